"""The venv seed: nox's virtualenvs for this tree's pins, built once per rehearsal (and kept between rehearsals) in a
scratch copy of the tree, and linked into every job's workspace by the checkout stand-in (KILN_REHEARSE_VENV_SEED).

Without it every job that runs the project's tests installs torch, triton and the project into a fresh `.nox/kiln`
(about two minutes a job here), the same install each time. With it the jobs' `nox` finds the venv its stamp asks for
and reuses it; a job whose pins differ from the seed's (nox's own stamp check) installs as before. The seed is built by
the jobs' own sessions with `nox --install-only`, in the runner's environment (`act_env`), so it holds what a job
would install. `SEEDED_SESSIONS` names them: the unit tests' session (the project venv `.nox/kiln`, which every
session of the shared venv reuses) and lint (its own venv, `.nox/lint`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rehearsal.actions import ACTIONS_DIR
from rehearsal.plan import ROOT, JobSpec

SEEDED_SESSIONS = ("unit-tests", "lint")
# the pairs that wait for the seed before they start: the jobs whose steps install a seeded venv
WAITING_JOBS = ("lint", "unit-tests", "tests-cpu", "flakes-cpu")


def waits_for_seed(spec: JobSpec) -> bool:
    """Whether `spec`'s job installs a venv the seed holds (only where it is expected to run to its end)."""
    return spec.expect == "success" and spec.job in WAITING_JOBS


@dataclass
class Seed:
    """The seed folder (`root`: a copy of the tree whose `.nox` holds the seeded venvs) and its state: `ready` is set
    once the build ended, `ok` says whether it holds them, `line` what happened (one line), `took` its seconds."""

    root: Path
    ready: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    line: str = ""
    took: float = 0.0

    def env(self) -> dict[str, str]:
        """What the checkout stand-in needs to link the seed (nothing when the build failed)."""
        return {"KILN_REHEARSE_VENV_SEED": str(self.root)} if self.ok else {}


def seed_commands(python: str) -> list[list[str]]:
    """The commands that fill the seed folder's venvs: each seeded session with `nox --install-only`."""
    return [[python, "-m", "nox", "--install-only", "-s", *SEEDED_SESSIONS]]


def build_seed(seed: Seed, env: dict[str, str], log: Path, timeout_s: int = 1800) -> Seed:
    """Refresh the seed folder's tree from this tree (the checkout stand-in, keeping `.nox`), then run
    `seed_commands` there with the runner's environment `env`; output in `log`. Sets `seed.ready` whatever happens."""
    started = time.monotonic()
    try:
        seed.root.mkdir(parents=True, exist_ok=True)
        python = shutil.which("python3", path=env.get("PATH")) or "python3"
        checkout = ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")]
        run_env = {**env, "KILN_REHEARSE_SOURCE": str(ROOT), "GITHUB_WORKSPACE": str(seed.root),
                   "KILN_REHEARSE_KEEP": ".nox", "STANDIN_PATH": ""}
        run_env.pop("KILN_REHEARSE_VENV_SEED", None)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as fh:
            for argv in [checkout, *seed_commands(python)]:
                fh.write("$ " + " ".join(argv) + "\n")
                fh.flush()
                proc = subprocess.run(argv, cwd=seed.root, env=run_env, stdin=subprocess.DEVNULL, stdout=fh,
                                      stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
                if proc.returncode != 0:
                    seed.line = f"`{' '.join(argv[-4:])}` exited {proc.returncode} (log: {log}); jobs install their own"
                    return seed
        venvs = sorted(p.name for p in (seed.root / ".nox").iterdir() if (p / "pyvenv.cfg").is_file())
        seed.ok = bool(venvs)
        seed.line = (f".nox/{{{','.join(venvs)}}} in {seed.root}" if venvs
                     else f"no venv in {seed.root / '.nox'} (log: {log}); jobs install their own")
    except (OSError, subprocess.TimeoutExpired) as e:
        seed.line = f"could not build the venv seed: {e}; jobs install their own"
    finally:
        seed.took = time.monotonic() - started
        seed.ready.set()
    return seed


def default_seed_root() -> Path:
    """~/.cache/kiln/rehearse-venvs (XDG_CACHE_HOME's): kept between rehearsals, as the npm folder is."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "rehearse-venvs"
