"""The cancel check: the unit tests' job is cancelled mid-pytest (SIGINT to act, as a cancel does); afterwards no
step but the teardown may start, and nothing the job started may still run CANCEL_GRACE_S seconds later."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from rehearsal.act import ANSI, LINE, JobRun, act_argv, event_payload, free_port, parse_act_output, run_act
from rehearsal.actions import ACTIONS_DIR
from rehearsal.plan import ROOT, JobSpec
from rehearsal.report import Verdict

# ---- the cancel check ----------------------------------------------------------------------------------------

CANCEL_JOB = (
    "ci.yml",
    "unit-tests",
)  # a job whose long step runs nox, then pytest: cancelled while pytest runs
CANCEL_STEP = re.compile(r"^⭐ Run Main nox -s unit-tests")
CANCEL_AT = re.compile(r"nox > .*-m pytest")  # nox's log line as it starts pytest
CANCEL_GRACE_S = 30
AFTER_CANCEL_ALLOWED = re.compile(r"ci-teardown|^Complete job$|^Post ")


def descendants(root: int) -> dict[int, str]:
    """Every process below `root` now (pid -> command line), from /proc."""
    children: dict[int, list[int]] = {}
    cmd: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = cmd.get(child, "").strip()
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def containers() -> set[str]:
    """The running containers' ids (empty without docker)."""
    try:
        proc = subprocess.run(
            ["docker", "ps", "-q", "--no-trunc"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(proc.stdout.split()) if proc.returncode == 0 else set()


def cancel_verdict(
    runs: list[JobRun], left: dict[int, str], new_containers: set[str], cancelled: bool
) -> Verdict:
    """The cancel check's outcome: act was interrupted while the unit tests ran; afterwards no step but the
    teardown started, and nothing the job started (`left`: processes, `new_containers`) outlived the grace."""
    if not cancelled:
        return Verdict(False, "the unit tests' step never reached pytest: nothing was cancelled")
    steps = [s for r in runs for s in r.steps if s.depth == 0]
    at = next((i for i, s in enumerate(steps) if CANCEL_STEP.match(f"⭐ Run Main {s.name}")), None)
    if at is None:
        return Verdict(False, "the unit tests' step did not run")
    later = [
        s.name
        for s in steps[at + 1 :]
        if not AFTER_CANCEL_ALLOWED.search(s.name) and not AFTER_CANCEL_ALLOWED.search(f"{s.stage} ")
    ]
    if later:
        return Verdict(False, f"after the cancel act started {', '.join(repr(n) for n in later)}")
    teardown = [s for s in steps[at + 1 :] if "ci-teardown" in s.name]
    if not teardown:
        return Verdict(False, "the teardown did not run after the cancel")
    if left:
        pid, cmd = next(iter(left.items()))
        return Verdict(
            False,
            f"{len(left)} process(es) of the job still ran {CANCEL_GRACE_S} s after the cancel "
            f"(pid {pid}: {cmd[:120]})",
        )
    if new_containers:
        return Verdict(
            False, f"{len(new_containers)} container(s) still ran {CANCEL_GRACE_S} s after the cancel"
        )
    return Verdict(
        True,
        f"cancelled mid-pytest: no later step but the teardown ({teardown[0].result}); no process "
        f"or container left after {CANCEL_GRACE_S} s",
    )


def cancel_check(
    act: str,
    workflows: dict[str, dict],
    env: dict[str, str],
    *,
    out: Path,
    artifacts: Path,
    cache: Path,
    selection: str,
    ref: str,
    **act_extra: Any,
) -> tuple[JobSpec, Verdict, float]:
    """Run CANCEL_JOB on workflow_dispatch, SIGINT act (as a cancel does) once its unit tests' pytest started, then
    judge (`cancel_verdict`) what ran after it and what was left CANCEL_GRACE_S seconds after act ended; what was
    left is then ended, so that the machine stays clean."""
    spec = JobSpec(
        *CANCEL_JOB,
        "workflow_dispatch",
        inputs=(("selection", selection),) if selection else (),
        variant="cancelled",
    )
    event = out / f"{spec.key}.event.json"
    event.write_text(json.dumps(event_payload(spec, ref), indent=1) + "\n", encoding="utf-8")
    argv = act_argv(
        act,
        spec,
        workflows,
        root=ROOT,
        actions_dir=ACTIONS_DIR,
        artifacts=artifacts,
        cache=cache,
        port=free_port(),
        event_file=event,
        selection=selection,
        **act_extra,
    )
    print(
        f"\n===== rehearse: cancel check: {spec.workflow} job {spec.job}, SIGINT once pytest runs =====",
        flush=True,
    )
    before = containers()
    state: dict = {"in_step": False, "seen": {}, "cancelled": False}

    def watch(line: str, proc: subprocess.Popen) -> None:
        m = LINE.match(ANSI.sub("", line.rstrip("\n")))
        rest = m["rest"] if m else ""
        if CANCEL_STEP.match(rest):
            state["in_step"] = True
        elif state["in_step"] and not state["cancelled"] and CANCEL_AT.search(line):
            time.sleep(3)  # pytest imports torch and collects: mid-suite
            state["seen"] = descendants(proc.pid)
            print(
                f"rehearse: cancel: SIGINT to act (pid {proc.pid}); {len(state['seen'])} process(es) below it",
                flush=True,
            )
            os.kill(proc.pid, signal.SIGINT)
            state["cancelled"] = True

    started = time.monotonic()
    code, text = run_act(argv, env, out / f"{spec.key}.log", 1800, on_line=watch)
    time.sleep(CANCEL_GRACE_S)
    left = {pid: cmd for pid, cmd in state["seen"].items() if alive(pid)}
    new = containers() - before
    verdict = cancel_verdict(parse_act_output(text), left, new, state["cancelled"])
    for pid in left:  # the machine stays clean whatever the verdict
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if new:
        subprocess.run(["docker", "rm", "--force", *sorted(new)], capture_output=True, check=False)
    print(f"rehearse: cancel check (act exit {code}): {verdict.line}", flush=True)
    return spec, verdict, time.monotonic() - started
