"""Program counts of mixed row/column kernels, measured: ``python -m compiler.tools.mix_sweep``.

A norm's backward computes the input gradient row by row and the weight (and bias) gradients as column sums
over the same rows. kiln's scheduler folds the first stage of those column sums into the row kernel
(``Scheduler.mix_column_partials``): each of the kernel's programs takes a chunk of rows, stores the row
results and keeps per-column partial sums, which a small second kernel adds up. How many programs the mixed
kernel has (``scheduler.mix_programs``) decides how many warps are in flight per SM (too few and the kernel
waits on memory) and how many partial rows the second kernel reads. This tool is the evidence for that rule:
for each case (below) it compiles the function under kiln once per program count (fresh Dynamo state, kiln's
on-disk caches off, ``config.mix_programs`` set for the compile; ``--tile-acc-cols`` sets the accumulator form,
``config.mix_tile_acc_cols``) and once unmixed (the row kernel and a split column reduction of its own, as
Inductor has them), checks the results against eager, and times the compiled function (CUDA-graph replays:
median device µs, every kernel), beside Inductor.

Cases (name: rows x columns, bf16 inputs, fp32 sums): BatchNorm backward over channels-last rows with a
residual's ReLU mask, as ResNet-50's training step has them at batch 32 (``bn``: the stem at 112 x 112, the
stages at 56, 28 and 14; the masked gradient stored in bf16 and its two column sums), the whole BatchNorm
backward after a plain ReLU as the model has it (``bnrelu``: the masked gradient is no output, so kiln keeps it
inline, ``graph.RECOMPUTE_MAX_READS``: the *kiln inline* column; its program and unmixed columns store it in
bf16 instead, the row kernel its column sums mix into), a GELU backward with the
linear layer's bias gradient at ViT-B/16 MLP size (``gelu``: its rows fill three quarters of their block, so
the scheduler keeps it unmixed at every count, ``scheduler.MIX_MIN_FILL``; the row checks that choice against
Inductor), and a LayerNorm backward at ViT-B/16 size
(``ln``: row sums for the input gradient, column sums for the weight and bias).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from .sweeps import bench_us, check_args, inductor_us, print_head, print_row, timed_cell

#: name -> (rows, columns, kind)
CASES: dict[str, tuple[int, int, str]] = {
    "bn_401408x64": (401408, 64, "bn"),
    "bn_100352x64": (100352, 64, "bn"),
    "bn_100352x256": (100352, 256, "bn"),
    "bn_25088x512": (25088, 512, "bn"),
    "bn_6272x1024": (6272, 1024, "bn"),
    "bnrelu_100352x64": (100352, 64, "bnrelu"),
    "bnrelu_25088x128": (25088, 128, "bnrelu"),
    "bnrelu_6272x256": (6272, 256, "bnrelu"),
    "bnrelu_1568x512": (1568, 512, "bnrelu"),
    "bnrelu_25088x512": (25088, 512, "bnrelu"),
    "gelu_6304x3072": (6304, 3072, "gelu"),
    "ln_6304x768": (6304, 768, "ln"),
}

PROGRAMS = (256, 512, 1024, 2048)


def _bn(g: torch.Tensor, b: torch.Tensor, a: torch.Tensor, x: torch.Tensor, mean: torch.Tensor) -> tuple:
    d = torch.where(a <= 0, torch.zeros_like(g), g + b)
    df = d.float()
    return d, df.sum(0), (df * (x.float() - mean)).sum(0)


def _bnrelu(
    g: torch.Tensor,
    a: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    w: torch.Tensor,
) -> tuple:
    n = g.shape[0]
    d = torch.where(a <= 0, torch.zeros_like(g), g).float()
    xc = x.float() - mean
    s1, s2 = d.sum(0), (d * xc).sum(0)
    dx = (d - s1 / n - xc * (invstd * invstd) * (s2 / n)) * (invstd * w)
    return dx.to(g.dtype), s1, s2


def _gelu(g: torch.Tensor, h: torch.Tensor) -> tuple:
    hf = h.float()
    cdf = 0.5 * (1 + torch.erf(hf * 0.7071067811865476))
    d = (g.float() * (cdf + hf * torch.exp(-0.5 * hf * hf) * 0.3989422804014327)).to(g.dtype)
    return d, d.float().sum(0)


def _ln(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple:
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-6)
    xhat = (xf - mean) * rstd
    gf = g.float()
    dxhat = gf * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    return dx.to(g.dtype), (gf * xhat).sum(0), gf.sum(0)


def make_case(name: str, device: str) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """(function, inputs) of case ``name`` on ``device``."""
    rows, cols, kind = CASES[name]
    gen = torch.Generator(device=device).manual_seed(0)

    def mat() -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, device=device).to(torch.bfloat16)

    if kind == "bn":
        return _bn, (mat(), mat(), mat(), mat(), torch.randn(cols, generator=gen, device=device))
    if kind == "bnrelu":
        vec = [torch.rand(cols, generator=gen, device=device) + 0.5 for _ in range(2)]
        return _bnrelu, (mat(), mat(), mat(), torch.randn(cols, generator=gen, device=device), *vec)
    if kind == "gelu":
        return _gelu, (mat(), mat())
    return _ln, (mat(), mat(), torch.randn(cols, generator=gen, device=device))


def _close(got: tuple, want: tuple) -> bool:
    """Every output as eager's: the bf16 row results within two of their units in the last place (a sum
    ordered differently rounds to the neighbouring bf16), the fp32 column sums within 1e-3."""
    for g, w in zip(got, want):
        tol = 1.6e-2 if g.dtype == torch.bfloat16 else 1e-3
        if not torch.allclose(g.float(), w.float(), rtol=tol, atol=tol):
            return False
    return True


def compile_kiln(
    fn: Callable[..., Any],
    xs: tuple[torch.Tensor, ...],
    programs: int | None,
    tile_acc_cols: int | None = None,
    mixed: bool = True,
    narrow: str = "rule",
) -> Callable[..., Any]:
    """``fn`` compiled by kiln (and run once, checked against eager) with mixed kernels of ``programs``
    programs (None: the scheduler's rule) and ``config.mix_tile_acc_cols`` at ``tile_acc_cols`` (None: as set);
    ``mixed=False``: the scheduler does not mix (the row kernel, then the column sums' own split reduction,
    Inductor's shape). ``narrow``: where an exact upcast read by several kernels lives: "rule" (as
    ``graph.RECOMPUTE_MAX_READS`` decides), "inline" (recomputed by every reader), "store" (stored in its narrow
    type, ``GraphLowering._realize_narrow``, and so a row kernel its column sums can mix into)."""
    from compiler import config, graph, scheduler

    old_mix = scheduler.Scheduler.mix_column_partials
    old_reads = graph.RECOMPUTE_MAX_READS
    if not mixed:
        scheduler.Scheduler.mix_column_partials = lambda self: None  # type: ignore[method-assign]
    graph.RECOMPUTE_MAX_READS = {"rule": old_reads, "inline": 1 << 30, "store": 0}[narrow]
    try:
        tile = {} if tile_acc_cols is None else {"mix_tile_acc_cols": tile_acc_cols}
        with config.patch(cache="0", mix_programs=programs or 0, **tile):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="kiln")
            got = compiled(*xs)
    finally:
        scheduler.Scheduler.mix_column_partials = old_mix  # type: ignore[method-assign]
        graph.RECOMPUTE_MAX_READS = old_reads
    if not _close(got, fn(*xs)):
        raise AssertionError(f"kiln's result differs from eager's ({programs} programs, mixed {mixed})")
    return compiled


def kiln_us(
    fn: Callable[..., Any],
    xs: tuple[torch.Tensor, ...],
    programs: int | None,
    tile_acc_cols: int | None = None,
    mixed: bool = True,
    narrow: str = "rule",
) -> float:
    """µs of ``fn`` compiled by ``compile_kiln`` with these arguments."""
    compiled = compile_kiln(fn, xs, programs, tile_acc_cols, mixed, narrow)
    return bench_us(lambda: compiled(*xs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m compiler.tools.mix_sweep", description=__doc__.splitlines()[0]
    )
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    p.add_argument("--programs", default=",".join(map(str, PROGRAMS)), help="program counts to compile with")
    p.add_argument(
        "--tile-acc-cols",
        type=int,
        default=None,
        help="config.mix_tile_acc_cols for every kiln compile (0: one-row accumulators; default: as configured)",
    )
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor's column")
    args = p.parse_args(argv)
    if args.tile_acc_cols is None:
        from compiler import config

        args.tile_acc_cols = config.settings().mix_tile_acc_cols
    if args.tile_acc_cols < 0:
        print(f"mix_sweep: --tile-acc-cols must be 0 or more, got {args.tile_acc_cols}", file=sys.stderr)
        return 2
    counts = check_args("mix_sweep", args.cases, CASES, "--programs", args.programs)
    if counts is None:
        return 2
    from compiler import register, scheduler

    register()
    print(
        "device µs, median of CUDA-graph replays; rule: the programs of the scheduler's mix_programs for the "
        f"case; full-tile accumulators for rows of at most {args.tile_acc_cols} elements"
    )
    print_head(
        ["case", "inductor", "rule"] + [f"kiln p{c}" for c in counts] + ["kiln unmixed", "kiln inline"]
    )
    for name in args.cases.split(","):
        fn, xs = make_case(name, "cuda")
        rows, cols, kind = CASES[name]
        cells = [name, "-" if args.no_inductor else timed_cell(partial(inductor_us, fn, xs))]
        cells.append(str(scheduler.mix_grid(rows, cols)[1]))
        # bnrelu: the program and unmixed columns store the masked gradient (a row kernel to mix into); the last
        # column recomputes it in every reader, as the rule does for a value of two reads
        stored = "store" if kind == "bnrelu" else "rule"
        variants = [(c, True) for c in counts] + [(None, False)]
        cells += [timed_cell(partial(kiln_us, fn, xs, c, args.tile_acc_cols, m, stored)) for c, m in variants]
        inline = partial(kiln_us, fn, xs, None, args.tile_acc_cols, True, "inline")
        cells.append(timed_cell(inline) if kind == "bnrelu" else "-")
        print_row(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
