"""The ``combo`` pass: independent small pointwise kernels of one graph launched as one combo kernel.

A launch-bound graph (an optimizer step: one small update kernel per parameter) spends its time launching, not
computing. A *combo kernel* runs several kernels (its *parts*) in one launch: its grid is the sum of the parts'
grids, and each program finds its part by program id ranges (``pid < end0``: part 0, ``pid < end1``: part 1 with
``pid - end0``, ...). Every part keeps its own function (the kernel ``render`` made, with ``tl.program_id(0)``
replaced by the program id within its part), its own block size (``XBLOCK_p<k>``, chosen at launch from its own
size, as for a launch of its own) and its own buffers.

Which kernels are combined: pointwise kernels (no reduction, scatter, scan or fixed grid) of static sizes without
size arguments and at most ``combo_max_numel`` elements (launch-bound), gathered in launch order, adjacent or not.
A combo launches at its first part's place, so a kernel joins one only when it is independent of its parts and
of every kernel launched between them: it reads nothing they write and writes nothing they read or write (a
buffer stored in place, ``Schedule.in_place``, counts as its input; the parts of one launch run in any order).
An extern or subgraph call, or a scatter or scan kernel, ends every combo gathered so far. A combo holds at most
``combo_max_parts`` parts and ``combo_max_args`` arguments (pointers and one size per part: a kernel's
parameters share a few kilobytes of launch memory, and its compile time grows with its size); a combo of one
kernel stays that kernel. The ``split`` pass (``split.py``) has already cut small pointwise kernels into their
independent parts, so that an optimizer step's per-parameter updates land here as parts.

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
    """The ``combo`` pass: ``kernels`` with independent small pointwise kernels grouped into combo kernels
    (``Kernels.combos``); unchanged when the ``combo_kernels`` setting is off or no combo has two parts."""
    s = config.settings()
    if not s.combo_kernels:
        return kernels
    combos = [
        combo_source([kernels.sources[k] for k in parts], tuple(parts))
        for parts in _groups(schedule, kernels, s.combo_max_numel, s.combo_max_parts, s.combo_max_args)
    ]
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


def arg_count(ks: KernelSource) -> int:
    """Arguments a part adds to a combo's launch: its pointers and its size."""
    return len(ks.ptr_args) + 1


@dataclasses.dataclass
class _Open:
    """A combo being gathered: its parts (indices into ``Kernels.sources``), what they read and write, and
    what the kernels launched after its first part and not in it read and write (``later_*``)."""

    parts: list[int]
    reads: set[str]
    writes: set[str]
    later_reads: set[str] = dataclasses.field(default_factory=set)
    later_writes: set[str] = dataclasses.field(default_factory=set)
    args: int = 0
    helpers: dict[str, str] = dataclasses.field(default_factory=dict)

    def conflicts(self, reads: set[str], writes: set[str]) -> bool:
        """A kernel with these reads and writes may not launch with the parts, at the first part's place."""
        if reads & (self.writes | self.later_writes):
            return True
        return bool(writes & (self.reads | self.writes | self.later_reads | self.later_writes))


def _groups(
    schedule: Schedule, kernels: Kernels, max_numel: int, max_parts: int, max_args: int
) -> list[list[int]]:
    """The parts (indices into ``kernels.sources``, in launch order) of each combo, ordered by first part.

    Kernels are visited in launch order. A combinable kernel joins the first open combo it may join, else opens
    one; a combo launches at its first part's place, so a kernel joins only when it is independent of the
    parts (reads nothing they write, writes nothing they read or write) and of every kernel launched between
    (whose launch it moves before). An extern or subgraph call, or a scatter or scan kernel (which writes
    memory it shares with another buffer), closes every open combo. A combo closes at ``max_parts`` parts;
    a kernel that would take it past ``max_args`` arguments (pointers and sizes), or whose helper functions
    differ from its parts' of the same name, looks further."""
    done: list[_Open] = []
    open_: list[_Open] = []
    k = 0
    for item in schedule.items:
        if not isinstance(item, KernelGroup) or item.kind:
            done += open_
            open_ = []
            if isinstance(item, KernelGroup):
                k += 1
            continue
        ks = kernels.sources[k]
        reads, writes = kernels.access(k)
        joined: _Open | None = None
        if combinable(item, ks, max_numel):
            mine = _helpers(ks)
            for c in open_:
                if c.args + arg_count(ks) > max_args or c.conflicts(reads, writes):
                    continue
                if any(c.helpers.get(n, text) != text for n, text in mine.items()):
                    continue
                joined = c
                break
            if joined is None:
                joined = _Open([], set(), set())
                open_.append(joined)
            joined.parts.append(k)
            joined.reads |= reads
            joined.writes |= writes
            joined.args += arg_count(ks)
            joined.helpers.update(mine)
        for c in open_:
            if c is not joined:
                c.later_reads |= reads
                c.later_writes |= writes
        done += [c for c in open_ if len(c.parts) >= max_parts]
        open_ = [c for c in open_ if len(c.parts) < max_parts]
        k += 1
    done += open_
    return sorted(c.parts for c in done if len(c.parts) >= 2)


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
    lines = [f"    # part {k}: {ks.name}" for k, ks in enumerate(parts)]
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
