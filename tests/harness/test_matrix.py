"""ci/matrix.json: the real file is valid and agrees with the Dockerfiles; bad files give clear errors."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import MatrixError, UnknownBackend

ROOT = Path(__file__).resolve().parents[2]
REAL = json.loads((ROOT / "ci" / "matrix.json").read_text())


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(data))
    return path


def test_real_matrix_loads_with_three_backends():
    m = matrix.load(ROOT / "ci" / "matrix.json")
    assert list(m.backends) == ["cpu", "cuda", "rocm"]
    assert m.suites == ("dynamic_shapes", "control_flow", "fallback", "numerics")
    # GPU access (--gpus, /dev/kfd and render nodes, the render group) comes from harness.gpus, for the GPUs the
    # runner was given: the matrix names no device of its own
    for name in ("cuda", "rocm"):
        opts = " ".join(m.backend(name).container_options)
        assert "--gpus" not in opts and "/dev/" not in opts and "--group-add" not in opts, opts
    assert not m.backend("cpu").is_gpu and m.backend("cuda").is_gpu


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    out = {}
    for line in dockerfile.read_text().splitlines():
        found = re.match(r"^ARG (\w+)=(.*)$", line.strip())
        if found:
            out[found.group(1)] = found.group(2).strip().strip('"')
    return out


@pytest.mark.parametrize("name", ["cpu", "cuda", "rocm"])
def test_dockerfile_arg_defaults_equal_the_matrix(name):
    b = matrix.load(ROOT / "ci" / "matrix.json").backend(name)
    dockerfile = ROOT / b.dockerfile
    index_default = "--no-index" if b.wheelhouse else ""  # the index itself comes from the environment
    assert _arg_defaults(dockerfile) == {
        **b.build_args(),
        "PIP_INDEX_ARGS": index_default,
        "PIP_LOCK_ARGS": "--require-hashes --no-deps",
    }
    assert _arg_defaults(dockerfile)["BASE_IMAGE"] == b.base_ref  # tag@sha256:... once pinned (image --pin)
    assert "-r /opt/kiln/lock.txt" in dockerfile.read_text() and "${PIP_LOCK_ARGS}" in dockerfile.read_text()
    text = dockerfile.read_text()
    assert "USER 1000:1000" in text and "useradd --create-home --uid 1000" in text  # non-root user
    assert text.index("FROM ${BASE_IMAGE}") > text.index("ARG BASE_IMAGE=")


def test_unknown_backend_names_the_known_ones():
    m = matrix.load(ROOT / "ci" / "matrix.json")
    with pytest.raises(UnknownBackend, match=r"unknown backend 'tpu'.*cpu, cuda, rocm"):
        m.backend("tpu")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["backends"]["cuda"].pop("image"), r"backends\.cuda\.image: missing"),
        (lambda d: d["backends"]["cpu"]["timeouts"].update(test_s="600"), r"timeouts\.test_s: expected int"),
        (lambda d: d["backends"]["cpu"]["timeouts"].update(test_s=True), r"timeouts\.test_s: expected int"),
        (lambda d: d["backends"]["cpu"].update(extra=1), r"backends\.cpu: unknown key\(s\) extra"),
        (
            lambda d: d["backends"]["cpu"].update(torch="torch>=2"),
            r"backends\.cpu\.torch: must be an exact pin",
        ),
        (lambda d: d["backends"]["cpu"].update(base_image="debian:latest"), r"base_image: must be pinned"),
        (
            lambda d: d["backends"]["rocm"].update(container_options="--gpus all"),
            r"container_options: expected list",
        ),
        (lambda d: d["backends"]["cpu"]["timeouts"].update(suite_s=1), r"suite_s \(1\) must be >= test_s"),
        (lambda d: d.update(schema=99), r"schema 99 is not supported"),
        (lambda d: d["backends"].clear(), r"no backends defined"),
    ],
)
def test_bad_matrix_gives_a_clear_error(tmp_path, mutate, message):
    data = copy.deepcopy(REAL)
    mutate(data)
    with pytest.raises(MatrixError, match=message):
        matrix.load(_write(tmp_path, data))


def test_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(MatrixError, match="cannot read matrix file"):
        matrix.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(MatrixError, match=r"not valid JSON: .* line 1"):
        matrix.load(bad)
