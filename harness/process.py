"""Running commands: the one place that starts a harness subprocess and stops it.

`execute` tees a command's output to a log (and stdout), kills it after a timeout, handles an interrupt by
its policy, and removes its container whatever happens; `kill_group` stops a process and everything it
started. The suites runner, the bench backend verb, compile-check's workers and the flake detector use these.

Progress: while a command runs, a `Heartbeat` prints `progress: <step>: running <elapsed>; last line: <line>` on
stderr every `heartbeat_s` seconds (settings().heartbeat_s, KILN_HEARTBEAT_S; 30 by default, 0: none) in which
nothing of the command was shown (its output is not echoed, or it said nothing), so a long silent step (an image
build, debootstrap, a wheel download, the compile check) still says every 30 s that it is alive and what it did last.

Interrupt policies (Ctrl-C, i.e. KeyboardInterrupt in the main thread, while `execute` waits):
  None (default)  stop the command at once (container, then process group) and re-raise the interrupt.
  Forward(grace_s)  SIGTERM counts as Ctrl-C too; SIGINT is sent to the command's process group, which gets
                  `grace_s` seconds to finish writing its outputs (pytest writes its JUnit XML on the way
                  out) before the group is killed; then `exc.Interrupted` (a KeyboardInterrupt) is raised
                  carrying the command's exit status.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.exc import Interrupted


@dataclass(frozen=True)
class Forward:
    """Interrupt policy of `execute`: forward Ctrl-C/SIGTERM to the command as SIGINT and give it `grace_s`
    seconds to finish before its process group is killed (see the module docstring)."""

    grace_s: float = 60


def kill_group(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """Stop a process started with `start_new_session=True` and everything it started (its process group):
    SIGTERM, then SIGKILL after `grace_s`. A process that is gone already is fine."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(grace_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def stop(proc: subprocess.Popen, container: str | None) -> None:
    """Stop a running command: kill its container (if named), then its process group."""
    from harness import docker_client

    if container:
        docker_client.docker("kill", container, check=False)
    kill_group(proc)


def forward_interrupt(proc: subprocess.Popen, container: str | None, grace_s: float) -> None:
    """Send SIGINT to the command's process group and wait up to `grace_s` for it to end; then stop it.
    Another interrupt while waiting stops it at once (and propagates)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        stop(proc, container)
    except BaseException:
        stop(proc, container)
        raise


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    """libc's prctl, looked up once in the parent: a child between fork and exec must not import or load."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """In a child before exec: ask Linux to SIGKILL this process when the harness dies (even by SIGKILL), so no
    pytest outlives a killed harness and keeps writing into an abandoned run folder. Elsewhere a no-op.
    It only calls a C function that was looked up before the fork (safe beside the harness's threads)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _child_setup() -> None:
    die_with_parent()


def _default_sigint() -> None:
    # a job started in the background of a non-interactive shell ignores SIGINT, and so would its children:
    # restore the default so that a forwarded SIGINT stops the command (runs in the child before exec)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent()


def start_reaper(container: str) -> subprocess.Popen | None:
    """A detached watcher that removes `container` if this harness process dies without doing so (SIGKILL,
    OOM): the container is no child of ours, so the parent-death signal cannot reach it (harness.reaper)."""
    from harness.settings import settings

    try:
        return subprocess.Popen(
            [sys.executable, "-m", "harness.reaper", str(os.getpid()), container, settings().docker],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(settings().root)},
        )
    except OSError:
        return None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cancelled CI job), raised as an interrupt so that Ctrl-C's cleanup runs for it too."""


#: set by the SIGTERM handler: the request outlives the exception it raised, which a library may swallow;
#: it belongs to the outermost `sigterm_interrupts` block, cleared when that block is entered and left
_terminated = threading.Event()
#: how many `sigterm_interrupts` blocks the main thread is inside
_depth = 0


def _raise_terminated(signum: int, frame: Any) -> None:
    _terminated.set()
    raise Terminated()


def raise_if_terminated() -> None:
    """Raise `Terminated` when a SIGTERM arrived inside `sigterm_interrupts` although its exception did not
    propagate: torch's Dynamo catches what is raised while it compiles and goes on, so a SIGTERM landing in a
    compile was lost and a cancelled bench run ran to its end as `complete` (1 run in 4 in a test). Call it
    where a long loop can stop and before work is marked complete. Outside every block it never raises: a
    request ends with the block it arrived in."""
    if _terminated.is_set():
        raise Terminated()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread, as Ctrl-C would; the
    handler before is put back on the way out. The one SIGTERM handler of the harness: the runner, `execute`'s
    Forward policy, the shard supervisor, compile-check and the bench bisection use it. Outside the main thread
    (where Python cannot set a handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _depth
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    if _depth == 0:
        _terminated.clear()
    _depth += 1
    try:
        yield
        raise_if_terminated()  # a SIGTERM swallowed inside the block still ends it as an interrupt
    finally:  # None: the handler was not set from Python
        _depth -= 1
        if _depth == 0:  # raised above or propagated already: a later block or caller starts clear
            _terminated.clear()
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """While inside (a command starting: ``Popen`` forks, execs and returns), SIGINT and SIGTERM are recorded, not
    handled; the list yielded holds what arrived, for the caller to deliver (``signal.raise_signal``) once it can
    handle them, after the handlers before are put back. A signal handled inside ``Popen`` on a loaded host (the
    command already running, the parent descheduled) escaped before ``execute`` could apply its interrupt policy:
    the command kept running and its outputs and status were lost. Outside the main thread it records nothing."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def record(signum: int, frame: Any) -> None:
        got.append(signum)

    saved = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:  # None: the handler was not set from Python
        for sig, handler in saved.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextmanager
def interrupts_after() -> Iterator[None]:
    """SIGINT and SIGTERM arriving inside the block are held (``held_interrupts``) and delivered when it ends
    normally, to the handlers put back: wrap the start of a process together with the line that records it
    where the interrupt handling looks (a shard's table, a list of workers), so that a stop arriving between
    the two still finds and stops it. Delivered nowhere when the block raises (its exception goes on)."""
    with held_interrupts() as held:
        yield
    for signum in held:
        signal.raise_signal(signum)


def elapsed_text(seconds: float) -> str:
    """`45s`, `2m05s`, `1h02m`: a duration for progress lines."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Heartbeat:
    """A thread that prints a progress line for `step` every `interval_s` seconds in which nothing was shown
    (module docstring): `last_line()` gives the command's last log line, `shown()` the monotonic time something was
    last shown (None: never). A context manager; `interval_s` <= 0 prints nothing."""

    def __init__(
        self,
        step: str,
        interval_s: float,
        last_line: Callable[[], str] = lambda: "",
        shown: Callable[[], float | None] = lambda: None,
        out: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.step, self.interval_s, self.last_line, self.shown = step, interval_s, last_line, shown
        self.out, self.clock = out, clock
        self.t0 = clock()
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self) -> str:
        """The progress line now."""
        last = " ".join(self.last_line().split())
        last = last if len(last) <= 160 else last[:157] + "..."
        return f"progress: {self.step}: running {elapsed_text(self.clock() - self.t0)}" + (
            f"; last line: {last}" if last else ""
        )

    def beat(self) -> bool:
        """Print the progress line unless something was shown within the interval; True when printed."""
        shown = self.shown()
        if shown is not None and self.clock() - shown < self.interval_s:
            return False
        out = self.out or sys.stderr
        out.write(self.line() + "\n")
        out.flush()
        self.beats += 1
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except (OSError, ValueError):  # the stream went away: progress is best effort
                return

    def __enter__(self) -> Heartbeat:
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name=f"heartbeat {self.step}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def heartbeat_interval(heartbeat_s: float | None) -> float:
    """`heartbeat_s`, else settings().heartbeat_s (KILN_HEARTBEAT_S)."""
    if heartbeat_s is not None:
        return heartbeat_s
    from harness.settings import settings

    return settings().heartbeat_s


def last_log_line(log: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a log file ("" when it has none or cannot be read)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            lines = fh.read().decode("utf-8", "replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


@dataclass(frozen=True)
class Spawned:
    """A command started by `spawn`: its process and the thread that copies its output to the log."""

    proc: subprocess.Popen
    reader: threading.Thread


def spawn(
    argv: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    echo: bool = True,
    prefix: str = "",
) -> Spawned:
    """Start `argv` in its own process group (it dies with the harness) without waiting for it: its output goes
    line by line to `log` and, when `echo`, to stdout with `prefix` before each line. The caller waits, stops it
    (`kill_group`) and joins the reader (the shards of `harness run --shards` run side by side this way)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=die_with_parent,
    )  # noqa: PLW1509 - no child outlives the harness

    def pump() -> None:
        with open(log, "w", encoding="utf-8", errors="replace") as fh:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                if echo:
                    sys.stdout.write(f"{prefix}{line}")
                    sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return Spawned(proc, reader)


def _wait(
    proc: subprocess.Popen,
    timeout_s: float | None,
    watchdog: Callable[[], str | None] | None,
    fh: Any,
    container: str | None,
) -> int:
    """Wait for `proc` (TimeoutExpired past `timeout_s`); a watchdog's reason stops it at once (logged)."""
    if watchdog is None:
        return proc.wait(timeout=timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        step = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0))
        try:
            return proc.wait(timeout=step)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
        reason = watchdog()
        if reason:
            fh.write(f"\n[harness] killed by the watchdog: {reason}\n")
            fh.flush()
            stop(proc, container)
            return proc.wait()


def _end_leftovers(sid: int, fh: Any, left: list[Any] | None) -> None:
    """End what the command of session `sid` left running; name it in its log and append it to `left`."""
    from harness import leftovers

    ended = leftovers.end_session(sid)
    if ended:
        fh.write(
            f"\n[harness] ended {len(ended)} process(es) the command left running: {leftovers.describe(ended)}\n"
        )
        fh.flush()
        if left is not None:
            left.extend(ended)


def execute(
    argv: list[str],
    *,
    log: Path,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    container: str | None = None,
    echo: bool = True,
    on_interrupt: Forward | None = None,
    watchdog: Callable[[], str | None] | None = None,
    step: str | None = None,
    heartbeat_s: float | None = None,
    left: list[Any] | None = None,
) -> tuple[int, bool]:
    """Run `argv` with output teed live to `log` (and stdout when `echo`); kill it after `timeout_s` (None: no
    limit). The container (if named) is removed whatever happens. Returns (returncode, timed_out).
    An interrupt is handled by `on_interrupt` (module docstring): by default the command is stopped and the
    KeyboardInterrupt propagates; under `Forward` it raises `Interrupted` once the command has ended.
    `watchdog`, asked every second while the command runs, returns a reason to kill it now (a hung test) or None.
    The command dies with the harness (parent-death signal); a container, through a reaper process. What it left
    running in its session once it has ended is ended too (harness.leftovers), logged, and appended to `left`.
    Progress: a `Heartbeat` named `step` (default: the log's name) every `heartbeat_s` seconds of silence (default
    settings().heartbeat_s)."""
    from harness import docker_client

    log.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    # under Forward, SIGTERM (a cancelled CI job) is handled like Ctrl-C: the command is asked to stop, keeps outputs
    with sigterm_interrupts() if on_interrupt is not None else nullcontext():
        with open(log, "w", encoding="utf-8") as fh:
            reaper: subprocess.Popen | None = None
            reader: threading.Thread | None = None
            beat: Heartbeat | None = None
            seen: dict[str, Any] = {"line": "", "partial": "", "shown": None}

            def pump() -> None:  # the reader thread: the command's output into the log (and stdout)
                assert proc.stdout is not None
                decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
                while True:
                    # os.read returns what is there: output without a newline (pytest's progress dots) shows now
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    text = decoder.decode(chunk, final=not chunk)
                    if text:
                        fh.write(text)
                        fh.flush()  # the log is what a person tails during a long run
                        if echo:
                            sys.stdout.write(text)
                            sys.stdout.flush()
                            seen["shown"] = time.monotonic()
                        lines = (seen["partial"] + text).replace("\r", "\n").split("\n")
                        seen["partial"] = lines[-1][-4096:]
                        done = [ln for ln in lines[:-1] if ln.strip()]
                        if done:
                            seen["line"] = done[-1]
                    if not chunk:
                        return

            with held_interrupts() as held:  # one arriving while the command starts is delivered below
                proc = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=_default_sigint if on_interrupt is not None else _child_setup,
                )  # noqa: PLW1509
            # everything after the start is inside the try: an interrupt (SIGTERM under Forward) that arrives
            # while the command, the reader and the heartbeat start still reaches the command through the policy
            try:
                try:
                    for signum in held:
                        signal.raise_signal(signum)  # handled now, by the handlers put back
                    reaper = start_reaper(container) if container else None
                    reader = threading.Thread(target=pump, daemon=True)
                    reader.start()
                    beat = Heartbeat(
                        step or log.stem,
                        heartbeat_interval(heartbeat_s),
                        last_line=lambda: seen["partial"].strip() or seen["line"],
                        shown=lambda: seen["shown"],
                    )
                    beat.__enter__()
                    rc = _wait(proc, timeout_s, watchdog, fh, container)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    fh.write(f"\n[harness] killed after the suite timeout of {timeout_s:.0f}s\n")
                    stop(proc, container)
                    rc = proc.returncode
            except KeyboardInterrupt:
                if on_interrupt is None:
                    stop(proc, container)
                    raise
                forward_interrupt(proc, container, on_interrupt.grace_s)
                raise Interrupted(proc.returncode) from None
            except BaseException:
                stop(proc, container)
                raise
            finally:
                if beat is not None:
                    beat.__exit__()
                if (
                    proc.poll() is not None
                ):  # before the reader's wait: a leftover may hold the output pipe open
                    _end_leftovers(proc.pid, fh, left)
                if reader is not None:
                    reader.join(timeout=10)
                if container:
                    docker_client.docker("rm", "--force", container, check=False)
                if reaper is not None:
                    reaper.kill()
                    reaper.wait()
    return rc, timed_out
