"""The ``combo`` pass: independent small pointwise kernels of one graph launched as one combo kernel.

A launch-bound graph (an optimizer step: one small update kernel per parameter) spends its time launching, not
computing. A *combo kernel* runs several kernels (its *parts*) in one launch: its grid is the sum of the parts'
grids, and each program finds its part by program id ranges (``pid < end0``: part 0, ``pid < end1``: part 1 with
``pid - end0``, ...). Every part keeps its own function (the kernel ``render`` made, with ``tl.program_id(0)``
replaced by the program id within its part), its own block size (``XBLOCK_p<k>``, chosen at launch from its own
size, as for a launch of its own) and its own buffers.

Which kernels are combined: runs of consecutive kernel groups of the schedule (no extern or subgraph call
between them) that are pointwise (no reduction, scatter, scan or fixed grid), of static sizes without size
arguments and at most ``combo_max_numel`` elements (launch-bound), with no part reading what an earlier part of
the run stores, nor storing (in place: ``Schedule.in_place``) an input an earlier part reads (independent: the
parts of one launch run in any order). A run is cut at ``combo_max_parts``
parts or ``combo_max_args`` pointer arguments (a kernel's parameters share a few kilobytes of launch memory, and
its compile time grows with its size); a run of one kernel stays as it is.

Whether a combination pays is decided at its first launch on a GPU by timing it against its parts
(``runtime/combo.py``); the parts' own kernels stay in the combo's module for that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence

import sympy

from .. import config
from ..scheduler import KernelGroup, Schedule
from .kernels import ComboSource, Kernels
from .triton_kernel import KernelSource

_COMMENT_LINE = re.compile(r"^\s*#.*\n", re.MULTILINE)
_JIT = "@triton.jit\n"


def combine(schedule: Schedule, kernels: Kernels) -> Kernels:
    """The ``combo`` pass: ``kernels`` with runs of independent small pointwise kernels grouped into combo kernels
    (``Kernels.combos``); unchanged when the ``combo_kernels`` setting is off or no run has two kernels."""
    s = config.settings()
    if not s.combo_kernels:
        return kernels
    combos: list[ComboSource] = []
    for run in _runs(schedule, kernels, s.combo_max_numel):
        for chunk in _chunks(run, kernels.sources, s.combo_max_parts, s.combo_max_args):
            if len(chunk) >= 2:
                combos.append(combo_source([kernels.sources[k] for k in chunk], tuple(chunk)))
    if not combos:
        return kernels
    return dataclasses.replace(kernels, combos=tuple(combos))


def combinable(group: KernelGroup, ks: KernelSource, max_numel: int) -> bool:
    """A kernel that may be a part: pointwise over a static size of at most ``max_numel`` elements, no size
    arguments, one ``tl.program_id(0)`` read and no other grid query."""
    x = sympy.sympify(group.xnumel)
    if group.has_reduction or group.kind or group.partials or ks.reduction or ks.programs or ks.size_args:
        return False
    if not x.is_Integer or not 0 < int(x) <= max_numel:
        return False
    src = ks.source
    return src.count("tl.program_id(0)") == 1 and "num_programs" not in src and "program_id(1)" not in src


def _runs(schedule: Schedule, kernels: Kernels, max_numel: int) -> list[list[int]]:
    """Indices (into ``kernels.sources``) of maximal runs of combinable kernels adjacent in launch order; a run is
    cut before a kernel that reads what the run already stores, or stores what it already reads."""
    runs: list[list[int]] = []
    cur: list[int] = []
    stored: set[str] = set()
    read: set[str] = set()
    k = 0
    for item in schedule.items:
        if not isinstance(item, KernelGroup):
            cur, stored, read = _close(runs, cur), set(), set()
            continue
        ks = kernels.sources[k]
        if not combinable(item, ks, max_numel):
            cur, stored, read = _close(runs, cur), set(), set()
        else:
            reads = {name for param, name in ks.ptr_args if param.startswith("in_ptr")}
            # a buffer stored in place is the input's memory: it stores the input too
            stores = set(ks.stores) | {schedule.in_place[b] for b in ks.stores if b in schedule.in_place}
            if reads & stored or stores & read:
                cur, stored, read = _close(runs, cur), set(), set()
            cur.append(k)
            stored |= stores
            read |= reads
        k += 1
    _close(runs, cur)
    return runs


def _close(runs: list[list[int]], cur: list[int]) -> list[int]:
    if len(cur) >= 2:
        runs.append(cur)
    return []


def _chunks(
    run: list[int], sources: Sequence[KernelSource], max_parts: int, max_args: int
) -> list[list[int]]:
    """``run`` cut into consecutive chunks of at most ``max_parts`` kernels and ``max_args`` pointer arguments, and
    where two parts' helper functions of one name differ."""
    out: list[list[int]] = []
    cur: list[int] = []
    args = 0
    helpers: dict[str, str] = {}
    for k in run:
        ks = sources[k]
        mine = _helpers(ks)
        clash = any(helpers.get(n, text) != text for n, text in mine.items())
        if cur and (len(cur) >= max_parts or args + len(ks.ptr_args) > max_args or clash):
            out.append(cur)
            cur, args, helpers = [], 0, {}
        cur.append(k)
        args += len(ks.ptr_args)
        helpers.update(mine)
    if cur:
        out.append(cur)
    return out


def _split_source(ks: KernelSource) -> tuple[list[str], list[str], str]:
    """(import lines, helper function blocks, the kernel's own function) of a rendered kernel."""
    head, sep, main = ks.source.partition(f"{_JIT}def {ks.name}(")
    if not sep:
        raise ValueError(f"kernel {ks.name}: no '@triton.jit def {ks.name}(' in its source")
    blocks = head.split(_JIT)
    imports = [line for line in blocks[0].splitlines() if line.strip()]
    helpers = [(_JIT + b).strip() + "\n" for b in blocks[1:] if b.strip()]
    return imports, helpers, f"{_JIT}def {ks.name}(" + main


def _helpers(ks: KernelSource) -> dict[str, str]:
    out = {}
    for block in _split_source(ks)[1]:
        m = re.search(r"^def (\w+)\(", block, re.MULTILINE)
        if m:
            out[m.group(1)] = block
    return out


def _part_function(ks: KernelSource) -> tuple[str, list[str]]:
    """The kernel's function as a part: ``pid`` (the program id within the part) first, comment lines dropped;
    and its parameter names."""
    main = _COMMENT_LINE.sub("", _split_source(ks)[2])
    m = re.search(rf"^def {re.escape(ks.name)}\(([^()]*)\):", main, re.MULTILINE)
    if m is None:
        raise ValueError(f"kernel {ks.name}: its def line is not on one line")
    params = [p.split(":")[0].strip() for p in m.group(1).split(",") if p.strip()]
    main = main.replace(f"def {ks.name}(", f"def {ks.name}(pid, ", 1).replace("tl.program_id(0)", "pid")
    return main.rstrip() + "\n", params


def combo_source(parts: Sequence[KernelSource], indices: tuple[int, ...]) -> ComboSource:
    """The combo kernel of ``parts`` (rendered pointwise kernels; ``indices``: their positions in launch order):
    deterministic source text, named by a hash of that text without comments."""
    imports: list[str] = []
    helpers: dict[str, str] = {}
    functions: dict[str, str] = {}  # a kernel two parts share (``dedup``) is defined once
    params: list[str] = []
    ptr_args: list[tuple[str, str]] = []
    calls: list[str] = []
    ends: list[str] = []
    for k, ks in enumerate(parts):
        imp, _, _ = _split_source(ks)
        imports += [line for line in imp if line not in imports]
        for name, block in _helpers(ks).items():
            helpers.setdefault(name, block)
        fn, names = _part_function(ks)
        functions.setdefault(ks.name, fn)
        ptrs = [(f"{p}_p{k}", b) for p, b in ks.ptr_args]
        ptr_args += ptrs
        params += [p for p, _ in ptrs]
        numel, block = f"xnumel_p{k}", f"XBLOCK_p{k}"
        ends.append(f"    end{k} = {f'end{k - 1} + ' if k else ''}tl.cdiv({numel}, {block})")
        start = f"pid - end{k - 1}" if k else "pid"
        want = [p for p, _ in ks.ptr_args] + ["xnumel", "XBLOCK"]
        if names != want:
            raise ValueError(f"kernel {ks.name}: parameters {names}, expected {want}")
        args = ", ".join([start] + [p for p, _ in ptrs] + [numel, block])
        cond = "if" if k == 0 else "elif"
        calls.append(f"    {cond} pid < end{k}:\n        {ks.name}({args})")
    sizes = [f"xnumel_p{k}" for k in range(len(parts))]
    blocks = [f"XBLOCK_p{k}: tl.constexpr" for k in range(len(parts))]
    lines = [f"    # part {k}: {ks.name} over {ks.xnumel} elements" for k, ks in enumerate(parts)]
    body = "\n".join(lines + ["    pid = tl.program_id(0).to(tl.int32)"] + ends + calls) + "\n"
    signature = ", ".join(params + sizes + blocks)
    text = (
        "\n".join(imports)
        + "\n\n"
        + "\n".join(helpers.values())
        + "\n"
        + "\n".join(functions.values())
        + f"\n\n{_JIT}def KERNEL_NAME({signature}):\n{body}"
    )
    digest = hashlib.sha256(_COMMENT_LINE.sub("", text).encode()).hexdigest()[:10]
    name = f"kiln_combo{len(parts)}_{digest}"
    return ComboSource(name, text.replace("KERNEL_NAME", name), ptr_args, tuple(parts), indices)
