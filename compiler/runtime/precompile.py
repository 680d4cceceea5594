"""Ahead-of-time kernel compiles: after the ``wrap`` pass, send each kernel's expected specialization to
the compile workers, so that kernels compile in parallel while kiln and Dynamo carry on.

For every kernel whose launch sizes are known (static shapes; for dynamic shapes the sizes of the example
inputs, a good guess for the first call), the launch config is the launcher's
``heuristic_config(..., interp=False)`` and the arguments are guessed: pointers by dtype, 16-byte aligned
unless the example input's storage offset says otherwise; ints by their value. A guess that turns out
wrong costs one more compile at the launch; never a wrong result (the launch builds its own request from
the real arguments and uses a worker's result only when the requests are equal). A combo kernel's first
launch on a GPU times the combo against its parts (``runtime/combo.py``): its request (each part's block
size as its own launch would pick it) and every part's are sent, so that none compiles on the main thread.

A request the binary index knows (``runtime/binary_index.py``) is on disk already: it is not sent, and the
kernel's module is not imported for it (its parameter names come from the source's ``def`` line).

Nothing happens under the interpreter, on CPU, for non-CUDA targets, or with one compile thread/worker
(``compile_pool.pool_size() == 0``): kernels then compile at their first launch, in-process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import sympy
import torch

from .. import config
from ..codegen.kernels import ComboSource
from ..ir import Strided, sym
from . import cache, compile_jobs, compile_pool, compile_worker, gpu_compile

log = logging.getLogger("kiln")


def enabled() -> bool:
    return not config.interpreting() and compile_pool.pool_size() > 0 and gpu_compile._OWN["ok"]


def precompile_graph(lowering: Any, kernels: Sequence[Any], wrapper: torch.nn.Module) -> int:
    """Submit the graph's kernels (``lowering``: the ``graph.Program``; ``kernels``: its ``KernelSource``s,
    one per launch in launch order; ``wrapper``: the module holding their ``TritonKernel``s) to the compile
    pool; returns how many requests were sent. Never raises: a kernel that cannot be sent compiles at its
    first launch."""
    if not kernels or not enabled():
        return 0
    try:
        return _precompile(lowering, kernels, wrapper)
    except Exception as e:  # noqa: BLE001 - an optimization: the launch compiles what was not sent
        log.warning("kiln: ahead-of-time kernel compiles skipped (%s: %s)", type(e).__name__, e)
        return 0


def _precompile(lowering: Any, kernels: Sequence[Any], wrapper: torch.nn.Module) -> int:
    from ..ir import size_hints

    hints = size_hints()
    inputs = input_metas(lowering)
    sent = 0
    for ks in kernels:
        try:
            device = _cuda_device(ks, lowering)
            if device is None:
                continue
            target = gpu_compile.device_target(device)
            if target.backend != "cuda":
                continue
            jobs = requests_for(ks, getattr(wrapper, ks.name), lowering, hints, target, inputs)
        except gpu_compile.Unsupported as e:
            log.debug("kiln: no ahead-of-time compile for %s: %s", ks.name, e)
            continue
        for req, fn in jobs:
            if compile_jobs.has(req.key):
                continue
            if gpu_compile.on_disk(req, fn):
                gpu_compile.count(skipped_on_disk=1)
                continue
            submit(req)
            sent += 1
    return sent


def requests_for(
    ks: Any, kernel: Any, lowering: Any, hints: dict, target: Any, inputs: dict[str, Any]
) -> list:
    """The (request, kernel loader) pairs of what the first launch of ``ks`` compiles: a kernel's own
    specialization (``request_for``); for a combo kernel (``ComboSource``, ``kernel`` its ``ComboKernel``) each
    part's and the combo's own (``combo_request_for``), since its first launch on a GPU times the combo against
    its parts (``runtime/combo.py``) and so compiles all of them."""
    if not isinstance(ks, ComboSource):
        one = request_for(ks, kernel, lowering, hints, target, inputs)
        return [one] if one is not None else []
    jobs = [request_for(p, k, lowering, hints, target, inputs) for p, k in zip(ks.parts, kernel.parts)]
    jobs.append(combo_request_for(ks, kernel, lowering, hints, target, inputs))
    return [j for j in jobs if j is not None]


def combo_request_for(
    cs: ComboSource, kernel: Any, lowering: Any, hints: dict, target: Any, inputs: dict[str, Any]
) -> tuple | None:
    """(request, kernel loader) for the first launch of combo kernel ``cs`` (``kernel``: its ``ComboKernel``) at
    the example sizes: every part's pointers, then each part's ``xnumel``; the block sizes its launch picks
    (``ComboKernel.combo_config``). None when no part has elements (the launch launches nothing)."""
    ints = [_value(p.xnumel, hints) for p in cs.parts]
    if not any(ints):
        return None
    ptrs = [gpu_compile.Ptr(*_pointer(name, lowering, hints, inputs)[::2]) for _, name in cs.ptr_args]
    cfg = kernel.combo_config(tuple(ints), False)
    path = cache.source_path(cs.source)
    req = gpu_compile.make_request(cs.name, path, kernel.param_names(cfg), ptrs + ints, cfg, target)
    return req, kernel.jit_function


def warm_up(example_inputs: Any) -> bool:
    """Start the compile workers when a graph on a GPU is about to be compiled (Dynamo and AOTAutograd then
    trace for a while: the workers' start-up hides behind it). True when the pool was warmed."""
    if not enabled() or not any(
        isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in example_inputs
    ):
        return False
    compile_pool.get_pool().warm_up()
    _prime_triton_key_once()
    return True


_primed: list[threading.Thread] = []
_prime_lock = threading.Lock()


def _prime_triton_key_once() -> None:
    """Compute Triton's cache key in a background thread, once per process (``compile_worker.prime_triton_key``):
    this pass asks ``on_disk`` for every kernel's cache key, and the first such key cost the pass about a second
    on the H200 (Triton hashes its sources and its library), after the graph was traced; hashing and reading
    release the GIL, so the thread runs beside the tracing."""
    with _prime_lock:
        if _primed:
            return
        t = threading.Thread(target=compile_worker.prime_triton_key, name="kiln-triton-key", daemon=True)
        _primed.append(t)
    t.start()


def submit(req: gpu_compile.CompileRequest) -> Future:
    """Send ``req`` to the compile pool; the first launch of the same specialization waits for it
    (``compile_jobs``)."""
    fut = compile_pool.get_pool().submit(req.wire(gpu_compile.cache_env()), req.label)
    compile_jobs.add(req, fut)
    gpu_compile.count(submitted=1)
    return fut


def request_for(
    ks: Any, kernel: Any, lowering: Any, hints: dict, target: Any, inputs: dict[str, Any] | None = None
) -> tuple | None:
    """(request, a function returning the kernel's ``JITFunction``) for the first launch of kernel ``ks``
    (``KernelSource``; ``kernel`` its ``TritonKernel``) at the example sizes ``hints`` on ``target``; None when that
    launch launches nothing. The module is imported only if ``on_disk`` must compute Triton's key (a binary
    index hit needs no import). ``inputs``: ``input_metas(lowering)``, found once per graph by the caller."""
    if inputs is None:
        inputs = input_metas(lowering)
    ints = [_value(s, hints) for s in ks.size_args]
    xnumel = _value(ks.xnumel, hints)
    rnumel = _value(ks.rnumel, hints) if ks.reduction else 1
    ints += [xnumel, rnumel] if ks.reduction else [xnumel]
    if xnumel == 0:
        return None
    ptrs = [gpu_compile.Ptr(*_pointer(name, lowering, hints, inputs)[::2]) for _, name in ks.ptr_args]
    cfg = kernel.heuristic_config(xnumel, rnumel, interp=False)
    if kernel._autotune:  # a choice cached by an earlier compile: compile that config, not the heuristic's
        device = _pointer(ks.ptr_args[0][1], lowering, {}, {})[1] if ks.ptr_args else torch.device("cuda")
        cfg = kernel.cached_tuned_config(cfg, xnumel, rnumel, device)
    path = cache.source_path(ks.source)
    req = gpu_compile.make_request(ks.name, path, kernel.param_names(cfg), ptrs + ints, cfg, target)
    return req, kernel.jit_function


def _cuda_device(ks: Any, lowering: Any) -> int | None:
    """The CUDA device index of the kernel's buffers, or None (CPU, or no pointer arguments)."""
    for _, name in ks.ptr_args:
        dev = _pointer(name, lowering, {}, {})[1]
        if dev.type != "cuda":
            return None
        return dev.index if dev.index is not None else torch.cuda.current_device()
    return None


def _value(expr: Any, hints: dict) -> int:
    e = sympy.sympify(expr)
    if not e.is_number:
        e = e.xreplace({s: sympy.Integer(hints[s]) for s in e.free_symbols if s in hints})
    if not e.is_number:
        raise gpu_compile.Unsupported(f"size {expr} has no example value")
    return int(e)


def input_metas(lowering: Any) -> dict[str, Any]:
    """Buffer name -> the FakeTensor of the graph input it holds (the first input of each buffer), for every
    input buffer of ``lowering``: found once per graph rather than by a scan of the inputs per pointer (an
    optimizer step's kernels pass hundreds of pointers, its graph has hundreds of inputs)."""
    out: dict[str, Any] = {}
    for ph, value in getattr(lowering, "inputs", ()):  # none: nothing to look up
        if isinstance(value, Strided):
            out.setdefault(value.buffer.name, ph.meta.get("val"))
    return out


def _pointer(
    name: str, lowering: Any, hints: dict, inputs: dict[str, Any]
) -> tuple[torch.dtype, torch.device, bool]:
    """(dtype, device, 16-byte aligned?) of the buffer passed as a kernel's pointer argument (``inputs``:
    ``input_metas``; graph inputs are aligned when their storage offset is, allocations always are)."""
    const = lowering.constants.get(name)
    if isinstance(const, torch.Tensor):
        return const.dtype, const.device, const.data_ptr() % 16 == 0
    buf = lowering.buffers.get(name)
    if buf is None:
        raise gpu_compile.Unsupported(f"buffer {name} is unknown")
    aligned = True
    meta = inputs.get(buf.name)
    if isinstance(meta, torch.Tensor):
        try:
            offset = _value(sym(meta.storage_offset()), hints)
        except gpu_compile.Unsupported:
            offset = 0  # unknown: allocations are aligned
        aligned = (offset * meta.element_size()) % 16 == 0
    return buf.dtype, buf.device, aligned
