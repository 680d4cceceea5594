"""Reading act's output and judging a pair against its expected end (ci/rehearse/rehearsal/report.py), on act's
real output (tests/harness/fixtures/act), and the tables a rehearsal prints."""

from __future__ import annotations

import zipfile
from pathlib import Path

from rehearsal.act import parse_act_output
from rehearsal.plan import JobSpec
from rehearsal.report import (
    Verdict,
    error_line,
    judge,
    judge_uploads,
    pairs_table,
    summary_rows,
    table,
    uploaded,
)
from rehearse_helpers import FIXTURES, WORKFLOWS


def test_parse_a_successful_job():
    (run,) = parse_act_output((FIXTURES / "lint.log").read_text(encoding="utf-8"))
    assert run.result == "succeeded"
    main = [(s.name, s.result, s.depth) for s in run.steps if s.stage == "Main"]
    assert main == [
        ("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", "success", 0),
        ("copy the local source tree (stand-in for actions/checkout)", "success", 1),
        ("Install nox", "success", 0),
        ("nox -s lint", "success", 0),
    ]
    spec = JobSpec("ci.yml", "lint", "workflow_dispatch")
    assert judge(spec, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 0).ok
    assert not judge(spec, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 1).ok
    gpu = JobSpec("ci.yml", "lint", "workflow_dispatch", expect="preflight")
    assert not judge(gpu, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 0).ok


def test_gpu_job_must_stop_at_its_pre_flight():
    text = (FIXTURES / "flakes-cuda.log").read_text(encoding="utf-8")
    (run,) = parse_act_output(text)
    assert run.result == "failed"
    assert [s.name for s in run.steps if s.result == "failure"] == ["nox -s flakes-cuda"]
    spec = JobSpec("flakes.yml", "flakes-cuda", "workflow_dispatch", expect="preflight")
    job = WORKFLOWS["flakes.yml"]["jobs"]["flakes-cuda"]
    v = judge(spec, job, [run], 1)
    assert v.ok, v.line
    assert v.line.startswith(
        "stopped at pre-flight (step 'nox -s flakes-cuda') with message: "
        "error: pre-flight cuda: no NVIDIA driver"
    )
    # a workflow with a pre-flight step of its own: failing anywhere else is not the expected stop
    with_step = {"steps": [{"name": "GPU pre-flight", "run": "python -m harness preflight"}, *job["steps"]]}
    v = judge(spec, with_step, [run], 1)
    assert not v.ok and "not at its pre-flight step 'GPU pre-flight'" in v.line
    renamed = parse_act_output(text.replace("nox -s flakes-cuda", "GPU pre-flight"))
    assert judge(spec, with_step, renamed, 1).ok
    # a CPU expectation for the same output fails and names the step
    assert (
        "at step 'nox -s flakes-cuda'"
        in judge(JobSpec("flakes.yml", "flakes-cuda", "workflow_dispatch"), job, [run], 1).line
    )


def test_gpu_job_failing_before_its_pre_flight_is_not_the_expected_stop():
    """tests-cuda under act: `strategy.job-total` is empty, so `--shard 1/` is refused before the pre-flight."""
    (run,) = parse_act_output((FIXTURES / "tests-cuda.log").read_text(encoding="utf-8"))
    assert run.result == "failed"
    failed = [s for s in run.steps if s.result == "failure"]
    assert [s.name for s in failed] == ["nox -s tests-cuda (one shard)", "Report and job summary"]
    assert error_line(failed[0]).startswith("harness run: error: --shard '1/'")
    spec = JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", expect="preflight")
    v = judge(spec, WORKFLOWS["ci.yml"]["jobs"]["tests-cuda"], [run], 1)
    assert not v.ok and "before or without its pre-flight: harness run: error: --shard '1/'" in v.line


def test_summary_rows_list_steps_as_act_ran_them_and_the_skipped_ones():
    (run,) = parse_act_output((FIXTURES / "tests-cuda.log").read_text(encoding="utf-8"))
    spec = JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", expect="preflight")
    rows = summary_rows(spec, WORKFLOWS["ci.yml"]["jobs"]["tests-cuda"], [run])
    steps = {step.strip(): result for _, step, result in rows}
    assert steps["nox -s tests-cuda (one shard)"].startswith("failure [")
    assert steps["Install nox"].startswith("success [")
    assert steps["nox -s ci-durations (main; per-test durations from the history, for --shard)"] == "skipped"
    assert any(step.startswith("  copy the local source tree") for _, step, _ in rows)  # composite: indented
    text = table(rows)
    assert text.splitlines()[0].split() == ["job", "step", "result"]
    assert len(text.splitlines()) == len(rows) + 2


def test_an_unfinished_or_missing_job_is_not_ok():
    spec = JobSpec("ci.yml", "lint", "push")
    assert not judge(spec, {}, [], 1).ok
    (run,) = parse_act_output("[ci/lint] ⭐ Run Main Install nox\n[ci/lint]   | x\n")
    assert run.result == "unfinished" and run.steps[0].result == "running" and run.steps[0].output == ["x"]
    assert not judge(spec, {}, [run], 0).ok


def test_the_pairs_table_has_every_pair_its_result_and_time_then_the_cancel_check():
    ok, bad = Verdict(True, "succeeded"), Verdict(False, "failed (act exit 1) at step 'nox -s lint': E501")
    verdicts = [
        (JobSpec("ci.yml", "lint", "push"), ok, 61.4),
        (JobSpec("ci.yml", "unit-tests", "pull_request", expect="skipped", variant="fork"), bad, 0.2),
    ]
    cancel = (JobSpec("ci.yml", "unit-tests", "workflow_dispatch", variant="cancelled"), ok, 95.0)
    lines = pairs_table(verdicts, cancel).splitlines()
    assert lines[0] == "job x event:"
    assert lines[1].split()[:6] == ["workflow", "job", "event", "expected", "result", "s"]
    assert lines[2].split() == ["ci.yml", "lint", "push", "success", "ok", "61", "succeeded"]
    assert lines[3].split()[:7] == ["ci.yml", "unit-tests", "pull_request", "(fork)", "skipped", "FAIL", "0"]
    assert lines[4].split()[:7] == ["ci.yml", "unit-tests", "cancel", "check", "cancelled", "ok", "95"]
    assert lines[-1] == "2 of 3 ended as expected"
    assert pairs_table(verdicts).splitlines()[-1] == "1 of 2 ended as expected"


def _artifact(folder: Path, name: str, files: list[str]) -> None:
    (folder / "1" / name).mkdir(parents=True)
    with zipfile.ZipFile(folder / "1" / name / f"{name}.zip", "w") as z:
        for f in files:
            z.writestr(f, "x")


def test_a_unit_tests_pair_must_have_uploaded_both_junit_files(tmp_path):
    spec, ok = JobSpec("ci.yml", "unit-tests", "push"), Verdict(True, "succeeded")
    (tmp_path / "1").mkdir()
    v = judge_uploads(spec, ok, tmp_path)
    assert (
        not v.ok and v.line == "succeeded, but no artifact results-unit-tests was uploaded (artifacts: none)"
    )
    _artifact(tmp_path, "results-unit-tests", ["unit-tests/compiler.xml"])
    assert judge_uploads(spec, ok, tmp_path).line.endswith("lacks unit-tests/harness.xml")
    _artifact(tmp_path, "other", ["a"])
    with zipfile.ZipFile(tmp_path / "1" / "results-unit-tests" / "results-unit-tests.zip", "a") as z:
        z.writestr("unit-tests/harness.xml", "x")
    v = judge_uploads(spec, ok, tmp_path)
    assert v.ok and v.line == "succeeded; uploaded other (1 files), results-unit-tests (2 files)"
    assert uploaded(tmp_path)["results-unit-tests"] == ["unit-tests/compiler.xml", "unit-tests/harness.xml"]
    # a pair that failed, or that ends at its guard or pre-flight, is judged by its steps alone
    assert judge_uploads(spec, Verdict(False, "failed"), tmp_path) == Verdict(False, "failed")
    gpu = JobSpec("ci.yml", "tests-cuda", "push", expect="preflight")
    assert judge_uploads(gpu, Verdict(True, "stopped"), tmp_path / "none") == Verdict(True, "stopped")
