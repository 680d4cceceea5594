"""What the kernel sweeps (``split_sweep``, ``mix_sweep``) share: device timing, Inductor's column, argument
checks that stop with one line, and the markdown table they print.

A *sweep* compiles one small function per case under kiln once per value of a knob (a chunk size, a program
count) and prints one table row per case: the case, Inductor's µs, then kiln's µs per value; a value that fails
(a compile error, a result that differs from eager's) is an ``error: <type>`` cell, not the end of the sweep.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch


def bench_us(fn: Callable[[], Any]) -> float:
    """Device µs of one call: the median of CUDA-graph replays (``do_bench_cudagraph``), so that the host's
    time per call (guards, wrapper, launches: tens of µs, more than these kernels take) is not what is read."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")) * 1e3


def inductor_us(fn: Callable[..., Any], xs: tuple[torch.Tensor, ...]) -> float:
    """µs of ``fn`` compiled by Inductor (``torch.compile``'s default backend), timed as ``bench_us`` times."""
    torch._dynamo.reset()
    compiled = torch.compile(fn)
    compiled(*xs)
    return bench_us(lambda: compiled(*xs))


def check_args(prog: str, cases: str, known: Iterable[str], flag: str, values: str) -> list[int] | None:
    """The integer values of ``flag`` (comma-separated ``values``), or None after one line on stderr: an
    unknown case among ``cases``, a value that is not an integer, or no CUDA GPU."""
    known = list(known)
    unknown = [c for c in cases.split(",") if c not in known]
    if unknown:
        print(f"{prog}: unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return None
    try:
        ints = [int(v) for v in values.split(",")]
    except ValueError:
        print(f"{prog}: {flag} must be integers, got {values!r}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU (the interpreter's timings mean nothing)", file=sys.stderr)
        return None
    return ints


def timed_cell(measure: Callable[[], float]) -> str:
    """``measure()``'s µs as a table cell, or ``error: <type>`` when it raises."""
    try:
        return f"{measure():.1f}"
    except Exception as e:  # noqa: BLE001 - a failed variant is a cell of the table, not the end
        return f"error: {type(e).__name__}"


def print_head(head: list[str]) -> None:
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)


def print_row(cells: list[str]) -> None:
    print("| " + " | ".join(cells) + " |", flush=True)
