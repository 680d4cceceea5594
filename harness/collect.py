"""Collecting a results folder: the manifest (run.json) and every suite's JUnit, parsed and classified.

A run is `complete` only when run.json says so; `running` left behind by a killed process and
`incomplete`/`aborted` runs are reported as incomplete, with whatever suites finished.

A merged run (harness.merge: the shards of one run, each a results folder of its own in `shard-I/`) has a
run.json with `shards`; its suites are each suite's tests over every shard that has a run.json, and each
test's repro line comes from the manifest of the shard that ran it (`manifest_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import results as res
from harness.exc import ResultsError
from harness.settings import settings


@dataclass(frozen=True)
class SuiteResults:
    """One suite of a run: its manifest entry and its classified tests."""

    name: str
    status: str
    tests: list[res.TestResult]
    entry: dict[str, Any]


@dataclass(frozen=True)
class RunResults:
    """A whole results folder."""

    path: Path
    manifest: dict[str, Any]
    suites: list[SuiteResults]
    shard_runs: dict[int, RunResults] = field(default_factory=dict)  # merged runs: shard index -> its run
    test_shards: dict[str, int] = field(default_factory=dict)  # merged runs: test id -> the shard that ran it

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    @property
    def failing(self) -> list[tuple[str, res.TestResult]]:
        """(suite, test) for every failed or errored test, in suite then file order."""
        return [(s.name, t) for s in self.suites for t in s.tests if t.failing]

    @property
    def broken_suites(self) -> list[SuiteResults]:
        """Suites that did not finish normally (timeout, pytest error) whatever their tests say."""
        return [s for s in self.suites if s.status in ("timeout", "error")]

    @property
    def merged(self) -> bool:
        return self.manifest.get("shards") is not None

    def manifest_for(self, test_id: str) -> dict[str, Any]:
        """The manifest of the run that ran `test_id`: this one, or in a merged run its shard's (the first
        shard's for a test no shard ran)."""
        if not self.shard_runs:
            return self.manifest
        index = self.test_shards.get(test_id, min(self.shard_runs))
        return self.shard_runs[index].manifest


SUITE_STATUS_ORDER = ("timeout", "error", "failed", "passed", "empty", "missing")


def merged_status(statuses: list[str]) -> str:
    """One suite's status over its shards: the worst of them (timeout, error, failed, passed, empty, missing)."""
    known = [s for s in statuses if s in SUITE_STATUS_ORDER]
    if not known:
        return statuses[0] if statuses else "missing"
    return min(known, key=SUITE_STATUS_ORDER.index)


def load_run(path: Path | str) -> RunResults:
    """Parse the results folder at `path`."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise ResultsError(f"results folder {path} does not exist")
    if not (path / "run.json").exists():
        raise ResultsError(f"{path} is not a harness results folder (no run.json)")
    manifest = res.read_json(path / "run.json")
    if not isinstance(manifest, dict) or "backend" not in manifest:
        raise ResultsError(f"{path / 'run.json'} is not a harness run manifest")
    if manifest.get("shards") is not None:
        return _load_merged(path, manifest)
    root = Path(manifest.get("src") or settings().root)
    suites = []
    for entry in manifest.get("suites", []):
        junit = path / entry["junit"] if entry.get("junit") else None
        try:
            tests = res.parse_junit(junit, root) if junit is not None and junit.exists() else []
        except ResultsError:
            tests = []
        suites.append(SuiteResults(entry["name"], entry.get("status", "error"), tests, entry))
    return RunResults(path, manifest, suites)


def _load_merged(path: Path, manifest: dict[str, Any]) -> RunResults:
    shard_runs: dict[int, RunResults] = {}
    for entry in manifest["shards"]:
        folder = path / entry.get("dir", "")
        if entry.get("dir") and (folder / "run.json").exists():
            try:
                shard_runs[int(entry["index"])] = load_run(folder)
            except ResultsError:
                continue  # the merged manifest says what became of the shard
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
        entries = {str(i): s.entry for i, s in parts[name]}
        entry = {"name": name, "duration_s": round(sum(s.entry.get("duration_s", 0.0) for _, s in parts[name]), 2),
                 "shards": entries}
        status = merged_status([s.status for _, s in parts[name]])
        tests = [t for _, s in parts[name] for t in s.tests]
        suites.append(SuiteResults(name, status, tests, {**entry, "status": status}))
    return RunResults(path, manifest, suites, shard_runs, test_shards)


def latest_run(results_root: Path | None = None) -> Path:
    """The most recently written run folder under results/."""
    root = results_root or settings().results_root
    runs = sorted(p for p in root.glob("*") if (p / "run.json").exists()) if root.is_dir() else []
    if not runs:
        raise ResultsError(f"no results folders under {root}; run `python -m harness run` first")
    return max(runs, key=lambda p: ((p / "run.json").stat().st_mtime, p.name))
