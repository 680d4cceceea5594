"""Bisection of a benchmark regression: `python -m harness bench bisect GOOD BAD --only WORKLOAD`.

Which commit of GOOD..BAD made one workload slower under one compiler (default kiln)?

- The range is checked out commit by commit in one scratch worktree (`git worktree add` in a temporary
  folder, removed at the end, Ctrl-C and SIGTERM included); nothing in the caller's checkout is touched.
- Each measurement is a fresh `python -m harness bench run` of that commit's own code (the worktree first on
  PYTHONPATH) into a scratch store; the compiler's and eager's samples are read back from it. A commit whose
  run fails (no such flag, import error, error result, timeout) is skipped and reported. With `--backend B`
  (the CI bench jobs: harness/bench/job.py) each run is in B's container as `bench backend` runs it (B's image,
  built from the caller's checkout; the worktree mounted as the source), or natively with `--native`.
- Statistics are `bench compare`'s (`compare.judge`: ratio of medians and a one-sided Mann-Whitney test at
  `alpha`, regressed above 1 + threshold); for a compiler other than eager, eager on the same workload,
  measured in the same process, is the local clock divided out (`--drift off` keeps raw ratios).
- GOOD is measured first, then BAD. If BAD is not regressed against GOOD, or the verdict does not hold in
  the confirm step, the range is noise and nothing is bisected. Otherwise the reference is the GOOD measured
  in the confirm step's last pair that found BAD regressed, and the first-parent commits in between are
  searched by halving. The confirm step is two of three: a commit whose ratio is regressed (or above
  1 + threshold/2, or nearer BAD's ratio than 1 on a log scale) is measured again right after a fresh GOOD,
  in pairs, until two verdicts agree (a burst of load on a shared machine spoils one measurement, rarely
  two); bad when two say regressed, else good. BAD faster than GOOD at first is confirmed the same way.
  A probe's vote says bad only when it is regressed at a ratio nearer BAD's than 1 (log scale): a bisection
  asks on which side of GOOD..BAD's step a commit lies, and a good commit measured 1.5x slower than GOOD
  under a load that set in after GOOD was measured (eager has no same-process clock) is not on BAD's side
  of a 100x step. Of two regressions in one range, the one that makes most of BAD's ratio is named.
- The verdict names the first bad commit with its confirmed ratio against GOOD and the p-value; skips that
  leave several commits possible make the verdict inconclusive, listing them.

Exit codes: 0 a commit is named or the range is noise; 1 inconclusive or GOOD/BAD could not be measured;
2 bad input (unknown revision, GOOD not an ancestor of BAD, unknown workload); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.bench.core.records import Verdict
from harness.bench.core.stats import Stats
from harness.bench.judge.compare import CompareConfig, judge
from harness.bench.reports.report import fmt_ns
from harness.exc import BenchError, UsageError
from harness.git import git
from harness.process import sigterm_interrupts

EAGER = "eager"


class BisectError(BenchError):
    """The bisection could not decide: GOOD or BAD could not be measured."""

    exit_code = 1


# ------------------------------------------------------------------ records
@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str = ""

    @property
    def short(self) -> str:
        return self.sha[:10]

    def label(self) -> str:
        return f"{self.short} {self.subject}".strip()


@dataclass
class Measured:
    """One measurement of one commit: the compiler's and eager's samples (ns), or the error that stopped it."""

    commit: Commit
    samples: list[float] = field(default_factory=list)
    eager: list[float] = field(default_factory=list)
    source_hash: str = ""
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.samples)

    @property
    def median(self) -> float | None:
        return Stats.of(self.samples).median if self.samples else None


@dataclass
class Judgement:
    """A commit's measurement against the reference's: `ratio` has the eager clock (`clock`) divided out."""

    verdict: Verdict  # regressed / improved / unchanged
    ratio: float
    p: float
    raw_ratio: float
    clock: float | None = None

    def text(self) -> str:
        clock = f", eager clock {self.clock:.3f}" if self.clock is not None else ""
        return f"ratio {self.ratio:.3f} (p={self.p:.2g}, confidence {confidence(self.p)}{clock})"


def confidence(p: float) -> str:
    """1 - p as a percentage (">99.99%" below p = 1e-4)."""
    return ">99.99%" if p < 1e-4 else f"{100 * (1 - p):.2f}%"


@dataclass
class Step:
    """One measurement in the log of the bisection."""

    n: int
    sha: str
    subject: str
    role: str  # GOOD, BAD, GOOD again, BAD again, probe, probe again
    median_ns: float | None
    verdict: str  # reference, regressed, improved, unchanged, error
    ratio: float | None = None
    p: float | None = None
    seconds: float = 0.0
    note: str = ""


@dataclass
class SearchResult:
    """`first_bad`: index of the first bad commit, or None when skipped commits leave several `candidates`."""

    first_bad: int | None
    candidates: list[int]
    decided: dict[int, str]


@dataclass
class BisectReport:
    """Everything the bisection found (see the module docstring); `outcome` is first-bad, noise or inconclusive."""

    workload: str
    compiler: str
    device: str
    good: Commit
    bad: Commit
    commits: list[Commit]
    outcome: str = "inconclusive"
    message: str = ""
    range_first: Judgement | None = None
    range_confirmed: Judgement | None = None
    first_bad: Commit | None = None
    first_bad_judgement: Judgement | None = None
    candidates: list[Commit] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)  # sha -> good / bad / skipped
    skipped: dict[str, str] = field(default_factory=dict)  # sha -> why
    steps: list[Step] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome in ("first-bad", "noise") else 1

    def as_dict(self) -> dict[str, Any]:
        def jd(j: Judgement | None) -> dict | None:
            return asdict(j) if j else None

        fb = self.first_bad
        return {
            "workload": self.workload,
            "compiler": self.compiler,
            "device": self.device,
            "good": asdict(self.good),
            "bad": asdict(self.bad),
            "outcome": self.outcome,
            "message": self.message,
            "range": {"first": jd(self.range_first), "confirmed": jd(self.range_confirmed)},
            "first_bad": {**asdict(fb), **(jd(self.first_bad_judgement) or {})} if fb else None,
            "candidates": [asdict(c) for c in self.candidates],
            "commits": [
                {**asdict(c), "decision": self.decisions.get(c.sha, "not measured")} for c in self.commits
            ],
            "skipped": [{"sha": s, "why": w} for s, w in self.skipped.items()],
            "steps": [asdict(s) for s in self.steps],
        }

    def step_rows(self) -> list[list[str]]:
        rows = [["#", "commit", "role", "median", "ratio", "p", "verdict", "s", "note"]]
        for s in self.steps:
            rows.append(
                [
                    str(s.n),
                    f"{s.sha[:10]} {s.subject[:40]}",
                    s.role,
                    fmt_ns(s.median_ns),
                    "-" if s.ratio is None else f"{s.ratio:.3f}",
                    "-" if s.p is None else f"{s.p:.2g}",
                    s.verdict,
                    f"{s.seconds:.0f}",
                    s.note,
                ]
            )
        return rows

    def markdown(self) -> str:
        from harness.bench.reports.report import markdown as md_table

        head = f"## kiln bench bisect: `{self.workload}` under {self.compiler} ({self.device})"
        lines = [
            head,
            "",
            f"**{self.message}**",
            "",
            f"- range: GOOD `{self.good.label()}` .. BAD `{self.bad.label()}`, {len(self.commits)} commit(s)",
        ]
        for what, j in (
            ("BAD vs GOOD", self.range_first),
            ("BAD vs GOOD, measured again", self.range_confirmed),
        ):
            if j:
                lines.append(f"- {what}: {j.verdict}, {j.text()}")
        if self.skipped:
            lines.append(
                "- skipped (could not be measured): "
                + "; ".join(f"`{s[:10]}` {w}" for s, w in self.skipped.items())
            )
        lines += ["", md_table(self.step_rows()), ""]
        return "\n".join(lines)


# ------------------------------------------------------------------ statistics and search
def compare_measured(new: Measured, ref: Measured, cfg: CompareConfig, use_clock: bool) -> Judgement:
    """`new` against `ref` with `compare.judge`, eager's ratio divided out when `use_clock` and both have it."""
    clock = None
    if use_clock and new.eager and ref.eager:
        clock = Stats.of(new.eager).median / Stats.of(ref.eager).median
    verdict, ratio, p = judge(new.samples, ref.samples, cfg, clock or 1.0)
    raw = Stats.of(new.samples).median / Stats.of(ref.samples).median
    return Judgement(verdict, ratio, p, raw, clock)


def search(n: int, classify: Callable[[int], str]) -> SearchResult:
    """Halve indices 0..n-1 of a range whose last is known bad (and whose predecessor, -1, is good).

    `classify(i)` returns good, bad or skip; each index is asked at most once, the untested one nearest
    the middle of the open interval first. When only skipped indices are left between the last good and
    the first bad, `first_bad` is None and `candidates` lists them with that bad one."""
    if n < 1:
        raise ValueError("search needs at least the bad commit")
    lo, hi = -1, n - 1
    decided: dict[int, str] = {hi: "bad"}
    while True:
        open_ = [i for i in range(lo + 1, hi) if i not in decided]
        if not open_:
            break
        mid = (lo + hi) / 2
        i = min(open_, key=lambda k: (abs(k - mid), k))
        v = classify(i)
        if v not in ("good", "bad", "skip"):
            raise ValueError(f"classify returned {v!r}")
        decided[i] = v
        if v == "bad":
            hi = i
        elif v == "good":
            lo = i
    cands = list(range(lo + 1, hi + 1))
    return SearchResult(hi if len(cands) == 1 else None, cands, decided)


def run_bisect(
    good: Commit,
    commits: list[Commit],
    measure: Callable[[Commit], Measured],
    cfg: CompareConfig,
    *,
    workload: str,
    compiler: str,
    device: str,
    use_clock: bool = True,
    log: Callable[[str], None] | None = None,
) -> BisectReport:
    """Bisect `commits` (GOOD's descendants up to BAD, oldest first) with `measure` (see module docstring).
    `cfg` must be resolved for the device (`CompareConfig.for_device`)."""
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    bad = commits[-1]
    rep = BisectReport(workload, compiler, device, good, bad, list(commits))
    thr = cfg.threshold or 0.0
    use_clock = use_clock and compiler != EAGER

    def take(c: Commit, role: str, ref: Measured | None) -> tuple[Measured, Judgement | None]:
        m = measure(c)
        j = compare_measured(m, ref, cfg, use_clock) if ref is not None and m.ok and ref.ok else None
        note = m.error or (
            ""
            if not ref or m.source_hash == ref.source_hash or not m.source_hash
            else "workload definition differs from GOOD's"
        )
        verdict = "error" if not m.ok else (j.verdict if j else "reference")
        rep.steps.append(
            Step(
                len(rep.steps) + 1,
                c.sha,
                c.subject,
                role,
                m.median,
                verdict,
                j.ratio if j else None,
                j.p if j else None,
                m.seconds,
                note,
            )
        )
        say(
            f"[bisect {len(rep.steps):>2}] {role:<11} {c.label()[:50]:<50} {fmt_ns(m.median):>9}  "
            + (j.text() + f" -> {j.verdict}" if j else ("error: " + m.error if not m.ok else "reference"))
        )
        return m, j

    def need(m: Measured, what: str) -> None:
        if not m.ok:
            raise BisectError(f"{what} could not be measured: {m.error}")

    def borderline(j: Judgement) -> bool:
        return j.verdict == Verdict.REGRESSED or j.ratio > 1 + thr / 2

    def vote(
        c: Commit, first: Judgement, role: str, level: float = 1.0
    ) -> tuple[str, list[tuple[Judgement, Measured]]]:
        """Two of three: `first` and then pairs (a fresh GOOD, then `c` against it) until two verdicts agree;
        bad when two say regressed at a ratio nearer BAD's `level` than 1 (log scale: a probe 1.5x slower on a
        loaded machine is still on GOOD's side of a 100x step; the range's own vote has no level yet: 1);
        skip when `c` fails to run.
        Returns the pairs' (judgement, GOOD) too."""

        def bad(j: Judgement) -> bool:
            return j.verdict == Verdict.REGRESSED and j.ratio >= math.sqrt(level)

        yes = int(bad(first))
        no = 1 - yes
        pairs: list[tuple[Judgement, Measured]] = []
        while yes < 2 and no < 2:
            fresh, _ = take(good, "GOOD again", None)
            need(fresh, f"GOOD {good.short} (again)")
            m, j = take(c, f"{role} again", fresh)
            if j is None:
                rep.skipped[c.sha] = m.error
                return "skip", pairs
            pairs.append((j, fresh))
            yes, no = (yes + 1, no) if bad(j) else (yes, no + 1)
        return ("bad" if yes >= 2 else "good"), pairs

    ref, _ = take(good, "GOOD", None)
    need(ref, f"GOOD {good.short}")
    bad_m, first = take(bad, "BAD", ref)
    need(bad_m, f"BAD {bad.short}")
    assert first is not None
    rep.range_first = first
    if (
        not borderline(first) and first.verdict != Verdict.IMPROVED
    ):  # BAD faster than GOOD is suspect: confirm it
        rep.outcome = "noise"
        rep.message = (
            f"range is noise: BAD is not significantly slower than GOOD ({first.verdict}, "
            f"{first.text()}); nothing bisected"
        )
        return rep
    verdict, pairs = vote(bad, first, "BAD")
    if verdict == "skip":
        raise BisectError(f"BAD {bad.short} could not be measured again: {rep.skipped.pop(bad.sha)}")
    if verdict == "good":
        last = pairs[-1][0]
        rep.range_confirmed, rep.outcome = last, "noise"
        rep.message = (
            f"range is noise: BAD was {first.verdict} against GOOD at first ({first.text()}) and "
            f"not regressed in two of three measurements (last: {last.verdict}, {last.text()}); "
            "nothing bisected"
        )
        return rep
    # the reference from here on: the GOOD of the last pair in which BAD was regressed (never one measured
    # slow by chance, which would make every probe look good); `level`: BAD's ratio against it
    rep.range_confirmed, ref = next((j, g) for j, g in reversed(pairs) if j.verdict == Verdict.REGRESSED)
    # BAD's level: the smallest of its regressed ratios (a measurement spoiled by load only inflates it, and
    # the level decides on which side of the step a probe lies)
    level = min(j.ratio for j in [first] + [pj for pj, _ in pairs] if j.verdict == Verdict.REGRESSED)
    confirmed: dict[int, Judgement] = {len(commits) - 1: rep.range_confirmed}

    def classify(i: int) -> str:
        c = commits[i]
        m, j = take(c, "probe", ref)
        if j is None:
            rep.skipped[c.sha] = m.error
            return "skip"
        if not borderline(j) and j.ratio < math.sqrt(level):  # nearer GOOD's level than BAD's: good
            return "good"
        v, pairs = vote(c, j, "probe", level)
        if v == "bad":
            confirmed[i] = next((pj for pj, _ in reversed(pairs) if pj.verdict == Verdict.REGRESSED), j)
        return v

    res = search(len(commits), classify)
    for i, v in res.decided.items():
        rep.decisions[commits[i].sha] = {"skip": "skipped"}.get(v, v)
    n_meas = len(rep.steps)
    if res.first_bad is not None:
        c = commits[res.first_bad]
        rep.outcome, rep.first_bad = "first-bad", c
        rep.first_bad_judgement = confirmed.get(res.first_bad)
        j = rep.first_bad_judgement
        rep.message = (
            f"first bad commit: {c.label()}: {j.text() if j else 'regressed'} against GOOD "
            f"{good.short} ({n_meas} measurements)"
        )
    else:
        rep.candidates = [commits[i] for i in res.candidates]
        rep.message = (
            "inconclusive: skipped commits leave "
            + ", ".join(c.short for c in rep.candidates)
            + " as the possible first bad commits"
        )
    return rep


# ------------------------------------------------------------------ git and the scratch worktree


def repo_root(path: Path) -> Path:
    r = git(path, "rev-parse", "--show-toplevel", check=False)
    if r.returncode != 0:
        raise UsageError(f"{path} is not inside a git repository")
    return Path(r.stdout.strip())


def resolve(repo: Path, rev: str) -> Commit:
    """The commit `rev` names (UsageError when it names none)."""
    r = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if r.returncode != 0 or not r.stdout.strip():
        raise UsageError(f"unknown revision {rev!r} in {repo}")
    sha = r.stdout.strip()
    return Commit(sha, git(repo, "log", "-1", "--format=%s", sha).stdout.strip())


def commit_range(repo: Path, good: Commit, bad: Commit) -> list[Commit]:
    """GOOD's descendants up to BAD, oldest first: BAD's first-parent chain down to GOOD when GOOD is on it,
    else every commit of the ancestry path in topological order."""
    if good.sha == bad.sha:
        raise UsageError(f"GOOD and BAD are the same commit ({good.short})")
    if git(repo, "merge-base", "--is-ancestor", good.sha, bad.sha, check=False).returncode != 0:
        raise UsageError(f"GOOD {good.short} is not an ancestor of BAD {bad.short}")

    def listing(*opts: str) -> list[Commit]:
        out = git(repo, "log", "--reverse", "--format=%H%x1f%s", *opts, f"{good.sha}..{bad.sha}").stdout
        return [Commit(*line.split("\x1f", 1)) for line in out.splitlines() if line]

    chain = listing("--first-parent")
    first_parent = git(repo, "rev-parse", f"{chain[0].sha}^1", check=False).stdout.strip() if chain else ""
    return chain if first_parent == good.sha else listing("--ancestry-path", "--topo-order")


class Scratch:
    """A temporary folder holding a detached worktree of `repo`, the step stores and logs; removed on exit
    (the folder kept with `keep`, the worktree always removed)."""

    def __init__(self, repo: Path, start: str, keep: bool = False):
        self.repo, self.start, self.keep = repo, start, keep
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-bisect-"))
        self.tree = self.dir / "worktree"

    def __enter__(self) -> Scratch:
        r = git(self.repo, "worktree", "add", "--detach", "--quiet", str(self.tree), self.start, check=False)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise BisectError(f"git worktree add failed: {r.stderr.strip().splitlines()[-1:]}")
        return self

    def __exit__(self, *exc: object) -> None:
        git(self.repo, "worktree", "remove", "--force", str(self.tree), check=False)
        shutil.rmtree(self.tree, ignore_errors=True)
        git(self.repo, "worktree", "prune", check=False)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def checkout(self, sha: str) -> None:
        git(self.tree, "checkout", "--detach", "--force", "--quiet", sha)
        git(self.tree, "clean", "-ffdxq")


@dataclass(frozen=True)
class Container:
    """Measure at a backend's container place (`--backend B` without `--native`), as `bench backend` does: the
    worktree mounted read-only as the source, the scratch folder as the results folder, the backend's suite
    environment, no network. `place` is harness.suites.place.ContainerPlace, its image the harness's image of B
    (built from the caller's checkout)."""

    backend: Any  # harness.matrix.Backend
    place: Any  # harness.suites.place.Place, prepared
    env: dict[str, str]  # the backend's suite environment (harness.commands.suite_env)

    def launch(self, inner: list[str], tree: Path, results: Path, name: str) -> Any:
        """The place's Launch of `inner` with `tree` as the source (harness.suites.place.Launch)."""
        env = {**self.env, "PYTHONDONTWRITEBYTECODE": "1"}
        return self.place.launch(self.backend, inner, out_dir=results, name=name, env=env, src=tree)


class CommitRunner:
    """`measure(commit)`: that commit's `python -m harness bench run` in the scratch worktree, read back; in
    `container` when given (`--backend B`), else with `python` on this machine (`env`: more variables)."""

    def __init__(
        self,
        scratch: Scratch,
        workload: str,
        compiler: str,
        device: str,
        *,
        profile: str | None,
        run_args: list[str],
        timeout_s: float,
        python: str = sys.executable,
        container: Container | None = None,
        env: dict[str, str] | None = None,
    ):
        self.scratch, self.workload, self.compiler, self.device = scratch, workload, compiler, device
        self.profile, self.run_args, self.timeout_s, self.python = profile, run_args, timeout_s, python
        self.container, self.extra_env = container, dict(env or {})
        self.count = 0

    def argv(self, commit: Commit, db: Path | str, python: str | None = None) -> list[str]:
        argv = [
            python or self.python,
            "-m",
            "harness",
            "bench",
            "run",
            "--device",
            self.device,
            "--only",
            self.workload,
            "--compilers",
            self.compiler,
            "--db",
            str(db),
            "--quiet",
            "--no-fail",
            "--label",
            f"bisect {commit.short}",
            "--git-ref",
            "bisect",
            "--git-commit",
            commit.sha,
        ]
        return argv + (["--profile", self.profile] if self.profile else []) + self.run_args

    def env(self) -> dict[str, str]:
        from harness.commands import with_pythonpath

        env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "KILN_BENCH_DB")}
        env.update(self.extra_env)
        env = with_pythonpath(env, self.scratch.tree)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # same-size edits within a second must not reuse stale bytecode
        return env

    def command(self, commit: Commit, name: str) -> tuple[list[str], dict[str, str] | None, str | None]:
        """(argv, environment, container name) of the step `name` measuring `commit`."""
        if self.container is None:
            return self.argv(commit, self.scratch.dir / f"{name}.sqlite"), self.env(), None
        c = self.container
        inner = self.argv(commit, f"{c.place.seen(self.scratch.dir)}/{name}.sqlite", python=c.place.python)
        how = c.launch(inner, self.scratch.tree, self.scratch.dir, f"bisect-{os.getpid()}-{name}")
        return how.argv, how.env, how.container

    def __call__(self, commit: Commit) -> Measured:
        from harness.process import execute

        self.count += 1
        name = f"step{self.count:02d}-{commit.short}"
        db, log = self.scratch.dir / f"{name}.sqlite", self.scratch.dir / f"{name}.log"
        t0 = time.monotonic()
        m = Measured(commit)
        try:
            self.scratch.checkout(commit.sha)
        except subprocess.CalledProcessError as e:
            m.error = f"git checkout failed: {(e.stderr or '').strip()[:200]}"
            return m
        argv, env, container = self.command(commit, name)
        rc, timed_out = execute(
            argv,
            log=log,
            timeout_s=self.timeout_s,
            env=env,
            cwd=self.scratch.tree,
            container=container,
            echo=False,
        )
        m.seconds = time.monotonic() - t0
        if timed_out:
            m.error = f"bench run timed out after {self.timeout_s:.0f}s"
        elif rc != 0:
            m.error = f"bench run exited {rc}: {last_line(log)}"
        else:
            self._read(m, db)
        return m

    def _read(self, m: Measured, db: Path) -> None:
        from harness.bench.stores.store import Store

        try:
            with Store(db) as store:
                runs = store.runs(limit=1)
                results = store.results(runs[0].rid) if runs else []
        except (BenchError, IndexError) as e:
            m.error = f"cannot read the step's store: {e}"
            return
        mine = {r.compiler: r for r in results if r.workload == self.workload}
        r = mine.get(self.compiler)
        if r is None:
            m.error = f"no {self.workload} result under {self.compiler} (workload unknown at this commit?)"
        elif r.status != "ok" or not r.samples:
            m.error = f"{self.compiler} failed: {r.error or 'no samples'}"
        else:
            m.samples, m.source_hash = list(r.samples), r.source_hash
            eager = mine.get(EAGER)
            m.eager = list(eager.samples) if eager is not None and eager.status == "ok" else []


def last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(no output)"


# ------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `bench bisect`."""
    p.add_argument("good", help="a commit (any git revision) where the workload was fast")
    p.add_argument("bad", help="a later commit (descendant of GOOD) where it is slow")
    p.add_argument(
        "--only",
        required=True,
        metavar="WORKLOAD",
        help="the workload (one name, or a pattern matching exactly one; see `bench workloads`)",
    )
    p.add_argument(
        "--compiler",
        default="kiln",
        help="compiler whose time is bisected (default kiln; eager is measured beside it as the local clock)",
    )
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda, cuda:N")
    p.add_argument("--profile", choices=["tiny", "gpu"], help="size table (default: gpu on a GPU, else tiny)")
    p.add_argument(
        "--backend",
        help="measure as the bench job of this backend of ci/matrix.json does: in its "
        "container (the harness's image; each commit's code mounted as the source), the device its "
        "matrix entry says; with --native on this machine's Python with its suite environment",
    )
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="with --backend: this machine's Python, no container (also KILN_NATIVE=1)",
    )
    p.add_argument("--image", help="with --backend: this local image instead of building the hash-tagged one")
    p.add_argument(
        "--repo", type=Path, default=Path("."), help="the git repository (default: the current one)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="fraction slower that counts as a regression "
        "(default $KILN_BENCH_THRESHOLD, else 0.05 on GPU, 0.10 on CPU)",
    )
    p.add_argument("--alpha", type=float, default=None, help="Mann-Whitney level (default 0.01)")
    p.add_argument(
        "--drift",
        choices=["on", "off"],
        default="on",
        help="divide out eager's ratio on the same workload (default on)",
    )
    p.add_argument(
        "--step-timeout", type=float, default=1800.0, help="seconds per measurement (default 1800)"
    )
    p.add_argument(
        "--run-args",
        default="",
        help="more `bench run` flags for every measurement, one string (e.g. '--target-s 0.3 --rounds 10')",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (step stores and logs)")
    p.add_argument("--json", type=Path, help="write the verdict and every step as JSON here")
    p.add_argument(
        "--md", type=Path, help="write a Markdown report here (also appended to $GITHUB_STEP_SUMMARY)"
    )


def _one_workload(pattern: str, profile: str) -> str:
    from harness.bench.kernels import workloads as wl

    names = [c.name for c in wl.cases(profile, pattern)]  # UsageError when nothing matches
    if pattern in names:
        return pattern
    if len(names) != 1:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise UsageError(f"--only {pattern!r} matches {len(names)} workloads ({shown}); name one")
    return names[0]


def _backend_setup(args: argparse.Namespace) -> tuple[str, str, str, Container | None, dict[str, str]]:
    """(device, profile, workload, container or None, more environment) of `--backend B [--native]`: the
    device of B's matrix entry; in a container the host may have no torch, so the workload is checked against
    the profile only where torch imports (a wrong name then shows as GOOD failing to measure)."""
    from harness import matrix as matrix_mod
    from harness.commands import suite_env
    from harness.suites.place import NATIVE, chosen

    m = matrix_mod.load()
    try:
        b = m.backend(args.backend)
    except matrix_mod.MatrixError as e:
        raise UsageError(str(e)) from None
    place = chosen(args.native, args.image)  # --native, else KILN_NATIVE, else the backend's container
    env = suite_env(m, b)
    if place.mode == NATIVE:  # this Python in the scratch worktree, with the backend's suite environment
        from harness.bench.kernels.execute import defaults_for, resolve_device

        device = resolve_device("cpu" if b.device == "cpu" else args.device)
        profile = args.profile or defaults_for(device)["profile"]
        return device, profile, _one_workload(args.only, profile), None, env
    device = "cpu" if b.device == "cpu" else "cuda"
    profile = args.profile or ("tiny" if device == "cpu" else "gpu")
    try:
        workload = _one_workload(args.only, profile)
    except ImportError:  # no torch on this host: the container has it
        workload = args.only
    return device, profile, workload, Container(b, place.prepared(b), env), {}


sigterm_as_interrupt = (
    sigterm_interrupts  # SIGTERM raises KeyboardInterrupt like Ctrl-C: the worktree is removed
)


def cmd_bisect(args: argparse.Namespace) -> int:
    """The `bench bisect` verb (module docstring)."""
    from harness.bench.reports.report import terminal
    from harness.results import append_job_summary, atomic_write_text
    from harness.settings import bench_settings

    s = bench_settings()
    thr = s.threshold if args.threshold is None else args.threshold
    alpha = s.alpha if args.alpha is None else args.alpha
    if (thr is not None and not 0 < thr < 1) or not 0 < alpha < 1:
        raise UsageError("--threshold and --alpha must be between 0 and 1")
    repo = repo_root(args.repo)
    good, bad = resolve(repo, args.good), resolve(repo, args.bad)
    commits = commit_range(repo, good, bad)
    container: Container | None = None
    extra_env: dict[str, str] = {}
    if args.backend:
        device, profile, workload, container, extra_env = _backend_setup(args)
    else:
        from harness.bench.kernels.execute import defaults_for, resolve_device

        device = resolve_device(args.device)
        profile = args.profile or defaults_for(device)["profile"]
        workload = _one_workload(args.only, profile)
    cfg = CompareConfig(threshold=thr, alpha=alpha).for_device(device)
    try:
        run_args = shlex.split(args.run_args)
    except ValueError as e:
        raise UsageError(f"bad --run-args: {e}") from None
    where = (
        f"{args.backend}'s container" if container else (f"{args.backend}, native" if args.backend else "")
    )
    print(
        f"bisect {workload} under {args.compiler} on {device}{f' ({where})' if where else ''}: GOOD "
        f"{good.label()} .. BAD {bad.label()} ({len(commits)} commit(s)), threshold {cfg.threshold:.0%}, "
        f"alpha {cfg.alpha}",
        file=sys.stderr,
    )
    try:
        with sigterm_as_interrupt(), Scratch(repo, good.sha, keep=args.keep) as scratch:
            runner = CommitRunner(
                scratch,
                workload,
                args.compiler,
                device,
                profile=args.profile,
                run_args=run_args,
                timeout_s=args.step_timeout,
                container=container,
                env=extra_env,
            )
            rep = run_bisect(
                good,
                commits,
                runner,
                cfg,
                workload=workload,
                compiler=args.compiler,
                device=device,
                use_clock=args.drift == "on",
            )
            if args.keep:
                print(f"note: step stores and logs kept in {scratch.dir}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: bisection stopped; its scratch worktree is removed", file=sys.stderr)
        return 130
    print(terminal(rep.step_rows()))
    print(rep.message)
    if rep.outcome == "first-bad" and rep.range_confirmed:
        print(f"BAD/GOOD: {rep.range_confirmed.text()}")
    if rep.skipped:
        print("skipped: " + "; ".join(f"{sha[:10]} ({why})" for sha, why in rep.skipped.items()))
    md = rep.markdown()
    if args.md:
        atomic_write_text(args.md, md)
    append_job_summary(md)
    if args.json:
        atomic_write_text(args.json, json.dumps(rep.as_dict(), indent=1))
    return rep.exit_code
