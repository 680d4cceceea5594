"""Kernel op -> Triton source. A table of templates, not an if-chain.

Each entry maps an op name (``kexpr.Op.op``) to a template over the rendered operand strings ``{0}``,
``{1}``..., or to a function ``(operands, operand_dtypes, result_dtype) -> str`` where dtype matters.
Functions that Triton's core lacks come from ``libdevice`` (on GPUs) or the interpreter shim
(``runtime/interp_libdevice.py``); helper JIT functions live in ``HELPERS`` and are emitted on use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..dtypes import tl_dtype

Render = Callable[[Sequence[str], Sequence[torch.dtype], torch.dtype], str]


def _float_or_int(float_tpl: str, int_tpl: str) -> Render:
    def render(a, dts, out):
        return (float_tpl if dts[0].is_floating_point else int_tpl).format(*a)

    return render


def _pow(a, dts, out) -> str:
    return f"libdevice.pow({a[0]}, {a[1]})" if out.is_floating_point else f"_pow_int({a[0]}, {a[1]})"


def cast(code: str, src: torch.dtype, dst: torch.dtype) -> str:
    """``code`` (of dtype ``src``) converted to ``dst`` as eager converts: bool is ``!= 0``; integers
    reach bfloat16 through float32 (c10 rounds them that way, and the interpreter's direct int -> bf16
    conversion reinterprets bits)."""
    if dst == torch.bool:
        return f"({code} != 0)"
    if dst == torch.bfloat16 and not src.is_floating_point:
        return f"{code}.to(tl.float32).to(tl.bfloat16)"
    return f"{code}.to({tl_dtype(dst)})"


def _to(a, dts, out) -> str:
    return cast(a[0], dts[0], out)


def _bitcast(a, dts, out) -> str:
    return f"{a[0]}.to({tl_dtype(out)}, bitcast=True)"


def _isinf(a, dts, out) -> str:
    return f"(tl.abs({a[0]}) == float('inf'))" if dts[0].is_floating_point else f"({a[0]} != {a[0]})"


def _isnan(a, dts, out) -> str:
    return f"({a[0]} != {a[0]})"


def _sign(a, dts, out) -> str:
    cast = tl_dtype(out)
    return f"(({a[0]} > 0).to({cast}) - ({a[0]} < 0).to({cast}))"


def _shift(left: bool) -> Render:
    """Integer shifts as eager computes them: a shift by a negative amount or by the width or more gives 0
    (left; right on unsigned types) or the sign fill (right on signed types), where LLVM's would be poison."""

    def render(a, dts, out):
        bits = torch.iinfo(out).bits
        x, n = a
        ok = f"(({n} >= 0) & ({n} < {bits}))"
        safe = f"tl.where({ok}, {n}, {n} * 0)"
        if left:
            return f"tl.where({ok}, {x} << {safe}, {x} * 0)"
        far = f"({x} >> {bits - 1})" if out.is_signed else f"({x} * 0)"
        return f"tl.where({ok}, {x} >> {safe}, {far})"

    return render


def _div_rn(a, dts, out) -> str:
    """Division rounded to nearest as eager's CUDA kernels divide (Triton's ``/`` on fp32 may be the
    approximate ``div.full``); for the ops whose results users compare exactly (``round(decimals=)``).
    ``tl.div_rn`` is core Triton (CUDA, ROCm and the interpreter) and takes fp32 only; fp64's ``/`` is IEEE."""
    if out == torch.float32:
        return f"tl.div_rn({a[0]}, {a[1]})"
    return f"({a[0]} / {a[1]})"


def _bool_not(a, dts, out) -> str:
    return f"({a[0]} == 0)" if dts[0] == torch.bool else f"(~{a[0]})"


def _maxmin(fn: str) -> Render:
    def render(a, dts, out):
        if out.is_floating_point:
            return f"tl.{fn}({a[0]}, {a[1]}, propagate_nan=tl.PropagateNan.ALL)"
        return f"tl.{fn}({a[0]}, {a[1]})"

    return render


OPS: dict[str, str | Render] = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "truediv": "({0} / {1})",
    "div_rn": _div_rn,
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "exp": "tl.exp({0})",
    "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})",
    "log": "tl.log({0})",
    "log2": "tl.log2({0})",
    "log1p": "libdevice.log1p({0})",
    "sqrt": lambda a, dts, out: f"tl.sqrt({a[0]})" if dts[0] == torch.float64 else f"tl.sqrt_rn({a[0]})",
    "rsqrt": "tl.rsqrt({0})",
    "reciprocal": "(1.0 / {0})",
    "sin": "libdevice.sin({0})",
    "cos": "libdevice.cos({0})",
    "tanh": "libdevice.tanh({0})",
    "atan2": "libdevice.atan2({0}, {1})",
    "erfc": "libdevice.erfc({0})",
    "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})",
    "tan": "libdevice.tan({0})",
    "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})",
    "log10": "libdevice.log10({0})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
    "erf": "tl.math.erf({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "round": "libdevice.nearbyint({0})",
    "trunc": "libdevice.trunc({0})",
    "sign": _sign,
    "relu": "_relu({0})",
    "maximum": _maxmin("maximum"),
    "minimum": _maxmin("minimum"),
    "clamp_min": _maxmin("maximum"),
    "clamp_max": _maxmin("minimum"),
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "isnan": _isnan,
    "isinf": _isinf,
    "logical_not": "({0} == 0)",
    "logical_and": "({0} & {1})",
    "logical_or": "({0} | {1})",
    "logical_xor": "({0} ^ {1})",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "bitwise_not": _bool_not,
    "lshift": _shift(left=True),
    "rshift": _shift(left=False),
    "pow": _pow,
    "fmod": "({0} % {1})",
    "remainder": _float_or_int("_remainder_float({0}, {1})", "_remainder_int({0}, {1})"),
    "floordiv": _float_or_int("_floordiv_float({0}, {1})", "_floordiv_int({0}, {1})"),
    "truncdiv": _float_or_int("libdevice.trunc({0} / {1})", "({0} // {1})"),
    "where": "tl.where({0}, {1}, {2})",
    "gelu": "({0} * 0.5 * (1.0 + tl.math.erf({0} * 0.7071067811865476)))",
    "gelu_tanh": "(0.5 * {0} * (1.0 + libdevice.tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0}))))",
    "silu": "({0} / (1.0 + tl.exp(-{0})))",
    "fma": "({0} * {1} + {2})",
    "to": _to,
    "bitcast": _bitcast,
    "round_bf16": "_round_bf16({0})",
    "round_fp16": "_round_fp16({0})",
}

#: helper JIT functions, emitted into a kernel's module only when its source mentions them
HELPERS: dict[str, str] = {
    "_relu": """
@triton.jit
def _relu(x):
    return tl.where(x != x, x, tl.maximum(x, 0))
""",
    "_floordiv_int": """
@triton.jit
def _floordiv_int(a, b):
    q = a // b
    r = a % b
    return q - ((r != 0) & ((r < 0) != (b < 0))).to(q.dtype)
""",
    "_remainder_int": """
@triton.jit
def _remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
""",
    "_floordiv_float": """
@triton.jit
def _floordiv_float(a, b):
    m = a % b
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1.0, d)
    fd = tl.floor(d)
    fd = tl.where(d - fd > 0.5, fd + 1.0, fd)
    return tl.where(b == 0, a / b, fd)
""",
    "_remainder_float": """
@triton.jit
def _remainder_float(a, b):
    m = a % b
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)
""",
    "_pow_int": """
@triton.jit
def _pow_int(a, b):
    result = a * 0 + 1
    base = a
    e = b
    for _ in range(64):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    return result
""",
    "_round_bf16": """
@triton.jit
def _round_bf16(x):
    # fp32 rounded to bf16 precision (nearest even), kept in fp32, with integer ops: with the plain round trip
    # x.to(bf16).to(fp32) a fused bf16 chain on an H100 differed from eager in ~800 of 4096 elements under
    # emulate_eager_precision (the compiler does not keep it as a rounding point), though alone it rounds right
    u = x.to(tl.uint32, bitcast=True)
    u = (u + (((u >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, u.to(tl.float32, bitcast=True))
""",
    "_round_fp16": """
@triton.jit
def _round_fp16(x):
    # fp32 rounded to fp16 precision and range (nearest even; subnormals, overflow to inf), kept in fp32
    u = x.to(tl.uint32, bitcast=True)
    u = (u + (((u >> 13) & 1) + 0xFFF)) & 0xFFFFE000
    v = u.to(tl.float32, bitcast=True)
    v = tl.where(tl.abs(v) > 65504.0, tl.where(x > 0, float('inf'), float('-inf')), v)
    sub = ((x * 16777216.0 + 12582912.0) - 12582912.0) * 5.960464477539063e-08
    v = tl.where(tl.abs(x) < 6.103515625e-05, sub, v)
    return tl.where(x != x, x, v)
""",
    "_max_nan": """
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
    "_min_nan": """
@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
    "_max_int": """
@triton.jit
def _max_int(a, b):
    return tl.maximum(a, b)
""",
    "_min_int": """
@triton.jit
def _min_int(a, b):
    return tl.minimum(a, b)
""",
    "_max_final": """
@triton.jit
def _max_final(v):
    nan = tl.max((v != v).to(tl.int8), 1)[:, None] > 0
    return tl.where(nan, float('nan'), tl.max(v, 1)[:, None])
""",
    "_min_final": """
@triton.jit
def _min_final(v):
    nan = tl.max((v != v).to(tl.int8), 1)[:, None] > 0
    return tl.where(nan, float('nan'), tl.min(v, 1)[:, None])
""",
    "_prod_combine": """
@triton.jit
def _prod_combine(a, b):
    return a * b
""",
    "_add_combine": """
@triton.jit
def _add_combine(a, b):
    return a + b
""",
    "_logaddexp_combine": """
@triton.jit
def _logaddexp_combine(a, b):
    hi = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    finite = (lo != hi) | (tl.abs(lo) != float('inf'))
    out = tl.where(finite, hi + libdevice.log1p(tl.exp(lo - hi)), a)
    return tl.where(a != a, a, tl.where(b != b, b, out))
""",
    "_argmax_combine": """
@triton.jit
def _argmax_combine(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 > v2) | (nan1 & ~nan2)
    tie = (v1 == v2) | (nan1 & nan2)
    pick1 = better | (tie & (i1 < i2))
    return tl.where(pick1, v1, v2), tl.where(pick1, i1, i2)
""",
    "_argmin_combine": """
@triton.jit
def _argmin_combine(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 < v2) | (nan1 & ~nan2)
    tie = (v1 == v2) | (nan1 & nan2)
    pick1 = better | (tie & (i1 < i2))
    return tl.where(pick1, v1, v2), tl.where(pick1, i1, i2)
""",
}


def _arg_final(kind: str, is_float: bool) -> str:
    """Source of ``_arg{max,min}_final[_int]``: first index of the best value per row (NaN counts as best)."""
    red = "max" if kind == "max" else "min"
    name = f"_arg{kind}_final" + ("" if is_float else "_int")
    if not is_float:
        return f"""
@triton.jit
def {name}(v, i):
    best = tl.{red}(v, 1)[:, None]
    return tl.min(tl.where(v == best, i, 2147483647), 1)[:, None]
"""
    inf = "float('inf')" if kind == "max" else "float('-inf')"
    return f"""
@triton.jit
def {name}(v, i):
    nan = v != v
    anynan = tl.max(nan.to(tl.int8), 1)[:, None] > 0
    key = tl.where(nan, {inf}, v)
    best = tl.{red}(key, 1)[:, None]
    cand = tl.where(anynan, nan, key == best)
    return tl.min(tl.where(cand, i, 2147483647), 1)[:, None]
"""


for _kind in ("max", "min"):
    for _is_float in (True, False):
        HELPERS[f"_arg{_kind}_final" + ("" if _is_float else "_int")] = _arg_final(_kind, _is_float)


def render_op(op: str, operands: Sequence[str], dtypes: Sequence[torch.dtype], out: torch.dtype) -> str:
    entry = OPS.get(op)
    if entry is None:
        raise NotImplementedError(f"no Triton rendering for op {op!r}")
    if isinstance(entry, str):
        return entry.format(*operands)
    return entry(operands, dtypes, out)
