"""Environment record and git state of a bench run: the harness's own (`harness.envinfo`), so a bench run and
a suite run describe a machine the same way.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from harness.store import runner


def git_info(ref_override: str | None = None, commit_override: str | None = None) -> dict[str, Any]:
    """Commit, ref (branch name, or the override) and whether the tree in the working folder has
    uncommitted changes (None outside a git checkout)."""
    from harness.envinfo import git_info as checkout

    g = checkout(Path.cwd())
    return {"commit": commit_override or g["sha"], "ref": ref_override or g["branch"], "dirty": g["dirty"]}


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


def capture() -> dict[str, Any]:
    """The environment record stored with each run: `harness.envinfo.capture()` (host and device)."""
    from harness import envinfo

    return {"source": "harness.envinfo", **_jsonable(envinfo.capture())}


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


def new_run(
    profile: str,
    device: str,
    compilers: list[str],
    config: dict[str, Any],
    label: str | None = None,
    git_ref: str | None = None,
    git_commit: str | None = None,
) -> Any:
    """A fresh `RunInfo` (not yet stored) with this machine's git state, device name, environment record,
    torch's thread count and this process id added to `config`."""
    import uuid

    import torch

    from harness.bench.core.records import RunInfo
    from harness.bench.stores.store import now

    git = git_info(git_ref, git_commit)
    name = device_name(device)
    who = runner.current(name)  # who measures it: the hardware class baselines stay within
    return RunInfo(
        id=None,
        uid=uuid.uuid4().hex,
        created_at=now(),
        profile=profile,
        device=device,
        device_name=name,
        compilers=list(compilers),
        git_ref=git["ref"],
        git_commit=git["commit"],
        label=label,
        config={**config, "threads": torch.get_num_threads(), "pid": os.getpid(), "git_dirty": git["dirty"]},
        env=capture(),
        runner=who.runner,
        gpu_model=who.gpu_model,
        driver=who.driver,
        gpu_label=who.gpu_label,
        hw_class=who.hw_class,
    )
