"""The act rehearsal (ci/rehearse/rehearse.py, `nox -s rehearse`): the act command line it builds from the
committed workflows (every runs-on label mapped to host mode, every remote action to a local stand-in, the
artifact server on 127.0.0.1 only), its reading of act's output and verdicts, the stand-in actions themselves,
and the test selection (KILN_TEST_SELECTION) the workflows hand to the harness."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import settings as settings_mod

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "act"
_spec = importlib.util.spec_from_file_location("kiln_rehearse", ROOT / "ci" / "rehearse" / "rehearse.py")
rehearse = importlib.util.module_from_spec(_spec)
sys.modules["kiln_rehearse"] = rehearse  # dataclasses look their module up
_spec.loader.exec_module(rehearse)

WORKFLOWS = rehearse.load_workflows(ROOT)


def _argv(spec, workflows=WORKFLOWS, tmp=Path("/tmp/x")):
    return rehearse.act_argv("act", spec, workflows, root=ROOT, actions_dir=rehearse.ACTIONS_DIR,
                             artifacts=tmp / "artifacts", cache=tmp / "cache", port=40000,
                             event_file=tmp / "event.json")


def _pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


# ---- the act command line ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", rehearse.default_jobs("x", 2), ids=lambda s: s.job)
def test_every_runs_on_label_of_every_workflow_runs_in_host_mode(spec):
    argv = _argv(spec)
    mapped = dict(p.split("=", 1) for p in _pairs(argv, "-P"))
    labels = {lb for wf in WORKFLOWS.values() for job in wf["jobs"].values() for lb in rehearse.runs_on_labels(job)}
    assert {"self-hosted", "ubuntu-latest"} <= labels  # read from the real workflows
    assert set(mapped) == labels
    assert set(mapped.values()) == {"-self-hosted"}
    # the rehearsed job's own labels in particular
    assert set(rehearse.runs_on_labels(WORKFLOWS[spec.workflow]["jobs"][spec.job])) <= set(mapped)


def test_runs_on_forms_and_expression_labels():
    assert rehearse.runs_on_labels({"runs-on": "ubuntu-latest"}) == ["ubuntu-latest"]
    assert rehearse.runs_on_labels({"runs-on": ["self-hosted", "cpu"]}) == ["self-hosted", "cpu"]
    assert rehearse.runs_on_labels({"runs-on": {"group": "g", "labels": ["self-hosted", "h100"]}}) == \
        ["self-hosted", "h100"]
    with pytest.raises(rehearse.RehearseError, match="expression"):
        rehearse.platform_args(["self-hosted", "${{ matrix.runner }}"])


@pytest.mark.parametrize("spec", rehearse.default_jobs("", 2), ids=lambda s: s.job)
def test_every_remote_action_is_a_local_stand_in(spec):
    argv = _argv(spec)
    local = dict(p.split("=", 1) for p in _pairs(argv, "--local-repository"))
    uses = {str(step["uses"]) for wf in WORKFLOWS.values() for job in wf["jobs"].values()
            for step in job.get("steps", []) if "uses" in step}
    assert any(u.startswith("actions/download-artifact@") for u in uses)  # merge jobs: mapped though not run
    for u in uses:
        assert u in local, f"{u} would be fetched from the network"
        assert (Path(local[u]) / "action.yml").is_file()
        assert Path(local[u]).is_relative_to(ROOT / "ci" / "rehearse" / "actions")
    assert "--no-skip-checkout" in argv  # the checkout stand-in runs rather than act's silent copy
    assert "--action-offline-mode" in argv


def test_an_action_without_stand_in_is_refused():
    with pytest.raises(rehearse.RehearseError, match="no local stand-in for actions/cache@v4"):
        rehearse.local_repository_args(["actions/checkout@abc", "actions/cache@v4"], rehearse.ACTIONS_DIR)
    wf = {"w.yml": {"jobs": {"j": {"runs-on": "ubuntu-latest", "steps": [{"uses": "docker://alpine"},
                                                                          {"uses": "./local"},
                                                                          {"uses": "actions/checkout@abc"}]}}}}
    assert rehearse.remote_uses(wf) == ["actions/checkout@abc"]


def test_servers_listen_on_loopback_only(tmp_path):
    argv = _argv(rehearse.default_jobs("", 2)[1], tmp=tmp_path)
    assert _pairs(argv, "--artifact-server-addr") == ["127.0.0.1"]
    assert _pairs(argv, "--artifact-server-path") == [str(tmp_path / "artifacts")]
    assert _pairs(argv, "--artifact-server-port") == ["40000"]
    assert "--no-cache-server" in argv and _pairs(argv, "--cache-server-addr") == ["127.0.0.1"]
    assert not [a for a in argv if a.endswith("-addr") and a not in ("--artifact-server-addr", "--cache-server-addr")]


def test_event_inputs_and_matrix_reach_act():
    specs = {s.job: s for s in rehearse.default_jobs("test_a or test_b", 3)}
    flakes = _argv(specs["flakes-cpu"])
    assert flakes[1] == "workflow_dispatch"  # act gives inputs.* only to workflow_dispatch
    assert _pairs(flakes, "-e") == ["/tmp/x/event.json"]  # with an event file, act reads the inputs from it
    assert rehearse.event_payload(specs["flakes-cpu"], "refs/heads/main") == \
        {"ref": "refs/heads/main", "inputs": {"runs": "3", "selection": "test_a or test_b"}}
    assert rehearse.event_payload(rehearse.default_jobs("", 2)[0], "refs/heads/x") == \
        {"ref": "refs/heads/x", "inputs": {}}
    assert _pairs(flakes, "-W") == [".github/workflows/flakes.yml"] and _pairs(flakes, "-j") == ["flakes-cpu"]
    assert specs["flakes-cuda"].expect == "preflight" and "--matrix" not in _argv(specs["flakes-cuda"])
    matrix = rehearse.JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", matrix=(("shard", "1"),))
    assert _pairs(_argv(matrix), "--matrix") == ["shard:1"]
    assert "KILN_PRUNE_IMAGES=0" in _pairs(flakes, "--env")  # the teardown keeps other checkouts' images
    with pytest.raises(rehearse.RehearseError, match="has no job"):
        _argv(rehearse.JobSpec("ci.yml", "nope", "push"))


def test_the_workflows_declare_the_inputs_the_rehearsal_sends():
    for spec in rehearse.default_jobs("x", 2):
        if not spec.inputs:
            assert spec.event != "workflow_dispatch" or spec.workflow == "bench.yml", spec
            continue
        declared = WORKFLOWS[spec.workflow]["on"]["workflow_dispatch"]["inputs"]
        assert {k for k, _ in spec.inputs} <= set(declared), spec.workflow
        env = WORKFLOWS[spec.workflow].get("env", {})
        assert env.get("KILN_TEST_SELECTION") == "${{ inputs.selection || vars.KILN_TEST_SELECTION }}", spec.workflow


def test_act_env_keeps_the_workflow_in_charge():
    env = rehearse.act_env({"PATH": "/venv/r/bin:/usr/bin", "KILN_TEST_SELECTION": "x", "GITHUB_TOKEN": "t",
                            "VIRTUAL_ENV": "/venv/r", "PIP_FIND_LINKS": "/w", "HOME": "/root"}, "/venv/r")
    assert env == {"PATH": "/usr/bin", "PIP_FIND_LINKS": "/w", "HOME": "/root"}
    runner = rehearse.act_env({"PATH": "/usr/bin", "HOME": "/root", "TRITON_CACHE_DIR": "/root/.triton/cache",
                               "XDG_DATA_HOME": "/root/.local/share"}, None, Path("/r/home"))
    # pip keeps its configuration and download cache; every lasting kiln, Triton and data folder is the
    # rehearsal's own scratch home, never the user's trusted ones
    assert runner == {"PATH": "/usr/bin", "HOME": "/r/home", "XDG_CONFIG_HOME": "/root/.config",
                      "PIP_CACHE_DIR": "/root/.cache/pip", "XDG_CACHE_HOME": "/r/home/.cache",
                      "XDG_DATA_HOME": "/r/home/.local/share"}


# ---- act's output --------------------------------------------------------------------------------------------


def test_parse_a_successful_job():
    (run,) = rehearse.parse_act_output((FIXTURES / "lint.log").read_text(encoding="utf-8"))
    assert run.result == "succeeded"
    main = [(s.name, s.result, s.depth) for s in run.steps if s.stage == "Main"]
    assert main == [
        ("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", "success", 0),
        ("copy the local source tree (stand-in for actions/checkout)", "success", 1),
        ("Install nox", "success", 0),
        ("nox -s lint", "success", 0),
    ]
    spec = rehearse.JobSpec("ci.yml", "lint", "workflow_dispatch")
    assert rehearse.judge(spec, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 0).ok
    assert not rehearse.judge(spec, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 1).ok
    gpu = rehearse.JobSpec("ci.yml", "lint", "workflow_dispatch", expect="preflight")
    assert not rehearse.judge(gpu, WORKFLOWS["ci.yml"]["jobs"]["lint"], [run], 0).ok


def test_gpu_job_must_stop_at_its_pre_flight():
    text = (FIXTURES / "flakes-cuda.log").read_text(encoding="utf-8")
    (run,) = rehearse.parse_act_output(text)
    assert run.result == "failed"
    assert [s.name for s in run.steps if s.result == "failure"] == ["nox -s flakes-cuda"]
    spec = rehearse.JobSpec("flakes.yml", "flakes-cuda", "workflow_dispatch", expect="preflight")
    job = WORKFLOWS["flakes.yml"]["jobs"]["flakes-cuda"]
    v = rehearse.judge(spec, job, [run], 1)
    assert v.ok, v.line
    assert v.line.startswith("stopped at pre-flight (step 'nox -s flakes-cuda') with message: "
                             "error: pre-flight cuda: no NVIDIA driver")
    # a workflow with a pre-flight step of its own: failing anywhere else is not the expected stop
    with_step = {"steps": [{"name": "GPU pre-flight", "run": "python -m harness preflight"}, *job["steps"]]}
    v = rehearse.judge(spec, with_step, [run], 1)
    assert not v.ok and "not at its pre-flight step 'GPU pre-flight'" in v.line
    renamed = rehearse.parse_act_output(text.replace("nox -s flakes-cuda", "GPU pre-flight"))
    assert rehearse.judge(spec, with_step, renamed, 1).ok
    # a CPU expectation for the same output fails and names the step
    assert "at step 'nox -s flakes-cuda'" in rehearse.judge(
        rehearse.JobSpec("flakes.yml", "flakes-cuda", "workflow_dispatch"), job, [run], 1).line


def test_gpu_job_failing_before_its_pre_flight_is_not_the_expected_stop():
    """tests-cuda under act: `strategy.job-total` is empty, so `--shard 1/` is refused before the pre-flight."""
    (run,) = rehearse.parse_act_output((FIXTURES / "tests-cuda.log").read_text(encoding="utf-8"))
    assert run.result == "failed"
    failed = [s for s in run.steps if s.result == "failure"]
    assert [s.name for s in failed] == ["nox -s tests-cuda (one shard)", "Report and job summary"]
    assert rehearse.error_line(failed[0]).startswith("harness run: error: --shard '1/'")
    spec = rehearse.JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", expect="preflight")
    v = rehearse.judge(spec, WORKFLOWS["ci.yml"]["jobs"]["tests-cuda"], [run], 1)
    assert not v.ok and "before or without its pre-flight: harness run: error: --shard '1/'" in v.line


def test_summary_rows_list_steps_as_act_ran_them_and_the_skipped_ones():
    (run,) = rehearse.parse_act_output((FIXTURES / "tests-cuda.log").read_text(encoding="utf-8"))
    spec = rehearse.JobSpec("ci.yml", "tests-cuda", "workflow_dispatch", expect="preflight")
    rows = rehearse.summary_rows(spec, WORKFLOWS["ci.yml"]["jobs"]["tests-cuda"], [run])
    steps = {step.strip(): result for _, step, result in rows}
    assert steps["nox -s tests-cuda (one shard)"].startswith("failure [")
    assert steps["Install nox"].startswith("success [")
    assert steps["nox -s ci-durations (main; per-test durations from the history, for --shard)"] == "skipped"
    assert any(step.startswith("  copy the local source tree") for _, step, _ in rows)  # composite: indented
    text = rehearse.table(rows)
    assert text.splitlines()[0].split() == ["job", "step", "result"]
    assert len(text.splitlines()) == len(rows) + 2


def test_an_unfinished_or_missing_job_is_not_ok():
    spec = rehearse.JobSpec("ci.yml", "lint", "push")
    assert not rehearse.judge(spec, {}, [], 1).ok
    (run,) = rehearse.parse_act_output("[ci/lint] ⭐ Run Main Install nox\n[ci/lint]   | x\n")
    assert run.result == "unfinished" and run.steps[0].result == "running" and run.steps[0].output == ["x"]
    assert not rehearse.judge(spec, {}, [run], 0).ok


# ---- the stand-in actions (their scripts, run for real) -------------------------------------------------------


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


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
    out = subprocess.run(["bash", str(rehearse.ACTIONS_DIR / "checkout" / "checkout.sh")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "NOT actions/checkout" in out.stdout and "2 uncommitted or untracked" in out.stdout
    assert sorted(p.name for p in ws.iterdir() if p.name != ".git") == [".gitignore", "changed", "kept", "new"]
    assert (ws / "changed").read_text() == "changed, not committed"
    env["STANDIN_PATH"] = "../escape"
    bad = subprocess.run(["bash", str(rehearse.ACTIONS_DIR / "checkout" / "checkout.sh")], env=env,
                         capture_output=True, text=True)
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
    modules = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "rehearse-npm" / "node_modules"
    if act is None or shutil.which("node") is None or not (modules / "@actions" / "artifact").is_dir():
        pytest.skip("act, node or the rehearsal's artifact client (nox -s rehearse installs them) is missing")
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "t.yml").write_text(ROUND_TRIP)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "t"]):
        subprocess.run([*git, *argv], check=True, capture_output=True)
    actions = rehearse.ACTIONS_DIR
    proc = subprocess.run(
        [act, "push", "-C", str(repo), "-W", ".github/workflows/t.yml", "-P", "self-hosted=-self-hosted",
         "--artifact-server-path", str(tmp_path / "art"), "--artifact-server-addr", "127.0.0.1",
         "--artifact-server-port", str(rehearse.free_port()), "--no-cache-server", "--cache-server-addr", "127.0.0.1",
         "--action-offline-mode", "--action-cache-path", str(tmp_path / "cache"),
         "--local-repository", f"actions/upload-artifact@v4={actions / 'upload-artifact'}",
         "--local-repository", f"actions/download-artifact@v4={actions / 'download-artifact'}",
         "--env", f"NODE_PATH={modules}", "--env", f"GITHUB_REPOSITORY={rehearse.REPOSITORY}"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "HOME": str(tmp_path / "home")})
    out = rehearse.ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-3000:]
    found = re.findall(r"\| FOUND (\S+)", out)
    assert found == ["got/results-cuda-shard-1/suite/a.xml"], out[-3000:]
    assert re.search(r"URL=\S+/kiln/kiln/actions/runs/1/artifacts/\d+", out)
    assert "No files were found with the provided path: missing/" in out


# ---- the selection the workflows hand to the harness -------------------------------------------------------------


def test_selection_setting_becomes_pytest_k(monkeypatch, capsys):
    monkeypatch.delenv("KILN_TEST_SELECTION", raising=False)
    assert settings_mod.selection_args("harness run") == []
    monkeypatch.setenv("KILN_TEST_SELECTION", "  test_a or test_b ")
    assert settings_mod.settings().test_selection == "test_a or test_b"
    assert settings_mod.selection_args("flakes") == ["-k", "test_a or test_b"]
    assert "flakes: note: KILN_TEST_SELECTION selects the tests matching -k 'test_a or test_b'" in capsys.readouterr().out


def test_flakes_cli_runs_only_the_selected_tests(tmp_path):
    """The selection reaches pytest for real: of the planted module's tests only the one matching -k runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_PLANTED")}
    env.update(KILN_PLANTED_STATE=str(tmp_path), KILN_TEST_SELECTION="planted_passing")
    out = subprocess.run([sys.executable, "-m", "harness", "flakes", "--native", "--runs", "2", "--out",
                          str(tmp_path / "out"), "--pytest-arg=--confcutdir=tests/harness/planted",
                          "tests/harness/planted/planted_flakes.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KILN_TEST_SELECTION selects the tests matching -k 'planted_passing'" in out.stdout
    assert "flakes cpu: 1 tests x 2 runs: 1 passing, 0 failing, 0 flaky, 0 blocking" in out.stdout


def test_without_a_docker_daemon_the_container_jobs_stop_before_any_job_runs(tmp_path):
    """`nox -s rehearse` on a laptop without docker ran 4m43s (a 3m47s compile check) and then failed tests-cpu and
    flakes-cpu at the container: now one line naming the jobs and the `--job` flags of the others, exit 3, no act
    run; with only the jobs that need no docker, act runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\n"
                      "exit 1\n")
    act = bin_dir / "act"
    act.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'act-calls'}\nexit 1\n")
    for f in (docker, act):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    script = str(ROOT / "ci" / "rehearse" / "rehearse.py")
    out = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, script, "--act", str(act), "--out", out], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("rehearse: error: tests-cpu and flakes-cpu run the suites in the cpu container")
    assert "Cannot connect to the Docker daemon" in line and "--job bench-cuda --job bench-rocm --job lint" in line
    assert not (tmp_path / "act-calls").exists()
    proc = subprocess.run([sys.executable, script, "--act", str(act), "--out", out, "--job", "lint"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert "docker daemon" not in proc.stderr and "lint" in (tmp_path / "act-calls").read_text()


# ---- every job on every event that reaches it; the cancel check ---------------------------------------------


def test_every_job_of_every_workflow_on_every_event_of_its_workflow():
    """`--list`'s pairs: each job of each workflow once per event its `on:` names (pull_request twice: same-repo
    and fork), with the end it must reach here: skipped by the fork guard, the pre-flight line for GPU jobs and the
    merges that need them, success otherwise."""
    specs = rehearse.default_jobs("x", 2)
    jobs = {(wf, j) for wf, data in WORKFLOWS.items() for j in data["jobs"]}
    assert {(s.workflow, s.job) for s in specs} == jobs
    by = {(s.job, s.label): s.expect for s in specs}
    assert by[("lint", "pull_request (fork)")] == "success"  # no guard: ubuntu-latest runs forks' lint
    for job in ("unit-tests", "tests-cpu", "tests-cuda", "merge-cuda", "bench-rocm"):
        assert by[(job, "pull_request (fork)")] == "skipped"
    assert by[("unit-tests", "push")] == by[("tests-cpu", "pull_request (same-repo)")] == "success"
    assert by[("merge-rocm", "push")] == by[("tests-cuda", "workflow_dispatch")] == "preflight"
    assert by[("flakes-cuda", "schedule")] == "preflight" and ("flakes-cpu", "push") not in by
    assert ("bench-cuda", "schedule") not in by and len(specs) == len(set((s.workflow, s.key) for s in specs))
    listed = rehearse.list_table(specs).splitlines()
    assert listed[-1] == f"{len(specs)} job x event pair(s)" and listed[0].split() == ["workflow", "job", "event",
                                                                                       "expected"]


def test_list_prints_the_pairs_and_runs_nothing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "rehearse" / "rehearse.py"), "--list", "--act",
                           str(tmp_path / "no-act"), "--job", "tests-cuda", "--event", "pull_request:fork"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split() == ["ci.yml", "tests-cuda", "pull_request", "(fork)", "skipped"]
    assert not (tmp_path / "no-act").exists()
    with pytest.raises(rehearse.RehearseError, match="no event pull_request:forks"):
        rehearse.select(rehearse.default_jobs("", 2), [], ["pull_request:forks"])
    with pytest.raises(rehearse.RehearseError, match="no job nope in the workflows"):
        rehearse.select(rehearse.default_jobs("", 2), ["nope"], [])


def test_pull_request_payloads_name_the_head_repository_and_the_selection_reaches_every_event(tmp_path):
    specs = {(s.job, s.label): s for s in rehearse.default_jobs("test_a", 2)}
    fork = rehearse.event_payload(specs[("tests-cpu", "pull_request (fork)")], "refs/heads/main")
    same = rehearse.event_payload(specs[("tests-cpu", "pull_request (same-repo)")], "refs/heads/main")
    assert fork["pull_request"]["head"]["repo"]["full_name"] == "contributor/kiln" != rehearse.REPOSITORY
    assert same["pull_request"]["head"]["repo"]["full_name"] == rehearse.REPOSITORY == same["repository"]["full_name"]
    argv = rehearse.act_argv("act", specs[("tests-cpu", "push")], WORKFLOWS, root=ROOT,
                             actions_dir=rehearse.ACTIONS_DIR, artifacts=tmp_path, cache=tmp_path, port=1,
                             event_file=tmp_path / "e.json", selection="test_a")
    assert _pairs(argv, "--var") == ["KILN_TEST_SELECTION=test_a"]  # push carries no inputs: the variable does
    assert f"GITHUB_REPOSITORY={rehearse.REPOSITORY}" in _pairs(argv, "--env")
    assert specs[("tests-cpu", "push")].inputs == ()


def _run(*steps: tuple[str, str]) -> list:
    return [rehearse.JobRun("ci/unit tests", [rehearse.StepRun("Main", n, r) for n, r in steps], "failed")]


def test_the_cancel_verdict():
    teardown = "nox -s ci-teardown (this job's containers, stale ones, superseded kiln image tags)"
    good = _run(("Install nox", "success"), ("nox -s unit-tests", "failure"), (teardown, "success"))
    assert rehearse.cancel_verdict(good, {}, set(), True).ok
    assert "never reached pytest" in rehearse.cancel_verdict(good, {}, set(), False).line
    later = _run(("nox -s unit-tests", "failure"), ("Upload results", "success"), (teardown, "success"))
    assert rehearse.cancel_verdict(later, {}, set(), True).line == "after the cancel act started 'Upload results'"
    assert "teardown did not run" in rehearse.cancel_verdict(_run(("nox -s unit-tests", "failure")), {}, set(),
                                                             True).line
    left = rehearse.cancel_verdict(good, {42: "python -m pytest tests/compiler"}, set(), True)
    assert not left.ok and "pid 42: python -m pytest" in left.line
    assert "1 container(s) still ran" in rehearse.cancel_verdict(good, {}, {"abc"}, True).line


def test_descendants_and_alive_read_proc():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"])
    try:
        import time

        for _ in range(100):
            found = rehearse.descendants(os.getpid())
            if any(cmd.startswith("sleep 30") for cmd in found.values()):
                break
            time.sleep(0.1)
        assert child.pid in found and any(cmd.startswith("sleep 30") for cmd in found.values())
        assert rehearse.alive(child.pid)
    finally:
        for pid in rehearse.descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
    assert not rehearse.alive(child.pid)


def test_our_artifact_actions_use_the_real_client_and_built_real_actions_replace_them(tmp_path):
    """upload/download-artifact map to our node actions over @actions/artifact (NODE_PATH: the npm scratch folder);
    with `--actions DIR`, a built copy of the real action there replaces ours, and only where DIR has one."""
    for name in ("upload-artifact", "download-artifact"):
        folder = rehearse.ACTIONS_DIR / name
        action = yaml.safe_load((folder / "action.yml").read_text())
        assert action["runs"] == {"using": "node20", "main": "index.js"}
        assert "require('@actions/artifact')" in (folder / "index.js").read_text()
    assert "artifact-url" in yaml.safe_load((rehearse.ACTIONS_DIR / "upload-artifact" / "action.yml").read_text())[
        "outputs"]
    assert not list(rehearse.ACTIONS_DIR.rglob("node_modules"))  # installed at rehearsal time, never committed
    real = tmp_path / "real"
    (real / "actions" / "upload-artifact").mkdir(parents=True)
    (real / "actions" / "upload-artifact" / "action.yml").write_text("name: built\n")
    uses = ["actions/upload-artifact@" + "a" * 40, "actions/download-artifact@" + "b" * 40]
    local = dict(p.split("=", 1) for p in rehearse.local_repository_args(uses, rehearse.ACTIONS_DIR, real)[1::2])
    assert local[uses[0]] == str(real / "actions" / "upload-artifact")
    assert local[uses[1]] == str(rehearse.ACTIONS_DIR / "download-artifact")
    spec = rehearse.default_jobs("", 2)[0]
    argv = rehearse.act_argv("act", spec, WORKFLOWS, root=ROOT, actions_dir=rehearse.ACTIONS_DIR, artifacts=tmp_path,
                             cache=tmp_path, port=1, event_file=tmp_path / "e.json", node_path=tmp_path / "nm")
    assert f"NODE_PATH={tmp_path / 'nm'}" in _pairs(argv, "--env")
