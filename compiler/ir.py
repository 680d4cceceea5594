"""kiln's IR: buffers (storage), layouts (strided views of storage) and values (what a lowering returns).

Terms:
- *Buffer*: one allocation (a graph input, a fused-kernel output, or an ATen fallback's output).
- *Layout*: sizes, strides and offset (in elements) of a view into a buffer; sympy expressions.
- *Strided* value: a view of a realized buffer (views of it cost nothing: no kernel, no copy).
- *Lazy* value: an element function ``index -> KExpr`` not yet stored anywhere (fused into its users).
- *ComputedBuffer*: a Lazy value or a reduction that a kernel stores, defined by ``Pointwise``/``Reduction``,
  a ``Scatter`` (writes at positions loaded from index tensors, into a copy of its target) or a ``Scan``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import TypeAlias

import sympy
import torch

from .kexpr import KExpr, Load

Expr: TypeAlias = sympy.Expr
Index = Sequence[Expr]


def sym(x) -> Expr:
    """A size/stride (int, SymInt, a lowered SymScalar or sympy expr) as a sympy expression."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x.node.expr
    if isinstance(x, SymScalar):  # a symbolic op argument after lowering (slice start, select index)
        return x.expr
    return sympy.sympify(x)


def prod(xs: Sequence[Expr]) -> Expr:
    return functools.reduce(operator.mul, xs, sympy.Integer(1))


def contiguous_strides(size: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    acc: Expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def is_one(e: Expr) -> bool:
    return e == 1


@functools.lru_cache(maxsize=16384)
def _layout_index(layout: Layout, idx: tuple[Expr, ...]) -> Expr:
    out = layout.offset
    for i, st, sz in zip(idx, layout.stride, layout.size):
        if not is_one(sz):
            out = out + i * st
    return out


def difference(a: Expr, b: Expr) -> Expr:
    """``a - b`` simplified as far as ``sympy.simplify`` would decide it: sympy's automatic evaluation and
    ``expand`` first (a polynomial in the sizes, what strides and offsets are, is zero exactly when its
    expansion is), ``sympy.simplify`` only for what they leave with functions or fractions (floor divisions,
    modulos). ``sympy.simplify`` is slow, and its first call imports sympy's physics and tensor packages
    (0.1-0.6 s of a cold compile)."""
    d = sympy.sympify(a - b)
    if d.is_Number:
        return d
    e = sympy.expand(d)
    if e.is_Number or e.is_polynomial(*e.free_symbols):
        return e
    return sympy.simplify(d)


def same(a: Expr, b: Expr) -> bool:
    """Whether sizes or strides ``a`` and ``b`` are provably equal (``difference`` is zero)."""
    return difference(a, b) == 0


@dataclasses.dataclass(frozen=True)
class Layout:
    """A strided view: element ``idx`` lives at ``offset + sum(idx[i] * stride[i])``."""

    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr
    dtype: torch.dtype
    device: torch.device

    def index(self, idx: Index) -> Expr:
        """The flat offset of element ``idx`` (size-1 dims left out). Cached: lowering and the scheduler ask for
        the same element of the same layout many times (each try of a buffer in a kernel group rebuilds its
        loads), and each answer is a few sympy additions and products."""
        return _layout_index(self, tuple(idx))

    @property
    def numel(self) -> Expr:
        return prod(self.size)

    def is_contiguous(self) -> bool:
        return all(
            is_one(sz) or same(a, b)
            for sz, a, b in zip(self.size, self.stride, contiguous_strides(self.size))
        )

    def storage_extent(self) -> Expr:
        """Elements a buffer must hold to back this layout (for allocation)."""
        return (
            self.offset + 1 + sum(((sz - 1) * st for sz, st in zip(self.size, self.stride)), sympy.Integer(0))
        )


def layout_from_meta(val: torch.Tensor, base_offset: Expr = sympy.Integer(0)) -> Layout:
    """Layout of a FakeTensor (size/stride/storage_offset), offset made relative to ``base_offset``."""
    return Layout(
        size=tuple(sym(s) for s in val.size()),
        stride=tuple(sym(s) for s in val.stride()),
        offset=sym(val.storage_offset()) - base_offset,
        dtype=val.dtype,
        device=val.device,
    )


def is_dense(layout: Layout) -> bool:
    """Non-overlapping and dense: strides are a permutation of contiguous strides (sizes 1 ignored)."""
    order = stride_order(layout)
    return order is not None and _dense_in_order(layout, order)


def stride_order(layout: Layout) -> list[int] | None:
    """Dims sorted from largest to smallest stride, or None if symbolic strides cannot be ordered."""
    idx = list(range(len(layout.size)))

    def key(i: int):
        return layout.stride[i]

    def by_stride(a: int, b: int) -> int:
        return _cmp(key(b), key(a))

    try:
        return sorted(idx, key=functools.cmp_to_key(by_stride))
    except TypeError:
        return None


def _cmp(a: Expr, b: Expr) -> int:
    d = difference(a, b)
    if d == 0:
        return 0
    if d.is_positive:
        return 1
    if d.is_negative:
        return -1
    # symbols are positive sizes: compare at the traced sizes (hints), else at a few large samples
    syms = sorted(d.free_symbols, key=lambda s: s.name)
    hints = size_hints()
    samples = [
        {s: hints[s] for s in syms if s in hints},
        {s: 1000 + i for i, s in enumerate(syms)},
        {s: 1000 for s in syms},
        {s: 1000 + 7 * (len(syms) - i) for i, s in enumerate(syms)},
    ]
    for subs in samples:
        if len(subs) != len(syms):
            continue
        try:
            v = d.xreplace({s: sympy.Integer(n) for s, n in subs.items()})  # every symbol at once
        except ZeroDivisionError:  # e.g. s1 // s2 with s1 < s2 in the sample, then divided by
            continue
        if v.is_number and v.is_finite is not False:
            return 1 if v > 0 else (-1 if v < 0 else 0)
    raise TypeError("cannot order strides")


def size_hints() -> dict:
    """Symbol -> the size it had in the example inputs (from the ShapeEnv being compiled), if any."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
    if env is None:
        return {}
    hints = getattr(env, "backed_var_to_val", None)  # newer torch; older ones call it var_to_val
    return dict(hints if hints is not None else env.var_to_val)


def _dense_in_order(layout: Layout, order: list[int]) -> bool:
    expected: Expr = sympy.Integer(1)
    for i in reversed(order):
        if is_one(layout.size[i]):
            continue
        if not same(layout.stride[i], expected):
            return False
        expected = expected * layout.size[i]
    return True


# --------------------------------------------------------------------------------------------- buffers
class Buffer:
    """One allocation. ``layout`` describes the whole allocation as the producer writes it.

    ``base_offset``: the storage offset of the tensor the buffer stands for (an input's ``storage_offset()``,
    0 for what kiln allocates); layout offsets of views are relative to it.
    """

    def __init__(self, name: str, layout: Layout, base_offset: Expr = sympy.Integer(0)) -> None:
        self.name = name
        self.layout = layout
        self.base_offset = base_offset

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def device(self) -> torch.device:
        return self.layout.device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class InputBuffer(Buffer):
    """A graph input (placeholder). Loads are relative to the tensor's own data pointer."""


class ComputedBuffer(Buffer):
    """A buffer that a generated kernel writes. ``definition`` is a ``Pointwise`` or ``Reduction``."""

    def __init__(
        self, name: str, layout: Layout, definition: Pointwise | Reduction | Scatter | Scan, origin: str = ""
    ) -> None:
        super().__init__(name, layout)
        self.definition = definition
        self.origin = origin  # FX node name it came from, for readable kernel names and reports
        #: the scheduler's caches of the definition's element expression and the buffers it reads
        #: (``forget_body()`` when the definition is replaced)
        self.body_expr: KExpr | None = None
        self.body_reads: list[str] | None = None

    def forget_body(self) -> None:
        self.body_expr = self.body_reads = None


class ExternBuffer(Buffer):
    """A buffer produced by an ATen call in the wrapper (extern kernel or fallback)."""


class EmptyBuffer(Buffer):
    """``torch.empty_strided`` with no writer in the graph (``aten.empty*``)."""


@dataclasses.dataclass
class Pointwise:
    """``body(index)`` gives the element at ``index`` (over ``ranges``)."""

    ranges: tuple[Expr, ...]
    body: Callable[[Index], KExpr]
    dtype: torch.dtype


#: reduction types and their identity for floats; ints use the dtype's limits
REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclasses.dataclass
class Reduction:
    """Reduce ``body(index, rindex)`` over ``reduction_ranges`` for every ``index`` in ``ranges``.

    ``dtype`` is the result dtype; ``src_dtype`` the dtype values accumulate in.
    For argmax/argmin the result is the flat position within the reduced dims (int64).
    """

    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    body: Callable[[Index, Index], KExpr]
    reduction_type: str
    dtype: torch.dtype
    src_dtype: torch.dtype
    #: set on the first stage of a split column reduction: what its partial sums reduce (see ColumnSource)
    column: ColumnSource | None = None


#: how a ``Scatter`` combines a value into its target element: atomics, or a plain store
SCATTER_OPS = ("add", "max", "min", "store")


@dataclasses.dataclass
class Scatter:
    """Write ``body(index)`` into the buffer named ``target`` for every ``index`` over ``ranges``.

    ``body`` returns ``Op("scatter", (offset, value, valid))``: the flat element offset in ``target`` (int64,
    usually computed from loaded indices), the value (``dtype``) and whether to write it (bool). ``reduce``
    (one of ``SCATTER_OPS``) combines it with what the element holds: ``add``/``max``/``min`` as atomics (the
    order of floating-point sums is not fixed; ``ordered``: a float ``add`` summed in a fixed order), ``store`` a plain store (duplicates: any one wins).
    The scattered buffer *is* ``target``'s memory after the writes (the wrapper gives both one allocation):
    the lowering makes ``target`` a fresh buffer (a copy, a fill) that nothing else reads, and the scheduler
    gives the scatter a kernel of its own, so every read of the result comes after all the writes.
    """

    ranges: tuple[Expr, ...]
    target: str
    body: Callable[[Index], KExpr]
    reduce: str
    dtype: torch.dtype
    #: an ``add`` whose sums run in a fixed order (no atomics; see ``codegen/scatter_kernel.py``)
    ordered: bool = False


#: scan types of ``Scan`` (inclusive prefix combinations)
SCAN_TYPES = ("sum", "prod", "logsumexp")


@dataclasses.dataclass
class Scan:
    """Inclusive scan (``cumsum``, ``cumprod``, ``logcumsumexp``) of ``body(index, rindex)`` along the one dim of
    ``reduction_ranges`` for every ``index`` over ``ranges``, combined in ``src_dtype``, stored as ``dtype``.
    ``dim`` is where the scanned dim sits in the result's dims (the others are ``ranges`` in order)."""

    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    body: Callable[[Index, Index], KExpr]
    scan_type: str
    dtype: torch.dtype
    src_dtype: torch.dtype
    dim: int

    def full_index(self, index: Index, rindex: Index) -> list[Expr]:
        """The result's index of element ``rindex`` of row ``index``."""
        return list(index[: self.dim]) + list(rindex) + list(index[self.dim :])


@dataclasses.dataclass
class ColumnSource:
    """The column reduction behind a split's partial results: ``body(col_index, row_index)`` summed over
    ``rows`` for every column in ``cols``. The scheduler may recompute the partials inside a row kernel over
    the same (rows x cols) space (see ``scheduler.Scheduler.mix_column_partials``)."""

    body: Callable[[Index, Index], KExpr]
    cols: tuple[Expr, ...]
    rows: tuple[Expr, ...]


# --------------------------------------------------------------------------------------------- values
class Value:
    """What a lowering returns for a tensor: ``size``, ``dtype``, ``device`` and ``load(index)``."""

    size: tuple[Expr, ...]
    dtype: torch.dtype
    device: torch.device
    #: rough count of ops an element of this value inlines into its users (0: a realized buffer, read as is)
    cost: int = 0

    def load(self, index: Index) -> KExpr:
        raise NotImplementedError


class Strided(Value):
    """A view of a realized buffer."""

    def __init__(self, buffer: Buffer, layout: Layout) -> None:
        self.buffer = buffer
        self.layout = layout
        self.size, self.dtype, self.device = layout.size, layout.dtype, layout.device

    def load(self, index: Index) -> KExpr:
        return Load(self.buffer.name, self.layout.index(index), self.dtype, buffer_dtype=self.buffer.dtype)

    def is_whole_buffer(self) -> bool:
        return self.layout == self.buffer.layout

    def __repr__(self) -> str:
        return f"Strided({self.buffer.name}, size={self.size}, stride={self.layout.stride})"


class Lazy(Value):
    """An unrealized pointwise value.

    ``widens``: the fp16/bf16 value this one is a float upcast of (``x.float()``), when it is one. Realization
    may store that narrower value instead and upcast on every read (``GraphLowering._maybe_realize``).
    """

    def __init__(
        self,
        size: Sequence[Expr],
        dtype: torch.dtype,
        device: torch.device,
        fn: Callable[[Index], KExpr],
        cost: int = 1,
        widens: Lazy | None = None,
    ) -> None:
        self.size = tuple(size)
        self.dtype = dtype
        self.device = device
        self.fn = fn
        self.cost = cost  # rough count of ops inlined, to bound recomputation
        self.widens = widens

    def load(self, index: Index) -> KExpr:
        return self.fn(index)

    def __repr__(self) -> str:
        return f"Lazy(size={self.size}, dtype={self.dtype})"


class SymScalar:
    """A SymInt/SymFloat/SymBool value in the graph (``expr`` over size symbols)."""

    def __init__(self, expr: Expr, py_type: type) -> None:
        self.expr = expr
        # the Python type the value has at run time (SymFloat -> float, SymInt -> int, SymBool -> bool)
        sym_types: dict[type, type] = {torch.SymFloat: float, torch.SymInt: int, torch.SymBool: bool}
        self.py_type = sym_types.get(py_type, py_type)

    def __repr__(self) -> str:
        return f"SymScalar({self.expr})"


class Opaque:
    """A non-tensor result of a fallback (e.g. a list) passed around unchanged."""

    def __init__(self, fx_name: str) -> None:
        self.fx_name = fx_name
