"""Retries that classify (harness/suites/retries.py): a failed suite test is run again alone in a fresh pytest process;
passed on a retry = flaky (reported with the failing attempt's log, recorded in the test history, not failing the
run), failed every attempt = failing. End to end on planted projects with real pytest processes (a test whose
failure depends on a counter file next to it), plain and sharded; the matrix key; the history's flaky counts."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import MatrixError
from harness.record import AttemptRecord, RetryRecord
from harness.results import Case
from harness.suites import flakes, history, quarantine, retries
from harness.suites.collect import load_run
from scratch_project import scratch_project

ROOT = Path(__file__).resolve().parents[2]

# test_flaky fails the first time it runs in a project (its counter file is 0), then passes
PLANTED = """
from pathlib import Path

COUNTER = Path(__file__).with_name("counter-" + Path(__file__).stem)


def test_ok():
    pass


def test_flaky():
    n = int(COUNTER.read_text()) if COUNTER.exists() else 0
    COUNTER.write_text(str(n + 1))
    assert n >= 1, f"planted flake: attempt {n}"


def test_broken():
    assert 1 + 1 == 3, "planted failure"


def test_quarantined_fine():
    pass
"""
BETA = PLANTED.split("def test_broken")[0].replace(
    "test_flaky", "test_flaky_beta"
)  # test_ok and a flaky test
FLAKY = "tests/alpha/test_alpha.py::test_flaky"
BROKEN = "tests/alpha/test_alpha.py::test_broken"
FINE = "tests/alpha/test_alpha.py::test_quarantined_fine"


def make_project(
    tmp_path: Path, *, broken: bool = True, retries_key: dict | None = None, quarantined: tuple[str, ...] = ()
) -> Path:
    """Suites alpha (the planted file, without test_broken unless `broken`) and beta (test_ok, a flaky test)."""
    text = PLANTED if broken else PLANTED.replace("def test_broken", "def _not_a_test")
    edit = (lambda d: d.__setitem__("retries", retries_key)) if retries_key is not None else None
    return scratch_project(
        tmp_path / "proj", {"alpha": text, "beta": BETA}, matrix=edit, quarantined=quarantined
    )


def harness(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "KILN_ROOT": str(root),
        "PYTHONPATH": str(ROOT),
        "KILN_RESULTS": str(root / "results"),
    }
    for key in ("KILN_NATIVE", "KILN_HISTORY_DB"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / "results").iterdir() if p.is_dir())


def test_flaky_and_failing_in_the_report_and_the_history(tmp_path):
    root = make_project(tmp_path, retries_key={"attempts": 2, "max_tests": 10})  # 2 reruns keep it short
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "alpha")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # test_broken fails every attempt
    assert f"retried {FLAKY} alone: FLAKY: failed, passed (passed on retry 1)" in out
    assert f"retried {BROKEN} alone: FAILING: failed 3 of 3 attempts (failed, failed, failed)" in out
    assert (
        "suite alpha [cpu/native] retried 2 failed test(s) alone, up to 2 time(s) each: 1 flaky, 1 failing"
        in out
    )
    assert out.splitlines()[-1] == "kiln cpu/native FAILED: 2 passed, 1 failed, 1 flaky"
    run_dir = run_dirs(root)[0]

    # three real pytest processes besides the suite's: one rerun of the flaky test, two of the broken one
    manifest = json.loads((run_dir / "run.json").read_text())
    found = manifest["suites"][0]["retries"]
    assert (found["attempts"], found["max_tests"], found["not_retried"]) == (2, 10, [])
    assert [(t["id"], t["status"], [a["outcome"] for a in t["attempts"]]) for t in found["tests"]] == [
        (FLAKY, "flaky", ["failed", "passed"]),
        (BROKEN, "failing", ["failed", "failed", "failed"]),
    ]
    assert (root / "tests" / "alpha" / "counter-test_alpha").read_text() == "2"
    rerun_log = run_dir / found["tests"][1]["attempts"][2]["log"]
    assert "planted failure" in rerun_log.read_text() and "1 failed" in rerun_log.read_text()

    report = (run_dir / "report.txt").read_text()
    assert (
        f"flaky: 1 test(s) failed, then passed when run again alone; they do not fail the run: {FLAKY}"
        in report
    )
    failing, flaky = report.split("failing tests (1):")[1].split("flaky tests (1):")
    assert BROKEN in failing and FLAKY not in failing and FLAKY in flaky and BROKEN not in flaky
    assert (
        "attempts: failed 3 of 3 attempts (failed, failed, failed); log: suites/retries/alpha-2.0.txt"
        in failing
    )
    assert (
        "attempts: failed, passed (passed on retry 1); failing attempt's log: suites/retries/alpha-1.0.txt"
        in flaky
    )
    assert (
        "planted flake: attempt 0" in (run_dir / "suites/retries/alpha-1.0.txt").read_text()
    )  # the failing log
    for text, test in ((failing, BROKEN), (flaky, FLAKY)):  # each with its repro line, for that test alone
        assert any(
            ln.strip().startswith(f"cd {root} && env ") and ln.endswith(test) for ln in text.splitlines()
        )
    assert "history: failed 1 of the last 1 runs (flaky in 1: passed when run again alone)" in flaky
    assert "history: failed 1 of the last 1 runs\n" in failing
    md = (run_dir / "report.md").read_text()
    assert (
        "#### Flaky tests" in md
        and "failing attempt's log</summary>" in md
        and "planted flake: attempt 0" in md
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["flaky"] == [FLAKY] and summary["blocking"] == [BROKEN] and not summary["ok"]
    assert {t["id"]: t.get("status") for t in summary["tests"]} == {
        "tests/alpha/test_alpha.py::test_ok": None,
        FLAKY: "flaky",
        BROKEN: "failing",
        FINE: None,
    }

    # the history: the run and its reruns, flaky vs failing, and the flakes report's phrase
    db = history.default_path()
    counts = history.failure_counts(db)
    assert (counts[FLAKY].failed, counts[FLAKY].flaky, counts[BROKEN].failed, counts[BROKEN].flaky) == (
        1,
        1,
        1,
        0,
    )
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT node_id, attempt, outcome, status FROM history_retries ORDER BY node_id, attempt"
        )
        assert rows.fetchall() == [
            (BROKEN, 1, "failed", "failing"),
            (BROKEN, 2, "failed", "failing"),
            (FLAKY, 1, "passed", "flaky"),
        ]
    shown = harness(root, "history", "show", "--failing")
    assert f"{FLAKY}: failed 1 of the last 1 runs (flaky in 1: passed when run again alone)" in shown.stdout
    assert f"{BROKEN}: failed 1 of the last 1 runs\n" in shown.stdout

    # a second run: the flaky test passes at once, the broken one fails again; the history builds up
    again = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "alpha")
    assert again.returncode == 1 and f"retried {FLAKY}" not in again.stdout
    report = (run_dirs(root)[1] / "report.txt").read_text()
    assert "history: failed 2 of the last 2 runs\n" in report and "flaky tests" not in report
    assert (
        history.failure_counts(db)[FLAKY].phrase()
        == "failed 1 of the last 2 runs (flaky in 1: passed when run again alone)"
    )


def test_flaky_only_passes_and_quarantined_tests_are_reported(tmp_path):
    root = make_project(tmp_path, quarantined=(BROKEN, FINE))
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # flaky ones and a quarantined failure: green
    lines = proc.stdout.splitlines()
    assert lines[-1] == "kiln cpu/native OK: 3 passed, 1 failed, 2 flaky (1 failing quarantined)"
    assert any(
        ln.startswith("flaky: 2 test(s) failed, then passed when run again alone; they do not fail the run")
        for ln in lines
    )
    # one pass of a quarantined test is listed, never as "ready to leave": only a flakes run of N says that
    assert (
        f"quarantined tests that passed in this run (1; one run does not show a flake is fixed: `harness flakes` "
        f"decides): {FINE}"
    ) in lines
    assert "remove" not in proc.stdout
    run_dir = run_dirs(root)[0]
    report = (run_dir / "report.txt").read_text()
    assert "suite beta [cpu/native] FLAKY: 1 passed, 1 failed" in report  # failed only by its flaky test
    assert "suite alpha [cpu/native] FAILED" in report  # the quarantined broken test failed there
    assert f"- [alpha] {BROKEN} (quarantined): failed" in report
    assert (
        "quarantined tests that passed in this run (1); only `harness flakes` with N runs says whether they may "
        f"leave the quarantine:\n- {FINE}: passed 1/1"
    ) in report
    md = (run_dir / "report.md").read_text()
    assert f"- `{FINE}`: passed 1/1\n" in md and "Ready to leave" not in md and "remove" not in md + report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ok"] and summary["quarantined_failing"] == [BROKEN] and summary["blocking"] == []
    assert summary["quarantined_passed_all_runs"] == [FINE]
    assert sorted(summary["flaky"]) == sorted([FLAKY, "tests/beta/test_beta.py::test_flaky_beta"])
    report_again = harness(root, "report", str(run_dir), "--check")
    assert report_again.returncode == 0, report_again.stdout


def test_retries_off_and_past_max_tests_leave_failures_failing(tmp_path):
    root = make_project(tmp_path, retries_key={"attempts": 1, "max_tests": 1})
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "alpha")
    assert proc.returncode == 1
    assert (
        "retried 1 failed test(s) alone, up to 1 time(s) each: 1 flaky (1 more not retried: past max_tests 1)"
        in proc.stdout
    )
    run = load_run(run_dirs(root)[0])
    assert retries.not_retried(run) == [BROKEN] and list(retries.load(run)) == [FLAKY]
    assert "attempts: failed the suite run; not run again" in (run.path / "report.txt").read_text()

    (root / "tests" / "alpha" / "counter-test_alpha").unlink()
    off = harness(
        root,
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--quiet",
        "--suite",
        "alpha",
        "--retries",
        "0",
        "--no-history",
    )
    assert off.returncode == 1 and "retried" not in off.stdout
    assert off.stdout.splitlines()[-1] == "kiln cpu/native FAILED: 2 passed, 2 failed"
    assert history.failure_counts(history.default_path())[FLAKY].runs == 1  # only the first run
    bad = harness(root, "run", "--backend", "cpu", "--native", "--retries", "-1")
    assert bad.returncode != 0 and "--retries -1: expected 0 (no reruns) or more" in bad.stderr


def test_sharded_runs_carry_the_classification_through_the_merge(tmp_path):
    root = make_project(tmp_path, broken=False)
    proc = harness(
        root,
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--shards",
        "2",
        "--results",
        "results/par",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = root / "results" / "par"
    assert "kiln cpu/native 2 shards OK: 3 passed, 2 flaky" in proc.stdout
    report = (run_dir / "report.txt").read_text()
    flaky = report.split("flaky tests (2):")[1]
    for test in (FLAKY, "tests/beta/test_beta.py::test_flaky_beta"):
        assert f"- [{test.split('/')[1]}] {test}: failed" in flaky
    logs = [
        ln.split("failing attempt's log: ")[1] for ln in flaky.splitlines() if "failing attempt's log" in ln
    ]
    assert len(logs) == 2 and all(log.startswith("shard-") and (run_dir / log).is_file() for log in logs)
    # the shards recorded nothing: the merged run is recorded once, with its reruns
    db = history.default_path()
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT folder FROM history_runs").fetchall() == [(str(run_dir),)]
        assert con.execute("SELECT COUNT(*) FROM history_retries WHERE status = 'flaky'").fetchone() == (2,)
    assert "history: failed 1 of the last 1 runs (flaky in 1" in report

    # merging the shard folders again elsewhere (as CI's merge job does) keeps the verdicts
    merged = harness(
        root,
        "merge",
        str(run_dir / "shard-1"),
        str(run_dir / "shard-2"),
        "--out",
        "results/again",
        "--check",
        "--history",
        str(tmp_path / "ci-history.sqlite"),
    )
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert merged.stdout.splitlines()[0] == "kiln cpu/native 2 shards OK: 3 passed, 2 flaky"
    assert history.failure_counts(tmp_path / "ci-history.sqlite")[FLAKY].flaky == 1


# ---- pieces, no processes ----------------------------------------------------------------------------------


def test_classify_and_the_json_round_trip():
    assert retries.classify(["failed", "passed"]) == retries.FLAKY == flakes.FLAKY
    assert retries.classify(["error", "failed", "failed"]) == retries.FAILING
    assert retries.classify(["failed", "skipped"]) == retries.FAILING
    r = RetryRecord(
        "t::x",
        "alpha",
        "flaky",
        (
            AttemptRecord(0, "failed", "boom", "suites/retries/alpha-1.0.txt"),
            AttemptRecord(
                1, "failed", "boom", "suites/retries/alpha-1.1.log", 0.1, 1, "suites/retries/alpha-1.1.xml"
            ),
            AttemptRecord(
                2, "passed", "", "suites/retries/alpha-1.2.log", 0.1, 0, "suites/retries/alpha-1.2.xml"
            ),
        ),
    )
    assert r.describe() == "failed, failed, passed (passed on retry 2)" and r.passed_on == 2
    back = RetryRecord.from_json(json.loads(json.dumps(r.to_json())), "shard-2")
    assert back.failing_log == "shard-2/suites/retries/alpha-1.0.txt"
    assert back.attempts[2].junit == "shard-2/suites/retries/alpha-1.2.xml" and back.outcomes == r.outcomes


def test_quarantine_sees_every_attempt():
    q = quarantine.parse({"test": [{"id": "t.py::a", "reason": "r"}, {"id": "t.py::b", "reason": "r"}]})
    v = quarantine.apply({"t.py::a": ["failed", "passed"], "t.py::b": ["passed"]}, q, "cpu")
    assert [(r.id, r.failures, r.runs) for r in v.quarantined_failing] == [("t.py::a", 1, 2)]
    assert [r.id for r in v.ready_to_leave] == ["t.py::b"] and v.ok


def _matrix(tmp_path: Path, top: object = None, cpu: object = None) -> Path:
    data = json.loads((ROOT / "ci" / "matrix.json").read_text())
    data.pop("retries", None)
    if top is not None:
        data["retries"] = top
    if cpu is not None:
        data["backends"]["cpu"]["retries"] = cpu
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(data))
    return path


def test_the_matrix_retries_key(tmp_path):
    real = matrix.load(ROOT / "ci" / "matrix.json")
    assert real.retries_for(real.backend("cuda")) == matrix.Retries(4, 10)  # a 30% flake: failing 0.81%
    assert matrix.load(_matrix(tmp_path)).retries == matrix.DEFAULT_RETRIES
    m = matrix.load(_matrix(tmp_path, {"attempts": 0}, {"attempts": 3, "max_tests": 4}))
    assert m.retries == matrix.Retries(0, 10) and m.retries_for(m.backend("cpu")) == matrix.Retries(3, 4)
    assert m.retries_for(m.backend("rocm")) == matrix.Retries(0, 10)
    for top, cpu, message in (
        ({"attempts": -1}, None, r": retries\.attempts: must be >= 0, got -1"),
        (None, {"max_tests": 0}, r"backends\.cpu\.retries\.max_tests: must be >= 1"),
        ({"times": 2}, None, r"retries: unknown key\(s\) times"),
        ({"attempts": True}, None, r"expected int, got bool"),
        (3, None, r"retries: expected dict"),
    ):
        with pytest.raises(MatrixError, match=message):
            matrix.load(_matrix(tmp_path, top, cpu))


def test_a_store_without_the_retries_table_still_answers(tmp_path):
    db = tmp_path / "old.sqlite"
    with history.connect(db) as con:
        con.exec_driver_sql("DROP TABLE history_retries")  # a store written before retries were recorded
    assert history.failure_counts(db) == {}
    assert (
        history.FailureCount("t", 2, 5, 1).phrase()
        == "failed 2 of the last 5 runs (flaky in 1: passed when run again alone)"
    )
    assert history.FailureCount("t", 2, 5).phrase() == "failed 2 of the last 5 runs"


def test_a_rerun_without_a_result_is_an_error_attempt(tmp_path):
    from harness.suites.runner import PytestRun

    log = tmp_path / "suites" / "retries" / "alpha-1.1.log"
    log.parent.mkdir(parents=True)
    log.write_text("Fatal Python error: Segmentation fault\n")
    run = PytestRun("alpha-1.1", log.with_suffix(".xml"), log, -11, False, 0.5, [])
    a = retries.rerun_attempt(1, "t.py::x", run, tmp_path)
    assert (a.outcome, a.log, a.junit, a.returncode) == ("error", "suites/retries/alpha-1.1.log", "", -11)
    assert a.message == "the rerun left no result for the test (exit -11); see its log"


def test_the_flakes_report_shows_flaky_on_retry_from_the_history(tmp_path):
    """A recorded run whose suite entry holds reruns: the flakes report's history line names the flaky runs."""
    folder = tmp_path / "run"
    (folder / "suites").mkdir(parents=True)
    case = (
        '<testcase classname="x" name="t"><properties><property name="kiln_nodeid" value="t.py::t"/>'
        '</properties><failure message="boom"/></testcase>'
    )
    (folder / "suites" / "alpha.xml").write_text(f"<testsuites><testsuite>{case}</testsuite></testsuites>")
    flaky = RetryRecord(
        "t.py::t",
        "alpha",
        retries.FLAKY,
        (
            AttemptRecord(0, "failed", "boom", "suites/retries/alpha-1.0.txt"),
            AttemptRecord(1, "passed", "", "suites/retries/alpha-1.1.log", 0.2, 0),
        ),
    )
    (folder / "run.json").write_text(
        json.dumps(
            {
                "backend": "cpu",
                "mode": "native",
                "status": "complete",
                "src": str(folder),
                "started": "2026-01-01T00:00:00+00:00",
                "suites": [
                    {
                        "name": "alpha",
                        "status": "failed",
                        "junit": "suites/alpha.xml",
                        "retries": retries.suite_retries(2, 10, [flaky], []).to_json(),
                    }
                ],
            }
        )
    )
    db = tmp_path / "h.sqlite"
    assert history.record(db, folder).retried == 1
    stats = flakes.classify(
        [
            Case("t.py::t", "failed", "", 0.0, {"kiln_flake_run": "0"}),
            Case("t.py::t", "passed", "", 0.0, {"kiln_flake_run": "1"}),
        ]
    )
    q = quarantine.Quarantine()
    report = flakes.build_report(
        stats,
        quarantine.apply({"t.py::t": ["failed", "passed"]}, q),
        backend="cpu",
        runs=2,
        paths=["t.py"],
        command=[],
        pytest_exit=1,
        complete=True,
        history=history.failure_counts_if_any(["t.py::t"], db_path=db),
    )
    assert (
        report["tests"][0]["history"]
        == "failed 1 of the last 1 runs (flaky in 1: passed when run again alone)"
    )
