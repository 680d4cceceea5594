"""A pytest plugin (`-p harness.suites.journal_plugin --kiln-journal FILE [--kiln-skip FILE]`) that writes every test's
start and outcome to a journal as it happens, so that nothing a suite ran is lost when its process dies.

Terms:
  journal   a file of JSON lines, one event each, appended and flushed as the event happens (a process that
            segfaults, aborts, is OOM-killed or SIGKILLed has written every event before its end):
              {"event": "collected", "ids": [...]}          the tests this process will run, in order
              {"event": "collect_error", "id", "message", "text"}   a file that failed to collect
              {"event": "collect_start", "id"} / {"event": "collect_done", "id"}   a collector (a folder, a
                                                            file, a class) began / ended collecting: one
                                                            started and not done names the file whose import
                                                            the process died in
              {"event": "start", "id"}                      a test began (its setup)
              {"event": "finish", "id", "outcome", "message", "text", "duration_s"}   a test ended
              {"event": "spawned", "id", "procs", "ns"}     processes the test started that still ran after
                                                            its teardown ([pid, start, sid, cmdline] each,
                                                            harness.leftovers.Proc; ns: the pid namespace): the
                                                            harness ends and names those still running when the
                                                            process ends (natively: a container's are ended by
                                                            its removal)
              {"event": "poisoned", "id", "error"}          the device is unusable after this test (below)
              {"event": "exit", "status"}                   the session ended normally
            A `start` without its `finish` names the test that was running when the process ended.
  outcome   as harness.results.OUTCOMES, decided as pytest's JUnit writer does: a setup or teardown failure is
            an error, a failed call a failure, an expected failure xfailed, a skip skipped.
  skip file JSON list of node ids this process must not run (done or crashed in an earlier process of the
            same suite); they are deselected after every other selection (`-k`, `-m`, the shard plugin), so a
            resumed process runs exactly the rest of what the first one would have run.
  text      every string of an event is `harness.results.printable`: control characters and unpaired surrogates
            in a message arrive as their escapes, so the JUnit files and reports built from it stay readable.
  poisoned  a CUDA/HIP error is sticky: after an illegal address, a device-side assert or an uncorrectable
            ECC error, every later kernel of the process fails. After each test that used the GPU the plugin
            synchronizes the device; when that raises, the test is recorded as the culprit and the process
            exits at once with EXIT_POISONED, so the harness resumes the rest in a fresh process and no later
            test is charged (PyTorch's device-type test base stops its suite the same way).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, ClassVar

import pytest

from harness import leftovers
from harness.exc import EXIT_POISONED
from harness.results import printable

_TEXT_LIMIT = 20000
_STICKY = (
    "illegal memory access",
    "illegal address",
    "device-side assert",
    "uncorrectable ecc",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction",
    "hipErrorIllegal",
    "cudaErrorIllegal",
    "cudaErrorAssert",
    "cudaErrorLaunchFailure",
    "cudaErrorECCUncorrectable",
)


class Journal:
    """Appends one JSON line per event to a file, flushed to the OS at once (O_APPEND: whole lines)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **event: Any) -> None:
        os.write(self.fd, (json.dumps(_printable(event), default=str) + "\n").encode())


def _printable(value: Any) -> Any:
    """`value` with every string in it `printable` (module docstring)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kiln-journal", "kiln: a crash-proof journal of the tests run")
    group.addoption("--kiln-journal", metavar="FILE", help="append every test's start and outcome here")
    group.addoption("--kiln-skip", metavar="FILE", help="JSON list of node ids not to run (done elsewhere)")


class _State:
    """This process's journal and the reports of the test in progress (one pytest session per process)."""

    journal: Journal | None = None
    reports: ClassVar[dict[str, list[pytest.TestReport]]] = {}
    before: ClassVar[set[tuple[int, int]]] = (
        set()
    )  # (pid, start) of the processes below this one at a test's start


def _journal(_: object = None) -> Journal | None:
    return _State.journal


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("kiln_journal")
    if path:
        _State.journal = Journal(path)
        _State.reports = {}
        leftovers.become_subreaper()  # a test's double-forked daemon stays below this process, to be named


def pytest_collectstart(collector: pytest.Collector) -> None:
    journal = _journal()
    if journal is not None and collector.nodeid:
        journal.write(event="collect_start", id=collector.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    yield  # every other selection first (-k, -m, the shard plugin): the skip applies to what they kept
    path = config.getoption("kiln_skip")
    if path:
        with open(path, encoding="utf-8") as fh:
            skip = set(json.load(fh))
        deselected = [item for item in items if item.nodeid in skip]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.nodeid not in skip]
    journal = _journal(config)
    if journal is not None:
        journal.write(event="collected", ids=[item.nodeid for item in items])


def pytest_collectreport(report: pytest.CollectReport) -> None:
    journal = _journal()
    if journal is not None and report.nodeid:
        journal.write(event="collect_done", id=report.nodeid)
    if report.failed and journal is not None:
        text = str(report.longrepr)
        journal.write(
            event="collect_error", id=report.nodeid, message=_last_error_line(text), text=text[-_TEXT_LIMIT:]
        )


def _last_error_line(text: str) -> str:
    """The line of a traceback that says what went wrong: the last `E   ...` line, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors or lines or [""])[-1][:500]


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    journal = _journal()
    if journal is not None:
        _State.reports[nodeid] = []
        _State.before = {(p.pid, p.start) for p in leftovers.descendants(os.getpid())}
        journal.write(event="start", id=nodeid, t=round(time.time(), 3))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _journal() is not None:
        _State.reports.setdefault(report.nodeid, []).append(report)


def outcome_of(reports: list[pytest.TestReport]) -> tuple[str, str, str]:
    """(outcome, message, text) of one test from its setup/call/teardown reports (module docstring)."""
    outcome, message, text = "passed", "", ""
    for r in reports:
        xfail = hasattr(r, "wasxfail")
        if r.failed:
            kind = "failed" if r.when == "call" else "error"
            if outcome not in ("failed", "error") or kind == "error":
                outcome = kind
            text = r.longreprtext
            crash = getattr(r.longrepr, "reprcrash", None)
            message = (crash.message if crash is not None else _last_error_line(text)) or f"{r.when} failed"
            if r.when != "call":
                message = f"{r.when} failed: {message}"
        elif r.skipped and outcome == "passed":
            outcome = "xfailed" if xfail else "skipped"
            if xfail:
                message = str(r.wasxfail)
            elif isinstance(r.longrepr, tuple) and len(r.longrepr) == 3:
                message = str(r.longrepr[2])
    for r in reports:
        for name, content in r.sections:
            if content.strip():
                text += f"\n--- {name}\n{content}"
    return outcome, message, text[-_TEXT_LIMIT:]


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    journal = _journal()
    if journal is None:
        return
    reports = _State.reports.pop(nodeid, [])
    outcome, message, text = outcome_of(reports)
    journal.write(
        event="finish",
        id=nodeid,
        outcome=outcome,
        message=message,
        text=text,
        duration_s=round(sum(r.duration for r in reports), 3),
    )
    spawned = [p for p in leftovers.descendants(os.getpid()) if (p.pid, p.start) not in _State.before]
    if spawned:
        journal.write(
            event="spawned", id=nodeid, procs=[p.as_json() for p in spawned], ns=leftovers.pid_namespace()
        )
    error = device_error()
    if error is not None:
        journal.write(event="poisoned", id=nodeid, error=error)
        os._exit(EXIT_POISONED)  # no teardown of anything: the device is gone for this process


def device_error() -> str | None:
    """The sticky device error this process has hit, or None (no GPU used, or the device is fine)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any error raised by the device check is the answer
        text = str(e)
        return text.strip().splitlines()[0][:500] if any(s.lower() in text.lower() for s in _STICKY) else None
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    journal = _journal()
    if journal is not None:
        journal.write(event="exit", status=int(exitstatus))
