"""Faults planted through the real harness (`python -m harness run --native` on a scratch project, CPU): a
segfault, an `os.abort()`, a hang past the test timeout that pytest-timeout cannot end, a test whose process
is SIGKILLed; a harness SIGKILLed, interrupted (SIGINT, SIGTERM) or timed out mid-suite. Each fault costs its
test alone: every other result stays in the report and the history, the fault is named with its test id and
repro line, and the stores pass `PRAGMA integrity_check` ("Nothing lost")."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scratch_project import scratch_project

ROOT = Path(__file__).resolve().parents[3]

FAULTS = """
import ctypes, os, signal, time

def test_first():
    pass

def test_segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV

def test_between():
    pass

def test_abort():
    os.abort()

def test_fails():
    assert 2 + 2 == 5, "planted failure"

def test_hang():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # pytest-timeout's alarm never arrives
    time.sleep(600)

def test_killed():
    os.kill(os.getpid(), signal.SIGKILL)

def test_last():
    pass
"""

# the running pytest writes its pid and waits: the test below signals or kills the harness meanwhile
WAITING = """
import os, signal, time

def test_done_first():
    pass

def test_done_second():
    pass

def test_waiting():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # only the harness can end it
    with open(os.environ["KILN_FAULT_PIDFILE"], "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(1800)  # longer than any wait of the tests below: the end of this test is the harness's doing

def test_never_reached():
    pass
"""

FAULT_IDS = {f"tests/faults/test_faults.py::test_{n}" for n in ("segfault", "abort", "hang", "killed")}


def make_project(tmp_path: Path, suite: str, *, test_s: int = 2, suite_s: int = 300) -> Path:
    return scratch_project(
        tmp_path / "proj",
        {"faults": suite},
        matrix=lambda d: d["backends"]["cpu"]["timeouts"].update(test_s=test_s, suite_s=suite_s),
    )


def env_for(root: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "KILN_ROOT": str(root),
        "PYTHONPATH": str(ROOT),
        "KILN_RESULTS": str(root / "results"),
        "KILN_FAULT_PIDFILE": str(root / "pytest.pid"),
    }
    env.pop("KILN_NATIVE", None)
    return env


def harness(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env=env_for(root),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_args(root: Path, *more: str) -> list[str]:
    return [
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--quiet",
        "--history",
        str(root / "history.sqlite"),
        *more,
    ]


def only_run(root: Path) -> Path:
    runs = [p for p in (root / "results").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def integrity_ok(db: Path) -> bool:
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def history_outcomes(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT node_id, outcome FROM history_outcomes").fetchall())


def test_each_fault_costs_its_test_alone(tmp_path):
    root = make_project(tmp_path, FAULTS)
    proc = harness(root, *run_args(root, "--retries", "1"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    run_dir = only_run(root)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "complete"
    suite = manifest["suites"][0]
    assert suite["status"] == "failed"  # every test decided: the suite ran to its end
    crashes = {c["id"]: c["reason"] for c in suite["crashes"]}
    assert set(crashes) == FAULT_IDS
    assert crashes["tests/faults/test_faults.py::test_segfault"] == "killed by SIGSEGV"
    assert crashes["tests/faults/test_faults.py::test_abort"] == "killed by SIGABRT"
    assert crashes["tests/faults/test_faults.py::test_killed"] == "killed by SIGKILL"
    assert crashes["tests/faults/test_faults.py::test_hang"].startswith("hung: still running")
    assert len(suite["attempts"]) == 5  # the first process and one fresh one after each crash

    # the suite's JUnit holds every test: the healthy ones passed, the planted failure failed, the faults errored
    from harness import results

    tests = {t.id: t for t in results.parse_junit(run_dir / "suites" / "faults.xml")}
    assert {i: t.outcome for i, t in tests.items() if i not in FAULT_IDS} == {
        "tests/faults/test_faults.py::test_first": "passed",
        "tests/faults/test_faults.py::test_between": "passed",
        "tests/faults/test_faults.py::test_fails": "failed",
        "tests/faults/test_faults.py::test_last": "passed",
    }
    assert all(tests[i].outcome == "error" and tests[i].message.startswith("crashed: ") for i in FAULT_IDS)
    for line in (
        "crashed: tests/faults/test_faults.py::test_segfault: killed by SIGSEGV",
        "crashed: tests/faults/test_faults.py::test_killed: killed by SIGKILL",
    ):
        assert line in proc.stdout
    # retries see the crashes: each crashed again alone
    assert "retried tests/faults/test_faults.py::test_abort alone: FAILING" in proc.stdout

    report = (run_dir / "report.txt").read_text()
    assert "3 passed, 1 failed, 4 error" in report.splitlines()[0]
    for test_id in FAULT_IDS:
        assert f"{test_id}: error: crashed: " in report
    repro = harness(root, "repro", "--print", str(run_dir)).stdout
    for test_id in FAULT_IDS:  # a repro line names each fault by its node id
        assert any(ln.rstrip("'").endswith(test_id) for ln in repro.splitlines() if not ln.startswith("#")), (
            repro
        )

    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_last"] == "passed"
    assert {i: recorded[i] for i in FAULT_IDS} == dict.fromkeys(FAULT_IDS, "error")
    assert integrity_ok(root / "history.sqlite")


# Bounds on waits for the harness under test: each only ends a hang (a busy shared host may take minutes to start a
# pytest or to stop one); no assertion here depends on how fast the host is.
HANG_S = 600


def _wait_for_pid(root: Path, timeout_s: float = HANG_S) -> int:
    deadline = time.monotonic() + timeout_s
    pidfile = root / "pytest.pid"
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.1)
    raise AssertionError("the planted test never started")


def _gone(pid: int, timeout_s: float = HANG_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as fh:  # a zombie has ended (its parent reaps it)
            if fh.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.1)
    return False


def _start(root: Path) -> subprocess.Popen:
    """The harness as a terminal starts it: SIGINT at its default disposition. Tests that run inside a
    background job of a non-interactive shell (`nohup nox -s tests &`, some CI runners) inherit SIGINT ignored,
    and a program started with SIGINT ignored keeps ignoring it (Python installs no KeyboardInterrupt handler);
    the interrupt test would then wait out its bound for a Ctrl-C nobody could send."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *run_args(root)],
        env=env_for(root),
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_keeps_what_finished_and_names_the_running_test(tmp_path, sig):
    root = make_project(tmp_path, WAITING, test_s=300)
    harness_proc = _start(root)
    pytest_pid = _wait_for_pid(root)
    harness_proc.send_signal(sig)  # what a CI cancel sends (SIGINT: Ctrl-C)
    out, err = harness_proc.communicate(timeout=HANG_S)
    assert harness_proc.returncode == 130, err
    assert "results so far kept" in err and "Traceback" not in err
    assert _gone(pytest_pid)
    run_dir = only_run(root)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "incomplete"
    what = "interrupted" if sig == signal.SIGINT else "terminated"
    assert (
        manifest["reason"]
        == f"{what} during suite faults while running tests/faults/test_faults.py::test_waiting"
    )
    from harness.suites import collect

    run = collect.load_run(run_dir)
    assert [(t.id.split("::")[1], t.outcome) for s in run.suites for t in s.tests] == [
        ("test_done_first", "passed"),
        ("test_done_second", "passed"),
    ]
    assert "[run INCOMPLETE]" in (run_dir / "report.txt").read_text().splitlines()[0]
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded == {
        "tests/faults/test_faults.py::test_done_first": "passed",
        "tests/faults/test_faults.py::test_done_second": "passed",
    }
    assert integrity_ok(root / "history.sqlite")


def test_a_suite_timeout_keeps_what_finished_and_names_the_hung_test(tmp_path):
    # the suite timeout is what is tested, so it cannot be a mere bound; 45 s leaves a loaded host time to start
    # pytest and pass the two quick tests before it, and test_waiting sleeps far past it
    # (no reruns: each would wait out the timeout again, and the reruns are tested elsewhere)
    root = make_project(tmp_path, WAITING, test_s=45, suite_s=45)
    proc = harness(root, *run_args(root, "--retries", "0"), timeout=HANG_S)
    assert proc.returncode == 1
    assert "suite faults [cpu/native] TIMEOUT: 2 passed, 1 error" in proc.stdout
    manifest = json.loads((only_run(root) / "run.json").read_text())
    suite = manifest["suites"][0]
    assert suite["timed_out"] and suite["not_run"] == ["tests/faults/test_faults.py::test_never_reached"]
    assert [c["id"] for c in suite["crashes"]] == ["tests/faults/test_faults.py::test_waiting"]
    assert suite["crashes"][0]["reason"] == "hung: still running when the suite timeout (45s) passed"
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_done_second"] == "passed"
    assert recorded["tests/faults/test_faults.py::test_waiting"] == "error"


def test_a_sigkilled_harness_leaves_no_child_and_no_finished_run(tmp_path):
    root = make_project(tmp_path, WAITING, test_s=300)
    harness_proc = _start(root)
    pytest_pid = _wait_for_pid(root)
    harness_proc.kill()
    harness_proc.communicate(timeout=HANG_S)
    assert _gone(pytest_pid), "pytest outlived the SIGKILLed harness"
    run_dir = only_run(root)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # never counted as finished
    from harness.suites import collect

    assert not collect.load_run(run_dir).complete
    # the history was not written (the run never finished); a store it left is intact
    db = root / "history.sqlite"
    assert not db.exists() or integrity_ok(db)


def test_a_file_that_fails_to_collect_costs_its_own_tests_and_says_why(tmp_path):
    root = make_project(tmp_path, "def test_fine():\n    pass\n")
    (root / "tests" / "faults" / "test_broken_import.py").write_text("import not_a_module_anywhere\n")
    proc = harness(root, *run_args(root, "--retries", "0"))
    assert proc.returncode == 1
    report = (only_run(root) / "report.txt").read_text()
    assert report.splitlines()[0].endswith("FAILED: 1 passed, 1 error")
    assert (
        "tests/faults/test_broken_import.py: error: collection error: ModuleNotFoundError: No module named "
        "'not_a_module_anywhere'"
    ) in report
    repro = harness(root, "repro", "--print", str(only_run(root))).stdout
    assert any(ln.endswith("tests/faults/test_broken_import.py") for ln in repro.splitlines()), repro


def test_a_bad_compiler_setting_is_one_line_before_any_suite(tmp_path):
    root = make_project(tmp_path, "def test_fine():\n    pass\n")
    (root / "compiler").mkdir()
    for name in ("config.py", "exc.py"):  # the project's compiler settings module, as in the real tree
        (root / "compiler" / name).write_text((ROOT / "compiler" / name).read_text())
    env = {**env_for(root), "KILN_POINTWISE_XBLOCK": "abc"}
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *run_args(root)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "harness run: error: bad compiler setting for the suites: "
        "KILN_POINTWISE_XBLOCK='abc': expected an integer"
    )
    assert not (root / "results").exists() or not any((root / "results").iterdir())
