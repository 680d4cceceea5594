"""Hermetic images (harness/images/image.py): FROM tag@digest, the unpinned warning, what the hash tag covers, the
lock gate of a build and the labels (docker faked: nothing here runs docker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import ImageError
from harness.images import image, lock

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def _matrix(tmp_path: Path, **rocm: object) -> matrix.Matrix:
    """The repository's matrix with fields of the rocm backend (a registry base, no lock, no wheelhouse) changed."""
    data = json.loads((ROOT / "ci/matrix.json").read_text())
    data["backends"]["rocm"].update(rocm)
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(data))
    return matrix.load(path)


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "docker" / "lock").mkdir(parents=True)
    for rel in (
        "docker/cpu.Dockerfile",
        "docker/cuda.Dockerfile",
        "docker/rocm.Dockerfile",
        "docker/requirements-test.txt",
        "docker/lock/cpu.txt",
        "docker/lock/cuda.txt",
        "pyproject.toml",
    ):
        shutil.copy(ROOT / rel, root / rel)
    return root


def _pairs(argv: list[str], flag: str) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == flag)


def test_a_pinned_base_is_built_from_tag_at_digest(tmp_path):
    cuda = _matrix(tmp_path, base_digest=DIGEST).backend("rocm")
    ref = f"rocm/dev-ubuntu-24.04:7.0.2@{DIGEST}"
    assert cuda.base_ref == ref and cuda.build_args()["BASE_IMAGE"] == ref
    argv = image.build_argv(cuda, "kiln-rocm:0123", tmp_path, cuda.base_ref, root=_root(tmp_path))
    assert _pairs(argv, "--build-arg")["BASE_IMAGE"] == ref  # the Dockerfile's `FROM ${BASE_IMAGE}`
    labels = _pairs(argv, "--label")
    assert labels["kiln.base-digest"] == DIGEST and labels["kiln.base-image"] == ref
    assert image.unpinned_warning(cuda, cuda.base_ref) is None and image.digest_pinned(cuda, cuda.base_ref)
    unpinned = _matrix(tmp_path).backend("rocm")
    assert (
        unpinned.base_ref == unpinned.base_image
        and unpinned.build_args()["BASE_IMAGE"] == unpinned.base_image
    )


def test_resolve_base_pulls_the_digest(monkeypatch, tmp_path):
    cuda = _matrix(tmp_path, base_digest=DIGEST).backend("rocm")
    pulled = []
    monkeypatch.setattr(image, "image_id", lambda ref: None)
    monkeypatch.setattr(
        image, "docker", lambda *a, **k: pulled.append(a) or type("P", (), {"returncode": 0})()
    )
    assert image.resolve_base(cuda, bootstrap=False) == cuda.base_ref
    assert pulled == [("pull", cuda.base_ref)]


@pytest.mark.parametrize("bad", ["sha256:abc", "md5:" + "a" * 64, "SHA256:" + "A" * 64])
def test_a_malformed_digest_is_refused(tmp_path, bad):
    from harness.exc import MatrixError

    with pytest.raises(MatrixError, match=r"backends\.rocm\.base_digest: must be 'sha256:' and 64 hex"):
        _matrix(tmp_path, base_digest=bad)
    with pytest.raises(MatrixError, match=r"base_image: must be the tag alone"):
        _matrix(tmp_path, base_image=f"rocm/dev-ubuntu-24.04:7@{DIGEST}")


def test_an_unpinned_base_is_named_in_a_warning(tmp_path):
    m = _matrix(tmp_path)
    rocm, cpu, cuda = m.backend("rocm"), m.backend("cpu"), m.backend("cuda")
    warning = image.unpinned_warning(rocm, rocm.base_ref)
    assert warning.startswith("base image not pinned by digest: rocm/dev-ubuntu-24.04:7.0.2")
    assert "image --pin --backend rocm" in warning
    assert (
        image.unpinned_warning(cuda, cuda.bootstrap.image) is None
    )  # cuda builds on the same bootstrapped base
    assert image.unpinned_warning(cpu, cpu.bootstrap.image) is None  # bootstrapped here: recorded by its id
    assert "not pinned by digest" in image.unpinned_warning(cpu, cpu.base_image)


def test_the_hash_tag_covers_the_lock_the_base_digest_and_the_base_id(tmp_path):
    root = _root(tmp_path)
    pinned = _matrix(tmp_path, base_digest=DIGEST).backend("rocm")
    repinned = _matrix(tmp_path, base_digest=OTHER).backend("rocm")
    cpu = matrix.load(ROOT / "ci/matrix.json").backend("cpu")
    assert image.image_tag(pinned, root=root) != image.image_tag(repinned, root=root)
    tag = image.image_tag(cpu, root=root)
    assert image.image_tag(cpu, root=root, base_id="sha256:1") != tag  # a re-bootstrapped base: a new tag
    assert image.image_tag(cpu, root=root, base_id="sha256:1") != image.image_tag(
        cpu, root=root, base_id="sha256:2"
    )
    path = root / "docker/lock/cpu.txt"
    path.write_text(path.read_text().replace("pytest==9.2.0", "pytest==9.2.1"))
    assert image.image_tag(cpu, root=root) != tag
    path.unlink()  # no lock: the unlocked pins go into the hash instead, a tag of its own
    assert image.image_tag(cpu, root=root) not in {tag}
    assert "lock" in image.image_inputs(cpu, root=root)


def test_a_digest_pinned_base_id_is_not_hashed(monkeypatch, tmp_path):
    pinned = _matrix(tmp_path, base_digest=DIGEST).backend("rocm")
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:local")
    assert image.base_id_for_hash(pinned, pinned.base_ref) is None  # the digest names the content
    assert image.base_id_for_hash(pinned, "kiln-base/other:1") == "sha256:local"


def _fake_build(monkeypatch, tmp_path, base="base:1"):
    monkeypatch.setattr(image, "require_docker", lambda: None)
    monkeypatch.setattr(image, "resolve_base", lambda b, base_image=None, bootstrap=None: base)
    monkeypatch.setattr(image, "image_id", lambda ref: None)
    monkeypatch.setenv("KILN_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KILN_LOGS", str(tmp_path / "logs"))
    runs = []

    def fake_execute(argv, *, log, **kw):
        runs.append(argv)
        log.write_text("#1 planted build failure\n")
        return 1, False

    monkeypatch.setattr(image, "execute", fake_execute)
    monkeypatch.setattr(image, "prepare_context", lambda b, root=None: tmp_path)
    (tmp_path / "state").mkdir(exist_ok=True)
    return runs


def test_a_build_without_a_lock_fails_unless_asked(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KILN_ROOT", str(_root(tmp_path)))
    monkeypatch.delenv("KILN_ALLOW_UNLOCKED", raising=False)
    rocm = matrix.load(ROOT / "ci/matrix.json").backend("rocm")
    runs = _fake_build(monkeypatch, tmp_path)
    with pytest.raises(ImageError, match=r"no lock file docker/lock/rocm\.txt.*KILN_ALLOW_UNLOCKED=1"):
        image.build(rocm)
    assert not runs
    monkeypatch.setenv("KILN_ALLOW_UNLOCKED", "1")
    with pytest.raises(
        ImageError, match="(?s)docker build of kiln-rocm:.*logs/build-rocm.log.*planted build failure"
    ):
        image.build(rocm)
    err = capsys.readouterr().err
    assert "packages are NOT hash-checked" in err and "base image not pinned by digest: base:1" in err
    argv = runs[-1]
    assert (
        _pairs(argv, "--build-arg")["PIP_LOCK_ARGS"] == ""
        and _pairs(argv, "--label")["kiln.lock-sha256"] == "none"
    )


def test_a_locked_build_labels_the_lock_digest(monkeypatch, tmp_path, capsys):
    root = _root(tmp_path)
    monkeypatch.setenv("KILN_ROOT", str(root))
    cpu = matrix.load(ROOT / "ci/matrix.json").backend("cpu")
    runs = _fake_build(monkeypatch, tmp_path, base=cpu.bootstrap.image)
    with pytest.raises(ImageError):
        image.build(cpu)
    assert "not pinned" not in capsys.readouterr().err  # a bootstrapped base is not a registry tag
    labels, args = _pairs(runs[-1], "--label"), _pairs(runs[-1], "--build-arg")
    assert labels["kiln.lock-sha256"] == lock.file_digest(root / "docker/lock/cpu.txt")
    assert args["PIP_LOCK_ARGS"] == "--require-hashes --no-deps" and labels["kiln.base-digest"] == ""


def test_prepare_context_ships_the_lock(monkeypatch, tmp_path):
    root = _root(tmp_path)
    monkeypatch.setenv("KILN_STATE", str(tmp_path / "state"))
    rocm = matrix.load(ROOT / "ci/matrix.json").backend("rocm")  # no wheelhouse: nothing downloaded
    ctx = image.prepare_context(rocm, root)
    assert (ctx / "lock.txt").read_text().startswith("# UNLOCKED")
    (root / "docker/lock/rocm.txt").write_text("x==1 \\\n    --hash=sha256:00\n")
    assert (image.prepare_context(rocm, root) / "lock.txt").read_text().startswith("x==1")


def test_describe_reads_the_labels_of_a_given_image(monkeypatch):
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:img")
    monkeypatch.setattr(
        image,
        "labels",
        lambda ref: {
            "kiln.base-image": "b:1",
            "kiln.lock-sha256": "sha256:99",
            "kiln.base-digest": "",
            "kiln.base-id": "sha256:base",
        },
    )
    rec = image.describe("kiln-cpu:1")
    assert rec == {
        "tag": "kiln-cpu:1",
        "id": "sha256:img",
        "base": "b:1",
        "built": False,
        "base_digest": None,
        "base_id": "sha256:base",
        "lock_sha256": "sha256:99",
    }


def test_the_cpu_image_carries_inductors_cpp_toolchain():
    """Inductor's CPU code is C++ compiled against Python's headers: the bench's Inductor rows need both in the
    image (without them every Inductor row is an error: no working C++ compiler)."""
    from test_run import _cpu_image_present

    tag = _cpu_image_present(ROOT)
    if tag is None:
        pytest.skip("CPU image not built on this machine (python -m harness image build --backend cpu)")
    probe = (
        "import subprocess, sysconfig, torch._inductor.cpp_builder as cb; cxx = cb.get_cpp_compiler(); "
        "subprocess.run([cxx, '-x', 'c++', '-fsyntax-only', '-I', sysconfig.get_paths()['include'], '-'], "
        "input=b'#include <Python.h>\\nint main() { return 0; }\\n', check=True); print('cxx', cxx)"
    )
    p = subprocess.run(
        [
            os.environ.get("KILN_DOCKER", "/usr/bin/docker"),
            "run",
            "--rm",
            "--network",
            "none",
            tag,
            "python",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0 and p.stdout.startswith("cxx "), p.stderr[-2000:]


def test_debootstrap_in_sbin_is_found_off_a_users_path(tmp_path):
    """A user's PATH often lacks /usr/sbin, where Debian installs debootstrap: the harness looks there too, and
    says where it looked when it is nowhere."""
    import os
    import subprocess
    import sys

    from harness.images.image import SBIN

    root = Path(__file__).resolve().parents[2]
    probe = "from harness.images.image import find_tool; print(find_tool('debootstrap'))"
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(root)}  # a PATH with nothing on it
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    there = [str(Path(d) / "debootstrap") for d in SBIN if os.access(Path(d) / "debootstrap", os.X_OK)]
    if not there:
        assert proc.stdout.strip() == "None"
        pytest.skip("debootstrap is not installed in any sbin folder here")
    assert proc.stdout.strip() == there[0]
