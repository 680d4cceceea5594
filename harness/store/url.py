"""Where a store lives: a SQLite file or a database server, named by one URL (KILN_STORE_URL, `--store URL`).

Terms:
  location   what a store is opened on: a `Path` (a SQLite file, as before the fleet store) or a `ServerURL`
             (a PostgreSQL database reached through psycopg 3).
  store URL  `sqlite:///ABS/PATH` or `sqlite:///REL/PATH` (a file: the same as giving the path),
             `postgresql://...`, `postgresql+psycopg://...` or `postgres://...` (a server; the driver is always
             psycopg 3). Both stores (bench and history) may share one location: their tables are prefixed.
  redacted   the URL as printed: its password replaced by `***` (messages and notes never show it).
  reader     a server engine whose transactions are read-only (`default_transaction_read_only`): whatever a
             reader runs, the server refuses to change a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from harness.exc import UsageError

SERVER_SCHEMES = ("postgresql", "postgresql+psycopg", "postgres")
CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class ServerURL:
    """A store on a PostgreSQL server (see the module docstring); `url` keeps the password, `str()` hides it."""

    url: URL

    def __str__(self) -> str:
        return self.url.render_as_string(hide_password=True)

    @property
    def engine_name(self) -> str:
        return "postgresql"


Location = Path | ServerURL


def is_url(value: str | Path | ServerURL | None) -> bool:
    """Whether `value` is written as a URL (`scheme://...`) rather than a path."""
    return isinstance(value, ServerURL) or (isinstance(value, str) and "://" in value)


def parse(value: str | Path | ServerURL) -> Location:
    """The location `value` names: a ServerURL, or a Path for a path or a `sqlite:///` URL. A URL of another
    scheme, or one that does not parse, is a UsageError naming the schemes this code reads."""
    if isinstance(value, (Path, ServerURL)):
        return value
    if not is_url(value):
        return Path(value).expanduser()
    if value.startswith("sqlite://"):
        rest = value[len("sqlite://") :]
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            raise UsageError(f"store URL {value!r}: give a file, sqlite:///REL/PATH or sqlite:////ABS/PATH")
        return Path(rest[1:]).expanduser()
    try:
        url = make_url(value)
    except (ArgumentError, ValueError) as e:  # ValueError: a port that is not a number, among others
        why = (
            ""
            if not isinstance(e, ValueError)
            else (" (its port is not a number)" if "int()" in str(e) else f" ({str(e).splitlines()[0]})")
        )
        raise UsageError(
            f"store URL {_hide(value)!r} does not parse{why}; expected sqlite:///PATH or "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB"
        ) from None
    if url.drivername not in SERVER_SCHEMES:
        raise UsageError(
            f"store URL scheme {url.drivername!r} is not one this code reads: sqlite:///PATH or "
            "postgresql://USER@HOST/DB (psycopg 3)"
        )
    return ServerURL(url.set(drivername="postgresql+psycopg"))


def _hide(value: str) -> str:
    head, sep, tail = value.partition("@")
    if not sep or ":" not in head.split("://", 1)[-1]:
        return value
    scheme, _, cred = head.partition("://")
    return f"{scheme}://{cred.split(':', 1)[0]}:***@{tail}"


def describe(location: Location | str) -> str:
    """The location as messages print it (a path, or the URL with its password hidden)."""
    return str(location)


def server_engine(location: ServerURL, *, write: bool) -> Engine:
    """An engine on the server store; a reader's transactions are read-only (see the module docstring).
    psycopg missing is a one-line MissingTool naming the extra to install."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        from harness.exc import MissingTool

        raise MissingTool(
            "a PostgreSQL store needs psycopg 3: pip install 'kiln[fleet]' (or 'psycopg[binary]>=3.1')"
        ) from None
    args: dict[str, object] = {"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "kiln"}
    if not write:
        args["options"] = "-c default_transaction_read_only=on"
    return create_engine(location.url, poolclass=NullPool, connect_args=args)
