"""Error classes of the benchmark package.

Every error a user can cause (bad flag, unknown run id, unreadable JSON, a store written by a newer
schema) is a `BenchError`: the CLI prints its message on one line and exits with `exit_code`.
"""

from __future__ import annotations


class BenchError(Exception):
    """Base of every expected failure; `exit_code` is what the CLI returns."""

    exit_code = 2


class UsageError(BenchError):
    """A bad command-line value or an unknown name (workload, compiler, profile, timer)."""


class StoreError(BenchError):
    """The SQLite store cannot be opened, is from another schema version, or lacks a requested run."""


class ImportFormatError(BenchError):
    """A JSON file given to `import` is not a bench export this code can read."""


class BaselineError(BenchError):
    """A baseline spec (`run:ID`, `ref:NAME`, `window:N`) resolves to no complete run."""
