"""The typed run record (harness/record.py): a schema-1 run folder, written as the harness before records wrote
it, reads and reports as it did; records round-trip; the runner's end steps work on a record in memory."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import HarnessError, ResultsError
from harness.process import Terminated, sigterm_interrupts
from harness.record import (
    SCHEMA_VERSION,
    Outcome,
    RunRecord,
    RunStatus,
    SuiteRecord,
    SuiteStatus,
    TestOutcome,
)
from harness.suites import history, report, steps
from harness.suites.collect import load_run
from harness.suites.options import RunOptions
from harness.suites.place import NativePlace

EXPECTED = (
    Path(__file__).parent / "schema1"
)  # the reports the harness at 6f4b059 wrote of `write_schema1_run` (summary.json: plus the keys added since, `suites` and `broken_suite_details`; every older key as it was)
CASE = (
    '<testcase classname="tests.alpha.test_a" name="{name}" file="tests/alpha/test_a.py" time="{t}">'
    '<properties><property name="kiln_nodeid" value="tests/alpha/test_a.py::{name}"/></properties>{body}'
    "</testcase>"
)


def _junit(cases: list[tuple[str, str, str]]) -> str:
    body = "".join(CASE.format(name=n, t=t, body=b) for n, t, b in cases)
    return f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="s">{body}</testsuite></testsuites>'


def schema1_manifest(folder: Path, src: Path) -> dict:
    """run.json as runner.run_suites wrote it before records (schema 1): a complete native cpu run, suite alpha
    under isolation (a crash, a flaky test rerun alone, a quarantined failure not rerun), suite beta missing."""
    flaky = {
        "id": "tests/alpha/test_a.py::test_flaky",
        "suite": "alpha",
        "status": "flaky",
        "attempts": [
            {
                "n": 0,
                "outcome": "failed",
                "message": "assert 1 == 2",
                "log": "suites/retries/alpha-1.0.txt",
                "duration_s": 0.5,
                "returncode": None,
                "junit": "",
            },
            {
                "n": 1,
                "outcome": "passed",
                "message": "",
                "log": "suites/retries/alpha-1.1.log",
                "duration_s": 0.4,
                "returncode": 0,
                "junit": "suites/retries/alpha-1.1.xml",
            },
        ],
    }
    crash = {
        "id": "tests/alpha/test_a.py::test_crash",
        "reason": "killed by SIGSEGV",
        "returncode": -11,
        "attempt": 1,
        "log": "alpha.log",
        "tail": "Segmentation fault",
    }
    return {
        "schema": 1,
        "run_id": folder.name,
        "backend": "cpu",
        "mode": "native",
        "status": "complete",
        "started": "2026-11-01T10:00:00+00:00",
        "finished": "2026-11-01T10:05:00+00:00",
        "wall_s": 300.0,
        "src": str(src),
        "python": "/usr/bin/python3",
        "docker": "docker",
        "image": None,
        "env": {"KILN_TEST_DEVICE": "cpu", "PYTHONHASHSEED": "0"},
        "container_options": [],
        "test_timeout_s": 300,
        "suite_timeout_s": 3600,
        "pytest_extra": ["-x"],
        "health": {"ok": True, "log": "health.log"},
        "per_test_timeout": True,
        "devices": [],
        "retries": {"attempts": 2, "max_tests": 10},
        "history": None,
        "quarantine": {
            "file": "ci/quarantine.toml",
            "entries": [
                {"id": "tests/alpha/test_a.py::test_q", "reason": "known bad", "backends": [], "issue": "#7"}
            ],
        },
        "suites": [
            {
                "name": "alpha",
                "status": "error",
                "junit": "suites/alpha.xml",
                "log": "suites/alpha.log",
                "returncode": 1,
                "timed_out": False,
                "duration_s": 2.5,
                "counts": {"passed": 1, "failed": 2, "error": 1, "skipped": 1, "xfailed": 0},
                "argv": ["python", "-m", "pytest", "tests/alpha"],
                "attempts": [
                    {"log": "suites/alpha.log", "returncode": -11, "duration_s": 1.5},
                    {"log": "suites/alpha.resume-1.log", "returncode": 1, "duration_s": 1.0},
                ],
                "crashes": [crash],
                "not_run": [],
                "collect_failed": "",
                "ended_badly": "",
                "retries": {
                    "attempts": 2,
                    "max_tests": 10,
                    "tests": [flaky],
                    "not_retried": ["tests/alpha/test_a.py::test_q"],
                },
            },
            {
                "name": "beta",
                "status": "missing",
                "junit": "",
                "log": "",
                "returncode": None,
                "timed_out": False,
                "duration_s": 0.0,
                "counts": {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0},
                "argv": [],
            },
        ],
    }


def write_schema1_run(folder: Path, src: Path) -> Path:
    (folder / "suites" / "retries").mkdir(parents=True)
    (folder / "suites" / "alpha.xml").write_text(
        _junit(
            [
                ("test_ok", "0.125", ""),
                ("test_flaky", "0.5", '<failure message="assert 1 == 2">trace</failure>'),
                ("test_q", "0.25", '<failure message="known bad">trace</failure>'),
                ("test_crash", "0.0", '<error message="crashed: killed by SIGSEGV">tail</error>'),
                ("test_skip", "0.0", '<skipped message="no gpu" type="pytest.skip"/>'),
            ]
        )
    )
    (folder / "suites" / "alpha.log").write_text("log\n")
    (folder / "suites" / "retries" / "alpha-1.0.txt").write_text("attempt 0\n")
    (folder / "suites" / "retries" / "alpha-1.1.log").write_text("rerun\n")
    (folder / "run.json").write_text(json.dumps(schema1_manifest(folder, src), indent=2, sort_keys=True))
    return folder


def test_a_schema1_run_folder_reports_as_the_previous_harness_reported_it(tmp_path):
    run_dir = write_schema1_run(tmp_path / "run-1", Path("/repo"))
    before = (run_dir / "run.json").read_text()
    summary = report.write_reports(run_dir)
    assert not summary.ok and summary.flaky == ["tests/alpha/test_a.py::test_flaky"]
    for name in ("report.txt", "report.md", "summary.json"):
        assert (run_dir / name).read_text() == (EXPECTED / name).read_text().replace("{RUN}", str(run_dir)), (
            name
        )
    assert (run_dir / "run.json").read_text() == before  # a report never rewrites run.json


def test_a_schema1_run_folder_is_recorded_into_the_history(tmp_path):
    run_dir = write_schema1_run(tmp_path / "run-1", Path("/repo"))
    recorded = history.record(tmp_path / "h.sqlite", run_dir)
    assert (recorded.tests, recorded.retried, recorded.backend) == (5, 1, "cpu")


def test_a_schema1_record_round_trips_as_the_current_schema_with_the_same_keys(tmp_path):
    data = schema1_manifest(tmp_path / "run-1", Path("/repo"))
    record = RunRecord.from_json(data)
    assert record.status is RunStatus.COMPLETE and record.suites[0].status is SuiteStatus.ERROR
    assert record.suites[0].crashes[0].returncode == -11 and record.suites[0].retries.tests[0].passed_on == 1
    assert record.to_json() == {**data, "schema": SCHEMA_VERSION}
    assert RunRecord.from_json(record.to_json()) == replace(record, schema=SCHEMA_VERSION)


@pytest.mark.parametrize(
    "data, says",
    [
        ([], "is not a harness run manifest"),
        ({"backend": "cpu", "schema": 99}, "has schema 99"),
        ({"backend": "cpu", "status": "half-done"}, "is malformed: ValueError"),
        ({"backend": "cpu", "suites": [{"status": "passed"}]}, "is malformed: KeyError"),
    ],
)
def test_a_malformed_run_json_is_one_line_naming_the_file(tmp_path, data, says):
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError) as e:
        load_run(tmp_path)
    assert says in str(e.value) and str(tmp_path / "run.json") in str(e.value) and "\n" not in str(e.value)


def _planted_state(tmp_path: Path, history_db: Path | None) -> steps.RunState:
    """A finished run held in memory only: no JUnit file on disk, so what the end steps report came from memory."""
    m = matrix.load()
    plan = steps.Plan(b=m.backend("cpu"), m=m, place=NativePlace(), suites=("alpha",), history_db=history_db)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tests = [
        TestOutcome("tests/alpha/test_a.py::test_ok", Outcome.PASSED, "", 0.1),
        TestOutcome("tests/alpha/test_a.py::test_bad", Outcome.FAILED, "boom", 0.2),
    ]
    record = RunRecord(
        run_dir.name,
        "cpu",
        RunStatus.COMPLETE,
        mode="native",
        src="/repo",
        python="python",
        started="2026-11-01T10:00:00+00:00",
        finished="2026-11-01T10:01:00+00:00",
        suites=(SuiteRecord("alpha", SuiteStatus.FAILED, "suites/alpha.xml", duration_s=0.3),),
    )
    state = steps.RunState(plan, run_dir, record, {"alpha": tests})
    state.save()
    return state


def test_the_report_step_reports_the_record_in_memory(tmp_path, capsys):
    state = _planted_state(tmp_path, None)
    state = steps.write_report(state)
    assert state.ok is False
    assert "kiln cpu/native FAILED: 1 passed, 1 failed" in capsys.readouterr().out
    text = (state.run_dir / "report.txt").read_text()
    assert "- [alpha] tests/alpha/test_a.py::test_bad: failed: boom" in text
    assert not (state.run_dir / "suites" / "alpha.xml").exists()


def test_the_history_step_records_the_record_in_memory(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    steps.record_history(_planted_state(tmp_path, db))
    assert "test history: 2 test outcomes recorded" in capsys.readouterr().out
    counts = history.failure_counts(db, tests=["tests/alpha/test_a.py::test_bad"])
    assert counts["tests/alpha/test_a.py::test_bad"].phrase().startswith("failed 1 of the last 1 runs")


def test_the_host_check_step_stops_an_unknown_suite_before_anything_is_written(tmp_path):
    m = matrix.load()
    plan = steps.Plan(
        b=m.backend("cpu"), m=m, place=NativePlace(), suites=("no-such-suite",), run_dir=tmp_path / "run"
    )
    with pytest.raises(HarnessError, match="unknown suite"):
        steps.check_host(plan)
    assert not (tmp_path / "run").exists()


def test_sigterm_is_an_interrupt_inside_the_supervisor_only():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(500):  # the handler raises at the next bytecode the main thread runs
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) == before
    assert issubclass(Terminated, KeyboardInterrupt)


def write_schema1_merged_run(folder: Path) -> Path:
    """A merged run as `harness merge` wrote it before records (schema 1): shard 1 of 2 complete (the run of
    `write_schema1_run`, as a shard), shard 2 missing."""
    shard_dir = write_schema1_run(folder / "shard-1", Path("/repo"))
    one = json.loads((shard_dir / "run.json").read_text())
    one["shard"] = {"index": 1, "count": 2, "durations": None}
    (shard_dir / "run.json").write_text(json.dumps(one))
    shared = (
        "backend",
        "mode",
        "src",
        "python",
        "docker",
        "image",
        "pytest_extra",
        "test_timeout_s",
        "suite_timeout_s",
        "per_test_timeout",
        "retries",
        "quarantine",
    )
    merged = {
        **{k: one[k] for k in shared},
        "schema": 1,
        "run_id": folder.name,
        "status": "incomplete",
        "started": one["started"],
        "finished": "2026-11-01T10:06:00+00:00",
        "shard_count": 2,
        "shards": [
            {
                "index": 1,
                "count": 2,
                "status": "complete",
                "reason": "",
                "dir": "shard-1",
                "devices": [],
                "wall_s": 300.0,
                "run_id": "shard-1",
                "started": one["started"],
                "finished": one["finished"],
            },
            {
                "index": 2,
                "count": 2,
                "status": "missing",
                "reason": "no results folder for this shard",
                "dir": "",
                "devices": [],
                "wall_s": None,
                "run_id": None,
                "started": None,
                "finished": None,
            },
        ],
        "suites": [],
        "problems": [],
        "wall_s": 310.0,
        "reason": "shard 2/2 missing: no results folder for this shard",
    }
    (folder / "run.json").write_text(json.dumps(merged, indent=2, sort_keys=True))
    return folder


def test_a_schema1_merged_run_reports_as_the_previous_harness_reported_it(tmp_path):
    run_dir = write_schema1_merged_run(tmp_path / "merged")
    report.write_reports(run_dir)
    for name in ("report.txt", "report.md", "summary.json"):
        expected = (EXPECTED / f"merged-{name}").read_text().replace("{RUN}", str(run_dir))
        assert (run_dir / name).read_text() == expected, name
    run = load_run(run_dir)
    assert run.merged and run.record_for("tests/alpha/test_a.py::test_q").shard.index == 1


def test_the_shards_check_step_stops_an_unknown_suite_and_records_the_quarantine(tmp_path):
    from harness.suites import sharded

    m = matrix.load()
    st = sharded.ShardsState(
        b=m.backend("cpu"),
        m=m,
        groups=[[], []],
        place=NativePlace(),
        options=RunOptions(suites=["no-such-suite"], echo=False),
        run_dir=tmp_path / "run",
    )
    with pytest.raises(HarnessError, match="unknown suite"):
        sharded.check_shards(st)
    st.options = replace(st.options, suites=list(m.suites))
    st = sharded.check_shards(st)
    assert st.base is not None and st.base.backend == "cpu" and st.base.mode == "native"
    assert st.base.quarantine is not None and not (tmp_path / "run").exists()


def test_schema3_records_the_commit_and_seeds_and_reads_schema2_without_them():
    from harness.record import seeds_of

    assert seeds_of({"PYTHONHASHSEED": "0", "KILN_NUMERICS_SEED": "3", "OMP_NUM_THREADS": "1"}) == {
        "KILN_NUMERICS_SEED": "3",
        "PYTHONHASHSEED": "0",
    }
    commit = {"sha": "a" * 40, "dirty": True, "dirty_files": ["compiler/x.py"], "branch": "main"}
    record = RunRecord(
        "r", "cpu", RunStatus.COMPLETE, container_options=(), commit=commit, seeds={"PYTHONHASHSEED": "0"}
    )
    data = record.to_json()
    assert data["schema"] == SCHEMA_VERSION == 3 and data["commit"] == commit
    assert data["seeds"] == {"PYTHONHASHSEED": "0"} and RunRecord.from_json(data) == record
    older = RunRecord.from_json(
        {k: v for k, v in {**data, "schema": 2}.items() if k not in ("commit", "seeds")}
    )
    assert older.commit is None and older.seeds == {} and older.schema == 2


def test_a_run_records_the_commit_it_tested(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run(
        [
            "git",
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "user.name=t",
            "-C",
            str(tmp_path),
            "commit",
            "-qm",
            "x",
        ],
        check=True,
    )
    (tmp_path / "f").write_text("changed")
    commit = steps.commit_of(tmp_path)
    assert (
        commit is not None and len(commit["sha"]) == 40 and commit["dirty"] and commit["dirty_files"] == ["f"]
    )
    assert steps.commit_of(tmp_path / "not-a-repo") is None
