"""Lock files (harness/images/lock.py): the committed CPU lock is complete and current, staleness, the record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import matrix
from harness.images import lock

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")


def _root(tmp_path: Path, with_lock: bool = True) -> Path:
    root = tmp_path / "root"
    (root / "docker" / "lock").mkdir(parents=True)
    shutil.copy(ROOT / "docker/requirements-test.txt", root / "docker/requirements-test.txt")
    if with_lock:
        shutil.copy(ROOT / "docker/lock/cpu.txt", root / "docker/lock/cpu.txt")
    return root


def test_the_cpu_lock_is_current_and_hashes_every_package():
    state = lock.state(M.backend("cpu"), ROOT)
    assert state.exists and not state.stale and state.problem() is None, state.problem()
    text = (ROOT / "docker/lock/cpu.txt").read_text()
    pins = lock.pins(ROOT / "docker/lock/cpu.txt")
    assert pins["torch"].startswith("2.13.0") and pins["triton"] == "3.9.0"
    for name in (
        "numpy",
        "pytest",
        "pytest-timeout",
        "sympy",
        "filelock",
        "jinja2",
    ):  # test pins, torch's deps
        assert name in pins, name
    # every `name==version` line continues into --hash lines: pip's --require-hashes accepts nothing less
    for line in text.splitlines():
        if lock._PIN.match(line):
            assert line.endswith("\\"), line
    assert text.count("--hash=sha256:") >= len(pins)
    assert "index-url" not in text and "find-links" not in text  # no index in the lock


def test_a_lock_is_stale_when_its_inputs_change(tmp_path):
    root = _root(tmp_path)
    cpu = M.backend("cpu")
    assert lock.state(cpu, root).problem() is None
    (root / "docker/requirements-test.txt").write_text("pytest==1.0\n")
    state = lock.state(cpu, root)
    assert state.stale and "is stale" in state.problem() and "nox -s lock -- --backend cpu" in state.problem()
    data = json.loads((ROOT / "ci/matrix.json").read_text())
    data["backends"]["cpu"]["torch"] = "torch==2.14.0"
    newer = matrix.parse(data, ROOT / "ci/matrix.json").backend("cpu")
    assert lock.inputs_digest(newer, ROOT) != lock.inputs_digest(cpu, ROOT)


def test_a_missing_lock_says_how_to_make_one(tmp_path):
    state = lock.state(M.backend("cuda"), _root(tmp_path))
    assert not state.exists and state.digest is None and not state.stale
    assert state.problem().startswith("no lock file ") and "nox -s lock -- --backend cuda" in state.problem()
    assert state.record()["sha256"] is None
    text = lock.unlocked_text(M.backend("cuda"), _root(tmp_path / "x"))
    assert text.startswith("# UNLOCKED") and "torch==2.13.0" in text and "--hash" not in text


def test_device_record_names_the_lock_digest_and_what_differs(tmp_path, monkeypatch):
    f = tmp_path / "lock.txt"
    f.write_text(
        "pytest==0.0.1 \\\n    --hash=sha256:00\nno-such-package-kiln==1.0 \\\n    --hash=sha256:11\n"
    )
    monkeypatch.setenv(lock.LOCK_ENV, str(f))
    rec = lock.device_record(None)
    assert rec["sha256"] == lock.file_digest(f) and rec["unlocked"] is False
    assert any(
        m.startswith("pytest: installed ") and m.endswith("locked 0.0.1") for m in rec["installed_mismatches"]
    )
    assert "no-such-package-kiln: installed none, locked 1.0" in rec["installed_mismatches"]


def test_compile_argv_hashes_everything_and_names_no_index(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_TORCH_INDEX_URL", raising=False)
    argv = lock.compile_argv(M.backend("rocm"), tmp_path / "out.txt", python="/py")
    assert argv[:4] == ["/py", "-m", "piptools", "compile"] and argv[-1] == "-"
    assert {"--generate-hashes", "--allow-unsafe", "--no-emit-index-url", "--no-emit-find-links"} <= set(argv)
    assert "--extra-index-url" not in argv  # pip's own configuration decides
    monkeypatch.setenv("KILN_TORCH_INDEX_URL", "http://torch.test/whl/")
    argv = lock.compile_argv(M.backend("rocm"), tmp_path / "out.txt")
    assert argv[argv.index("--extra-index-url") + 1] == "http://torch.test/whl/rocm7.0"
    # cuda resolves from the package index alone (torch_index "index"): PyPI's Linux torch is the CUDA build
    assert "--extra-index-url" not in lock.compile_argv(M.backend("cuda"), tmp_path / "out.txt")


def test_write_refuses_another_python(tmp_path):
    from harness.exc import ImageError

    data = json.loads((ROOT / "ci/matrix.json").read_text())
    data["backends"]["cpu"]["python"] = "2.7"
    old = matrix.parse(data, ROOT / "ci/matrix.json").backend("cpu")
    with pytest.raises(ImageError, match=r"runs Python 2\.7.*nox -s lock-cpu"):
        lock.write(old, _root(tmp_path))
