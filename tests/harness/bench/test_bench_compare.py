"""Regression detection on synthetic samples: threshold AND Mann-Whitney, drift, confirmation, verdicts."""

from __future__ import annotations

import pytest
from bench_helpers import WORKLOADS, make_results, make_run, medians, samples, store_run

from harness.bench.judge.compare import (
    Baseline,
    CompareConfig,
    compare,
    confirm,
    counts,
    judge,
    load_baseline,
    resolve_baseline,
)
from harness.exc import BaselineError

CPU = CompareConfig().for_device("cpu")
GPU = CompareConfig().for_device("cuda")


def _base(results):
    return Baseline.of([make_run()], [results])


def test_device_defaults():
    assert (CPU.threshold, CPU.normalize_drift) == (0.10, True)
    assert (GPU.threshold, GPU.normalize_drift) == (0.05, False)
    assert CompareConfig(threshold=0.2).for_device("cuda").threshold == 0.2


def test_judge_needs_threshold_and_significance():
    base = samples(100.0, seed=1)
    assert judge(samples(120.0, seed=2), base, GPU)[0] == "regressed"
    assert judge(samples(80.0, seed=2), base, GPU)[0] == "improved"
    # significant but below the threshold: unchanged
    verdict, ratio, p = judge(samples(103.0, seed=2), base, GPU)
    assert verdict == "unchanged" and 1.0 < ratio < 1.05
    # above the threshold but not significant (few, very noisy samples): unchanged
    noisy_new = [50.0, 200.0, 110.0]
    noisy_base = [60.0, 190.0, 100.0]
    verdict, ratio, p = judge(noisy_new, noisy_base, GPU)
    assert ratio > 1.05 and p >= GPU.alpha and verdict == "unchanged"


def test_identical_runs_flag_nothing():
    a, b = make_results(medians(), seed=1), make_results(medians(), seed=2)
    cmps = compare(b, _base(a), CPU)
    assert counts(cmps)["unchanged"] == 2 * len(WORKLOADS)
    assert not [c for c in cmps if c.verdict != "unchanged"]


def test_run_against_itself_flags_nothing():
    a = make_results(medians(), seed=1)
    cmps = compare(a, _base(a), GPU)
    assert all(c.verdict == "unchanged" and c.ratio == 1.0 for c in cmps)


def test_planted_20pct_slowdown_is_flagged_alone():
    a = make_results(medians(), seed=1)
    b = make_results(medians({("w05", "inductor"): 1.2}), seed=2)
    for cfg in (CPU, GPU):
        cmps = compare(b, _base(a), cfg)
        flagged = [(c.workload, c.compiler) for c in cmps if c.verdict != "unchanged"]
        assert flagged == [("w05", "inductor")]
        hit = next(c for c in cmps if c.workload == "w05" and c.compiler == "inductor")
        assert hit.verdict == "regressed" and hit.ratio == pytest.approx(1.2, rel=0.03) and hit.p < 1e-6


def test_machine_drift_is_divided_out_on_cpu_but_not_gpu():
    a = make_results(medians(), seed=1)
    b = make_results({k: v * 1.12 for k, v in medians().items()}, seed=2)  # everything 12% slower
    assert counts(compare(b, _base(a), CPU))["regressed"] == 0
    assert counts(compare(b, _base(a), GPU))["regressed"] == 2 * len(WORKLOADS)
    # one compiler slower everywhere is still a regression with drift normalization (drift comes from eager)
    c = make_results(medians({(w, "inductor"): 1.2 for w in WORKLOADS}), seed=3)
    assert counts(compare(c, _base(a), CPU))["regressed"] == len(WORKLOADS)


def test_new_missing_and_not_comparable():
    a = make_results(
        {("w1", "eager"): 100.0, ("w2", "eager"): 100.0, ("w3", "eager"): 100.0, ("w4", "eager"): 100.0}
    )
    b = make_results(
        {("w1", "eager"): 100.0, ("w3", "eager"): 100.0, ("w4", "eager"): 100.0, ("w5", "eager"): 100.0},
        seed=2,
        hashes={"w3": "changed"},
    )
    b[2].status, b[2].error, b[2].samples = "error", "BackendCompilerFailed: boom", []
    got = {c.workload: c for c in compare(b, _base(a), GPU)}
    assert got["w1"].verdict == "unchanged"
    assert got["w3"].verdict == "not comparable" and "source hash" in got["w3"].note
    assert got["w4"].verdict == "not comparable" and "failed in new run" in got["w4"].note
    assert got["w5"].verdict == "new"
    assert got["w2"].verdict == "missing"


def test_other_device_or_timer_not_comparable():
    a = make_results({("w1", "eager"): 100.0})
    b = make_results({("w1", "eager"): 100.0}, seed=2)
    other = make_run(device="cuda")
    assert compare(b, _base(a), GPU, new_run=other)[0].verdict == "not comparable"
    b[0].timer = "graph"
    assert "timer" in compare(b, _base(a), GPU)[0].note


def _remeasure_with(fresh_medians, calls):
    def remeasure(workload, compilers, refs):
        calls.append((workload, tuple(compilers), tuple(refs)))
        keys = [(workload, c) for c in compilers] + [(workload, "eager")] + [(r, "eager") for r in refs]
        return {k: samples(fresh_medians[k], seed=hash(k) % 1000) for k in keys}

    return remeasure


def test_confirm_keeps_a_real_regression():
    a = make_results(medians(), seed=1)
    slow = medians({("w03", "inductor"): 1.25})
    b = make_results(slow, seed=2)
    calls: list = []
    cmps = confirm(compare(b, _base(a), CPU), b, _base(a), _remeasure_with(slow, calls), CPU)
    hit = next(c for c in cmps if (c.workload, c.compiler) == ("w03", "inductor"))
    assert hit.verdict == "regressed" and hit.confirmed is True
    assert calls == [("w03", ("inductor",), ())]


def test_confirm_drops_a_transient_slowdown():
    a = make_results(medians(), seed=1)
    b = make_results(medians({("w07", "eager"): 1.3}), seed=2)
    calls: list = []
    cmps = compare(b, _base(a), CPU)
    assert next(c for c in cmps if (c.workload, c.compiler) == ("w07", "eager")).verdict == "regressed"
    cmps = confirm(cmps, b, _base(a), _remeasure_with(medians(), calls), CPU)
    hit = next(c for c in cmps if (c.workload, c.compiler) == ("w07", "eager"))
    assert hit.verdict == "unchanged" and hit.confirmed is False and "not confirmed" in hit.note
    # eager's local clock: three other eager workloads near it in time, re-measured around it
    assert calls[0][0] == "w07" and len(calls[0][2]) == 3 and "w07" not in calls[0][2]


def test_confirm_blames_the_machine_when_the_local_clock_slowed_too():
    a = make_results(medians(), seed=1)
    b = make_results(medians({("w02", "inductor"): 1.3}), seed=2)
    # during the re-measure the machine is 30% slower for everything
    slow_machine = {k: v * 1.3 for k, v in medians().items()}
    cmps = confirm(compare(b, _base(a), GPU), b, _base(a), _remeasure_with(slow_machine, []), GPU)
    hit = next(c for c in cmps if (c.workload, c.compiler) == ("w02", "inductor"))
    assert hit.verdict == "unchanged" and "machine drift" in hit.note
    assert hit.norm_ratio == pytest.approx(1.0, abs=0.03)


def test_window_baseline_pools_runs_and_skips_incomplete(store):
    r1 = store_run(store, make_results(medians(), seed=1), ref="main")
    r2 = store_run(store, make_results(medians(), seed=2), ref="feature")
    bad = store_run(store, make_results(medians(), seed=3), complete=False)
    new = make_run()
    assert [r.id for r in resolve_baseline(store, "window:5", new)] == [r2.id, r1.id]
    assert [r.id for r in resolve_baseline(store, "latest", new)] == [r2.id]
    assert [r.id for r in resolve_baseline(store, "ref:main", new)] == [r1.id]
    assert [r.id for r in resolve_baseline(store, str(r1.id), new)] == [r1.id]
    base = load_baseline(store, resolve_baseline(store, "window:2", new))
    assert len(base.samples(("w00", "eager"), "h-w00")) == 240
    with pytest.raises(BaselineError, match="incomplete"):
        resolve_baseline(store, f"run:{bad.id}", new)
    for spec in ("ref:nope", "window:0", "window:x", "run:x", "bogus"):
        with pytest.raises(BaselineError):
            resolve_baseline(store, spec, new)
    # another profile (or device) is never a baseline
    with pytest.raises(BaselineError):
        resolve_baseline(store, "latest", make_run(profile="gpu"))
