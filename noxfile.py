"""Front door of kiln: every CI job and every local run goes through a session here.

Sessions are verbs with one-line docstrings. CI files stay thin: they call nox.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

# Pins for the CPU (interpreter) environment. GPU images pin their own builds in docker/ and ci/matrix.json.
TORCH_PIN = "torch==2.13.0"
TRITON_PIN = "triton==3.9.0"

# The four suites the harness runs, plus unit tests of the compiler and the harness.
SUITES = ["dynamic_shapes", "control_flow", "fallback", "numerics"]

# Determinism for every compiler suite: one process, one compile thread, fixed seeds.
SUITE_ENV = {
    "PYTHONHASHSEED": "0",
    "KILN_COMPILE_THREADS": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def install_project(session: nox.Session) -> None:
    """Install the pinned torch/triton and the project with its test extras into the session venv."""
    session.install(TORCH_PIN, TRITON_PIN)
    session.install("-e", ".[test,bench]")


@nox.session(python=False if os.environ.get("KILN_NO_VENV") else None)
def tests(session: nox.Session) -> None:
    """Run the compiler suites single-threaded and the harness unit tests, on the machine at hand."""
    if not os.environ.get("KILN_NO_VENV"):
        install_project(session)
    suite_paths = [f"tests/{s}" for s in SUITES] + ["tests/compiler"]
    session.run("python", "-m", "pytest", "-p", "no:xdist", *suite_paths, *session.posargs, env=SUITE_ENV)
    session.run("python", "-m", "pytest", "tests/harness", *session.posargs, env=SUITE_ENV)
