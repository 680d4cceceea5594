"""The CUDA image without a CUDA base image: the matrix, docker/cuda.Dockerfile and the committed
docker/lock/cuda.txt agree; the lock names PyPI's CUDA build of torch with its nvidia-* runtime wheels and hashes
for every package, and its resolution leaves this machine's local wheel folders out. Nothing here builds it (a
5-6 GB image: by hand only, never in .ci/run)."""

from __future__ import annotations

import os
from pathlib import Path

from harness import matrix
from harness.images import image, lock

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")
CUDA = M.backend("cuda")


def test_cuda_builds_on_the_cpu_images_bootstrapped_base_from_a_wheelhouse():
    cpu = M.backend("cpu")
    assert CUDA.bootstrap == cpu.bootstrap and CUDA.base_image == cpu.base_image
    assert CUDA.python == cpu.python  # the Debian base's own python3
    assert CUDA.wheelhouse and CUDA.index_args() == "--no-index" and CUDA.torch_index == "index"
    assert M.backend("rocm").torch_index == "variant" and not M.backend("rocm").wheelhouse  # ROCm: its index
    text = (ROOT / CUDA.dockerfile).read_text()
    assert "nvidia/cuda" not in text.split("FROM", 1)[1]  # no CUDA base image
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text  # libcuda is mounted only for `compute`
    assert "NVIDIA_VISIBLE_DEVICES" not in text.replace(
        "NVIDIA_VISIBLE_DEVICES is left", ""
    )  # --gpus decides
    assert (
        " gcc " in text and "python3-dev" in text
    )  # Triton builds its launcher with the C compiler at run time


def test_the_cuda_lock_is_current_hashed_and_names_the_cuda_build():
    state = lock.state(CUDA, ROOT)
    assert state.exists and state.problem() is None, state.problem()
    body = state.path.read_text()
    assert lock.resolved_problems(CUDA, body) == []
    pins = lock.pins(state.path)
    assert f"torch=={pins['torch']}" == CUDA.torch and f"triton=={pins['triton']}" == CUDA.triton
    for name in ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cuda-nvrtc"):
        assert name in pins, name
    for line in body.splitlines():
        if lock._PIN.match(line):
            assert line.endswith("\\"), line
    assert "index-url" not in body and "find-links" not in body and "+cpu" not in body


def test_the_image_tag_hashes_the_cuda_lock(tmp_path):
    root = tmp_path / "root"
    (root / "docker" / "lock").mkdir(parents=True)
    for rel in (
        "docker/cuda.Dockerfile",
        "docker/requirements-test.txt",
        "docker/lock/cuda.txt",
        "pyproject.toml",
    ):
        (root / rel).write_bytes((ROOT / rel).read_bytes())
    inputs = image.image_inputs(CUDA, root=root)
    assert inputs["lock"] == (ROOT / "docker/lock/cuda.txt").read_text()
    tag = image.image_tag(CUDA, root=root)
    path = root / "docker/lock/cuda.txt"
    path.write_text(path.read_text().replace("nvidia-cuda-runtime==", "nvidia-cuda-runtime==0"))
    assert image.image_tag(CUDA, root=root) != tag


def test_resolved_problems_catch_a_cpu_torch_missing_runtime_wheels_and_unhashed_pins():
    good = (
        "torch==2.13.0 \\\n    --hash=sha256:aa\ntriton==3.7.1 \\\n    --hash=sha256:bb\n"
        "nvidia-cuda-runtime==13.0.96 \\\n    --hash=sha256:cc\n"
    )
    assert lock.resolved_problems(CUDA, good) == []
    cpu_torch = good.replace("torch==2.13.0", "torch==2.13.0+cpu").replace("nvidia-cuda-runtime", "numpy")
    found = lock.resolved_problems(CUDA, cpu_torch)
    assert any("a local build" in p for p in found) and any("not a CUDA build" in p for p in found)
    assert any("matrix pins torch==2.13.0" in p for p in found)
    assert lock.resolved_problems(CUDA, good.replace("triton==3.7.1 \\", "triton==3.7.1")) == [
        "packages without hashes: triton==3.7.1"
    ]
    assert "triton resolved as 3.9.0" in lock.resolved_problems(CUDA, good.replace("3.7.1", "3.9.0"))[0]
    # the cpu lock's `+cpu` torch is what its pip resolves (its local wheel folders): not a problem there
    assert lock.resolved_problems(M.backend("cpu"), cpu_torch.replace("3.7.1", "3.9.0")) == []


def test_the_index_only_resolution_leaves_local_wheel_folders_out():
    env = {
        "PIP_FIND_LINKS": "/opt/wheels",
        "PIP_EXTRA_INDEX_URL": "file:///opt/more",
        "PIP_CONSTRAINT": "/c.txt",
        "PIP_DEFAULT_TIMEOUT": "180",
        "PATH": "/usr/bin",
    }
    config = {"global.index-url": "https://mirror.test/simple", "global.cert": "/etc/ca.crt"}
    out = lock.index_only_env(env, config=lambda key: config.get(key, ""))
    assert (
        out["PIP_CONFIG_FILE"] == os.devnull
    )  # none of pip's configuration files (find-links, extra indexes)
    assert not {"PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"} & set(out)
    assert out["PIP_INDEX_URL"] == "https://mirror.test/simple" and out["PIP_CERT"] == "/etc/ca.crt"
    assert out["PIP_DEFAULT_TIMEOUT"] == "180"
    env["PIP_INDEX_URL"] = "https://own.test/simple"  # pip's own variable wins over its configuration
    assert (
        lock.index_only_env(env, config=lambda key: config.get(key, ""))["PIP_INDEX_URL"]
        == env["PIP_INDEX_URL"]
    )
    assert "PIP_INDEX_URL" not in lock.index_only_env({}, config=lambda key: "")  # nothing set: pip's default


def test_the_wheelhouse_takes_every_manylinux_tag_the_base_runs():
    argv = image.wheelhouse_argv(CUDA, Path("/w"), ROOT)
    tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    for tag in (
        "manylinux_2_18_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux2014_x86_64",
    ):
        assert tag in tags, tag  # nvidia-nccl-cu13 is 2_18, cuDNN and cuBLAS 2_27, torch 2_28
    assert "manylinux_2_37_x86_64" not in tags and "manylinux_2_36_x86_64" in tags  # bookworm's glibc is 2.36
    assert argv[argv.index("-r") + 1].endswith("docker/lock/cuda.txt") and "--require-hashes" in argv


def test_nothing_in_the_ci_script_builds_the_gpu_images():
    text = (ROOT / ".ci" / "run").read_text()
    assert "--backend cpu" in text
    for backend in ("cuda", "rocm"):
        assert f"--backend {backend}" not in text and f"tests-{backend}" not in text
