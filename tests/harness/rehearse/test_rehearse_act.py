"""Running act (ci/rehearse/rehearsal/act.py): the command line built from the committed workflows (every runs-on
label in host mode, the servers on 127.0.0.1 only, the events and the selection), the environment a job sees, and the
selection (KILN_TEST_SELECTION) the workflows hand to the harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rehearsal.act import act_argv, act_env, event_payload
from rehearsal.actions import ACTIONS_DIR
from rehearsal.plan import REPOSITORY, JobSpec, RehearseError, default_jobs, runs_on_labels
from rehearse_helpers import ROOT, WORKFLOWS, argv_for, pairs

from harness import settings as settings_mod


@pytest.mark.parametrize("spec", default_jobs("x", 2), ids=lambda s: s.job)
def test_every_runs_on_label_of_every_workflow_runs_in_host_mode(spec):
    argv = argv_for(spec)
    mapped = dict(p.split("=", 1) for p in pairs(argv, "-P"))
    labels = {lb for wf in WORKFLOWS.values() for job in wf["jobs"].values() for lb in runs_on_labels(job)}
    assert {"self-hosted", "ubuntu-latest"} <= labels  # read from the real workflows
    assert set(mapped) == labels
    assert set(mapped.values()) == {"-self-hosted"}
    # the rehearsed job's own labels in particular
    assert set(runs_on_labels(WORKFLOWS[spec.workflow]["jobs"][spec.job])) <= set(mapped)


def test_servers_listen_on_loopback_only(tmp_path):
    argv = argv_for(default_jobs("", 2)[1], tmp=tmp_path)
    assert pairs(argv, "--artifact-server-addr") == ["127.0.0.1"]
    assert pairs(argv, "--artifact-server-path") == [str(tmp_path / "artifacts")]
    assert pairs(argv, "--artifact-server-port") == ["40000"]
    assert "--no-cache-server" in argv and pairs(argv, "--cache-server-addr") == ["127.0.0.1"]
    assert not [
        a for a in argv if a.endswith("-addr") and a not in ("--artifact-server-addr", "--cache-server-addr")
    ]


def test_event_inputs_and_matrix_reach_act():
    specs = {s.job: s for s in default_jobs("test_a or test_b", 3)}
    flakes = argv_for(specs["flakes-cpu"])
    assert flakes[1] == "workflow_dispatch"  # act gives inputs.* only to workflow_dispatch
    assert pairs(flakes, "-e") == ["/tmp/x/event.json"]  # with an event file, act reads the inputs from it
    assert event_payload(specs["flakes-cpu"], "refs/heads/main") == {
        "ref": "refs/heads/main",
        "inputs": {"runs": "3", "selection": "test_a or test_b"},
    }
    assert event_payload(default_jobs("", 2)[0], "refs/heads/x") == {"ref": "refs/heads/x", "inputs": {}}
    assert pairs(flakes, "-W") == [".github/workflows/flakes.yml"] and pairs(flakes, "-j") == ["flakes-cpu"]
    assert specs["flakes-cuda"].expect == "preflight" and "--matrix" not in argv_for(specs["flakes-cuda"])
    matrix = JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", matrix=(("shard", "1"),))
    assert pairs(argv_for(matrix), "--matrix") == ["shard:1"]
    assert "KILN_PRUNE_IMAGES=0" in pairs(flakes, "--env")  # the teardown keeps other checkouts' images
    with pytest.raises(RehearseError, match="has no job"):
        argv_for(JobSpec("ci.yml", "nope", "push"))


def test_act_env_keeps_the_workflow_in_charge():
    env = act_env(
        {
            "PATH": "/venv/r/bin:/usr/bin",
            "KILN_TEST_SELECTION": "x",
            "GITHUB_TOKEN": "t",
            "VIRTUAL_ENV": "/venv/r",
            "PIP_FIND_LINKS": "/w",
            "HOME": "/root",
        },
        "/venv/r",
    )
    assert env == {"PATH": "/usr/bin", "PIP_FIND_LINKS": "/w", "HOME": "/root"}
    runner = act_env(
        {
            "PATH": "/usr/bin",
            "HOME": "/root",
            "TRITON_CACHE_DIR": "/root/.triton/cache",
            "XDG_DATA_HOME": "/root/.local/share",
        },
        None,
        Path("/r/home"),
    )
    # pip keeps its configuration and download cache; every lasting kiln, Triton and data folder is the
    # rehearsal's own scratch home, never the user's trusted ones
    assert runner == {
        "PATH": "/usr/bin",
        "HOME": "/r/home",
        "XDG_CONFIG_HOME": "/root/.config",
        "PIP_CACHE_DIR": "/root/.cache/pip",
        "XDG_CACHE_HOME": "/r/home/.cache",
        "XDG_DATA_HOME": "/r/home/.local/share",
    }


def test_pull_request_payloads_name_the_head_repository_and_the_selection_reaches_every_event(tmp_path):
    specs = {(s.job, s.label): s for s in default_jobs("test_a", 2)}
    fork = event_payload(specs[("tests-cpu", "pull_request (fork)")], "refs/heads/main")
    same = event_payload(specs[("tests-cpu", "pull_request (same-repo)")], "refs/heads/main")
    assert fork["pull_request"]["head"]["repo"]["full_name"] == "contributor/kiln" != REPOSITORY
    assert same["pull_request"]["head"]["repo"]["full_name"] == REPOSITORY == same["repository"]["full_name"]
    argv = act_argv(
        "act",
        specs[("tests-cpu", "push")],
        WORKFLOWS,
        root=ROOT,
        actions_dir=ACTIONS_DIR,
        artifacts=tmp_path,
        cache=tmp_path,
        port=1,
        event_file=tmp_path / "e.json",
        selection="test_a",
    )
    assert pairs(argv, "--var") == ["KILN_TEST_SELECTION=test_a"]  # push carries no inputs: the variable does
    assert f"GITHUB_REPOSITORY={REPOSITORY}" in pairs(argv, "--env")
    assert specs[("tests-cpu", "push")].inputs == ()


def test_selection_setting_becomes_pytest_k(monkeypatch, capsys):
    monkeypatch.delenv("KILN_TEST_SELECTION", raising=False)
    assert settings_mod.selection_args("harness run") == []
    monkeypatch.setenv("KILN_TEST_SELECTION", "  test_a or test_b ")
    assert settings_mod.settings().test_selection == "test_a or test_b"
    assert settings_mod.selection_args("flakes") == ["-k", "test_a or test_b"]
    assert (
        "flakes: note: KILN_TEST_SELECTION selects the tests matching -k 'test_a or test_b'"
        in capsys.readouterr().out
    )


def test_flakes_cli_runs_only_the_selected_tests(tmp_path):
    """The selection reaches pytest for real: of the planted module's tests only the one matching -k runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_PLANTED")}
    env.update(KILN_PLANTED_STATE=str(tmp_path), KILN_TEST_SELECTION="planted_passing")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "flakes",
            "--native",
            "--runs",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--pytest-arg=--confcutdir=tests/harness/planted",
            "tests/harness/planted/planted_flakes.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KILN_TEST_SELECTION selects the tests matching -k 'planted_passing'" in out.stdout
    assert "flakes cpu: 1 tests x 2 runs: 1 passing, 0 failing, 0 flaky, 0 blocking" in out.stdout
