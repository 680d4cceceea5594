"""The quarantine: known-flaky tests that still run and are reported, but whose failures do not fail the
build.

Terms:
  quarantine file   `ci/quarantine.toml`: an array of `[[test]]` tables, each with
                      id       (required) a pytest node id relative to the repo root, e.g.
                               "tests/numerics/test_softmax.py::test_bf16[32768]". An id without a
                               `[...]` suffix also covers every parametrization of that test.
                      reason   (required) why it is quarantined (a person reads this in every report)
                      backends (optional) the backends it is quarantined on, e.g. ["rocm"]; default all
                      issue    (optional) a link or tracker reference
  outcomes          test id -> list of per-run outcomes ("passed", "failed", "error", "skipped", "xfailed");
                    a normal suite run gives one outcome per test, a flake run N.
  verdict           what the quarantine makes of outcomes: the failures that block the build, the
                    quarantined failures that do not, and the quarantined tests ready to leave quarantine
                    (they passed every run).

The runner calls `load(path)` once, records the entries in force into run.json (`to_json`: the file's path and
its entries, so a later report judges the run by them, `from_json`), then `apply(outcomes, quarantine, backend)`
on a run's results; the verdict's `ok` decides the build, `markdown()` goes into the report. Only a flake run
(harness.suites.flakes: N repetitions of each test) may call a quarantined test ready to leave; a normal run's report
lists the quarantined tests that passed without that advice (`markdown(leave_advice=False)`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.exc import QuarantineError

FAILED_OUTCOMES = ("failed", "error")
PASSED_OUTCOMES = ("passed", "xfailed")
KNOWN_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")
_ENTRY_KEYS = ("id", "reason", "backends", "issue")
_PARAMS = re.compile(r"\[[^\]]*\]$")


def _backends() -> list[str]:
    """The backend names of the matrix (ci/matrix.json, or KILN_MATRIX)."""
    from harness import matrix

    return list(matrix.load().backends)


@dataclass(frozen=True)
class Entry:
    """One quarantined test."""

    id: str
    reason: str
    backends: tuple[str, ...] = ()
    issue: str = ""

    def applies_to(self, backend: str | None) -> bool:
        return backend is None or not self.backends or backend in self.backends

    def covers(self, test_id: str) -> bool:
        """True when `test_id` is this entry's id, or one parametrization of it."""
        return test_id == self.id or (not _PARAMS.search(self.id) and _PARAMS.sub("", test_id) == self.id)


@dataclass(frozen=True)
class Quarantine:
    """The parsed quarantine file (entries in file order)."""

    entries: tuple[Entry, ...] = ()
    path: str = ""

    def to_json(self) -> dict:
        """The quarantine as plain JSON for run.json: {"file": path or None, "entries": [{id, reason, backends,
        issue}, ...]} (an empty quarantine or no file: no entries)."""
        return {
            "file": self.path or None,
            "entries": [
                {"id": e.id, "reason": e.reason, "backends": list(e.backends), "issue": e.issue}
                for e in self.entries
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping, source: str = "run.json") -> Quarantine:
        """The quarantine `to_json` recorded, as it was (not checked against today's matrix); a malformed record
        raises QuarantineError naming `source`."""
        entries = data.get("entries") if isinstance(data, Mapping) else None
        if not isinstance(entries, list):
            raise QuarantineError(f'{source}: \'quarantine\' must be {{"file": ..., "entries": [...]}}')
        try:
            parsed = tuple(
                Entry(
                    str(e["id"]),
                    str(e.get("reason", "")),
                    tuple(e.get("backends") or ()),
                    str(e.get("issue", "")),
                )
                for e in entries
            )
        except (KeyError, TypeError) as e:
            raise QuarantineError(f"{source}: malformed quarantine entry ({e})") from None
        return cls(parsed, str(data.get("file") or ""))

    def match(self, test_id: str, backend: str | None = None) -> Entry | None:
        """The entry that quarantines `test_id` on `backend`, or None."""
        for entry in self.entries:
            if entry.applies_to(backend) and entry.covers(test_id):
                return entry
        return None


def _read_toml(path: Path) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as e:
            raise QuarantineError(
                "reading the quarantine file needs Python >= 3.11 or `pip install tomli`"
            ) from e
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise QuarantineError(f"{path}: quarantine file not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise QuarantineError(f"{path}: cannot read quarantine file: {e}") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise QuarantineError(f"{path}: not valid TOML: {e}") from e


def parse(data: Mapping, source: str = "<quarantine>") -> Quarantine:
    """Validate the decoded file; every problem raises one `QuarantineError` naming the entry."""
    unknown = sorted(k for k in data if k != "test")
    if unknown:
        raise QuarantineError(f"{source}: unknown top-level key(s) {unknown}; expected only [[test]] tables")
    raw = data.get("test", [])
    if not isinstance(raw, list):
        raise QuarantineError(f"{source}: 'test' must be an array of tables written as [[test]]")
    entries: list[Entry] = []
    first_seen: dict[str, int] = {}
    for n, item in enumerate(raw, start=1):
        where = f"{source}: [[test]] #{n}"
        if not isinstance(item, dict):
            raise QuarantineError(f"{where}: must be a table with 'id' and 'reason'")
        test_id = item.get("id")
        if not isinstance(test_id, str) or not test_id.strip():
            raise QuarantineError(
                f"{where}: missing 'id' (a pytest node id such as 'tests/x/test_y.py::test_z')"
            )
        test_id = test_id.strip()
        where = f"{where} (id {test_id!r})"
        if "::" not in test_id:
            raise QuarantineError(f"{where}: 'id' must be a pytest node id 'path.py::test_name'")
        bad_keys = sorted(k for k in item if k not in _ENTRY_KEYS)
        if bad_keys:
            raise QuarantineError(f"{where}: unknown key(s) {bad_keys}; allowed: {list(_ENTRY_KEYS)}")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise QuarantineError(f"{where}: missing 'reason' (say why the test is quarantined)")
        backends = item.get("backends", [])
        if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
            raise QuarantineError(f"{where}: 'backends' must be a list of names such as [\"rocm\"]")
        known = _backends()
        unknown_backends = [b for b in backends if b not in known]
        if unknown_backends:
            raise QuarantineError(f"{where}: unknown backend(s) {unknown_backends}; known: {known}")
        issue = item.get("issue", "")
        if not isinstance(issue, str):
            raise QuarantineError(f"{where}: 'issue' must be a string")
        if test_id in first_seen:
            raise QuarantineError(
                f"{source}: duplicate id {test_id!r} in [[test]] #{first_seen[test_id]} and #{n}"
            )
        first_seen[test_id] = n
        entries.append(Entry(test_id, reason.strip(), tuple(backends), issue.strip()))
    return Quarantine(tuple(entries), source)


def load(path: str | Path) -> Quarantine:
    """Read and validate a quarantine file (.toml). A missing file is an error; an empty one is valid."""
    p = Path(path)
    if p.suffix != ".toml":
        raise QuarantineError(f"{p}: the quarantine file must be a .toml file")
    return parse(_read_toml(p), str(p))


def default_path(root: str | Path) -> Path:
    """Where the project keeps its quarantine file."""
    return Path(root) / "ci" / "quarantine.toml"


@dataclass(frozen=True)
class QuarantinedResult:
    """A quarantined test that ran: how often it failed, and the entry that covers it."""

    id: str
    failures: int
    runs: int
    entry: Entry


@dataclass
class Verdict:
    """What the quarantine makes of a run's outcomes (all lists sorted by test id)."""

    backend: str | None
    failing: list[str] = field(default_factory=list)  # not quarantined, failed at least once: blocks
    quarantined_failing: list[QuarantinedResult] = field(default_factory=list)  # reported, not blocking
    ready_to_leave: list[QuarantinedResult] = field(default_factory=list)  # quarantined, passed every run
    not_run: list[Entry] = field(default_factory=list)  # quarantine entries that matched no test

    @property
    def ok(self) -> bool:
        """True when nothing outside the quarantine failed."""
        return not self.failing

    def to_dict(self) -> dict:
        def qr(r: QuarantinedResult) -> dict:
            return {
                "id": r.id,
                "failures": r.failures,
                "runs": r.runs,
                "reason": r.entry.reason,
                "issue": r.entry.issue,
            }

        return {
            "backend": self.backend,
            "ok": self.ok,
            "failing": list(self.failing),
            "quarantined_failing": [qr(r) for r in self.quarantined_failing],
            "ready_to_leave": [qr(r) for r in self.ready_to_leave],
            "not_run": [e.id for e in self.not_run],
        }

    def markdown(self, leave_advice: bool = True) -> str:
        """A short Markdown section for the report (empty string when the quarantine played no part).
        `leave_advice`: call the quarantined tests that passed every run ready to leave (a flake run of N
        repetitions); False for a normal run, where one pass says little about a flake."""
        lines: list[str] = []
        if self.quarantined_failing:
            lines += ["", "**Quarantined failures (do not fail the build):**", ""]
            lines += [
                f"- `{r.id}`: failed {r.failures}/{r.runs}; {r.entry.reason}"
                for r in self.quarantined_failing
            ]
        if self.ready_to_leave and not leave_advice:
            lines += [
                "",
                (
                    "**Quarantined tests that passed in this run** (only `harness flakes` with N runs says "
                    "whether they may leave the quarantine):"
                ),
                "",
            ]
            lines += [f"- `{r.id}`: passed {r.runs}/{r.runs}" for r in self.ready_to_leave]
        elif self.ready_to_leave:
            lines += ["", "**Ready to leave quarantine (passed every run):**", ""]
            lines += [
                f"- `{r.id}`: passed {r.runs}/{r.runs}; remove it from ci/quarantine.toml"
                for r in self.ready_to_leave
            ]
        if self.not_run:
            lines += ["", "**Quarantine entries that matched no test run:**", ""]
            lines += [f"- `{e.id}`" for e in self.not_run]
        if not lines:
            return ""
        return "\n".join(["### Quarantine", *lines]) + "\n"


def _as_runs(value: str | Sequence[str]) -> list[str]:
    runs = [value] if isinstance(value, str) else list(value)
    for outcome in runs:
        if outcome not in KNOWN_OUTCOMES:
            raise QuarantineError(f"unknown test outcome {outcome!r}; known: {list(KNOWN_OUTCOMES)}")
    return runs


def apply(
    outcomes: Mapping[str, str | Sequence[str]], quarantine: Quarantine, backend: str | None = None
) -> Verdict:
    """Split a run's outcomes into blocking failures, quarantined failures and tests ready to leave.

    `outcomes` maps a test id to one outcome or a list of per-run outcomes; `backend` selects the
    entries whose `backends` include it (None: all entries).
    """
    verdict = Verdict(backend)
    matched: set[str] = set()
    for test_id in sorted(outcomes):
        runs = _as_runs(outcomes[test_id])
        failures = sum(o in FAILED_OUTCOMES for o in runs)
        passes = sum(o in PASSED_OUTCOMES for o in runs)
        entry = quarantine.match(test_id, backend)
        if entry is None:
            if failures:
                verdict.failing.append(test_id)
            continue
        matched.add(entry.id)
        counted = failures + passes
        if failures:
            verdict.quarantined_failing.append(QuarantinedResult(test_id, failures, counted, entry))
        elif passes:
            verdict.ready_to_leave.append(QuarantinedResult(test_id, 0, counted, entry))
    verdict.not_run = [e for e in quarantine.entries if e.applies_to(backend) and e.id not in matched]
    return verdict


class HasOutcome(Protocol):
    """A result record with a test id and its outcome (e.g. harness.record.TestOutcome)."""

    @property
    def id(self) -> str: ...

    @property
    def outcome(self) -> str: ...


def outcomes_of(tests: Iterable[HasOutcome]) -> dict[str, list[str]]:
    """test id -> outcomes from result records with `.id` and `.outcome` (e.g. harness.record.TestOutcome);
    a test listed twice (same id in two suites or runs) keeps both outcomes."""
    result: dict[str, list[str]] = {}
    for t in tests:
        result.setdefault(t.id, []).append(t.outcome)
    return result


def failing_ids(outcomes: Mapping[str, str | Sequence[str]]) -> Iterable[str]:
    """The ids that failed at least once (sorted), before the quarantine is applied."""
    return [t for t in sorted(outcomes) if any(o in FAILED_OUTCOMES for o in _as_runs(outcomes[t]))]
