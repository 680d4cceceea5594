"""The numerics suite's save hook: ``KILN_NUMERICS_SAVE=DIR`` saves every kiln run of these tests (with eager's
result and the float64 reference on the same inputs) as numerics run folders under DIR, so runs of two machines
or compilers are compared later: ``python -m harness numerics compare DIR_A:kiln DIR_B:kiln``."""

from __future__ import annotations

import pytest

import kiln_testing


@pytest.fixture(autouse=True)
def _numerics_save(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    from harness.numerics import suite

    root = suite.save_dir()
    if root is None:
        yield
        return
    recorder = suite.Recorder(root, request.node.nodeid)
    original = kiln_testing.run_compiled

    def run_compiled(fn, *args, **kwargs):
        out, graphs = original(fn, *args, **kwargs)
        recorder.record(fn, args, out, kwargs)
        return out, graphs

    monkeypatch.setattr(kiln_testing, "run_compiled", run_compiled)  # check() calls it through the module
    monkeypatch.setattr(request.module, "run_compiled", run_compiled, raising=False)
    yield
