"""harness/process.py: output teed to the log, the timeout kills the whole process group, exit codes kept."""

from __future__ import annotations

import subprocess
import sys
import time

from harness.process import execute, kill_group


def test_execute_tees_output_and_keeps_the_exit_code(tmp_path, capsys):
    log = tmp_path / "out.log"
    rc, timed_out = execute([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], log=log, timeout_s=60)
    assert (rc, timed_out) == (3, False)
    assert "hello" in log.read_text() and "hello" in capsys.readouterr().out


def test_timeout_kills_the_command_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    rc, timed_out = execute([sys.executable, "-c", script], log=tmp_path / "t.log", timeout_s=3, echo=False)
    assert timed_out and rc != 0 and time.monotonic() - t0 < 30
    assert "killed after the suite timeout of 3s" in (tmp_path / "t.log").read_text()
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild was in the same process group: it is gone too (or a zombie)
        if not _alive(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {child} survived the timeout")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that does not reap it counts as dead)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_kill_group_of_a_finished_process_is_a_no_op():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    kill_group(proc)
    assert proc.returncode == 0
