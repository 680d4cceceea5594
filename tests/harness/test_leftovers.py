"""harness.leftovers: processes found through /proc (a fake one for the parsing, the real one for the rest),
named and ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import leftovers

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_read_parses_a_command_name_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "42").mkdir()
    fields = (
        ["S", "1", "7", "9"] + ["0"] * 15 + ["12345"]
    )  # state, ppid, pgrp, session ... starttime is field 22
    (tmp_path / "42" / "stat").write_text(f"42 (a b) c) {' '.join(fields)} 0 0\n")
    (tmp_path / "42" / "cmdline").write_bytes(b"python3\0-c\0print(1)\0")
    assert leftovers.read(42, tmp_path) == leftovers.Proc(42, 12345, 9, "python3 -c print(1)")
    (tmp_path / "42" / "stat").write_text(f"42 (zz) Z {' '.join(fields[1:])} 0 0\n")
    assert leftovers.read(42, tmp_path) is None  # a zombie has ended
    assert leftovers.read(43, tmp_path) is None


def test_a_command_session_left_running_is_found_named_and_ended():
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:])", *SLEEP],
        start_new_session=True,
    )
    leader.wait(30)
    left = leftovers.session(leader.pid)
    try:
        assert [p.cmdline for p in left] == [" ".join(SLEEP)] and left[0].sid == leader.pid
        assert leftovers.describe(left) == f"pid {left[0].pid} ({' '.join(SLEEP)})"
        assert leftovers.end_session(leader.pid, grace_s=5) == left
        assert not leftovers.alive(left[0]) and leftovers.session(leader.pid) == []
    finally:
        for p in left:
            if leftovers.alive(p):
                os.kill(p.pid, 9)


def test_descendants_lists_children_and_grandchildren_and_never_the_own_session():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()", *SLEEP]
    )
    try:
        for _ in range(200):
            below = [
                p
                for p in leftovers.descendants(os.getpid())
                if p.pid == child.pid or " ".join(SLEEP) == p.cmdline
            ]
            if len(below) == 2:
                break
            time.sleep(0.05)
        assert below[0].pid == child.pid and below[1].cmdline == " ".join(SLEEP)
        assert leftovers.end_session(os.getsid(0)) == []  # the caller's own session is never ended
        assert leftovers.end(below, grace_s=5) == below and not any(leftovers.alive(p) for p in below)
    finally:
        child.kill()
        child.wait()
