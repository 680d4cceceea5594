"""Render the kernels of ``scatter`` and ``scan`` groups (one ``Scatter`` or ``Scan`` member, alone in its kernel).

- scatter: one program handles ``XBLOCK`` source elements; each computes its target offset (from loaded indices),
  its value and whether it writes, and combines the value into the target with ``tl.atomic_add``/``_max``/``_min``
  (relaxed: the kernel's end is the only ordering point) or stores it (``tl.store``).
- ordered scatter (a float ``add`` with ``Scatter.ordered``): no atomics. Each program's sources compare their
  target offsets with those of every source, ``QBLOCK`` at a time in source order (the body rendered again over
  that block); the first valid source of each offset (its *head*) sums the values of all sources of that offset,
  chunk after chunk in source order, and adds the sum to the target with a plain load and store (one head per
  offset: no race). The order of every addition is fixed by the sizes and the launch config, so results are
  bitwise identical run to run; the work is quadratic in the number of sources (``ordered_scatter_max``).
- scan: rows x scanned elements like a reduction. ``PERSISTENT`` (the whole scanned dim in one block) is one
  ``tl.associative_scan``; the looped form scans ``RBLOCK`` elements at a time and carries each row's running
  combination from one chunk to the next. Masked-off lanes hold the combination's identity.
"""

from __future__ import annotations

import re

from ..dtypes import tl_dtype
from ..exc import CodegenError
from ..ir import Scan, Scatter
from ..kexpr import Const, Op
from ..scheduler import KernelGroup
from .ops_table import cast
from .printer import pexpr, raw_literal
from .triton_kernel import KernelRenderer, KernelSource, Scope

#: scatter reduce -> the Triton call that writes (``store``: a plain store)
_WRITE = {"add": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min", "store": "tl.store"}

#: the names a program's own block of sources has in an ordered scatter
_P_NAMES = re.compile(r"\bx(index|mask|offset)\b")

#: sources compared per step of an ordered scatter's loop
QBLOCK = 64

#: scan type -> (combine helper in ``ops_table.HELPERS``, identity)
_SCAN = {
    "sum": ("_add_combine", 0),
    "prod": ("_prod_combine", 1),
    "logsumexp": ("_logaddexp_combine", float("-inf")),
}


class ScatterRenderer(KernelRenderer):
    """A scatter kernel: a pointwise kernel over the sources whose one write goes through an atomic."""

    kind = "scatter"

    def render_body(self, lines: list[str]) -> None:
        m = self.group.members[0]
        d = m.buf.definition
        if not isinstance(d, Scatter) or not (isinstance(m.value, Op) and m.value.op == "scatter"):
            raise CodegenError(f"scatter group of {m.buf.name} holds no scatter")
        offset, value, valid = m.value.args
        s = Scope(self, "x", lines, "    ")
        start = len(lines)
        self.program_block(s, rows=False)
        off = s.emit(offset)
        mask = "xmask"
        if not (isinstance(valid, Const) and valid.value is True):
            # a select, not ``&``: a 0-d condition ``&`` a block mask is int32 in the interpreter
            mask = f"tl.where({s.emit(valid)}, xmask, False)"
        if d.ordered:
            # this program's sources keep their index and mask as ``pindex``/``pmask``: the loop below binds
            # ``xindex``/``xmask`` to other blocks (a loop may not rebind a name to a block of another shape)
            for i in range(start, len(lines)):
                lines[i] = _P_NAMES.sub(lambda mo: "p" + mo.group(0)[1:], lines[i])
            self._ordered(lines, s, m, off, _P_NAMES.sub(lambda mo: "p" + mo.group(0)[1:], mask))
            return
        val = cast(f"tl.broadcast_to({s.emit(value)}, [XBLOCK])", value.dtype, m.buf.dtype)
        ptr = f"{self.out_ptr(m.buf.name)} + tl.broadcast_to({off}, [XBLOCK])"
        extra = "" if d.reduce == "store" else ", sem='relaxed'"
        s.line(f"{_WRITE[d.reduce]}({ptr}, {val}, {mask}{extra})")

    def _ordered(self, lines: list[str], s: Scope, m, off: str, mask: str) -> None:
        """The order-fixed sum (see the module docstring): ``off``/``mask`` are this program's sources' offsets
        and validity."""
        offset, value, valid = m.value.args
        acc = tl_dtype(m.buf.dtype)
        s.line(f"poff = tl.broadcast_to({off}, [XBLOCK])")
        s.line(f"head = {mask}")
        s.line(f"total = tl.zeros([XBLOCK], {acc})")
        s.line(f"for qoffset in range(0, xnumel, {QBLOCK}):")
        # the body again, over QBLOCK sources: ``xindex``/``xmask`` are rebound, nothing is shared with ``s``
        q = Scope(self, "x", lines, "        ")
        q.line(f"xindex = qoffset + tl.arange(0, {QBLOCK})")
        q.line("xmask = xindex < xnumel")
        self.xblock = str(QBLOCK)
        try:
            qoff = f"tl.broadcast_to({q.emit(offset)}, [{QBLOCK}])"
            qval = cast(f"tl.broadcast_to({q.emit(value)}, [{QBLOCK}])", value.dtype, m.buf.dtype)
            qmask = "xmask"
            if not (isinstance(valid, Const) and valid.value is True):
                qmask = f"tl.where({q.emit(valid)}, xmask, False)"
        finally:
            self.xblock = "XBLOCK"
        q.line(f"same = (poff[:, None] == {qoff}[None, :]) & {qmask}[None, :]")
        q.line("earlier = tl.where(same & (xindex[None, :] < pindex[:, None]), 1, 0)")
        q.line("head = head & (tl.max(earlier, 1) == 0)")
        q.line(f"total = total + tl.sum(tl.where(same, {qval}[None, :], 0), 1)")
        ptr = f"{self.out_ptr(m.buf.name)} + poff"
        s.line(f"tl.store({ptr}, tl.load({ptr}, head, other=0) + total, head)")


class ScanRenderer(KernelRenderer):
    """A scan kernel over rows x scanned elements (see the module docstring)."""

    kind = "scan"

    def render_body(self, lines: list[str]) -> None:
        m = self.group.members[0]
        d = m.buf.definition
        if not isinstance(d, Scan):
            raise CodegenError(f"scan group of {m.buf.name} holds no scan")
        combine, identity = _SCAN[d.scan_type]
        self._use(combine)
        acc = tl_dtype(d.src_dtype)
        ident = raw_literal(identity if d.src_dtype.is_floating_point else int(identity), d.src_dtype)
        top = Scope(self, "x", lines, "    ")
        self.program_block(top, rows=True)
        top.line("if PERSISTENT:")
        pers = Scope(self, "xr", lines, "        ")
        self.row_block(pers)
        self._chunk(pers, m, combine, acc, ident, None)
        top.line("else:")
        looped = Scope(self, "x", lines, "        ")
        carry = self.new_var()
        looped.line(f"{carry} = tl.full([XBLOCK, 1], {ident}, {acc})")
        looped.line("for roffset in range(0, rnumel, RBLOCK):")
        body = Scope(self, "xr", lines, "            ")
        self.row_block(body, "roffset + ")
        self._chunk(body, m, combine, acc, ident, carry)

    def _chunk(self, s: Scope, m, combine: str, acc: str, ident: str, carry: str | None) -> None:
        """Scan one block of each row (after ``carry``, the rows' combination so far, when looping) and store it."""
        v = s.emit(m.value)
        a, out = self.new_var(), self.new_var()
        s.line(f"{a} = tl.where(xrmask, tl.broadcast_to({v}, [XBLOCK, RBLOCK]).to({acc}), {ident})")
        s.line(f"{out} = tl.associative_scan({a}, 1, {combine})")
        if carry is not None:
            s.line(f"{out} = {combine}({carry}, {out})")
            s.line(f"{carry} = {combine}({carry}, tl.reduce({a}, 1, {combine})[:, None])")
        self.note_symbols(m.store_index)
        s.line(
            f"tl.store({self.out_ptr(m.buf.name)} + tl.broadcast_to({pexpr(m.store_index)}, [XBLOCK, RBLOCK]), "
            f"{cast(out, m.buf.definition.src_dtype, m.buf.dtype)}, xrmask)"
        )


#: group kind -> its renderer
RENDERERS: dict[str, type[KernelRenderer]] = {"scatter": ScatterRenderer, "scan": ScanRenderer}


def render_special(group: KernelGroup, index_dtype: str) -> KernelSource:
    """The kernel of a ``scatter`` or ``scan`` group (an ordered scatter's launch hint: ``ordered``)."""
    ks = RENDERERS[group.kind](group, index_dtype).render()
    d = group.members[0].buf.definition
    if isinstance(d, Scatter) and d.ordered:
        ks.hint = "ordered"
    return ks
