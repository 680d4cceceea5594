"""The numerics suite's save hook: with ``KILN_NUMERICS_SAVE=DIR``, every kiln run of a tests/numerics test
(`kiln_testing.run_compiled`, which `check` uses too) is saved as a run folder under DIR.

Terms:
  case        one kiln run inside one test: ``DIR/<test id as a file name>[-k]`` for the k-th run (k > 0).
  sides       ``kiln`` (or ``kiln-emulate`` when the test asked for emulate_eager_precision): the compiled
              result; ``eager``: the same function run eagerly on copies of the same inputs.
  reference   computed at save time (the function in float64 eager on the CPU) and stored with the case: the
              tests' functions are lambdas that `compare` cannot import again.

Compare two saved suite runs (two machines, or kiln vs another compiler) case by case with
``python -m harness numerics compare DIR_A:kiln DIR_B:kiln``; cases present in one folder only are listed.
Inputs made on the device differ between machines: such cases are reported as not comparable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness import arms

from . import inputs as inp
from .capture import SideResult, flatten_outputs
from .program import Program
from .records import ProgramKind
from .store import safe_name, save_run

ENV = "KILN_NUMERICS_SAVE"


def save_dir() -> Path | None:
    """The folder the suite saves into, or None when saving is off."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


class Recorder:
    """Saves the kiln runs of one test (see the module docstring)."""

    def __init__(self, root: Path, test_id: str) -> None:
        self.root, self.test_id, self.count = root, test_id, 0

    def record(
        self, fn: Callable[..., Any], args: tuple[Any, ...], compiled: Any, settings: dict[str, Any]
    ) -> Path | None:
        """Save one case; None when the run cannot be saved (a non-tensor argument, a non-tensor result)."""
        if not args or not all(isinstance(a, torch.Tensor) for a in args):
            return None
        kiln = dict(flatten_outputs(compiled))
        if not kiln:
            return None
        cpu = {f"arg{i}": a.detach().to("cpu").contiguous() for i, a in enumerate(args)}
        eager = dict(flatten_outputs(fn(*[a.detach().clone() for a in args])))
        try:
            with torch.no_grad():
                ref = dict(
                    flatten_outputs(fn(*[t.double() if t.is_floating_point() else t for t in cpu.values()]))
                )
        except Exception:  # noqa: BLE001 - some programs have no float64 form; the case is still comparable
            ref = None
        name = arms.KILN_EMULATE if settings.get("emulate_eager_precision") else arms.KILN
        sides = [
            SideResult(name, [{n: t.detach().to("cpu").contiguous() for n, t in kiln.items()}]),
            SideResult("eager", [{n: t.detach().to("cpu").contiguous() for n, t in eager.items()}]),
        ]
        case = safe_name(self.test_id.replace("/", ".").replace("::", "."))[:180]
        path = self.root / (case if self.count == 0 else f"{case}-{self.count}")
        ref_id = self.test_id if self.count == 0 else f"{self.test_id}#{self.count}"
        self.count += 1
        specs = [
            inp.InputSpec(n, tuple(t.shape), inp.dtype_name(t.dtype), grad=False) for n, t in cpu.items()
        ]
        prog = Program(
            ref_id,
            fn,
            specs,
            backward=False,
            kind=ProgramKind.SUITE_CASE,
            note=f"a kiln run saved by the numerics suite ({ENV})",
        )
        device = str(args[0].device)
        return save_run(path, prog, 0, device, cpu, {}, sides, None, reference=ref)
