"""Value tracing (``KILN_TRACE_VALUES``): what a trace holds for a small fused graph, and nothing traced when off."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch

import compiler
from compiler import backend, config
from compiler.runtime import value_trace


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _launches(records: list[dict]) -> list[dict]:
    return [r for r in records if r["type"] == "launch"]


def _run(fn, args, path: Path, **settings):
    """``fn`` compiled with tracing into ``path``; (result, captured graphs, trace records)."""
    with config.patch(trace_values=True, trace_file=str(path), **settings), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    value_trace.close(str(path))
    return out, graphs, _read(path)


def _expected(t: torch.Tensor) -> dict:
    """The statistics of ``t`` as the trace defines them, computed here in plain Python floats."""
    values = [float(v) for v in t.detach().double().cpu().reshape(-1)]
    finite = [v for v in values if math.isfinite(v)]
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return {
        "nan": sum(math.isnan(v) for v in values),
        "inf": sum(math.isinf(v) for v in values),
        "min": min(finite),
        "max": max(finite),
        "sum": math.fsum(finite),
        "sumsq": math.fsum(v * v for v in finite),
        "abs_sum": math.fsum(abs(v) for v in finite),
        "mean": math.fsum(finite) / len(finite),
        "digest": hashlib.sha256(data).hexdigest()[:16],
        "samples": [[p, value_trace._num(values[p])] for p in value_trace.sample_positions(len(values))],
    }


def test_trace_of_a_fused_graph(tmp_path, device):
    """A pointwise result and a row sum fused into one kernel, a matmul (extern) and a cumsum (fallback): one launch
    record each, in launch order, with the outputs' shapes, dtypes and statistics (NaN and Inf counted, left out of
    the sums), and each kernel's source once."""

    def f(x, w):
        y = x * 2 + 1
        return y, y.sum(-1), torch.cumsum(x @ w, 0)

    x = torch.randn(8, 100, device=device)
    x[1, 3], x[2, 5], x[3, 7] = float("nan"), float("inf"), -float("inf")
    w = torch.randn(100, 16, device=device)
    (y, s, c), graphs, records = _run(f, (x, w), tmp_path / "t.jsonl")
    head, graph = records[0], records[1]
    assert (
        head["type"] == "header"
        and head["schema"] == value_trace.SCHEMA
        and head["torch"] == torch.__version__
    )
    assert graph == {"type": "graph", "graph": graphs[0].name, "graph_index": 0, "settings": ""}
    launches = _launches(records)
    assert [r["seq"] for r in launches] == list(range(len(launches)))
    assert [r["launch"] for r in launches] == list(range(len(launches)))
    assert [r["kind"] for r in launches] == ["triton", "extern", "fallback"]
    fused, mm, cumsum = launches
    assert fused["kernel"] in graphs[0].kernel_sources and mm["kernel"] == "aten.mm.out"
    assert cumsum["kernel"] == "aten.cumsum.default"
    by_shape = {tuple(o["shape"]): o for o in fused["outputs"]}
    assert set(by_shape) == {(8, 100), (8,)} and all(o["dtype"] == "float32" for o in fused["outputs"])
    stats = by_shape[(8, 100)]["stats"]
    want = _expected(y)
    assert (stats["nan"], stats["inf"], stats["numel"]) == (1, 2, 800)
    for k in ("min", "max", "samples", "digest"):
        assert stats[k] == want[k], k
    for k in ("sum", "sumsq", "abs_sum", "mean"):
        assert stats[k] == pytest.approx(want[k], rel=1e-12), k
    sums = by_shape[(8,)]["stats"]  # rows with a NaN, an Inf and a -Inf
    assert (sums["nan"], sums["inf"], sums["digest"]) == (1, 2, _expected(s)["digest"])
    assert cumsum["outputs"][0]["stats"]["digest"] == _expected(c)["digest"]
    assert fused["source_hash"] == value_trace.source_hash(graphs[0].kernel_sources[fused["kernel"]])
    sources = [r for r in records if r["type"] == "kernel"]
    assert sources == [
        {
            "type": "kernel",
            "kernel": fused["kernel"],
            "source_hash": fused["source_hash"],
            "source": graphs[0].kernel_sources[fused["kernel"]],
        }
    ]


def test_calls_and_graphs_are_counted(tmp_path, device):
    """Two calls of a training step: the forward is graph 0 and the backward graph 1 (indices in the order first
    called), each call numbered, launches numbered from 0 in each call, a source written once."""

    def f(x):
        return torch.softmax(x * 3, -1).sum()

    path = tmp_path / "t.jsonl"
    with config.patch(trace_values=True, trace_file=str(path)):
        g = torch.compile(f, backend="kiln")
        for _ in range(2):
            x = torch.randn(4, 32, device=device, requires_grad=True)
            g(x).backward()
    value_trace.close(str(path))
    records = _read(path)
    launches = _launches(records)
    calls = [(r["graph_index"], r["call"]) for r in launches]
    assert sorted(set(calls)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert calls == sorted(calls, key=lambda gc: (gc[1], gc[0]))  # forward, backward, forward, backward
    for key in set(calls):
        assert [r["launch"] for r in launches if (r["graph_index"], r["call"]) == key] == list(
            range(calls.count(key))
        )
    hashes = [r["source_hash"] for r in records if r["type"] == "kernel"]
    assert (
        len(hashes) == len(set(hashes)) == len({r["source_hash"] for r in launches if r["kind"] == "triton"})
    )
    assert [r["graph_index"] for r in records if r["type"] == "graph"] == [0, 1]


def test_no_trace_calls_when_off(tmp_path, device, monkeypatch):
    """Off: the wrapper holds no trace node, so nothing is called per launch (counted through the module's entry
    points, which a traced wrapper does call)."""
    calls = []
    monkeypatch.setattr(value_trace, "begin_graph", lambda *a: calls.append("begin") or a)
    monkeypatch.setattr(value_trace, "record", lambda *a: calls.append("record"))

    def f(x):
        return torch.relu(x * 2).sum(-1) + 1

    x = torch.randn(8, 64, device=device)
    with compiler.capture() as graphs:
        out = torch.compile(f, backend="kiln")(x)
    torch.testing.assert_close(out, f(x))
    assert calls == []
    assert "value_trace" not in graphs[0].code
    assert not any(
        n.target in (value_trace.begin_graph, value_trace.record) for n in graphs[0].wrapper.graph.nodes
    )
    torch._dynamo.reset()
    with config.patch(trace_values=True, trace_file=str(tmp_path / "t.jsonl")), compiler.capture() as graphs:
        torch.compile(f, backend="kiln")(x)
    assert calls == ["begin"] + ["record"] * graphs[0].kernel_count
    assert not (tmp_path / "t.jsonl").exists()  # the patched entry points wrote nothing


def test_traced_results_are_the_untraced_ones(tmp_path, device):
    """Tracing only reads: the results are bitwise those of the untraced wrapper (buffer reuse included)."""

    def f(x):
        a = torch.softmax(x, -1)
        b = torch.softmax(a * 2, -1)
        return torch.softmax(b - 1, -1)

    x = torch.randn(16, 50, device=device)
    plain = torch.compile(f, backend="kiln")(x)
    torch._dynamo.reset()
    traced, _, records = _run(f, (x,), tmp_path / "t.jsonl")
    assert torch.equal(plain, traced)
    assert _launches(records)[-1]["outputs"][0]["stats"]["digest"] == _expected(traced)["digest"]


def test_planted_change_reaches_later_launches(tmp_path, device):
    """The test hook changes a launch's output in place before it is recorded: later kernels read the change."""

    def f(x):
        return torch.softmax(x * 2, -1).sum(-1) * 3

    x = torch.randn(8, 40, device=device)
    clean, _, a = _run(f, (x,), tmp_path / "a.jsonl")
    torch._dynamo.reset()
    with value_trace.planted(0, 0, lambda t: t.add_(1.0)):
        planted, _, b = _run(f, (x,), tmp_path / "b.jsonl")
    assert not torch.equal(clean, planted)
    da = [o["stats"]["digest"] for r in _launches(a) for o in r["outputs"]]
    db = [o["stats"]["digest"] for r in _launches(b) for o in r["outputs"]]
    assert len(da) == len(db) >= 1 and all(p != q for p, q in zip(da, db))


def test_tracing_runs_without_cuda_graphs_and_says_why(tmp_path, monkeypatch):
    """cudagraphs + trace_values: the graph runs unrecorded with a ``cudagraph`` fallback reason naming tracing.
    (On the CPU no graph qualifies for CUDA graphs: the facts are forced to exist.)"""
    monkeypatch.setattr(backend, "_cudagraph_facts", lambda *a: object())
    x = torch.randn(8, 16)
    with (
        config.patch(trace_values=True, trace_file=str(tmp_path / "t.jsonl"), cudagraphs=True),
        compiler.capture() as graphs,
    ):
        out = torch.compile(lambda x: x.exp() + 1, backend="kiln")(x)
    torch.testing.assert_close(out, x.exp() + 1)
    reasons = [r for r in graphs[0].fallbacks if r.kind == "cudagraph"]
    assert [r.detail for r in reasons] == [value_trace.CUDAGRAPH_REASON] and graphs[0].cudagraphs is None


def test_trace_file_resolution(tmp_path):
    pid = str(os.getpid())
    s = config.Settings
    assert value_trace.resolve_path(s(trace_file=str(tmp_path / "x.jsonl"))) == str(tmp_path / "x.jsonl")
    assert value_trace.resolve_path(s(trace_file=str(tmp_path))) == str(tmp_path / f"kiln-trace-{pid}.jsonl")
    assert value_trace.resolve_path(s(trace_file=str(tmp_path / "new") + "/")) == str(
        tmp_path / "new" / f"kiln-trace-{pid}.jsonl"
    )
    assert value_trace.resolve_path(s(trace_file=str(tmp_path / "t-{pid}.jsonl"))) == str(
        tmp_path / f"t-{pid}.jsonl"
    )
    assert value_trace.resolve_path(s(dump_dir=str(tmp_path))) == str(tmp_path / f"kiln-trace-{pid}.jsonl")
    assert config.from_env({"KILN_TRACE_VALUES": "1", "KILN_TRACE_FILE": "/tmp/t.jsonl"}).trace_values is True
    assert (
        value_trace.settings_summary(s(emulate_eager_precision=True, trace_values=True))
        == "emulate_eager_precision=True"
    )


def test_sample_positions():
    assert value_trace.sample_positions(0) == []
    assert value_trace.sample_positions(1) == [0]
    assert value_trace.sample_positions(3) == [0, 1, 2]
    assert value_trace.sample_positions(800) == [0, 114, 228, 342, 456, 570, 684, 799]


cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or config.interpreting(), reason="needs a CUDA device"
)


@cuda
def test_gpu_cudagraphs_asked_for_run_unrecorded(tmp_path):
    """On a GPU, cudagraphs + trace_values: every call runs the traced wrapper (each call's launches recorded),
    with the reason recorded, never a replay."""
    x = torch.randn(64, 32, device="cuda")
    path = tmp_path / "t.jsonl"
    with config.patch(trace_values=True, trace_file=str(path), cudagraphs=True), compiler.capture() as graphs:
        g = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="kiln")
        for _ in range(3):
            torch.testing.assert_close(g(x), torch.softmax(x * 2, -1))
    value_trace.close(str(path))
    assert graphs[0].cudagraphs is None
    assert value_trace.CUDAGRAPH_REASON in [r.detail for r in graphs[0].fallbacks if r.kind == "cudagraph"]
    assert sorted({r["call"] for r in _launches(_read(path))}) == [0, 1, 2]


@cuda
def test_gpu_trace_inside_a_capture_is_refused(tmp_path):
    from compiler.exc import ValueTraceError

    x = torch.randn(64, device="cuda")
    with config.patch(trace_values=True, trace_file=str(tmp_path / "t.jsonl")):
        g = torch.compile(lambda x: x.exp() + 1, backend="kiln")
        g(x)
        with pytest.raises(ValueTraceError, match="inside a CUDA graph capture"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                g(x)
    value_trace.close()
