"""Pre-flight: the cheap checks before any image build, suite run, flake run or bench job, each failing with one
clear line and exit 3 (infrastructure: the runner, not the code, is at fault).

Terms:
  driver      the host's GPU driver, seen from its tools and device files: NVIDIA's `nvidia-smi -L` (one line per
              GPU: `GPU 0: NVIDIA H100 ... (UUID: GPU-...)`); AMD's `/dev/kfd` plus the GPUs that `rocm-smi` lists,
              else the render nodes `/dev/dri/renderD*`.
  visible     the GPUs this job may use: the runner's visible set as every run reads it (`harness.gpus`), in
              the driver's names. Like the CUDA runtime, the list stops at its first entry that names no GPU.
  need        how many visible GPUs the job needs (1; `--shards N --gpus-per-shard K`: N*K).
  label       the GPU model the job's runner label names (KILN_GPU_LABEL, `h100` or `gpu-h100`, which the workflows
              set from the job's `gpu-*` runs-on label): every visible GPU the driver names must be that model (its name,
              letters and digits only, contains the label's); a GPU whose name the driver does not say is not checked.
  free disk   free bytes at the docker daemon's root (container mode: images and layers) and at the results
              folder, against settings().min_free_gb (KILN_MIN_FREE_GB) and RESULTS_MIN_FREE_GB. Unset, the docker
              root's need is the job's: MIN_FREE_GB by backend when its image must be built (the base, the
              layers, the build cache), PRESENT_MIN_FREE_GB when the image it runs is already there (the
              containers' writable layers only).

The message of a failed pre-flight is one line, `pre-flight <backend>: <what is missing>; <what to do>`, raised as
`PreflightError` (exit 3); the CLI prints it as `harness <verb>: error: pre-flight <backend>: ...`. Docker missing or
unreachable stays docker_client's own DockerError line (exit 3 too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.exc import PreflightError
from harness.matrix import Backend
from harness.settings import settings

GB = 1024**3
# free GB at the docker root by backend (unknown backends: the largest): to build the job's image, and to run it
# when it is already present
MIN_FREE_GB = {"cpu": 5.0, "cuda": 20.0, "rocm": 30.0}
PRESENT_MIN_FREE_GB = {"cpu": 1.0, "cuda": 2.0, "rocm": 2.0}
RESULTS_MIN_FREE_GB = 1.0
_NVIDIA_LINE = re.compile(r"^GPU (\d+):\s*(.*?)\s*(?:\(UUID: ([^)]+)\))?\s*$")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
DiskUsage = Callable[[str], Any]  # shutil.disk_usage's shape: .free in bytes


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@dataclass(frozen=True)
class Gpu:
    """One GPU the driver reports: its index and, where the tool says it, its UUID."""

    index: str
    uuid: str = ""
    name: str = ""  # the model as the driver names it (`NVIDIA H100 80GB HBM3`), "" when it does not say


@dataclass
class Report:
    """What the pre-flight found (printed as one `pre-flight ... ok` line when nothing is wrong)."""

    backend: str
    gpus: list[Gpu] = field(default_factory=list)
    visible: list[str] = field(default_factory=list)
    free_gb: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        gpus = (
            f"{len(self.visible)} of {len(self.gpus)} GPU(s) visible; " if self.gpus or self.visible else ""
        )
        disk = ", ".join(f"{gb:.1f} GB free at {where}" for where, gb in self.free_gb.items())
        return f"pre-flight {self.backend}: ok ({gpus}{disk})"


# ---- GPUs ----------------------------------------------------------------------------------------------


def nvidia_gpus(run: Runner = _run) -> list[Gpu]:
    """The GPUs `nvidia-smi -L` lists; PreflightError when the tool is missing or fails (no driver)."""
    if shutil.which("nvidia-smi") is None:
        raise PreflightError(
            "pre-flight cuda: no NVIDIA driver: nvidia-smi not found on PATH; run cuda jobs on a "
            "runner with the NVIDIA driver and container toolkit (here: --backend cpu)"
        )
    try:
        proc = run(["nvidia-smi", "-L"])
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PreflightError(
            f"pre-flight cuda: nvidia-smi did not answer ({e}); the NVIDIA driver is not usable"
        ) from None
    if proc.returncode != 0:
        detail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise PreflightError(
            f"pre-flight cuda: nvidia-smi failed (exit {proc.returncode}: {detail[0]}); the NVIDIA "
            "driver is not loaded or does not match its tools"
        )
    out = []
    for line in proc.stdout.splitlines():
        found = _NVIDIA_LINE.match(line.strip())
        if found:
            out.append(Gpu(found.group(1), found.group(3) or "", found.group(2) or ""))
    return out


def amd_gpus(run: Runner = _run, dev: Path = Path("/dev")) -> list[Gpu]:
    """The AMD GPUs: /dev/kfd must exist; their count from `rocm-smi --showid --csv` (`cardN` rows) when it
    answers, else from the render nodes /dev/dri/renderD*."""
    if not (dev / "kfd").exists():
        raise PreflightError(
            f"pre-flight rocm: no AMD GPU driver: {dev / 'kfd'} does not exist (amdgpu not loaded "
            "or no AMD GPU); run rocm jobs on a ROCm runner (here: --backend cpu)"
        )
    count = 0
    if shutil.which("rocm-smi") is not None:
        try:
            proc = run(["rocm-smi", "--showid", "--csv"])
            if proc.returncode == 0:
                count = sum(1 for ln in proc.stdout.splitlines() if re.match(r"^card\d+,", ln.strip()))
        except (OSError, subprocess.TimeoutExpired):
            count = 0
    if count == 0:
        count = len(list((dev / "dri").glob("renderD*")))
    names = amd_names(run) if count else []
    return [Gpu(str(i), name=names[i] if i < len(names) else "") for i in range(count)]


def amd_names(run: Runner = _run) -> list[str]:
    """The AMD GPUs' product names (`rocm-smi --showproductname --csv`: each `cardN` row's fields after the first,
    joined), in card order; [] when rocm-smi is missing or does not answer."""
    if shutil.which("rocm-smi") is None:
        return []
    try:
        proc = run(["rocm-smi", "--showproductname", "--csv"])
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [
        " ".join(f.strip() for f in ln.strip().split(",")[1:])
        for ln in proc.stdout.splitlines()
        if re.match(r"^card\d+,", ln.strip())
    ]


def _model_key(text: str) -> str:
    """Letters and digits only, lower case: `gpu-h100` -> `gpuh100`, `NVIDIA H100 80GB` -> `nvidiah10080gb`."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def check_label(backend: str, label: str, gpus: Sequence[Gpu]) -> None:
    """PreflightError (one line) when a GPU the driver names is not the model the job's label names (`label`:
    KILN_GPU_LABEL, with or without its `gpu-` prefix); nothing to check without a label or named GPUs."""
    model = label.strip().lower().removeprefix("gpu-")
    if not model:
        return
    for g in gpus:
        if g.name and _model_key(model) not in _model_key(g.name):
            raise PreflightError(
                f"pre-flight {backend}: the job's label is gpu-{model} but GPU {g.index} is "
                f"{g.name!r}; this runner's labels do not name its GPU: fix them (KILN_GPU_LABEL)"
            )


def visible(backend: str, gpus: Sequence[Gpu], env: Mapping[str, str]) -> list[str]:
    """The GPU ids this job may use, as the host's driver names them: the runner's visible set as every run
    reads it (`harness.gpus.visible`: HIP's ids index ROCR's list; a variable naming no GPU is an error), then,
    like the CUDA runtime, cut at its first id that names no GPU of the driver (an index, a UUID or its prefix);
    none set: every GPU."""
    from harness import gpus as runner_gpus

    kind = runner_gpus.NVIDIA if backend == "cuda" else runner_gpus.AMD
    host = runner_gpus.visible(kind, env).host
    if host is None:
        return [g.index for g in gpus]
    out = []
    for entry in host:
        uuid = entry.startswith(("GPU-", "MIG-"))
        if not any(entry == g.index or (uuid and g.uuid.startswith(entry)) for g in gpus):
            break
        out.append(entry)
    return out


def visible_hint(backend: str, env: Mapping[str, str]) -> str:
    """` (CUDA_VISIBLE_DEVICES=...)`: the variable that narrowed the GPUs, for the message; "" when none."""
    from harness import gpus as runner_gpus

    v = runner_gpus.visible(runner_gpus.NVIDIA if backend == "cuda" else runner_gpus.AMD, env)
    return f" ({v.source}={env[v.source]!r})" if v.ids is not None else ""


def driver_gpus(b: Backend, run: Runner = _run, dev: Path = Path("/dev")) -> list[Gpu]:
    """The GPUs of a GPU backend's driver (none for cpu); PreflightError when the driver is missing."""
    if not b.is_gpu:
        return []
    return nvidia_gpus(run) if b.name == "cuda" else amd_gpus(run, dev)


# ---- disk ----------------------------------------------------------------------------------------------


def docker_root(run: Runner = _run) -> Path | None:
    """The docker daemon's root folder (`docker info`), None when the daemon does not say."""
    try:
        proc = run([settings().docker, "info", "--format", "{{.DockerRootDir}}"])
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = proc.stdout.strip()
    return Path(root) if proc.returncode == 0 and root.startswith("/") else None


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent (the results folder may not exist yet)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def min_free_gb(backend: str, image_present: Callable[[], bool] = lambda: False) -> float:
    """The free space the docker root needs for `backend`: KILN_MIN_FREE_GB, else PRESENT_MIN_FREE_GB when the job's
    image is already present (`image_present()`, asked only when the setting is unset), else MIN_FREE_GB (a build)."""
    configured = settings().min_free_gb
    if configured is not None:
        return configured
    table = PRESENT_MIN_FREE_GB if image_present() else MIN_FREE_GB
    return table.get(backend, max(table.values()))


def image_present(b: Backend, tag: str | None = None, base_image: str | None = None) -> bool:
    """Whether the image a container run of `b` would use is present locally: `tag` when given, else the hash tag
    `harness image build` would use now for this checkout, under its own name or this cache scope's (a pull
    request's job runs main's image of the same inputs, or builds its own under a scoped name). False when the
    tag cannot be worked out (the build will say why)."""
    from harness import trust
    from harness.exc import HarnessError
    from harness.images import image as image_mod

    try:
        ref = tag or image_mod.current_tag(b, base_image)
        names = dict.fromkeys([ref, trust.scoped_image(ref, settings().cache_scope)])
        return any(image_mod.image_id(name) for name in names)
    except (HarnessError, OSError, subprocess.SubprocessError):
        return False


def check_disk(
    backend: str, places: Sequence[tuple[str, Path, float]], usage: DiskUsage = shutil.disk_usage
) -> dict[str, float]:
    """Free GB at each (label, path, needed GB), keyed `<label> <path> (need N GB)`; PreflightError naming the first
    place short of space."""
    free: dict[str, float] = {}
    for label, path, need in places:
        gb = usage(str(_existing(path))).free / GB
        free[f"{label} {path} (need {need:g} GB)"] = gb
        if gb < need:
            raise PreflightError(
                f"pre-flight {backend}: {gb:.1f} GB free at {label} {path}, need {need:g} GB; free "
                "disk (e.g. `docker image prune`, old results) or lower KILN_MIN_FREE_GB"
            )
    return free


# ---- the whole check -----------------------------------------------------------------------------------


def check(
    b: Backend,
    *,
    docker: bool,
    need_gpus: int = 1,
    results: Path | None = None,
    env: Mapping[str, str] | None = None,
    run: Runner = _run,
    usage: DiskUsage = shutil.disk_usage,
    dev: Path = Path("/dev"),
    present: Callable[[Backend], bool] = image_present,
) -> Report:
    """The driver and `need_gpus` visible GPUs (GPU backends), with `docker` the daemon reachable and free disk at
    its root (a run in containers: the build's need, or less when `present(b)` says the image is there), free disk at
    the results folder, in that order; the first problem raises PreflightError (one line, exit 3). `run`, `usage`,
    `dev` and `present` stand in for the tools, shutil.disk_usage, /dev and image_present in tests."""
    from harness.docker_client import require_docker

    env = os.environ if env is None else env
    report = Report(b.name)
    if b.is_gpu:
        report.gpus = driver_gpus(b, run, dev)
        report.visible = visible(b.name, report.gpus, env)
        check_label(
            b.name,
            env.get("KILN_GPU_LABEL", ""),
            [
                g
                for g in report.gpus
                if g.index in report.visible
                or (
                    g.uuid
                    and any(g.uuid.startswith(v) for v in report.visible if v.startswith(("GPU-", "MIG-")))
                )
            ],
        )
        if len(report.visible) < need_gpus:
            raise PreflightError(
                f"pre-flight {b.name}: {len(report.visible)} GPU(s) visible{visible_hint(b.name, env)} of "
                f"{len(report.gpus)} on this machine, the job needs {need_gpus}"
            )
    places: list[tuple[str, Path, float]] = []
    if docker:
        require_docker()  # its DockerError (exit 3) says what is missing, as every verb has said it
        root = docker_root(run)
        if root is not None:
            places.append(("the docker root", root, min_free_gb(b.name, lambda: present(b))))
    places.append(("the results folder", results or settings().results_root, RESULTS_MIN_FREE_GB))
    report.free_gb = check_disk(b.name, places, usage)
    return report


def cli_add_arguments(p: Any) -> None:
    p.add_argument("--backend", help="cpu, cuda or rocm (default: detected)")
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="no container (also KILN_NATIVE=1): docker and its disk are not checked",
    )
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="visible GPUs the job needs (default 1)")


def cli_main(args: Any) -> int:
    """`python -m harness preflight`: the checks above, one line `pre-flight B: ok (...)` or one error line."""
    from harness import matrix

    b = matrix.load().backend(args.backend or matrix.detect_backend())
    docker = not (settings().native if args.native is None else args.native)  # the mode rule of `harness run`
    print(check(b, docker=docker, need_gpus=args.gpus).line(), flush=True)
    return 0
