"""Render a KernelGroup to Triton source (IR -> text). No compiling or launching here.

Kernel shapes:
- pointwise: one program handles ``XBLOCK`` flat elements; values have shape ``[XBLOCK]``.
- reduction: one program handles ``XBLOCK`` rows; row values ``[XBLOCK, 1]``, row x reduced-element values
  ``[XBLOCK, RBLOCK]``. With ``PERSISTENT`` (a constexpr chosen at launch) the whole row is one block and
  every member is computed once; otherwise each *level* (members whose inputs are ready after the same
  number of finished reductions) runs its own loop over the row, recomputing cheap producers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import sympy
import torch

from ..blocks import tile_accumulators
from ..dtypes import tl_dtype
from ..exc import CodegenError
from ..index_simplify import simplify
from ..ir import Reduction
from ..kexpr import Const, IndexValue, KExpr, Load, Op, address_steps, fold_condition, kexpr_equal, loads
from ..scheduler import RINDEX, XINDEX, KernelGroup, Member
from .ops_table import HELPERS, cast, render_op
from .printer import pexpr, pfloat, raw_literal, typed_literal


# ------------------------------------------------------------------------------------------ emitter
class Scope:
    """A block of generated lines with CSE. ``shape`` is "x" ([XBLOCK, 1] or [XBLOCK]) or "xr"."""

    def __init__(
        self, renderer: KernelRenderer, shape: str, lines: list[str], indent: str, parent: Scope | None = None
    ) -> None:
        self.r, self.shape, self.lines, self.indent, self.parent = renderer, shape, lines, indent, parent
        self.cache: dict = {}
        self.members: dict[str, str] = {}  # member buffer -> var in this scope
        # expression node (by identity) -> (node, var) for the operations emitted in this scope: kernel
        # expressions are DAGs (an inlined producer read twice is one shared node), and walking them as trees
        # re-emits a shared subexpression once per path to it, which grows exponentially with depth
        self.emitted: dict[int, tuple[KExpr, str]] = {}

    def lookup(self, key) -> str | None:
        """The variable holding ``key``'s value in this scope or an enclosing one (CSE), or None."""
        s: Scope | None = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None

    def member_var(self, name: str) -> str | None:
        """The variable holding group member ``name``'s value in this scope or an enclosing one, or None."""
        s: Scope | None = self
        while s is not None:
            if name in s.members:
                return s.members[name]
            s = s.parent
        return None

    def line(self, text: str) -> None:
        self.lines.append(self.indent + text)

    def assign(self, key, code: str) -> str:
        found = self.lookup(key)
        if found is not None:
            return found
        var = self.r.new_var()
        self.line(f"{var} = {code}")
        self.cache[key] = var
        return var

    def emit(self, e: KExpr) -> str:
        """The variable holding ``e``'s value in this scope, emitting the lines that compute it."""
        if not isinstance(e, Op):
            return self._emit(e)
        done = self.emitted.get(id(e))
        if done is not None and done[0] is e:
            return done[1]
        var = self._emit(e)
        self.emitted[id(e)] = (e, var)
        return var

    def _emit(self, e: KExpr) -> str:
        if isinstance(e, Load):
            m = self.r.group.member(e.buffer)
            if m is not None:
                return self.r.member_value(self, m)
            return self._load(e)
        if isinstance(e, Const):
            return self.assign(("c", repr(e.value), e.dtype), typed_literal(e.value, e.dtype))
        if isinstance(e, IndexValue):
            if e.expr.is_number:
                return self.assign(("c", int(e.expr), e.dtype), typed_literal(int(e.expr), e.dtype))
            expr = e.expr
            if e.indirect:
                expr = expr.subs({s: sympy.Symbol(self.emit(v), integer=True) for s, v in e.indirect})
            self.r.note_symbols(expr)
            try:  # integer size arithmetic, else a SymFloat expression (``0.05 / s0``) in float64
                code = cast(f"({pexpr(expr)} + tl.zeros([], tl.int64))", torch.int64, e.dtype)
            except CodegenError:
                code = f"{pfloat(expr)}.to({tl_dtype(e.dtype)})"
            return self.assign(("i", str(expr), e.dtype), code)
        if isinstance(e, Op):
            folded = fold_condition(e)
            if folded is not None:  # e.g. a pad's bounds test at an index that is the constant 0
                return self.assign(("c", repr(folded), e.dtype), typed_literal(folded, e.dtype))
            args = [self.emit(a) for a in e.args]
            code = render_op(e.op, args, [a.dtype for a in e.args], e.dtype)
            self.r.note_helpers(code)
            return self.assign(("op", e.op, tuple(args), e.dtype), code)
        raise CodegenError(f"unknown kernel expression {e!r}")

    def _load(self, e: Load) -> str:
        ptr = self.r.in_ptr(e.buffer)
        index = e.index
        if e.indirect:
            subs = {s: sympy.Symbol(self.emit(v), integer=True) for s, v in e.indirect}
            index = index.subs(subs)
            mask: str | None = self.r.scope_mask(self.shape)
        else:
            mask = self.r.mask_for(index)
            index = self.r.simplified(index)
        # the loaded values' names (tmpN) are skipped; a size that scales one of them (the row stride of
        # ``s1 * tmp3``) stays, where substituting 0 for them dropped it
        self.r.note_symbols(index)
        idx = pexpr(index)
        if e.indirect and not ({XINDEX, RINDEX} & index.free_symbols):
            # every position comes from loaded values, which may all be scalars (a gather at a constant
            # index): give the pointer the block shape of its mask
            idx = f"tl.broadcast_to({idx}, {self.r.block_shape(self.shape)})"
        if e.mask is not None and not (e.indirect == () and not ({XINDEX, RINDEX} & index.free_symbols)):
            # a constant index is one real element, valid wherever the value is used: no mask needed
            extra = self.emit(e.mask)
            # a select, not ``mask & extra``: the interpreter types a block mask ``&`` a 0-d condition (a
            # bounds test at a constant index) as int32, which loads reject ("mask has unsupported dtype")
            mask = extra if mask is None else f"tl.where({extra}, {mask}, False)"
        code = f"tl.load({ptr} + {idx}" + (f", {mask}, other=0)" if mask else ")")
        if e.buffer_dtype != e.dtype:
            code += f".to({tl_dtype(e.dtype)}, bitcast=True)"
        return self.assign(("load", e.buffer, idx, mask, e.dtype), code)


@dataclasses.dataclass
class KernelSource:
    """What the renderer produces: source text and the launch signature."""

    name: str
    source: str
    ptr_args: list[tuple[str, str]]  # (kernel arg, buffer name), loads then stores
    size_args: list[sympy.Symbol]  # size symbols, passed after the pointers
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    reduction: bool
    stores: list[str]
    origins: list[str]
    hint: str = "inner"  # reductions: "inner" (rows contiguous in memory) or "outer" (columns)
    programs: int = 0  # a fixed grid (mixed row/column kernels); 0: ceil(xnumel / XBLOCK)


class KernelRenderer:
    def __init__(self, group: KernelGroup, index_dtype: str) -> None:
        self.group = group
        self.index_dtype = index_dtype
        self._var = 0
        self.ins: dict[str, str] = {}
        self.outs: dict[str, str] = {}
        self.symbols: dict[str, sympy.Symbol] = {}
        self.helpers: list[str] = []
        self.reduction = group.has_reduction
        self._online: dict[str, Member] = {}
        #: the block size name a pointwise value's block has (an ordered scatter's inner loop renders its body
        #: over a block of another size)
        self.xblock = "XBLOCK"

    # -------------------------------------------------------------- bookkeeping
    def new_var(self) -> str:
        v = f"tmp{self._var}"
        self._var += 1
        return v

    def in_ptr(self, name: str) -> str:
        if name not in self.ins:
            self.ins[name] = f"in_ptr{len(self.ins)}"
        return self.ins[name]

    def out_ptr(self, name: str) -> str:
        if name not in self.outs:
            self.outs[name] = f"out_ptr{len(self.outs)}"
        return self.outs[name]

    def note_symbols(self, e: sympy.Expr) -> None:
        for s in e.free_symbols:
            if s not in (XINDEX, RINDEX) and not s.name.startswith("tmp"):
                self.symbols[s.name] = s

    def simplified(self, index: sympy.Expr) -> sympy.Expr:
        """``index`` with the digits views split joined again over this kernel's static domain
        (``index_simplify``: ``128 * (xindex // 128) + xindex % 128`` is ``xindex``)."""
        bounds = {}
        for sym, n in ((XINDEX, self.group.xnumel), (RINDEX, self.group.rnumel)):
            if isinstance(n, (int, sympy.Integer)) and int(n) > 0:
                bounds[sym] = int(n) - 1
        out = simplify(index, bounds)
        # an index that no longer varies over a block (a single row) keeps its form: pointers stay blocks
        return (
            out if (out.free_symbols & {XINDEX, RINDEX}) == (index.free_symbols & {XINDEX, RINDEX}) else index
        )

    def note_helpers(self, code: str) -> None:
        for name in HELPERS:
            if name in code and name not in self.helpers:
                self.helpers.append(name)

    def block_shape(self, shape: str) -> str:
        """The block a value of scope ``shape`` ("x" or "xr") has in this kernel."""
        if not self.reduction:
            return f"[{self.xblock}]"
        return "[XBLOCK, RBLOCK]" if shape == "xr" else "[XBLOCK, 1]"

    def scope_mask(self, shape: str) -> str:
        if not self.reduction:
            return "xmask"
        return "xrmask" if shape == "xr" else "xmask"

    def mask_for(self, index: sympy.Expr) -> str | None:
        syms = index.free_symbols
        has_x, has_r = XINDEX in syms, RINDEX in syms
        if not self.reduction:
            return "xmask" if has_x else None
        if has_r:
            return "xrmask" if has_x else "rmask"
        return "xmask" if has_x else None

    def member_value(self, scope: Scope, m: Member) -> str:
        """The register value of group member ``m`` as seen from ``scope`` (computing it if needed)."""
        var = scope.member_var(m.buf.name)
        if var is not None:
            return var
        if m.is_reduction:
            raise CodegenError(f"{m.buf.name} read before its reduction finished (scheduling bug)")
        if m.role == "x":
            return self.compute_x_member(scope, m)
        var = scope.emit(m.value)
        scope.members[m.buf.name] = var
        return var

    def compute_x_member(self, scope: Scope, m: Member) -> str:
        xs = scope
        while xs.shape != "x":
            assert xs.parent is not None, "a row-and-reduction scope lies inside a row scope"
            xs = xs.parent
        var = xs.emit(m.value)
        xs.members[m.buf.name] = var
        return var

    # -------------------------------------------------------------- stores
    def store(self, scope: Scope, m: Member, var: str) -> None:
        ptr = self.out_ptr(m.buf.name)
        self.note_symbols(m.store_index)
        idx = pexpr(self.simplified(m.store_index))
        dtype = m.buf.dtype
        if self.reduction:
            shape = "[XBLOCK, RBLOCK]" if m.role == "xr" else "[XBLOCK, 1]"
            mask = "xrmask" if m.role == "xr" else "xmask"
        else:
            shape, mask = "[XBLOCK]", "xmask"
        if XINDEX not in m.store_index.free_symbols:  # one row (xnumel == 1): make the pointer a block too
            idx = f"{idx} + tl.zeros_like(xindex)"
        val = cast(f"tl.broadcast_to({var}, {shape})", m.value_dtype, dtype)
        scope.line(f"tl.store({ptr} + {idx}, {val}, {mask})")

    # -------------------------------------------------------------- block headers
    def program_block(self, scope: Scope, rows: bool) -> None:
        """This program's ``XBLOCK`` x indices and their mask; ``rows``: as a column (``[:, None]``) of a 2-D
        ``XBLOCK x RBLOCK`` tile, else a 1-D block."""
        scope.line(f"xoffset = tl.program_id(0).to({self.index_dtype}) * XBLOCK")
        scope.line(f"xindex = xoffset + tl.arange(0, XBLOCK){'[:, None]' if rows else ''}")
        scope.line("xmask = xindex < xnumel")

    @staticmethod
    def row_block(scope: Scope, start: str = "") -> None:
        """One ``RBLOCK`` step of the reduction dim (``start``: its offset expression plus ``+ ``, or nothing
        for the first and only step) and the tile's mask."""
        scope.line(f"rindex = {start}tl.arange(0, RBLOCK)[None, :]")
        scope.line("rmask = rindex < rnumel")
        scope.line("xrmask = xmask & rmask")

    # -------------------------------------------------------------- bodies
    def render_pointwise(self, lines: list[str]) -> None:
        s = Scope(self, "x", lines, "    ")
        self.program_block(s, rows=False)
        late = []  # stores into inputs (``Member.in_place``): after every load of the kernel
        for m in self.group.members:
            var = s.emit(m.value)
            s.members[m.buf.name] = var
            if m.store and m.in_place:
                late.append((m, var))
            elif m.store:
                self.store(s, m, var)
        for m, var in late:
            self.store(s, m, var)

    def render_reduction(self, lines: list[str]) -> None:
        top = Scope(self, "x", lines, "    ")
        self.program_block(top, rows=True)
        top.line("if PERSISTENT:")
        pers = Scope(self, "x", lines, "        ")
        self.row_block(pers)
        self._persistent(pers)
        top.line("else:")
        looped = Scope(self, "x", lines, "        ")
        self._looped(looped)

    def render_mixed(self, lines: list[str]) -> None:
        """A row kernel that also sums columns: each program loops over its ``row_chunk`` rows, ``XBLOCK`` at a
        time (whole rows in registers), and stores per-column partial sums (see Scheduler.mix_column_partials).
        Each step adds its ``XBLOCK`` rows' column sums to a one-row accumulator, a reduction across the rows of
        the tile (across warps where rows are spread over warps) every step; rows of at most
        ``config.mix_tile_acc_cols`` elements instead add each step's tile to a full ``XBLOCK x RBLOCK``
        accumulator, reduced once after the loop. That holds a whole extra tile in registers per partial (a
        LayerNorm backward's two partials made ptxas spill at 4 rows x 1024 columns on sm_90), so it is kept to
        narrow rows."""
        g = self.group
        top = Scope(self, "x", lines, "    ")
        top.line(f"pid = tl.program_id(0).to({self.index_dtype})")
        top.line("rindex = tl.arange(0, RBLOCK)[None, :]")
        top.line("rmask = rindex < rnumel")
        tile = self._tile_accumulators()
        shape = "[XBLOCK, RBLOCK]" if tile else "[1, RBLOCK]"
        accs = []
        for p in g.partials:  # a partial's definition is its column sum
            acc = self.new_var()
            top.line(f"{acc} = tl.full({shape}, 0, {tl_dtype(p.reduction.src_dtype)})")
            accs.append(acc)
        top.line(f"for xsub in range(0, {g.row_chunk}, XBLOCK):")
        xs = Scope(self, "x", lines, "        ")
        xs.line("xlocal = xsub + tl.arange(0, XBLOCK)[:, None]")
        xs.line(f"xindex = pid * {g.row_chunk} + xlocal")
        xs.line(f"xmask = (xindex < xnumel) & (xlocal < {g.row_chunk})")
        xs.line("xrmask = xmask & rmask")
        xr = self._persistent(xs)
        for p, acc in zip(g.partials, accs):
            src = tl_dtype(p.reduction.src_dtype)
            v = xr.emit(p.value)
            step = f"tl.where(xrmask, tl.broadcast_to({v}, [XBLOCK, RBLOCK]).to({src}), 0)"
            xr.line(f"{acc} = {acc} + {step}" if tile else f"{acc} = {acc} + tl.sum({step}, 0)[None, :]")
        for p, acc in zip(g.partials, accs):
            total = f"tl.sum({acc}, 0)[None, :]" if tile else acc
            top.line(f"tl.store({self.out_ptr(p.buf.name)} + pid * rnumel + rindex, {total}, rmask)")

    def _tile_accumulators(self) -> bool:
        """Whether this mixed kernel's partial sums accumulate a full tile (``blocks.tile_accumulators``)."""
        n = self.group.rnumel
        return n.is_number and tile_accumulators(int(n))

    def _persistent(self, xs: Scope) -> Scope:
        xr = Scope(self, "xr", xs.lines, xs.indent, parent=xs)
        for m in self.group.members:
            if m.is_reduction:
                v = xr.emit(m.value)
                var = self._reduce_block(xs, m, v)
                xs.members[m.buf.name] = var
            elif m.role == "xr":
                var = self.member_value(xr, m)
                if m.store:
                    self.store(xr, m, var)
                continue
            else:
                var = self.compute_x_member(xs, m)
            if m.store:
                self.store(xs, m, var)
        return xr

    def _levels(self) -> dict[str, int]:
        """Loop level of each member; for x members and reductions, the level their value is ready at."""
        avail: dict[str, int] = {}
        level: dict[str, int] = {}
        for m in self.group.members:
            deps = [avail[ld.buffer] for ld in loads(m.value) if ld.buffer in avail]
            lv = max(deps, default=0)
            partner = self._online.get(m.buf.name)
            if partner is not None:  # sum(exp(v - max(v))) runs in the max's loop (online softmax)
                lv = level[partner.buf.name]
            level[m.buf.name] = lv
            avail[m.buf.name] = lv + 1 if m.is_reduction else lv
        self._avail = avail
        return level

    def _online_pairs(self) -> dict[str, Member]:
        """Sum reductions of ``exp(v - max(v))`` whose max is in this group: sum name -> max member.

        In looped mode both run in one loop with a running max and a rescaled running sum, so softmax
        reads its row twice instead of three times, and log-sum-exp (cross-entropy) once instead of twice.
        """
        by_name = {m.buf.name: m for m in self.group.members}
        pairs: dict[str, Member] = {}
        for m in self.group.members:
            d = m.buf.definition
            if not isinstance(d, Reduction) or d.reduction_type != "sum" or not d.src_dtype.is_floating_point:
                continue
            e = m.value
            if not (
                isinstance(e, Op) and e.op == "exp" and isinstance(e.args[0], Op) and e.args[0].op == "sub"
            ):
                continue
            v, ld = e.args[0].args
            if not isinstance(ld, Load) or ld.indirect or ld.mask is not None:
                continue
            a = by_name.get(ld.buffer)
            if a is None or not a.is_reduction or a.reduction.reduction_type != "max":
                continue
            if a.reduction.src_dtype != d.src_dtype or not kexpr_equal(v, a.value):
                continue
            pairs[m.buf.name] = a
        return pairs

    def _looped(self, xs: Scope) -> None:
        self._online = self._online_pairs()
        partner_of = {a.buf.name: b for b, a in self._online.items()}
        level = self._levels()
        members = self.group.members
        nloops = max([level[m.buf.name] for m in members if m.is_reduction or m.role == "xr"], default=0) + 1
        for k in range(nloops + 1):
            # row members whose inputs are ready before loop k
            for m in members:
                if (
                    m.role == "x"
                    and not m.is_reduction
                    and self._avail[m.buf.name] == k
                    and xs.member_var(m.buf.name) is None
                ):
                    var = self.compute_x_member(xs, m)
                    if m.store:
                        self.store(xs, m, var)
            if k == nloops:
                break
            reds = [m for m in members if m.is_reduction and level[m.buf.name] == k]
            stores = [m for m in members if m.role == "xr" and m.store and level[m.buf.name] == k]
            if not reds and not stores:
                continue
            accs = {m.buf.name: self._acc_init(xs, m) for m in reds}
            xs.line("for roffset in range(0, rnumel, RBLOCK):")
            body = Scope(self, "xr", xs.lines, xs.indent + "    ", parent=xs)
            self.row_block(body, "roffset + ")
            for m in members:
                if m.is_reduction and m.buf.name in accs:
                    if m.buf.name in self._online:
                        continue  # updated together with its max
                    v = body.emit(m.value)
                    sum_name = partner_of.get(m.buf.name)
                    if sum_name in accs:
                        self._online_update(body, m, accs[m.buf.name], accs[sum_name], v)
                    else:
                        self._acc_update(body, m, accs[m.buf.name], v)
                elif m in stores:
                    var = self.member_value(body, m)
                    self.store(body, m, var)
            for m in reds:
                partner = self._online.get(m.buf.name)
                if partner is not None and partner.buf.name in accs:
                    var = self.new_var()
                    m_acc, m_row = accs[partner.buf.name], xs.members[partner.buf.name]
                    xs.line(
                        f"{var} = tl.sum({accs[m.buf.name]} * tl.where({m_acc} == float('-inf'), 0.0, "
                        f"tl.exp({m_acc} - {m_row})), 1)[:, None]"
                    )
                else:
                    var = self._acc_final(xs, m, accs[m.buf.name])
                xs.members[m.buf.name] = var
                if m.store:
                    self.store(xs, m, var)

    # -------------------------------------------------------------- reductions
    def _identity(self, m: Member) -> str:
        d = m.reduction
        t, dt = d.reduction_type, d.src_dtype
        if t == "sum":
            return raw_literal(0, dt)
        if t == "prod":
            return raw_literal(1, dt)
        big = t in ("max", "argmax")
        if dt.is_floating_point:
            return raw_literal(float("-inf") if big else float("inf"), dt)
        info = torch.iinfo(dt) if dt != torch.bool else None
        return raw_literal((info.min if big else info.max) if info else int(not big), dt)

    def _combine(self, m: Member) -> str:
        d = m.reduction
        t = d.reduction_type
        if t in ("max", "min"):
            name = (
                ("_max_nan" if t == "max" else "_min_nan")
                if d.src_dtype.is_floating_point
                else ("_max_int" if t == "max" else "_min_int")
            )
        elif t == "prod":
            name = "_prod_combine"
        elif t in ("argmax", "argmin"):
            name = f"_{t}_combine"
        else:
            name = ""
        if name and name not in self.helpers:
            self.helpers.append(name)
        return name

    def _final(self, m: Member, acc: str, idx: str = "") -> str:
        """Reduce a [XBLOCK, RBLOCK] block along dim 1 to [XBLOCK, 1] with builtin reductions (fast in the
        interpreter too); NaN propagates for max/min, and argmax/argmin pick the first NaN or best value."""
        d = m.reduction
        t, is_float = d.reduction_type, d.src_dtype.is_floating_point
        if t == "sum":
            return f"tl.sum({acc}, 1)[:, None]"
        if t in ("max", "min"):
            if not is_float:
                return f"tl.{t}({acc}, 1)[:, None]"
            name = f"_{t}_final"
        elif t in ("argmax", "argmin"):
            name = f"_{t}_final" + ("" if is_float else "_int")
            self._use(name)
            return f"{name}({acc}, {idx})"
        else:  # prod
            name = "_prod_combine"
            self._use(name)
            return f"tl.reduce({acc}, 1, {name})[:, None]"
        self._use(name)
        return f"{name}({acc})"

    def _use(self, helper: str) -> None:
        if helper not in self.helpers:
            self.helpers.append(helper)

    def _reduce_block(self, xs: Scope, m: Member, v: str) -> str:
        d = m.reduction
        masked = f"tl.where(xrmask, tl.broadcast_to({v}, [XBLOCK, RBLOCK]).to({tl_dtype(d.src_dtype)}), {self._identity(m)})"
        var = self.new_var()
        xs.line(f"{var} = {masked}")
        out = self.new_var()
        xs.line(f"{out} = {self._final(m, var, 'tl.broadcast_to(rindex, [XBLOCK, RBLOCK])')}")
        return out

    def _acc_init(self, xs: Scope, m: Member):
        d = m.reduction
        acc = self.new_var()
        xs.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {self._identity(m)}, {tl_dtype(d.src_dtype)})")
        if d.reduction_type in ("argmax", "argmin"):
            idx = self.new_var()
            xs.line(f"{idx} = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int32)")
            return acc, idx
        return acc

    def _acc_update(self, body: Scope, m: Member, acc, v: str) -> None:
        d = m.reduction
        masked = f"tl.where(xrmask, tl.broadcast_to({v}, [XBLOCK, RBLOCK]).to({tl_dtype(d.src_dtype)}), {self._identity(m)})"
        t = d.reduction_type
        if t == "sum":
            body.line(f"{acc} = {acc} + {masked}")
        elif t == "prod":
            body.line(f"{acc} = {acc} * {masked}")
        elif t in ("argmax", "argmin"):
            a, i = acc
            comb = self._combine(m)
            body.line(f"{a}, {i} = {comb}({a}, {i}, {masked}, tl.broadcast_to(rindex, [XBLOCK, RBLOCK]))")
        else:
            body.line(f"{acc} = {self._combine(m)}({acc}, {masked})")

    def _online_update(self, body: Scope, m: Member, m_acc: str, s_acc: str, v: str) -> None:
        """Running max ``m_acc`` and running sum of exp(v - max) ``s_acc``, rescaled when the max grows."""
        d = m.reduction
        self._use("_max_nan")
        vm, new, alpha = self.new_var(), self.new_var(), self.new_var()
        body.line(
            f"{vm} = tl.where(xrmask, tl.broadcast_to({v}, [XBLOCK, RBLOCK]).to({tl_dtype(d.src_dtype)}), "
            "float('-inf'))"
        )
        body.line(f"{new} = _max_nan({m_acc}, {vm})")
        body.line(f"{alpha} = tl.where({new} == float('-inf'), 0.0, tl.exp({m_acc} - {new}))")
        body.line(f"{s_acc} = {s_acc} * {alpha} + tl.where({vm} == float('-inf'), 0.0, tl.exp({vm} - {new}))")
        body.line(f"{m_acc} = {new}")

    def _acc_final(self, xs: Scope, m: Member, acc) -> str:
        var = self.new_var()
        if isinstance(acc, tuple):
            xs.line(f"{var} = {self._final(m, acc[0], acc[1])}")
        else:
            xs.line(f"{var} = {self._final(m, acc)}")
        return var

    # -------------------------------------------------------------- module
    #: the kernel kind in its name (``kiln_<kind>_<origin>_<hash>``); None: pointwise or reduction
    kind: str | None = None

    def render_body(self, body: list[str]) -> None:
        """The kernel function's body lines, after its signature."""
        if self.group.partials:
            self.render_mixed(body)
        elif self.reduction:
            self.render_reduction(body)
        else:
            self.render_pointwise(body)

    def render(self) -> KernelSource:
        body: list[str] = []
        self.render_body(body)
        self.note_symbols(self.group.xnumel)
        self.note_symbols(self.group.rnumel)
        size_args = [self.symbols[k] for k in sorted(self.symbols)]
        ptrs = [(v, k) for k, v in self.ins.items()] + [(v, k) for k, v in self.outs.items()]
        params = [p for p, _ in ptrs] + [s.name for s in size_args] + ["xnumel"]
        if self.reduction:
            params += ["rnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "PERSISTENT: tl.constexpr"]
        else:
            params += ["XBLOCK: tl.constexpr"]
        origins = [m.buf.origin or m.buf.name for m in self.group.members + self.group.partials]
        kind = self.kind or ("reduction" if self.reduction else "pointwise")
        header = [
            "import triton",
            "import triton.language as tl",
            "from triton.language.extra import libdevice",
            "",
        ]
        for h in self.helpers:
            header.append(HELPERS[h].strip("\n"))
            header.append("")
        doc = [f"    # {p} -> {b}" for p, b in ptrs]
        fn = ["", "@triton.jit", f"def KERNEL_NAME({', '.join(params)}):"] + doc + body
        text = "\n".join(header + fn) + "\n"
        tag = hashlib.sha256(text.encode()).hexdigest()[:10]
        stem = re.sub(r"[^0-9a-zA-Z_]", "_", origins[-1])[:40]
        name = f"kiln_{kind}_{stem}_{tag}"
        text = text.replace("KERNEL_NAME", name)
        return KernelSource(
            name,
            text,
            ptrs,
            size_args,
            self.group.xnumel,
            self.group.rnumel,
            self.reduction,
            [m.buf.name for m in self.group.members + self.group.partials if m.store],
            origins,
            self.reduction_hint(),
            self.group.programs,
        )

    def reduction_hint(self) -> str:
        """ "outer" when reduced elements are far apart in memory and rows are adjacent (column sums).

        Decided from the address step of each load of a reduction member when xindex or rindex grows by
        one, evaluated at a sample point (size symbols set to large sample values).
        """
        if not self.reduction:
            return "inner"
        votes = 0  # > 0: column-wise reads dominate
        for m in self.group.members:
            if not m.is_reduction:
                continue
            for ld in loads(m.value):
                if ld.indirect:
                    continue
                step_x, step_r = address_steps(ld.index, XINDEX, RINDEX)
                if not step_x or not step_r:
                    continue  # a vector broadcast along rows or along the reduction: no say in the tiling
                if step_r == 1:
                    votes -= 1
                elif step_x == 1:
                    votes += 1
        return "outer" if votes > 0 else "inner"


def render_group(group: KernelGroup, index_dtype: str) -> KernelSource:
    """``group`` as a Triton kernel with ``index_dtype`` index math (``tl.int32`` or ``tl.int64``)."""
    return KernelRenderer(group, index_dtype).render()
