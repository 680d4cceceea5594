"""Two value traces (``KILN_TRACE_VALUES=1``, ``compiler/runtime/value_trace.py``): the first launch whose outputs
diverge beyond tolerance, with its kernel's source.

    python -m harness numerics trace-diff A.jsonl B.jsonl [--rtol R] [--atol A] [--allow-source-diff]

Terms (the trace's own are in value_trace's docstring: graph index, call, launch, kind, source hash, statistics):
  aligned      launch i of A and launch i of B (file order) have the same graph index, graph role (its name
               without kiln's process-wide number: a cond branch meets the same branch), call, launch position
               and kind, outputs of the same shapes, and the same source hash (``allow_source_diff``: sources
               and output dtypes may differ, e.g. an fp64-upcast run or a setting that changes codegen).
               Traces that do not align are refused (``TraceError``, exit 2), naming the first launch that
               does not.
  scale        what a statistic's difference is measured against, per output, the larger of both sides:
               ``amax`` = max(|min|, |max|) for min, max and samples; ``abs_sum`` for sum; ``abs_sum / finite
               count`` for mean; ``sumsq`` (twice, squares double relative errors) for sumsq.
  diverged     a NaN or Inf count that differs, a non-finite sample on one side only, or a statistic with
               ``|a - b| > rtol * scale + atol``; ``rtol`` per dtype is ``RTOL`` (the larger of the two dtypes').
  bitwise      the outputs' digests (sha256 of their bytes) are equal: differences within tolerance are
               reported as the first launch that is not bitwise identical.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from .exc import RecordError, TraceError
from .records import read
from .trace_records import GraphRecord, Header, Launch, LaunchKind, TraceOutput, TraceStats, Value

#: the trace format this reader understands (``value_trace.SCHEMA``)
SCHEMA = 1
#: default relative tolerance per dtype (several ULPs: reduction order and fused intermediates move a few)
RTOL: dict[str, float] = {
    "float64": 1e-9,
    "complex128": 1e-9,
    "float32": 1e-4,
    "complex64": 1e-4,
    "float16": 4e-3,
    "bfloat16": 3.2e-2,
    "float8_e4m3fn": 0.125,
    "float8_e4m3fnuz": 0.125,
    "float8_e5m2": 0.25,
    "float8_e5m2fnuz": 0.25,
}
#: statistics compared, in the order they are named when several diverge
STATS = ("nan", "inf", "min", "max", "mean", "sum", "sumsq", "samples")
_LAUNCH_KEYS = ("seq", "graph", "graph_index", "call", "launch", "kind", "kernel", "source_hash", "outputs")


def rtol_of(dtype: str) -> float:
    """Default relative tolerance of ``dtype`` (0: integers and booleans compare exactly)."""
    if dtype in RTOL:
        return RTOL[dtype]
    return 0.25 if dtype.startswith("float8") else 0.0


@dataclasses.dataclass
class Trace:
    """One trace file, read and checked: its header, graph records by index, sources by hash, launches."""

    path: Path
    header: Header
    graphs: dict[int, GraphRecord]
    sources: dict[str, str]
    launches: list[Launch]
    truncated: bool = False  # a last line cut short (the traced process died mid-write) was left out

    def describe(self) -> str:
        h = self.header
        where = (
            "CPU interpreter"
            if h.interpret
            else f"{h.gpu or 'no GPU'}" + (f" ({h.gpu_backend})" if h.gpu_backend else "")
        )
        return f"{self.path} ({len(self.launches)} launches; {where}, torch {h.torch}, triton {h.triton})"


def load(path: Path) -> Trace:
    """Read and check a trace; ``TraceError`` (one line) when it is missing, empty, malformed or of another schema."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file" + (" (a folder)" if path.is_dir() else ""))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read it: {e}") from None
    lines = text.split("\n")
    truncated = False
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no newline at the end: the writer died mid-line
        lines.pop()
        truncated = True
    if not lines:
        raise TraceError(f"{path} is empty: not a kiln value trace (KILN_TRACE_VALUES=1 writes one)")
    records = []
    for i, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(
                f"{path}:{i}: not JSON ({e.msg}): not a kiln value trace, or a damaged one"
            ) from None
        if not isinstance(r, dict) or "type" not in r:
            raise TraceError(f"{path}:{i}: not a trace record (a JSON object with a 'type')")
        records.append(r)
    head = records[0]
    if head.get("type") != "header":
        raise TraceError(f"{path}: its first line is no trace header: not a kiln value trace")
    if head.get("schema") != SCHEMA:
        raise TraceError(f"{path}: trace schema {head.get('schema')!r}, this harness reads schema {SCHEMA}")
    try:
        trace = Trace(path, Header.from_dict(head), {}, {}, [], truncated)
    except RecordError as e:
        raise TraceError(f"{path}:1: {e}") from None
    for i, r in enumerate(records[1:], 2):
        try:
            _add(trace, r, f"{path}:{i}")
        except RecordError as e:
            raise TraceError(f"{path}:{i}: {e}") from None
    return trace


def _add(trace: Trace, r: dict[str, Any], where: str) -> None:
    """One record after the header, into `trace` (a JSON line: the reader's boundary)."""
    kind = r["type"]
    if kind == "graph":
        g = GraphRecord.from_dict(r)
        trace.graphs[g.graph_index] = g
    elif kind == "kernel":
        h, source = read("kernel record", r, lambda d: (str(d["source_hash"]), str(d["source"])))
        trace.sources[h] = source
    elif kind == "launch":
        missing = [k for k in _LAUNCH_KEYS if k not in r]
        if missing:
            raise TraceError(f"{where}: launch record without {', '.join(missing)}")
        launch = Launch.from_dict(r)
        if launch.seq != len(trace.launches):
            raise TraceError(
                f"{where}: launch seq {launch.seq}, expected {len(trace.launches)}: records missing or out of order"
            )
        trace.launches.append(launch)
    elif kind == "header":
        raise TraceError(f"{where}: a second header: two traces written into one file")


def where(r: Launch) -> str:
    """A launch for a person: ``#5 graph 0 (graph_3) call 1 launch 2: triton kiln_pointwise_add_...``."""
    return f"#{r.seq} graph {r.graph_index} ({r.graph}) call {r.call} launch {r.launch}: {r.kind} {r.kernel}"


def graph_role(name: str) -> str:
    """A graph's name without kiln's process-wide number (``graph_7.true_graph_0`` -> ``graph.true_graph_0``): a
    ``torch.cond`` branch must meet the same branch."""
    return re.sub(r"^graph_\d+", "graph", name)


def _shape(o: TraceOutput) -> str:
    return o.typed_shape


def misalignment(a: Launch, b: Launch, allow_source_diff: bool) -> str | None:
    """Why launches ``a`` (of trace A) and ``b`` (of B) do not align, or None when they do."""
    if (a.graph_index, a.call, a.launch, a.kind, graph_role(a.graph)) != (
        b.graph_index,
        b.call,
        b.launch,
        b.kind,
        graph_role(b.graph),
    ):
        return f"A has {where(a)}, B has {where(b)}"
    if a.source_hash != b.source_hash and not allow_source_diff:
        return (
            f"{where(a)} has source {a.source_hash} in A and {b.kernel} source {b.source_hash} in B "
            "(kernel sources differ: --allow-source-diff compares them anyway)"
        )
    oa, ob = a.outputs, b.outputs
    if [o.shape for o in oa] != [o.shape for o in ob]:
        return (
            f"{where(a)} writes {', '.join(map(_shape, oa)) or 'nothing'} in A and "
            f"{', '.join(map(_shape, ob)) or 'nothing'} in B"
        )
    if [o.dtype for o in oa] != [o.dtype for o in ob] and not allow_source_diff:
        return (
            f"{where(a)} writes {', '.join(map(_shape, oa))} in A and {', '.join(map(_shape, ob))} in B "
            "(--allow-source-diff compares them anyway)"
        )
    return None


@dataclasses.dataclass
class Finding:
    """One statistic of one output that diverged: its values on both sides, the difference and what was allowed."""

    output: str
    stat: str
    a: Value
    b: Value
    diff: float | None
    allowed: float | None

    def line(self) -> str:
        if self.diff is None:
            return f"{self.stat}: A {_fmt(self.a)} vs B {_fmt(self.b)}"
        return (
            f"{self.stat}: A {_fmt(self.a)} vs B {_fmt(self.b)} "
            f"(|A-B| {_fmt(self.diff)} > allowed {_fmt(self.allowed)})"
        )


def _fmt(x: Any) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _close(name: str, stat: str, a: Any, b: Any, scale: float, rtol: float, atol: float) -> Finding | None:
    if a == b:
        return None
    if not (_finite(a) and _finite(b)):  # None (no finite value) or "nan"/"inf" on one side
        return Finding(name, stat, a, b, None, None)
    diff, allowed = abs(a - b), rtol * scale + atol
    return Finding(name, stat, a, b, diff, allowed) if diff > allowed else None


def _num(x: Any) -> float:
    return float(x) if _finite(x) else 0.0


def compare_output(name: str, sa: TraceStats, sb: TraceStats, rtol: float, atol: float) -> list[Finding]:
    """The statistics of one output that diverged (``STATS`` order); empty when within tolerance."""
    found: list[Finding] = []
    if sa.nan != sb.nan:
        found.append(Finding(name, "nan count", sa.nan, sb.nan, None, None))
    if sa.inf != sb.inf:
        found.append(Finding(name, "inf count", sa.inf, sb.inf, None, None))
    if not (sa.values and sb.values):  # quantized: the digest is all there is
        return found
    amax = max(abs(_num(v)) for s in (sa, sb) for v in (s.min, s.max))
    count = max(sa.numel - (sa.nan or 0) - (sa.inf or 0), 1)
    abs_sum = max(_num(sa.abs_sum), _num(sb.abs_sum))
    scales = {
        "min": amax,
        "max": amax,
        "mean": abs_sum / count,
        "sum": abs_sum,
        "sumsq": 2 * max(_num(sa.sumsq), _num(sb.sumsq)),
    }
    for stat, scale in scales.items():
        f = _close(name, stat, sa.stat(stat), sb.stat(stat), scale, rtol, atol)
        if f is not None:
            found.append(f)
    for (pa, va), (_, vb) in zip(sa.samples, sb.samples):
        f = _close(name, f"sample[{pa}]", va, vb, amax, rtol, atol)
        if f is not None:
            found.append(f)
    return found


@dataclasses.dataclass
class Result:
    """What ``diff`` found: the aligned launch count, the first divergence (launch of A and B, findings), the
    first launch that is not bitwise identical, and notes (a truncated trace, lengths that differ)."""

    a: Trace
    b: Trace
    aligned: int
    first: tuple[Launch, Launch, list[Finding]] | None
    first_bitwise: Launch | None
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        first = None
        if self.first is not None:
            ra, rb, found = self.first
            first = {
                "seq": ra.seq,
                "graph_index": ra.graph_index,
                "call": ra.call,
                "launch": ra.launch,
                "kind": ra.kind.value,
                "kernel_a": ra.kernel,
                "kernel_b": rb.kernel,
                "source_hash_a": ra.source_hash,
                "source_hash_b": rb.source_hash,
                "findings": [dataclasses.asdict(f) for f in found],
            }
        bit = (
            None
            if self.first_bitwise is None
            else {"seq": self.first_bitwise.seq, "kernel": self.first_bitwise.kernel}
        )
        return {
            "schema": SCHEMA,
            "a": str(self.a.path),
            "b": str(self.b.path),
            "aligned": self.aligned,
            "divergence": first,
            "first_bitwise_difference": bit,
            "notes": self.notes,
        }


def diff(
    a: Trace, b: Trace, rtol: float | None = None, atol: float = 0.0, allow_source_diff: bool = False
) -> Result:
    """Align ``a`` and ``b`` launch by launch and find the first divergence (``TraceError`` when they do not align).

    ``rtol`` None: per dtype (``rtol_of``, the larger of the two sides' dtypes)."""
    notes = [
        f"{t.path} ends in a cut-off line (its process died while writing): left out"
        for t in (a, b)
        if t.truncated
    ]
    first_bitwise = None
    n = min(len(a.launches), len(b.launches))
    for ra, rb in zip(a.launches, b.launches):
        why = misalignment(ra, rb, allow_source_diff)
        if why is not None:
            raise TraceError(f"the traces do not align at launch #{ra.seq}: {why}")
        found: list[Finding] = []
        for oa, ob in zip(ra.outputs, rb.outputs):
            tol = rtol if rtol is not None else max(rtol_of(oa.dtype), rtol_of(ob.dtype))
            found += compare_output(oa.name, oa.stats, ob.stats, tol, atol)
            same = oa.stats.digest is not None and oa.stats.digest == ob.stats.digest
            if first_bitwise is None and not same:
                first_bitwise = ra
        if found:
            return Result(a, b, ra.seq + 1, (ra, rb, found), first_bitwise, notes + _lengths(a, b))
    if len(a.launches) != len(b.launches):
        longer, label = (a, "A") if len(a.launches) > n else (b, "B")
        raise TraceError(
            f"the traces do not align: A has {len(a.launches)} launches, B {len(b.launches)}; the first "
            f"{n} agree within tolerance, then {label} goes on with {where(longer.launches[n])}"
        )
    return Result(a, b, n, None, first_bitwise, notes)


def _lengths(a: Trace, b: Trace) -> list[str]:
    if len(a.launches) == len(b.launches):
        return []
    return [f"A has {len(a.launches)} launches, B {len(b.launches)} (compared up to the divergence)"]


def source_of(trace: Trace, r: Launch, dump_dir: Path | None) -> tuple[str, str | None]:
    """(where the source came from, the source) of launch ``r``'s kernel: the trace's own kernel record, else
    ``dump_dir/kernels/<kernel>.py`` (a ``KILN_DUMP_DIR`` folder) when its hash matches."""
    src = trace.sources.get(r.source_hash)
    if src is not None:
        return f"from {trace.path}", src
    if dump_dir is not None:
        path = Path(dump_dir) / "kernels" / f"{r.kernel}.py"
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            from hashlib import sha256

            if sha256(text.encode()).hexdigest()[:16] == r.source_hash:
                return f"from {path}", text
            return f"{path} holds another source than the traced one", None
        return f"not in the trace, and no {path}", None
    return "not in the trace (--dump-dir DIR: a KILN_DUMP_DIR folder of the traced run)", None


def _settings(trace: Trace, r: Launch) -> str:
    g = trace.graphs.get(r.graph_index)
    return (g.settings if g is not None else None) or "(defaults)"


def render(res: Result, dump_dir: Path | None = None) -> str:
    """The report for a person: both traces, the first divergence with every diverged statistic and the source."""
    lines = [f"A: {res.a.describe()}", f"B: {res.b.describe()}"]
    lines += [f"note: {n}" for n in res.notes]
    if res.first is None:
        tail = (
            "bitwise identical"
            if res.first_bitwise is None
            else f"first bitwise difference (within tolerance) at {where(res.first_bitwise)}"
        )
        lines.append(f"no divergence beyond tolerance in {res.aligned} aligned launches; {tail}")
        return "\n".join(lines) + "\n"
    ra, rb, found = res.first
    lines.append(f"first divergence at launch {where(ra)}")
    if rb.kernel != ra.kernel or rb.source_hash != ra.source_hash:
        lines.append(f"  in B: {rb.kind} {rb.kernel} (source {rb.source_hash})")
    shapes = {o.name: _shape(o) for o in ra.outputs}
    f0 = found[0]
    lines.append(f"  output {f0.output} {shapes.get(f0.output, '')}: {f0.line()}")
    lines += [f"  also {f.output}: {f.line()}" for f in found[1:8]]
    if len(found) > 8:
        lines.append(f"  ... {len(found) - 8} more statistics diverged")
    if ra.seq:
        earlier = (
            "bitwise identical"
            if res.first_bitwise is None or res.first_bitwise.seq == ra.seq
            else f"within tolerance (first bitwise difference at {where(res.first_bitwise)})"
        )
        lines.append(f"  launches before it ({ra.seq}): {earlier}")
    sa, sb = (_settings(t, r) for t, r in ((res.a, ra), (res.b, rb)))
    if sa != sb:
        lines.append(f"  graph settings: A {sa}; B {sb}")
    if ra.kind is not LaunchKind.TRITON:
        lines.append(f"no kernel source: {ra.kernel} is an ATen {ra.kind} call")
        return "\n".join(lines) + "\n"
    for label, trace, r in (("A", res.a, ra), ("B", res.b, rb)):
        if label == "B" and r.source_hash == ra.source_hash:
            break
        origin, src = source_of(trace, r, dump_dir)
        lines.append(
            f"kernel source of {r.kernel} ({label}, source hash {r.source_hash}; {origin})"
            + (":" if src else "")
        )
        if src:
            lines += ["    " + ln for ln in src.rstrip("\n").split("\n")]
    return "\n".join(lines) + "\n"
