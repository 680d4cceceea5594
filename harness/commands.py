"""Pure command builders for every harness step that starts a process: the suites' environment, the pytest
argv, `docker run` and native command lines. Nothing here runs anything, so each builder is tested alone and
the runner, repro lines, flakes and compile-check build the same commands.

Terms:
  inner command   the `python -m pytest ...` argv run inside the container or, with this machine's Python,
                  natively (`pytest_argv`); identical in both modes.
  container mode  `docker run --rm --init --network none` with the source tree mounted read-only at /src, the
                  output folder at /results, the backend's container options (GPU flags) and environment.
  native mode     the inner command with this machine's Python, from the source tree, same environment.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.matrix import Backend, Matrix

CONTAINER_SRC = "/src"
CONTAINER_RESULTS = "/results"


def suite_env(m: Matrix, b: Backend) -> dict[str, str]:
    """The environment every suite of backend `b` runs with: the matrix's suite_env, then the backend's."""
    return {**m.suite_env, **b.env}


def pytest_argv(targets: Sequence[str], *, junit: str | None = None, test_timeout_s: int | None = None,
                extra: Sequence[str] = ()) -> list[str]:
    """The inner command: one process (`-p no:xdist`), JUnit with file names (xunit1) and every test's exact
    node id (`-p harness.suites.flake_plugin`: the id quarantine and repro lines use), per-test timeout."""
    argv = ["python", "-m", "pytest", "-p", "no:xdist", "-p", "harness.suites.flake_plugin", "-o", "junit_family=xunit1",
            "--tb=short"]
    if junit:
        argv.append(f"--junitxml={junit}")
    if test_timeout_s:
        argv.append(f"--timeout={test_timeout_s}")
    return [*argv, *extra, *targets]


def container_argv(b: Backend, image: str, inner: Sequence[str], *, src: Path | str, env: dict[str, str],
                   results: Path | str | None = None, name: str | None = None, network: bool = False,
                   docker: str = "docker") -> list[str]:
    """`docker run` of `inner` in backend `b`'s image: source read-only, results mounted, no network."""
    argv = [docker, "run", "--rm", "--init"]
    if name:
        argv += ["--name", name]
    if not network:
        argv += ["--network", "none"]
    argv += ["--volume", f"{src}:{CONTAINER_SRC}:ro"]
    if results is not None:
        argv += ["--volume", f"{results}:{CONTAINER_RESULTS}"]
    argv += ["--workdir", CONTAINER_SRC]
    for key in sorted(env):
        argv += ["--env", f"{key}={env[key]}"]
    return [*argv, *b.container_options, image, *inner]


def native_command(inner: Sequence[str], env: dict[str, str], *, src: Path,
                   python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, full environment) that run `inner` with this machine's Python from the source tree."""
    argv = [python or sys.executable, *inner[1:]] if inner and inner[0] == "python" else list(inner)
    full = {**os.environ, **env}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
    return argv, full


def native_shell_line(argv: Sequence[str], env: dict[str, str], src: Path) -> str:
    """A shell line for a native command: `cd SRC && env K=V ... argv`."""
    assigns = [f"{k}={env[k]}" for k in sorted(env)]
    return f"cd {shlex.quote(str(src))} && " + shlex.join(["env", *assigns, *argv])


def with_pythonpath(env: dict[str, str], root: Path | str) -> dict[str, str]:
    """`env` with `root` first on PYTHONPATH (so `harness` and `compiler` import from the source tree)."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), out.get("PYTHONPATH", "")) if p)
    return out

