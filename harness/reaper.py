"""`python -m harness.reaper PID CONTAINER DOCKER`: remove CONTAINER once process PID is gone.

Started detached (its own session) by `harness.process.execute` for every container it runs, and killed by it
when the container is done. If the harness dies first (SIGKILL, OOM), its `docker run` client gets the
parent-death signal but the container is the daemon's child and would run on: this watcher removes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    pid, container, docker = int(argv[0]), argv[1], argv[2]
    while alive(pid):
        time.sleep(1.0)
    subprocess.run(
        [docker, "rm", "--force", container],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
