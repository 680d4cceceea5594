"""harness/process.py: output teed to the log, the timeout kills the whole process group, exit codes kept,
and the interrupt policies: by default an interrupt stops the command at once; under Forward the command
gets SIGINT and time to write its outputs, and is killed when it lets the grace period pass."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.process import execute, kill_group

ROOT = Path(__file__).resolve().parents[2]


def test_execute_tees_output_and_keeps_the_exit_code(tmp_path, capsys):
    log = tmp_path / "out.log"
    rc, timed_out = execute(
        [sys.executable, "-c", "print('hello'); raise SystemExit(3)"], log=log, timeout_s=60
    )
    assert (rc, timed_out) == (3, False)
    assert "hello" in log.read_text() and "hello" in capsys.readouterr().out


def test_timeout_kills_the_command_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    # the timeout leaves a loaded host time to start both processes; the command would sleep far longer than it
    script = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(600)"
    )
    t0 = time.monotonic()
    rc, timed_out = execute([sys.executable, "-c", script], log=tmp_path / "t.log", timeout_s=15, echo=False)
    assert timed_out and rc != 0 and time.monotonic() - t0 < 300
    assert "killed after the suite timeout of 15s" in (tmp_path / "t.log").read_text()
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


def test_execute_keeps_output_without_a_newline_and_any_bytes(tmp_path):
    log = tmp_path / "out.log"
    script = (
        "import sys; sys.stdout.buffer.write(b'..' + 'caf\\u00e9'.encode() + b'\\xff'); sys.stdout.flush()"
    )
    rc, _ = execute([sys.executable, "-c", script], log=log, timeout_s=60, echo=False)
    assert rc == 0 and log.read_text(encoding="utf-8") == "..caf\u00e9\ufffd"


# ---- interrupt policies -------------------------------------------------------------------------------
# A driver process runs `execute` (an interrupt must reach the main thread of the process running it, which
# must not be pytest's); the test signals the driver once the command says it is ready.

DRIVER = """
import signal, sys
from pathlib import Path
from harness.exc import Interrupted
from harness.process import Forward, execute
if sys.argv[3] == 'ctrl-c':
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
grace = float(sys.argv[4])
policy = Forward(grace_s=grace) if grace >= 0 else None
try:
    execute([sys.executable, '-c', sys.argv[1]], log=Path(sys.argv[2]), timeout_s=600, on_interrupt=policy,
            echo=False)
    print('finished', flush=True)
except Interrupted as e:
    print('interrupted', e.returncode, flush=True)
except KeyboardInterrupt:
    print('stopped', flush=True)
"""


def _drive(tmp_path, command: str, *, how: str, grace_s: float, driver_code: str = "") -> tuple[str, float]:
    """Run `command` under execute in a driver with SIGINT ignored (a background job of a non-interactive
    shell, as in CI), interrupt the driver by `how` (ctrl-c: SIGINT, else SIGTERM) once `ready` exists;
    returns (the driver's output, seconds from the signal to the driver's exit)."""
    ready = tmp_path / "ready"
    driver = subprocess.Popen(
        [sys.executable, "-c", driver_code or DRIVER, command, str(tmp_path / "cmd.log"), how, str(grace_s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        for _ in range(1200):
            if ready.exists() or driver.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), f"the command did not start: {driver.communicate(timeout=60)[0]}"
        t0 = time.monotonic()
        driver.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
        out, _ = driver.communicate(timeout=240)
        return out, time.monotonic() - t0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def _command(tmp_path, body: str) -> str:
    """A Python command that writes its pid to `pid`, says `ready`, then runs `body`."""
    return (
        f"import os, signal, sys, time; from pathlib import Path\n"
        f"Path({str(tmp_path / 'pid')!r}).write_text(str(os.getpid()))\n"
        f"Path({str(tmp_path / 'ready')!r}).write_text('')\n" + body
    )


def test_forward_lets_the_command_write_its_outputs_on_sigterm(tmp_path):
    """SIGTERM to the harness reaches the command as SIGINT (reset from ignored to the default, so Python's
    KeyboardInterrupt): it finishes writing its outputs, and its exit status comes back."""
    outputs = tmp_path / "outputs.xml"
    body = (
        "try:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n    time.sleep(1)  # still writing\n"
        f"    Path({str(outputs)!r}).write_text('<testsuites/>')\n    sys.exit(2)\n"
    )
    out, _ = _drive(tmp_path, _command(tmp_path, body), how="sigterm", grace_s=120)
    assert out.strip() == "interrupted 2"
    assert outputs.read_text() == "<testsuites/>"


def _sigterm_during_a_slow_start(tmp_path, slow: str) -> None:
    """Drive a command under Forward with the driver's start slowed by ``slow`` (code run before ``DRIVER``),
    SIGTERM meanwhile: the command keeps its outputs and its status comes back."""
    outputs = tmp_path / "outputs.xml"
    body = (
        "try:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n"
        f"    Path({str(outputs)!r}).write_text('<testsuites/>')\n    sys.exit(2)\n"
    )
    out, _ = _drive(tmp_path, _command(tmp_path, body), how="sigterm", grace_s=120, driver_code=slow + DRIVER)
    assert out.strip() == "interrupted 2"
    assert outputs.read_text() == "<testsuites/>"


def test_forward_holds_for_a_sigterm_while_execute_is_still_starting_its_reader(tmp_path):
    """A SIGTERM that arrives after the command started but before `execute` waits on it (its reader thread and
    heartbeat starting: a descheduled main thread on a loaded CI host, here a heartbeat that takes two seconds to
    start) still goes through the Forward policy: the command keeps its outputs and its status comes back."""
    slow_start = (
        "import time\nimport harness.process as hp\n_enter = hp.Heartbeat.__enter__\n"
        "hp.Heartbeat.__enter__ = lambda self: (time.sleep(2), _enter(self))[1]\n"
    )
    _sigterm_during_a_slow_start(tmp_path, slow_start)


def test_forward_holds_for_a_sigterm_while_popen_is_still_returning(tmp_path):
    """A SIGTERM that arrives while ``Popen`` has started the command but not yet returned (the parent descheduled
    on a loaded CI host, here two seconds asleep after the fork) is held and delivered once ``execute`` can
    apply the Forward policy: the command keeps its outputs and its status comes back ('stopped' before: the
    interrupt escaped from inside ``Popen``, CI's harness unit phase)."""
    slow_popen = (
        "import subprocess, time\n_Popen = subprocess.Popen\n"
        "class SlowPopen(_Popen):  # the command runs; the parent is not back from Popen for two seconds\n"
        "    def __init__(self, *a, **k):\n        super().__init__(*a, **k)\n        time.sleep(2)\n"
        "subprocess.Popen = SlowPopen\n"
    )
    _sigterm_during_a_slow_start(tmp_path, slow_popen)


def test_forward_on_ctrl_c_to_a_command_that_traps_sigint(tmp_path):
    outputs = tmp_path / "outputs.txt"
    body = (
        f"def done(signum, frame):\n    Path({str(outputs)!r}).write_text('written')\n    sys.exit(7)\n"
        "signal.signal(signal.SIGINT, done)\ntime.sleep(600)\n"
    )
    out, _ = _drive(tmp_path, _command(tmp_path, body), how="ctrl-c", grace_s=120)
    assert out.strip() == "interrupted 7"
    assert outputs.read_text() == "written"


def test_forward_kills_a_command_that_ignores_sigint_after_the_grace_period(tmp_path):
    grace_s = 2
    body = "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)\n"
    out, waited = _drive(tmp_path, _command(tmp_path, body), how="ctrl-c", grace_s=grace_s)
    assert out.strip() == f"interrupted {-signal.SIGTERM}"  # kill_group's SIGTERM, after the grace period
    assert waited >= grace_s
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_default_policy_stops_the_command_at_once(tmp_path):
    """Without a policy the command gets no SIGINT: its group is stopped and the interrupt propagates."""
    outputs = tmp_path / "outputs.txt"
    body = (
        f"def done(signum, frame):\n    Path({str(outputs)!r}).write_text('written')\n    sys.exit(7)\n"
        "signal.signal(signal.SIGINT, done)\ntime.sleep(600)\n"
    )
    out, _ = _drive(tmp_path, _command(tmp_path, body), how="ctrl-c", grace_s=-1)
    assert out.strip() == "stopped"
    assert not outputs.exists() and not _alive(int((tmp_path / "pid").read_text()))


def test_a_sigterm_swallowed_inside_the_block_still_ends_it_as_an_interrupt():
    """A library that catches what is raised inside it (torch's Dynamo while it compiles) swallows the
    `Terminated` of a SIGTERM; the request is kept: `raise_if_terminated` raises it again, and so does the end
    of the `sigterm_interrupts` block. A block without a SIGTERM ends normally, and the flag starts clear."""
    import os
    import threading

    import pytest

    from harness.process import Terminated, raise_if_terminated, sigterm_interrupts

    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM)
    swallowed = []
    with pytest.raises(Terminated), sigterm_interrupts():
        try:  # what Dynamo does with an exception raised while it compiles
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here
        except BaseException as e:  # noqa: BLE001 - the library under imitation swallows everything
            swallowed.append(type(e))
        assert swallowed == [Terminated]
        with pytest.raises(Terminated):
            raise_if_terminated()
    raise_if_terminated()  # the request ended with its block: code after it (the next test) runs on
    inner = []
    with pytest.raises(Terminated), sigterm_interrupts():  # nested: the request reaches the outer block
        try:
            with sigterm_interrupts():
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)
                except Terminated:
                    inner.append("swallowed")
        except Terminated:  # the inner block's end raised it again
            inner.append("raised at the inner end")
    assert inner == ["swallowed", "raised at the inner end"]
    raise_if_terminated()
    with sigterm_interrupts():  # a new block starts clear and ends normally
        raise_if_terminated()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler before the blocks is back
