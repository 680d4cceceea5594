"""The cancel check (ci/rehearse/rehearsal/cancel.py): its verdict, and its reading of the processes below act."""

from __future__ import annotations

import os
import subprocess
import sys

from rehearsal.act import JobRun, StepRun
from rehearsal.cancel import alive, cancel_verdict, descendants
from rehearse_helpers import ROOT  # noqa: F401  (makes `rehearsal` importable)


def _run(*steps: tuple[str, str]) -> list:
    return [JobRun("ci/unit tests", [StepRun("Main", n, r) for n, r in steps], "failed")]


def test_the_cancel_verdict():
    teardown = "nox -s ci-teardown (this job's containers, stale ones, superseded kiln image tags)"
    good = _run(("Install nox", "success"), ("nox -s unit-tests", "failure"), (teardown, "success"))
    assert cancel_verdict(good, {}, set(), True).ok
    assert "never reached pytest" in cancel_verdict(good, {}, set(), False).line
    later = _run(("nox -s unit-tests", "failure"), ("Upload results", "success"), (teardown, "success"))
    assert cancel_verdict(later, {}, set(), True).line == "after the cancel act started 'Upload results'"
    assert (
        "teardown did not run" in cancel_verdict(_run(("nox -s unit-tests", "failure")), {}, set(), True).line
    )
    left = cancel_verdict(good, {42: "python -m pytest tests/compiler"}, set(), True)
    assert not left.ok and "pid 42: python -m pytest" in left.line
    assert "1 container(s) still ran" in cancel_verdict(good, {}, {"abc"}, True).line


def test_descendants_and_alive_read_proc():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"]
    )
    try:
        import time

        for _ in range(100):
            found = descendants(os.getpid())
            if any(cmd.startswith("sleep 30") for cmd in found.values()):
                break
            time.sleep(0.1)
        assert child.pid in found and any(cmd.startswith("sleep 30") for cmd in found.values())
        assert alive(child.pid)
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
    assert not alive(child.pid)
