"""Reduction lowerings: every reduction becomes a ``Reduction`` ComputedBuffer over (kept dims, reduced dims).

Producers are inlined into the reduction's body; consumers fuse with it in the scheduler. ``mean``, ``var``
and ``var_mean`` are built from sums (two-pass variance: mean first, then squared deviations).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ..dtypes import compute_dtype
from ..exc import NotLowered
from ..graph import GraphLowering, register_lowering
from ..ir import (
    ColumnSource,
    ComputedBuffer,
    Index,
    Layout,
    Lazy,
    Reduction,
    Strided,
    Value,
    contiguous_strides,
    prod,
)
from ..kexpr import Const, IndexValue, KExpr, Op, cast

aten = torch.ops.aten


def _dims(dims, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    out = sorted({d + rank if d < 0 else d for d in dims})
    return out if rank > 0 else []


def reduce(
    g: GraphLowering,
    x: Value,
    dims: Sequence[int],
    keepdim: bool,
    rtype: str,
    dtype: torch.dtype,
    src_dtype: torch.dtype | None = None,
    body=None,
) -> Strided:
    """Add a Reduction over ``dims`` of ``x`` (or of ``body(full_index)``) and return a view of its buffer."""
    rank = len(x.size)
    dset = set(dims)
    out_ranges = tuple(
        (sympy.Integer(1) if d in dset else x.size[d]) for d in range(rank) if keepdim or d not in dset
    )
    red_ranges = tuple(x.size[d] for d in dims)
    src = src_dtype or compute_dtype(dtype)
    load = body or x.load

    def fn(idx: Index, ridx: Index) -> KExpr:
        full, it, rit = [], iter(idx), iter(ridx)
        for d in range(rank):
            if d in dset:
                full.append(next(rit))
                if keepdim:
                    next(it)
            else:
                full.append(next(it))
        return cast(load(full), src)

    outer = _is_outer(fn, out_ranges, red_ranges)
    split = _split_count(out_ranges, red_ranges, rtype, outer)
    if split > 1:
        return _split_reduce(g, x.device, out_ranges, red_ranges, fn, rtype, dtype, src, split, outer)
    layout = Layout(out_ranges, contiguous_strides(out_ranges), sympy.Integer(0), dtype, x.device)
    red = Reduction(out_ranges, red_ranges, fn, rtype, dtype, src)
    return g.add_computed(ComputedBuffer(g.new_name(), layout, red))


#: split reductions: few rows of many elements run as partial reductions over chunks, then a final pass
SPLIT_MIN_RNUMEL = 32768
SPLIT_TARGET_PROGRAMS = 1024
SPLIT_MIN_CHUNK = 4096
#: column (outer) reductions over at least this many rows split in two or more (and then may join a row kernel
#: as partial sums: H100, bf16 norm backward at 1024 x 768 / 2048 x 4096 rows x cols, 15.3 -> 9.8 us and
#: 70.5 -> 44.4 us against a 4096-row threshold; 512 rows was no better)
OUTER_SPLIT_MIN_ROWS = 1024
#: rows of one chunk of a split column reduction (at least; the partial rows stay at most OUTER_SPLIT_MAX_PARTIALS).
#: H200 ``compiler.tools.split_sweep`` (device µs, both stages): eight norm- and bias-gradient cases summed 68.8 at
#: 1024 rows, 65.5 at 512, 73-79 at 64-256, every case but one within 2 µs of its best; the GPT-2 CI-size LayerNorm
#: backward's three sums over 2048 x 512 fp32: 8.7 µs at 1024, 7.0 at 512 (Inductor 8.9)
OUTER_SPLIT_CHUNK_ROWS = 1024
OUTER_SPLIT_MAX_PARTIALS = 32768


def _split_count(out_ranges, red_ranges, rtype: str, outer: bool) -> int:
    """How many chunks to split each row into (1: no split). Only static sizes and combinable types.

    Inner (row) reductions split when there are too few rows to fill the GPU; outer (column) reductions,
    which process `outer_xblock` (64) adjacent columns per program, split until there are enough column blocks.
    """
    if rtype not in ("sum", "prod", "max", "min"):
        return 1
    X, R = prod(out_ranges), prod(red_ranges)
    if not (X.is_number and R.is_number):
        return 1
    X, R = int(X), int(R)
    if outer:
        if R < OUTER_SPLIT_MIN_ROWS or X >= 16384:
            return 1
        return max(2, min(R // OUTER_SPLIT_CHUNK_ROWS, OUTER_SPLIT_MAX_PARTIALS // max(X, 1)))
    if R < SPLIT_MIN_RNUMEL or X >= SPLIT_TARGET_PROGRAMS // 4:
        return 1
    return max(1, min(R // SPLIT_MIN_CHUNK, SPLIT_TARGET_PROGRAMS // max(X, 1)))


def _is_outer(fn, out_ranges, red_ranges) -> bool:
    """True when the reduced elements of a row are far apart and neighbouring rows are adjacent (the address
    steps of each load, evaluated as the renderer's ``reduction_hint`` does: views put floor divisions and
    modulos into indices, and a column sum through a reshape was taken for a row sum and never split)."""
    from ..kexpr import address_steps, loads

    idx = [sympy.Symbol(f"o{i}", integer=True, nonnegative=True) for i in range(len(out_ranges))]
    ridx = [sympy.Symbol(f"q{i}", integer=True, nonnegative=True) for i in range(len(red_ranges))]
    if not idx or not ridx:
        return False
    # the innermost dims that are not 1 (keepdim leaves size-1 dims among the kept ones)
    xi = max((i for i, r in enumerate(out_ranges) if r != 1), default=len(idx) - 1)
    ri = max((i for i, r in enumerate(red_ranges) if r != 1), default=len(ridx) - 1)
    others = {s: 0 for s in idx + ridx if s not in (idx[xi], ridx[ri])}
    votes = 0
    for ld in loads(fn(idx, ridx)):
        if ld.indirect:
            continue
        cx, cr = address_steps(ld.index, idx[xi], ridx[ri], others)
        if not cx or not cr:
            continue  # broadcast along rows or along the reduction (or not evaluable): no say in the tiling
        if cr == 1:
            votes -= 1
        elif cx == 1:
            votes += 1
    return votes > 0


def _identity(rtype: str, dtype: torch.dtype):
    if rtype == "sum":
        return 0
    if rtype == "prod":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if rtype == "max" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if rtype == "max" else info.max


def _split_reduce(
    g, device, out_ranges, red_ranges, fn, rtype, dtype, src, split: int, outer: bool = False
) -> Strided:
    from .misc import mask_loads

    R = int(prod(red_ranges))
    chunk = -(-R // split)
    red_strides = contiguous_strides(red_ranges)
    ident = Const(_identity(rtype, src), src)

    def stage1(idx: Index, ridx: Index) -> KExpr:
        flat = idx[0] * chunk + ridx[0]
        inside = Op("lt", [IndexValue(flat), Const(R, torch.int64)], torch.bool)
        parts = [
            FloorDiv(flat, red_strides[0]) if i == 0 else ModularIndexing(flat, st, sz)
            for i, (st, sz) in enumerate(zip(red_strides, red_ranges))
        ]
        v = mask_loads(fn(list(idx[1:]), parts), inside, {})
        return Op("where", [inside, v, ident], src)

    # partial results laid out (split, *rows): for column reductions, adjacent rows stay adjacent
    ranges1 = (sympy.Integer(split),) + tuple(out_ranges)
    lay1 = Layout(ranges1, contiguous_strides(ranges1), sympy.Integer(0), src, device)
    column = ColumnSource(fn, tuple(out_ranges), tuple(red_ranges)) if outer and rtype == "sum" else None
    part = g.add_computed(
        ComputedBuffer(
            g.new_name(), lay1, Reduction(ranges1, (sympy.Integer(chunk),), stage1, rtype, src, src, column)
        )
    )

    def stage2(idx: Index, ridx: Index) -> KExpr:
        return part.load([ridx[0]] + list(idx))

    layout = Layout(tuple(out_ranges), contiguous_strides(out_ranges), sympy.Integer(0), dtype, device)
    red = Reduction(tuple(out_ranges), (sympy.Integer(split),), stage2, rtype, dtype, src)
    return g.add_computed(ComputedBuffer(g.new_name(), layout, red))


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return compute_dtype(dtype)


def _simple(rtype: str):
    def lower(g: GraphLowering, node, x: Value, dims=None, keepdim: bool = False, *, dtype=None):
        out = node.meta["val"]
        if len(x.size) == 0:
            return Lazy((), out.dtype, x.device, lambda idx: cast(x.load(idx), out.dtype))
        d = _dims(dims, len(x.size))
        acc = _acc_dtype(out.dtype)
        r = reduce(g, x, d, keepdim, rtype, acc)
        if acc == out.dtype:
            return r
        return Lazy(r.size, out.dtype, x.device, lambda idx: cast(r.load(idx), out.dtype))

    return lower


register_lowering(aten.sum.dim_IntList)(_simple("sum"))
register_lowering(aten.amax.default)(_simple("max"))
register_lowering(aten.amin.default)(_simple("min"))


@register_lowering(aten.sum.default)
def _sum_all(g, node, x, *, dtype=None):
    return _simple("sum")(g, node, x, None, False)


@register_lowering(aten.prod.dim_int)
def _prod(g, node, x, dim, keepdim=False, *, dtype=None):
    return _simple("prod")(g, node, x, [dim], keepdim)


@register_lowering(aten.prod.default)
def _prod_all(g, node, x, *, dtype=None):
    return _simple("prod")(g, node, x, None, False)


@register_lowering(aten.max.default, aten.min.default)
def _max_all(g, node, x):
    if x.size and any(s == 0 for s in x.size):
        raise NotLowered("max of an empty tensor raises in eager")
    return _simple("max" if node.target is aten.max.default else "min")(g, node, x, None, False)


@register_lowering(
    aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default
)
def _any_all(g, node, x, dims=None, keepdim=False):
    rtype = "max" if node.target.__name__.startswith("any") else "min"
    out = node.meta["val"]
    if len(x.size) == 0:
        return Lazy((), torch.bool, x.device, lambda idx: cast(x.load(idx), torch.bool))
    d = _dims(dims, len(x.size))
    r = reduce(
        g,
        x,
        d,
        keepdim,
        rtype,
        torch.int32,
        torch.int32,
        body=lambda full: cast(cast(x.load(full), torch.bool), torch.int32),
    )
    return Lazy(r.size, out.dtype, x.device, lambda idx: cast(r.load(idx), torch.bool))


def _arg(rtype: str):
    def lower(g: GraphLowering, node, x: Value, dim=None, keepdim: bool = False):
        if len(x.size) == 0:
            return Lazy((), torch.int64, x.device, lambda idx: Const(0, torch.int64))
        if dim is None:
            flat_size = (prod(x.size),)
            from .views import reshape_value

            remap = reshape_value(x, flat_size)
            flat = Lazy(flat_size, x.dtype, x.device, lambda idx: x.load(remap(idx)))
            r = reduce(g, flat, [0], False, rtype, torch.int64, compute_dtype(x.dtype))
            if keepdim:
                size = tuple(sympy.Integer(1) for _ in x.size)
                return Lazy(size, torch.int64, x.device, lambda idx: r.load([]))
            return r
        return reduce(g, x, _dims(dim, len(x.size)), keepdim, rtype, torch.int64, compute_dtype(x.dtype))

    return lower


register_lowering(aten.argmax.default)(_arg("argmax"))
register_lowering(aten.argmin.default)(_arg("argmin"))


@register_lowering(aten.max.dim, aten.min.dim, exact=True)  # values of x: exact in its dtype
def _max_dim(g, node, x: Value, dim: int, keepdim: bool = False):
    is_max = node.target is aten.max.dim
    out = node.meta["val"][0]
    if len(x.size) == 0:
        return (
            Lazy((), x.dtype, x.device, lambda idx: x.load(idx)),
            Lazy((), torch.int64, x.device, lambda idx: Const(0, torch.int64)),
        )
    d = _dims(dim, len(x.size))
    acc = _acc_dtype(out.dtype)
    vals: Value = reduce(g, x, d, keepdim, "max" if is_max else "min", acc)
    idxs = reduce(g, x, d, keepdim, "argmax" if is_max else "argmin", torch.int64, acc)
    if acc != out.dtype:
        v = vals
        vals = Lazy(v.size, out.dtype, x.device, lambda idx: cast(v.load(idx), out.dtype))
    return vals, idxs


def _count(x: Value, dims: Sequence[int]) -> sympy.Expr:
    return prod([x.size[d] for d in dims])


def _scalar_value(e: sympy.Expr, dtype: torch.dtype) -> KExpr:
    return Const(int(e), dtype) if e.is_number else cast(IndexValue(e), dtype)


@register_lowering(aten.mean.dim, aten.mean.default)
def _mean(g, node, x: Value, dims=None, keepdim: bool = False, *, dtype=None):
    out = node.meta["val"]
    if len(x.size) == 0:
        return Lazy((), out.dtype, x.device, lambda idx: cast(x.load(idx), out.dtype))
    d = _dims(dims, len(x.size))
    acc = _acc_dtype(out.dtype)
    s = reduce(g, x, d, keepdim, "sum", acc)
    n = _count(x, d)
    return Lazy(
        s.size,
        out.dtype,
        x.device,
        lambda idx: cast(Op("truediv", [s.load(idx), _scalar_value(n, acc)], acc), out.dtype),
    )


def _var_parts(g, node, x: Value, dims, correction, keepdim: bool):
    """(var, mean) Lazies in the output dtype (std reads var back in the accumulation dtype: one rounding)."""
    out = node.meta["val"]
    out = out[0] if isinstance(out, (list, tuple)) else out
    acc = _acc_dtype(out.dtype)
    d = _dims(dims, len(x.size))
    n = _count(x, d)
    total = reduce(g, x, d, True, "sum", acc)
    dset = set(d)

    def mean_at(full: Index) -> KExpr:
        kidx = [sympy.Integer(0) if i in dset else full[i] for i in range(len(full))]
        return Op("truediv", [total.load(kidx), _scalar_value(n, acc)], acc)

    def sq_dev(full: Index) -> KExpr:
        dev = Op("sub", [cast(x.load(full), acc), mean_at(full)], acc)
        return Op("mul", [dev, dev], acc)

    m2 = reduce(g, x, d, keepdim, "sum", acc, body=sq_dev)
    corr = 1 if correction is None else correction
    if float(corr) == int(corr):
        corr = int(corr)

    def var_fn(idx: Index) -> KExpr:
        # max(n - correction, 0) in the accumulation dtype (correction may be a float)
        dn = Op("sub", [cast(_scalar_value(n, torch.int64), acc), Const(float(corr), acc)], acc)
        dn = Op("maximum", [dn, Const(0.0, acc)], acc)
        return cast(Op("truediv", [m2.load(idx), dn], acc), out.dtype)

    var = Lazy(m2.size, out.dtype, x.device, var_fn)

    def mean_fn(idx: Index) -> KExpr:
        it = iter(idx)
        kidx = (
            [sympy.Integer(0) if i in dset else next(it) for i in range(len(x.size))]
            if not keepdim
            else list(idx)
        )
        return cast(Op("truediv", [total.load(kidx), _scalar_value(n, acc)], acc), out.dtype)

    mean = Lazy(m2.size, out.dtype, x.device, mean_fn)
    return var, mean


@register_lowering(aten.var.correction, aten.var.dim)
def _var(g, node, x, dims=None, unbiased=None, keepdim=False, *, correction=None):
    if node.target is aten.var.dim:
        correction = 1 if unbiased in (None, True) else 0
    return _var_parts(g, node, x, dims, correction, keepdim)[0]


@register_lowering(aten.var_mean.correction)
def _var_mean(g, node, x, dims=None, *, correction=None, keepdim=False):
    return _var_parts(g, node, x, dims, correction, keepdim)


@register_lowering(aten.std.correction)
def _std(g, node, x, dims=None, *, correction=None, keepdim=False):
    var, _ = _var_parts(g, node, x, dims, correction, keepdim)  # eager: sqrt(var), one rounding
    out = node.meta["val"]
    acc = _acc_dtype(out.dtype)
    return Lazy(
        var.size,
        out.dtype,
        x.device,
        lambda idx: cast(Op("sqrt", [cast(var.load(idx), acc)], acc), out.dtype),
    )
