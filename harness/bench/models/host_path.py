"""Kiln's host time per step of model cases, split by phase, with kernel launches stubbed (no GPU needed).

    python -m harness.bench.models.host_path [--only PATTERNS] [--profile tiny] [--reps N] [--samples N]
                                             [--compare] [--json FILE]

Each case of the model tier (``catalog``) is compiled with kiln on the CPU (Triton's interpreter) and warmed
up; then its step runs with every kernel launch taking the launcher's GPU fast path with a no-op kernel
(``compiler.tools.host_path``). Columns, µs per step (medians of interleaved samples):

- *step*: the whole step; *outside*: the step minus kiln's wrappers (Dynamo's guards, AOTAutograd's runtime
  wrappers, autograd, the step's eager code);
- *launcher*: kiln's launcher (the wrappers with and without their kernels), and *µs/launch* = launcher /
  *launches*;
- *alloc*, *views*, *sizes*, *extern*: the wrappers' other nodes replayed by kind (``extern`` includes the
  CPU compute of ATen calls: an upper bound of their host time on a GPU).

``--compare`` times the launcher's lean path (``launcher.LEAN``, the default) against the path it replaced,
interleaved in the same process: the *old* row of each case is the same step with ``LEAN`` off.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from harness.bench.models import catalog as mdl

COLUMNS = (
    "step",
    "outside",
    "launch",
    "launches",
    "us_per_launch",
    "old_us_per_launch",
    "alloc",
    "views",
    "sizes",
    "extern",
    "fx",
)


def profile_case(case: mdl.ModelCase, reps: int, samples: int, compare: bool = False) -> dict[str, Any]:
    """One case's host profile under kiln (``HostProfile``'s phases, µs per step; µs per launch)."""
    import compiler
    from compiler.tools import host_path
    from harness.bench.models.run import Stepper

    torch._dynamo.reset()
    base = case.build(0)
    with compiler.capture() as graphs:
        st = Stepper(case, base, "kiln", torch.device("cpu"), 0)
        st.step()
    prof = host_path.profile_step(st.step, graphs, reps=reps, samples=samples, compare=compare)
    row: dict[str, Any] = {"case": case.name, "step": prof.step_us, "launches": prof.launches}
    row.update(prof.phases(), us_per_launch=prof.per_launch_us, old_us_per_launch=prof.old_per_launch_us)
    return row


def _cell(r: dict[str, Any], c: str) -> str:
    v = r.get(c)
    if v is None:
        return "-"
    return str(v) if c == "launches" else f"{v:.2f}" if "per_launch" in c else f"{v:.1f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``profile_case`` rows (µs per step; µs per launch)."""
    lines = ["| case | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        lines.append(f"| {r['case']} | " + " | ".join(_cell(r, c) for c in COLUMNS) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.bench.models.host_path", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--only", default="", help="comma-separated name patterns of model cases (default: all)")
    ap.add_argument("--profile", default="tiny", help="model tier profile (default tiny: runs on CPU)")
    ap.add_argument("--reps", type=int, default=20, help="calls per sample")
    ap.add_argument("--samples", type=int, default=7, help="samples per variant (interleaved)")
    ap.add_argument("--compare", action="store_true", help="also time the launcher's old path (rows 'old')")
    ap.add_argument("--json", default="", help="write the rows here")
    args = ap.parse_args(argv)
    from harness.bench.kernels.session import prepare_kiln
    from harness.exc import UsageError

    try:
        cases = mdl.cases(args.profile, args.only or None, "cpu")
    except UsageError as e:
        print(f"host_path: {e}", file=sys.stderr)
        return 2
    prepare_kiln()
    # one thread: on a loaded host, a CPU op's worker threads wait out scheduler slices (milliseconds a call)
    torch.set_num_threads(1)
    rows = []
    for case in cases:
        problem = mdl.package_problem(case.spec.package)
        if problem:
            print(f"host_path: {case.name}: skipped ({problem})", file=sys.stderr)
            continue
        row = profile_case(case, args.reps, args.samples, args.compare)
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
