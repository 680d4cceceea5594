"""Environment capture: the record stored with every run's results (env.json).

Two halves, because in container mode they are taken in different places:
  host    taken by the harness process: git sha and dirty state, host name, docker server version,
          the image tag and id (with its base digest or id and lock digest), the host's driver (nvidia-smi /
          amdgpu module), the backend's lock file in the tree (`lock`: path, sha256, stale).
  device  taken by the Python that runs the suites (inside the container, or natively): Python,
          torch/triton/CUDA/ROCm versions, driver, GPU name and count, the compiler's settings
          (`compiler.config.settings()` when importable, else the import error), and the lock this
          Python was installed from (`lock`: $KILN_LOCK_FILE in the images, natively the backend's lock
          in the tree; its sha256 and the locked packages installed at another version).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.exc import SettingsError
from harness.git import output as git_output
from harness.settings import settings

if TYPE_CHECKING:
    from harness.matrix import Backend

SCHEMA = 1


def _cmd(argv: list[str], cwd: Path | None = None, timeout: float = 20, strip: bool = True) -> str | None:
    """stdout of `argv` (stripped unless `strip=False`), or None when the program is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() if strip else proc.stdout


def git_info(root: Path) -> dict[str, Any]:
    """sha, branch and dirty state of the checkout (dirty: tracked files modified or staged)."""
    sha = git_output(root, "rev-parse", "HEAD")
    if sha is None:
        return {"sha": None, "dirty": None, "branch": None, "note": "not a git checkout or git missing"}
    status = git_output(root, "status", "--porcelain", "--untracked-files=no", strip=False) or ""
    return {
        "sha": sha,
        "dirty": bool(status.strip()),
        "dirty_files": sorted(line[3:] for line in status.splitlines() if line.strip())[:50],
        "branch": git_output(root, "rev-parse", "--abbrev-ref", "HEAD"),
    }


def driver_info() -> dict[str, Any]:
    """GPU driver as the machine reports it (no torch needed)."""
    out: dict[str, Any] = {}
    smi = _cmd(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"])
    if smi:
        rows = [r.split(", ", 1) for r in smi.splitlines() if r.strip()]
        out["nvidia_driver"] = rows[0][0]
        out["nvidia_gpus"] = [r[-1] for r in rows]
    amd = Path("/sys/module/amdgpu/version")
    if amd.exists():
        out["amdgpu_driver"] = amd.read_text().strip() or "present"
    elif Path("/dev/kfd").exists():
        out["amdgpu_driver"] = "present (/dev/kfd)"
    rocm = Path("/opt/rocm/.info/version")
    if rocm.exists():
        out["rocm_version"] = rocm.read_text().strip()
    return out


def lock_record(backend: Backend | str | None, root: Path | None = None) -> dict[str, Any] | None:
    """The backend's lock file in the tree: path, sha256 (None: no lock) and whether it is stale. A name is
    looked up in the matrix; a caller that holds the `Backend` passes it (no second read of the matrix)."""
    if not backend:
        return None
    from harness import matrix
    from harness.images import lock

    try:
        b = matrix.load().backend(backend) if isinstance(backend, str) else backend
        return lock.state(b, root).record()
    except Exception as e:  # noqa: BLE001 - a broken matrix is reported by the run itself; the record says how
        return {"error": f"{type(e).__name__}: {e}"}


def capture_host(
    image: dict[str, Any] | None = None, root: Path | None = None, backend: str | None = None
) -> dict[str, Any]:
    """The host half of the record (`backend`: record its lock file too)."""
    root = root or settings().root
    docker = settings().docker
    server = _cmd([docker, "version", "--format", "{{.Server.Version}}"]) if shutil.which(docker) else None
    return {
        "git": git_info(root),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "docker_server": server,
        "image": image,
        "lock": lock_record(backend, root),
        "driver": driver_info(),
    }


SECRET = "<set, not recorded>"
SECRET_VARIABLES = frozenset({"KILN_CACHE_KEY"})  # recorded as SECRET (harness/trust.py: main's cache key)


def _compiler_config() -> dict[str, Any]:
    """The compiler's settings as compiler/config.py reads them from this environment, read without importing
    torch or triton (``import compiler`` has no side effects)."""
    import importlib.util

    from harness.settings import compiler_config

    try:
        spec = importlib.util.find_spec("compiler")
        folder = Path(spec.origin).parent if spec is not None and spec.origin else None
        config = compiler_config(folder)
        if config is None:
            return {"error": "no compiler/config.py in the tree under test"}
        cfg = config.from_env()
    except Exception as e:  # noqa: BLE001 - the compiler may be broken; the record says how
        return {"error": f"{type(e).__name__}: {e}"}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        out = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
        if out.get("cache_key"):
            out["cache_key"] = SECRET  # the cache key signs main's entries: a record never holds it
        return out
    if hasattr(cfg, "__dict__"):
        return json.loads(json.dumps(vars(cfg), default=str))
    return {"repr": repr(cfg)}


def device_lock(backend: str | None) -> dict[str, Any] | None:
    """The lock this Python was installed from (harness.images.lock.device_record)."""
    from harness import matrix
    from harness.images import lock

    try:
        b = matrix.load().backend(backend) if backend else None
        return lock.device_record(b)
    except Exception as e:  # noqa: BLE001 - in a container the tree may lack what the host has; say why
        return {"error": f"{type(e).__name__}: {e}"}


def capture_device(backend: str | None = None) -> dict[str, Any]:
    """The device half of the record, taken by the Python that runs the suites."""
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "env": {
            k: SECRET if k in SECRET_VARIABLES else v
            for k, v in sorted(os.environ.items())
            if k.startswith(
                ("KILN_", "TRITON_", "TORCH", "CUDA_", "HIP_", "ROCR_", "PYTHONHASHSEED", "OMP_NUM_THREADS")
            )
        },
        "driver": driver_info(),
        "lock": device_lock(backend),
    }
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        out["torch"] = None
        out["torch_error"] = f"{type(e).__name__}: {e}"
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        out["triton"] = None
        out["triton_error"] = f"{type(e).__name__}: {e}"
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    out["gpu_count"] = count
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
    if count:
        props = torch.cuda.get_device_properties(0)
        arch = getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}"
        out["gpu_arch"] = arch
    out["compiler_config"] = _compiler_config()
    return out


def capture(image: dict[str, Any] | None = None, backend: str | None = None) -> dict[str, Any]:
    """Both halves in this process (native runs)."""
    return {"schema": SCHEMA, "host": capture_host(image, backend=backend), "device": capture_device(backend)}


# ---- CLI: `python -m harness env` ----------------------------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument("--part", choices=["all", "host", "device"], default="all")
    p.add_argument("--backend", help="set the backend's environment (e.g. TRITON_INTERPRET for cpu) first")
    p.add_argument("--out", help="write the JSON here instead of printing it")


def cli_main(args: Any) -> int:
    """Print (or write) the environment record."""
    if args.backend:
        from harness import matrix

        for key, value in matrix.load().backend(args.backend).env.items():
            os.environ.setdefault(key, value)
    if args.part == "host":
        data: dict[str, Any] = capture_host(backend=args.backend)
    elif args.part == "device":
        data = capture_device(args.backend)
    else:
        data = capture(backend=args.backend)
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    if args.out:
        from harness.results import atomic_write_text

        atomic_write_text(Path(args.out), text + "\n")
    else:
        print(text)
    bad = ((data.get("device") or data).get("compiler_config") or {}).get("error", "")
    if bad.startswith("ConfigError"):  # recorded above; the verb still says it in one line and exits 2
        raise SettingsError(f"bad compiler setting: {bad.partition(': ')[2]} (compiler/config.py)")
    return 0
