"""The bench store: runs, results, every sample and the compared verdicts, in SQLite or on a PostgreSQL server
through harness.store (SQLAlchemy Core + Alembic; the schema is harness/store/tables.py, its revisions are
harness/store/migrations/bench; a store URL: harness/store/url.py).

Safety:
- WAL journal + a busy timeout + `BEGIN IMMEDIATE` write transactions: two processes may write at once; one
  waits for the other instead of failing.
- A run row is inserted as `running` and becomes `complete` only in `finish_run`, after its last result;
  each result is committed on its own, so a killed run keeps what it wrote but is never `complete`, and
  baselines are chosen among complete runs only.
- Opening for writing migrates an older store to the head revision after copying it to
  `STORE.bak-<UTC time>-rev<N>` (a note says so); `readonly=True` opens it `mode=ro`, reads an older
  revision as it is and never changes the file; a store newer than this code is a StoreError for both.
- JSON export/import carries runs by their `uid`, so importing the same file twice, or files from several
  runners, merges without duplicates.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, insert, inspect, select, update
from sqlalchemy.exc import SQLAlchemyError

from harness.bench.core.records import SCHEMA_VERSION, Comparison, Result, RunInfo
from harness.exc import ImportFormatError, StoreError, StoreUnavailable, StoreUnreachable
from harness.results import set_aside
from harness.store import BENCH, open_store, runner, spool, unreadable_problem, url
from harness.store import tables as t
from harness.store.migrate import newer_problem, read_state
from harness.store.sqlite import open_engine, transaction
from harness.store.url import ServerURL

EXPORT_FORMAT = "kiln-bench-export"
VERDICTS_REVISION = 2  # the first revision with the `verdicts` table

_RUN_COLS = tuple(c.name for c in t.runs.columns)
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


def _chunks(items: list[int], n: int) -> Iterator[list[int]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def now() -> str:
    """UTC timestamp, ISO 8601, second precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class Store:
    """An open bench store (see module docstring). Use as a context manager or call `close()`.

    `path`: a SQLite file, `:memory:`, or a store URL (harness/store/url.py: `sqlite:///PATH`,
    `postgresql://...`). `revision` is the store's schema revision (the head for writers; readers may find an
    older one). A reader (`readonly=True`) of a missing or empty file, or of a server database without the
    bench's tables, reads an empty store and creates nothing. A writer whose server is unreachable, at open or
    later mid-run, spools (harness/store/spool.py: one note line; `strict` raises StoreUnreachable instead,
    exit 3); one that reaches it first pushes what an earlier run spooled."""

    def __init__(
        self,
        path: Path | str | ServerURL,
        timeout_s: float = 120.0,
        *,
        readonly: bool = False,
        log: Callable[[str], None] | None = None,
        strict: bool | None = None,
    ):
        self.log = log
        self.strict = spool.strict(strict)
        self.spooled: Path | None = None  # the spool this writer fell back to, if it did
        self._journal: dict[int, dict[str, Any]] = {}  # run id -> what this writer wrote of it (failover)
        self._ids: dict[int, int] = {}  # server run id -> spool run id, after a failover
        where = path if str(path) == ":memory:" else url.parse(path)
        self.server = where if isinstance(where, ServerURL) else None
        if self.server is not None:
            self.path: Any = self.server
            self.readonly = readonly
            self._open_server(readonly)
            return
        self.path = Path(str(where))
        self.readonly = readonly and str(path) != ":memory:"
        missing = not self.path.exists() or (self.path.is_file() and not self.path.stat().st_size)
        if self.readonly and missing:
            where = ":memory:"  # a reader of a missing or empty store reads no runs and creates nothing
        memory = str(where) == ":memory:"
        self._use(open_store(where, BENCH, write=not self.readonly or memory, timeout_s=timeout_s, say=log))

    def _use(self, opened: Any) -> None:
        self.engine, self.conn, self.revision = opened.engine, opened.conn, opened.revision
        self._opened = opened
        have = {c["name"] for c in inspect(self.conn).get_columns("runs")} if opened.revision else set()
        self._run_cols = tuple(c for c in _RUN_COLS if c in have) or _RUN_COLS
        if self.conn.in_transaction():
            self.conn.commit()

    def _open_server(self, readonly: bool) -> None:
        assert self.server is not None
        say = self.log or _say
        try:
            opened = open_store(self.server, BENCH, write=not readonly, say=say)
        except StoreUnreachable as e:
            if readonly or self.strict:
                raise
            self._spool(e)
            return
        if readonly and opened.revision == 0:  # no bench tables on the server yet: an empty store
            opened.close()
            opened = open_store(":memory:", BENCH, write=True)
        self._use(opened)
        if not readonly:
            try:
                spool.drain(self.server, say)
            except StoreUnreachable as e:
                say(f"note: spooled runs not pushed ({e}); the next run tries again")

    def _spool(self, e: Exception) -> None:
        """Go on in the local spool (see the class docstring): the runs this writer began are written there again
        under their uids, with what it wrote of them."""
        where = spool.path()
        (self.log or _say)(spool.spooling_line(e, where))
        self.spooled = where
        old = getattr(self, "_opened", None)
        if old is not None:
            try:
                old.close()
            except Exception:  # noqa: BLE001 - the server is gone; its connection may not close cleanly
                pass
        self._use(open_store(where, BENCH, write=True, say=self.log))
        for old_id, j in list(self._journal.items()):
            run = RunInfo(**{**j["run"].as_dict(), "id": None, "status": "running"})
            with self.transaction() as db:
                new_id = self._insert_run(db, run)
                for res in j["results"].values():
                    self._insert_result(db, new_id, res)
                if j.get("verdicts") is not None:
                    self._insert_verdicts(db, new_id, j["verdicts"])
            self._ids[old_id] = new_id

    def _rid(self, run_id: int) -> int:
        return self._ids.get(run_id, run_id)

    def _write(self, fn: Callable[[], Any]) -> Any:
        """Run the write `fn`; a server that went away mid-run sends this writer to the spool and `fn` runs
        again there (unless strict)."""
        try:
            return fn()
        except StoreUnreachable as e:
            if self.server is None or self.spooled is not None or self.strict:
                raise
            self._spool(e)
            return fn()

    def close(self) -> None:
        self._opened.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction that takes the write lock up front (waits up to the busy timeout)."""
        if self.readonly:
            raise StoreError(f"bench store {self.path} is open read-only: nothing can be written to it")
        with transaction(self.conn, write=True, error=StoreError, what=f"bench store {self.path}") as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A read transaction (or the write transaction already open)."""
        if self.conn.in_transaction():
            yield self.conn
            return
        with self.conn.begin():
            yield self.conn

    # ------------------------------------------------------------ runs
    def begin_run(self, run: RunInfo) -> int:
        """Insert `run` as `running` with this runner's identity (harness/store/runner.py) where it names none;
        sets and returns its id."""
        run.uid = run.uid or uuid.uuid4().hex
        run.status = "running"
        if not run.runner:
            for k, v in runner.current(run.device_name).as_dict().items():
                setattr(run, k, v)

        def write() -> int:
            with self.transaction() as db:
                return self._insert_run(db, run)

        run.id = self._write(write)
        self._journal[run.id] = {"run": run, "results": {}, "verdicts": None}
        return run.id

    def _insert_run(self, db: Connection, run: RunInfo) -> int:
        vals = run.as_dict()
        vals["compilers"] = json.dumps(run.compilers)
        vals["config"] = json.dumps(run.config, sort_keys=True)
        vals["env"] = json.dumps(run.env, sort_keys=True)
        row = {c: vals[c] for c in self._run_cols if c != "id"}
        key = db.execute(insert(t.runs).values(**row)).inserted_primary_key
        assert key is not None
        return int(key[0])

    def set_ceiling(self, run_id: int, gbps: float | None) -> None:
        if run_id in self._journal:
            self._journal[run_id]["run"].ceiling_gbps = gbps

        def write() -> None:
            with self.transaction() as db:
                db.execute(update(t.runs).where(t.runs.c.id == self._rid(run_id)).values(ceiling_gbps=gbps))

        self._write(write)

    def finish_run(self, run_id: int, status: str = "complete") -> None:
        """Mark the run `complete` (or `aborted`): the last write of a run."""

        def write() -> None:
            with self.transaction() as db:
                db.execute(
                    update(t.runs)
                    .where(t.runs.c.id == self._rid(run_id))
                    .values(status=status, finished_at=now())
                )

        self._write(write)
        self._journal.pop(run_id, None)

    @staticmethod
    def _run_from_row(row: Mapping[Any, Any]) -> RunInfo:
        d = {c: row[c] for c in _RUN_COLS if c in row}
        d["compilers"] = json.loads(d["compilers"] or "[]")
        d["config"] = json.loads(d["config"] or "{}")
        d["env"] = json.loads(d["env"] or "{}")
        return RunInfo(**d)

    def _runs_select(self) -> Any:
        return select(*(t.runs.c[c] for c in self._run_cols))

    def run(self, run_id: int) -> RunInfo:
        with self._read() as db:
            row = db.execute(self._runs_select().where(t.runs.c.id == self._rid(run_id))).mappings().first()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.path}")
        out = self._run_from_row(row)
        out.id = run_id
        return out

    def runs(
        self,
        *,
        complete_only: bool = False,
        limit: int | None = None,
        runner: str | None = None,
        hw_class: str | None = None,
    ) -> list[RunInfo]:
        """Runs, newest first (of one runner or hardware class, when given)."""
        q = self._runs_select().order_by(t.runs.c.id.desc())
        if complete_only:
            q = q.where(t.runs.c.status == "complete")
        for col, want in (("runner", runner), ("hw_class", hw_class)):
            if want:
                if col not in self._run_cols:
                    return []  # a store of a revision before runners: no run names one
                q = q.where(t.runs.c[col] == want)
        if limit:
            q = q.limit(int(limit))
        with self._read() as db:
            return [self._run_from_row(r) for r in db.execute(q).mappings()]

    # ------------------------------------------------------------ results
    def add_result(self, run_id: int, res: Result) -> None:
        """Insert (or replace) one result with its samples, in one transaction."""
        if run_id in self._journal:
            self._journal[run_id]["results"][(res.workload, res.compiler, res.phase)] = res

        def write() -> None:
            with self.transaction() as db:
                self._insert_result(db, self._rid(run_id), res)

        self._write(write)

    def _insert_result(self, db: Connection, run_id: int, res: Result) -> None:
        x = t.results.c
        db.execute(
            delete(t.results).where(
                x.run_id == run_id,
                x.workload == res.workload,
                x.compiler == res.compiler,
                x.phase == res.phase,
            )
        )
        row = {c: getattr(res, c) for c in _RESULT_COLS}
        row.update(
            run_id=run_id,
            median_ns=res.median_ns,
            n=len(res.samples),
            meta=json.dumps(res.meta.as_dict(), sort_keys=True),
        )
        key = db.execute(insert(t.results).values(**row)).inserted_primary_key
        assert key is not None
        rid = key[0]
        if res.samples:  # executemany: psycopg pipelines it (faster than a multi-row INSERT, compiled anew)
            db.execute(
                insert(t.samples),
                [{"result_id": rid, "seq": i, "ns": float(v)} for i, v in enumerate(res.samples)],
            )

    def results(self, run_id: int, phase: str | None = "main") -> list[Result]:
        """Results of a run in insertion order (one phase, or all when `phase` is None)."""
        return self.results_of([run_id], phase)[run_id]

    def results_of(self, run_ids: Sequence[int], phase: str | None = "main") -> dict[int, list[Result]]:
        """results() of many runs in a few queries (a server's round trips add up over a thousand runs)."""
        ids = {self._rid(i): i for i in run_ids}
        rows: list[Any] = []
        by_result: dict[int, list[float]] = {}
        with self._read() as db:
            for chunk in _chunks(list(ids), 500):
                q = select(t.results).where(t.results.c.run_id.in_(chunk)).order_by(t.results.c.id)
                if phase:
                    q = q.where(t.results.c.phase == phase)
                got = db.execute(q).mappings().all()
                rows += got
                by_result.update({r["id"]: [] for r in got})
            for chunk in _chunks(list(by_result), 500):
                sq = (
                    select(t.samples.c.result_id, t.samples.c.ns)
                    .where(t.samples.c.result_id.in_(chunk))
                    .order_by(t.samples.c.result_id, t.samples.c.seq)
                )
                for rid, ns in db.execute(sq).all():  # fetchall: a thousand runs' samples are a million rows
                    by_result[rid].append(ns)
        out: dict[int, list[Result]] = {i: [] for i in run_ids}
        for row in rows:
            d: dict[str, Any] = {c: row[c] for c in _RESULT_COLS}
            d["meta"] = json.loads(row["meta"] or "{}")
            d["samples"] = by_result[row["id"]]
            out[ids[row["run_id"]]].append(Result(**d))
        return out

    def history(self, workload: str, compiler: str, limit: int = 50) -> list[tuple[RunInfo, float | None]]:
        """(run, median_ns) of complete runs for one workload+compiler, oldest first."""
        x, r = t.results.c, t.runs.c
        q = (
            select(*(t.runs.c[c] for c in self._run_cols), x.median_ns.label("m"))
            .join(t.results, x.run_id == r.id)
            .where(x.workload == workload, x.compiler == compiler, x.phase == "main", r.status == "complete")
            .order_by(r.id.desc())
            .limit(limit)
        )
        with self._read() as db:
            rows = db.execute(q).mappings().all()
        return [(self._run_from_row(row), row["m"]) for row in reversed(rows)]

    # ------------------------------------------------------------ verdicts (revision 2)
    def save_verdicts(self, run_id: int, verdicts: Sequence[Comparison]) -> None:
        """Store `verdicts` as the compared verdicts of run `run_id`, replacing any it had, in one
        transaction (each as `Comparison.stored()`: the verdict's string value, the whole record in `detail`)."""
        if run_id in self._journal:
            self._journal[run_id]["verdicts"] = list(verdicts)

        def write() -> None:
            with self.transaction() as db:
                self._insert_verdicts(db, self._rid(run_id), verdicts)

        self._write(write)

    def _insert_verdicts(self, db: Connection, run_id: int, verdicts: Sequence[Comparison]) -> None:
        if db.execute(select(t.runs.c.id).where(t.runs.c.id == run_id)).first() is None:
            raise StoreError(f"no run {run_id} in {self.path}: its verdicts cannot be stored")
        db.execute(delete(t.verdicts).where(t.verdicts.c.run_id == run_id))
        if verdicts:
            rows = [v.stored() for v in verdicts]
            db.execute(
                insert(t.verdicts),
                [
                    {
                        **row,
                        "run_id": run_id,
                        "confirmed": None if row["confirmed"] is None else int(bool(row["confirmed"])),
                        "detail": json.dumps(row["detail"], sort_keys=True, default=str),
                    }
                    for row in rows
                ],
            )

    def verdicts_of(self, run_ids: Sequence[int]) -> dict[int, list[Comparison] | None]:
        """verdicts() of many runs in a few queries."""
        out: dict[int, list[Comparison] | None] = {i: None for i in run_ids}
        if self.revision < VERDICTS_REVISION:
            return out
        ids = {self._rid(i): i for i in run_ids}
        v = t.verdicts.c
        with self._read() as db:
            for chunk in _chunks(list(ids), 500):
                for row in db.execute(
                    select(t.verdicts).where(v.run_id.in_(chunk)).order_by(v.id)
                ).mappings():
                    got = out[ids[row["run_id"]]]
                    if got is None:
                        got = out[ids[row["run_id"]]] = []
                    got.append(Comparison.from_dict({**row, "detail": json.loads(row["detail"] or "{}")}))
        return out

    def verdicts(self, run_id: int) -> list[Comparison] | None:
        """The compared verdicts stored with run `run_id`, in the order saved; None when it stored none (or
        the store is of a revision before verdicts, read as it is)."""
        if self.revision < VERDICTS_REVISION:
            return None
        v = t.verdicts.c
        with self._read() as db:
            q = select(t.verdicts).where(v.run_id == self._rid(run_id)).order_by(v.id)
            rows = db.execute(q).mappings().all()
        if not rows:
            return None
        return [Comparison.from_dict({**row, "detail": json.loads(row["detail"] or "{}")}) for row in rows]

    # ------------------------------------------------------------ export / import
    def export(self, run_ids: list[int] | None = None) -> dict[str, Any]:
        """A JSON-able dict with the given runs (all when None), their results with every sample, and their
        stored verdicts (`verdicts`: a list, or null when the run stored none)."""
        runs = [self.run(i) for i in run_ids] if run_ids else list(reversed(self.runs()))
        out = []
        for r in runs:
            stored = self.verdicts(r.rid)
            out.append(
                {
                    **r.as_dict(),
                    "results": [x.as_dict() for x in self.results(r.rid, phase=None)],
                    "verdicts": [v.stored() for v in stored] if stored is not None else None,
                }
            )
        return {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "exported_at": now(), "runs": out}

    def import_(self, data: dict[str, Any]) -> tuple[int, int]:
        """Merge an export (of this schema version or an older one) into this store; returns (runs added,
        runs already present by uid)."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ImportFormatError('not a kiln bench export (missing "format": "kiln-bench-export")')
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
            raise ImportFormatError(f"export has schema v{version}; this code reads v1 to v{SCHEMA_VERSION}")
        added = skipped = 0
        for rd in data.get("runs", []):
            try:
                run = RunInfo(**{k: rd[k] for k in RunInfo.__dataclass_fields__ if k in rd})
                results = [Result.from_dict(x) for x in rd.get("results", [])]
                verdicts = [Comparison.from_dict(v) for v in rd.get("verdicts") or []]
            except (TypeError, KeyError, AttributeError) as e:
                raise ImportFormatError(f"malformed run in export: {e}") from None
            with self.transaction() as db:
                if db.execute(select(t.runs.c.id).where(t.runs.c.uid == run.uid)).first():
                    skipped += 1
                    continue
                run.id = None
                rid = self._insert_run(db, run)
                for res in results:
                    self._insert_result(db, rid, res)
                if verdicts:
                    self._insert_verdicts(db, rid, verdicts)
                added += 1
        return added, skipped


# ------------------------------------------------------------ the lasting store of the CI bench jobs
# A store on the runner, outside the checkout (a fresh checkout would wipe it): the bench jobs of the workflows
# record main's runs into it and compare pull requests with them. Its path is KILN_BENCH_STORE (`{backend}`
# replaced), else the backend's `bench_store` in ci/matrix.json, else ~/.local/share/kiln/bench/<backend>.sqlite.
# An OS file lock (`<store>.lock`) is held while it is in use: exclusive for writers, shared for readers. A
# missing store starts fresh (writers) or reads as empty (readers), with a note. An older revision is migrated
# by a writer (after a backup copy) and read as it is by a reader. A corrupt one (not SQLite, failing
# `PRAGMA integrity_check`, bench tables missing or lacking columns) is moved aside by a writer to
# `<store>.corrupt-<UTC time>` with an error line, never overwritten; a reader reports it and leaves it be.
# A newer store than this code is refused (StoreError) for both and never moved.

LOCK_TIMEOUT_S = 1200.0


def _say(msg: str) -> None:
    """A note or error line on stderr, also in the GitHub job summary when there is one."""
    import sys

    from harness.results import append_job_summary

    print(msg, file=sys.stderr, flush=True)
    append_job_summary(f"> {msg}")


def default_path() -> Path:
    """The bench store every session and verb agree on: $KILN_BENCH_DB, else results/bench/<backend>/bench.sqlite
    (relative to the folder the command runs in, the checkout for nox sessions) for the backend this machine
    runs (`python -m harness detect`: the first GPU backend whose devices exist, else cpu). `nox -s ci`, `nox -s
    bench` and `bench backend` write it; `bench list`, `show`, `history`, `plot`... read it."""
    from harness import matrix
    from harness.exc import HarnessError
    from harness.settings import bench_settings

    db = bench_settings().db
    if db is not None:
        return db
    try:
        backend = matrix.detect_backend()
    except HarnessError:  # no readable matrix (a scratch folder): the CPU's store
        backend = "cpu"
    return Path("results") / "bench" / backend / "bench.sqlite"


def missing_store(path: Path | ServerURL) -> StoreError:
    """The one-line error of a reader given a store that is not there, naming the stores that are."""
    found = (
        sorted(str(p) for p in Path("results").glob("bench/**/bench.sqlite"))[:5]
        if Path("results").is_dir()
        else []
    )
    there = f"; stores here: {', '.join(found)}" if found else ""
    return StoreError(
        f"no bench store at {path} (give --db, or record runs: `nox -s bench`, `nox -s ci`, `bench run`)"
        f"{there}"
    )


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

    def __init__(
        self,
        store_path: Path,
        *,
        exclusive: bool,
        timeout_s: float = LOCK_TIMEOUT_S,
        log: Callable[[str], None] | None = None,
    ):
        self.path = store_path.with_name(store_path.name + ".lock")
        self.exclusive, self.timeout_s, self.log = exclusive, timeout_s, log or _say
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        return f"held by {text}" if text else "held by a reader, or a writer that left no note"

    def __enter__(self) -> StoreLock:
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
                    raise StoreUnavailable(  # exit 3: the runner, not the command, is at fault
                        f"gave up after {self.timeout_s:g} s waiting for the lock on {self.path} ({holder}): "
                        "another bench job is using this store; run again when it is done"
                    ) from None
                if not waited:
                    self.log(
                        f"note: waiting for the lock on {self.path} ({self.holder()}; "
                        f"up to {self.timeout_s:g} s)"
                    )
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
    """Why the file at `path` is no usable bench store: ("corrupt", why) for an unreadable or broken one,
    ("newer", why) for a store of a newer revision than this code knows, or None when it is usable (an older
    revision included: a writer migrates it; an empty file counts as usable: SQLite starts it). Reads only."""
    why = unreadable_problem(Path(path), BENCH)
    if why is not None:
        return "corrupt", why
    if not Path(path).stat().st_size:
        return None
    engine = open_engine(path, write=False)
    try:
        with engine.connect() as conn, conn.begin():
            state = read_state(conn, BENCH)
    except SQLAlchemyError as e:
        return "corrupt", f"SQLite cannot read it ({str(e).splitlines()[0]})"
    finally:
        engine.dispose()
    newer = newer_problem(BENCH, path, state)
    return ("newer", newer) if newer else None


@contextmanager
def open_lasting(
    path: Path,
    *,
    write: bool,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
    log: Callable[[str], None] | None = None,
) -> Iterator[Store]:
    """The lasting store at `path`, locked while the block runs (see above). Writers get it created when
    missing, migrated when older (after a backup copy) and a fresh one after a corrupt one is moved aside;
    readers open it read-only and get an empty in-memory store when it is missing or corrupt (a pull request
    never creates, moves or migrates the store). A store of a newer revision is a StoreError for both; nothing
    is moved."""
    say = log or _say
    path = Path(path)
    if path.is_dir():
        raise StoreError(
            f"lasting store path {path} is a directory; give a file such as {path / 'bench.sqlite'}"
        )
    if not write and not path.exists():
        say(
            f"note: no lasting bench store at {path} yet (a recording run on main creates it): "
            "nothing recorded to compare with"
        )
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
                raise StoreError(f"lasting {why}")
            if write:
                aside = set_aside(path)
                say(
                    f"error: lasting bench store {path} is corrupt: {why}; moved aside to {aside}; "
                    "starting a fresh store"
                )
            else:
                say(
                    f"error: lasting bench store {path} is corrupt: {why}; left as it is (the next recording "
                    "run on main moves it aside); nothing recorded to compare with"
                )
                usable = False
        elif not write and path.stat().st_size == 0:
            usable = False
        with Store(path if usable else ":memory:", readonly=not write, log=say) as store:
            yield store


@contextmanager
def open_fleet(
    where: Path | ServerURL, *, write: bool, log: Callable[[str], None] | None = None
) -> Iterator[Store]:
    """The store KILN_STORE_URL names, for the CI bench jobs (`--lasting` with KILN_STORE_URL set): a file goes
    through open_lasting (locked, set aside when corrupt); a server is opened as it is, and a reader that
    cannot reach it reads an empty store with a note (a pull request's comparison is skipped, its verdict not
    failed) unless strict (StoreUnreachable, exit 3). A writer spools (Store)."""
    if isinstance(where, Path):
        with open_lasting(where, write=write, log=log) as store:
            yield store
        return
    say = log or _say
    try:
        store = Store(where, readonly=not write, log=say)
    except StoreUnreachable as e:
        if write or spool.strict():
            raise
        say(f"note: {e}: nothing recorded to compare with")
        store = Store(":memory:")
    with store:
        yield store
