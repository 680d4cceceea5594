"""The test history through harness/store: a history written before the Alembic stores
(fixtures/history-rev1.sqlite) is stamped by a write-open after a backup with nothing lost and read unchanged
by readers; a newer one is refused; flakes folders are counted by repetitions; and with default settings the
history lives outside the checkout, so two `harness run`s accumulate and feed a third, sharded one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_history import fake_flakes, fake_run

from harness.__main__ import main
from harness.exc import HistoryError
from harness.suites import history, shard
from scratch_project import scratch_project

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "history-rev1.sqlite"


def _copy(tmp_path: Path) -> Path:
    db = tmp_path / "store" / "history.sqlite"
    db.parent.mkdir()
    shutil.copyfile(FIXTURE, db)
    return db


def _rows(db: Path, table: str, run_ids: tuple[int, ...] = (1, 2, 3)) -> list[tuple]:
    marks = ",".join("?" * len(run_ids))
    key = "id" if table == "history_runs" else "run_id"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        sql = f"SELECT * FROM {table} WHERE {key} IN ({marks}) ORDER BY 1, 2"
        return con.execute(sql, run_ids).fetchall()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_write_open_backs_up_stamps_and_keeps_every_row(tmp_path, capsys):
    db = _copy(tmp_path)
    before = {t: _rows(db, t) for t in ("history_runs", "history_outcomes")}
    assert len(before["history_runs"]) == 3 and len(before["history_outcomes"]) == 6
    rec = history.record(
        db, fake_run(tmp_path / "r4", {"t::flaky": ("failed", 0.5)}, started="2026-01-02T00:00:00+00:00")
    )
    assert rec.run_id == 4
    (backup,) = [p for p in db.parent.iterdir() if ".bak-" in p.name]
    assert backup.name.startswith("history.sqlite.bak-") and backup.name.endswith("-rev1")
    err = capsys.readouterr().err
    assert f"copied it to {backup}" in err and len(err.strip().splitlines()) == 1
    after = {t: [r[: len(before[t][0])] for r in _rows(db, t)] for t in before}  # revision 2 adds columns
    assert after == before == {t: _rows(backup, t) for t in before}
    with sqlite3.connect(db) as con:
        stamped = con.execute("SELECT version_num FROM alembic_version_history").fetchall()
    assert stamped == [("history_0002",)]
    assert history.failure_counts(db)["t::flaky"].phrase() == "failed 2 of the last 4 runs"
    history.record(db, fake_run(tmp_path / "r5", {"t::ok": ("passed", 1.0)}))
    assert len([p for p in db.parent.iterdir() if ".bak-" in p.name]) == 1  # stamped once, backed up once


def test_readers_leave_a_rev1_history_byte_identical(tmp_path, capsys):
    db = _copy(tmp_path)
    digest = _digest(db)
    assert main(["history", "show", "--history", str(db)]) == 0
    out = capsys.readouterr().out
    assert "t::flaky: failed 1 of the last 3 runs" in out and "t::ok: failed 0 of the last 3 runs" in out
    assert history.failure_counts_if_any(["t::flaky"], db_path=db)["t::flaky"].runs == 3
    assert history.median_durations(db, "cpu") == {"t::ok": 2.0, "t::flaky": 0.5}
    out_file = tmp_path / "durations.json"
    assert main(["durations", "--from-history", str(db), "--backend", "cpu", "--out", str(out_file)]) == 0
    assert _digest(db) == digest and sorted(p.name for p in db.parent.iterdir()) == ["history.sqlite"]


def test_a_newer_history_is_refused_in_one_line_and_left_alone(tmp_path, capsys):
    db = _copy(tmp_path)
    history.record(db, fake_run(tmp_path / "r4", {"t::ok": ("passed", 1.0)}))
    for p in db.parent.glob("*.bak-*"):
        p.unlink()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version_history SET version_num = 'history_0042'")
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    digest = _digest(db)
    for call in (
        lambda: history.failure_counts(db),
        lambda: history.median_durations(db, "cpu"),
        lambda: history.record(db, fake_run(tmp_path / "r5", {"t::ok": ("passed", 1.0)})),
    ):
        with pytest.raises(HistoryError) as err:
            call()
        msg = str(err.value)
        assert len(msg.splitlines()) == 1 and str(db) in msg
        assert "history_0042" in msg and "history_0002" in msg
    assert history.failure_counts_if_any(["t::ok"], db_path=db) == {}
    capsys.readouterr()
    assert main(["history", "show", "--history", str(db)]) == 2
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err_lines) == 1 and "newer than this code knows" in err_lines[0]
    assert _digest(db) == digest
    assert not [p for p in db.parent.iterdir() if ".corrupt-" in p.name or ".bak-" in p.name]


def test_a_history_failing_the_integrity_check_is_set_aside_by_a_writer_only(tmp_path):
    db = _copy(tmp_path)
    size = db.stat().st_size
    with open(db, "r+b") as fh:  # pages past the first cut short: still SQLite's header, broken inside
        fh.seek(4096)
        fh.write(b"\xff" * (size - 4096))
    damaged = db.read_bytes()
    assert history.failure_counts_if_any(["t::ok"], db_path=db) == {}
    with pytest.raises(HistoryError):
        history.failure_counts(db)
    assert db.read_bytes() == damaged  # readers never move it
    with pytest.raises(HistoryError, match="moved aside to") as err:
        history.record(db, fake_run(tmp_path / "r4", {"t::ok": ("passed", 1.0)}))
    (aside,) = db.parent.glob("history.sqlite.corrupt-*")
    assert str(aside) in str(err.value) and aside.read_bytes() == damaged and not db.exists()


def test_flakes_folders_say_how_many_repetitions_failed(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history.record(
        db,
        fake_flakes(
            tmp_path / "f1",
            {
                "t::flaky": ["failed"] * 6 + ["passed"] * 14,
                "t::broken": ["failed"] * 20,
                "t::ok": ["passed"] * 20,
            },
        ),
    )
    counts = history.failure_counts(db)
    assert counts["t::flaky"].phrase() == "failed 6 of 20 repetitions (flaky)"
    assert counts["t::broken"].phrase() == "failed 20 of 20 repetitions"
    assert counts["t::ok"].phrase() == "failed 0 of 20 repetitions"
    history.record(
        db, fake_run(tmp_path / "r1", {"t::flaky": ("failed", 0.1)}, started="2027-01-01T00:00:00+00:00")
    )
    assert (
        history.failure_counts(db)["t::flaky"].phrase()
        == "failed 1 of the last 1 runs; failed 6 of 20 repetitions (flaky)"
    )
    assert main(["history", "show", "--history", str(db), "--failing"]) == 0
    out = capsys.readouterr().out
    assert "t::broken: failed 20 of 20 repetitions\n" in out and "t::ok" not in out


PLANTED = """
import time


def test_slow():
    time.sleep(0.5)


def test_a():
    pass


def test_b():
    pass


def test_c():
    pass
"""


def test_two_default_runs_accumulate_outside_the_checkout_and_feed_a_sharded_third(tmp_path, monkeypatch):
    root = scratch_project(tmp_path / "proj", {"alpha": PLANTED})
    data_home = tmp_path / "xdg"
    env = {
        **os.environ,
        "KILN_ROOT": str(root),
        "KILN_RESULTS": str(root / "results"),
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(data_home),
    }
    for name in ("KILN_NATIVE", "KILN_HISTORY_DB", "KILN_PLANT"):
        env.pop(name, None)

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    run = ("run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "alpha")
    for _ in range(2):
        proc = harness(*run)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    db = data_home / "kiln" / "history" / "history.sqlite"
    assert db.is_file() and not list(root.rglob("*.sqlite"))  # outside the checkout
    show = harness("history", "show")
    assert show.returncode == 0
    assert "tests/alpha/test_alpha.py::test_slow: failed 0 of the last 2 runs" in show.stdout

    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    lasting = shard.lasting_durations_path("cpu")  # where `nox -s ci-durations` writes it
    assert lasting == db.parent / "durations" / "cpu.json"
    made = harness("durations", "--from-history", str(db), "--backend", "cpu", "--out", str(lasting))
    assert made.returncode == 0, made.stderr
    durations = shard.load_durations(lasting)
    assert durations["tests/alpha/test_alpha.py::test_slow"] >= 0.4

    third = harness(*run, "--shard", "1/2", "--no-history", "--results", "results/third")
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    manifest = json.loads((root / "results" / "third" / "run.json").read_text())
    assert manifest["shard"]["durations"] == "suites/shard-durations.json"
    record = json.loads((root / "results" / "third" / "suites" / "alpha.shard.json").read_text())
    assert record["durations_sha256"] == shard.durations_digest(durations)
    ids = [f"tests/alpha/test_alpha.py::{t}" for t in ("test_slow", "test_a", "test_b", "test_c")]
    one = shard.parse_shard("1/2")
    by_durations = shard.select(ids, one, durations, record["offset"])
    assert sorted(record["selected"]) == sorted(by_durations)
    assert sorted(by_durations) != sorted(shard.select(ids, one, {}, record["offset"]))  # not split by count
