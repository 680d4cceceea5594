"""Processes a command or a test left running: found through Linux's /proc, named, and ended.

Terms:
  proc         one process as /proc shows it: pid, its start time (clock ticks since boot: with the pid it names
               the process even after the pid is reused), its session and its command line (`Proc`).
  descendants  the processes below a pid, through /proc/<pid>/task/*/children. A process that sets itself up as
               a child subreaper (`become_subreaper`: the suites' pytest does) gets the orphans of its
               descendants, so a daemon that double-forks stays among its descendants.
  session      every process a command started keeps the command's session id (the harness starts each command
               in a session of its own), unless it calls setsid itself; after the command has exited, the
               members of its session are what it left running.
  leftover     a process still alive when what started it has ended: a test's (the suites' journal names the
               test that started it) or a command's (`process.execute` ends its session's leftovers).
Elsewhere than Linux every lookup finds nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_PR_SET_CHILD_SUBREAPER = 36
CMDLINE_LIMIT = 200


@dataclass(frozen=True)
class Proc:
    """One process: pid, start time (ticks since boot), session id and command line (shortened)."""

    pid: int
    start: int
    sid: int
    cmdline: str

    def label(self) -> str:
        """`pid 123 (python3 -c import time; time.sleep(300))`: how a report names it."""
        return f"pid {self.pid} ({self.cmdline})"

    def as_json(self) -> list:
        return [self.pid, self.start, self.sid, self.cmdline]

    @classmethod
    def from_json(cls, row: list) -> Proc:
        return cls(int(row[0]), int(row[1]), int(row[2]), str(row[3]))


def read(pid: int, proc: Path = PROC) -> Proc | None:
    """The process `pid`, or None when it is gone or a zombie (it has ended; only its exit status is left)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces and ')'
    if not fields or fields[0] in ("Z", "X"):
        return None
    name = stat[stat.find("(") + 1 : stat.rfind(")")]
    cmdline = " ".join(a.decode(errors="backslashreplace") for a in raw.split(b"\0") if a) or f"[{name}]"
    if len(cmdline) > CMDLINE_LIMIT:
        cmdline = cmdline[: CMDLINE_LIMIT - 3] + "..."
    return Proc(pid, int(fields[19]), int(fields[3]), cmdline)


def alive(p: Proc, proc: Path = PROC) -> bool:
    """Whether `p` itself (same pid and start time) is still running."""
    now = read(p.pid, proc)
    return now is not None and now.start == p.start


def descendants(pid: int, proc: Path = PROC) -> list[Proc]:
    """The living processes below `pid`, parents before their children."""
    out: list[Proc] = []
    todo, seen = [pid], {pid}
    while todo:
        parent = todo.pop(0)
        try:
            tasks = list((proc / str(parent) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid in seen:
                    continue
                seen.add(kid)
                found = read(kid, proc)
                if found is not None:
                    out.append(found)
                    todo.append(kid)
    return out


def session(sid: int, proc: Path = PROC) -> list[Proc]:
    """The living processes of session `sid` (its leader included, when it still runs)."""
    out = []
    try:
        pids = [int(e.name) for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return []
    for pid in sorted(pids):
        found = read(pid, proc)
        if found is not None and found.sid == sid:
            out.append(found)
    return out


def end(procs: Iterable[Proc], grace_s: float = 2.0) -> list[Proc]:
    """SIGTERM each process of `procs` that is still itself, SIGKILL those still running after `grace_s`;
    returns the ones that were running (ended now)."""
    running = [p for p in procs if alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in running:
            if alive(p):
                try:
                    os.kill(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(alive(p) for p in running):
            time.sleep(0.05)
    return running


def end_session(sid: int, grace_s: float = 2.0) -> list[Proc]:
    """End what is left of session `sid` after its leader exited (module docstring); returns what was ended."""
    if sid <= 1 or sid == os.getsid(0):
        return []  # never the harness's own session
    return end([p for p in session(sid) if p.pid != os.getpid()], grace_s)


def pid_namespace() -> str:
    """This process's pid namespace (`pid:[4026531836]`), "" where /proc does not say: pids journaled in a
    container's namespace name other processes here, so only those of the harness's own namespace are ended."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); True when it is one now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def describe(procs: Iterable[Proc]) -> str:
    """`pid 1 (cmd), pid 2 (cmd)`."""
    return ", ".join(p.label() for p in procs)
