"""`nox -s rehearse`'s command line (ci/rehearse/rehearsal/run.py), run as a real process with a fake act and docker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rehearsal.actions import ARTIFACT_CLIENT
from rehearsal.plan import default_jobs
from rehearsal.run import run_order
from rehearsal.seed import waits_for_seed
from rehearse_helpers import SCRIPT


def test_without_a_docker_daemon_the_container_jobs_stop_before_any_job_runs(tmp_path):
    """`nox -s rehearse` on a laptop without docker ran 4m43s (a 3m47s compile check) and then failed tests-cpu and
    flakes-cpu at the container: now one line naming the jobs and the `--job` flags of the others, exit 3, no act
    run; with only the jobs that need no docker, act runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n"
    )
    act = bin_dir / "act"
    act.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "act-calls"}\nexit 1\n')
    for f in (docker, act):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    script = str(SCRIPT)
    out = str(tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, script, "--act", str(act), "--out", out],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("rehearse: error: tests-cpu and flakes-cpu run the suites in the cpu container")
    assert (
        "Cannot connect to the Docker daemon" in line
        and "--job bench-cuda --job bench-rocm --job lint" in line
    )
    assert not (tmp_path / "act-calls").exists()
    # the artifact client found installed (its package.json as rehearse writes it): this test is about docker and
    # act, and needs no npm registry (a fresh HOME's npm may reach none)
    npm_dir = tmp_path / "npm"
    (npm_dir / "node_modules").mkdir(parents=True)
    (npm_dir / "package.json").write_text(json.dumps(ARTIFACT_CLIENT, indent=1) + "\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, script, "--act", str(act), "--out", out, "--job", "lint", "--no-venv-seed"]
        + ["--npm-dir", str(npm_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "docker daemon" not in proc.stderr and "lint" in (tmp_path / "act-calls").read_text()


def test_pairs_that_need_no_seed_start_first_and_the_longest_jobs_lead_the_rest():
    specs = default_jobs("", 2)
    order = run_order(specs)
    assert sorted(order, key=specs.index) == specs  # every pair once
    waiting = [s for s in order if waits_for_seed(s)]
    assert order[-len(waiting) :] == waiting and order[: len(order) - len(waiting)] == [
        s for s in specs if not waits_for_seed(s)
    ]
    assert [s.job for s in waiting][:3] == ["tests-cpu"] * 3 and waiting[-1].job == "lint"
