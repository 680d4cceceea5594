"""The SQLite store: real files, two writers at once, killed runs never complete, JSON export/import merge."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import make_results, make_run, medians, store_run

from harness.bench.core.records import SCHEMA_VERSION, Meta
from harness.bench.judge.compare import resolve_baseline
from harness.bench.stores.env import device_name
from harness.bench.stores.store import Store
from harness.exc import BaselineError, ImportFormatError, StoreError

ROOT = Path(__file__).resolve().parents[3]


def test_roundtrip_keeps_every_sample_and_field(store):
    res = make_results({("w1", "inductor"): 1000.0, ("w1", "eager"): 2000.0})
    res[0].max_abs_err, res[0].compile_s, res[0].meta = 1e-6, 1.5, Meta(dtype="fp32")
    run = store_run(store, res)
    back = store.results(run.id)
    assert [r.samples for r in back] == [r.samples for r in res]
    assert back[0].max_abs_err == 1e-6 and back[0].compile_s == 1.5 and back[0].meta == Meta(dtype="fp32")
    assert store.run(run.id).status == "complete" and store.run(run.id).finished_at
    assert store.conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_schema_version_is_checked(tmp_path):
    path = tmp_path / "b.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    newer = f"revision schema v999, newer than this code knows.*bench_000{SCHEMA_VERSION}"
    with pytest.raises(StoreError, match=newer):
        Store(path)


def test_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "b.sqlite"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(StoreError, match="cannot use bench store .*: .*not a database"):
        Store(bad)
    with pytest.raises(StoreError, match="directory"):
        Store(tmp_path)


def _writer(path: str, tag: int, runs: int) -> None:
    with Store(path, timeout_s=60) as s:
        for i in range(runs):
            store_run(s, make_results(medians(), seed=tag * 100 + i, n=20), ref=f"writer{tag}")


def test_two_processes_write_at_once(tmp_path):
    path = str(tmp_path / "b.sqlite")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, tag, 4)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store(path) as s:
        runs = s.runs()
        assert len(runs) == 8 and all(r.status == "complete" for r in runs)
        assert sorted(r.git_ref for r in runs) == ["writer1"] * 4 + ["writer2"] * 4
        n = s.conn.exec_driver_sql("SELECT COUNT(*) FROM samples").scalar()
        assert n == 8 * len(medians()) * 20


def test_killed_run_keeps_results_and_is_never_a_baseline(tmp_path):
    """A real `python -m harness.bench run`, SIGKILLed after its first result: the run stays incomplete."""
    db = tmp_path / "b.sqlite"
    with Store(db) as s:
        done = store_run(
            s, make_results({("x", "eager"): 1.0}), profile="tiny", device_name=device_name("cpu")
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.bench",
            "run",
            "--device",
            "cpu",
            "--compilers",
            "eager",
            "--db",
            str(db),
            "--quiet",
            "--target-s",
            "0.3",
            "--passes",  # one sweep: results are stored case by case, so there is a run to kill mid-way
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with Store(db) as s:
                running = [r for r in s.runs() if r.status == "running"]
                if running and s.results(running[0].id):
                    break
            assert proc.poll() is None, "the run finished before it could be killed"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    with Store(db) as s:
        killed = next(r for r in s.runs() if r.id != done.id)
        assert killed.status == "running"  # never marked complete
        assert s.results(killed.id)  # what it wrote before dying is kept
        like = s.run(killed.id)
        assert [r.id for r in resolve_baseline(s, "latest", like)] == [done.id]
        with pytest.raises(BaselineError, match="incomplete"):
            resolve_baseline(s, str(killed.id), like)


def test_export_import_merges_runners_without_duplicates(tmp_path):
    with (
        Store(tmp_path / "a.sqlite") as a,
        Store(tmp_path / "b.sqlite") as b,
        Store(tmp_path / "m.sqlite") as m,
    ):
        ra = store_run(a, make_results(medians(), seed=1), ref="runner-a")
        store_run(b, make_results(medians(), seed=2), ref="runner-b")
        store_run(b, make_results(medians(), seed=3), complete=False)
        ea, eb = a.export(), b.export()
        path = tmp_path / "a.json"
        path.write_text(json.dumps(ea))
        assert m.import_(json.loads(path.read_text())) == (1, 0)
        assert m.import_(eb) == (2, 0)
        assert m.import_(ea) == (0, 1)  # same uid: skipped
        runs = m.runs()
        assert len(runs) == 3
        assert sorted(r.status for r in runs) == ["complete", "complete", "running"]
        merged = next(r for r in runs if r.uid == ra.uid)
        assert [x.samples for x in m.results(merged.id)] == [x.samples for x in a.results(ra.id)]


def test_import_rejects_other_formats(store):
    with pytest.raises(ImportFormatError, match="not a kiln bench export"):
        store.import_({"runs": []})
    with pytest.raises(ImportFormatError, match="schema"):
        store.import_({"format": "kiln-bench-export", "schema_version": SCHEMA_VERSION + 1, "runs": []})
    with pytest.raises(ImportFormatError, match="malformed"):
        store.import_({"format": "kiln-bench-export", "schema_version": SCHEMA_VERSION, "runs": [{"id": 1}]})


def test_history_lists_complete_runs_oldest_first(store):
    r1 = store_run(store, make_results({("w", "eager"): 100.0}, seed=1))
    store_run(store, make_results({("w", "eager"): 100.0}, seed=2), complete=False)
    r3 = store_run(store, make_results({("w", "eager"): 120.0}, seed=3))
    hist = store.history("w", "eager")
    assert [run.id for run, _ in hist] == [r1.id, r3.id]
    assert hist[1][1] > hist[0][1]
    assert make_run().status == "running"
