"""The rehearsal's plan: the committed workflows read, and every job x event pair with the end it must reach here.

A pair is a `JobSpec`: one job of one workflow on one event of EVENTS that the workflow's `on:` names (pull_request
twice: from a branch of the repository and from a fork). Its expected end (`expected_end`): `skipped` where the fork
guard keeps it away, `preflight` for a GPU job (or a job that needs GPU jobs) on a machine without a GPU, else
`success`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS_DIR = Path(".github") / "workflows"
PREFLIGHT = re.compile(r"pre-?flight", re.IGNORECASE)


class RehearseError(Exception):
    """A rehearsal that cannot start (bad workflow, missing stand-in, act missing): one line, exit 2."""


class NoDocker(RehearseError):
    """The jobs that run the suites in the cpu container (DOCKER_JOBS) on a machine whose docker daemon cannot be
    reached: one line before any job runs, exit 3 (the machine, not the workflows, is at fault)."""


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
EVENTS = (
    ("push", ""),
    ("pull_request", "same-repo"),
    ("pull_request", "fork"),
    ("schedule", ""),
    ("workflow_dispatch", ""),
)
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
        inputs = tuple(
            (k, v) for k, v in (("runs", str(runs)), ("selection", selection)) if k in declared and v
        )
        for job_id, job in wf["jobs"].items():
            for event, variant in EVENTS:
                if event not in on:
                    continue
                specs.append(
                    JobSpec(
                        name,
                        job_id,
                        event,
                        expected_end(job_id, job, wf, event, variant),
                        inputs=inputs if event == "workflow_dispatch" else (),
                        variant=variant,
                    )
                )
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
    return sorted(
        {lb for wf in workflows.values() for job in wf["jobs"].values() for lb in runs_on_labels(job)}
    )


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
            names.append(
                "Run " + str(step.get("run", "")).strip().splitlines()[0] if step.get("run") else "?"
            )
    return names


def preflight_step(job: dict) -> str | None:
    """The display name of the job's pre-flight step (its name or its command says preflight), or None."""
    for step, name in zip(job.get("steps", []) or [], step_names(job)):
        if PREFLIGHT.search(name) or PREFLIGHT.search(str(step.get("run", ""))):
            return name
    return None


def select(specs: list[JobSpec], jobs: list[str], events: list[str]) -> list[JobSpec]:
    """The specs of the `jobs` (ids; all when empty) on the `events` (`EVENT` or `EVENT:VARIANT`; all when empty);
    a job or event that names nothing is a RehearseError."""
    for name in jobs:
        if not any(s.job == name for s in specs):
            raise RehearseError(
                f"no job {name} in the workflows (jobs: {', '.join(sorted({s.job for s in specs}))})"
            )
    known = {s.event for s in specs} | {f"{s.event}:{s.variant}" for s in specs if s.variant}
    for name in events:
        if name not in known:
            raise RehearseError(f"no event {name} (events: {', '.join(sorted(known))})")
    return [
        s
        for s in specs
        if (not jobs or s.job in jobs)
        and (not events or s.event in events or f"{s.event}:{s.variant}" in events)
    ]


def list_table(specs: list[JobSpec]) -> str:
    """The job x event pairs with their expected ends (`--list`)."""
    rows = [(s.workflow, s.job, s.label, s.expect) for s in specs]
    head = ("workflow", "job", "event", "expected")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in rows), f"{len(rows)} job x event pair(s)"])
