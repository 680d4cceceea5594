"""Retries that classify: a suite test that failed is run again alone, in a fresh pytest process, to tell a
flaky test from a broken one.

Terms:
  attempt   one run of one test. Attempt 0 is the suite's own run; attempts 1..N are reruns of that test
            alone (its exact node id, `harness.commands.pytest_argv` through `runner.run_pytest`: the same
            container or Python, environment and per-test timeout), stopping at the first pass. N and how
            many tests of a suite are retried come from the matrix (`retries`, harness.matrix.Retries).
  status    of a retried test, from its attempts (`classify`):
              flaky    failed in one attempt and passed in another (any order): reported, recorded, does not
                       fail the run
              failing  failed, and passed in no attempt: fails the run (unless quarantined)
            A failing test left without a rerun (past `max_tests`, or retries off) is failing. These are the
            statuses of harness.suites.flakes for the same attempts (there, N repetitions in one process).
  log       each attempt's: attempt 0's is the failure JUnit recorded for the test (the suite's log holds
            every test), written to `suites/retries/<suite>-<k>.0.txt`; a rerun's is its process's log,
            `suites/retries/<suite>-<k>.<n>.log` next to its JUnit `.xml`.

False failures: a flaky test that fails each run independently with probability p, and failed the suite run,
is called failing only when all N reruns fail too: P = p ** N (per suite run, its first failure included,
p ** (N + 1)); `called_failing_rate`. With N = 2 a 30% flake is called failing 9% of the times it fails
(measured: 199 of 2000 trials, 9.95%); with N = 4 (ci/matrix.json's default) 0.81% (measured: 13 of 1440,
0.90%), under the 1% a red build may cost. tests/harness/planted/retry_rate.py measures it through the real
rerun path (`runner.retry_failed`, a pytest process per rerun); tests/harness/test_retry_rate.py checks a few
trials against the draws that decide them. Why 4 rather than a rule that gives tests with a flaky history more
reruns: a new flake has no history, and CI runners need not share one store; the price of 4 is two more
single-test processes (each bounded by `retry_timeout_s`) per genuinely broken test, at most `max_tests` per
suite, and nothing for a test that passes (reruns stop at the first pass: 1.4 reruns on average for a 30% flake).

The runner (harness.suites.runner.retry_failed) runs the reruns through its `run_pytest` and puts what they found
into the suite's entry of run.json (`retries`: `suite_retries`); `load` reads it back from a run folder, a
shard's folder or a merged run (from each shard's entry, log paths made relative to the merged folder), so
reports, history and merges see the same classification. This module runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import results as res
from harness.record import (
    PASSED,
    AttemptRecord,
    RetryRecord,
    RetryStatus,
    SuiteRecord,
    SuiteRetries,
    TestOutcome,
)

FLAKY, FAILING = RetryStatus.FLAKY.value, RetryStatus.FAILING.value  # as harness.suites.flakes names them
RETRY_SLACK_S = 120  # a rerun's limit: the per-test timeout plus this (start-up, imports, collection)
RETRY_DIR = "retries"  # under the suites folder
MAX_TEXT = 20_000  # characters of attempt 0's failure text kept


def classify(outcomes: Sequence[str]) -> str:
    """flaky when an attempt failed and another passed (whichever came first), else failing (skips count as
    neither)."""
    failed = any(o in res.FAILING for o in outcomes)
    return FLAKY if failed and any(o in PASSED for o in outcomes) else FAILING


def called_failing_rate(p: float, attempts: int) -> float:
    """The probability that a flaky test failing each run independently with probability `p` is called failing,
    given that it failed the suite run and is retried up to `attempts` times: p ** attempts (module docstring)."""
    if not 0.0 <= p <= 1.0 or attempts < 0:
        raise ValueError(f"p={p} must be in [0, 1] and attempts={attempts} >= 0")
    return p**attempts


# ---- reading JUnit -----------------------------------------------------------------------------------------


def _cases(junit: Path, root: Path | None) -> list[res.Case]:
    """The JUnit file's cases; none when it is missing or cut off (a rerun killed before pytest wrote it)."""
    try:
        return res.read_cases(junit, root)
    except res.ResultsError:
        return []


def failure_text(junit: Path, test_id: str, root: Path | None = None) -> str:
    """What JUnit recorded of `test_id`'s failure: the failure/error text (pytest's --tb) and captured output."""
    return next((c.text[:MAX_TEXT] for c in _cases(junit, root) if c.id == test_id), "")


def attempt_result(junit: Path, test_id: str, root: Path | None) -> tuple[str, str, float] | None:
    """(outcome, message, seconds) of `test_id` in a rerun's JUnit (the only case, if ids differ), or None."""
    cases = _cases(junit, root)
    match = [c for c in cases if c.id == test_id] or (cases if len(cases) == 1 else [])
    worst = None
    for case in match:  # a teardown error comes as a second case of the same test
        if worst is None or (case.outcome in res.FAILING and worst[0] not in res.FAILING):
            worst = (case.outcome, case.message, case.duration_s)
    return worst


# ---- running the reruns ------------------------------------------------------------------------------------


def retry_timeout_s(b: Any) -> float:
    """How long one rerun may take: the per-test timeout plus start-up slack, at most the suite timeout."""
    return float(min(b.timeouts.suite_s, b.timeouts.test_s + RETRY_SLACK_S))


def write_first_attempt(
    out_dir: Path, run_dir: Path, suite: str, k: int, junit: Path, test: TestOutcome, root: Path | None = None
) -> AttemptRecord:
    """Attempt 0 of the k-th retried test of `suite`: its failure text from the suite's JUnit, saved as its log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{suite}-{k}.0.txt"
    whole = junit.with_suffix(".log")
    where = whole.relative_to(run_dir) if whole.is_relative_to(run_dir) else whole
    res.atomic_write_text(
        path,
        f"{test.id}: attempt 0 (the suite run; its whole log: {where})\n"
        f"{failure_text(junit, test.id, root)}\n",
    )
    return AttemptRecord(
        0, test.outcome, test.headline[:300], str(path.relative_to(run_dir)), test.duration_s
    )


def rerun_attempt(n: int, test_id: str, run: Any, run_dir: Path, root: Path | None = None) -> AttemptRecord:
    """Attempt `n` from a rerun's `runner.PytestRun` (its JUnit, log, exit status)."""
    found = attempt_result(run.junit, test_id, root) if run.junit.exists() else None
    if found is None:
        why = "timed out" if run.timed_out else f"exit {run.returncode}"
        found = ("error", f"the rerun left no result for the test ({why}); see its log", run.duration_s)
    outcome, message, seconds = found
    return AttemptRecord(
        n,
        outcome,
        (message.splitlines() or [""])[0][:300],
        str(run.log.relative_to(run_dir)),
        seconds,
        run.returncode,
        str(run.junit.relative_to(run_dir)) if run.junit.exists() else "",
    )


def order(failed: Sequence[TestOutcome], quarantined: Any) -> list[str]:
    """The failed tests' ids in the order they are retried: outside the quarantine first, then file order."""
    return sorted(dict.fromkeys(t.id for t in failed), key=lambda i: bool(quarantined(i)))


def suite_retries(
    attempts: int, max_tests: int, retried: Sequence[RetryRecord], not_retried: Sequence[str]
) -> SuiteRetries:
    """A suite record's `retries`."""
    return SuiteRetries(attempts, max_tests, tuple(retried), tuple(not_retried))


# ---- reading them back -------------------------------------------------------------------------------------


def _suites(run: Any) -> list[tuple[str, SuiteRecord]]:
    """(path prefix, suite record) of every suite of a run (harness.suites.collect.RunResults); a merged run's come
    from its shards."""
    out = []
    for suite in run.suites:
        shards = suite.record.shards
        if shards is None:
            out.append(("", suite.record))
            continue
        for index, record in shards.items():
            sub = run.shard_runs.get(index)
            prefix = str(sub.path.relative_to(run.path)) if sub is not None else f"shard-{index}"
            out.append((prefix, record))
    return out


def load(run: Any) -> dict[str, RetryRecord]:
    """test id -> RetryRecord for every test the run retried (harness.suites.collect.RunResults, merged or not)."""
    found: dict[str, RetryRecord] = {}
    for prefix, record in _suites(run):
        for r in record.retries.tests if record.retries else ():
            found.setdefault(r.id, r.placed(prefix) if prefix else r)
    return found


def not_retried(run: Any) -> list[str]:
    """Failed tests a suite left without a rerun (past `max_tests`)."""
    return [i for _, record in _suites(run) for i in (record.retries.not_retried if record.retries else ())]


def outcomes(run: Any) -> dict[str, list[str]]:
    """test id -> every attempt's outcome (the suite run's, then the reruns'), the input of quarantine.apply."""
    retried = load(run)
    out: dict[str, list[str]] = {}
    for suite in run.suites:
        for t in suite.tests:
            out.setdefault(t.id, []).append(t.outcome)
    for test_id, r in retried.items():
        out.setdefault(test_id, [])
        out[test_id] += [a.outcome for a in r.attempts[1:]]
    return out
