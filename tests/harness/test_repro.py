"""End to end: a planted CI failure reproduced from the run's artifact with `python -m harness repro`: a scratch
git project whose commit fails, run by the real harness, its results zipped as an artifact, then reproduced at
that commit while the user's checkout has moved on (natively; in the CPU container where its image is built)."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from test_run import harness, make_project, only_run

from harness import matrix
from harness.exc import ImageError
from harness.images import image
from harness.suites import repro_rerun as rr
from scratch_project import scratch_project

GIT = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]

PLANTED = """
import os
from pathlib import Path

def test_fine():
    pass

def test_planted():
    assert os.environ.get("PYTHONHASHSEED") == "0", "the run's seed is not applied"
    value = (Path(__file__).parent / "VALUE").read_text().strip()
    assert value == "fixed", f"planted CI failure: VALUE is {value}"
"""
PLANTED_ID = "tests/alpha/test_alpha.py::test_planted"


def commit(root: Path, message: str) -> str:
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", message], check=True)
    return subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def planted_repo(root: Path) -> str:
    """`root` made a git repository whose one commit holds the planted failure (VALUE is broken); its sha."""
    (root / "tests" / "alpha" / "VALUE").write_text("broken\n")
    (root / "notes.txt").write_text("committed\n")
    (root / ".gitignore").write_text("results/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return commit(root, "planted failure")


def artifact(root: Path, dest: Path) -> Path:
    """results/ zipped as upload-artifact does (paths relative to it), the run folder inside."""
    with zipfile.ZipFile(dest, "w") as z:
        for f in sorted((root / "results").rglob("*")):
            if f.is_file() and f.suffix not in (".sqlite", ".sqlite-wal", ".sqlite-shm"):
                z.write(f, f.relative_to(root / "results").as_posix())
    return dest


def move_on(root: Path) -> str:
    """The user's checkout after the run: the failure fixed in a new commit, and an uncommitted edit."""
    (root / "tests" / "alpha" / "VALUE").write_text("fixed\n")
    fixed = commit(root, "fix")
    (root / "notes.txt").write_text("edited, not committed\n")
    return fixed


def assert_untouched(root: Path, head: str) -> None:
    assert (
        subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        == head
    )
    assert (root / "notes.txt").read_text() == "edited, not committed\n"
    listed = subprocess.run(
        ["git", "-C", str(root), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert len(listed.splitlines()) == 1, listed  # the scratch worktree is gone


def test_a_planted_ci_failure_is_reproduced_natively_from_the_runs_artifact(tmp_path):
    root = scratch_project(tmp_path / "proj", {"alpha": PLANTED})
    sha = planted_repo(root)
    run = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--retries", "0")
    assert run.returncode == 1 and "suite alpha [cpu/native] FAILED: 1 passed, 1 failed" in run.stdout, (
        run.stderr
    )
    zipped = artifact(root, tmp_path / "results-cpu.zip")
    head = move_on(root)

    proc = harness(root, "repro", str(zipped), "--out", str(tmp_path / "scratch"))
    out = proc.stdout
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"(cpu/native, commit {sha[:12]}): 1 failing test(s)" in out
    assert "differs: nothing: same commit, mode, image and hardware as the run" in out
    assert "planted CI failure: VALUE is broken" in out and "seed is not applied" not in out
    assert f"  {PLANTED_ID}: failed here (the run: failed)" in out
    assert out.splitlines()[-1] == "reproduced: 1 of 1 failing test(s) fail again"
    assert_untouched(root, head)

    here = harness(
        root, "repro", str(zipped), "--here", "--out", str(tmp_path / "here")
    )  # on the fixed checkout the failure is gone
    assert here.returncode == 0, here.stdout[-2000:]
    assert (
        f"differs: commit: this checkout's tree (HEAD {head[:12]}) instead of the run's {sha[:12]}"
        in here.stdout
    )
    assert here.stdout.splitlines()[-1] == "reproduced: 0 of 1 failing test(s) fail again"

    by_store = harness(
        root, "repro", only_run(root).name, "--out", str(tmp_path / "store")
    )  # the run's id in the test history store
    assert by_store.returncode == 1 and "reproduced: 1 of 1" in by_store.stdout, by_store.stdout[-2000:]
    assert_untouched(root, head)


def test_a_commit_that_is_not_here_is_one_line_and_nothing_is_run(tmp_path, monkeypatch):
    root = scratch_project(tmp_path / "proj", {"alpha": PLANTED})
    sha = planted_repo(root)
    assert (
        harness(
            root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--retries", "0"
        ).returncode
        == 1
    )
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / "x").write_text("x\n")
    commit(other, "unrelated")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where the scratch folder would be made
    (tmp_path / "tmp").mkdir()
    proc = harness(root, "repro", str(only_run(root)), "--repo", str(other))
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"commit {sha[:12]} of the run is not in this repository" in err[0]
    assert "reproduced:" not in proc.stdout and list((tmp_path / "tmp").iterdir()) == []


def cpu_image_built(root: Path) -> str | None:
    """The CPU image tag the project at `root` builds (its base's local id in the hash, as a build computes it)
    when docker answers and that image is present, else None."""
    try:
        image.require_docker()
        b = matrix.load(root / "ci" / "matrix.json").backend("cpu")
        tag = image.current_tag(b, root=root)
        return tag if image.image_id(tag) else None
    except Exception:  # noqa: BLE001 - no docker here: the test is skipped
        return None


def test_a_planted_ci_failure_is_reproduced_in_the_cpu_container_from_the_runs_artifact(tmp_path):
    root = make_project(tmp_path, with_harness=True)
    tag = cpu_image_built(root)
    if tag is None:
        pytest.skip("CPU image not built on this machine (python -m harness image build --backend cpu)")
    shutil.rmtree(root / "tests" / "beta")
    (root / "tests" / "alpha" / "test_alpha.py").write_text(PLANTED)
    sha = planted_repo(root)
    env_docker = os.environ.get("KILN_DOCKER", "/usr/bin/docker")
    run = harness(
        root, "run", "--backend", "cpu", "--suite", "alpha", "--no-health", "--quiet", "--retries", "0"
    )
    assert run.returncode == 1 and "[cpu/container] FAILED" in run.stdout, (
        run.stdout[-2000:] + run.stderr[-2000:]
    )
    zipped = artifact(root, tmp_path / "results-cpu.zip")
    head = move_on(root)
    proc = harness(root, "repro", str(zipped), "--out", str(tmp_path / "scratch"), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"(cpu/container, commit {sha[:12]})" in proc.stdout and f"in {tag}" in proc.stdout
    assert "planted CI failure: VALUE is broken" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "reproduced: 1 of 1 failing test(s) fail again"
    assert_untouched(root, head)
    left = subprocess.run(
        [env_docker, "ps", "-aq", "--filter", "name=kiln-repro-"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
    # the tree's own harness computes the same content-hash tag, and "rebuilds" it (up to date: nothing to do)
    assert rr.worktree_image_tag(root, "cpu") == tag
    rr.build_image(root, "cpu", tag)
    with pytest.raises(ImageError, match="not kiln-cpu:0000000000000000"):
        rr.build_image(root, "cpu", "kiln-cpu:0000000000000000")
