"""Paired statistics over interleaved rounds, and the side-by-side judgement built on them.

Terms:
- *round*: one turn of every arm of a side-by-side measurement, taken one after another within a few
  seconds (harness/bench/kernels/sidebyside.py); each turn gives one time (its lower quartile). Rounds are the
  independent unit: the samples inside one turn share the machine's state (a burst of load spans them), and
  turns of one round share it too, which is what pairing uses.
- *log ratio* of a round: log(candidate turn / baseline turn). Its distribution under "no change" is
  symmetric about 0 when the arms take the earlier place in turn.
- Wilcoxon signed-rank test: a rank test of whether the rounds' log ratios are centred above (or below) 0;
  exact (all 2^n sign patterns, by dynamic programming over the ranks actually observed), so it stays
  honest for the 6-40 rounds a side-by-side measurement has.
- Hodges-Lehmann estimate: the median of the Walsh averages (d_i + d_j) / 2, i <= j; the *ratio* is its
  exponential. Its distribution-free confidence interval comes from the same signed-rank distribution.
- *noise floor*: the largest difference between identical code that an A/A pair (the baseline's code in
  two processes, measured in the same rounds) and the B/B pair (the candidate's code in two processes) are
  compatible with: max(hi, 1/lo) - 1 of each ratio's interval, the larger of the two. A change smaller than
  the noise floor cannot be told from the host's own noise.
- *process effect*: a difference that one process of a build keeps for its whole life (where its code and
  data landed in memory, the core it settled on): on the shared CPU host one process of identical code has
  measured 18% slower than two others in every round (p=0.00024) while those two agreed within 1.3%. The
  B/B pair is what tells such a process from a slower build: both candidate processes must differ.
- Side-by-side verdicts (`judge_side_by_side`): `regressed` (`improved`) when every candidate process is
  slower (faster) than every baseline process by more than the threshold at p < alpha in each pairing, the
  change exceeds the noise floor, and neither identical-code pair shows a difference beyond the threshold;
  `inconclusive` (with the noise floor) when the host is too noisy to tell a threshold-sized change, a
  change does not clear the noise floor, or a pair of identical code differs; else `unchanged`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.bench.core.records import Verdict

MIN_ROUNDS = 6  # fewer paired rounds cannot reach p < 0.02 with a signed-rank test: nothing is decided


def _abs_ranks(d: Sequence[float]) -> list[float]:
    """Average ranks (1-based) of |d|."""
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    ranks = [0.0] * len(d)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _rank_sum_counts(doubled: Sequence[int]) -> list[int]:
    """counts[s]: how many of the 2^n sign patterns give a positive-rank sum of s (in doubled ranks)."""
    counts = [1] + [0] * sum(doubled)
    top = 0
    for r in doubled:
        for s in range(top, -1, -1):
            if counts[s]:
                counts[s + r] += counts[s]
        top += r
    return counts


@dataclass(frozen=True)
class SignedRank:
    """Wilcoxon signed-rank test of `d` (zeros dropped): W+ and its exact one-sided p-values."""

    n: int
    w_plus: float
    p_greater: float  # P(W+ >= observed) under symmetry about 0: d tends to be positive
    p_less: float  # P(W+ <= observed): d tends to be negative

    @property
    def p_two_sided(self) -> float:
        return min(1.0, 2 * min(self.p_greater, self.p_less))


def signed_rank(d: Sequence[float]) -> SignedRank:
    """The exact Wilcoxon signed-rank test of whether `d` is centred above or below 0 (module docstring)."""
    nz = [x for x in d if x != 0 and math.isfinite(x)]
    if not nz:
        return SignedRank(0, 0.0, 1.0, 1.0)
    ranks = _abs_ranks(nz)
    doubled = [round(2 * r) for r in ranks]
    counts = _rank_sum_counts(doubled)
    total = 2 ** len(nz)
    w2 = sum(r for r, x in zip(doubled, nz) if x > 0)
    return SignedRank(len(nz), w2 / 2, sum(counts[w2:]) / total, sum(counts[: w2 + 1]) / total)


def hodges_lehmann(d: Sequence[float], confidence: float = 0.99) -> tuple[float, float, float]:
    """(estimate, low, high): the median of the Walsh averages of `d` and its distribution-free confidence
    interval at `confidence` (two-sided); the interval is infinite when `d` has too few values for it."""
    if not d:
        raise ValueError("hodges_lehmann needs at least one value")
    walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
    m = len(walsh)
    est = (walsh[(m - 1) // 2] + walsh[m // 2]) / 2
    counts = _rank_sum_counts([2 * r for r in range(1, len(d) + 1)])  # no ties: ranks 1..n, doubled
    total, tail, cum, k = 2 ** len(d), (1 - confidence) / 2, 0, 0
    while k < m and (cum + counts[2 * k]) / total <= tail:  # k: largest with P(W+ <= k - 1) <= tail
        cum += counts[2 * k]
        k += 1
    if k == 0:
        return est, -math.inf, math.inf
    return est, walsh[k - 1], walsh[m - k]


@dataclass(frozen=True)
class Paired:
    """One arm against another over paired rounds: the ratio (exp of the Hodges-Lehmann log ratio), its
    confidence interval, and the signed-rank test of the log ratios."""

    n: int
    ratio: float
    lo: float
    hi: float
    test: SignedRank

    @property
    def noise(self) -> float:
        """The largest difference (a fraction) this pairing is compatible with: max(hi, 1/lo) - 1."""
        return max(self.hi, 1 / self.lo if self.lo > 0 else math.inf) - 1


def log_ratios(base: Sequence[float], cand: Sequence[float]) -> list[float]:
    """log(cand / base) of every round where both arms have a positive time."""
    return [math.log(y / x) for x, y in zip(base, cand) if x > 0 and y > 0]


def paired(base: Sequence[float], cand: Sequence[float], confidence: float = 0.99) -> Paired | None:
    """`cand` against `base`, round by round; None with fewer than `MIN_ROUNDS` usable rounds."""
    d = log_ratios(base, cand)
    return paired_of(d, confidence) if len(d) >= MIN_ROUNDS else None


def paired_of(d: Sequence[float], confidence: float = 0.99) -> Paired:
    """A `Paired` of log ratios `d` (at least one)."""
    est, lo, hi = hodges_lehmann(d, confidence)
    return Paired(len(d), math.exp(est), math.exp(lo), math.exp(hi), signed_rank(d))


@dataclass(frozen=True)
class SideBySide:
    """The judgement of one workload+compiler measured side by side: the verdict, the candidate's ratio to
    the baseline (both baseline processes together), the p-value that decided it, the noise floor measured by
    the A/A pair, the A/A ratio, the number of rounds and a one-line reason."""

    verdict: Verdict
    ratio: float | None
    p: float | None
    noise: float | None
    aa_ratio: float | None
    rounds: int
    why: str
    bb_ratio: float | None = (
        None  # the B/B pair's ratio (the candidate's code in two processes), when measured
    )


def _geo(xs: Sequence[float]) -> float:
    """The mean of the logs of `xs` (a geometric mean, in logs)."""
    return sum(math.log(x) for x in xs) / len(xs)


def judge_side_by_side(
    base: Sequence[float],
    base2: Sequence[float],
    cand: Sequence[float],
    threshold: float,
    alpha: float,
    cand2: Sequence[float] | None = None,
) -> SideBySide:
    """Verdict of the candidate's turns (`cand`, and `cand2` from a second candidate process when measured)
    against the baseline code's turns in two processes (`base`, `base2`), all taken in the same rounds (module
    docstring)."""
    arms = [base, base2, cand] + ([cand2] if cand2 is not None else [])
    rows = [r for r in zip(*arms) if all(x > 0 for x in r)]
    if len(rows) < MIN_ROUNDS:
        return SideBySide(
            Verdict.INCONCLUSIVE,
            None,
            None,
            None,
            None,
            len(rows),
            f"{len(rows)} usable round(s) (at least {MIN_ROUNDS} are needed)",
        )
    cols = [[r[i] for r in rows] for i in range(len(arms))]
    bases, cands = cols[:2], cols[2:]
    conf = 1 - alpha
    aa = paired_of(log_ratios(*bases), conf)
    bb = paired_of(log_ratios(*cands), conf) if len(cands) == 2 else None
    pairings = [paired_of(log_ratios(x, y), conf) for y in cands for x in bases]
    both = paired_of([_geo(r[2:]) - _geo(r[:2]) for r in rows], conf)
    same = [aa] + ([bb] if bb else [])
    ratio, noise, n = both.ratio, max(s.noise for s in same), len(rows)
    same_flag = any(
        s.test.p_two_sided < alpha and abs(math.log(s.ratio)) > math.log1p(threshold) for s in same
    )

    def out(v: Verdict, p: float | None, why: str) -> SideBySide:
        return SideBySide(v, ratio, p, noise, aa.ratio, n, why, bb.ratio if bb else None)

    pairs = f"x{aa.ratio:.3f}" + (f" and x{bb.ratio:.3f}" if bb else "")
    floor = f"noise floor {noise:.0%} (identical code in two processes: {pairs})"
    for flag, p, change in (
        (Verdict.REGRESSED, max(v.test.p_greater for v in pairings), ratio - 1),
        (Verdict.IMPROVED, max(v.test.p_less for v in pairings), 1 / ratio - 1),
    ):
        if change > threshold and p < alpha:
            if change > noise and not same_flag:
                return out(
                    flag, p, f"{flag.value}: x{ratio:.3f} (p={p:.2g}) over {n} rounds, beyond the {floor}"
                )
            return out(Verdict.INCONCLUSIVE, p, f"x{ratio:.3f} (p={p:.2g}) does not clear the {floor}")
    p2 = max(v.test.p_two_sided for v in pairings)
    if noise > threshold or same_flag:
        return out(
            Verdict.INCONCLUSIVE,
            p2,
            f"x{ratio:.3f}; host too noisy to tell a {threshold:.0%} change: {floor}",
        )
    return out(Verdict.UNCHANGED, p2, f"x{ratio:.3f} over {n} rounds, within the threshold; {floor}")
