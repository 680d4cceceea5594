"""Value tracing for numerics triage: per launch, statistics of what it wrote, as JSON lines.

With the ``trace_values`` setting (``KILN_TRACE_VALUES=1``) the ``wrap`` pass adds trace calls to the wrapper
(``add_trace_calls``): one ``begin_graph`` at its start and, right after every kernel launch and every extern or
fallback call, one ``record`` of its outputs. With the setting off the wrapper holds no trace call at all:
tracing costs nothing per launch (the launcher is untouched).

Terms:
  trace        one JSON-lines file (``trace_file``), one JSON object a line, appended and flushed per launch (a
               crashed run keeps what it recorded); ``type`` is ``header`` (first line: schema, versions,
               device), ``graph`` (first call of a graph in this trace: its name, index and settings),
               ``kernel`` (a kernel's source, once per source hash) or ``launch``.
  graph index  the order in which graphs were first called in this trace (0, 1, ...): two runs of one program
               agree on it even where kiln's process-wide graph names differ (``graph_0`` vs ``graph_7``).
  call         the how-many-th call of that graph in this trace (0, 1, ...); *launch* the position of the launch
               in that call (kernel launches, extern and fallback calls counted alike, in launch order).
  kind         ``triton`` (a generated kernel), ``extern`` (an ``out=`` ATen kernel: a matmul) or ``fallback``
               (an ATen op kiln did not lower).
  source hash  the first 16 hex digits of the sha256 of the kernel's source (of ``aten.<op>`` for ATen calls).
  statistics   of an output, computed in float64 over its finite values: ``min``, ``max``, ``mean``, ``sum``,
               ``sumsq`` (sum of squares), ``abs_sum``; the counts ``nan`` and ``inf``; ``samples``: the values at
               ``SAMPLES`` fixed flat positions (spread evenly from first to last element); ``digest``: sha256 of
               the output's bytes (contiguous, first 16 hex digits; None above ``DIGEST_MAX_BYTES``).
               Non-finite numbers are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``.

On a GPU each record synchronizes the device before reading (so an asynchronous fault is charged to the
launch that caused it); tracing is therefore incompatible with CUDA graph recording: graphs traced run
unrecorded (``CUDAGRAPH_REASON``), and a trace call inside someone else's capture raises ``ValueTraceError``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx

from .. import config
from ..exc import ValueTraceError

#: version of the trace format; the reader (``harness/numerics/trace_diff.py``) refuses others
SCHEMA = 1
#: values sampled per output
SAMPLES = 8
#: outputs larger than this get no byte digest (copying them to the host for a hash is not worth it)
DIGEST_MAX_BYTES = 1 << 28
#: why a traced graph runs without CUDA graphs (``FallbackReason("cudagraph", graph, CUDAGRAPH_REASON)``)
CUDAGRAPH_REASON = (
    "value tracing (trace_values) reads every launch's outputs on the host; a graph traced runs unrecorded"
)
#: settings left out of a graph record's ``settings`` (where files go, how compiles are spread: not the math)
_NOT_MATH = {
    "trace_values",
    "trace_file",
    "dump_dir",
    "cache_dir",
    "compile_threads",
    "compile_workers",
    "log_fallbacks",
    "cache",
    "graph_cache_dir",
    "cache_max_mb",
    "autotune_dir",
    "cache_auth",
    "cache_key",
    "cache_key_file",
}


def resolve_path(s: config.Settings | None = None) -> str:
    """The trace file of settings ``s`` (the active ones by default) in this process, absolute (see
    ``Settings.trace_file``)."""
    s = s or config.settings()
    return _resolve(s.trace_file, s.dump_dir)


def _resolve(trace_file: str, dump_dir: str) -> str:
    name = f"kiln-trace-{os.getpid()}.jsonl"
    raw = trace_file.replace("{pid}", str(os.getpid()))
    if not raw:
        path = os.path.join(dump_dir, name) if dump_dir else name
    elif raw.endswith(("/", os.sep)) or os.path.isdir(raw):
        path = os.path.join(raw, name)
    else:
        path = raw
    return os.path.abspath(path)


def settings_summary(s: config.Settings | None = None) -> str:
    """The settings that differ from their defaults and may change the math, as ``name=value`` pairs."""
    s = s or config.settings()
    default = config.Settings()
    return " ".join(
        f"{f.name}={getattr(s, f.name)}"
        for f in dataclasses.fields(s)
        if f.name not in _NOT_MATH and getattr(s, f.name) != getattr(default, f.name)
    )


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- writing
class TraceWriter:
    """One trace file, open for this process's life (or until ``close``): truncated when first opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the process's life
        except OSError as e:
            raise ValueTraceError(f"cannot write the value trace {path}: {e}") from e
        self.lock = threading.Lock()
        self.seq = 0  # launches written
        self.graphs: dict[str, int] = {}  # graph name -> graph index
        self.calls: dict[str, int] = {}  # graph name -> calls begun
        self.sources: set[str] = set()  # source hashes written
        self._write(header())

    def _write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, sort_keys=True) + "\n")
        self.file.flush()

    def begin(self, graph: str, settings: str) -> GraphCall:
        with self.lock:
            if graph not in self.graphs:
                self.graphs[graph] = len(self.graphs)
                self._write(
                    {"type": "graph", "graph": graph, "graph_index": self.graphs[graph], "settings": settings}
                )
            call = self.calls.get(graph, 0)
            self.calls[graph] = call + 1
            return GraphCall(self, graph, self.graphs[graph], call)

    def launch(self, record: dict[str, Any], source: str | None) -> None:
        with self.lock:
            h = record["source_hash"]
            if source is not None and h not in self.sources:
                self.sources.add(h)
                self._write(
                    {"type": "kernel", "kernel": record["kernel"], "source_hash": h, "source": source}
                )
            record["seq"] = self.seq
            self.seq += 1
            self._write(record)

    def close(self) -> None:
        with self.lock:
            if not self.file.closed:
                self.file.close()


@dataclasses.dataclass
class GraphCall:
    """One call of a traced wrapper: where its launches are written, and how many it has made so far."""

    writer: TraceWriter
    graph: str
    graph_index: int
    call: int
    launches: int = 0


_writers: dict[str, TraceWriter] = {}
_writers_lock = threading.Lock()


def writer(path: str) -> TraceWriter:
    """The open writer of ``path`` in this process (opened, and the file truncated, on first use)."""
    w = _writers.get(path)
    if w is None:
        with _writers_lock:
            w = _writers.get(path)
            if w is None:
                w = _writers[path] = TraceWriter(path)
    return w


def close(path: str | None = None) -> None:
    """Close the trace ``path`` (every trace by default); a later launch traced there starts the file anew."""
    with _writers_lock:
        for p in [path] if path is not None else list(_writers):
            w = _writers.pop(p, None)
            if w is not None:
                w.close()


atexit.register(close)


def header() -> dict[str, Any]:
    """The first line of a trace: schema, versions and the device kernels run on."""
    import triton

    gpu = backend = None
    if not config.interpreting() and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
        backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
    return {
        "type": "header",
        "schema": SCHEMA,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "interpret": config.interpreting(),
        "gpu": gpu,
        "gpu_backend": backend,
    }


# ---------------------------------------------------------------------------------------------------- recording
def begin_graph(trace_file: str, dump_dir: str, graph: str, settings: str) -> GraphCall:
    """Called first by a traced wrapper: a new call of ``graph`` in the trace of the wrapper's ``trace_file`` and
    ``dump_dir`` settings (resolved in the process that runs it: a file name may hold its pid)."""
    key = (trace_file, dump_dir, os.getpid())
    path = _paths.get(key)
    if path is None:
        path = _paths[key] = _resolve(trace_file, dump_dir)
    return writer(path).begin(graph, settings)


_paths: dict[tuple[str, str, int], str] = {}  # (trace_file, dump_dir, pid) -> trace path


def record(call: GraphCall, kind: str, kernel: Any, names: tuple, *outputs: Any) -> None:
    """Called by a traced wrapper after a launch: write the statistics of ``outputs`` (named ``names``).

    ``kernel``: the ``TritonKernel`` launched (kind ``triton``), or the ATen op's name (``extern``, ``fallback``).
    """
    launch = call.launches
    call.launches += 1
    if isinstance(kernel, str):
        name, source = kernel, None
    else:
        name, source = kernel.name, kernel.source
    h = _source_hash(source if source is not None else name)
    plant = _plants.get((call.graph_index, call.call, launch))
    if plant is not None:
        plant(outputs[0])
    tensors = [(n, t) for n, t in zip(names, outputs) if isinstance(t, torch.Tensor)]
    _sync([t for _, t in tensors])
    with torch.no_grad():
        outs = [
            {
                "name": n,
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "device": str(t.device),
                "stats": stats(t),
            }
            for n, t in tensors
        ]
    call.writer.launch(
        {
            "type": "launch",
            "graph": call.graph,
            "graph_index": call.graph_index,
            "call": call.call,
            "launch": launch,
            "kind": kind,
            "kernel": name,
            "source_hash": h,
            "outputs": outs,
        },
        source,
    )


_hashes: dict[str, str] = {}


def _source_hash(text: str) -> str:
    h = _hashes.get(text)
    if h is None:
        h = _hashes[text] = source_hash(text)
    return h


def _sync(tensors: list[torch.Tensor]) -> None:
    for d in sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"}):
        if torch.cuda.is_current_stream_capturing():
            raise ValueTraceError(
                "value tracing (KILN_TRACE_VALUES) cannot run inside a CUDA graph capture: "
                "it reads every launch's outputs on the host; trace without CUDA graphs"
            )
        torch.cuda.synchronize(d)


def _num(x: float) -> Any:
    """``x`` for JSON: a float, or ``"nan"``/``"inf"``/``"-inf"``."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def sample_positions(numel: int, k: int = SAMPLES) -> list[int]:
    """``k`` flat positions spread evenly over ``numel`` elements, first and last included (fewer if smaller)."""
    if numel <= 0:
        return []
    k = min(k, numel)
    if k == 1:
        return [0]
    return sorted({i * (numel - 1) // (k - 1) for i in range(k)})


def stats(t: torch.Tensor) -> dict[str, Any]:
    """The statistics of ``t`` (see the module docstring), read from the device with one transfer."""
    numel = t.numel()
    out: dict[str, Any] = {"numel": numel, "digest": digest(t)}
    if t.is_quantized:
        return out
    x = torch.view_as_real(t) if t.is_complex() else t
    flat = x.detach().reshape(-1).to(torch.float64)
    n = flat.numel()
    if n == 0:
        out.update(nan=0, inf=0, min=None, max=None, mean=None, sum=0.0, sumsq=0.0, abs_sum=0.0, samples=[])
        return out
    finite = torch.isfinite(flat)
    zero = torch.where(finite, flat, 0.0)
    pos = sample_positions(n)
    values = torch.stack(
        [
            torch.isnan(flat).sum().to(torch.float64),
            torch.isinf(flat).sum().to(torch.float64),
            finite.sum().to(torch.float64),
            torch.where(finite, flat, math.inf).min(),
            torch.where(finite, flat, -math.inf).max(),
            zero.sum(),
            (zero * zero).sum(),
            zero.abs().sum(),
            *flat[torch.tensor(pos, device=flat.device)],
        ]
    ).tolist()
    nan, inf, count, lo, hi, total, sumsq, abs_sum = values[:8]
    out.update(
        nan=int(nan),
        inf=int(inf),
        min=_num(lo) if count else None,
        max=_num(hi) if count else None,
        mean=_num(total / count) if count else None,
        sum=_num(total),
        sumsq=_num(sumsq),
        abs_sum=_num(abs_sum),
        samples=[[p, _num(v)] for p, v in zip(pos, values[8:])],
    )
    return out


def digest(t: torch.Tensor) -> str | None:
    """sha256 (16 hex digits) of ``t``'s bytes in row-major order, or None when it is over the size limit."""
    if t.numel() * t.element_size() > DIGEST_MAX_BYTES or t.is_quantized:
        return None
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- test hook
_plants: dict[tuple[int, int, int], Callable[[torch.Tensor], Any]] = {}


@contextlib.contextmanager
def planted(
    graph_index: int, launch: int, change: Callable[[torch.Tensor], Any], call: int = 0
) -> Iterator[None]:
    """Test hook (traced wrappers only): ``change(output)`` alters, in place, the first output of launch
    ``launch`` of call ``call`` of graph ``graph_index`` before it is recorded: a planted divergence that later
    launches read, as a wrong kernel's result would be."""
    key = (graph_index, call, launch)
    _plants[key] = change
    try:
        yield
    finally:
        _plants.pop(key, None)


# ---------------------------------------------------------------------------------------------------- wrapper side
@dataclasses.dataclass
class TraceSite:
    """A wrapper step whose outputs a trace records: the node after which to record, the kind, the kernel's
    attribute (``triton``) or op name, and how to find its output nodes once buffers are reused."""

    anchor: fx.Node
    kind: str
    kernel: str
    names: tuple[str, ...]
    outputs: Callable[[], list[Any]]


def add_trace_calls(graph: fx.Graph, sites: list[TraceSite], graph_name: str) -> int:
    """Insert the trace calls into ``graph`` (after buffer reuse: the wrapper is otherwise the untraced one):
    ``begin_graph`` before the first step, and a ``record`` after each site. Returns the records added."""
    s = config.settings()
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first):
        call = graph.call_function(begin_graph, (s.trace_file, s.dump_dir, graph_name, settings_summary(s)))
    for site in sites:
        with graph.inserting_after(site.anchor):
            kernel: Any = site.kernel
            if site.kind == "triton":
                kernel = graph.get_attr(site.kernel)
        with graph.inserting_after(kernel if isinstance(kernel, fx.Node) else site.anchor):
            graph.call_function(record, (call, site.kind, kernel, site.names, *site.outputs()))
    return len(sites)
