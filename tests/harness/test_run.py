"""End to end: `python -m harness run` on a small planted project, natively (and in the CPU container
when its image is already built), then report and repro; interrupted and timed-out runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.images import image
from harness.record import RunRecord
from harness.settings import settings
from harness.suites import collect, repro
from scratch_project import scratch_project

ROOT = Path(__file__).resolve().parents[2]

PLANTED_A = """
import pytest

def test_ok():
    pass

def test_broken():
    assert 1 + 1 == 3, "planted failure"

class TestGroup:
    @pytest.mark.parametrize("n", [1, 2])
    def test_param(self, n):
        assert n == 1

@pytest.mark.xfail(reason="planted known failure", strict=True)
def test_known():
    assert False
"""

PLANTED_B = """
import os, signal, time

def test_fine():
    pass

def test_maybe_stop():
    plant = os.environ.get("KILN_PLANT", "")
    if plant == "interrupt":
        os.kill(os.getppid(), signal.SIGTERM)  # the harness is our parent
        time.sleep(60)

    if plant == "hang" or os.path.exists("tests/beta/HANG"):  # the file reaches containers, env does not
        time.sleep(60)


def test_maybe_hang_again():
    if os.path.exists("tests/beta/HANG"):
        time.sleep(60)
"""


def make_project(tmp_path: Path, *, suite_s: int | None = None, with_harness: bool = False) -> Path:
    """A project with two suites, alpha (planted failures) and beta, and the real matrix otherwise."""
    timeouts = (
        (lambda d: d["backends"]["cpu"]["timeouts"].update(suite_s=suite_s, test_s=suite_s))
        if suite_s
        else None
    )
    root = scratch_project(tmp_path / "proj", {"alpha": PLANTED_A, "beta": PLANTED_B}, matrix=timeouts)
    if with_harness:  # the container runs `python -m harness` from the mounted tree
        shutil.copytree(
            ROOT / "harness", root / "harness", ignore=shutil.ignore_patterns("__pycache__", "bench")
        )
        # the harness reads its settings through compiler.envvars and compiler.config
        shutil.copytree(ROOT / "compiler", root / "compiler", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "docker", root / "docker")
        shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
        (root / "pytest.ini").unlink()
    return root


def harness(root: Path, *args: str, plant: str = "", timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "KILN_ROOT": str(root),
        "PYTHONPATH": str(ROOT),
        "KILN_PLANT": plant,
        "KILN_RESULTS": str(root / "results"),
    }
    env.pop("KILN_NATIVE", None)
    env.pop("KILN_HISTORY_DB", None)  # runs record into the test's own XDG_DATA_HOME (conftest.py)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def only_run(root: Path) -> Path:
    runs = sorted(p for p in (root / "results").iterdir() if p.is_dir())  # not history.sqlite
    assert len(runs) == 1, runs
    return runs[0]


def test_native_run_classifies_reports_and_reproduces(tmp_path):
    root = make_project(tmp_path)
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(
        ln.startswith("suite alpha [cpu/native] FAILED: 2 passed, 2 failed, 1 xfailed") for ln in lines
    )
    assert any(ln.startswith("suite beta [cpu/native] PASSED: 3 passed") for ln in lines)
    n = (
        json.loads((ROOT / "ci" / "matrix.json").read_text())["retries"]["attempts"] + 1
    )  # the suite run + reruns
    for test in ("test_broken", "TestGroup::test_param[2]"):  # each run again alone, by its exact node id
        assert (
            f"retried tests/alpha/test_alpha.py::{test} alone: FAILING: failed {n} of {n} attempts "
            f"({', '.join(['failed'] * n)})" in proc.stdout
        )
    run_dir = only_run(root)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["mode"] == "native"
    assert [s["name"] for s in manifest["suites"]] == ["alpha", "beta"]
    for name in (
        "env.json",
        "summary.json",
        "report.txt",
        "report.md",
        "suites/alpha.xml",
        "suites/alpha.log",
    ):
        assert (run_dir / name).exists(), name
    env = json.loads((run_dir / "env.json").read_text())
    assert env["device"]["torch"] and env["device"]["gpu_count"] == 0 and "git" in env["host"]
    assert env["device"]["env"]["TRITON_INTERPRET"] == "1" and env["device"]["env"]["PYTHONHASHSEED"] == "0"

    out = harness(root, "repro", "--print", str(run_dir)).stdout
    cmds = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 2
    assert cmds[0].endswith("tests/alpha/test_alpha.py::test_broken")
    assert cmds[1].endswith("'tests/alpha/test_alpha.py::TestGroup::test_param[2]'")
    for cmd in cmds:  # pasted into a shell, each line reproduces its failure and only that test runs
        again = subprocess.run(
            ["bash", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("KILN_")},
        )
        assert again.returncode == 1, again.stdout[-2000:]
        assert "1 failed" in again.stdout and "passed" not in again.stdout.splitlines()[-1]

    report = harness(root, "report", str(run_dir), "--check")
    assert report.returncode == 1
    assert report.stdout.splitlines()[0] == "kiln cpu/native FAILED: 5 passed, 2 failed, 1 xfailed"
    assert "tests/alpha/test_alpha.py::test_broken: failed: AssertionError: planted failure" in report.stdout


def test_interrupted_run_keeps_results_and_is_marked_incomplete(tmp_path):
    root = make_project(tmp_path)
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", plant="interrupt")
    assert proc.returncode == 130, proc.stderr
    assert "results so far kept" in proc.stderr and "Traceback" not in proc.stderr
    run_dir = only_run(root)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "incomplete"
    assert (
        manifest["reason"]
        == "terminated during suite beta while running tests/beta/test_beta.py::test_maybe_stop"
    )
    # the finished suite is kept, and so is what the interrupted one had finished
    assert [s["name"] for s in manifest["suites"]] == ["alpha", "beta"]
    assert manifest["suites"][1]["status"] == "interrupted" and manifest["suites"][1]["counts"]["passed"] == 1
    assert (run_dir / "suites" / "alpha.xml").exists()
    run = collect.load_run(run_dir)
    assert not run.complete and len(run.failing) == 2
    report = harness(root, "report", str(run_dir), "--check")
    assert report.returncode == 1 and "[run INCOMPLETE]" in report.stdout.splitlines()[0]


def test_suite_timeout_kills_the_suite(tmp_path):
    root = make_project(tmp_path, suite_s=3)
    proc = harness(
        root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "beta", plant="hang"
    )
    assert proc.returncode == 1
    assert "suite beta [cpu/native] TIMEOUT" in proc.stdout
    manifest = json.loads((only_run(root) / "run.json").read_text())
    assert manifest["suites"][0]["timed_out"] is True and manifest["status"] == "complete"
    assert "suites not finished: beta" in proc.stdout


def test_health_check_runs_before_the_suites(tmp_path):
    root = make_project(tmp_path)
    proc = harness(root, "run", "--backend", "cpu", "--native", "--suite", "beta")
    assert proc.returncode == 0, proc.stderr
    assert "health cpu cpu [cpu (Triton interpreter)]: ok" in proc.stdout
    health = json.loads((only_run(root) / "health.json").read_text())
    assert health["ok"] and health["devices"][0]["kernel_max_err"] == 0.0


def _cpu_image_present(root: Path) -> str | None:
    """The CPU image's tag when it is built here; else the test is skipped with why not (no docker client, no daemon,
    or no image), the client found as the harness finds it (KILN_DOCKER, /usr/bin/docker, PATH)."""
    from harness.exc import HarnessError
    from harness.settings import settings

    docker = settings().docker
    if shutil.which(docker) is None:
        pytest.skip(f"no docker client here ({docker} not found; KILN_DOCKER names another)")
    try:
        image.require_docker()
    except HarnessError as e:
        pytest.skip(f"docker is not usable here: {e}")
    b = matrix.load(root / "ci" / "matrix.json").backend("cpu")
    tag = image.current_tag(b, root=root)  # as a build computes it (the local base's id in the hash)
    if not image.image_id(tag):
        pytest.skip(
            f"CPU image {tag} not built on this machine (python -m harness image build --backend cpu)"
        )
    return tag


def test_container_run_and_repro_line(tmp_path):
    root = make_project(tmp_path, with_harness=True)
    tag = _cpu_image_present(root)
    proc = harness(root, "run", "--backend", "cpu", "--image", tag, "--quiet")
    assert proc.returncode == 1, proc.stderr
    assert "suite alpha [cpu/container] FAILED: 2 passed, 2 failed, 1 xfailed" in proc.stdout
    run_dir = only_run(root)
    assert json.loads((run_dir / "health.json").read_text())["ok"]
    env = json.loads((run_dir / "env.json").read_text())
    assert env["host"]["image"]["tag"] == tag and env["device"]["executable"] == "/opt/venv/bin/python"
    record = RunRecord.from_json(json.loads((run_dir / "run.json").read_text()))
    line = repro.repro_line(record, "tests/alpha/test_alpha.py::test_broken")
    assert "--network none" in line and f"{root}:/src:ro" in line and tag in line
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "1 failed" in again.stdout


def test_container_suite_timeout_kills_and_removes_the_container(tmp_path):
    root = make_project(tmp_path, with_harness=True)
    tag = _cpu_image_present(root)
    data = json.loads((root / "ci" / "matrix.json").read_text())
    # pytest-timeout ends the first hanging test after 5 s; the container is killed at 8 s during the second
    data["backends"]["cpu"]["timeouts"].update(test_s=5, suite_s=8)
    (root / "ci" / "matrix.json").write_text(json.dumps(data))
    (root / "tests" / "beta" / "HANG").touch()
    proc = harness(
        root, "run", "--backend", "cpu", "--image", tag, "--quiet", "--no-health", "--suite", "beta"
    )
    assert proc.returncode == 1, proc.stderr
    assert "suite beta [cpu/container] TIMEOUT" in proc.stdout
    entry = json.loads((only_run(root) / "run.json").read_text())["suites"][0]
    assert entry["timed_out"] is True
    name = entry["argv"][entry["argv"].index("--name") + 1]
    left = subprocess.run(
        [settings().docker, "ps", "-a", "-q", "--filter", f"name={name}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert left.stdout.strip() == ""  # removed whatever happened


def test_a_suite_folder_missing_from_the_checkout_is_reported_not_failed(tmp_path):
    root = make_project(tmp_path)
    data = json.loads((root / "ci" / "matrix.json").read_text())
    data["suites"] = ["beta", "gamma"]  # git keeps no empty folder: a fresh clone may lack a suite
    (root / "ci" / "matrix.json").write_text(json.dumps(data))
    proc = harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "suite gamma [cpu/native] MISSING: tests/gamma is not in this checkout" in proc.stdout
    manifest = json.loads((only_run(root) / "run.json").read_text())
    assert [(s["name"], s["status"]) for s in manifest["suites"]] == [
        ("beta", "passed"),
        ("gamma", "missing"),
    ]
    report = harness(root, "report", str(only_run(root)), "--check")
    assert report.returncode == 0 and "suite gamma [cpu/native] MISSING" in report.stdout
