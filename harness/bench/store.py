"""SQLite store of bench runs: one file, every sample, a schema version, safe for concurrent writers.

Safety:
- WAL journal + a busy timeout + `BEGIN IMMEDIATE` transactions: two processes may write at once; one
  waits for the other instead of failing.
- A run row is inserted as `running` and becomes `complete` only in `finish_run`, after its last result;
  each result is committed on its own, so a killed run keeps what it wrote but is never `complete`, and
  baselines are chosen among complete runs only.
- JSON export/import carries runs by their `uid`, so importing the same file twice, or files from several
  runners, merges without duplicates.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from harness.exc import ImportFormatError, StoreError

from .records import SCHEMA_VERSION, Result, RunInfo

EXPORT_FORMAT = "kiln-bench-export"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    profile TEXT, device TEXT, device_name TEXT, compilers TEXT,
    git_ref TEXT, git_commit TEXT, label TEXT, ceiling_gbps REAL,
    config TEXT, env TEXT
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    workload TEXT NOT NULL, compiler TEXT NOT NULL, phase TEXT NOT NULL,
    source_hash TEXT NOT NULL, status TEXT NOT NULL, error TEXT,
    median_ns REAL, n INTEGER, bytes INTEGER, flops INTEGER,
    max_abs_err REAL, max_rel_err REAL, compile_s REAL, timer TEXT, planted REAL, ceiling_gbps REAL,
    meta TEXT,
    UNIQUE (run_id, workload, compiler, phase)
);
CREATE TABLE IF NOT EXISTS samples (
    result_id INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    ns REAL NOT NULL,
    PRIMARY KEY (result_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS results_by_run ON results (run_id);
CREATE INDEX IF NOT EXISTS results_by_workload ON results (workload, compiler);
"""

_RUN_COLS = (
    "id",
    "uid",
    "created_at",
    "finished_at",
    "status",
    "profile",
    "device",
    "device_name",
    "compilers",
    "git_ref",
    "git_commit",
    "label",
    "ceiling_gbps",
    "config",
    "env",
)
_RESULT_COLS = (
    "workload",
    "compiler",
    "phase",
    "source_hash",
    "status",
    "error",
    "bytes",
    "flops",
    "max_abs_err",
    "max_rel_err",
    "compile_s",
    "timer",
    "planted",
    "ceiling_gbps",
)


def now() -> str:
    """UTC timestamp, ISO 8601, second precision."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class Store:
    """An open SQLite store (see module docstring). Use as a context manager or call `close()`."""

    def __init__(self, path: Path | str, timeout_s: float = 120.0):
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise StoreError(
                f"store path {self.path} is a directory; give a file such as {self.path / 'bench.sqlite'}"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open store {self.path}: {e}") from None
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            self._retry(lambda: self.db.execute("PRAGMA journal_mode = WAL"), timeout_s)
            self.db.execute("PRAGMA synchronous = NORMAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            with self.transaction() as db:
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(stmt)
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise StoreError(
                        f"store {self.path} has schema v{row[0]}; this code reads v{SCHEMA_VERSION}"
                    )
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise StoreError(f"cannot use store {self.path}: {e}") from None
        except StoreError:
            self.db.close()
            raise

    @staticmethod
    def _retry(fn, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (waits up to the busy timeout)."""
        self._retry(lambda: self.db.execute("BEGIN IMMEDIATE"), 120.0)
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    # ------------------------------------------------------------ runs
    def begin_run(self, run: RunInfo) -> int:
        """Insert `run` as `running`; sets and returns its id."""
        run.uid = run.uid or uuid.uuid4().hex
        run.status = "running"
        with self.transaction() as db:
            run.id = self._insert_run(db, run)
        return run.id

    def _insert_run(self, db: sqlite3.Connection, run: RunInfo) -> int:
        vals = run.as_dict()
        vals["compilers"] = json.dumps(run.compilers)
        vals["config"] = json.dumps(run.config, sort_keys=True)
        vals["env"] = json.dumps(run.env, sort_keys=True)
        cols = [c for c in _RUN_COLS if c != "id"]
        cur = db.execute(
            f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            [vals[c] for c in cols],
        )
        return int(cur.lastrowid)

    def set_ceiling(self, run_id: int, gbps: float | None) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET ceiling_gbps = ? WHERE id = ?", (gbps, run_id))

    def finish_run(self, run_id: int, status: str = "complete") -> None:
        """Mark the run `complete` (or `aborted`): the last write of a run."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?", (status, now(), run_id))

    def _run_from_row(self, row: sqlite3.Row) -> RunInfo:
        d = dict(row)
        d["compilers"] = json.loads(d["compilers"] or "[]")
        d["config"] = json.loads(d["config"] or "{}")
        d["env"] = json.loads(d["env"] or "{}")
        return RunInfo(**d)

    def run(self, run_id: int) -> RunInfo:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.path}")
        return self._run_from_row(row)

    def runs(self, *, complete_only: bool = False, limit: int | None = None) -> list[RunInfo]:
        """Runs, newest first."""
        sql = (
            "SELECT * FROM runs"
            + (" WHERE status = 'complete'" if complete_only else "")
            + " ORDER BY id DESC"
        )
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._run_from_row(r) for r in self.db.execute(sql)]

    # ------------------------------------------------------------ results
    def add_result(self, run_id: int, res: Result) -> None:
        """Insert (or replace) one result with its samples, in one transaction."""
        with self.transaction() as db:
            self._insert_result(db, run_id, res)

    def _insert_result(self, db: sqlite3.Connection, run_id: int, res: Result) -> None:
        db.execute(
            "DELETE FROM results WHERE run_id = ? AND workload = ? AND compiler = ? AND phase = ?",
            (run_id, res.workload, res.compiler, res.phase),
        )
        vals = [getattr(res, c) for c in _RESULT_COLS]
        cols = ("run_id",) + _RESULT_COLS + ("median_ns", "n", "meta")
        cur = db.execute(
            f"INSERT INTO results ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            [run_id, *vals, res.median_ns, len(res.samples), json.dumps(res.meta, sort_keys=True)],
        )
        rid = cur.lastrowid
        db.executemany(
            "INSERT INTO samples (result_id, seq, ns) VALUES (?, ?, ?)",
            [(rid, i, float(x)) for i, x in enumerate(res.samples)],
        )

    def results(self, run_id: int, phase: str | None = "main") -> list[Result]:
        """Results of a run in insertion order (one phase, or all when `phase` is None)."""
        sql = "SELECT * FROM results WHERE run_id = ?" + (" AND phase = ?" if phase else "") + " ORDER BY id"
        rows = self.db.execute(sql, (run_id, phase) if phase else (run_id,)).fetchall()
        out = []
        for row in rows:
            d = {c: row[c] for c in _RESULT_COLS}
            d["meta"] = json.loads(row["meta"] or "{}")
            d["samples"] = [
                r[0]
                for r in self.db.execute(
                    "SELECT ns FROM samples WHERE result_id = ? ORDER BY seq", (row["id"],)
                )
            ]
            out.append(Result(**d))
        return out

    def history(self, workload: str, compiler: str, limit: int = 50) -> list[tuple[RunInfo, float | None]]:
        """(run, median_ns) of complete runs for one workload+compiler, oldest first."""
        rows = self.db.execute(
            "SELECT r.*, x.median_ns AS m FROM results x JOIN runs r ON r.id = x.run_id "
            "WHERE x.workload = ? AND x.compiler = ? AND x.phase = 'main' AND r.status = 'complete' "
            "ORDER BY r.id DESC LIMIT ?",
            (workload, compiler, limit),
        ).fetchall()
        out = []
        for row in reversed(rows):
            d = {k: row[k] for k in _RUN_COLS}
            out.append((self._run_from_row(d), row["m"]))  # type: ignore[arg-type]
        return out

    # ------------------------------------------------------------ export / import
    def export(self, run_ids: list[int] | None = None) -> dict[str, Any]:
        """A JSON-able dict with the given runs (all when None), their results and every sample."""
        runs = [self.run(i) for i in run_ids] if run_ids else list(reversed(self.runs()))
        return {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "exported_at": now(),
            "runs": [
                {**r.as_dict(), "results": [x.as_dict() for x in self.results(r.id, phase=None)]}
                for r in runs
            ],
        }

    def import_(self, data: dict[str, Any]) -> tuple[int, int]:
        """Merge an export into this store; returns (runs added, runs already present by uid)."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ImportFormatError('not a kiln bench export (missing "format": "kiln-bench-export")')
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ImportFormatError(
                f"export has schema v{data.get('schema_version')}; this code reads v{SCHEMA_VERSION}"
            )
        added = skipped = 0
        for rd in data.get("runs", []):
            try:
                run = RunInfo(**{k: rd[k] for k in RunInfo.__dataclass_fields__ if k in rd})
                results = [Result.from_dict(x) for x in rd.get("results", [])]
            except (TypeError, KeyError) as e:
                raise ImportFormatError(f"malformed run in export: {e}") from None
            with self.transaction() as db:
                if db.execute("SELECT 1 FROM runs WHERE uid = ?", (run.uid,)).fetchone():
                    skipped += 1
                    continue
                run.id = None
                rid = self._insert_run(db, run)
                for res in results:
                    self._insert_result(db, rid, res)
                added += 1
        return added, skipped
