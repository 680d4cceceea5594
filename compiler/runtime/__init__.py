"""Runtime layer: load generated kernel sources (cache), compile them for the GPU (gpu_compile, with the worker
pool of compile_pool/precompile) and launch them (launcher, autotune); store compiled graphs on disk (graph_cache,
fx_codec) and where each kernel's binary is (binary_index). ``compile_stats()``: this process's compile counts,
graph cache hits/misses and autotune timings."""

from __future__ import annotations

from typing import Any


def compile_stats() -> Any:
    """A copy of this process's ``gpu_compile.CompileStats`` (compiled, cache hits, worker compiles, seconds)."""
    from .gpu_compile import compile_stats as stats

    return stats()


def reset_compile_stats() -> None:
    from .gpu_compile import reset_compile_stats as reset

    reset()
