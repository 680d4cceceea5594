"""harness/store/sqlite.py: how a reader opens a store file, in a folder it may write and in one it may not.

The read-only folder is simulated (``os.access`` answers no): the tests run as root, whom no folder refuses.
What it stands for was checked by hand as an unprivileged user on a folder with mode 555: `mode=ro` alone fails
with "attempt to write a readonly database" (SQLite cannot make the `-shm` a WAL read needs), `immutable=1`
reads the file.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from harness.bench.stores.store import Store
from harness.store import sqlite as hs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_helpers import make_results, store_run  # noqa: E402


@pytest.fixture
def read_only_folder(monkeypatch):
    """Every folder reads as not writable to this process (files are untouched)."""
    real = hs.os.access
    monkeypatch.setattr(hs.os, "access", lambda p, mode: False if mode == hs.os.W_OK else real(p, mode))


def _stored(tmp_path: Path) -> Path:
    path = tmp_path / "bench.sqlite"
    with Store(path) as store:  # a writer: WAL, closed cleanly (no -wal left)
        store_run(store, make_results({("w1", "kiln"): 1000.0}))
    assert not path.with_name("bench.sqlite-wal").exists()
    return path


def test_a_writable_folder_reads_mode_ro(tmp_path):
    path = _stored(tmp_path)
    assert hs.read_uri(path).endswith("?mode=ro")


def test_a_read_only_folder_reads_the_closed_file_immutable(tmp_path, read_only_folder):
    path = _stored(tmp_path)
    assert hs.read_uri(path).endswith("?mode=ro&immutable=1")
    with Store(path, readonly=True) as store:  # the reader engine and the unreadable() check both use it
        (run,) = store.runs()
        assert [r.workload for r in store.results(run.id)] == ["w1"]
    assert not path.with_name("bench.sqlite-shm").exists()  # immutable: nothing made beside it


def test_a_live_wal_is_never_skipped(tmp_path, monkeypatch):
    """A `-wal` (with frames: commits the main file lacks yet) or a `-shm` beside the file may mean a writer with
    rights this process lacks is at work: immutable reads would miss or tear its commits, so the reader keeps
    `mode=ro` (and SQLite says what it cannot do rather than answering from a stale file)."""
    path = tmp_path / "live.sqlite"
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (a)")
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()
    try:
        assert path.with_name("live.sqlite-wal").stat().st_size > 0
        monkeypatch.setattr(hs.os, "access", lambda p, mode: False)
        assert hs.read_uri(path).endswith("?mode=ro")
    finally:
        writer.close()
    assert not path.with_name("live.sqlite-wal").exists()  # the last connection closed: the file holds it all
    assert hs.read_uri(path).endswith("&immutable=1")
    path.with_name("live.sqlite-shm").write_bytes(b"")  # a -shm alone: a writer may have the file open
    assert hs.read_uri(path).endswith("?mode=ro")
