"""harness.suites.isolation's resume loop on journals written by a stand-in for pytest (no process is started):
which test is blamed for each way an attempt can end, what the next attempt skips, and the suite's JUnit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import results
from harness.exc import EXIT_POISONED
from harness.suites import isolation

IDS = [f"tests/s/test_x.py::test_{n}" for n in ("a", "b", "c", "d")]


@dataclass
class FakeRun:
    log: Path
    returncode: int
    timed_out: bool = False
    duration_s: float = 0.1
    argv: tuple = ()


def scripted(suite_dir: Path, script: list[tuple[list[dict], int]], seen_skips: list[list[str]]):
    """An `attempt` that writes the k-th scripted journal and returns its exit status."""

    def attempt(k, name, extra, timeout_s, watchdog):
        skip = next((a.split("=", 1)[1] for a in extra if a.startswith("--kiln-skip=")), None)
        seen_skips.append(json.loads(Path(skip).read_text()) if skip else [])
        events, rc = script[k - 1]
        suite_dir.mkdir(parents=True, exist_ok=True)
        (suite_dir / f"{name}.journal").write_text("".join(json.dumps(e) + "\n" for e in events))
        (suite_dir / f"{name}.log").write_text(f"log of attempt {k}\n")
        return FakeRun(suite_dir / f"{name}.log", rc)

    return attempt


def finish(i: str, outcome: str = "passed") -> list[dict]:
    return [
        {"event": "start", "id": i, "t": 0},
        {"event": "finish", "id": i, "outcome": outcome, "message": "", "text": "", "duration_s": 0.5},
    ]


def test_a_test_that_fails_and_poisons_the_device_is_one_crashed_test_and_the_rest_resume(tmp_path):
    first = [
        {"event": "collected", "ids": IDS},
        *finish(IDS[0]),
        *finish(IDS[1], "failed"),
        {"event": "poisoned", "id": IDS[1], "error": "CUDA error: an illegal memory access was encountered"},
    ]
    second = [
        {"event": "collected", "ids": IDS[2:]},
        *finish(IDS[2]),
        *finish(IDS[3]),
        {"event": "exit", "status": 0},
    ]
    skips: list[list[str]] = []
    out = isolation.run_suite(
        scripted(tmp_path, [(first, EXIT_POISONED), (second, 0)], skips),
        "s",
        tmp_path,
        str(tmp_path),
        suite_s=60,
        test_s=10,
    )
    assert skips == [[], sorted(IDS[:2])]  # the fresh process skips what was decided, the culprit included
    assert [(f.id, f.outcome) for f in out.finished] == [
        (IDS[0], "passed"),
        (IDS[1], "error"),
        (IDS[2], "passed"),
        (IDS[3], "passed"),
    ]  # run order
    culprit = out.finished[1]
    assert culprit.message.startswith(
        "crashed: device unusable after this test: CUDA error: an illegal memory"
    )
    assert culprit.duration_s == 0.5 and out.status() == "failed" and not out.not_run
    isolation.write_junit(tmp_path / "s.xml", "s", out.finished)
    parsed = {t.id: t.outcome for t in results.parse_junit(tmp_path / "s.xml")}
    assert parsed == {IDS[0]: "passed", IDS[1]: "error", IDS[2]: "passed", IDS[3]: "passed"}


def test_a_process_killed_between_tests_resumes_without_blaming_anyone(tmp_path):
    first = [{"event": "collected", "ids": IDS}, *finish(IDS[0])]  # died in a module teardown: nobody running
    second = [
        {"event": "collected", "ids": IDS[1:]},
        *finish(IDS[1]),
        *finish(IDS[2]),
        *finish(IDS[3]),
        {"event": "exit", "status": 0},
    ]
    out = isolation.run_suite(
        scripted(tmp_path, [(first, -9), (second, 0)], []),
        "s",
        tmp_path,
        str(tmp_path),
        suite_s=60,
        test_s=10,
    )
    assert (
        not out.crashes and [f.outcome for f in out.finished] == ["passed"] * 4 and out.status() == "passed"
    )


def test_a_process_that_dies_before_collecting_is_a_collection_failure(tmp_path):
    out = isolation.run_suite(
        scripted(tmp_path, [([], 4)], []), "s", tmp_path, str(tmp_path), suite_s=60, test_s=10
    )
    assert out.status() == "error" and out.collect_failed == "exit status 4: log of attempt 1"


def test_a_crash_after_the_last_test_is_an_error_of_the_suite(tmp_path):
    events = [{"event": "collected", "ids": IDS[:1]}, *finish(IDS[0])]
    out = isolation.run_suite(
        scripted(tmp_path, [(events, -11)], []), "s", tmp_path, str(tmp_path), suite_s=60, test_s=10
    )
    assert out.status() == "error" and out.ended_badly == "killed by SIGSEGV after its last test"


def test_exit_reasons():
    assert isolation.exit_reason(-11) == "killed by SIGSEGV"
    assert isolation.exit_reason(134) == "killed by SIGABRT"
    assert isolation.exit_reason(3) == "exit status 3"


def test_the_suite_junit_stays_readable_whatever_a_message_holds(tmp_path):
    from harness import results as res

    nasty = "a\x00b\x1b[31mred\ud800 \x07\uffff"
    finished = [
        isolation.Finished("t.py::test_a", "failed", nasty, nasty, 0.1),
        isolation.Finished("t.py::test_b", "skipped", nasty, "", 0.0),
        isolation.Finished("t.py::test_c", "passed", "", "", 0.0),
    ]
    isolation.write_junit(tmp_path / "s.xml", "s", finished)
    tests = res.parse_junit(tmp_path / "s.xml")
    assert [(t.outcome, t.message) for t in tests] == [
        ("failed", "a\\x00b\\x1b[31mred\\ud800 \\x07\\uffff"),
        ("skipped", "a\\x00b\\x1b[31mred\\ud800 \\x07\\uffff"),
        ("passed", ""),
    ]


@pytest.mark.parametrize("clean", [True, False])
def test_leftovers_are_charged_to_their_test_only_after_a_clean_exit(clean):
    from harness.leftovers import Proc

    ended = Proc(4242, 7, 4000, "sleep 300")  # what process.execute ended when pytest exited
    out = isolation.SuiteRun(
        finished=[
            isolation.Finished("t.py::test_a", "passed", "", "", 0.1),
            isolation.Finished("t.py::test_b", "passed", "", "", 0.1),
        ]
    )
    read = isolation.JournalRead(spawned={"t.py::test_a": [ended]})
    isolation._charge_leftovers(out, read, [ended], clean=clean)
    outcomes = {f.id: (f.outcome, f.message) for f in out.finished}
    if clean:
        assert outcomes["t.py::test_a"] == (
            "error",
            "left 1 process(es) running: pid 4242 (sleep 300) (ended by the harness)",
        )
        assert out.unowned == [] and out.status() == "failed"
    else:  # pytest died: a process-wide pool would be left too; the suite names it with its test
        assert outcomes["t.py::test_a"] == ("passed", "")
        assert out.unowned == ["pid 4242 (sleep 300) started by t.py::test_a"] and out.status() == "error"
    assert outcomes["t.py::test_b"] == ("passed", "")
