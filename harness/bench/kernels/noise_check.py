"""How often side-by-side verdicts are wrong on this host: N A/A checks and N planted checks, under load.

`python -m harness.bench.kernels.noise_check --runs N [--load cpu:K | --load gpu] [--only CASES] [--device D]`

Each *check* is one side-by-side measurement of the `bench run` confirmation (`sidebyside.measure_pair`:
the baseline code in two processes and the candidate in two more, taking turns for `ROUNDS` rounds), with
all four processes over this tree:
- *A/A check*: nothing planted; every key (workload@compiler) judged `regressed` or `improved` is a false
  positive;
- *planted check*: the candidate carries a planted slowdown (`--fraction`, default 20%) in every workload
  under the planted compiler; a key judged `regressed` is a true positive, `inconclusive` is the host
  declining to decide, anything else a miss.
Every check is also judged by the statistic used before the round became the unit (a Mann-Whitney test of
the turns' ratios sqrt(c/b) against sqrt(b/c), baseline against candidate only), on the same turns, so that
both rates come from the same measurements.

`--load cpu:K` runs K busy loops beside the checks (one Python process each); `--load gpu` runs a process
that keeps the GPU busy with matrix products. The load processes are ended when the checks end. The last
line gives the rates (a line after every check gives them so far); `--json PATH` writes every check's verdicts
(rewritten after every check). Exit 0 when no A/A check gave a flagged
verdict, else 1.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness.bench.core.records import Result, Verdict
from harness.bench.judge.compare import CompareConfig, judge
from harness.bench.kernels.execute import BenchConfig, defaults_for
from harness.bench.kernels.sidebyside import judge_rounds, measure_pair, source_root, undecided_at
from harness.exc import UsageError

DEFAULT_CASES = "layer_norm.fwd.bf16.64x128,row_sum.fwd.fp32.64x128"
GPU_LOAD = (
    "import torch\nx = torch.randn(4096, 4096, device='cuda')\n"
    "while True:\n    y = x @ x\n    torch.cuda.synchronize()\n"
)


def old_verdict(base: Result, cand: Result, cfg: CompareConfig) -> Verdict:
    """The verdict of the earlier statistic: Mann-Whitney of the turns' sqrt(c/b) against sqrt(b/c)."""
    pairs = [(x, y) for x, y in zip(base.meta.rounds or [], cand.meta.rounds or []) if x > 0 and y > 0]
    if len(pairs) < 3:
        return Verdict.INCONCLUSIVE
    return Verdict(judge([math.sqrt(y / x) for x, y in pairs], [math.sqrt(x / y) for x, y in pairs], cfg)[0])


def start_load(spec: str | None) -> list[subprocess.Popen]:
    """The load processes of `--load` (module docstring)."""
    if not spec:
        return []
    kind, _, count = spec.partition(":")
    if kind == "gpu":
        return [subprocess.Popen([sys.executable, "-c", GPU_LOAD]) for _ in range(int(count or 1))]
    if kind == "cpu" and (not count or count.isdigit()):
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(count or 1))]
    raise UsageError(f"bad --load {spec!r} (use cpu:K or gpu)")


def check(
    cfg: BenchConfig, cases: list[str], compilers: list[str], plant: str | None, cmp_cfg: CompareConfig
) -> list[dict[str, Any]]:
    """One side-by-side check: per key, the verdict, ratio and noise floor, and the earlier statistic's verdict."""
    with tempfile.TemporaryDirectory(prefix="kiln-noise-") as tmp:
        arm_results = measure_pair(
            cfg.as_dict(),
            cases,
            compilers,
            source_root(),
            source_root(),
            plant,
            Path(tmp),
            undecided=undecided_at(cmp_cfg),
        )
    of = [{(r.workload, r.compiler): r for r in rs} for rs in arm_results]
    rows: list[dict[str, Any]] = []
    for key, b in of[0].items():
        got = [b, *(r for m in of[1:] if (r := m.get(key)) is not None)]
        if len(got) < len(of) or any(x.status != "ok" for x in got):
            rows.append({"key": "@".join(key), "verdict": "error", "old": "error"})
            continue
        c = got[2]
        j = judge_rounds(*got, cfg=cmp_cfg)
        rows.append(
            {
                "key": "@".join(key),
                "verdict": j.verdict.value,
                "ratio": j.ratio,
                "p": j.p,
                "noise": j.noise,
                "aa_ratio": j.aa_ratio,
                "bb_ratio": j.bb_ratio,
                "old": old_verdict(b, c, cmp_cfg).value,
                "planted": bool(c.planted),
                "rounds": j.rounds,
                "turns": [x.meta.rounds for x in got],
            }
        )
    return rows


def rates(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and rates over every key of every check, for the new and the earlier statistic."""
    aa = [r for ch in checks if not ch["plant"] for r in ch["rows"]]
    pl = [r for ch in checks if ch["plant"] for r in ch["rows"] if r.get("planted")]
    flagged = (Verdict.REGRESSED.value, Verdict.IMPROVED.value)

    def share(rows: list[dict[str, Any]], field: str, wanted: tuple[str, ...]) -> str:
        return f"{sum(1 for r in rows if r[field] in wanted)}/{len(rows)}"

    return {
        "aa_keys": len(aa),
        "planted_keys": len(pl),
        "false_positive": share(aa, "verdict", flagged),
        "false_positive_old": share(aa, "old", flagged),
        "aa_inconclusive": share(aa, "verdict", (Verdict.INCONCLUSIVE.value,)),
        "true_positive": share(pl, "verdict", (Verdict.REGRESSED.value,)),
        "true_positive_old": share(pl, "old", (Verdict.REGRESSED.value,)),
        "planted_inconclusive": share(pl, "verdict", (Verdict.INCONCLUSIVE.value,)),
        "aa_verdicts": dict(Counter(r["verdict"] for r in aa)),
        "planted_verdicts": dict(Counter(r["verdict"] for r in pl)),
    }


def _line(
    device: str,
    args: argparse.Namespace,
    n_cases: int,
    compilers: list[str],
    checks: list[dict[str, Any]],
    summary: dict[str, Any],
) -> str:
    n_aa = sum(1 for c in checks if not c["plant"])
    return (
        f"noise check ({device}, load {args.load or 'none'}, {n_aa} A/A + {len(checks) - n_aa} planted "
        f"{args.fraction:.0%} checks of {n_cases} workload(s) x {', '.join(compilers)}): "
        f"false positives {summary['false_positive']} (earlier statistic {summary['false_positive_old']}), "
        f"A/A inconclusive {summary['aa_inconclusive']}; planted confirmed {summary['true_positive']} "
        f"(earlier statistic {summary['true_positive_old']}), planted inconclusive "
        f"{summary['planted_inconclusive']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench.kernels.noise_check", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=10, help="A/A checks, and as many planted checks (default 10)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated workloads (default on CPU: {DEFAULT_CASES}; "
        "on CUDA: the first four of the gpu profile)",
    )
    p.add_argument(
        "--compilers", default="kiln", help="measured compilers; the first is planted (default kiln)"
    )
    p.add_argument("--fraction", type=float, default=0.2, help="the planted slowdown (default 0.2)")
    p.add_argument(
        "--load", default=None, help="cpu:K busy loops or gpu (a process of matrix products) beside"
    )
    p.add_argument("--json", type=Path, default=None, help="write every check's verdicts and the rates here")
    args = p.parse_args(argv)
    if args.runs < 1 or not 0 < args.fraction < 10:
        raise UsageError("--runs must be at least 1 and --fraction between 0 and 10")
    from harness.bench.kernels import workloads as wl
    from harness.bench.kernels.session import prepare_kiln

    cfg = BenchConfig(device=args.device, compilers=[], **defaults_for(args.device))
    names = [c.name for c in wl.cases(cfg.profile, None)]
    cases = (
        args.only.split(",")
        if args.only
        else (DEFAULT_CASES.split(",") if cfg.device == "cpu" else names[:4])
    )
    if unknown := [c for c in cases if c not in names]:
        raise UsageError(f"unknown workload(s) for profile {cfg.profile}: {', '.join(unknown)}")
    compilers = [c.strip() for c in args.compilers.split(",") if c.strip()]
    if "kiln" in compilers:
        prepare_kiln()
    cmp_cfg = CompareConfig().for_device(cfg.device)
    plant = f"*@{compilers[0]}={args.fraction:g}"
    load = start_load(args.load)
    checks: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    try:
        for i in range(args.runs):
            for spec in (None, plant):
                t0 = time.monotonic()
                rows = check(cfg, cases, compilers, spec, cmp_cfg)
                checks.append({"plant": spec, "rows": rows, "seconds": round(time.monotonic() - t0, 1)})
                for r in rows:
                    print(
                        f"[{i + 1}/{args.runs}] {'planted' if spec else 'A/A    '} {r['key']:<40} {r['verdict']:<12} "
                        f"x{r.get('ratio') or 0:.3f} noise {r.get('noise') or 0:.0%} over {r.get('rounds', 0)} "
                        f"rounds (earlier statistic: {r['old']})",
                        flush=True,
                    )
                # after every check, so that a run cut short by a time limit still leaves its rates
                summary = rates(checks)
                if args.json:
                    args.json.write_text(
                        json.dumps(
                            {
                                "checks": checks,
                                "rates": summary,
                                "load": args.load,
                                "device": cfg.device,
                                "cases": cases,
                                "compilers": compilers,
                            },
                            indent=1,
                        )
                    )
                print(_line(cfg.device, args, len(cases), compilers, checks, summary), flush=True)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    return 0 if summary["false_positive"].startswith("0/") else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as e:
        print(f"noise_check: {e}", file=sys.stderr)
        sys.exit(2)
