"""Pointwise lowerings: one table from ATen overload to kernel op name and type-promotion rule.

Each entry is registered with its promotion kind, so the lowering contract (``compiler.contract``) promotes
the operands' types, broadcasts them to the output size and casts the result to eager's dtype (a rounding
point under ``emulate_eager_precision``); a lowering here only says how one element is computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from ..contract import Elementwise, arg_cost
from ..exc import NotLowered
from ..graph import register_lowering
from ..ir import Index, Lazy, Value
from ..kexpr import Const, KExpr, Op, cast

aten = torch.ops.aten
prims = torch.ops.prims

D, F, B, N = K.DEFAULT, K.INT_TO_FLOAT, K.ALWAYS_BOOL, K.NO_OPMATH

#: overload -> (kernel op, type promotion).  Ops whose name ends in "_f" exist only for floats.
POINTWISE: dict[Any, tuple[str, K]] = {
    aten.add.Tensor: ("add", D),
    aten.sub.Tensor: ("sub", D),
    aten.mul.Tensor: ("mul", D),
    aten.div.Tensor: ("truediv", F),
    aten.neg.default: ("neg", D),
    aten.abs.default: ("abs", D),
    aten.exp.default: ("exp", F),
    aten.exp2.default: ("exp2", F),
    aten.expm1.default: ("expm1", F),
    aten.log.default: ("log", F),
    aten.log2.default: ("log2", F),
    aten.log1p.default: ("log1p", F),
    aten.sqrt.default: ("sqrt", F),
    aten.rsqrt.default: ("rsqrt", F),
    aten.reciprocal.default: ("reciprocal", F),
    aten.sin.default: ("sin", F),
    aten.cos.default: ("cos", F),
    aten.tanh.default: ("tanh", F),
    aten.sigmoid.default: ("sigmoid", F),
    aten.erf.default: ("erf", F),
    aten.floor.default: ("floor", D),
    aten.ceil.default: ("ceil", D),
    aten.round.default: ("round", D),
    aten.trunc.default: ("trunc", D),
    aten.sign.default: ("sign", D),
    aten.relu.default: ("relu", D),
    aten.maximum.default: ("maximum", D),
    aten.minimum.default: ("minimum", D),
    aten.eq.Tensor: ("eq", B),
    aten.eq.Scalar: ("eq", B),
    aten.ne.Tensor: ("ne", B),
    aten.ne.Scalar: ("ne", B),
    aten.lt.Tensor: ("lt", B),
    aten.lt.Scalar: ("lt", B),
    aten.le.Tensor: ("le", B),
    aten.le.Scalar: ("le", B),
    aten.gt.Tensor: ("gt", B),
    aten.gt.Scalar: ("gt", B),
    aten.ge.Tensor: ("ge", B),
    aten.ge.Scalar: ("ge", B),
    aten.isnan.default: ("isnan", B),
    aten.isinf.default: ("isinf", B),
    aten.logical_not.default: ("logical_not", B),
    aten.logical_and.default: ("logical_and", B),
    aten.logical_or.default: ("logical_or", B),
    aten.logical_xor.default: ("logical_xor", B),
    aten.bitwise_and.Tensor: ("bitwise_and", D),
    aten.bitwise_or.Tensor: ("bitwise_or", D),
    aten.bitwise_xor.Tensor: ("bitwise_xor", D),
    aten.bitwise_not.default: ("bitwise_not", D),
    aten.bitwise_and.Scalar: ("bitwise_and", D),
    aten.bitwise_or.Scalar: ("bitwise_or", D),
    aten.bitwise_xor.Scalar: ("bitwise_xor", D),
    aten.__lshift__.Tensor: ("lshift", D),
    aten.__lshift__.Scalar: ("lshift", D),
    aten.__rshift__.Tensor: ("rshift", D),
    aten.__rshift__.Scalar: ("rshift", D),
    aten.bitwise_left_shift.Tensor: ("lshift", D),
    aten.bitwise_left_shift.Tensor_Scalar: ("lshift", D),
    aten.bitwise_left_shift.Scalar_Tensor: ("lshift", D),
    aten.bitwise_right_shift.Tensor: ("rshift", D),
    aten.bitwise_right_shift.Tensor_Scalar: ("rshift", D),
    aten.bitwise_right_shift.Scalar_Tensor: ("rshift", D),
    aten.pow.Tensor_Tensor: ("pow", K.BOOL_TO_LONG),
    aten.pow.Tensor_Scalar: ("pow", K.BOOL_TO_LONG),
    aten.pow.Scalar: ("pow", K.BOOL_TO_LONG),
    aten.fmod.Tensor: ("fmod", D),
    aten.fmod.Scalar: ("fmod", D),
    aten.remainder.Tensor: ("remainder", D),
    aten.remainder.Scalar: ("remainder", D),
    aten.atan2.default: ("atan2", F),
    aten.where.self: ("where", N),
    aten.mul.Scalar: ("mul", D),
    aten.div.Scalar: ("truediv", F),
    aten.erfc.default: ("erfc", F),
    aten.sinh.default: ("sinh", F),
    aten.cosh.default: ("cosh", F),
    aten.tan.default: ("tan", F),
    aten.asin.default: ("asin", F),
    aten.acos.default: ("acos", F),
    aten.atan.default: ("atan", F),
    aten.log10.default: ("log10", F),
}

# prims that survive decomposition; they are created lazily by torch, so they are keyed by name
POINTWISE["prims.fma.default"] = ("fma", D)
POINTWISE["prims.erfc.default"] = ("erfc", F)

_FLOAT_ONLY = {
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log1p",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "truediv",
    "reciprocal",
    "atan2",
    "erfc",
    "sinh",
    "cosh",
    "tan",
    "asin",
    "acos",
    "atan",
    "log10",
}
_INT_IDENTITY = {"floor", "ceil", "round", "trunc"}  # no-ops on integer tensors
_INT_ONLY = {"lshift", "rshift"}  # eager has no float or bool kernels for them
#: arithmetic on bools is logic in eager (True + True is True); 1-bit integer adds would wrap to False
_BOOL_FORMS = {"add": "logical_or", "mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and"}


#: operands (positions in the node's args) that take part in type promotion, where not all of them do
_OPERANDS = {"where": (1, 2)}


def pointwise(op: str, kind: K) -> Callable[..., Lazy]:
    """The elementwise lowering of kernel op ``op`` (``kind``: its promotion, for ALWAYS_BOOL results)."""

    def lower(e: Elementwise, *args: Any, **kwargs: Any) -> Lazy:
        if kwargs:
            raise NotLowered(f"keyword arguments {sorted(kwargs)}")
        if op in _INT_IDENTITY and not e.comp.is_floating_point:
            return e.lazy(lambda idx: e.load(args[0], idx, e.out), args)
        if op in _INT_ONLY and (e.comp.is_floating_point or e.comp == torch.bool):
            raise NotLowered(f"{op} of {e.comp}")
        if op in _FLOAT_ONLY and not e.comp.is_floating_point:
            e = dataclasses.replace(e, comp=torch.float32)
        comp = e.comp
        kop = _BOOL_FORMS.get(op, op) if comp == torch.bool else op
        result_dtype = torch.bool if kind == B else comp

        def element(index: Index) -> KExpr:
            if op == "where":
                vals = [e.load(args[0], index, torch.bool)] + [e.load(a, index) for a in args[1:]]
            elif op in ("logical_not", "logical_and", "logical_or", "logical_xor"):
                vals = [e.load(a, index, torch.bool) for a in args]
            else:
                vals = [e.load(a, index) for a in args]
            return Op(kop, vals, result_dtype)

        return e.lazy(element, args)

    return lower


for _op, (_name, _kind) in POINTWISE.items():
    register_lowering(_op, promote=_kind, operands=_OPERANDS.get(_name))(pointwise(_name, _kind))


# ---------------------------------------------------------------------------- ops with extra arguments
@register_lowering(aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar, promote=D)
def _add_sub(e: Elementwise, a, b, alpha=1) -> Lazy:
    op = "add" if e.node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    return pointwise(op, D)(e, a, _scaled(e, b, alpha) if alpha != 1 else b)


def _scaled(e: Elementwise, b, alpha):
    """``alpha * b`` in the compute dtype: eager's ``add(a, b, alpha=)`` rounds once, after the add."""
    if isinstance(b, Value):
        comp = e.comp
        return Lazy(
            b.size,
            comp,
            b.device,
            lambda idx: Op("mul", [cast(b.load(idx), comp), Const(alpha, comp)], comp),
            arg_cost([b]),
        )
    return b * alpha


@register_lowering(
    aten.div.Tensor_mode, promote=lambda node: F if node.kwargs.get("rounding_mode") is None else D
)
def _div_mode(e: Elementwise, a, b, *, rounding_mode=None) -> Lazy:
    if rounding_mode is None:
        return pointwise("truediv", F)(e, a, b)
    op = {"floor": "floordiv", "trunc": "truncdiv"}.get(rounding_mode)
    if op is None:
        raise NotLowered(f"rounding_mode={rounding_mode!r}")
    return pointwise(op, D)(e, a, b)


register_lowering(aten.floor_divide.default, promote=D)(pointwise("floordiv", D))


@register_lowering(
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.clamp_min.default,
    aten.clamp_max.default,
    aten.clamp_min.Tensor,
    aten.clamp_max.Tensor,
    promote=D,
)
def _clamp(e: Elementwise, x, lo=None, hi=None) -> Lazy:
    if e.node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo

    def element(idx: Index) -> KExpr:
        v = e.load(x, idx)
        if lo is not None:
            v = Op("clamp_min", [v, e.load(lo, idx)], e.comp)
        if hi is not None:
            v = Op("clamp_max", [v, e.load(hi, idx)], e.comp)
        return v

    return e.lazy(element, [x, lo, hi])


@register_lowering(aten.hardtanh.default, promote=D)
def _hardtanh(e: Elementwise, x, lo=-1.0, hi=1.0) -> Lazy:
    return _clamp(e, x, lo, hi)


@register_lowering(aten.gelu.default, promote=F)
def _gelu(e: Elementwise, x, approximate: str = "none") -> Lazy:
    op = {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    if op is None:
        raise NotLowered(f"approximate={approximate!r}")
    return pointwise(op, F)(e, x)


register_lowering(aten.silu.default, promote=F)(pointwise("silu", F))


@register_lowering(aten.round.decimals, promote=D)
def _round_decimals(e: Elementwise, x, *, decimals: int = 0) -> Lazy:
    """Eager's form: nearbyint(x * 10^d) / 10^d, or for d < 0, nearbyint(x / 10^-d) * 10^-d."""
    if not e.comp.is_floating_point:
        raise NotLowered(f"round(decimals=) of {e.comp}")
    comp, scale = e.comp, 10.0 ** abs(decimals)
    into, back = ("mul", "div_rn") if decimals >= 0 else ("div_rn", "mul")

    def element(idx: Index) -> KExpr:
        scaled = Op(into, [e.load(x, idx), Const(scale, comp)], comp)
        return Op(back, [Op("round", [scaled], comp), Const(scale, comp)], comp)

    return e.lazy(element, [x])


@register_lowering(aten.leaky_relu.default, promote=D, operands=(0,))
def _leaky_relu(e: Elementwise, x, slope=0.01) -> Lazy:
    comp = e.comp

    def element(idx: Index) -> KExpr:
        v = e.load(x, idx)
        neg = Op("mul", [v, Const(slope, comp)], comp)
        return Op("where", [Op("gt", [v, Const(0, comp)], torch.bool), v, neg], comp)

    return e.lazy(element, [x])


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor, promote=N, operands=(0, 2))
def _masked_fill(e: Elementwise, x, mask, value) -> Lazy:
    return pointwise("where", N)(e, mask, value, x)


#: pow with a constant exponent: cheap exact forms instead of libdevice.pow
_POW_FORMS = {
    2: lambda v, c: Op("mul", [v, v], c),
    3: lambda v, c: Op("mul", [Op("mul", [v, v], c), v], c),
    1: lambda v, c: v,
    0.5: lambda v, c: Op("sqrt", [v], c),
    -0.5: lambda v, c: Op("rsqrt", [v], c),
    -1: lambda v, c: Op("reciprocal", [v], c),
    -2: lambda v, c: Op("reciprocal", [Op("mul", [v, v], c)], c),
}


@register_lowering(aten.pow.Tensor_Scalar, promote=K.BOOL_TO_LONG)
def _pow_scalar(e: Elementwise, x, exponent) -> Lazy:
    form = (
        _POW_FORMS.get(exponent)
        if isinstance(exponent, (int, float)) and not isinstance(exponent, bool)
        else None
    )
    if form is None or not e.out.is_floating_point:
        return pointwise("pow", K.BOOL_TO_LONG)(e, x, exponent)
    return e.lazy(lambda idx: form(e.load(x, idx), e.comp), [x])
