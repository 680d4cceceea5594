"""Fixtures shared by the compiler's unit tests."""

from __future__ import annotations

import pytest

from compiler import config
from compiler.runtime import reset_compile_stats


@pytest.fixture
def gc_dir(tmp_path):
    """The graph cache on (tests run with KILN_CACHE=0), in a fresh folder, kernel sources beside it; compile
    counters reset."""
    folder = tmp_path / "graphs"
    with config.patch(
        cache="1", graph_cache_dir=str(folder), cache_dir=str(tmp_path / "kernels"), strict=True
    ):
        reset_compile_stats()
        yield folder
