"""Running the suites: one pytest process per suite, in the backend's container or natively.

Terms:
  inner command  the `python -m pytest ...` argv that runs inside the container (or, with this
                 machine's Python, natively). Built by `pytest_argv`; identical in both modes.
  place          where the processes run (harness.suites.place, chosen once per run): natively with this
                 machine's Python from the source tree, or in the backend's container (`docker run --rm --init
                 --network none`, the source tree read-only at /src, the output folder at /results, only the
                 runner's visible GPUs, as the runner's uid:gid, with the per-runner compile cache at /cache).
                 The harness kills the process (and its container) when the suite timeout passes (on top of
                 pytest-timeout's per-test limit) and removes the container whatever happens.
  run folder     results/<run id>/ (see harness.results); run.json records status
                 running -> complete, or incomplete when interrupted (what was written is kept).
  shards         `--shard I/N` runs shard I of N of every suite's tests (harness.suites.shard, by a pytest plugin in
                 each suite's process); `--shards N|auto` runs N shards at once, each pinned to its GPUs,
                 into shard-I/ folders merged into one report (harness.suites.sharded, harness.suites.merge).
  retries        a failed suite test is run again alone in a fresh process (harness.suites.retries; the matrix's
                 `retries`, `--retries N`): passed on a retry = flaky (reported, does not fail the run),
                 failed every time = failing. Their attempts go into the suite's entry of run.json.
  history        a complete run is recorded into the test history (harness.suites.history; `--history DB`, else
                 KILN_HISTORY_DB, else history/history.sqlite in the lasting data folder outside the checkout,
                 harness.settings.data_dir; `--no-history` skips it), so the report can
                 say "failed K of the last N runs" and flake rates build up.

Command lines come from the place (harness.suites.place, with `harness.commands`); functions other modules call: `execute`, `run_pytest`,
`run_python_module`, `run_suite_isolated`, `retry_failed` (harness.suites.steps runs the suites: `harness run`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness import results as res
from harness.commands import pytest_argv
from harness.matrix import Backend, Retries
from harness.process import execute
from harness.record import ProcessRecord, RetryRecord, SuiteRecord, SuiteRetries, SuiteStatus, TestOutcome
from harness.settings import settings
from harness.suites import isolation
from harness.suites import retries as retries_mod
from harness.suites.place import Place

EXIT_NO_TESTS = 5  # pytest: no tests collected


# ---- one pytest process ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PytestRun:
    """What one pytest invocation left behind: JUnit and log paths on the host, exit status."""

    name: str
    junit: Path
    log: Path
    returncode: int
    timed_out: bool
    duration_s: float
    argv: list[str]
    left: list[Any] = field(default_factory=list)  # processes it left running, ended (harness.leftovers.Proc)


def run_pytest(
    place: Place,
    backend: Backend,
    targets: Sequence[str],
    out_dir: Path,
    name: str,
    *,
    env: dict[str, str],
    extra: Sequence[str] = (),
    timeout_s: float | None = None,
    echo: bool = True,
    env_extra: dict[str, str] | None = None,
    watchdog: Callable[[], str | None] | None = None,
) -> PytestRun:
    """Run pytest once on `targets` (paths or node ids relative to the source root) at `place`.

    JUnit lands in `out_dir/<name>.xml`, the output in `out_dir/<name>.log`. This is the step the
    suites, the flake session and others call; `env` is the suites' environment (the run's, computed once:
    harness.commands.suite_env); `extra` are more pytest arguments; `env_extra` more environment variables,
    where {out} stands for `out_dir` as pytest sees it; `watchdog` (process.execute) may stop the process early.
    """
    out_dir = out_dir.resolve()  # docker needs absolute paths for bind mounts
    out_dir.mkdir(parents=True, exist_ok=True)
    seen_out = place.seen(out_dir)
    env = {**env, **{k: v.replace("{out}", seen_out) for k, v in (env_extra or {}).items()}}
    junit, log = out_dir / f"{name}.xml", out_dir / f"{name}.log"
    junit.unlink(missing_ok=True)
    start = time.monotonic()
    inner = pytest_argv(
        targets, junit=f"{seen_out}/{junit.name}", test_timeout_s=place.test_timeout_s(backend), extra=extra
    )
    how = place.launch(backend, inner, out_dir=out_dir, name=name, env=env)
    left: list[Any] = []
    rc, timed_out = execute(
        how.argv,
        log=log,
        timeout_s=timeout_s or backend.timeouts.suite_s,
        env=how.env,
        cwd=how.cwd,
        container=how.container,
        echo=echo,
        watchdog=watchdog,
        left=left,
    )
    return PytestRun(name, junit, log, rc, timed_out, round(time.monotonic() - start, 2), how.argv, left)


def run_python_module(
    place: Place,
    backend: Backend,
    module_args: Sequence[str],
    out_dir: Path,
    name: str,
    *,
    env: dict[str, str],
    timeout_s: float,
    echo: bool = True,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run `python -m harness <module_args>` at `place` with the suites' environment `env`; return its exit
    code. Paths in `module_args` may use {out} for the output folder as seen by that process; `extra_env` is
    added to `env` (what the host knows and a container cannot: the runner's name)."""
    out_dir = out_dir.resolve()  # docker needs absolute paths for bind mounts
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [a.replace("{out}", place.seen(out_dir)) for a in module_args]
    how = place.launch(
        backend,
        ["python", "-m", "harness", *args],
        out_dir=out_dir,
        name=name,
        env={**env, **(extra_env or {})},
    )
    rc, _ = execute(
        how.argv,
        log=out_dir / f"{name}.log",
        timeout_s=timeout_s,
        env=how.env,
        cwd=how.cwd,
        container=how.container,
        echo=echo,
    )
    return rc


# ---- the suites ------------------------------------------------------------------------------------------


def suite_status(run: PytestRun, tests: list[TestOutcome]) -> str:
    """passed / failed / empty / timeout / error for one suite run."""
    if run.timed_out:
        return "timeout"
    if run.returncode == EXIT_NO_TESTS and not tests:
        return "empty"
    if any(t.failing for t in tests) or run.returncode == 1:
        return "failed"
    if run.returncode != 0:
        return "error"
    return "passed"


def new_run_dir(backend: str, mode: str, results_root: Path | None = None) -> Path:
    """results/<UTC time>-<backend>-<mode>[-n]: a fresh folder."""
    root = results_root or settings().results_root
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = root / f"{stamp}-{backend}-{mode}"
    root.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:  # mkdir is the claim: two runs started in one second (parallel test workers) get two folders
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = Path(f"{base}-{n}")


def _error_line(log: Path) -> str:
    """The most telling line of a log: the last one that mentions an error, else the last line."""
    lines = (
        [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if log.exists()
        else []
    )
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1]


def run_suite_isolated(
    place: Place,
    b: Backend,
    suite: str,
    suite_dir: Path,
    *,
    env: dict[str, str],
    extra: Sequence[str],
    echo: bool,
    env_extra: dict[str, str] | None,
    on_interrupt: Callable[[SuiteRecord, list[TestOutcome], str | None], None],
) -> tuple[SuiteRecord, list[TestOutcome], Path]:
    """One suite under crash isolation (harness.suites.isolation): (its record, tests, the suite's JUnit).
    On Ctrl-C/SIGTERM the record of what finished goes to `on_interrupt(record, tests, running test)` first."""
    junit = suite_dir / f"{suite}.xml"

    def attempt(k: int, name: str, more: list[str], timeout_s: float, watchdog: Callable[[], str | None]):
        return run_pytest(
            place,
            b,
            [f"tests/{suite}"],
            suite_dir,
            name,
            env=env,
            extra=[*extra, *more],
            timeout_s=timeout_s,
            echo=echo,
            env_extra=env_extra,
            watchdog=watchdog,
        )

    def record_of(sr: isolation.SuiteRun, status: str) -> SuiteRecord:
        isolation.write_junit(junit, suite, sr.finished)
        return SuiteRecord(
            suite,
            SuiteStatus(status),
            f"suites/{junit.name}",
            f"suites/{suite}.log",
            sr.attempts[-1].returncode if sr.attempts else None,
            sr.timed_out,
            round(sum(a.duration_s for a in sr.attempts), 2),
            res.counts(sr.tests()),
            tuple(sr.attempts[0].argv) if sr.attempts else (),
            attempts=tuple(
                ProcessRecord(f"suites/{a.log.name}", a.returncode, a.duration_s) for a in sr.attempts
            ),
            crashes=tuple(sr.crashes),
            not_run=tuple(sr.not_run),
            collect_failed=sr.collect_failed,
            ended_badly=sr.ended_badly,
        )

    seen = place.seen(suite_dir.resolve())  # the suite's folder as pytest sees it
    sr = isolation.run_suite(
        attempt,
        suite,
        suite_dir,
        seen,
        suite_s=b.timeouts.suite_s,
        test_s=b.timeouts.test_s,
        on_interrupt=lambda part: on_interrupt(record_of(part, "interrupted"), part.tests(), part.running),
    )
    return record_of(sr, sr.status()), sr.tests(), junit


def run_suite_plain(
    place: Place,
    b: Backend,
    suite: str,
    suite_dir: Path,
    *,
    env: dict[str, str],
    extra: Sequence[str],
    echo: bool,
    env_extra: dict[str, str] | None,
) -> tuple[SuiteRecord, list[TestOutcome], Path]:
    """One suite as one pytest process, no isolation (`--no-isolation`: what isolation costs is measured
    against this); a crash loses the suite's JUnit."""
    run = run_pytest(
        place, b, [f"tests/{suite}"], suite_dir, suite, env=env, extra=extra, echo=echo, env_extra=env_extra
    )
    tests = res.parse_junit(run.junit, settings().root) if run.junit.exists() else []
    status = suite_status(run, tests)
    if not run.junit.exists() and status == "passed":
        status = "error"
    return (
        SuiteRecord(
            suite,
            SuiteStatus(status),
            f"suites/{run.junit.name}",
            f"suites/{run.log.name}",
            run.returncode,
            run.timed_out,
            run.duration_s,
            res.counts(tests),
            tuple(run.argv),
        ),
        tests,
        run.junit,
    )


def retry_failed(
    place: Place,
    b: Backend,
    suite: str,
    failed: Sequence[TestOutcome],
    policy: Retries,
    *,
    run_dir: Path,
    junit: Path,
    env: dict[str, str],
    extra: Sequence[str] = (),
    echo: bool = False,
    quarantined: Callable[[str], bool] = lambda _: False,
) -> SuiteRetries:
    """Rerun each failed test of one suite alone (its node id, a fresh `run_pytest`), up to `policy.attempts`
    times until it passes; returns the suite record's `retries` (harness.suites.retries).

    Tests outside the quarantine go first; past `policy.max_tests` the rest stay failing without a rerun.
    `extra` are the run's own pytest arguments (never the shard options: one node id is one test).
    """
    out_dir = junit.parent / retries_mod.RETRY_DIR
    ordered = retries_mod.order(failed, quarantined)
    chosen = ordered[: policy.max_tests] if policy.attempts > 0 else []
    first = {t.id: t for t in reversed(failed)}  # the first record of each id
    extra = [a for a in extra if not a.startswith("--junitxml")]
    root = settings().root
    seen = place.seen(out_dir.resolve())  # the reruns' folder as pytest sees it
    retried = []
    for k, test_id in enumerate(chosen, 1):
        tries = [retries_mod.write_first_attempt(out_dir, run_dir, suite, k, junit, first[test_id], root)]
        for n in range(1, policy.attempts + 1):
            name = (
                f"{suite}-{k}.{n}"  # a rerun that hangs is stopped by the same watchdog as the suite's tests
            )
            journal = ["-p", "harness.suites.journal_plugin", f"--kiln-journal={seen}/{name}.journal"]
            watchdog = isolation.make_watchdog(out_dir / f"{name}.journal", b.timeouts.test_s, [])
            run = run_pytest(
                place,
                b,
                [test_id],
                out_dir,
                name,
                env=env,
                extra=[*extra, *journal],
                timeout_s=retries_mod.retry_timeout_s(b),
                echo=echo,
                watchdog=watchdog,
            )
            tries.append(retries_mod.rerun_attempt(n, test_id, run, run_dir, root))
            if tries[-1].outcome not in res.FAILING:
                break
        r = RetryRecord(test_id, suite, retries_mod.classify([a.outcome for a in tries]), tuple(tries))
        retried.append(r)
        print(f"  retried {test_id} alone: {r.status.upper()}: {r.describe()}", flush=True)
    return retries_mod.suite_retries(policy.attempts, policy.max_tests, retried, ordered[len(chosen) :])


def retry_line(suite: str, label: str, found: SuiteRetries) -> str:
    """`suite alpha [cpu/native] retried 2 failed tests alone: 1 flaky, 1 failing (1 more not retried)`."""
    statuses = [str(t.status) for t in found.tests]
    body = (
        ", ".join(
            f"{statuses.count(s)} {s}" for s in (retries_mod.FLAKY, retries_mod.FAILING) if statuses.count(s)
        )
        or "none"
    )
    more = (
        f" ({len(found.not_retried)} more not retried: past max_tests {found.max_tests})"
        if found.not_retried
        else ""
    )
    return (
        f"suite {suite} [{label}] retried {len(statuses)} failed test(s) alone, up to {found.attempts} "
        f"time(s) each: {body}{more}"
    )


# ---- CLI: `python -m harness detect` (`run` is harness.suites.steps') -------------------------------------------


def detect_mode() -> str:
    """`container` when a docker daemon answers, else `native`."""
    from harness.exc import DockerError
    from harness.images import image

    try:
        image.require_docker()
    except DockerError:
        return "native"
    return "container"


def cli_detect_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--field", help="print this matrix field of the detected backend instead of its name")
    p.add_argument(
        "--mode",
        action="store_true",
        help="print `container` when a docker daemon answers, else `native`, instead",
    )


def cli_detect_main(args: argparse.Namespace) -> int:
    """Print the backend this machine supports: the first GPU backend whose devices exist, else cpu."""
    if args.mode:
        print(detect_mode())
        return 0
    m = matrix_mod.load()
    name = matrix_mod.detect_backend(m)
    print(name if not args.field else getattr(m.backend(name), args.field))
    return 0
