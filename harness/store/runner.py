"""Who recorded a run: the runner's identity, stored with every bench run and test-history run (fleet store).

Terms:
  runner        the machine's name: $RUNNER_NAME (GitHub Actions sets it on a runner), else the host name.
  gpu model     the first GPU's name as the driver reports it (nvidia-smi), "" without one.
  driver        the GPU driver's version (NVIDIA's, else amdgpu's), "" without one.
  gpu label     the matrix's GPU label of the job ($KILN_GPU_LABEL, e.g. `h100`), "" when unset.
  hardware class  what results may be compared across: the gpu label, else the GPU model, else the device name
                the caller measured on (`cpu: <model>`), else "cpu"; ` (container)` added inside the harness's
                containers ($KILN_RUN_MODE), whose timings differ from the same machine's native ones. A baseline,
                a bisection reference and a history plot stay within one class unless asked (`--any-hardware`).
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from functools import cache

FIELDS = ("runner", "gpu_model", "driver", "gpu_label", "hw_class")


@dataclass(frozen=True)
class Runner:
    """A runner's identity (see the module docstring)."""

    runner: str = ""
    gpu_model: str = ""
    driver: str = ""
    gpu_label: str = ""
    hw_class: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


CONTAINER_MARK = " (container)"


def hardware_class(gpu_label: str, gpu_model: str, device_name: str = "", mode: str = "native") -> str:
    """The hardware class (module docstring): a container's runs are a class apart from native ones."""
    return (gpu_label or gpu_model or device_name or "cpu") + (CONTAINER_MARK if mode == "container" else "")


@cache
def _gpu() -> tuple[str, str]:
    """(first GPU's model, driver version) from nvidia-smi, else amdgpu's module version; ("", "") without.
    (harness.envinfo records the whole environment; this floor asks for these two only.)"""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        rows = [r.split(", ") for r in out.splitlines() if r.strip()]
        if rows and len(rows[0]) == 2:
            return rows[0][0].strip(), rows[0][1].strip()
    amd = Path("/sys/module/amdgpu/version")
    try:
        return "", amd.read_text().strip() if amd.exists() else ""
    except OSError:
        return "", ""


def current(device_name: str = "") -> Runner:
    """This machine's identity now (the GPU part read once per process); `device_name`: what the caller measured
    on, used for the hardware class when there is no GPU label or model."""
    from harness.settings import fleet_settings

    s = fleet_settings()
    model, driver = _gpu()
    if device_name and not device_name.startswith("cpu"):
        model = model or device_name
    elif device_name:
        model = ""  # a CPU measurement: the GPU in the box says nothing about its class
    return Runner(
        s.runner_name or socket.gethostname(),
        model,
        driver,
        s.gpu_label,
        hardware_class(s.gpu_label, model, device_name, s.run_mode),
    )


def from_env() -> dict[str, str]:
    """current() as a dict, for tests and exports."""
    return current().as_dict()


__all__ = ["FIELDS", "Runner", "current", "hardware_class", "from_env"]
