"""Chunk sizes of split column reductions, measured: ``python -m compiler.tools.split_sweep``.

A column (outer) reduction over many rows (a norm's weight and bias gradients, a linear layer's bias gradient:
sums over the batch x sequence rows of a (rows, columns) tensor) is split by ``lowering/reductions.py`` into
chunks of rows: a first kernel writes one partial sum per chunk and column, a second sums the partials. How many
rows a chunk holds (``OUTER_SPLIT_CHUNK_ROWS``) decides how many programs the first kernel has, and so whether it
fills the GPU. This tool is the evidence for that constant: for each case (below) it compiles the reduction under
kiln once per chunk size (fresh Dynamo state, kiln's on-disk caches off, the constant patched for the compile),
checks the result against eager, and times its kernels (CUDA-graph replays, ``sweeps.bench_us``: median device µs),
beside Inductor's compile of the same function.

Cases (name: rows x columns, dtype, sums): the GPT-2/BERT CI-size LayerNorm backward with the next linear
layer's bias gradient (``ln3``: sum(a*b), sum(a), sum(c), fp32), bias gradients of wider layers (``sum``), bf16
LayerNorm backward at BERT-, GPT-2-XL- and ViT-B-like sizes (``ln2``: sum(a*b), sum(a) in fp32) and a
ResNet-50 BatchNorm backward over channels-last rows (``bn2``: the two sums; ``bnrelu``: the whole backward after a
ReLU, as ``mix_sweep`` has it: both sums and the input gradient).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from .sweeps import bench_us, check_args, inductor_us, print_head, print_row, timed_cell

#: name -> (rows, columns, dtype, kind)
CASES: dict[str, tuple[int, int, torch.dtype, str]] = {
    "ln3_2048x512_fp32": (2048, 512, torch.float32, "ln3"),
    "sum_2048x2048_fp32": (2048, 2048, torch.float32, "sum"),
    "sum_2048x1536_fp32": (2048, 1536, torch.float32, "sum"),
    "ln3_4096x768_fp32": (4096, 768, torch.float32, "ln3"),
    "ln2_1024x768_bf16": (1024, 768, torch.bfloat16, "ln2"),
    "ln2_2048x4096_bf16": (2048, 4096, torch.bfloat16, "ln2"),
    "ln2_6304x768_bf16": (6304, 768, torch.bfloat16, "ln2"),
    "bn2_100352x64_bf16": (100352, 64, torch.bfloat16, "bn2"),
    "bnrelu_6272x256": (6272, 256, torch.bfloat16, "bnrelu"),
    "bnrelu_25088x128": (25088, 128, torch.bfloat16, "bnrelu"),
    "bnrelu_100352x64": (100352, 64, torch.bfloat16, "bnrelu"),
    "bnrelu_1568x512": (1568, 512, torch.bfloat16, "bnrelu"),
    "bnrelu_25088x512": (25088, 512, torch.bfloat16, "bnrelu"),
}

CHUNKS = (1024, 512, 256, 128, 64)


def make_case(name: str, device: str) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """(function, inputs) of case ``name`` on ``device``."""
    rows, cols, dtype, kind = CASES[name]
    if kind == "bnrelu":
        from .mix_sweep import make_case as mix_case

        return mix_case(name, device)
    gen = torch.Generator(device=device).manual_seed(0)
    n = 3 if kind == "ln3" else 1 if kind == "sum" else 2
    xs = tuple(torch.randn(rows, cols, generator=gen, device=device).to(dtype) for _ in range(n))

    def ln3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (a * b).sum(0), a.sum(0), c.sum(0)

    def colsum(a: torch.Tensor) -> torch.Tensor:
        return a.sum(0)

    def ln2(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        af = a.float()
        return (af * b.float()).sum(0), af.sum(0)

    fns: dict[str, Callable[..., Any]] = {"ln3": ln3, "sum": colsum, "ln2": ln2, "bn2": ln2}
    return fns[kind], xs


def _close(got: Any, want: Any) -> bool:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    # bf16 results within two units in the last place (a sum ordered differently rounds to the neighbour)
    tol = [1.6e-2 if w.dtype == torch.bfloat16 else 1e-3 for w in want]
    return all(
        torch.allclose(g.float(), w.float(), rtol=t, atol=max(t, 1e-2)) for g, w, t in zip(got, want, tol)
    )


def kiln_us(fn: Callable[..., Any], xs: tuple[torch.Tensor, ...], chunk: int) -> float:
    """µs of ``fn`` compiled by kiln with column-reduction chunks of ``chunk`` rows (checked against eager)."""
    from compiler import config
    from compiler.lowering import reductions

    old = reductions.OUTER_SPLIT_CHUNK_ROWS
    reductions.OUTER_SPLIT_CHUNK_ROWS = chunk
    try:
        with config.patch(cache="0"):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="kiln")
            got = compiled(*xs)
    finally:
        reductions.OUTER_SPLIT_CHUNK_ROWS = old
    if not _close(got, fn(*xs)):
        raise AssertionError(f"kiln's result differs from eager's at chunk {chunk}")
    return bench_us(lambda: compiled(*xs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m compiler.tools.split_sweep", description=__doc__.splitlines()[0]
    )
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    p.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="chunk sizes in rows")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor's column")
    args = p.parse_args(argv)
    chunks = check_args("split_sweep", args.cases, CASES, "--chunks", args.chunks)
    if chunks is None:
        return 2
    from compiler import register
    from compiler.lowering import reductions

    register()
    print(f"current chunk: {reductions.OUTER_SPLIT_CHUNK_ROWS} rows; device µs, median of CUDA-graph replays")
    print_head(["case", "inductor"] + [f"kiln c{c}" for c in chunks])
    for name in args.cases.split(","):
        fn, xs = make_case(name, "cuda")
        cells = [name, "-" if args.no_inductor else timed_cell(partial(inductor_us, fn, xs))]
        cells += [timed_cell(partial(kiln_us, fn, xs, c)) for c in chunks]
        print_row(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
