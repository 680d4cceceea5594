"""The bench store's revisions (harness/store, Alembic): a store written by the code before the Alembic stores
(fixtures/bench-store-rev1.sqlite, schema v1) is migrated by a write-open with nothing lost and a backup,
read as it is by every reader without a byte changed, and a newer store is refused and left alone. Also the
stored verdicts of revision 2 (Store.save_verdicts / verdicts, export and import)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from bench_helpers import make_results, store_run

from harness.bench.cli import main as bench_main
from harness.bench.core.records import SCHEMA_VERSION, Comparison, Verdict
from harness.bench.stores.store import Store, open_lasting, store_problem
from harness.exc import ImportFormatError, StoreError
from harness.store import BENCH, head

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TABLES = ("runs", "results", "samples")


def _rev1(tmp_path: Path, name: str = "bench.sqlite") -> Path:
    path = tmp_path / name
    shutil.copyfile(FIXTURES / "bench-store-rev1.sqlite", path)
    return path


def _rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _others(path: Path) -> list[str]:
    """Files next to the store other than the store itself, its WAL side files and the lock file."""
    skip = {path.name, path.name + "-wal", path.name + "-shm", path.name + ".lock"}
    return sorted(p.name for p in path.parent.iterdir() if p.name not in skip)


def test_the_fixture_is_a_store_of_the_code_before_alembic():
    with sqlite3.connect(f"file:{FIXTURES / 'bench-store-rev1.sqlite'}?mode=ro", uri=True) as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    assert {"meta", "runs", "results", "samples"} <= names and not any(n.startswith("alembic") for n in names)
    assert "verdicts" not in names and head(BENCH) == SCHEMA_VERSION == 3


def test_a_write_open_backs_up_then_migrates_with_nothing_lost(tmp_path):
    path = _rev1(tmp_path)
    before = _rows(path)
    notes: list[str] = []
    with Store(path, log=notes.append) as store:
        assert store.revision == 3
        runs = store.runs()
        assert [r.uid for r in runs] == ["uid-2", "uid-1", "uid-0"]
        assert [r.uid for r in store.runs(complete_only=True)] == ["uid-1", "uid-0"]  # killed: stays so
        res = store.results(runs[-1].id)
        assert len(res) == 4 and res[0].samples == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
        assert res[0].meta.extra == {"n": 0} and runs[-1].config == {"k": 0}
        assert store.verdicts(runs[-1].id) is None
        store.save_verdicts(runs[-1].id, [Comparison("add", "kiln", "ok")])  # the new table is there
    (backup,) = [tmp_path / n for n in _others(path)]
    assert backup.name.startswith("bench.sqlite.bak-") and backup.name.endswith("-rev1")
    assert len(notes) == 1 and str(backup) in notes[0]
    assert "revision 1" in notes[0] and "revision 3" in notes[0]
    after = {t: [r[: len(before[t][0])] if before[t] else r for r in rows] for t, rows in _rows(path).items()}
    assert after == before == _rows(backup)  # every row kept (revision 3 adds columns), the backup as it was
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version_bench").fetchall() == [("bench_0003",)]
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
    with sqlite3.connect(backup) as db:  # the backup is the revision-1 store, still without a version table
        assert db.execute("SELECT value FROM meta").fetchone() == ("1",)
        assert not db.execute("SELECT 1 FROM sqlite_master WHERE name LIKE 'alembic%'").fetchall()
    with Store(path, log=notes.append):
        pass
    assert len(notes) == 1 and len(_others(path)) == 1  # at head: no second backup, nothing said


def test_readers_read_revision_1_and_leave_it_byte_identical(tmp_path, capsys):
    path = _rev1(tmp_path)
    digest = _digest(path)
    with Store(path, readonly=True) as store:
        assert store.revision == 1
        run = store.runs(complete_only=True)[0]
        assert len(store.results(run.id)) == 4 and store.verdicts(run.id) is None
        assert store.export([run.id])["runs"][0]["verdicts"] is None
        with pytest.raises(StoreError, match="open read-only"):
            store.save_verdicts(run.id, [])
    with open_lasting(path, write=False, log=lambda _: None) as store:
        assert len(store.runs()) == 3
    assert bench_main(["list", "--db", str(path)]) == 0
    assert bench_main(["show", "latest", "--db", str(path)]) == 0
    assert bench_main(["export", str(tmp_path / "x" / "e.json"), "--db", str(path), "--runs", "latest"]) == 0
    assert "uid" not in capsys.readouterr().err
    assert store_problem(path) is None
    assert _digest(path) == digest and _others(path) == ["x"]  # no backup, nothing set aside


@pytest.mark.parametrize("stamp", ["version-table", "meta"])
def test_a_newer_store_is_refused_in_one_line_and_left_byte_identical(tmp_path, stamp):
    path = _rev1(tmp_path)
    with Store(path, log=lambda _: None):
        pass
    for p in tmp_path.glob("*.bak-*"):
        p.unlink()
    db = sqlite3.connect(path, isolation_level=None)
    if stamp == "version-table":
        db.execute("UPDATE alembic_version_bench SET version_num = 'bench_0099'")
    else:
        db.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    db.execute("PRAGMA journal_mode = DELETE")  # no WAL: a writer's open would have to switch it first
    db.close()
    digest = _digest(path)
    want = "bench_0099" if stamp == "version-table" else "schema v4"
    for opener in (lambda: Store(path), lambda: Store(path, readonly=True)):
        with pytest.raises(StoreError) as err:
            opener()
        msg = str(err.value)
        assert len(msg.splitlines()) == 1 and str(path) in msg and want in msg and "bench_0003" in msg
        assert "update the checkout" in msg
    for write in (True, False):
        with pytest.raises(StoreError, match=want), open_lasting(path, write=write, log=lambda _: None):
            pass
    assert store_problem(path)[0] == "newer"
    assert _digest(path) == digest and _others(path) == []  # never moved, migrated, backed up or set aside


def test_an_unreadable_lasting_store_is_set_aside_by_a_writer_only(tmp_path):
    path = tmp_path / "cuda.sqlite"
    path.write_bytes(b"not sqlite " * 100)
    notes: list[str] = []
    with open_lasting(path, write=False, log=notes.append) as store:
        assert store.runs() == []
    assert path.read_bytes() == b"not sqlite " * 100 and _others(path) == []
    assert "left as it is" in notes[0]
    with open_lasting(path, write=True, log=notes.append) as store:
        assert store.runs() == [] and store.revision == 3
    (aside,) = [tmp_path / n for n in _others(path)]
    assert aside.name.startswith("cuda.sqlite.corrupt-") and aside.read_bytes() == b"not sqlite " * 100
    assert str(aside) in notes[1] and "not an SQLite database" in notes[1]


def test_verdicts_are_stored_replaced_exported_and_imported(store, tmp_path):
    run = store_run(store, make_results({("w1", "kiln"): 1000.0, ("w1", "eager"): 2000.0}))
    other = store_run(store, make_results({("w1", "kiln"): 1000.0}))
    assert store.verdicts(run.id) is None
    vs = [
        Comparison(
            "w1",
            "kiln",
            Verdict.REGRESSED,
            ratio=1.25,
            p=1e-4,
            baseline="uid-a,uid-b",
            confirmed=True,
            note="threshold 0.1",
            sbs_ratio=1.2,
            sbs_noise=0.04,
        ),
        Comparison(
            "w1", "eager", "ok", ratio=1.0, p=0.5, baseline="uid-a,uid-b"
        ),  # an older harness's verdict
        Comparison("w2", "kiln", Verdict.REGRESSED, ratio=1.3, confirmed=False),
    ]
    store.save_verdicts(run.id, vs)
    assert store.verdicts(run.id) == vs and store.verdicts(other.id) is None
    store.save_verdicts(run.id, vs[1:])  # replaces, in one transaction
    assert store.verdicts(run.id) == vs[1:]
    with pytest.raises(StoreError, match="no run 999"):
        store.save_verdicts(999, vs)
    with pytest.raises(StoreError, match="UNIQUE"):  # the same workload and compiler twice: nothing replaced
        store.save_verdicts(run.id, [vs[0], vs[0]])
    assert store.verdicts(run.id) == vs[1:]
    assert Comparison.from_dict(vs[0].as_dict()) == vs[0] == Comparison.from_dict(vs[0].stored())
    assert (
        vs[0].stored()["verdict"] == "regressed" and type(vs[0].stored()["verdict"]) is str
    )  # stored: the value

    data = store.export([run.id, other.id])
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["runs"][0]["verdicts"] == [v.stored() for v in vs[1:]]
    assert data["runs"][1]["verdicts"] is None
    with Store(tmp_path / "other.sqlite") as dest:
        assert dest.import_(data) == (2, 0)
        got = {r.uid: dest.verdicts(r.id) for r in dest.runs()}
    assert got == {run.uid: vs[1:], other.uid: None}


def test_an_export_of_schema_v1_still_imports(store, tmp_path):
    with Store(_rev1(tmp_path, "old.sqlite"), readonly=True) as old:
        data = old.export()
    data["schema_version"] = 1
    for rd in data["runs"]:
        del rd["verdicts"]  # what the code before verdicts exported
    assert store.import_(data) == (3, 0) and len(store.runs(complete_only=True)) == 2
    with pytest.raises(ImportFormatError, match="v1 to v3"):
        store.import_({**data, "schema_version": 4})


def test_a_migration_that_fails_halfway_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    from harness.store import migrate

    path = _rev1(tmp_path)
    before = _rows(path)
    real = migrate.command.upgrade

    def upgrade_then_fail(cfg, rev):
        real(cfg, rev)  # stamped and upgraded inside the one transaction ...
        raise OSError("disk full")  # ... which this undoes

    monkeypatch.setattr(migrate.command, "upgrade", upgrade_then_fail)
    with pytest.raises(OSError, match="disk full"):
        Store(path, log=lambda _: None)
    with sqlite3.connect(path) as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert db.execute("SELECT value FROM meta").fetchone() == ("1",)
    assert "verdicts" not in names and not any(n.startswith("alembic") for n in names)
    assert _rows(path) == before
    monkeypatch.setattr(migrate.command, "upgrade", real)
    with Store(path, log=lambda _: None) as store:  # the next write-open migrates it
        assert store.revision == 3 and len(store.runs()) == 3


def test_the_migrations_ship_as_package_modules():
    from harness.store import HISTORY
    from harness.store.migrate import MIGRATIONS, known_revisions

    assert known_revisions(BENCH) == ("bench_0001", "bench_0002", "bench_0003")
    assert known_revisions(HISTORY) == ("history_0001", "history_0002")
    for folder in (MIGRATIONS, *MIGRATIONS.glob("*/"), *MIGRATIONS.glob("*/versions/")):
        assert (folder / "__init__.py").is_file(), f"{folder}: setuptools' packages.find ships packages only"
