"""Where kiln's compile time goes: seconds per named phase, summed over the process.

``with phase_times.phase("pass.lower"): ...`` adds the block's wall time to its phase. Phases nest: a phase's
*exclusive* seconds leave out the phases opened inside it (a ``cond`` branch compiled inside the ``lower``
pass counts for its own passes, not twice), so the exclusive seconds of all phases sum to at most the wall
time they cover. *Inclusive* seconds (the block's whole wall time) are kept beside them.

Phase names kiln records (``totals()`` keys):
- ``aot_autograd``: AOTAutograd's tracing and partitioning around kiln's graph compiles (exclusive: the
  compiles of the forward, backward or inference graph inside it are their own phases);
- ``front_cache``, ``graph_cache``: the Dynamo-graph front cache's lookup, the graph cache's key, load or store;
- ``pass.<name>``: each pass of ``backend.PASSES`` (``pass.render`` renders kernels to Triton source);
- ``kernel_load``: importing a kernel's module (its ``@triton.jit`` function built);
- ``triton_compile``: a first GPU launch's compile, binary-index load or wait for a compile worker;
- ``autotune``: timing candidate configs at a first launch (with autotuning on).

The model tier's compile probe reads ``totals()`` with Dynamo's own timers (``compile_times.breakdown``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_lock = threading.Lock()
_exclusive: dict[str, float] = {}
_inclusive: dict[str, float] = {}
_counts: dict[str, int] = {}
_local = threading.local()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` (exclusive of phases opened inside it on this thread)."""
    stack: list[list[float]] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    frame = [0.0]  # seconds of the phases nested inside this one
    stack.append(frame)
    start = time.perf_counter()
    try:
        yield
    finally:
        wall = time.perf_counter() - start
        stack.pop()
        if stack:
            stack[-1][0] += wall
        with _lock:
            _exclusive[name] = _exclusive.get(name, 0.0) + wall - frame[0]
            _inclusive[name] = _inclusive.get(name, 0.0) + wall
            _counts[name] = _counts.get(name, 0) + 1


def totals() -> dict[str, float]:
    """Exclusive seconds per phase name since the last ``reset()``."""
    with _lock:
        return dict(_exclusive)


def inclusive() -> dict[str, float]:
    """Inclusive seconds (nested phases included) per phase name since the last ``reset()``."""
    with _lock:
        return dict(_inclusive)


def counts() -> dict[str, int]:
    """How many times each phase ran since the last ``reset()``."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Forget every phase's seconds and counts."""
    with _lock:
        _exclusive.clear()
        _inclusive.clear()
        _counts.clear()
