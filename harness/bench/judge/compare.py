"""Regression detection: compare a run with a baseline, confirm flagged workloads, give verdicts.

Terms:
- *baseline*: `run:ID` (or just `ID`), `ref:NAME` (the latest complete run whose git ref is NAME or whose
  commit starts with NAME), `window:N` (the last N complete runs, samples pooled), or `latest`. Only
  complete runs on the same device and profile qualify.
- *ratio*: median(new) / median(baseline); > 1 means slower.
- A workload is *regressed* only if ratio > 1 + threshold AND a one-sided Mann-Whitney U test on the samples
  gives p < alpha; *improved* symmetrically (ratio < 1 - threshold). Against stored samples such a flag is only
  a *suspect*: `bench run` decides it side by side (harness/bench/kernels/sidebyside.py: `rejected`, `unconfirmed`, or
  regressed/improved `confirmed`); `bench compare`, the model tier and `bench history`'s recomputed steps
  report it as `suspect` (`mark_suspects`). `confirm` below (the older re-measure against the baseline's
  stored samples, no longer used by `bench run`) is kept for its tests: flagged workloads re-measured,
  interleaved with the baseline compiler (`eager`), and keep their verdict only if the re-measurement shows it
  too and, for compilers other than eager, the slowdown relative to eager exceeds the threshold as well (so
  a machine that became slower as a whole flags nothing); eager's own local clock is a few other eager
  workloads re-measured right before and after it.
- Verdicts (`records.Verdict`): regressed, improved, unchanged, new (no baseline result), missing (no new
  result), not comparable (workload definition changed, a side failed, or another device/timer); the side by
  side confirmation adds rejected, unconfirmed and inconclusive.
- *drift*: the median, over all workloads, of eager's ratio: how much slower the machine as a whole ran.
  With `normalize_drift` (default on CPU, where a shared 2-core machine drifts by 5-10% between runs) every
  ratio is divided by it, and the new samples scaled by 1/drift before the test. A regression of one
  compiler across all workloads still shows, since drift is measured on eager.
- Defaults per device kind: GPU threshold 5%, no drift normalization; CPU threshold 10%, drift normalized
  (two identical CPU runs differ by up to ~10% per workload; a 20% slowdown still stands out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from harness.bench.core.records import Comparison, Result, RunInfo, Verdict
from harness.bench.core.stats import Stats, mann_whitney_u
from harness.bench.stores.store import Store
from harness.exc import BaselineError

VERDICTS = tuple(Verdict)
BASELINE_COMPILER = "eager"

Key = tuple[str, str]  # (workload, compiler)
# remeasure(workload, compilers, reference workloads) -> fresh samples per (workload, compiler); it measures
# `workload` under `compilers` + eager interleaved, and each reference workload under eager around it.
Remeasure = Callable[[str, list[str], list[str]], dict[Key, list[float]]]


CPU_THRESHOLD = 0.10
GPU_THRESHOLD = 0.05


@dataclass
class CompareConfig:
    """threshold/normalize_drift None mean: the default for the new run's device kind (module docstring)."""

    threshold: float | None = None
    alpha: float = 0.01
    normalize_drift: bool | None = None
    confirm_improved: bool = True
    references: int = 3
    any_hardware: bool = False  # baselines may cross hardware classes (`--any-hardware`)

    def for_device(self, device: str) -> CompareConfig:
        cpu = not device.startswith("cuda")
        return CompareConfig(
            threshold=self.threshold
            if self.threshold is not None
            else (CPU_THRESHOLD if cpu else GPU_THRESHOLD),
            alpha=self.alpha,
            normalize_drift=self.normalize_drift if self.normalize_drift is not None else cpu,
            confirm_improved=self.confirm_improved,
            references=self.references,
            any_hardware=self.any_hardware,
        )


def _median(xs: list[float]) -> float:
    return Stats.of(xs).median


def judge(
    new: list[float], base: list[float], cfg: CompareConfig, drift: float = 1.0
) -> tuple[Verdict, float, float]:
    """(verdict: regressed/improved/unchanged, ratio, p) for two sample sets; `new` is divided by `drift`."""
    assert cfg.threshold is not None
    if drift != 1.0:
        new = [x / drift for x in new]
    ratio = _median(new) / _median(base)
    if ratio > 1 + cfg.threshold:
        p = mann_whitney_u(new, base, "greater").p
        return (Verdict.REGRESSED if p < cfg.alpha else Verdict.UNCHANGED), ratio, p
    if ratio < 1 - cfg.threshold:
        p = mann_whitney_u(new, base, "less").p
        return (Verdict.IMPROVED if p < cfg.alpha else Verdict.UNCHANGED), ratio, p
    return Verdict.UNCHANGED, ratio, mann_whitney_u(new, base, "two-sided").p


@dataclass
class Baseline:
    """Pooled baseline results: per key, the samples of every qualifying run with one source hash."""

    runs: list[RunInfo]
    results: dict[Key, list[Result]]

    @classmethod
    def of(cls, runs: list[RunInfo], results_per_run: list[list[Result]]) -> Baseline:
        pooled: dict[Key, list[Result]] = {}
        for results in results_per_run:
            for r in results:
                pooled.setdefault((r.workload, r.compiler), []).append(r)
        return cls(runs, pooled)

    def samples(self, key: Key, source_hash: str) -> list[float]:
        return [
            x
            for r in self.results.get(key, [])
            if r.status == "ok" and r.source_hash == source_hash
            for x in r.samples
        ]


def drift_of(new: list[Result], base: Baseline, min_workloads: int = 5) -> float:
    """Median ratio new/baseline of eager over comparable workloads (1.0 with fewer than `min_workloads`)."""
    ratios = []
    for r in new:
        if r.compiler == BASELINE_COMPILER and r.status == "ok" and r.samples:
            bs = base.samples((r.workload, r.compiler), r.source_hash)
            if bs:
                ratios.append(_median(r.samples) / _median(bs))
    return Stats.of(ratios).median if len(ratios) >= min_workloads else 1.0


def compare(
    new: list[Result],
    base: Baseline,
    cfg: CompareConfig,
    *,
    new_run: RunInfo | None = None,
    drift: float | None = None,
) -> list[Comparison]:
    """Verdicts for every key in `new` or `base`, in the order of `new` then missing ones.

    `cfg` should already be resolved for the device (`CompareConfig.for_device`); `drift` defaults to
    `drift_of(new, base)` when the config normalizes drift.
    """
    if cfg.threshold is None or cfg.normalize_drift is None:
        cfg = cfg.for_device(new_run.device if new_run else "cpu")
    if drift is None:
        drift = drift_of(new, base) if cfg.normalize_drift else 1.0
    out: list[Comparison] = []
    seen: set[Key] = set()
    run_problem = _run_mismatch(new_run, base.runs)
    for r in new:
        key = (r.workload, r.compiler)
        seen.add(key)
        brs = base.results.get(key)
        if not brs:
            out.append(Comparison(r.workload, r.compiler, Verdict.NEW, new_ns=r.median_ns))
            continue
        c = Comparison(r.workload, r.compiler, Verdict.NOT_COMPARABLE, new_ns=r.median_ns)
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
            c.verdict, c.ratio, c.p = judge(r.samples, bs, cfg, drift)
            c.base_ns = _median(bs)
            if drift != 1.0:
                c.note = f"drift {drift:.3f} divided out"
            if r.planted:
                c.note = _join(c.note, f"planted slowdown {r.planted:+.0%}")
        out.append(c)
    for key in sorted(base.results):
        if key not in seen:
            med = [b.median_ns for b in base.results[key] if b.median_ns]
            out.append(Comparison(key[0], key[1], Verdict.MISSING, base_ns=med[-1] if med else None))
    return out


def _run_mismatch(new_run: RunInfo | None, base_runs: list[RunInfo]) -> str:
    if new_run is None:
        return ""
    for b in base_runs:
        if b.device_name and new_run.device_name and b.device_name != new_run.device_name:
            return f"device differs (baseline run {b.id}: {b.device_name})"
    return ""


def flagged(cmps: list[Comparison], cfg: CompareConfig) -> list[Comparison]:
    wanted = (Verdict.REGRESSED, Verdict.IMPROVED) if cfg.confirm_improved else (Verdict.REGRESSED,)
    return [c for c in cmps if c.verdict in wanted]


def _references(cmps: list[Comparison], workload: str, base_ns: float | None, n: int) -> list[str]:
    """Eager workloads judged unchanged, closest in baseline time to `base_ns`: the local clock for eager."""
    cands = [
        c
        for c in cmps
        if c.compiler == BASELINE_COMPILER
        and c.verdict == Verdict.UNCHANGED
        and c.workload != workload
        and c.base_ns
        and c.ratio is not None
    ]
    if base_ns:
        cands.sort(key=lambda c: (abs(math.log(c.base_ns / base_ns)), c.workload))  # type: ignore[operator]
    return [c.workload for c in cands[:n]]


def confirm(
    cmps: list[Comparison],
    new: list[Result],
    base: Baseline,
    remeasure: Remeasure,
    cfg: CompareConfig,
    drift: float = 1.0,
) -> list[Comparison]:
    """Re-measure flagged workloads and keep a verdict only if it holds again, relative to a local clock.

    The local clock of a compiler other than eager is eager on the same workload, re-measured interleaved with
    it; the local clock of eager is `cfg.references` other eager workloads (judged unchanged) re-measured
    right before and after it. A slowdown the local clock shows too is machine drift, not a regression.
    `cfg` must be resolved for the device; `drift` is the one `compare` divided out.
    """
    hashes = {(r.workload, r.compiler): r.source_hash for r in new}
    thr = cfg.threshold or 0.0

    def base_samples(key: Key) -> list[float]:
        return base.samples(key, hashes.get(key, ""))

    def local_ratio(fresh: dict[Key, list[float]], keys: list[Key]) -> float | None:
        ratios = [
            _median(fresh[k]) / _median(base_samples(k)) for k in keys if fresh.get(k) and base_samples(k)
        ]
        return Stats.of(ratios).median if ratios else None

    by_workload: dict[str, list[Comparison]] = {}
    for c in flagged(cmps, cfg):
        by_workload.setdefault(c.workload, []).append(c)
    for workload, group in by_workload.items():
        eager_c = next((c for c in group if c.compiler == BASELINE_COMPILER), None)
        refs = _references(cmps, workload, eager_c.base_ns, cfg.references) if eager_c else []
        fresh = remeasure(workload, [c.compiler for c in group], refs)
        clocks = {
            BASELINE_COMPILER: (
                local_ratio(fresh, [(r, BASELINE_COMPILER) for r in refs]),
                "other eager workloads re-measured beside it",
            )
        }
        eager_here = local_ratio(fresh, [(workload, BASELINE_COMPILER)])
        for c in group:
            first, first_ratio = c.verdict, c.ratio
            again = fresh.get((workload, c.compiler)) or []
            if not again:
                c.verdict, c.confirmed = Verdict.UNCHANGED, False
                c.note = _join(c.note, f"re-measure failed; first ratio {first_ratio:.3f}")
                continue
            bs = base_samples((workload, c.compiler))
            verdict, c.ratio, c.p = judge(again, bs, cfg, drift)
            c.new_ns = _median(again)
            local, what = clocks.get(c.compiler, (eager_here, "eager re-measured beside it"))
            if verdict == first and local:
                c.norm_ratio = _median(again) / _median(bs) / local
                holds = c.norm_ratio > 1 + thr if first == Verdict.REGRESSED else c.norm_ratio < 1 - thr
                if not holds:
                    verdict = Verdict.UNCHANGED
                    c.note = _join(c.note, f"machine drift: {what} ratio {local:.3f}")
            c.confirmed = verdict == first
            if not c.confirmed:
                c.note = _join(c.note, f"not confirmed by re-measure (first ratio {first_ratio:.3f})")
            c.verdict = verdict
    return cmps


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def mark_suspects(cmps: list[Comparison], why: str = "stored samples only") -> list[Comparison]:
    """Flags of a comparison with stored samples that nothing measured side by side: `suspect` (never a
    regression: see harness/bench/kernels/sidebyside.py). Returns `cmps`."""
    for c in cmps:
        if c.verdict in (Verdict.REGRESSED, Verdict.IMPROVED):
            c.suspect, c.verdict = c.verdict, Verdict.SUSPECT
            c.note = _join(
                c.note,
                f"{'slower' if c.suspect == Verdict.REGRESSED else 'faster'} against {why}; "
                "not confirmed side by side",
            )
    return cmps


def with_baseline(cmps: list[Comparison], baseline: str) -> list[Comparison]:
    """`cmps`, each naming the baseline run(s) it was judged against (what `Store.save_verdicts` stores)."""
    for c in cmps:
        c.baseline = baseline
    return cmps


def counts(cmps: list[Comparison]) -> dict[str, int]:
    """Number of comparisons per verdict, in `VERDICTS` order."""
    return {v: sum(1 for c in cmps if c.verdict == v) for v in VERDICTS}


# ------------------------------------------------------------------ baselines from the store
def same_kind(run: RunInfo, like: RunInfo | None, any_hardware: bool = False) -> bool:
    """Whether `run` may be a baseline of `like`: the same profile, and the same hardware class (both name one:
    harness/store/runner.py; else the same device name), unless `any_hardware`."""
    if like is None:
        return True
    if run.profile != like.profile:
        return False
    if any_hardware:
        return True
    if like.hw_class and run.hw_class:
        return run.hw_class == like.hw_class
    return not like.device_name or run.device_name == like.device_name


def resolve_baseline(
    store: Store, spec: str, new_run: RunInfo | None = None, *, any_hardware: bool = False
) -> list[RunInfo]:
    """Runs named by a baseline spec (see module docstring), of the new run's hardware class unless
    `any_hardware`; raises BaselineError when none qualifies."""
    spec = spec.strip()
    new_id = new_run.id if new_run else None
    kind, _, arg = spec.partition(":") if ":" in spec else ("run" if spec.isdigit() else spec, "", spec)
    complete = [
        r for r in store.runs(complete_only=True) if r.id != new_id and same_kind(r, new_run, any_hardware)
    ]
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
    return Baseline.of(runs, [store.results(r.rid) for r in runs])


def config_from_args(args) -> CompareConfig:
    """The comparison settings of a command line (`--threshold`, `--alpha`, `--drift`), the bench settings
    (`KILN_BENCH_*`) filling what it leaves out; a clear UsageError for values outside (0, 1)."""
    from harness.exc import UsageError
    from harness.settings import bench_settings

    s = bench_settings()
    thr = s.threshold if args.threshold is None else args.threshold
    alpha = s.alpha if args.alpha is None else args.alpha
    if (thr is not None and not 0 < thr < 1) or not 0 < alpha < 1:
        raise UsageError("--threshold and --alpha must be between 0 and 1")
    drift = {"auto": None, "on": True, "off": False}[args.drift]
    return CompareConfig(
        threshold=thr,
        alpha=alpha,
        normalize_drift=drift,
        any_hardware=bool(getattr(args, "any_hardware", False)),
    )
