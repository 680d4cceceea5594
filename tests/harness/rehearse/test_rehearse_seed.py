"""The venv seed (ci/rehearse/rehearsal/seed.py and the checkout stand-in's linking of it): which pairs wait for it,
what builds it, and the stand-in's copy of a seeded venv into a workspace, its paths rewritten and the seed
untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rehearsal.actions import ACTIONS_DIR
from rehearsal.plan import JobSpec, default_jobs
from rehearsal.seed import (
    SEEDED_SESSIONS,
    Seed,
    adopt_tree_venv,
    build_seed,
    install_steps,
    seed_commands,
    waits_for_seed,
)
from rehearse_helpers import WORKFLOWS


def test_the_pairs_that_run_the_seeded_sessions_wait_for_it():
    waiting = {(s.job, s.label) for s in default_jobs("", 2) if waits_for_seed(s)}
    assert ("unit-tests", "push") in waiting and ("tests-cpu", "pull_request (same-repo)") in waiting
    assert ("flakes-cpu", "schedule") in waiting and ("lint", "pull_request (fork)") in waiting
    # skipped by the guard, or stopped at the pre-flight: they install nothing the seed holds
    assert ("unit-tests", "pull_request (fork)") not in waiting and ("tests-cuda", "push") not in waiting
    assert not waits_for_seed(JobSpec("bench.yml", "bench-cuda", "push", expect="preflight"))


def test_the_seed_is_built_by_the_jobs_own_install_steps_then_their_sessions_install_only():
    steps = install_steps(WORKFLOWS)
    assert len(steps) == 1 and steps[0].startswith(
        'python3 -m venv "$RUNNER_TEMP/venv" && '
    )  # every "Install nox"
    first, (argv,) = seed_commands("/usr/bin/python3", steps)
    assert first == [["bash", "-e", "-c", steps[0]]]
    assert argv[:4] == ["/usr/bin/python3", "-m", "nox", "--install-only"]
    assert argv[argv.index("-s") + 1 :] == list(SEEDED_SESSIONS) == ["unit-tests", "lint"]
    seed = Seed(Path("/s"))
    assert seed.env(True) == {}  # not built: the jobs install their own
    seed.temp_ok = True
    assert seed.env(True) == seed.env(False) == {"KILN_REHEARSE_TEMP_SEED": "/s/runner-temp"}
    seed.ok = True
    assert seed.env(True) == {"KILN_REHEARSE_TEMP_SEED": "/s/runner-temp", "KILN_REHEARSE_VENV_SEED": "/s"}
    seed.skip("none (--no-venv-seed)")
    assert seed.ready.is_set() and seed.temp_ready.is_set()


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_a_failed_seed_build_says_so_and_leaves_the_jobs_to_install(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a")
    _git("init", "-q", cwd=src)
    _git("add", "-A", cwd=src)
    _git("commit", "-qm", "one", cwd=src)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho 'nox: no such session' >&2\nexit 3\n")
    fake.chmod(0o755)
    import rehearsal.seed as seed_mod

    seed = Seed(tmp_path / "seed")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    monkeypatch.setattr(seed_mod, "ROOT", src)
    build_seed(seed, env, tmp_path / "seed.log", ["true"])
    assert seed.ready.is_set() and seed.temp_ok and not seed.ok  # the install step ran; nox did not
    assert seed.env(True) == {"KILN_REHEARSE_TEMP_SEED": str(seed.temp)}
    assert "exited 3" in seed.line and "jobs install their own" in seed.line
    assert "nox: no such session" in (tmp_path / "seed.log").read_text()


@pytest.mark.skipif(not shutil.which("git") or not shutil.which("tar"), reason="needs git and tar")
def test_checkout_links_the_seed_venvs_with_their_paths_rewritten(tmp_path):
    src, ws, seed = tmp_path / "src", tmp_path / "ws", tmp_path / "seed"
    src.mkdir()
    ws.mkdir()
    (src / "a").write_text("a")
    _git("init", "-q", cwd=src)
    _git("add", "-A", cwd=src)
    _git("commit", "-qm", "one", cwd=src)
    venv = seed / ".nox" / "kiln"
    site = venv / "lib" / "python3.11" / "site-packages"
    (venv / "bin").mkdir(parents=True)
    (site / "kiln-0.1.0.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {venv}\n")
    (venv / "bin" / "pytest").write_text(f"#!{venv}/bin/python\nimport pytest\n")
    (venv / "bin" / "pytest").chmod(0o755)
    (site / "__editable___kiln_finder.py").write_text(f"MAPPING = {{'compiler': '{seed}/compiler'}}\n")
    (site / "kiln-0.1.0.dist-info" / "direct_url.json").write_text(f'{{"url": "file://{seed}"}}\n')
    (site / "torch.py").write_text("big = 1\n")  # a package's file: linked, not copied
    temp_seed, temp = tmp_path / "temp-seed", tmp_path / "runner-temp"
    (temp_seed / "venv" / "bin").mkdir(parents=True)
    (temp_seed / "venv" / "bin" / "nox").write_text(f"#!{temp_seed}/venv/bin/python\n")
    env = {
        **os.environ,
        "KILN_REHEARSE_SOURCE": str(src),
        "GITHUB_WORKSPACE": str(ws),
        "STANDIN_PATH": "",
        "KILN_REHEARSE_VENV_SEED": str(seed),
        "KILN_REHEARSE_TEMP_SEED": str(temp_seed),
        "RUNNER_TEMP": str(temp),
    }
    out = subprocess.run(
        ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "checkout stand-in: .nox/kiln $RUNNER_TEMP/venv from the rehearsal's venv seed" in out.stdout
    assert (temp / "venv" / "bin" / "nox").read_text() == f"#!{temp}/venv/bin/python\n"
    assert (temp_seed / "venv" / "bin" / "nox").read_text() == f"#!{temp_seed}/venv/bin/python\n"
    got = ws / ".nox" / "kiln"
    gsite = got / "lib" / "python3.11" / "site-packages"
    assert (got / "bin" / "pytest").read_text().startswith(f"#!{got}/bin/python\n")
    assert os.access(got / "bin" / "pytest", os.X_OK)
    assert (
        gsite / "__editable___kiln_finder.py"
    ).read_text() == f"MAPPING = {{'compiler': '{ws}/compiler'}}\n"
    assert str(ws) in (gsite / "kiln-0.1.0.dist-info" / "direct_url.json").read_text()
    assert f"-m venv {got}" in (got / "pyvenv.cfg").read_text()
    assert (gsite / "torch.py").stat().st_ino == (site / "torch.py").stat().st_ino  # a hard link
    # the seed itself is untouched
    assert (venv / "bin" / "pytest").read_text().startswith(f"#!{venv}/bin/python\n")
    assert str(seed) in (site / "__editable___kiln_finder.py").read_text()
    assert (ws / "a").read_text() == "a"


@pytest.mark.skipif(not shutil.which("git") or not shutil.which("tar"), reason="needs git and tar")
def test_refreshing_the_seed_tree_keeps_its_venvs(tmp_path):
    src, ws = tmp_path / "src", tmp_path / "ws"
    src.mkdir()
    (src / "new").write_text("new")
    _git("init", "-q", cwd=src)
    _git("add", "-A", cwd=src)
    _git("commit", "-qm", "one", cwd=src)
    (ws / ".nox" / "kiln").mkdir(parents=True)
    (ws / ".nox" / "kiln" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (ws / "stale").write_text("old tree")
    env = {
        **os.environ,
        "KILN_REHEARSE_SOURCE": str(src),
        "GITHUB_WORKSPACE": str(ws),
        "STANDIN_PATH": "",
        "KILN_REHEARSE_KEEP": ".nox",
    }
    out = subprocess.run(
        ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in ws.iterdir()) == [".git", ".nox", "new"]
    assert (ws / ".nox" / "kiln" / "pyvenv.cfg").is_file()  # the venvs stay; nothing else of the old tree


def _fake_venv(ws: Path, stamp: str) -> Path:
    venv = ws / ".nox" / "kiln"
    site = venv / "lib" / "python3.11" / "site-packages"
    (venv / "bin").mkdir(parents=True)
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "pip").write_text(f"#!{venv}/bin/python\n")
    (site / "__editable___kiln_finder.py").write_text(f"MAPPING = {{'harness': '{ws}/harness'}}\n")
    (site / "torch.py").write_text("big = 1\n")
    (venv / "kiln-installed.json").write_text(stamp)
    return venv


def test_the_seed_adopts_the_trees_own_project_venv_once(tmp_path):
    tree, seed = tmp_path / "tree", Seed(tmp_path / "seed")
    mine = _fake_venv(tree, '{"project": 1}')
    assert adopt_tree_venv(seed, tree) == f"the seed's .nox/kiln linked from {mine}"
    got = seed.root / ".nox" / "kiln"
    site = got / "lib" / "python3.11" / "site-packages"
    assert (
        site / "__editable___kiln_finder.py"
    ).read_text() == f"MAPPING = {{'harness': '{seed.root}/harness'}}\n"
    assert (got / "bin" / "pip").read_text() == f"#!{got}/bin/python\n"
    mine_site = mine / "lib" / "python3.11" / "site-packages"
    assert (site / "torch.py").stat().st_ino == (mine_site / "torch.py").stat().st_ino
    assert str(tree) in (mine / "bin" / "pip").read_text()  # the tree's own venv is untouched
    assert adopt_tree_venv(seed, tree) == ""  # the same stamp: nothing to do
    (mine / "kiln-installed.json").unlink()
    assert (
        adopt_tree_venv(Seed(tmp_path / "other"), tree) == ""
    )  # no filled venv in the tree: nothing to adopt


def test_a_tree_venv_that_cannot_be_linked_is_left_to_nox(tmp_path, monkeypatch):
    import rehearsal.seed as seed_mod

    tree, seed = tmp_path / "tree", Seed(tmp_path / "seed")
    _fake_venv(tree, '{"project": 1}')

    def refuse(*args, **kwargs):
        raise subprocess.CalledProcessError(1, ["cp", "-al"], stderr="Invalid cross-device link")

    monkeypatch.setattr(seed_mod.subprocess, "run", refuse)
    line = adopt_tree_venv(seed, tree)
    assert line.startswith(f"could not link {tree / '.nox' / 'kiln'} into the seed") and line.endswith(
        "nox installs it"
    )
    assert not (seed.root / ".nox" / "kiln").exists()
