"""The harness's stores on SQLAlchemy Core + Alembic: the bench store (harness/bench/stores/store.py) and the test
history (harness/suites/history.py) share this layer.

  sqlite.py    one SQLite helper for both: writer/reader engines (WAL, busy timeout), unreadable files,
               backups
  tables.py    the head schema of both stores, written once through SQLAlchemy `Table`s
  migrate.py   the revision check, backup-then-migrate for writers, readers that never write
  migrations/  the Alembic scripts, one folder per store, each with its own version table
  url.py       the fleet store: a store URL (KILN_STORE_URL, `--store`): a SQLite file or a PostgreSQL server
  types.py     column types of the same width on both engines
  runner.py    who recorded a run (runner name, GPU model, driver, GPU label, hardware class)
  sync.py      copying runs between stores by UUID (`store push`/`pull`, the spool's drain)
  spool.py     the local spool of a writer whose server is unreachable
  cli.py       `--store URL`/`--store-strict` for every verb, and the `store` verb
"""

from typing import Any

__all__ = ["BENCH", "HISTORY", "Opened", "StoreKind", "head", "open_store", "unreadable_problem"]


def __getattr__(name: str) -> Any:
    """The names of migrate.py, imported on first use: `harness.store.cli`'s flags load without SQLAlchemy (a
    host Python that runs the suites in containers needs only the standard library)."""
    if name in __all__:
        from . import migrate

        return getattr(migrate, name)
    raise AttributeError(name)
