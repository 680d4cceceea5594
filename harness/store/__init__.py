"""The harness's stores on SQLAlchemy Core + Alembic: the bench store (harness/bench/store.py) and the test
history (harness/suites/history.py) share this layer.

  sqlite.py    one SQLite helper for both: writer/reader engines (WAL, busy timeout), unreadable files,
               backups
  tables.py    the head schema of both stores, written once through SQLAlchemy `Table`s
  migrate.py   the revision check, backup-then-migrate for writers, readers that never write
  migrations/  the Alembic scripts, one folder per store, each with its own version table
"""

from .migrate import BENCH, HISTORY, Opened, StoreKind, head, open_store, unreadable_problem

__all__ = ["BENCH", "HISTORY", "Opened", "StoreKind", "head", "open_store", "unreadable_problem"]
