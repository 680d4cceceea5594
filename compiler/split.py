"""The ``split`` pass: a small pointwise group of independent parts becomes one group per part, for the ``combo``
pass to launch side by side.

The scheduler fuses every pointwise buffer of one size into one group, related or not: an optimizer step over
many parameters of one size (a model's norm weights and biases, every parameter's step count) becomes one kernel
in which each program updates every parameter, one after another (a store to one parameter's memory keeps the
next parameter's loads behind it). Over a few thousand elements that kernel has a handful of programs, each
waiting on memory once per parameter. Split, each parameter's update is a kernel of its own; the ``combo``
pass launches them as parts of one combo kernel, whose programs run the parts side by side.

A *component* of a group is a maximal set of members that touch a common buffer: one reads what another
computes, both read one buffer, or one reads the input another stores in place (``Member.in_place``). Members
of two components share nothing, so running them as two kernels (in any order, or at once) computes what the
group computes; a component keeps the group's order of its members, and the in-place rule of the ``in_place``
pass (every load of the input in the kernel that stores it) holds in it, since every reader of that input is
in it.

Which groups are split: pointwise (no reduction, scatter, scan, partial sums or fixed grid) over a static size
of at most ``combo_max_numel`` elements (the ``combo`` pass's parts), with two components or more; only while
the ``combo_kernels`` setting is on (without combo kernels a split would only add launches).
"""

from __future__ import annotations

import sympy

from . import config
from .kexpr import loads
from .scheduler import KernelGroup, Member, Schedule


def split_independent(schedule: Schedule) -> Schedule:
    """The ``split`` pass: ``schedule`` with each splittable group (module docstring) replaced, in place, by
    one group per component, in the order of their first members; unchanged with combo kernels off."""
    s = config.settings()
    if not s.combo_kernels:
        return schedule
    items: list = []
    for item in schedule.items:
        if isinstance(item, KernelGroup) and splittable(item, s.combo_max_numel):
            parts = components(item.members, schedule.in_place)
            if len(parts) >= 2:
                items += [KernelGroup(item.xnumel, item.rnumel, part) for part in parts]
                continue
        items.append(item)
    schedule.items = items
    return schedule


def splittable(group: KernelGroup, max_numel: int) -> bool:
    """A pointwise group over a static size of at most ``max_numel`` elements with two members or more."""
    if group.has_reduction or group.kind or group.partials or group.programs or len(group.members) < 2:
        return False
    x = sympy.sympify(group.xnumel)
    return bool(x.is_Integer) and 0 < int(x) <= max_numel


def components(members: list[Member], in_place: dict[str, str]) -> list[list[Member]]:
    """``members`` grouped into components (module docstring), each in member order, ordered by first member."""
    parent = list(range(len(members)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}  # buffer -> a member touching it
    for i, m in enumerate(members):
        touched = {m.buf.name} | {ld.buffer for ld in loads(m.value)}
        if m.buf.name in in_place:
            touched.add(in_place[m.buf.name])
        for name in sorted(touched):
            j = owner.setdefault(name, i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    out: dict[int, list[Member]] = {}
    for i, m in enumerate(members):
        out.setdefault(find(i), []).append(m)
    return list(out.values())
