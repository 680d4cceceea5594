"""`nox -s tests` (noxfile.py `tests`): its phases (suites single-threaded, unit tests on pytest-xdist workers), every
phase run even after one fails, and the recap of every phase at the end."""

from __future__ import annotations

import os

import pytest
from noxfile_loader import noxfile


class FakeSession:
    """What `tests` uses of a nox session; `fail` names the phases whose pytest exits 1 (after writing its JUnit)."""

    def __init__(self, fail: set[int]) -> None:
        self.fail, self.calls, self.logged, self.errors = fail, [], [], []
        self._runner = None
        self.posargs: list[str] = []

    def run(self, *args, env=None, external=False):
        from nox.command import CommandFailed

        index = len(self.calls)
        self.calls.append((list(args), env))
        junit = next(a.split("=", 1)[1] for a in args if a.startswith("--junitxml="))
        bad = index in self.fail
        with open(junit, "w", encoding="utf-8") as fh:
            fh.write(
                f'<testsuites><testsuite tests="5" failures="{int(bad)}" errors="{int(bad)}" skipped="1"/>'
                "</testsuites>"
            )
        if bad:
            raise CommandFailed("pytest failed", return_code=1)

    def log(self, line):
        self.logged.append(line)

    def error(self, line):
        self.errors.append(line)
        raise SystemExit(line)


def test_every_phase_runs_after_a_failure_and_the_recap_names_each(monkeypatch):
    nf = noxfile()
    monkeypatch.setenv("KILN_NO_VENV", "1")
    monkeypatch.delenv("KILN_TEST_WORKERS", raising=False)
    session = FakeSession(fail={1})
    with pytest.raises(SystemExit, match="failed phase\\(s\\): suites, caches cold"):
        nf.tests(session)
    names = [name for name, _, _ in nf.test_phases("/x")]
    assert len(session.calls) == len(names) == 5  # the phases after the failed one ran too
    recap = session.logged[session.logged.index("recap of `nox -s tests`:") + 1 :]
    assert [line.split("  ")[0].strip() for line in recap] == [*names, "total"]
    assert "FAILED (exit 1)" in recap[1] and "2 passed, 2 failed, 1 skipped in" in recap[1]
    assert all(" ok " in line and "4 passed, 0 failed, 1 skipped" in line for line in recap[:1] + recap[2:-1])
    assert recap[-1].split()[1] == "FAILED"


def test_suites_stay_single_threaded_and_unit_tests_use_workers(monkeypatch):
    nf = noxfile()
    monkeypatch.delenv("KILN_TEST_WORKERS", raising=False)
    phases = {name: args for name, args, _ in nf.test_phases("/x")}
    for name, args in phases.items():
        if name.startswith("suites"):
            assert args[:2] == ["-p", "no:xdist"], name
    assert phases["compiler unit tests"][:4] == ["-n", "auto", "--dist", "loadfile"]
    # the harness's tests mostly wait on the processes they start: more workers than cores
    per_core = nf.HARNESS_WORKERS_PER_CORE
    assert per_core > 1
    assert phases["harness unit tests"][:4] == ["-n", str(per_core * os.cpu_count()), "--dist", "loadfile"]
    monkeypatch.setenv("KILN_TEST_WORKERS", "3")  # a number given is the number for every unit-test phase
    assert nf.test_workers() == nf.test_workers(per_core) == ["-n", "3", "--dist", "loadfile"]
    monkeypatch.setenv("KILN_TEST_WORKERS", "0")
    assert nf.test_workers() == nf.test_workers(per_core) == ["-p", "no:xdist"]
    monkeypatch.setenv("KILN_TEST_WORKERS", "many")
    with pytest.raises(SystemExit, match="KILN_TEST_WORKERS='many'"):
        nf.test_workers()


def test_a_missing_junit_counts_nothing(tmp_path):
    assert noxfile().junit_counts(str(tmp_path / "none.xml")) == {"passed": 0, "failed": 0, "skipped": 0}


def test_the_cache_phases_run_one_subset_of_every_suite_and_the_warm_one_expects_hits():
    nf = noxfile()
    phases = {name: (args, env) for name, args, env in nf.test_phases("/x")}
    cold, cold_env = phases["suites, caches cold"]
    warm, warm_env = phases["suites, caches warm"]
    assert cold == warm  # the same tests: warm is answered from what cold stored
    assert cold[cold.index("--kiln-shard") + 1] == nf.CACHED_SHARD and "harness.suites.shard_plugin" in cold
    assert [a for a in cold if a.startswith("tests/")] == [f"tests/{s}" for s in nf.SUITES]
    assert cold_env["KILN_CACHE"] == warm_env["KILN_CACHE"] == "1" and cold_env["XDG_CACHE_HOME"] == "/x"
    assert warm_env["KILN_EXPECT_WARM_CACHE"] == "1" and "KILN_EXPECT_WARM_CACHE" not in cold_env
    assert "--kiln-shard" not in phases["suites"][0]  # the uncached phase runs every test
