"""The float64 reference: the program in fp64 eager on the CPU, from the run's own inputs and cotangents.

Terms:
  reference   every output (forward and gradients) of the program run eagerly on the CPU with its floating
              inputs and cotangents converted to float64 (exactly: every narrower float is a float64 value).
              The program's own casts stay (a ``.to(torch.bfloat16)`` inside it rounds here too), so the
              reference is "the same program with every implicit rounding removed".
  stored      runs saved by the numerics suite carry the reference computed when they were saved (their
              programs are test lambdas that cannot be imported again); it is used when the program cannot be
              resolved.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from .capture import execute
from .exc import NotComparable, ProgramError
from .program import Program, resolve
from .records import ProgramKind
from .store import RunFolder


def _as64(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def fp64_function(prog: Program) -> Callable[..., Any]:
    """The callable that runs the program in float64 (a float64 copy of an exported module's weights)."""
    if prog.exported is None:
        return prog.fn
    mod = copy.deepcopy(prog.exported.module()).double()
    for node in mod.graph.nodes:  # lifted constants that are plain attributes, not buffers
        if node.op == "get_attr":
            owner, _, attr = node.target.rpartition(".")
            obj = mod.get_submodule(owner) if owner else mod
            val = getattr(obj, attr, None)
            if isinstance(val, torch.Tensor) and val.is_floating_point():
                setattr(obj, attr, _as64(val))
    return mod


def compute(
    prog: Program, cpu_inputs: dict[str, torch.Tensor], cotangents: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Every output of the program in float64 eager on the CPU (see the module docstring)."""
    args = {n: _as64(t.to("cpu")) for n, t in cpu_inputs.items()}

    def cotangent_for(name: str, out: torch.Tensor) -> torch.Tensor:
        if name not in cotangents:
            raise NotComparable(
                f"{prog.ref}: the fp64 program has a float output {name!r} that no run has a cotangent for"
            )
        return cotangents[name].to(torch.float64)

    try:
        with torch.random.fork_rng(devices=[]):
            return execute(fp64_function(prog), prog, args, cotangent_for)
    except NotComparable:
        raise
    except Exception as e:  # noqa: BLE001 - the program itself fails in float64
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ProgramError(f"{prog.ref} fails in float64 on the CPU: {type(e).__name__}: {first}") from None


def for_run(run: RunFolder, prefer: str = "compute") -> tuple[dict[str, torch.Tensor], str]:
    """(reference outputs, how they were obtained) for a run: computed from its program, else stored."""
    stored = run.manifest.reference
    if prefer == "stored" and stored:
        return {n: run.read(e) for n, e in stored.items()}, "stored with the run (fp64 eager on CPU)"
    spec = run.program
    if spec.kind is ProgramKind.SUITE_CASE:
        if not stored:
            raise ProgramError(f"{run.path}: a saved suite case without a stored fp64 reference")
        return {n: run.read(e) for n, e in stored.items()}, "stored with the run (fp64 eager on CPU)"
    try:
        override = None if spec.kind is ProgramKind.SUITE else list(spec.inputs) or None
        prog = resolve(spec.ref, override)
    except ProgramError as e:
        if stored:
            return {n: run.read(e) for n, e in stored.items()}, "stored with the run (fp64 eager on CPU)"
        raise ProgramError(f"cannot compute the fp64 reference: {e}") from None
    prog.backward = spec.backward  # `run --no-backward` turned it off
    here, there = prog.identity(), spec.identity()
    diff = next((k for k in here if here[k] != there[k]), None)
    if diff is not None:
        raise NotComparable(
            f"program {spec.ref} resolves here to another {diff} than the run recorded "
            f"({here[diff]!r} vs {there[diff]!r})"
        )
    ref = compute(prog, run.tensors("inputs"), run.tensors("cotangents"))
    return ref, "computed now: fp64 eager on CPU from the run's inputs"
