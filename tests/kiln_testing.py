"""Helpers shared by the four compiler suites (dynamic_shapes, control_flow, fallback, numerics).

Terms:
- *run_compiled*: compile ``fn`` with the kiln backend in strict mode (lowering bugs raise instead of
  silently falling back) and collect every graph kiln compiled while it ran.
- *launch log*: the kernel launches (kernel name and launch config, e.g. ``PERSISTENT``) seen in a block.
- *frames*: Dynamo's count of frames it compiled; a recompile makes it grow.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._dynamo.utils import counters

import compiler
from compiler.runtime.launcher import TritonKernel


def import_problem(module: str) -> str | None:
    """None when `module` imports, else why not (one line): the `needs` marker's check (tests/conftest.py)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means the extra is not usable here
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _pick_device() -> str:
    forced = os.environ.get("KILN_TEST_DEVICE")
    if forced:
        return forced
    return "cuda" if torch.cuda.is_available() else "cpu"


#: The device every suite compiles for: CUDA/ROCm when present (``KILN_TEST_DEVICE`` overrides), else CPU
#: through Triton's interpreter.
DEVICE: str = _pick_device()


def randn(*shape: int) -> torch.Tensor:
    """A standard-normal tensor on the test device."""
    return torch.randn(*shape, device=DEVICE)


#: (rtol, atol) for comparing compiled results with eager ones, by dtype
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def compile_kiln(fn: Callable, **kwargs: Any) -> Callable:
    """``torch.compile(fn, backend="kiln", **kwargs)``."""
    return torch.compile(fn, backend="kiln", **kwargs)


def run_compiled(
    fn: Callable, *args: Any, strict: bool = True, compile_kwargs: dict | None = None, **settings: Any
) -> tuple[Any, list]:
    """Compile and run ``fn(*args)`` under kiln (strict by default); return (result, captured graphs).

    Dynamo's cache is reset first, so every call compiles afresh (a test may call this in a loop).
    Under the ``cudagraphs`` setting (``KILN_CUDAGRAPHS=1``: the suites run this way on GPUs too) with CUDA
    inputs, the compiled function is called twice more on fresh copies of the original arguments (a recording
    and a replay, inputs copied in): results and in-place updates must equal the first, unrecorded call's.
    """
    torch._dynamo.reset()
    with compiler.config.patch(strict=strict, **settings), compiler.capture() as graphs:
        replays = compiler.config.settings().cudagraphs and _on_cuda(args)
        originals = _clone(args) if replays else []
        compiled = compile_kiln(fn, **(compile_kwargs or {}))
        out = compiled(*args)
        if replays:
            _check_replays(compiled, originals, args, out, graphs)
    return out, graphs


def _on_cuda(args: Sequence[Any]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)


def _check_replays(compiled: Callable, originals: list, args: Sequence[Any], out: Any, graphs: list) -> None:
    """Record and replay (see ``run_compiled``); every graph that ran either replayed or says why it could not."""
    for _ in range(2):
        fresh = _clone(originals)
        assert_close(compiled(*fresh), out)
        assert_close(fresh, list(args))
    for g in graphs:
        runner = g.cudagraphs
        if runner is not None and runner.stats.warmups:
            reasons = [f for f in g.fallbacks if f.kind == "cudagraph"]
            assert runner.stats.replays or reasons, f"{g.name} neither replayed nor recorded why not"


def assert_close(
    actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None, equal_nan: bool = True
) -> None:
    """Compare (nested) results with dtype-appropriate tolerances; dtypes and shapes must match exactly."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol, atol, equal_nan)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, (actual, expected)
        return
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    r, a = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    torch.testing.assert_close(
        actual,
        expected,
        rtol=r if rtol is None else rtol,
        atol=a if atol is None else atol,
        equal_nan=equal_nan,
    )


def check(
    fn: Callable,
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    compile_kwargs: dict | None = None,
    **settings: Any,
) -> list:
    """Run ``fn`` eagerly and compiled on clones of ``args``; assert they agree; return the graphs."""
    expected = fn(*_clone(args))
    actual, graphs = run_compiled(fn, *_clone(args), compile_kwargs=compile_kwargs, **settings)
    assert_close(actual, expected, rtol, atol)
    assert graphs, "kiln compiled no graph"
    return graphs


def _clone(args: Sequence[Any]) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def kernels(graphs: list) -> int:
    """Kernel launches over every captured graph."""
    return sum(g.kernel_count for g in graphs)


def externs(graphs: list) -> int:
    return sum(g.extern_count for g in graphs)


def fallbacks(graphs: list) -> list:
    """Every recorded FallbackReason (cond subgraphs included) of the captured graphs."""
    return [f for g in graphs for f in g.all_fallbacks()]


def fallback_ops(graphs: list) -> list[str]:
    return [f.op for f in fallbacks(graphs)]


def assert_no_fallbacks(graphs: list) -> None:
    """No op ran as ATen. A graph running without CUDA graphs (kind ``cudagraph``, under KILN_CUDAGRAPHS=1) is
    no op fallback: its reason is checked by ``_check_replays``."""
    fbs = [f for f in fallbacks(graphs) if f.kind != "cudagraph"]
    assert not fbs, "unexpected fallbacks: " + "; ".join(map(str, fbs))


def assert_fallback(graphs: list, op: str) -> None:
    """``op`` (e.g. ``"aten.sort"``) fell back with a readable recorded reason."""
    hits = [f for f in fallbacks(graphs) if f.op == op or f.op.startswith(op + ".") or f.op.startswith(op)]
    assert hits, f"no fallback recorded for {op}; recorded: {[str(f) for f in fallbacks(graphs)]}"
    for f in hits:
        assert f.kind and f.detail and str(f).startswith(f.op), f


def all_kernel_source(graphs: list) -> str:
    out = []
    for g in graphs:
        out.extend(g.kernel_sources.values())
        out.extend(all_kernel_source(g.subgraphs).splitlines())
    return "\n".join(out)


def frames() -> int:
    """Frames Dynamo has compiled since the last reset (a recompile adds one)."""
    return counters["frames"]["ok"]


@contextlib.contextmanager
def launch_log() -> Iterator[list[tuple[str, dict]]]:
    """Record every kiln kernel launch as (kernel name, launch config) inside the block."""
    seen: list[tuple[str, dict]] = []
    orig_cfg = TritonKernel.launch_config

    def spy(self, xnumel, rnumel, device):
        cfg = orig_cfg(self, xnumel, rnumel, device)
        seen.append((self.name, dict(cfg, xnumel=xnumel, rnumel=rnumel)))
        return cfg

    TritonKernel.launch_config = spy
    try:
        yield seen
    finally:
        TritonKernel.launch_config = orig_cfg


def reset_counters() -> None:
    counters.clear()


def model_with_grads(device: str) -> torch.nn.Module:
    """A small seeded model (linear, layer norm, linear) on ``device`` whose parameters hold small gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).to(
        device
    )
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return model


def compiled_optimizer_steps(
    model: torch.nn.Module, opt: str, *, steps: int = 3, **settings: Any
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list]:
    """A copy of ``model`` (its gradients cloned) stepped ``steps`` times by a foreach optimizer (``opt``: "adamw"
    or "sgd" with momentum) whose ``step`` kiln compiles in strict mode under ``settings``: (the copy, its
    optimizer, the graphs compiled)."""
    m = copy.deepcopy(model)
    for p, q in zip(m.parameters(), model.parameters()):
        p.grad = q.grad.clone()
    o: torch.optim.Optimizer = (
        torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)
        if opt == "adamw"
        else torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    )
    torch._dynamo.reset()
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        step = torch.compile(o.step, backend="kiln")
        for _ in range(steps):
            step()
    return m, o, graphs


def gpu_jit_function(source: str, name: str, prefix: str = "jit") -> tuple[Any, str]:
    """``(JITFunction, path)`` of kernel ``name`` of ``source``, built with Triton's interpreter off (as a GPU or
    worker process imports it; tests on CPU run under the interpreter), from kiln's kernel cache file."""
    import importlib.util

    from triton import knobs
    from triton.runtime.jit import JITFunction

    from compiler.runtime import cache

    path = cache.source_path(source)
    if not os.path.exists(path):
        cache.write_atomic(path, source)
    with knobs.runtime.scope():
        knobs.runtime.interpret = False
        spec = importlib.util.spec_from_file_location(f"{prefix}_{os.path.basename(path)[:-3]}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    fn = getattr(mod, name)
    assert isinstance(fn, JITFunction)
    return fn, path


def run_tagged_json(cmd: Sequence[str], env: dict, tag: str = "STATS ", timeout: float = 600) -> dict:
    """Run ``cmd`` in a fresh process with ``env`` (it must exit 0, else its stderr's tail is the failure) and return
    the JSON object on its stdout line starting with ``tag``."""
    import json
    import subprocess

    proc = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(tag))
    return json.loads(line[len(tag) :])
