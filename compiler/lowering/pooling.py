"""Pooling lowerings: ``max_pool2d_with_indices`` and its backward as pointwise kernels over window taps.

Terms: a *tap* is one (kh, kw) position of the pooling window; output element (oh, ow) reads input row
``oh * stride_h - pad_h + kh * dilation_h`` and the column likewise. A tap outside the input (padding) reads
-inf and never wins. The value is the running ``maximum`` of the taps (NaN propagates, as in eager); the index
is the flat ``h * W + w`` position in the input plane of the tap that eager's kernels pick: a tap replaces the
best so far when it is greater or NaN (so a later NaN wins), starting from the window's first in-bounds
position. Both outputs are Lazy: an unused index costs nothing, and the window is recomputed per output element
(no copy of the input). Windows of more than ``MAX_TAPS`` taps stay with ATen (``NotLowered``): their
unrolled body would outgrow a kernel.

The backward is a gather, not a scatter: input element (ih, iw) sums the gradients of the output elements whose
window holds it and whose index names it. With stride s and window k (no dilation) at most ceil(k / s) output
rows hold a given input row: ``oh = (ih + pad) // s - t`` for t below that bound, kept where ``oh`` is an output
row and its window reaches ``ih`` (columns likewise).
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from ..dtypes import compute_dtype
from ..exc import NotLowered
from ..graph import GraphLowering, register_lowering
from ..ir import Index, Lazy, Value, sym
from ..kexpr import Const, IndexValue, KExpr, Op, cast
from .misc import in_range, masked_load

aten = torch.ops.aten

#: the most taps a lowered window may have (5x5)
MAX_TAPS = 25


def _pair(v) -> tuple[int, int]:
    """A pooling argument as (h, w): one int for both, or a one- or two-element list."""
    if isinstance(v, int):
        return (v, v)
    v = list(v)
    if not v:
        raise NotLowered("pooling argument missing")
    if len(v) == 1:
        return (int(v[0]), int(v[0]))
    return (int(v[0]), int(v[1]))


def _clamp(i: sympy.Expr, n: sympy.Expr) -> sympy.Expr:
    """``i`` moved into ``[0, n)``: a tap in the padding reads its nearest input element, unmasked, and the
    caller's ``where`` discards it. No load of the window carries a per-tap mask, so the loads of a fused
    producer that do not depend on the tap (a batch norm's per-channel parameters) are the same expression
    in every tap and are emitted once: masked per tap, ResNet's stem recomputed its batch norm nine times
    per output element (0.12 ms a step on the H200 against Inductor's 0.02)."""
    hi = n - 1
    if i.is_number and hi.is_number:
        return sympy.Integer(min(max(int(i), 0), int(hi)))
    # built unevaluated where the bounds are clear from the affine forms: sympy's own Min/Max evaluation asks
    # its assumptions system about every pair of arguments (milliseconds per tap, 0.5 s of a ResNet-18
    # training step's schedule) and decides nothing more for these indices than the tests below
    lo_i = _lower_bound(i)
    if i.is_number:
        low: sympy.Expr = sympy.Integer(max(int(i), 0))
    else:
        low = i if lo_i is not None and lo_i >= 0 else sympy.Max(0, i, evaluate=False)
    lo_low = max(lo_i, 0) if lo_i is not None else 0  # Max(0, i) >= 0 whatever i is
    if hi.is_number and lo_low >= int(hi):
        return sympy.Integer(int(hi))
    lo_gap = _lower_bound(hi - low) if low.is_number else None
    if lo_gap is not None and lo_gap >= 0:
        return low
    return sympy.Min(low, hi, evaluate=False)


def _lower_bound(e: sympy.Expr) -> int | None:
    """A lower bound of integer expression ``e`` read off its affine form: its constant plus, for each term
    with a positive coefficient, the coefficient times 1 for a positive integer term or 0 for a nonnegative
    one; None where a term has a negative coefficient or an unknown sign (no bound shown, not a proof that
    there is none)."""
    bound = 0
    for term, coeff in e.as_coefficients_dict().items():
        if not coeff.is_Integer:
            return None
        if term == 1:
            bound += int(coeff)
        elif coeff < 0:
            return None
        elif term.is_integer and term.is_positive:
            bound += int(coeff)
        elif term.is_nonnegative is not True:
            return None
    return bound


def _and(a: KExpr, b: KExpr) -> KExpr:
    return Op("logical_and", [a, b], torch.bool)


def _or(a: KExpr, b: KExpr) -> KExpr:
    return Op("logical_or", [a, b], torch.bool)


@register_lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(
    g: GraphLowering, node, x: Value, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False
):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride else (kh, kw)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > MAX_TAPS:
        raise NotLowered(f"a {kh}x{kw} pooling window (more than {MAX_TAPS} taps)")
    if not x.dtype.is_floating_point:
        raise NotLowered("max pooling of an integer tensor")
    out_val, out_idx = node.meta["val"]
    size = tuple(sym(s) for s in out_val.shape)
    rank = len(size)
    H, W = x.size[rank - 2], x.size[rank - 1]
    taps = [(i, j) for i in range(kh) for j in range(kw)]
    neg_inf = Const(float("-inf"), x.dtype)

    def window(idx: Index) -> list[tuple[KExpr, KExpr, KExpr]]:
        """Each tap's (in-bounds mask, value, flat input position)."""
        oh, ow = idx[rank - 2], idx[rank - 1]
        out: list[tuple[KExpr, KExpr, KExpr]] = []
        for i, j in taps:
            ih, iw = oh * sh - ph + i * dh, ow * sw - pw + j * dw
            inside = _and(in_range(ih, H), in_range(iw, W))
            local = list(idx[: rank - 2]) + [_clamp(ih, H), _clamp(iw, W)]
            v = Op("where", [inside, cast(x.load(local), x.dtype), neg_inf], x.dtype)
            out.append((inside, v, IndexValue(ih * W + iw)))
        return out

    def value(idx: Index) -> KExpr:
        taps_ = window(idx)
        best = taps_[0][1]
        for _, v, _ in taps_[1:]:
            best = Op("maximum", [best, v], x.dtype)
        return best

    def index(idx: Index) -> KExpr:
        oh, ow = idx[rank - 2], idx[rank - 1]
        h0 = sympy.Max(oh * sh - ph, 0)
        w0 = sympy.Max(ow * sw - pw, 0)
        best: KExpr = neg_inf
        where: KExpr = IndexValue(h0 * W + w0)
        for inside, v, flat in window(idx):
            take = _and(inside, _or(Op("gt", [v, best], torch.bool), Op("isnan", [v], torch.bool)))
            best = Op("where", [take, v, best], x.dtype)
            where = Op("where", [take, flat, where], torch.int64)
        return where

    cost = len(taps) * (x.cost + 2 if isinstance(x, Lazy) else 2)
    return (
        Lazy(size, x.dtype, x.device, value, cost),
        Lazy(size, torch.int64, x.device, index, 2 * cost),
    )


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(
    g: GraphLowering,
    node,
    grad: Value,
    x: Value,
    kernel_size,
    stride,
    padding,
    dilation,
    ceil_mode,
    indices: Value,
):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride else (kh, kw)
    ph, pw = _pair(padding)
    if _pair(dilation) != (1, 1):
        raise NotLowered("max pooling backward with dilation")
    th, tw = -(-kh // sh), -(-kw // sw)  # output rows (columns) whose windows can hold one input row (column)
    if th * tw > MAX_TAPS:
        raise NotLowered(f"max pooling backward over {th}x{tw} output windows per input element")
    out = node.meta["val"]
    size = tuple(sym(s) for s in out.shape)
    rank = len(size)
    OH, OW = grad.size[rank - 2], grad.size[rank - 1]
    W = size[rank - 1]
    acc = compute_dtype(out.dtype)
    zero = Const(0.0, acc)

    def fn(idx: Index) -> KExpr:
        ih, iw = idx[rank - 2], idx[rank - 1]
        here = IndexValue(ih * W + iw)
        total: KExpr = zero
        for a in range(th):
            oh = FloorDiv(ih + ph, sh) - a
            rows = _and(
                in_range(oh, OH),
                Op("ge", [IndexValue(oh * sh - ph + kh - 1 - ih), Const(0, torch.int64)], torch.bool),
            )
            for b in range(tw):
                ow = FloorDiv(iw + pw, sw) - b
                cols = _and(
                    in_range(ow, OW),
                    Op("ge", [IndexValue(ow * sw - pw + kw - 1 - iw), Const(0, torch.int64)], torch.bool),
                )
                valid = _and(rows, cols)
                local = list(idx[: rank - 2]) + [oh, ow]
                picked = _and(
                    valid, Op("eq", [cast(masked_load(indices, local, valid), torch.int64), here], torch.bool)
                )
                g_ = cast(masked_load(grad, local, picked), acc)
                total = Op("add", [total, Op("where", [picked, g_, zero], acc)], acc)
        return cast(total, out.dtype)

    cost = (
        th * tw * 4
        + (grad.cost if isinstance(grad, Lazy) else 0)
        + (indices.cost if isinstance(indices, Lazy) else 0)
    )
    return Lazy(size, out.dtype, out.device, fn, cost)
