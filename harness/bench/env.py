"""Environment record of a bench run.

Uses the harness's own capture (`harness.envinfo`) when it exists; otherwise a minimal capture here:
interpreter, torch/triton versions, device, host, git commit and ref, and the KILN_/TRITON_/TORCH env vars.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from typing import Any


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_info(ref_override: str | None = None) -> dict[str, Any]:
    """Commit, ref (branch name, or the override) and whether the tree has uncommitted changes."""
    commit = os.environ.get("KILN_BENCH_GIT_COMMIT") or _git("rev-parse", "HEAD")
    ref = ref_override or _git("rev-parse", "--abbrev-ref", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "ref": ref, "dirty": bool(status) if commit else None}


def device_name(device: str) -> str:
    """A stable description of the device timings came from (GPU name, or the CPU model)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {model}"


def _minimal() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001 - a missing/broken triton is a fact to record, not a failure
        info["triton"] = f"unavailable: {type(e).__name__}"
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    prefixes = ("KILN_", "TRITON_", "TORCH", "CUDA_VISIBLE", "HIP_VISIBLE", "OMP_NUM_THREADS")
    info["env"] = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(prefixes)}
    return info


def capture() -> dict[str, Any]:
    """The environment record stored with each run (the harness's capture when available)."""
    try:
        from harness import envinfo  # type: ignore[attr-defined]

        for name in ("capture", "collect", "capture_env", "environment"):
            fn = getattr(envinfo, name, None)
            if callable(fn):
                rec = fn()
                rec = rec if isinstance(rec, dict) else getattr(rec, "__dict__", {"value": str(rec)})
                return {"source": f"harness.envinfo.{name}", **_jsonable(rec)}
    except Exception:  # noqa: BLE001 - fall back to the minimal capture below
        pass
    return {"source": "harness.bench.env", **_minimal()}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "__dict__"):
        return _jsonable(vars(obj))
    return str(obj)


def new_run(profile: str, device: str, compilers: list[str], config: dict[str, Any], label: str | None = None,
            git_ref: str | None = None) -> Any:
    """A fresh `RunInfo` (not yet stored) with this machine's git state, device name, environment record,
    torch's thread count and this process id added to `config`."""
    import uuid

    import torch

    from .records import RunInfo
    from .store import now

    git = git_info(git_ref)
    return RunInfo(
        id=None,
        uid=uuid.uuid4().hex,
        created_at=now(),
        profile=profile,
        device=device,
        device_name=device_name(device),
        compilers=list(compilers),
        git_ref=git["ref"],
        git_commit=git["commit"],
        label=label,
        config={**config, "threads": torch.get_num_threads(), "pid": os.getpid(), "git_dirty": git["dirty"]},
        env=capture(),
    )
