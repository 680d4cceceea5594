"""The GPUs this runner was given, and how a run is confined to them.

A host with one runner agent per GPU sets a visible-devices variable per runner; the harness must use only
those GPUs, natively and in containers, sharded or not.

Terms:
  vendor       `nvidia` or `amd`, from the backend's host devices (/dev/nvidia*, /dev/kfd); None for CPU.
  visible set  the GPU ids the runner offers: NVIDIA `CUDA_VISIBLE_DEVICES`; AMD `HIP_VISIBLE_DEVICES` (or
               `CUDA_VISIBLE_DEVICES`, which HIP also reads) over `ROCR_VISIBLE_DEVICES` (HIP's ids then index
               ROCR's list). Ids are indices or UUIDs (`GPU-...`, `MIG-...`). Unset: every GPU (None); set
               and empty: none, an error.
  ids          the ids as the variable that set them writes them (`source`): shards split these, and a native
               run pins a subset by writing it to `source` again.
  host ids     the same GPUs as the host's driver names them (ROCR's list applied): what a container gets
               (`--gpus "device=..."`, the render nodes of those GPUs).
  render node  /dev/dri/renderD<minor> of an AMD GPU: its KFD topology node's `drm_render_minor` (nodes with a
               `gpu_id` other than 0 are GPUs, in HIP's order), else 128 + index.
NVIDIA indices: `--gpus device=K` counts GPUs in PCI order, CUDA in its own (fastest first) unless
CUDA_DEVICE_ORDER=PCI_BUS_ID; a runner given its GPU by UUID (`nvidia-smi -L`) means the same GPU everywhere.
Everything that reads the host takes the environment, the /sys root and `stat` as arguments, so the tests
give fake ones; the argv itself is built by `harness.commands.with_gpus` (pure).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.commands import GpuAccess, with_gpus
from harness.exc import HarnessError

NVIDIA, AMD = "nvidia", "amd"
SYS = Path("/sys")
DRI = Path("/dev/dri")
KFD = Path("/dev/kfd")
FIRST_RENDER_MINOR = 128


def vendor(b: Any) -> str | None:
    """`nvidia`, `amd` or None (no GPU) for backend `b` (harness.matrix.Backend), from its host devices."""
    devices = " ".join([*b.host_devices, *b.container_options])
    if "/dev/kfd" in devices:
        return AMD
    if "/dev/nvidia" in devices or "--gpus" in devices:
        return NVIDIA
    return None


def _split(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(",") if d.strip())


@dataclass(frozen=True)
class Visible:
    """The runner's visible set (module docstring): `ids` as `source` writes them and the same GPUs' `host`
    ids; both None when no variable is set (every GPU)."""

    ids: tuple[str, ...] | None
    host: tuple[str, ...] | None
    source: str

    def host_of(self, ids: Sequence[str]) -> tuple[str, ...]:
        """The host ids of `ids` (a subset of `self.ids`, or any ids when every GPU is visible)."""
        if self.ids is None or self.host is None:
            return tuple(ids)
        table = dict(zip(self.ids, self.host))
        unknown = [i for i in ids if i not in table]
        if unknown:
            raise HarnessError(
                f"GPU id(s) {', '.join(unknown)} are not among the runner's {self.source}="
                f"{','.join(self.ids)}"
            )
        return tuple(table[i] for i in ids)


def visible(kind: str, env: Mapping[str, str] | None = None) -> Visible:
    """The visible set of vendor `kind` in `env` (default os.environ); a variable set to no id is an error."""
    env = os.environ if env is None else env
    if kind == NVIDIA:
        raw = env.get("CUDA_VISIBLE_DEVICES")
        if raw is None:
            return Visible(None, None, "CUDA_VISIBLE_DEVICES")
        ids = _checked("CUDA_VISIBLE_DEVICES", raw)
        return Visible(ids, ids, "CUDA_VISIBLE_DEVICES")
    rocr_raw = env.get("ROCR_VISIBLE_DEVICES")
    rocr = None if rocr_raw is None else _checked("ROCR_VISIBLE_DEVICES", rocr_raw)
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if env.get(name) is not None:
            ids = _checked(name, env[name])
            if rocr is None:
                return Visible(ids, ids, name)
            bad = [i for i in ids if not i.isdigit() or int(i) >= len(rocr)]
            if bad:
                raise HarnessError(
                    f"{name}={env[name]} indexes ROCR_VISIBLE_DEVICES={rocr_raw}, which has "
                    f"{len(rocr)} GPU(s): no GPU {', '.join(bad)}"
                )
            return Visible(ids, tuple(rocr[int(i)] for i in ids), name)
    return Visible(rocr, rocr, "ROCR_VISIBLE_DEVICES" if rocr is not None else "HIP_VISIBLE_DEVICES")


def _checked(name: str, raw: str) -> tuple[str, ...]:
    ids = _split(raw)
    if not ids or any(i.startswith("-") for i in ids):
        raise HarnessError(
            f"{name}={raw!r} names no GPU: this runner was given none (unset it for every GPU)"
        )
    return ids


# ---- AMD: render nodes and groups ------------------------------------------------------------------------


@dataclass(frozen=True)
class AmdGpu:
    """One AMD GPU of the KFD topology: its render minor (0: unknown) and unique id (0: unknown)."""

    render_minor: int
    unique_id: int

    @property
    def uuid(self) -> str:
        return f"GPU-{self.unique_id:016x}"


def amd_gpus(sys_root: Path = SYS) -> list[AmdGpu]:
    """The GPU nodes of the KFD topology, in node order (HIP's device order); [] without one."""
    nodes = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    found = []
    for node in (
        sorted((p for p in nodes.glob("*") if p.name.isdigit()), key=lambda p: int(p.name))
        if nodes.is_dir()
        else []
    ):
        try:
            if (node / "gpu_id").read_text().strip() in ("", "0"):  # a CPU node
                continue
            props = dict(
                line.split(None, 1)
                for line in (node / "properties").read_text().splitlines()
                if len(line.split(None, 1)) == 2
            )
        except OSError:
            continue
        found.append(AmdGpu(_int(props.get("drm_render_minor")), _int(props.get("unique_id"))))
    return found


def _int(text: str | None) -> int:
    try:
        return int((text or "0").strip())
    except ValueError:
        return 0


def render_node(host_id: str, gpus: Sequence[AmdGpu]) -> str:
    """/dev/dri/renderD<minor> of AMD GPU `host_id` (an index or a `GPU-<hex>` UUID)."""
    if host_id.isdigit():
        k = int(host_id)
        if k < len(gpus) and gpus[k].render_minor:
            return str(DRI / f"renderD{gpus[k].render_minor}")
        if gpus and k >= len(gpus):
            raise HarnessError(f"AMD GPU {host_id}: the host has {len(gpus)} GPU(s) (KFD topology)")
        return str(DRI / f"renderD{FIRST_RENDER_MINOR + k}")
    for gpu in gpus:
        if gpu.unique_id and gpu.uuid.lower() == host_id.lower() and gpu.render_minor:
            return str(DRI / f"renderD{gpu.render_minor}")
    raise HarnessError(
        f"AMD GPU {host_id!r}: no GPU of the KFD topology has that id (expected an index or "
        "GPU-<16 hex digits>)"
    )


def host_gids(paths: Sequence[str], stat: Callable[[str], Any] = os.stat) -> tuple[int, ...]:
    """The host's group ids owning `paths` (absent ones skipped; 0 never: root's group is no grant)."""
    gids = set()
    for path in paths:
        try:
            gids.add(stat(path).st_gid)
        except OSError:
            continue
    return tuple(sorted(g for g in gids if g != 0))


def access(
    kind: str,
    host_ids: Sequence[str] | None,
    *,
    sys_root: Path = SYS,
    stat: Callable[[str], Any] = os.stat,
    dri: Path = DRI,
) -> GpuAccess:
    """What a container of vendor `kind` is given: `host_ids` (None: every GPU), and for AMD the render nodes
    and the host's gids of /dev/kfd and those nodes."""
    ids = None if host_ids is None else tuple(host_ids)
    if kind == NVIDIA:
        return GpuAccess(NVIDIA, ids)
    if ids is None:
        nodes = tuple(sorted(str(p) for p in dri.glob("renderD*"))) if dri.is_dir() else ()
        return GpuAccess(AMD, None, (), host_gids([str(KFD), *nodes], stat))
    gpus = amd_gpus(sys_root)
    nodes = tuple(dict.fromkeys(render_node(i, gpus) for i in ids))
    return GpuAccess(AMD, ids, nodes, host_gids([str(KFD), *nodes], stat))


# ---- pinning a backend ------------------------------------------------------------------------------------


def pin(
    b: Any,
    devices: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    sys_root: Path = SYS,
    stat: Callable[[str], Any] = os.stat,
    dri: Path = DRI,
) -> Any:
    """Backend `b` confined in its container to `devices` (ids of the runner's visible set; empty: the whole
    visible set): the GPU options (harness.commands.with_gpus) give the visible set's host GPUs only,
    renumbered from 0 inside."""
    kind = vendor(b)
    if kind is None:
        return b
    vis = visible(kind, env)
    host = vis.host_of(devices) if devices else vis.host
    return with_gpus(b, access(kind, host, sys_root=sys_root, stat=stat, dri=dri))


def pin_visible(b: Any, devices: Sequence[str] = (), *, env: Mapping[str, str] | None = None) -> Any:
    """Backend `b` confined to `devices` (ids of the runner's visible set) where it runs with this machine's
    Python: the subset written to the variable the visible set came from (the child inherits the rest of the
    runner's environment); empty `devices` leave `b` as it is."""
    kind = vendor(b)
    if kind is None or not devices:
        return b
    vis = visible(kind, env)
    if vis.ids is not None:
        vis.host_of(devices)  # an id outside the runner's set is an error, not a silent other GPU
    return replace(b, env={**b.env, vis.source: ",".join(devices)})


def pinned(b: Any) -> bool:
    """Whether `b`'s container options were computed by `pin` (harness.commands.HOST_GPUS in its env)."""
    from harness.commands import HOST_GPUS

    return HOST_GPUS in b.env


def count_gpus(kind: str, sys_root: Path = SYS, dev: Path = Path("/dev")) -> int:
    """The host's GPUs of vendor `kind` from the driver's device files (NVIDIA: /dev/nvidiaK; AMD: KFD)."""
    if kind == NVIDIA:
        return sum(1 for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    return len(amd_gpus(sys_root))
