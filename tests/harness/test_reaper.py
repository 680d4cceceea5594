"""harness.reaper: a container outlives no harness. The reaper watches a process and, once it is gone, removes
the container with the given docker client (a stand-in script that records its arguments here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_reaper_removes_the_container_once_the_harness_is_gone(tmp_path):
    calls = tmp_path / "calls.txt"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    docker.chmod(0o755)
    harness = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"]
    )  # ends when killed below
    reaper = subprocess.Popen(
        [sys.executable, "-m", "harness.reaper", str(harness.pid), "kiln-cpu-x", str(docker)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    time.sleep(1.5)
    assert not calls.exists() and reaper.poll() is None  # the harness lives: the container is left alone
    harness.kill()
    harness.wait()
    assert reaper.wait(timeout=300) == 0  # a bound on a hang only: the reaper ends once it sees the pid gone
    assert calls.read_text().split() == ["rm", "--force", "kiln-cpu-x"]
