"""View lowerings: index arithmetic, never a copy kernel.

A view of a realized buffer (``Strided``) takes the eager result's layout from the FX node's FakeTensor, so
it stays a view of the same buffer (the wrapper emits ``as_strided``, no kernel). A view of a ``Lazy`` value
remaps indices: ``REMAPS[op](out_index) -> in_index``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ..exc import NotLowered
from ..graph import GraphLowering, register_lowering
from ..ir import Index, Lazy, Strided, Value, contiguous_strides, layout_from_meta, sym
from ..kexpr import Op

aten = torch.ops.aten


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _permute(x: Value, out_size, dims) -> Callable[[Index], list]:
    dims = [_norm_dim(d, len(x.size)) for d in dims]

    def remap(idx: Index) -> list:
        res = [None] * len(dims)
        for i, d in enumerate(dims):
            res[d] = idx[i]
        return res

    return remap


def _transpose(x: Value, out_size, d0, d1):
    rank = len(x.size)
    dims = list(range(rank))
    a, b = _norm_dim(d0, rank), _norm_dim(d1, rank)
    dims[a], dims[b] = dims[b], dims[a]
    return _permute(x, out_size, dims)


def _t(x: Value, out_size):
    return _permute(x, out_size, list(reversed(range(len(x.size)))))


def _expand(x: Value, out_size, *_):
    off = len(out_size) - len(x.size)
    return lambda idx: [
        sympy.Integer(0) if (s == 1 and out_size[off + i] != 1) else idx[off + i]
        for i, s in enumerate(x.size)
    ]


def _slice(x: Value, out_size, dim=0, start=None, end=None, step=1):
    dim = _norm_dim(dim, len(x.size))
    size = x.size[dim]
    start = 0 if start is None else start
    s = sym(start)
    if s.is_number and s < 0:
        s = sympy.Max(s + size, 0)
    step_e = sym(step)

    def remap(idx: Index) -> list:
        res = list(idx)
        res[dim] = s + idx[dim] * step_e
        return res

    return remap


def _select(x: Value, out_size, dim, index):
    dim = _norm_dim(dim, len(x.size))
    i = sym(index)
    if i.is_number and i < 0:
        i = i + x.size[dim]
    return lambda idx: list(idx[:dim]) + [i] + list(idx[dim:])


def _unsqueeze(x: Value, out_size, dim):
    dim = _norm_dim(dim, len(x.size) + 1)
    return lambda idx: list(idx[:dim]) + list(idx[dim + 1 :])


def _squeeze(x: Value, out_size, dims=None):
    rank = len(x.size)
    if dims is None:
        dims = [d for d in range(rank) if x.size[d] == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = {_norm_dim(d, rank) for d in dims if x.size[_norm_dim(d, rank)] == 1}

    def remap(idx: Index) -> list:
        it = iter(idx)
        return [sympy.Integer(0) if d in dims else next(it) for d in range(rank)]

    return remap


def reshape_value(x: Value, out_size, *_):
    """Reshape of a logically contiguous value: each output index mapped to the input's.

    Where the two shapes split into runs of dims with equal element counts (``dim_groups``: [B*T, C] and
    [B, T, C] are the runs B*T|B,T and C|C), each run is mapped on its own: a dim kept as it is maps to itself,
    merged dims to one sum, a split dim to a ``FloorDiv`` and ``ModularIndexing`` of its own index alone.
    Otherwise the whole output index is flattened and unflattened into the input's. Both give the same element;
    the runs keep the expressions small, where a whole-shape flatten made torch's ``FloorDiv`` and
    ``ModularIndexing`` simplify sums of every dim back down with sympy's gcd (most of the ``schedule`` pass's
    time on a transformer, whose views are mostly these splits and merges)."""
    in_size = x.size
    groups = dim_groups(tuple(in_size), tuple(out_size))

    def remap(idx: Index) -> list:
        if groups is None:
            return _unflatten(_flatten(idx, out_size), in_size)
        res: list = [sympy.Integer(0)] * len(in_size)
        for outs, ins in groups:
            flat = _flatten([idx[k] for k in outs], [out_size[k] for k in outs])
            for k, v in zip(ins, _unflatten(flat, [in_size[k] for k in ins])):
                res[k] = v
        return res

    return remap


def _flatten(idx: Index, size) -> sympy.Expr:
    """The flat (row-major) position of ``idx`` in a contiguous tensor of ``size`` (size-1 dims left out)."""
    return sum(
        (i * st for i, st, sz in zip(idx, contiguous_strides(size), size) if sz != 1),
        sympy.Integer(0),
    )


def _unflatten(flat: sympy.Expr, size) -> list:
    """The index of the element at flat position ``flat`` of a contiguous tensor of ``size``."""
    res: list = []
    first = True
    for sz, st in zip(size, contiguous_strides(size)):
        if sz == 1:
            res.append(sympy.Integer(0))
        elif first:
            res.append(flat if st == 1 else FloorDiv(flat, st))
            first = False
        else:
            res.append(ModularIndexing(flat, st, sz))
    return res


def dim_groups(in_size: tuple, out_size: tuple) -> list[tuple[list[int], list[int]]] | None:
    """Runs of output dims and input dims with equal element counts, in order (size-1 dims left out), or None
    where the sizes do not split so (a symbolic size that neither divides nor equals the other side's)."""
    outs = [k for k, n in enumerate(out_size) if n != 1]
    ins = [k for k, n in enumerate(in_size) if n != 1]
    groups: list[tuple[list[int], list[int]]] = []
    a = b = 0
    while a < len(outs) and b < len(ins):
        ga, gb = [outs[a]], [ins[b]]
        po, pi = sympy.sympify(out_size[outs[a]]), sympy.sympify(in_size[ins[b]])
        a, b = a + 1, b + 1
        while po != pi:
            if _multiple(pi, po) and a < len(outs):  # the output run is the smaller: take its next dim
                ga.append(outs[a])
                po *= out_size[outs[a]]
                a += 1
            elif _multiple(po, pi) and b < len(ins):
                gb.append(ins[b])
                pi *= in_size[ins[b]]
                b += 1
            else:
                return None
        groups.append((ga, gb))
    return groups if a == len(outs) and b == len(ins) else None


def _multiple(big: sympy.Expr, small: sympy.Expr) -> bool:
    """``big`` is a whole multiple of ``small`` other than itself (sympy cancels common factors of products)."""
    q = big / small
    return bool(q.is_Integer) and q > 1


def _flip(x: Value, out_size, dims):
    dims = {_norm_dim(d, len(x.size)) for d in dims}
    return lambda idx: [(x.size[d] - 1 - i) if d in dims else i for d, i in enumerate(idx)]


def _alias(x: Value, out_size, *_):
    return lambda idx: list(idx)


#: view op -> remap builder for Lazy inputs
REMAPS: dict[Any, Callable] = {
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.t.default: _t,
    aten.expand.default: _expand,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.view.default: reshape_value,
    aten._unsafe_view.default: reshape_value,
    aten.reshape.default: reshape_value,
    aten.alias.default: _alias,
    aten.lift_fresh_copy.default: _alias,
}
#: flips are not views in eager (they copy), so they always take the remap path
COPY_REMAPS: dict[Any, Callable] = {aten.flip.default: _flip, "prims.rev.default": _flip}

#: view ops that are fine on a Strided input via the FakeTensor layout, but have no Lazy remap
META_ONLY_VIEWS = [
    aten.as_strided.default,
    aten.diagonal.default,
    aten.unfold.default,
    aten.unbind.int,
    aten.split.Tensor,
    aten.split_with_sizes.default,
]


def lower_view(g: GraphLowering, node, x: Any, *args, **kwargs):
    out = node.meta["val"]
    if not isinstance(x, Value):
        raise NotLowered("view of a non-tensor")
    if isinstance(x, Strided) and _layout_matches_meta(x, node.args[0]):
        if isinstance(out, (list, tuple)):
            return type(out)(Strided(x.buffer, layout_from_meta(o, x.buffer.base_offset)) for o in out)
        return Strided(x.buffer, layout_from_meta(out, x.buffer.base_offset))
    builder = REMAPS.get(node.target)
    if builder is None or isinstance(out, (list, tuple)):
        x = g.realize(x, node.args[0].meta.get("val"))
        if _layout_matches_meta(x, node.args[0]):
            return lower_view(g, node, x, *args, **kwargs)
        raise NotLowered("view of a buffer whose layout differs from eager's", kind="layout")
    out_size = tuple(sym(s) for s in out.shape)
    remap = builder(x, out_size, *args)
    return Lazy(out_size, x.dtype, x.device, lambda idx: x.load(remap(idx)), x.cost)


def _layout_matches_meta(x: Strided, arg_node) -> bool:
    meta = arg_node.meta.get("val") if hasattr(arg_node, "meta") else None
    if not isinstance(meta, torch.Tensor):
        return False
    return x.layout == layout_from_meta(meta, x.buffer.base_offset)


for _op in list(REMAPS) + META_ONLY_VIEWS:
    register_lowering(_op)(lower_view)


def lower_remap_copy(g: GraphLowering, node, x: Any, *args):
    if not isinstance(x, Value):
        raise NotLowered("remap of a non-tensor")
    out = node.meta["val"]
    out_size = tuple(sym(s) for s in out.shape)
    remap = COPY_REMAPS.get(node.target, _flip)(x, out_size, *args)
    return Lazy(out_size, x.dtype, x.device, lambda idx: x.load(remap(idx)), x.cost + 1)


for _op in COPY_REMAPS:
    register_lowering(_op)(lower_remap_copy)


@register_lowering(aten.view.dtype)
def _view_dtype(g: GraphLowering, node, x: Value, dtype: torch.dtype):
    """Same-width reinterpretation: a bitcast of the loaded value, never a copy kernel."""
    out = node.meta["val"]
    if x.dtype.itemsize != dtype.itemsize:
        raise NotLowered("view.dtype between different widths")
    if isinstance(x, Strided) and _layout_matches_meta(x, node.args[0]):
        return Strided(x.buffer, layout_from_meta(out, x.buffer.base_offset))
    return Lazy(x.size, dtype, x.device, lambda idx: Op("bitcast", [x.load(idx)], dtype), x.cost)
