"""Evaluate an index expression (sympy, over index symbols) at concrete integers or integer numpy arrays,
walking the sympy tree: the integer arithmetic a kernel computes for it (``codegen.printer.pexpr``), without
printing it and evaluating the text.

``evaluate`` understands what ``pexpr`` prints as plain integer arithmetic: symbols, integers, sums,
products, positive integer powers, ``FloorDiv`` (floor division), ``ModularIndexing`` and modulos. Anything
else (``Max``/``Min``, which a kernel computes with ``tl.maximum``/``tl.minimum``; rationals; floats; other
functions) raises ``Unevaluable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv, Mod, ModularIndexing, PythonMod


class Unevaluable(ValueError):
    """An expression ``evaluate`` does not compute (the caller then does without its value)."""


def evaluate(e: sympy.Expr, env: Mapping[sympy.Symbol, Any]) -> Any:
    """The value of ``e`` with each symbol bound by ``env`` (Python ints or integer numpy arrays, which
    broadcast); ``Unevaluable`` for a form it does not compute or a symbol ``env`` does not bind."""
    if isinstance(e, sympy.Symbol):
        if e not in env:
            raise Unevaluable(f"symbol {e} is not bound")
        return env[e]
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, FloorDiv):
        return evaluate(e.args[0], env) // evaluate(e.args[1], env)
    if isinstance(e, ModularIndexing):
        base, div, mod = (evaluate(a, env) for a in e.args)
        return (base // div) % mod
    if isinstance(e, (sympy.Mod, Mod, PythonMod)):  # operands of index math are non-negative
        return evaluate(e.args[0], env) % evaluate(e.args[1], env)
    if isinstance(e, sympy.Add):
        terms = [evaluate(a, env) for a in e.args]
        out = terms[0]
        for t in terms[1:]:
            out = out + t
        return out
    if isinstance(e, sympy.Mul):
        factors = [evaluate(a, env) for a in e.args]
        out = factors[0]
        for f in factors[1:]:
            out = out * f
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
        base = evaluate(e.base, env)
        out = base
        for _ in range(int(e.exp) - 1):
            out = out * base
        return out
    raise Unevaluable(f"cannot evaluate index expression {e!r} ({type(e).__name__})")
