"""Nothing lost (bench): suspects decided side by side, verdicts stored and repeated by `bench
history`, the job's last lines, atomic artifacts, `finished_at`, SIGTERM. Real `bench run`s of a few tiny
workloads in subprocesses (the machine's speed is what they are about), plus unit tests without timing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import make_run, samples

from harness.bench.core.records import Result
from harness.bench.judge import verdict
from harness.bench.judge.compare import CPU_THRESHOLD, CompareConfig, Comparison
from harness.bench.kernels import sidebyside
from harness.bench.reports.report import fmt_ns

ROOT = Path(__file__).resolve().parents[3]
W1, W2 = "softmax.fwd.fp32.64x128", "row_sum.fwd.fp32.64x128"
CPU = CompareConfig().for_device("cpu")


def _env(**more: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KILN_BENCH_") and k != "GITHUB_STEP_SUMMARY"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **more}


def _bench(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 400
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "bench", *argv],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ------------------------------------------------------------------ history repeats the run's verdicts
def test_history_repeats_the_verdict_and_times_of_the_run_that_stored_them(tmp_path):
    """A baseline whose stored samples are 40% too fast (measured in a fast moment): the next run flags a
    suspect against them, the side-by-side measurement (same commit: two arms of the same code) rejects it;
    `bench history` and `bench show` say `rejected` with the run's own numbers, never regressed or improved."""
    db = tmp_path / "b.sqlite"
    args = [
        "run",
        "--device",
        "cpu",
        "--compilers",
        "eager",
        "--only",
        f"{W1},{W2}",
        "--target-s",
        "0.05",
        "--passes",
        "1",
        "--quiet",
        "--db",
        str(db),
        "--baseline",
        "latest?",
    ]
    first = _bench(*args)
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(db) as con:  # the planted slowdown lives only in the stored baseline
        con.execute(
            "UPDATE samples SET ns = ns * 0.6 WHERE result_id IN (SELECT id FROM results WHERE run_id = 1 "
            "AND workload = ?)",
            (W1,),
        )
        con.execute("UPDATE results SET median_ns = median_ns * 0.6 WHERE run_id = 1 AND workload = ?", (W1,))
    second = _bench(*args, "--json", str(tmp_path / "last.json"))
    assert second.returncode == 0, second.stderr  # a rejected suspect never fails the run
    report = json.loads((tmp_path / "last.json").read_text())
    assert (
        report["run"]["status"] == "complete" and report["run"]["finished_at"]
    )  # set in a complete run's JSON
    c = next(x for x in report["comparisons"] if x["workload"] == W1)
    assert (
        c["suspect"] == "regressed" and c["ratio"] > 1 + CPU_THRESHOLD
    )  # the stored comparison flagged it ...
    v = c["verdict"]  # ... not so; a host too noisy to decide says so (its noise floor above the threshold)
    if v == "inconclusive":
        assert c["confirmed"] is None and c["sbs_noise"] > 0, c
    else:
        assert v == "rejected" and c["confirmed"] is False and c["sbs_ratio"] < 1 + CPU_THRESHOLD, c
    assert f"{v} side by side" in second.stdout
    mark = {"rejected": "= rejected", "inconclusive": "? inconclusive"}[v]
    assert not any(x["verdict"] == "regressed" for x in report["comparisons"])

    hist = _bench(
        "history", W1, "--db", str(db), "--out", str(tmp_path / "plots"), "--md", str(tmp_path / "h.md")
    )
    assert hist.returncode == 0, hist.stderr
    line = next(ln for ln in hist.stdout.splitlines() if ln.startswith(f"{v}: "))
    # the same verdict, ratio and times as the run's comparison table
    assert f"{W1} [eager] run 2 x{c['ratio']:.2f}" in line and "as its run stored it" in line
    assert f"{fmt_ns(c['base_ns'])} -> {fmt_ns(c['new_ns'])}" in line
    assert f"side by side x{c['sbs_ratio']:.2f}" in line
    table_line = next(ln for ln in second.stdout.splitlines() if ln.startswith(W1) and v in ln)
    assert fmt_ns(c["base_ns"]) in table_line and fmt_ns(c["new_ns"]) in table_line
    assert f"{c['ratio']:.3f}" in table_line
    # the terminal's long format: the series' last step; the Markdown table: the run's row
    series = next(ln for ln in hist.stdout.splitlines() if ln.startswith(W1) and " eager " in ln)
    assert (
        fmt_ns(c["new_ns"]) in series and f" x{c['ratio']:.2f} " in series and series.rstrip().endswith(mark)
    )
    row = next(ln for ln in (tmp_path / "h.md").read_text().splitlines() if ln.startswith("| 2 "))
    assert f"{fmt_ns(c['new_ns'])} x{c['ratio']:.2f} {mark}" in row and row.rstrip(" |").endswith("stored")
    assert not [
        ln for ln in hist.stdout.splitlines() if ln.startswith(("regressed:", "improved:", "suspect:"))
    ]
    assert "▲" not in row and "▼" not in row
    shown = _bench("show", "2", "--db", str(db))
    counts = next(ln for ln in shown.stdout.splitlines() if ln.startswith("against baseline run(s) 1: "))
    assert shown.returncode == 0 and f"{v}: " in counts and "regressed: 0" in counts, (
        shown.stdout + shown.stderr
    )


# ------------------------------------------------------------------ the main job's bench step, twice
BUSY_CPU_S = 30
# a bound for a step that hangs, not a speed: a side-by-side confirmation (four processes, kiln in Triton's
# interpreter) takes minutes on a loaded 2-core host
STEP_TIMEOUT_S = 1200
BUSY_LOOP = f"import resource\nresource.setrlimit(resource.RLIMIT_CPU, ({BUSY_CPU_S}, {BUSY_CPU_S}))\nwhile True: pass"


def _job_step(out: Path, *, plant: str | None = None) -> tuple[int, str, str]:
    """The main job's bench step (`bench backend`, natively, as `nox -s ci` runs it on this machine) over two
    tiny workloads under kiln (interpreter) and eager, then its verdict line."""
    env = _env(**({"KILN_BENCH_PLANT": plant} if plant else {}))
    p = _bench(
        "backend",
        "--backend",
        "cpu",
        "--native",
        "--results",
        str(out),
        "--",
        "--compilers",
        "kiln",
        "--only",
        f"{W1},{W2}",
        "--target-s",
        "0.05",
        "--passes",
        "1",
        "--quiet",
        env=env,
        timeout=STEP_TIMEOUT_S,
    )
    v = _bench("verdict", "--step", "kernels", str(out / "last.json"), str(p.returncode))
    return p.returncode, v.stdout.strip(), p.stdout + p.stderr


@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_the_main_jobs_bench_step_twice_under_load_flags_nothing_and_a_planted_slowdown_is_confirmed(
    tmp_path,
):
    out = tmp_path / "bench"
    rc, line, log = _job_step(out)
    assert rc == 0 and line == "bench kernels: nothing compared (no baseline run) -> ok", log
    # one core busy while the second run starts and measures: the loop ends itself after BUSY_CPU_S of CPU time
    # (RLIMIT_CPU), so that the load it adds costs the test a bounded share of the machine
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        rc, line, log = _job_step(out)
    finally:
        busy.kill()
        busy.wait()
    assert rc == 0, log
    assert line.startswith("bench kernels: 0 regressed (confirmed side by side), ") and line.endswith(
        "-> ok"
    ), log
    rc, line, log = _job_step(out, plant=f"{W1}@kiln=0.2")
    report = json.loads((out / "last.json").read_text())
    confirmed = [(c["workload"], c["compiler"]) for c in report["comparisons"] if c["verdict"] == "regressed"]
    planted = next(c for c in report["comparisons"] if (c["workload"], c["compiler"]) == (W1, "kiln"))
    if (
        planted["verdict"] == "inconclusive"
    ):  # a host this busy cannot tell 20%: it says so, with its noise floor
        assert rc == 0 and planted["sbs_noise"] > 0.1 and not confirmed and line.endswith("-> ok"), log
        assert f"inconclusive (host too noisy to decide, not failing): {W1}@kiln" in line, line
        return
    assert rc == 1 and confirmed == [(W1, "kiln")], log
    assert (
        line.startswith(f"bench kernels: 1 regressed (confirmed side by side): {W1}@kiln x1.")
        and "(interpreter: pipeline check, not kernel speed)" in line
        and line.endswith("-> FAIL")
    ), line


# ------------------------------------------------------------------ unit: no commit, no confirmation
def _suspect(workload: str = "w", compiler: str = "kiln") -> Comparison:
    return Comparison(workload, compiler, "regressed", ratio=1.4, p=1e-6, base_ns=1e6, new_ns=1.4e6)


def test_a_suspect_whose_baseline_commit_is_unavailable_stays_unconfirmed_and_never_fails(tmp_path):
    run, base = make_run(commit="1" * 40), make_run(commit="f" * 40)  # no such commit in this repository
    run.id, base.id = 2, 1

    def never(*a, **k):
        raise AssertionError("nothing can be measured without the baseline's code")

    cmps = sidebyside.confirm_side_by_side(
        [_suspect()], run, [base], {}, CPU, measure=never, log=lambda m: None
    )
    assert cmps[0].verdict == "unconfirmed" and cmps[0].confirmed is None
    assert "not available" in cmps[0].note
    line, failed = verdict.step_verdict("kernels", {"comparisons": [cmps[0].as_dict()]}, 0)
    assert not failed and "1 unconfirmed" in line and line.endswith("-> ok")
    # no commit recorded at all (a run outside git): unconfirmed as well
    base.git_commit = None
    c = sidebyside.confirm_side_by_side(
        [_suspect()], run, [base], {}, CPU, measure=never, log=lambda m: None
    )[0]
    assert c.verdict == "unconfirmed" and "recorded no git commit" in c.note


def test_same_clean_commit_measures_the_candidate_tree_against_itself():
    run, base = make_run(commit="a" * 40), make_run(commit="a" * 40)
    run.id, base.id = 2, 1
    seen = {}

    def measure(cfg, cases, compilers, base_tree, cand_tree, plant, workdir, threads=1, undecided=None):
        seen.update(cases=cases, compilers=compilers, same=base_tree == cand_tree, plant=plant)

        def arm(seed: int) -> list[Result]:  # 12 rounds' turns of a quiet host, 2% apart at most
            return [
                Result(
                    "w",
                    c,
                    "h",
                    samples=samples(1e6, seed=seed + i),
                    meta={"rounds": samples(1e6, n=12, noise=0.005, seed=seed + i)},
                )
                for i, c in enumerate(compilers)
            ]

        return arm(0), arm(10), arm(20), arm(30)

    c = sidebyside.confirm_side_by_side(
        [_suspect()], run, [base], {}, CPU, measure=measure, log=lambda m: None
    )[0]
    assert seen == {"cases": ["w"], "compilers": ["kiln", "eager"], "same": True, "plant": None}
    assert c.verdict == "rejected" and c.confirmed is False and c.sbs_ratio == pytest.approx(1.0, abs=0.02)
    run.config["git_dirty"] = (
        True  # uncommitted changes: the commit's own code in a worktree, not "same code"
    )
    assert not sidebyside.plan_for(run, [base], ROOT).same_code


@pytest.mark.parametrize(
    "rc, cmps, failed, text",
    [
        (0, None, False, "nothing compared"),
        (
            1,
            [
                {
                    "workload": "w",
                    "compiler": "kiln",
                    "verdict": "regressed",
                    "confirmed": True,
                    "sbs_ratio": 1.3,
                    "interpreter": True,
                }
            ],
            True,
            "1 regressed (confirmed side by side): w@kiln x1.30 (interpreter",
        ),
        (
            0,
            [{"workload": "w", "compiler": "kiln", "verdict": "rejected", "confirmed": False}],
            False,
            "0 regressed (confirmed side by side), 1 suspect(s) rejected side by side",
        ),
        (2, [], True, "the step failed (exit 2)"),
        (
            1,
            [],
            True,
            "the step failed (exit 1)",
        ),  # exit 1 without a confirmed regression: a failure all the same
    ],
)
def test_verdict_lines(rc, cmps, failed, text):
    line, f = verdict.step_verdict("kernels", None if cmps is None and rc else {"comparisons": cmps}, rc)
    assert f is failed and text in line and line.endswith("-> FAIL" if failed else "-> ok")


def test_verdict_command_exit_follows_the_steps(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"comparisons": []}))
    bad.write_text(
        json.dumps(
            {
                "comparisons": [
                    {
                        "workload": "w",
                        "compiler": "eager",
                        "verdict": "regressed",
                        "confirmed": True,
                        "ratio": 1.5,
                    }
                ]
            }
        )
    )
    ok = _bench("verdict", "--step", "kernels", str(good), "0")
    assert ok.returncode == 0 and ok.stdout.startswith("bench kernels: 0 regressed")
    no = _bench("verdict", "--step", "kernels", str(good), "0", "--step", "models", str(bad), "1")
    assert no.returncode == 1 and no.stdout.splitlines()[1].startswith("bench models: 1 regressed")
    missing = _bench("verdict", "--step", "kernels", str(tmp_path / "none.json"), "137")
    assert missing.returncode == 1 and "no report; the step failed (exit 137)" in missing.stdout


# ------------------------------------------------------------------ atomic artifacts, SIGTERM
KILLED_WRITER = """
import os, signal, sys
import harness.results as r
real = os.replace
def die(src, dst):  # killed after the new contents are written, before they are renamed into place
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = die
from harness.bench.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("verb", ["export", "show"])
def test_a_writer_killed_midway_leaves_the_previous_file(tmp_path, verb):
    from bench_helpers import make_results, medians, store_run

    from harness.bench.stores.store import Store

    db = tmp_path / "b.sqlite"
    with Store(db) as s:
        store_run(s, make_results(medians(), seed=1))
    target = tmp_path / "art" / "run.json"
    target.parent.mkdir()
    target.write_text('{"previous": true}')
    argv = (
        ["export", str(target), "--db", str(db)]
        if verb == "export"
        else ["show", "1", "--db", str(db), "--json", str(target), "--md", str(tmp_path / "art" / "x.md")]
    )
    p = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, *argv],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert json.loads(target.read_text()) == {"previous": True}  # never a partial file under the final name
    assert (
        not (tmp_path / "art" / "x.md").exists() or verb != "show"
    )  # the Markdown, first, was never renamed
    # and without the kill the new file replaces it whole
    ok = subprocess.run(
        [sys.executable, "-m", "harness", "bench", *argv],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "previous" not in json.loads(target.read_text())


def test_sigterm_marks_the_run_aborted_and_keeps_what_was_measured(tmp_path):
    db = tmp_path / "b.sqlite"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "bench",
            "run",
            "--device",
            "cpu",
            "--compilers",
            "eager,kiln",  # kiln through the interpreter: seconds a workload, so the signal finds the run measuring
            "--only",
            "*.fwd.fp32.*",
            "--target-s",
            "0.3",
            "--passes",
            "1",
            "--quiet",
            "--db",
            str(db),
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, n = time.monotonic() + 180, 0
    while time.monotonic() < deadline and n < 2:
        time.sleep(0.5)
        try:
            with sqlite3.connect(db) as con:
                n = con.execute("SELECT count(*) FROM results").fetchone()[0]
        except sqlite3.Error:
            n = 0
    assert n >= 2, "the run stored no result in time"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    with sqlite3.connect(db) as con:
        status, finished = con.execute("SELECT status, finished_at FROM runs").fetchone()
        kept = con.execute("SELECT count(*) FROM results").fetchone()[0]
    assert status == "aborted" and finished and kept >= n
    assert "marked aborted" in err


# ------------------------------------------------------------------ `nox -s ci`: its last lines and exit
class _Quit(Exception):
    pass


class _FakeSession:
    """Enough of nox.Session for the `ci` session: each command's effect is given by `effects`; `bench verdict`
    runs for real."""

    def __init__(self, effects: dict[str, tuple[int, dict | None, str | None]]):
        import nox.virtualenv

        self.posargs: list[str] = []
        self.virtualenv = nox.virtualenv.PassthroughEnv()
        self.effects, self.logged, self.ran = effects, [], []

    def log(self, msg: str) -> None:
        self.logged.append(msg)

    def error(self, msg: str) -> None:
        raise _Quit(msg)

    def run(self, *argv: str, silent: bool = False, success_codes=None, env=None, external=None):
        import nox.command

        self.ran.append(list(argv))
        if "detect" in argv:
            return "native\n" if "--mode" in argv else "cpu\n"
        if argv[3:5] == ("bench", "verdict"):
            p = subprocess.run(argv, capture_output=True, text=True, cwd=os.getcwd(), env=_env(), check=False)
            self.logged.extend(p.stdout.splitlines())
            if p.returncode not in (success_codes or [0]):
                raise nox.command.CommandFailed(f"Returned code {p.returncode}", return_code=p.returncode)
            return True
        key = next((k for k in self.effects if k in argv), None)
        rc, report, path = self.effects.get(key, (0, None, None))
        if report is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(report))
        if rc not in (success_codes or [0]):
            raise nox.command.CommandFailed(f"Returned code {rc}", return_code=rc)
        return True


def _ci(tmp_path, monkeypatch, effects):
    from test_bench_job import _noxfile  # noxfile.py loaded once (loading registers its sessions)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_NO_VENV", "1")
    # the session's own commands (the pre-flight) run `python -m harness` from tmp_path: the checkout on the path,
    # as an installed project is
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    nf = _noxfile()
    s = _FakeSession(effects)
    try:
        nf.ci.func(s) if hasattr(nf.ci, "func") else nf.ci(s)
        return s, None
    except _Quit as e:
        return s, str(e)


def test_the_ci_session_ends_with_the_bench_verdicts_and_fails_on_a_confirmed_regression(
    tmp_path, monkeypatch
):
    last, models = "results/bench/cpu/last.json", "results/bench/cpu/models/report.json"
    regressed = {
        "comparisons": [
            {
                "workload": "w",
                "compiler": "kiln",
                "verdict": "regressed",
                "confirmed": True,
                "sbs_ratio": 1.2,
                "interpreter": True,
            },
            {"workload": "v", "compiler": "eager", "verdict": "rejected", "confirmed": False},
        ]
    }
    s, err = _ci(
        tmp_path, monkeypatch, {"backend": (1, regressed, last), "models": (0, {"comparisons": []}, models)}
    )
    assert err is not None and "bench: FAILED" in err  # the session fails ...
    assert s.ran[-2][3] == "report" and s.ran[-1][3:5] == [
        "bench",
        "verdict",
    ]  # the report ran, then the verdict
    assert s.logged[-2:] == [  # ... after the report, its last lines one per bench step
        (
            "bench kernels: 1 regressed (confirmed side by side): w@kiln x1.20 (interpreter: pipeline check, not "
            "kernel speed), 1 suspect(s) rejected side by side -> FAIL"
        ),
        "bench models: 0 regressed (confirmed side by side), 0 suspect(s) rejected side by side -> ok",
    ]
    # identical code, nothing confirmed: success, and it says so
    quiet = {
        "comparisons": [{"workload": "v", "compiler": "eager", "verdict": "rejected", "confirmed": False}]
    }
    s, err = _ci(
        tmp_path, monkeypatch, {"backend": (0, quiet, last), "models": (0, {"comparisons": []}, models)}
    )
    assert err is None and s.logged[-2].startswith(
        "bench kernels: 0 regressed (confirmed side by side), 1 suspect"
    )
    # a bench step that dies before writing its report (the stale one from before is gone): a failure
    s, err = _ci(
        tmp_path, monkeypatch, {"backend": (137, None, None), "models": (0, {"comparisons": []}, models)}
    )
    assert err is not None and s.logged[-2] == "bench kernels: no report; the step failed (exit 137) -> FAIL"


def test_verdicts_are_stored_per_run_and_replaced_whole(store):
    from bench_helpers import make_results, medians, store_run

    from harness.bench.core.records import Verdict
    from harness.bench.judge.compare import with_baseline

    a = store_run(store, make_results(medians(), seed=1))
    assert store.verdicts(a.id) is None  # stored none: readers recompute, labelled so
    c = Comparison(
        "w",
        "kiln",
        "rejected",
        ratio=1.4,
        p=1e-5,
        base_ns=1e6,
        new_ns=1.4e6,
        confirmed=False,
        suspect="regressed",
        sbs_ratio=1.01,
        sbs_p=0.4,
        interpreter=True,
    )
    store.save_verdicts(
        a.id, with_baseline([c, Comparison("v", "eager", "unchanged", ratio=1.0)], "run:1 (commit x)")
    )
    got = store.verdicts(a.id)
    assert [(v.workload, v.verdict, v.confirmed, v.baseline) for v in got] == [
        ("w", "rejected", False, "run:1 (commit x)"),
        ("v", "unchanged", None, "run:1 (commit x)"),
    ]
    assert (
        got[0] == c and got[0].verdict is Verdict.REJECTED
    )  # the run's comparison, side-by-side numbers included
    store.save_verdicts(
        a.id, [Comparison("w", "kiln", Verdict.REGRESSED, 1.3, 1e-4, baseline="run:1", confirmed=True)]
    )
    assert [v.verdict for v in store.verdicts(a.id)] == ["regressed"]  # replaced, not added
    assert Comparison.from_dict(got[0].as_dict()) == got[0]
