"""Kernel expressions: the small DAG a lowering builds for one element of a tensor.

A *body* is a function ``index -> KExpr`` (pointwise) or ``(index, rindex) -> KExpr`` (reduction input).
Nodes carry the torch dtype of the value they produce. Codegen renders a DAG to Triton with CSE.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sympy
import torch

from .dtypes import LOW_PRECISION, ROUNDING_OPS


class KExpr:
    """Base class. ``dtype`` is the torch dtype of the value."""

    __slots__ = ("dtype",)
    dtype: torch.dtype


class Load(KExpr):
    """Read ``buffer`` at flat element offset ``index`` (a sympy expression of index symbols).

    ``buffer_dtype`` is the dtype the buffer holds; ``dtype`` the one the value is read as (they differ for
    same-width reinterpretations, ``view.dtype``: the kernel bitcasts the loaded value).
    ``mask`` (a bool KExpr or None) guards the read; masked-off lanes read 0 (padding, concatenation).
    ``indirect`` binds symbols of ``index`` to int64 KExprs computed in the kernel (gather, ``x[idx]``).
    """

    __slots__ = ("buffer", "buffer_dtype", "index", "mask", "indirect")

    def __init__(
        self,
        buffer: str,
        index: sympy.Expr,
        dtype: torch.dtype,
        mask: KExpr | None = None,
        indirect: tuple = (),
        *,
        buffer_dtype: torch.dtype,
    ) -> None:
        self.buffer, self.index, self.dtype, self.mask = buffer, sympy.sympify(index), dtype, mask
        self.buffer_dtype = buffer_dtype
        self.indirect = tuple(indirect)

    def with_mask(self, mask: KExpr | None, indirect: tuple | None = None) -> Load:
        """This read with another ``mask`` (and, when given, other ``indirect`` bindings)."""
        return Load(
            self.buffer,
            self.index,
            self.dtype,
            mask,
            self.indirect if indirect is None else indirect,
            buffer_dtype=self.buffer_dtype,
        )

    def __repr__(self) -> str:
        return f"Load({self.buffer}[{self.index}]:{self.dtype})"


class Const(KExpr):
    """A Python scalar (bool, int or float; inf and nan included)."""

    __slots__ = ("value",)

    def __init__(self, value: Any, dtype: torch.dtype) -> None:
        self.value, self.dtype = value, dtype

    def __repr__(self) -> str:
        return f"Const({self.value}:{self.dtype})"


class IndexValue(KExpr):
    """An integer computed from index symbols and sizes (``arange``, a SymInt scalar...).

    ``indirect`` binds symbols of ``expr`` to int64 KExprs, as for ``Load``.
    """

    __slots__ = ("expr", "indirect")

    def __init__(self, expr: sympy.Expr, dtype: torch.dtype = torch.int64, indirect: tuple = ()) -> None:
        self.expr, self.dtype = sympy.sympify(expr), dtype
        self.indirect = tuple(indirect)


class Op(KExpr):
    """Apply the named op (a key of ``codegen.ops_table.OPS``) to ``args``."""

    __slots__ = ("op", "args", "round_trip")

    def __init__(self, op: str, args: Sequence[KExpr], dtype: torch.dtype, round_trip: bool = False) -> None:
        self.op, self.args, self.dtype, self.round_trip = op, tuple(args), dtype, round_trip

    def __repr__(self) -> str:
        return f"{self.op}({', '.join(map(repr, self.args))}):{self.dtype}"


def mark_rounding(x: KExpr) -> KExpr:
    """``x`` made a rounding point where it narrows to fp16/bf16, as eager rounds every fp16/bf16 result
    (``emulate_eager_precision``; ``contract.rounding_points`` applies it to every lowering's results): an
    implicit narrowing cast is kept by a later widening (``Op.round_trip``), a constant holds its rounded value."""
    if x.dtype not in LOW_PRECISION:
        return x
    if isinstance(x, Op) and x.op == "to" and not x.round_trip and _narrows(x.args[0].dtype, x.dtype):
        return Op("to", x.args, x.dtype, round_trip=True)
    if isinstance(x, Const) and isinstance(x.value, (int, float)) and not isinstance(x.value, bool):
        rounded = round_scalar(x.value, x.dtype)
        if rounded == rounded and rounded != x.value:
            return Const(rounded, x.dtype)
    return x


def round_scalar(value: float, dtype: torch.dtype) -> float:
    """``value`` as eager stores it in fp16/bf16 (through fp32, nearest even), computed without tensors
    (lowerings run under a FakeTensor mode)."""
    with np.errstate(over="ignore"):
        f = np.float32(value)
    if dtype == torch.float16:
        with np.errstate(over="ignore"):
            return float(np.float16(f))
    if f != f:
        return float(f)
    u = int(f.view(np.uint32))
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return float(np.uint32(u).view(np.float32))


def _narrows(src: torch.dtype, dst: torch.dtype) -> bool:
    """A float -> float conversion that may lose precision."""
    return (
        src.is_floating_point
        and dst.is_floating_point
        and src != dst
        and torch.finfo(src).bits >= torch.finfo(dst).bits
    )


def cast(x: KExpr, dtype: torch.dtype, *, explicit: bool = False) -> KExpr:
    """Convert ``x`` to ``dtype``.

    An *implicit* cast (an op's result stored back in its ATen dtype) that is immediately widened again
    is elided, so fused kernels keep fp32 intermediates. ``explicit`` casts (the program's own
    ``.to()``) are kept. ``emulate_eager_precision`` keeps every narrowing result (see ``Op.round_trip``,
    ``mark_rounding``).
    """
    if x.dtype == dtype:
        return x
    if isinstance(x, Op) and x.op == "to" and x.args[0].dtype == dtype:
        if not x.round_trip:  # widen(narrow(v)) -> v, when the narrowing was implicit
            return x.args[0]
        if dtype == torch.float32 and x.dtype in ROUNDING_OPS:
            # a real rounding point: compilers fold fp32->bf16->fp32 conversions, so round with integer ops
            return Op(ROUNDING_OPS[x.dtype], (x.args[0],), torch.float32)
    if isinstance(x, Const):
        return Const(_convert_scalar(x.value, dtype), dtype)
    return Op("to", (x,), dtype, round_trip=explicit)


def _convert_scalar(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return value
    return int(value)


#: ops whose result is one of their operands' values (or its negation / magnitude): no arithmetic rounding
SELECTING_OPS = frozenset({"neg", "abs", "relu", "maximum", "minimum", "clamp_min", "clamp_max"})


def holds_exactly(expr: KExpr, dtype: torch.dtype) -> bool:
    """Whether every value ``expr`` takes is representable in ``dtype`` by construction, so storing it in
    ``dtype`` loses nothing: reads of ``dtype`` buffers, constants ``dtype`` holds, casts to ``dtype`` or wider
    float types, and ops that only select, negate or take the magnitude of such values (``where``'s branches,
    whatever its condition; ``SELECTING_OPS``). ``dtype`` is fp16 or bf16; any other op answers no (a sum of
    bf16 values needs more bits than bf16 has)."""
    memo: dict[int, bool] = {}

    def exact(x: KExpr) -> bool:
        done = memo.get(id(x))
        if done is None:
            done = memo[id(x)] = _holds(x)
        return done

    def _holds(x: KExpr) -> bool:
        if isinstance(x, Load):
            return x.buffer_dtype == dtype and x.dtype == dtype
        if isinstance(x, Const):
            v = x.value
            if isinstance(v, bool) or v != v:
                return True
            return isinstance(v, (int, float)) and round_scalar(v, dtype) == v
        if not isinstance(x, Op):
            return False
        if x.op == "to":
            wide = x.dtype == dtype or x.dtype in (torch.float32, torch.float64)
            return wide and exact(x.args[0])
        if x.op == "where":
            return exact(x.args[1]) and exact(x.args[2])
        return x.op in SELECTING_OPS and all(exact(a) for a in x.args)

    return exact(expr)


def walk(expr: KExpr):
    """Yield every node of the DAG once (pre-order, deterministic)."""
    seen: set[int] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if isinstance(node, Op):
            stack.extend(reversed(node.args))
        elif isinstance(node, Load):
            if node.mask is not None:
                stack.append(node.mask)
            stack.extend(e for _, e in reversed(node.indirect))
        elif isinstance(node, IndexValue):
            stack.extend(e for _, e in reversed(node.indirect))


def address_steps(
    index: sympy.Expr, a: sympy.Symbol, b: sympy.Symbol, point: dict | None = None
) -> tuple[int | None, int | None]:
    """Address steps of ``index`` when ``a`` grows by one and when ``b`` does, evaluated at a sample point:
    ``a`` = 3, ``b`` = 5, the symbols of ``point`` as given, every other symbol (a size) a large sample value.
    Evaluating sees through the floor divisions and modulos of views (``(768*r + x) // 768 % 197``), which
    ``coeff`` cannot. (None, None) where the index does not evaluate to a number."""
    point = dict(point or {})
    others = sorted(
        (s for s in index.free_symbols if s not in (a, b) and s not in point), key=lambda s: s.name
    )
    point.update({s: 1024 + 16 * i for i, s in enumerate(others)})
    point[a], point[b] = 3, 5

    values = {k: sympy.Integer(v) for k, v in point.items()}

    def at(da: int = 0, db: int = 0) -> int | None:
        # every symbol at once (``subs`` replaces one at a time: each view function in between is rebuilt with
        # symbolic arguments, and torch's ModularIndexing then calls ``sympy.simplify``)
        v = index.xreplace({**values, a: values[a] + da, b: values[b] + db})
        return int(v) if v.is_number else None

    base, step_a, step_b = at(), at(da=1), at(db=1)
    if base is None or step_a is None or step_b is None:
        return None, None
    return step_a - base, step_b - base


def loads(expr: KExpr) -> list[Load]:
    """All loads in the DAG, in a deterministic order."""
    return [n for n in walk(expr) if isinstance(n, Load)]


def free_symbols(expr: KExpr) -> list[sympy.Symbol]:
    """Sorted symbols appearing in load indices and index values, without the indirect ones (those stand
    for loaded values; the sizes that scale them, ``s1`` of ``s1 * i0``, are kept)."""
    syms: dict[str, sympy.Symbol] = {}
    for n in walk(expr):
        if isinstance(n, Load):
            e = n.index
        elif isinstance(n, IndexValue):
            e = n.expr
        else:
            continue
        bound = {s for s, _ in n.indirect}
        for s in e.free_symbols - bound:
            syms[s.name] = s
    return [syms[k] for k in sorted(syms)]


def bind_indirect(expr: KExpr, bindings: Sequence[tuple]) -> KExpr:
    """Attach ``bindings`` (symbol, KExpr) to every Load/IndexValue of ``expr`` whose index uses the symbol."""
    syms = {s for s, _ in bindings}
    memo: dict[int, KExpr] = {}

    def visit(e: KExpr) -> KExpr:
        if id(e) in memo:
            return memo[id(e)]
        r = e
        if isinstance(e, Load):
            used = tuple(b for b in bindings if b[0] in e.index.free_symbols)
            mask = visit(e.mask) if e.mask is not None else None
            inner = visit_bound(e.indirect)  # a gather of a gather: the inner index reads the outer symbol
            if used or mask is not e.mask or inner is not e.indirect:
                r = e.with_mask(mask, inner + used)
        elif isinstance(e, IndexValue):
            used = tuple(b for b in bindings if b[0] in e.expr.free_symbols)
            inner = visit_bound(e.indirect)
            if used or inner is not e.indirect:
                r = IndexValue(e.expr, e.dtype, inner + used)
        elif isinstance(e, Op):
            args = [visit(a) for a in e.args]
            if any(a is not b for a, b in zip(args, e.args)):
                r = Op(e.op, args, e.dtype, e.round_trip)
        memo[id(e)] = r
        return r

    def visit_bound(pairs: tuple) -> tuple:
        new = tuple((sym, visit(v)) for sym, v in pairs)
        return pairs if all(a[1] is b[1] for a, b in zip(pairs, new)) else new

    return visit(expr) if syms else expr


def kexpr_equal(a: KExpr, b: KExpr, memo: dict | None = None) -> bool:
    """Structural equality of two kernel expressions (same ops, loads, constants and dtypes)."""
    memo = {} if memo is None else memo
    key = (id(a), id(b))
    if a is b or key in memo:
        return True
    if type(a) is not type(b) or a.dtype != b.dtype:
        return False
    if isinstance(a, Load) and isinstance(b, Load):
        ok = (
            a.buffer == b.buffer
            and a.index == b.index
            and not a.indirect
            and not b.indirect
            and (
                a.mask is None
                and b.mask is None
                or a.mask is not None
                and b.mask is not None
                and kexpr_equal(a.mask, b.mask, memo)
            )
        )
    elif isinstance(a, Const) and isinstance(b, Const):
        ok = repr(a.value) == repr(b.value)
    elif isinstance(a, IndexValue) and isinstance(b, IndexValue):
        ok = a.expr == b.expr and not a.indirect and not b.indirect
    elif isinstance(a, Op) and isinstance(b, Op):
        ok = (
            a.op == b.op
            and a.round_trip == b.round_trip
            and len(a.args) == len(b.args)
            and all(kexpr_equal(x, y, memo) for x, y in zip(a.args, b.args))
        )
    else:
        ok = False
    if ok:
        memo[key] = True
    return ok


#: comparisons and logic on constants, folded when rendered (Triton's interpreter mis-types 0-d comparisons
#: of int64 constants: combined into a load mask they fail with "mask has unsupported dtype")
_FOLDABLE: dict[str, Callable[..., Any]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "logical_and": lambda a, b: bool(a) and bool(b),
    "logical_or": lambda a, b: bool(a) or bool(b),
    "logical_not": lambda a: not a,
}


def fold_condition(e: Op) -> bool | None:
    """The value of a comparison or logical op whose operands are constants (recursively), else None."""
    fn = _FOLDABLE.get(e.op)
    if fn is None and e.op in ("bitwise_and", "bitwise_or") and e.dtype == torch.bool:
        fn = _FOLDABLE["logical_and" if e.op == "bitwise_and" else "logical_or"]
    if fn is None:
        return None
    vals = []
    for a in e.args:
        if isinstance(a, Const) and not isinstance(a.value, (list, tuple)):
            vals.append(a.value)
        elif isinstance(a, IndexValue) and a.expr.is_number and not a.indirect:
            vals.append(int(a.expr))
        elif isinstance(a, Op) and (v := fold_condition(a)) is not None:
            vals.append(v)
        else:
            return None
    return bool(fn(*vals))
