"""Regression detection: compare a run with a baseline, confirm flagged workloads, give verdicts.

Terms:
- *baseline*: `run:ID` (or just `ID`), `ref:NAME` (the latest complete run whose git ref is NAME or whose
  commit starts with NAME), `window:N` (the last N complete runs, samples pooled), or `latest`. Only
  complete runs on the same device and profile qualify.
- *ratio*: median(new) / median(baseline); > 1 means slower.
- A workload is *regressed* only if ratio > 1 + threshold AND a one-sided Mann-Whitney U test on the samples
  gives p < alpha; *improved* symmetrically (ratio < 1 - threshold). Flagged workloads are then re-measured,
  interleaved with the baseline compiler (`eager`), and keep their verdict only if the re-measurement shows it
  too and, for compilers other than eager, the slowdown relative to eager exceeds the threshold as well (so
  a machine that became slower as a whole flags nothing).
- Verdicts: regressed, improved, unchanged, new (no baseline result), missing (no new result), not comparable
  (workload definition changed, a side failed, or another device/timer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from .exc import BaselineError
from .records import Result, RunInfo
from .stats import Stats, mann_whitney_u
from .store import Store

VERDICTS = ("regressed", "improved", "unchanged", "new", "missing", "not comparable")
BASELINE_COMPILER = "eager"

Key = tuple[str, str]  # (workload, compiler)
Remeasure = Callable[[str, list[str]], dict[str, list[float]]]


@dataclass
class CompareConfig:
    threshold: float = 0.05
    alpha: float = 0.01
    confirm_improved: bool = True


@dataclass
class Comparison:
    """The verdict for one workload+compiler."""

    workload: str
    compiler: str
    verdict: str
    ratio: float | None = None
    p: float | None = None
    base_ns: float | None = None
    new_ns: float | None = None
    norm_ratio: float | None = None  # ratio divided by the baseline compiler's ratio (confirmation only)
    confirmed: bool | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _median(xs: list[float]) -> float:
    return Stats.of(xs).median


def judge(new: list[float], base: list[float], cfg: CompareConfig) -> tuple[str, float, float]:
    """(verdict among regressed/improved/unchanged, ratio, p) for two sample sets."""
    ratio = _median(new) / _median(base)
    if ratio > 1 + cfg.threshold:
        p = mann_whitney_u(new, base, "greater").p
        return ("regressed" if p < cfg.alpha else "unchanged"), ratio, p
    if ratio < 1 - cfg.threshold:
        p = mann_whitney_u(new, base, "less").p
        return ("improved" if p < cfg.alpha else "unchanged"), ratio, p
    return "unchanged", ratio, mann_whitney_u(new, base, "two-sided").p


@dataclass
class Baseline:
    """Pooled baseline results: per key, the samples of every qualifying run with one source hash."""

    runs: list[RunInfo]
    results: dict[Key, list[Result]]

    @classmethod
    def of(cls, runs: list[RunInfo], results_per_run: list[list[Result]]) -> "Baseline":
        pooled: dict[Key, list[Result]] = {}
        for results in results_per_run:
            for r in results:
                pooled.setdefault((r.workload, r.compiler), []).append(r)
        return cls(runs, pooled)

    def samples(self, key: Key, source_hash: str) -> list[float]:
        return [x for r in self.results.get(key, []) if r.status == "ok" and r.source_hash == source_hash
                for x in r.samples]


def compare(new: list[Result], base: Baseline, cfg: CompareConfig, *, new_run: RunInfo | None = None) -> list[Comparison]:
    """Verdicts for every key in `new` or `base`, in the order of `new` then missing ones."""
    out: list[Comparison] = []
    seen: set[Key] = set()
    run_problem = _run_mismatch(new_run, base.runs)
    for r in new:
        key = (r.workload, r.compiler)
        seen.add(key)
        brs = base.results.get(key)
        if not brs:
            out.append(Comparison(r.workload, r.compiler, "new", new_ns=r.median_ns))
            continue
        c = Comparison(r.workload, r.compiler, "not comparable", new_ns=r.median_ns)
        base_ok = [b for b in brs if b.status == "ok"]
        if run_problem:
            c.note = run_problem
        elif r.status != "ok":
            c.note = f"failed in new run: {r.error}"
        elif not base_ok:
            c.note = "failed in baseline"
        elif not any(b.source_hash == r.source_hash for b in base_ok):
            c.note = "workload definition changed (source hash differs)"
        elif any(b.timer != r.timer for b in base_ok if b.source_hash == r.source_hash):
            c.note = f"timer differs (new: {r.timer})"
        else:
            bs = base.samples(key, r.source_hash)
            c.verdict, c.ratio, c.p = judge(r.samples, bs, cfg)
            c.base_ns = _median(bs)
            if r.planted:
                c.note = f"planted slowdown {r.planted:+.0%}"
        out.append(c)
    for key in sorted(base.results):
        if key not in seen:
            med = [b.median_ns for b in base.results[key] if b.median_ns]
            out.append(Comparison(key[0], key[1], "missing", base_ns=med[-1] if med else None))
    return out


def _run_mismatch(new_run: RunInfo | None, base_runs: list[RunInfo]) -> str:
    if new_run is None:
        return ""
    for b in base_runs:
        if b.device_name and new_run.device_name and b.device_name != new_run.device_name:
            return f"device differs (baseline run {b.id}: {b.device_name})"
    return ""


def flagged(cmps: list[Comparison], cfg: CompareConfig) -> list[Comparison]:
    wanted = ("regressed", "improved") if cfg.confirm_improved else ("regressed",)
    return [c for c in cmps if c.verdict in wanted]


def confirm(cmps: list[Comparison], new: list[Result], base: Baseline, remeasure: Remeasure,
            cfg: CompareConfig) -> list[Comparison]:
    """Re-measure flagged workloads (interleaved with eager) and keep a verdict only if it holds again."""
    hashes = {(r.workload, r.compiler): r.source_hash for r in new}
    by_workload: dict[str, list[Comparison]] = {}
    for c in flagged(cmps, cfg):
        by_workload.setdefault(c.workload, []).append(c)
    for workload, group in by_workload.items():
        fresh = remeasure(workload, [c.compiler for c in group])
        eager_new = fresh.get(BASELINE_COMPILER) or []
        eager_base = base.samples((workload, BASELINE_COMPILER), hashes.get((workload, BASELINE_COMPILER), ""))
        for c in group:
            first, first_ratio = c.verdict, c.ratio
            again = fresh.get(c.compiler) or []
            if not again:
                c.verdict, c.confirmed = "unchanged", False
                c.note = _join(c.note, f"re-measure failed; first ratio {first_ratio:.3f}")
                continue
            bs = base.samples((workload, c.compiler), hashes[(workload, c.compiler)])
            verdict, c.ratio, c.p = judge(again, bs, cfg)
            c.new_ns = _median(again)
            if verdict == first and c.compiler != BASELINE_COMPILER and eager_new and eager_base:
                drift = _median(eager_new) / _median(eager_base)
                c.norm_ratio = c.ratio / drift
                holds = c.norm_ratio > 1 + cfg.threshold if first == "regressed" else c.norm_ratio < 1 - cfg.threshold
                if not holds:
                    verdict = "unchanged"
                    c.note = _join(c.note, f"machine drift: eager ratio {drift:.3f} too")
            c.confirmed = verdict == first
            if not c.confirmed:
                c.note = _join(c.note, f"not confirmed by re-measure (first ratio {first_ratio:.3f})")
            c.verdict = verdict
    return cmps


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def counts(cmps: list[Comparison]) -> dict[str, int]:
    """Number of comparisons per verdict, in `VERDICTS` order."""
    return {v: sum(1 for c in cmps if c.verdict == v) for v in VERDICTS}


# ------------------------------------------------------------------ baselines from the store
def _same_kind(run: RunInfo, like: RunInfo | None) -> bool:
    if like is None:
        return True
    return run.profile == like.profile and (not like.device_name or run.device_name == like.device_name)


def resolve_baseline(store: Store, spec: str, new_run: RunInfo | None = None) -> list[RunInfo]:
    """Runs named by a baseline spec (see module docstring); raises BaselineError when none qualifies."""
    spec = spec.strip()
    new_id = new_run.id if new_run else None
    kind, _, arg = spec.partition(":") if ":" in spec else ("run" if spec.isdigit() else spec, "", spec)
    complete = [r for r in store.runs(complete_only=True) if r.id != new_id and _same_kind(r, new_run)]
    if kind == "run":
        if not arg.isdigit():
            raise BaselineError(f"bad baseline {spec!r}: run id must be a number")
        run = store.run(int(arg))
        if run.status != "complete":
            raise BaselineError(f"run {run.id} is {run.status}: incomplete runs are never baselines")
        return [run]
    if kind == "latest":
        if not complete:
            raise BaselineError("no complete run to use as baseline (latest)")
        return complete[:1]
    if kind == "ref":
        hits = [r for r in complete if r.git_ref == arg or (r.git_commit or "").startswith(arg or "\0")]
        if not hits:
            raise BaselineError(f"no complete run of git ref {arg!r} in {store.path}")
        return hits[:1]
    if kind == "window":
        if not arg.isdigit() or int(arg) < 1:
            raise BaselineError(f"bad baseline {spec!r}: window needs a positive count")
        if not complete:
            raise BaselineError(f"no complete runs for window baseline in {store.path}")
        return complete[: int(arg)]
    raise BaselineError(f"bad baseline {spec!r} (use run:ID, ref:NAME, window:N or latest)")


def load_baseline(store: Store, runs: list[RunInfo]) -> Baseline:
    return Baseline.of(runs, [store.results(r.id) for r in runs])
