"""Running commands: the one place that starts a harness subprocess and stops it.

`execute` tees a command's output to a log (and stdout), kills it after a timeout, forwards an interrupt by
stopping it, and removes its container whatever happens; `kill_group` stops a process and everything it
started. The suites runner, the bench backend verb and compile-check's workers use these. (flakes.run_pytest
keeps its own loop: it forwards Ctrl-C to pytest so that pytest writes its JUnit XML before it exits.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


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
    from harness import image

    if container:
        image.docker("kill", container, check=False)
    kill_group(proc)


def execute(argv: list[str], *, log: Path, timeout_s: float, env: dict[str, str] | None = None,
            cwd: Path | None = None, container: str | None = None, echo: bool = True) -> tuple[int, bool]:
    """Run `argv` with output teed to `log` (and stdout when `echo`); kill it after `timeout_s`.
    The container (if named) is removed whatever happens. Returns (returncode, timed_out)."""
    from harness import image

    log.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                text=True, errors="replace", start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                fh.write(f"\n[harness] killed after the suite timeout of {timeout_s:.0f}s\n")
                stop(proc, container)
                rc = proc.returncode
        except BaseException:
            stop(proc, container)
            raise
        finally:
            reader.join(timeout=10)
            if container:
                image.docker("rm", "--force", container, check=False)
    return rc, timed_out
