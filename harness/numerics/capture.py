"""Capture: run a program under several compilers on the device at hand, forward and backward, N times.

Terms:
  compiler      how a program's function is run: the numerics tier's arms of ``harness/arms.py``: ``eager``
                (as written), ``kiln`` (torch.compile with the kiln backend, emulate_eager_precision pinned
                off), ``kiln-emulate`` (kiln with ``compiler.config.patch(emulate_eager_precision=True)``),
                ``inductor`` (torch.compile's default backend). A `.pt2` program runs kiln through
                ``compiler.aot.compile_exported``.
  execution     one call: fresh leaf copies of the device inputs, the forward, then (programs with a backward)
                ``torch.autograd.grad`` of every float output with its seeded cotangent wrt the float inputs.
  repeat        the same compiled function executed again on the same inputs (compiled once): a run-to-run
                difference is nondeterminism.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from harness import arms

from . import inputs as inp
from .program import Program
from .records import SideInfo

TIER = "numerics"
COMPILERS = arms.names(TIER)


@dataclass
class Compiler:
    """A named way of running a program: `build` returns the callable; `context` wraps compile and runs."""

    name: str
    build: Callable[[Program], Callable[..., Any]]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    kiln: bool = False


class Cotangents(dict):
    """The cotangents of one run (CPU tensors by output name), made on first use from the run's seed."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed


@dataclass
class SideResult:
    """One compiler's outputs (one dict per repeat, tensors on the CPU), timings, kiln facts or an error."""

    compiler: str
    repeats: list[dict[str, torch.Tensor]] = field(default_factory=list)
    info: SideInfo = field(default_factory=SideInfo)
    error: str | None = None


def _builder(arm: arms.Arm) -> Callable[[Program], Callable[..., Any]]:
    def build(prog: Program) -> Callable[..., Any]:
        if arm.kiln:
            import compiler

            compiler.register()  # the backend (and the interpreter without a GPU)

            if prog.exported is not None:
                from compiler.aot import compile_exported

                return compile_exported(prog.exported)
        return arm.compile(prog.fn)

    return build


def _kiln_context(settings: dict[str, Any]) -> Callable[[], contextlib.AbstractContextManager]:
    def ctx() -> contextlib.AbstractContextManager:
        import compiler

        return compiler.config.patch(**settings)

    return ctx


def standard(name: str) -> Compiler:
    """One of COMPILERS; a kiln arm runs with emulate_eager_precision pinned to its own (off unless it sets it),
    whatever the environment says."""
    from .exc import NumericsError

    try:
        arm = arms.get(name, TIER)
    except arms.UnknownArm as e:
        raise NumericsError(str(e)) from None
    if not arm.kiln:
        return Compiler(arm.name, _builder(arm), arm.context)
    return Compiler(
        arm.name, _builder(arm), _kiln_context({"emulate_eager_precision": False, **arm.settings}), kiln=True
    )


def flatten_outputs(result: Any, prefix: str = "out") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in a (nested) result: ``out``, ``out.0``, ``out.key``..."""
    if isinstance(result, torch.Tensor):
        return [(prefix, result)]
    if isinstance(result, (list, tuple)):
        return [p for i, r in enumerate(result) for p in flatten_outputs(r, f"{prefix}.{i}")]
    if isinstance(result, dict):
        return [p for k in sorted(result, key=str) for p in flatten_outputs(result[k], f"{prefix}.{k}")]
    return []  # numbers and None are not outputs


def execute(
    fn: Callable[..., Any],
    prog: Program,
    args: dict[str, torch.Tensor],
    cotangent_for: Callable[[str, torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """One execution (see the module docstring); returns the outputs, still on their device."""
    grad_names = prog.grad_inputs()
    leaves = {n: a.detach().clone().requires_grad_(n in grad_names) for n, a in args.items()}
    with torch.enable_grad() if grad_names else torch.no_grad():
        flat = flatten_outputs(fn(*leaves.values()))
    outs = {name: t for name, t in flat}
    if grad_names:
        pairs = [(n, t) for n, t in flat if t.is_floating_point() and t.requires_grad]
        if pairs:
            grads = torch.autograd.grad(
                [t for _, t in pairs],
                [leaves[n] for n in grad_names],
                [cotangent_for(n, t) for n, t in pairs],
                allow_unused=True,
            )
            for n, g in zip(grad_names, grads):
                outs[f"grad.{n}"] = torch.zeros_like(leaves[n]) if g is None else g
    return {n: t.detach() for n, t in outs.items()}


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


@contextlib.contextmanager
def _kiln_record(enabled: bool) -> Iterator[list]:
    if not enabled:
        yield []
        return
    import compiler

    with compiler.capture() as graphs:
        yield graphs


def run_side(
    prog: Program,
    comp: Compiler,
    cpu_inputs: dict[str, torch.Tensor],
    cotangents: Cotangents,
    device: str,
    repeat: int = 1,
) -> SideResult:
    """Compile once and execute `repeat` times on the device; outputs come back to the CPU.

    `cotangents` (CPU) is filled on first use with the seeded cotangent of each float output, so every
    side uses the same ones. A compiler error is recorded in the result, not raised.
    """
    side = SideResult(comp.name)
    dev_inputs = {n: t.to(device) for n, t in cpu_inputs.items()}

    def cotangent_for(name: str, out: torch.Tensor) -> torch.Tensor:
        cot = cotangents.get(name)
        if cot is None or tuple(cot.shape) != tuple(out.shape) or cot.dtype != out.dtype:
            cot = cotangents[name] = inp.cotangent(cotangents.seed, name, tuple(out.shape), out.dtype)
        return cot.to(out.device)

    torch._dynamo.reset()
    try:
        with comp.context(), _kiln_record(comp.kiln) as graphs:
            fn = comp.build(prog)
            for _ in range(repeat):
                t0 = time.perf_counter()
                outs = execute(fn, prog, dev_inputs, cotangent_for)
                _sync(device)
                side.info.seconds.append(round(time.perf_counter() - t0, 3))
                side.repeats.append({n: t.to("cpu").contiguous() for n, t in outs.items()})
        if comp.kiln:
            side.info.graphs = len(graphs)
            side.info.kernels = sum(g.kernel_count for g in graphs)
            side.info.fallbacks = sorted({str(f) for g in graphs for f in g.all_fallbacks()})[:50]
    except Exception as e:  # noqa: BLE001 - a compiler failure is a finding of the run, recorded per side
        first = (str(e).strip().splitlines() or [""])[0][:300]
        side.error = f"{type(e).__name__}: {first}"
        side.repeats = []
    finally:
        torch._dynamo.reset()
    return side


def resolve_device(name: str) -> str:
    """auto -> cuda when a GPU is present (CUDA or ROCm), else cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def capture(
    prog: Program,
    compilers: list[Compiler],
    seed: int = 0,
    device: str = "auto",
    repeat: int = 1,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, torch.Tensor], Cotangents, list[SideResult]]:
    """Inputs (CPU), cotangents (CPU) and one SideResult per compiler, in the order given."""
    device = resolve_device(device)
    if any(c.kiln for c in compilers):
        import compiler

        compiler.register()  # before triton is imported by anything else
    cpu_inputs = prog.cpu_inputs(seed)
    cots = Cotangents(seed)
    sides = []
    for comp in compilers:
        t0 = time.perf_counter()
        side = run_side(prog, comp, cpu_inputs, cots, device, repeat)
        sides.append(side)
        if progress:
            status = f"FAILED: {side.error}" if side.error else f"{len(side.repeats[0])} outputs x {repeat}"
            progress(f"{prog.ref} [{device}] {comp.name}: {status} ({time.perf_counter() - t0:.1f}s)")
    return cpu_inputs, cots, sides
