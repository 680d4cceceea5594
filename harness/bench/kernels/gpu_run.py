"""The GPU run for the lead's machine: every GPU-sized workload under kiln, inductor and eager, twice, then
the spread between the two runs for workloads above 100 microseconds (the goal: under 3%).

    python -m harness.bench gpu --out results/gpu        (or: python -m harness bench gpu --out ...)

Writes into --out: bench.sqlite (both runs, every sample), report.md (run 2 side by side, its comparison with
run 1, the spread table, a text plot), report.json, export.json (for `import`/`plot --from-json` elsewhere),
and PNG plots when matplotlib is installed (otherwise a note says how to make them later).
"""

from __future__ import annotations

import argparse
import json
import time

from harness.bench.judge.compare import CompareConfig
from harness.bench.kernels.execute import BenchConfig, defaults_for, resolve_device
from harness.bench.kernels.session import run_bench
from harness.bench.reports import report
from harness.bench.stores.store import Store
from harness.exc import UsageError
from harness.results import atomic_write_text

SPREAD_GOAL = 0.03
GPU_TARGET_S = 0.2  # seconds of measurement per workload and compiler
WARM_S = 3.0  # seconds of matmuls before run 1, so run 1 does not pay for clocks ramping up


def warm_clocks(device: str, seconds: float) -> None:
    """Keep the GPU busy for ``seconds`` so its clocks settle before anything is timed."""
    import torch

    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize(device)


def cmd_gpu(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if not device.startswith("cuda") and not args.allow_cpu:
        raise UsageError("the gpu run needs a GPU (torch.cuda.is_available() is False); use `run` on CPU")
    kw = defaults_for(device)
    if device.startswith("cuda"):
        kw["timer"] = args.timer
    # twice the default measuring time: more samples per workload narrow the run-to-run spread
    kw["target_s"] = args.target_s or max(kw.get("target_s", 0.1), GPU_TARGET_S)
    cfg = BenchConfig(
        device=device,
        compilers=[c.strip() for c in args.compilers.split(",") if c.strip()],
        only=args.only,
        **kw,
    )
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    cmp_cfg = CompareConfig().for_device(device)
    if device.startswith("cuda"):
        warm_clocks(device, WARM_S)
    t0 = time.monotonic()
    with Store(out / "bench.sqlite") as store:
        first = run_bench(cfg, store, label="gpu-run-1")
        t1 = time.monotonic()
        second = run_bench(cfg, store, label="gpu-run-2", baseline=f"run:{first.run.id}", cmp_cfg=cmp_cfg)
        t2 = time.monotonic()
        export = store.export([first.run.rid, second.run.rid])
    rows, summary = report.spread_table(first.results, second.results)
    summary.update({"goal": SPREAD_GOAL, "run1_s": round(t1 - t0, 1), "run2_s": round(t2 - t1, 1)})
    verdict = (
        f"spread between runs for workloads above 100 us: {summary['under_3pct']} of {summary['count']} "
        f"under 3%, max {_pct(summary['max_spread'])}, median {_pct(summary['median_spread'])} "
        f"(run 1 {summary['run1_s']} s, run 2 {summary['run2_s']} s)"
    )
    md = report.markdown_report(second.run, second.results, second.comparisons, second.baseline)
    md += "\n### Spread between run 1 and run 2 (workloads above 100 us)\n\n" + verdict + "\n\n"
    md += (report.markdown(rows) if len(rows) > 1 else "no workload above 100 us") + "\n"
    atomic_write_text(out / "report.md", md)
    js = report.json_report(second.run, second.results, second.comparisons, second.baseline)
    js["spread"] = {**summary, "rows": rows[1:]}
    atomic_write_text(out / "report.json", json.dumps(js, indent=1, default=str))
    atomic_write_text(out / "export.json", json.dumps(export, default=str))
    print(report.run_header(second.run))
    print(report.terminal(report.side_by_side(second.results, second.run.compilers)))
    print()
    print(f"run 2 against run 1: {report.counts_line(second.comparisons or [])}")
    if len(rows) > 1:
        worst = sorted(rows[1:], key=lambda r: -float(r[-1].rstrip("%")))[:10]
        print("largest spreads (all in report.md):")
        print(report.terminal([rows[0], *worst]))
    print(verdict)
    try:
        compilers = report.speedup_compilers(second.run.device, second.run.compilers)
        plots = (
            [report.plot_speedups(second.results, compilers, out / "speedups.png", run=second.run)]
            if [c for c in compilers if c != "eager"]
            else []
        )
        plots.append(
            report.plot_ratios(
                second.comparisons or [], cmp_cfg.threshold or 0.05, out / "run2_vs_run1.png", run=second.run
            )
        )
        print(f"plots: {', '.join(map(str, plots))}")
    except report.PlotUnavailable as e:
        print(f"note: {e}")
    print(f"wrote {out / 'report.md'}, {out / 'report.json'}, {out / 'export.json'}, {out / 'bench.sqlite'}")
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"
