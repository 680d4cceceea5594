"""Where a model step's time goes, per compiler: `python -m harness bench model-profile --only PATTERN`.

For each model case and compiler: build the case as the model tier does (`model_run.Stepper`), warm up,
then profile `--steps` steps with `torch.profiler` and report
- *step ms*: wall-clock per step (device synchronized), as the model tier measures it;
- *device ms*: summed kernel and copy time per step (the GPU's share; on CPU, the CPU ops' self time);
- *launches*: device kernels and memcpy/memset per step (each one costs host time to launch);
- the top kernels by device time, with their share and calls per step; and for kiln the graphs it made
  (kernels, ATen fallback ops and their reasons, graphs that ran unrecorded under CUDA graphs and why), so a
  gap to Inductor names the kernels that make it;
- *host gaps* (GPU): the device's idle ms per step (time between consecutive kernels/copies inside the
  profiled steps: the GPU waiting for the host), the largest gaps with the kernels around them, and the CUDA
  runtime calls per step (`cudaGraphLaunch` replays vs `cudaLaunchKernel`/`cuLaunchKernel` launches outside
  a graph, copies, synchronizations): where a CUDA-graph step still runs on the host.
The Markdown goes to `--md` (written whole or not at all), a summary line per compiler to stdout.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.bench.models import catalog as mdl
from harness.bench.models.step_facts import device_events as _device_events
from harness.bench.models.step_facts import graph_report, unrecorded_lines
from harness.results import markdown_table


@dataclass
class Profile:
    """One case under one compiler: per-step figures and the kernels ranked by device time."""

    case: str
    compiler: str
    step_ms: float
    device_ms: float
    launches: float
    top: list[tuple[str, float, float]]  # (kernel name, ms per step, calls per step)
    graphs: list[str] = field(default_factory=list)
    gaps: dict[str, Any] = field(default_factory=dict)  # host_gaps(); empty on CPU


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


RUNTIME_CALLS = (
    "cudaGraphLaunch",
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchKernelExC",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMalloc",
    "cudaFree",
)


def host_gaps(events: list[Any], steps: int, top: int = 10) -> dict[str, Any]:
    """Idle device time between consecutive device events and the runtime calls, per step (module
    docstring). `events`: the profile's FunctionEvents (`time_range` in us, `device_type`, `name`)."""
    dev = sorted(
        (e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    gaps = []
    end = None
    prev = ""
    for e in dev:
        if end is not None and e.time_range.start > end:
            gaps.append((e.time_range.start - end, prev, e.name))
        if end is None or e.time_range.end > end:
            end, prev = e.time_range.end, e.name
    calls = collections.Counter(
        e.name for e in events if e.device_type != torch.autograd.DeviceType.CUDA and e.name in RUNTIME_CALLS
    )
    gaps.sort(key=lambda g: -g[0])
    return {
        "idle_ms": round(sum(g[0] for g in gaps) / 1e3 / steps, 4),
        "top": [(round(us, 1), _short(a, 60), _short(b, 60)) for us, a, b in gaps[:top]],
        "runtime_calls": {k: round(v / steps, 1) for k, v in sorted(calls.items())},
    }


def profile_case(case: mdl.ModelCase, compiler: str, device: torch.device, steps: int, top: int) -> Profile:
    from harness.bench.models.run import Stepper, sync

    graphs: list[str] = []
    ctx: Any = None
    if compiler.startswith("kiln"):
        import compiler as kiln

        ctx = kiln.capture()
        seen = ctx.__enter__()
    try:
        st = Stepper(case, case.build(), compiler, device)
        for _ in range(3):
            st.step()
        sync(device)
        wall = st.timed(steps) / 1e6
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
            for g in seen:
                fb = collections.Counter(str(r.op) for r in g.all_fallbacks())
                graphs.append(
                    f"{g.kernel_count} kernels, fallbacks: "
                    + (", ".join(f"{op} x{n}" for op, n in sorted(fb.items())) or "none")
                )
            graphs += [
                f"unrecorded under CUDA graphs: {line}" for line in unrecorded_lines(graph_report(seen))
            ]
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            st.step()
        sync(device)
    evs = _device_events(prof, device.type)
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in evs:
        t = e.device_time_total if device.type == "cuda" else e.cpu_time_total
        per[e.name][0] += t
        per[e.name][1] += 1
    total_us = sum(v[0] for v in per.values())
    ranked = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    gaps = host_gaps(list(prof.events()), steps) if device.type == "cuda" else {}
    del st
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Profile(
        case.name,
        compiler,
        step_ms=wall,
        device_ms=total_us / 1e3 / steps,
        launches=len(evs) / steps,
        top=[(n, v[0] / 1e3 / steps, v[1] / steps) for n, v in ranked],
        graphs=graphs,
        gaps=gaps,
    )


def markdown(profiles: list[Profile]) -> str:
    lines = ["# Model step profiles", ""]
    lines += markdown_table(
        ["case", "compiler", "step ms", "device ms", "host-bound ms", "launches/step"],
        (
            [
                p.case,
                p.compiler,
                f"{p.step_ms:.3f}",
                f"{p.device_ms:.3f}",
                f"{max(0.0, p.step_ms - p.device_ms):.3f}",
                f"{p.launches:.0f}",
            ]
            for p in profiles
        ),
        "llrrrr",
    )
    for p in profiles:
        lines += ["", f"## {p.case} under {p.compiler}", ""]
        lines += markdown_table(
            ["kernel", "ms/step", "%", "calls/step"],
            (
                [
                    f"`{_short(name)}`",
                    f"{ms:.4f}",
                    f"{100 * ms / p.device_ms if p.device_ms else 0.0:.1f}",
                    f"{calls:g}",
                ]
                for name, ms, calls in p.top
            ),
            "lrrr",
        )
        if p.graphs:
            lines += ["", "kiln graphs:", ""] + [f"- {g}" for g in p.graphs]
        if p.gaps:
            calls = ", ".join(f"{k} {v:g}" for k, v in p.gaps["runtime_calls"].items()) or "none"
            lines += [
                "",
                f"GPU idle between kernels: {p.gaps['idle_ms']:.3f} ms/step; CUDA runtime calls per "
                f"step: {calls}",
                "",
            ]
            lines += markdown_table(
                ["idle us", "after", "before"],
                ([f"{us:.1f}", f"`{a}`", f"`{b}`"] for us, a, b in p.gaps["top"]),
                "rll",
            )
    return "\n".join(lines) + "\n"


def cmd_model_profile(args: argparse.Namespace) -> int:
    from harness.bench.models.run import check_compilers
    from harness.results import atomic_write_bytes

    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    profile = args.profile or ("gpu" if device.type == "cuda" else "tiny")
    cases = mdl.cases(profile, args.only, device.type)
    compilers, notes = check_compilers(
        [c.strip() for c in args.compilers.split(",") if c.strip()], str(device)
    )
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    out: list[Profile] = []
    for case in cases:
        for c in compilers:
            t0 = time.perf_counter()
            torch._dynamo.reset()
            try:
                p = profile_case(case, c, device, args.steps, args.top)
            except Exception as e:  # noqa: BLE001 - one failing compiler does not end the profile
                print(f"{case.name} {c}: error: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            out.append(p)
            print(
                f"{case.name:<34} {c:<12} step {p.step_ms:8.3f} ms  device {p.device_ms:8.3f} ms  "
                f"launches {p.launches:6.0f}  ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
    md = markdown(out)
    if args.md:
        atomic_write_bytes(Path(args.md), md.encode())
    else:
        print(md)
    return 0 if out else 1
