"""The ``render`` pass: a ``scheduler.Schedule`` in, its ``Kernels`` out (one Triton kernel per kernel group,
kernels with the same body sharing one name and source). The schedule itself is left as it was."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import sympy
import torch

from ..dtypes import tl_dtype
from ..exc import require
from ..ir import Scatter
from ..scheduler import KernelGroup, Schedule, same
from .dedup import share_identical
from .scatter_kernel import render_special
from .triton_kernel import KernelSource, render_group


@dataclasses.dataclass(frozen=True)
class ComboSource:
    """A combo kernel (``codegen.combo``): one launch, at the place of its first part, running ``parts``
    (independent kernels at ``indices`` of ``Kernels.sources``, in launch order), each over its own program id
    range. ``ptr_args``: every part's pointers, renamed ``<param>_p<part>``; the launch passes them, then each
    part's ``xnumel``."""

    name: str
    source: str
    ptr_args: list[tuple[str, str]]
    parts: tuple[KernelSource, ...]
    indices: tuple[int, ...]

    @property
    def stores(self) -> list[str]:
        return [b for ks in self.parts for b in ks.stores]


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The ``render`` pass's product: the kernel of each kernel group of ``schedule``, in launch order
    (``sources[k]`` belongs to ``schedule.groups[k]``). A kernel another group shares keeps its own buffers and
    sizes (``ptr_args``, ``size_args``): see ``codegen.dedup``."""

    schedule: Schedule
    sources: tuple[KernelSource, ...]
    #: the ``combo`` pass's combo kernels, in launch order; each launches in place of its parts
    combos: tuple[ComboSource, ...] = ()

    @property
    def launches(self) -> list[KernelSource | ComboSource]:
        """One kernel per launch, in launch order (groups that share a kernel list it once each; a combo
        kernel, at the place of its first part, stands for its parts)."""
        if not self.combos:
            return list(self.sources)
        first = {c.indices[0]: c for c in self.combos}
        inside = {k for c in self.combos for k in c.indices}
        return [
            first[k] if k in first else ks
            for k, ks in enumerate(self.sources)
            if k in first or k not in inside
        ]

    def access(self, index: int) -> tuple[set[str], set[str]]:
        """(buffers read, buffers written) by the kernel at ``index`` of ``sources``, a buffer stored in place
        named by the input whose memory it is (``Schedule.in_place``); a scatter's target counts as written."""
        ks = self.sources[index]
        in_place = self.schedule.in_place
        reads = {in_place.get(b, b) for p, b in ks.ptr_args if not p.startswith("out_ptr")}
        writes = {in_place.get(b, b) for b in ks.stores}
        writes |= {in_place.get(b, b) for p, b in ks.ptr_args if p.startswith("out_ptr")}
        for m in self.schedule.groups[index].members:
            if isinstance(m.buf.definition, Scatter):
                writes.add(m.buf.definition.target)
        return reads, writes

    def combo_of(self, index: int) -> ComboSource | None:
        """The combo kernel that launches the kernel at ``index`` of ``sources``, or None."""
        return next((c for c in self.combos if index in c.indices), None)

    def pairs(self) -> Iterator[tuple[KernelGroup, KernelSource]]:
        """(group, its kernel), in launch order."""
        return zip(self.schedule.groups, self.sources)

    def verify(self) -> None:
        """Structural invariants (``InvariantError`` names the first broken one): one kernel per group of the
        schedule; each stores exactly its group's stored members (partial sums included), reads registered
        buffers (or constants) only and launches over its group's sizes; a kernel name stands for one source."""
        program = self.schedule.program
        where = f"kernels of {program.name}"
        groups = self.schedule.groups
        require(
            len(self.sources) == len(groups), f"{where}: {len(self.sources)} kernels for {len(groups)} groups"
        )
        names: dict[str, str] = {}
        for k, (group, ks) in enumerate(self.pairs()):
            require(isinstance(ks, KernelSource), f"{where}: group {k} has no kernel ({ks!r})")
            want = [m.buf.name for m in group.members + group.partials if m.store]
            require(
                list(ks.stores) == want,
                f"{where}: kernel {ks.name} (group {k}) stores {ks.stores}, its group stores {want}",
            )
            for param, name in ks.ptr_args:
                require(
                    name in program.buffers or name in program.constants,
                    f"{where}: kernel {ks.name} (group {k}) passes unknown buffer {name} as {param}",
                )
            outs = [name for param, name in ks.ptr_args if param.startswith("out_ptr")]
            require(
                sorted(outs) == sorted(want),
                f"{where}: kernel {ks.name} (group {k}) writes {outs}, stores {want}",
            )
            require(
                same(ks.xnumel, group.xnumel) and same(ks.rnumel, group.rnumel),
                f"{where}: kernel {ks.name} (group {k}) launches over ({ks.xnumel}, {ks.rnumel}), its group "
                f"over ({group.xnumel}, {group.rnumel})",
            )
            require(
                names.setdefault(ks.name, ks.source) == ks.source,
                f"{where}: kernel name {ks.name} stands for two different sources",
            )
        taken: set[int] = set()
        access = [self.access(k) for k in range(len(self.sources))] if self.combos else []
        for c in self.combos:
            require(
                len(c.indices) >= 2 and list(c.indices) == sorted(set(c.indices)),
                f"{where}: combo {c.name} launches kernels {list(c.indices)}, not two or more in launch order",
            )
            require(not taken & set(c.indices), f"{where}: combo {c.name} shares a kernel with another combo")
            taken |= set(c.indices)
            require(
                list(c.parts) == [self.sources[k] for k in c.indices],
                f"{where}: combo {c.name}'s parts are not the kernels at {list(c.indices)}",
            )
            self._verify_combo(c, where, access)
            require(
                names.setdefault(c.name, c.source) == c.source,
                f"{where}: kernel name {c.name} stands for two different sources",
            )

    def _verify_combo(self, c: ComboSource, where: str, access: list[tuple[set[str], set[str]]]) -> None:
        """The parts of ``c`` are independent of each other and of every kernel between its first part and
        them (the combo launches them at its first part's place), and no call or scatter/scan kernel is
        between."""
        items = self.schedule.items
        group_item = [i for i, it in enumerate(items) if isinstance(it, KernelGroup)]
        first, last = group_item[c.indices[0]], group_item[c.indices[-1]]
        for i in range(first, last + 1):
            it = items[i]
            require(
                isinstance(it, KernelGroup) and not it.kind,
                f"{where}: combo {c.name}: a call or scatter/scan kernel (item {i}) between its parts",
            )
        parts = set(c.indices)
        for j in c.indices:
            reads, writes = access[j]
            for m in range(c.indices[0], j):
                r, w = access[m]
                require(
                    not (reads & w or writes & (r | w)),
                    f"{where}: combo {c.name}: {self.sources[j].name} (kernel {j}) depends on kernel {m}"
                    + (" (a part)" if m in parts else ", launched between"),
                )


def render(schedule: Schedule) -> Kernels:
    """Each kernel group of ``schedule`` as deterministic Triton source; one kernel per distinct body
    (transformer layers repeat)."""
    program = schedule.program
    small = _fits_int32(b.layout.storage_extent() for b in program.buffers.values())
    kernels = [
        (render_special if g.kind else render_group)(g, index_dtype(g, small)) for g in schedule.groups
    ]
    return Kernels(schedule, tuple(share_identical(kernels)))


INT32_LIMIT = 2**31 - 1


def _fits_int32(exprs: Iterable[Any]) -> bool:
    """Every expression a static integer no larger than int32 holds."""
    for e in exprs:
        e = sympy.sympify(e)
        if not e.is_number or int(e) > INT32_LIMIT:
            return False
    return True


def index_dtype(group: KernelGroup, program_small: bool) -> str:
    """int32 index math when every size is static and small (the group's domain, its members' buffers and,
    ``program_small``, every buffer of the program, checked once per graph); int64 otherwise."""
    own = [group.xnumel * group.rnumel, *(m.buf.layout.storage_extent() for m in group.members)]
    return tl_dtype(torch.int32 if program_small and _fits_int32(own) else torch.int64)
