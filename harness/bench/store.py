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
import os
import socket
import sqlite3
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from harness.exc import ImportFormatError, StoreError
from harness.results import set_aside

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

    # ==================== BEGIN verdicts (issue 21; stand-in, replaced at merge by the SQLAlchemy store's) ====
    # The verdicts a `bench run` gave, stored with the run: `save_verdicts` replaces a run's verdicts,
    # `verdicts` reads them back (None when the run stored none: an older run, or one never compared).
    _VERDICTS_SCHEMA = (
        "CREATE TABLE IF NOT EXISTS verdicts (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
        "workload TEXT NOT NULL, compiler TEXT NOT NULL, verdict TEXT NOT NULL, ratio REAL, p_value REAL, "
        "baseline TEXT, confirmed INTEGER, detail TEXT, UNIQUE (run_id, workload, compiler))"
    )

    def save_verdicts(self, run_id: int, verdicts: Sequence[StoredVerdict]) -> None:  # noqa: F821
        with self.transaction() as db:
            db.execute(self._VERDICTS_SCHEMA)
            db.execute("DELETE FROM verdicts WHERE run_id = ?", (run_id,))
            db.executemany(
                "INSERT INTO verdicts (run_id, workload, compiler, verdict, ratio, p_value, baseline, confirmed, "
                "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, v.workload, v.compiler, v.verdict, v.ratio, v.p_value, v.baseline,
                  None if v.confirmed is None else int(v.confirmed), json.dumps(v.detail, default=str))
                 for v in verdicts],
            )

    def verdicts(self, run_id: int) -> list[StoredVerdict] | None:  # noqa: F821
        from .records import StoredVerdict

        has = self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'verdicts'").fetchone()
        rows = self.db.execute("SELECT * FROM verdicts WHERE run_id = ? ORDER BY rowid", (run_id,)).fetchall() \
            if has else []
        if not rows:
            return None
        return [StoredVerdict(r["workload"], r["compiler"], r["verdict"], r["ratio"], r["p_value"], r["baseline"],
                              None if r["confirmed"] is None else bool(r["confirmed"]),
                              json.loads(r["detail"] or "{}")) for r in rows]
    # ==================== END verdicts ============================================================================


# ------------------------------------------------------------ the lasting store of the CI bench jobs
# A store on the runner, outside the checkout (a fresh checkout would wipe it): the bench jobs of the workflows
# record main's runs into it and compare pull requests with them. Its path is KILN_BENCH_STORE (`{backend}`
# replaced), else the backend's `bench_store` in ci/matrix.json, else ~/.local/share/kiln/bench/<backend>.sqlite.
# An OS file lock (`<store>.lock`) is held while it is in use: exclusive for writers, shared for readers. A missing store starts fresh (writers) or reads as
# empty (readers), with a note; a corrupt one (not SQLite, failing `PRAGMA integrity_check`, no bench tables,
# an older schema) is moved aside to `<store>.corrupt-<UTC time>` with an error line, never overwritten.

LOCK_TIMEOUT_S = 1200.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
_REQUIRED_COLUMNS = {
    "meta": {"key", "value"},
    "runs": set(_RUN_COLS),
    "results": {"run_id", "median_ns", "n", "meta", *_RESULT_COLS},
    "samples": {"result_id", "seq", "ns"},
}


def _say(msg: str) -> None:
    """A note or error line on stderr, also in the GitHub job summary when there is one."""
    import sys

    from harness.results import append_job_summary

    print(msg, file=sys.stderr, flush=True)
    append_job_summary(f"> {msg}")


def lasting_path(backend: str) -> Path:
    """The lasting store of `backend`: $KILN_BENCH_STORE, else the matrix's `bench_store` of the backend, else
    ~/.local/share/kiln/bench/<backend>.sqlite (`{backend}` replaced); a UsageError when it lies inside the
    checkout or the backend is not in the matrix (without KILN_BENCH_STORE)."""
    from harness.exc import MatrixError, UsageError
    from harness.settings import DEFAULT_BENCH_STORE, bench_settings, settings

    env = bench_settings().store
    if env is not None:
        raw, source = str(env), "KILN_BENCH_STORE"
    else:
        from harness import matrix as matrix_mod

        try:
            m = matrix_mod.load()
            configured = m.backend(backend).bench_store
        except MatrixError as e:
            raise UsageError(str(e)) from None
        if configured:
            raw, source = configured, f"the bench_store of {backend} in {m.path}"
        else:
            raw, source = str(DEFAULT_BENCH_STORE), "the default"
    path = Path(raw.replace("{backend}", backend)).expanduser().absolute()
    root = settings().root.resolve()
    if path.resolve() == root or root in path.resolve().parents:
        raise UsageError(
            f"the lasting bench store {path} ({source}) lies inside the checkout {root}, which a fresh checkout "
            "wipes; set KILN_BENCH_STORE or the matrix's bench_store to a path outside it"
        )
    return path


class StoreLock:
    """An OS file lock (`flock`) on `<store>.lock`: exclusive for writers, shared for readers. Waiting is said
    once (with the holder a writer left in the lock file); giving up after `timeout_s` is a StoreError."""

    def __init__(self, store_path: Path, *, exclusive: bool, timeout_s: float = LOCK_TIMEOUT_S,
                 log: Callable[[str], None] | None = None):
        self.path = store_path.with_name(store_path.name + ".lock")
        self.exclusive, self.timeout_s, self.log = exclusive, timeout_s, log or _say
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        return f"held by {text}" if text else "held by a reader, or a writer that left no note"

    def __enter__(self) -> "StoreLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        mode = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline, waited = time.monotonic() + self.timeout_s, False
        while True:
            try:
                fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self.holder()
                    os.close(self.fd)
                    self.fd = None
                    raise StoreError(
                        f"gave up after {self.timeout_s:g} s waiting for the lock on {self.path} ({holder}): "
                        "another bench job is using this store; run again when it is done"
                    ) from None
                if not waited:
                    self.log(f"note: waiting for the lock on {self.path} ({self.holder()}; "
                             f"up to {self.timeout_s:g} s)")
                    waited = True
                time.sleep(0.2)
        if self.exclusive:
            note = f"pid {os.getpid()} on {socket.gethostname()} since {now()}\n".encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, note, 0)
        if waited:
            self.log(f"note: got the lock on {self.path}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            if self.exclusive:
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def store_problem(path: Path) -> tuple[str, str] | None:
    """Why the file at `path` is no usable bench store: ("corrupt", why), ("newer", why) for a store of a newer
    schema than this code reads, or None when it is usable (an empty file counts as usable: SQLite starts it)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as e:
        return "corrupt", f"cannot be read ({e.strerror})"
    if not head:
        return None
    if head != _SQLITE_MAGIC:
        return "corrupt", "it is not an SQLite database"
    try:
        db = sqlite3.connect(str(path), timeout=30)  # read-write: a read-only open fails on a leftover WAL
    except sqlite3.Error as e:
        return "corrupt", f"SQLite cannot open it ({e})"
    try:
        rows = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
        if rows != ["ok"]:
            return "corrupt", f"PRAGMA integrity_check says: {'; '.join(map(str, rows[:3]))}"
        for table, need in _REQUIRED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            if not have:
                return "corrupt", f"it has no `{table}` table: not a kiln bench store"
            if need - have:
                return "corrupt", f"its `{table}` table lacks {', '.join(sorted(need - have))}: wrong schema"
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row and str(row[0]).isdigit() else None
    except sqlite3.DatabaseError as e:
        return "corrupt", f"SQLite cannot read it ({e})"
    finally:
        db.close()
    if version is None:
        return "corrupt", "it records no schema version"
    if version > SCHEMA_VERSION:
        return "newer", f"it has schema v{version}; this code reads v{SCHEMA_VERSION} (update the checkout)"
    if version < SCHEMA_VERSION:
        return "corrupt", f"it has schema v{version} of older code; this code reads v{SCHEMA_VERSION}"
    return None


@contextmanager
def open_lasting(path: Path, *, write: bool, lock_timeout_s: float = LOCK_TIMEOUT_S,
                 log: Callable[[str], None] | None = None) -> Iterator[Store]:
    """The lasting store at `path`, locked while the block runs (see above). Writers get it created when missing
    and a fresh one after a corrupt one is moved aside; readers then get an empty in-memory store instead (a
    pull request never creates the store). A store of a newer schema is a StoreError for writers (nothing is
    moved) and reads as empty."""
    say = log or _say
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"lasting store path {path} is a directory; give a file such as {path / 'bench.sqlite'}")
    if not write and not path.exists():
        say(f"note: no lasting bench store at {path} yet (a recording run on main creates it): "
            "nothing recorded to compare with")
        with Store(":memory:") as empty:
            yield empty
        return
    with StoreLock(path, exclusive=write, timeout_s=lock_timeout_s, log=say):
        usable = True
        if not path.exists():
            say(f"note: no lasting bench store at {path}: starting a fresh one")
        elif (problem := store_problem(path)) is not None:
            kind, why = problem
            if kind == "newer":
                if write:
                    raise StoreError(f"lasting bench store {path}: {why}; nothing was moved or written")
                say(f"error: lasting bench store {path}: {why}; nothing recorded to compare with")
                usable = False
            else:
                aside = set_aside(path)
                say(f"error: lasting bench store {path} is corrupt: {why}; moved aside to {aside}"
                    + ("; starting a fresh store" if write else "; nothing recorded to compare with"))
                usable = write
        with Store(path if usable else ":memory:") as store:
            yield store
