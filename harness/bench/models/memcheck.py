"""One model row's memory, by hand against `torch.cuda.memory_stats` (GPU):

    python -m harness.bench.models.memcheck model.ci_gpt2.train.fp32 [--compilers eager,kiln-cg,inductor-cg]
        [--json FILE] [--md FILE]

1. *tier*: the model tier's own measurement (`ModelExecutor.open_case`: every arm prepared, its
   `meta.memory` from `model_memory.MemoryWindow`), no samples taken.
2. *by hand*: each arm again, alone, with the allocator's raw counters read at every point (before the model
   copy, after the first step, after each later step) and the driver's used bytes (`torch.cuda.mem_get_info`)
   beside them; the by-hand peak is `allocated_bytes.all.peak` read after the window's steps minus
   `allocated_bytes.all.current` before the copy, with the same reset after the first step.
3. *static bytes*: parameters, gradients and optimizer state on the device after the steps.
Checks (exit 1 when one fails): the tier's peak allocated equals the by-hand one within max(8 MiB, 5%), and in
training it is at least 95% of the static bytes for every arm (inductor-cg's replayed gradients live in pool
memory the allocator stops counting once recorded, which the old window, opened after recording, missed; the
window sees them while it records). The driver's used bytes are printed, not checked (CUDA context, module
loads and graph instantiation live outside the allocator).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

from harness import arms
from harness.bench.models import catalog as mdl
from harness.bench.models import memory as mm
from harness.exc import UsageError
from harness.results import atomic_write_text, markdown_table

MIB = 2**20
KEYS = (mm.ALLOC_NOW, mm.ALLOC_PEAK, mm.RES_NOW, mm.RES_PEAK)


def _snap(device: torch.device, label: str) -> dict[str, Any]:
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {"point": label, **{k: int(stats.get(k, 0)) for k in KEYS}, "driver_used": int(total - free)}


def static_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> int:
    """Bytes of parameters, gradients and optimizer state tensors (each storage once)."""
    seen: dict[int, int] = {}
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    if opt is not None:
        tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        if t.device.type == "cuda":
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def by_hand(
    case: mdl.ModelCase, base: torch.nn.Module, compiler: str, device: torch.device, steps: int
) -> dict[str, Any]:
    """One arm alone with raw counters at every point (module docstring)."""
    from harness.bench.models.run import Stepper

    torch._dynamo.reset()
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    points = [_snap(device, "before the model copy")]
    from harness.bench.models.run import kiln_capture
    from harness.bench.models.step_facts import graph_report

    with kiln_capture(compiler) as graphs:
        st = Stepper(case, base, compiler, device)
        st.step()
    points.append(_snap(device, "after the first step"))
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    points.append(_snap(device, "window opened"))
    for i in range(steps):
        st.step()
        points.append(_snap(device, f"after window step {i + 1}"))
    out = {
        "points": points,
        "peak_allocated_bytes": max(0, points[-1][mm.ALLOC_PEAK] - points[0][mm.ALLOC_NOW]),
        "peak_reserved_bytes": max(0, points[-1][mm.RES_PEAK] - points[0][mm.RES_NOW]),
        "driver_used_delta_bytes": max(p["driver_used"] for p in points) - points[0]["driver_used"],
        "static_bytes": static_bytes(st.model, st.opt),
    }
    if graphs is not None:
        out["graphs"] = graph_report(graphs)
    del st, graphs
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    after = _snap(device, "after the arm was dropped (dynamo reset, gc, empty_cache)")
    out["points"].append(after)
    out["left_allocated_bytes"] = max(0, after[mm.ALLOC_NOW] - points[0][mm.ALLOC_NOW])
    return out


def check(case_name: str, compilers: list[str], steps: int = 6) -> tuple[dict[str, Any], list[str]]:
    """(the measurements per arm, failed checks)."""
    from harness.bench.core.executor import finished
    from harness.bench.models.run import (
        BASELINE_COMPILER,
        ModelBenchConfig,
        ModelExecutor,
        check_compilers,
        defaults_for,
    )

    device = torch.device("cuda")
    compilers, notes = check_compilers(compilers, "cuda")
    case = mdl.find(case_name, "gpu", "cuda")
    problem = mdl.package_problem(case.spec.package)
    if problem:
        raise UsageError(f"{case.name}: {case.spec.package} is not importable ({problem})")
    kw = {k: v for k, v in defaults_for("cuda").items() if k != "profile"}
    kw.update(compile_times=[], kernel_steps=0)
    ex = ModelExecutor(ModelBenchConfig(device="cuda", compilers=compilers, profile="gpu", **kw))
    torch._dynamo.reset()
    oc = ex.open_case(case, compilers)
    tier = {c: finished(p) for c, p in oc.prepared.items()}
    base = case.build(0)
    ex.close_case(oc)
    out: dict[str, Any] = {
        "case": case.name,
        "definition": mm.DEFINITION,
        "counted": mm.DESCRIPTION,
        "arms": {},
    }
    failed = []
    for c in compilers:
        r = tier[c]
        if r.status != "ok" or r.meta.memory is None:
            failed.append(f"{c}: the tier measured nothing ({r.error or 'no memory'})")
            continue
        hand = by_hand(case, base, c, device, steps)
        t_alloc = r.meta.memory["peak_allocated_bytes"]
        h_alloc = hand["peak_allocated_bytes"]
        out["arms"][c] = {"tier": r.meta.memory, "by_hand": hand, "tier_graphs": r.meta.kiln_graphs}
        if abs(t_alloc - h_alloc) > max(8 * MIB, 0.05 * h_alloc):
            failed.append(
                f"{c}: tier peak allocated {t_alloc / MIB:.1f} MiB != by hand {h_alloc / MIB:.1f} MiB"
            )
        if hand["left_allocated_bytes"] > max(8 * MIB, 0.05 * h_alloc):
            failed.append(
                f"{c}: {hand['left_allocated_bytes'] / MIB:.1f} MiB still allocated after the arm's model, "
                "compiled graphs and Dynamo's caches were dropped"
            )
        if case.mode == "train" and t_alloc < 0.95 * hand["static_bytes"]:
            failed.append(
                f"{c}: tier peak allocated {t_alloc / MIB:.1f} MiB < weights + gradients + optimizer "
                f"state {hand['static_bytes'] / MIB:.1f} MiB"
            )
    if BASELINE_COMPILER not in compilers:
        notes.append("no eager arm: no ratio")
    out["notes"], out["failed"] = notes, failed
    return out, failed


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# Memory of {res['case']} by hand",
        "",
        f"Counted ({res['definition']}): {res['counted']}.",
        "",
    ]
    lines += markdown_table(
        [
            "arm",
            "tier alloc MiB",
            "by hand alloc MiB",
            "tier reserved MiB",
            "by hand reserved MiB",
            "driver used delta MiB",
            "weights+grads+opt MiB",
        ],
        (
            [
                c,
                f"{a['tier']['peak_allocated_bytes'] / MIB:.1f}",
                f"{a['by_hand']['peak_allocated_bytes'] / MIB:.1f}",
                f"{a['tier']['peak_reserved_bytes'] / MIB:.1f}",
                f"{a['by_hand']['peak_reserved_bytes'] / MIB:.1f}",
                f"{a['by_hand']['driver_used_delta_bytes'] / MIB:.1f}",
                f"{a['by_hand']['static_bytes'] / MIB:.1f}",
            ]
            for c, a in res["arms"].items()
        ),
        "lrrrrrr",
    )
    for c, a in res["arms"].items():
        lines += ["", f"## {c}: torch.cuda.memory_stats by hand (MiB)", ""]
        lines += markdown_table(
            ["point", "allocated", "allocated peak", "reserved", "reserved peak", "driver used"],
            (
                [p["point"]] + [f"{p[k] / MIB:.1f}" for k in (*KEYS, "driver_used")]
                for p in a["by_hand"]["points"]
            ),
            "lrrrrr",
        )
        for where, rep in (("tier", a.get("tier_graphs")), ("by hand", a["by_hand"].get("graphs"))):
            for g in (rep or {}).get("cudagraphs", []):
                lines.append(
                    f"- {where}: CUDA graph {g.get('graph')} ({g.get('role')}): warm-ups {g.get('warmups')}, "
                    f"recordings {g.get('recordings')}, replays {g.get('replays')}, unrecorded "
                    f"{g.get('unrecorded')} {g.get('unrecorded_why') or ''} {g.get('reasons') or ''}"
                )
    lines += [""] + [f"- FAILED: {f}" for f in res["failed"]] + [f"- note: {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.bench.models.memcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("case", help="a gpu-profile model case, e.g. model.ci_gpt2.train.fp32")
    ap.add_argument("--compilers", default=f"{arms.EAGER},{arms.KILN_CG},{arms.INDUCTOR_CG}")
    ap.add_argument(
        "--steps", type=int, default=6, help="window steps by hand (warm-up and recording included)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the memory check needs a CUDA device", file=sys.stderr)
        return 3
    try:
        res, failed = check(args.case, arms.split(args.compilers), args.steps)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    md = markdown(res)
    if args.md:
        atomic_write_text(args.md, md)
    if args.json:
        atomic_write_text(args.json, json.dumps(res, indent=1))
    print(md)
    print(f"memory check: {len(res['arms'])} arm(s), {len(failed)} failed check(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
