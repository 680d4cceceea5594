"""Container and native runs of one machine are separate hardware classes: neither is the other's baseline.

The harness puts KILN_RUN_MODE=container in the environment of every container it starts (harness/commands.py);
harness/store/runner.py adds the mode to the hardware class that bench baselines stay within.
"""

from __future__ import annotations

import pytest
from bench_helpers import make_results, store_run

from harness import commands, matrix
from harness.bench.judge.compare import BaselineError, resolve_baseline
from harness.store import runner

CPU_NAME = "cpu: Test CPU @ 2.0GHz"


@pytest.fixture(autouse=True)
def _no_label(monkeypatch):
    for name in ("KILN_GPU_LABEL", "KILN_RUN_MODE"):
        monkeypatch.delenv(name, raising=False)


def test_the_mode_is_part_of_the_hardware_class(monkeypatch):
    assert runner.current(CPU_NAME).hw_class == CPU_NAME
    monkeypatch.setenv("KILN_RUN_MODE", "container")
    assert runner.current(CPU_NAME).hw_class == f"{CPU_NAME} (container)"
    monkeypatch.setenv("KILN_GPU_LABEL", "h100")
    assert runner.current("NVIDIA H100 80GB HBM3").hw_class == "h100 (container)"


def test_every_container_the_harness_starts_says_it_is_one():
    m = matrix.load()
    argv = commands.container_argv(
        m.backend("cpu"), "kiln-cpu:x", ["true"], src="/repo", env={"KILN_RUN_MODE": "native"}
    )  # a caller's value cannot hide the container
    assert "KILN_RUN_MODE=container" in argv and "KILN_RUN_MODE=native" not in argv


def test_a_container_run_never_takes_a_native_run_as_its_baseline(store, monkeypatch):
    native = store_run(store, make_results({("w", "kiln"): 1.0}), device_name=CPU_NAME)
    assert native.hw_class == CPU_NAME
    monkeypatch.setenv("KILN_RUN_MODE", "container")
    boxed = store_run(store, make_results({("w", "kiln"): 3.0}), complete=False, device_name=CPU_NAME)
    assert boxed.hw_class == f"{CPU_NAME} (container)"
    with pytest.raises(BaselineError, match="no complete run"):
        resolve_baseline(store, "latest", boxed)
    monkeypatch.delenv("KILN_RUN_MODE")
    again = store_run(store, make_results({("w", "kiln"): 1.0}), complete=False, device_name=CPU_NAME)
    assert [r.id for r in resolve_baseline(store, "latest", again)] == [native.id]
