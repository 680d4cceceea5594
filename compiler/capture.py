"""Records of what kiln compiled, for tests and reports: ``with compiler.capture() as graphs: ...``."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.fx as fx

from .graph import FallbackReason


@dataclasses.dataclass
class CompiledGraph:
    """One compiled FX graph: its wrapper, kernel sources and fallback reasons.

    ``kernel_count``: distinct kernel launches in the wrapper; ``extern_count``: extern-kernel calls (``out=``
    ATen such as ``mm.out``; copies are not counted: device transfers of CPU scalars, write-backs into
    mutated inputs); ``fallbacks``: structured reasons for every op that ran as ATen (and, kind ``cudagraph``,
    why the graph runs without CUDA graphs when they were asked for).
    """

    name: str
    wrapper: fx.GraphModule
    kernel_sources: dict[str, str]
    kernel_launches: int
    extern_count: int
    fallbacks: list[FallbackReason]
    subgraphs: list[CompiledGraph] = dataclasses.field(default_factory=list)
    #: the ``CudaGraphRunner`` when the graph runs through CUDA graphs (its ``stats`` count replays), else None
    cudagraphs: Any = None
    #: the ATen graph as kiln lowered it (after the FX rewrites: layouts, adopted input strides)
    aten_graph: Any = None
    #: what the graph cache did (``runtime/graph_cache.py``): "hit" (rebuilt from disk: no pass ran; ``aten_graph``
    #: is then the graph before the FX rewrites), "stored", "not stored: <why>", "" (cache off)
    cache: str = ""
    #: its graph cache key when the cache was consulted (a hit or a store), else ""
    cache_key: str = ""
    #: where kiln chose speed over run-to-run identity (kind ``nondeterministic``: atomic float sums, racing
    #: stores); empty when every result of the graph is bitwise identical run to run
    nondeterministic: list[FallbackReason] = dataclasses.field(default_factory=list)
    #: the graph's runner state: ``fn`` is what each call runs (the wrapper's ``forward``, or the ATen graph after
    #: a failed first launch); ``compiler.tools.host_path`` swaps it to time a wrapper alone on recorded inputs
    entry: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def kernel_count(self) -> int:
        return self.kernel_launches

    @property
    def fallback_ops(self) -> list[str]:
        return [f.op for f in self.fallbacks]

    def all_fallbacks(self) -> list[FallbackReason]:
        out = list(self.fallbacks)
        for s in self.subgraphs:
            out.extend(s.all_fallbacks())
        return out

    def all_nondeterministic(self) -> list[FallbackReason]:
        out = list(self.nondeterministic)
        for s in self.subgraphs:
            out.extend(s.all_nondeterministic())
        return out

    @property
    def code(self) -> str:
        return self.wrapper.code

    @property
    def kernel_code(self) -> str:
        """Every kernel's source as one readable text, each under a ``# kernel NAME`` line (``kernel_sources`` is
        the dict of them, name -> source)."""
        return "\n".join(f"# kernel {name}\n{src.rstrip()}\n" for name, src in self.kernel_sources.items())


#: the open ``capture()`` blocks. Nothing else in the process keeps a compiled graph: a graph holds its CUDA-graph
#: runner, whose recordings own their pools' memory, so a module-level list of recent graphs (there was one)
#: kept a dropped model's CUDA-graph memory (1.1 GB for a 4-layer BERT training step) alive after
#: ``torch._dynamo.reset()``.
_sinks: list[list[CompiledGraph]] = []


def record(cg: CompiledGraph) -> None:
    for sink in _sinks:
        sink.append(cg)


@contextlib.contextmanager
def capture() -> Iterator[list[CompiledGraph]]:
    """Collect every top-level graph compiled inside the block (forward and backward graphs)."""
    sink: list[CompiledGraph] = []
    _sinks.append(sink)
    try:
        yield sink
    finally:
        _sinks.remove(sink)
