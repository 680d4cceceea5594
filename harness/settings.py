"""The harness's settings: every environment variable the harness reads is read here.

Variables (all optional):
  KILN_ROOT         source tree to test (default: the checkout this package lives in)
  KILN_MATRIX       path of the matrix file (default: <root>/ci/matrix.json)
  KILN_RESULTS      folder that receives one sub-folder per run (default: <root>/results)
  KILN_STATE        harness scratch folder: wheel caches, build contexts, bootstrap roots (<root>/.kiln)
  KILN_DOCKER       docker client to call (default: /usr/bin/docker when present, else `docker` on PATH)
  KILN_NATIVE       "1" runs the suites on this machine's Python instead of in a container
  KILN_BOOTSTRAP    "1" bootstraps the base image with debootstrap without trying to pull it first
  KILN_DEBIAN_MIRROR  Debian mirror for debootstrap (default: the one apt's sources name for the suite)
  KILN_TORCH_INDEX_URL  base URL of PyTorch's per-variant wheel indexes (the matrix's `torch_variant`, e.g.
                    cu130, is appended) for GPU images; unset: pip's own configuration decides
  PIP_INDEX_URL, PIP_EXTRA_INDEX_URL  pip's own variables, handed to image builds as they are
  GITHUB_STEP_SUMMARY  the job summary file of a GitHub Actions step (reports append to it when asked)

No package index or mirror host is written in the repository: they come from these variables or from the
tools' own configuration, so mirrors and air-gapped sites work unchanged.
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
    debian_mirror: str = ""
    torch_index_url: str = ""
    pip_index_url: str = ""
    pip_extra_index_url: str = ""
    github_step_summary: str = ""


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
        debian_mirror=os.environ.get("KILN_DEBIAN_MIRROR", "").strip(),
        torch_index_url=os.environ.get("KILN_TORCH_INDEX_URL", "").strip().rstrip("/"),
        pip_index_url=os.environ.get("PIP_INDEX_URL", "").strip(),
        pip_extra_index_url=os.environ.get("PIP_EXTRA_INDEX_URL", "").strip(),
        github_step_summary=os.environ.get("GITHUB_STEP_SUMMARY", "").strip(),
    )
