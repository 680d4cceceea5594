"""Collecting a results folder: its record (run.json as harness.record.RunRecord, schema 1 or 2) and every
suite's JUnit, parsed and classified.

A run is `complete` only when run.json says so; `running` left behind by a killed process and
`incomplete`/`aborted` runs are reported as incomplete, with whatever suites finished.

A merged run (harness.suites.merge: the shards of one run, each a results folder of its own in `shard-I/`) has a
run.json with `shards`; its suites are each suite's tests over every shard that has a run.json, and each
test's repro line comes from the record of the shard that ran it (`record_for`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness import results as res
from harness.exc import ResultsError
from harness.record import RunRecord, SuiteRecord, SuiteStatus, TestOutcome
from harness.settings import settings


@dataclass(frozen=True)
class SuiteResults:
    """One suite of a run: its record (run.json's entry; a merged run's holds its shards') and its tests."""

    name: str
    status: SuiteStatus
    tests: list[TestOutcome]
    record: SuiteRecord


@dataclass(frozen=True)
class RunResults:
    """A whole results folder: its record (run.json) and every suite's tests."""

    path: Path
    record: RunRecord
    suites: list[SuiteResults]
    shard_runs: dict[int, RunResults] = field(default_factory=dict)  # merged runs: shard index -> its run
    test_shards: dict[str, int] = field(default_factory=dict)  # merged runs: test id -> the shard that ran it

    @property
    def complete(self) -> bool:
        return self.record.complete

    @property
    def failing(self) -> list[tuple[str, TestOutcome]]:
        """(suite, test) for every failed or errored test, in suite then file order."""
        return [(s.name, t) for s in self.suites for t in s.tests if t.failing]

    @property
    def broken_suites(self) -> list[SuiteResults]:
        """Suites that did not finish normally (timeout, pytest error) whatever their tests say."""
        return [s for s in self.suites if s.status in (SuiteStatus.TIMEOUT, SuiteStatus.ERROR)]

    @property
    def merged(self) -> bool:
        return self.record.merged

    def record_for(self, test_id: str) -> RunRecord:
        """The record of the run that ran `test_id`: this one, or in a merged run its shard's (the first
        shard's for a test no shard ran)."""
        if not self.shard_runs:
            return self.record
        index = self.test_shards.get(test_id, min(self.shard_runs))
        return self.shard_runs[index].record


SUITE_STATUS_ORDER = ("timeout", "error", "failed", "passed", "empty", "missing")


def merged_status(statuses: list[str]) -> str:
    """One suite's status over its shards: the worst of them (timeout, error, failed, passed, empty, missing)."""
    known = [s for s in statuses if s in SUITE_STATUS_ORDER]
    if not known:
        return statuses[0] if statuses else "missing"
    return min(known, key=SUITE_STATUS_ORDER.index)


def read_record(path: Path | str) -> RunRecord:
    """The record (run.json) of the results folder at `path`, schema 1 or 2."""
    path = Path(path)
    if not path.is_dir():
        if path.exists():
            raise ResultsError(
                f"{path} is a file, not a results folder (give the folder a run wrote, e.g. results/<run>)"
            )
        raise ResultsError(f"results folder {path} does not exist")
    if not (path / "run.json").exists():
        raise ResultsError(f"{path} is not a harness results folder (no run.json)")
    return RunRecord.from_json(res.read_json(path / "run.json"), str(path / "run.json"))


def load_run(path: Path | str) -> RunResults:
    """Parse the results folder at `path`: its record and every suite's JUnit."""
    path = Path(path).resolve()
    record = read_record(path)
    if record.merged:
        return _load_merged(path, record)
    root = Path(record.src or settings().root)
    tests = {}
    for suite in record.suites:
        junit = path / suite.junit if suite.junit else None
        try:
            tests[suite.name] = res.parse_junit(junit, root) if junit is not None and junit.exists() else []
        except ResultsError:
            tests[suite.name] = []
    return from_record(path, record, tests)


def from_record(path: Path, record: RunRecord, tests: Mapping[str, list[TestOutcome]]) -> RunResults:
    """A plain run's results from its record and each suite's tests as already parsed (the runner's, in
    memory: nothing is read back)."""
    suites = [SuiteResults(s.name, s.status, list(tests.get(s.name, [])), s) for s in record.suites]
    return RunResults(Path(path), record, suites)


def _load_merged(path: Path, record: RunRecord) -> RunResults:
    shard_runs: dict[int, RunResults] = {}
    for shard in record.shards or ():
        folder = path / shard.dir
        if shard.dir and (folder / "run.json").exists():
            try:
                shard_runs[shard.index] = load_run(folder)
            except ResultsError:
                continue  # the merged record says what became of the shard
    names: list[str] = []
    parts: dict[str, list[tuple[int, SuiteResults]]] = {}
    test_shards: dict[str, int] = {}
    for index in sorted(shard_runs):
        for suite in shard_runs[index].suites:
            if suite.name not in parts:
                names.append(suite.name)
            parts.setdefault(suite.name, []).append((index, suite))
            for t in suite.tests:
                test_shards.setdefault(t.id, index)
    suites = []
    for name in names:
        status = SuiteStatus(merged_status([s.status for _, s in parts[name]]))
        one = SuiteRecord(
            name,
            status,
            duration_s=round(sum(s.record.duration_s for _, s in parts[name]), 2),
            shards={i: s.record for i, s in parts[name]},
        )
        tests = [t for _, s in parts[name] for t in s.tests]
        suites.append(SuiteResults(name, status, tests, one))
    return RunResults(path, record, suites, shard_runs, test_shards)


def latest_run(results_root: Path | None = None) -> Path:
    """The most recently written run folder under results/."""
    root = results_root or settings().results_root
    runs = sorted(p for p in root.glob("*") if (p / "run.json").exists()) if root.is_dir() else []
    if not runs:
        raise ResultsError(f"no results folders under {root}; run `python -m harness run` first")
    return max(runs, key=lambda p: ((p / "run.json").stat().st_mtime, p.name))
