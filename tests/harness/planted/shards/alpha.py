"""Planted suite `alpha` for tests/harness/test_shard.py, which copies it into a scratch project as
tests/alpha/test_alpha.py (this file's name does not match `test_*.py`, so nothing else collects it).

Every test passes unless KILN_PLANT asks otherwise: `fail` fails test_broken; `crash` kills the process that
runs pytest (a shard's `python -m harness run`: pytest's parent) from test_crash; `hang` stops that process
(SIGSTOP) from test_hang, so the shard never finishes.
"""

import os
import signal

import pytest

PLANT = os.environ.get("KILN_PLANT", "")


@pytest.mark.parametrize("n", range(6))
def test_param(n):
    assert n < 6


class TestGroup:
    def test_a(self):
        pass

    def test_b(self):
        pass


def test_broken():
    assert "fail" not in PLANT, "planted failure"


def test_crash():
    if "crash" in PLANT:
        os.kill(os.getppid(), signal.SIGKILL)


def test_hang():
    if "hang" in PLANT:
        os.kill(os.getppid(), signal.SIGSTOP)


@pytest.mark.skip(reason="planted skip")
def test_skipped():
    pass
