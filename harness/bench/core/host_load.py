"""What else ran on the host while an arm took its samples: other processes' CPU use, read from /proc/stat.

Host-bound timings (a model step without CUDA graphs, a small kernel's launch) move with whatever else runs on
the machine: a compile in a neighbouring process, a second benchmark on another GPU of the same host. The
executor reads this around each arm's turns so that a result says how busy the host was while it was taken.

Terms:
- *busy seconds*: the whole host's CPU time, every state but idle and iowait (``/proc/stat``'s ``cpu`` line:
  user, nice, system, irq, softirq, steal; guest time is inside user already);
- *own seconds*: this process's CPU time (``os.times``: user and system of the process, not of its children);
- *other cores*: (busy - own) seconds over wall seconds: how many cores other processes kept busy on average
  (0 on a quiet host, 8 while eight compile workers run beside it);
- ``meta.host_load``: ``{"other_cpu_s", "wall_s", "other_cores", "cpus"}`` accumulated over an arm's turns;
  absent where /proc/stat cannot be read (not Linux).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")
#: a result whose arm saw other processes keep at least this many cores busy is flagged in reports
BUSY_OTHER_CORES = 0.5
#: /proc/stat's cpu-line fields counted busy (user nice system idle iowait irq softirq steal ...)
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Snapshot:
    """The host's busy seconds, this process's CPU seconds and a monotonic clock, read together."""

    busy_s: float
    own_s: float
    wall_s: float


def snapshot() -> Snapshot | None:
    """The counters now, or None where /proc/stat is missing or unreadable."""
    try:
        line = PROC_STAT.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = line.split()
    if not fields or fields[0] != "cpu":
        return None
    try:
        ticks = [int(fields[1 + i]) for i in _BUSY_FIELDS if 1 + i < len(fields)]
    except ValueError:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    t = os.times()
    return Snapshot(sum(ticks) / hz, t.user + t.system, time.monotonic())


def add(meta_load: dict[str, Any] | None, before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """``meta_load`` (a result's ``host_load``, or None) with the window ``before``..``after`` added: other
    processes' CPU seconds and the wall seconds accumulate; ``other_cores`` is their ratio."""
    out = dict(meta_load or {})
    other = max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s))
    wall = max(0.0, after.wall_s - before.wall_s)
    out["other_cpu_s"] = round(out.get("other_cpu_s", 0.0) + other, 3)
    out["wall_s"] = round(out.get("wall_s", 0.0) + wall, 3)
    out["other_cores"] = round(out["other_cpu_s"] / out["wall_s"], 2) if out["wall_s"] > 0 else 0.0
    out["cpus"] = os.cpu_count()
    return out


@contextmanager
def measured(meta: Any) -> Iterator[None]:
    """Add the block's window to ``meta.host_load`` (a results ``Meta``); nothing where it cannot be read."""
    before = snapshot()
    try:
        yield
    finally:
        after = snapshot() if before is not None else None
        if before is not None and after is not None:
            meta.host_load = add(meta.host_load, before, after)


def busy_note(workload: str, compiler: str, load: dict[str, Any] | None) -> str | None:
    """A report line when the arm was measured beside other work (``BUSY_OTHER_CORES`` or more), else None."""
    if not load or load.get("other_cores", 0.0) < BUSY_OTHER_CORES:
        return None
    return (
        f"{workload} {compiler}: other processes kept {load['other_cores']:.1f} of {load.get('cpus') or '?'} "
        f"cores busy while it was sampled (host-bound figures read the neighbour too)"
    )
