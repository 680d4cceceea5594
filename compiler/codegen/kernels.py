"""The ``render`` pass: a ``scheduler.Schedule`` in, its ``Kernels`` out (one Triton kernel per kernel group,
kernels with the same body sharing one name and source). The schedule itself is left as it was."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import sympy
import torch

from ..dtypes import tl_dtype
from ..exc import require
from ..graph import Program
from ..scheduler import KernelGroup, Schedule, same
from .dedup import share_identical
from .scatter_kernel import render_special
from .triton_kernel import KernelSource, render_group


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The ``render`` pass's product: the kernel of each kernel group of ``schedule``, in launch order
    (``sources[k]`` belongs to ``schedule.groups[k]``). A kernel another group shares keeps its own buffers and
    sizes (``ptr_args``, ``size_args``): see ``codegen.dedup``."""

    schedule: Schedule
    sources: tuple[KernelSource, ...]

    @property
    def launches(self) -> list[KernelSource]:
        """One kernel per launch, in launch order (groups that share a kernel list it once each)."""
        return list(self.sources)

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
        require(len(self.sources) == len(groups), f"{where}: {len(self.sources)} kernels for {len(groups)} groups")
        names: dict[str, str] = {}
        for k, (group, ks) in enumerate(self.pairs()):
            require(isinstance(ks, KernelSource), f"{where}: group {k} has no kernel ({ks!r})")
            want = [m.buf.name for m in group.members + group.partials if m.store]
            require(list(ks.stores) == want, f"{where}: kernel {ks.name} (group {k}) stores {ks.stores}, "
                                              f"its group stores {want}")
            for param, name in ks.ptr_args:
                require(name in program.buffers or name in program.constants,
                         f"{where}: kernel {ks.name} (group {k}) passes unknown buffer {name} as {param}")
            outs = [name for param, name in ks.ptr_args if param.startswith("out_ptr")]
            require(sorted(outs) == sorted(want), f"{where}: kernel {ks.name} (group {k}) writes {outs}, stores {want}")
            require(same(ks.xnumel, group.xnumel) and same(ks.rnumel, group.rnumel),
                     f"{where}: kernel {ks.name} (group {k}) launches over ({ks.xnumel}, {ks.rnumel}), its group "
                     f"over ({group.xnumel}, {group.rnumel})")
            require(names.setdefault(ks.name, ks.source) == ks.source,
                     f"{where}: kernel name {ks.name} stands for two different sources")


def render(schedule: Schedule) -> Kernels:
    """Each kernel group of ``schedule`` as deterministic Triton source; one kernel per distinct body
    (transformer layers repeat)."""
    program = schedule.program
    kernels = [(render_special if g.kind else render_group)(g, index_dtype(g, program)) for g in schedule.groups]
    return Kernels(schedule, tuple(share_identical(kernels)))


def index_dtype(group: KernelGroup, program: Program) -> str:
    """int32 index math when every size is static and small; int64 otherwise."""
    limit = 2 ** 31 - 1
    exprs = [group.xnumel * group.rnumel]
    for m in group.members:
        exprs.append(m.buf.layout.storage_extent())
    for b in program.buffers.values():
        exprs.append(b.layout.storage_extent())
    for e in exprs:
        e = sympy.sympify(e)
        if not e.is_number or int(e) > limit:
            return tl_dtype(torch.int64)
    return tl_dtype(torch.int32)
