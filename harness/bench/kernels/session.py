"""One bench run from start to finish: resolve baseline -> begin run -> ceiling -> measure every workload ->
compare with the baseline's stored samples (suspects only) -> decide the suspects side by side with the
baseline's own build (harness/bench/kernels/sidebyside.py) -> store the verdicts -> mark complete. Interrupted runs are marked `aborted` (a killed one
stays `running`); neither is ever a baseline.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from harness.bench.core.records import Result, RunInfo, Verdict
from harness.bench.judge.compare import (
    Baseline,
    CompareConfig,
    Comparison,
    compare,
    drift_of,
    load_baseline,
    resolve_baseline,
    with_baseline,
)
from harness.bench.kernels import workloads as wl
from harness.bench.kernels.execute import BenchConfig, Executor, check_compilers
from harness.bench.kernels.sidebyside import ALWAYS_ON_CPU, confirm_side_by_side
from harness.bench.reports.report import fmt_ns, interpreted
from harness.bench.stores import env
from harness.bench.stores.store import Store
from harness.exc import BaselineError
from harness.process import raise_if_terminated

SCREEN_RUNS = 3  # complete runs (the baseline's among them) whose stored samples screen for suspects


def widen_suspects(
    store: Store,
    run: RunInfo,
    results: list[Result],
    base_runs: list[RunInfo],
    cmps: list[Comparison],
    cfg: CompareConfig,
    n: int = SCREEN_RUNS,
) -> None:
    """Also flag as suspects (`regressed`, to be decided side by side) the workloads more than half the
    threshold slower than the baseline or than any of the other last `n` complete runs of its kind, in raw
    time or with eager on the same workload (measured interleaved with it in each run) as the clock (no
    significance asked: a screen): a baseline measured in a slow spell of the host hides a real slowdown
    against itself (a planted 20% read 0.89x against a baseline measured under load). Each suspect costs
    side-by-side time; only that measurement decides."""
    try:
        others = [
            r
            for r in resolve_baseline(store, f"window:{n}", run, any_hardware=cfg.any_hardware)
            if r.id not in {b.id for b in base_runs}
        ]
    except BaselineError:
        others = []
    loose = 1 + (cfg.threshold or 0.0) / 2
    by_key = {(c.workload, c.compiler): c for c in cmps}
    screens = [("the baseline's stored samples", cmps)]
    for other in others[: max(0, n - len(base_runs))]:
        base = load_baseline(store, [other])
        drift = drift_of(results, base) if cfg.normalize_drift else 1.0
        screens.append(
            (f"run {other.id}'s stored samples", compare(results, base, cfg, new_run=run, drift=drift))
        )
    for what, cs in screens:
        eager = {o.workload: o.ratio for o in cs if o.compiler == "eager" and o.ratio}
        for o in cs:
            c = by_key.get((o.workload, o.compiler))
            if not o.ratio or c is None or c.verdict not in (Verdict.UNCHANGED, Verdict.IMPROVED):
                continue
            clocked = o.ratio / eager[o.workload] if o.compiler != "eager" and o.workload in eager else None
            if o.ratio > loose or (clocked is not None and clocked > loose):
                c.verdict = Verdict.REGRESSED
                c.note = _join(
                    c.note,
                    f"suspect: {o.ratio:.3f}x {what}"
                    + (f", {clocked:.3f}x with eager as the clock" if clocked is not None else "")
                    + f" (p={o.p:.2g})",
                )


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)


def baseline_label(runs: list[RunInfo]) -> str:
    """`run:ID[,ID...] (commit C)`: what a stored verdict was judged against."""
    ids = ",".join(str(r.id) for r in runs)
    commit = (runs[0].git_commit or "-")[:10] if runs else "-"
    return f"run:{ids} (commit {commit})"


@dataclass
class Outcome:
    """What a run produced: the stored run, its main-phase results, and verdicts when compared."""

    run: RunInfo
    results: list[Result]
    comparisons: list[Comparison] | None = None
    baseline: list[RunInfo] = field(default_factory=list)


class Progress:
    """One line per workload on stderr: position, medians per compiler, elapsed and estimated time left."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled, self.t0 = total, enabled, time.monotonic()
        self.ends: list[float] = []  # seconds from the start at which each main-phase workload ended

    def __call__(self, i: int, name: str, results: list[Result], phase: str = "main") -> None:
        from harness.bench.core.stats import eta_text

        spent = time.monotonic() - self.t0
        if phase == "main":
            self.ends.append(spent)
        if not self.enabled:
            return
        eta = eta_text(self.ends, self.total) if phase == "main" else "confirming"
        cells = "  ".join(
            f"{r.compiler} {fmt_ns(r.median_ns) if r.status == 'ok' else 'error'}" for r in results
        )
        tag = f"[{i + 1:>3}/{self.total}]" if phase == "main" else "[confirm]"
        print(f"{tag} {name:<40} {cells}  ({spent:.0f}s, {eta})", file=sys.stderr, flush=True)


def prepare_kiln() -> None:
    """Register the compiler (`compiler.register()`) before anything else imports triton (Dynamo's backend list
    does), so that on a machine without a GPU kiln can still choose Triton's interpreter. A broken compiler is
    left for each workload to report as an error result."""
    try:
        importlib.import_module("compiler").register()
    except Exception as e:  # noqa: BLE001
        print(
            f"note: `import compiler` failed ({type(e).__name__}: {e}); kiln results will be errors",
            file=sys.stderr,
        )


def set_threads(cfg: BenchConfig, threads: int | None) -> None:
    """CPU runs measure with `threads` intra-op threads (1 by default: the other core stays for the OS)."""
    if cfg.device == "cpu" and threads:
        torch.set_num_threads(threads)


@contextmanager
def open_runs(store: Store, runs: list[RunInfo], ex: Executor) -> Iterator[None]:
    """Begin `runs` in the store with the machine's measured ceiling; mark them `complete` when the block
    ends normally and `aborted` when it raises (never a baseline then), the original error kept."""
    for run in runs:
        store.begin_run(run)
    try:
        ceiling = ex.measure_ceiling()
        for run in runs:
            store.set_ceiling(run.rid, ceiling)
            run.ceiling_gbps = ceiling
        yield
        raise_if_terminated()  # a SIGTERM that a compile swallowed: the runs are aborted, not complete
    except BaseException as e:
        for run in runs:
            try:
                store.finish_run(run.rid, "aborted")
            except Exception:  # noqa: BLE001 - the store may be what failed; keep the original error
                pass
            if isinstance(e, KeyboardInterrupt):
                print(
                    f"note: run {run.id} is marked aborted (what was measured is kept) and will never be used "
                    "as a baseline",
                    file=sys.stderr,
                )
        raise
    for run in runs:
        store.finish_run(run.rid, "complete")
        run.status, run.finished_at = "complete", store.run(run.rid).finished_at


def run_bench(
    cfg: BenchConfig,
    store: Store,
    *,
    label: str | None = None,
    git_ref: str | None = None,
    git_commit: str | None = None,
    baseline: str | None = None,
    cmp_cfg: CompareConfig | None = None,
    progress: bool = True,
    threads: int | None = 1,
    log: Callable[[str], None] | None = None,
) -> Outcome:
    """Measure every workload of `cfg`, store it, compare with `baseline` if given (see module docstring)."""
    cases = wl.cases(cfg.profile, cfg.only)
    if "kiln" in cfg.compilers:
        prepare_kiln()
    cfg.compilers = check_compilers(cfg.compilers)
    set_threads(cfg, threads)
    run = env.new_run(cfg.profile, cfg.device, cfg.compilers, cfg.as_dict(), label, git_ref, git_commit)
    base_runs: list[RunInfo] = []
    if baseline:  # "SPEC?" means: compare when SPEC resolves, else run without a baseline
        try:
            base_runs = resolve_baseline(
                store, baseline.rstrip("?"), run, any_hardware=bool(cmp_cfg and cmp_cfg.any_hardware)
            )
        except BaselineError as e:
            if not baseline.endswith("?"):
                raise
            print(f"note: no baseline ({e}); this run is stored without comparison", file=sys.stderr)
    ex = Executor(cfg, log=log)
    with open_runs(store, [run], ex):
        show = Progress(len(cases), progress)

        def done(i: int, case: wl.Case, rs: list[Result]) -> None:
            for r in rs:
                store.add_result(run.id, r)
            show(i, case.name, rs)
            raise_if_terminated()  # stop at the next case, what was measured stored

        results = ex.measure_cases(cases, cfg.compilers, done)
        cmps = None
        if base_runs:
            cmp_cfg = (cmp_cfg or CompareConfig()).for_device(cfg.device)
            base: Baseline = load_baseline(store, base_runs)
            drift = drift_of(results, base) if cmp_cfg.normalize_drift else 1.0
            cmps = compare(results, base, cmp_cfg, new_run=run, drift=drift)
            widen_suspects(store, run, results, base_runs, cmps, cmp_cfg)
            interp = interpreted(cfg.device, cfg.compilers)
            for c in cmps:
                c.interpreter = c.compiler in interp
            # the stored comparison only raises suspects; they are decided side by side, now
            cmps = confirm_side_by_side(
                cmps,
                run,
                base_runs,
                cfg.as_dict(),
                cmp_cfg,
                plant=cfg.plant.spec() if cfg.plant else None,
                threads=threads or 1,
                log=log,
                always=ALWAYS_ON_CPU if cfg.device == "cpu" else (),
            )
            store.save_verdicts(run.id, with_baseline(cmps, baseline_label(base_runs)))
    return Outcome(run, results, cmps, base_runs)
