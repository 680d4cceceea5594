"""Stats (median/IQR after 1.5-IQR outlier removal) and the Mann-Whitney U test against known values."""

from __future__ import annotations

import math

import pytest

from harness.bench.core.stats import Stats, drop_outliers, geomean, mann_whitney_u, quantile

# (x, y, alternative, U of x, p): values from
# scipy.stats.mannwhitneyu(x, y, alternative=..., method="asymptotic")
KNOWN = [
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], "two-sided", 0.0, 0.012185780355344813),
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], "less", 0.0, 0.006092890177672406),
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], "greater", 0.0, 0.9966923245172357),
    ([1, 2, 2, 3, 3, 3, 4], [2, 3, 3, 4, 5, 5, 6, 7], "two-sided", 10.5, 0.04393680322463132),
    ([1, 2, 2, 3, 3, 3, 4], [2, 3, 3, 4, 5, 5, 6, 7], "less", 10.5, 0.02196840161231566),
    ([19, 22, 16, 29, 24], [20, 11, 17, 12], "greater", 17.0, 0.055673443266570206),
    ([19, 22, 16, 29, 24], [20, 11, 17, 12], "two-sided", 17.0, 0.11134688653314041),
    ([3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3, 2], "two-sided", 22.5, 0.20702196820234253),
    ([3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3, 2], "less", 22.5, 0.10351098410117127),
]


@pytest.mark.parametrize("x,y,alt,u,p", KNOWN)
def test_mann_whitney_matches_known_values(x, y, alt, u, p):
    r = mann_whitney_u(x, y, alt)
    assert r.u == u
    assert r.p == pytest.approx(p, rel=1e-9)


def test_mann_whitney_all_tied_is_not_significant():
    assert mann_whitney_u([1.0] * 5, [1.0] * 4, "greater").p == 1.0


def test_mann_whitney_shift_detected_and_symmetric():
    base = [100.0 + (i * 37 % 11) for i in range(60)]
    slow = [x * 1.2 for x in base]
    assert mann_whitney_u(slow, base, "greater").p < 1e-10
    assert mann_whitney_u(slow, base, "less").p > 0.99
    assert mann_whitney_u(base, base, "two-sided").p == pytest.approx(1.0)
    a, b = mann_whitney_u(slow, base), mann_whitney_u(base, slow)
    assert a.p == pytest.approx(b.p) and a.u + b.u == len(base) * len(slow)


def test_mann_whitney_rejects_empty_and_bad_alternative():
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError):
        mann_whitney_u([1.0], [2.0], "sideways")  # type: ignore[arg-type]


def test_quantile_is_linear_interpolation():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert quantile(xs, 0.5) == 2.5
    assert quantile(xs, 0.25) == 1.75
    assert quantile([7.0], 0.9) == 7.0


def test_outliers_beyond_1_5_iqr_are_dropped():
    xs = [10.0, 11.0, 10.5, 10.2, 10.8, 10.1, 50.0, 0.5]
    kept = drop_outliers(xs)
    assert 50.0 not in kept and 0.5 not in kept and len(kept) == 6


def test_stats_summary():
    s = Stats.of([10.0, 12.0, 11.0, 13.0, 1000.0])
    assert s.n == 5 and s.kept == 4
    assert s.median == 11.5
    assert s.min == 10.0 and s.max == 13.0
    assert s.iqr == pytest.approx(s.q3 - s.q1)
    assert s.spread == pytest.approx(s.iqr / 11.5)
    assert math.isclose(s.mean, 11.5)
    with pytest.raises(ValueError):
        Stats.of([])


def test_geomean_keeps_positive_finite_values():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, None, 0.0, -1.0, float("inf"), float("nan"), 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None and geomean([0.0, None]) is None
