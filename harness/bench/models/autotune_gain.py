"""Autotuning's gain per model case, from the model tier's arms ``kiln`` and ``kiln-autotune`` measured side by
side (interleaved rounds in one process): what the goal "autotuned step >= heuristic" is judged on.

Terms:
- *step gain*: kiln's median step time / kiln-autotune's (above 1: the autotuned configs are faster);
- *kernel gain*: the same ratio of profiled device kernel ms per step: the GPU's share, the part launch configs
  change (a host-bound step hides it);
- *verdict*: ``faster`` or ``slower`` when the two arms' step samples differ by a two-sided Mann-Whitney U test
  at ``ALPHA`` and the medians by more than ``MIN_EFFECT``; else ``same`` (the difference is within the
  samples' noise). The goal holds on a case unless its verdict is ``slower``.

A gain read from two processes minutes apart (the compile probes' steady steps, ``compile_times``) is not judged
here: whatever else loads the host moves host-bound steps between the two (2026-11-26: ResNet-50 training read
0.64 that way and 0.99, with a kernel gain of 1.08, side by side).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness import arms
from harness.bench.core.records import Result, by_case, passed
from harness.bench.core.stats import geomean, mann_whitney_u
from harness.results import markdown_table

#: significance level of the step samples' rank test
ALPHA = 0.01
#: smallest relative difference of the medians called faster or slower
MIN_EFFECT = 0.01


@dataclass(frozen=True)
class Gain:
    """One case: the two arms' medians (ms), the gains, the test's p-value and the verdict."""

    case: str
    step_ms: float
    tuned_step_ms: float
    step_gain: float
    p: float
    verdict: str
    kernel_ms: float | None = None
    tuned_kernel_ms: float | None = None

    @property
    def kernel_gain(self) -> float | None:
        if self.kernel_ms and self.tuned_kernel_ms:
            return self.kernel_ms / self.tuned_kernel_ms
        return None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kernel_gain": self.kernel_gain}


def _kernel_ms(r: Result) -> float | None:
    k = r.meta.kernel
    return float(k["kernel_ms"]) if isinstance(k, dict) and k.get("kernel_ms") else None


def gain(heuristic: Result, tuned: Result) -> Gain:
    """The gain of ``tuned`` (kiln-autotune) over ``heuristic`` (kiln) on one case (both with samples)."""
    a, b = heuristic.median_ns, tuned.median_ns
    assert a and b, "gain() needs samples on both arms"
    g = a / b
    p = mann_whitney_u(heuristic.samples, tuned.samples).p
    verdict = "same"
    if p < ALPHA and abs(g - 1) > MIN_EFFECT:
        verdict = "faster" if g > 1 else "slower"
    return Gain(heuristic.workload, a / 1e6, b / 1e6, g, p, verdict, _kernel_ms(heuristic), _kernel_ms(tuned))


def gains(
    results: Sequence[Result], heuristic: str = arms.KILN, tuned: str = arms.KILN_AUTOTUNE
) -> list[Gain]:
    """One ``Gain`` per case where both arms ran, passed their accuracy check and have samples (results' order)."""
    return [
        gain(per[heuristic], per[tuned])
        for per in by_case(results).values()
        if passed(per.get(heuristic)) and passed(per.get(tuned))
    ]


def report_lines(results: Sequence[Result]) -> list[str]:
    """The model report's section (none without both arms): a row per case, the geomeans and the goal's count."""
    gs = gains(results)
    if not gs:
        return []
    lines = [
        "### Autotuning's gain (kiln against kiln-autotune, side by side)",
        "",
        f"Gain: kiln / kiln-autotune (above 1: autotuned faster). Verdict: two-sided Mann-Whitney U on the "
        f"step samples at p < {ALPHA} and a median difference above {MIN_EFFECT:.0%}; `same` otherwise.",
        "",
    ]
    lines += markdown_table(
        [
            "case",
            "kiln ms",
            "kiln-autotune ms",
            "step gain",
            "p",
            "verdict",
            "kernel ms",
            "autotuned kernel ms",
            "kernel gain",
        ],
        (
            [
                g.case,
                f"{g.step_ms:.3f}",
                f"{g.tuned_step_ms:.3f}",
                f"{g.step_gain:.3f}",
                f"{g.p:.2g}",
                g.verdict,
                f"{g.kernel_ms:.3f}" if g.kernel_ms else "-",
                f"{g.tuned_kernel_ms:.3f}" if g.tuned_kernel_ms else "-",
                f"{g.kernel_gain:.3f}" if g.kernel_gain else "-",
            ]
            for g in gs
        ),
        "lrrrrlrrr",
    )
    return lines + ["", *(f"- {line}" for line in summary_lines(gs)), ""]


def summary_lines(gs: Sequence[Gain]) -> list[str]:
    """The geomeans and the goal's count of ``gs`` (none when empty): the report's last lines, the terminal's."""
    if not gs:
        return []
    kernel = [g.kernel_gain for g in gs if g.kernel_gain]
    slower = [g.case for g in gs if g.verdict == "slower"]
    return [
        f"autotuning: geomean step gain {geomean([g.step_gain for g in gs]) or 0:.3f} over {len(gs)} case(s)"
        + (f"; kernel gain {geomean(kernel) or 0:.3f} over {len(kernel)}" if kernel else ""),
        f"goal autotuned step >= heuristic (side by side): {len(gs) - len(slower)}/{len(gs)} cases"
        + (f"; slower on {', '.join(slower)}" if slower else ""),
    ]
