# Kiln CUDA image: the suites on NVIDIA GPUs. Run with `--gpus ...` (NVIDIA container toolkit on the host).
# No CUDA base image: torch's Linux x86-64 wheel from the package index is the CUDA build and carries the CUDA
# runtime as nvidia-* wheels (cuBLAS, cuDNN, NVRTC...), Triton's wheel carries ptxas; the driver (libcuda) comes
# from the host through the toolkit. So it builds on the same Debian base as the CPU image: bootstrapped with
# debootstrap where no registry serves BASE_IMAGE, else the matrix's tag (tag@sha256:digest once pinned).
# Built by `python -m harness image build --backend cuda`; tagged with the hash of this file, the build args,
# the base's local image id, the lock, docker/requirements-test.txt and the project metadata. Defaults below
# equal ci/matrix.json (a test checks it). The build context holds wheels/ (a wheelhouse the harness fills
# from the host's pip, hash-checked against the lock), so the build needs no index.
ARG BASE_IMAGE=debian:bookworm-20251117-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC=torch==2.13.0
ARG TRITON_SPEC=triton==3.7.1
ARG TORCH_VARIANT=cu130
LABEL kiln.torch-variant="${TORCH_VARIANT}" kiln.torch-spec="${TORCH_SPEC}" kiln.triton-spec="${TRITON_SPEC}"
# index arguments come from the harness (image.build_argv): the wheelhouse build needs none
ARG PIP_INDEX_ARGS="--no-index"

# lock.txt is docker/lock/<backend>.txt (`nox -s lock`): every package pinned with its sha256 hashes, installed
# hash-checked and without dependency resolution. The harness passes "" only for an unlocked build that was
# asked for (KILN_ALLOW_UNLOCKED=1, then lock.txt holds the top-level pins alone).
ARG PIP_LOCK_ARGS="--require-hashes --no-deps"

SHELL ["/bin/sh", "-eu", "-c"]
# NVIDIA_DRIVER_CAPABILITIES: the toolkit mounts libcuda only for `compute` (its default is `utility` alone).
# NVIDIA_VISIBLE_DEVICES is left to `--gpus` so that a runner's GPU pinning holds.
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# gcc, libc6-dev and python3-dev: Triton builds its small CUDA launcher module with the C compiler at run time
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH

COPY requirements-test.txt lock.txt /opt/kiln/
# hadolint ignore=DL3042
RUN --mount=type=bind,source=wheels,target=/opt/kiln/wheels \
    pip install --find-links /opt/kiln/wheels ${PIP_INDEX_ARGS} ${PIP_LOCK_ARGS} -r /opt/kiln/lock.txt \
    && python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

RUN useradd --create-home --uid 1000 --shell /bin/sh kiln
USER 1000:1000
WORKDIR /src
ENV PYTHONPATH=/src \
    KILN_LOCK_FILE=/opt/kiln/lock.txt \
    PYTHONDONTWRITEBYTECODE=1 \
    KILN_TEST_DEVICE=cuda
