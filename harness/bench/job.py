"""The end of a CI bench job: `python -m harness bench job-summary --backend B [--recorded]
[--bisect-max N] [--native]`, the last step of `nox -s bench-record` / `bench-pr`.

It reads the job's results folder (default results/bench/B): `last.json`, the run's JSON report (its
comparisons after the confirmation re-measure and the baseline runs), and `baseline.json`, the seed (main's
previous complete run as exported from B's lasting store). It appends to the job summary:

- **Runs compared**: this run (its id in the job's store, uid, commit; with `--recorded` its id in B's lasting
  store, where the record step put it) and the baseline (its id in the lasting store, uid, commit). The run
  report's own ids are those of the job's store, which lives one job.
- **Automatic bisection** (`--bisect-max N`, default $KILN_BENCH_BISECT_MAX, else 2; 0: off): each
  workload+compiler whose regression the re-measure confirmed, compilers before eager, worst ratio first; the
  first N are bisected with `bench bisect BASELINE_COMMIT THIS_COMMIT --only W --compiler C --backend B` (B's
  container, or `--native`), the rest listed as not bisected. Each verdict (bisect's `--md`) goes to the
  summary, its `--json` to `bisect-W-C.json` beside the run's export (`run.json`); `auto-bisect.json` says
  what was decided. Nothing is bisected, with the reason, when the baseline run recorded no commit, is of this
  very commit, or its commit is not in the checkout's history (a shallow clone: the workflow's checkout needs
  `fetch-depth: 0`); the command to run by hand is given.

Exit 0 whatever the bisections find: a confirmed regression already fails the job (the measure step's exit 1),
and a bisection that fails or is inconclusive only adds its verdict to the summary. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.bench.core.records import comparisons_of
from harness.exc import UsageError
from harness.git import git
from harness.settings import DEFAULT_BENCH_BISECT_MAX as DEFAULT_BISECT_MAX
from harness.settings import bench_settings
from harness.suites.place import Place, chosen

EAGER = "eager"


@dataclass(frozen=True)
class Target:
    """A confirmed regression: one workload under one compiler, its ratio and p-value after the re-measure."""

    workload: str
    compiler: str
    ratio: float | None = None
    p: float | None = None

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.workload}-{self.compiler}")

    def label(self) -> str:
        ratio = f", ratio {self.ratio:.3f}" if self.ratio is not None else ""
        return f"`{self.workload}` under {self.compiler}{ratio}"


@dataclass
class Plan:
    """What to bisect: `targets` between `good` (the baseline run's commit) and `bad` (this run's); `skipped`:
    (target, why) not bisected; `reason`: why none is bisected, when that holds for all."""

    good: str | None
    bad: str | None
    targets: list[Target] = field(default_factory=list)
    skipped: list[tuple[Target, str]] = field(default_factory=list)
    reason: str = ""


def confirmed_regressions(report: dict[str, Any]) -> list[Target]:
    """The comparisons of a run's JSON report that stayed regressed after the confirmation re-measure;
    compilers before eager (eager is the clock, rarely the culprit), then worst ratio first."""
    hits = [
        Target(c.workload, c.compiler, c.ratio, c.p)
        for c in comparisons_of(report) or []
        if c.confirmed_regression
    ]
    return sorted(hits, key=lambda t: (t.compiler == EAGER, -(t.ratio or 0.0), t.workload, t.compiler))


def plan_bisections(
    targets: list[Target],
    good: str | None,
    bad: str | None,
    cap: int,
    history_problem: Callable[[str, str], str | None],
) -> Plan:
    """Which of `targets` to bisect (at most `cap`), or why none; `history_problem(good, bad)` says what keeps
    GOOD..BAD from being bisected in this checkout (None: nothing)."""
    plan = Plan(good, bad)
    if not targets:
        return plan

    def none(reason: str) -> Plan:
        plan.reason = reason
        plan.skipped = [(t, reason) for t in targets]
        return plan

    if cap <= 0:
        return none("automatic bisection is off (--bisect-max 0 / KILN_BENCH_BISECT_MAX=0)")
    if not good:
        return none("the baseline run (main's previous run) recorded no commit")
    if not bad:
        return none("this run recorded no commit")
    if good == bad:
        return none(
            f"the baseline run is of this very commit {good[:10]}: no commit lies between them (the "
            "slowdown came from the runner or its environment)"
        )
    problem = history_problem(good, bad)
    if problem:
        return none(problem)
    plan.targets = targets[:cap]
    plan.skipped = [
        (t, f"at most {cap} bisection(s) per job (--bisect-max / KILN_BENCH_BISECT_MAX)")
        for t in targets[cap:]
    ]
    return plan


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return git(repo, *args, check=False)


def history_problem(repo: Path, good: str, bad: str) -> str | None:
    """Why GOOD..BAD cannot be bisected in the checkout at `repo` (None: it can): not a git checkout, GOOD or
    BAD missing from its history (a shallow clone says so), GOOD not an ancestor of BAD."""
    if _git(repo, "rev-parse", "--git-dir").returncode != 0:
        return f"{repo} is not a git checkout"
    shallow = _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    for what, sha in (("main's previous run", good), ("this run", bad)):
        if _git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
            if shallow:
                return (
                    f"commit {sha[:10]} ({what}) is not in this checkout's history: the checkout is shallow "
                    "(the workflow's checkout step needs `fetch-depth: 0`)"
                )
            return (
                f"commit {sha[:10]} ({what}) is not in this checkout's history (main rewritten, or the run "
                "came from another repository)"
            )
    if _git(repo, "merge-base", "--is-ancestor", good, bad).returncode != 0:
        return f"commit {good[:10]} (main's previous run) is not an ancestor of {bad[:10]} (main rewritten?)"
    return None


def bisect_argv(
    plan: Plan,
    t: Target,
    backend: str,
    *,
    place: Place | None = None,
    out: Path | None = None,
    python: str = "python",
    step_timeout_s: float | None = None,
) -> list[str]:
    """`python -m harness bench bisect GOOD BAD --only W --compiler C --backend B` (reports into `out`), at `place`
    (its `cli_args`: `--native`, or the image of a prepared container place; None: bisect's own mode rule)."""
    argv = [
        python,
        "-m",
        "harness",
        "bench",
        "bisect",
        str(plan.good),
        str(plan.bad),
        "--only",
        t.workload,
        "--compiler",
        t.compiler,
        "--backend",
        backend,
        *(place.cli_args() if place is not None else []),
    ]
    if step_timeout_s:
        argv += ["--step-timeout", f"{step_timeout_s:g}"]
    if out is not None:
        argv += ["--json", str(out / f"bisect-{t.slug}.json"), "--md", str(out / f"bisect-{t.slug}.md")]
    return argv


@dataclass
class BisectOutcome:
    """What one bisection said: its exit code, Markdown report (empty when it wrote none) and a line."""

    target: Target
    rc: int
    markdown: str = ""
    line: str = ""
    outcome: str = ""  # first-bad / noise / inconclusive (bisect's JSON), else empty
    first_bad: str | None = None


def run_one(
    plan: Plan, t: Target, backend: str, out: Path, *, place: Place, step_timeout_s: float, repo: Path
) -> BisectOutcome:
    """One real bisection, its output teed to the log and `out/bisect-W-C.log`, read back as a BisectOutcome."""
    from harness.bench.kernels.bisect import last_line
    from harness.process import execute

    argv = bisect_argv(
        plan, t, backend, place=place, out=out, python=sys.executable, step_timeout_s=step_timeout_s
    )
    env = {**os.environ, "GITHUB_STEP_SUMMARY": ""}  # this step writes the summary, in its own order
    log = out / f"bisect-{t.slug}.log"
    print(f"auto-bisect: {shlex.join(argv)}", file=sys.stderr, flush=True)
    rc, _ = execute(argv, log=log, timeout_s=None, env=env, cwd=repo)
    v = BisectOutcome(t, rc)
    md, js = out / f"bisect-{t.slug}.md", out / f"bisect-{t.slug}.json"
    if md.exists():
        v.markdown = md.read_text(encoding="utf-8")
    if js.exists():
        try:
            data = json.loads(js.read_text())
            v.outcome, v.line = data.get("outcome", ""), data.get("message", "")
            v.first_bad = (data.get("first_bad") or {}).get("sha")
        except (OSError, json.JSONDecodeError):
            pass
    if not v.line:
        v.line = f"bisect exited {rc}: {last_line(log)}"
    return v


def _run_line(run: dict[str, Any]) -> str:
    commit, ref = (run.get("git_commit") or "-")[:10], run.get("git_ref") or "-"
    return f"uid `{run.get('uid', '?')}`, commit `{commit}` (ref {ref}, {run.get('created_at', '?')})"


def runs_markdown(
    report: dict[str, Any], seed: dict[str, Any] | None, *, lasting_id: int | None, recorded: bool
) -> list[str]:
    """The 'Runs compared' lines: this run and its baseline, by their ids in the job's and the lasting store."""
    run = report.get("run") or {}
    lines = ["### Runs compared", ""]
    where = (
        f"recorded as run {lasting_id} of the lasting store"
        if lasting_id is not None
        else "not found in the lasting store after the record step"
        if recorded
        else "not recorded (only main's runs are)"
    )
    lines.append(f"- this run: run {run.get('id', '?')} of the job's store, {_run_line(run)}; {where}")
    base = report.get("baseline")
    if base is None:  # a report written before it named its baseline runs: ids of the job's store only
        base = [{"id": i} for i in report.get("baseline_runs") or []]
    lasting = {r.get("uid"): r for r in (seed or {}).get("runs", [])}
    if not base:
        lines.append(
            "- against: nothing (no complete run of main in the lasting store yet); nothing compared"
        )
    for b in base:
        seeded = lasting.get(b.get("uid"), {})
        lid = f"run {seeded['id']} of the lasting store" if seeded.get("id") is not None else "a run"
        lines.append(
            f"- against: {lid} (main's previous complete run), {_run_line({**seeded, **b})}; run "
            f"{b.get('id', '?')} of the job's store"
        )
    return lines + [""]


def bisect_markdown(plan: Plan, verdicts: list[BisectOutcome], backend: str, place: Place) -> list[str]:
    """The 'Automatic bisection' section."""
    n = len(plan.targets) + len(plan.skipped)
    if not n:
        return []
    lines = ["### Automatic bisection", ""]
    good, bad = (plan.good or "?")[:10], (plan.bad or "?")[:10]
    if plan.targets:
        lines.append(
            f"{n} confirmed regression(s); {len(plan.targets)} bisected between main's previous run "
            f"`{good}` and this run `{bad}`:"
        )
    else:
        lines.append(f"{n} confirmed regression(s), **none bisected**: {plan.reason}.")
    lines.append("")
    for v in verdicts:
        tail = f" (exit {v.rc}; log `bisect-{v.target.slug}.log`)" if not v.markdown else ""
        lines.append(f"- {v.target.label()}: **{v.line}**{tail}")
    for t, why in plan.skipped:
        lines.append(f"- {t.label()}: not bisected: {why}")
    if plan.skipped and plan.good and plan.bad:
        t = plan.skipped[0][0]
        lines += [
            "",
            "By hand (in a full clone): `" + shlex.join(bisect_argv(plan, t, backend, place=place)) + "`",
        ]
    lines.append("")
    for v in verdicts:
        if v.markdown:
            lines += [v.markdown, ""]
    return lines


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None


def _lasting_id(backend: str, uid: str | None) -> int | None:
    from harness.bench.stores.store import lasting_path, open_fleet, open_lasting
    from harness.store.cli import configured

    if not uid:
        return None
    fleet = configured()  # KILN_STORE_URL: the run was recorded there
    opened = (
        open_fleet(fleet, write=False)
        if fleet is not None
        else open_lasting(lasting_path(backend), write=False)
    )
    with opened as store:
        return next((r.id for r in store.runs() if r.uid == uid), None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, help="the job's backend of ci/matrix.json")
    p.add_argument("--results", type=Path, help="the job's results folder (default results/bench/BACKEND)")
    p.add_argument(
        "--recorded",
        action="store_true",
        help="the run was recorded into the backend's lasting store (bench-record): name its id there",
    )
    p.add_argument(
        "--bisect-max",
        type=int,
        default=None,
        help="confirmed regressions bisected at most (default "
        f"$KILN_BENCH_BISECT_MAX, else {DEFAULT_BISECT_MAX}; 0: none)",
    )
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="bisect on this machine's Python, not the container (also KILN_NATIVE=1)",
    )
    p.add_argument("--step-timeout", type=float, default=600.0, help="seconds per bisect measurement (600)")
    p.add_argument("--repo", type=Path, default=Path("."), help="the checkout (default: the current folder)")


def bisect_max(arg: int | None) -> int:
    """`--bisect-max N` when given, else KILN_BENCH_BISECT_MAX (harness/settings.py), else the default."""
    return arg if arg is not None else bench_settings().bisect_max


def cmd_job_summary(
    args: argparse.Namespace, run_bisect: Callable[[Plan, Target], BisectOutcome] | None = None
) -> int:
    """The `bench job-summary` verb (module docstring); `run_bisect` replaces the real bisections (tests)."""
    from harness.results import append_job_summary, atomic_write_text

    out = Path(args.results or Path("results") / "bench" / args.backend)
    cap = bisect_max(args.bisect_max)
    report = _read(out / "last.json")
    if report is None:
        append_job_summary(
            f"> bench {args.backend}: no run report ({out / 'last.json'}): the measure step ended "
            "before writing it; nothing compared or bisected (see the job log)",
            force=True,
        )
        print(f"note: no run report {out / 'last.json'}", file=sys.stderr)
        return 0
    seed = _read(out / "baseline.json")
    run = report.get("run") or {}
    lasting_id = _lasting_id(args.backend, run.get("uid")) if args.recorded else None
    base = report.get("baseline") or []
    good = base[0].get("git_commit") if base else None
    if not base and report.get("baseline_runs") and seed and seed.get("runs"):
        good = seed["runs"][0].get("git_commit")  # an older report: the seed is the baseline
    repo = args.repo.resolve()
    place = chosen(args.native)  # --native, else KILN_NATIVE, else the backend's container
    plan = plan_bisections(
        confirmed_regressions(report),
        good,
        run.get("git_commit"),
        cap,
        lambda g, b: history_problem(repo, g, b),
    )
    if run_bisect is None:

        def run_bisect(plan: Plan, t: Target) -> BisectOutcome:
            return run_one(
                plan, t, args.backend, out, place=place, step_timeout_s=args.step_timeout, repo=repo
            )

    verdicts = [run_bisect(plan, t) for t in plan.targets]
    lines = runs_markdown(report, seed, lasting_id=lasting_id, recorded=args.recorded)
    lines += bisect_markdown(plan, verdicts, args.backend, place)
    md = "\n".join(lines)
    print(md)
    append_job_summary(md, force=True)  # this verb exists to write the job summary
    atomic_write_text(
        out / "auto-bisect.json",
        json.dumps(
            {
                "good": plan.good,
                "bad": plan.bad,
                "max": cap,
                "reason": plan.reason,
                "bisected": [
                    {
                        **asdict(v.target),
                        "rc": v.rc,
                        "outcome": v.outcome,
                        "message": v.line,
                        "first_bad": v.first_bad,
                        "json": f"bisect-{v.target.slug}.json",
                    }
                    for v in verdicts
                ],
                "not_bisected": [{**asdict(t), "why": why} for t, why in plan.skipped],
            },
            indent=1,
        ),
    )
    return 0
