"""A planted suite that stands in for the compiler when testing the compile check.

Like a compiler suite run with KILN_DUMP_DIR, it runs kernels on CPU under Triton's interpreter and leaves
them in the dump folder in the compiler's format (docs/TEAM.md). Its kernels are hand-written files in
kernels/: one valid, one that only the interpreter accepts. Not part of any suite (the file name does not
match test_*.py) and it skips itself without KILN_PLANTED_STATE.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

if not os.environ.get("KILN_PLANTED_STATE"):
    pytest.skip("planted tests run only under the harness's own tests", allow_module_level=True)

KERNELS = Path(__file__).parent / "kernels"


def _run_in_interpreter(name: str):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(name, KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.linspace(-2.0, 2.0, 100)
    y = torch.empty_like(x)
    getattr(module, name)[(1,)](x, y, x.numel(), BLOCK=128)
    return x, y


def test_kernels_run_in_the_interpreter_and_are_dumped():
    assert os.environ.get("TRITON_INTERPRET") == "1", "the compile check runs the suites in interpreter mode"
    x, y = _run_in_interpreter("kiln_planted_ok")
    assert (y == (x * 2).clamp(min=0)).all()
    x, y = _run_in_interpreter("kiln_planted_interp_only")
    assert (y == x + 1).all()
    dump = Path(os.environ["KILN_DUMP_DIR"]) / "kernels"
    dump.mkdir(parents=True, exist_ok=True)
    for path in sorted(KERNELS.iterdir()):
        if path.suffix in (".py", ".json"):
            shutil.copy(path, dump / path.name)
