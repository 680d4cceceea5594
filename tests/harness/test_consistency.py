"""One matrix, one truth: nox sessions, CI workflows, the runner and repro lines all read ci/matrix.json."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from harness import commands, matrix
from harness.record import RunRecord
from harness.suites import repro

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")


def _run_noxfile() -> tuple[dict, dict]:
    """(sessions, noxfile globals), the noxfile loaded once per process (noxfile_loader: no re-registration)."""
    from noxfile_loader import noxfile, sessions

    return sessions(), vars(noxfile())


def test_nox_has_one_tests_session_per_matrix_backend_and_the_main_job():
    sessions, names = _run_noxfile()
    assert sorted(n[len("tests-") :] for n in sessions if n.startswith("tests-")) == sorted(M.backends)
    assert "ci" in sessions and "ci-report" in sessions
    noxfile = (ROOT / "noxfile.py").read_text()
    # the sessions delegate to the harness
    assert re.search(r'"harness",\s*"run",\s*"--backend",\s*backend', noxfile)
    assert names["SUITE_ENV"] == M.suite_env and names["SUITES"] == list(M.suites)  # read from the matrix
    cpu = M.backend("cpu")
    assert (names["TORCH_PIN"], names["TRITON_PIN"]) == (cpu.torch, cpu.triton)
    gpu = sorted(b.name for b in M.backends.values() if b.is_gpu)  # `nox -s bench-B`: one per GPU backend
    assert gpu and sorted(names["_gpu_backends"]()) == gpu
    assert {f"bench-{n}" for n in M.backends} & set(sessions) == {f"bench-{n}" for n in gpu}


def _manifest(backend: str, mode: str = "container", **more) -> RunRecord:
    b = M.backend(backend)
    return RunRecord.from_json(
        {
            **more,
            "backend": backend,
            "mode": mode,
            "src": "/repo",
            "image": {"tag": f"{b.image}:0123"},
            "env": commands.suite_env(M, b),
            "test_timeout_s": b.timeouts.test_s,
            "python": "/usr/bin/python3",
        }
    )


@pytest.mark.parametrize("backend", sorted(M.backends))
def test_repro_line_equals_the_runner_command_for_one_test(backend):
    """The repro line is the suite's docker command minus the results mount and name, for one test id."""
    b = M.backend(backend)
    test_id = "tests/numerics/test_x.py::test_y[fp32]"
    line = shlex.split(repro.repro_line(_manifest(backend), test_id))
    inner = commands.pytest_argv([test_id], test_timeout_s=b.timeouts.test_s)
    expected = commands.container_argv(b, f"{b.image}:0123", inner, src="/repo", env=commands.suite_env(M, b))
    assert line == expected
    for opt in b.container_options:
        assert opt in line
    assert line[line.index(f"{b.image}:0123") + 1 :] == inner


def test_native_repro_line_uses_the_recorded_python_and_env():
    line = repro.repro_line(_manifest("cuda", "native"), "tests/fallback/test_f.py::test_g")
    assert line.startswith("cd /repo && env ")
    assert "KILN_TEST_DEVICE=cuda" in line and "PYTHONHASHSEED=0" in line
    assert "/usr/bin/python3 -m pytest -p no:xdist" in line and "--timeout=300" in line
    assert line.endswith("tests/fallback/test_f.py::test_g")


def test_repro_line_keeps_the_container_options_the_run_used():
    line = repro.repro_line(_manifest("rocm", container_options=["--device=/dev/kfd"]), "tests/a.py::b")
    assert "--device=/dev/kfd" in line and "--device=/dev/dri" not in line


def test_workflows_run_each_backend_with_its_matrix_labels_and_timeout():
    yaml = pytest.importorskip("yaml")
    path = ROOT / ".github" / "workflows" / "ci.yml"
    if not path.exists():
        pytest.skip("no CI workflow yet")
    jobs = yaml.safe_load(path.read_text())["jobs"]
    for name, b in M.backends.items():
        job = jobs[f"tests-{name}"]
        assert job["runs-on"] == list(b.runner_labels)
        assert job["timeout-minutes"] == b.timeouts.job_min
        runs = " ".join(step.get("run", "") for step in job["steps"])
        assert f"-s tests-{name}" in runs


def test_matrix_cli_prints_the_same_data():
    import contextlib
    import io

    from harness.__main__ import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["matrix", "--backend", "rocm", "--field", "container_options"]) == 0
    assert json.loads(buf.getvalue()) == list(M.backend("rocm").container_options)


def test_the_images_carry_the_stores_dependencies_at_the_workflows_pins():
    """`bench backend` measures inside the backend's container and writes its bench store there, so every image
    installs SQLAlchemy and Alembic (docker/requirements-test.txt, hence each lock) at the pins the workflows give
    the host (the main job failed with `No module named 'sqlalchemy'` in the container without them)."""
    import re

    reqs = dict(
        re.findall(r"^([\w-]+)==([\w.]+)$", (ROOT / "docker" / "requirements-test.txt").read_text(), re.M)
    )
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    for name in ("sqlalchemy", "alembic"):
        assert name in reqs, f"docker/requirements-test.txt lacks {name}"
        assert f"{name}=={reqs[name]}" in workflow, f"{name}: image pin {reqs[name]} unlike the workflows'"
        for lock in sorted((ROOT / "docker" / "lock").glob("*.txt")):
            assert f"\n{name}=={reqs[name]} " in lock.read_text(), f"{lock.name} lacks {name}=={reqs[name]}"


def test_test_files_have_unique_basenames():
    """The test folders have no __init__.py, so pytest imports each test file by its basename: two files of one
    name in one session fail to collect ("import file mismatch"), in whichever order the workers meet them."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
