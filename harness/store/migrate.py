"""Opening a store at the right revision: the version check, backup-then-migrate, readers that never write.

Terms:
  kind       one of the two stores (BENCH, HISTORY): its Alembic scripts (harness/store/migrations/<name>),
             its own version table (`alembic_version_<name>`, so both stores may share one file) and the error
             class it raises (StoreError, HistoryError).
  revision   a store's schema, numbered 1, 2, ... (Alembic ids `<name>_0001`, ...). A store written before the
             Alembic stores has no version table and `schema_version` 1 in its meta table: it is revision 1
             (a *legacy* store; a write-open stamps it, then upgrades it).
  head       the newest revision this code knows; a store at a revision this code does not know is *newer*:
             refused in one line, for readers and writers, and never moved or changed.
  write-open opens read-write; a store of an older revision (or a legacy one) is first copied with
             harness.store.sqlite.backup (one `note:` line names the copy), then migrated to head inside one
             transaction. A read-open (`mode=ro`) reads whatever known revision it finds and changes nothing.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from harness.exc import HarnessError, HistoryError, StoreDenied, StoreError, StoreUnreachable

from .sqlite import MEMORY, WRITE_TXN, backup, denied_reason, open_engine, settle, unreadable
from .tables import RUNNER_COLUMNS
from .tables import bench as bench_tables
from .tables import history as history_tables
from .url import ServerURL, server_engine

MIGRATION_LOCK = (
    0x6B696C6E  # PostgreSQL advisory lock key ("kiln") held while a writer migrates a server store
)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


@dataclass(frozen=True)
class StoreKind:
    """One of the two stores (see the module docstring); `required`: the columns of revision 1's tables."""

    name: str
    label: str
    meta_table: str
    required: dict[str, frozenset[str]]
    error: type[HarnessError]

    @property
    def version_table(self) -> str:
        return f"alembic_version_{self.name}"

    def rev_id(self, number: int) -> str:
        return f"{self.name}_{number:04d}"


def _columns(md: Any, names: tuple[str, ...]) -> dict[str, frozenset[str]]:
    later = {"uid", *RUNNER_COLUMNS}  # added by bench revision 3 / history revision 2: not required
    return {n: frozenset(c.name for c in md.tables[n].columns if c.name not in later) for n in names}


BENCH = StoreKind(
    "bench", "bench store", "meta", _columns(bench_tables, ("meta", "runs", "results", "samples")), StoreError
)
HISTORY = StoreKind(
    "history",
    "history store",
    "history_meta",
    _columns(history_tables, ("history_meta", "history_runs", "history_outcomes")),
    HistoryError,
)


def _number(rev_id: str) -> int | None:
    tail = rev_id.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _config(kind: StoreKind, conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS / kind.name))
    cfg.attributes["connection"] = conn
    cfg.attributes["version_table"] = kind.version_table
    return cfg


def known_revisions(kind: StoreKind) -> tuple[str, ...]:
    """The revision ids of `kind` this code has scripts for, oldest first."""
    return _known(kind.name)


@cache
def _known(name: str) -> tuple[str, ...]:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS / name))
    script = ScriptDirectory.from_config(cfg)
    return tuple(reversed([r.revision for r in script.walk_revisions()]))


def head(kind: StoreKind) -> int:
    """The number of the newest revision of `kind` this code knows."""
    return _number(known_revisions(kind)[-1]) or 0


def run_environment(context: Any) -> None:
    """Alembic's env.py body: migrate the connection the caller opened, in the caller's transaction."""
    cfg = context.config
    context.configure(
        connection=cfg.attributes["connection"],
        version_table=cfg.attributes["version_table"],
        transactional_ddl=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


@dataclass(frozen=True)
class State:
    """What a store file holds: `revision` (Alembic id; None: none of the kind's tables, an empty store),
    `legacy` (no version table yet), `problem` (why it is no store of this kind, or None)."""

    revision: str | None
    legacy: bool = False
    problem: str | None = None
    meta_version: int | None = None

    @property
    def number(self) -> int:
        return (_number(self.revision) or 0) if self.revision else 0


def read_state(conn: Connection, kind: StoreKind) -> State:
    """The State of the store behind `conn` (a read; call it inside a transaction)."""
    have = set(inspect(conn).get_table_names())
    meta_version = None
    if kind.meta_table in have:
        row = conn.execute(text(f"SELECT value FROM {kind.meta_table} WHERE key = 'schema_version'")).first()
        meta_version = int(row[0]) if row and str(row[0]).isdigit() else None
    for table, need in kind.required.items():
        if table not in have:
            ours = set(bench_tables.tables) | set(history_tables.tables)
            foreign = {n for n in have if n not in ours and not n.startswith(("sqlite_", "alembic_version_"))}
            if have & set(kind.required) or kind.version_table in have or foreign:
                return State(None, problem=f"it has no `{table}` table: not a kiln {kind.label}")
            return State(None)  # empty (or the other store's tables only: both may share a file)
        cols = {c["name"] for c in inspect(conn).get_columns(table)}
        if need - cols:
            lacks = ", ".join(sorted(need - cols))
            return State(None, problem=f"its `{table}` table lacks {lacks}: wrong schema")
    if kind.version_table in have:
        rows = conn.execute(text(f"SELECT version_num FROM {kind.version_table}")).all()
        if len(rows) == 1:
            return State(str(rows[0][0]), meta_version=meta_version)
    if meta_version is None:
        return State(None, problem="it records no schema version")
    if meta_version == 1:
        return State(kind.rev_id(1), legacy=True, meta_version=1)
    if meta_version > 1:
        return State(kind.rev_id(meta_version), legacy=True, meta_version=meta_version)
    return State(None, problem=f"it records schema v{meta_version}, which no kiln code wrote")


def newer_problem(kind: StoreKind, path: Path | str, state: State) -> str | None:
    """The one-line refusal for a store newer than this code, or None."""
    top = head(kind)
    newer = state.revision is not None and state.revision not in known_revisions(kind)
    if not newer and not (state.meta_version and state.meta_version > top):
        return None
    rev = state.revision if newer else f"schema v{state.meta_version}"
    return (
        f"{kind.label} {path} is at revision {rev}, newer than this code knows (its newest is "
        f"{kind.rev_id(top)}, revision {top}): update the checkout; nothing was moved or written"
    )


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Opened:
    """An open store: its engine, the connection it is used through, and the revision found (readers)."""

    path: str
    engine: Engine
    conn: Connection
    revision: int
    file_writer: bool = (
        False  # a writer of a SQLite file: its close leaves the file in rollback mode (settle)
    )

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()
        if self.file_writer:
            settle(Path(self.path))


def open_store(
    path: Path | str | ServerURL,
    kind: StoreKind,
    *,
    write: bool,
    timeout_s: float = 120.0,
    say: Callable[[str], None] | None = None,
) -> Opened:
    """Open the store at `path` (or `:memory:`, or a server: open_server) as `kind`; a writer gets it created
    or migrated to head (see the module docstring). Errors are `kind.error`, one line each: unreadable file,
    not a store of this kind, newer revision, a reader's missing file."""
    say = say or _say
    if isinstance(path, ServerURL):
        return open_server(path, kind, write=write, say=say)
    memory = str(path) == MEMORY
    if not memory:
        path = Path(path)
        if path.is_dir():
            raise kind.error(
                f"{kind.label} path {path} is a directory; give a file such as {path / 'store.sqlite'}"
            )
        if not write and not path.is_file():
            raise kind.error(f"{kind.label} {path} does not exist")
        if write:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise kind.error(f"cannot open {kind.label} {path}: {e}") from None
    if write and not memory and Path(path).is_file() and Path(path).stat().st_size:
        # before a byte changes: checked read-only
        _refuse(Path(path), kind, open_engine(path, write=False, timeout_s=timeout_s))
    engine = open_engine(path, write=write or memory, timeout_s=timeout_s)
    conn: Connection | None = None
    try:
        conn = engine.connect()
        with conn.begin():
            state = read_state(conn, kind)
        if state.problem:
            raise kind.error(f"cannot use {kind.label} {path}: {state.problem}")
        if (why := newer_problem(kind, path, state)) is not None:
            raise kind.error(why)
        top = head(kind)
        if write and (state.number < top or state.legacy):
            if state.revision is not None and not memory:
                copy = backup(Path(path), state.number)
                what = "from before the version table" if state.legacy and state.number == top else ""
                at = f"{state.number} {what}".rstrip()
                say(
                    f"note: {kind.label} {path} is at revision {at}; this code writes revision {top}: "
                    f"copied it to {copy} and migrating it"
                )
            _migrate(conn, kind)
            state = State(kind.rev_id(top))
        return Opened(str(path), engine, conn, state.number, file_writer=write and not memory)
    except (sqlite3.Error, DBAPIError, SQLAlchemyError) as e:
        if conn is not None:
            conn.close()
        engine.dispose()
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise kind.error(f"cannot use {kind.label} {path}: {first}") from None
    except BaseException:
        if conn is not None:
            conn.close()
        engine.dispose()
        raise


def unreachable(location: ServerURL, kind: StoreKind, e: BaseException) -> StoreUnreachable | StoreDenied:
    """The one-line StoreUnreachable for a server that refused, timed out or went away; StoreDenied when it
    answered and refused us (wrong password, unknown role or database, no permission), which is never spooled."""
    if (why := denied_reason(e)) is not None:
        return StoreDenied(
            f"{kind.label} server {location} refused access: {why} (check the store URL's user, "
            "password and database, and the role's grants)"
        )
    first = str(getattr(e, "orig", None) or e).strip().splitlines()
    why = first[0] if first else type(e).__name__
    return StoreUnreachable(f"{kind.label} server {location} is unreachable: {why}")


def open_server(
    location: ServerURL, kind: StoreKind, *, write: bool, say: Callable[[str], None] | None = None
) -> Opened:
    """Open a store on a PostgreSQL server: the same checks as a file (a store of another kind or a newer
    revision refused in one line); a writer creates or migrates it in one transaction under an advisory lock
    (transactional DDL: a killed migration leaves the old revision). No file copy is taken: the server's own
    backups (pg_dump) are the admin's. A reader's transactions are read-only; an empty database reads as
    revision 0. An unreachable server is StoreUnreachable."""
    say = say or _say
    engine = server_engine(location, write=write)
    conn: Connection | None = None
    try:
        try:
            conn = engine.connect()
        except OperationalError as e:
            raise unreachable(location, kind, e) from None
        with conn.begin():
            state = read_state(conn, kind)
        if state.problem:
            raise kind.error(f"cannot use {kind.label} {location}: {state.problem}")
        if (why := newer_problem(kind, str(location), state)) is not None:
            raise kind.error(why)
        top = head(kind)
        if write and (state.number < top or state.legacy):
            if state.revision is not None:
                say(
                    f"note: {kind.label} {location} is at revision {state.number}; this code writes revision "
                    f"{top}: migrating it in one transaction"
                )
            _migrate(conn, kind)
            state = State(kind.rev_id(top))
        return Opened(str(location), engine, conn, state.number)
    except OperationalError as e:
        if conn is not None:
            conn.close()
        engine.dispose()
        raise unreachable(location, kind, e) from None
    except (DBAPIError, SQLAlchemyError) as e:
        if conn is not None:
            conn.close()
        engine.dispose()
        if denied_reason(e) is not None:
            raise unreachable(location, kind, e) from None
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise kind.error(f"cannot use {kind.label} {location}: {first}") from None
    except BaseException:
        if conn is not None:
            conn.close()
        engine.dispose()
        raise


def _refuse(path: Path, kind: StoreKind, engine: Engine) -> None:
    """Raise `kind.error` for a store that is no store of `kind` or newer than this code, found through a
    read-only engine (a writer's engine would switch the file to WAL first: a change of its header)."""
    try:
        with engine.connect() as conn, conn.begin():
            state = read_state(conn, kind)
    except (sqlite3.Error, SQLAlchemyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise kind.error(f"cannot use {kind.label} {path}: {first}") from None
    finally:
        engine.dispose()
    if state.problem:
        raise kind.error(f"cannot use {kind.label} {path}: {state.problem}")
    if (why := newer_problem(kind, path, state)) is not None:
        raise kind.error(why)


def _migrate(conn: Connection, kind: StoreKind) -> None:
    """Stamp a legacy store and upgrade it to head, all in one write transaction (re-reading the state inside
    it: a writer that raced us may have migrated it already)."""
    conn.info[WRITE_TXN] = True
    sqlite = conn.dialect.name == "sqlite"
    if sqlite:  # a revision that copies a table must not cascade its DROP into the children (checked below)
        conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]
    try:
        with conn.begin():
            if conn.dialect.name == "postgresql":  # SQLite's BEGIN IMMEDIATE is its lock; a server needs one
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            state = read_state(conn, kind)
            if state.revision == kind.rev_id(head(kind)) and not state.legacy:
                return  # a writer that held the lock before us migrated it
            cfg = _config(kind, conn)
            if state.legacy and state.revision:
                command.stamp(cfg, state.revision)
            command.upgrade(cfg, "head")
            if sqlite and (bad := conn.exec_driver_sql("PRAGMA foreign_key_check").all()):
                raise kind.error(f"migrating the {kind.label} broke {len(bad)} foreign key(s): rolled back")
    finally:
        conn.info[WRITE_TXN] = False
        if sqlite:
            conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")  # type: ignore[union-attr]


def unreadable_problem(path: Path, kind: StoreKind) -> str | None:
    """Why the file at `path` cannot be a store of `kind` at all: unreadable (harness.store.sqlite.unreadable)
    or holding tables of the kind that are broken; None for a usable, empty, older or newer store."""
    why = unreadable(path)
    if why or not path.stat().st_size:
        return why
    engine = open_engine(path, write=False)
    try:
        with engine.connect() as conn, conn.begin():
            return read_state(conn, kind).problem
    except (sqlite3.Error, SQLAlchemyError) as e:
        return f"SQLite cannot read it ({str(e).splitlines()[0]})"
    finally:
        engine.dispose()
