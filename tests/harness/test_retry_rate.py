"""The retry policy's false-failure rate (harness/suites/retries.py): a flake failing with probability p is called failing
p ** attempts of the times it fails the suite run. Trials of a planted 30% flake (seeded draws per run) through the
real rerun path (`runner.retry_failed`, one pytest process per rerun) must each give the call their draws predict;
the draws' rate over many trials matches the formula; and the matrix's default keeps a 30% flake under 1%.
(tests/harness/planted/retry_rate.py measures the rate itself through the real path; see its docstring.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.suites import retries

ROOT = Path(__file__).resolve().parents[2]


def _rate_module():
    spec = importlib.util.spec_from_file_location(
        "retry_rate", ROOT / "tests" / "harness" / "planted" / "retry_rate.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("retry_rate", module)  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rate():
    return _rate_module()


def test_trials_through_the_real_retry_path_give_the_call_their_draws_predict(rate, tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_NATIVE", raising=False)
    monkeypatch.setenv("KILN_ROOT", str(tmp_path))  # measure() points it at its project; restored after
    # three trials around the first one whose draws call it failing: both calls go through the real path
    chosen = [t for t in range(12) if rate.predicted_failing(t, 0.3, 2)]
    assert chosen, "no failing trial among the first 12: pick others"
    first = chosen[0]
    got = rate.measure(0.3, 2, trials=3, first=first - 1, root=tmp_path / "proj")
    assert got.mismatches == [] and got.trials == 3
    assert got.failing == sum(rate.predicted_failing(t, 0.3, 2) for t in range(first - 1, first + 2)) >= 1
    assert got.reruns >= 3 + 1  # every trial reruns at least once; the failing one twice


def test_the_draws_follow_the_formula():
    # the same seeded draws the planted test makes, 40000 trials: the rate is p ** attempts within 4 sigma
    model = _rate_module()
    for attempts in (1, 2, 4):
        n = 40_000
        hits = sum(model.predicted_failing(t, 0.3, attempts) for t in range(n))
        want = retries.called_failing_rate(0.3, attempts)
        sigma = (want * (1 - want) / n) ** 0.5
        assert abs(hits / n - want) < 4 * sigma, (attempts, hits / n, want)


def test_the_default_policy_calls_a_30_percent_flake_failing_under_1_percent():
    m = matrix.load(ROOT / "ci" / "matrix.json")
    for name in m.backends:
        attempts = m.retries_for(m.backend(name)).attempts
        assert retries.called_failing_rate(0.3, attempts) < 0.01, (name, attempts)
    assert retries.called_failing_rate(0.3, matrix.DEFAULT_RETRIES.attempts) < 0.01
    assert retries.called_failing_rate(0.3, 2) == pytest.approx(0.09)  # the old default: 9%
    assert json.loads((ROOT / "ci" / "matrix.json").read_text())["retries"]["attempts"] == 4


@pytest.mark.parametrize(
    "outcomes,status",
    [
        (["failed", "passed"], retries.FLAKY),
        (["failed", "failed", "failed", "passed"], retries.FLAKY),
        (["passed", "failed"], retries.FLAKY),  # a pass in any attempt, before or after the failure
        (["error", "xfailed"], retries.FLAKY),
        (["failed", "failed", "failed", "failed", "failed"], retries.FAILING),
        (["failed", "skipped"], retries.FAILING),  # a skip is no pass
    ],
)
def test_fails_then_passes_in_any_attempt_is_flaky(outcomes, status):
    assert retries.classify(outcomes) == status
