"""Cold, warm and autotuned compile times of model cases, each in fresh processes (issue 25).

    python -m harness.bench.compile_times --only PATTERNS [--compilers kiln,inductor] [--profile gpu]
                                          [--device cuda] [--no-autotune] [--budget-s S] [--json P] [--md P]

Terms, per case and compiler (every number from a fresh subprocess: the model tier's compile probe,
`model_run.probe_command`, which times 3 first steps against 3 steady ones):
- *cold*: empty caches (new TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, KILN_CACHE_DIR, XDG_CACHE_HOME: kiln's
  graph cache and autotune choices live under the last);
- *warm*: a second process on the same cache folders (kiln: the graph cache and Triton's kernels on disk;
  Inductor: its FX graph and AOTAutograd caches);
- *autotuned*: new empty caches with autotuning on (kiln: `KILN_AUTOTUNE=1`; Inductor:
  `TORCHINDUCTOR_MAX_AUTOTUNE=1`), then *autotuned warm*: a second process on those caches (no timing is
  expected: choices are cached on disk);
- *step*: the median of the probe's 3 steady steps, of the warm process (heuristic configs) and of the
  autotuned warm one: a rough side-by-side, not the model tier's measured step time.

The model tier calls `autotuned_meta` for its `--autotune-times` compilers and `report_lines` for its
report; `ci/device_check.sh warmcache` runs this module for 2-3 rows, kiln and Inductor side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import arms

#: environment that turns autotuning on, per compiler backend
AUTOTUNE_ENV: dict[str, dict[str, str]] = {arms.KILN: {"KILN_AUTOTUNE": "1"},
                                           arms.INDUCTOR: {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}}


@dataclass
class CompileTimes:
    """One case under one compiler; seconds, None where not measured (``error`` says why)."""

    case: str
    compiler: str
    cold_s: float | None = None
    warm_s: float | None = None
    autotune_s: float | None = None
    autotune_warm_s: float | None = None
    step_s: float | None = None
    autotune_step_s: float | None = None
    error: str = ""


def autotune_env(compiler: str) -> dict[str, str] | None:
    """The variables that autotune ``compiler``'s backend, or None (eager, unknown backends)."""
    arm = arms.ARMS.get(compiler)
    backend = arm.backend if arm is not None else compiler
    return AUTOTUNE_ENV.get(backend)


def probe(cmd: list[str], environ: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """The JSON line of one compile probe (``compile_s``, ``steady_s``...), or ``{"error": one line}``."""
    from .model_run import PROBE_TAG, REPO

    try:
        p = subprocess.run(cmd, env=environ, cwd=str(REPO), capture_output=True, text=True, timeout=timeout_s,
                           check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"probe took longer than {timeout_s:.0f}s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(PROBE_TAG):
            return json.loads(line[len(PROBE_TAG):])
    tail = [ln.strip() for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
    return {"error": f"probe exit {p.returncode}: {tail[-1][:200] if tail else 'no output'}"}


def _pair(case: Any, compiler: str, cfg: Any, extra: dict[str, str]) -> tuple[dict, dict]:
    """(first, second) probe of ``case`` in two fresh processes sharing new, initially empty cache folders."""
    from .model_run import _probe_env, probe_command

    folder = Path(tempfile.mkdtemp(prefix="kiln-compile-times-"))
    try:
        environ = {**_probe_env(folder), **extra}
        cmd = probe_command(case, compiler, cfg)
        first = probe(cmd, environ, cfg.compile_timeout_s + 120)
        if "error" in first:
            return first, {}
        return first, probe(cmd, environ, cfg.compile_timeout_s + 120)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(case: Any, compiler: str, cfg: Any, autotune: bool = True) -> CompileTimes:
    """Cold and warm, then (when ``autotune`` and the compiler can) autotuned cold and warm compile s."""
    out = CompileTimes(case.name, compiler)
    first, second = _pair(case, compiler, cfg, {})
    out.cold_s, out.warm_s, out.step_s = first.get("compile_s"), second.get("compile_s"), second.get("steady_s")
    errors = [f"{what}: {d['error']}" for what, d in (("cold", first), ("warm", second)) if "error" in d]
    extra = autotune_env(compiler)
    if autotune and extra is not None and not errors:
        first, second = _pair(case, compiler, cfg, extra)
        out.autotune_s, out.autotune_warm_s = first.get("compile_s"), second.get("compile_s")
        out.autotune_step_s = second.get("steady_s")
        errors += [f"{what}: {d['error']}" for what, d in (("autotuned", first), ("autotuned warm", second))
                   if "error" in d]
    out.error = "; ".join(errors)
    return out


def autotuned_meta(case: Any, compiler: str, cfg: Any) -> dict[str, Any]:
    """The model tier's extra ``Result.meta`` for one case and compiler: autotuned compile s (cold, warm) and
    the probes' steady step s with heuristic and autotuned configs."""
    t = measure(case, compiler, cfg)
    meta = {"compile_autotune_s": t.autotune_s, "compile_autotune_warm_s": t.autotune_warm_s,
            "probe_step_s": t.step_s, "probe_autotune_step_s": t.autotune_step_s}
    if t.error:
        meta["compile_autotune_error"] = t.error
    return meta


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(rows: list[CompileTimes]) -> list[str]:
    """A Markdown table of ``rows``, with the autotuned step gain (heuristic step / autotuned step)."""
    lines = ["| case | compiler | cold s | warm s | warm/cold | autotuned s | autotuned warm s | step ms | "
             "autotuned step ms | gain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.warm_s / r.cold_s if r.cold_s and r.warm_s is not None else None
        gain = r.step_s / r.autotune_step_s if r.step_s and r.autotune_step_s else None
        lines.append(f"| {r.case} | {r.compiler} | {_f(r.cold_s)} | {_f(r.warm_s)} | {_f(ratio, '{:.0%}')} | "
                     f"{_f(r.autotune_s)} | {_f(r.autotune_warm_s)} | {_f(r.step_s and r.step_s * 1e3, '{:.2f}')} | "
                     f"{_f(r.autotune_step_s and r.autotune_step_s * 1e3, '{:.2f}')} | {_f(gain, '{:.3f}')} |")
    gains = [r.step_s / r.autotune_step_s for r in rows if r.step_s and r.autotune_step_s]
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.step_s and r.autotune_step_s:
            by.setdefault(r.compiler, []).append(r.step_s / r.autotune_step_s)
    if gains:
        lines += [""] + [f"- autotuned step gain, geomean over {len(g)} rows: {c} "
                         f"{math.exp(sum(map(math.log, g)) / len(g)):.3f}" for c, g in by.items()]
    errors = [f"- {r.case} {r.compiler}: {r.error}" for r in rows if r.error]
    return lines + ([""] + errors if errors else [])


def report_lines(results: list[Any]) -> list[str]:
    """The model tier report's section for results carrying ``autotuned_meta`` (none: no lines)."""
    rows = [CompileTimes(r.workload, r.compiler, r.compile_s, r.meta.get("compile_warm_s"),
                         r.meta.get("compile_autotune_s"), r.meta.get("compile_autotune_warm_s"),
                         r.meta.get("probe_step_s"), r.meta.get("probe_autotune_step_s"),
                         r.meta.get("compile_autotune_error", ""))
            for r in results if "compile_autotune_s" in r.meta]
    if not rows:
        return []
    return ["### Compile times: cold, warm, autotuned (fresh processes)", "", *table(rows), ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.compile_times", description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="model case patterns (comma-separated), as `bench models`")
    ap.add_argument("--compilers", default=f"{arms.KILN},{arms.INDUCTOR}")
    ap.add_argument("--profile", default=None, help="tiny or gpu (default: gpu on CUDA, else tiny)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    ap.add_argument("--no-autotune", action="store_true", help="cold and warm only")
    ap.add_argument("--budget-s", type=float, default=None, help="start no case past this many seconds")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="compile limit of one probe (it gets 120 s more)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    from harness.exc import UsageError

    from . import models as mdl
    from .execute import resolve_device
    from .model_run import ModelBenchConfig

    try:
        device = resolve_device(args.device)
        profile = args.profile or ("gpu" if device.startswith("cuda") else "tiny")
        compilers = [a.name for a in arms.check(arms.split(args.compilers), "model") if a.name != arms.EAGER]
        runnable, problems = mdl.available(mdl.cases(profile, args.only, device))
    except (UsageError, arms.UnknownArm) as e:
        print(f"compile_times: {e}", file=sys.stderr)
        return 2
    for line in problems.values():
        print(f"note: {line}", file=sys.stderr)
    cfg = ModelBenchConfig(device=device, profile=profile, compilers=compilers, compile_timeout_s=args.timeout_s)
    note = ([f"Device {device}: kernels run through Triton's interpreter; autotuning is a no-op there and step "
             "times are the interpreter's (pipeline check only)."] if device == "cpu" else [])
    rows: list[CompileTimes] = []
    start = time.monotonic()
    for case in runnable:
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            print(f"note: budget of {args.budget_s:.0f}s spent; {case.name} not measured", file=sys.stderr)
            continue
        for c in compilers:  # side by side: each case's compilers one after the other
            rows.append(measure(case, c, cfg, autotune=not args.no_autotune))
            print(table(rows[-1:])[2], flush=True)
            _write(args, rows, note)  # after every row: a stage killed at its time limit keeps what it measured
    print("\n".join(table(rows) + note))
    return 0 if rows and not any(r.error for r in rows) else 1


def _write(args: argparse.Namespace, rows: list[CompileTimes], note: list[str]) -> None:
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text("\n".join(table(rows) + ([""] + note if note else [])) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
