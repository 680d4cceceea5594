"""Flake detection: run chosen tests N times with pytest-flakefinder and classify every test.

Terms:
  run          one execution of one test; pytest-flakefinder makes N copies of every selected test in a
               single pytest process (`--flake-finder --flake-runs=N`), so a flake run is one pytest call.
  status       per test, from its runs (skips are not counted):
                 passing  every run passed
                 failing  every run failed (a broken test, not a flaky one)
                 flaky    some runs passed and some failed; `failure_rate` = failed / (passed + failed)
                 skipped  no run passed or failed
  blocking     a failing or flaky test that the quarantine does not cover: it fails the flake session.

Steps: `pytest_command` -> `run_pytest` -> `read_junit` -> `classify` -> quarantine.apply -> `write_report`.
Output folder: pytest.xml (JUnit), pytest.log, flakes.json (the report, schema 1) and flakes.md (for the
job summary).
The CLI is `python -m harness flakes --backend cpu --runs 20 [paths or node ids...]`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.commands import pytest_argv, suite_env
from harness.exc import FlakeRunError, Interrupted, ResultsError, RunInterrupted
from harness.matrix import resolve_test_paths
from harness.process import Forward, execute
from harness.results import (
    Case,
    append_job_summary,
    atomic_write_text,
    markdown_table,
    output_folder,
    read_cases,
)
from harness.settings import selection_args, settings
from harness.suites import quarantine as quarantine_mod
from harness.suites.place import Launch, NativePlace, Place, chosen

SCHEMA = 1
DEFAULT_RUNS = 20
PASSING, FAILING, FLAKY, SKIPPED = "passing", "failing", "flaky", "skipped"


@dataclass(frozen=True)
class TestStats:
    """Every run of one test folded into a status (see the module docstring)."""

    __test__ = False  # not a pytest test class

    id: str
    status: str
    runs: int
    passed: int
    failed: int
    skipped: int
    failure_rate: float
    first_failure: str = ""


# ---- reading JUnit XML --------------------------------------------------------------------------------


def read_junit(path: Path, root: Path | None = None) -> list[Case]:
    """Every `<testcase>` of a pytest JUnit XML file, in file order (`results.read_cases`); a repetition's
    index is its `kiln_flake_run` property."""
    try:
        return read_cases(path, root)
    except ResultsError as e:
        raise FlakeRunError(f"{e}: pytest did not finish its session") from None


# ---- classification -----------------------------------------------------------------------------------


def classify(runs: Iterable[Case]) -> list[TestStats]:
    """Fold runs into one TestStats per test id, sorted by id."""
    by_id: dict[str, list[Case]] = {}
    for run in runs:
        by_id.setdefault(run.id, []).append(run)
    stats = []
    for test_id in sorted(by_id):
        rs = by_id[test_id]
        failed = [r for r in rs if r.outcome in quarantine_mod.FAILED_OUTCOMES]
        passed = sum(r.outcome in quarantine_mod.PASSED_OUTCOMES for r in rs)
        skipped = len(rs) - len(failed) - passed
        counted = passed + len(failed)
        if not counted:
            status = SKIPPED
        elif not failed:
            status = PASSING
        elif not passed:
            status = FAILING
        else:
            status = FLAKY
        stats.append(
            TestStats(
                test_id,
                status,
                len(rs),
                passed,
                len(failed),
                skipped,
                round(len(failed) / counted, 4) if counted else 0.0,
                failed[0].message.split("\n", 1)[0] if failed else "",
            )
        )
    return stats


def outcomes(runs: Iterable[Case]) -> dict[str, list[str]]:
    """test id -> per-run outcomes, the input `quarantine.apply` takes."""
    result: dict[str, list[str]] = {}
    for run in runs:
        result.setdefault(run.id, []).append(run.outcome)
    return result


# ---- running pytest -----------------------------------------------------------------------------------


def flake_args(runs: int) -> list[str]:
    """pytest arguments that repeat every selected test `runs` times (pytest-flakefinder)."""
    return ["--flake-finder", f"--flake-runs={runs}", "-q", "-rN", "--tb=line"]


def pytest_command(
    paths: Sequence[str], runs: int, junit: Path, extra: Sequence[str] = (), timeout_s: int | None = None
) -> list[str]:
    """The inner command (`commands.pytest_argv`: one process, exact node ids in the JUnit) that runs `paths`
    `runs` times."""
    return pytest_argv(paths, junit=str(junit), test_timeout_s=timeout_s, extra=[*flake_args(runs), *extra])


def run_pytest(how: Launch, log: Path, timeout_s: float | None = None) -> tuple[int, bool]:
    """Run pytest as the place launches it (`how`), its output tee'd live to `log` and stdout; returns (exit code,
    interrupted). Ctrl-C or SIGTERM is forwarded to pytest as SIGINT, so it stops and still writes its JUnit XML;
    a run past `timeout_s` counts as interrupted."""
    try:
        code, timed_out = execute(
            list(how.argv),
            log=log,
            timeout_s=timeout_s,
            env=how.env,
            cwd=how.cwd,
            container=how.container,
            on_interrupt=Forward(grace_s=60),
        )
    except Interrupted as e:
        return e.returncode if e.returncode is not None else 2, True
    return (
        code,
        timed_out or code == 2,
    )  # pytest exits 2 when interrupted from inside (KeyboardInterrupt in a test)


# ---- report -------------------------------------------------------------------------------------------


def build_report(
    stats: list[TestStats],
    verdict: quarantine_mod.Verdict,
    *,
    backend: str,
    runs: int,
    paths: Sequence[str],
    command: Sequence[str],
    pytest_exit: int,
    complete: bool,
    history: dict | None = None,
) -> dict:
    """The report (schema 1). `history`: node id -> harness.suites.history.FailureCount from the test-history store;
    each failing or flaky test it names gets `history`: "failed K of the last N runs" (else "")."""
    counts = {s: sum(t.status == s for t in stats) for s in (PASSING, FAILING, FLAKY, SKIPPED)}
    quarantined = {r.id: r.entry.reason for r in verdict.quarantined_failing + verdict.ready_to_leave}
    tests = []
    for t in stats:
        row = asdict(t)
        row["quarantined"] = t.id in quarantined
        row["reason"] = quarantined.get(t.id, "")
        row["rerun"] = rerun_command(backend, runs, t.id) if t.status in (FAILING, FLAKY) else ""
        past = (history or {}).get(t.id) if t.status in (FAILING, FLAKY) else None
        row["history"] = past.phrase() if past is not None else ""
        tests.append(row)
    return {
        "schema": SCHEMA,
        "kind": "flakes",
        "backend": backend,
        "runs": runs,
        "paths": list(paths),
        "command": list(command),
        "pytest_exit": pytest_exit,
        "complete": complete,
        "ok": complete and verdict.ok,
        "counts": counts,
        "blocking": list(verdict.failing),
        "tests": tests,
        "quarantine": verdict.to_dict(),
    }


def rerun_command(backend: str, runs: int, test_id: str) -> str:
    """The command that runs one test `runs` times again on `backend` (natively), from the source root."""
    return shlex.join(
        ["python", "-m", "harness", "flakes", "--backend", backend, "--native", "--runs", str(runs), test_id]
    )


def summary_line(report: dict) -> str:
    c = report["counts"]
    flaky = [t for t in report["tests"] if t["status"] == FLAKY]
    rates = ", ".join(f"{t['id'].rsplit('::', 1)[-1]} {t['failure_rate']:.0%}" for t in flaky[:3])
    tail = "" if report["complete"] else " (INCOMPLETE: interrupted)"
    return (
        f"flakes {report['backend']}: {len(report['tests'])} tests x {report['runs']} runs: "
        f"{c[PASSING]} passing, {c[FAILING]} failing, {c[FLAKY]} flaky"
        + (f" ({rates})" if rates else "")
        + f", {len(report['blocking'])} blocking{tail}"
    )


def render_markdown(report: dict, verdict: quarantine_mod.Verdict) -> str:
    lines = [f"## Flake detection: {report['backend']}", "", summary_line(report), ""]
    bad = [t for t in report["tests"] if t["status"] in (FAILING, FLAKY)]
    if bad:
        lines += markdown_table(
            ["test", "status", "failed / runs", "failure rate", "quarantined"],
            [
                [
                    f"`{t['id']}`",
                    t["status"],
                    f"{t['failed']} / {t['passed'] + t['failed']}",
                    f"{t['failure_rate']:.0%}",
                    f"yes: {t['reason']}" if t["quarantined"] else "no",
                ]
                for t in bad
            ],
        )
        past = [t for t in bad if t.get("history")]
        if past:
            lines += ["", "History:", ""] + [f"- `{t['id']}`: {t['history']}" for t in past]
        lines += ["", "Rerun one:", "", "```"] + [t["rerun"] for t in bad] + ["```", ""]
    section = verdict.markdown()
    return "\n".join(lines) + ("\n" + section if section else "")


def write_report(out_dir: Path, report: dict, markdown: str) -> None:
    """Write flakes.json and flakes.md atomically (a reader never sees half a report)."""
    atomic_write_text(out_dir / "flakes.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out_dir / "flakes.md", markdown)


# ---- the whole step -----------------------------------------------------------------------------------


def detect(
    paths: Sequence[str],
    *,
    backend: str,
    runs: int,
    out_dir: Path,
    quarantine: quarantine_mod.Quarantine,
    extra: Sequence[str] = (),
    root: Path | None = None,
    place: Place | None = None,
) -> dict:
    """Run `paths` `runs` times on `backend`, classify, apply the quarantine, write the report into `out_dir`.

    `place` (harness.suites.place; None: natively, with this machine's Python) runs the one pytest process:
    its pre-flight first, then made ready (a container place builds or describes its image); `root` is the
    source root the node ids are relative to.
    """
    if runs < 2:
        raise FlakeRunError(f"--runs must be at least 2 to tell flaky from failing, got {runs}")
    root = root or settings().root
    from harness import matrix

    m = matrix.load()
    b = m.backend(backend)
    place = place or NativePlace()
    print(place.preflight(b, results=out_dir).line(), flush=True)
    place = place.prepared(b)
    out_dir = out_dir.resolve()  # docker needs absolute paths for bind mounts
    out_dir.mkdir(parents=True, exist_ok=True)
    junit = out_dir / "pytest.xml"
    junit.unlink(missing_ok=True)  # never read a previous run's results as this run's
    inner = pytest_command(
        paths, runs, Path(place.seen(out_dir)) / junit.name, extra, place.test_timeout_s(b)
    )
    how = place.launch(b, inner, out_dir=out_dir, name="flakes", env=suite_env(m, b))
    code, interrupted = run_pytest(how, out_dir / "pytest.log", b.timeouts.suite_s * runs)
    cmd = how.argv
    if code in (3, 4):
        raise FlakeRunError(f"pytest exited {code} (internal or usage error); see {out_dir / 'pytest.log'}")
    if code == 5:
        raise FlakeRunError(f"no tests collected from {' '.join(paths)}")
    if interrupted and not junit.exists():
        raise RunInterrupted(f"interrupted before pytest wrote results; log kept in {out_dir / 'pytest.log'}")
    all_runs = read_junit(junit, root)
    stats = classify(all_runs)
    verdict = quarantine_mod.apply(outcomes(all_runs), quarantine, backend)
    from harness.suites.history import failure_counts_if_any  # read-only; {} without a store

    history = failure_counts_if_any([t.id for t in stats if t.status in (FAILING, FLAKY)], backend=backend)
    report = build_report(
        stats,
        verdict,
        backend=backend,
        runs=runs,
        paths=paths,
        command=cmd,
        pytest_exit=code,
        complete=not interrupted,
        history=history,
    )
    write_report(out_dir, report, render_markdown(report, verdict))
    if interrupted:
        raise RunInterrupted(f"interrupted; partial results (marked incomplete) kept in {out_dir}")
    return report


# ---- CLI ----------------------------------------------------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", help="backend from ci/matrix.json (default: cpu)")
    from harness.store.cli import add_store_flags

    add_store_flags(p)  # the failure counts' history
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"runs per test (default {DEFAULT_RUNS})")
    p.add_argument("--quarantine", help="quarantine file (default: ci/quarantine.toml)")
    p.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the Markdown report to $GITHUB_STEP_SUMMARY when it is set",
    )
    p.add_argument("--out", help="output folder (default: <results>/flakes-<backend>-<time>)")
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="run with this machine's Python instead of the backend's container (also KILN_NATIVE=1)",
    )
    p.add_argument(
        "--image", help="container mode: use this local image instead of building the hash-tagged one"
    )
    p.add_argument(
        "--pytest-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for pytest (repeatable), e.g. --pytest-arg=-k --pytest-arg=softmax",
    )
    p.add_argument(
        "-k",
        dest="keyword",
        metavar="EXPR",
        help="only the tests whose names match EXPR (pytest's -k), e.g. -k mm",
    )
    p.add_argument("paths", nargs="*", help="test paths or node ids (default: the matrix's suites)")


def cli_main(args: argparse.Namespace) -> int:
    """Run the flake detector; exit 0 when nothing outside the quarantine is failing or flaky, else 1."""
    s = settings()
    output_folder(
        args.out or s.results_root, "--out" if args.out else "KILN_RESULTS"
    )  # a file: one line, now
    default = quarantine_mod.default_path(s.root)
    if args.quarantine or default.exists():  # a named file must exist; the project's may be absent
        q = quarantine_mod.load(args.quarantine or default)
    else:
        q = quarantine_mod.Quarantine()
    paths, missing = resolve_test_paths(s.root, args.paths)
    if missing and args.paths:
        raise FlakeRunError(f"no such test path: {missing[0]}")
    for p in missing:
        print(f"flakes: suite folder {p} does not exist: skipped")
    if not paths:
        raise FlakeRunError("none of the matrix's suite folders exist under tests/; name test paths")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.out) if args.out else s.results_root / f"flakes-{args.backend}-{stamp}"
    report = detect(
        paths,
        backend=args.backend,
        runs=args.runs,
        out_dir=out,
        quarantine=q,
        extra=[*args.pytest_arg, *(["-k", args.keyword] if args.keyword else []), *selection_args("flakes")],
        root=s.root,
        place=chosen(args.native, args.image),
    )
    print(summary_line(report))
    for r in report["quarantine"]["ready_to_leave"]:
        print(f"ready to leave quarantine: {r['id']} passed {r['runs']}/{r['runs']} runs")
    print(f"report: {out / 'flakes.md'}")
    if args.github_summary:
        append_job_summary((out / "flakes.md").read_text(encoding="utf-8"), force=True)
    return 0 if report["ok"] else 1
