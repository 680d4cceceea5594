"""Peak memory of a model step, measured the same way for every compiler arm.

Terms:
- *stats source*: a function returning the caching allocator's counters as `torch.cuda.memory_stats(device)`
  names them (`allocated_bytes.all.current|peak`, `reserved_bytes.all.current|peak`), with a `reset` of the
  peaks (`torch.cuda.reset_peak_memory_stats`) and a `release` of cached blocks that no tensor uses
  (`gc.collect()` + `torch.cuda.empty_cache()`; a live CUDA-graph pool is never released). `cuda_source`
  builds the real one; tests inject a fake allocator.
- *baseline*: allocated and reserved bytes just before the arm's copy of the model is made (after a release):
  what other arms and the harness hold. Every number below is above it.
- *window*: from the end of the arm's first step (compilation and first run; released, peaks reset) through
  its warm-up steps and two steady-state steps. CUDA-graph modes record in the window (kiln and Inductor both
  record on their second call), so their graph pools are allocated in it.
- *peak allocated* (`peak_mem_bytes`, the memory ratio's number): the highest `allocated_bytes.all.peak` in the
  window minus the baseline: weights, gradients, optimizer state and the step's live tensors at its worst
  moment, tensors in CUDA-graph private pools counted while they live (a recording's intermediates are live
  while it records; Inductor hands replayed outputs out from pool memory that the allocator no longer counts,
  so a window that starts after recording, as this tier's did before, saw almost none of its step).
- *peak reserved*: the highest `reserved_bytes.all.peak` in the window minus the baseline: device memory the
  caching allocator held, private graph pools included whether or not a tensor lives in them, plus its
  rounding and fragmentation (2 MiB / 20 MiB segments): what the process took from the device.
Compile-time allocations (the first step) are left out of both: they are the compiler's, not the step's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.bench.core.records import Meta

#: stored with every measurement (`meta.memory["definition"]`): ratios are only taken between equal ones
DEFINITION = "window-v2"
DESCRIPTION = (
    "peak allocated bytes (live tensors, CUDA-graph pool tensors included while they live) from the end of "
    "the first step (compilation left out) through warm-up, CUDA-graph recording and two steady steps, above "
    "what was allocated before the compiler's copy of the model; reserved: the same window's peak of memory "
    "the caching allocator held (private graph pools included)"
)

ALLOC_PEAK, ALLOC_NOW = "allocated_bytes.all.peak", "allocated_bytes.all.current"
RES_PEAK, RES_NOW = "reserved_bytes.all.peak", "reserved_bytes.all.current"


@dataclass
class StatsSource:
    """Where the counters come from (module docstring)."""

    stats: Callable[[], dict[str, int]]
    reset: Callable[[], None]
    release: Callable[[], None]


def cuda_source(device: Any) -> StatsSource:
    """The real allocator of `device` (a CUDA `torch.device`)."""
    import torch

    def release() -> None:
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()

    return StatsSource(
        stats=lambda: dict(torch.cuda.memory_stats(device)),
        reset=lambda: torch.cuda.reset_peak_memory_stats(device),
        release=release,
    )


@dataclass
class MemoryWindow:
    """One arm's measurement: `baseline()` before its model copy, `open()` after its first step, `close()`
    after the window's steps (module docstring)."""

    source: StatsSource
    base_allocated: int = 0
    base_reserved: int = 0
    opened: bool = False

    def baseline(self) -> None:
        self.source.release()
        s = self.source.stats()
        self.base_allocated, self.base_reserved = int(s.get(ALLOC_NOW, 0)), int(s.get(RES_NOW, 0))

    def open(self) -> None:
        self.source.release()
        self.source.reset()
        self.opened = True

    def close(self) -> dict[str, Any]:
        """The measurement as stored in `meta.memory`; raises if the window was never opened."""
        if not self.opened:
            raise RuntimeError("memory window closed before it was opened")
        s = self.source.stats()
        alloc = max(int(s.get(ALLOC_PEAK, 0)), int(s.get(ALLOC_NOW, 0)))
        res = max(int(s.get(RES_PEAK, 0)), int(s.get(RES_NOW, 0)))
        return {
            "definition": DEFINITION,
            "peak_allocated_bytes": max(0, alloc - self.base_allocated),
            "peak_reserved_bytes": max(0, res - self.base_reserved),
            "baseline_allocated_bytes": self.base_allocated,
            "baseline_reserved_bytes": self.base_reserved,
        }


def definition_of(meta: Meta) -> str | None:
    """The memory definition of a stored result: DEFINITION, `window-v1` for results stored before it (peak
    allocated over two steps after warm-up: CUDA-graph recording left out), None without a measurement."""
    if meta.memory is not None:
        return meta.memory.get("definition")
    return "window-v1" if meta.peak_mem_bytes else None


def comparable(a: Meta, b: Meta) -> bool:
    """Whether two results' memory numbers share a definition (their ratio means something)."""
    da = definition_of(a)
    return da is not None and da == definition_of(b)
