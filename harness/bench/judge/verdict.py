"""The last lines of a job with bench steps: `python -m harness bench verdict --step NAME REPORT EXIT ...`.

One line per bench step, from its JSON report (`bench run --json`, `bench models`' report.json: their
`comparisons`, each with the verdict its run stored) and its exit status, and an exit status that follows
them: 1 when a step confirmed a regression side by side or failed (an exit other than 0, or 1 without a
confirmed regression; a report missing after a non-zero exit), else 0. Terms:
- *regressed (confirmed side by side)*: the candidate measured slower than the baseline build, both taking
  turns in one process pair (harness/bench/kernels/sidebyside.py); fails the job.
- *suspect rejected*: flagged against the baseline's stored samples, not confirmed side by side.
- *unconfirmed*: flagged, but the baseline build could not be measured (its commit not in this checkout...).
- *inconclusive*: measured side by side on a host too noisy to tell a threshold-sized change (the line gives
  the noise floor the A/A pair measured); never fails, never counts as a pass.
- *suspect*: flagged against stored samples only (the model tier: no side-by-side confirmation); never fails.
A kiln timing under Triton's interpreter (CPU) is labelled: it checks the pipeline, not kernel speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.bench.core.records import INTERPRETER_LABEL, Comparison, Verdict, comparisons_of
from harness.exc import UsageError


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read bench report {path}: {e}") from None
    return data if isinstance(data, dict) else None


def _target(c: Comparison) -> str:
    ratio = c.sbs_ratio or c.ratio
    text = f"{c.workload}@{c.compiler}" + (f" x{ratio:.2f}" if ratio else "")
    return text + (f" {INTERPRETER_LABEL}" if c.interpreter else "")


def step_verdict(name: str, report: dict[str, Any] | None, rc: int) -> tuple[str, bool]:
    """(the step's line, whether it fails the job) from its report and exit status (module docstring)."""
    cmps = comparisons_of(report)
    if cmps is None:
        what = "no report" if report is None else "nothing compared (no baseline run)"
        failed = rc != 0
        return f"bench {name}: {what}" + (
            f"; the step failed (exit {rc})" if failed else ""
        ) + f" -> {'FAIL' if failed else 'ok'}", failed
    regressed = [c for c in cmps if c.confirmed_regression]
    n = {
        v: sum(1 for c in cmps if c.verdict == v)
        for v in (
            Verdict.REJECTED,
            Verdict.UNCONFIRMED,
            Verdict.INCONCLUSIVE,
            Verdict.SUSPECT,
            Verdict.IMPROVED,
        )
    }
    parts = [
        f"{len(regressed)} regressed (confirmed side by side)"
        + (": " + ", ".join(_target(c) for c in regressed) if regressed else "")
    ]
    parts.append(f"{n[Verdict.REJECTED]} suspect(s) rejected side by side")
    if n[Verdict.UNCONFIRMED]:
        parts.append(
            f"{n[Verdict.UNCONFIRMED]} unconfirmed (baseline build not measurable): "
            + ", ".join(_target(c) for c in cmps if c.verdict == Verdict.UNCONFIRMED)
        )
    if n[Verdict.INCONCLUSIVE]:
        parts.append(
            f"{n[Verdict.INCONCLUSIVE]} inconclusive (host too noisy to decide, not failing): "
            + ", ".join(
                _target(c) + (f" noise {c.sbs_noise:.0%}" if c.sbs_noise is not None else "")
                for c in cmps
                if c.verdict == Verdict.INCONCLUSIVE
            )
        )
    if n[Verdict.SUSPECT]:
        parts.append(f"{n[Verdict.SUSPECT]} suspect(s) against stored samples only (not failing)")
    if n[Verdict.IMPROVED]:
        parts.append(f"{n[Verdict.IMPROVED]} improved")
    failed = bool(regressed) or rc not in (0, 1) or (rc == 1 and not regressed)
    if rc != 0 and not (rc == 1 and regressed):
        parts.append(f"the step failed (exit {rc})")
    return f"bench {name}: " + ", ".join(parts) + f" -> {'FAIL' if failed else 'ok'}", failed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--step",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "REPORT", "EXIT"),
        help="a bench step: its name, its JSON report and its exit status (repeatable)",
    )


def cmd_verdict(args: argparse.Namespace) -> int:
    """The `bench verdict` verb (module docstring)."""
    if not args.step:
        raise UsageError("give at least one --step NAME REPORT EXIT")
    failed_any = False
    for name, report, rc in args.step:
        try:
            code = int(rc)
        except ValueError:
            raise UsageError(f"--step {name}: exit status {rc!r} is not a number") from None
        line, failed = step_verdict(name, _read(Path(report)), code)
        failed_any |= failed
        print(line, flush=True)
    if failed_any:
        print(
            "bench: FAILED (a regression was confirmed side by side, or a bench step failed)", file=sys.stderr
        )
    return 1 if failed_any else 0
