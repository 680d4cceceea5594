"""Planted tests for the flake detector: one passing, one broken, one flaky on a fixed schedule.

Not part of any suite: the file name does not match `test_*.py`, so only an explicit path collects it,
and without KILN_PLANTED_STATE (a scratch folder the caller makes) the module skips itself.
`tests/harness/test_flakes.py` runs it through `harness.suites.flakes` with pytest-flakefinder.

The flaky test keeps a counter file in KILN_PLANTED_STATE and fails every third run (runs 3, 6, 9, ...),
so with N runs it fails N // 3 times: deterministic, yet neither always passing nor always failing.
The interrupt test raises KeyboardInterrupt on its second run when KILN_PLANTED_INTERRUPT=1, as Ctrl-C would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

STATE = os.environ.get("KILN_PLANTED_STATE")
if not STATE:
    pytest.skip("planted tests run only under the flake detector's own tests", allow_module_level=True)

FLAKY_PERIOD = 3


def _next_count(name: str) -> int:
    path = Path(STATE) / f"{name}.count"
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return n


def test_planted_passing():
    assert sum(range(5)) == 10


def test_planted_broken():
    assert "kiln".upper() == "kiln", "planted broken test: fails on every run"


def test_planted_flaky():
    n = _next_count("flaky")
    assert n % FLAKY_PERIOD != 0, f"planted flake: run {n} fails"


def test_planted_slow():
    """Takes KILN_PLANTED_SLOW seconds per run (0 when unset): time for a signal to arrive mid-run."""
    import time

    time.sleep(float(os.environ.get("KILN_PLANTED_SLOW", "0")))


def test_planted_interrupt():
    """Stands in for Ctrl-C on the second run when KILN_PLANTED_INTERRUPT=1 (else passes)."""
    n = _next_count("interrupt")
    if os.environ.get("KILN_PLANTED_INTERRUPT") == "1" and n == 2:
        raise KeyboardInterrupt
