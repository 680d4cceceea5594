"""The docker client: the argv prefix from settings, a reachability check with a clear message, and one
command runner whose failure is a `DockerError` with the last line of docker's stderr. At the ground floor:
process control (kill a container) and the images both use it."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from harness.exc import DockerError
from harness.settings import settings


def docker_base() -> list[str]:
    """The docker client argv prefix (settings().docker)."""
    return [settings().docker]


def require_docker() -> None:
    """Fail with a clear message when the docker client is missing or its daemon is unreachable."""
    client = settings().docker
    if shutil.which(client) is None:
        raise DockerError(
            f"docker client {client!r} not found: install docker (apt-get install docker.io) "
            "or run natively with --native / KILN_NATIVE=1"
        )
    try:
        proc = subprocess.run(
            [client, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        raise DockerError("docker daemon did not answer within 30 s (is dockerd hung?)") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DockerError(
            f"cannot reach the docker daemon ({detail}); start it (e.g. `dockerd > /tmp/dockerd.log 2>&1 &`)"
            " or run natively with --native"
        )


def docker(*args: str, check: bool = True, capture: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    """Run one docker command; a failure raises DockerError with the last line of its stderr."""
    argv = [*docker_base(), *args]
    proc = subprocess.run(argv, capture_output=capture, text=True, **kw)
    if check and proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] if capture else []
        raise DockerError(f"`docker {' '.join(args[:2])}` failed (exit {proc.returncode}): {' '.join(tail)}")
    return proc
