"""What `harness repro` does on this machine: check the run's commit out in a scratch git worktree, find or
build the run's image by its content hash, rerun the failing tests, read their outcomes back.

Terms:
  scratch     the folder of one repro (`--out`, else a fresh kiln-repro-* folder in the system's temporary
              folder): `tree/` the worktree, `artifact/` an extracted zip, `repro.log` and `repro.xml` the rerun's
              output and JUnit. The worktree is removed at the end (`--keep` keeps it); the user's own checkout is
              never changed (git records the worktree under .git/worktrees until it is removed).
  worktree's harness  image tags are computed and images built by the harness of the run's commit
              (`python -m harness image tag|build` in the worktree, its KILN_ROOT), so the hash is the one the run
              computed; the wheel caches and bootstrapped bases of this checkout's state folder are shared.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import secrets
import subprocess
import sys
from pathlib import Path

from harness import envinfo
from harness.exc import DockerError, HarnessError, ImageError
from harness.git import git
from harness.git import output as git_output
from harness.process import execute
from harness.record import FAILING
from harness.results import parse_junit
from harness.settings import settings

TREE, LOG, JUNIT = "tree", "repro.log", "repro.xml"


# ---- git -------------------------------------------------------------------------------------------------


def has_commit(repo: Path, sha: str) -> bool:
    """Whether `sha` names a commit of the repository at `repo`."""
    return git_output(repo, "cat-file", "-e", f"{sha}^{{commit}}") is not None


def add_worktree(repo: Path, sha: str, dest: Path) -> Path:
    """`git worktree add --detach dest sha` (the user's checkout is not touched); returns `dest`."""
    if dest.exists():
        raise HarnessError(f"{dest} already exists: give another --out folder")
    proc = git(repo, "worktree", "add", "--detach", str(dest), sha, check=False, timeout=600)
    if proc.returncode != 0:
        raise HarnessError(f"git worktree add of {sha[:12]} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return dest


def remove_worktree(repo: Path, dest: Path) -> None:
    """Remove the worktree at `dest` and its entry in the repository (quietly: the folder may be gone)."""
    git(repo, "worktree", "remove", "--force", str(dest), check=False, timeout=120)
    git(repo, "worktree", "prune", check=False, timeout=120)


# ---- this machine ----------------------------------------------------------------------------------------


def docker_answers() -> bool:
    from harness.docker_client import require_docker

    try:
        require_docker()
    except DockerError:
        return False
    return True


def local_gpus() -> tuple[str, ...]:
    """This machine's GPU models as the driver names them (NVIDIA), () without."""
    return tuple(envinfo.driver_info().get("nvidia_gpus") or ())


def local_versions() -> dict[str, str]:
    """python, torch (with its build suffix, CUDA and HIP versions) and triton of this Python (the one native
    reruns use), spelled as a run records them (`torch.__version__`, `torch.version.cuda`: harness/envinfo.py).
    torch's are read from its `version.py` without importing torch: the package metadata's version drops the
    build suffix of the package index's CUDA wheels (`2.13.0` for `2.13.0+cu130`)."""
    out = {"python": platform.python_version()}
    out.update(torch_build_versions())
    try:
        out["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    return out


def torch_build_versions() -> dict[str, str]:
    """{"torch": __version__, "cuda": ..., "hip": ...} from torch's `version.py` (the keys it sets to a string);
    {} where torch is not installed or that file is not readable."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return {}
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    names = {"__version__": "torch", "cuda": "cuda", "hip": "hip"}
    out: dict[str, str] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id in names and isinstance(value, ast.Constant):
            if isinstance(value.value, str):
                out[names[target.id]] = value.value
    return out


# ---- the worktree's harness: image tag and build ----------------------------------------------------------


def worktree_env(tree: Path) -> dict[str, str]:
    """The environment of `python -m harness` in the worktree: its own root and code, this checkout's state, the
    build logs in the scratch folder (they outlive the worktree)."""
    env = {
        **os.environ,
        "KILN_ROOT": str(tree),
        "KILN_STATE": str(settings().state_dir),
        "KILN_LOGS": str(tree.parent / "logs"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p),
    }
    env.pop("KILN_MATRIX", None)
    return env


def worktree_image_tag(tree: Path, backend: str) -> str | None:
    """The tag the worktree's image inputs hash to here (`python -m harness image tag`), None when its harness
    cannot say (printed as one line)."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "image", "tag", "--backend", backend],
        cwd=tree,
        env=worktree_env(tree),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"repro: the commit's image tag could not be computed: {why}", flush=True)
        return None
    return lines[-1].strip()


def build_image(tree: Path, backend: str, tag: str) -> None:
    """Build the worktree's image (`python -m harness image build`, minutes); an image other than `tag` is an
    ImageError."""
    print(
        f"repro: building {tag} from the run's commit (minutes; `python -m harness image build`)", flush=True
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "image", "build", "--backend", backend],
        cwd=tree,
        env=worktree_env(tree),
        stdout=subprocess.PIPE,
        text=True,
        timeout=None,
        check=False,
    )
    built = (proc.stdout.strip().splitlines() or [""])[-1].strip()
    if proc.returncode != 0:
        raise ImageError(f"the image build of the run's commit failed (exit {proc.returncode})")
    if built != tag:
        raise ImageError(f"the build of the run's commit made {built}, not {tag}")


def image_present(tag: str | None) -> bool:
    if not tag:
        return False
    from harness.images.image import image_id

    return image_id(tag) is not None


# ---- the rerun -------------------------------------------------------------------------------------------


def rerun(
    argv: list[str],
    *,
    env: dict[str, str] | None,
    cwd: Path | None,
    log: Path,
    timeout_s: float,
    container: str | None,
) -> int:
    """Run the rerun's command, its output echoed and logged; its exit status."""
    rc, timed_out = execute(
        argv, log=log, timeout_s=timeout_s, env=env, cwd=cwd, echo=True, container=container
    )
    if timed_out:
        print(f"repro: the rerun passed its {timeout_s:.0f} s limit and was stopped", flush=True)
    return rc


def outcomes(junit: Path, root: Path, targets: tuple[str, ...]) -> dict[str, str]:
    """Each target's outcome in the rerun's JUnit (`not run` for one that is not there: gone at that commit, or the
    process died first)."""
    found: dict[str, str] = {}
    if junit.is_file():
        for t in parse_junit(junit, root):
            if t.id not in found or t.outcome in FAILING:
                found[t.id] = str(t.outcome)
    return {t: found.get(t, "not run") for t in targets}


def why_not_run(test: str, tree: Path, log: Path) -> str:
    """Why a target did not run, where the tree or pytest's log says: its file is not in the tree (gone or
    renamed at this commit), or pytest found no such test in it (``ERROR: not found: ...``); else empty (the
    process stopped first: the log says how)."""
    path, _, name = test.partition("::")
    if not (tree / path).is_file():
        return f"{path} is not in this tree"
    text = log.read_text(errors="replace") if log.is_file() else ""
    if any("not found:" in line and line.rstrip().endswith(f"::{name}") for line in text.splitlines()):
        return f"{path} has no test {name} here"
    return ""


def container_name(backend: str) -> str:
    return f"kiln-repro-{backend}-{secrets.token_hex(4)}"
