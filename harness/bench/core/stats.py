"""Statistics of timing samples, in one small class, and the Mann-Whitney U test.

Terms:
- *sample*: one timed repetition of a workload, in nanoseconds.
- *kept*: the samples left after dropping outliers beyond 1.5 IQR from the quartiles (Tukey fences).
- *spread*: IQR of the kept samples divided by their median (a unit-free measure of noise).
- Mann-Whitney U: a rank test of whether one sample set is stochastically larger than another; here with
  the normal approximation, tie correction and continuity correction (no scipy needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

Alternative = Literal["greater", "less", "two-sided"]


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method) of an already sorted, non-empty sequence."""
    if not sorted_xs:
        raise ValueError("quantile of an empty sequence")
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac


def drop_outliers(xs: Sequence[float], k: float = 1.5) -> list[float]:
    """Samples inside [Q1 - k*IQR, Q3 + k*IQR], in their original order."""
    if len(xs) < 4:
        return list(xs)
    s = sorted(xs)
    q1, q3 = quantile(s, 0.25), quantile(s, 0.75)
    lo, hi = q1 - k * (q3 - q1), q3 + k * (q3 - q1)
    return [x for x in xs if lo <= x <= hi]


def geomean(xs: Sequence[float | None]) -> float | None:
    """The geometric mean of the positive, finite values of ``xs`` (ratios, speedups), None when there are none."""
    kept = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in kept) / len(kept)) if kept else None


@dataclass(frozen=True)
class Stats:
    """Summary of one set of samples after dropping outliers beyond 1.5 IQR."""

    n: int
    kept: int
    median: float
    mean: float
    stdev: float
    q1: float
    q3: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        """Summarize `samples` (at least one)."""
        if not samples:
            raise ValueError("Stats.of needs at least one sample")
        kept = sorted(drop_outliers(samples))
        mean = sum(kept) / len(kept)
        var = sum((x - mean) ** 2 for x in kept) / (len(kept) - 1) if len(kept) > 1 else 0.0
        return cls(
            n=len(samples),
            kept=len(kept),
            median=quantile(kept, 0.5),
            mean=mean,
            stdev=math.sqrt(var),
            q1=quantile(kept, 0.25),
            q3=quantile(kept, 0.75),
            min=kept[0],
            max=kept[-1],
        )

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def spread(self) -> float:
        """IQR / median of the kept samples (0 when the median is 0)."""
        return self.iqr / self.median if self.median else 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) of `values` and the sizes of each group of tied values."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = avg
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _norm_sf(z: float) -> float:
    """Survival function P(Z > z) of the standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class MannWhitney:
    """Result of `mann_whitney_u`: U of the first sample, the z score, and the p-value."""

    u: float
    z: float
    p: float


def mann_whitney_u(
    x: Sequence[float], y: Sequence[float], alternative: Alternative = "two-sided"
) -> MannWhitney:
    """Mann-Whitney U test of `x` against `y` (normal approximation, tie and continuity corrections).

    `alternative="greater"` tests whether x tends to be larger than y (x slower, for timings). U is the
    statistic of x (scipy's convention): results match scipy.stats.mannwhitneyu(..., method="asymptotic").
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs two non-empty samples")
    ranks, ties = _ranks(list(x) + list(y))
    r1 = sum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return MannWhitney(u=u1, z=0.0, p=1.0)
    sigma = math.sqrt(var)
    if alternative == "greater":
        z = (u1 - mu - 0.5) / sigma
        p = _norm_sf(z)
    elif alternative == "less":
        z = (u1 - mu + 0.5) / sigma
        p = _norm_sf(-z)
    elif alternative == "two-sided":
        d = u1 - mu
        z = (d - math.copysign(0.5, d)) / sigma if d else 0.0
        p = min(1.0, 2 * _norm_sf(abs(z)))
    else:
        raise ValueError(f"unknown alternative {alternative!r}")
    return MannWhitney(u=u1, z=z, p=min(1.0, max(0.0, p)))


def time_left(ends: Sequence[float], total: int) -> float | None:
    """Seconds a sequence of `total` steps has left, from `ends` (the seconds since its start at which each step so
    far ended): the median step times the steps left. The first step pays the one-time costs (imports, the first
    compile, the interpreter's start) and is left out once a second step has ended; None until then (no honest
    estimate exists from one step)."""
    if len(ends) < 2:
        return None
    from itertools import pairwise

    steps = sorted(b - a for a, b in pairwise(ends))
    mid = len(steps) // 2
    median = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
    return median * max(total - len(ends), 0)


def eta_text(ends: Sequence[float], total: int) -> str:
    """`~Ns left` for time_left, `estimate after the next step` before it has one, `done` at the end."""
    if len(ends) >= total:
        return "done"
    left = time_left(ends, total)
    return "time left: after the next step" if left is None else f"~{left:.0f}s left"
