"""The harness's settings: every environment variable the harness reads is read here.

Variables (all optional):
  KILN_ROOT         source tree to test (default: the checkout this package lives in)
  KILN_MATRIX       path of the matrix file (default: <root>/ci/matrix.json)
  KILN_RESULTS      folder that receives one sub-folder per run (default: <root>/results)
  KILN_STATE        harness scratch folder: wheel caches, build contexts, bootstrap roots (<root>/.kiln)
  KILN_DOCKER       docker client to call (default: /usr/bin/docker when present, else `docker` on PATH)
  KILN_NATIVE       "1" runs the suites on this machine's Python instead of in a container
  KILN_BOOTSTRAP    "1" bootstraps the base image with debootstrap without trying to pull it first
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _default_docker() -> str:
    # Debian's client builds with its built-in BuildKit; a newer client on PATH may need a buildx plugin.
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


@dataclass(frozen=True)
class Settings:
    """Typed view of the harness's environment variables (see the module docstring)."""

    root: Path
    matrix_path: Path
    results_root: Path
    state_dir: Path
    docker: str
    native: bool
    bootstrap: bool


def settings() -> Settings:
    """Read the environment now and return the settings."""
    root = Path(os.environ.get("KILN_ROOT") or PACKAGE_ROOT).resolve()
    return Settings(
        root=root,
        matrix_path=Path(os.environ.get("KILN_MATRIX") or root / "ci" / "matrix.json"),
        results_root=Path(os.environ.get("KILN_RESULTS") or root / "results"),
        state_dir=Path(os.environ.get("KILN_STATE") or root / ".kiln"),
        docker=os.environ.get("KILN_DOCKER") or _default_docker(),
        native=_flag("KILN_NATIVE"),
        bootstrap=_flag("KILN_BOOTSTRAP"),
    )
