"""The rehearsal's plan (ci/rehearse/rehearsal/plan.py): every job of every workflow on every event that reaches it,
with the end it must reach here; `--list` and the job/event selection."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rehearsal.act import platform_args
from rehearsal.plan import RehearseError, default_jobs, list_table, runs_on_labels, select
from rehearse_helpers import SCRIPT, WORKFLOWS


def test_runs_on_forms_and_expression_labels():
    assert runs_on_labels({"runs-on": "ubuntu-latest"}) == ["ubuntu-latest"]
    assert runs_on_labels({"runs-on": ["self-hosted", "cpu"]}) == ["self-hosted", "cpu"]
    assert runs_on_labels({"runs-on": {"group": "g", "labels": ["self-hosted", "h100"]}}) == [
        "self-hosted",
        "h100",
    ]
    with pytest.raises(RehearseError, match="expression"):
        platform_args(["self-hosted", "${{ matrix.runner }}"])


def test_the_workflows_declare_the_inputs_the_rehearsal_sends():
    for spec in default_jobs("x", 2):
        if not spec.inputs:
            assert spec.event != "workflow_dispatch" or spec.workflow == "bench.yml", spec
            continue
        declared = WORKFLOWS[spec.workflow]["on"]["workflow_dispatch"]["inputs"]
        assert {k for k, _ in spec.inputs} <= set(declared), spec.workflow
        env = WORKFLOWS[spec.workflow].get("env", {})
        assert env.get("KILN_TEST_SELECTION") == "${{ inputs.selection || vars.KILN_TEST_SELECTION }}", (
            spec.workflow
        )


def test_every_job_of_every_workflow_on_every_event_of_its_workflow():
    """`--list`'s pairs: each job of each workflow once per event its `on:` names (pull_request twice: same-repo
    and fork), with the end it must reach here: skipped by the fork guard, the pre-flight line for GPU jobs and the
    merges that need them, success otherwise."""
    specs = default_jobs("x", 2)
    jobs = {(wf, j) for wf, data in WORKFLOWS.items() for j in data["jobs"]}
    assert {(s.workflow, s.job) for s in specs} == jobs
    by = {(s.job, s.label): s.expect for s in specs}
    assert by[("lint", "pull_request (fork)")] == "success"  # no guard: ubuntu-latest runs forks' lint
    for job in ("unit-tests", "tests-cpu", "tests-cuda", "merge-cuda", "bench-rocm"):
        assert by[(job, "pull_request (fork)")] == "skipped"
    assert by[("unit-tests", "push")] == by[("tests-cpu", "pull_request (same-repo)")] == "success"
    assert by[("merge-rocm", "push")] == by[("tests-cuda", "workflow_dispatch")] == "preflight"
    assert by[("flakes-cuda", "schedule")] == "preflight" and ("flakes-cpu", "push") not in by
    assert ("bench-cuda", "schedule") not in by and len(specs) == len({(s.workflow, s.key) for s in specs})
    listed = list_table(specs).splitlines()
    assert listed[-1] == f"{len(specs)} job x event pair(s)" and listed[0].split() == [
        "workflow",
        "job",
        "event",
        "expected",
    ]


def test_list_prints_the_pairs_and_runs_nothing(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--list",
            "--act",
            str(tmp_path / "no-act"),
            "--job",
            "tests-cuda",
            "--event",
            "pull_request:fork",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split() == [
        "ci.yml",
        "tests-cuda",
        "pull_request",
        "(fork)",
        "skipped",
    ]
    assert not (tmp_path / "no-act").exists()
    with pytest.raises(RehearseError, match="no event pull_request:forks"):
        select(default_jobs("", 2), [], ["pull_request:forks"])
    with pytest.raises(RehearseError, match="no job nope in the workflows"):
        select(default_jobs("", 2), ["nope"], [])
