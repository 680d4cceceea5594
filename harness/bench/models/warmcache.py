"""`python -m harness.bench.models.warmcache`: cold, warm and autotuned compile s of model cases, each compiler of a case
side by side, in fresh processes (`compile_times`); the stage `warmcache` of `ci/device_check.sh`.

    python -m harness.bench.models.warmcache --only PATTERNS [--compilers kiln,inductor] [--profile gpu]
                                      [--device cuda] [--no-autotune] [--autotune-compilers kiln]
                                      [--budget-s S] [--timeout-s S] [--json P] [--md P]

Exit 0 when every row was measured, 1 when a probe failed, 2 on bad arguments (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from harness import arms
from harness.bench.kernels.execute import resolve_device
from harness.bench.models import catalog as mdl
from harness.bench.models.compile_times import CompileTimes, measure, table
from harness.bench.models.run import ModelBenchConfig, compile_probe
from harness.exc import UsageError
from harness.results import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.bench.models.warmcache", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--only", required=True, help="model case patterns (comma-separated), as `bench models`")
    ap.add_argument("--compilers", default=f"{arms.KILN},{arms.INDUCTOR}")
    ap.add_argument("--profile", default=None, help="tiny or gpu (default: gpu on CUDA, else tiny)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    ap.add_argument("--no-autotune", action="store_true", help="cold and warm only")
    ap.add_argument(
        "--autotune-compilers",
        default=None,
        help="compilers also measured autotuned (default: every one of --compilers)",
    )
    ap.add_argument("--budget-s", type=float, default=None, help="start no case past this many seconds")
    ap.add_argument(
        "--timeout-s", type=float, default=900.0, help="compile limit of one probe (it gets 120 s more)"
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        device = resolve_device(args.device)
        profile = args.profile or ("gpu" if device.startswith("cuda") else "tiny")
        compilers = [a.name for a in arms.check(arms.split(args.compilers), "model") if a.name != arms.EAGER]
        runnable, problems = mdl.available(mdl.cases(profile, args.only, device))
    except (UsageError, arms.UnknownArm) as e:
        print(f"warmcache: {e}", file=sys.stderr)
        return 2
    for line in problems.values():
        print(f"note: {line}", file=sys.stderr)
    cfg = ModelBenchConfig(
        device=device, profile=profile, compilers=compilers, compile_timeout_s=args.timeout_s
    )
    interp = (
        f"Device {device}: kernels run through Triton's interpreter; autotuning is a no-op there and step "
        "times are the interpreter's (pipeline check only)."
    )
    note = [interp] if device == "cpu" else []
    rows: list[CompileTimes] = []
    start = time.monotonic()
    for case in runnable:
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            print(f"note: budget of {args.budget_s:.0f}s spent; {case.name} not measured", file=sys.stderr)
            continue
        for c in compilers:  # side by side: each case's compilers one after the other
            tune = not args.no_autotune and (
                args.autotune_compilers is None or c in arms.split(args.autotune_compilers)
            )
            rows.append(measure(case.name, c, compile_probe(case, c, cfg), autotune=tune))
            print(table(rows[-1:])[2], flush=True)
            _write(
                args, rows, note
            )  # after every row: a stage killed at its time limit keeps what it measured
    print("\n".join(table(rows) + note))
    return 0 if rows and not any(r.problems for r in rows) else 1


def _write(args: argparse.Namespace, rows: list[CompileTimes], note: list[str]) -> None:
    if args.md:
        atomic_write_text(args.md, "\n".join(table(rows) + ([""] + note if note else [])) + "\n")
    if args.json:
        atomic_write_text(args.json, json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
