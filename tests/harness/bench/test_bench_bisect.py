"""`bench bisect` (harness/bench/kernels/bisect.py): the search, the driver with a fake measure function, bad input,
and (CPU, under a minute) a real bisection of a scratch repository with a planted slowdown in one workload's
code on one commit between good ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
from bench_helpers import samples

from harness.bench import cli
from harness.bench.judge.compare import CompareConfig
from harness.bench.kernels.bisect import (
    BisectError,
    Commit,
    Measured,
    commit_range,
    resolve,
    run_bisect,
    search,
)

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = "softmax.fwd.fp32.64x128"
CFG = CompareConfig().for_device("cpu")  # threshold 10%, alpha 0.01, drift normalized
GIT_ENV = {
    "GIT_AUTHOR_NAME": "bisect test",
    "GIT_AUTHOR_EMAIL": "bisect@test.invalid",
    "GIT_COMMITTER_NAME": "bisect test",
    "GIT_COMMITTER_EMAIL": "bisect@test.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


# ------------------------------------------------------------------ search
def _classify(first_bad: int, skip: set[int] = frozenset(), asked: list[int] | None = None):
    def classify(i: int) -> str:
        if asked is not None:
            asked.append(i)
        return "skip" if i in skip else ("bad" if i >= first_bad else "good")

    return classify


@pytest.mark.parametrize("n", [1, 2, 3, 8, 17])
def test_bisect_search_finds_every_first_bad(n: int) -> None:
    for first in range(n):
        asked: list[int] = []
        res = search(n, _classify(first, asked=asked))
        assert res.first_bad == first and res.candidates == [first]
        assert len(asked) == len(set(asked)) and n - 1 not in asked  # each once; BAD is known bad
        assert len(asked) <= max(1, (n - 1).bit_length())


def test_bisect_search_skips() -> None:
    res = search(8, _classify(5, skip={3}))  # a skipped commit away from the boundary does not matter
    assert res.first_bad == 5 and res.candidates == [5]
    res = search(8, _classify(4, skip={3}))  # skipped right before the first bad: either may be it
    assert res.first_bad is None and res.candidates == [3, 4]
    res = search(6, _classify(5, skip={0, 1, 2, 3, 4}))
    assert res.first_bad is None and res.candidates == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------------ driver with a fake measure function
def _commits(n: int) -> tuple[Commit, list[Commit]]:
    good = Commit("0" * 40, "good base")
    return good, [Commit(f"{i + 1:02x}" + "c" * 38, f"commit {i + 1}") for i in range(n)]


class FakeMeasure:
    """Samples around 1 ms (eager 10 us) for each commit, `slow` times that from `first_slow` on; `broken`
    commits fail; `flaky_bad` is slow only on its first measurement; the calls numbered in `spoil` (from 1)
    are 2x slower under kiln only (a burst of load that eager's short calls do not see); every call gets a
    new seed."""

    def __init__(
        self,
        commits: list[Commit],
        first_slow: int | None,
        slow: float = 1.3,
        broken: set[int] = frozenset(),
        flaky_bad: bool = False,
        machine: float = 1.0,
        spoil: set[int] = frozenset(),
    ):
        self.index = {c.sha: i for i, c in enumerate(commits)}
        self.first_slow, self.slow, self.broken, self.flaky_bad, self.machine, self.spoil = (
            first_slow,
            slow,
            broken,
            flaky_bad,
            machine,
            spoil,
        )
        self.calls: list[str] = []

    def __call__(self, c: Commit) -> Measured:
        self.calls.append(c.sha)
        i = self.index.get(c.sha, -1)
        seed = len(self.calls)
        if i in self.broken:
            return Measured(c, error="bench run exited 1: ImportError: boom")
        factor = self.slow if self.first_slow is not None and i >= self.first_slow else 1.0
        if self.flaky_bad and i == len(self.index) - 1 and self.calls.count(c.sha) > 1:
            factor = 1.0
        m = 1.0 if i < 0 else self.machine  # the machine as a whole slower after GOOD's first measurement
        factor *= 2.0 if seed in self.spoil else 1.0
        return Measured(
            c, samples(1e6 * factor * m, n=60, seed=seed), samples(1e4 * m, n=60, seed=seed + 999), "hash"
        )


def _run(commits, measure, good, compiler: str = "kiln"):
    return run_bisect(
        good, commits, measure, CFG, workload=WORKLOAD, compiler=compiler, device="cpu", log=lambda m: None
    )


def test_bisect_fake_first_bad_found() -> None:
    good, commits = _commits(9)
    fake = FakeMeasure(commits, first_slow=5)
    rep = _run(commits, fake, good)
    assert rep.outcome == "first-bad" and rep.first_bad == commits[5] and rep.exit_code == 0
    j = rep.first_bad_judgement
    assert j is not None and j.verdict == "regressed" and 1.2 < j.ratio < 1.4 and j.p < CFG.alpha
    assert rep.decisions[commits[5].sha] == "bad" and rep.decisions[commits[4].sha] == "good"
    assert fake.calls[:4] == [good.sha, commits[-1].sha, good.sha, commits[-1].sha]  # range confirmed first
    assert len(fake.calls) <= 4 + 3 * 4  # halving, not a linear scan
    d = json.loads(json.dumps(rep.as_dict()))
    assert (
        d["outcome"] == "first-bad" and d["first_bad"]["sha"] == commits[5].sha and d["first_bad"]["p"] < 0.01
    )
    assert d["range"]["confirmed"]["verdict"] == "regressed" and d["steps"][0]["role"] == "GOOD"
    md = rep.markdown()
    assert commits[5].short in md and "first bad commit" in md and "| GOOD again |" in md


def test_bisect_fake_noise_range_is_not_bisected() -> None:
    good, commits = _commits(6)
    fake = FakeMeasure(commits, first_slow=None)
    rep = _run(commits, fake, good)
    assert rep.outcome == "noise" and rep.first_bad is None and rep.exit_code == 0
    assert "range is noise" in rep.message and len(fake.calls) == 2


def test_bisect_fake_unconfirmed_range_is_noise() -> None:
    good, commits = _commits(6)
    fake = FakeMeasure(commits, first_slow=len(commits) - 1, flaky_bad=True)
    rep = _run(commits, fake, good)
    assert rep.outcome == "noise" and "two of three" in rep.message and len(fake.calls) == 6


@pytest.mark.parametrize("spoil", [{1}, {3}, {5}, {4, 9}])
def test_bisect_fake_one_spoiled_measurement_is_outvoted(spoil: set[int]) -> None:
    """1: GOOD's first measurement (BAD looks faster; the reference must not be that one); 3: GOOD measured
    again in the range's confirm step; 5: the first probe (commit 3, good); 4 and 9: BAD again and a later
    probe."""
    good, commits = _commits(9)
    rep = _run(commits, FakeMeasure(commits, first_slow=5, spoil=spoil), good)
    assert rep.outcome == "first-bad" and rep.first_bad == commits[5], rep.markdown()


class UnluckyRuns(FakeMeasure):
    """`FakeMeasure` whose every measurement of the commits at `unlucky` is `load` times slower, eager's too:
    on a shared 2-core machine each run's process lands on a busy or an idle core (a CI run once measured a
    good commit 1.5x slower twice in a row, with GOOD normal in between, and named it)."""

    def __init__(self, commits: list[Commit], first_slow: int, slow: float, unlucky: set[int], load: float):
        super().__init__(commits, first_slow, slow)
        self.unlucky, self.load = unlucky, load

    def __call__(self, c: Commit) -> Measured:
        m = super().__call__(c)
        if self.index.get(c.sha, -1) not in self.unlucky:
            return m
        return Measured(
            c, [x * self.load for x in m.samples], [x * self.load for x in m.eager], m.source_hash
        )


@pytest.mark.parametrize("compiler", ["eager", "kiln"])
def test_bisect_a_good_commit_measured_slower_stays_on_goods_side_of_the_step(compiler: str) -> None:
    """A 100x step at commit 1; commit 0 is measured 1.5x slower every time (eager too, so kiln's clock does
    not divide it out either): regressed against GOOD, but far nearer GOOD's level than BAD's."""
    good, commits = _commits(4)
    fake = UnluckyRuns(commits, first_slow=1, slow=100.0, unlucky={0}, load=1.5)
    rep = _run(commits, fake, good, compiler=compiler)
    assert rep.outcome == "first-bad" and rep.first_bad == commits[1], rep.markdown()
    assert rep.decisions[commits[0].sha] == "good"
    if compiler == "eager":  # regressed against GOOD, so judged by a vote (kiln's eager clock divides it out)
        assert fake.calls.count(commits[0].sha) >= 2


def test_bisect_fake_machine_drift_divided_out() -> None:
    good, commits = _commits(4)
    fake = FakeMeasure(commits, first_slow=None, machine=1.4)  # kiln and eager both 1.4x: the machine
    assert _run(commits, fake, good).outcome == "noise"
    fake = FakeMeasure(commits, first_slow=None, machine=1.4)
    assert _run(commits, fake, good, compiler="eager").outcome == "first-bad"  # eager has no clock


def test_bisect_fake_skipped_commits_reported() -> None:
    good, commits = _commits(9)
    rep = _run(commits, FakeMeasure(commits, first_slow=6, broken={3}), good)
    assert rep.outcome == "first-bad" and rep.first_bad == commits[6]
    assert commits[3].sha in rep.skipped and "ImportError" in rep.skipped[commits[3].sha]
    assert rep.decisions[commits[3].sha] == "skipped"
    assert any(s.verdict == "error" for s in rep.steps)

    rep = _run(commits, FakeMeasure(commits, first_slow=4, broken={3}), good)
    assert rep.outcome == "inconclusive" and rep.exit_code == 1
    assert rep.candidates == [commits[3], commits[4]] and "inconclusive" in rep.message


def test_bisect_fake_good_unmeasurable() -> None:
    good, commits = _commits(3)
    fake = FakeMeasure(commits, first_slow=1)
    with pytest.raises(BisectError, match="GOOD"):
        _run(commits, lambda c: Measured(c, error="boom") if c == good else fake(c), good)


# ------------------------------------------------------------------ git and bad input
def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        check=True,
    )
    return r.stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A", ".")
    _git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def tiny_repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "tiny"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for i in range(4):
        (repo / "f.txt").write_text(f"{i}\n")
        _commit(repo, f"c{i}")
    return repo


def test_bisect_range_and_revisions(tiny_repo: Path) -> None:
    good, bad = resolve(tiny_repo, "HEAD~3"), resolve(tiny_repo, "main")
    assert good.subject == "c0" and bad.subject == "c3"
    assert [c.subject for c in commit_range(tiny_repo, good, bad)] == ["c1", "c2", "c3"]


@pytest.mark.parametrize(
    "good,bad,only,message",
    [
        ("nope", "HEAD", WORKLOAD, "unknown revision 'nope'"),
        ("HEAD", "HEAD~2", WORKLOAD, "is not an ancestor of BAD"),
        ("HEAD", "HEAD", WORKLOAD, "same commit"),
        ("HEAD~2", "HEAD", "no_such_workload", "no tiny workload matches"),
        ("HEAD~2", "HEAD", "softmax*", "matches 3 workloads"),
    ],
)
def test_bisect_bad_input_is_one_line(
    tiny_repo: Path, capsys, good: str, bad: str, only: str, message: str
) -> None:
    rc = cli.main(["bisect", good, bad, "--only", only, "--repo", str(tiny_repo), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert _git(tiny_repo, "worktree", "list").count("\n") == 0  # no worktree was made


# ------------------------------------------------------------------ a real bisection (CPU, under a minute)
PLANT_ANCHOR = "def softmax(x: torch.Tensor) -> torch.Tensor:\n"  # the function WORKLOAD runs


def _scratch_copy(dest: Path) -> None:
    """The committed compiler and harness (git archive of HEAD), or the files as they are without git."""
    paths = ["compiler", "harness", "ci", "pyproject.toml"]
    r = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD", *paths], capture_output=True
    )
    dest.mkdir()
    if r.returncode == 0:
        with tarfile.open(fileobj=BytesIO(r.stdout)) as tar:
            tar.extractall(dest, filter="data") if sys.version_info >= (3, 12) else tar.extractall(dest)
        return
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for p in paths:
        src = ROOT / p
        shutil.copytree(src, dest / p, ignore=ignore) if src.is_dir() else shutil.copy2(src, dest / p)


@pytest.mark.slow
def test_bisect_planted_slowdown_named(tmp_path: Path, capsys) -> None:
    """base -> good -> planted 1 ms sleep in softmax() -> good -> good (BAD): the planted commit is named.
    Eager runs the workload's function itself: its 5 us calls are barely touched by other load on a shared
    2-core machine, where kiln's interpreted milliseconds vary several-fold (the fake tests cover the clock)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    _scratch_copy(repo)
    _git(repo, "init", "-q", "-b", "main")
    base = _commit(repo, "base")
    notes = repo / "NOTES.txt"
    notes.write_text("one\n")
    _commit(repo, "good: a note")
    src = repo / "harness" / "bench" / "kernels" / "workloads.py"
    text = src.read_text()
    assert text.count(PLANT_ANCHOR) == 1, "the planted slowdown's anchor moved: update PLANT_ANCHOR"
    src.write_text(
        text.replace(PLANT_ANCHOR, PLANT_ANCHOR + '    __import__("time").sleep(0.001)  # planted\n')
    )
    planted = _commit(repo, "planted: softmax sleeps")
    for word in ("two", "three"):
        notes.write_text(notes.read_text() + word + "\n")
        _commit(repo, f"good: note {word}")
    out_json, out_md = tmp_path / "bisect.json", tmp_path / "bisect.md"
    rc = cli.main(
        [
            "bisect",
            base,
            "HEAD",
            "--only",
            WORKLOAD,
            "--compiler",
            "eager",
            "--repo",
            str(repo),
            "--device",
            "cpu",
            "--json",
            str(out_json),
            "--md",
            str(out_md),
        ]
    )
    out = capsys.readouterr().out
    d = json.loads(out_json.read_text())
    assert rc == 0, out
    assert d["outcome"] == "first-bad" and d["first_bad"]["sha"] == planted, out
    assert d["first_bad"]["ratio"] > 10 and d["first_bad"]["p"] < 0.01
    assert f"first bad commit: {planted[:10]} planted" in out
    assert "workload definition differs" in out  # the source hash changed with the function; noted
    assert planted[:10] in out_md.read_text()
    assert _git(repo, "worktree", "list").count("\n") == 0  # the scratch worktree is gone
