"""Fixtures of the bench tests: a real SQLite store in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.stores.store import Store


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "bench.sqlite") as s:
        yield s
