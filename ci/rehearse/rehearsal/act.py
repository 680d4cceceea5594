"""Running act: its command line for one pair, the environment it runs with, the run itself, and its output read
back as jobs and steps."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rehearsal.actions import CHECKOUT_TOKEN, local_repository_args, real_checkout
from rehearsal.plan import FORK, REPOSITORY, WORKFLOWS_DIR, JobSpec, RehearseError, all_labels, remote_uses

# variables of this shell that never reach act's steps: what a job sees comes from the workflow
PRIVATE_ENV = re.compile(r"^(KILN_|GITHUB_|RUNNER_|ACTIONS_|ACT_|VIRTUAL_ENV$|NOX_|PYTHONPATH$)")


def platform_args(labels: list[str]) -> list[str]:
    """`-P LABEL=-self-hosted` for every label: every job runs on this machine in host mode."""
    bad = [lb for lb in labels if "${{" in lb]
    if bad:
        raise RehearseError(
            f"runs-on label {bad[0]!r} is an expression: the rehearsal maps only literal labels"
        )
    return [arg for lb in labels for arg in ("-P", f"{lb}=-self-hosted")]


def event_payload(spec: JobSpec, ref: str) -> dict:
    """The event act hands the job (`-e FILE`): the branch `ref` (so the rehearsal runs main's steps whatever
    branch is checked out here) and the inputs (with an event file, act takes `inputs.*` from it alone); a pull
    request's number, base (REPOSITORY's main) and head (a branch of REPOSITORY, or of FORK for `fork`)."""
    payload: dict = {"ref": ref, "inputs": dict(spec.inputs)}
    if spec.event == "pull_request":
        head = FORK if spec.variant == "fork" else REPOSITORY
        payload = {
            "number": 1,
            "repository": {"full_name": REPOSITORY},
            "pull_request": {
                "number": 1,
                "head": {"ref": "topic", "repo": {"full_name": head}},
                "base": {"ref": "main", "repo": {"full_name": REPOSITORY}},
            },
        }
    return payload


def act_argv(
    act: str,
    spec: JobSpec,
    workflows: dict[str, dict],
    *,
    root: Path,
    actions_dir: Path,
    artifacts: Path,
    cache: Path,
    port: int,
    event_file: Path,
    selection: str = "",
    node_path: Path | None = None,
    real_actions: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> list[str]:
    """The whole `act` command line for one rehearsal job (ci/rehearse/rehearse.py's docstring); `event_file` holds
    `event_payload`; `extra_env`: more variables for the job's steps (the venv seed's)."""
    if spec.workflow not in workflows:
        raise RehearseError(f"no workflow {spec.workflow} under {root / WORKFLOWS_DIR}")
    if spec.job not in workflows[spec.workflow]["jobs"]:
        raise RehearseError(f"{spec.workflow} has no job {spec.job}")
    argv = [
        act,
        spec.event,
        "-e",
        str(event_file),
        "-C",
        str(root),
        "-W",
        str(WORKFLOWS_DIR / spec.workflow),
        "-j",
        spec.job,
        *platform_args(all_labels(workflows)),
        "--no-skip-checkout",  # checkout runs (its stand-in) instead of act's silent copy
        *local_repository_args(remote_uses(workflows), actions_dir, real_actions),
        *(["--secret", f"GITHUB_TOKEN={CHECKOUT_TOKEN}"] if real_checkout(real_actions) else []),
        "--action-offline-mode",
        "--action-cache-path",
        str(cache),
        "--artifact-server-path",
        str(artifacts),
        "--artifact-server-addr",
        "127.0.0.1",
        "--artifact-server-port",
        str(port),
        "--no-cache-server",
        "--cache-server-addr",
        "127.0.0.1",
        "--env",
        f"KILN_REHEARSE_SOURCE={root}",
        "--env",
        f"KILN_REHEARSE_ARTIFACTS={artifacts}",
        "--env",
        f"GITHUB_REPOSITORY={REPOSITORY}",  # github.repository: the fork guard compares with it
        *(
            ["--env", f"NODE_PATH={node_path}"] if node_path else []
        ),  # the artifact client for our node actions
        # the reduced selection on every event: the workflows read `inputs.selection || vars.KILN_TEST_SELECTION`
        *(["--var", f"KILN_TEST_SELECTION={selection}"] if selection else []),
        # the runner's own setting: the jobs' teardown keeps superseded kiln image tags, which other
        # checkouts of this machine may be using
        "--env",
        "KILN_PRUNE_IMAGES=0",
        *[arg for key, value in (extra_env or {}).items() for arg in ("--env", f"{key}={value}")],
    ]
    for key, value in spec.matrix:
        argv += ["--matrix", f"{key}:{value}"]
    return argv


def act_env(environ: dict[str, str], venv: str | None, home: Path | None = None) -> dict[str, str]:
    """This shell's environment for act, less what must not reach a job (PRIVATE_ENV) and the rehearsal's own
    venv on PATH (a step's `python3` is the machine's, as on a runner). With `home`, HOME is that folder (the
    runner's home), and so are the lasting data and cache folders (XDG_DATA_HOME, XDG_CACHE_HOME; Triton's and
    Inductor's cache variables are dropped): the workflows' stores and main's compile caches of a rehearsal,
    whose checkout may hold uncommitted code, land there, never in this user's trusted folders. pip keeps this
    user's configuration (XDG_CONFIG_HOME) and its download cache (PIP_CACHE_DIR)."""
    env = {k: v for k, v in environ.items() if not PRIVATE_ENV.match(k)}
    if venv:
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(venv)
        )
    if home is not None:
        user_home = Path(environ.get("HOME") or Path.home())
        env.setdefault("XDG_CONFIG_HOME", str(user_home / ".config"))
        env.setdefault(
            "PIP_CACHE_DIR", str(Path(environ.get("XDG_CACHE_HOME") or user_home / ".cache") / "pip")
        )
        for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            env.pop(name, None)
        env["XDG_CACHE_HOME"] = str(home / ".cache")
        env["XDG_DATA_HOME"] = str(home / ".local" / "share")
        env["HOME"] = str(home)
    return env


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for act's artifact server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- act's output ----------------------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LINE = re.compile(r"^\[(?P<job>[^\]]+)\] (?P<rest>.*)$")
RUN = re.compile(r"^⭐ Run (?P<stage>Pre|Main|Post) (?P<name>.*)$")
DONE = re.compile(
    r"^\s*(?:✅|❌)\s+(?P<result>Success|Failure) - (?P<stage>Pre|Main|Post) (?P<name>.*?)"
    r"(?: \[(?P<took>[^\]]*)\])?$"
)
JOB_END = re.compile(r"^🏁\s+Job (?P<result>succeeded|failed)$")
OUTPUT = re.compile(r"^\s*\| ?(?P<text>.*)$")


@dataclass
class StepRun:
    """One step as act ran it: stage (Pre/Main/Post), name, success/failure, duration as act printed it, depth
    (0: a workflow step; 1+: a step inside a composite action) and its output lines."""

    stage: str
    name: str
    result: str = "running"
    took: str = ""
    depth: int = 0
    output: list[str] = field(default_factory=list)


@dataclass
class JobRun:
    """One job as act ran it (`prefix`: act's `[workflow/job name]`), its steps in order, and its result."""

    prefix: str
    steps: list[StepRun] = field(default_factory=list)
    result: str = "unfinished"


def parse_act_output(text: str) -> list[JobRun]:
    """act's plain output (colours removed) as jobs and steps, in the order act ran them."""
    jobs: dict[str, JobRun] = {}
    open_steps: dict[str, list[StepRun]] = {}
    for raw in text.splitlines():
        m = LINE.match(ANSI.sub("", raw))
        if not m:
            continue
        prefix, rest = m["job"], m["rest"]
        job = jobs.setdefault(prefix, JobRun(prefix))
        stack = open_steps.setdefault(prefix, [])
        if r := RUN.match(rest):
            if r["name"] in ("Set up job", "Complete job"):
                continue
            step = StepRun(r["stage"], r["name"], depth=len(stack))
            job.steps.append(step)
            stack.append(step)
        elif d := DONE.match(rest):
            if d["name"] in ("Set up job", "Complete job"):
                if d["result"] == "Failure":
                    job.steps.append(StepRun(d["stage"], d["name"], "failure", d["took"] or ""))
                continue
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].stage == d["stage"] and stack[i].name == d["name"]:
                    stack[i].result, stack[i].took = d["result"].lower(), d["took"] or ""
                    del stack[i:]
                    break
        elif e := JOB_END.match(rest):
            job.result = e["result"]
        elif (o := OUTPUT.match(rest)) and stack:
            stack[-1].output.append(o["text"])
    return list(jobs.values())


# ---- running -----------------------------------------------------------------------------------------------


def run_act(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    timeout_s: int,
    on_line: Callable[[str, subprocess.Popen], None] | None = None,
    echo: bool = True,
) -> tuple[int, str]:
    """Run act, echo its output line by line (unless `echo` is off) and keep it in `log`; (exit code, output). Past
    `timeout_s` act's process group is ended and the exit code is 124. `on_line(line, process)` sees every line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        timer = threading.Timer(timeout_s, os.killpg, (proc.pid, signal.SIGTERM))
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                fh.write(line)
                lines.append(line)
                if on_line is not None:
                    on_line(line, proc)
            code = proc.wait()
        finally:
            expired = not timer.is_alive()  # the timer fired
            timer.cancel()
    if expired:
        msg = f"rehearse: act ran past {timeout_s} s and was stopped\n"
        sys.stdout.write(msg)
        lines.append(msg)
        code = 124
    return code, "".join(lines)
