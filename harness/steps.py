"""`harness run` as a list of named steps, in the manner of the compiler's PASSES (compiler/backend.py).

Terms:
  Plan       what a run was asked to do, checked: backend, suites, shard, retry policy, quarantine, history
             store, image. The setup steps (`SETUP`) each take a Plan and return one, before any folder is
             written.
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

import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import collect
from harness import matrix as matrix_mod
from harness import results as res
from harness import runner
from harness import shard as shard_mod
from harness.commands import CONTAINER_RESULTS, suite_env
from harness.exc import HarnessError, HealthError, RunInterrupted
from harness.matrix import Backend, Matrix, Retries
from harness.process import Terminated, sigterm_interrupts
from harness.record import (HealthRecord, RetryPolicy, RunRecord, RunStatus, ShardSpec, SuiteRecord, SuiteStatus,
                            TestOutcome)
from harness.settings import settings


@dataclass(frozen=True)
class Plan:
    """What the run was asked to do (module docstring); `image_tag`/`image` are set by the image step."""

    b: Backend
    m: Matrix
    native: bool
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
    quarantine: Any = None  # harness.quarantine.Quarantine or None
    run_dir: Path | None = None
    image_tag: str | None = None
    base_image: str | None = None
    image: dict[str, Any] | None = None

    @property
    def mode(self) -> str:
        return "native" if self.native else "container"

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
        self.update(status=status, finished=now(), wall_s=round(time.monotonic() - self.t0, 2),
                    reason=reason or self.record.reason)

    def results(self) -> collect.RunResults:
        """The run's results from memory (harness.collect.RunResults), for the report and the history."""
        return collect.from_record(self.run_dir, self.record, self.tests)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- setup steps: Plan -> Plan ---------------------------------------------------------------------------


def check_host(plan: Plan) -> Plan:
    """Stop before anything is written on a bad durations file, suite, quarantine file, missing pytest or bad
    compiler setting (every suite would die importing the compiler); the quarantine in force is read."""
    from harness import report

    if plan.shard is not None and plan.durations is not None:
        shard_mod.load_durations(plan.durations)
    unknown = [s for s in plan.suites if s not in plan.m.suites]
    if unknown:
        raise HarnessError(f"unknown suite(s) {', '.join(unknown)}; the matrix lists {', '.join(plan.m.suites)}")
    plan = replace(plan, quarantine=report.load_quarantine(settings().root))  # a broken file stops the run here
    if plan.native:
        runner._check_native_python()
    problem = runner.compiler_settings_problem({**(os.environ if plan.native else {}), **suite_env(plan.m, plan.b)})
    if problem:
        raise HarnessError(f"bad compiler setting for the suites: {problem}")
    return plan


def prepare_image(plan: Plan) -> Plan:
    """Container mode: devices and docker present, then the given image described or the backend's built."""
    from harness import health as health_mod
    from harness import image as image_mod

    if plan.native:
        return plan
    health_mod.require_host_devices(plan.b)
    image_mod.require_docker()
    if plan.image_tag:
        info = image_mod.describe(plan.image_tag, plan.base_image)  # its labels: base digest/id, lock digest
        if not info:
            raise HarnessError(f"image {plan.image_tag} is not present locally")
        return replace(plan, image=info)
    built = image_mod.build(plan.b, base_image=plan.base_image)
    return replace(plan, image=built.record(), image_tag=built.tag)


SETUP: tuple[tuple[str, Callable[[Plan], Plan]], ...] = (("check host", check_host), ("image", prepare_image))


def open_run(plan: Plan) -> RunState:
    """The run folder and its first record (status running), written."""
    from harness import report

    run_dir = (plan.run_dir or runner.new_run_dir(plan.b.name, plan.mode)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    b = plan.b
    shard = None if plan.shard is None else ShardSpec(
        plan.shard.index, plan.shard.count, "suites/shard-durations.json" if plan.durations else None)
    record = RunRecord(
        run_id=run_dir.name, backend=b.name, status=RunStatus.RUNNING, mode=plan.mode, started=now(),
        src=str(settings().root), python=sys.executable if plan.native else "python", docker="docker",
        image=plan.image, env=suite_env(plan.m, b), container_options=tuple(b.container_options),
        test_timeout_s=b.timeouts.test_s, suite_timeout_s=b.timeouts.suite_s, pytest_extra=plan.extra,
        per_test_timeout=runner.pytest_timeout_available() if plan.native else True, devices=plan.devices,
        retries=RetryPolicy(plan.policy.attempts, plan.policy.max_tests),
        history=str(plan.history_db) if plan.history_db else None,
        quarantine=report.quarantine_json(plan.quarantine),  # the entries in force: a later report judges by them
        shard=shard)
    state = RunState(plan, run_dir, record)
    state.save()
    return state


# ---- run steps: RunState -> RunState ---------------------------------------------------------------------


def capture_environment(state: RunState) -> RunState:
    """env.json: the host (git, image, the backend's lock) and, where the suites run, the device."""
    from harness import envinfo

    p, run_dir = state.plan, state.run_dir
    host = envinfo.capture_host(p.image)
    host["lock"] = envinfo.lock_record(p.b.name)  # the backend's lock in the tree: path, sha256, stale
    runner.run_python_module(p.b, ["env", "--part", "device", "--backend", p.b.name, "--out",
                                   "{out}/env-device.json"], run_dir, "env", native=p.native, image=p.image_tag,
                             m=p.m, timeout_s=p.b.timeouts.health_s, echo=False)
    device = (res.read_json(run_dir / "env-device.json") if (run_dir / "env-device.json").exists()
              else {"error": "device environment capture failed; see env.log"})
    res.atomic_write_json(run_dir / "env.json", {"schema": envinfo.SCHEMA, "host": host, "device": device})
    return state


def check_health(state: RunState) -> RunState:
    """The health check where the suites run (unless `--no-health`); a failure aborts the run."""
    p, run_dir = state.plan, state.run_dir
    if not p.health:
        return state
    rc = runner.run_python_module(p.b, ["health", "--backend", p.b.name, "--json", "{out}/health.json"], run_dir,
                                  "health", native=p.native, image=p.image_tag, m=p.m,
                                  timeout_s=p.b.timeouts.health_s, echo=p.echo)
    state.update(health=HealthRecord(rc == 0, "health.log"))
    if rc != 0:
        state.finish(RunStatus.ABORTED, "health check failed")
        raise HealthError(f"health check failed for {p.label}: {runner._error_line(run_dir / 'health.log')} "
                          f"(see {run_dir / 'health.log'})")
    return state


def run_all_suites(state: RunState) -> RunState:
    """Every suite in turn: under isolation (or plain), then its failed tests rerun alone."""
    p = state.plan
    suite_dir = state.run_dir / "suites"
    seen = str(suite_dir) if p.native else CONTAINER_RESULTS  # the suites folder as pytest sees it
    shard_args: list[str] = []
    if p.shard is not None:
        shard_args = ["-p", "harness.shard_plugin", f"--kiln-shard={p.shard}"]
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


def run_one_suite(state: RunState, suite: str, suite_dir: Path, seen: str, shard_args: Sequence[str]
                  ) -> list[TestOutcome]:
    """One suite's pytest process(es), its summary lines printed and its record added; returns its tests."""
    p = state.plan
    if not (settings().root / "tests" / suite).is_dir():  # git keeps no empty folder
        print(f"suite {suite} [{p.label}] MISSING: tests/{suite} is not in this checkout", flush=True)
        state.add_suite(SuiteRecord(suite, SuiteStatus.MISSING), [])
        return []
    # numerics triage (harness/numerics/suite.py): the numerics suite saves every kiln run's outputs
    save = {"KILN_NUMERICS_SAVE": "{out}/numerics-outputs"} if p.save_numerics and suite == "numerics" else None
    # the k-th suite's split starts at shard k: the heaviest test of each suite goes to a different shard
    record = [f"--kiln-shard-offset={p.m.suites.index(suite)}",
              f"--kiln-shard-record={seen}/{suite}.shard.json"] if shard_args else []
    extra = [*p.extra, *shard_args, *record]

    def interrupted(part: SuiteRecord, tests: list[TestOutcome], running: str | None) -> None:
        state.add_suite(part, tests)
        state.running = running

    if p.isolate:
        rec, tests, junit = runner.run_suite_isolated(
            p.b, suite, suite_dir, seen=seen, native=p.native, image=p.image_tag, extra=extra, m=p.m, echo=p.echo,
            env_extra=save, on_interrupt=interrupted)
    else:
        rec, tests, junit = runner.run_suite_plain(p.b, suite, suite_dir, native=p.native, image=p.image_tag,
                                                   extra=extra, m=p.m, echo=p.echo, env_extra=save)
    print(res.summary_line(suite, p.label, tests, rec.duration_s, rec.status.upper(), str(junit)), flush=True)
    for crash in rec.crashes or ():
        print(f"  crashed: {crash.id}: {crash.reason} (attempt {crash.attempt}, {crash.log}); "
              "the rest of the suite ran in a fresh process", flush=True)
    if rec.collect_failed or rec.ended_badly:
        print(f"  suite {suite}: {rec.collect_failed or rec.ended_badly}", flush=True)
    state.add_suite(rec, tests)
    return tests


def retry_suite(state: RunState, suite: str, failed: list[TestOutcome], junit: Path) -> None:
    """Rerun a suite's failed tests alone (runner.retry_failed) and put the verdicts in its record."""
    p = state.plan
    q = p.quarantine
    found = runner.retry_failed(p.b, suite, failed, p.policy, run_dir=state.run_dir, junit=junit, native=p.native,
                                image=p.image_tag, m=p.m, extra=p.extra, echo=p.echo,
                                quarantined=lambda i: q is not None and q.match(i, p.b.name) is not None)
    print(runner.retry_line(suite, p.label, found), flush=True)
    state.add_suite(replace(state.record.suites[-1], retries=found), state.tests[suite])


STEPS: tuple[tuple[str, Callable[[RunState], RunState]], ...] = (
    ("environment capture", capture_environment), ("health check", check_health), ("suites", run_all_suites))


# ---- end steps -------------------------------------------------------------------------------------------


def record_history(state: RunState) -> RunState:
    """The run's outcomes into the test history (unless `--no-history`), from memory."""
    if state.plan.history_db is not None:
        from harness.history import record_or_warn

        record_or_warn(state.plan.history_db, state.results())
    return state


def write_report(state: RunState) -> RunState:
    """summary.json and the reports, from memory; the verdict lines and the headline printed."""
    from harness import report

    summary = report.write_reports(state.results())
    for line in summary.verdict_lines():
        print(line, flush=True)
    print(summary.headline(), flush=True)
    state.ok = summary.ok
    return state


END: tuple[tuple[str, Callable[[RunState], RunState]], ...] = (("history", record_history), ("report", write_report))


# ---- the driver ------------------------------------------------------------------------------------------


def run(plan: Plan) -> tuple[Path, int]:
    """SETUP, then STEPS under the interrupt supervisor, then END (module docstring); (run folder, exit code)."""
    for _, step in SETUP:
        plan = step(plan)
    state = open_run(plan)
    with sigterm_interrupts():
        try:
            for name, step in STEPS:
                state.current = name
                state = step(state)
            state.finish(RunStatus.COMPLETE)
        except KeyboardInterrupt as e:
            what = "terminated" if isinstance(e, Terminated) else "interrupted"
            running = f" while running {state.running}" if state.running else ""
            state.finish(RunStatus.INCOMPLETE, f"{what} during {state.current}{running}")
            from harness import report

            report.write_reports(state.results())
            record_history(state)  # what finished before the interrupt counts (the run stays incomplete)
            raise RunInterrupted(f"run {what} during {state.current}; results so far kept in {state.run_dir} "
                                 "(marked incomplete)") from None
        except HarnessError:
            if state.record.status == RunStatus.RUNNING:
                state.finish(RunStatus.INCOMPLETE, f"error during {state.current}")
            raise
    for _, step in END:
        state = step(state)
    return state.run_dir, 0 if state.ok else 1


def plan_of(backend_name: str, *, native: bool, suites: Sequence[str] | None, run_dir: Path | None,
            image_tag: str | None, base_image: str | None, extra: Sequence[str], health: bool, echo: bool,
            save_numerics: bool, shard: shard_mod.Shard | None, durations: Path | None, devices: Sequence[str],
            retries: Retries | None, history: Path | None, record_history: bool, isolate: bool) -> Plan:
    """The Plan of `runner.run_suites`' arguments: the matrix loaded, the devices pinned."""
    m = matrix_mod.load()
    b = shard_mod.pin_devices(m.backend(backend_name), list(devices), native=native)
    return Plan(b, m, native, tuple(suites or m.suites), tuple(extra), health, echo, save_numerics, shard, durations,
                tuple(devices), retries or m.retries_for(b),
                (history or settings().history_db).resolve() if record_history else None, isolate, None,
                run_dir, image_tag, base_image)
