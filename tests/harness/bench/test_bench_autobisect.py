"""The end of a CI bench job (harness/bench/job.py): which confirmed regressions are bisected
automatically on main (the cap, the order), why none are (no baseline commit, the same commit, a shallow
checkout), the runs compared in the job summary, and the bisections measuring in the backend's container.
The bisections themselves are fakes here (test_bench_bisect.py bisects a planted slowdown for real)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.bench import job
from harness.bench.job import (
    BisectOutcome,
    Plan,
    Target,
    confirmed_regressions,
    history_problem,
    plan_bisections,
)
from harness.bench.kernels.bisect import Commit, CommitRunner, Container, Scratch
from harness.exc import SettingsError
from harness.suites.place import ContainerPlace, NativePlace

ROOT = Path(__file__).resolve().parents[3]
GOOD, BAD = "a" * 40, "b" * 40


def _cmp(
    workload: str,
    compiler: str,
    verdict: str = "regressed",
    confirmed: bool | None = True,
    ratio: float = 1.3,
) -> dict:
    return {
        "workload": workload,
        "compiler": compiler,
        "verdict": verdict,
        "confirmed": confirmed,
        "ratio": ratio,
        "p": 0.001,
    }


def test_only_regressions_the_re_measure_confirmed_compilers_before_eager_worst_first():
    report = {
        "comparisons": [
            _cmp("w1", "eager", ratio=2.0),
            _cmp("w2", "kiln", ratio=1.2),
            _cmp("w3", "inductor", ratio=1.5),
            _cmp("w4", "kiln", verdict="unchanged", confirmed=False),  # flagged, then not confirmed
            _cmp("w5", "kiln", verdict="improved", ratio=0.5),
            _cmp("w6", "kiln", confirmed=None),  # never re-measured: not confirmed
            _cmp("w7", "kiln", verdict="new", confirmed=None),
        ]
    }
    assert [(t.workload, t.compiler) for t in confirmed_regressions(report)] == [
        ("w3", "inductor"),
        ("w2", "kiln"),
        ("w1", "eager"),
    ]
    assert confirmed_regressions({"comparisons": None}) == []  # the first run: compared with nothing


def _targets(n: int) -> list[Target]:
    return [Target(f"w{i}", "kiln", 1.5 - i / 100) for i in range(n)]


def _no_problem(good: str, bad: str) -> None:
    return None


def test_the_cap_bisects_the_first_and_lists_the_rest():
    plan = plan_bisections(_targets(4), GOOD, BAD, 2, _no_problem)
    assert [t.workload for t in plan.targets] == ["w0", "w1"] and not plan.reason
    assert [(t.workload, why) for t, why in plan.skipped] == [
        ("w2", "at most 2 bisection(s) per job (--bisect-max / KILN_BENCH_BISECT_MAX)"),
        ("w3", "at most 2 bisection(s) per job (--bisect-max / KILN_BENCH_BISECT_MAX)"),
    ]
    plan = plan_bisections(_targets(1), GOOD, BAD, 2, _no_problem)
    assert len(plan.targets) == 1 and plan.skipped == []


def test_nothing_regressed_nothing_planned():
    asked = []
    plan = plan_bisections([], GOOD, BAD, 2, lambda g, b: asked.append(g))
    assert plan.targets == plan.skipped == [] and plan.reason == "" and asked == []


@pytest.mark.parametrize(
    "good, bad, cap, problem, reason",
    [
        (GOOD, BAD, 0, None, "automatic bisection is off"),
        (None, BAD, 2, None, "the baseline run (main's previous run) recorded no commit"),
        ("", BAD, 2, None, "the baseline run (main's previous run) recorded no commit"),
        (GOOD, None, 2, None, "this run recorded no commit"),
        (BAD, BAD, 2, None, "the baseline run is of this very commit bbbbbbbbbb"),
        (GOOD, BAD, 2, "the checkout is shallow", "the checkout is shallow"),
    ],
)
def test_why_nothing_is_bisected(good, bad, cap, problem, reason):
    plan = plan_bisections(_targets(3), good, bad, cap, lambda g, b: problem)
    assert plan.targets == [] and plan.reason.startswith(reason)
    assert [t.workload for t, why in plan.skipped] == ["w0", "w1", "w2"]
    assert all(why == plan.reason for _, why in plan.skipped)


# ---- the checkout's history: a real scratch repository, a full and a shallow clone ----------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """A repository of three commits; their shas, oldest first."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.invalid")
    _git(r, "config", "user.name", "t")
    shas = []
    for i in range(3):
        (r / "f.txt").write_text(f"{i}\n")
        _git(r, "add", "f.txt")
        _git(r, "commit", "-q", "-m", f"c{i}")
        shas.append(_git(r, "rev-parse", "HEAD"))
    return r, shas


def test_history_of_a_full_checkout(repo):
    r, (c0, c1, c2) = repo
    assert history_problem(r, c0, c2) is None
    assert "is not an ancestor of" in history_problem(r, c2, c0)
    msg = history_problem(r, "f" * 40, c2)
    assert msg.startswith("commit ffffffffff (main's previous run) is not in this checkout's history")
    assert "shallow" not in msg
    assert history_problem(r.parent, c0, c2).endswith("is not a git checkout")


def test_history_of_a_shallow_checkout_says_fetch_depth_0(repo, tmp_path):
    r, (c0, c1, c2) = repo
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{r}", str(shallow)], check=True)
    assert history_problem(shallow, c0, c2) == (
        f"commit {c0[:10]} (main's previous run) is not in this checkout's history: the checkout is shallow "
        "(the workflow's checkout step needs `fetch-depth: 0`)"
    )


# ---- the verb, with fake bisections --------------------------------------------------------------------
def _results(tmp_path: Path, comparisons: list[dict], *, good: str | None, bad: str | None) -> Path:
    """A job's results folder as the measure and seed steps leave it: last.json and baseline.json."""
    out = tmp_path / "results" / "bench" / "cuda"
    out.mkdir(parents=True)
    base = {
        "id": 1,
        "uid": "base-uid",
        "created_at": "2026-01-01T00:00:00Z",
        "git_ref": "main",
        "git_commit": good,
    }
    report = {
        "run": {
            "id": 2,
            "uid": "this-uid",
            "created_at": "2026-01-02T00:00:00Z",
            "git_ref": "main",
            "git_commit": bad,
            "status": "complete",
        },
        "baseline_runs": [1],
        "baseline": [base],
        "comparisons": comparisons,
    }
    (out / "last.json").write_text(json.dumps(report))
    (out / "baseline.json").write_text(
        json.dumps({"format": "kiln-bench-export", "runs": [{**base, "id": 41}]})
    )
    return out


def _args(out: Path, repo: Path, **kw) -> argparse.Namespace:
    ns = dict(
        backend="cuda",
        results=out,
        recorded=False,
        bisect_max=None,
        native=False,
        step_timeout=600.0,
        repo=repo,
    )
    return argparse.Namespace(**{**ns, **kw})


class FakeBisect:
    """Stands in for `bench bisect`: remembers what it was asked, names a first bad commit (or fails)."""

    def __init__(self, first_bad: str | None = None, rc: int = 0):
        self.asked: list[tuple[str, str, str, str]] = []
        self.first_bad, self.rc = first_bad, rc

    def __call__(self, plan: Plan, t: Target) -> BisectOutcome:
        self.asked.append((plan.good, plan.bad, t.workload, t.compiler))
        if self.rc:
            return BisectOutcome(
                t, self.rc, line=f"bisect exited {self.rc}: error: GOOD could not be measured"
            )
        return BisectOutcome(
            t,
            0,
            markdown=f"## kiln bench bisect: `{t.workload}` under {t.compiler}",
            line=f"first bad commit: {self.first_bad[:10]} slow",
            outcome="first-bad",
            first_bad=self.first_bad,
        )


def test_main_job_bisects_confirmed_regressions_up_to_the_cap(repo, tmp_path, monkeypatch):
    r, (c0, c1, c2) = repo
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("KILN_BENCH_BISECT_MAX", "2")
    out = _results(
        tmp_path,
        [
            _cmp("w1", "kiln", ratio=1.2),
            _cmp("w2", "kiln", ratio=1.4),
            _cmp("w3", "eager", ratio=1.9),
            _cmp("w4", "inductor", verdict="unchanged", confirmed=False),
        ],
        good=c0,
        bad=c2,
    )
    fake = FakeBisect(first_bad=c1)
    assert job.cmd_job_summary(_args(out, r), run_bisect=fake) == 0
    assert fake.asked == [(c0, c2, "w2", "kiln"), (c0, c2, "w1", "kiln")]
    md = summary.read_text()
    assert "### Runs compared" in md
    assert "- this run: run 2 of the job's store, uid `this-uid`" in md and "not recorded" in md
    assert (
        f"- against: run 41 of the lasting store (main's previous complete run), uid `base-uid`, commit "
        f"`{c0[:10]}`"
        in md
        and "run 1 of the job's store" in md
    )
    assert (
        f"3 confirmed regression(s); 2 bisected between main's previous run `{c0[:10]}` and this run "
        f"`{c2[:10]}`" in md
    )
    assert f"- `w2` under kiln, ratio 1.400: **first bad commit: {c1[:10]} slow**" in md
    assert "- `w3` under eager, ratio 1.900: not bisected: at most 2 bisection(s) per job" in md
    assert "## kiln bench bisect: `w2` under kiln" in md and "## kiln bench bisect: `w1` under kiln" in md
    assert f"python -m harness bench bisect {c0} {c2} --only w3 --compiler eager --backend cuda" in md
    decided = json.loads((out / "auto-bisect.json").read_text())
    assert decided["good"] == c0 and decided["bad"] == c2 and decided["max"] == 2
    assert [(b["workload"], b["outcome"], b["first_bad"]) for b in decided["bisected"]] == [
        ("w2", "first-bad", c1),
        ("w1", "first-bad", c1),
    ]
    assert [n["workload"] for n in decided["not_bisected"]] == ["w3"]


def test_a_failed_bisection_adds_its_verdict_and_the_step_still_passes(repo, tmp_path, monkeypatch):
    r, (c0, _, c2) = repo
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = _results(tmp_path, [_cmp("w1", "kiln")], good=c0, bad=c2)
    assert job.cmd_job_summary(_args(out, r, bisect_max=1), run_bisect=FakeBisect(rc=1)) == 0
    md = summary.read_text()
    assert (
        "- `w1` under kiln, ratio 1.300: **bisect exited 1: error: GOOD could not be measured** (exit 1; "
        "log `bisect-w1-kiln.log`)" in md
    )


def test_a_shallow_checkout_is_said_plainly_and_nothing_runs(repo, tmp_path, monkeypatch):
    r, (c0, _, c2) = repo
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{r}", str(shallow)], check=True)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = _results(tmp_path, [_cmp("w1", "kiln"), _cmp("w2", "kiln")], good=c0, bad=c2)
    fake = FakeBisect(first_bad=c2)
    assert job.cmd_job_summary(_args(out, shallow), run_bisect=fake) == 0
    assert fake.asked == []
    md = summary.read_text()
    assert (
        f"2 confirmed regression(s), **none bisected**: commit {c0[:10]} (main's previous run) is not in this "
        "checkout's history: the checkout is shallow (the workflow's checkout step needs `fetch-depth: 0`)."
    ) in md
    assert f"By hand (in a full clone): `python -m harness bench bisect {c0} {c2} --only w1" in md
    assert json.loads((out / "auto-bisect.json").read_text())["reason"].startswith(f"commit {c0[:10]}")


def test_no_baseline_commit_and_a_first_run(repo, tmp_path, monkeypatch):
    r, (_, _, c2) = repo
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = _results(tmp_path, [_cmp("w1", "kiln")], good=None, bad=c2)
    fake = FakeBisect(first_bad=c2)
    assert job.cmd_job_summary(_args(out, r), run_bisect=fake) == 0
    assert (
        fake.asked == []
        and "**none bisected**: the baseline run (main's previous run) recorded no commit"
        in summary.read_text()
    )
    assert "By hand" not in summary.read_text()  # no GOOD to name

    first = tmp_path / "first"
    first.mkdir()
    report = {
        "run": {"id": 1, "uid": "u1", "git_commit": c2},
        "baseline_runs": [],
        "baseline": [],
        "comparisons": None,
    }
    (first / "last.json").write_text(json.dumps(report))
    assert job.cmd_job_summary(_args(first, r, results=first), run_bisect=fake) == 0
    assert "- against: nothing (no complete run of main in the lasting store yet)" in summary.read_text()


def test_no_run_report_is_said_and_the_step_passes(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert job.cmd_job_summary(_args(tmp_path / "none", tmp_path)) == 0
    assert (
        "no run report" in summary.read_text()
        and "the measure step ended before writing it" in summary.read_text()
    )


def test_the_cap_from_the_flag_the_variable_or_the_default(monkeypatch):
    monkeypatch.delenv("KILN_BENCH_BISECT_MAX", raising=False)
    assert job.bisect_max(None) == job.DEFAULT_BISECT_MAX == 2
    monkeypatch.setenv("KILN_BENCH_BISECT_MAX", "5")
    assert job.bisect_max(None) == 5 and job.bisect_max(0) == 0
    monkeypatch.setenv("KILN_BENCH_BISECT_MAX", "lots")  # read by harness/settings.py: a SettingsError
    with pytest.raises(
        SettingsError, match=r"^KILN_BENCH_BISECT_MAX='lots': expected a count \(0, 1, 2, ...\)$"
    ):
        job.bisect_max(None)
    assert job.bisect_max(3) == 3  # the flag wins; the variable is not read


def test_the_bisect_command_line():
    plan = Plan(GOOD, BAD)
    t = Target("softmax.fwd.fp32.64x128", "kiln")
    assert job.bisect_argv(
        plan, t, "rocm", place=NativePlace(), out=Path("o"), python="py", step_timeout_s=600
    ) == [
        "py",
        "-m",
        "harness",
        "bench",
        "bisect",
        GOOD,
        BAD,
        "--only",
        "softmax.fwd.fp32.64x128",
        "--compiler",
        "kiln",
        "--backend",
        "rocm",
        "--native",
        "--step-timeout",
        "600",
        "--json",
        "o/bisect-softmax.fwd.fp32.64x128-kiln.json",
        "--md",
        "o/bisect-softmax.fwd.fp32.64x128-kiln.md",
    ]


def test_a_real_bisect_that_fails_fast_is_reported_with_its_last_line(repo, tmp_path, monkeypatch):
    """run_one runs `bench bisect` for real: an unknown workload ends it at once (exit 2, one error line)."""
    r, (c0, _, c2) = repo
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    out.mkdir()
    v = job.run_one(
        Plan(c0, c2),
        Target("no.such.workload", "kiln"),
        "cpu",
        out,
        place=NativePlace(),
        step_timeout_s=60,
        repo=r,
    )
    assert v.rc == 2 and v.markdown == "" and v.line.startswith("bisect exited 2: harness bench: error: ")
    assert "no.such.workload" in v.line


# ---- bench bisect --backend B: each measurement in the backend's container -------------------------------
def test_bisect_measures_in_the_backends_container(repo, tmp_path):
    from harness import matrix

    r, (c0, _, _) = repo
    m = matrix.load(ROOT / "ci" / "matrix.json")
    b = m.backend("cuda")
    scratch = Scratch(r, c0)
    try:
        runner = CommitRunner(
            scratch,
            "softmax.fwd.fp32.64x128",
            "kiln",
            "cuda",
            profile=None,
            run_args=[],
            timeout_s=60,
            container=Container(b, ContainerPlace("kiln-cuda:abc"), {"KILN_TEST_DEVICE": "cuda"}),
        )
        argv, env, name = runner.command(Commit(c0), "step01-x")
    finally:
        scratch.dir.rmdir()
    assert env is None and name and name.startswith("kiln-cuda-bisect-")
    assert Path(argv[0]).name == "docker" and argv[1] == "run"
    assert argv[argv.index("--name") + 1] == name
    assert f"{scratch.tree}:/src:ro" in argv and f"{scratch.dir}:/results" in argv
    assert "KILN_TEST_DEVICE=cuda" in argv and "PYTHONDONTWRITEBYTECODE=1" in argv and "--gpus" in argv
    inner = argv[argv.index("kiln-cuda:abc") + 1 :]
    assert inner[:5] == ["python", "-m", "harness", "bench", "run"]
    assert inner[inner.index("--db") + 1] == "/results/step01-x.sqlite"
    assert inner[inner.index("--git-commit") + 1] == c0 and inner[inner.index("--device") + 1] == "cuda"
    native = CommitRunner(
        scratch,
        "w",
        "kiln",
        "cpu",
        profile=None,
        run_args=[],
        timeout_s=60,
        python="py",
        env={"TRITON_INTERPRET": "1"},
    )
    argv, env, name = native.command(Commit(c0), "step02-x")
    assert argv[0] == "py" and name is None and env["TRITON_INTERPRET"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(scratch.tree)
