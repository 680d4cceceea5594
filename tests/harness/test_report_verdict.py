"""A finished run keeps its verdict (harness/suites/report.py): run.json records the quarantine in force when the run
started, a later `harness report` judges the run with that one (today's ci/quarantine.toml only for a run from
before it was recorded, and the report says so), and never turns a run's verdict around: `report --check`
returns what the run returned. Real `python -m harness run` / `report` processes on a planted project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.exc import QuarantineError
from scratch_project import scratch_project, write_quarantine

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "tests/alpha/test_alpha.py::test_broken"
PLANTED = """
def test_ok():
    pass


def test_broken():
    assert 1 + 1 == 3, "planted failure"
"""


def make_project(tmp_path: Path) -> Path:
    return scratch_project(tmp_path / "proj", {"alpha": PLANTED})


def quarantine(root: Path, *ids: str) -> None:
    write_quarantine(root, *ids)


def harness(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_NATIVE", "KILN_HISTORY_DB")}
    env.update(KILN_ROOT=str(root), PYTHONPATH=str(ROOT), KILN_RESULTS=str(root / "results"))
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def run(root: Path) -> tuple[subprocess.CompletedProcess, Path]:
    proc = harness(
        root,
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--quiet",
        "--retries",
        "0",
        "--no-history",
    )
    return proc, max(p for p in (root / "results").iterdir() if p.is_dir())


def test_a_run_is_judged_by_the_quarantine_it_recorded(tmp_path):
    root = make_project(tmp_path)
    quarantine(root, BROKEN)
    proc, run_dir = run(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the broken test was quarantined then
    recorded = json.loads((run_dir / "run.json").read_text())["quarantine"]
    assert recorded == {
        "file": str(root / "ci" / "quarantine.toml"),
        "entries": [{"id": BROKEN, "reason": "planted", "backends": [], "issue": ""}],
    }

    (root / "ci" / "quarantine.toml").unlink()  # today: no quarantine; the run is still judged by its own
    again = harness(root, "report", str(run_dir), "--check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == "kiln cpu/native OK: 1 passed, 1 failed (1 failing quarantined)"
    assert "verdict kept" not in again.stdout and "none recorded" not in again.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ok"] and summary["judged_ok"] and summary["quarantined_failing"] == [BROKEN]


def test_a_failed_run_stays_failed_when_its_test_is_quarantined_later(tmp_path):
    root = make_project(tmp_path)
    proc, run_dir = run(root)
    assert proc.returncode == 1
    assert json.loads((run_dir / "run.json").read_text())["quarantine"] == {"file": None, "entries": []}
    quarantine(root, BROKEN)
    again = harness(root, "report", str(run_dir), "--check")
    assert again.returncode == 1 and "FAILED" in again.stdout.splitlines()[0]
    assert json.loads((run_dir / "summary.json").read_text())["blocking"] == [BROKEN]


def test_an_old_run_without_a_recorded_quarantine_keeps_the_verdict_it_finished_with(tmp_path):
    root = make_project(tmp_path)
    quarantine(root, BROKEN)
    proc, run_dir = run(root)
    assert proc.returncode == 0
    manifest = json.loads((run_dir / "run.json").read_text())
    del manifest["quarantine"]  # as a harness before the quarantine was recorded wrote it
    (run_dir / "run.json").write_text(json.dumps(manifest))
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("finished", "judged_ok", "quarantine_note"):  # and its summary.json
        del summary[key]
    (run_dir / "summary.json").write_text(json.dumps(summary))

    quarantine(root)  # today's file no longer quarantines the test
    for _ in range(2):  # and a second report keeps it too
        again = harness(root, "report", str(run_dir), "--check")
        assert again.returncode == 0, again.stdout + again.stderr  # what the run returned
        lines = again.stdout.splitlines()
        assert lines[0] == "kiln cpu/native OK: 1 passed, 1 failed"
        assert (
            f"quarantine: none recorded in run.json (a run from before it was); judged with today's "
            f"{root / 'ci' / 'quarantine.toml'}"
        ) in lines
        assert (
            "verdict kept: the run finished OK; judged again now it would be FAILED (a report never rewrites "
            "a finished run's verdict)"
        ) in lines
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["ok"] is True and summary["judged_ok"] is False and summary["blocking"] == [BROKEN]
    assert json.loads((run_dir / "run.json").read_text()) == manifest  # run.json is never written by report

    # never reported at all (no summary.json): judged with today's file, and the report says which
    (run_dir / "summary.json").unlink()
    fresh = harness(root, "report", str(run_dir), "--check")
    assert fresh.returncode == 1 and "none recorded in run.json" in fresh.stdout


def fake_shard(
    folder: Path, index: int, tests: list[str], collected: list[str], quarantined: list[str]
) -> Path:
    """A shard's results folder as `harness run --shard I/2` writes it, with the quarantine it recorded."""
    from harness.suites import shard

    (folder / "suites").mkdir(parents=True)
    cases = "".join(
        f'<testcase classname="x" name="{t}" time="0.5"><properties><property name="kiln_nodeid" '
        f'value="{t}"/></properties></testcase>'
        for t in tests
    )
    (folder / "suites" / "alpha.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    (folder / "suites" / "alpha.shard.json").write_text(
        json.dumps(
            {
                "shard": [index, 2],
                "collected": len(collected),
                "collected_sha256": shard.digest(collected),
                "durations_sha256": None,
                "selected": tests,
            }
        )
    )
    (folder / "run.json").write_text(
        json.dumps(
            {
                "backend": "cpu",
                "mode": "native",
                "status": "complete",
                "src": str(folder),
                "env": {},
                "python": "python",
                "shard": {"index": index, "count": 2},
                "started": "2025-01-01T00:00:00+00:00",
                "wall_s": 1.5,
                "quarantine": {
                    "file": "ci/quarantine.toml",
                    "entries": [
                        {"id": i, "reason": "planted", "backends": [], "issue": ""} for i in quarantined
                    ],
                },
                "suites": [
                    {"name": "alpha", "status": "passed", "junit": "suites/alpha.xml", "duration_s": 1.0}
                ],
            }
        )
    )
    return folder


def test_a_merged_run_keeps_the_shards_quarantine_and_they_must_agree(tmp_path):
    from harness.suites import merge

    ids = ["t.py::a", "t.py::b"]
    one = fake_shard(tmp_path / "one", 1, ["t.py::a"], ids, ["t.py::z"])
    two = fake_shard(tmp_path / "two", 2, ["t.py::b"], ids, ["t.py::z"])
    assert merge.merge_shards(tmp_path / "out", {1: one, 2: two}, 2).ok
    merged = json.loads((tmp_path / "out" / "run.json").read_text())
    assert merged["quarantine"]["entries"][0]["id"] == "t.py::z"

    other = fake_shard(tmp_path / "other", 2, ["t.py::b"], ids, [])
    summary = merge.merge_shards(tmp_path / "out2", {1: one, 2: other}, 2)
    problems = json.loads((tmp_path / "out2" / "run.json").read_text())["problems"]
    assert summary.status == "inconsistent" and not summary.ok
    assert (
        "the shards ran under different quarantines (run.json `quarantine`): shard 1: 1 entries; "
        "shard 2: 0 entries"
    ) in problems


def test_the_recorded_quarantine_round_trips_and_a_normal_run_gives_no_leave_advice(tmp_path):
    from harness.suites import quarantine as q_mod

    path = tmp_path / "ci" / "quarantine.toml"
    path.parent.mkdir()
    path.write_text(
        '[[test]]\nid = "t.py::a"\nreason = "r"\nbackends = ["cpu"]\nissue = "#1"\n\n'
        '[[test]]\nid = "t.py::b"\nreason = "s"\n'
    )
    q = q_mod.load(path)
    data = json.loads(json.dumps(q.to_json()))  # plain JSON, as run.json holds it
    assert data["file"] == str(path) and [e["id"] for e in data["entries"]] == ["t.py::a", "t.py::b"]
    back = q_mod.Quarantine.from_json(data)
    assert back == q and back.match("t.py::a", "cpu") and not back.match("t.py::a", "cuda")
    v = q_mod.apply({"t.py::b": "passed"}, back, "cpu")
    assert "Ready to leave" in v.markdown() and "remove it" in v.markdown()  # a flakes run's advice
    normal = v.markdown(leave_advice=False)
    assert "`t.py::b`: passed 1/1" in normal and "Ready to leave" not in normal and "remove" not in normal
    with pytest.raises(QuarantineError, match="run.json: 'quarantine' must be"):
        q_mod.Quarantine.from_json({"entries": "t.py::a"})
