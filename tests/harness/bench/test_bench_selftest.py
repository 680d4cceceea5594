"""The bench self-test's side-by-side confirmation (harness/bench/kernels/selftest.py), without timing anything: the
re-measure is a fake returning chosen samples."""

from __future__ import annotations

from bench_helpers import make_results, store_run

from harness.bench.judge.compare import CompareConfig, Comparison
from harness.bench.kernels import selftest
from harness.bench.kernels.execute import BenchConfig
from harness.bench.stores.store import Store
from harness.settings import Plant

W1, W2 = "softmax.fwd.fp32.64x128", "row_sum.fwd.fp32.64x128"


def test_only_verdicts_that_hold_side_by_side_again_stay(tmp_path, monkeypatch):
    again = {  # the re-measure: W1 under inductor is 1.3x slower in C again; W2's eager blip in B is gone
        "A": {(W1, "inductor"): 100.0, (W2, "eager"): 50.0},
        "B": {(W1, "inductor"): 100.0, (W2, "eager"): 50.5},
        "C": {(W1, "inductor"): 130.0, (W2, "eager"): 50.0},
    }
    asked = []

    def fake_measure_arms(self, cases, compilers, arms, done):
        asked.append(([c.name for c in cases], sorted(arms), arms["C"].spec(), arms["A"]))
        out = {arm: make_results(m, seed=i) for i, (arm, m) in enumerate(again.items())}
        for i, case in enumerate(cases):
            done(i, case, {arm: [r for r in rs if r.workload == case.name] for arm, rs in out.items()})
        return out

    monkeypatch.setattr(selftest.Executor, "measure_arms", fake_measure_arms)
    b = [Comparison(W2, "eager", "regressed", 1.3, 1e-5), Comparison(W1, "inductor", "unchanged", 1.0, 0.5)]
    c = [Comparison(W1, "inductor", "regressed", 1.25, 1e-9)]
    plant = Plant(W1, "inductor", 0.2)
    with Store(tmp_path / "s.sqlite") as store:
        runs = {arm: store_run(store, []) for arm in "ABC"}
        selftest.confirm_side_by_side(
            BenchConfig(compilers=["inductor", "eager"]),
            store,
            plant,
            runs,
            {"B": b, "C": c},
            CompareConfig().for_device("cpu"),
        )
        stored = [(r.workload, r.compiler, r.phase) for r in store.results(runs["B"].id, phase=None)]
    ((names, arms, planted, unplanted),) = asked  # one re-measure of the flagged workloads, every arm again
    assert (
        sorted(names) == sorted([W1, W2])
        and arms == ["A", "B", "C"]
        and (planted, unplanted) == (plant.spec(), None)
    )
    assert (b[0].verdict, b[0].confirmed) == ("unchanged", False) and "not confirmed side by side" in b[
        0
    ].note
    assert (b[1].verdict, b[1].confirmed) == ("unchanged", None)  # never flagged, never re-measured
    assert (c[0].verdict, c[0].confirmed) == ("regressed", True)
    assert sorted(stored) == [(W2, "eager", "confirm"), (W1, "inductor", "confirm")]


def test_the_plant_goes_to_inductor_else_another_compiler_else_eager():
    assert selftest.plant_compiler(["kiln", "inductor", "eager"]) == "inductor"
    assert selftest.plant_compiler(["kiln", "eager"]) == "kiln"
    assert selftest.plant_compiler(["eager"]) == "eager"
