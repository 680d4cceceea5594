"""The pre-flight (harness/checks/preflight.py): the driver through stand-in `nvidia-smi` / `rocm-smi` scripts on PATH,
the visible-devices variables, free disk through a stand-in for shutil.disk_usage, one error line with exit 3, and
the step before the image in `harness run`, the shards, flakes and the bench backend verb."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import matrix
from harness.checks import preflight
from harness.exc import EXIT_INFRA, HarnessError, PreflightError

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")
H100 = "NVIDIA H100 80GB HBM3"


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def nvidia_smi(folder: Path, gpus: int, rc: int = 0) -> None:
    """A stand-in `nvidia-smi` that lists `gpus` GPUs for `-L` (or fails with `rc` as a driver mismatch does)."""
    if rc:
        _tool(
            folder,
            "nvidia-smi",
            f"echo 'Failed to initialize NVML: Driver/library version mismatch'; exit {rc}\n",
        )
        return
    lines = "".join(f"echo 'GPU {i}: {H100} (UUID: GPU-{i}abc-{i})'\n" for i in range(gpus))
    _tool(folder, "nvidia-smi", f'[ "$1" = -L ] || exit 9\n{lines}')


@pytest.fixture
def path_with(tmp_path, monkeypatch):
    """A PATH of a stand-in tools folder plus the system's basics (no nvidia-smi or rocm-smi of the machine)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    return tools


def free(gb: dict[str, float]):
    """A shutil.disk_usage stand-in: `gb` maps path prefixes to free GB (the longest matching prefix wins)."""

    def usage(path: str) -> SimpleNamespace:
        best = max((p for p in gb if path.startswith(p)), key=len)
        return SimpleNamespace(free=gb[best] * preflight.GB)

    return usage


PLENTY = free({"/": 500.0})


# ---- GPUs and visible devices --------------------------------------------------------------------------


def test_nvidia_gpus_come_from_nvidia_smi(path_with):
    nvidia_smi(path_with, 4)
    gpus = preflight.nvidia_gpus()
    assert [g.index for g in gpus] == ["0", "1", "2", "3"] and gpus[2].uuid == "GPU-2abc-2"


def test_no_nvidia_smi_is_one_line_naming_the_driver(path_with):
    with pytest.raises(PreflightError) as e:
        preflight.nvidia_gpus()
    assert str(e.value).startswith("pre-flight cuda: no NVIDIA driver: nvidia-smi not found on PATH")
    assert "\n" not in str(e.value) and e.value.exit_code == EXIT_INFRA


def test_a_failing_nvidia_smi_quotes_its_last_line(path_with):
    nvidia_smi(path_with, 0, rc=18)
    with pytest.raises(
        PreflightError, match=r"nvidia-smi failed \(exit 18: Failed to initialize NVML: Driver/library"
    ):
        preflight.nvidia_gpus()


@pytest.mark.parametrize(
    "value, want",
    [
        ("1,3", ["1", "3"]),  # a runner agent given two GPUs
        ("2", ["2"]),  # one runner agent per GPU
        ("0,7,1", ["0"]),  # the list stops at its first id that names no GPU (as the CUDA runtime reads it)
        ("GPU-3abc", ["GPU-3abc"]),  # a UUID prefix
    ],
)
def test_cuda_visible_devices_narrow_the_gpus(value, want):
    gpus = [preflight.Gpu(str(i), f"GPU-{i}abc-{i}") for i in range(4)]
    assert preflight.visible("cuda", gpus, {"CUDA_VISIBLE_DEVICES": value}) == want
    assert preflight.visible("cuda", gpus, {}) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("value", ["", "-1"])
def test_a_visible_devices_variable_naming_no_gpu_is_an_error_as_in_every_run(value):
    gpus = [preflight.Gpu(str(i), f"GPU-{i}abc-{i}") for i in range(4)]
    with pytest.raises(HarnessError, match="names no GPU"):
        preflight.visible("cuda", gpus, {"CUDA_VISIBLE_DEVICES": value})


def test_rocm_reads_the_visible_set_as_runs_do_hip_indexing_rocr():
    gpus = [preflight.Gpu(str(i)) for i in range(8)]
    env = {"HIP_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "5,2", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert preflight.visible("rocm", gpus, env) == ["2"]  # HIP's 1 is ROCR's second GPU: the host's GPU 2
    env.pop("HIP_VISIBLE_DEVICES")
    assert preflight.visible("rocm", gpus, env) == [
        "5",
        "2",
    ]  # HIP reads CUDA_VISIBLE_DEVICES too, over ROCR's list
    env.pop("CUDA_VISIBLE_DEVICES")
    assert preflight.visible("rocm", gpus, env) == ["5", "2"]
    assert preflight.visible("rocm", gpus, {"CUDA_VISIBLE_DEVICES": "3"}) == ["3"]


def test_amd_gpus_from_rocm_smi_else_render_nodes(path_with, tmp_path):
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    with pytest.raises(PreflightError, match=r"^pre-flight rocm: no AMD GPU driver: .*kfd does not exist"):
        preflight.amd_gpus(dev=dev)
    (dev / "kfd").touch()
    for i in range(3):
        (dev / "dri" / f"renderD{128 + i}").touch()
    assert len(preflight.amd_gpus(dev=dev)) == 3  # no rocm-smi: the render nodes
    _tool(path_with, "rocm-smi", "echo 'device,Device ID'; echo 'card0,0x74a1'; echo 'card1,0x74a1'\n")
    assert len(preflight.amd_gpus(dev=dev)) == 2  # rocm-smi's cards win
    _tool(path_with, "rocm-smi", "exit 1\n")
    assert len(preflight.amd_gpus(dev=dev)) == 3  # a failing rocm-smi: the render nodes again


def test_the_gpu_must_be_the_model_the_job_label_names(path_with, tmp_path):
    """KILN_GPU_LABEL (the job's `gpu-*` label, with or without its prefix) against the names the driver gives:
    an H100 passes `h100` and `gpu-h100`, fails `gpu-mi300x` in one line; no label: nothing checked."""
    nvidia_smi(path_with, 2)
    assert preflight.nvidia_gpus()[1].name == H100
    cuda = M.backend("cuda")
    for label in ("h100", "gpu-h100", "GPU-H100", ""):
        preflight.check(cuda, docker=False, env={"KILN_GPU_LABEL": label}, results=tmp_path, usage=PLENTY)
    with pytest.raises(PreflightError) as e:
        preflight.check(
            cuda, docker=False, env={"KILN_GPU_LABEL": "gpu-mi300x"}, results=tmp_path, usage=PLENTY
        )
    assert str(e.value) == (
        f"pre-flight cuda: the job's label is gpu-mi300x but GPU 0 is '{H100}'; this runner's "
        "labels do not name its GPU: fix them (KILN_GPU_LABEL)"
    )
    # only the GPUs the job may use are checked
    _tool(
        path_with,
        "nvidia-smi",
        f"""[ "$1" = -L ] || exit 9
echo 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0abc-0)'
echo 'GPU 1: {H100} (UUID: GPU-1abc-1)'
""",
    )
    preflight.check(
        cuda,
        docker=False,
        env={"KILN_GPU_LABEL": "gpu-h100", "CUDA_VISIBLE_DEVICES": "1"},
        results=tmp_path,
        usage=PLENTY,
    )
    with pytest.raises(
        PreflightError, match=r"^pre-flight cuda: the job's label is gpu-h100 but GPU 0 is 'NVIDIA A100"
    ):
        preflight.check(
            cuda, docker=False, env={"KILN_GPU_LABEL": "gpu-h100"}, results=tmp_path, usage=PLENTY
        )


def test_amd_gpu_names_come_from_rocm_smi_product_names(path_with, tmp_path):
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").touch()
    _tool(
        path_with,
        "rocm-smi",
        """case "$*" in
  *--showproductname*) echo 'device,Card Series,Card Vendor'; echo 'card0,AMD Instinct MI300X,AMD';;
  *) echo 'device,Device ID'; echo 'card0,0x74a1';;
esac
""",
    )
    (gpu,) = preflight.amd_gpus(dev=dev)
    assert gpu.name == "AMD Instinct MI300X AMD"
    preflight.check_label("rocm", "gpu-mi300x", [gpu])
    with pytest.raises(PreflightError, match=r"^pre-flight rocm: the job's label is gpu-mi250 but GPU 0 is "):
        preflight.check_label("rocm", "gpu-mi250", [gpu])
    preflight.check_label(
        "rocm", "gpu-mi250", [preflight.Gpu("0")]
    )  # a GPU the driver does not name: unchecked


# ---- the whole check -----------------------------------------------------------------------------------


def test_a_cuda_job_needs_as_many_visible_gpus_as_it_asks(path_with, tmp_path):
    nvidia_smi(path_with, 2)
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    report = preflight.check(M.backend("cuda"), docker=False, env=env, results=tmp_path, usage=PLENTY)
    assert report.visible == ["1"] and report.line().startswith(
        "pre-flight cuda: ok (1 of 2 GPU(s) visible; "
    )
    with pytest.raises(PreflightError) as e:
        preflight.check(M.backend("cuda"), docker=False, need_gpus=2, env=env, results=tmp_path, usage=PLENTY)
    assert str(e.value) == (
        "pre-flight cuda: 1 GPU(s) visible (CUDA_VISIBLE_DEVICES='1') of 2 on this machine, the job needs 2"
    )


def test_too_little_free_disk_names_the_place_and_the_threshold(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_MIN_FREE_GB", raising=False)
    results = tmp_path / "results" / "not-yet"  # measured at its nearest existing parent
    cpu = M.backend("cpu")
    with pytest.raises(PreflightError) as e:
        preflight.check(cpu, docker=False, results=results, usage=free({"/": 0.4}))
    assert str(e.value).startswith(f"pre-flight cpu: 0.4 GB free at the results folder {results}, need 1 GB")
    # container mode: the docker root, with the backend's threshold (KILN_MIN_FREE_GB overrides it)
    monkeypatch.setattr("harness.docker_client.require_docker", lambda: None)
    info = lambda argv: subprocess.CompletedProcess(argv, 0, "/var/lib/docker\n", "")  # noqa: E731
    absent = lambda b: False  # noqa: E731
    with pytest.raises(PreflightError, match=r"3\.0 GB free at the docker root /var/lib/docker, need 5 GB"):
        preflight.check(cpu, docker=True, results=tmp_path, run=info, usage=free({"/": 3.0}), present=absent)
    monkeypatch.setenv("KILN_MIN_FREE_GB", "2.5")
    report = preflight.check(
        cpu, docker=True, results=tmp_path, run=info, usage=free({"/": 3.0}), present=absent
    )
    assert "3.0 GB free at the docker root /var/lib/docker (need 2.5 GB)" in report.line()


def test_a_present_image_needs_only_room_for_its_containers(tmp_path, monkeypatch):
    """The build's threshold is for building: with the job's image already there, the docker root needs
    PRESENT_MIN_FREE_GB (a runner with 3.7 GB left after its image build could not run its CPU suites)."""
    monkeypatch.delenv("KILN_MIN_FREE_GB", raising=False)
    monkeypatch.setattr("harness.docker_client.require_docker", lambda: None)
    info = lambda argv: subprocess.CompletedProcess(argv, 0, "/var/lib/docker\n", "")  # noqa: E731
    cpu, asked = M.backend("cpu"), []
    present = lambda b: asked.append(b.name) or True  # noqa: E731
    report = preflight.check(
        cpu, docker=True, results=tmp_path, run=info, usage=free({"/": 3.7}), present=present
    )
    assert asked == ["cpu"] and "3.7 GB free at the docker root /var/lib/docker (need 1 GB)" in report.line()
    with pytest.raises(PreflightError, match=r"0\.5 GB free at the docker root /var/lib/docker, need 1 GB"):
        preflight.check(cpu, docker=True, results=tmp_path, run=info, usage=free({"/": 0.5}), present=present)
    # KILN_MIN_FREE_GB is the threshold whatever is present, and the image is then not looked up
    monkeypatch.setenv("KILN_MIN_FREE_GB", "4")
    asked.clear()
    with pytest.raises(PreflightError, match=r"need 4 GB"):
        preflight.check(cpu, docker=True, results=tmp_path, run=info, usage=free({"/": 3.7}), present=present)
    assert asked == []


def test_image_present_looks_up_the_tag_and_this_scopes_name(monkeypatch):
    from harness.images import image as image_mod

    looked: list[str] = []
    monkeypatch.setattr(
        image_mod,
        "image_id",
        lambda ref: looked.append(ref) or ("sha256:1" if ref.endswith("-pr:abc") else None),
    )
    monkeypatch.setenv("KILN_CACHE_SCOPE", "pr")
    assert preflight.image_present(M.backend("cpu"), "kiln-cpu:abc") is True
    assert looked == ["kiln-cpu:abc", "kiln-cpu-pr:abc"]
    looked.clear()
    assert preflight.image_present(M.backend("cpu"), "kiln-cpu:zzz") is False
    # no tag given: the one `harness image build` would use now for this checkout
    monkeypatch.setattr(image_mod, "current_tag", lambda b, base=None: "kiln-cpu:now")
    looked.clear()
    preflight.image_present(M.backend("cpu"))
    assert looked == ["kiln-cpu:now", "kiln-cpu-pr:now"]

    # a tag that cannot be worked out reads as absent (the build then says why)
    def broken(b, base=None):
        raise OSError("unreadable lock")

    monkeypatch.setattr(image_mod, "current_tag", broken)
    assert preflight.image_present(M.backend("cpu")) is False


def test_the_driver_is_checked_before_docker_and_disk(path_with, tmp_path, monkeypatch):
    """On a machine without a GPU a GPU job stops at the driver, whatever docker and the disk say."""
    monkeypatch.setattr("harness.docker_client.require_docker", lambda: (_ for _ in ()).throw(AssertionError))
    with pytest.raises(PreflightError, match="^pre-flight cuda: no NVIDIA driver"):
        preflight.check(M.backend("cuda"), docker=True, results=tmp_path, usage=free({"/": 0.0}))


def test_the_cli_fails_with_one_line_and_exit_3(path_with, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_RESULTS": str(tmp_path / "r")}
    for verb in (["preflight"], ["run"]):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", *verb, "--backend", "cuda", "--native"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
        assert proc.returncode == EXIT_INFRA, proc.stderr
        assert proc.stderr.splitlines() == [
            f"harness {verb[0]}: error: pre-flight cuda: no NVIDIA driver: nvidia-smi not found on PATH; run cuda "
            "jobs on a runner with the NVIDIA driver and container toolkit (here: --backend cpu)"
        ]
    assert not (tmp_path / "r").exists()  # stopped before any run folder was written
    nvidia_smi(path_with, 1)
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "preflight", "--backend", "cuda", "--native"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("pre-flight cuda: ok (1 of 1 GPU(s) visible; ")


def test_the_run_and_the_shards_check_before_the_image():
    from harness.suites import sharded, steps

    names = [name for name, _ in steps.SETUP]
    assert names.index("pre-flight") < names.index("image")
    names = [name for name, _ in sharded.SETUP_STEPS]
    assert names.index("pre-flight") < names.index("image")


@pytest.mark.parametrize(
    "verb",
    [
        ["flakes", "--backend", "cuda", "--runs", "2", "--out", "{tmp}/f", "tests/harness/test_preflight.py"],
        ["bench", "backend", "--backend", "cuda", "--results", "{tmp}/b"],
        ["run", "--backend", "rocm", "--shards", "2", "--devices", "0,1"],
        ["run", "--backend", "cuda", "--shards", "auto"],  # the driver is checked before the GPUs are counted
    ],
)
def test_flakes_bench_and_shards_stop_at_the_pre_flight(path_with, tmp_path, verb):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_RESULTS": str(tmp_path / "r"), "KILN_NATIVE": "0"}
    argv = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == EXIT_INFRA, proc.stdout + proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .split(": error: ")[1]
        .startswith(f"pre-flight {argv[argv.index('--backend') + 1]}: no ")
    )
