"""One SQLite helper for both stores (the bench store and the test history): engines, checks, copies.

Terms:
  writer engine  opens (and creates) the file read-write with WAL, a busy timeout and foreign keys on; its
                 write transactions start with `BEGIN IMMEDIATE` (the write lock up front: two processes that
                 write at once wait for each other instead of failing), its read transactions with `BEGIN`.
  reader engine  opens the file with `mode=ro`: nothing it does can change the file's bytes. In a folder this
                 process cannot write (a read-only mount, an artifact fetched read-only) SQLite cannot make the
                 `-shm` file a WAL read needs, so a file with neither `-wal` nor `-shm` beside it (its last
                 connection closed it: everything is in the file, and no writer is at work) is opened
                 `immutable=1` (`read_uri`).
  unreadable     a file that is not an SQLite database or fails `PRAGMA integrity_check`; only such a file is
                 ever set aside (harness.results.set_aside), and only by a writer.
  backup         a consistent copy (SQLite's online backup) taken before a migration, next to the store:
                 `STORE.bak-<UTC time>-rev<N>`.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, CursorResult, Engine, create_engine, event
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.pool import NullPool, StaticPool

from harness.results import unused_sibling

SQLITE_MAGIC = b"SQLite format 3\x00"
MEMORY = ":memory:"
WRITE_TXN = "kiln_write_txn"  # Connection.info flag: the next transaction is a write (BEGIN IMMEDIATE)


def _retry_locked(fn: Any, timeout_s: float) -> Any:
    """Call `fn` until it stops failing with `database is locked` (a WAL switch races other openers)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_uri(path: Path | str) -> str:
    """The URI a reader opens `path` with: `mode=ro`, plus `immutable=1` where the folder cannot be written and
    neither a `-wal` nor a `-shm` file lies beside it (see the module docstring; either one may mean a writer
    with rights this process lacks is at work, and immutable reads would not see it)."""
    p = Path(path).absolute()
    uri = f"file:{quote(str(p))}?mode=ro"
    live = any(p.with_name(p.name + end).exists() for end in ("-wal", "-shm"))
    if not live and not os.access(p.parent, os.W_OK):
        uri += "&immutable=1"
    return uri


def open_engine(path: Path | str, *, write: bool, timeout_s: float = 120.0) -> Engine:
    """An engine on the SQLite file `path` (or `:memory:`), writer or reader (see the module docstring)."""
    memory = str(path) == MEMORY
    if memory:
        target, uri = MEMORY, False
    elif write:
        target, uri = str(path), False
    else:
        target, uri = read_uri(path), True

    def creator() -> sqlite3.Connection:
        return sqlite3.connect(
            target, uri=uri, timeout=timeout_s, isolation_level=None, check_same_thread=False
        )

    engine = create_engine(
        "sqlite+pysqlite://", creator=creator, poolclass=StaticPool if memory else NullPool
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi: sqlite3.Connection, _record: object) -> None:
        dbapi.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        dbapi.execute("PRAGMA foreign_keys = ON")
        if write and not memory:
            _retry_locked(lambda: dbapi.execute("PRAGMA journal_mode = WAL"), timeout_s)
            dbapi.execute("PRAGMA synchronous = NORMAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        immediate = write and conn.info.get(WRITE_TXN)
        _retry_locked(lambda: conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN"), timeout_s)

    return engine


def settle(path: Path) -> None:
    """After a writer's last connection closed: switch the file out of WAL into rollback-journal mode, so that a
    reader (`mode=ro`) of the closed store makes no `-wal`/`-shm` beside it (a read-only verb creates no file); the
    next writer switches it back to WAL. Skipped, without waiting, while any other connection has the file open
    (the switch needs it alone)."""
    if not path.is_file():
        return
    try:
        db = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        db.execute("PRAGMA busy_timeout = 0")
        db.execute("PRAGMA journal_mode = DELETE")
    except (
        sqlite3.Error
    ):  # another connection is open (busy) or the file is not ours to change: leave it in WAL
        pass
    finally:
        db.close()


def unreadable(path: Path) -> str | None:
    """Why the file at `path` is no readable SQLite database (not SQLite, failing `PRAGMA integrity_check`),
    or None. An empty file is readable (SQLite starts it). Opens the file read-only: it changes nothing."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if not head:
        return None
    if head != SQLITE_MAGIC:
        return "it is not an SQLite database"
    try:
        db = sqlite3.connect(read_uri(path), uri=True, timeout=30)
    except sqlite3.Error as e:
        return f"SQLite cannot open it ({e})"
    try:
        rows = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as e:
        return f"SQLite cannot read it ({e})"
    finally:
        db.close()
    if rows != ["ok"]:
        return f"PRAGMA integrity_check says: {'; '.join(map(str, rows[:3]))}"
    return None


def backup(path: Path, revision: int) -> Path:
    """Copy the store at `path` (with what its WAL holds) to `PATH.bak-<UTC time>-rev<revision>`, never over
    an existing file, through a temporary file and a rename; returns the copy's path."""
    dest = unused_sibling(path, "bak", f"-rev{revision}")
    tmp = dest.with_name(f".{dest.name}.tmp")
    src = sqlite3.connect(str(path), timeout=120)
    try:
        out = sqlite3.connect(str(tmp))
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, no -wal/-shm beside it
        finally:
            out.close()
    finally:
        src.close()
    tmp.rename(dest)
    return dest


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key of the one row an `INSERT` (`result`, from `Connection.execute`) added."""
    key = result.inserted_primary_key
    assert key is not None, "not the result of a single-row INSERT"
    return int(key[0])


@contextmanager
def transaction(conn: Connection, *, write: bool, error: type[Exception], what: str) -> Iterator[Connection]:
    """One transaction on `conn` (`BEGIN IMMEDIATE` for a write on SQLite: the write lock taken up front, waiting
    up to the busy timeout; a server's own row locks otherwise); a database error leaves as
    `error("<what>: <its first line>")`, a server gone away as StoreUnreachable. Both stores use it."""
    conn.info[WRITE_TXN] = write
    try:
        with conn.begin():
            conn.info[WRITE_TXN] = False
            yield conn
    except OperationalError as e:
        if (
            conn.dialect.name != "sqlite"
        ):  # a server that went away: the caller may spool (harness/store/spool.py)
            from harness.exc import StoreUnreachable

            _raise_if_denied(e, what)
            why = str(e.orig or e).splitlines()[0]
            raise StoreUnreachable(f"{what}: the server is unreachable: {why}") from None
        raise error(f"{what}: {str(e).splitlines()[0]}") from None
    except SQLAlchemyError as e:
        if conn.dialect.name != "sqlite":
            _raise_if_denied(e, what)
        raise error(f"{what}: {str(e).splitlines()[0]}") from None
    finally:
        if not conn.invalidated:  # touching a lost server connection's info would reconnect
            conn.info[WRITE_TXN] = False


def _raise_if_denied(e: BaseException, what: str) -> None:
    """StoreDenied when the server refused `e`'s statement for lack of rights (never spooled, exit 3)."""
    from harness.exc import StoreDenied

    if (why := denied_reason(e)) is not None:
        raise StoreDenied(f"{what}: the server refused: {why} (check the role's grants)") from None


# what a server says when it answered and refused us (a configuration error, not an outage): SQLSTATE class 28
# (authorization) and 42501 (insufficient privilege); a connection refused at login carries no SQLSTATE in
# psycopg, so its FATAL line is matched too
_DENIED = re.compile(
    r"password authentication failed|authentication failed|no pg_hba\.conf entry|"
    r"role \S+ does not exist|database \S+ does not exist|permission denied|"
    r"no password supplied|not permitted to log in|must be owner|insufficient privilege"
)


def denied_reason(e: BaseException) -> str | None:
    """The server's refusal in `e` (a DBAPI error) as one line, when it is one (see _DENIED); else None."""
    orig = getattr(e, "orig", None) or e
    code = str(getattr(orig, "sqlstate", None) or "")
    text = " ".join(str(orig).split())
    if not (code.startswith("28") or code == "42501" or _DENIED.search(text)):
        return None
    fatal = re.search(r"FATAL:\s*(.*)", text)
    return (fatal.group(1) if fatal else text) or type(orig).__name__
