"""The actions the rehearsal maps the pinned remote actions to (ci/rehearse/rehearsal/actions.py and
ci/rehearse/actions/): our checkout copies the tree as it is, our upload/download-artifact go through the real artifact
client and act's artifact server, and built copies of the real actions replace them where given."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rehearsal.act import ANSI, act_argv, free_port
from rehearsal.actions import (
    ACTIONS_DIR,
    CHECKOUT_TOKEN,
    local_repository_args,
    real_checkout,
    serve_checkout,
)
from rehearsal.plan import REPOSITORY, RehearseError, default_jobs, remote_uses
from rehearse_helpers import ROOT, WORKFLOWS, argv_for, pairs

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras")


@pytest.mark.parametrize("spec", default_jobs("", 2), ids=lambda s: s.job)
def test_every_remote_action_is_a_local_stand_in(spec):
    argv = argv_for(spec)
    local = dict(p.split("=", 1) for p in pairs(argv, "--local-repository"))
    uses = {
        str(step["uses"])
        for wf in WORKFLOWS.values()
        for job in wf["jobs"].values()
        for step in job.get("steps", [])
        if "uses" in step
    }
    assert any(u.startswith("actions/download-artifact@") for u in uses)  # merge jobs: mapped though not run
    for u in uses:
        assert u in local, f"{u} would be fetched from the network"
        assert (Path(local[u]) / "action.yml").is_file()
        assert Path(local[u]).is_relative_to(ROOT / "ci" / "rehearse" / "actions")
    assert "--no-skip-checkout" in argv  # the checkout stand-in runs rather than act's silent copy
    assert "--action-offline-mode" in argv


def test_an_action_without_stand_in_is_refused():
    with pytest.raises(RehearseError, match="no local stand-in for actions/cache@v4"):
        local_repository_args(["actions/checkout@abc", "actions/cache@v4"], ACTIONS_DIR)
    wf = {
        "w.yml": {
            "jobs": {
                "j": {
                    "runs-on": "ubuntu-latest",
                    "steps": [
                        {"uses": "docker://alpine"},
                        {"uses": "./local"},
                        {"uses": "actions/checkout@abc"},
                    ],
                }
            }
        }
    }
    assert remote_uses(wf) == ["actions/checkout@abc"]


def _git(*args, cwd):
    subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )


@pytest.mark.skipif(not shutil.which("git") or not shutil.which("tar"), reason="needs git and tar")
def test_checkout_stand_in_copies_the_tree_as_it_is(tmp_path):
    src, ws = tmp_path / "src", tmp_path / "ws"
    src.mkdir()
    ws.mkdir()
    (ws / "stale").write_text("from a previous job")
    _git("init", "-q", cwd=src)
    for name in ("kept", "changed", "gone"):
        (src / name).write_text(name)
    (src / ".gitignore").write_text("ignored\n")
    _git("add", "-A", cwd=src)
    _git("commit", "-qm", "one", cwd=src)
    (src / "changed").write_text("changed, not committed")
    (src / "new").write_text("untracked")
    (src / "ignored").write_text("ignored")
    (src / "gone").unlink()
    env = {**os.environ, "KILN_REHEARSE_SOURCE": str(src), "GITHUB_WORKSPACE": str(ws), "STANDIN_PATH": ""}
    out = subprocess.run(
        ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "NOT actions/checkout" in out.stdout and "2 uncommitted or untracked" in out.stdout
    assert sorted(p.name for p in ws.iterdir() if p.name != ".git") == [
        ".gitignore",
        "changed",
        "kept",
        "new",
    ]
    assert (ws / "changed").read_text() == "changed, not committed"
    env["STANDIN_PATH"] = "../escape"
    bad = subprocess.run(
        ["bash", str(ACTIONS_DIR / "checkout" / "checkout.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "leaves the workspace" in bad.stderr


ROUND_TRIP = """\
name: t
on: [push]
jobs:
  a:
    runs-on: [self-hosted]
    steps:
      - run: mkdir -p results/suite && echo '<a/>' > results/suite/a.xml && echo h > results/.hidden
      - id: up
        uses: actions/upload-artifact@v4
        with:
          name: results-cuda-shard-1
          path: results/
      - run: echo "URL=${{ steps.up.outputs.artifact-url }}"
      - uses: actions/upload-artifact@v4
        with:
          name: none
          path: missing/
      - uses: actions/download-artifact@v4
        with:
          pattern: results-cuda-shard-*
          path: got
      - run: find got -type f | sort | sed 's/^/FOUND /'
"""


def test_our_artifact_actions_round_trip_through_act_and_the_real_client(tmp_path):
    """upload then download through our node actions, @actions/artifact and act's artifact server: the folder named
    alone is the artifact's root, hidden files stay out, `artifact-url` is set, a path with no files warns, and a
    pattern download puts each artifact under its name. Needs act, node and the rehearsal's npm folder."""
    act = shutil.which("act")
    modules = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "kiln"
        / "rehearse-npm"
        / "node_modules"
    )
    if act is None or shutil.which("node") is None or not (modules / "@actions" / "artifact").is_dir():
        pytest.skip("act, node or the rehearsal's artifact client (nox -s rehearse installs them) is missing")
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "t.yml").write_text(ROUND_TRIP)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "t"]):
        subprocess.run([*git, *argv], check=True, capture_output=True)
    actions = ACTIONS_DIR
    proc = subprocess.run(
        [
            act,
            "push",
            "-C",
            str(repo),
            "-W",
            ".github/workflows/t.yml",
            "-P",
            "self-hosted=-self-hosted",
            "--artifact-server-path",
            str(tmp_path / "art"),
            "--artifact-server-addr",
            "127.0.0.1",
            "--artifact-server-port",
            str(free_port()),
            "--no-cache-server",
            "--cache-server-addr",
            "127.0.0.1",
            "--action-offline-mode",
            "--action-cache-path",
            str(tmp_path / "cache"),
            "--local-repository",
            f"actions/upload-artifact@v4={actions / 'upload-artifact'}",
            "--local-repository",
            f"actions/download-artifact@v4={actions / 'download-artifact'}",
            "--env",
            f"NODE_PATH={modules}",
            "--env",
            f"GITHUB_REPOSITORY={REPOSITORY}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HOME": str(tmp_path / "home")},
    )
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-3000:]
    found = re.findall(r"\| FOUND (\S+)", out)
    assert found == ["got/results-cuda-shard-1/suite/a.xml"], out[-3000:]
    assert re.search(r"URL=\S+/kiln/kiln/actions/runs/1/artifacts/\d+", out)
    assert "No files were found with the provided path: missing/" in out


def test_our_artifact_actions_use_the_real_client_and_built_real_actions_replace_them(tmp_path):
    """upload/download-artifact map to our node actions over @actions/artifact (NODE_PATH: the npm scratch folder);
    with `--actions DIR`, a built copy of the real action there replaces ours, and only where DIR has one."""
    for name in ("upload-artifact", "download-artifact"):
        folder = ACTIONS_DIR / name
        action = yaml.safe_load((folder / "action.yml").read_text())
        assert action["runs"] == {"using": "node20", "main": "index.js"}
        assert "require('@actions/artifact')" in (folder / "index.js").read_text()
    assert (
        "artifact-url"
        in yaml.safe_load((ACTIONS_DIR / "upload-artifact" / "action.yml").read_text())["outputs"]
    )
    assert not list(ACTIONS_DIR.rglob("node_modules"))  # installed at rehearsal time, never committed
    real = tmp_path / "real"
    (real / "actions" / "upload-artifact").mkdir(parents=True)
    (real / "actions" / "upload-artifact" / "action.yml").write_text("name: built\n")
    uses = ["actions/upload-artifact@" + "a" * 40, "actions/download-artifact@" + "b" * 40]
    local = dict(p.split("=", 1) for p in local_repository_args(uses, ACTIONS_DIR, real)[1::2])
    assert local[uses[0]] == str(real / "actions" / "upload-artifact")
    assert local[uses[1]] == str(ACTIONS_DIR / "download-artifact")
    spec = default_jobs("", 2)[0]
    argv = act_argv(
        "act",
        spec,
        WORKFLOWS,
        root=ROOT,
        actions_dir=ACTIONS_DIR,
        artifacts=tmp_path,
        cache=tmp_path,
        port=1,
        event_file=tmp_path / "e.json",
        node_path=tmp_path / "nm",
    )
    assert f"NODE_PATH={tmp_path / 'nm'}" in pairs(argv, "--env")


def test_a_built_real_checkout_gets_a_token_and_fetches_this_repository_through_insteadof(tmp_path):
    real = tmp_path / "real"
    assert not real_checkout(real) and not real_checkout(None)
    (real / "actions" / "checkout").mkdir(parents=True)
    (real / "actions" / "checkout" / "action.yml").write_text("name: built\n")
    assert real_checkout(real)
    spec = default_jobs("", 2)[0]
    argv = act_argv(
        "act",
        spec,
        WORKFLOWS,
        root=ROOT,
        actions_dir=ACTIONS_DIR,
        artifacts=tmp_path,
        cache=tmp_path,
        port=1,
        event_file=tmp_path / "e.json",
        real_actions=real,
    )
    assert pairs(argv, "--secret") == [f"GITHUB_TOKEN={CHECKOUT_TOKEN}"]
    local = dict(p.split("=", 1) for p in pairs(argv, "--local-repository"))
    assert {u: v for u, v in local.items() if u.startswith("actions/checkout@")} == {
        u: str(real / "actions" / "checkout") for u in local if u.startswith("actions/checkout@")
    }
    assert "--secret" not in argv_for(spec)  # our checkout needs no token
    serve_checkout(tmp_path / "home", ROOT, REPOSITORY)
    config = subprocess.run(
        ["git", "config", "--file", str(tmp_path / "home" / ".gitconfig"), "--get-regexp", "url"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert config == [f"url.file://{ROOT}.insteadof", f"https://github.com/{REPOSITORY}"]
