"""The paired per-round statistics (harness/bench/judge/paired.py) and the side-by-side verdicts built on them:
exact signed-rank test, Hodges-Lehmann interval, noise floor, `inconclusive`; a synthetic host whose load
comes in bursts that span several turns (what a busy loop and other jobs make), on which the statistic used
before the round became the unit calls identical code regressed and the paired one never does."""

from __future__ import annotations

import math
import random

import pytest
from bench_helpers import make_run

from harness.bench.core.records import Result, Verdict
from harness.bench.judge import verdict
from harness.bench.judge.compare import CompareConfig, Comparison
from harness.bench.judge.paired import MIN_ROUNDS, hodges_lehmann, judge_side_by_side, paired, signed_rank
from harness.bench.kernels import sidebyside
from harness.bench.kernels.noise_check import old_verdict, rates

CPU = CompareConfig().for_device("cpu")
THR, ALPHA = CPU.threshold or 0.1, CPU.alpha


# ------------------------------------------------------------------ the statistics
@pytest.mark.parametrize(
    "d",
    [
        [1, 2, 3, 4, 5, 6],
        [-1, 2, 3, -4, 5, 6],
        [0.3, -0.1, 0.25, 0.4, -0.05, 0.2, 0.15, 0.5],
        [-2.0, -1.0, 0.5, -3.0, -4.0, 1.5, -0.7],
    ],
)
def test_signed_rank_is_the_exact_wilcoxon_test(d):
    scipy_stats = pytest.importorskip("scipy.stats")
    got = signed_rank(d)
    assert got.p_greater == pytest.approx(
        scipy_stats.wilcoxon(d, alternative="greater", method="exact").pvalue
    )
    assert got.p_less == pytest.approx(scipy_stats.wilcoxon(d, alternative="less", method="exact").pvalue)
    assert got.n == len(d)


def test_signed_rank_extremes_and_ties():
    assert signed_rank([0.1] * 6).p_greater == pytest.approx(1 / 64)  # all 6 positive: 1 of 2^6 sign patterns
    assert signed_rank([]).p_greater == 1.0 and signed_rank([0.0, 0.0]).n == 0  # zeros carry no sign
    tied = signed_rank([1, 1, -1, 2, 2, 2])  # average ranks, exact over the ranks observed
    assert 0 < tied.p_greater < 0.2 and tied.p_less > 0.8


def test_hodges_lehmann_interval_uses_the_signed_rank_critical_value():
    d = [float(x) for x in range(1, 13)]  # 12 values: 78 Walsh averages; the 99% table value is 7
    est, lo, hi = hodges_lehmann(d, 0.99)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(12) for j in range(i, 12))
    assert est == pytest.approx(6.5) and lo == walsh[7] and hi == walsh[-8]
    assert hodges_lehmann(d[:5], 0.99)[1] == -math.inf  # 5 values cannot give a 99% interval


def test_paired_needs_enough_rounds_and_skips_bad_turns():
    assert paired([1.0] * (MIN_ROUNDS - 1), [1.1] * (MIN_ROUNDS - 1)) is None
    p = paired([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [1.2, 5.0, 1.21, 1.19, 1.2, 1.22, 1.18, 1.2])
    assert (
        p is not None and p.n == 7 and p.ratio == pytest.approx(1.2, abs=0.01)
    )  # the round with a 0 is dropped


# ------------------------------------------------------------------ a synthetic host
def judge4(turns: list[list[float]]):
    """`judge_side_by_side` of the four arms' turns at the CPU threshold and alpha."""
    a, a2, c, c2 = turns
    return judge_side_by_side(a, a2, c, THR, ALPHA, c2)


def host(
    seed: int,
    rounds: int = 12,
    slow: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0),
    load: float = 0.3,
    jitter: float = 0.05,
    persistence: float = 0.8,
) -> list[list[float]]:
    """Turn times of the arms (baseline, A/A, candidate, B/B: one per `slow` factor) taken in
    `sidebyside.arm_orders`: the host's load is a
    log-normal AR(1) process over the sequence of turns (a burst spans several turns, so neighbouring turns,
    of one round and of the next, share it), plus independent jitter; `slow` is each arm's true factor."""
    rng, level = random.Random(seed), 0.0
    turns: list[list[float]] = [[] for _ in slow]
    orders = sidebyside.arm_orders(len(slow))
    for r in range(rounds):
        for k in orders[r % len(orders)]:
            level = persistence * level + rng.gauss(0, load * math.sqrt(1 - persistence**2))
            turns[k].append(1e6 * slow[k] * math.exp(level + rng.gauss(0, jitter)))
    return turns


def _result(rounds: list[float], planted: float = 0.0) -> Result:
    return Result("w", "kiln", "h", samples=list(rounds), meta={"rounds": list(rounds)}, planted=planted)


def test_identical_code_on_a_bursty_host_the_earlier_statistic_invents_regressions_the_paired_one_does_not():
    flagged = (Verdict.REGRESSED, Verdict.IMPROVED)
    old = new = inconclusive = 0
    for seed in range(200):
        a, a2, c, c2 = (_result(x) for x in host(seed))
        old += old_verdict(a, c, CPU) in flagged
        j = sidebyside.judge_rounds(a, a2, c, c2, cfg=CPU)
        new += j.verdict in flagged
        inconclusive += j.verdict is Verdict.INCONCLUSIVE
    assert old >= 8  # at alpha 0.01 a sound test flags about 2 of 200; the earlier one flags 4% or more
    assert new == 0
    assert inconclusive > 150  # the host is too noisy to tell a 10% change: said so, not passed


def test_a_quiet_host_decides_identical_code_unchanged_and_a_planted_20_percent_regressed():
    for seed in range(20):
        same = judge4(host(seed, rounds=24, load=0.03, jitter=0.02))
        assert same.verdict is Verdict.UNCHANGED and same.noise is not None and same.noise < THR, same
        slow = judge4(host(100 + seed, rounds=24, load=0.03, jitter=0.02, slow=(1, 1, 1.2, 1.2)))
        assert slow.verdict is Verdict.REGRESSED and slow.ratio == pytest.approx(1.2, abs=0.04), slow
        fast = judge4(host(200 + seed, rounds=24, load=0.03, jitter=0.02, slow=(1, 1, 0.8, 0.8)))
        assert fast.verdict is Verdict.IMPROVED, fast


def test_a_noisy_host_gives_inconclusive_with_its_noise_floor_never_a_pass():
    j = judge4(host(7, load=0.4))
    assert j.verdict is Verdict.INCONCLUSIVE and j.noise is not None and j.noise > THR
    assert f"noise floor {j.noise:.0%}" in j.why


def test_a_change_within_the_noise_floor_or_an_unequal_aa_pair_is_inconclusive():
    # the A/A process itself runs 30% slower in every round: identical code differs here, so a 30% slower
    # candidate proves nothing
    a, a2, c = host(3, rounds=24, load=0.02, jitter=0.02, slow=(1.0, 1.3, 1.3))
    j = judge_side_by_side(a, a2, c, THR, ALPHA)  # three arms (no B/B pair) are still judged
    assert j.verdict is Verdict.INCONCLUSIVE and j.aa_ratio == pytest.approx(1.3, abs=0.03)
    # too few rounds to decide anything
    short = judge_side_by_side(a[:4], a2[:4], c[:4], THR, ALPHA)
    assert short.verdict is Verdict.INCONCLUSIVE and short.ratio is None and "4 usable round(s)" in short.why


# ------------------------------------------------------------------ through confirm_side_by_side and the job
def _confirm(turns: list[list[float]], planted: float = 0.0) -> Comparison:
    run, base = make_run(commit="a" * 40), make_run(commit="a" * 40)
    run.id, base.id = 2, 1

    def measure(cfg, cases, compilers, base_tree, cand_tree, plant, workdir, threads=1, undecided=None):
        assert undecided is not None and base_tree == cand_tree
        return tuple([_result(t, planted if k >= 2 else 0.0)] for k, t in enumerate(turns))

    suspect = Comparison("w", "kiln", Verdict.REGRESSED, ratio=1.3, p=1e-6, base_ns=1e6, new_ns=1.3e6)
    return sidebyside.confirm_side_by_side(
        [suspect], run, [base], {}, CPU, measure=measure, log=lambda m: None
    )[0]


def test_one_slower_candidate_process_is_a_process_effect_not_a_regression():
    """The field's case: in identical code one process ran 18% slower in every round than two others that agreed
    within 1.3%. With three arms that is a confirmed regression; the B/B pair (the candidate's code in a second
    process, as fast as the baseline's) makes it inconclusive, with both identical-code ratios in the reason."""
    turns = host(5, rounds=24, load=0.02, jitter=0.02, slow=(1.0, 1.0, 1.18, 1.0))
    three = judge_side_by_side(*turns[:3], THR, ALPHA)
    assert three.verdict is Verdict.REGRESSED  # what the three-arm judgement concluded in the field
    j = judge4(turns)
    assert j.verdict is Verdict.INCONCLUSIVE and j.bb_ratio == pytest.approx(1 / 1.18, abs=0.03), j
    assert f"x{j.aa_ratio:.3f} and x{j.bb_ratio:.3f}" in j.why
    assert j.noise is not None and j.noise > 0.15  # the B/B pair's spread is the noise floor
    # a slower build (both candidate processes) with one baseline process a little off stays regressed
    build = judge4(host(6, rounds=24, load=0.02, jitter=0.02, slow=(1.0, 1.03, 1.25, 1.25)))
    assert build.verdict is Verdict.REGRESSED and build.bb_ratio == pytest.approx(1.0, abs=0.03), build


def test_confirmation_on_a_noisy_host_is_inconclusive_and_never_fails_the_job():
    c = _confirm(host(7, load=0.4))
    assert c.verdict is Verdict.INCONCLUSIVE and c.confirmed is None and c.sbs_noise and c.sbs_noise > THR
    assert "inconclusive side by side" in c.note and "noise floor" in c.note
    line, failed = verdict.step_verdict("kernels", {"comparisons": [c.as_dict()]}, 0)
    assert not failed and "1 inconclusive (host too noisy to decide" in line and line.endswith("-> ok"), line


def test_confirmation_of_a_planted_slowdown_on_a_quiet_host_is_a_confirmed_regression():
    c = _confirm(host(11, rounds=24, load=0.03, jitter=0.02, slow=(1, 1, 1.2, 1.2)), planted=0.2)
    assert (
        c.verdict is Verdict.REGRESSED and c.confirmed is True and c.sbs_ratio == pytest.approx(1.2, abs=0.04)
    )
    line, failed = verdict.step_verdict("kernels", {"comparisons": [c.as_dict()]}, 1)
    assert failed and "1 regressed (confirmed side by side): w@kiln x1." in line


def test_undecided_asks_for_more_rounds_only_while_inconclusive():
    undecided = sidebyside.undecided_at(CPU)
    assert undecided(*host(7, load=0.4))
    assert not undecided(*host(7, rounds=24, load=0.03, jitter=0.02))


def test_noise_check_rates_count_false_and_true_positives():
    checks = [
        {
            "plant": None,
            "rows": [
                {"verdict": "regressed", "old": "regressed"},
                {"verdict": "inconclusive", "old": "unchanged"},
            ],
        },
        {
            "plant": "*@kiln=0.2",
            "rows": [
                {"verdict": "regressed", "old": "regressed", "planted": True},
                {"verdict": "inconclusive", "old": "regressed", "planted": True},
            ],
        },
    ]
    r = rates(checks)
    assert r["false_positive"] == "1/2" and r["aa_inconclusive"] == "1/2" and r["false_positive_old"] == "1/2"
    assert (
        r["true_positive"] == "1/2" and r["true_positive_old"] == "2/2" and r["planted_inconclusive"] == "1/2"
    )


def test_a_cpu_plant_adds_its_fraction_of_the_calls_own_cpu_time():
    """The CPU timer's plant is work on the thread's CPU clock, a fraction of each call's own CPU time: on a
    loaded host it is slowed as much as the call (a wall-clock wait would shrink to nothing beside it)."""
    import time

    import torch

    from harness.bench.kernels.measure import Timer

    seen: list[int] = []

    def work() -> None:
        t0 = time.thread_time_ns()
        end = t0 + 2_000_000
        while time.thread_time_ns() < end:
            pass
        seen.append(time.thread_time_ns() - t0)

    slow = Timer(torch.device("cpu")).planted(work, 0.0, 0.5)
    t0 = time.thread_time_ns()
    slow()
    total = time.thread_time_ns() - t0
    assert total >= 1.5 * seen[0]  # by construction: the spin ends only after half the call's CPU time more


def test_only_workloads_left_inconclusive_get_more_rounds(tmp_path, monkeypatch):
    rng = random.Random(5)

    class FakeWorker:  # the protocol of sbs_worker.py, answered at once: "quiet" steady, "noisy" anything
        def __init__(self, name, tree, hello, log, timeout_s):
            self.name, self.reps, self.est = name, {}, {}

        def ask(self, obj):
            if obj["op"] == "finish":
                return {
                    "results": [Result(c, "kiln", "h", samples=[1.0]).as_dict() for c in ("quiet", "noisy")]
                }
            t = 1e6 * (1 + rng.gauss(0, 0.002) if obj["case"] == "quiet" else math.exp(rng.gauss(0, 0.5)))
            return {"block": {"kiln": t}}

        def close(self):
            pass

    monkeypatch.setattr(sidebyside, "Worker", FakeWorker)
    base, aa, cand, bb = sidebyside.measure_pair(
        {},
        ["quiet", "noisy"],
        ["kiln"],
        tmp_path,
        tmp_path,
        None,
        tmp_path,
        undecided=sidebyside.undecided_at(CPU),
    )
    rounds = {r.workload: len(r.meta.rounds) for r in cand}
    assert rounds == {"quiet": sidebyside.ROUNDS, "noisy": sidebyside.MAX_ROUNDS}
    for arm in (base, aa, bb):
        assert [len(r.meta.rounds) for r in arm] == list(rounds.values())
