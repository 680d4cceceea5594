"""Host overhead per compiled call: microseconds per call of graphs with 1, 10 and 50 kernel launches.

    python -m harness bench overhead [--device cuda] [--compilers kiln,inductor,...] [--md FILE] [--json FILE]

(arguments: ``harness/bench/cli.py``)

Terms:
- *chain graph*: ``softmax(x * 1.5, dim)`` repeated N times on a 64x64 tensor, alternating the softmax dim, so
  that each step needs its own kernel (a row softmax cannot fuse with the column softmax after it). On tensors
  this small the device finishes each kernel long before the host launches the next one: the wall time per
  call is the host time per call (Dynamo's guards, AOTAutograd's wrappers, the compiler's wrapper and
  launcher), which is what this benchmark measures. CUDA-graph modes replay all launches at once.
- *launches*: kernels the compiler generated for the graph (kiln: its capture record; Inductor: its kernel
  counter). They may differ between compilers; the per-launch column divides by each compiler's own count.
- *compilers*: the overhead tier's arms of ``harness/arms.py`` (the CUDA-graph ones need CUDA; ``inductor-cg``
  marks each step's beginning); the ratio column is against each arm's peer (``inductor``, or ``inductor-cg`` for
  the CUDA-graph arms).
- Each sample times ``CALLS`` back-to-back calls with the device synchronized before and after; the result is
  the median over samples, with the spread (max - min over the middle half of the samples, as a fraction of
  the median).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness import arms, conventions
from harness.exc import UsageError
from harness.results import markdown_table

LAUNCHES = (1, 10, 50)
SIZE = (64, 64)
CALLS = 200
SAMPLES = 25
TIER = "overhead"
COMPILERS = arms.names(TIER)


def chain(steps: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The chain graph of ``steps`` softmaxes (the 1-launch graph is one row softmax)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        for i in range(steps):
            x = torch.softmax(x * 1.5, dim=-1 - (i % 2))
        return x

    fn.__name__ = f"chain_{steps}"
    return fn


@dataclass
class OverheadResult:
    """One (graph, compiler): µs per call (median, spread), the launches it made, and µs per launch."""

    graph: str
    compiler: str
    us_per_call: float
    spread: float
    launches: int
    us_per_launch: float
    samples_us: list[float]


def compile_for(compiler: str, fn: Callable) -> tuple[Callable, Callable[[], None]]:
    """The compiled function and a per-step hook (``inductor-cg`` marks each step's beginning)."""
    arm = arms.get(compiler, TIER)
    return arm.compile(fn), arm.step_hook()


def _launch_count(compiler: str, call: Callable[[], object]) -> int:
    """Kernels generated while ``call`` compiles the graph (0 for eager)."""
    arm = arms.get(compiler, TIER)
    if arm.kiln:
        import compiler as kiln

        with kiln.capture() as graphs:
            call()
        return sum(g.kernel_launches for g in graphs)
    if arm.backend == arms.INDUCTOR:
        from torch._inductor import metrics

        before = metrics.generated_kernel_count
        call()
        return metrics.generated_kernel_count - before
    call()
    return 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    compiler: str, steps: int, device: torch.device, calls: int = CALLS, samples: int = SAMPLES
) -> OverheadResult:
    """Compile the chain graph of ``steps`` under ``compiler`` and time ``samples`` x ``calls`` calls."""
    torch._dynamo.reset()
    fn, step_begin = compile_for(compiler, chain(steps))
    x = torch.randn(*SIZE, device=device)
    launches = _launch_count(compiler, lambda: fn(x))
    for _ in range(5):  # warm-up: CUDA-graph modes record on their second or third call
        step_begin()
        fn(x)
    _sync(device)
    times = []
    for _ in range(samples):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            step_begin()
            fn(x)
        _sync(device)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    med = statistics.median(times)
    q = sorted(times)[len(times) // 4 : len(times) - len(times) // 4]
    return OverheadResult(
        f"chain_{steps}",
        compiler,
        med,
        (q[-1] - q[0]) / med,
        launches,
        med / launches if launches else float("nan"),
        times,
    )


def profile_calls(compiler: str, steps: int, device: torch.device, calls: int = CALLS, top: int = 30) -> str:
    """cProfile of ``calls`` calls of a compiled chain graph (after warm-up): where the host time goes."""
    import cProfile
    import io
    import pstats

    torch._dynamo.reset()
    fn, step_begin = compile_for(compiler, chain(steps))
    x = torch.randn(*SIZE, device=device)
    for _ in range(5):
        step_begin()
        fn(x)
    _sync(device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step_begin()
        fn(x)
    _sync(device)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return f"## {compiler} chain_{steps}: {calls} calls\n{buf.getvalue()}"


def report_markdown(results: list[OverheadResult]) -> str:
    """A table per graph: µs per call (spread), launches, µs per launch, ratio to Inductor."""
    by = {(r.graph, r.compiler): r for r in results}
    rows = []
    for r in results:
        peer = by.get((r.graph, arms.peer(r.compiler)))
        ratio = f"{r.us_per_call / peer.us_per_call:.2f}x" if peer else "-"
        rows.append(
            [
                r.graph,
                r.compiler,
                f"{r.us_per_call:.1f}",
                f"{r.spread:.1%}",
                r.launches,
                f"{r.us_per_launch:.2f}",
                ratio,
            ]
        )
    header = ["graph", "compiler", "us/call", "spread", "launches", "us/launch", "vs inductor"]
    return "\n".join(markdown_table(header, rows, "llrrrrr")) + "\n"


def cli_main(args: argparse.Namespace) -> int:
    """The `overhead` verb; with `--json -` the JSON is all that goes to stdout (the lines and table to stderr)."""
    with conventions.human_to_stderr(conventions.to_stdout(args.json)):
        return _overhead(args)


def _overhead(args: argparse.Namespace) -> int:
    device = _device(args.device)
    compilers = [a.name for a in arms.check(arms.split(args.compilers), TIER)]
    if device.type != "cuda":
        skipped = arms.cuda_graph_arms(compilers)
        if skipped:
            print(f"overhead: {', '.join(skipped)} need a CUDA device: skipped on {device}")
        compilers = [c for c in compilers if c not in skipped]
    try:
        steps = [int(s) for s in args.launches.split(",")]
    except ValueError:
        raise UsageError(f"--launches {args.launches!r}: expected comma-separated integers") from None
    if args.calls < 1 or args.samples < 3:
        raise UsageError("--calls must be >= 1 and --samples >= 3")
    results = []
    for n in steps:
        for c in compilers:
            r = measure(c, n, device, args.calls, args.samples)
            print(
                f"chain_{n:<3} {c:<12} {r.us_per_call:9.1f} us/call  spread {r.spread:6.1%}  "
                f"launches {r.launches:3d}",
                flush=True,
            )
            results.append(r)
    if args.profile:
        _write(
            args.profile,
            "\n".join(
                profile_calls(c, n, device, args.calls) for n in steps for c in compilers if c != "eager"
            ),
        )
    text = report_markdown(results)
    print(text)
    if args.md:
        _write(args.md, text)
    if args.json:
        # eager launches no kernel: its µs per launch is null (a NaN is not JSON: `jq` refuses it)
        rows = [{**asdict(r), "us_per_launch": r.us_per_launch if r.launches else None} for r in results]
        conventions.write_json(args.json, {"device": str(device), "results": rows})
    return 0


def _device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return device


def _write(path: Path, text: str) -> None:
    from harness.results import atomic_write_text

    atomic_write_text(path, text)
