"""Printing for kernel source: index expressions (sympy -> integer Triton arithmetic) and typed literals.

Why ``pexpr`` and ``pfloat`` are not ``torch.utils._sympy.printers.PythonPrinter`` subclasses: that printer
writes Python for host-side guards and sizes, and almost every form it prints is the wrong one in a Triton
kernel. ``Max``/``Min`` become builtin ``max``/``min`` (here ``tl.maximum``/``tl.minimum``: blocks, not
scalars); ``ToFloat`` and ``sqrt`` become ``torch.sym_float``/``torch._sym_sqrt`` (here a float64 block,
``s0 + tl.zeros([], tl.float64)``, and ``tl.sqrt``); floats get 17 digits (``0.050000000000000003``, not
``0.05``); a negative term prints as ``((-1)*r)``. Its ``Add``/``Mul`` keep sympy's argument order and
parenthesize by precedence, while kiln sorts terms by ``sympy.default_sort_key`` and parenthesizes every
compound term: a switch would change the text (so the hashed name) of every kernel and the golden files. And
a type it has no rule for prints as ``Name(args)``, which fails only when Triton compiles the kernel; here it
raises ``CodegenError`` at render time (``index_eval.evaluate``, which ``scheduler.same_on_domain`` uses,
computes the same integer forms without printing). A subclass would override every method these printers use, and the fallback, so it
would share no code.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, Mod, ModularIndexing, PythonMod
from torch.utils._sympy.functions import Max as SymMax
from torch.utils._sympy.functions import Min as SymMin

from ..dtypes import tl_dtype
from ..exc import CodegenError

#: sympy's Max/Min and torch's own (shape guards and ``sym_max`` produce the latter)
MAX_TYPES = (sympy.Max, SymMax)
MIN_TYPES = (sympy.Min, SymMin)


def pexpr(e: sympy.Expr) -> str:
    """Print an index expression as Triton/Python integer arithmetic (all indices are non-negative)."""
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, FloorDiv):
        return f"({pexpr(e.args[0])} // {pexpr(e.args[1])})"
    if isinstance(e, ModularIndexing):
        base, div, mod = e.args
        inner = pexpr(base) if div == 1 else f"({pexpr(base)} // {pexpr(div)})"
        return f"({inner} % {pexpr(mod)})"
    if isinstance(e, (sympy.Mod, Mod, PythonMod)):  # operands of index math are non-negative
        return f"({pexpr(e.args[0])} % {pexpr(e.args[1])})"
    if isinstance(e, sympy.Add):
        terms = sorted(e.args, key=sympy.default_sort_key)
        out = pexpr(terms[0])
        for t in terms[1:]:
            c, rest = t.as_coeff_Mul()
            if c < 0:
                out += f" - {pexpr(-t)}"
            else:
                out += f" + {pexpr(t)}"
        return f"({out})"
    if isinstance(e, sympy.Mul):
        c, rest = e.as_coeff_Mul()
        factors = sorted(sympy.Mul.make_args(rest), key=sympy.default_sort_key)
        body = " * ".join(pexpr(f) for f in factors)
        if c == 1:
            return f"({body})" if len(factors) > 1 else body
        if c == -1:
            return f"(-{body})"
        return f"({pexpr(c)} * {body})"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
        return "(" + " * ".join([pexpr(e.base)] * int(e.exp)) + ")"
    if isinstance(e, MAX_TYPES + MIN_TYPES):
        fn = "tl.maximum" if isinstance(e, MAX_TYPES) else "tl.minimum"
        a = [pexpr(x) for x in sorted(e.args, key=sympy.default_sort_key)]
        out = a[0]
        for x in a[1:]:
            out = f"{fn}({out}, {x})"
        return out
    if isinstance(e, sympy.Rational) and e.q != 1:
        raise CodegenError(f"non-integer index expression {e}")
    raise CodegenError(f"cannot print index expression {e!r} ({type(e).__name__})")


def raw_literal(value, dtype: torch.dtype) -> str:
    """A Python literal for ``value`` (for constexpr positions such as ``tl.full``'s fill value)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        f = float(value)
        if f != f:
            return "float('nan')"
        if f in (float("inf"), float("-inf")):
            return "float('inf')" if f > 0 else "float('-inf')"
        return repr(f)
    return str(_wrap_int(int(value), dtype))


def _wrap_int(v: int, dtype: torch.dtype) -> int:
    """``v`` converted to an integer dtype as C++ casts (two's complement wrap-around): eager compares an
    int8 tensor with ``-1000`` as with ``24``; an out-of-range literal is an error in Triton."""
    info = torch.iinfo(dtype)
    if info.min <= v <= info.max:
        return v
    span = info.max - info.min + 1
    return (v - info.min) % span + info.min


def typed_literal(value, dtype: torch.dtype) -> str:
    """A 0-d constant of exactly ``dtype`` (so Triton's type promotion never widens or narrows it)."""
    return f"tl.full([], {raw_literal(value, dtype)}, {tl_dtype(dtype)})"


def pfloat(e: sympy.Expr) -> str:
    """Print a SymFloat expression (sizes mixed with float math, e.g. ``0.05 / s0``, ``1 / sqrt(s1)``) as
    float64 Triton arithmetic. Integer size symbols are kernel arguments, widened to float64."""
    name = type(e).__name__
    if isinstance(e, sympy.Symbol):
        return f"({e.name} + tl.zeros([], tl.float64))"
    if e.is_number:
        return repr(float(e))
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(pfloat(a) for a in sorted(e.args, key=sympy.default_sort_key)) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(pfloat(a) for a in sorted(e.args, key=sympy.default_sort_key)) + ")"
    if name in ("FloatTrueDiv", "IntTrueDiv"):
        return f"({pfloat(e.args[0])} / {pfloat(e.args[1])})"
    if name in ("ToFloat", "Identity"):
        return pfloat(e.args[0])
    if name == "OpaqueUnaryFn_sqrt":
        return f"tl.sqrt({pfloat(e.args[0])})"
    if isinstance(e, sympy.Pow) or name in ("FloatPow", "PowByNatural"):
        base, exp = e.args
        if exp == -1:
            return f"(1.0 / {pfloat(base)})"
        if exp == sympy.Rational(1, 2):
            return f"tl.sqrt({pfloat(base)})"
        if exp == -sympy.Rational(1, 2):
            return f"(1.0 / tl.sqrt({pfloat(base)}))"
        if exp.is_Integer and 0 < int(exp) <= 4:
            return "(" + " * ".join([pfloat(base)] * int(exp)) + ")"
    if isinstance(e, (FloorDiv, ModularIndexing, sympy.Mod)):
        return f"({pexpr(e)} + tl.zeros([], tl.float64))"
    raise CodegenError(f"cannot print float expression {e!r} ({name})")
