"""Indirect indexing: ``x[idx]`` (``aten.index.Tensor``), ``gather`` and ``index_select`` read their source at
positions loaded from index tensors inside the same kernel (``Load.indirect``), so embeddings, label
gathers in cross-entropy and ``roll``/nearest-upsampling index math fuse with their neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch

from ..contract import broadcast_index
from ..exc import NotLowered
from ..graph import GraphLowering, register_lowering
from ..ir import Index, Lazy, Value, sym
from ..kexpr import Const, IndexValue, KExpr, Op, bind_indirect, cast

aten = torch.ops.aten


def broadcast_sizes(sizes: Sequence[Sequence[sympy.Expr]]) -> tuple:
    """Broadcast shape of symbolic sizes (trailing-aligned; a 1 yields to the other size)."""
    rank = max((len(s) for s in sizes), default=0)
    out = [sympy.Integer(1)] * rank
    for s in sizes:
        for i, d in enumerate(s):
            j = rank - len(s) + i
            if out[j] == 1:
                out[j] = d
    return tuple(out)


def wrap_index(i: KExpr, size: sympy.Expr) -> KExpr:
    """Python-style negative indices: ``i < 0 ? i + size : i`` (int64)."""
    i = cast(i, torch.int64)
    n = Const(int(size), torch.int64) if size.is_number else IndexValue(size)
    return Op(
        "where",
        [Op("lt", [i, Const(0, torch.int64)], torch.bool), Op("add", [i, n], torch.int64), i],
        torch.int64,
    )


def _indirect_load(g: GraphLowering, src: Value, index: list, bindings: list) -> KExpr:
    """``src`` at an index holding bound symbols; a Lazy source is computed only at the gathered positions."""
    return bind_indirect(src.load(index), bindings)


def _source(g: GraphLowering, node, x: Value) -> Value:
    if not isinstance(x, Value):
        raise NotLowered("indexing a non-tensor")
    return x


@register_lowering(aten.index.Tensor)
def _index(g: GraphLowering, node, x: Value, indices: Sequence[Value | None]):
    out = node.meta["val"]
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise NotLowered("boolean mask indexing has a data-dependent size")
    src = _source(g, node, x)
    rank = len(src.size)
    dims = [d for d, i in enumerate(indices) if i is not None]
    idx_tensors = [i for i in indices if i is not None]
    bshape = broadcast_sizes([i.size for i in idx_tensors])
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    out_size = tuple(sym(s) for s in out.shape)
    nb = len(bshape)

    def fn(oidx: Index) -> KExpr:
        if adjacent:
            before = list(oidx[: dims[0]])
            bidx = list(oidx[dims[0] : dims[0] + nb])
            after = list(oidx[dims[0] + nb :])
            rest = before + after
            rest_dims = [d for d in range(rank) if d not in dims]
        else:
            bidx = list(oidx[:nb])
            rest = list(oidx[nb:])
            rest_dims = [d for d in range(rank) if d not in dims]
        full: list = [None] * rank
        for d, v in zip(rest_dims, rest):
            full[d] = v
        bindings = []
        for d, t in zip(dims, idx_tensors):
            s = sympy.Symbol(g.new_name("indirect"), integer=True)
            val = t.load(broadcast_index(t.size, bshape, bidx))
            bindings.append((s, wrap_index(val, src.size[d])))
            full[d] = s
        return _indirect_load(g, src, full, bindings)

    return Lazy(out_size, out.dtype, out.device, fn, 2)


def _take_along(g: GraphLowering, node, x: Value, dim: int, index: Value, position) -> Lazy:
    """Output element ``i`` reads ``x`` at ``i`` with dim ``dim`` replaced by ``position(index, i)``."""
    out = node.meta["val"]
    src = _source(g, node, x)
    rank = len(src.size)
    if rank == 0:
        raise NotLowered("indexing a 0-d tensor along a dim")
    dim = dim + rank if dim < 0 else dim

    def fn(oidx: Index) -> KExpr:
        s = sympy.Symbol(g.new_name("indirect"), integer=True)
        full = list(oidx)
        full[dim] = s
        return _indirect_load(g, src, full, [(s, wrap_index(position(index, oidx, dim), src.size[dim]))])

    return Lazy(tuple(sym(v) for v in out.shape), out.dtype, out.device, fn, 2)


@register_lowering(aten.gather.default)
def _gather(g: GraphLowering, node, x: Value, dim: int, index: Value, sparse_grad: bool = False):
    return _take_along(g, node, x, dim, index, lambda ix, oidx, d: ix.load(oidx))


@register_lowering(aten.index_select.default)
def _index_select(g: GraphLowering, node, x: Value, dim: int, index: Value):
    return _take_along(
        g, node, x, dim, index, lambda ix, oidx, d: ix.load([oidx[d]] if len(ix.size) == 1 else [])
    )


@register_lowering(aten.scatter.value, aten.scatter.src)
def _scatter_one_hot(g: GraphLowering, node, x: Value, dim: int, index: Value, src):
    """``scatter`` whose index has one entry along ``dim`` and covers every other dim (one-hot style, as
    in cross-entropy's backward): a pointwise ``where(i == index[..., 0, ...], src, x)``. Other scatters
    write positions that only the data knows, so they fall back (deterministically) to ATen."""
    out = node.meta["val"]
    rank = len(x.size)
    dim = dim + rank if dim < 0 else dim
    if (
        len(index.size) != rank
        or index.size[dim] != 1
        or any(index.size[d] != x.size[d] for d in range(rank) if d != dim)
    ):
        raise NotLowered("scatter with several positions per slice")
    if isinstance(src, Value) and (
        len(src.size) != rank or any(src.size[d] != index.size[d] for d in range(rank))
    ):
        raise NotLowered("scatter source shaped unlike its index")
    size = tuple(sym(s) for s in out.shape)

    def fn(idx: Index) -> KExpr:
        at = list(idx)
        at[dim] = sympy.Integer(0)
        target = wrap_index(index.load(at), x.size[dim])
        hit = Op("eq", [cast(IndexValue(idx[dim]), torch.int64), target], torch.bool)
        new = cast(src.load(at), out.dtype) if isinstance(src, Value) else Const(src, out.dtype)
        return Op("where", [hit, new, cast(x.load(idx), out.dtype)], out.dtype)

    return Lazy(size, out.dtype, out.device, fn, 3)
