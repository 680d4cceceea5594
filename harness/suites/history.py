"""Test history: every recorded run's per-test outcomes and durations in one SQLite file, so a report can say
"failed 3 of the last 40 runs" and sharding can balance by recorded times.

Terms:
  store     a store URL (`--store URL`, KILN_STORE_URL: a SQLite file or a PostgreSQL server, harness/store/url.py;
            a server that is down spools the record, harness/store/spool.py), else a SQLite file (`--history DB`,
            else KILN_HISTORY_DB, else the lasting folder outside the
            checkout, $XDG_DATA_HOME/kiln/history/history.sqlite, ~/.local/share/... without it: see
            harness/settings.py), opened through harness.store (SQLAlchemy Core, Alembic revisions in
            harness/store/migrations/history, version table `alembic_version_history`). Its tables are
            prefixed `history_` so the file may be the bench's store as well:
              history_meta      key/value; `schema_version` (SCHEMA_VERSION)
              history_runs      id, date, git commit, backend, source (`run` or `flakes`), folder (unique per
                                runner), uid (the run's UUID) and who recorded it (harness/store/runner.py)
              history_outcomes  run id, node id, outcome (passed/failed/error/skipped/xfailed), duration s
              history_retries   run id, node id, attempt (1..), outcome, duration s: the reruns alone of a
                                test that failed in the run (harness.suites.retries), with the test's verdict
                                `status` (flaky: passed on a retry; failing: failed every attempt)
  recording a finished results folder: a `harness run` folder (run.json; merged shard runs too), read with
            harness.suites.collect.load_run, or a `harness flakes` folder (flakes.json + pytest.xml), read with
            harness.results.parse_junit: one row per repetition of a test. A folder is recorded once per runner.
  failure count  per test over the last N recorded folders (newest dates first): of the `run` folders that ran
            it, in how many at least one row failed or errored, and in how many of those it was flaky (a rerun
            alone passed); of the `flakes` folders, how many of its repetitions failed out of how many ran
            ("failed 6 of 20 repetitions (flaky)": some but not all failed).
  durations per test, the median over `run` sources of a backend (flake repetitions are left out: a test run
            N times in one process is no sample of its time in a suite).

A writer (`record`) migrates an older store after copying it (`DB.bak-<time>-rev<N>`, a note says so); a file
that is not a readable SQLite database is moved aside by a writer (`DB.corrupt-<time>`, never over an existing
file) and a one-line HistoryError says so; the next write starts a new store. Readers (`history show`, the
failure counts of reports, `durations --from-history`) open the file read-only: they never move, migrate or
write it, and a store newer than this code is a one-line HistoryError for all. Readers that only want to add a
line to a report (`failure_counts_if_any`) never raise.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from harness import conventions
from harness.exc import HarnessError, HistoryError, MissingTool
from harness.record import RunStatus
from harness.results import set_aside

try:
    from sqlalchemy import Connection, case, func, insert, inspect, select
    from sqlalchemy.exc import SQLAlchemyError

    from harness.store import HISTORY, open_store, unreadable_problem
    from harness.store import tables as t
    from harness.store.sqlite import transaction

    _MISSING = ""
except ImportError as _e:  # a host Python without the project's dependencies: each store use says so
    _MISSING = str(_e)
    SQLAlchemyError = OSError  # type: ignore[misc, assignment]

SCHEMA_VERSION = 2  # the history store's head revision (harness/store/migrations/history)
DEFAULT_LAST = 40
SOURCES = ("run", "flakes")


def default_path(*, write: bool = False) -> Any:
    """The history's location: KILN_STORE_URL when set (a Path for `sqlite:///`, else a server; for a writer
    not with KILN_STORE_READ_ONLY), else KILN_HISTORY_DB or the lasting folder's file (harness/settings.py)."""
    from harness.settings import settings

    if _MISSING:
        return settings().history_db
    from harness.store.cli import location

    return location(None, settings().history_db, write=write)


def plan_location(history: Path | None) -> Any:
    """The store a run records into: `history` (an explicit `--history DB`), else default_path() (files
    resolved)."""
    where = Path(history) if history else default_path(write=True)
    return where.resolve() if isinstance(where, Path) else where


def _where(path: Any) -> Any:
    """`path` as a location: a Path, or a ServerURL for a `postgresql://` URL (harness/store/url.py)."""
    if _MISSING or isinstance(path, Path):
        return Path(path)
    from harness.store.url import parse

    return parse(path)


@contextmanager
def connect(path: Any, *, readonly: bool = False) -> Iterator[Connection]:
    """The store at `path` (a file, or a store URL) as a SQLAlchemy connection inside one transaction,
    committed on success: created or migrated to the head revision unless `readonly` (see the module
    docstring)."""
    if _MISSING:
        raise MissingTool(
            f"the test history needs SQLAlchemy and Alembic ({_MISSING}): install the "
            "project's dependencies (pyproject.toml) into this Python"
        )
    path = _where(path)
    if isinstance(
        path, Path
    ):  # a file: damaged or empty ones are said (and set aside) first; a server URL is not
        if not readonly and path.is_file() and (why := unreadable_problem(path, HISTORY)) is not None:
            if why.startswith(("it is not an SQLite", "PRAGMA integrity_check", "SQLite cannot")):
                aside = set_aside(path)
                raise HistoryError(
                    f"history store {path} is not a readable SQLite database ({why}); "
                    f"moved aside to {aside}, the next record starts a new store"
                )
            raise HistoryError(f"cannot use history store {path}: {why}")
        if readonly and path.is_file() and not path.stat().st_size:
            raise HistoryError(f"history store {path} holds no test history (an empty file)")
    opened = open_store(path, HISTORY, write=not readonly)
    try:
        if readonly and opened.revision == 0:
            raise HistoryError(f"history store {path} holds no test history (no history_meta table)")
        with transaction(
            opened.conn, write=not readonly, error=HistoryError, what=f"history store {path}"
        ) as conn:
            yield conn
    finally:
        opened.close()


def _has_table(db: Connection, name: str) -> bool:
    return inspect(db).has_table(name)


# ---- recording ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    folder: Path
    run_id: int | None  # None: the folder was recorded before
    source: str
    backend: str
    tests: int
    retried: int = 0  # rerun rows (harness.suites.retries)


def folder_commit(folder: Path) -> str | None:
    """The git sha a results folder tested: run.json's `commit` (schema 3), else env.json's (a run's `host.git`, or
    `git` at its top), else None."""
    for name, path in (("run.json", ("commit",)), ("env.json", ("host", "git")), ("env.json", ("git",))):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        for key in path:
            data = data.get(key) if isinstance(data, dict) else None
        if isinstance(data, dict) and data.get("sha"):
            return str(data["sha"])
    return None


Retry = tuple[str, int, str, float, str]  # node id, attempt, outcome, seconds, status


def _read_folder(folder: Path) -> tuple[str, str, str, list[tuple[str, str, float]], list[Retry]]:
    """(source, date, backend, [(node id, outcome, seconds)], reruns) of a results folder, with the existing
    readers (a run's reruns with harness.suites.retries)."""
    if (folder / "run.json").is_file():
        from harness.suites.collect import load_run

        return _read_run(load_run(folder))
    if (folder / "flakes.json").is_file():
        from harness.results import parse_junit, read_json

        report = read_json(folder / "flakes.json")
        if not isinstance(report, dict) or report.get("kind") != "flakes":
            raise HistoryError(f"{folder / 'flakes.json'} is not a flakes report")
        tests = parse_junit(folder / "pytest.xml")  # one case per repetition, each under the test's node id
        mtime = (folder / "flakes.json").stat().st_mtime
        date = datetime.fromtimestamp(mtime, UTC).isoformat(timespec="seconds")
        return (
            "flakes",
            date,
            str(report.get("backend", "?")),
            [(t.id, t.outcome, t.duration_s) for t in tests],
            [],
        )
    if not folder.is_dir():
        raise HistoryError(f"results folder {folder} does not exist")
    raise HistoryError(
        f"{folder} is neither a run's results folder (run.json) nor a flakes folder (flakes.json)"
    )


def _read_run(run: Any) -> tuple[str, str, str, list[tuple[str, str, float]], list[Retry]]:
    """`_read_folder` of a run's results (harness.suites.collect.RunResults), in memory or read from its folder."""
    from harness.suites import retries

    if run.record.status == RunStatus.RUNNING:
        raise HistoryError(f"{run.path} is not a finished run (status {str(run.record.status)!r})")
    rows = [(t.id, str(t.outcome), t.duration_s) for s in run.suites for t in s.tests]
    reruns = [
        (r.id, a.n, a.outcome, a.duration_s, str(r.status))
        for r in retries.load(run).values()
        for a in r.attempts
        if a.n >= 1
    ]
    return "run", str(run.record.started or ""), run.record.backend, rows, reruns


def record(db_path: Any, folder: Any, *, strict: bool | None = None) -> Recorded:
    """Record a finished results folder, or a run's results in memory (harness.suites.collect.RunResults: the runner
    hands its own); read before the store is opened, so a bad folder leaves no trace. On a server store that
    cannot be reached the run goes to the local spool with one line (harness/store/spool.py), unless `strict`
    (StoreUnreachable, exit 3); a record that reaches the server first pushes what was spooled."""
    if _MISSING:
        raise MissingTool(
            f"SQLAlchemy and Alembic are not installed in this Python ({sys.executable}: "
            f"{_MISSING}); to record it: {sys.executable} -m pip install 'sqlalchemy>=2' "
            "'alembic>=1.13' (or the project: pip install -e .)"
        )
    where = _where(db_path)
    if isinstance(where, Path):
        return _record(where, folder)
    from harness.exc import StoreUnreachable
    from harness.store import spool

    try:
        out = _record(where, folder)
    except StoreUnreachable as e:
        if spool.strict(strict):
            raise
        print(spool.spooling_line(e, spool.path()), file=sys.stderr, flush=True)
        return _record(spool.path(), folder)
    try:
        spool.drain(where, lambda m: print(m, file=sys.stderr, flush=True))
    except StoreUnreachable as e:
        print(f"note: spooled runs not pushed ({e}); the next run tries again", file=sys.stderr, flush=True)
    return out


def _record(db_path: Any, folder: Any) -> Recorded:
    """record() into one store."""
    import uuid

    from harness.store.runner import current
    from harness.store.sqlite import inserted_id

    if isinstance(folder, (str, Path)):
        folder = Path(folder).resolve()
        source, date, backend, rows, reruns = _read_folder(folder)
    else:
        source, date, backend, rows, reruns = _read_run(folder)
        folder = folder.path
    date = date or datetime.now(UTC).isoformat(timespec="seconds")
    who = current().as_dict()
    r = t.history_runs.c
    with connect(db_path) as db:
        if db.execute(select(r.id).where(r.folder == str(folder), r.runner == who["runner"])).first():
            return Recorded(folder, None, source, backend, len(rows), len(reruns))
        run_id = inserted_id(
            db.execute(
                insert(t.history_runs).values(
                    date=date,
                    git_commit=folder_commit(folder),
                    backend=backend,
                    source=source,
                    folder=str(folder),
                    uid=uuid.uuid4().hex,
                    **who,
                )
            )
        )
        if rows:
            db.execute(
                insert(t.history_outcomes),
                [{"run_id": run_id, "node_id": n, "outcome": o, "duration_s": float(d)} for n, o, d in rows],
            )
        if reruns:
            db.execute(
                insert(t.history_retries),
                [
                    {
                        "run_id": run_id,
                        "node_id": n,
                        "attempt": a,
                        "outcome": o,
                        "duration_s": float(d),
                        "status": st,
                    }
                    for n, a, o, d, st in reruns
                ],
            )
    return Recorded(folder, run_id, source, backend, len(rows), len(reruns))


def record_or_warn(db_path: Path | str, folder: Any, out: TextIO | None = None) -> Recorded | None:
    """record(), for a run that has just finished: a store that cannot take it is reported in one line on `out`
    (default stdout) and the run goes on; None then. A store that refuses access (StoreDenied) is raised: the
    caller reports the run, then fails with it (exit 3)."""
    from harness.exc import StoreDenied

    try:
        r = record(db_path, folder)
    except StoreDenied:  # a configuration error (wrong password, no grants): the run's caller fails with it
        raise
    except HarnessError as e:
        print(f"test history not recorded: {e}", file=out or sys.stdout, flush=True)
        return None
    reruns = f" and {r.retried} reruns" if r.retried else ""
    print(
        f"test history: {r.tests} test outcomes{reruns} recorded in {db_path}",
        file=out or sys.stdout,
        flush=True,
    )
    return r


# ---- queries -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureCount:
    """One test's failures over a window (see the module docstring): `failed` of `runs` run folders (`flaky`
    of those passed on a rerun alone), `failed_repetitions` of `repetitions` in flakes folders."""

    node_id: str
    failed: int  # run folders of the window in which it failed or errored
    runs: int  # run folders of the window that ran it
    flaky: int = 0  # of the `failed` runs, those in which a rerun alone passed (harness.suites.retries)
    failed_repetitions: int = 0  # repetitions in the window's flakes folders that failed or errored
    repetitions: int = 0  # repetitions of it in the window's flakes folders

    def phrase(self) -> str:
        parts = []
        if self.runs or not self.repetitions:
            tail = f" (flaky in {self.flaky}: passed when run again alone)" if self.flaky else ""
            parts.append(f"failed {self.failed} of the last {self.runs} runs{tail}")
        if self.repetitions:
            flaky = " (flaky)" if 0 < self.failed_repetitions < self.repetitions else ""
            parts.append(f"failed {self.failed_repetitions} of {self.repetitions} repetitions{flaky}")
        return "; ".join(parts)


def _last_runs(
    db: Connection, last: int, backend: str | None, runner: str | None = None, hw_class: str | None = None
) -> list[int]:
    r = t.history_runs.c
    q = select(r.id).order_by(r.date.desc(), r.id.desc()).limit(last)
    if backend:
        q = q.where(r.backend == backend)
    for col, want in (("runner", runner), ("hw_class", hw_class)):
        if want:
            if col not in {c["name"] for c in inspect(db).get_columns("history_runs")}:
                return []  # a store of revision 1: no run names a runner
            q = q.where(r[col] == want)
    return [int(x) for x in db.execute(q).scalars()]


def failure_counts(
    db_path: Any,
    *,
    last: int = DEFAULT_LAST,
    backend: str | None = None,
    tests: Sequence[str] | None = None,
    runner: str | None = None,
    hw_class: str | None = None,
) -> dict[str, FailureCount]:
    """node id -> FailureCount over the last `last` recorded folders (of `backend`, runner `runner`, hardware
    class `hw_class`, if given; of `tests`, if given). Reads only."""
    if last < 1:
        raise HistoryError(f"--last {last}: expected at least 1")
    with connect(db_path, readonly=True) as db:
        ids = _last_runs(db, last, backend, runner, hw_class)
        if not ids:
            return {}
        o, r = t.history_outcomes.c, t.history_runs.c
        bad = o.outcome.in_(("failed", "error"))
        runs = db.execute(
            select(o.node_id, func.count(o.run_id.distinct()), func.count(case((bad, o.run_id)).distinct()))
            .join(t.history_runs, r.id == o.run_id)
            .where(o.run_id.in_(ids), r.source == "run")
            .group_by(o.node_id)
        ).all()
        reps = db.execute(
            select(o.node_id, func.count(), func.count(case((bad, 1))))
            .join(t.history_runs, r.id == o.run_id)
            .where(o.run_id.in_(ids), r.source == "flakes")
            .group_by(o.node_id)
        ).all()
        flaky: dict[str, int] = {}
        if _has_table(db, "history_retries"):
            x = t.history_retries.c
            flaky = {
                n: int(k)
                for n, k in db.execute(
                    select(x.node_id, func.count(x.run_id.distinct()))
                    .where(x.run_id.in_(ids), x.status == "flaky")
                    .group_by(x.node_id)
                )
            }
    counts: dict[str, list[int]] = {}
    for node, n, k in runs:
        counts.setdefault(node, [0, 0, 0, 0])[0:2] = [int(k), int(n)]
    for node, n, k in reps:
        counts.setdefault(node, [0, 0, 0, 0])[2:4] = [int(k), int(n)]
    wanted = set(tests) if tests is not None else None
    return {
        node: FailureCount(node, c[0], c[1], flaky.get(node, 0), c[2], c[3])
        for node, c in counts.items()
        if wanted is None or node in wanted
    }


def failure_counts_if_any(
    tests: Sequence[str],
    *,
    backend: str | None = None,
    db_path: Path | str | None = None,
    last: int = DEFAULT_LAST,
) -> dict[str, FailureCount]:
    """failure_counts for a report: {} when there is no store or it cannot be read (never raises)."""
    try:
        path = _where(db_path) if db_path else default_path()
        if isinstance(path, Path) and not path.is_file():
            return {}
        return failure_counts(path, last=last, backend=backend, tests=tests)
    except (HarnessError, SQLAlchemyError, sqlite3.Error, OSError, ValueError):
        return {}


def median_durations(db_path: Any, backend: str) -> dict[str, float]:
    """node id -> median seconds over the `run` sources of `backend` (HistoryError when it has none)."""
    o, r = t.history_outcomes.c, t.history_runs.c
    with connect(db_path, readonly=True) as db:
        rows = db.execute(
            select(o.node_id, o.duration_s)
            .join(t.history_runs, r.id == o.run_id)
            .where(r.backend == backend, r.source == "run")
        ).all()
    by_id: dict[str, list[float]] = {}
    for node, seconds in rows:
        by_id.setdefault(node, []).append(float(seconds))
    if not by_id:
        raise HistoryError(f"history store {db_path} has no recorded runs of backend {backend!r}")
    return {k: float(statistics.median(v)) for k, v in by_id.items()}


# ---- CLI: `python -m harness history record RUN_DIR...` / `history show [--last N] [--failing]` ------------


# `history show` in a terminal: past this many tests that never failed, one line counts them instead of listing them
QUIET_AFTER = 20


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--history",
        metavar="DB",
        help="the history store (default: KILN_HISTORY_DB, else "
        "$XDG_DATA_HOME/kiln/history/history.sqlite, ~/.local/share/kiln/... without "
        "XDG_DATA_HOME)",
    )
    sub = p.add_subparsers(dest="action", metavar="{record,show}")
    sub.required = True
    rec = sub.add_parser("record", help="record finished results folders (runs or flakes folders)")
    rec.add_argument("results_dirs", nargs="+", metavar="RUN_DIR")
    show = sub.add_parser(
        "show",
        help="per-test failure counts over the last N runs (read-only: never migrates or moves the store)",
    )
    show.add_argument(
        "--last", type=int, default=DEFAULT_LAST, help=f"runs to look back on (default {DEFAULT_LAST})"
    )
    show.add_argument("--failing", action="store_true", help="only tests that failed in the window")
    show.add_argument(
        "--all",
        action="store_true",
        help=f"list every test in the terminal (default: past "
        f"{QUIET_AFTER} tests that never failed in the window, one line counts them)",
    )
    show.add_argument("--backend", help="only runs of this backend")
    conventions.add_json(show, "the counts")
    show.add_argument("--runner", help="only runs recorded by this runner (its RUNNER_NAME or host name)")
    show.add_argument("--hw-class", help="only runs of this hardware class (the GPU label, else GPU model)")
    from harness.store.cli import add_store_flags

    add_store_flags(p)
    for sp in (rec, show):  # also accepted after the action
        sp.add_argument("--history", metavar="DB", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        add_store_flags(sp, hidden=True)


def cli_main(args: argparse.Namespace) -> int:
    """Record results folders into the test history, or show per-test failure counts."""
    from harness.store.cli import apply_store_flags, exists, location

    if getattr(args, "store", None) and args.history:
        raise HistoryError("give --history DB or --store URL, not both")
    apply_store_flags(args)
    write = args.action == "record"
    db = (
        Path(args.history or default_path())
        if _MISSING
        else location(args.history, default_path(write=write), write=write)
    )
    if args.action == "record":
        for d in args.results_dirs:
            r = record(db, d)
            what = "already recorded" if r.run_id is None else f"recorded as run {r.run_id}"
            reruns = f" (+{r.retried} reruns of failed tests)" if r.retried else ""
            print(f"{r.folder}: {r.source} of {r.backend}, {r.tests} test outcomes{reruns} {what}")
        return 0
    if not exists(db):
        raise HistoryError(
            f"history store {db} does not exist; record a run first (`history record RUN_DIR`)"
        )
    counts = failure_counts(
        db, last=args.last, backend=args.backend, runner=args.runner, hw_class=args.hw_class
    )
    shown = sorted(
        (c for c in counts.values() if c.failed or c.failed_repetitions or not args.failing),
        key=lambda c: (-c.failed, -c.failed_repetitions, c.node_id),
    )
    listed = shown
    never = [c for c in shown if not (c.failed or c.failed_repetitions)]
    if len(never) > QUIET_AFTER and not args.all:  # a terminal page, not one line per passing test
        listed = [c for c in shown if c.failed or c.failed_repetitions]
    with conventions.human_to_stderr(conventions.to_stdout(args.json)):
        for c in listed:
            print(f"{c.node_id}: {c.phrase()}")
        if listed is not shown:
            runs = max(c.runs for c in never)
            print(
                f"{len(never)} test(s) never failed in the last {runs} run(s) (`--all` lists them, "
                "`--json -` gives every count)"
            )
        failing = len(shown) - len(never)
        print(
            f"{db}: {len(listed)} of {len(shown)} test(s) listed ({failing} failed in the window)"
            + (" (failing only)" if args.failing else "")
        )
    if args.json:
        conventions.write_json(
            args.json,
            {
                "store": str(db),
                "last": args.last,
                "backend": args.backend,
                "failing_only": args.failing,
                "tests": [{**asdict(c), "phrase": c.phrase()} for c in shown],
            },
        )
    return 0
