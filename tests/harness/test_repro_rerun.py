"""`harness repro` on this machine (harness/suites/repro_rerun.py and the rerun's command in
harness/suites/repro.py): the scratch worktree, the command in both modes, the outcomes read back, the exit
status."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from harness import matrix
from harness.exc import EXIT_FAILED, EXIT_INFRA, EXIT_OK
from harness.record import RunRecord, RunStatus
from harness.suites import repro_rerun as rr
from harness.suites.repro import exit_code, rerun_command
from harness.suites.repro_plan import CONTAINER, NATIVE, ReproPlan

GIT = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]


def git_repo(root: Path) -> tuple[str, str]:
    """A repository with two commits of `f.txt` (one, then two); (first sha, second sha)."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shas = []
    for text in ("one\n", "two\n"):
        (root / "f.txt").write_text(text)
        subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
        subprocess.run([*GIT, "-C", str(root), "commit", "-qm", text.strip()], check=True)
        shas.append(
            subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    return shas[0], shas[1]


def test_the_run_commit_is_checked_out_beside_the_users_tree_which_stays_as_it_was(tmp_path):
    repo = tmp_path / "repo"
    first, second = git_repo(repo)
    (repo / "f.txt").write_text("edited, not committed\n")
    assert rr.has_commit(repo, first) and not rr.has_commit(repo, "f" * 40)
    tree = rr.add_worktree(repo, first, tmp_path / "scratch" / rr.TREE)
    assert (tree / "f.txt").read_text() == "one\n"
    assert (repo / "f.txt").read_text() == "edited, not committed\n"
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert head.strip() == second
    rr.remove_worktree(repo, tree)
    assert not tree.exists()
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert len(listed.splitlines()) == 1


def record(mode: str, backend: str = "cpu", **kw) -> RunRecord:
    return RunRecord(
        "run-1", backend, RunStatus.COMPLETE, mode=mode, test_timeout_s=300, pytest_extra=("-x",), **kw
    )


def test_the_native_rerun_runs_every_failing_test_in_one_pytest_from_the_tree(tmp_path):
    m = matrix.load()
    p = ReproPlan(
        NATIVE,
        ("tests/a/test_a.py::test_x", "tests/a/test_a.py::test_y[1]"),
        {"PYTHONHASHSEED": "0", "TRITON_INTERPRET": "1"},
    )
    argv, env, cwd, name = rerun_command(p, record(NATIVE), m.backend("cpu"), tmp_path / "tree", tmp_path)
    assert argv[1:3] == ["-m", "pytest"] and argv[-2:] == list(p.targets)
    assert f"--junitxml={tmp_path / rr.JUNIT}" in argv and "--timeout=300" in argv and "-x" in argv
    assert cwd == tmp_path / "tree" and name is None
    assert env["PYTHONHASHSEED"] == "0" and env["PYTHONPATH"].split(":")[0] == str(tmp_path / "tree")


def test_the_container_rerun_mounts_the_worktree_and_leaves_gpu_options_out_without_a_gpu(tmp_path):
    m = matrix.load()
    rec = record(CONTAINER, "cuda", container_options=("--gpus", "all", "--shm-size=8g"))
    p = ReproPlan(
        CONTAINER,
        ("tests/a/test_a.py::test_x",),
        {"PYTHONHASHSEED": "0"},
        image="kiln-cuda:abc",
        drop_gpus=True,
    )
    argv, env, cwd, name = rerun_command(p, rec, m.backend("cuda"), tmp_path / "tree", tmp_path / "out")
    line = shlex.join(argv)
    assert argv[1:2] == ["run"] and "--network none" in line and env is None and cwd is None
    assert f"{tmp_path / 'tree'}:/src:ro" in line and f"{tmp_path / 'out'}:/results" in line
    assert "--gpus" not in argv and "--shm-size=8g" in argv and f"--name {name}" in line
    assert argv[argv.index("kiln-cuda:abc") + 1 :][:3] == ["python", "-m", "pytest"]
    assert f"--junitxml=/results/{rr.JUNIT}" in argv and argv[-1] == "tests/a/test_a.py::test_x"
    assert "PYTHONHASHSEED=0" in argv


JUNIT = (
    '<?xml version="1.0"?><testsuites><testsuite name="s">'
    '<testcase classname="tests.a.test_a" name="test_x" file="tests/a/test_a.py">'
    '<failure message="boom">t</failure></testcase>'
    '<testcase classname="tests.a.test_a" name="test_y" file="tests/a/test_a.py"/>'
    "</testsuite></testsuites>"
)


def test_outcomes_are_read_back_and_a_test_not_in_the_junit_is_not_run(tmp_path):
    (tmp_path / rr.JUNIT).write_text(JUNIT)
    found = rr.outcomes(
        tmp_path / rr.JUNIT,
        tmp_path,
        ("tests/a/test_a.py::test_x", "tests/a/test_a.py::test_y", "tests/a/test_a.py::test_gone"),
    )
    assert found == {
        "tests/a/test_a.py::test_x": "failed",
        "tests/a/test_a.py::test_y": "passed",
        "tests/a/test_a.py::test_gone": "not run",
    }
    assert rr.outcomes(tmp_path / "none.xml", tmp_path, ("t::a",)) == {"t::a": "not run"}


def test_a_target_that_did_not_run_says_why_where_the_tree_or_log_knows(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_a.py").write_text("def test_x():\n    pass\n")
    log = tmp_path / rr.LOG
    log.write_text(
        "ERROR: not found: /work/tree/tests/a/test_a.py::test_renamed\n(no match in any of [<Module test_a.py>])\n"
    )
    assert (
        rr.why_not_run("tests/b/test_b.py::test_x", tmp_path, log) == "tests/b/test_b.py is not in this tree"
    )
    assert rr.why_not_run("tests/a/test_a.py::test_renamed", tmp_path, log) == (
        "tests/a/test_a.py has no test test_renamed here"
    )
    assert rr.why_not_run("tests/a/test_a.py::test_x", tmp_path, log) == ""  # the process stopped first
    assert rr.why_not_run("tests/a/test_a.py::test_x", tmp_path, tmp_path / "no.log") == ""


def test_the_exit_status_is_the_reruns():
    assert exit_code(1, {"t::a": "failed", "t::b": "passed"}) == EXIT_FAILED
    assert exit_code(0, {"t::a": "passed"}) == EXIT_OK
    assert exit_code(4, {"t::a": "not run"}) == EXIT_INFRA  # pytest could not find it: nothing was reproduced
    assert exit_code(0, {"t::a": "passed", "t::b": "not run"}) == EXIT_INFRA


def test_local_versions_spell_torch_as_a_run_records_it():
    """torch.__version__ and torch.version.cuda, as harness/envinfo.py records them in a run, not the package
    metadata's version (which drops the `+cu130` of the package index's CUDA wheels)."""
    import sys

    probe = "import torch, json; print(json.dumps([torch.__version__, torch.version.cuda]))"
    version, cuda = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    )
    here = rr.local_versions()
    assert here["torch"] == version and here.get("cuda") == cuda


def test_torch_build_versions_read_version_py_without_importing_torch(tmp_path: Path):
    """A torch whose metadata would say 2.13.0 while its version.py says 2.13.0+cu130 (and whose import would
    fail): the build's own spelling, read from the file."""
    import os
    import sys

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    (fake / "version.py").write_text(
        "from typing import Optional\n__version__: str = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\nhip = None\n"
    )
    code = "import json; from harness.suites.repro_rerun import torch_build_versions as v; print(json.dumps(v()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"torch": "2.13.0+cu130", "cuda": "13.0"}
