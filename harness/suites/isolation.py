"""Crash isolation of a suite: one test at a time, and a test that kills its process costs that test alone.

A suite runs as one pytest process with `harness.suites.journal_plugin`, which journals every test's start and
outcome as it happens. When the process ends abnormally (a segfault, `abort()`, the OOM killer, SIGKILL,
pytest-timeout's thread method, a device left unusable, or a test running past the harness's watchdog), the
journal says which tests finished and which one was running: that one is recorded as *crashed*, and the suite
resumes in a fresh process that skips every test already decided, until all of them are (PyTorch's
`run_test.py` resumes after a crash the same way). Execution stays single-threaded: one process at a time.

Terms:
  attempt     one pytest process of the suite: the first is named `<suite>` (log `<suite>.log`), a resumed
              one `<suite>.resume-<k>` (its own log); the suite's JUnit `<suite>.xml` is written by the harness
              from every attempt's journal (`<name>.journal`), so it holds every result whatever ended each.
  crash       a test whose process ended while it ran: its reason (signal name or exit status, "device
              unusable: ...", "hung"), the attempt and the last lines of that attempt's log. It is a JUnit
              `<error>` with property `kiln_crash`, so the report, the repro lines, the retries and the test
              history see it as an errored test.
  watchdog    a test still running `test_s + grace` after it started (grace: the per-test timeout again, at
              least 3 s, at most WATCHDOG_GRACE_S; pytest-timeout did not get it out: a hang in C code with
              signals blocked, a GPU kernel that never ends) has its process killed and is recorded as hung; the
              rest of the suite resumes.
  collection crash  a process that dies while importing a test file (a collector started, never done): that file
              is recorded as crashed, with an `<error>` under the file's id, and the suite resumes without it
              (`--ignore`); a death before any file is known (a root conftest, a plugin) fails the suite's
              collection.
  leftover    a process a test started that still runs after the pytest process ended (the journal's `spawned`
              events name the test; `process.execute` ends its session's): ended by the harness and named in the
              test's outcome, an error `left N process(es) running: pid P (command), ...`; one that no test is
              known to have started, or any after a pytest process that died (no atexit ran: a process-wide
              worker pool was not stopped either), ends the suite badly, named, with its test where known.
  budget      the suite timeout covers all attempts together; when it runs out the running test is recorded as
              hung, the tests not run yet are counted as `not_run`, and the suite's status is `timeout`.
"""

from __future__ import annotations

import json
import signal
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import leftovers
from harness import results as res
from harness.exc import EXIT_POISONED
from harness.record import CrashRecord, Outcome, TestOutcome

WATCHDOG_GRACE_S = 30.0  # at most this long past the per-test timeout: pytest-timeout has had its chance
MAX_CRASHES = 25  # per suite: past this many, the rest is not run (something is broken for every test)
TAIL_LINES = 30
NORMAL_EXITS = (0, 1, 5)  # pytest: all passed, some failed, no tests


Crash = CrashRecord  # a test whose process ended while it ran (module docstring); run.json keeps it as is


@dataclass(frozen=True)
class Finished:
    """One test's outcome as journaled (or a crash's, as the harness decided it)."""

    id: str
    outcome: str
    message: str
    text: str
    duration_s: float
    crash: str = ""


@dataclass
class JournalRead:
    """What one attempt's journal says: tests collected, finished in order, the one running at the end."""

    collected: list[str] | None = None
    finished: list[Finished] = field(default_factory=list)
    collect_errors: list[Finished] = field(default_factory=list)
    running: str | None = None
    running_since: float | None = None
    poisoned: tuple[str, str] | None = None
    exit_status: int | None = None
    collecting: list[str] = field(default_factory=list)  # collectors started and not done, outermost first
    spawned: dict[str, list[leftovers.Proc]] = field(
        default_factory=dict
    )  # test id -> processes it left running

    def collecting_file(self) -> str | None:
        """The file (or folder) whose collection the process died in, when it died collecting one."""
        return self.collecting[-1].split("::")[0] if self.collecting and self.collected is None else None


def read_journal(path: Path) -> JournalRead:
    """Parse a journal; a last line cut short by the process's death is ignored."""
    out = JournalRead()
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = ev.get("event")
        if kind == "collected":
            out.collected = list(ev["ids"])
        elif kind == "collect_error":
            out.collect_errors.append(
                Finished(
                    res.printable(ev["id"] or "<collection>"),
                    "error",
                    res.printable(f"collection error: {ev.get('message', '')}"),
                    res.printable(ev.get("text", "")),
                    0.0,
                )
            )
        elif kind == "collect_start":
            out.collecting.append(str(ev["id"]))
        elif kind == "collect_done":
            if ev["id"] in out.collecting:
                out.collecting.remove(ev["id"])
        elif (
            kind == "spawned" and ev.get("ns", "") == leftovers.pid_namespace()
        ):  # module docstring: leftover
            out.spawned.setdefault(ev["id"], []).extend(
                leftovers.Proc.from_json(p) for p in ev.get("procs", [])
            )
        elif kind == "start":
            out.running, out.running_since = ev["id"], ev.get("t")
        elif kind == "finish":
            out.finished.append(
                Finished(
                    ev["id"],
                    ev["outcome"],
                    res.printable(ev.get("message", "")),
                    res.printable(ev.get("text", "")),
                    float(ev.get("duration_s") or 0.0),
                )
            )
            if out.running == ev["id"]:  # the test that was running finished
                out.running = out.running_since = None
        elif kind == "poisoned":
            out.poisoned = (ev["id"], ev.get("error", ""))
        elif kind == "exit":
            out.exit_status = int(ev["status"])
    return out


def exit_reason(returncode: int | None) -> str:
    """`killed by SIGSEGV` / `exit status 3` for a process's return code (negative: a signal)."""
    if returncode is None:
        return "no exit status"
    if returncode < 0 or returncode > 128:
        num = -returncode if returncode < 0 else returncode - 128
        try:
            return f"killed by {signal.Signals(num).name}"
        except ValueError:
            return f"killed by signal {num}"
    return f"exit status {returncode}"


def log_tail(log: Path, lines: int = TAIL_LINES) -> str:
    if not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class SuiteRun:
    """Everything a suite's attempts decided: outcomes in run order, crashes, tests not run, attempts made."""

    finished: list[Finished] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    attempts: list[Any] = field(default_factory=list)  # runner.PytestRun of each attempt
    collect_failed: str = ""  # the cause when the suite could not be collected at all
    ended_badly: str = ""  # an abnormal end that no test is to blame for (a crash after the last test)
    timed_out: bool = False
    running: str | None = None  # the test that was running when the suite was interrupted
    unowned: list[str] = field(
        default_factory=list
    )  # leftovers charged to no test (labels, their test if known)

    @property
    def decided(self) -> set[str]:
        return {f.id for f in self.finished}

    def status(self) -> str:
        """timeout / error (could not collect, ended badly, tests left unrun) / failed / empty / passed."""
        if self.timed_out:
            return "timeout"
        if self.collect_failed or self.ended_badly or self.not_run or self.unowned:
            return "error"
        if any(f.outcome in res.FAILING for f in self.finished):
            return "failed"
        return "passed" if self.finished else "empty"

    def tests(self) -> list[TestOutcome]:
        """The finished tests as the suite's JUnit (`write_junit`) gives them back: seconds to 3 decimals, a
        message only for a test that did not pass."""
        return [
            TestOutcome(
                f.id,
                Outcome(f.outcome),
                f.message.strip()[:500] if f.outcome != "passed" else "",
                round(f.duration_s, 3),
            )
            for f in self.finished
        ]


Attempt = Callable[[int, str, list[str], float, Callable[[], str | None]], Any]


def run_suite(
    attempt: Attempt,
    suite: str,
    suite_dir: Path,
    seen_dir: str,
    *,
    suite_s: float,
    test_s: float,
    on_interrupt: Callable[[SuiteRun], None] | None = None,
) -> SuiteRun:
    """Run one suite to the end through `attempt(k, name, extra_args, timeout_s, watchdog) -> PytestRun`
    (runner.run_pytest with the suite's arguments), resuming after every crash (module docstring).

    `seen_dir` is `suite_dir` as pytest sees it (the container's mount). On Ctrl-C/SIGTERM the journal's
    results are kept in the returned state: `on_interrupt(state)` is called, then the interrupt propagates.
    Leftovers that no test started (module docstring) end the suite badly, named.
    """
    out = _run_attempts(
        attempt, suite, suite_dir, seen_dir, suite_s=suite_s, test_s=test_s, on_interrupt=on_interrupt
    )
    if out.unowned:
        note = f"left {len(out.unowned)} process(es) running: {', '.join(out.unowned)} (ended by the harness)"
        out.ended_badly = f"{out.ended_badly}; {note}" if out.ended_badly else note
    return out


def _run_attempts(
    attempt: Attempt,
    suite: str,
    suite_dir: Path,
    seen_dir: str,
    *,
    suite_s: float,
    test_s: float,
    on_interrupt: Callable[[SuiteRun], None] | None,
) -> SuiteRun:
    """`run_suite`'s attempts, one after the other until every test is decided (or the budget is spent)."""
    out = SuiteRun()
    deadline = time.monotonic() + suite_s
    ignored: list[str] = []  # files whose import killed a process: the later attempts leave them out
    k = 0
    while True:
        k += 1
        name = suite if k == 1 else f"{suite}.resume-{k}"
        journal = suite_dir / f"{name}.journal"
        journal.unlink(missing_ok=True)
        extra = [
            "-p",
            "harness.suites.journal_plugin",
            f"--kiln-journal={seen_dir}/{journal.name}",
            "--continue-on-collection-errors",
        ]  # a file that fails to import costs its own tests alone
        extra += [f"--ignore={path}" for path in ignored]
        if out.finished:
            skip = suite_dir / f"{name}.skip.json"
            res.atomic_write_json(skip, sorted(out.decided))
            extra.append(f"--kiln-skip={seen_dir}/{skip.name}")
        hung: list[str] = []
        watchdog = make_watchdog(journal, test_s, hung)
        try:
            run = attempt(k, name, extra, max(deadline - time.monotonic(), 1.0), watchdog)
        except KeyboardInterrupt:
            read = read_journal(journal)
            out.finished += read.finished
            out.running = read.running
            _collected_rest(out, read)
            if on_interrupt is not None:
                on_interrupt(out)
            raise
        out.attempts.append(run)
        read = read_journal(journal)
        before = len(out.finished)
        out.finished += read.finished + [e for e in read.collect_errors if e.id not in out.decided]
        _charge_leftovers(out, read, getattr(run, "left", []), clean=read.exit_status is not None)
        if run.returncode in NORMAL_EXITS and not run.timed_out and not hung and read.exit_status is not None:
            _collected_rest(out, read)
            return out
        culprit, why = _culprit(read, run, hung, suite_s, test_s)
        if culprit is not None:
            crash = Crash(culprit, why, run.returncode, k, run.log.name, log_tail(run.log))
            out.crashes.append(crash)
            own = next(
                (f for f in out.finished if f.id == culprit), None
            )  # it finished, then broke the device
            out.finished = [f for f in out.finished if f.id != culprit]
            text = f"{own.message}\n{own.text}\n--- log tail\n{crash.tail}" if own else crash.tail
            out.finished.append(
                Finished(
                    culprit,
                    "error",
                    f"crashed: {why} (attempt {k}; see {run.log.name})",
                    text,
                    own.duration_s if own else 0.0,
                    crash=why,
                )
            )
        crashed_file = read.collecting_file()
        if (
            culprit is None
            and crashed_file
            and crashed_file not in ignored
            and len(out.crashes) < MAX_CRASHES
        ):
            crash = Crash(
                crashed_file,
                f"crashed while collecting: {why}",
                run.returncode,
                k,
                run.log.name,
                log_tail(run.log),
            )
            out.crashes.append(crash)
            out.finished = [f for f in out.finished if f.id != crashed_file]
            out.finished.append(
                Finished(
                    crashed_file,
                    "error",
                    f"crashed while collecting: {why} (attempt {k}; see {run.log.name})",
                    crash.tail,
                    0.0,
                    crash=crash.reason,
                )
            )
            ignored.append(crashed_file)
            if run.timed_out or time.monotonic() >= deadline:  # it hung importing: the budget is spent
                out.timed_out = True
                return out
            continue  # the rest of the suite, without that file
        if (
            read.collected is None and not read.finished
        ):  # died before its tests were known: conftest, imports
            out.collect_failed = f"{why}: {res_error_line(run.log)}"
            out.timed_out = run.timed_out
            return out
        _collected_rest(out, read)
        if run.timed_out or time.monotonic() >= deadline:
            out.timed_out = True
            return out
        if not out.not_run:
            if culprit is None:  # every test decided, yet the process ended badly (a crash at exit)
                out.ended_badly = f"{why} after its last test"
            return out
        if len(out.crashes) >= MAX_CRASHES or (culprit is None and len(out.finished) == before):
            out.ended_badly = (
                f"{why}; gave up after {len(out.crashes)} crash(es), {len(out.not_run)} test(s) not run"
            )
            return out


def _charge_leftovers(out: SuiteRun, read: JournalRead, left: list[leftovers.Proc], *, clean: bool) -> None:
    """End the processes an attempt's tests left running (module docstring: leftover) and charge each test that
    started one: its outcome becomes an error naming them. `left`: those `process.execute` ended already. After
    an attempt that did not end `clean` (pytest died: no atexit ran, so a process-wide worker pool was not
    stopped either) no test is charged: the suite names them, with the test that started each where known."""
    started = {(p.pid, p.start): test for test, procs in read.spawned.items() for p in procs}
    escaped = [
        p
        for procs in read.spawned.values()
        for p in procs
        if not any((q.pid, q.start) == (p.pid, p.start) for q in left)
    ]
    ended = [*left, *leftovers.end(escaped)]
    if not ended:
        return
    by_test: dict[str, list[leftovers.Proc]] = {}
    for p in ended:
        by_test.setdefault(started.get((p.pid, p.start), ""), []).append(p)
    if not clean:
        out.unowned += [
            p.label() + (f" started by {test}" if test else "")
            for test, procs in by_test.items()
            for p in procs
        ]
        return
    out.unowned += [p.label() for p in by_test.pop("", [])]
    for test, procs in by_test.items():
        note = f"left {len(procs)} process(es) running: {leftovers.describe(procs)} (ended by the harness)"
        own = next((f for f in out.finished if f.id == test), None)
        if own is None:
            out.finished.append(Finished(test, "error", note, "", 0.0))
            continue
        message = note if own.outcome not in res.FAILING else f"{own.message}; {note}"
        out.finished[out.finished.index(own)] = Finished(
            test, "error", message, own.text, own.duration_s, own.crash
        )


def make_watchdog(journal: Path, test_s: float, hung: list[str]) -> Callable[[], str | None]:
    """A process.execute watchdog over a journal: the reason to kill the process once its running test is
    `test_s + watchdog_grace_s(test_s)` old (that test is appended to `hung`), else None. Off for test_s 0."""
    limit = test_s + watchdog_grace_s(test_s)

    def watchdog() -> str | None:
        read = read_journal(journal)
        if test_s and read.running and read.running_since and time.time() - read.running_since > limit:
            hung.append(read.running)
            return f"{read.running} still running after {limit:.0f}s"
        return None

    return watchdog


def _collected_rest(out: SuiteRun, read: JournalRead) -> None:
    """Count what the last attempt collected but nobody decided as not run."""
    out.not_run = [i for i in (read.collected or []) if i not in out.decided and i != out.running]


def watchdog_grace_s(test_s: float) -> float:
    """How long past the per-test timeout the watchdog waits (module docstring)."""
    return min(WATCHDOG_GRACE_S, max(3.0, test_s))


def _culprit(
    read: JournalRead, run: Any, hung: list[str], suite_s: float, test_s: float
) -> tuple[str | None, str]:
    """(the test to blame, why) for an attempt that ended abnormally."""
    if read.poisoned is not None:
        return read.poisoned[0], f"device unusable after this test: {read.poisoned[1]}"
    if hung:
        return (
            hung[0],
            f"hung: still running {watchdog_grace_s(test_s):.0f}s past the test timeout of {test_s:.0f}s "
            "(process killed)",
        )
    if run.timed_out:
        return read.running, f"hung: still running when the suite timeout ({suite_s:.0f}s) passed"
    if run.returncode == EXIT_POISONED:
        return read.running, "device unusable (no test named)"
    return read.running, exit_reason(run.returncode)


def res_error_line(log: Path) -> str:
    """The most telling line of a log: the last one that mentions an error, else the last line."""
    lines = (
        [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if log.exists()
        else []
    )
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1][:500]


# ---- the suite's JUnit, written from the journals ------------------------------------------------------------


def _names(test_id: str) -> tuple[str, str, str]:
    """(classname, name, file) as pytest's xunit1 JUnit would write them for a node id."""
    parts = test_id.split("::")
    file = parts[0]
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
    return ".".join([module, *parts[1:-1]]), parts[-1] if len(parts) > 1 else file, file


def write_junit(path: Path, suite: str, finished: list[Finished]) -> None:
    """The suite's JUnit XML (xunit1, with each test's `kiln_nodeid`; a crash also carries `kiln_crash`)."""
    counts = res.counts([TestOutcome(f.id, Outcome(f.outcome), "", 0.0) for f in finished])
    top = ET.Element("testsuites")
    ts = ET.SubElement(
        top,
        "testsuite",
        name=suite,
        tests=str(len(finished)),
        failures=str(counts["failed"]),
        errors=str(counts["error"]),
        skipped=str(counts["skipped"] + counts["xfailed"]),
        time=f"{sum(f.duration_s for f in finished):.3f}",
    )
    for f in finished:
        classname, name, file = _names(f.id)
        case = ET.SubElement(
            ts, "testcase", classname=classname, name=name, file=file, time=f"{f.duration_s:.3f}"
        )
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="kiln_nodeid", value=f.id)
        if f.crash:
            ET.SubElement(props, "property", name="kiln_crash", value=f.crash)
        if f.outcome in ("failed", "error"):
            el = ET.SubElement(
                case, "failure" if f.outcome == "failed" else "error", message=res.printable(f.message)
            )
            el.text = res.printable(f.text)
        elif f.outcome in ("skipped", "xfailed"):
            ET.SubElement(
                case,
                "skipped",
                message=res.printable(f.message),
                type="pytest.xfail" if f.outcome == "xfailed" else "pytest.skip",
            )
    ET.indent(top)
    res.atomic_write_bytes(path, ET.tostring(top, encoding="utf-8", xml_declaration=True) + b"\n")
