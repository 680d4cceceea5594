"""Facts of a model step shared by the model tier (`model_run`, `model_report`) and `model_profile`: the device
events of a profile, kernel time per step, and what kiln made of a step (graphs, ATen fallbacks, CUDA-graph
runners and why their calls ran unrecorded).

Terms:
- *device events*: a profile's kernel and memcpy/memset events on a GPU; on CPU the innermost ATen ops.
- *kernel ms*: the device events' summed time per step (CUDA-graph replays included).
- *graph report*: `graph_report(graphs)` of `compiler.capture()` records, stored as `meta.kiln_graphs`.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from statistics import median_high
from typing import Any

import torch


def device_events(prof: Any, device_type: str) -> list[Any]:
    """Kernel and memcpy/memset events (GPU), or the innermost ATen ops (CPU: the work itself, whether
    called by eager, Inductor's C++ or kiln's wrapper; Triton's interpreter shows as the ops it runs)."""
    evs = prof.events()
    if device_type == "cuda":
        return [e for e in evs if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e for e in evs if e.name.startswith("aten::") and not e.cpu_children]


def kernel_time(step: Any, device: torch.device, steps: int) -> dict[str, float]:
    """Device kernel + copy ms and launches per step over `steps` calls of `step` under `torch.profiler`
    (kernels replayed from CUDA graphs included): the *kernel ms* of the model tier's table. CPU activity is
    on too, as in `profile_case` (device events are read as that reads them)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
    sync(device)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync(device)
    evs = device_events(prof, device.type)
    total_us = sum(e.device_time_total if device.type == "cuda" else e.cpu_time_total for e in evs)
    return {"kernel_ms": round(total_us / 1e3 / steps, 4), "launches": round(len(evs) / steps, 1)}


@dataclass
class HostSamples:
    """Host time samples of one arm's step, gathered a few at a time (the model tier takes them in every
    sampling round, the compilers taking turns, so a swing of the host's speed lands on every compiler alike):
    `idle`, ns a step takes to return when started on an idle device (synchronized before, not inside: kernel
    launches are queued, not waited for); `loop`, the same for calls back to back as the timing loop runs them;
    `cpu`, the process's CPU ns per call of the loop (every thread: the autograd engine's too), which a host
    thread woken late or a core's clock does not stretch the way it stretches wall time. They measure the host's
    work (Python, guards, argument binding, launches), not the kernels, unless the step waits for the device
    inside (a value read on the host): then the loop figures include that wait. On the GPU the idle-start
    figure has read up to twice the loop's step time for compiled inference rows (H200, 2026-11-28), which the
    host's own work cannot explain: the figures side by side say which one a row's host time is."""

    idle: list[int] = field(default_factory=list)
    loop: list[int] = field(default_factory=list)
    cpu: list[int] = field(default_factory=list)

    def take(self, step: Any, device: torch.device, steps: int) -> None:
        """`steps` more samples of each kind."""
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
        for _ in range(max(1, steps)):
            sync(device)
            t0 = time.perf_counter_ns()
            step()
            self.idle.append(time.perf_counter_ns() - t0)
        sync(device)
        for _ in range(max(1, steps)):
            t0, c0 = time.perf_counter_ns(), time.process_time_ns()
            step()
            self.cpu.append(time.process_time_ns() - c0)
            self.loop.append(time.perf_counter_ns() - t0)
        sync(device)

    def summary(self, launches: float | None = None) -> dict[str, float]:
        """Medians in ms (`host_ms`, `host_ms_loop`, `host_cpu_ms`) and how many samples each (`host_n`); with
        `launches` (per step, from `kernel_time`): host us per launch (of `host_ms`)."""
        if not self.idle:
            return {}
        out: dict[str, float] = {
            "host_ms": round(median_high(self.idle) / 1e6, 4),
            "host_ms_loop": round(median_high(self.loop) / 1e6, 4),
            "host_cpu_ms": round(median_high(self.cpu) / 1e6, 4),
            "host_n": len(self.idle),
        }
        if launches:
            out["host_us_per_launch"] = round(out["host_ms"] * 1e3 / launches, 2)
        return out


def reset_combo_guard() -> None:
    """Start counting the combo-kernel guard's decisions from zero (before a kiln arm compiles)."""
    from compiler.runtime import combo

    combo.reset_decisions()


def combo_guard() -> dict[str, Any]:
    """The combo-kernel guard's decisions since `reset_combo_guard` (`meta.combo_guard`): counts by how
    (`combined`, `split`: timed; `cached`; `rule`) and each decision (`compiler.runtime.combo.decision_log`)."""
    from compiler.runtime import combo

    return {"counts": combo.decisions(), "decisions": combo.decision_log()}


def reset_addmm_forms() -> None:
    """Start logging the addmm_bias pass's timed decisions from zero (before a kiln arm compiles)."""
    from compiler import fx_addmm

    fx_addmm.reset_decisions()


def addmm_forms() -> list[dict[str, Any]]:
    """The form each timed bias addmm took since `reset_addmm_forms` (`meta.addmm_forms`): its `m`, `n`, `k`,
    `dtype`, each form's microseconds (`us`) and the `form` chosen (`compiler.fx_addmm.decision_log`)."""
    from compiler import fx_addmm

    return fx_addmm.decision_log()


def graph_report(graphs: list[Any]) -> dict[str, Any]:
    """What kiln made of a step, for the model tier (`meta.kiln_graphs`): graphs and kernels, ATen fallback
    ops with counts (`fallbacks`), and per graph run through CUDA graphs its role, counters and why calls ran
    unrecorded (`cudagraphs`, from `CudaGraphRunner.summary`; `cudagraph` fallback reasons included)."""
    fb: collections.Counter[str] = collections.Counter()
    cg_reasons: dict[str, list[str]] = {}
    runners = []
    for g in graphs:
        for r in g.all_fallbacks():
            if r.kind == "cudagraph":
                cg_reasons.setdefault(r.op, []).append(r.detail)
            else:
                fb[str(r.op)] += 1
        runner = getattr(g, "cudagraphs", None)
        if runner is not None:
            runners.append(runner.summary())
    for r in runners:
        r["reasons"] = cg_reasons.pop(r["graph"], [])
    for name, details in cg_reasons.items():  # a subgraph's reason, or a graph without a runner
        runners.append({"graph": name, "role": "?", "reasons": details})
    return {
        "graphs": len(graphs),
        "kernels": sum(g.kernel_count for g in graphs),
        "fallbacks": dict(sorted(fb.items())),
        "cudagraphs": runners,
    }


def unrecorded_lines(report: dict[str, Any]) -> list[str]:
    """One line per graph that ran unrecorded after warm-up or has a `cudagraph` fallback reason: which graph,
    its role, how many calls, and why."""
    out = []
    for r in report.get("cudagraphs", []):
        why = dict(r.get("unrecorded_why") or {})
        for d in r.get("reasons", []):
            why.setdefault(d, 0)
        if not why:
            continue
        calls = r.get("replays", 0) + r.get("unrecorded", 0)
        head = f"{r['graph']} ({r.get('role', '?')})"
        if calls:
            head += f": {r.get('unrecorded', 0)} of {calls} calls after warm-up unrecorded"
        out.append(head + ": " + "; ".join(f"{d}" + (f" (x{n})" if n else "") for d, n in why.items()))
    return out
