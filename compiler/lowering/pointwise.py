"""Pointwise lowerings: one table from ATen overload to kernel op name and type-promotion rule.

Each entry becomes a ``Lazy`` value: inputs are broadcast to the output size by index arithmetic, cast to
the computation dtype (fp32 for fp16/bf16), combined, and cast to the result dtype.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K, elementwise_dtypes

from ..exc import NotLowered
from ..graph import GraphLowering, register_lowering
from ..ir import Index, Lazy, SymScalar, Value, sym
from ..kexpr import Const, IndexValue, KExpr, Op, cast, compute_dtype, mark_rounding

aten = torch.ops.aten
prims = torch.ops.prims

D, F, B, N = K.DEFAULT, K.INT_TO_FLOAT, K.ALWAYS_BOOL, K.NO_OPMATH

#: overload -> (kernel op, type promotion).  Ops whose name ends in "_f" exist only for floats.
POINTWISE: dict[Any, tuple[str, K]] = {
    aten.add.Tensor: ("add", D), aten.sub.Tensor: ("sub", D), aten.mul.Tensor: ("mul", D),
    aten.div.Tensor: ("truediv", F),
    aten.neg.default: ("neg", D), aten.abs.default: ("abs", D),
    aten.exp.default: ("exp", F), aten.exp2.default: ("exp2", F), aten.expm1.default: ("expm1", F),
    aten.log.default: ("log", F), aten.log2.default: ("log2", F), aten.log1p.default: ("log1p", F),
    aten.sqrt.default: ("sqrt", F), aten.rsqrt.default: ("rsqrt", F), aten.reciprocal.default: ("reciprocal", F),
    aten.sin.default: ("sin", F), aten.cos.default: ("cos", F), aten.tanh.default: ("tanh", F),
    aten.sigmoid.default: ("sigmoid", F), aten.erf.default: ("erf", F),
    aten.floor.default: ("floor", D), aten.ceil.default: ("ceil", D), aten.round.default: ("round", D),
    aten.trunc.default: ("trunc", D), aten.sign.default: ("sign", D),
    aten.relu.default: ("relu", D),
    aten.maximum.default: ("maximum", D), aten.minimum.default: ("minimum", D),
    aten.eq.Tensor: ("eq", B), aten.eq.Scalar: ("eq", B), aten.ne.Tensor: ("ne", B), aten.ne.Scalar: ("ne", B),
    aten.lt.Tensor: ("lt", B), aten.lt.Scalar: ("lt", B), aten.le.Tensor: ("le", B), aten.le.Scalar: ("le", B),
    aten.gt.Tensor: ("gt", B), aten.gt.Scalar: ("gt", B), aten.ge.Tensor: ("ge", B), aten.ge.Scalar: ("ge", B),
    aten.isnan.default: ("isnan", B), aten.isinf.default: ("isinf", B),
    aten.logical_not.default: ("logical_not", B), aten.logical_and.default: ("logical_and", B),
    aten.logical_or.default: ("logical_or", B), aten.logical_xor.default: ("logical_xor", B),
    aten.bitwise_and.Tensor: ("bitwise_and", D), aten.bitwise_or.Tensor: ("bitwise_or", D),
    aten.bitwise_xor.Tensor: ("bitwise_xor", D), aten.bitwise_not.default: ("bitwise_not", D),
    aten.bitwise_and.Scalar: ("bitwise_and", D), aten.bitwise_or.Scalar: ("bitwise_or", D),
    aten.bitwise_xor.Scalar: ("bitwise_xor", D),
    aten.pow.Tensor_Tensor: ("pow", K.BOOL_TO_LONG), aten.pow.Tensor_Scalar: ("pow", K.BOOL_TO_LONG),
    aten.pow.Scalar: ("pow", K.BOOL_TO_LONG),
    aten.fmod.Tensor: ("fmod", D), aten.fmod.Scalar: ("fmod", D),
    aten.remainder.Tensor: ("remainder", D), aten.remainder.Scalar: ("remainder", D),
    aten.atan2.default: ("atan2", F),
    aten.where.self: ("where", N),
    aten.mul.Scalar: ("mul", D), aten.div.Scalar: ("truediv", F),
    aten.erfc.default: ("erfc", F), aten.sinh.default: ("sinh", F), aten.cosh.default: ("cosh", F),
    aten.tan.default: ("tan", F), aten.asin.default: ("asin", F), aten.acos.default: ("acos", F),
    aten.atan.default: ("atan", F), aten.log10.default: ("log10", F),
}

# prims that survive decomposition; they are created lazily by torch, so they are keyed by name
POINTWISE["prims.fma.default"] = ("fma", D)
POINTWISE["prims.erfc.default"] = ("erfc", F)

_FLOAT_ONLY = {"exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh",
               "sigmoid", "erf", "truediv", "reciprocal", "atan2", "erfc", "sinh", "cosh", "tan", "asin", "acos",
               "atan", "log10"}
_INT_IDENTITY = {"floor", "ceil", "round", "trunc"}  # no-ops on integer tensors
#: arithmetic on bools is logic in eager (True + True is True); 1-bit integer adds would wrap to False
_BOOL_FORMS = {"add": "logical_or", "mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and"}


def broadcast_index(size: Sequence[sympy.Expr], out_size: Sequence[sympy.Expr], index: Index) -> list:
    """Index into a tensor of ``size`` broadcast to ``out_size`` (trailing-aligned, 1-dims read at 0)."""
    off = len(out_size) - len(size)
    return [sympy.Integer(0) if (s == 1 and out_size[off + i] != 1) else index[off + i]
            for i, s in enumerate(size)]


def load_arg(arg: Any, out_size: Sequence[sympy.Expr], index: Index, dtype: torch.dtype) -> KExpr:
    """A pointwise operand at ``index``: a tensor value, a SymInt/SymFloat, or a Python scalar."""
    if isinstance(arg, Value):
        return cast(arg.load(broadcast_index(arg.size, out_size, index)), dtype)
    if isinstance(arg, SymScalar):
        if arg.py_type is float:
            from ..codegen.printer import pfloat
            from ..exc import CodegenError
            try:
                pfloat(arg.expr)
            except CodegenError as e:
                raise NotLowered(f"symbolic float scalar: {e}") from None
            return cast(IndexValue(arg.expr, torch.float64), dtype)
        return cast(IndexValue(arg.expr, torch.int64), dtype)
    if isinstance(arg, (bool, int, float)):
        return Const(arg, dtype) if dtype != torch.bool else Const(bool(arg), dtype)
    raise NotLowered(f"operand of type {type(arg).__name__}")


def meta_of(node_arg: Any) -> Any:
    """A stand-in for type promotion: FakeTensor for tensors, Python scalar samples for symbols."""
    if hasattr(node_arg, "meta"):
        v = node_arg.meta.get("val")
        if isinstance(v, torch.SymInt):
            return 0
        if isinstance(v, torch.SymFloat):
            return 0.0
        if isinstance(v, torch.SymBool):
            return False
        return v
    return node_arg


def arg_cost(args: Sequence[Any]) -> int:
    return 1 + sum(a.cost for a in args if isinstance(a, Lazy))


def check_device(node, args: Sequence[Any]) -> torch.device:
    out = node.meta["val"]
    for a in args:
        if isinstance(a, Value) and a.device != out.device:
            if len(a.size) == 0:
                raise NotLowered(f"0-d tensor on {a.device} used with {out.device} tensors", kind="device")
            raise NotLowered(f"operands on {a.device} and {out.device}", kind="device")
    return out.device


def make_pointwise(op: str, kind: K) -> Callable:
    def lower(g: GraphLowering, node, *args, **kwargs) -> Lazy:
        if kwargs:
            raise NotLowered(f"keyword arguments {sorted(kwargs)}")
        out = node.meta["val"]
        if out.dtype.is_complex:
            raise NotLowered("complex dtypes", kind="dtype")
        device = check_device(node, args)
        metas = [meta_of(a) for a in node.args]
        if op == "where":
            comp, _ = elementwise_dtypes(*metas[1:], type_promotion_kind=K.DEFAULT)
            comp = compute_dtype(comp)
        else:
            comp, _ = elementwise_dtypes(*metas, type_promotion_kind=kind)
            comp = compute_dtype(comp)
        if op in _INT_IDENTITY and not comp.is_floating_point:
            return _identity(args[0], out, device)
        if op in _FLOAT_ONLY and not comp.is_floating_point:
            comp = torch.float32
        kop = _BOOL_FORMS.get(op, op) if comp == torch.bool else op
        out_size = tuple(sym(s) for s in out.shape)
        out_dtype = out.dtype
        result_dtype = torch.bool if kind == B else comp
        emulate = g.settings.emulate_eager_precision

        def fn(index: Index) -> KExpr:
            if op == "where":
                vals = [load_arg(args[0], out_size, index, torch.bool)] + [
                    load_arg(a, out_size, index, comp) for a in args[1:]]
            elif op in ("logical_not", "logical_and", "logical_or", "logical_xor"):
                vals = [load_arg(a, out_size, index, torch.bool) for a in args]
            else:
                vals = [load_arg(a, out_size, index, comp) for a in args]
            r = Op(kop, vals, result_dtype)
            return mark_rounding(cast(r, out_dtype), emulate)

        return Lazy(out_size, out_dtype, device, fn, arg_cost(args))

    return lower


def _identity(x: Value, out: torch.Tensor, device: torch.device) -> Lazy:
    size = tuple(sym(s) for s in out.shape)
    return Lazy(size, out.dtype, device, lambda idx: cast(x.load(idx), out.dtype), arg_cost([x]))


for _op, (_name, _kind) in POINTWISE.items():
    register_lowering(_op)(make_pointwise(_name, _kind))


# ---------------------------------------------------------------------------- ops with extra arguments
@register_lowering(aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar)
def _add_sub(g: GraphLowering, node, a, b, alpha=1):
    op = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if alpha != 1:
        b_scaled = _scaled(node, b, alpha)
        return make_pointwise(op, D)(g, node, a, b_scaled)
    return make_pointwise(op, D)(g, node, a, b)


def _scaled(node, b, alpha):
    """``alpha * b`` in the compute dtype: eager's ``add(a, b, alpha=)`` rounds once, after the add."""
    if isinstance(b, Value):
        comp = compute_dtype(node.meta["val"].dtype)
        return Lazy(b.size, comp, b.device, lambda idx: Op("mul", [cast(b.load(idx), comp), Const(alpha, comp)], comp),
                    arg_cost([b]))
    return b * alpha


@register_lowering(aten.div.Tensor_mode)
def _div_mode(g: GraphLowering, node, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return make_pointwise("truediv", F)(g, node, a, b)
    op = {"floor": "floordiv", "trunc": "truncdiv"}.get(rounding_mode)
    if op is None:
        raise NotLowered(f"rounding_mode={rounding_mode!r}")
    return make_pointwise(op, D)(g, node, a, b)


register_lowering(aten.floor_divide.default)(make_pointwise("floordiv", D))


@register_lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
                   aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(g: GraphLowering, node, x, lo=None, hi=None):
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    out = node.meta["val"]
    device = check_device(node, [x, lo, hi])
    metas = [meta_of(a) for a in node.args if a is not None]
    comp = compute_dtype(elementwise_dtypes(*metas, type_promotion_kind=D)[0])
    size = tuple(sym(s) for s in out.shape)
    emulate = g.settings.emulate_eager_precision

    def fn(idx: Index) -> KExpr:
        v = load_arg(x, size, idx, comp)
        if lo is not None:
            v = Op("clamp_min", [v, load_arg(lo, size, idx, comp)], comp)
        if hi is not None:
            v = Op("clamp_max", [v, load_arg(hi, size, idx, comp)], comp)
        return mark_rounding(cast(v, out.dtype), emulate)

    return Lazy(size, out.dtype, device, fn, arg_cost([x, lo, hi]))


@register_lowering(aten.hardtanh.default)
def _hardtanh(g: GraphLowering, node, x, lo=-1.0, hi=1.0):
    return _clamp(g, node, x, lo, hi)


@register_lowering(aten.gelu.default)
def _gelu(g: GraphLowering, node, x, approximate: str = "none"):
    op = {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    if op is None:
        raise NotLowered(f"approximate={approximate!r}")
    return make_pointwise(op, F)(g, node, x)


@register_lowering(aten.silu.default)
def _silu(g: GraphLowering, node, x):
    return make_pointwise("silu", F)(g, node, x)


@register_lowering(aten.leaky_relu.default)
def _leaky_relu(g: GraphLowering, node, x, slope=0.01):
    out = node.meta["val"]
    comp = compute_dtype(out.dtype)
    size = tuple(sym(s) for s in out.shape)
    emulate = g.settings.emulate_eager_precision

    def fn(idx: Index) -> KExpr:
        v = load_arg(x, size, idx, comp)
        neg = Op("mul", [v, Const(slope, comp)], comp)
        return mark_rounding(cast(Op("where", [Op("gt", [v, Const(0, comp)], torch.bool), v, neg], comp), out.dtype),
                             emulate)

    return Lazy(size, out.dtype, check_device(node, [x]), fn, arg_cost([x]))


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(g: GraphLowering, node, x, mask, value):
    return make_pointwise("where", N)(g, _SwapArgs(node, (node.args[1], node.args[2], node.args[0])), mask, value, x)


class _SwapArgs:
    """Present ``node`` to a pointwise lowering with reordered args (for type promotion)."""

    def __init__(self, node, args) -> None:
        self.meta, self.args, self.target, self.users = node.meta, args, node.target, node.users


#: pow with a constant exponent: cheap exact forms instead of libdevice.pow
_POW_FORMS = {2: lambda v, c: Op("mul", [v, v], c), 3: lambda v, c: Op("mul", [Op("mul", [v, v], c), v], c),
              1: lambda v, c: v, 0.5: lambda v, c: Op("sqrt", [v], c), -0.5: lambda v, c: Op("rsqrt", [v], c),
              -1: lambda v, c: Op("reciprocal", [v], c), -2: lambda v, c: Op("reciprocal", [Op("mul", [v, v], c)], c)}


@register_lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(g: GraphLowering, node, x, exponent):
    out = node.meta["val"]
    form = _POW_FORMS.get(exponent) if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) else None
    if form is None or not out.dtype.is_floating_point or (exponent in (0.5, -0.5, -1, -2) and not out.dtype.is_floating_point):
        return make_pointwise("pow", K.BOOL_TO_LONG)(g, node, x, exponent)
    comp = compute_dtype(out.dtype)
    size = tuple(sym(s) for s in out.shape)
    emulate = g.settings.emulate_eager_precision
    device = check_device(node, [x])
    return Lazy(size, out.dtype, device, lambda idx: mark_rounding(cast(form(load_arg(x, size, idx, comp), comp), out.dtype),
                                                             emulate), arg_cost([x]))
