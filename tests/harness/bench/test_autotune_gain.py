"""harness/bench/models/autotune_gain.py: autotuning's gain judged on the two arms' step samples side by side (a rank
test plus a smallest effect), and its section of the model report."""

from __future__ import annotations

import random

import pytest

from harness.bench.core.records import Result
from harness.bench.models import autotune_gain as ag
from harness.bench.models import report as model_report


def _samples(ms: float, n: int = 40, noise: float = 0.02, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [ms * 1e6 * (1 + rng.uniform(-noise, noise)) for _ in range(n)]


def _result(
    case: str, compiler: str, samples: list[float], kernel_ms: float | None = None, ok: bool = True
) -> Result:
    meta = {"accuracy": {"pass": ok}}
    if kernel_ms is not None:
        meta["kernel"] = {"kernel_ms": kernel_ms, "launches": 10.0}
    return Result(case, compiler, "h", samples=samples, meta=meta)


def _pair(case: str, ms: float, tuned_ms: float, **kw) -> list[Result]:
    return [
        _result(case, "kiln", _samples(ms, seed=1), kw.get("kernel")),
        _result(
            case, "kiln-autotune", _samples(tuned_ms, seed=2), kw.get("tuned_kernel"), kw.get("ok", True)
        ),
    ]


@pytest.mark.parametrize(
    "ms,tuned,verdict",
    [
        (10.0, 9.0, "faster"),  # 11% faster, far beyond the samples' 2% noise
        (10.0, 11.0, "slower"),
        (10.0, 10.0, "same"),  # one distribution: no difference to find
        (10.0, 10.05, "same"),  # a shift under MIN_EFFECT is no verdict even where the test could see it
    ],
)
def test_verdicts_need_the_rank_test_and_the_smallest_effect(ms, tuned, verdict):
    (g,) = ag.gains(_pair("model.m.infer.bf16", ms, tuned))
    assert g.verdict == verdict
    assert g.step_gain == pytest.approx(ms / tuned, rel=0.01)
    assert (g.p < ag.ALPHA) == (verdict != "same" or tuned == 10.05)


def test_a_noisy_small_loss_is_same_not_slower():
    heur = _result("c", "kiln", _samples(10.0, n=8, noise=0.3, seed=3))
    tuned = _result("c", "kiln-autotune", _samples(10.3, n=8, noise=0.3, seed=4))
    assert ag.gain(heur, tuned).verdict == "same"


def test_cases_without_both_arms_or_a_passing_check_are_left_out():
    results = (
        _pair("a", 10.0, 9.0)
        + [_result("b", "kiln", _samples(5.0))]
        + _pair("c", 10.0, 9.0, ok=False)
        + _pair("d", 10.0, 9.5)
    )
    assert [g.case for g in ag.gains(results)] == ["a", "d"]


def test_kernel_gain_is_read_from_the_profiled_kernel_ms():
    (g,) = ag.gains(_pair("a", 10.0, 10.0, kernel=8.0, tuned_kernel=7.5))
    assert g.kernel_gain == pytest.approx(8.0 / 7.5)
    (g,) = ag.gains(_pair("a", 10.0, 10.0))
    assert g.kernel_gain is None and g.as_dict()["kernel_gain"] is None


def test_report_section_counts_the_goal_and_names_the_slower_cases():
    results = _pair("a", 10.0, 9.0, kernel=5.0, tuned_kernel=4.0) + _pair("b", 10.0, 11.0)
    lines = ag.report_lines(results)
    text = "\n".join(lines)
    assert lines[0].startswith("### Autotuning's gain")
    assert "\n| a | " in text and "| faster |" in text and "| slower |" in text
    assert "goal autotuned step >= heuristic (side by side): 1/2 cases; slower on b" in text
    assert "kernel gain 1.250 over 1" in text and "- autotuning: geomean step gain" in text
    assert ag.summary_lines([]) == []
    assert ag.report_lines(_pair("a", 10.0, 9.0)[:1]) == []


def test_the_model_report_carries_the_section_and_the_json_the_gains():
    results = _pair("model.m.infer.bf16", 10.0, 9.0)
    md = model_report.markdown_report("gpu", [], results, [])
    assert "### Autotuning's gain" in md
    js = model_report.json_report("gpu", [], results, [])
    assert [g["verdict"] for g in js["autotune_gain"]] == ["faster"]
    assert "### Autotuning's gain" not in model_report.markdown_report("gpu", [], results[:1], [])
