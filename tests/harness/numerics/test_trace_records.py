"""A value trace's typed records (harness/numerics/trace_records.py): what trace-diff reads of each line."""

from __future__ import annotations

import pytest

from harness.numerics import trace_diff as td
from harness.numerics.exc import RecordError
from harness.numerics.trace_records import GraphRecord, Header, Launch, LaunchKind, TraceStats

STATS = {
    "numel": 4,
    "digest": "d1",
    "nan": 0,
    "inf": 1,
    "min": -1.0,
    "max": 2.0,
    "mean": 0.5,
    "sum": 1.5,
    "sumsq": 5.0,
    "abs_sum": 3.5,
    "samples": [[0, -1.0], [3, "inf"]],
}
LAUNCH = {
    "type": "launch",
    "seq": 0,
    "graph": "graph_3",
    "graph_index": 0,
    "call": 0,
    "launch": 1,
    "kind": "extern",
    "kernel": "aten.mm",
    "source_hash": "0123456789abcdef",
    "outputs": [{"name": "buf0", "shape": [2, 2], "dtype": "float32", "device": "cpu", "stats": STATS}],
}


def test_a_launch_line_reads_into_records():
    r = Launch.from_dict(LAUNCH)
    assert r.kind is LaunchKind.EXTERN and r.outputs[0].typed_shape == "float32[2, 2]"
    s = r.outputs[0].stats
    assert s.values and s.inf == 1 and s.samples == [(0, -1.0), (3, "inf")] and s.stat("abs_sum") == 3.5
    assert td.where(r) == "#0 graph 0 (graph_3) call 0 launch 1: extern aten.mm"


def test_header_and_graph_records_of_the_old_shape():
    """A header written without versions and device facts, a graph record without settings."""
    assert Header.from_dict({"type": "header", "schema": 1}) == Header(1)
    assert GraphRecord.from_dict({"type": "graph", "graph": "g", "graph_index": 2}).settings is None


def test_quantized_output_has_no_values():
    """A quantized output's statistics are its numel and digest: only counts and digests compare."""
    q = TraceStats.from_dict({"numel": 4, "digest": "d"})
    assert not q.values and q.min is None
    assert td.compare_output("q", q, TraceStats.from_dict({"numel": 4, "digest": "e"}), 0.0, 0.0) == []
    full = TraceStats.from_dict(STATS)
    found = td.compare_output("o", full, q, 0.0, 0.0)
    assert [f.stat for f in found] == ["nan count", "inf count"]


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"kind": "cuda"}, "launch kind 'cuda' is not one of triton, extern, fallback"),
        ({"seq": "first"}, "malformed launch record"),
        ({"outputs": [{"name": "buf0"}]}, "malformed launch output"),
    ],
)
def test_bad_launch_lines(change, needle):
    with pytest.raises(RecordError, match=needle):
        Launch.from_dict({**LAUNCH, **change})
