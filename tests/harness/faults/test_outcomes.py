"""Every way a planted test misbehaves is one outcome, through the real harness (`python -m harness run --native` on
a scratch project, CPU): a test or fixture that leaves processes running (they are ended and named); any text in
a message, in any phase (the JUnit stays readable, the report shows it escaped, no outcome is lost); a test file
that kills the interpreter while it is imported (that file alone is lost, named; the rest of the suite runs).
The planted tests import no torch: each run takes seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_faults import harness, history_outcomes, integrity_ok, make_project, only_run, run_args

from harness import results

MARK = "kiln-planted-leftover"

# each leftover runs `sleep` under a marked command line (MARK and the project's folder), so the test can look for
# survivors of its own run only
LEFTOVERS = """
import os, subprocess, sys, pytest

def sleeper(what):
    return [sys.executable, "-c", "import sys, time; time.sleep(300)", what, "{mark}", os.environ["KILN_ROOT"]]

@pytest.fixture
def server():
    subprocess.Popen(sleeper("fixture"))  # never stopped
    yield

def test_first():
    pass

def test_child_left_running():
    subprocess.Popen(sleeper("child"))

def test_fixture_left_running(server):
    pass

def test_daemon_left_running():
    # a double-forked daemon in a session of its own: neither its parent nor its session is pytest's
    subprocess.run([sys.executable, "-c",
                    "import os, subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)",
                    *sleeper("daemon")], check=True)

def test_child_waited_for():
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # ended in time: no leftover

def test_last():
    pass
""".replace("{mark}", MARK)


def _survivors(root: Path) -> list[int]:
    """pids of running processes whose command line carries MARK and `root`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if MARK.encode() in cmd and str(root).encode() in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def _run_and_reap(root: Path) -> tuple[subprocess.CompletedProcess, list[int]]:
    """The harness run of the planted project and the planted processes still alive after it; whatever survived
    is killed afterwards, so that a failing test leaves nothing behind."""
    try:
        proc = harness(root, *run_args(root, "--retries", "0"))
        survivors = _survivors(root)
    finally:
        for pid in _survivors(root):
            os.kill(pid, signal.SIGKILL)
    return proc, survivors


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="the leftover search reads Linux's /proc")
def test_processes_a_test_leaves_running_are_ended_and_named(tmp_path):
    root = make_project(tmp_path, LEFTOVERS)
    proc, survivors = _run_and_reap(root)
    assert survivors == [], "processes of the planted tests outlived the run"
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (only_run(root) / "report.txt").read_text()
    assert "3 passed, 3 error" in report.splitlines()[0], report
    for test, what in (
        ("child_left_running", "child"),
        ("fixture_left_running", "fixture"),
        ("daemon_left_running", "daemon"),
    ):
        line = next((ln for ln in report.splitlines() if f"test_faults.py::test_{test}: error: " in ln), "")
        assert "left 1 process(es) running: pid " in line and f"time.sleep(300) {what} {MARK}" in line, (
            test,
            report,
        )
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_child_left_running"] == "error"
    assert recorded["tests/faults/test_faults.py::test_child_waited_for"] == "passed"


# unprintable text in every phase and kind of outcome: a call's failure, a setup error, a teardown error, a skip's
# and an expected failure's reason, captured output, and a sibling file that fails to import
NASTY = "a\\x00b\\x1b[31mred\\ud800 \\x07 \\uffff end"
ESCAPED = r"a\x00b\x1b[31mred\ud800 \x07 \uffff end"
TEXTS = """
import sys, pytest

NASTY = "{nasty}"

@pytest.fixture
def broken_setup():
    raise RuntimeError(NASTY)

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError(NASTY)

def test_first():
    pass

def test_call_fails():
    print(NASTY)
    sys.stderr.write(NASTY + "\\\\n")
    assert False, NASTY

def test_setup_errors(broken_setup):
    pass

def test_teardown_errors(broken_teardown):
    pass

def test_skipped():
    pytest.skip(NASTY)

@pytest.mark.xfail(reason=NASTY)
def test_xfails():
    assert False

def test_last():
    pass
""".replace("{nasty}", NASTY)


def test_any_text_in_any_phase_survives_escaped_and_the_junit_stays_readable(tmp_path):
    root = make_project(tmp_path, TEXTS)
    (root / "tests" / "faults" / "test_import_fails.py").write_text(f'raise RuntimeError("{NASTY}")\n')
    proc = harness(root, *run_args(root, "--retries", "0"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    run_dir = only_run(root)
    junit = run_dir / "suites" / "faults.xml"
    ET.parse(junit)  # readable XML
    tests = {t.id.split("::")[-1]: t for t in results.parse_junit(junit)}
    assert {name: t.outcome for name, t in tests.items()} == {
        "test_first": "passed",
        "test_call_fails": "failed",
        "test_setup_errors": "error",
        "test_teardown_errors": "error",
        "test_skipped": "skipped",
        "test_xfails": "xfailed",
        "test_last": "passed",
        "tests/faults/test_import_fails.py": "error",
    }
    for name in (
        "test_call_fails",
        "test_setup_errors",
        "test_teardown_errors",
        "test_skipped",
        "test_xfails",
        "tests/faults/test_import_fails.py",
    ):
        assert ESCAPED in tests[name].message, (name, tests[name].message)
    report = (run_dir / "report.txt").read_text(encoding="utf-8")
    assert report.splitlines()[0].endswith("FAILED: 2 passed, 1 failed, 3 error, 1 skipped, 1 xfailed"), (
        report
    )
    assert f"test_faults.py::test_call_fails: failed: AssertionError: {ESCAPED}" in report
    assert "\x1b" not in report and "\x00" not in report and "\x1b" not in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["passed"] == 2, summary
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_last"] == "passed" and len(recorded) == 8
    assert integrity_ok(root / "history.sqlite")


# a file whose import kills the interpreter, in each way a process dies; healthy files before and after it
DIES_IMPORTING = {
    "test_aborts.py": "import os\nos.abort()\n\ndef test_never():\n    pass\n",
    "test_segfaults.py": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n\ndef test_never():\n    pass\n",
    "test_exits.py": "import os\nos._exit(0)\n\ndef test_never():\n    pass\n",
    "test_zz_healthy.py": "def test_after_them():\n    pass\n",
}


def test_a_file_that_kills_the_interpreter_while_imported_costs_that_file_alone(tmp_path):
    root = make_project(tmp_path, "def test_before_them():\n    pass\n")
    for name, text in DIES_IMPORTING.items():
        (root / "tests" / "faults" / name).write_text(text)
    proc = harness(root, *run_args(root, "--retries", "0"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = only_run(root)
    report = (run_dir / "report.txt").read_text()
    assert report.splitlines()[0].endswith("FAILED: 2 passed, 3 error"), report
    for name, why in (
        ("test_aborts.py", "killed by SIGABRT"),
        ("test_segfaults.py", "killed by SIGSEGV"),
        ("test_exits.py", "exit status 0"),
    ):
        assert f"tests/faults/{name}: error: crashed while collecting: {why} (attempt " in report, (
            name,
            report,
        )
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_before_them"] == "passed"
    assert recorded["tests/faults/test_zz_healthy.py::test_after_them"] == "passed"
    assert recorded["tests/faults/test_aborts.py"] == "error"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert {c["id"] for c in manifest["suites"][0]["crashes"]} == {
        f"tests/faults/{n}" for n in ("test_aborts.py", "test_segfaults.py", "test_exits.py")
    }
    repro = harness(root, "repro", "--print", str(run_dir)).stdout
    assert any(ln.endswith("tests/faults/test_aborts.py") for ln in repro.splitlines()), repro


# every phase a test process can die in or leave something behind in: import (a process started at module level,
# which no test owns), setup, teardown, the call (an exit with status 0), and after the last test (at exit)
PHASES = """
import os, signal, subprocess, sys, pytest

STARTED_AT_IMPORT = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)", "import", "{mark}", os.environ["KILN_ROOT"]])

@pytest.fixture
def dies_in_setup():
    os.abort()

@pytest.fixture
def dies_in_teardown():
    yield
    os.kill(os.getpid(), signal.SIGSEGV)

def test_first():
    pass

def test_setup_crash(dies_in_setup):
    pass

def test_teardown_crash(dies_in_teardown):
    pass

def test_exits_zero():
    os._exit(0)

def test_last():
    pass
""".replace("{mark}", MARK)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="the leftover search reads Linux's /proc")
def test_every_phase_a_process_dies_in_or_leaves_processes_in_is_named(tmp_path):
    root = make_project(tmp_path, PHASES)
    (root / "tests" / "faults" / "conftest.py").write_text(
        "import atexit, os\n\ndef pytest_sessionfinish(session):\n    atexit.register(os.abort)  # after the journal\n"
    )
    proc, survivors = _run_and_reap(root)
    assert survivors == [], "processes started at import outlived the run"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (only_run(root) / "report.txt").read_text()
    assert report.splitlines()[0].startswith("kiln cpu/native FAILED: 2 passed, 3 error"), report
    for test, why in (
        ("setup_crash", "killed by SIGABRT"),
        ("teardown_crash", "killed by SIGSEGV"),
        ("exits_zero", "exit status 0"),
    ):
        assert f"tests/faults/test_faults.py::test_{test}: error: crashed: {why} (attempt " in report, (
            test,
            report,
        )
    (badly,) = [ln for ln in report.splitlines() if "ended badly: " in ln]
    assert "killed by SIGABRT after its last test" in badly
    assert "process(es) running: pid " in badly and "(ended by the harness)" in badly
    assert f"time.sleep(300) import {MARK}" in badly
    recorded = history_outcomes(root / "history.sqlite")
    assert recorded["tests/faults/test_faults.py::test_last"] == "passed"
