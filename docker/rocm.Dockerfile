# Kiln ROCm image: the suites on AMD GPUs. Run with
# `--device=/dev/kfd --device=/dev/dri --group-add video`.
# Built by `python -m harness image build --backend rocm`; tagged with the hash of this file, the build
# args (BASE_IMAGE is tag@sha256:digest once pinned), the lock, docker/requirements-test.txt and the
# project metadata. Defaults below equal ci/matrix.json.
ARG BASE_IMAGE=rocm/dev-ubuntu-24.04:7.0.2
FROM ${BASE_IMAGE}

ARG TORCH_SPEC=torch==2.13.0
ARG TRITON_SPEC=pytorch-triton-rocm==3.9.0
ARG TORCH_VARIANT=rocm7.0
LABEL kiln.torch-variant="${TORCH_VARIANT}" kiln.torch-spec="${TORCH_SPEC}" kiln.triton-spec="${TRITON_SPEC}"
# index arguments come from the harness (pip's variables, KILN_TORCH_INDEX_URL/<variant>); empty: pip's
# own configuration and defaults. No index host is written here.
ARG PIP_INDEX_ARGS=""

# lock.txt is docker/lock/<backend>.txt (`nox -s lock`): every package pinned with its sha256 hashes, installed
# hash-checked and without dependency resolution. The harness passes "" only for an unlocked build that was
# asked for (KILN_ALLOW_UNLOCKED=1, then lock.txt holds the top-level pins alone).
ARG PIP_LOCK_ARGS="--require-hashes --no-deps"

SHELL ["/bin/sh", "-eu", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH

COPY requirements-test.txt lock.txt /opt/kiln/
# hadolint ignore=DL3042
RUN --mount=type=bind,source=wheels,target=/opt/kiln/wheels \
    pip install --find-links /opt/kiln/wheels ${PIP_INDEX_ARGS} ${PIP_LOCK_ARGS} -r /opt/kiln/lock.txt \
    && python -c "import torch, triton; print('torch', torch.__version__, 'hip', torch.version.hip, 'triton', triton.__version__)"

# The base image may already own uid 1000 (ubuntu); reuse the uid, name the user kiln.
# video and render give the user access to /dev/kfd and /dev/dri.
RUN if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -un 1000)"; fi \
    && useradd --create-home --uid 1000 --shell /bin/sh --groups video kiln \
    && (getent group render >/dev/null && usermod -aG render kiln || true)
USER 1000:1000
WORKDIR /src
ENV PYTHONPATH=/src \
    KILN_LOCK_FILE=/opt/kiln/lock.txt \
    PYTHONDONTWRITEBYTECODE=1 \
    KILN_TEST_DEVICE=cuda
