"""Collecting a results folder: the manifest (run.json) and every suite's JUnit, parsed and classified.

A run is `complete` only when run.json says so; `running` left behind by a killed process and
`incomplete`/`aborted` runs are reported as incomplete, with whatever suites finished.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def latest_run(results_root: Path | None = None) -> Path:
    """The most recently written run folder under results/."""
    root = results_root or settings().results_root
    runs = sorted(p for p in root.glob("*") if (p / "run.json").exists()) if root.is_dir() else []
    if not runs:
        raise ResultsError(f"no results folders under {root}; run `python -m harness run` first")
    return max(runs, key=lambda p: ((p / "run.json").stat().st_mtime, p.name))
