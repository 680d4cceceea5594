"""The harness tests never touch the real lasting stores: the lasting data folder (XDG_DATA_HOME, where the
test history lives by default) is a fresh temporary folder per test, and KILN_HISTORY_DB and the fleet store's
settings (KILN_STORE_*) are unset; nor the runner's compile cache (KILN_COMPILE_CACHE, a fresh folder too),
nor a CI job's id (containers labelled with it would be the job's teardown's), nor the GitHub event of a CI job
that runs these tests (the trust scope, harness/trust.py, is `local` unless a test sets one)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
    monkeypatch.setenv("KILN_COMPILE_CACHE", str(tmp_path_factory.mktemp("compile-cache")))
    monkeypatch.delenv("KILN_HISTORY_DB", raising=False)
    monkeypatch.delenv("KILN_JOB_ID", raising=False)
    # nor a fleet store (KILN_STORE_URL); `--store` sets these in-process: set then deleted, so
    # monkeypatch restores them as unset after the test
    for name in ("KILN_STORE_URL", "KILN_STORE_STRICT", "KILN_STORE_READ_ONLY", "KILN_STORE_SPOOL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name in (
        "GITHUB_ACTIONS",
        "GITHUB_EVENT_NAME",
        "GITHUB_EVENT_PATH",
        "GITHUB_REF",
        "GITHUB_REPOSITORY",
        "KILN_CACHE_SCOPE",
        "KILN_CACHE_KEY",
        "KILN_CACHE_KEY_FILE",
        "KILN_CACHE_AUTH",
    ):
        monkeypatch.delenv(name, raising=False)
