"""The lasting store of the CI bench jobs: its path, the OS lock, missing and corrupt stores, and the
CLI verbs the jobs use (`--lasting`, `export --baseline/--runs latest`, `summary`). Real files, no GPU."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from bench_helpers import make_results, store_run

from harness import matrix
from harness.bench.stores.store import StoreLock, lasting_path, open_lasting, set_aside, store_problem
from harness.exc import MatrixError, StoreError, UsageError

ROOT = Path(__file__).resolve().parents[3]


def _notes() -> tuple[list[str], object]:
    lines: list[str] = []
    return lines, lines.append


def _lasting_with_runs(path: Path, n: int = 1) -> list[str]:
    """A lasting store at `path` with `n` complete runs; their uids."""
    uids = []
    with open_lasting(path, write=True, log=lambda _: None) as store:
        for i in range(n):
            uids.append(store_run(store, make_results({("w1", "eager"): 1000.0 + i})).uid)
    return uids


def test_path_from_the_environment_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_BENCH_STORE", str(tmp_path / "stores" / "{backend}.sqlite"))
    assert lasting_path("cuda") == tmp_path / "stores" / "cuda.sqlite"
    monkeypatch.delenv("KILN_BENCH_STORE")
    assert lasting_path("rocm") == Path.home() / ".local" / "share" / "kiln" / "bench" / "rocm.sqlite"
    monkeypatch.setenv("KILN_BENCH_STORE", str(ROOT / "results" / "lasting.sqlite"))
    with pytest.raises(UsageError, match="inside the checkout"):
        lasting_path("cuda")


def _matrix_with(tmp_path: Path, top: str | None = None, **per_backend: str) -> Path:
    """A copy of ci/matrix.json with a top-level `bench_store` (None: the key removed) and per-backend ones."""
    data = json.loads((ROOT / "ci" / "matrix.json").read_text())
    data.pop("bench_store", None)
    if top is not None:
        data["bench_store"] = top
    for name, value in per_backend.items():
        data["backends"][name]["bench_store"] = value
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(data))
    return path


def test_the_real_matrix_names_the_lasting_store_of_every_backend():
    m = matrix.load(ROOT / "ci" / "matrix.json")
    for name, b in m.backends.items():
        assert b.bench_store == f"~/.local/share/kiln/bench/{name}.sqlite"


def test_matrix_bench_store_top_level_with_backend_and_a_backends_own(tmp_path):
    m = matrix.load(_matrix_with(tmp_path, "/srv/kiln/{backend}/bench.sqlite", rocm="~/rocm-bench.sqlite"))
    assert m.backend("cuda").bench_store == "/srv/kiln/cuda/bench.sqlite"
    assert m.backend("rocm").bench_store == "~/rocm-bench.sqlite"
    assert matrix.load(_matrix_with(tmp_path)).backend("cuda").bench_store is None


@pytest.mark.parametrize(
    "top, own, message",
    [
        ("results/{backend}.sqlite", None, r"\.bench_store: must be an absolute path or start with ~"),
        (None, "bench.sqlite", r"backends\.cuda\.bench_store: must be an absolute path or start with ~"),
        (None, "", r"backends\.cuda\.bench_store: must be an absolute path"),
        (7, None, r"bench_store: expected str"),
    ],
)
def test_matrix_bench_store_must_be_a_path_on_the_runner(tmp_path, top, own, message):
    path = _matrix_with(tmp_path, top, **({"cuda": own} if own is not None else {}))
    with pytest.raises(MatrixError, match=message):
        matrix.load(path)


def test_lasting_path_precedence_environment_then_matrix_then_default(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_BENCH_STORE", raising=False)
    monkeypatch.setenv(
        "KILN_MATRIX",
        str(_matrix_with(tmp_path, str(tmp_path / "m" / "{backend}.db"), rocm="~/own-rocm.sqlite")),
    )
    assert lasting_path("cuda") == tmp_path / "m" / "cuda.db"
    assert lasting_path("rocm") == Path.home() / "own-rocm.sqlite"
    monkeypatch.setenv("KILN_BENCH_STORE", str(tmp_path / "env" / "{backend}.sqlite"))
    assert lasting_path("rocm") == tmp_path / "env" / "rocm.sqlite"  # the variable wins over the matrix
    monkeypatch.delenv("KILN_BENCH_STORE")
    monkeypatch.setenv("KILN_MATRIX", str(_matrix_with(tmp_path)))
    assert lasting_path("cuda") == Path.home() / ".local" / "share" / "kiln" / "bench" / "cuda.sqlite"
    with pytest.raises(UsageError, match="unknown backend 'tpu'"):
        lasting_path("tpu")


def test_a_matrix_bench_store_inside_the_checkout_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_BENCH_STORE", raising=False)
    monkeypatch.setenv("KILN_MATRIX", str(_matrix_with(tmp_path, str(ROOT / "results" / "{backend}.sqlite"))))
    with pytest.raises(UsageError, match=r"\(the bench_store of cuda in .*\) lies inside the checkout"):
        lasting_path("cuda")


def test_missing_store_starts_fresh_for_writers_and_reads_empty_without_creating(tmp_path):
    path = tmp_path / "runner" / "cuda.sqlite"
    notes, log = _notes()
    with open_lasting(path, write=False, log=log) as store:
        assert store.runs() == []
    assert not path.exists() and "no lasting bench store" in notes[0] and "nothing recorded" in notes[0]
    with open_lasting(path, write=True, log=log) as store:
        store_run(store, make_results({("w1", "eager"): 1000.0}))
    assert "starting a fresh one" in notes[1]
    with open_lasting(path, write=False, log=log) as store:
        assert len(store.runs(complete_only=True)) == 1
    assert len(notes) == 2  # a usable store says nothing


def _truncate_pages(path: Path) -> None:
    """Damage a real store inside SQLite's format: pages past the first are cut short."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode = DELETE")
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\xff" * (size - 4096))


def _legacy_v0(path: Path) -> None:
    """A store without the version table whose meta claims schema v0 (never written by any kiln code)."""
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE alembic_version_bench")
        db.execute("UPDATE meta SET value = '0'")


def _sql(statement: str):
    def damage(path: Path) -> None:
        with sqlite3.connect(path) as db:
            db.execute(statement)

    return damage


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: p.write_bytes(b"not a database at all " * 200), "not an SQLite database"),
        (_truncate_pages, r"integrity_check|SQLite cannot read it"),
        (_sql("DROP TABLE samples"), "no `samples` table"),
        (_sql("ALTER TABLE runs DROP COLUMN label"), "`runs` table lacks label: wrong schema"),
        (_sql("DROP TABLE alembic_version_bench"), None),
        (_legacy_v0, "schema v0, which no kiln code wrote"),
    ],
    ids=["not-sqlite", "integrity", "missing-table", "missing-column", "legacy-v1", "legacy-v0"],
)
def test_corrupt_store_is_reported_and_moved_aside_then_a_fresh_one_starts(tmp_path, damage, why):
    path = tmp_path / "cuda.sqlite"
    _lasting_with_runs(path, 2)
    damage(path)
    before = path.read_bytes()
    if why is None:  # a store from before the version table with schema_version 1 is a usable revision 1
        assert store_problem(path) is None
        with open_lasting(path, write=True, log=lambda _: None) as store:
            assert len(store.runs()) == 2
        return
    kind, detail = store_problem(path)
    assert kind == "corrupt" and re.search(why, detail), detail
    notes, log = _notes()
    with open_lasting(path, write=True, log=log) as store:
        assert store.runs() == []
        store_run(store, make_results({("w1", "eager"): 1000.0}))
    (aside,) = [p for p in tmp_path.glob("cuda.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert aside.read_bytes() == before  # kept as it was, never overwritten
    assert notes[0].startswith(f"error: lasting bench store {path} is corrupt") and str(aside) in notes[0]
    assert notes[0].endswith("starting a fresh store")
    assert store_problem(path) is None


def test_a_sqlite_file_of_something_else_is_not_a_bench_store(tmp_path):
    path = tmp_path / "other.sqlite"
    _sql("CREATE TABLE other (x)")(path)
    assert store_problem(path) == ("corrupt", "it has no `meta` table: not a kiln bench store")
    path.write_bytes(b"")
    assert store_problem(path) is None  # an empty file is an empty database


def test_a_reader_never_moves_a_corrupt_store_and_creates_nothing(tmp_path):
    path = tmp_path / "cuda.sqlite"
    path.write_text("garbage")
    notes, log = _notes()
    with open_lasting(path, write=False, log=log) as store:
        assert store.runs() == []
    assert path.read_text() == "garbage" and not list(tmp_path.glob("cuda.sqlite.corrupt-*"))
    assert "left as it is" in notes[0] and "nothing recorded to compare with" in notes[0]


def test_a_newer_schema_is_refused_by_writers_and_never_moved(tmp_path):
    path = tmp_path / "cuda.sqlite"
    _lasting_with_runs(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    before = path.read_bytes()
    for write in (True, False):
        with pytest.raises(StoreError, match="schema v999.*update the checkout.*nothing was moved"):
            with open_lasting(path, write=write, log=lambda _: None):
                pass
    assert path.read_bytes() == before and not list(tmp_path.glob("*.corrupt-*"))


def test_set_aside_never_overwrites_and_takes_the_wal_along(tmp_path):
    path = tmp_path / "s.sqlite"
    firsts = []
    for k in range(2):
        path.write_text(f"copy {k}")
        path.with_name("s.sqlite-wal").write_text(f"wal {k}")
        firsts.append(set_aside(path))
    assert firsts[0] != firsts[1] and [p.read_text() for p in firsts] == ["copy 0", "copy 1"]
    assert firsts[1].with_name(firsts[1].name + "-wal").read_text() == "wal 1"


def test_the_lock_waits_says_so_and_gives_up_with_a_clear_error(tmp_path):
    path = tmp_path / "cuda.sqlite"
    notes, log = _notes()
    with StoreLock(path, exclusive=True, log=log):
        with pytest.raises(
            StoreError, match=r"gave up after 0.3 s waiting for the lock .*held by pid \d+ on"
        ) as e:
            with StoreLock(path, exclusive=True, timeout_s=0.3, log=log):
                pass
        assert e.value.exit_code == 3  # infrastructure: the runner is busy, the command is fine
        with pytest.raises(StoreError, match="another bench job is using this store"):
            with StoreLock(path, exclusive=False, timeout_s=0.2, log=log):
                pass
    assert notes[0].startswith(f"note: waiting for the lock on {path}.lock (held by pid")
    with StoreLock(path, exclusive=False, log=log), StoreLock(path, exclusive=False, timeout_s=0.2, log=log):
        pass  # readers share it


def test_a_second_writer_waits_for_the_first_and_then_writes(tmp_path):
    path = tmp_path / "cuda.sqlite"
    _lasting_with_runs(path)
    notes, log = _notes()
    order = []

    def second() -> None:
        with open_lasting(path, write=True, log=log) as store:
            order.append("second")
            store_run(store, make_results({("w2", "eager"): 1000.0}))

    with open_lasting(path, write=True, log=lambda _: None) as store:
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.6)
        order.append("first")
        store_run(store, make_results({("w1", "eager"): 1000.0}))
    t.join(10)
    assert order == ["first", "second"] and any("waiting for the lock" in n for n in notes)
    with open_lasting(path, write=False, log=log) as store:
        assert len(store.runs(complete_only=True)) == 3


def _bench(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_lasting_export_by_baseline_import_and_summary(tmp_path):
    import json
    import os

    path = tmp_path / "runner" / "cpu.sqlite"
    uids = _lasting_with_runs(path, 2)
    summary = tmp_path / "summary.md"
    env = {
        **os.environ,
        "KILN_BENCH_STORE": str(tmp_path / "runner" / "{backend}.sqlite"),
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    out = _bench("export", str(tmp_path / "base.json"), "--lasting", "cpu", "--baseline", "ref:main", env=env)
    assert out.returncode == 0, out.stderr
    assert [r["uid"] for r in json.loads((tmp_path / "base.json").read_text())["runs"]] == [uids[-1]]
    out = _bench(
        "export", str(tmp_path / "none.json"), "--lasting", "cpu", "--baseline", "ref:nope?", env=env
    )
    assert out.returncode == 0 and "no baseline to export" in out.stderr
    assert json.loads((tmp_path / "none.json").read_text())["runs"] == []
    out = _bench("export", str(tmp_path / "x.json"), "--lasting", "cpu", "--baseline", "ref:nope", env=env)
    assert out.returncode == 2 and "error: no complete run of git ref 'nope'" in out.stderr
    out = _bench("export", str(tmp_path / "last.json"), "--lasting", "cpu", "--runs", "latest", env=env)
    assert [r["uid"] for r in json.loads((tmp_path / "last.json").read_text())["runs"]] == [uids[-1]]
    out = _bench("import", str(tmp_path / "base.json"), "--db", str(tmp_path / "job.sqlite"), env=env)
    assert "1 run(s) added" in out.stdout
    out = _bench("list", "--lasting", "cpu", "--db", str(tmp_path / "job.sqlite"), env=env)
    assert out.returncode == 2 and "not both" in out.stderr
    (tmp_path / "last.md").write_text("## kiln bench: run 7\n")
    out = _bench("summary", str(tmp_path / "last.md"), str(tmp_path / "gone.md"), env=env)
    assert out.returncode == 0
    text = summary.read_text()
    assert "## kiln bench: run 7" in text and "no report" in text and "gone.md" in text
