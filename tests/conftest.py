"""Shared fixtures: fixed seeds, a fresh Dynamo cache per test, and the device the suites run on; the `needs`
marker for optional extras.

Optional extra: a package the project's extras install (transformers: `models`; matplotlib, scipy: `bench`) that
a plain `pip install -e .[test]` lacks. A test that needs one is marked `@pytest.mark.needs("matplotlib")` and
is skipped, with the import error as the reason, where it does not import; it never fails for that.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

# kiln's graph cache (runtime/graph_cache.py) is off in the tests unless a run sets KILN_CACHE: tests that patch
# kiln's passes or launcher must compile, not find yesterday's graph on disk (tests of the cache turn it on)
os.environ.setdefault("KILN_CACHE", "0")

import compiler  # noqa: E402

# Triton's interpreter without a GPU (before anything imports triton.language), then the "kiln" backend
compiler.register()

from kiln_testing import DEVICE, import_problem  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*modules): skip, naming the module and why, where one of these "
        "optional extras does not import (transformers, matplotlib, scipy)",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for module in mark.args:
            problem = import_problem(module)
            if problem is not None:
                pytest.skip(f"needs the optional extra {module}, not importable here ({problem})")


@pytest.fixture
def device() -> str:
    """The device every suite compiles for: CUDA/ROCm when present, else CPU through Triton's interpreter."""
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_state():
    """Fixed seeds and no Dynamo cache carried between tests."""
    torch.manual_seed(0)
    random.seed(0)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _expects_warm_caches() -> bool:
    """KILN_EXPECT_WARM_CACHE=1: this run is answered from kiln's graph cache that an earlier run filled (`nox -s
    tests`' warm cache phase); its session then fails unless the cache answered (see pytest_sessionfinish)."""
    return os.environ.get("KILN_EXPECT_WARM_CACHE", "").strip().lower() in ("1", "true", "yes", "on")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under KILN_EXPECT_WARM_CACHE, a session whose tests passed fails when kiln's graph cache answered no graph or
    compiled again a graph it stores (a miss that was not a graph the cache declines to store)."""
    if not _expects_warm_caches() or exitstatus != 0:
        return
    from compiler.runtime import compile_stats

    stats = compile_stats()
    stored_misses = stats.graph_misses - stats.graph_skips
    if stats.graph_hits == 0 or stored_misses:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    session.config.stash[_WARM_STATS] = stats


_WARM_STATS = pytest.StashKey[object]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The graph cache's counts of a warm run (KILN_EXPECT_WARM_CACHE), and why it failed when it did."""
    stats = config.stash.get(_WARM_STATS, None)
    if stats is None:
        return
    stored_misses = stats.graph_misses - stats.graph_skips
    terminalreporter.write_line(
        f"kiln graph cache, warm run: {stats.graph_hits} hits ({stats.front_hits} before "
        f"AOTAutograd), {stored_misses} graphs compiled again, {stats.graph_skips} not stored"
    )
    if stats.graph_hits == 0 or stored_misses:
        terminalreporter.write_line(
            "FAILED: a warm run must answer every stored graph from the cache (KILN_EXPECT_WARM_CACHE=1)",
            red=True,
        )
