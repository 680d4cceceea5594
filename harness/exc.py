"""Errors of the harness, the benchmarks' included, and the exit codes of every CLI. The CLI prints any
`HarnessError` as one line and exits with its `exit_code`. (harness/numerics/exc.py holds numerics triage's,
all `HarnessError`s too.)

Exit codes (the same for every verb, `python -m harness.bench` and `python -m harness.numerics` included):
  0  EXIT_OK        done; the tests passed, no regression
  1  EXIT_FAILED    tests failed, a check failed or a regression was found: the code is at fault
  2  EXIT_USAGE     usage or input error: a bad flag, a malformed file or variable, a missing folder (argparse's
                    own usage errors exit 2 too); running again unchanged fails again
  3  EXIT_INFRA     infrastructure: docker, an image build, the health check, no device, a missing tool on the
                    machine, a lock or store that cannot be reached in time; the runner is at fault, a CI retry
                    (on another machine) may pass
  130 EXIT_INTERRUPTED  interrupted (Ctrl-C / SIGTERM)
A CI retry policy retries 3 (and 130), never 1 or 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# a suite's pytest process ended itself after a test left the GPU unusable (harness.suites.journal_plugin); here so that
# the harness reads it without importing pytest (the host side of the harness never needs pytest)
EXIT_POISONED = 86

EXIT_CODES_EPILOG = f"""exit codes:
  {EXIT_OK}    ok (tests passed, no regression)
  {EXIT_FAILED}    tests failed, a check failed, or a regression was found
  {EXIT_USAGE}    usage or input error (bad flag, malformed file or variable, missing folder)
  {EXIT_INFRA}    infrastructure error (docker, image build, health check, no device, missing tool,
       lock or store unreachable): retrying on a working runner may pass
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C / SIGTERM)"""


class HarnessError(Exception):
    """An expected failure with a message meant for a person: printed as one line, no traceback. By default a
    usage or input error (exit 2); `InfrastructureError`s exit 3."""

    exit_code = EXIT_USAGE


class InfrastructureError(HarnessError):
    """The machine, not the code or the command line, is at fault: docker, images, devices, tools, locks."""

    exit_code = EXIT_INFRA


class MatrixError(HarnessError):
    """ci/matrix.json is missing, not JSON, or does not match the schema."""


class UnknownBackend(MatrixError):
    """A backend name that the matrix does not define."""


class DockerError(InfrastructureError):
    """The docker client is missing, the daemon is unreachable, or a docker command failed."""


class ImageError(InfrastructureError):
    """An image could not be bootstrapped or built."""


class ImageInputError(ImageError):
    """The image cannot be made from what the checkout holds (a missing Dockerfile, requirements or lock file, a
    stale lock, no bootstrap entry in the matrix, a lock written under the wrong Python): exit 2, the input is at
    fault, not the machine."""

    exit_code = EXIT_USAGE


class NoDeviceError(InfrastructureError):
    """The backend needs a GPU (or its driver) that this machine does not have."""


class PreflightError(InfrastructureError):
    """The runner cannot take the job (harness/checks/preflight.py): no GPU driver, too few visible GPUs, docker not
    reachable, too little free disk."""


class HealthError(InfrastructureError):
    """A device is present but failed the health check (wrong matmul, kernel did not compile/run)."""


class ResultsError(HarnessError):
    """A results folder is missing, unreadable, or not a harness results folder."""


class SettingsError(HarnessError):
    """An environment variable read by harness/settings.py holds a value it cannot use."""


class MissingTool(InfrastructureError):
    """A program or Python package the requested step needs is not installed."""


class RunInterrupted(HarnessError):
    """The run was interrupted (Ctrl-C / SIGTERM); results written so far are kept, marked incomplete."""

    exit_code = EXIT_INTERRUPTED


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


class StoreUnavailable(StoreError, InfrastructureError):
    """The store is there but cannot be used now: its lock was not released in time, or it cannot be reached
    (exit 3, where a wrong path or schema is an input error, 2). bench/store.py's lock wait raises it."""

    exit_code = EXIT_INFRA


class StoreUnreachable(InfrastructureError):
    """A store's database server cannot be reached (refused, timed out, gone mid-run): the writers keep their
    results in the local spool (harness/store/spool.py) unless `--store-strict` asks for this error (exit 3)."""

    exit_code = EXIT_INFRA


class StoreDenied(InfrastructureError):
    """A store's server answered and refused us: wrong password, unknown role or database, no permission. A
    configuration error, never spooled as if the server were down (exit 3: CI must not go green over it)."""

    exit_code = EXIT_INFRA


class ImportFormatError(BenchError):
    """A JSON file given to `bench import` is not a bench export this code can read."""


class BaselineError(BenchError):
    """A baseline spec (`run:ID`, `ref:NAME`, `window:N`) resolves to no complete run."""


class HistoryError(HarnessError):
    """The test-history store (harness/suites/history.py) is not a readable SQLite file, is from a newer schema, or a
    results folder given to it cannot be recorded."""


def guarded(verb: str, run: Callable[[], int]) -> int:
    """`run()`'s exit code, with any `HarnessError` as one line `harness <verb>: error: ...` and its exit
    code, Ctrl-C as 130 and a closed stdout pipe as 0 (for modules run as `python -m harness.<module>`)."""
    try:
        return run()
    except HarnessError as e:
        print(f"harness {verb}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"harness {verb}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stdout = None  # no flush error at exit
        return EXIT_OK
    except ModuleNotFoundError as e:  # a dependency this Python lacks (nox's own Python has none): one line
        line = missing_dependency_line(e)
        if line is None:
            raise
        print(f"harness {verb}: error: {line}", file=sys.stderr)
        return EXIT_INFRA
    except Exception as e:  # a bad compiler setting met deep inside a verb is still one line, exit 2
        bad = compiler_config_error(e)
        if bad is None:
            raise
        print(f"harness {verb}: error: bad compiler setting: {bad} (compiler/config.py)", file=sys.stderr)
        return EXIT_USAGE


# the project's shared virtualenv (noxfile.py SHARED_VENV), made by the README's set-up (`nox -s ci`, `nox -s tests`)
SHARED_VENV = (".nox", "kiln")


def missing_dependency_line(e: ModuleNotFoundError, root: str | None = None) -> str | None:
    """One line for a third-party module this Python lacks (SQLAlchemy, torch...), naming the Python and the
    project's venv to run the harness with; None for the project's own modules (a bug, not a set-up problem).
    `root`: the checkout (default: the one this file is in)."""
    import os

    top = (e.name or "").split(".")[0]
    if not top or top in ("harness", "compiler", "tests"):
        return None
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(*SHARED_VENV)
    python = os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")
    if not os.path.exists(os.path.join(root, python)):
        hint = f"run `nox -s ci` or `nox -s tests` first: they make the project's venv, {venv}"
    elif os.path.samefile(sys.prefix, os.path.join(root, venv)):
        hint = f"the project's venv lacks it: `nox -s ci` refills {venv} (or `pip install -e '.[test,bench,models]'`)"
    else:
        hint = (
            f"run the harness with the project's venv, which the README's set-up made: `. {venv}/bin/activate` "
            f"(or `{python} -m harness ...`)"
        )
    return f"no module named {top!r} in this Python ({sys.executable}): {hint}"


def compiler_config_error(e: BaseException) -> BaseException | None:
    """The compiler's ConfigError (compiler/exc.py: a bad `KILN_*` value) that `e` is or was raised from
    (torch wraps a backend's errors), or None; found by name so that the harness never imports the compiler."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if (
            type(cur).__name__ == "ConfigError"
            and type(cur).__module__.endswith("exc")
            and isinstance(cur, ValueError)
        ):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None
