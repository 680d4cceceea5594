"""The docker, pytest and native command lines the harness builds (asserted, not run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import commands, matrix
from harness.images import image
from harness.suites import runner
from harness.settings import settings

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")


def _run_argv(backend: str) -> list[str]:
    b = M.backend(backend)
    inner = commands.pytest_argv(["tests/numerics"], junit="/results/numerics.xml", test_timeout_s=b.timeouts.test_s)
    return commands.container_argv(b, "kiln-x:abc", inner, src="/repo", env=commands.suite_env(M, b),
                                 results="/out", name="kiln-x-1", docker="/usr/bin/docker")


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("backend", ["cpu", "cuda", "rocm"])
def test_container_run_isolation(backend):
    argv = _run_argv(backend)
    assert argv[:4] == ["/usr/bin/docker", "run", "--rm", "--init"]
    assert _pairs(argv, "--network") == ["none"]
    assert _pairs(argv, "--volume") == ["/repo:/src:ro", "/out:/results"]
    assert _pairs(argv, "--workdir") == ["/src"]
    assert _pairs(argv, "--name") == ["kiln-x-1"]
    image_at = argv.index("kiln-x:abc")
    assert argv[image_at + 1:image_at + 4] == ["python", "-m", "pytest"]
    inner = argv[image_at + 1:]
    assert "-p" in inner and inner[inner.index("-p") + 1] == "no:xdist"  # one process
    assert f"--timeout={M.backend(backend).timeouts.test_s}" in inner
    assert "--junitxml=/results/numerics.xml" in inner
    env = dict(e.split("=", 1) for e in _pairs(argv, "--env"))
    assert env["PYTHONHASHSEED"] == "0" and env["KILN_COMPILE_THREADS"] == "1"


def test_gpu_flags_per_backend():
    cuda, rocm, cpu = _run_argv("cuda"), _run_argv("rocm"), _run_argv("cpu")
    assert _pairs(cuda, "--gpus") == ["all"]
    assert "--device=/dev/kfd" in rocm and "--device=/dev/dri" in rocm and _pairs(rocm, "--group-add") == ["video"]
    assert "--gpus" not in rocm and "--gpus" not in cpu and not any(a.startswith("--device") for a in cpu)
    assert dict(e.split("=", 1) for e in _pairs(cpu, "--env"))["TRITON_INTERPRET"] == "1"
    # GPU flags come before the image name, never after it
    for argv in (cuda, rocm):
        assert max(i for i, a in enumerate(argv) if a.startswith(("--gpus", "--device"))) < argv.index("kiln-x:abc")


def test_native_command_uses_this_python_and_the_same_inner_command(tmp_path):
    inner = commands.pytest_argv(["tests/fallback"], junit=str(tmp_path / "f.xml"), test_timeout_s=30)
    argv, env = commands.native_command(inner, {"PYTHONHASHSEED": "0"}, src=tmp_path, python="/py/bin/python")
    assert argv == ["/py/bin/python", *inner[1:]]
    assert env["PYTHONHASHSEED"] == "0" and env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    line = commands.native_shell_line(argv, {"B": "2", "A": "x y"}, Path("/src dir"))
    assert line.startswith("cd '/src dir' && env 'A=x y' B=2 /py/bin/python -m pytest")


def test_pytest_argv_without_timeout_plugin():
    assert not any(a.startswith("--timeout") for a in commands.pytest_argv(["t"], test_timeout_s=0))


def test_missing_pytest_timeout_falls_back_with_a_warning(monkeypatch):
    real = runner.importlib.util.find_spec
    monkeypatch.setattr(runner.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pytest_timeout" else real(name, *a))
    with pytest.warns(UserWarning, match="pytest-timeout is not installed"):
        assert runner._check_native_python() is False


def test_missing_pytest_is_a_clear_error(monkeypatch):
    from harness.exc import MissingTool

    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingTool, match="pytest is not installed"):
        runner._check_native_python()


def test_build_argv_passes_the_matrix_build_args(tmp_path):
    b = M.backend("cuda")
    argv = image.build_argv(b, "kiln-cuda:0123", tmp_path, b.base_image)
    args = dict(a.split("=", 1) for a in _pairs(argv, "--build-arg"))
    assert args == {**b.build_args(), "PIP_INDEX_ARGS": b.index_args(),
                    "PIP_LOCK_ARGS": "--require-hashes --no-deps" if (ROOT / "docker/lock/cuda.txt").exists() else ""}
    assert args["BASE_IMAGE"] == "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    assert _pairs(argv, "--tag") == ["kiln-cuda:0123"] and argv[-1] == str(tmp_path)


def test_bootstrap_and_wheelhouse_commands(tmp_path):
    cpu = M.backend("cpu")
    assert image.bootstrap_argv(cpu, tmp_path, "http://mirror.test/debian") == [
        "debootstrap", "--variant=minbase", "bookworm", str(tmp_path), "http://mirror.test/debian"]
    wh = image.wheelhouse_argv(cpu, tmp_path, ROOT)
    assert wh[1:4] == ["-m", "pip", "download"]
    # the wheelhouse is the lock's files, hash-checked (docker/lock/cpu.txt pins torch 2.13.0 and triton 3.9.0)
    assert wh[-4:] == ["--require-hashes", "--no-deps", "-r", str(ROOT / "docker/lock/cpu.txt")]
    assert _pairs(wh, "--python-version") == ["3.11"] and _pairs(wh, "--abi") == ["cp311"]
    with pytest.raises(Exception, match="no bootstrap entry"):
        image.bootstrap_argv(M.backend("cuda"), tmp_path, "http://mirror.test/debian")


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "docker").mkdir(parents=True)
    for rel in ("docker/cpu.Dockerfile", "docker/requirements-test.txt", "pyproject.toml"):
        shutil.copy(ROOT / rel, root / rel)
    return root


def test_image_tag_is_a_stable_hash_of_the_inputs(tmp_path):
    root = _fake_root(tmp_path)
    cpu = M.backend("cpu")
    tag = image.image_tag(cpu, root=root)
    assert tag.startswith("kiln-cpu:") and len(tag.split(":")[1]) == image.HASH_LEN
    assert image.image_tag(cpu, root=root) == tag
    assert image.image_tag(cpu, "kiln-base/other:1", root=root) != tag  # base image is a build arg
    (root / "docker/cpu.Dockerfile").write_text((root / "docker/cpu.Dockerfile").read_text() + "\n# change\n")
    changed = image.image_tag(cpu, root=root)
    assert changed != tag
    (root / "docker/requirements-test.txt").write_text("pytest==1.0\n")
    assert image.image_tag(cpu, root=root) != changed
    text = (root / "pyproject.toml").read_text()
    before = image.image_tag(cpu, root=root)
    (root / "pyproject.toml").write_text(text.replace('version = "0.1.0"', 'version = "0.2.0"'))
    assert image.image_tag(cpu, root=root) != before


def test_build_is_skipped_when_the_tag_exists(monkeypatch):
    calls = []
    monkeypatch.setattr(image, "require_docker", lambda: None)
    monkeypatch.setattr(image, "resolve_base", lambda b, base=None, bootstrap=None: "base:1")
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:feed")
    monkeypatch.setattr(image, "prepare_context", lambda *a: calls.append(a))
    img = image.build(M.backend("cpu"))
    assert img.built is False and img.id == "sha256:feed" and not calls
    assert img.tag == image.image_tag(M.backend("cpu"), "base:1", base_id="sha256:feed")


def test_detect_backend_uses_the_matrix_host_devices(tmp_path):
    data = json.loads((ROOT / "ci" / "matrix.json").read_text())
    data["backends"]["cuda"]["host_devices"] = [str(tmp_path / "nvidiactl")]
    data["backends"]["rocm"]["host_devices"] = [str(tmp_path / "kfd"), str(tmp_path / "dri")]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    assert matrix.detect_backend(matrix.load(path)) == "cpu"
    (tmp_path / "kfd").touch()
    assert matrix.detect_backend(matrix.load(path)) == "cpu"  # needs all of them
    (tmp_path / "dri").mkdir()
    assert matrix.detect_backend(matrix.load(path)) == "rocm"
    (tmp_path / "nvidiactl").touch()
    assert matrix.detect_backend(matrix.load(path)) == "cuda"


def test_settings_read_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_ROOT", str(tmp_path))
    monkeypatch.setenv("KILN_NATIVE", "1")
    monkeypatch.setenv("KILN_DOCKER", "/opt/docker")
    s = settings()
    assert s.root == tmp_path and s.matrix_path == tmp_path / "ci" / "matrix.json"
    assert s.native and s.docker == "/opt/docker" and s.results_root == tmp_path / "results"
