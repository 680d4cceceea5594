"""The test-history store (harness/suites/history.py): planted results folders recorded, failure counts over the last
N runs, durations exported for sharding, a corrupt file set aside, the CLI's errors. No pytest subprocesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.exc import HistoryError
from harness.results import Case
from harness.settings import settings
from harness.suites import flakes, history, shard
from harness.suites import quarantine as q


def fake_run(
    folder: Path,
    outcomes: dict[str, tuple[str, float]],
    *,
    backend: str = "cpu",
    started: str = "2026-01-01T00:00:00+00:00",
    status: str = "complete",
) -> Path:
    """A results folder as `harness run` writes it: run.json, env.json and one suite's JUnit."""
    (folder / "suites").mkdir(parents=True)
    body = {
        "passed": "",
        "failed": '<failure message="boom"/>',
        "error": '<error message="setup"/>',
        "skipped": '<skipped message="no"/>',
        "xfailed": '<skipped type="pytest.xfail" message="x"/>',
    }
    cases = "".join(
        f'<testcase classname="x" name="{t}" time="{d}"><properties><property name="kiln_nodeid" '
        f'value="{t}"/></properties>{body[o]}</testcase>'
        for t, (o, d) in outcomes.items()
    )
    (folder / "suites" / "alpha.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    (folder / "run.json").write_text(
        json.dumps(
            {
                "backend": backend,
                "mode": "native",
                "status": status,
                "src": str(folder),
                "started": started,
                "suites": [
                    {"name": "alpha", "status": "passed", "junit": "suites/alpha.xml", "duration_s": 1.0}
                ],
            }
        )
    )
    (folder / "env.json").write_text(json.dumps({"git": {"sha": "abc123"}}))
    return folder


def fake_flakes(folder: Path, runs: dict[str, list[str]], backend: str = "cpu") -> Path:
    """A `harness flakes` output folder: flakes.json and pytest.xml with one case per repetition."""
    folder.mkdir(parents=True)
    body = {"passed": "", "failed": '<failure message="boom"/>'}
    cases = "".join(
        f'<testcase classname="x" name="{t}"><properties><property name="kiln_nodeid" value="{t}"/>'
        f'<property name="kiln_flake_run" value="{i}"/></properties>{body[o]}</testcase>'
        for t, outs in runs.items()
        for i, o in enumerate(outs)
    )
    (folder / "pytest.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    (folder / "flakes.json").write_text(json.dumps({"schema": 1, "kind": "flakes", "backend": backend}))
    return folder


def record_series(tmp_path: Path, db: Path, n: int, failing_at: set[int], *, backend: str = "cpu") -> None:
    """n runs, oldest first; t::flaky fails in the runs numbered in `failing_at` (0 = oldest)."""
    for k in range(n):
        outs = {
            "t::ok": ("passed", 1.0 + k % 3),
            "t::flaky": ("failed" if k in failing_at else "passed", 0.5),
            "t::skip": ("skipped", 0.0),
        }
        history.record(
            db,
            fake_run(
                tmp_path / f"{backend}-{k:03d}",
                outs,
                backend=backend,
                started=f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}+00:00",
            ),
        )


def test_failed_3_of_the_last_40_runs_counts_only_the_window(tmp_path):
    db = tmp_path / "h.sqlite"
    # 45 runs: failures in runs 1 and 2 (outside the last 40) and in 10, 30, 44 (inside)
    record_series(tmp_path, db, 45, {1, 2, 10, 30, 44})
    counts = history.failure_counts(db, last=40)
    assert counts["t::flaky"].phrase() == "failed 3 of the last 40 runs"
    assert (counts["t::ok"].failed, counts["t::ok"].runs) == (0, 40)
    assert counts["t::skip"].failed == 0
    assert history.failure_counts(db, last=1)["t::flaky"].phrase() == "failed 1 of the last 1 runs"
    assert history.failure_counts(db, last=100)["t::flaky"].failed == 5
    assert set(history.failure_counts(db, tests=["t::flaky"])) == {"t::flaky"}
    with pytest.raises(HistoryError, match="--last 0"):
        history.failure_counts(db, last=0)


def test_record_is_once_per_folder_and_keeps_backend_commit_source(tmp_path):
    db = tmp_path / "h.sqlite"
    run = fake_run(
        tmp_path / "r1", {"t::a": ("passed", 0.2), "t::b": ("error", 0.1), "t::c": ("xfailed", 0.0)}
    )
    first = history.record(db, run)
    assert first.run_id == 1 and (first.source, first.backend, first.tests) == ("run", "cpu", 3)
    assert history.record(db, run).run_id is None  # recorded before: nothing added
    flk = history.record(db, fake_flakes(tmp_path / "f1", {"t::b": ["passed", "failed", "passed"]}))
    assert flk.source == "flakes" and flk.tests == 3
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT backend, git_commit, source FROM history_runs ORDER BY id").fetchall()
        outs = dict(con.execute("SELECT node_id, outcome FROM history_outcomes WHERE run_id = 1").fetchall())
    assert rows == [("cpu", "abc123", "run"), ("cpu", None, "flakes")]
    assert outs == {"t::a": "passed", "t::b": "error", "t::c": "xfailed"}
    # the flakes folder counts its repetitions, apart from the run folders
    assert (
        history.failure_counts(db)["t::b"].phrase()
        == "failed 1 of the last 1 runs; failed 1 of 3 repetitions (flaky)"
    )


def test_unfinished_and_unknown_folders_are_refused_and_leave_no_trace(tmp_path):
    db = tmp_path / "h.sqlite"
    with pytest.raises(HistoryError, match="not a finished run"):
        history.record(db, fake_run(tmp_path / "r", {"t::a": ("passed", 1.0)}, status="running"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(HistoryError, match="neither a run's results folder"):
        history.record(db, tmp_path / "empty")
    with pytest.raises(HistoryError, match="does not exist"):
        history.record(db, tmp_path / "nope")
    assert not db.exists()


def test_median_durations_feed_shard_assignment(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    record_series(tmp_path, db, 3, set())  # t::ok took 1, 2, 3 s
    history.record(db, fake_run(tmp_path / "gpu", {"t::ok": ("passed", 99.0)}, backend="cuda"))
    history.record(db, fake_flakes(tmp_path / "fl", {"t::ok": ["passed", "passed"]}))  # no durations
    med = history.median_durations(db, "cpu")
    assert med == {"t::ok": 2.0, "t::flaky": 0.5, "t::skip": 0.0}
    out = tmp_path / "durations.json"
    assert main(["durations", "--from-history", str(db), "--backend", "cpu", "--out", str(out)]) == 0
    assert "3 test durations recorded" in capsys.readouterr().out
    loaded = shard.load_durations(out)
    assert loaded == med and json.loads(out.read_text())["backend"] == "cpu"
    # the slow test gets a shard to itself; the two quick ones share the other
    assert shard.assign(list(loaded), 2, loaded) == [["t::ok"], ["t::flaky", "t::skip"]]
    with pytest.raises(HistoryError, match="no recorded runs of backend 'rocm'"):
        history.median_durations(db, "rocm")


def test_a_corrupt_store_is_set_aside_with_one_clear_error(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    garbage = b"this is not sqlite at all\n" * 200
    db.write_bytes(garbage)
    run = fake_run(tmp_path / "r1", {"t::a": ("failed", 1.0)})
    # a report's read never raises and never moves the file
    assert history.failure_counts_if_any(["t::a"], db_path=db) == {}
    assert db.read_bytes() == garbage
    assert main(["history", "--history", str(db), "record", str(run)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("harness history: error: history store ")
    assert "not a readable SQLite database" in err[0] and "moved aside to" in err[0]
    aside = list(tmp_path.glob("h.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage and not db.exists()
    # a second corrupt file never overwrites the first one set aside
    db.write_bytes(garbage + b"2")
    with pytest.raises(HistoryError, match="moved aside"):
        history.record(db, run)
    assert sorted(p.read_bytes() for p in tmp_path.glob("h.sqlite.corrupt-*")) == [garbage, garbage + b"2"]
    assert history.record(db, run).run_id == 1  # a new store


def test_a_newer_schema_is_refused(tmp_path):
    import sqlite3

    db = tmp_path / "h.sqlite"
    history.record(db, fake_run(tmp_path / "r1", {"t::a": ("passed", 1.0)}))
    with sqlite3.connect(db) as con:
        con.execute("UPDATE history_meta SET value = '99' WHERE key = 'schema_version'")
    before = db.read_bytes()
    with pytest.raises(HistoryError, match=r"history store .* is at revision schema v99, newer than this"):
        history.failure_counts(db)
    with pytest.raises(HistoryError, match="update the checkout; nothing was moved or written"):
        history.record(db, fake_run(tmp_path / "r2", {"t::a": ("passed", 1.0)}))
    assert db.read_bytes() == before and not list(tmp_path.glob("h.sqlite.*"))


def test_the_store_shares_a_file_with_the_bench_store(tmp_path):
    from harness.bench.stores.store import Store

    db = tmp_path / "bench.sqlite"
    with Store(db) as store:
        assert store.runs() == []
    history.record(db, fake_run(tmp_path / "r1", {"t::a": ("failed", 1.0)}))
    with Store(db) as store:
        assert store.runs() == []
    assert history.failure_counts(db)["t::a"].failed == 1


def test_settings_name_the_store(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_HISTORY_DB", raising=False)
    monkeypatch.setenv("KILN_RESULTS", str(tmp_path / "res"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert settings().history_db == tmp_path / "data" / "kiln" / "history" / "history.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home" / ".local" / "share"
    assert settings().history_db == home / "kiln" / "history" / "history.sqlite"
    monkeypatch.setenv("KILN_HISTORY_DB", str(tmp_path / "x.sqlite"))
    assert settings().history_db == tmp_path / "x.sqlite" == history.default_path()


def test_cli_record_and_show(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_HISTORY_DB", str(tmp_path / "env.sqlite"))
    runs = [
        fake_run(
            tmp_path / f"r{k}",
            {"t::a": ("failed" if k else "passed", 1.0), "t::b": ("passed", 1.0)},
            started=f"2026-01-0{k + 1}T00:00:00+00:00",
        )
        for k in range(3)
    ]
    assert main(["history", "record", *map(str, runs)]) == 0
    assert capsys.readouterr().out.count("recorded as run") == 3
    assert main(["history", "show", "--last", "2", "--failing"]) == 0
    out = capsys.readouterr().out
    assert "t::a: failed 2 of the last 2 runs" in out and "t::b" not in out
    assert main(["history", "show"]) == 0
    assert "t::b: failed 0 of the last 3 runs" in capsys.readouterr().out
    # --history names another file than the environment's
    assert main(["history", "show", "--history", str(tmp_path / "other.sqlite")]) == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["history", "show"], "does not exist; record a run first"),
        (["history", "record", "/nonexistent/run"], "results folder /nonexistent/run does not exist"),
        (["durations", "--from-history", "H", "--out", "x.json"], "--from-history DB takes --backend B"),
        (["durations", "--out", "x.json"], "name results folders, or --from-history DB --backend B"),
        (
            ["durations", "RUN", "--backend", "cpu", "--out", "x.json"],
            "name results folders, or --from-history DB",
        ),
        (
            ["durations", "--from-history", "/nonexistent.sqlite", "--backend", "cpu", "--out", "x.json"],
            "history store /nonexistent.sqlite does not exist",
        ),
    ],
)
def test_cli_errors_are_one_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_HISTORY_DB", str(tmp_path / "none.sqlite"))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"harness {argv[0]}: error: ") and message in err[0], err
    assert not (tmp_path / "none.sqlite").exists() and not (tmp_path / "x.json").exists()


def test_the_flakes_report_says_how_often_a_test_failed_before(tmp_path):
    db = tmp_path / "h.sqlite"
    record_series(tmp_path, db, 40, {3, 20, 39})
    stats = flakes.classify(
        [
            Case("t::flaky", "passed", "", 0.0, {"kiln_flake_run": "0"}),
            Case("t::flaky", "failed", "", 0.0, {"kiln_flake_run": "1"}),
            Case("t::ok", "passed", "", 0.0, {"kiln_flake_run": "0"}),
            Case("t::ok", "passed", "", 0.0, {"kiln_flake_run": "1"}),
        ]
    )
    verdict = q.apply(
        {"t::flaky": ["passed", "failed"], "t::ok": ["passed", "passed"]}, q.Quarantine(), "cpu"
    )
    past = history.failure_counts_if_any(["t::flaky"], backend="cpu", db_path=db)
    report = flakes.build_report(
        stats,
        verdict,
        backend="cpu",
        runs=2,
        paths=["t"],
        command=["pytest"],
        pytest_exit=1,
        complete=True,
        history=past,
    )
    rows = {t["id"]: t for t in report["tests"]}
    assert rows["t::flaky"]["history"] == "failed 3 of the last 40 runs" and rows["t::ok"]["history"] == ""
    assert "- `t::flaky`: failed 3 of the last 40 runs" in flakes.render_markdown(report, verdict)
    # no store: no history, no error, nothing created
    none = history.failure_counts_if_any(["t::flaky"], db_path=tmp_path / "absent.sqlite")
    assert none == {} and not (tmp_path / "absent.sqlite").exists()
    plain = flakes.build_report(
        stats, verdict, backend="cpu", runs=2, paths=["t"], command=["pytest"], pytest_exit=1, complete=True
    )
    assert "History:" not in flakes.render_markdown(plain, verdict)


def test_a_python_without_sqlalchemy_runs_reports_and_says_history_was_not_recorded(tmp_path):
    """Through the real harness, with SQLAlchemy and Alembic unimportable (a sitecustomize): the green run exits 0,
    is reported, and one line says the history was not recorded and how to get it."""
    import os
    import subprocess
    import sys

    from scratch_project import scratch_project

    root = Path(__file__).resolve().parents[2]
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\nfor n in ('sqlalchemy', 'alembic'):\n    sys.modules[n] = None\n"
    )
    proj = scratch_project(tmp_path / "proj", {"beta": "def test_a():\n    assert True\n"})
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KILN_")},
        "KILN_ROOT": str(proj),
        "KILN_RESULTS": str(proj / "results"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(block), str(root)]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--backend", "cpu", "--native", "--no-health", "--quiet"],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "kiln cpu/native OK: 1 passed" in out
    said = [ln for ln in out.splitlines() if "history" in ln]
    assert (
        len(said) == 1
        and said[0].startswith("test history not recorded: SQLAlchemy and Alembic are not installed")
        and "pip install" in said[0]
    ), said
