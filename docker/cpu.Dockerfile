# Kiln CPU image: the suites under Triton's interpreter (TRITON_INTERPRET=1), no GPU.
# Built by `python -m harness image build --backend cpu`, which tags it with the hash of this file, the
# build args, the base's local image id, the lock, docker/requirements-test.txt and the project
# metadata. The defaults below equal ci/matrix.json (a test checks it). When no registry serves
# BASE_IMAGE, the harness bootstraps a Debian base with debootstrap and passes it as BASE_IMAGE.
# The build context holds wheels/ (a wheelhouse the harness fills from the host's pip), so the build
# needs no network for Python packages.
ARG BASE_IMAGE=debian:bookworm-20251117-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC=torch==2.13.0
ARG TRITON_SPEC=triton==3.9.0
ARG TORCH_VARIANT=cpu
LABEL kiln.torch-variant="${TORCH_VARIANT}" kiln.torch-spec="${TORCH_SPEC}" kiln.triton-spec="${TRITON_SPEC}"
# index arguments come from the harness (image.build_argv): the wheelhouse build needs none
ARG PIP_INDEX_ARGS="--no-index"

# lock.txt is docker/lock/<backend>.txt (`nox -s lock`): every package pinned with its sha256 hashes, installed
# hash-checked and without dependency resolution. The harness passes "" only for an unlocked build that was
# asked for (KILN_ALLOW_UNLOCKED=1, then lock.txt holds the top-level pins alone).
ARG PIP_LOCK_ARGS="--require-hashes --no-deps"

SHELL ["/bin/sh", "-eu", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# g++ and python3-dev: Inductor's CPU code generation compiles C++ (with Python's headers); the bench compares
# kiln with Inductor in this image too
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates g++ python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH

COPY requirements-test.txt lock.txt /opt/kiln/
# hadolint ignore=DL3042
RUN --mount=type=bind,source=wheels,target=/opt/kiln/wheels \
    pip install --find-links /opt/kiln/wheels ${PIP_INDEX_ARGS} ${PIP_LOCK_ARGS} -r /opt/kiln/lock.txt \
    && python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

RUN useradd --create-home --uid 1000 --shell /bin/sh kiln
USER 1000:1000
WORKDIR /src
# The source tree is mounted read-only at /src; results are written to /results.
ENV PYTHONPATH=/src \
    KILN_LOCK_FILE=/opt/kiln/lock.txt \
    PYTHONDONTWRITEBYTECODE=1 \
    TRITON_INTERPRET=1 \
    KILN_TEST_DEVICE=cpu
