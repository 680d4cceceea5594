"""GPU health check, run before the suites: on every visible device a small matmul (checked against a
float64 CPU reference) and a Triton kernel compiled and launched (checked against torch).

For the cpu backend the "device" is the CPU and the kernel runs in Triton's interpreter. A missing
device, driver or docker gives a `NoDeviceError` / `DockerError` with a one-line explanation.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.exc import HealthError, MissingTool, NoDeviceError
from harness.matrix import Backend


@dataclass
class DeviceHealth:
    """Result for one device: `ok` only when both checks passed."""

    device: str
    name: str
    matmul_max_err: float | None = None
    kernel_max_err: float | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class HealthReport:
    backend: str
    devices: list[DeviceHealth] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.devices) and all(d.ok for d in self.devices)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "ok": self.ok, "devices": [asdict(d) for d in self.devices]}


def require_host_devices(backend: Backend) -> None:
    """Before starting a GPU container: the device files the container options pass must exist."""
    missing = [p for p in backend.host_devices if not Path(p).exists()]
    if missing:
        hint = {
            "cuda": "NVIDIA driver not loaded or no NVIDIA GPU",
            "rocm": "amdgpu/ROCm driver not loaded or no AMD GPU",
        }.get(backend.name, "device missing")
        raise NoDeviceError(
            f"backend {backend.name} needs a GPU but {', '.join(missing)} does not exist "
            f"({hint}); use --backend cpu on this machine"
        )


def _devices(backend: Backend) -> list[str]:
    import torch

    if backend.device == "cpu":
        return ["cpu"]
    want_hip = backend.name == "rocm"
    is_hip = getattr(torch.version, "hip", None) is not None
    if want_hip != is_hip:
        built = f"HIP {torch.version.hip}" if is_hip else f"CUDA {torch.version.cuda}"
        raise NoDeviceError(
            f"backend {backend.name} needs a {'ROCm' if want_hip else 'CUDA'} build of torch; "
            f"this torch {torch.__version__} is built for {built or 'CPU only'}"
        )
    if not is_hip and torch.version.cuda is None:
        raise NoDeviceError(
            f"backend {backend.name} needs a CUDA build of torch; torch {torch.__version__} is a "
            "CPU-only build"
        )
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise NoDeviceError(
            f"backend {backend.name}: torch {torch.__version__} sees no GPU "
            "(driver missing, device not passed to the container, or CUDA_VISIBLE_DEVICES empty)"
        )
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def check_device(dev: str) -> DeviceHealth:
    """Matmul and Triton kernel on one device."""
    import torch

    name = "cpu (Triton interpreter)" if dev == "cpu" else torch.cuda.get_device_name(torch.device(dev))
    result = DeviceHealth(device=dev, name=name)
    start = time.perf_counter()
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(64, 64, generator=gen)
        b = torch.randn(64, 64, generator=gen)
        ref = a.double() @ b.double()
        got = (a.to(dev) @ b.to(dev)).cpu().double()
        if dev != "cpu":
            torch.cuda.synchronize(torch.device(dev))
        result.matmul_max_err = float((got - ref).abs().max())
        if not result.matmul_max_err < 5e-2:  # tf32 allowed; NaN fails
            raise HealthError(f"matmul on {dev} off by {result.matmul_max_err}")
        from harness.checks._health_kernel import axpy

        x = torch.randn(1000, generator=gen).to(dev)
        y = torch.randn(1000, generator=gen).to(dev)
        out = axpy(x, y, 2.0)
        if dev != "cpu":
            torch.cuda.synchronize(torch.device(dev))
        result.kernel_max_err = float((out.cpu() - (2.0 * x.cpu() + y.cpu())).abs().max())
        if not result.kernel_max_err < 1e-5:
            raise HealthError(f"Triton kernel on {dev} off by {result.kernel_max_err}")
    except Exception as e:  # noqa: BLE001 - any failure is the device's health
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def check(backend: Backend) -> HealthReport:
    """Check every visible device of the backend. Raises NoDeviceError when there is none."""
    for key, value in backend.env.items():
        os.environ.setdefault(key, value)  # TRITON_INTERPRET must precede the first `import triton`
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        raise MissingTool(
            "torch is not installed for this Python; the health check needs torch and triton"
        ) from None
    report = HealthReport(backend.name)
    for dev in _devices(backend):
        report.devices.append(check_device(dev))
    return report


def describe(report: HealthReport) -> str:
    lines = []
    for d in report.devices:
        state = "ok" if d.ok else f"FAILED ({d.error})"
        lines.append(
            f"health {report.backend} {d.device} [{d.name}]: {state} "
            f"(matmul err {d.matmul_max_err}, kernel err {d.kernel_max_err}, {d.seconds}s)"
        )
    return "\n".join(lines)


# ---- CLI: `python -m harness health` --------------------------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument("--backend", help="backend to check (default: detected)")
    p.add_argument("--json", dest="json_out", help="also write the report as JSON to this file")


def cli_main(args: Any) -> int:
    """Check every device of the backend with this Python (`run` calls this inside the container)."""
    from harness import matrix

    backend = matrix.load().backend(args.backend or matrix.detect_backend())
    report = check(backend)
    print(describe(report))
    if args.json_out:
        from harness.results import atomic_write_text

        atomic_write_text(Path(args.json_out), json.dumps(report.to_json(), indent=2) + "\n")
    if not report.ok:
        bad = [d.device for d in report.devices if not d.ok]
        raise HealthError(f"{len(bad)} of {len(report.devices)} device(s) failed: {', '.join(bad)}")
    return 0
