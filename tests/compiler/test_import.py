"""``import compiler`` has no side effects on its own; with torch imported it registers the backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_import_compiler_sets_nothing_imports_no_torch_and_exits_0():
    code = (
        "import os, sys; before = dict(os.environ); import compiler; "
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch or triton imported'; "
        "compiler.config.settings(); assert dict(os.environ) == before; print('ok')"
    )
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_a_bad_setting_does_not_stop_the_import():
    proc = _run("import os; os.environ['KILN_INTERPRET'] = 'sometimes'; import compiler; print('imported')")
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr[-2000:]


def test_import_after_torch_registers_kiln():
    code = (
        "import torch; import compiler; from torch._dynamo.backends.registry import lookup_backend; "
        "print(lookup_backend('kiln').__module__)"
    )
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "compiler", proc.stderr[-2000:]


def test_a_bad_setting_after_torch_registers_and_fails_at_the_first_compile():
    code = (
        "import os; os.environ['KILN_INTERPRET'] = 'sometimes'; import torch; import compiler\n"
        "try:\n    torch.compile(lambda x: x + 1, backend='kiln')(torch.ones(2))\n"
        "except Exception as e:\n    from harness.exc import compiler_config_error\n"
        "    print(compiler_config_error(e))"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "KILN_INTERPRET='sometimes': expected auto, 0 or 1"
