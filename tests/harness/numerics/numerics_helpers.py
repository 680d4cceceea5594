"""Helpers of the numerics triage tests: saved runs with planted compilers, and the CLI in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.__main__ import main
from harness.numerics import capture as cap
from harness.numerics.program import resolve
from harness.numerics.store import save_run


def planted(
    name: str, change: Callable[[torch.Tensor, int], torch.Tensor], ref: str = "bf16_chain"
) -> cap.Compiler:
    """Eager, with `change(output, call number)` applied to the forward output: a planted difference."""
    calls = {"n": 0}

    def build(prog: Any) -> Callable[..., Any]:
        def fn(*args: torch.Tensor) -> torch.Tensor:
            calls["n"] += 1
            return change(prog.fn(*args).detach().clone(), calls["n"])

        return fn

    return cap.Compiler(name, build)


def save(
    path: Path,
    compilers: list[cap.Compiler | str],
    ref: str = "bf16_chain",
    seed: int = 0,
    repeat: int = 1,
    backward: bool = False,
    **store_kw: Any,
) -> Path:
    """Capture `ref` under `compilers` on the CPU and save the run folder."""
    prog = resolve(ref)
    prog.backward = backward
    comps = [cap.standard(c) if isinstance(c, str) else c for c in compilers]
    inputs, cots, sides = cap.capture(prog, comps, seed, "cpu", repeat)
    return save_run(path, prog, seed, "cpu", inputs, cots, sides, None, **store_kw)


def harness(capsys: Any, *args: str) -> tuple[int, str, str]:
    """`python -m harness ARGS` in this process: (exit code, stdout, stderr)."""
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error_line(rc: int, err: str) -> str:
    """The single stderr line of a failed command (exit 2, no traceback)."""
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("harness numerics: error: "), lines[0]
    return lines[0]
