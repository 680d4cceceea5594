"""The scatter family (``index_put``, ``scatter_add``, ``scatter_reduce``; ``index_add`` and the embedding backward
reach kiln as ``index_put(..., accumulate=True)``) and scans (``cumsum``, ``cumprod``, ``logcumsumexp``).

A scatter is three IR steps: a fresh *target* buffer (a copy of ``self`` or a fill, in the *accumulation dtype*:
fp32 for fp16/bf16, int32 for 8/16-bit integers, as atomics exist for those; plain stores keep eager's dtype), a
``Scatter`` that combines the sources into it with atomics (``ir.Scatter``), and the result read back, cast to
eager's dtype (fused into its readers). Out-of-range indices write nothing (eager raises). Float sums (``add``,
``mean``) and racing stores depend on the order of the writes: with ``torch.use_deterministic_algorithms(True)``
at compile time they stay ATen (``FallbackReason`` kind ``determinism``); maxima, minima and integer sums do not.
Otherwise a float sum is *ordered* (summed in a fixed order by a kernel without atomics, bitwise identical run to
run) when the ``scatter_order`` setting is ``fixed`` and it has at most ``ordered_scatter_max`` source elements;
an atomic float sum or a store that may race is noted in ``Program.nondeterministic`` (kind ``nondeterministic``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy
import torch

from ..contract import broadcast_index
from ..dtypes import compute_dtype
from ..exc import NotLowered
from ..graph import FallbackReason, GraphLowering, register_lowering
from ..ir import (
    ComputedBuffer,
    Index,
    Layout,
    Lazy,
    Pointwise,
    Scan,
    Scatter,
    Strided,
    Value,
    contiguous_strides,
    is_dense,
    size_hints,
    sym,
)
from ..kexpr import Const, IndexValue, KExpr, Op, cast
from .indexing import broadcast_sizes, wrap_index

aten = torch.ops.aten

#: scatter_reduce's reduce name -> the Scatter combine (``mean``: a sum and a count; ``prod``: no atomic)
_REDUCE = {"sum": "add", "mean": "add", "amax": "max", "amin": "min"}


def accumulation_dtype(dtype: torch.dtype, reduce: str) -> torch.dtype:
    """The dtype a scatter's target holds: eager's for plain stores; for atomics (which exist for 32/64-bit types
    only) fp32 for fp16/bf16 and int32 for 8/16-bit integers."""
    if reduce == "store":
        return dtype
    if dtype == torch.bool:
        raise NotLowered("scatter into a bool tensor", kind="dtype")
    if dtype in (torch.int8, torch.int16, torch.uint8):
        return torch.int32
    return compute_dtype(dtype)


def _check_determinism(op: str, reduce: str, acc: torch.dtype) -> None:
    """Order-dependent writes stay ATen when deterministic algorithms are asked for (at compile time)."""
    if torch.are_deterministic_algorithms_enabled() and (
        reduce == "store" or (acc.is_floating_point and reduce == "add")
    ):
        raise NotLowered(
            f"{op} with deterministic algorithms on: atomic float sums and racing stores are order-dependent",
            kind="determinism",
        )


def _ordered(
    g: GraphLowering,
    op: str,
    reduce: str,
    acc: torch.dtype,
    ranges: Sequence[sympy.Expr],
    exact: bool = False,
) -> bool:
    """Whether this scatter's float sum runs order-fixed; notes the cases that stay order-dependent (``exact``:
    the values summed are small integers, exact in any order)."""
    if reduce == "store":
        if "index_put" in op:
            g.nondeterministic.append(
                FallbackReason(
                    "nondeterministic",
                    op,
                    "racing stores: where positions repeat, any one value is kept (as eager's on a GPU)",
                )
            )
        return False
    if reduce != "add" or not acc.is_floating_point or exact:
        return False
    n = _hint(sympy.Mul(*ranges)) if ranges else 1
    s = g.settings
    if s.scatter_order == "fixed" and n is not None and n <= s.ordered_scatter_max:
        return True
    why = (
        "scatter_order=atomic"
        if s.scatter_order == "atomic"
        else f"{n if n is not None else 'an unknown number of'} source elements, more than ordered_scatter_max="
        f"{s.ordered_scatter_max}"
    )
    g.nondeterministic.append(
        FallbackReason(
            "nondeterministic",
            op,
            f"atomic float sum ({why}): the order of the "
            "additions, and so the last bits, may change run to run",
        )
    )
    return False


def _valid(conds: Sequence[KExpr]) -> KExpr:
    out: KExpr = Const(True, torch.bool)
    for c in conds:
        out = c if isinstance(out, Const) else Op("logical_and", [out, c], torch.bool)
    return out


def _in_range(i: KExpr, size: sympy.Expr) -> KExpr:
    """``0 <= i < size`` for an int64 index."""
    n = Const(int(size), torch.int64) if size.is_number else IndexValue(size)
    return Op(
        "logical_and",
        [Op("ge", [i, Const(0, torch.int64)], torch.bool), Op("lt", [i, n], torch.bool)],
        torch.bool,
    )


def _layout(node, dtype: torch.dtype) -> Layout:
    """Eager's strides for the result when dense (no restriding copy for a graph output), else contiguous."""
    out = node.meta["val"]
    size = tuple(sym(s) for s in out.shape)
    cand = Layout(size, tuple(sym(s) for s in out.stride()), sympy.Integer(0), dtype, out.device)
    if is_dense(cand):
        return cand
    return Layout(size, contiguous_strides(size), sympy.Integer(0), dtype, out.device)


class ScatterBuilder:
    """The steps of one scatter into a buffer shaped like ``node``'s result, in ``acc`` dtype."""

    def __init__(self, g: GraphLowering, node, acc: torch.dtype, init: Callable[[Index], KExpr]) -> None:
        self.g, self.acc = g, acc
        self.layout = _layout(node, acc)
        size = self.layout.size
        target = ComputedBuffer(g.new_name(), self.layout, Pointwise(size, lambda i: cast(init(i), acc), acc))
        self.last = g.add_computed(target)

    def scatter(
        self,
        ranges: Sequence[sympy.Expr],
        reduce: str,
        element: Callable[[Index], tuple[list, list, KExpr, list]],
        op: str = "scatter",
        exact: bool = False,
    ) -> Strided:
        """Write ``element(index)`` for every index over ``ranges``: (target index with indirect symbols, their
        bindings, value, validity conditions). ``op`` names the ATen op in notes; ``exact``: the values summed
        are exact in any order (counts)."""
        layout, acc = self.layout, self.acc
        ordered = _ordered(self.g, op, reduce, acc, ranges, exact)

        def body(idx: Index) -> KExpr:
            full, bindings, value, conds = element(idx)
            offset = IndexValue(layout.index(full), torch.int64, tuple(bindings))
            return Op("scatter", (offset, cast(value, acc), _valid(conds)), acc)

        buf = ComputedBuffer(
            self.g.new_name(),
            layout,
            Scatter(tuple(ranges), self.last.buffer.name, body, reduce, acc, ordered),
        )
        self.last = self.g.add_computed(buf)
        return self.last


def _result(out_dtype: torch.dtype, acc: Strided, fn: Callable[[Index], KExpr] | None = None) -> Value:
    """The scattered buffer read as eager's dtype (a fused cast), or ``fn`` of it."""
    if fn is None and acc.dtype == out_dtype:
        return acc
    load = fn or acc.load
    return Lazy(acc.size, out_dtype, acc.device, lambda idx: cast(load(idx), out_dtype), 1)


# ------------------------------------------------------------------------------------------ index_put
@register_lowering(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(
    g: GraphLowering, node, x: Value, indices: Sequence[Value | None], values: Value, accumulate: bool = False
):
    """``x[indices] = values`` (``+=`` with ``accumulate``): a store (or atomic add) scatter into a copy of ``x``."""
    out = node.meta["val"]
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise NotLowered("boolean mask index_put has a data-dependent number of positions")
    if not isinstance(values, Value):
        raise NotLowered("index_put of a non-tensor value")
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        raise NotLowered("index_put without an index tensor")
    reduce = "add" if accumulate else "store"
    acc = accumulation_dtype(out.dtype, reduce)
    _check_determinism("index_put", reduce, acc)
    rank = len(x.size)
    tensors = [i for i in indices if i is not None]
    bshape = list(broadcast_sizes([t.size for t in tensors]))
    nb = len(bshape)
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    rest = [d for d in range(rank) if d not in dims]
    if adjacent:
        size = list(x.size[: dims[0]]) + bshape + [x.size[d] for d in rest if d > dims[-1]]
    else:
        size = bshape + [x.size[d] for d in rest]
    if len(values.size) > len(size):
        raise NotLowered("index_put values of more dims than the indexed shape")

    def element(idx: Index):
        if adjacent:
            bidx = list(idx[dims[0] : dims[0] + nb])
            others = list(idx[: dims[0]]) + list(idx[dims[0] + nb :])
        else:
            bidx, others = list(idx[:nb]), list(idx[nb:])
        full: list = [None] * rank
        for d, v in zip(rest, others):
            full[d] = v
        bindings, conds = [], []
        for d, t in zip(dims, tensors):
            s = sympy.Symbol(g.new_name("indirect"), integer=True)
            w = wrap_index(t.load(broadcast_index(t.size, bshape, bidx)), x.size[d])
            bindings.append((s, w))
            conds.append(_in_range(w, x.size[d]))
            full[d] = s
        return full, bindings, values.load(broadcast_index(values.size, size, idx)), conds

    b = ScatterBuilder(g, node, acc, x.load)
    return _result(out.dtype, b.scatter(size, reduce, element, str(node.target)))


# ------------------------------------------------------------------------------------------ scatter_add/reduce
def _along(g: GraphLowering, dim: int, index: Value, src, self_size) -> Callable:
    """Element of a ``scatter*`` over ``index``'s positions: ``index[p]`` replaces ``p[dim]``; the value is
    ``src[p]`` (a tensor) or ``src`` (a scalar)."""

    def element(idx: Index):
        s = sympy.Symbol(g.new_name("indirect"), integer=True)
        i = cast(index.load(list(idx)), torch.int64)
        full = list(idx)
        full[dim] = s
        value = (
            src.load(list(idx))
            if isinstance(src, Value)
            else Const(src, torch.float64 if isinstance(src, float) else torch.int64)
        )
        return full, [(s, i)], value, [_in_range(i, self_size[dim])]

    return element


def _scatter_reduce(
    g: GraphLowering, node, x: Value, dim: int, index: Value, src, reduce: str, include_self: bool = True
):
    out = node.meta["val"]
    op = _REDUCE.get(reduce)
    if op is None:
        raise NotLowered(f"scatter reduce {reduce!r}: no atomic for it", kind="atomics")
    rank = len(x.size)
    dim = dim + rank if dim < 0 else dim
    if rank == 0 or len(index.size) != rank:
        raise NotLowered("scatter of a 0-d tensor or an index of another rank")
    acc = accumulation_dtype(out.dtype, op)
    _check_determinism(f"scatter_reduce({reduce})", op, acc)
    element = _along(g, dim, index, src, x.size)
    b = ScatterBuilder(g, node, acc, x.load)
    name = str(node.target)
    if not include_self:  # positions that receive a source start from the reduction's identity
        b.scatter(index.size, "store", _replaced(element, value=Const(_identity(op, acc), acc)))
    res = b.scatter(index.size, op, element, name)
    if reduce == "mean":
        cnt = ScatterBuilder(g, node, acc, lambda idx: Const(1 if include_self else 0, acc))
        count = cnt.scatter(index.size, "add", _replaced(element, value=Const(1, acc)), name, exact=True)
        div = "truediv" if acc.is_floating_point else "floordiv"

        def wrapped(v: KExpr) -> KExpr:  # eager sums and counts 8/16-bit integers in their own dtype
            return v if out.dtype == acc else cast(cast(v, out.dtype, explicit=True), acc)

        def mean(idx: Index) -> KExpr:
            n = wrapped(count.load(idx))
            n = Op("where", [Op("eq", [n, Const(0, acc)], torch.bool), Const(1, acc), n], acc)
            return Op(div, [wrapped(res.load(idx)), n], acc)

        return _result(out.dtype, res, mean)
    if op in ("max", "min") and acc.is_floating_point:
        # atomics on floats drop NaNs: a NaN source is stored after the atomics, a NaN ``self`` kept
        b.scatter(
            index.size, "store", _replaced(element, cond=lambda v: Op("isnan", [cast(v, acc)], torch.bool))
        )
        res = b.last
        if include_self:

            def keep_nan(idx: Index) -> KExpr:
                v = cast(x.load(idx), acc)
                return Op("where", [Op("isnan", [v], torch.bool), v, res.load(idx)], acc)

            return _result(out.dtype, res, keep_nan)
    return _result(out.dtype, res)


def _replaced(element: Callable, value: KExpr | None = None, cond: Callable | None = None) -> Callable:
    """``element`` writing ``value`` instead of its own, or only where ``cond(its value)`` also holds."""

    def el(idx: Index):
        full, bindings, v, conds = element(idx)
        return full, bindings, v if value is None else value, conds + ([cond(v)] if cond else [])

    return el


def _identity(op: str, dtype: torch.dtype):
    if op == "add":
        return 0.0 if dtype.is_floating_point else 0
    if dtype.is_floating_point:
        return float("-inf") if op == "max" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if op == "max" else info.max


@register_lowering(aten.scatter_add.default)
def _scatter_add(g: GraphLowering, node, x: Value, dim: int, index: Value, src: Value):
    return _scatter_reduce(g, node, x, dim, index, src, "sum")


@register_lowering(aten.scatter_reduce.two)
def _scatter_reduce_two(
    g: GraphLowering,
    node,
    x: Value,
    dim: int,
    index: Value,
    src: Value,
    reduce: str,
    include_self: bool = True,
):
    return _scatter_reduce(g, node, x, dim, index, src, reduce, include_self)


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_legacy_reduce(g: GraphLowering, node, x: Value, dim: int, index: Value, src, reduce: str):
    """``scatter_(dim, index, src, reduce="add"|"multiply")``: ``add`` is ``scatter_add``."""
    if reduce != "add":
        raise NotLowered(f"scatter reduce {reduce!r}: no atomic for it", kind="atomics")
    return _scatter_reduce(g, node, x, dim, index, src, "sum")


# ------------------------------------------------------------------------------------------ scans
def _scan(g: GraphLowering, node, x: Value, dim: int, scan_type: str):
    """An inclusive scan along ``dim`` when that dim is the innermost of the result (rows read in order) and its
    length (its example length, for a dynamic one) fits a persistent block; ATen otherwise."""
    out = node.meta["val"]
    rank = len(out.shape)
    if rank == 0:
        return Lazy((), out.dtype, out.device, lambda idx: cast(x.load(idx), out.dtype), 1)
    dim = dim + rank if dim < 0 else dim
    layout = _layout(node, out.dtype)
    n = layout.size[dim]
    if layout.stride[dim] != 1 and n != 1 and any(sz != 1 for d, sz in enumerate(layout.size) if d != dim):
        raise NotLowered("scan along a dim that is not innermost in memory", kind="layout")
    hint = _hint(n)
    limit = g.settings.persistent_rblock_max
    if hint is None or hint > limit:
        raise NotLowered(f"scan of {n} elements a row (more than a {limit}-element block)", kind="size")
    src = compute_dtype(out.dtype)
    ranges = tuple(s for d, s in enumerate(layout.size) if d != dim)

    def body(idx: Index, ridx: Index) -> KExpr:
        return cast(x.load(list(idx[:dim]) + list(ridx) + list(idx[dim:])), src)

    buf = ComputedBuffer(g.new_name(), layout, Scan(ranges, (n,), body, scan_type, out.dtype, src, dim))
    return g.add_computed(buf)


def _hint(n: sympy.Expr) -> int | None:
    """A scan length, or its example value when symbolic (None when unknown)."""
    if n.is_number:
        return int(n)
    hints = size_hints()
    v = n.subs({s: hints[s] for s in n.free_symbols if s in hints})
    return int(v) if v.is_number else None


@register_lowering(aten.cumsum.default)
def _cumsum(g: GraphLowering, node, x: Value, dim: int, *, dtype=None):
    return _scan(g, node, x, dim, "sum")


@register_lowering(aten.cumprod.default)
def _cumprod(g: GraphLowering, node, x: Value, dim: int, *, dtype=None):
    return _scan(g, node, x, dim, "prod")


@register_lowering(aten.logcumsumexp.default)
def _logcumsumexp(g: GraphLowering, node, x: Value, dim: int):
    return _scan(g, node, x, dim, "logsumexp")
