"""The compiler arms: every way the harness runs a function, named once, for every tier.

Terms:
  arm           a named way of running a function or model: ``eager`` (as written, no torch.compile: the
                baseline), ``kiln`` (``torch.compile(fn, backend="kiln")`` after ``import compiler``),
                ``inductor`` (``backend="inductor"``), the CUDA-graph arms ``kiln-cg`` (``backend="kiln",
                options={"cudagraphs": True}``) and ``inductor-cg`` (``mode="reduce-overhead"``), and the numerics
                tier's ``kiln-emulate`` (kiln under ``compiler.config.patch(emulate_eager_precision=True)``),
                ``kiln-autotune`` (``backend="kiln", mode="max-autotune-no-cudagraphs"``) and ``inductor-combo``
                (``backend="inductor", options={"combo_kernels": True}``: Inductor's horizontal fusion of independent
                kernels, off by default, the peer of kiln's combo kernels): the model and kernel tiers run these
                two when named, never by default, `OPTIONAL`.
                `ARMS` holds them; `get` finds one by name.
  tier          a part of the harness that runs arms, and the arms it offers, default order first (`TIERS`):
                ``kernel`` (``bench run``/``selftest``/``gpu`` and the side-by-side workers), ``model`` (``bench
                models``/``model-profile``), ``overhead`` (``bench overhead``), ``numerics`` (``numerics run``).
                The kernel and model tiers also run any other registered torch.compile backend by its name
                (`check` with ``any_backend``): a plain arm, ``torch.compile(fn, backend=NAME)``.
  peer          the arm a tier's ratio is taken against ("vs inductor"): ``inductor`` for the plain arms,
                ``inductor-cg`` for the CUDA-graph ones.
  step marking  ``torch.compiler.cudagraph_mark_step_begin()`` before each step: Inductor's CUDA-graph trees need it
                when a step's outputs are still alive at the next (`Arm.marks_steps`: ``inductor-cg``; kiln's
                own CUDA graphs do not). The overhead tier calls `Arm.step_hook` (so kiln-cg's calls carry no
                marking); the model tier marks the steps of every CUDA-graph arm, as a user of either would.

Each tier passes its own `torch.compile` extras to `Arm.compile` (the kernel tier ``dynamic=False``); everything
else an arm does is here. Importing this module imports neither torch nor the compiler.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.exc import UsageError

EAGER = "eager"
KILN = "kiln"
INDUCTOR = "inductor"
KILN_CG = "kiln-cg"
INDUCTOR_CG = "inductor-cg"
KILN_EMULATE = "kiln-emulate"
KILN_AUTOTUNE = "kiln-autotune"
INDUCTOR_COMBO = "inductor-combo"


class UnknownArm(UsageError):
    """A compiler name that no tier knows, or that the asking tier does not run (exit 2, one line)."""


@dataclass(frozen=True)
class Arm:
    """One compiler arm (module docstring). `backend` None is eager; `settings` are kiln settings patched
    around compiling and running (`context`); `cuda_graphs` arms need a CUDA device."""

    name: str
    backend: str | None
    mode: str | None = None
    options: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    cuda_graphs: bool = False
    marks_steps: bool = False
    peer: str = INDUCTOR
    summary: str = ""

    @property
    def eager(self) -> bool:
        return self.backend is None

    @property
    def kiln(self) -> bool:
        return self.backend == KILN

    @property
    def needs_cuda(self) -> bool:
        return self.cuda_graphs

    def compile_kwargs(self, **extra: Any) -> dict[str, Any]:
        """The keyword arguments of this arm's `torch.compile` call (`extra`: a tier's own, e.g. dynamic=False)."""
        if self.eager:
            raise ValueError(f"{self.name} runs the function as written: no torch.compile")
        kw: dict[str, Any] = {"backend": self.backend}
        if self.mode is not None:
            kw["mode"] = self.mode
        if self.options is not None:
            kw["options"] = dict(self.options)
        return {**kw, **extra}

    def compile(self, fn: Callable[..., Any], **extra: Any) -> Callable[..., Any]:
        """`fn` as this arm runs it: itself for eager, else `torch.compile(fn, **compile_kwargs(**extra))` (kiln
        arms register the backend first: `compiler.register()`, which also picks Triton's interpreter without a
        GPU)."""
        if self.eager:
            return fn
        if self.kiln:
            importlib.import_module("compiler").register()
        import torch

        return torch.compile(fn, **self.compile_kwargs(**extra))

    def context(self) -> contextlib.AbstractContextManager:
        """What compiling and running this arm happens under: its kiln `settings` patched, else nothing."""
        if not self.settings:
            return contextlib.nullcontext()
        import compiler

        return compiler.config.patch(**self.settings)

    def step_hook(self) -> Callable[[], None]:
        """What to call before each step (module docstring: step marking): a function doing nothing for arms
        that need no marking."""
        if not self.marks_steps:
            return _nothing
        import torch

        return torch.compiler.cudagraph_mark_step_begin


def _nothing() -> None:
    return None


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm(EAGER, None, summary="PyTorch as written (the baseline)"),
        Arm(KILN, KILN, summary='torch.compile(fn, backend="kiln")'),
        Arm(INDUCTOR, INDUCTOR, summary='torch.compile(fn, backend="inductor")'),
        Arm(
            KILN_CG,
            KILN,
            options={"cudagraphs": True},
            cuda_graphs=True,
            peer=INDUCTOR_CG,
            summary='backend="kiln", options={"cudagraphs": True}',
        ),
        Arm(
            INDUCTOR_CG,
            INDUCTOR,
            mode="reduce-overhead",
            cuda_graphs=True,
            marks_steps=True,
            peer=INDUCTOR_CG,
            summary='mode="reduce-overhead"',
        ),
        Arm(
            KILN_EMULATE,
            KILN,
            settings={"emulate_eager_precision": True},
            summary="kiln with compiler.config.patch(emulate_eager_precision=True)",
        ),
        Arm(
            KILN_AUTOTUNE,
            KILN,
            mode="max-autotune-no-cudagraphs",
            summary='backend="kiln", mode="max-autotune-no-cudagraphs" (launch configs timed on the GPU)',
        ),
        Arm(
            INDUCTOR_COMBO,
            INDUCTOR,
            options={"combo_kernels": True},
            summary='backend="inductor", options={"combo_kernels": True} (independent kernels launched as one)',
        ),
    )
}

#: the arms each tier runs, in its default order (`default`)
TIERS: dict[str, tuple[str, ...]] = {
    "kernel": (KILN, INDUCTOR, EAGER),
    "model": (KILN, INDUCTOR, KILN_CG, INDUCTOR_CG, EAGER),
    "overhead": (EAGER, KILN, INDUCTOR, KILN_CG, INDUCTOR_CG),
    "numerics": (KILN, KILN_EMULATE, INDUCTOR, EAGER),
}

#: arms a tier runs when asked by name but leaves out of its default list: kiln-autotune times candidate configs
#: of every kernel at its first launch (minutes a model); inductor-combo is a second Inductor configuration, the
#: peer of kiln's combo kernels on the optimizer rows, not part of every comparison
OPTIONAL: dict[str, tuple[str, ...]] = {
    "model": (KILN_AUTOTUNE, INDUCTOR_COMBO),
    "kernel": (KILN_AUTOTUNE, INDUCTOR_COMBO),
}

#: registered torch.compile backends known without asking Dynamo: listing its backends loads their entry points,
#: which imports kiln (after Inductor's triton it warns that it cannot choose the interpreter)
_PLAIN_BACKENDS = ("aot_eager",)


def names(tier: str | None = None) -> tuple[str, ...]:
    """The arms of `tier` in its default order, or every arm."""
    return TIERS[tier] if tier else tuple(ARMS)


def default(tier: str, eager_first: bool = False) -> str:
    """`tier`'s default `--compilers` value (eager moved first with `eager_first`)."""
    ns = names(tier)
    if eager_first:
        ns = (EAGER, *(n for n in ns if n != EAGER))
    return ",".join(ns)


def get(name: str, tier: str | None = None, *, any_backend: bool = False) -> Arm:
    """The arm `name` (of `tier` when given), or with `any_backend` a plain arm of a registered torch.compile
    backend of that name; else `UnknownArm` naming the known ones."""
    arm = ARMS.get(name)
    if arm is not None and (tier is None or name in TIERS[tier] or name in OPTIONAL.get(tier, ())):
        return arm
    known = set(names(tier)) | set(OPTIONAL.get(tier, ()) if tier else ())
    if any_backend:
        if arm is None and name in _PLAIN_BACKENDS:
            return Arm(name, name)
        import torch

        backends = set(torch._dynamo.list_backends()) | set(_PLAIN_BACKENDS)
        if arm is None and name in backends:
            return Arm(name, name)
        known |= backends
    where = [t for t, ns in TIERS.items() if name in ns or name in OPTIONAL.get(t, ())]
    hint = f"; {name} runs in the {', '.join(where)} tier{'s' if len(where) > 1 else ''}" if where else ""
    raise UnknownArm(f"unknown compiler {name!r} (known: {', '.join(sorted(known))}){hint}")


def check(requested: Iterable[str], tier: str, *, any_backend: bool = False) -> list[Arm]:
    """The arms named by `requested` (duplicates dropped, order kept); the first unknown name raises."""
    return [get(n, tier, any_backend=any_backend) for n in dict.fromkeys(requested)]


def split(spec: str) -> list[str]:
    """`a, b,c` -> [a, b, c] (a `--compilers` value)."""
    return [c.strip() for c in spec.split(",") if c.strip()]


def is_kiln(name: str) -> bool:
    """Whether `name` is one of kiln's arms (a name that is no arm is not)."""
    arm = ARMS.get(name)
    return arm is not None and arm.kiln


def cuda_graph_arms(requested: Iterable[str]) -> list[str]:
    """Those of `requested` that need CUDA graphs (and so a CUDA device)."""
    return [n for n in requested if n in ARMS and ARMS[n].cuda_graphs]


def peer(name: str) -> str:
    """The arm `name`'s ratios are taken against (inductor for names that are no arm)."""
    arm = ARMS.get(name)
    return arm.peer if arm is not None else INDUCTOR


# One colour per arm in every plot the harness draws (matplotlib colour names; kernel, model and history plots
# alike): a compiler keeps its colour from one figure to the next. Kiln's arms are warm, Inductor's cool.
COLOURS: dict[str, str] = {
    EAGER: "tab:gray",
    KILN: "tab:orange",
    KILN_CG: "tab:red",
    KILN_EMULATE: "tab:brown",
    KILN_AUTOTUNE: "gold",
    INDUCTOR: "tab:blue",
    INDUCTOR_CG: "tab:cyan",
    INDUCTOR_COMBO: "tab:purple",
}
_SPARE_COLOURS = ("tab:green", "tab:pink", "tab:olive", "teal")


def colour(name: str) -> str:
    """The plot colour of arm `name`; another backend's name gets a spare colour chosen by its letters (the
    same in every figure and every process)."""
    if name in COLOURS:
        return COLOURS[name]
    return _SPARE_COLOURS[sum(name.encode()) % len(_SPARE_COLOURS)]
