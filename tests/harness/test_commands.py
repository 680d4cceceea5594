"""The docker, pytest and native command lines the harness builds (asserted, not run)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness import commands, matrix
from harness.exc import HarnessError
from harness.images import image
from harness.settings import settings
from harness.suites import place, runner

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")


ALL_GPUS = {
    "cuda": commands.GpuAccess("nvidia", None),  # what harness.gpus gives a runner given every GPU
    "rocm": commands.GpuAccess("amd", None, groups=(44, 109)),
}


def _run_argv(backend: str) -> list[str]:
    b = M.backend(backend)
    if backend in ALL_GPUS:
        b = commands.with_gpus(b, ALL_GPUS[backend])
    inner = commands.pytest_argv(
        ["tests/numerics"], junit="/results/numerics.xml", test_timeout_s=b.timeouts.test_s
    )
    return commands.container_argv(
        b,
        "kiln-x:abc",
        inner,
        src="/repo",
        env=commands.suite_env(M, b),
        results="/out",
        name="kiln-x-1",
        docker="/usr/bin/docker",
    )


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
    assert argv[image_at + 1 : image_at + 4] == ["python", "-m", "pytest"]
    inner = argv[image_at + 1 :]
    assert "-p" in inner and inner[inner.index("-p") + 1] == "no:xdist"  # one process
    assert f"--timeout={M.backend(backend).timeouts.test_s}" in inner
    assert "--junitxml=/results/numerics.xml" in inner
    env = dict(e.split("=", 1) for e in _pairs(argv, "--env"))
    assert env["PYTHONHASHSEED"] == "0" and env["KILN_COMPILE_THREADS"] == "1"


def test_gpu_flags_per_backend():
    cuda, rocm, cpu = _run_argv("cuda"), _run_argv("rocm"), _run_argv("cpu")
    assert _pairs(cuda, "--gpus") == ["all"]
    assert (
        "--device=/dev/kfd" in rocm
        and "--device=/dev/dri" in rocm
        and _pairs(rocm, "--group-add") == ["44", "109"]
    )
    assert "--gpus" not in rocm and "--gpus" not in cpu and not any(a.startswith("--device") for a in cpu)
    assert dict(e.split("=", 1) for e in _pairs(cpu, "--env"))["TRITON_INTERPRET"] == "1"
    # GPU flags come before the image name, never after it
    for argv in (cuda, rocm):
        assert max(i for i, a in enumerate(argv) if a.startswith(("--gpus", "--device"))) < argv.index(
            "kiln-x:abc"
        )


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
    real = place.importlib.util.find_spec
    monkeypatch.setattr(
        place.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pytest_timeout" else real(name, *a),
    )
    with pytest.warns(UserWarning, match="pytest-timeout is not installed"):
        assert place.check_native_python() is False


def test_missing_pytest_is_a_clear_error(monkeypatch):
    from harness.exc import MissingTool

    monkeypatch.setattr(place.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingTool, match="pytest is not installed"):
        place.check_native_python()


def test_build_argv_passes_the_matrix_build_args(tmp_path):
    b = M.backend("rocm")
    argv = image.build_argv(b, "kiln-rocm:0123", tmp_path, b.base_image)
    args = dict(a.split("=", 1) for a in _pairs(argv, "--build-arg"))
    assert args == {
        **b.build_args(),
        "PIP_INDEX_ARGS": b.index_args(),
        "PIP_LOCK_ARGS": "--require-hashes --no-deps" if (ROOT / "docker/lock/rocm.txt").exists() else "",
    }
    assert args["BASE_IMAGE"] == "rocm/dev-ubuntu-24.04:7.0.2"
    assert _pairs(argv, "--tag") == ["kiln-rocm:0123"] and argv[-1] == str(tmp_path)


def test_bootstrap_and_wheelhouse_commands(tmp_path):
    cpu = M.backend("cpu")
    assert image.bootstrap_argv(cpu, tmp_path, "http://mirror.test/debian") == [
        image.find_tool("debootstrap") or "debootstrap",
        "--variant=minbase",
        "bookworm",
        str(tmp_path),
        "http://mirror.test/debian",
    ]
    wh = image.wheelhouse_argv(cpu, tmp_path, ROOT)
    assert wh[1:4] == ["-m", "pip", "download"]
    # the wheelhouse is the lock's files, hash-checked (docker/lock/cpu.txt pins torch 2.13.0 and triton 3.9.0)
    assert wh[-4:] == ["--require-hashes", "--no-deps", "-r", str(ROOT / "docker/lock/cpu.txt")]
    assert _pairs(wh, "--python-version") == ["3.11"] and _pairs(wh, "--abi") == ["cp311"]
    with pytest.raises(Exception, match="no bootstrap entry"):
        image.bootstrap_argv(M.backend("rocm"), tmp_path, "http://mirror.test/debian")


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


# ---- GPU isolation: one runner agent per GPU -------------------------------------------------


def _csv(value: str) -> list[str]:
    """docker's reading of a --gpus value (a CSV record)."""
    import csv

    return next(csv.reader([value]))


def _env_of(argv: list[str]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in _pairs(argv, "--env"))


def _pinned_argv(backend: str, env: dict[str, str], devices=(), **probe) -> list[str]:
    from harness import gpus

    b = gpus.pin(M.backend(backend), devices, env=env, **probe)
    inner = commands.pytest_argv(["tests/numerics"])
    return commands.container_argv(b, "kiln-x:abc", inner, src="/repo", env=commands.suite_env(M, b))


def test_cuda_runner_given_one_gpu_by_index_or_uuid():
    argv = _pinned_argv("cuda", {"CUDA_VISIBLE_DEVICES": "1"})
    assert _pairs(argv, "--gpus") == ["device=1"]
    assert _env_of(argv)["CUDA_VISIBLE_DEVICES"] == "0" and _env_of(argv)[commands.HOST_GPUS] == "1"
    uuid = "GPU-8f6c1e2a-5b7d-4c3e-9a10-112233445566"
    argv = _pinned_argv("cuda", {"CUDA_VISIBLE_DEVICES": uuid})
    assert (
        _csv(_pairs(argv, "--gpus")[0]) == [f"device={uuid}"] and _env_of(argv)["CUDA_VISIBLE_DEVICES"] == "0"
    )


def test_cuda_runner_given_two_gpus_quotes_the_list_for_dockers_csv_parser():
    argv = _pinned_argv("cuda", {"CUDA_VISIBLE_DEVICES": "2,3"})
    (value,) = _pairs(argv, "--gpus")
    assert value == '"device=2,3"' and _csv(value) == ["device=2,3"]  # unquoted, docker would read two fields
    assert _env_of(argv)["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_cuda_runner_with_two_gpus_and_two_shards_splits_only_its_gpus():
    from harness import gpus
    from harness.suites import shard

    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    groups = shard.device_groups(True, None, 1, shard.visible_gpus("cuda", env), backend="cuda")
    assert groups == [["2"], ["3"]]
    cuda = M.backend("cuda")
    assert [gpus.pin(cuda, g, env=env).container_options[:2] for g in groups] == [
        ("--gpus", "device=2"),
        ("--gpus", "device=3"),
    ]
    assert [gpus.pin_visible(cuda, g, env=env).env["CUDA_VISIBLE_DEVICES"] for g in groups] == ["2", "3"]
    with pytest.raises(HarnessError, match="not among the runner's CUDA_VISIBLE_DEVICES=2,3"):
        gpus.pin(cuda, ["0"], env=env)  # never a GPU another runner was given


def test_unset_visible_devices_means_every_gpu():
    argv = _pinned_argv("cuda", {})
    assert _pairs(argv, "--gpus") == ["all"] and "CUDA_VISIBLE_DEVICES" not in _env_of(argv)
    with pytest.raises(HarnessError, match="names no GPU"):
        _pinned_argv("cuda", {"CUDA_VISIBLE_DEVICES": ""})


def _fake_amd_host(tmp_path: Path, minors=(128, 136, 144, 152)):
    """A KFD topology (a CPU node, then GPUs with these render minors) and a stat that says which host group
    owns each device file."""
    nodes = tmp_path / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0" / "gpu_id").write_text("0\n")
    (nodes / "0" / "properties").write_text("cpu_cores_count 64\n")
    for k, minor in enumerate(minors, 1):
        (nodes / str(k)).mkdir()
        (nodes / str(k) / "gpu_id").write_text(f"{4000 + k}\n")
        (nodes / str(k) / "properties").write_text(
            f"simd_count 304\ndrm_render_minor {minor}\nunique_id {0xABC0 + k}\n"
        )
    dri = tmp_path / "dri"
    dri.mkdir()
    for minor in minors:
        (dri / f"renderD{minor}").touch()
    gids = {"/dev/kfd": 109}

    class St:
        def __init__(self, gid):
            self.st_gid = gid

    def stat(path):
        if path in gids:
            return St(gids[path])
        if "renderD" in path:
            return St(110)  # the host's render group
        raise FileNotFoundError(path)

    return {"sys_root": tmp_path / "sys", "stat": stat, "dri": dri}


def test_rocm_runner_given_one_gpu_gets_its_render_node_and_the_hosts_gids(tmp_path):
    probe = _fake_amd_host(tmp_path)
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        argv = _pinned_argv("rocm", {var: "1"}, **probe)
        devices = [a for a in argv if a.startswith("--device")]
        assert devices == ["--device=/dev/kfd", "--device=/dev/dri/renderD136"], var  # from sysfs, not 128+1
        assert _pairs(argv, "--group-add") == ["109", "110"] and "video" not in argv
        assert _env_of(argv)["HIP_VISIBLE_DEVICES"] == "0" and _env_of(argv)[commands.HOST_GPUS] == "1"
    # ROCR's list first, HIP's ids index it: HIP 1 of ROCR 2,3 is host GPU 3
    argv = _pinned_argv("rocm", {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, **probe)
    assert "--device=/dev/dri/renderD152" in argv and _env_of(argv)[commands.HOST_GPUS] == "3"
    # a UUID (GPU-<unique_id hex>) names the same GPU
    argv = _pinned_argv("rocm", {"HIP_VISIBLE_DEVICES": f"GPU-{0xABC0 + 3:016x}"}, **probe)
    assert "--device=/dev/dri/renderD144" in argv


def test_rocm_shards_split_the_runners_gpus_and_renumber_inside(tmp_path):
    from harness import gpus
    from harness.suites import shard

    probe = _fake_amd_host(tmp_path)
    env = {"HIP_VISIBLE_DEVICES": "2,3"}
    rocm = M.backend("rocm")
    groups = shard.device_groups(True, None, 1, shard.visible_gpus("rocm", env), backend="rocm")
    pinned = [gpus.pin(rocm, g, env=env, **probe) for g in groups]
    assert [[o for o in b.container_options if "renderD" in o] for b in pinned] == [
        ["--device=/dev/dri/renderD144"],
        ["--device=/dev/dri/renderD152"],
    ]
    assert [b.env["HIP_VISIBLE_DEVICES"] for b in pinned] == ["0", "0"]
    assert [gpus.pin_visible(rocm, g, env=env).env["HIP_VISIBLE_DEVICES"] for g in groups] == ["2", "3"]
    # a runner given its GPUs through ROCR natively: the subset goes to ROCR (HIP would index ROCR's list)
    assert gpus.pin_visible(rocm, ["3"], env={"ROCR_VISIBLE_DEVICES": "2,3"}).env == {
        **rocm.env,
        "ROCR_VISIBLE_DEVICES": "3",
    }


def test_rocm_unset_gets_every_gpu_with_the_hosts_gids(tmp_path):
    argv = _pinned_argv("rocm", {}, **_fake_amd_host(tmp_path))
    assert [a for a in argv if a.startswith("--device")] == ["--device=/dev/kfd", "--device=/dev/dri"]
    assert _pairs(argv, "--group-add") == ["109", "110"] and "HIP_VISIBLE_DEVICES" not in _env_of(argv)
    assert "--shm-size" in argv and "seccomp=unconfined" in argv  # the matrix's other options stay


def test_the_matrix_gpu_options_are_replaced_not_doubled():
    for opts in (
        ["--gpus", "all", "--shm-size", "8g"],
        ["--gpus=all", "--shm-size", "8g"],
        ["--device=/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--shm-size", "8g"],
    ):
        assert commands.without_gpu_options(opts) == ["--shm-size", "8g"]
    assert commands.without_gpu_options(["--device=/dev/fuse", "--group-add", "1234"]) == [
        "--device=/dev/fuse",
        "--group-add",
        "1234",
    ]


def test_a_container_run_uses_the_runners_gpus_user_job_label_and_compile_cache(tmp_path, monkeypatch):
    """runner.run_pytest for an unpinned CUDA backend on a runner given GPU 1 (docker faked)."""
    calls = []

    def fake_execute(argv, *, log, timeout_s, **kw):
        calls.append(argv)
        log.write_text("")
        return 0, False

    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("GITHUB_RUN_ID", "77")
    monkeypatch.setenv("GITHUB_RUN_ATTEMPT", "2")
    monkeypatch.setenv("RUNNER_NAME", "gpu box 1")
    monkeypatch.setenv("KILN_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_CACHE_SCOPE", "untrusted")  # narrowed from local: fork
    monkeypatch.delenv("KILN_CONTAINER_USER", raising=False)
    monkeypatch.delenv("KILN_JOB_ID", raising=False)
    monkeypatch.delenv("RUNNER_TEMP", raising=False)
    out = tmp_path / "out"
    cuda = M.backend("cuda")
    runner.run_pytest(
        place.ContainerPlace("kiln-cuda:0123456789abcdef"),
        cuda,
        ["tests/numerics"],
        out,
        "numerics",
        env=commands.suite_env(M, cuda),
        echo=False,
    )
    argv = calls[-1]
    assert _pairs(argv, "--gpus") == ["device=1"] and "all" not in argv
    assert _pairs(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert _pairs(argv, "--label") == ["kiln.backend=cuda", "kiln.job=77-2-gpu-box-1"]
    cache = tmp_path / "cache" / "fork" / "kiln-cuda-0123456789abcdef"
    assert f"{cache}:/cache" in _pairs(argv, "--volume") and cache.is_dir()
    env = _env_of(argv)
    assert env["TRITON_CACHE_DIR"] == "/cache/triton" and env["KILN_CACHE_DIR"] == "/cache/kiln"
    assert env["KILN_GRAPH_CACHE_DIR"] == "/cache/graphs" and env["KILN_AUTOTUNE_DIR"] == "/cache/autotune"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/cache/inductor" and "KILN_CACHE_AUTH" not in env
    assert env["HOME"].startswith("/tmp/") and env["XDG_CACHE_HOME"].startswith(env["HOME"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert out.stat().st_mode & 0o002 == 0  # nothing world-writable: the container writes as the runner
    # another toolchain (image inputs hash) or trust scope never shares that folder; the cache can be turned off
    assert commands.compile_cache_dir(tmp_path, "untrusted", "kiln-cuda:fedcba") != cache
    assert commands.compile_cache_dir(tmp_path, "main", "kiln-cuda:0123456789abcdef") != cache
    monkeypatch.setenv("KILN_COMPILE_CACHE", "off")
    runner.run_pytest(place.ContainerPlace("kiln-cuda:0"), cuda, ["t"], out, "t", env={}, echo=False)
    assert not any(v.endswith(":/cache") for v in _pairs(calls[-1], "--volume"))
    assert "TRITON_CACHE_DIR" not in _env_of(calls[-1])
    monkeypatch.setenv("KILN_CONTAINER_USER", "image")
    runner.run_pytest(
        place.ContainerPlace("kiln-cpu:0"), M.backend("cpu"), ["t"], out, "t", env={}, echo=False
    )
    assert "--user" not in calls[-1] and "--gpus" not in calls[-1]


def test_native_runs_use_the_compile_cache_of_their_scope_and_toolchain(tmp_path, monkeypatch):
    import importlib.metadata

    monkeypatch.setenv("KILN_COMPILE_CACHE", str(tmp_path))
    for name in (
        "TRITON_CACHE_DIR",
        "KILN_CACHE_DIR",
        "KILN_GRAPH_CACHE_DIR",
        "KILN_AUTOTUNE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    env = commands.native_cache_env()
    folder = Path(env["TRITON_CACHE_DIR"]).parent
    assert folder.parent == tmp_path / "local" and env["KILN_CACHE_DIR"] == str(folder / "kiln")
    assert env["KILN_GRAPH_CACHE_DIR"] == str(folder / "graphs") and "KILN_CACHE_AUTH" not in env
    version = importlib.metadata.version("torch").replace("+", "-")
    assert f"torch{version}" in folder.name  # a new toolchain: another folder
    monkeypatch.setenv("TRITON_CACHE_DIR", "/runner/own")  # outside CI the runner's own setting wins
    assert (
        "TRITON_CACHE_DIR" not in commands.native_cache_env()
        and "KILN_CACHE_DIR" in commands.native_cache_env()
    )
    monkeypatch.setenv("GITHUB_ACTIONS", "true")  # in CI the scope's folder wins: main's job gets main's
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    monkeypatch.setenv("GITHUB_REF", "refs/heads/main")
    monkeypatch.setenv("GITHUB_REPOSITORY", "kiln-org/kiln")
    env = commands.native_cache_env()
    assert Path(env["TRITON_CACHE_DIR"]).parent.parent == tmp_path / "main" and env["KILN_CACHE_AUTH"] == "1"
    monkeypatch.setenv("KILN_COMPILE_CACHE", "0")  # off in CI: folders of the job's own, never the user's
    assert Path(commands.native_cache_env()["KILN_GRAPH_CACHE_DIR"]).is_relative_to(settings().state_dir)
    for name in ("GITHUB_ACTIONS", "GITHUB_EVENT_NAME"):
        monkeypatch.delenv(name)
    assert commands.native_cache_env() == {}


def test_the_compile_cache_key_is_the_images_inputs_hash_or_its_id(monkeypatch):
    place.toolchain_key.cache_clear()
    assert (
        place.toolchain_key("kiln-cuda:0123456789abcdef") == "kiln-cuda:0123456789abcdef"
    )  # no docker asked
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:feedfacecafebeef0000")
    assert (
        place.toolchain_key("kiln-cuda:dev") == "kiln-cuda:dev-feedfacecafebeef"
    )  # a rebuilt :dev: another key
    place.toolchain_key.cache_clear()
