"""`harness run` (the verb, `run_suites`) as a list of named steps, in the manner of the compiler's PASSES
(compiler/backend.py); harness.suites.runner runs the pytest processes the steps ask for.

Terms:
  RunOptions what `harness run` was asked for besides the backend and the place: suites, folder, pytest
             arguments, shard, devices, retries, history, isolation (one dataclass, passed through whole).
  Plan       what a run was asked to do, checked: backend, place (harness.suites.place: natively or in the
             container, chosen once), suites, shard, retry policy, quarantine, history store, and the suites'
             environment (computed once, carried to every process). The setup steps (`SETUP`) each take a
             Plan and return one, before any folder is written.
  RunState   the run in progress: its folder, its record (harness.record.RunRecord, rewritten atomically to
             run.json after every change), each suite's tests as parsed, the step (`current`) and the test that
             was running when an interrupt came. The run steps (`STEPS`) each take and return it.
  end steps  `END`: record the test history, write and print the report, from the record in memory (nothing
             is read back from run.json or the JUnit files).

A step that raises HarnessError marks the run incomplete (`error during <step>`); Ctrl-C or SIGTERM
(harness.process.sigterm_interrupts) marks it incomplete, writes the report and the history of what finished,
and raises RunInterrupted.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness import results as res
from harness.commands import suite_env
from harness.exc import HarnessError, HealthError, RunInterrupted
from harness.matrix import Backend, Matrix, Retries
from harness.process import Terminated, raise_if_terminated, sigterm_interrupts
from harness.record import (
    HealthRecord,
    RetryPolicy,
    RunRecord,
    RunStatus,
    ShardSpec,
    SuiteRecord,
    SuiteStatus,
    TestOutcome,
    seeds_of,
)
from harness.settings import compiler_settings_problem, selection_args, settings
from harness.suites import collect, runner
from harness.suites import place as place_mod
from harness.suites import shard as shard_mod
from harness.suites.options import RunOptions
from harness.suites.place import Place


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the run was asked to do (module docstring); the image step gives `place` its image."""

    b: Backend
    m: Matrix
    place: Place
    suites: tuple[str, ...]
    extra: tuple[str, ...] = ()
    health: bool = True
    echo: bool = True
    save_numerics: bool = False
    shard: shard_mod.Shard | None = None
    durations: Path | None = None
    devices: tuple[str, ...] = ()
    policy: Retries = field(default_factory=Retries)
    history_db: Path | None = None
    isolate: bool = True
    quarantine: Any = None  # harness.suites.quarantine.Quarantine or None
    run_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # the suites' environment (commands.suite_env), once

    @property
    def mode(self) -> str:
        return self.place.mode

    @property
    def label(self) -> str:
        return f"{self.b.name}/{self.mode}" + (f" shard {self.shard}" if self.shard is not None else "")


@dataclass
class RunState:
    """The run in progress (module docstring): every change to `record` goes through `update`, which saves."""

    plan: Plan
    run_dir: Path
    record: RunRecord
    tests: dict[str, list[TestOutcome]] = field(default_factory=dict)
    current: str = "setup"
    running: str | None = None
    ok: bool | None = None  # the report's verdict, set by the report step
    history_error: HarnessError | None = None  # the store refused the record: the run fails with it (exit 3)
    t0: float = field(default_factory=time.monotonic)

    def save(self) -> None:
        res.atomic_write_json(self.run_dir / "run.json", self.record.to_json())

    def update(self, **changes: Any) -> None:
        self.record = replace(self.record, **changes)
        self.save()

    def add_suite(self, suite: SuiteRecord, tests: list[TestOutcome]) -> None:
        self.tests[suite.name] = tests
        self.record = self.record.with_suite(suite)
        self.save()

    def finish(self, status: RunStatus, reason: str = "") -> None:
        self.update(
            status=status,
            finished=now(),
            wall_s=round(time.monotonic() - self.t0, 2),
            reason=reason or self.record.reason,
        )

    def results(self) -> collect.RunResults:
        """The run's results from memory (harness.suites.collect.RunResults), for the report and the history."""
        return collect.from_record(self.run_dir, self.record, self.tests)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---- setup steps: Plan -> Plan ---------------------------------------------------------------------------


def check_host(plan: Plan) -> Plan:
    """Stop before anything is written on a bad durations file, suite, quarantine file, missing pytest or bad
    compiler setting (every suite would die importing the compiler); the quarantine in force is read."""
    from harness.suites import report

    if plan.shard is not None and plan.durations is not None:
        shard_mod.load_durations(plan.durations)
    unknown = [s for s in plan.suites if s not in plan.m.suites]
    if unknown:
        raise HarnessError(
            f"unknown suite(s) {', '.join(unknown)}; the matrix lists {', '.join(plan.m.suites)}"
        )
    plan = replace(
        plan, quarantine=report.load_quarantine(settings().root)
    )  # a broken file stops the run here
    plan.place.check_host()
    problem = compiler_settings_problem({**plan.place.inherited(), **plan.env})
    if problem:
        raise HarnessError(f"bad compiler setting for the suites: {problem}")
    return plan


def preflight(plan: Plan) -> Plan:
    """Before any image build or suite: the driver and enough visible GPUs, docker, free disk
    (harness.checks.preflight); a problem stops the run with one line (exit 3)."""
    report = plan.place.preflight(
        plan.b, need_gpus=max(1, len(plan.devices)), results=plan.run_dir or settings().results_root
    )
    if plan.echo:
        print(report.line(), flush=True)
    return plan


def prepare_image(plan: Plan) -> Plan:
    """The place made ready (harness.suites.place): in container mode devices and docker present, then the
    given image described or the backend's built; natively a GPU backend's torch sees its GPU."""
    return replace(plan, place=plan.place.prepared(plan.b))


SETUP: tuple[tuple[str, Callable[[Plan], Plan]], ...] = (
    ("check host", check_host),
    ("pre-flight", preflight),
    ("image", prepare_image),
)


def open_run(plan: Plan) -> RunState:
    """The run folder and its first record (status running), written."""
    from harness.suites import report

    run_dir = (plan.run_dir or runner.new_run_dir(plan.b.name, plan.mode)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    b = plan.b
    shard = (
        None
        if plan.shard is None
        else ShardSpec(
            plan.shard.index, plan.shard.count, "suites/shard-durations.json" if plan.durations else None
        )
    )
    record = RunRecord(
        run_id=run_dir.name,
        backend=b.name,
        status=RunStatus.RUNNING,
        mode=plan.mode,
        started=now(),
        src=str(settings().root),
        python=plan.place.python,
        docker="docker",
        image=plan.place.image,
        env=plan.env,
        container_options=tuple(b.container_options),
        test_timeout_s=b.timeouts.test_s,
        suite_timeout_s=b.timeouts.suite_s,
        pytest_extra=plan.extra,
        per_test_timeout=plan.place.per_test_timeout,
        devices=plan.devices,
        retries=RetryPolicy(plan.policy.attempts, plan.policy.max_tests),
        history=str(plan.history_db) if plan.history_db else None,
        quarantine=report.quarantine_json(
            plan.quarantine
        ),  # the entries in force: a later report judges by them
        shard=shard,
        commit=commit_of(settings().root),
        seeds=seeds_of(plan.env),
    )
    state = RunState(plan, run_dir, record)
    state.save()
    return state


def commit_of(root: Path) -> dict[str, Any] | None:
    """The record's `commit`: the tree's git sha, dirty state and files, branch; None outside a git checkout."""
    from harness import envinfo

    info = envinfo.git_info(root)
    return (
        None if info.get("sha") is None else {k: info[k] for k in ("sha", "dirty", "dirty_files", "branch")}
    )


# ---- run steps: RunState -> RunState ---------------------------------------------------------------------


def capture_environment(state: RunState) -> RunState:
    """env.json: the host (git, image, the backend's lock) and, where the suites run, the device."""
    from harness import envinfo

    p, run_dir = state.plan, state.run_dir
    host = envinfo.capture_host(p.place.image)
    host["lock"] = envinfo.lock_record(p.b)  # the backend's lock in the tree: path, sha256, stale
    runner.run_python_module(
        p.place,
        p.b,
        ["env", "--part", "device", "--backend", p.b.name, "--out", "{out}/env-device.json"],
        run_dir,
        "env",
        env=p.env,
        timeout_s=p.b.timeouts.health_s,
        echo=False,
    )
    device = (
        res.read_json(run_dir / "env-device.json")
        if (run_dir / "env-device.json").exists()
        else {"error": "device environment capture failed; see env.log"}
    )
    res.atomic_write_json(run_dir / "env.json", {"schema": envinfo.SCHEMA, "host": host, "device": device})
    return state


def check_health(state: RunState) -> RunState:
    """The health check where the suites run (unless `--no-health`); a failure aborts the run."""
    p, run_dir = state.plan, state.run_dir
    if not p.health:
        return state
    rc = runner.run_python_module(
        p.place,
        p.b,
        ["health", "--backend", p.b.name, "--json", "{out}/health.json"],
        run_dir,
        "health",
        env=p.env,
        timeout_s=p.b.timeouts.health_s,
        echo=p.echo,
    )
    state.update(health=HealthRecord(rc == 0, "health.log"))
    if rc != 0:
        state.finish(RunStatus.ABORTED, "health check failed")
        raise HealthError(
            f"health check failed for {p.label}: {runner._error_line(run_dir / 'health.log')} "
            f"(see {run_dir / 'health.log'})"
        )
    return state


def run_all_suites(state: RunState) -> RunState:
    """Every suite in turn: under isolation (or plain), then its failed tests rerun alone."""
    p = state.plan
    suite_dir = state.run_dir / "suites"
    seen = p.place.seen(suite_dir)  # the suites folder as pytest sees it
    shard_args: list[str] = []
    if p.shard is not None:
        shard_args = ["-p", "harness.suites.shard_plugin", f"--kiln-shard={p.shard}"]
        if p.durations is not None:
            suite_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p.durations, suite_dir / "shard-durations.json")
            shard_args.append(f"--kiln-durations={seen}/shard-durations.json")
    for suite in p.suites:
        state.current = f"suite {suite}"
        tests = run_one_suite(state, suite, suite_dir, seen, shard_args)
        failed = [t for t in tests if t.failing]
        if failed and p.policy.attempts > 0:
            state.current = f"retries of suite {suite}"
            retry_suite(state, suite, failed, suite_dir / f"{suite}.xml")
    return state


def run_one_suite(
    state: RunState, suite: str, suite_dir: Path, seen: str, shard_args: Sequence[str]
) -> list[TestOutcome]:
    """One suite's pytest process(es), its summary lines printed and its record added; returns its tests."""
    p = state.plan
    if not (settings().root / "tests" / suite).is_dir():  # git keeps no empty folder
        print(f"suite {suite} [{p.label}] MISSING: tests/{suite} is not in this checkout", flush=True)
        state.add_suite(SuiteRecord(suite, SuiteStatus.MISSING), [])
        return []
    # numerics triage (harness/numerics/suite.py): the numerics suite saves every kiln run's outputs
    save = (
        {"KILN_NUMERICS_SAVE": "{out}/numerics-outputs"} if p.save_numerics and suite == "numerics" else None
    )
    # the k-th suite's split starts at shard k: the heaviest test of each suite goes to a different shard
    record = (
        [f"--kiln-shard-offset={p.m.suites.index(suite)}", f"--kiln-shard-record={seen}/{suite}.shard.json"]
        if shard_args
        else []
    )
    extra = [*p.extra, *shard_args, *record]

    def interrupted(part: SuiteRecord, tests: list[TestOutcome], running: str | None) -> None:
        state.add_suite(part, tests)
        state.running = running

    if p.isolate:
        rec, tests, junit = runner.run_suite_isolated(
            p.place,
            p.b,
            suite,
            suite_dir,
            env=p.env,
            extra=extra,
            echo=p.echo,
            env_extra=save,
            on_interrupt=interrupted,
        )
    else:
        rec, tests, junit = runner.run_suite_plain(
            p.place, p.b, suite, suite_dir, env=p.env, extra=extra, echo=p.echo, env_extra=save
        )
    # a suite that could not be collected has no tests: its status says so and the pointer is its log (the cause)
    label, where = (
        ("COLLECTION ERROR", suite_dir / f"{suite}.log")
        if rec.collect_failed
        else (rec.status.upper(), junit)
    )
    if not where.exists():
        where = suite_dir / f"{suite}.log"
    print(res.summary_line(suite, p.label, tests, rec.duration_s, label, str(where)), flush=True)
    for crash in rec.crashes or ():
        print(
            f"  crashed: {crash.id}: {crash.reason} (attempt {crash.attempt}, {crash.log}); "
            "the rest of the suite ran in a fresh process",
            flush=True,
        )
    if rec.collect_failed or rec.ended_badly:
        print(f"  suite {suite}: {rec.collect_failed or rec.ended_badly}", flush=True)
    state.add_suite(rec, tests)
    return tests


def retry_suite(state: RunState, suite: str, failed: list[TestOutcome], junit: Path) -> None:
    """Rerun a suite's failed tests alone (runner.retry_failed) and put the verdicts in its record."""
    p = state.plan
    q = p.quarantine
    found = runner.retry_failed(
        p.place,
        p.b,
        suite,
        failed,
        p.policy,
        run_dir=state.run_dir,
        junit=junit,
        env=p.env,
        extra=p.extra,
        echo=p.echo,
        quarantined=lambda i: q is not None and q.match(i, p.b.name) is not None,
    )
    print(runner.retry_line(suite, p.label, found), flush=True)
    state.add_suite(replace(state.record.suites[-1], retries=found), state.tests[suite])


STEPS: tuple[tuple[str, Callable[[RunState], RunState]], ...] = (
    ("environment capture", capture_environment),
    ("health check", check_health),
    ("suites", run_all_suites),
)


# ---- end steps -------------------------------------------------------------------------------------------


def record_history(state: RunState) -> RunState:
    """The run's outcomes into the test history (unless `--no-history`), from memory."""
    if state.plan.history_db is not None:
        from harness.exc import StoreDenied
        from harness.suites.history import record_or_warn

        try:
            record_or_warn(state.plan.history_db, state.results())
        except StoreDenied as e:  # raised by run() once the report is written
            state.history_error = e
    return state


def write_report(state: RunState) -> RunState:
    """summary.json and the reports, from memory; the verdict lines and the headline printed."""
    from harness.suites import report

    summary = report.write_reports(state.results())
    for line in summary.verdict_lines():
        print(line, flush=True)
    print(summary.headline(), flush=True)
    md = state.run_dir / "report.md"
    if md.is_file():
        res.append_job_summary(
            md.read_text(encoding="utf-8")
        )  # only with --github-summary (KILN_GITHUB_SUMMARY)
    state.ok = summary.ok
    return state


END: tuple[tuple[str, Callable[[RunState], RunState]], ...] = (
    ("history", record_history),
    ("report", write_report),
)


# ---- the driver ------------------------------------------------------------------------------------------


def run(plan: Plan) -> tuple[Path, int]:
    """SETUP, then STEPS under the interrupt supervisor, then END (module docstring); (run folder, exit code)."""
    for _, prepare in SETUP:
        plan = prepare(plan)
    state = open_run(plan)
    with sigterm_interrupts():
        try:
            for name, step in STEPS:
                state.current = name
                state = step(state)
            raise_if_terminated()  # a SIGTERM swallowed inside a step: incomplete, as any interrupt
            state.finish(RunStatus.COMPLETE)
        except KeyboardInterrupt as e:
            what = "terminated" if isinstance(e, Terminated) else "interrupted"
            running = f" while running {state.running}" if state.running else ""
            state.finish(RunStatus.INCOMPLETE, f"{what} during {state.current}{running}")
            from harness.suites import report

            report.write_reports(state.results())
            record_history(state)  # what finished before the interrupt counts (the run stays incomplete)
            raise RunInterrupted(
                f"run {what} during {state.current}; results so far kept in {state.run_dir} "
                "(marked incomplete)"
            ) from None
        except HarnessError:
            if state.record.status == RunStatus.RUNNING:
                state.finish(RunStatus.INCOMPLETE, f"error during {state.current}")
            raise
    for _, step in END:
        state = step(state)
    if state.history_error is not None:
        raise state.history_error
    return state.run_dir, 0 if state.ok else 1


def plan_of(backend_name: str, place: Place, options: RunOptions) -> Plan:
    """The Plan of `run_suites`' arguments: the matrix loaded, the devices pinned, the suites' environment."""
    o = options
    m = matrix_mod.load()
    unpinned = m.backend(backend_name)
    b = place.pin(unpinned, list(o.devices))
    return Plan(
        b=b,
        m=m,
        place=place,
        suites=tuple(o.suites or m.suites),
        extra=tuple(o.extra),
        health=o.health,
        echo=o.echo,
        save_numerics=o.save_numerics,
        shard=o.shard,
        durations=o.durations,
        devices=tuple(o.devices),
        policy=o.retries or m.retries_for(unpinned),
        history_db=o.history_location(),
        isolate=o.isolate,
        run_dir=o.run_dir,
        env=suite_env(m, b),
    )


def run_suites(backend_name: str, place: Place, options: RunOptions) -> tuple[Path, int]:
    """Health check, environment capture and every suite for one backend at `place` (harness.suites.place);
    returns (run folder, exit code). The steps: SETUP, STEPS and END.

    `options` (RunOptions): `suites` (None: the matrix's), `run_dir` (None: a new folder under the results
    root), `extra` pytest arguments; `shard`: run only that shard of every suite's tests, balanced by the
    `durations` file (None: by count); `devices`: pin the run to these GPU ids (the place's `pin`, harness.suites.place);
    `retries`: how failed tests are rerun (None: the matrix's); `history`: the test-history store a complete run
    is recorded into (None: the default store; `record_history=False`: none); `isolate`: crash isolation
    (harness.suites.isolation: a test that kills its process costs that test alone), off only to measure what
    it costs.
    Exit code: 0 when every suite ran and no test failed or errored except flaky ones (passed on a retry) and
    quarantined ones, else 1. Raises HealthError when a device is unhealthy, RunInterrupted on Ctrl-C/SIGTERM
    (run.json then says `incomplete`).
    """
    return run(plan_of(backend_name, place, options))


# ---- CLI: `python -m harness run` ------------------------------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="cpu, cuda or rocm (default: detected, see `python -m harness detect`)")
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="run with this machine's Python instead of a container (also KILN_NATIVE=1)",
    )
    p.add_argument("--suite", action="append", dest="suites", help="run only this suite (repeatable)")
    p.add_argument("--results", help="run folder to write (default: results/<time>-<backend>-<mode>)")
    p.add_argument("--image", help="use this local image instead of building the hash-tagged one")
    p.add_argument("--base-image", help="build the image on this base")
    p.add_argument("--no-health", action="store_true", help="skip the GPU health check")
    p.add_argument("--quiet", action="store_true", help="do not echo pytest output (it is still logged)")
    p.add_argument(
        "--save-numerics",
        action="store_true",
        help="the numerics suite saves its outputs into suites/numerics-outputs (see `harness numerics`)",
    )
    shards = p.add_argument_group(
        "shards", "split every suite's tests into N disjoint shards (harness.suites.shard)"
    )
    shards.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N (e.g. one job of a CI matrix; "
        "`python -m harness merge` joins the shards' folders into one report)",
    )
    shards.add_argument(
        "--shards",
        metavar="N|auto",
        help="run N shards at once, each pinned to its own GPU(s), "
        "into RESULTS/shard-I/ and one merged report; auto: one per GPU group (CPU: 1)",
    )
    shards.add_argument(
        "--gpus-per-shard", type=int, default=1, metavar="K", help="GPUs per shard (default 1)"
    )
    shards.add_argument(
        "--durations",
        metavar="FILE",
        help="test durations that balance the shards (default: "
        "ci/durations/<backend>.json when it exists, else durations/<backend>.json next "
        "to the test history store, else shards are balanced by test count)",
    )
    shards.add_argument(
        "--devices",
        metavar="IDS",
        help="pin the run to these GPU ids (comma-separated); "
        "with --shards, shard k takes the k-th --gpus-per-shard of them, and an id may repeat "
        "(--devices 0,0 --shards 2: two shards share GPU 0)",
    )
    p.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="rerun each failed test alone up to N times until it "
        "passes (flaky) or not (failing); 0: no reruns (default: the matrix's `retries`)",
    )
    p.add_argument(
        "--history",
        metavar="DB",
        help="the test-history store a complete run is recorded into "
        "(default: KILN_HISTORY_DB, else $XDG_DATA_HOME/kiln/history/history.sqlite, "
        "~/.local/share/kiln/... without XDG_DATA_HOME: outside the checkout, so it accumulates)",
    )
    p.add_argument("--no-history", action="store_true", help="do not record the run into the test history")
    from harness.store.cli import add_store_flags

    add_store_flags(p)
    p.add_argument(
        "--no-isolation",
        action="store_true",
        help="run each suite as one pytest process with no "
        "crash isolation (a crashing test then loses its suite's results; for measuring its cost)",
    )
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after `--`: more pytest arguments")


def shard_options(
    args: argparse.Namespace, backend: str
) -> tuple[shard_mod.Shard | None, int | None, Path | None]:
    """(--shard, --shards with None for auto, the durations file) from the command line; bad values raise."""
    if args.shard and args.shards:
        raise HarnessError("--shard I/N runs one shard, --shards N runs them all: give one of them")
    shard = shard_mod.parse_shard(args.shard) if args.shard else None
    count = shard_mod.parse_shard_count(args.shards) if args.shards else None
    if args.durations:
        durations: Path | None = Path(args.durations).resolve()
        if not (durations and durations.is_file()):
            raise HarnessError(f"durations file {args.durations} not found")
    else:
        durations = shard_mod.find_durations(settings().root, backend)
    return shard, count, durations


def cli_main(args: argparse.Namespace) -> int:
    """Run the suites for a backend, in its container or natively."""
    place = place_mod.chosen(args.native, args.image, args.base_image)
    backend = args.backend or matrix_mod.detect_backend()
    extra = list(args.pytest_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    extra += selection_args("harness run")
    shard, count, durations = shard_options(args, backend)
    devices = [d.strip() for d in (args.devices or "").split(",") if d.strip()]
    run_dir = res.output_folder(args.results, "--results") if args.results else None
    if run_dir is None:
        res.output_folder(settings().results_root, "KILN_RESULTS")  # where new_run_dir would make the folder
    options = RunOptions(
        suites=args.suites,
        run_dir=run_dir,
        extra=extra,
        health=not args.no_health,
        echo=not args.quiet,
        save_numerics=args.save_numerics,
        shard=shard,
        durations=durations,
        devices=devices,
        retries=retry_option(args.retries, backend),
        history=Path(args.history) if args.history else None,
        record_history=not args.no_history,
        isolate=not args.no_isolation,
    )
    if args.shards:
        b = matrix_mod.load().backend(backend)
        from harness.checks import preflight as preflight_mod

        preflight_mod.driver_gpus(b)  # no driver: the pre-flight's line, before the shards are counted
        gpus = list(devices) or (shard_mod.visible_gpus(b.name) if b.is_gpu else [])
        groups = shard_mod.device_groups(b.is_gpu, count, args.gpus_per_shard, gpus, backend=b.name)
        if len(groups) > 1:  # one shard is the plain run (below)
            from harness.suites import sharded

            place.check_host()
            run_dir = run_dir or runner.new_run_dir(b.name, place.mode)
            _, code = sharded.run_shards(b.name, groups, place, replace(options, run_dir=run_dir))
            return code
        options = replace(options, devices=groups[0])
    _, code = run_suites(backend, place, options)
    return code


def retry_option(value: int | None, backend: str) -> Retries | None:
    """`--retries N` as the run's Retries (the matrix's max_tests), None when not given; N < 0 is an error."""
    if value is None:
        return None
    if value < 0:
        raise HarnessError(f"--retries {value}: expected 0 (no reruns) or more")
    m = matrix_mod.load()
    return Retries(attempts=value, max_tests=m.retries_for(m.backend(backend)).max_tests)
