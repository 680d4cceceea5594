"""Timing: one interface, several clocks.

Terms:
- *timer*: `sample(fn, reps)` calls `fn` `reps` times and returns one duration per call, in nanoseconds.
  `wall` (CPU: `time.perf_counter_ns` around each call), `event` (GPU: device events on the device that owns
  the tensors, L2 flushed before every call), `graph` (like `event`, replaying a CUDA graph of `fn`:
  no CPU launch overhead), `profiler` (GPU kernel time from torch.profiler: no launch overhead, no gaps;
  kernels are attributed to a call by time, so backward kernels launched from autograd's thread count).
- *bytes moved*: every unique storage of the inputs and outputs, counted once (-> GB/s = bytes / ns).
- *ceiling*: GB/s of a large elementwise device copy (`out = -src`) measured with the same timer in the same run.
- *plant*: `Timer.planted(fn, ns)` adds `ns` of extra work after each call (on CPU a busy wait on the thread's
  CPU clock, so that on a loaded host the extra work is slowed as much as the call itself, like a real 20%
  slower code; device sleep on GPU), so that tests can prove a known slowdown is detected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness.exc import UsageError

TIMERS = ("wall", "event", "graph", "profiler")
L2_FLUSH_BYTES = (
    256 << 20
)  # larger than the L2 of any current GPU (H100: 50 MiB, MI300X: 256 MiB infinity cache)

Fn = Callable[[], Any]


def flatten(obj: Any) -> list[torch.Tensor]:
    """Tensors in a (nested) tuple/list/dict output, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in flatten(o)]
    if isinstance(obj, dict):
        return [t for k in obj for t in flatten(obj[k])]
    return []


def unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of every distinct storage among `tensors` (views of one storage count once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[(str(t.device), st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def max_errors(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> tuple[float, float]:
    """(max |out - ref|, that divided by max |ref|) over all outputs, compared in float64."""
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs but {len(refs)} reference outputs")
    worst_abs = worst_rel = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
        if not (o.is_floating_point() or r.is_floating_point()):
            diff = float((o.detach().cpu() != r.detach().cpu()).sum())
            worst_abs = max(worst_abs, diff)
            continue
        a = o.detach().to(torch.float64)
        b = r.detach().to(device=a.device, dtype=torch.float64)
        if a.numel() == 0:
            continue
        d = (a - b).abs()
        d = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(d), d)
        err = float(d.max())
        scale = float(b.abs().max())
        worst_abs = max(worst_abs, err) if err == err else float("inf")
        worst_rel = max(worst_rel, err / scale if scale > 0 else err) if err == err else float("inf")
    return worst_abs, worst_rel


class Timer:
    """Wall-clock timer (CPU); the base class of the device timers."""

    name = "wall"

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        """Wait for all work queued on the timer's device."""

    def reset(self) -> None:
        """Forget per-function state (CUDA graphs and their memory) once a workload is done."""

    def sample(self, fn: Fn, reps: int) -> list[float]:
        out = []
        clock = time.perf_counter_ns
        for _ in range(reps):
            t0 = clock()
            fn()
            out.append(float(clock() - t0))
        return out

    def planted(self, fn: Fn, extra_ns: float, fraction: float | None = None) -> Fn:
        """`fn` followed by busy waiting on this thread's CPU clock (work, not wall time): `fraction` of the
        call's own CPU time when given, else `extra_ns`."""
        clock = time.thread_time_ns

        def slow() -> Any:
            t0 = clock()
            r = fn()
            now = clock()
            end = now + (fraction * (now - t0) if fraction is not None else extra_ns)
            while clock() < end:
                pass
            return r

        return slow


class EventTimer(Timer):
    """Device events around each call, on the device that owns the tensors; L2 flushed before each call."""

    name = "event"

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._flush_buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        self._cycles_per_ns: float | None = None

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def flush(self) -> None:
        self._flush_buf.zero_()

    def sample(self, fn: Fn, reps: int) -> list[float]:
        with torch.cuda.device(self.device):
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                self.flush()
                starts[i].record()
                fn()
                ends[i].record()
            self.sync()
            return [s.elapsed_time(e) * 1e6 for s, e in zip(starts, ends)]

    def _calibrate(self) -> float:
        if self._cycles_per_ns is None:
            with torch.cuda.device(self.device):
                torch.cuda._sleep(1_000_000)  # warm
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.cuda._sleep(10_000_000)
                e.record()
                self.sync()
                self._cycles_per_ns = 10_000_000 / (s.elapsed_time(e) * 1e6)
        return self._cycles_per_ns

    def planted(self, fn: Fn, extra_ns: float, fraction: float | None = None) -> Fn:
        """`fn` followed by a device-side sleep of about `extra_ns` (`fraction` is the CPU timer's)."""
        cycles = int(extra_ns * self._calibrate())

        def slow() -> Any:
            r = fn()
            torch.cuda._sleep(cycles)
            return r

        return slow


class GraphTimer(EventTimer):
    """Events around replays of a CUDA graph captured from `fn` (one graph per function, made once)."""

    name = "graph"

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._graphs: dict[int, tuple[Fn, torch.cuda.CUDAGraph]] = {}

    def _graph(self, fn: Fn) -> torch.cuda.CUDAGraph:
        hit = self._graphs.get(id(fn))
        if hit is not None and hit[0] is fn:
            return hit[1]
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            self.sync()
        self._graphs[id(fn)] = (fn, g)
        return g

    def sample(self, fn: Fn, reps: int) -> list[float]:
        g = self._graph(fn)
        return super().sample(g.replay, reps)

    def reset(self) -> None:
        self._graphs.clear()


class ProfilerTimer(EventTimer):
    """Sum of device kernel times per call, from torch.profiler (excludes CPU launch overhead)."""

    name = "profiler"
    MARK = "kiln_bench_call"

    def sample(self, fn: Fn, reps: int) -> list[float]:
        """Kernel time of each call: every device activity that starts inside the call's CPU marker.

        Kernels are matched by time, not by the marker's own children, because autograd launches a
        backward pass's kernels from its own thread. Each call is bracketed by synchronizations so the
        L2 flush before it and nothing after it fall inside its window. User annotations are skipped on
        both sides: Kineto mirrors every `record_function` range (ours, Dynamo's, AOTAutograd's) onto the
        GPU timeline as an annotation spanning the kernels it launched; taken as a window it would hide
        autograd-thread kernels, and summed as device time it would count kernels twice.
        """
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with torch.cuda.device(self.device), profile(activities=acts) as prof:
            for i in range(reps):
                self.flush()
                self.sync()
                with record_function(f"{self.MARK}{i}"):
                    fn()
                    self.sync()
        return attribute_kernel_time(prof.events(), self.MARK, reps, DeviceType.CPU, DeviceType.CUDA)


def attribute_kernel_time(
    events: Iterable[Any], mark: str, reps: int, cpu_type: Any, device_type: Any
) -> list[float]:
    """Per marked call `mark{i}`, ns of device activity starting inside its CPU window (see ProfilerTimer)."""
    windows: dict[int, tuple[float, float]] = {}
    device_spans: list[tuple[float, float]] = []
    for evt in events:
        if evt.device_type == cpu_type and evt.name.startswith(mark):  # itself a (CPU) user annotation
            windows[int(evt.name[len(mark) :])] = (evt.time_range.start, evt.time_range.end)
        elif evt.device_type == device_type and not getattr(evt, "is_user_annotation", False):
            device_spans.append((evt.time_range.start, evt.time_range.end))
    if len(windows) != reps or not device_spans:
        raise RuntimeError(
            f"profiler returned {len(windows)} of {reps} call markers and {len(device_spans)} device activities"
        )
    device_spans.sort()
    per_call = []
    for i in range(reps):
        lo, hi = windows[i]
        per_call.append(sum(e - s for s, e in device_spans if lo <= s < hi) * 1e3)  # us -> ns
    if not all(per_call):
        raise RuntimeError("profiler found no device activity inside some marked calls")
    return per_call


def make_timer(kind: str, device: torch.device) -> Timer:
    """The timer called `kind` for `device` (`wall` is the only one for CPU)."""
    if kind not in TIMERS:
        raise UsageError(f"unknown timer {kind!r} (choose from {', '.join(TIMERS)})")
    if device.type == "cpu":
        if kind != "wall":
            raise UsageError(f"timer {kind!r} needs a GPU; on CPU use --timer wall")
        return Timer(device)
    if kind == "wall":
        raise UsageError("timer 'wall' is for CPU runs; on a GPU use event, graph or profiler")
    return {"event": EventTimer, "graph": GraphTimer, "profiler": ProfilerTimer}[kind](device)


def ceiling_gbps(timer: Timer, nbytes: int, reps: int = 30) -> float:
    """GB/s of an elementwise copy (`out = -src`) of an `nbytes` buffer, read + write: the practical ceiling.

    An SM kernel rather than `copy_`: inside a CUDA graph a plain device copy becomes a copy-engine
    memcpy node (2.43 TB/s on the H100 against 3.00 TB/s for the kernel, with every timer), which would
    put graph-timed workloads above 100% of the ceiling.
    """
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=timer.device)
    dst = torch.empty_like(src)

    def copy() -> None:
        torch.neg(src, out=dst)

    timer.sample(copy, 3)
    from harness.bench.core.stats import Stats

    med = Stats.of(timer.sample(copy, reps)).median
    return 2 * n * 4 / med
