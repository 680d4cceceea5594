"""Test history: every recorded run's per-test outcomes and durations in one SQLite file, so a report can say
"failed 3 of the last 40 runs" and sharding can balance by recorded times.

Terms:
  store     a SQLite file (`--history DB`, else KILN_HISTORY_DB, else <results>/history.sqlite). Its tables are
            prefixed `history_` so the file may be the bench's store (results/bench.sqlite) as well:
              history_meta      key/value; `schema_version` (SCHEMA_VERSION)
              history_runs      id, date, git commit, backend, source (`run` or `flakes`), folder (unique)
              history_outcomes  run id, node id, outcome (passed/failed/error/skipped/xfailed), duration s
              history_retries   run id, node id, attempt (1..), outcome, duration s: the reruns alone of a
                                test that failed in the run (harness.retries), with the test's verdict
                                `status` (flaky: passed on a retry; failing: failed every attempt)
  recording a finished results folder: a `harness run` folder (run.json; merged shard runs too), read with
            harness.collect.load_run, or a `harness flakes` folder (flakes.json + pytest.xml), read with
            harness.results.parse_junit: one row per repetition of a test. A folder is recorded once.
  failure count  per test over the last N runs (newest dates first) that ran it: in how many at least one
            row failed or errored, and in how many of those it was flaky (a rerun alone passed).
  durations per test, the median over `run` sources of a backend (flake repetitions are left out: a test run
            N times in one process is no sample of its time in a suite).

A file that is not a readable SQLite database is moved aside (`DB.corrupt-<time>`, never over an existing
file) and a one-line HistoryError says so; the next write starts a new store. Readers that only want to add a
line to a report (`failure_counts_if_any`) never raise and never move anything.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from harness.exc import HarnessError, HistoryError
from harness.results import set_aside

SCHEMA_VERSION = 1
DEFAULT_LAST = 40
SOURCES = ("run", "flakes")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS history_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS history_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    date TEXT NOT NULL,
    git_commit TEXT,
    backend TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('run', 'flakes')),
    folder TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS history_outcomes (
    run_id INTEGER NOT NULL REFERENCES history_runs(id) ON DELETE CASCADE,
    node_id TEXT NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('passed', 'failed', 'error', 'skipped', 'xfailed')),
    duration_s REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS history_outcomes_node ON history_outcomes (node_id, run_id);
CREATE INDEX IF NOT EXISTS history_outcomes_run ON history_outcomes (run_id);
CREATE TABLE IF NOT EXISTS history_retries (
    run_id INTEGER NOT NULL REFERENCES history_runs(id) ON DELETE CASCADE,
    node_id TEXT NOT NULL,
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    outcome TEXT NOT NULL CHECK (outcome IN ('passed', 'failed', 'error', 'skipped', 'xfailed')),
    duration_s REAL NOT NULL DEFAULT 0,
    status TEXT NOT NULL CHECK (status IN ('flaky', 'failing'))
);
CREATE INDEX IF NOT EXISTS history_retries_node ON history_retries (node_id, run_id);
"""


def default_path() -> Path:
    from harness.settings import settings

    return settings().history_db


@contextmanager
def connect(path: Path | str, *, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """The store at `path`, schema checked (created unless `readonly`); committed on success."""
    path = Path(path)
    if readonly and not path.is_file():
        raise HistoryError(f"history store {path} does not exist")
    if not readonly:
        path.parent.mkdir(parents=True, exist_ok=True)
    uri = f"file:{path.resolve()}?mode=ro" if readonly else str(path)
    try:
        db = sqlite3.connect(uri, uri=readonly, timeout=30)
    except sqlite3.Error as e:
        raise HistoryError(f"history store {path} cannot be opened: {e}") from None
    try:
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if not readonly:
                db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM history_meta WHERE key = 'schema_version'").fetchone() \
                if _has_table(db, "history_meta") else None
            if row is None and not readonly:
                db.execute("INSERT INTO history_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                db.commit()
            elif row is None:
                raise HistoryError(f"history store {path} holds no test history (no history_meta table)")
            elif int(row[0]) > SCHEMA_VERSION:
                raise HistoryError(f"history store {path} has schema version {row[0]}; this harness reads "
                                   f"{SCHEMA_VERSION} (update the checkout)")
        except sqlite3.DatabaseError as e:
            db.close()
            if readonly:
                raise HistoryError(f"history store {path} is not a readable SQLite database ({e})") from None
            aside = set_aside(path)
            raise HistoryError(f"history store {path} is not a readable SQLite database ({e}); "
                               f"moved aside to {aside}, the next record starts a new store") from None
        yield db
        db.commit()
    finally:
        db.close()


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


# ---- recording ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    folder: Path
    run_id: int | None  # None: the folder was recorded before
    source: str
    backend: str
    tests: int
    retried: int = 0  # rerun rows (harness.retries)


def _commit_of(folder: Path) -> str | None:
    try:
        env = json.loads((folder / "env.json").read_text())
    except (OSError, ValueError):
        return None
    git = env.get("git") if isinstance(env, dict) else None
    return git.get("sha") if isinstance(git, dict) else None


Retry = tuple[str, int, str, float, str]  # node id, attempt, outcome, seconds, status


def _read_folder(folder: Path) -> tuple[str, str, str, list[tuple[str, str, float]], list[Retry]]:
    """(source, date, backend, [(node id, outcome, seconds)], reruns) of a results folder, with the existing
    readers (a run's reruns with harness.retries)."""
    if (folder / "run.json").is_file():
        from harness import retries
        from harness.collect import load_run

        run = load_run(folder)
        if run.manifest.get("status") in (None, "running"):
            raise HistoryError(f"{folder} is not a finished run (status {run.manifest.get('status')!r})")
        rows = [(t.id, t.outcome, t.duration_s) for s in run.suites for t in s.tests]
        reruns = [(r.id, a.n, a.outcome, a.duration_s, r.status) for r in retries.load(run).values()
                  for a in r.attempts if a.n >= 1]
        date = str(run.manifest.get("started") or "")
        return "run", date, str(run.manifest.get("backend", "?")), rows, reruns
    if (folder / "flakes.json").is_file():
        from harness.results import parse_junit, read_json

        report = read_json(folder / "flakes.json")
        if not isinstance(report, dict) or report.get("kind") != "flakes":
            raise HistoryError(f"{folder / 'flakes.json'} is not a flakes report")
        tests = parse_junit(folder / "pytest.xml")  # one case per repetition, each under the test's node id
        mtime = (folder / "flakes.json").stat().st_mtime
        date = datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds")
        return "flakes", date, str(report.get("backend", "?")), [(t.id, t.outcome, t.duration_s) for t in tests], []
    if not folder.is_dir():
        raise HistoryError(f"results folder {folder} does not exist")
    raise HistoryError(f"{folder} is neither a run's results folder (run.json) nor a flakes folder (flakes.json)")


def record(db_path: Path | str, folder: Path | str) -> Recorded:
    """Record a finished results folder (read before the store is opened: a bad folder leaves no trace)."""
    folder = Path(folder).resolve()
    source, date, backend, rows, reruns = _read_folder(folder)
    date = date or datetime.now(timezone.utc).isoformat(timespec="seconds")
    with connect(db_path) as db:
        if db.execute("SELECT 1 FROM history_runs WHERE folder = ?", (str(folder),)).fetchone():
            return Recorded(folder, None, source, backend, len(rows), len(reruns))
        cur = db.execute("INSERT INTO history_runs (date, git_commit, backend, source, folder) VALUES (?, ?, ?, ?, ?)",
                         (date, _commit_of(folder), backend, source, str(folder)))
        run_id = int(cur.lastrowid or 0)
        db.executemany("INSERT INTO history_outcomes VALUES (?, ?, ?, ?)",
                       [(run_id, n, o, float(d)) for n, o, d in rows])
        db.executemany("INSERT INTO history_retries VALUES (?, ?, ?, ?, ?, ?)",
                       [(run_id, n, a, o, float(d), st) for n, a, o, d, st in reruns])
    return Recorded(folder, run_id, source, backend, len(rows), len(reruns))


def record_or_warn(db_path: Path | str, folder: Path | str, out: TextIO | None = None) -> Recorded | None:
    """record(), for a run that has just finished: a store that cannot take it is reported in one line on `out`
    (default stdout) and the run goes on; None then."""
    try:
        r = record(db_path, folder)
    except HarnessError as e:
        print(f"test history not recorded: {e}", file=out or sys.stdout, flush=True)
        return None
    reruns = f" and {r.retried} reruns" if r.retried else ""
    print(f"test history: {r.tests} test outcomes{reruns} recorded in {db_path}", file=out or sys.stdout, flush=True)
    return r


# ---- queries -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureCount:
    node_id: str
    failed: int  # runs of the window in which it failed or errored
    runs: int  # runs of the window that ran it
    flaky: int = 0  # of the `failed` runs, those in which a rerun alone passed (harness.retries)

    def phrase(self) -> str:
        tail = f" (flaky in {self.flaky}: passed when run again alone)" if self.flaky else ""
        return f"failed {self.failed} of the last {self.runs} runs{tail}"


def _last_runs(db: sqlite3.Connection, last: int, backend: str | None) -> list[int]:
    where, params = ("WHERE backend = ?", [backend]) if backend else ("", [])
    rows = db.execute(f"SELECT id FROM history_runs {where} ORDER BY date DESC, id DESC LIMIT ?", [*params, last])
    return [int(r[0]) for r in rows]


def failure_counts(db_path: Path | str, *, last: int = DEFAULT_LAST, backend: str | None = None,
                   tests: Sequence[str] | None = None) -> dict[str, FailureCount]:
    """node id -> FailureCount over the last `last` runs (of `backend`, if given; of `tests`, if given)."""
    if last < 1:
        raise HistoryError(f"--last {last}: expected at least 1")
    with connect(db_path, readonly=True) as db:
        ids = _last_runs(db, last, backend)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = db.execute(
            f"SELECT node_id, COUNT(DISTINCT run_id) AS runs, "
            f"COUNT(DISTINCT CASE WHEN outcome IN ('failed', 'error') THEN run_id END) AS failed "
            f"FROM history_outcomes WHERE run_id IN ({marks}) GROUP BY node_id", ids).fetchall()
        flaky = dict(db.execute(
            f"SELECT node_id, COUNT(DISTINCT run_id) FROM history_retries WHERE run_id IN ({marks}) "
            f"AND status = 'flaky' GROUP BY node_id", ids).fetchall()) if _has_table(db, "history_retries") else {}
    wanted = set(tests) if tests is not None else None
    return {r["node_id"]: FailureCount(r["node_id"], int(r["failed"]), int(r["runs"]), int(flaky.get(r["node_id"], 0)))
            for r in rows if wanted is None or r["node_id"] in wanted}


def failure_counts_if_any(tests: Sequence[str], *, backend: str | None = None, db_path: Path | str | None = None,
                          last: int = DEFAULT_LAST) -> dict[str, FailureCount]:
    """failure_counts for a report: {} when there is no store or it cannot be read (never raises)."""
    try:
        path = Path(db_path) if db_path else default_path()
        if not path.is_file():
            return {}
        return failure_counts(path, last=last, backend=backend, tests=tests)
    except (HarnessError, sqlite3.Error, OSError, ValueError):
        return {}


def median_durations(db_path: Path | str, backend: str) -> dict[str, float]:
    """node id -> median seconds over the `run` sources of `backend` (HistoryError when it has none)."""
    with connect(db_path, readonly=True) as db:
        rows = db.execute("SELECT o.node_id, o.duration_s FROM history_outcomes o JOIN history_runs r "
                          "ON r.id = o.run_id WHERE r.backend = ? AND r.source = 'run'", (backend,)).fetchall()
    by_id: dict[str, list[float]] = {}
    for node, seconds in rows:
        by_id.setdefault(node, []).append(float(seconds))
    if not by_id:
        raise HistoryError(f"history store {db_path} has no recorded runs of backend {backend!r}")
    return {k: float(statistics.median(v)) for k, v in by_id.items()}


# ---- CLI: `python -m harness history record RUN_DIR...` / `history show [--last N] [--failing]` ------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", metavar="DB",
                   help="the history store (default: KILN_HISTORY_DB, else <results>/history.sqlite)")
    sub = p.add_subparsers(dest="action", metavar="{record,show}")
    sub.required = True
    rec = sub.add_parser("record", help="record finished results folders (runs or flakes folders)")
    rec.add_argument("results_dirs", nargs="+", metavar="RUN_DIR")
    show = sub.add_parser("show", help="per-test failure counts over the last N runs")
    show.add_argument("--last", type=int, default=DEFAULT_LAST, help=f"runs to look back on (default {DEFAULT_LAST})")
    show.add_argument("--failing", action="store_true", help="only tests that failed in the window")
    show.add_argument("--backend", help="only runs of this backend")
    for sp in (rec, show):  # also accepted after the action
        sp.add_argument("--history", metavar="DB", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def cli_main(args: argparse.Namespace) -> int:
    """Record results folders into the test history, or show per-test failure counts."""
    db = Path(args.history) if args.history else default_path()
    if args.action == "record":
        for d in args.results_dirs:
            r = record(db, d)
            what = "already recorded" if r.run_id is None else f"recorded as run {r.run_id}"
            reruns = f" (+{r.retried} reruns of failed tests)" if r.retried else ""
            print(f"{r.folder}: {r.source} of {r.backend}, {r.tests} test outcomes{reruns} {what}")
        return 0
    if not db.is_file():
        raise HistoryError(f"history store {db} does not exist; record a run first (`history record RUN_DIR`)")
    counts = failure_counts(db, last=args.last, backend=args.backend)
    shown = sorted((c for c in counts.values() if c.failed or not args.failing),
                   key=lambda c: (-c.failed, c.node_id))
    for c in shown:
        print(f"{c.node_id}: {c.phrase()}")
    print(f"{db}: {len(shown)} test(s) shown" + (" (failing only)" if args.failing else ""))
    return 0
