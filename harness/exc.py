"""Errors of the harness, the benchmarks' included. The CLI prints any `HarnessError` as one line and exits
with its `exit_code`. (harness/numerics/exc.py holds numerics triage's, all `HarnessError`s too.)"""

from __future__ import annotations


class HarnessError(Exception):
    """An expected failure with a message meant for a person: printed as one line, no traceback."""

    exit_code = 2


class MatrixError(HarnessError):
    """ci/matrix.json is missing, not JSON, or does not match the schema."""


class UnknownBackend(MatrixError):
    """A backend name that the matrix does not define."""


class DockerError(HarnessError):
    """The docker client is missing, the daemon is unreachable, or a docker command failed."""


class ImageError(HarnessError):
    """An image could not be bootstrapped or built."""


class NoDeviceError(HarnessError):
    """The backend needs a GPU (or its driver) that this machine does not have."""


class HealthError(HarnessError):
    """A device is present but failed the health check (wrong matmul, kernel did not compile/run)."""


class ResultsError(HarnessError):
    """A results folder is missing, unreadable, or not a harness results folder."""


class SettingsError(HarnessError):
    """An environment variable read by harness/settings.py holds a value it cannot use."""


class MissingTool(HarnessError):
    """A program or Python package the requested step needs is not installed."""


class RunInterrupted(HarnessError):
    """The run was interrupted (Ctrl-C / SIGTERM); results written so far are kept, marked incomplete."""

    exit_code = 130


class Interrupted(KeyboardInterrupt):
    """Not an error: `process.execute` under the `Forward` interrupt policy was interrupted (Ctrl-C/SIGTERM)
    and the command has ended since; `returncode` is its exit status. A KeyboardInterrupt, so that a caller
    that does not look for it sees the interrupt as such."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(returncode)
        self.returncode = returncode


class QuarantineError(HarnessError):
    """The quarantine file is missing, not valid TOML, or an entry is malformed or duplicated."""


class FlakeRunError(HarnessError):
    """The flake run could not produce per-run outcomes (pytest usage error, nothing collected, no JUnit XML)."""


class CompileCheckError(HarnessError):
    """The compile check could not run: bad dump folder, malformed specialization file, bad target list."""


# ---- the benchmarks (`python -m harness bench`) ---------------------------------------------------------
# Every error a user can cause (bad flag, unknown run id, unreadable JSON, a store written by a newer schema)
# is a `BenchError`: the bench CLI prints its message on one line (`error: ...`) and exits with `exit_code`.


class BenchError(HarnessError):
    """Base of every expected failure of the benchmarks; `exit_code` is what the CLI returns."""


class UsageError(BenchError):
    """A bad command-line value or an unknown name (workload, compiler, profile, timer)."""


class StoreError(BenchError):
    """The SQLite store cannot be opened, is from another schema version, or lacks a requested run."""


class ImportFormatError(BenchError):
    """A JSON file given to `bench import` is not a bench export this code can read."""


class BaselineError(BenchError):
    """A baseline spec (`run:ID`, `ref:NAME`, `window:N`) resolves to no complete run."""


class HistoryError(HarnessError):
    """The test-history store (harness/history.py) is not a readable SQLite file, is from a newer schema, or a
    results folder given to it cannot be recorded."""
