"""Bad input: one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("KILN_NATIVE", None)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full,
        timeout=120,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_usage_lists_the_verbs():
    proc = cli()
    assert proc.returncode == 2
    for verb in ("run", "repro", "env", "health", "image", "report", "detect"):
        assert f"\n  {verb} " in proc.stdout


def test_unknown_verb():
    assert one_error_line(cli("bake")).startswith("harness: error: unknown verb 'bake'; known: run, ")


def test_unknown_backend():
    line = one_error_line(cli("run", "--backend", "tpu"))
    assert (
        line
        == f"harness run: error: unknown backend 'tpu': {ROOT / 'ci' / 'matrix.json'} defines cpu, cuda, rocm"
    )


def test_no_docker():  # infrastructure: exit 3 (harness/exc.py), not 2 like a bad flag
    proc = cli("run", "--backend", "cpu", KILN_DOCKER="/nonexistent/docker")
    assert proc.returncode == 3
    assert "docker client '/nonexistent/docker' not found" in one_error_line(proc)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_no_gpu_for_a_gpu_session():
    proc = cli("run", "--backend", "cuda")
    line = one_error_line(proc)
    assert proc.returncode == 3  # the pre-flight (harness/checks/preflight.py), before any image build
    assert "pre-flight cuda: no NVIDIA driver: nvidia-smi not found on PATH" in line


@pytest.mark.skipif(Path("/dev/kfd").exists(), reason="this machine has an AMD GPU driver")
def test_no_gpu_for_a_rocm_session():
    line = one_error_line(cli("run", "--backend", "rocm"))
    assert "pre-flight rocm: no AMD GPU driver: /dev/kfd does not exist" in line


def test_unknown_suite():
    line = one_error_line(cli("run", "--backend", "cpu", "--native", "--suite", "nope"))
    assert "unknown suite(s) nope" in line


def test_missing_and_foreign_results_folders(tmp_path):
    assert "does not exist" in one_error_line(cli("repro", str(tmp_path / "none")))
    assert "not a harness results folder" in one_error_line(cli("report", str(tmp_path)))


def test_broken_matrix(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{")
    assert "not valid JSON" in one_error_line(cli("matrix", KILN_MATRIX=str(bad)))
