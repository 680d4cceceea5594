"""Lowerings for copies, casts, constants, concatenation and padding, and the extern (out=) kernels.

Extern kernels are ATen ops kiln chooses not to generate (matmuls): the wrapper calls their ``.out``
overload on a buffer it allocates, so a following pointwise epilogue fuses into one kernel.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from .. import dtypes
from ..contract import arg_cost, broadcast_index, load_arg
from ..exc import NotLowered
from ..graph import ExternCall, GraphLowering, register_lowering
from ..ir import EmptyBuffer, Index, InputBuffer, Lazy, Strided, SymScalar, Value, layout_from_meta, sym
from ..kexpr import Const, IndexValue, KExpr, Load, Op, cast

aten = torch.ops.aten
prims = torch.ops.prims


def _size(node) -> tuple:
    return tuple(sym(s) for s in node.meta["val"].shape)


@register_lowering(aten.clone.default)
def _clone(g: GraphLowering, node, x: Value, *, memory_format=None):
    return Lazy(x.size, x.dtype, x.device, x.load, x.cost + 1)


@register_lowering(aten._to_copy.default, same_device=False)
def _to_copy(
    g: GraphLowering,
    node,
    x: Value,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    out = node.meta["val"]
    if out.device != x.device:
        raise NotLowered(f"device copy {x.device} -> {out.device}", kind="device")
    return _cast_to(x, out.dtype)


@register_lowering(prims.convert_element_type.default)
def _convert(g: GraphLowering, node, x: Value, dtype: torch.dtype):
    return _cast_to(x, dtype)


def _cast_to(x: Value, dtype: torch.dtype) -> Lazy:
    """``x`` converted to ``dtype`` (a program's own cast: kept, ``explicit``); an upcast of an unrealized
    fp16/bf16 value remembers that value (``Lazy.widens``) so realization can store it narrow."""
    widens = x if isinstance(x, Lazy) and dtypes.widens_exactly(x.dtype, dtype) else None
    return Lazy(
        x.size, dtype, x.device, lambda idx: cast(x.load(idx), dtype, explicit=True), x.cost + 1, widens
    )


@register_lowering(aten.copy.default)
def _copy(g: GraphLowering, node, dst: Value, src: Value, non_blocking=False):
    out = node.meta["val"]
    size = _size(node)
    return Lazy(
        size,
        out.dtype,
        dst.device,
        lambda idx: cast(src.load(broadcast_index(src.size, size, idx)), out.dtype, explicit=True),
        src.cost + 1,
    )


@register_lowering(aten.copy_.default)
def _write_back(g: GraphLowering, node, dst: Value, src: Value, non_blocking=False):
    """The write-back of a mutated graph input (``x.add_(1)``, a parameter updated under ``no_grad``): AOTAutograd
    keeps it in the graph as a trailing ``copy_``. Kernels compute the new value, laid out like the input,
    and the wrapper copies it into the caller's tensor after every kernel (kernels inline reads of the
    input's old value: see Scheduler.run)."""
    if not (isinstance(dst, Strided) and isinstance(dst.buffer, InputBuffer)):
        raise NotLowered("copy_ into a tensor that is not a graph input")
    value = g.realize(_copy(g, node, dst, src), node.args[0].meta.get("val"))
    g.steps.append(
        ExternCall(
            aten.copy_.default, (dst, value), {}, None, node.name, None, transfer=True, write_back=True
        )
    )
    return dst


@register_lowering(
    aten.full.default,
    aten.full_like.default,
    aten.scalar_tensor.default,
    aten.zeros.default,
    aten.ones.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    same_device=False,
)
def _full(g: GraphLowering, node, *args, **kwargs):
    out = node.meta["val"]
    t = node.target
    if t in (aten.zeros.default, aten.zeros_like.default):
        value = 0
    elif t in (aten.ones.default, aten.ones_like.default):
        value = 1
    elif t is aten.scalar_tensor.default:
        value = args[0]
    else:
        value = args[1]
    size = _size(node)
    if not isinstance(value, (bool, int, float)):
        if not isinstance(value, SymScalar):
            raise NotLowered(f"fill value of type {type(value).__name__}")
        return Lazy(size, out.dtype, out.device, lambda idx: load_arg(value, size, idx, out.dtype))
    return Lazy(size, out.dtype, out.device, lambda idx: Const(value, out.dtype))


@register_lowering(
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    same_device=False,
)
def _empty(g: GraphLowering, node, *args, **kwargs):
    out = node.meta["val"]
    buf = EmptyBuffer(
        g.new_name(), layout_from_meta(out, sym(out.storage_offset())), sym(out.storage_offset())
    )
    g.add_buffer(buf)
    return Strided(buf, buf.layout)


@register_lowering(prims.iota.default)
def _iota(g: GraphLowering, node, length, *, start, step, dtype, device, requires_grad):
    out = node.meta["val"]
    st, sp = sym(start), sym(step)
    return Lazy(_size(node), out.dtype, out.device, lambda idx: cast(IndexValue(st + idx[0] * sp), out.dtype))


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(g: GraphLowering, node, *args, **kwargs):
    out = node.meta["val"]
    nums = [a for a in args]
    if node.target is aten.arange.default:
        start, step = 0, 1
    elif node.target is aten.arange.start:
        start, step = nums[0], 1
    else:
        start, step = nums[0], (nums[2] if len(nums) > 2 else 1)
    is_float = [
        isinstance(v, float) or (isinstance(v, SymScalar) and v.py_type is float) for v in (start, step)
    ]
    if any(is_float) or out.dtype.is_floating_point:
        comp = torch.float64
        size = _size(node)

        def fn(idx: Index) -> KExpr:  # start and step: Python numbers or size expressions (SymScalar)
            i = cast(IndexValue(idx[0]), comp)
            first, delta = (load_arg(v, size, idx, comp) for v in (start, step))
            return cast(Op("add", [first, Op("mul", [i, delta], comp)], comp), out.dtype)

        return Lazy(size, out.dtype, out.device, fn)
    st, sp = (v.expr if isinstance(v, SymScalar) else sym(v) for v in (start, step))
    return Lazy(_size(node), out.dtype, out.device, lambda idx: cast(IndexValue(st + idx[0] * sp), out.dtype))


@register_lowering(aten.cat.default)
def _cat(g: GraphLowering, node, tensors, dim=0):
    out = node.meta["val"]
    size = _size(node)
    rank = len(size)
    parts = [t for t in tensors if isinstance(t, Value) and not (len(t.size) == 1 and t.size[0] == 0)]
    if not parts:
        raise NotLowered("cat of empty tensors")
    dim = dim + rank if dim < 0 else dim
    offsets, acc = [], sympy.Integer(0)
    for t in parts:
        offsets.append(acc)
        acc = acc + t.size[dim]

    def fn(idx: Index) -> KExpr:
        result: KExpr | None = None
        for t, off in reversed(list(zip(parts, offsets))):
            local = list(idx)
            local[dim] = idx[dim] - off
            inside = in_range(idx[dim] - off, t.size[dim])
            v = cast(masked_load(t, local, inside), out.dtype)
            result = v if result is None else Op("where", [inside, v, result], out.dtype)
        assert result is not None  # parts is not empty
        return result

    return Lazy(size, out.dtype, out.device, fn, arg_cost(parts) + len(parts))


def in_range(i: sympy.Expr, n: sympy.Expr) -> KExpr:
    """``0 <= i < n`` as a bool KExpr."""
    return Op(
        "logical_and",
        [
            Op("ge", [IndexValue(i), Const(0, torch.int64)], torch.bool),
            Op("lt", [IndexValue(i), _int(n)], torch.bool),
        ],
        torch.bool,
    )


def _int(e: sympy.Expr) -> KExpr:
    return Const(int(e), torch.int64) if e.is_number else IndexValue(e)


def masked_load(t: Value, index: Index, mask: KExpr) -> KExpr:
    """Load ``t`` at ``index`` only where ``mask`` holds (other lanes must not touch memory)."""
    v = t.load(index)
    if isinstance(v, Load):
        return v.with_mask(mask if v.mask is None else Op("logical_and", [v.mask, mask], torch.bool))
    # Lazy producers: mask every load inside (they may be out of bounds too)
    return mask_loads(v, mask, {})


def mask_loads(e: KExpr, mask: KExpr, memo: dict) -> KExpr:
    if id(e) in memo:
        return memo[id(e)]
    r: KExpr
    if isinstance(e, Load):
        r = e.with_mask(mask if e.mask is None else Op("logical_and", [e.mask, mask], torch.bool))
    elif isinstance(e, Op):
        r = Op(e.op, [mask_loads(a, mask, memo) for a in e.args], e.dtype, e.round_trip)
    else:
        r = e
    memo[id(e)] = r
    return r


@register_lowering(aten.constant_pad_nd.default)
def _pad(g: GraphLowering, node, x: Value, pad, value=0):
    out = node.meta["val"]
    size = _size(node)
    rank = len(size)
    pads = [p.expr if isinstance(p, SymScalar) else sym(p) for p in pad]
    if any(p.is_number and p < 0 for p in pads):
        raise NotLowered("negative padding (cropping)")

    def fn(idx: Index) -> KExpr:
        local = list(idx)
        conds = []
        for i in range(len(pads) // 2):
            d = rank - 1 - i
            before = pads[2 * i]
            local[d] = idx[d] - before
            conds.append(in_range(idx[d] - before, x.size[d]))
        inside = conds[0]
        for c in conds[1:]:
            inside = Op("logical_and", [inside, c], torch.bool)
        v = cast(masked_load(x, local, inside), out.dtype)
        return Op("where", [inside, v, Const(value, out.dtype)], out.dtype)

    return Lazy(size, out.dtype, out.device, fn, arg_cost([x]) + 2)


# ------------------------------------------------------------------------------------- extern kernels
def _extern(out_overload):
    def lower(g: GraphLowering, node, *args, **kwargs):
        out = node.meta["val"]
        if out.dtype not in dtypes.FLOAT:
            raise NotLowered("matmul of non-float dtype", kind="dtype")
        return g.extern_out(node, out_overload, args, kwargs)

    return lower


register_lowering(aten.mm.default)(_extern(aten.mm.out))
register_lowering(aten.bmm.default)(_extern(aten.bmm.out))
register_lowering(aten.addmm.default)(_extern(aten.addmm.out))
register_lowering(aten.baddbmm.default)(_extern(aten.baddbmm.out))
register_lowering(aten.addbmm.default)(_extern(aten.addbmm.out))


@register_lowering(aten.slice_scatter.default)
def _slice_scatter(
    g: GraphLowering, node, x: Value, src: Value, dim: int = 0, start=None, end=None, step: int = 1
):
    """``x`` with ``src`` written into ``x[start:end:step]`` along ``dim`` (functionalized in-place slicing)."""
    out = node.meta["val"]
    size = _size(node)
    dim = dim + len(size) if dim < 0 else dim
    n = x.size[dim]
    begin = sym(0 if start is None else start)
    if begin.is_number and begin < 0:
        begin = begin + n
    count = src.size[dim]
    step_e = sym(step)

    def fn(idx: Index) -> KExpr:
        rel = idx[dim] - begin
        inside = in_range(rel, count * step_e)
        local = list(idx)
        if step_e == 1:
            local[dim] = rel
        else:
            on_step = Op(
                "eq", [IndexValue(rel - step_e * FloorDiv(rel, step_e)), Const(0, torch.int64)], torch.bool
            )
            inside = Op("logical_and", [inside, on_step], torch.bool)
            local[dim] = FloorDiv(rel, step_e)
        new = cast(masked_load(src, local, inside), out.dtype)
        return Op("where", [inside, new, cast(x.load(idx), out.dtype)], out.dtype)

    return Lazy(size, out.dtype, out.device, fn, arg_cost([x, src]) + 2)
