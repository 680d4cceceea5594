"""The CI check of the benchmark pipeline (CPU, tiny sizes, a few minutes), over at least 20 workloads:

1. run A compared with itself flags nothing;
2. run B, identical, compared with A flags nothing;
3. run C, with a planted 20% slowdown in one workload under one compiler (inductor when measured, else the
   first other compiler, else eager), compared with A: exactly that workload+compiler is regressed.
Exit 0 when every expectation holds, else 1 (with the reason).

Runs A, B and C are measured side by side in one process (`Executor.measure_arms`: each case compiled once,
the three runs taking turns in every round) and stored as three runs of one store; the verdicts come from
`compare` on what the store holds, as `bench compare` gives them. Why side by side: on the shared 2-core hosts
that run CI, the machine's speed swings by up to 2x over minutes, unevenly across workloads (2026-11-24/25:
eager's row_sum 7.3 -> 3.8 -> 7.3 us in three runs done one after another, each in a fresh process; in one
process likewise). Runs measured minutes apart then differ by more than any threshold, and the drift division
and the confirmation re-measure, which assume an even drift, cannot repair that; measured side by side, each
run sees the same machine. The confirmation re-measure of `bench run` is covered end to end by
`tests/harness/bench/test_bench_job.py` and by the unit tests of `compare.confirm`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.bench.core.records import Result, RunInfo, Verdict
from harness.bench.judge.compare import CompareConfig, Comparison, compare, judge, load_baseline
from harness.bench.kernels import workloads as wl
from harness.bench.kernels.execute import (
    BASELINE_COMPILER,
    BenchConfig,
    Executor,
    check_compilers,
    defaults_for,
)
from harness.bench.kernels.session import open_runs, prepare_kiln, set_threads
from harness.bench.reports import report
from harness.bench.stores import env
from harness.bench.stores.store import Store
from harness.results import append_job_summary, atomic_write_text
from harness.settings import Plant, bench_settings

MIN_WORKLOADS = 20
ARMS = ("A", "B", "C")
# Finer turns than `bench run` takes on CPU (5 rounds x 3 passes): the host's slow spells come in bursts of
# about a block of samples, and with 15 blocks an arm caught 2-3 more of them than its neighbour (identical arms
# 1.13-1.35x apart at p < 0.01 in 4 of 5 tries); more, shorter turns spread them evenly.
SIDE_BY_SIDE = {"rounds": 20, "target_s": 0.24, "max_reps": 1200}


def _regressed(cmps: list[Comparison]) -> list[str]:
    return [
        f"{c.workload}@{c.compiler} ({c.ratio:.3f}, p={c.p:.2g})"
        for c in cmps
        if c.verdict == Verdict.REGRESSED
    ]


def plant_compiler(compilers: list[str]) -> str:
    """Where the slowdown is planted: inductor when measured, else the first other compiler, else eager."""
    order = sorted(compilers, key=lambda c: (c != "inductor", c == BASELINE_COMPILER))
    return order[0]


def _plants(plant: Plant) -> dict[str, Plant | None]:
    """Each arm's plant: the slowdown in run C only."""
    return {arm: plant if arm == "C" else None for arm in ARMS}


def measure_side_by_side(
    cfg: BenchConfig, store: Store, plant: Plant
) -> dict[str, tuple[RunInfo, list[Result]]]:
    """Runs A, B (identical) and C (`plant`) measured side by side, each stored as a complete run."""
    if "kiln" in cfg.compilers:
        prepare_kiln()
    set_threads(cfg, 1)  # as `bench run` does on CPU
    cases = wl.cases(cfg.profile, cfg.only)
    ex = Executor(cfg)
    runs: dict[str, RunInfo] = {}
    for arm in ARMS:
        arm_cfg = cfg.as_dict() | {"plant": plant.spec() if arm == "C" else None, "side_by_side": list(ARMS)}
        runs[arm] = env.new_run(
            cfg.profile,
            cfg.device,
            cfg.compilers,
            arm_cfg,
            f"selftest-{arm}" + (f" plant {plant.spec()}" if arm == "C" else ""),
        )

    def done(i: int, case: wl.Case, by_arm: dict[str, list[Result]]) -> None:
        for arm, rs in by_arm.items():
            for r in rs:
                store.add_result(runs[arm].rid, r)
        cells = "  ".join(
            f"{arm}:" + ",".join(report.fmt_ns(r.median_ns) if r.status == "ok" else "error" for r in rs)
            for arm, rs in by_arm.items()
        )
        print(f"[{i + 1:>3}/{len(cases)}] {case.name:<36} {cells}", file=sys.stderr, flush=True)

    with open_runs(store, list(runs.values()), ex):
        results = ex.measure_arms(cases, cfg.compilers, _plants(plant), done)
    return {arm: (runs[arm], results[arm]) for arm in ARMS}


def confirm_side_by_side(
    cfg: BenchConfig,
    store: Store,
    plant: Plant,
    runs: dict[str, RunInfo],
    cmps_of: dict[str, list[Comparison]],
    cmp_cfg: CompareConfig,
) -> None:
    """Measure every flagged workload once more, all arms side by side again (stored as `confirm` results),
    and keep a verdict only if the fresh samples give it again: `bench run`'s confirmation, with the baseline
    arm measured beside it as the local clock. A host's slow spell that one arm caught in the first
    measurement (1-2 of 108 keys a run on the 2-core host) rarely catches the same arm twice."""
    flagged = [
        c for cmps in cmps_of.values() for c in cmps if c.verdict in (Verdict.REGRESSED, Verdict.IMPROVED)
    ]
    if not flagged:
        return
    names = list(dict.fromkeys(c.workload for c in flagged))
    cases = [c for c in wl.cases(cfg.profile, cfg.only) if c.name in names]

    def done(i: int, case: wl.Case, by_arm: dict[str, list[Result]]) -> None:
        for arm, rs in by_arm.items():
            for r in rs:
                r.phase = "confirm"
                store.add_result(runs[arm].rid, r)

    fresh = Executor(cfg, log=lambda msg: None).measure_arms(cases, cfg.compilers, _plants(plant), done)
    samples = {
        (arm, r.workload, r.compiler): r.samples for arm in ARMS for r in fresh[arm] if r.status == "ok"
    }
    for arm, cmps in cmps_of.items():
        for c in cmps:
            if c.verdict not in (Verdict.REGRESSED, Verdict.IMPROVED):
                continue
            first, first_ratio = c.verdict, c.ratio
            new, base = samples.get((arm, c.workload, c.compiler)), samples.get(("A", c.workload, c.compiler))
            verdict = judge(new, base, cmp_cfg)[0] if new and base else Verdict.UNCHANGED
            c.confirmed = verdict == first
            if not c.confirmed:
                c.verdict = Verdict.UNCHANGED
                c.note = f"{c.note}; not confirmed side by side (first ratio {first_ratio:.3f})".lstrip("; ")
            print(
                f"[confirm] {c.workload}@{c.compiler} run {arm}: first {first} ({first_ratio:.3f}), again "
                f"{verdict}",
                file=sys.stderr,
                flush=True,
            )


def cmd_selftest(args: argparse.Namespace) -> int:
    s = bench_settings()
    cmp_cfg = CompareConfig(threshold=s.threshold, alpha=s.alpha).for_device("cpu")
    cfg = BenchConfig(
        device="cpu",
        compilers=[c.strip() for c in args.compilers.split(",") if c.strip()],
        only=args.only,
        plant=None,
        **(defaults_for("cpu") | SIDE_BY_SIDE),
    )
    cfg.compilers = check_compilers(cfg.compilers)
    target, compiler = args.plant_workload, plant_compiler(cfg.compilers)
    plant = Plant(target, compiler, args.fraction)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-selftest-") as tmp:
        db = args.db if args.db is not None else Path(tmp) / "bench.sqlite"
        with Store(db) as store:
            arms = measure_side_by_side(cfg, store, plant)
            (a_run, a_res), (b_run, b_res), (c_run, c_res) = (arms[x] for x in ARMS)
            base = load_baseline(store, [a_run])
            self_cmps = compare(a_res, base, cmp_cfg, new_run=a_run)
            b_cmps = compare(b_res, base, cmp_cfg, new_run=b_run)
            c_cmps = compare(c_res, base, cmp_cfg, new_run=c_run)
            confirm_side_by_side(
                cfg, store, plant, {a: arms[a][0] for a in ARMS}, {"B": b_cmps, "C": c_cmps}, cmp_cfg
            )

    checks: list[tuple[str, bool, str]] = []
    n = len({r.workload for r in a_res})
    checks.append((f"at least {MIN_WORKLOADS} workloads", n >= MIN_WORKLOADS, f"{n} workloads"))
    for name, cmps in (("run A against itself", self_cmps), ("identical run B against A", b_cmps)):
        bad = _regressed(cmps)
        checks.append((f"{name}: nothing regressed", not bad, ", ".join(bad) or report.counts_line(cmps)))
    hit = [x for x in c_cmps if (x.workload, x.compiler) == (target, compiler)]
    checks.append(
        (
            f"planted {args.fraction:.0%} slowdown in {target}@{compiler} is flagged",
            bool(hit) and hit[0].verdict == Verdict.REGRESSED,
            f"verdict {hit[0].verdict}, ratio {hit[0].ratio:.3f}"
            if hit and hit[0].ratio
            else f"no comparison: {target}@{compiler} has no result in both runs",
        )
    )
    others = [x for x in _regressed(c_cmps) if not x.startswith(f"{target}@{compiler} ")]
    checks.append(("planted run: nothing else regressed", not others, ", ".join(others) or "none"))

    lines: list[str] = []
    for name, cmps in (("B vs A", b_cmps), ("C vs A", c_cmps)):
        lines += [
            f"### {name}",
            "",
            report.counts_line(cmps),
            "",
            report.markdown(report.comparison_table(cmps, only_flagged=True)),
            "",
        ]
    lines += ["### Run A", "", report.markdown(report.side_by_side(a_res, a_run.compilers)), ""]
    print(report.run_header(c_run))
    print(report.terminal(report.comparison_table(c_cmps, only_flagged=True)))
    return _conclude(checks, lines, args.md)


def _conclude(checks: list[tuple[str, bool, str]], lines: list[str], md: Path | None) -> int:
    ok_all = all(passed for _, passed, _ in checks)
    head = ["## kiln bench self-test: " + ("PASSED" if ok_all else "FAILED"), ""]
    head += [f"- {'PASS' if p else 'FAIL'} {name}: {detail}" for name, p, detail in checks] + [""]
    text = "\n".join(head + lines)
    for name, p, detail in checks:
        print(f"{'PASS' if p else 'FAIL'}  {name}: {detail}")
    if md:
        atomic_write_text(md, text)
    append_job_summary(text)
    print("bench self-test " + ("passed" if ok_all else "FAILED"), file=sys.stderr)
    return 0 if ok_all else 1
