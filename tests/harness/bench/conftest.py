"""Fixtures of the bench tests: a real SQLite store in a temporary folder, and one real tiny model run that the
model tier's tests share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import TINY_MODEL_ARGS, once_per_session

from harness.bench.stores.store import Store

ROOT = Path(__file__).resolve().parents[3]

# what the harness tests' autouse fixture (tests/harness/conftest.py) keeps away from every test
_PRIVATE = ("KILN_HISTORY_DB", "KILN_JOB_ID", "KILN_BENCH_DB", "GITHUB_STEP_SUMMARY", "KILN_GITHUB_SUMMARY")


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "bench.sqlite") as s:
        yield s


def _tiny_model_run(folder: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _PRIVATE and not k.startswith(("KILN_STORE_", "GITHUB_", "KILN_CACHE_"))
    }
    env.update(
        PYTHONPATH=str(ROOT),
        KILN_CACHE="0",
        XDG_DATA_HOME=str(folder / "xdg-data"),
        KILN_COMPILE_CACHE=str(folder / "compile-cache"),
    )
    argv = ["bench", "models", *TINY_MODEL_ARGS, "--out", "m", "--json", "-"]
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    result = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    (folder / "proc.json").write_text(json.dumps(result))


@pytest.fixture(scope="session")
def tiny_model_run(tmp_path_factory) -> tuple[Path, dict]:
    """`python -m harness bench models TINY_MODEL_ARGS --out m --json -` run once per session in a folder of its
    own (shared, read-only: copy before changing it): (the folder, {returncode, stdout, stderr})."""
    folder = once_per_session(tmp_path_factory, "tiny-model", _tiny_model_run)
    return folder, json.loads((folder / "proc.json").read_text())
