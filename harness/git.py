"""The harness's one way of asking git: `git -C REPO ...` with its output captured.

Terms:
  git(repo, *args)     the finished `git -C repo args...` (CompletedProcess, text); `check=True` raises
                       CalledProcessError on a non-zero exit. The bench bisection and the bench jobs use it.
  output(repo, *args)  its stdout (stripped unless `strip=False`), or None when git is missing, fails or takes
                       longer than `timeout` seconds: what environment capture (harness.envinfo) records.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def git(
    repo: Path | str, *args: str, check: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """`git -C repo args...`, its output captured as text (module docstring)."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def output(repo: Path | str, *args: str, strip: bool = True, timeout: float = 20) -> str | None:
    """stdout of `git -C repo args...`, or None when git is missing, fails or times out."""
    if shutil.which("git") is None:
        return None
    try:
        proc = git(repo, *args, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() if strip else proc.stdout
