"""The venv seed: what the jobs install for this tree's pins, built once per rehearsal (and kept between rehearsals) in
a scratch copy of the tree, and linked into every job's workspace by the checkout stand-in.

Without it every job makes the same venvs again: its "Install nox" step a venv in $RUNNER_TEMP (nox and the stores'
packages: 20 to 80 s a job here), and the jobs that run the project's tests a fresh `.nox/kiln` with torch, triton and
the project (minutes a job). The seed is built in two phases by the jobs' own commands in the runner's environment
(`act_env`), so it holds what a job would install: first the workflows' install steps (`install_steps`) with
RUNNER_TEMP its `runner-temp` folder (KILN_REHEARSE_TEMP_SEED: every pair that runs a step gets it), then the seeded
sessions (`SEEDED_SESSIONS`) with `nox --install-only` in the tree (KILN_REHEARSE_VENV_SEED: the pairs that run them,
`waits_for_seed`). A job's pip and nox still decide: nox reuses `.nox/kiln` only where its stamp matches the pins.
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
# the pairs that wait for the whole seed before they start: the jobs whose steps install a seeded nox venv
WAITING_JOBS = ("lint", "unit-tests", "tests-cpu", "flakes-cpu")


def waits_for_seed(spec: JobSpec) -> bool:
    """Whether `spec`'s job installs a venv the seed's second phase holds (only where it is expected to run to its
    end); every other pair that runs steps waits for the first phase only."""
    return spec.expect == "success" and spec.job in WAITING_JOBS


@dataclass
class Seed:
    """The seed folder (`root`: a copy of the tree whose `.nox` holds the seeded venvs; `root/runner-temp`: what the
    install steps put in RUNNER_TEMP) and its state: `temp_ready`/`ready` are set once the first phase/the whole
    build ended, `temp_ok`/`ok` say whether they hold it, `line` what happened (one line), `took` its seconds."""

    root: Path
    temp_ready: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    temp_ok: bool = False
    ok: bool = False
    line: str = ""
    took: float = 0.0

    @property
    def temp(self) -> Path:
        """The first phase's RUNNER_TEMP."""
        return self.root / "runner-temp"

    def env(self, whole: bool) -> dict[str, str]:
        """The variables that make the checkout stand-in link the seed: its first phase, and with `whole` its second
        (each only where it was built)."""
        out = {"KILN_REHEARSE_TEMP_SEED": str(self.temp)} if self.temp_ok else {}
        if whole and self.ok:
            out["KILN_REHEARSE_VENV_SEED"] = str(self.root)
        return out

    def skip(self, why: str) -> None:
        """No seed (`why`): both phases end at once, and the jobs install their own."""
        self.line = why
        self.temp_ready.set()
        self.ready.set()


def install_steps(workflows: dict[str, dict]) -> list[str]:
    """The distinct `run` commands of the workflows' steps that make a venv in $RUNNER_TEMP (their "Install nox")."""
    found = [
        str(step.get("run", ""))
        for wf in workflows.values()
        for job in wf["jobs"].values()
        for step in job.get("steps", []) or []
    ]
    return list(dict.fromkeys(r for r in found if "-m venv" in r and "$RUNNER_TEMP" in r))


def seed_commands(python: str, steps: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """The two phases' commands: the workflows' own install steps (`install_steps`, run with RUNNER_TEMP the seed's
    runner-temp), then the seeded sessions with `nox --install-only`."""
    return (
        [["bash", "-e", "-c", step] for step in steps],
        [[python, "-m", "nox", "--install-only", "-s", *SEEDED_SESSIONS]],
    )


def venv_text_files(venv: Path) -> list[Path]:
    """The small text files of a venv that name its folder or its project's: scripts, pyvenv.cfg, .pth files, the
    editable install's finder and direct_url.json."""
    site = list(venv.glob("lib/python*/site-packages"))
    found = [*(venv / "bin").glob("*"), venv / "pyvenv.cfg"]
    for folder in site:
        found += [
            *folder.glob("*.pth"),
            *folder.glob("__editable__*.py"),
            *folder.glob("*.dist-info/direct_url.json"),
        ]
    return [f for f in found if f.is_file() and not f.is_symlink()]


def link_venv(source: Path, target: Path, old: str, new: str) -> None:
    """`source` (a venv) hard-linked at `target` (no copy), `old` rewritten to `new` in `venv_text_files` (each written
    anew, so that the source's files are untouched)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(source), str(target)], check=True, capture_output=True)
    for f in venv_text_files(target):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if old in text:
            tmp = f.with_name(f.name + ".seed")
            tmp.write_text(text.replace(old, new), encoding="utf-8")
            shutil.copymode(f, tmp)
            os.replace(tmp, f)


def adopt_tree_venv(seed: Seed, root: Path = ROOT) -> str:
    """Where this tree already has nox's project venv (`root/.nox/kiln`, e.g. made by `nox -s tests`) and the seed's
    differs from it (its stamp), the seed takes it (`link_venv`): `nox --install-only` then finds it filled. Returns
    one line saying so, or ""."""
    mine, theirs = root / ".nox" / "kiln", seed.root / ".nox" / "kiln"
    stamp = "kiln-installed.json"
    if not (mine / stamp).is_file():
        return ""
    if (theirs / stamp).is_file() and (theirs / stamp).read_bytes() == (mine / stamp).read_bytes():
        return ""
    try:
        link_venv(mine, theirs, str(root), str(seed.root))
    except (OSError, subprocess.CalledProcessError) as e:  # e.g. another file system: nox installs it instead
        shutil.rmtree(theirs, ignore_errors=True)
        return f"could not link {mine} into the seed ({e}): nox installs it"
    return f"the seed's .nox/kiln linked from {mine}"


def build_seed(seed: Seed, env: dict[str, str], log: Path, steps: list[str], timeout_s: int = 1800) -> Seed:
    """Refresh the seed folder's tree from this tree (the checkout stand-in, keeping `.nox`), then run the two phases
    of `seed_commands` there with the runner's environment `env`; output in `log`. Sets `seed.temp_ready` after the
    first phase and `seed.ready` at the end, whatever happens; a phase that fails leaves the jobs to install."""
    started = time.monotonic()
    try:
        seed.root.mkdir(parents=True, exist_ok=True)
        python = shutil.which("python3", path=env.get("PATH")) or "python3"
        checkout = ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")]
        run_env = {k: v for k, v in env.items() if not k.startswith("KILN_REHEARSE_")}
        run_env.update(
            KILN_REHEARSE_SOURCE=str(ROOT),
            GITHUB_WORKSPACE=str(seed.root),
            KILN_REHEARSE_KEEP=".nox",
            STANDIN_PATH="",
            RUNNER_TEMP=str(seed.temp),
        )
        first, second = seed_commands(python, steps)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as fh:

            def run(argv: list[str]) -> bool:
                fh.write("$ " + " ".join(argv) + "\n")
                fh.flush()
                proc = subprocess.run(
                    argv,
                    cwd=seed.root,
                    env=run_env,
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    timeout=timeout_s,
                    check=False,
                )
                if proc.returncode != 0:
                    seed.line = (
                        f"`{' '.join(argv)[-80:]}` exited {proc.returncode} (log: {log}); jobs install "
                        "their own"
                    )
                return proc.returncode == 0

            if not run(checkout):
                return seed
            shutil.rmtree(seed.temp, ignore_errors=True)  # made afresh by the install steps, as in a job
            seed.temp.mkdir()
            seed.temp_ok = all(run(argv) for argv in first)
            seed.temp_ready.set()
            if adopted := adopt_tree_venv(seed):
                fh.write(adopted + "\n")
            if not all(run(argv) for argv in second):
                return seed
        venvs = sorted(p.name for p in (seed.root / ".nox").iterdir() if (p / "pyvenv.cfg").is_file())
        seed.ok = bool(venvs)
        seed.line = (
            f".nox/{{{','.join(venvs)}}} and runner-temp/{{{','.join(sorted(os.listdir(seed.temp)))}}} "
            f"in {seed.root}"
            if venvs
            else f"no venv in {seed.root / '.nox'} (log: {log})"
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        seed.line = f"could not build the venv seed: {e}; jobs install their own"
    finally:
        seed.took = time.monotonic() - started
        seed.temp_ready.set()
        seed.ready.set()
    return seed


def default_seed_root() -> Path:
    """~/.cache/kiln/rehearse-venvs (XDG_CACHE_HOME's): kept between rehearsals, as the npm folder is."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "rehearse-venvs"
