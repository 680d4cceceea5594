"""The bench jobs of the workflows, on CPU: the commands of `nox -s bench-record` /
`bench-pr` (noxfile.bench_job_steps, run here one by one as the session runs them) against one lasting store
outside the checkout; each job has its own fresh results folder, as a fresh checkout would. One tiny workload
under kiln (Triton's interpreter) and eager (a pull request's job: eager alone), a few seconds a job."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = "softmax.fwd.fp32.64x128"
EXTRA = ["--compilers", "kiln", "--only", WORKLOAD, "--target-s", "0.05", "--passes", "1", "--quiet"]
# a bound for a step that hangs, not a speed: a side-by-side confirmation (three processes, kiln in Triton's
# interpreter) takes minutes on a loaded 2-core host
STEP_TIMEOUT_S = 1200


def _noxfile():
    """noxfile.py as a module, loaded once per process (noxfile_loader: its sessions registered once)."""
    from noxfile_loader import noxfile

    return noxfile()


def _job(
    tmp_path: Path,
    name: str,
    *,
    record: bool,
    ref: str,
    extra: list[str] = EXTRA,
    more_env: dict[str, str] | None = None,
) -> dict:
    """Run one job's commands as the session does: seed steps must pass, the others all run. Returns the job's
    exit codes, stderr, summary and its results folder."""
    nf = _noxfile()
    job = tmp_path / name
    out = job / "results" / "bench" / "cpu"
    steps = nf.bench_job_steps("cpu", record=record, native=True, extra=extra, out=str(out))
    env = {
        **os.environ,
        **nf.SUITE_ENV,
        "KILN_BENCH_STORE": str(tmp_path / "runner" / "{backend}.sqlite"),
        "KILN_BENCH_GIT_REF": ref,
        "GITHUB_STEP_SUMMARY": str(job / "summary.md"),
        **(more_env or {}),
    }
    job.mkdir(parents=True)
    codes, err = [], []
    for step, argv, step_env in steps:
        p = subprocess.run(
            argv, cwd=ROOT, env={**env, **step_env}, capture_output=True, text=True, timeout=STEP_TIMEOUT_S
        )
        codes.append((step, p.returncode))
        err.append(p.stderr)
        assert p.returncode == 0 or step != "seed", p.stderr
    summary = (job / "summary.md").read_text() if (job / "summary.md").exists() else ""
    return {"codes": codes, "stderr": "\n".join(err), "summary": summary, "out": out}


def _lasting_runs(tmp_path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(tmp_path / "runner" / "cpu.sqlite") as db:
        return db.execute("SELECT uid, git_ref, status FROM runs ORDER BY id").fetchall()


def _exported_uid(out: Path) -> str:
    (run,) = json.loads((out / "run.json").read_text())["runs"]
    return run["uid"]


def _baseline_uids(out: Path) -> list[str]:
    report = json.loads((out / "last.json").read_text())
    with sqlite3.connect(out / "bench.sqlite") as db:
        return [
            db.execute("SELECT uid FROM runs WHERE id = ?", (i,)).fetchone()[0]
            for i in report["baseline_runs"]
        ]


@pytest.mark.needs("matplotlib")  # the job's plots; without it the note goes to the measure step's log
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_two_main_jobs_share_the_lasting_store_and_the_second_compares_with_the_first(tmp_path):
    """A first main job starts the lasting store; a second, with a planted slowdown, compares with the first
    job's run from it, fails on the confirmed regression and is recorded all the same; then a pull request's
    job (eager alone: what is tested is which run it compares with, not kiln) compares with the latest main run
    and records nothing."""
    first = _job(tmp_path, "job1", record=True, ref="main")
    assert all(rc == 0 for _, rc in first["codes"]), first["stderr"]
    assert "no lasting bench store" in first["stderr"] and "starting a fresh one" in first["summary"]
    assert "no baseline" in first["stderr"]
    uid1 = _exported_uid(first["out"])
    assert _lasting_runs(tmp_path) == [(uid1, "main", "complete")]
    assert "## kiln bench: run" in first["summary"] and "Against baseline" not in first["summary"]

    # a planted slowdown on main, confirmed by the re-measure: the job fails on it; the automatic bisection
    # says why it bisects nothing (main's previous run is of this very commit), the steps after it still ran
    second = _job(
        tmp_path, "job2", record=True, ref="main", more_env={"KILN_BENCH_PLANT": f"{WORKLOAD}@kiln=1.0"}
    )
    assert dict(second["codes"]) == {"seed": 0, "measure": 1, "report": 0, "record": 0, "bisect": 0}, second[
        "stderr"
    ]
    assert _baseline_uids(second["out"]) == [
        uid1
    ]  # compared with the first job's run, from the lasting store
    report = json.loads((second["out"] / "last.json").read_text())
    assert {(c["workload"], c["compiler"]) for c in report["comparisons"]} == {
        (WORKLOAD, "kiln"),
        (WORKLOAD, "eager"),
    }
    assert "Against baseline run(s)" in second["summary"] and "no lasting bench store" not in second["stderr"]
    uid2 = _exported_uid(second["out"])
    assert _lasting_runs(tmp_path) == [(uid1, "main", "complete"), (uid2, "main", "complete")]
    assert list((second["out"] / "plots").glob("*.png"))
    # the runs compared, by their ids in the lasting store (the report's own ids are the job store's)
    assert "### Runs compared" in second["summary"]
    assert "recorded as run 2 of the lasting store" in second["summary"]
    assert (
        f"- against: run 1 of the lasting store (main's previous complete run), uid `{uid1}`"
        in second["summary"]
    )
    decided = json.loads((second["out"] / "auto-bisect.json").read_text())
    # A run of one workload has no local clock for eager (its clock is other eager workloads), so eager itself may
    # be confirmed slower when the two jobs meet different load (pytest-xdist's other worker shares the 2 cores):
    # kiln's planted 2x must be there, and anything else can only be eager on this workload.
    flagged = [(b["workload"], b["compiler"]) for b in decided["not_bisected"]]
    assert (WORKLOAD, "kiln") in flagged and set(flagged) <= {(WORKLOAD, "kiln"), (WORKLOAD, "eager")}, (
        flagged
    )
    assert (
        decided["reason"].startswith("the baseline run is of this very commit") and decided["bisected"] == []
    )
    assert (
        f"{len(flagged)} confirmed regression(s), **none bisected**: the baseline run is of this very commit"
        in second["summary"]
    )

    pr = _job(tmp_path, "pr", record=False, ref="7/merge", extra=["--compilers", "eager", *EXTRA[2:]])
    assert [s for s, rc in pr["codes"] if rc not in (0, 1)] == [], pr["stderr"]
    assert _baseline_uids(pr["out"]) == [uid2]  # the latest complete main run
    assert "record" not in [s for s, _ in pr["codes"]] and len(_lasting_runs(tmp_path)) == 2
    assert "Against baseline run(s)" in pr["summary"]
    assert "not recorded (only main's runs are)" in pr["summary"] and f"uid `{uid2}`" in pr["summary"]


def test_a_corrupt_lasting_store_gets_a_clear_error_and_is_kept_aside(tmp_path):
    store = tmp_path / "runner" / "cpu.sqlite"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"this was a store once\n" * 100)
    job = _job(tmp_path, "job1", record=True, ref="main", extra=["--compilers", "eager", *EXTRA[2:]])
    assert all(rc == 0 for _, rc in job["codes"]), job["stderr"]
    (aside,) = store.parent.glob("cpu.sqlite.corrupt-*")
    assert aside.read_bytes() == b"this was a store once\n" * 100
    # the seed step (a reader) reports it and leaves it be; the record step (a writer) moves it aside
    assert (
        f"error: lasting bench store {store} is corrupt: it is not an SQLite database; left as it is"
        in job["stderr"]
    )
    assert (
        f"error: lasting bench store {store} is corrupt: it is not an SQLite database; moved aside to "
        f"{aside}; starting a fresh store" in job["stderr"]
    )
    assert job["stderr"].index("left as it is") < job["stderr"].index("moved aside to")
    assert "is corrupt" in job["summary"] and "starting a fresh store" in job["summary"]
    assert _lasting_runs(tmp_path) == [(_exported_uid(job["out"]), "main", "complete")]


def test_steps_of_the_sessions():
    nf = _noxfile()
    record = nf.bench_job_steps("cuda", record=True, python="py")
    assert [s for s, _, _ in record] == ["seed", "seed", "measure", "report", "report", "record", "bisect"]
    # the lasting store's steps write their notes into the job summary (opt-in)
    assert record[0][1][4:] == [
        "export",
        "results/bench/cuda/baseline.json",
        "--lasting",
        "cuda",
        "--baseline",
        "ref:main?",
        "--github-summary",
    ]
    assert record[-2][1][4:] == [
        "import",
        "results/bench/cuda/run.json",
        "--lasting",
        "cuda",
        "--github-summary",
    ]
    # after the record: the runs compared and the automatic bisection of confirmed regressions (its default cap)
    assert record[-1][1][4:] == [
        "job-summary",
        "--backend",
        "cuda",
        "--results",
        "results/bench/cuda",
        "--recorded",
    ]
    assert "--native" not in record[2][1] and record[2][2] == {"GITHUB_STEP_SUMMARY": ""}
    pr = nf.bench_job_steps("cuda", record=False, native=True, extra=["--only", "x"], python="py")
    assert [s for s, _, _ in pr] == ["seed", "seed", "measure", "report", "report", "report"]
    assert "--native" in pr[2][1] and pr[2][1][-2:] == ["--only", "x"]
    assert pr[-1][1][4:] == [
        "job-summary",
        "--backend",
        "cuda",
        "--results",
        "results/bench/cuda",
        "--native",
        "--bisect-max",
        "0",
    ]  # a pull request bisects nothing
    assert not any(
        "--lasting" in argv and "import" in argv for _, argv, _ in pr
    )  # a PR never writes the store
