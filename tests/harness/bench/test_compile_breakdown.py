"""Cold compile per phase: ``compile_times.phase_breakdown`` on a real kiln compile in this process, the probe's
breakdown carried into ``CompileTimes`` and the model tier's ``Result``, and its report table."""

from __future__ import annotations

import time

import torch

from harness.bench.core.records import Meta, Result
from harness.bench.models import compile_times as ct


def _compile_and_run() -> float:
    import compiler  # noqa: F401  (registers the backend)

    def f(x, w):
        return torch.nn.functional.layer_norm(x @ w, (16,)).relu().sum()

    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    torch._dynamo.reset()
    start = time.perf_counter()
    torch.compile(f, backend="kiln")(x, w).backward()
    return time.perf_counter() - start


def test_kiln_breakdown_names_every_phase_and_sums_within_the_wall_time():
    from compiler.backend import PASSES

    ct.reset_phase_timers()
    wall = _compile_and_run()
    b = ct.phase_breakdown(kiln=True)
    assert {"dynamo", "aot_autograd", "backend_other", "kiln.graph", "kiln.kernel_load"} <= set(b)
    assert {f"kiln.pass.{p.name}" for p in PASSES} <= set(b)
    assert all(v >= 0 for v in b.values())
    assert b["dynamo"] > 0 and b["aot_autograd"] > 0 and b["kiln.pass.lower"] > 0
    assert sum(b.values()) <= wall


def test_compile_counts_start_from_zero_at_the_reset():
    """The probe's compile counters cover its compiled steps only (reset with the phase timers); on the CPU
    (Triton's interpreter) nothing is compiled for a GPU and no graph comes from a cache."""
    from compiler.runtime import gpu_compile

    gpu_compile.count(compiled=5, worker_seconds=2.0)
    ct.reset_phase_timers()
    _compile_and_run()
    counts = ct.compile_counts()
    assert set(counts) == set(ct.COMPILE_COUNTS)
    assert counts["compiled"] == 0 and counts["worker_seconds"] == 0 and counts["graph_hits"] == 0


def test_other_compilers_get_dynamo_and_their_backend():
    ct.reset_phase_timers()
    wall = _compile_and_run()
    b = ct.phase_breakdown(kiln=False)
    assert set(b) == {"dynamo", "backend"} and b["backend"] > 0
    assert sum(b.values()) <= wall


def test_measure_keeps_the_cold_probes_breakdown_with_the_rest_as_other(monkeypatch):
    answers = iter(
        [
            {
                "compile_s": 10.0,
                "steady_s": 0.02,
                "breakdown": {"dynamo": 3.0, "aot_autograd": 1.0, "kiln.pass.lower": 1.5},
                "counts": {"compiled": 12.0, "worker_seconds": 4.0},
            },
            {"compile_s": 2.0, "steady_s": 0.02, "breakdown": {"dynamo": 1.0}},
        ]
    )
    monkeypatch.setattr(ct, "probe", lambda p, environ: next(answers))
    probe = ct.Probe(["true"], lambda folder: {}, "TAG ", ".", 1.0)
    t = ct.measure("model.a", "kiln", probe, autotune=False)
    assert t.breakdown == {"dynamo": 3.0, "aot_autograd": 1.0, "kiln.pass.lower": 1.5, "other": 4.5}
    assert sum(t.breakdown.values()) <= t.cold_s and not t.error
    assert t.counts == {"compiled": 12.0, "worker_seconds": 4.0}  # the cold probe's, not the warm one's


def test_breakdown_survives_the_store_and_reaches_the_report():
    b = {"dynamo": 3.0, "aot_autograd": 1.0, "kiln.pass.lower": 1.5, "kiln.pass.render": 0.5, "other": 4.0}
    counts = {"compiled": 40.0, "worker_compiles": 38.0, "worker_seconds": 21.5, "graph_hits": 0.0}
    meta = Meta.from_dict(Meta(compile_breakdown=b, compile_counts=counts).as_dict())
    assert meta.compile_breakdown == b and meta.compile_counts == counts
    r = Result("model.a", "kiln", "h", compile_s=10.0, meta=meta)
    lines = ct.breakdown_lines([r, Result("model.a", "inductor", "h", compile_s=20.0)])
    assert lines[0].startswith("### Cold compile per phase")
    row = next(line for line in lines if line.startswith("| model.a | kiln"))
    assert "| 10.00 | 3.00 | 1.00 | 2.00 |" in row  # cold, dynamo, aot_autograd, passes (lower + render)
    assert row.endswith(
        "| lower 1.50, render 0.50 | 40 (38) | 21.50 | 0.200 | 0.300 |"
    )  # (3 + 1) / 20, 6 / 20
    assert not any(line.startswith("| model.a | inductor") for line in lines)  # no breakdown: no row
    assert ct.breakdown_lines([Result("model.a", "inductor", "h", compile_s=20.0)]) == []
    alone = next(line for line in ct.breakdown_lines([r]) if line.startswith("| model.a | kiln"))
    assert alone.endswith("| 21.50 | - | - |")  # no peer measured: no split


def test_front_end_split_needs_a_real_cold_breakdown_and_a_peer():
    b = {"dynamo": 2.0, "aot_autograd": 2.0, "kiln.pass.lower": 1.0}
    assert ct.front_end_split(10.0, b, 20.0) == ("0.200", "0.300")
    assert ct.front_end_split(10.0, {"dynamo": 2.0}, 20.0) == ("-", "-")  # a cache answered: not cold
    assert ct.front_end_split(10.0, b, None) == ("-", "-")
    assert ct.front_end_split(None, b, 20.0) == ("-", "-")
