"""The ``in_place`` pass: a mutated input's new value stored by its kernel straight into the input.

A mutated graph input (a parameter or optimizer state updated under ``no_grad``: every optimizer step) is
lowered as a kernel that computes the new value into a fresh buffer and a trailing write-back copy into the
input (``ExternCall(write_back=True)``; the wrapper groups them into ``torch._foreach_copy_``). The copy reads
and writes every updated tensor once more. Where it is safe, this pass drops the write-back and lets the
kernel store into the input's memory (``Schedule.in_place``: buffer -> input; the wrapper passes the input where
the kernel writes the buffer).

Safe means that nothing needs the input's old value once the kernel has stored the new one:
- the new value is a whole computed buffer laid out exactly as the whole input (sizes, strides, offset, dtype),
  stored by a member of a pointwise group (no reduction, scatter, scan or partial sums), and no graph output;
- in that group, every load of the input reads the element the member stores at that position (same index,
  no mask, no indirection): each lane reads only the elements it writes, and the kernel stores members kept
  in place after every member's value is computed (``Member.in_place``), so after every load;
- no later item (kernel group, extern or subgraph call) reads the input.
Kernels that run before it may read the input; the ``combo`` pass keeps them out of its launch.
"""

from __future__ import annotations

import torch.utils._pytree as pytree

from . import config
from .graph import ExternCall
from .ir import ComputedBuffer, InputBuffer, Strided
from .kexpr import Load, loads
from .scheduler import KernelGroup, Member, Schedule, same_on_domain, scheduled_reads


def write_in_place(schedule: Schedule) -> Schedule:
    """The ``in_place`` pass: ``schedule`` with the write-backs it can drop dropped and recorded in
    ``schedule.in_place`` (the same object, changed); unchanged with the ``write_in_place`` setting off."""
    if not config.settings().write_in_place:
        return schedule
    outputs = {v.buffer.name for v in pytree.tree_leaves(schedule.program.outputs) if isinstance(v, Strided)}
    producer: dict[str, int] = {}
    for k, item in enumerate(schedule.items):
        if isinstance(item, KernelGroup):
            for m in item.members:
                producer[m.buf.name] = k
    # what each item reads and each group loads, found once: an optimizer step has a write-back per state
    # tensor and groups with members for hundreds of them, and walking the loads per write-back was quadratic
    readers: dict[str, list[int]] = {}
    for k, item in enumerate(schedule.items):
        for n in scheduled_reads(item):
            readers.setdefault(n, []).append(k)
    group_loads: dict[int, dict[str, list[Load]]] = {}  # by group index, then buffer; filled as needed
    dropped: list[int] = []
    for k, item in enumerate(schedule.items):
        if not (isinstance(item, ExternCall) and item.write_back):
            continue
        dst, src = item.args[0], item.args[1]
        if not (
            isinstance(dst, Strided)
            and isinstance(src, Strided)
            and isinstance(dst.buffer, InputBuffer)
            and isinstance(src.buffer, ComputedBuffer)
        ):
            continue
        name, target = src.buffer.name, dst.buffer.name
        j = producer.get(name)
        if j is None or name in outputs or name in schedule.in_place or target in schedule.in_place.values():
            continue
        if not (dst.is_whole_buffer() and src.is_whole_buffer() and dst.layout == src.buffer.layout):
            continue
        group = schedule.items[j]
        if not isinstance(group, KernelGroup) or (member := group.member(name)) is None:
            continue
        if j not in group_loads:
            group_loads[j] = _loads_by_buffer(group)
        if _safe(group, j, member, group_loads[j].get(target, []), k, readers.get(target, [])):
            schedule.in_place[name] = target
            member.in_place = True
            dropped.append(k)
    if dropped:
        schedule.items = [it for k, it in enumerate(schedule.items) if k not in set(dropped)]
    return schedule


def _loads_by_buffer(group: KernelGroup) -> dict[str, list[Load]]:
    """Every load of the group's members, by the buffer it reads."""
    out: dict[str, list[Load]] = {}
    for m in group.members:
        for ld in loads(m.value):
            out.setdefault(ld.buffer, []).append(ld)
    return out


def _safe(
    group: KernelGroup, j: int, member: Member, target_loads: list[Load], write_back: int, readers: list[int]
) -> bool:
    """The group at ``j`` may store ``member`` into the input it overwrites (module docstring);
    ``target_loads``: the group's loads of that input, ``readers``: the indices of the items that read it."""
    if group.has_reduction or group.kind or group.partials or not member.store:
        return False
    for ld in target_loads:
        if ld.mask is not None or ld.indirect or ld.dtype != member.buf.dtype:
            return False
        if not same_on_domain(ld.index, member.store_index, group.xnumel, group.rnumel):
            return False
    return all(k <= j or k == write_back for k in readers)
