"""Kiln's host path per step, split by phase, without a GPU: kernel launches stubbed on the GPU path.

``stubbed_gpu_launches()`` makes every kernel launch of kiln's wrappers take the launcher's GPU path on CPU
tensors (device index 0, the compiled-kernel fast path) with the compiled kernel's ``run`` a no-op: what is
timed is kiln's Python from the wrapper's first line to the call of Triton's C launcher, not the C launcher
(its argument parsing and ``cuLaunchKernel``) nor any device work. ATen calls of the wrapper (extern kernels,
fallbacks, allocations) run on the CPU for real: their time includes CPU compute, which a GPU would do
asynchronously, so read the ``extern`` phase as an upper bound.

``profile_step(step, graphs)`` times one compiled step (``step()``, whose graphs ``graphs`` were captured while
it compiled) in these phases, each the median of interleaved samples:

- ``step``: the whole step (Dynamo's guards, AOTAutograd's runtime wrappers, autograd, the step's eager code,
  kiln's runner, wrappers, launches);
- ``wrappers``: every wrapper's ``forward`` called directly on the inputs recorded from one step;
- ``outside``: ``step`` - ``wrappers`` (guards, AOTAutograd, autograd, eager code, kiln's runner);
- ``launcher``: ``wrappers`` - the same with every kernel a no-op (kiln's launcher, per launch below);
- ``alloc``, ``views``, ``extern``, ``sizes``: the wrappers' other nodes by kind (allocations, views,
  ATen calls, size arithmetic and tensor metadata), each node replayed on its recorded arguments;
- ``per_launch_us``: ``launcher`` / launches per step.
"""

from __future__ import annotations

import contextlib
import operator
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..capture import CompiledGraph
from ..runtime import launcher
from ..runtime.launcher import TritonKernel
from ..runtime.restride import reinterpret_c, reinterpret_tensor


class _NoopCompiled:
    """A compiled kernel whose launch does nothing (the stand-in for Triton's ``CompiledKernel``)."""

    function = 0
    packed_metadata = None

    @staticmethod
    def run(*args: Any) -> None:
        return None


def _device0(self: torch.Tensor) -> int:
    return 0


def _stream(index: int) -> int:
    return 0


@contextlib.contextmanager
def stubbed_gpu_launches() -> Iterator[None]:
    """Inside the block, kernel launches on CPU tensors take the GPU fast path with a no-op kernel (module
    docstring). Compile and warm the step up before entering: launches are prepared again on device 0."""
    saved_get_device = torch.Tensor.get_device
    had_stream = hasattr(torch._C, "_cuda_getCurrentRawStream")
    saved_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    saved_own = TritonKernel._compile_own
    saved_raw = launcher._raw_stream
    launcher._raw_stream = _stream
    torch.Tensor.get_device = _device0  # type: ignore[method-assign,assignment]
    vars(torch._C)["_cuda_getCurrentRawStream"] = _stream  # absent from a CPU build
    TritonKernel._compile_own = lambda self, args, launch: _NoopCompiled()  # type: ignore[method-assign]
    launcher._gpu_count[:] = [1]
    # kernels that do not run leave buffers as allocated: denormal garbage would slow the CPU's ATen calls 100x
    flushed = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)
        torch.Tensor.get_device = saved_get_device  # type: ignore[method-assign]
        if had_stream:
            vars(torch._C)["_cuda_getCurrentRawStream"] = saved_stream
        else:
            delattr(torch._C, "_cuda_getCurrentRawStream")
        TritonKernel._compile_own = saved_own  # type: ignore[method-assign]
        launcher._raw_stream = saved_raw
        launcher._gpu_count.clear()


def _all_graphs(graphs: list[CompiledGraph]) -> list[CompiledGraph]:
    return [g for g in graphs if g.entry]


def _kernel_names(gm: fx.GraphModule) -> list[str]:
    return [n for n, m in gm.named_children() if isinstance(m, TritonKernel)]


@contextlib.contextmanager
def noop_kernels(graphs: list[CompiledGraph]) -> Iterator[None]:
    """Every kernel of the wrappers of ``graphs`` a no-op inside the block."""
    swapped: list[tuple[fx.GraphModule, str, Any]] = []
    for g in graphs:
        for name in _kernel_names(g.wrapper):
            swapped.append((g.wrapper, name, g.wrapper.__dict__.get(name)))
            g.wrapper.__dict__[name] = _NoopCompiled.run
    try:
        yield
    finally:
        for gm, name, old in swapped:
            if old is None:
                gm.__dict__.pop(name, None)
            else:
                gm.__dict__[name] = old


def record_inputs(step: Callable[[], Any], graphs: list[CompiledGraph]) -> list[tuple[CompiledGraph, tuple]]:
    """Run ``step`` once and return each wrapper call it made with its arguments (in call order)."""
    calls: list[tuple[CompiledGraph, tuple]] = []
    saved = [(g, g.entry["fn"]) for g in graphs]
    for g, fn in saved:

        def recorder(*args: Any, _g: CompiledGraph = g, _fn: Callable = fn) -> Any:
            calls.append((_g, args))
            return _fn(*args)

        g.entry["fn"] = recorder
    try:
        step()
    finally:
        for g, fn in saved:
            g.entry["fn"] = fn
    return calls


#: node kinds of the replay split: what a call_function/call_method target does
VIEW_TARGETS = {reinterpret_tensor, torch.as_strided, torch.ops.aten.as_strided.default} | (
    {reinterpret_c} if reinterpret_c is not None else set()
)
ALLOC_TARGETS = {torch.empty_strided, torch.empty, torch.zeros, torch.ops.aten.empty_strided.default}


def node_kind(n: fx.Node) -> str:
    """``alloc``, ``views``, ``sizes`` (integer arithmetic, sizes and strides, getitem) or ``extern``."""
    if n.op == "call_method":
        return "sizes" if n.target in ("size", "stride", "storage_offset") else "extern"
    t = n.target
    if t in ALLOC_TARGETS or "empty_strided" in getattr(t, "__name__", ""):
        return "alloc"
    if t in VIEW_TARGETS or getattr(t, "__name__", "") in (
        "reinterpret_tensor",
        "_reinterpret_tensor",
        "as_strided",
    ):
        return "views"
    if getattr(t, "__module__", "") in ("_operator", "operator") or t is operator.getitem:
        return "sizes"
    return "extern"


class _Recorder(fx.Interpreter):
    """Runs a wrapper node by node (kernels as no-ops) and keeps each call's kind, callable and concrete arguments;
    a launch keeps the wrapper's real kernel module."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.calls: list[tuple[str, Callable, tuple, dict]] = []

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("call_function", "call_method", "call_module"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if n.op == "call_module":
                kernel = self.module.get_submodule(str(n.target))
                if isinstance(kernel, TritonKernel):
                    self.calls.append(("launch", kernel, tuple(args), dict(kwargs)))
                    return None  # a launch returns nothing
            elif n.op == "call_method":
                self.calls.append((node_kind(n), getattr(args[0], str(n.target)), tuple(args[1:]), kwargs))
            else:
                self.calls.append((node_kind(n), n.target, tuple(args), dict(kwargs)))  # type: ignore[arg-type]
        return super().run_node(n)


def record_nodes(calls: list[tuple[CompiledGraph, tuple]]) -> list[tuple[str, Callable, tuple, dict]]:
    """Every node call of the wrappers' ``calls`` (``record_inputs``) with its kind and concrete arguments."""
    recorded: list[tuple[str, Callable, tuple, dict]] = []
    with torch.no_grad():
        for g, args in calls:
            r = _Recorder(g.wrapper)
            r.run(*args)
            recorded += r.calls
    return recorded


def replay_kinds(recorded: list[tuple[str, Callable, tuple, dict]], reps: int) -> dict[str, float]:
    """Seconds per step of each node kind (``launch`` or ``node_kind``), each node called ``reps`` times in a row
    on its recorded arguments (launches under ``stubbed_gpu_launches``: no kernel runs)."""
    out: dict[str, float] = {}
    with torch.no_grad():
        for kind, fn, args, kwargs in recorded:
            t0 = clock()
            for _ in range(reps):
                fn(*args, **kwargs)
            out[kind] = out.get(kind, 0.0) + (clock() - t0) / reps
    return out


#: the replayed node kinds, in report order
KINDS = ("launch", "alloc", "views", "sizes", "extern")


@dataclass
class HostProfile:
    """Microseconds per step of each phase (module docstring), launches per step, and with ``compare`` the
    replayed launches on the launcher's old path (``old_launch_us``)."""

    step_us: float
    wrappers_us: float
    launches: int
    kinds_us: dict[str, float] = field(default_factory=dict)
    old_launch_us: float | None = None

    @property
    def outside_us(self) -> float:
        return max(0.0, self.step_us - self.wrappers_us)

    @property
    def launch_us(self) -> float:
        return self.kinds_us.get("launch", 0.0)

    @property
    def per_launch_us(self) -> float:
        return self.launch_us / self.launches if self.launches else 0.0

    @property
    def old_per_launch_us(self) -> float | None:
        if self.old_launch_us is None or not self.launches:
            return None
        return self.old_launch_us / self.launches

    @property
    def fx_us(self) -> float:
        """The wrappers' time outside their replayed nodes (the generated ``forward``'s own Python)."""
        return max(0.0, self.wrappers_us - sum(self.kinds_us.values()))

    def phases(self) -> dict[str, float]:
        """Phase -> µs per step: outside, the replayed node kinds, the wrappers' own code (``fx``)."""
        out = {"outside": self.outside_us}
        out.update({k: self.kinds_us.get(k, 0.0) for k in KINDS})
        out["fx"] = self.fx_us
        return out


#: the clock: CPU time of this thread, not wall time (a shared host preempts the process for milliseconds; with
#: one intra-op thread, the ATen calls' CPU work is on this thread too)
clock = time.thread_time


def _mean_us(fn: Callable[[], Any], reps: int) -> float:
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps * 1e6


def profile_step(
    step: Callable[[], Any],
    graphs: list[CompiledGraph],
    reps: int = 20,
    samples: int = 7,
    compare: bool = False,
) -> HostProfile:
    """The phases of ``step`` (compiled and warm; ``graphs`` captured while it compiled) under stubbed launches:
    ``samples`` rounds, each timing ``reps`` calls of every variant in turn; medians. With ``compare``, each
    round also replays the launches with ``launcher.LEAN`` off (the old path)."""
    graphs = _all_graphs(graphs)
    saved = launcher.LEAN[0]
    with stubbed_gpu_launches():
        for lean in (False, True):  # both paths prepared (their launches made) before timing
            launcher.LEAN[0] = lean
            step()
            step()
        calls = record_inputs(step, graphs)
        nodes = record_nodes(calls)
        launches_only = [c for c in nodes if c[0] == "launch"]

        def wrappers() -> None:
            with torch.no_grad():  # AOTAutograd runs compiled graphs with autograd off
                for g, args in calls:
                    g.entry["fn"](*args)

        got: dict[str, list[float]] = {"step": [], "wrappers": [], "old": []}
        kinds: dict[str, list[float]] = {}
        try:
            for _ in range(samples):
                got["step"].append(_mean_us(step, reps))
                got["wrappers"].append(_mean_us(wrappers, reps))
                for k, v in replay_kinds(nodes, reps).items():
                    kinds.setdefault(k, []).append(v * 1e6)
                if compare:
                    launcher.LEAN[0] = False
                    got["old"].append(replay_kinds(launches_only, reps).get("launch", 0.0) * 1e6)
                    launcher.LEAN[0] = True
        finally:
            launcher.LEAN[0] = saved
    return HostProfile(
        statistics.median(got["step"]),
        statistics.median(got["wrappers"]),
        sum(1 for c in launches_only),
        {k: statistics.median(v) for k, v in kinds.items()},
        statistics.median(got["old"]) if got["old"] else None,
    )


# ------------------------------------------------------------------ the launcher's paths side by side
def chain(steps: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``softmax(x * 1.5)`` ``steps`` times, alternating the dim: one kernel launch each."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        for i in range(steps):
            x = torch.softmax(x * 1.5, dim=-1 - (i % 2))
        return x

    return fn


def compare_paths(device: str, steps: int = 50, calls: int = 100, samples: int = 15) -> dict[str, float]:
    """µs per launch of a ``steps``-launch chain on 64x64 under kiln, the launcher's lean path and its old path
    taking turns each sample (medians). On a GPU the launches are real (the device is synchronized around each
    sample); on a CPU they are stubbed (``stubbed_gpu_launches``) and timed by this thread's CPU time."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(64, 64, device=device)
    fn = torch.compile(chain(steps), backend="kiln")
    fn(x)
    gpu = x.device.type == "cuda"
    stub = contextlib.nullcontext() if gpu else stubbed_gpu_launches()
    timer = time.perf_counter if gpu else clock
    saved = launcher.LEAN[0]
    got: dict[str, list[float]] = {"lean": [], "old": []}
    with stub:
        try:
            for lean in (False, True, False, True):
                launcher.LEAN[0] = lean
                fn(x)
            for _ in range(samples):
                for name, lean in (("old", False), ("lean", True)):
                    launcher.LEAN[0] = lean
                    if gpu:
                        torch.cuda.synchronize()
                    t0 = timer()
                    for _ in range(calls):
                        fn(x)
                    if gpu:
                        torch.cuda.synchronize()
                    got[name].append((timer() - t0) / calls / steps * 1e6)
        finally:
            launcher.LEAN[0] = saved
    return {k: statistics.median(v) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m compiler.tools.host_path [--device cuda] [--steps N]``: µs per launch (whole call / launches)
    of the launcher's old and lean paths, interleaved in one process (``compare_paths``)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m compiler.tools.host_path", description=main.__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50, help="launches per call (chain length)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--samples", type=int, default=15)
    args = ap.parse_args(argv)
    from .. import register

    register()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("host_path: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.device == "cpu":
        from .. import config

        if not config.interpreting():  # triton was imported with this module, before kiln could choose
            print(
                "host_path: --device cpu runs kernels in Triton's interpreter: set TRITON_INTERPRET=1",
                file=sys.stderr,
            )
            return 2
        torch.set_num_threads(1)
    got = compare_paths(args.device, args.steps, args.calls, args.samples)
    print(
        json.dumps({"device": args.device, "steps": args.steps, **{k: round(v, 3) for k, v in got.items()}})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
