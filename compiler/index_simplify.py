"""Simplification of a kernel's index expressions before printing (``codegen.triton_kernel``).

Views compose flat indices through floor divisions and modulos: a channels-last 4-d tensor read as the
2-d ``(N*H*W, C)`` matrix an ``addmm`` wrote, in memory order, prints as
``(2048 * (xindex // 2048)) + (xindex % 32) + (32 * ((xindex // 32) % 8)) + (256 * ((xindex // 256) % 8))``,
which is ``xindex``. The long form costs integer divisions per element, and hides from Triton that the
addresses are contiguous (no vectorized loads). ``simplify`` rewrites an index with two exact rules for
non-negative integers, applied bottom-up until nothing changes:

- *digit merge*: with ``q = b // d``, ``c * (q % m) + c*m * ((q // m) % m2) == c * (q % (m*m2))`` (``m2``
  may be unbounded: a plain floor division), so the digits of one base that a view split apart join again
  (``128 * (x // 128) + x % 128 -> x``).
- *range*: with ``g`` dividing ``d`` and ``b = g*Q + R`` (the terms of ``b`` whose coefficient ``g`` divides,
  and the rest) and ``R < g`` over the kernel's index domain, ``b // d == Q // (d/g)``; ``(b // d) % m == b // d`` when ``b < d*m``.
  Bounds come from ``bounds`` (the static ``xnumel``/``rnumel`` of the kernel: masked-off lanes never load or
  store), so only what the launch can reach is used.

Every rule is an identity over the domain, so a simplified index addresses the same elements.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import sympy
from torch.utils._sympy.functions import FloorDiv, Mod, ModularIndexing, PythonMod

#: one term of a sum: coefficient * ((base // div) % mod); mod None: a plain floor division (no modulo)
_Term = tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr | None]


def simplify(e: sympy.Expr, bounds: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """``e`` with digit merges and range rules applied (module docstring); ``bounds`` maps index symbols to
    their largest value. Expressions with other forms are returned with only their parts simplified."""
    return _simplify_cached(e, tuple(sorted(bounds.items(), key=lambda kv: kv[0].name)))


@functools.lru_cache(maxsize=4096)  # a model's repeated layers render the same indices
def _simplify_cached(e: sympy.Expr, bound_items: tuple) -> sympy.Expr:
    bounds = dict(bound_items)
    for _ in range(8):
        new = _simp(e, bounds)
        if new == e:
            return new
        e = new
    return e


def _simp(e: sympy.Expr, bounds: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    if not e.args or e.is_number:
        return e
    args = [_simp(a, bounds) for a in e.args]
    if isinstance(e, (FloorDiv, ModularIndexing, sympy.Mod, Mod, PythonMod, sympy.Add, sympy.Mul)):
        e = e.func(*args)
    else:
        return e.func(*args) if args != list(e.args) else e
    if isinstance(e, sympy.Add):
        return _merge(e, bounds)
    if isinstance(e, (FloorDiv, ModularIndexing, sympy.Mod, Mod, PythonMod)):
        t = _term(e)
        if t is not None:
            return _ranged(t, bounds)
    return e


def _term(e: sympy.Expr) -> _Term | None:
    """``e`` as a ``_Term`` (``None`` for a form that is none)."""
    coef, rest = sympy.Integer(1), e
    if isinstance(e, sympy.Mul):
        fns = [f for f in e.args if isinstance(f, (FloorDiv, ModularIndexing, sympy.Mod, Mod, PythonMod))]
        if len(fns) != 1:
            return (sympy.Integer(1), e, sympy.Integer(1), None)
        rest = fns[0]
        coef = sympy.Mul(*[f for f in e.args if f is not rest])
    if isinstance(rest, FloorDiv):
        return (coef, rest.args[0], rest.args[1], None)
    if isinstance(rest, ModularIndexing):
        return (coef, rest.args[0], rest.args[1], rest.args[2])
    if isinstance(rest, (sympy.Mod, Mod, PythonMod)):
        base, m = rest.args
        if isinstance(base, FloorDiv):
            return (coef, base.args[0], base.args[1], m)
        return (coef, base, sympy.Integer(1), m)
    return (coef, rest, sympy.Integer(1), None)


def _build(t: _Term) -> sympy.Expr:
    coef, base, div, mod = t
    if mod is None:
        inner = base if div == 1 else FloorDiv(base, div)
    else:
        inner = ModularIndexing(base, div, mod)
    return coef * inner


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


def _merge(e: sympy.Add, bounds: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """Join the digits of one base within the sum ``e``, then apply the range rules to each term."""
    found = [_term(a) for a in e.args]
    terms = [t for t in found if t is not None]
    if len(terms) < len(found):
        return e
    changed = True
    while changed:
        changed = False
        for i, (c1, b1, d1, m1) in enumerate(terms):
            if m1 is None:
                continue
            for j, (c2, b2, d2, m2) in enumerate(terms):
                if i == j or b1 != b2 or not _same(d2, d1 * m1) or not _same(c2, c1 * m1):
                    continue
                merged = (c1, b1, d1, None if m2 is None else m1 * m2)
                terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [merged]
                changed = True
                break
            if changed:
                break
    return sympy.Add(*[_ranged(t, bounds) for t in terms])


def _ranged(t: _Term, bounds: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """The term ``t`` with the range rules applied (module docstring)."""
    coef, base, div, mod = t
    if div != 1 and div.is_Integer and isinstance(base, sympy.Add):
        # b // d == (b // g) // (d / g) for g dividing d; with b = g*Q + R, R < g: (Q) // (d / g)
        coefs = [a.as_coeff_Mul()[0] for a in base.args]
        for g in sorted({sympy.gcd(int(c), int(div)) for c in coefs if c.is_Integer}, reverse=True):
            whole = [a for a, c in zip(base.args, coefs) if c.is_Integer and int(c) % g == 0]
            rest = [a for a in base.args if a not in whole]
            if g == 1 or not whole or not all(_nonneg(a) for a in rest):
                continue
            ub = upper(sympy.Add(*rest), bounds) if rest else 0
            if ub is not None and ub < g:
                base, div = sympy.expand(sympy.Add(*whole) / g), div / g
                break
    ub = upper(base, bounds) if _nonneg(base) else None
    if ub is not None and div.is_Integer:
        if ub < int(div):
            return sympy.Integer(0)
        if mod is not None and mod.is_Integer and ub < int(div) * int(mod):
            mod = None
    return _build((coef, base, div, mod))


def upper(e: sympy.Expr, bounds: Mapping[sympy.Symbol, int]) -> int | None:
    """The largest value of the non-negative index expression ``e`` given ``bounds`` (None: unknown)."""
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return bounds.get(e)
    if isinstance(e, sympy.Add):
        parts = [upper(a, bounds) for a in e.args]
        known = [p for p in parts if p is not None]
        return None if len(known) < len(parts) or any(p < 0 for p in known) else sum(known)
    if isinstance(e, sympy.Mul):
        out = 1
        for a in e.args:
            p = upper(a, bounds)
            if p is None or p < 0:
                return None
            out *= p
        return out
    if isinstance(e, FloorDiv) and e.args[1].is_Integer and int(e.args[1]) > 0:
        p = upper(e.args[0], bounds)
        return None if p is None else p // int(e.args[1])
    if isinstance(e, ModularIndexing) and e.args[1].is_Integer and e.args[2].is_Integer:
        p = upper(e.args[0], bounds)
        cap = int(e.args[2]) - 1
        return cap if p is None else min(cap, p // int(e.args[1]))
    if isinstance(e, (sympy.Mod, Mod, PythonMod)) and e.args[1].is_Integer:
        p = upper(e.args[0], bounds)
        cap = int(e.args[1]) - 1
        return cap if p is None else min(cap, p)
    return None


def _nonneg(e: sympy.Expr) -> bool:
    """Whether ``e`` is non-negative by its form: non-negative integers, symbols and div/mod terms, summed
    and multiplied."""
    if isinstance(e, sympy.Integer):
        return int(e) >= 0
    if isinstance(e, sympy.Symbol):
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Add, sympy.Mul, FloorDiv, ModularIndexing, sympy.Mod, Mod, PythonMod)):
        return all(_nonneg(a) for a in e.args)
    return False
