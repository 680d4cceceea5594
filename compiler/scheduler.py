"""Scheduler: groups ComputedBuffers into kernels (fusion) and decides what each kernel stores.

Terms:
- A *group* iterates over ``xnumel`` rows times ``rnumel`` reduced elements (``rnumel == 1`` and no
  reduction: a pointwise kernel over ``xnumel`` elements).
- A member's *role*: ``"x"`` (one value per row: reductions and pointwise nodes over the rows) or ``"xr"``
  (a pointwise node over rows x reduced elements).
- A read of a buffer produced in the same group is *aligned* when it reads exactly the element the producer
  computes at the same (x, r) position; then the value stays in registers. Unaligned reads break fusion.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._sympy.functions import FloorDiv, ModularIndexing
from torch.utils._sympy.symbol import SymT, symbol_is_type

from . import config
from .blocks import cdiv, next_pow2
from .exc import InvariantError, require
from .graph import ExternCall, Program, Step, SubgraphCall
from .index_eval import Unevaluable, evaluate
from .ir import (
    Buffer,
    ComputedBuffer,
    Index,
    InputBuffer,
    Layout,
    Reduction,
    Scan,
    Scatter,
    Strided,
    SymScalar,
    contiguous_strides,
    is_dense,
    prod,
    stride_order,
)
from .kexpr import KExpr, free_symbols, loads

#: mixed row/column kernels: each program takes at least MIX_MIN_ROWS rows; how many programs (``mix_programs``):
#: MIX_PROGRAMS, MIX_NARROW_PROGRAMS for rows of at most MIX_NARROW_COLS columns, MIX_WIDE_PROGRAMS for rows of more
#: than MIX_WIDE_COLS (one row a step, 16 warps: H100 sweep, 16384 x 4096 bf16 norm backward, 256 programs beat 512
#: and 1024 by 10 to 35 us). H200 ``compiler.tools.mix_sweep``
#: with each kernel autotuned (device µs at 256 / 512 / 1024 programs; unmixed; Inductor): ResNet-50 BatchNorm
#: backwards 100352 x 256 83.6 / 79.7 / 77.3; 82.8; 81.5, 25088 x 512 50.2 / 46.4 / 40.5; 46.1; 48.8, 6272 x 1024
#: 31.0 / 25.3 / 22.8; 26.1; 26.6, 401408 x 64 71.3 / 70.5 / 70.6; 83.0; 83.9, 100352 x 64 22.8 / 22.9 / 24.9; 25.8;
#: 26.4; ViT-B LayerNorm backward 6304 x 768 19.6 (512) / 19.5 (1024); 26.8. Rows of 64 columns are sixteen to a
#: thousand-element step and finish in few steps at 512 programs; wider rows want every SM busy with several
#: programs (the partial rows they leave are summed by a small second kernel)
MIX_MIN_ROWS = 8
MIX_PROGRAMS = 1024
MIX_NARROW_COLS = 64
MIX_NARROW_PROGRAMS = 512
MIX_WIDE_COLS = 1024
MIX_WIDE_PROGRAMS = 256
#: a pointwise kernel becomes the row kernel of a mixed one only when its rows fill more than this share of
#: their power-of-two block: ViT-B/16's QKV gradient (6304 rows of 2304, a 4096 block) took 121 us mixed on
#: the H100, where a flat copy and a split column sum (Inductor's two kernels) take 28 us; its GELU backward with
#: the bias gradient (6304 x 3072, three quarters of a 4096 block) 58.1 us mixed (autotuned, H200), 50.2 unmixed
MIX_MIN_FILL = 0.75


def mix_programs(rows: int, cols: int) -> int:
    """Programs of a mixed row/column kernel over ``rows`` x ``cols`` (before rounding to whole chunks of at
    least ``MIX_MIN_ROWS`` rows, so that few rows get fewer): narrow and wide rows over fewer programs, the rest
    over ``MIX_PROGRAMS`` (``compiler.tools.mix_sweep`` measures each count). ``config.mix_programs`` overrides
    the rule when set."""
    fixed = config.settings().mix_programs
    if fixed:
        return fixed
    if cols <= MIX_NARROW_COLS:
        return MIX_NARROW_PROGRAMS
    return MIX_WIDE_PROGRAMS if cols > MIX_WIDE_COLS else MIX_PROGRAMS


def mix_grid(rows: int, cols: int) -> tuple[int, int]:
    """(rows per program, programs) of a mixed row/column kernel over ``rows`` x ``cols``: ``mix_programs``'s
    count rounded to whole chunks of at least ``MIX_MIN_ROWS`` rows."""
    chunk = max(MIX_MIN_ROWS, cdiv(rows, mix_programs(rows, cols)))
    return chunk, cdiv(rows, chunk)


XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two size expressions are equal for every value of their symbols (integers: compared as they are,
    the usual static case, without sympy's expansion)."""
    if a == b:
        return True
    if isinstance(a, (int, sympy.Integer)) and isinstance(b, (int, sympy.Integer)):
        return False
    return sympy.expand(a - b) == 0


#: largest static iteration domain (xnumel * rnumel) on which two index expressions are compared by evaluation
EVAL_LIMIT = 1 << 26
_EVAL_CHUNK = 1 << 16


def floors_only(e: sympy.Expr) -> sympy.Expr:
    """``e`` with every ``ModularIndexing(v, d, m)`` written as ``FloorDiv(v, d) - m * FloorDiv(v, d * m)``, the
    same integer for every ``v >= 0`` (index expressions are never negative). Views through reshapes split a
    flat index into digits and join them again (``128 * 40000 * (x // 128) + 40000 * ModularIndexing(x, 1, 128)``
    is ``40000 * x``), which sympy does not see through; as floors only, the digits cancel when expanded."""
    if not e.has(ModularIndexing):
        return e
    return e.replace(
        lambda n: isinstance(n, ModularIndexing),
        lambda n: FloorDiv(n.args[0], n.args[1]) - n.args[2] * FloorDiv(n.args[0], n.args[1] * n.args[2]),
    )


@functools.lru_cache(maxsize=4096)
def same_on_domain(a: sympy.Expr, b: sympy.Expr, xnumel: sympy.Expr, rnumel: sympy.Expr) -> bool:
    """``a == b`` for every (xindex, rindex) of a group: symbolically (also with ``floors_only``: any domain
    size), or, when sympy cannot tell and the sizes are static, by evaluating both over the whole domain (exact,
    not sampled, up to ``EVAL_LIMIT`` elements). Views through reshapes give
    nested FloorDiv/ModularIndexing forms of the same offset (a softmax epilogue realized as a bmm operand of
    another shape), which would otherwise keep fusible kernels apart."""
    if same(a, b):
        return True
    fa, fb = floors_only(a), floors_only(b)
    if (fa is not a or fb is not b) and same(
        fa, fb
    ):  # only when a digit was rewritten: else the same test again
        return True
    if not (a.free_symbols | b.free_symbols) <= {XINDEX, RINDEX}:
        return False
    if not (sympy.sympify(xnumel).is_Integer and sympy.sympify(rnumel).is_Integer):
        return False
    xs_n, rs_n = int(xnumel), int(rnumel)
    if xs_n * rs_n == 0 or xs_n * rs_n > EVAL_LIMIT:
        return False
    import numpy as np

    rows = max(1, _EVAL_CHUNK // max(rs_n, 1))
    r = np.arange(rs_n, dtype=np.int64)[None, :]
    for x0 in range(0, xs_n, rows):
        x = np.arange(x0, min(xs_n, x0 + rows), dtype=np.int64)[:, None]
        env = {XINDEX: x, RINDEX: r}
        try:  # the integer arithmetic the kernel itself computes
            va, vb = evaluate(a, env), evaluate(b, env)
        except Unevaluable:  # Max/Min (tl.maximum/tl.minimum), rationals: not evaluated here
            return False
        shape = (x.shape[0], rs_n)
        if not np.array_equal(np.broadcast_to(va, shape), np.broadcast_to(vb, shape)):
            return False
    return True


def decompose(
    var: sympy.Symbol, ranges: Sequence[sympy.Expr], numel_is_one: bool = False
) -> list[sympy.Expr]:
    """Row-major multi-index of the flat ``var`` over ``ranges``; size-1 dims read index 0. The scheduler asks
    for the same few (ranges, var) many times while it tries a buffer in each open group: cached."""
    return list(_decompose(var, tuple(ranges), numel_is_one))


@functools.lru_cache(maxsize=4096)
def _decompose(
    var: sympy.Symbol, ranges: tuple[sympy.Expr, ...], numel_is_one: bool
) -> tuple[sympy.Expr, ...]:
    if numel_is_one:
        return (sympy.Integer(0),) * len(ranges)
    if any(r == 0 for r in ranges):  # never iterated; keep ``var`` in the index so its loads stay masked
        return (var,) * len(ranges)
    out: list[sympy.Expr] = []
    inner = [prod(ranges[i + 1 :]) for i in range(len(ranges))]
    first = True
    for size, div in zip(ranges, inner):
        if size == 1:
            out.append(sympy.Integer(0))
        elif first:
            out.append(FloorDiv(var, div) if div != 1 else var)
            first = False
        else:
            out.append(ModularIndexing(var, div, size))
    return tuple(out)


@dataclasses.dataclass
class Member:
    """One ComputedBuffer inside a group, with the expression of its value at (xindex, rindex)."""

    buf: ComputedBuffer
    role: str  # "x" or "xr"
    value: KExpr  # element value (reductions: the value reduced at (x, r))
    store_index: sympy.Expr = None  # flat offset the element is stored at
    store: bool = False
    #: stored into a graph input's memory (the ``in_place`` pass): stored after every member's value is computed
    in_place: bool = False

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.buf.definition, Reduction)

    @property
    def reduction(self) -> Reduction:
        """The definition of a reduction member (one where ``is_reduction`` holds)."""
        d = self.buf.definition
        if not isinstance(d, Reduction):
            raise InvariantError(f"{self.buf.name} is not a reduction: {type(d).__name__}")
        return d

    @property
    def value_dtype(self) -> torch.dtype:
        """The dtype of the register value the member stores (a reduction's result, not what it reads)."""
        d = self.buf.definition
        if not isinstance(d, Reduction):
            return self.value.dtype
        return torch.int64 if d.reduction_type in ("argmax", "argmin") else d.src_dtype


@dataclasses.dataclass
class KernelGroup:
    """A set of members compiled into one Triton kernel."""

    xnumel: sympy.Expr
    rnumel: sympy.Expr
    members: list[Member]
    has_reduction: bool = False
    #: mixed row/column kernel (see Scheduler.mix_column_partials): per-column partial sums over each
    #: program's ``row_chunk`` rows, stored at [program, column]; ``programs`` fixes the grid
    partials: list[Member] = dataclasses.field(default_factory=list)
    row_chunk: int = 0
    programs: int = 0
    #: "" (fused pointwise/reduction members), "scatter" or "scan": one ``Scatter``/``Scan`` member alone in its
    #: kernel (a scatter's result is complete only when every program has finished its writes)
    kind: str = ""

    def member(self, name: str) -> Member | None:
        for m in self.members:
            if m.buf.name == name:
                return m
        return None

    @property
    def buffer_names(self) -> list[str]:
        return [m.buf.name for m in self.members]


Scheduled = KernelGroup | ExternCall | SubgraphCall


@dataclasses.dataclass
class Schedule:
    """The ``schedule`` pass's product: the program's work in launch order (``items``: kernel groups,
    extern and subgraph calls). The ``render`` pass reads it and makes the groups' kernels
    (``codegen.kernels.Kernels``)."""

    program: Program
    items: list[Scheduled]
    #: computed buffer -> the graph input its kernel stores it into (the ``in_place`` pass: no write-back copy)
    in_place: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def groups(self) -> list[KernelGroup]:
        return [it for it in self.items if isinstance(it, KernelGroup)]

    def extern_count(self) -> int:
        """Extern-kernel calls (``out=`` ATen such as ``mm.out``; not fallbacks, not copies)."""
        return sum(
            1 for it in self.items if isinstance(it, ExternCall) and it.reason is None and not it.transfer
        )

    def verify(self) -> None:
        """Structural invariants (``InvariantError`` names the first broken one):

        - items are kernel groups, extern or subgraph calls; groups have members, each a registered computed
          buffer with role "x" or "xr" (partial sums "col", always stored); a buffer is produced by one item;
        - what an item reads is produced by an earlier item (or the same group), or is an input, constant or
          empty; a group's member another item or the graph's outputs read is stored (values that stay in
          registers are read inside their group only);
        - a scatter or scan group holds its one ``Scatter``/``Scan`` member alone; a scatter's target (whose memory
          it writes in place) is stored by an earlier group and read by no item but the scatter.
        """
        where = f"schedule of {self.program.name}"
        buffers = self.program.buffers
        producer: dict[str, int] = {}
        stored: dict[str, bool] = {}  # group members -> stored?
        for k, item in enumerate(self.items):
            if isinstance(item, KernelGroup):
                require(bool(item.members), f"{where}: group {k} has no members")
                made = []
                for m, roles in [(m, ("x", "xr")) for m in item.members] + [
                    (p, ("col",)) for p in item.partials
                ]:
                    require(m.role in roles, f"{where}: group {k}: member {m.buf.name} has role {m.role!r}")
                    require(
                        m.store or m.role != "col",
                        f"{where}: group {k}: partial sums {m.buf.name} not stored",
                    )
                    require(
                        isinstance(m.buf, ComputedBuffer) and buffers.get(m.buf.name) is m.buf,
                        f"{where}: group {k}: member {m.buf.name} is not a registered computed buffer",
                    )
                    stored[m.buf.name] = m.store
                    made.append(m.buf.name)
                if item.kind:
                    want = Scatter if item.kind == "scatter" else Scan
                    require(
                        len(item.members) == 1 and isinstance(item.members[0].buf.definition, want),
                        f"{where}: {item.kind} group {k} holds {item.buffer_names}, not one {want.__name__}",
                    )
            elif isinstance(item, (ExternCall, SubgraphCall)):
                made = list(dict.fromkeys(_step_outputs(item)))  # an ``out=`` buffer is also the result
            else:
                raise InvariantError(f"{where}: item {k} is a {type(item).__name__}")
            for name in made:
                require(
                    name not in producer, f"{where}: {name} produced by items {producer.get(name)} and {k}"
                )
                producer[name] = k
        for k, item in enumerate(self.items):
            for name in scheduled_reads(item):
                j = producer.get(name)
                if j is None:
                    require(
                        name in buffers and not isinstance(buffers[name], ComputedBuffer),
                        f"{where}: item {k} reads {name}, which nothing computes",
                    )
                    continue
                require(j <= k, f"{where}: item {k} reads {name} before item {j} produces it")
                require(
                    j == k or stored.get(name, True),
                    f"{where}: item {k} reads {name}, which group {j} keeps in registers (not stored)",
                )
        targets = {
            m.buf.definition.target: k
            for k, g in enumerate(self.items)
            if isinstance(g, KernelGroup)
            for m in g.members
            if isinstance(m.buf.definition, Scatter)
        }
        for k, item in enumerate(self.items):
            for name in scheduled_reads(item):
                require(
                    targets.get(name, k) == k,
                    f"{where}: item {k} reads {name}, which the scatter of item "
                    f"{targets.get(name)} overwrites in place",
                )
        for name, k in targets.items():
            require(
                producer.get(name, k) < k,
                f"{where}: the target {name} of the scatter of item {k} is not made before it",
            )
        for name, target in self.in_place.items():
            require(
                stored.get(name, False) and isinstance(buffers.get(target), InputBuffer),
                f"{where}: {name} is stored into {target} in place, but is no stored member or that no input",
            )
        for v in _iter_values(self.program.outputs):
            if isinstance(v, Strided):
                name = v.buffer.name
                require(
                    name in producer or not isinstance(v.buffer, ComputedBuffer),
                    f"{where}: graph output {name} is computed by no item",
                )
                require(stored.get(name, True), f"{where}: graph output {name} is not stored")


def schedule(program: Program) -> Schedule:
    """The ``schedule`` pass: ``program``'s live steps fused into kernel groups, with extern and subgraph calls,
    in launch order."""
    return Scheduler(program).run()


class Scheduler:
    """Turns a Program's steps into a Schedule: KernelGroups and extern/subgraph calls in launch order."""

    def __init__(self, g: Program) -> None:
        self.g = g
        self.items: list = []  # KernelGroup | ExternCall | SubgraphCall, in launch order
        self.producer: dict[str, int] = {}  # buffer name -> index in items
        self.symbol_producer: dict[sympy.Symbol, int] = {}  # unbacked symbol (u0, zuf0) -> index in items

    # ------------------------------------------------------------------ reads
    @staticmethod
    def reads_of_step(step: Step) -> list[str]:
        if isinstance(step, ComputedBuffer):
            return _body_reads(step)
        names: list[str] = []
        for v in _iter_values((step.args, step.kwargs)):
            if isinstance(v, Strided):
                names.append(v.buffer.name)
        return names

    def _item_reads(self, item) -> list[str]:
        """Buffers a scheduled item reads: every member's reads for a group, else the step's own."""
        if isinstance(item, KernelGroup):
            return [n for m in item.members for n in _body_reads(m.buf)]
        return self.reads_of_step(item)

    def live_steps(self) -> list[Step]:
        """Dead-code elimination: drop ComputedBuffers nothing reads (outputs and side effects are roots)."""
        needed: set[str] = set()
        for v in _iter_values(self.g.outputs):
            if isinstance(v, Strided):
                needed.add(v.buffer.name)
        live: list[Step] = []
        for step in reversed(self.g.steps):
            if isinstance(step, ComputedBuffer) and step.name not in needed:
                continue
            live.append(step)
            needed.update(self.reads_of_step(step))
        live.reverse()
        return live

    # ------------------------------------------------------------------ fusion
    def run(self) -> Schedule:
        steps = self.live_steps()
        consumers: dict[str, list[object]] = {}
        for step in steps:
            for name in self.reads_of_step(step):
                consumers.setdefault(name, []).append(step)
        # write-backs into mutated inputs go last: fused kernels recompute values from the inputs' old contents
        # wherever they are placed, so no kernel may run after an input is overwritten
        write_backs = [s for s in steps if isinstance(s, ExternCall) and s.write_back]
        steps = [s for s in steps if not (isinstance(s, ExternCall) and s.write_back)]
        steps += write_backs
        for step in steps:
            if isinstance(step, ComputedBuffer):
                self._place(step)
            else:
                self.items.append(step)
                for b in _step_outputs(step):
                    self.producer[b] = len(self.items) - 1
                for sym in _unbacked_symbols(step.outputs):
                    self.symbol_producer.setdefault(sym, len(self.items) - 1)
        self.mix_column_partials()
        self._decide_stores(consumers)
        return Schedule(self.g, self.items)

    def _place(self, buf: ComputedBuffer) -> None:
        deps = [self.producer[n] for n in _body_reads(buf) if n in self.producer]
        # a value computed at run time (``x.sum().item()``, ``nonzero(x).shape[0]``) is known only after
        # the extern call that defines its symbol: never fuse the buffer into a group launched before it
        deps += [self.symbol_producer[s] for s in _body_symbols(buf) if s in self.symbol_producer]
        earliest = max(deps, default=-1)
        # try the most recent group first, never one that launches before a dependency
        for i in range(len(self.items) - 1, -1, -1):
            if i < earliest:
                break
            item = self.items[i]
            if isinstance(item, KernelGroup) and self._try_add(item, buf):
                self.producer[buf.name] = i
                return
            if i == earliest:
                break
        if self._join_producer_by_hoisting(buf, deps):
            return
        group = self._new_group(buf)
        self.items.append(group)
        self.producer[buf.name] = len(self.items) - 1

    def _join_producer_by_hoisting(self, buf: ComputedBuffer, deps: list[int]) -> bool:
        """Fuse ``buf`` into the group of one of its producers that launches before another of its
        dependencies, by moving those later dependencies to launch right before that producer's group. Only
        kernel groups move, only past kernel groups, and only when everything they read is computed before
        the producer's group. Without this, a pointwise update that reads a value computed early and one
        computed later (an optimizer's new moments and the step size it derives from the step count) becomes
        a kernel of its own, and the early value a store and a load of its whole size."""
        for p in sorted(set(deps), reverse=True):
            producer = self.items[p]
            later = sorted({d for d in deps if d > p})
            if not later or not isinstance(producer, KernelGroup) or producer.kind or producer.partials:
                continue
            if not all(isinstance(self.items[k], KernelGroup) for k in range(p + 1, later[-1] + 1)):
                continue  # never reorder kernels around extern calls or subgraphs
            if not all(self._hoistable(self.items[d], p) for d in later):
                continue
            if not self._try_add(producer, buf):
                continue
            moved = set(later)
            rest = [it for k, it in enumerate(self.items) if k not in moved]
            at = next(k for k, it in enumerate(rest) if it is producer)
            self.items = rest[:at] + [self.items[d] for d in later] + rest[at:]
            self._reindex()
            return True
        return False

    def _hoistable(self, group: KernelGroup, before: int) -> bool:
        """Whether ``group`` may launch before item ``before``: everything it reads from outside itself (buffers,
        values known at run time) is produced by earlier items."""
        if group.kind or group.partials:
            return False
        own = set(group.buffer_names)
        for m in group.members:
            if any(n not in own and self.producer.get(n, -1) >= before for n in _body_reads(m.buf)):
                return False
            if any(self.symbol_producer.get(s, -1) >= before for s in _body_symbols(m.buf)):
                return False
        return True

    def _new_group(self, buf: ComputedBuffer) -> KernelGroup:
        d = buf.definition
        if isinstance(d, Scatter):
            group = KernelGroup(prod(d.ranges), sympy.Integer(1), [], kind="scatter")
        elif isinstance(d, Scan):
            group = KernelGroup(prod(d.ranges), prod(d.reduction_ranges), [], has_reduction=True, kind="scan")
        elif isinstance(d, Reduction):
            group = KernelGroup(prod(d.ranges), prod(d.reduction_ranges), [], has_reduction=True)
        else:
            group = KernelGroup(prod(d.ranges), sympy.Integer(1), [])
        ok = self._try_add(group, buf)
        assert ok, f"a fresh group must accept {buf.name}"
        return group

    def _try_add(self, group: KernelGroup, buf: ComputedBuffer) -> bool:
        d = buf.definition
        if group.kind or isinstance(d, (Scatter, Scan)):  # alone in a kernel of their own
            if group.members:
                return False
            alone = self._member(group, buf)
            assert alone is not None, f"a scatter or scan always maps onto its own group: {buf.name}"
            group.members.append(alone)
            return True
        if isinstance(d, Reduction):
            X, R = prod(d.ranges), prod(d.reduction_ranges)
            if group.has_reduction:
                if not (same(X, group.xnumel) and same(R, group.rnumel)):
                    return False
                candidate = group
            else:
                # a pointwise group becomes a reduction group: its members must map onto (X, R)
                remapped = self._remapped(group, X, R)
                if remapped is None:
                    return False
                candidate = remapped
            member = self._member(candidate, buf)
        else:
            if not group.has_reduction and group.members and not same(prod(d.ranges), group.xnumel):
                return False
            candidate = group
            member = self._member(group, buf)
        if member is None or not self._aligned(candidate, member) or not _stages_agree(candidate, member):
            return False
        if candidate is not group:
            group.members = candidate.members
            group.xnumel, group.rnumel, group.has_reduction = candidate.xnumel, candidate.rnumel, True
        group.members.append(member)
        return True

    def _remapped(self, group: KernelGroup, X: sympy.Expr, R: sympy.Expr) -> KernelGroup | None:
        """A copy of ``group`` with every member mapped onto a reduction group over (X, R), or None."""
        candidate = KernelGroup(X, R, [], has_reduction=True)
        for m in group.members:
            mm = self._member(candidate, m.buf)
            if mm is None:
                return None
            candidate.members.append(mm)
        return candidate

    def _member(self, group: KernelGroup, buf: ComputedBuffer) -> Member | None:
        """Map ``buf`` onto the group's (xindex, rindex) space, or None if it does not fit."""
        d = buf.definition
        x_is_one = group.xnumel == 1
        if isinstance(d, Scatter):  # iterates over its sources; where it writes is in its value
            return Member(
                buf, "x", d.body(decompose(XINDEX, d.ranges, x_is_one)), sympy.Integer(0), store=True
            )
        if isinstance(d, Scan):
            idx, ridx = decompose(XINDEX, d.ranges, x_is_one), decompose(RINDEX, d.reduction_ranges)
            return Member(buf, "xr", d.body(idx, ridx), buf.layout.index(d.full_index(idx, ridx)), store=True)
        if isinstance(d, Reduction):
            idx = decompose(XINDEX, d.ranges, x_is_one)
            ridx = decompose(RINDEX, d.reduction_ranges)
            value = d.body(idx, ridx)
            return Member(buf, "x", value, buf.layout.index(idx))
        ranges = d.ranges
        order = _iteration_order(buf)
        iter_ranges = [ranges[i] for i in order]
        numel = prod(ranges)
        if not group.has_reduction or same(numel, group.xnumel):
            it = decompose(XINDEX, iter_ranges, x_is_one)
            role = "x"
        else:
            split = _split(iter_ranges, group.rnumel)
            if split is None or not same(prod(iter_ranges[:split]), group.xnumel):
                return None
            it = decompose(XINDEX, iter_ranges[:split], x_is_one) + decompose(RINDEX, iter_ranges[split:])
            role = "xr"
        idx = [None] * len(ranges)
        for pos, dim in enumerate(order):
            idx[dim] = it[pos]
        return Member(buf, role, d.body(idx), buf.layout.index(idx))

    def _aligned(self, group: KernelGroup, member: Member) -> bool:
        for ld in loads(member.value):
            prod_m = group.member(ld.buffer)
            if prod_m is None:
                continue
            if ld.mask is not None or ld.indirect or ld.dtype != prod_m.buf.dtype:
                return False
            if member.role == "x" and not member.is_reduction and prod_m.role == "xr":
                return False
            if not same_on_domain(ld.index, prod_m.store_index, group.xnumel, group.rnumel):
                return False
        return True

    # ------------------------------------------------------------------ mixed row/column kernels
    def mix_column_partials(self) -> None:
        """Compute the first stage of split column reductions inside the row kernel over the same rows.

        A norm backward reads (grad, x) in a row kernel (the input gradient) and again in a column kernel
        (the weight gradients, split into partial sums over chunks of rows). When every value the column
        stage reads is aligned with the row kernel's (x = row, r = column) space, each program of the row
        kernel takes ``row_chunk`` rows and also accumulates per-column partial sums in registers; the small
        second stage then sums the ``programs`` partial rows. Only static sizes whose rows fit one
        persistent block qualify; anything else keeps the two kernels.
        """
        j = 0
        while j < len(self.items):
            plan = self._mix_plan(j)
            if plan is None:
                j += 1
                continue
            self._apply_mix(j, *plan)

    def _mix_plan(self, j: int):
        """How to absorb group ``j`` (a split column reduction's first stage) into a row kernel, or None:
        (row kernel index, the row kernel as a rows x columns group, second-stage index, partial values,
        rows per program, programs)."""
        c1 = self.items[j]
        if not isinstance(c1, KernelGroup) or not c1.has_reduction or not c1.members or c1.kind:
            return None
        if not all(m.is_reduction for m in c1.members):
            return None
        sources = [m.reduction.column for m in c1.members if m.reduction.column is not None]
        if len(sources) != len(c1.members):
            return None
        # every source sums M rows of N columns; their shapes may differ (a bias gradient summed over the
        # flattened rows beside norm weight gradients summed over batch x sequence, a kept size-1 dim): each
        # is indexed through its own shape, flattened row-major onto the row kernel's (row, column) space
        M, N = prod(sources[0].rows), prod(sources[0].cols)
        if not (M.is_number and N.is_number) or int(N) > config.settings().persistent_rblock_max:
            return None
        if any(not (same(prod(cs.rows), M) and same(prod(cs.cols), N)) for cs in sources):
            return None
        M, N = int(M), int(N)
        if M < 2 * MIX_MIN_ROWS:
            return None
        names = set(c1.buffer_names)
        outputs = {v.buffer.name for v in _iter_values(self.g.outputs) if isinstance(v, Strided)}
        readers = [k for k, it in enumerate(self.items) if k != j and names & set(self._item_reads(it))]
        if names & outputs or len(readers) != 1 or not isinstance(self.items[readers[0]], KernelGroup):
            return None
        c2 = self.items[readers[0]]
        for m in c2.members:  # the second stage: reductions of one partial each, and row-wise epilogues
            reads = set(_body_reads(m.buf))
            if (
                m.role != "x"
                or (m.is_reduction and reads & names and len(reads) != 1)
                or (not m.is_reduction and reads & names)
            ):
                return None
        values = [cs.body(decompose(RINDEX, cs.cols), decompose(XINDEX, cs.rows)) for cs in sources]
        syms = set().union(*(_body_symbols(m.buf) for m in c1.members))
        k2 = readers[0]
        c2_names = set(c2.buffer_names)
        # the row kernel: the nearest one before, else after (then the second stage moves behind it)
        for i in list(range(j - 1, -1, -1)) + list(range(j + 1, len(self.items))):
            g = self._as_rows(self.items[i], M, N)
            if g is None:
                continue
            if any(self.symbol_producer.get(sy, -1) > i for sy in syms):
                return None
            if i > k2 and any(c2_names & set(self._item_reads(it)) for it in self.items[k2 + 1 : i + 1]):
                continue  # something up to the row kernel needs the second stage's result
            if all(self._mix_aligned(g, i, v) for v in values):
                return i, g, k2, values, *mix_grid(M, N)
        return None

    def _as_rows(self, item, M: int, N: int) -> KernelGroup | None:
        """``item`` as a group over M rows x N columns: a row reduction group as it is, a pointwise group over
        M*N elements remapped onto (rows, columns) (a copy; None when a member does not map or align, or when
        its rows would fill no more than ``MIX_MIN_FILL`` of their block)."""
        if not isinstance(item, KernelGroup) or item.partials or item.kind:
            return None
        if item.has_reduction:
            return item if same(item.xnumel, M) and same(item.rnumel, N) else None
        if not same(item.xnumel, M * N) or M * N == 0 or N <= MIX_MIN_FILL * next_pow2(N):
            return None
        rows = self._remapped(item, sympy.Integer(M), sympy.Integer(N))
        if rows is None or any(m.role != "xr" or not self._aligned(rows, m) for m in rows.members):
            return None
        return rows

    def _mix_aligned(self, g: KernelGroup, i: int, value: KExpr) -> bool:
        """Every load of ``value`` (in ``g``'s row x column space) is ready before ``g`` or aligned in it."""
        for ld in loads(value):
            prod_m = g.member(ld.buffer)
            if prod_m is None:
                if self.producer.get(ld.buffer, -1) >= i:
                    return False
                continue
            if ld.mask is not None or ld.indirect or ld.dtype != prod_m.buf.dtype:
                return False
            if not same(ld.index, prod_m.store_index):
                return False
        return True

    def _apply_mix(
        self, j: int, i: int, g: KernelGroup, k2: int, values: list[KExpr], chunk: int, programs: int
    ) -> None:
        self.items[i] = g  # a pointwise row kernel is replaced by its rows x columns form
        c1, c2 = self.items[j], self.items[k2]
        renamed: dict[str, Strided] = {}
        for m, v in zip(c1.members, values):
            cols = m.buf.definition.column.cols
            size = (sympy.Integer(programs),) + tuple(cols)
            lay = Layout(size, contiguous_strides(size), sympy.Integer(0), m.buf.dtype, m.buf.layout.device)
            part = ComputedBuffer(self.g.new_name(), lay, m.buf.definition, m.buf.origin)
            self.g.add_buffer(part)
            g.partials.append(Member(part, "col", v, store=True))
            renamed[m.buf.name] = Strided(part, lay)
        for m in c2.members:
            reads = _body_reads(m.buf)
            if m.is_reduction and reads and reads[0] in renamed:
                d = m.reduction
                m.buf.definition = Reduction(
                    d.ranges,
                    (sympy.Integer(programs),),
                    _partials_reader(renamed[reads[0]]),
                    d.reduction_type,
                    d.dtype,
                    d.src_dtype,
                )
                m.buf.forget_body()
        c2.rnumel = sympy.Integer(programs)
        c2.members = [self._member(c2, m.buf) for m in c2.members]
        g.row_chunk, g.programs = chunk, programs
        order = [it for it in self.items if it is not c1]
        if k2 < i:  # the second stage runs right after the row kernel that now computes its partials
            order.remove(c2)
            order.insert(order.index(g) + 1, c2)
        self.items = order
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild ``producer`` and ``symbol_producer`` after items were removed or moved."""
        self.producer = {}
        symbols: dict[sympy.Symbol, int] = {}
        for k, it in enumerate(self.items):
            names = (
                [m.buf.name for m in it.members + it.partials]
                if isinstance(it, KernelGroup)
                else _step_outputs(it)
            )
            for n in names:
                self.producer[n] = k
            if not isinstance(it, KernelGroup):
                for sym in _unbacked_symbols(it.outputs):
                    symbols.setdefault(sym, k)
        self.symbol_producer = symbols

    # ------------------------------------------------------------------ stores
    def _decide_stores(self, consumers: dict[str, list]) -> None:
        outputs = {v.buffer.name for v in _iter_values(self.g.outputs) if isinstance(v, Strided)}
        # buffers still computed by some group (a mixed kernel's partials replace the first stage it absorbed)
        scheduled = {n for it in self.items if isinstance(it, KernelGroup) for n in it.buffer_names}
        for item in self.items:
            if not isinstance(item, KernelGroup):
                continue
            names = set(item.buffer_names)
            for m in item.members:
                users = consumers.get(m.buf.name, [])
                outside = [
                    u
                    for u in users
                    if not (isinstance(u, ComputedBuffer) and (u.name in names or u.name not in scheduled))
                ]
                m.store = m.buf.name in outputs or bool(outside) or bool(item.kind)


# ------------------------------------------------------------------------------------------ helpers
def _column_stage(buf: ComputedBuffer) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(rows, columns) of the column sum ``buf`` is the first stage of (a split column reduction's partial
    sums, ``ir.ColumnSource``), else None."""
    d = buf.definition
    if not isinstance(d, Reduction) or d.column is None:
        return None
    return prod(d.column.rows), prod(d.column.cols)


def _stages_agree(group: KernelGroup, member: Member) -> bool:
    """Whether ``member`` may share ``group``'s kernel as far as split column sums go: the first stage of one
    shares a kernel only with first stages over the same rows x columns and with values per partial row (role
    x, no reduction). Its iteration space (chunks x columns, chunk rows) can equal a row kernel's or a pointwise
    kernel's by a coincidence of sizes (2048 x 1024 split in chunks of 1024 rows: 2 x 1024 = 2048 outputs of 1024);
    fused there it would read its rows transposed beside the row kernel's reads, and the mixing pass, which folds
    it into the row kernel properly, would no longer see it."""
    mine = _column_stage(member.buf)
    for m in group.members:
        theirs = _column_stage(m.buf)
        if mine is None and theirs is None:
            continue
        if mine is not None and theirs is not None:
            if not (same(mine[0], theirs[0]) and same(mine[1], theirs[1])):
                return False
            continue
        other = m if mine is not None else member  # the one of the two that is no first stage
        if other.role != "x" or other.is_reduction:
            return False
    return True


def _iteration_order(buf: ComputedBuffer) -> list[int]:
    """Dims outermost-first in memory order, so stores are coalesced (logical order when unsure)."""
    return list(_layout_order(buf.layout))


@functools.lru_cache(maxsize=4096)
def _layout_order(layout: Layout) -> tuple[int, ...]:
    if is_dense(layout):
        order = stride_order(layout)
        if order is not None:
            # keep size-1 dims in place relative to logical order; they do not affect addressing
            return tuple(order)
    return tuple(range(len(layout.size)))


def _split(ranges: Sequence[sympy.Expr], rnumel: sympy.Expr) -> int | None:
    """Index j such that prod(ranges[j:]) == rnumel, preferring the largest j (fewest reduced dims)."""
    for j in range(len(ranges), -1, -1):
        if same(prod(ranges[j:]), rnumel):
            return j
    return None


def _body(buf: ComputedBuffer) -> KExpr:
    """The buffer's element expression at symbolic indices (cached)."""
    if buf.body_expr is not None:
        return buf.body_expr
    d = buf.definition
    idx = [sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(len(d.ranges))]
    if isinstance(d, (Reduction, Scan)):
        ridx = [sympy.Symbol(f"r{k}", integer=True, nonnegative=True) for k in range(len(d.reduction_ranges))]
        expr = d.body(idx, ridx)
    else:
        expr = d.body(idx)
    buf.body_expr = expr
    return expr


def _partials_reader(src: Strided) -> Callable[[Index, Index], KExpr]:
    """The body of a second stage that reduces the per-program partials ``src``: element ``[ridx[0], *idx]``."""
    return lambda idx, ridx: src.load([ridx[0]] + list(idx))


def _body_reads(buf: ComputedBuffer) -> list[str]:
    if buf.body_reads is not None:
        return buf.body_reads
    names: list[str] = []
    for ld in loads(_body(buf)):
        if ld.buffer not in names:
            names.append(ld.buffer)
    if isinstance(buf.definition, Scatter) and buf.definition.target not in names:
        names.append(buf.definition.target)  # written in place: runs after the target is made
    buf.body_reads = names
    return names


def _body_symbols(buf: ComputedBuffer) -> set[sympy.Symbol]:
    """Size symbols a buffer's kernel needs: in its element expression, its ranges and its layout."""
    d = buf.definition
    reduced = d.reduction_ranges if isinstance(d, (Reduction, Scan)) else ()
    exprs = list(d.ranges) + list(reduced) + list(buf.layout.size)
    exprs += list(buf.layout.stride)
    out = set(free_symbols(_body(buf)))
    for e in exprs:
        out |= sympy.sympify(e).free_symbols
    return out


def _unbacked_symbols(outputs) -> set[sympy.Symbol]:
    """Data-dependent symbols an extern call defines: scalar results and sizes of its tensor results."""
    found: set[sympy.Symbol] = set()
    for o in pytree.tree_leaves(outputs):
        if isinstance(o, SymScalar):
            found |= o.expr.free_symbols
        elif isinstance(o, Buffer):
            for e in o.layout.size + o.layout.stride:
                found |= sympy.sympify(e).free_symbols
    return {s for s in found if symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))}


def scheduled_reads(item: Scheduled) -> list[str]:
    """Buffers a scheduled item reads, from what it computes: the loads of a group's members (and partial
    sums) in the group's index space, the tensor arguments of a call. Evaluates no definition."""
    names: dict[str, None] = {}
    if isinstance(item, KernelGroup):
        for m in item.members + item.partials:
            for ld in loads(m.value):
                names[ld.buffer] = None
            if isinstance(m.buf.definition, Scatter):
                names[m.buf.definition.target] = None
    else:
        for v in _iter_values((item.args, item.kwargs)):
            if isinstance(v, Strided):
                names[v.buffer.name] = None
    return list(names)


def _iter_values(obj):
    from .ir import Value

    return (o for o in pytree.tree_leaves(obj) if isinstance(o, Value))


def _step_outputs(step) -> list[str]:
    out = [o.name for o in pytree.tree_leaves(step.outputs) if isinstance(o, Buffer)]
    if isinstance(step, ExternCall) and step.out is not None:
        out.append(step.out.name)
    return out
