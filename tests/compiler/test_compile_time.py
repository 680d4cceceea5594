"""``python -m compiler.tools.compile_time``: a child measurement compiles with kiln's kernels, not ATen."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_child_run_as_a_module_registers_kiln_before_it_compiles(tmp_path):
    """Run as ``-m compiler.tools.compile_time`` the package is imported before torch, so its import registers
    nothing: where the project is not installed (the GPU box) ``backend="kiln"`` was unknown, and where its
    entry point registered it, Triton was imported before the interpreter was chosen and every CPU graph fell
    back to ATen (0 kernels). The child registers the backend itself: the small MLP runs kiln's kernels."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-m", "compiler.tools.compile_time", "--child", "mlp", "--variant", "kiln"]
        + ["--phase", "cold", "--small", "--device", "cpu", "--layers", "2", "--dtype", "fp32"],
        cwd=tmp_path,
        env={**env, "KILN_CACHE_DIR": str(tmp_path / "kiln")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["kernels"] > 0 and result["launches"] > 0, result
    assert "fall back to ATen" not in proc.stderr
