"""Autotuning of launch configs: with the ``autotune`` setting (``KILN_AUTOTUNE=1``, ``mode="max-autotune"``),
the first launch of a kernel at a size bucket times candidate configs on the GPU and keeps the fastest.

Terms: a *config* is a kernel's launch parameters (``XBLOCK``, ``RBLOCK`` of looped reductions, ``num_warps``);
the *heuristic config* is ``TritonKernel.heuristic_config``'s, kept unless a candidate beats it by ``MARGIN``;
*candidates* are the configs around it
(``candidates``, also what ``compiler.tools.launch_sweep`` measures); a *size bucket* is (next power of two of
``xnumel``, of ``rnumel``): within one, the heuristic makes the same persistent/looped choice and the same
``RBLOCK`` for persistent rows, so a choice made at one size is valid at every size of its bucket.

Each candidate runs on the launch's real arguments. The buffers the kernel writes (``out_ptr*``: wrapper
allocations, cross-block workspaces such as the partial sums of mixed row/column kernels) are put back to
their state before the launch ahead of every candidate and before the real launch: zeroed workspaces are zero
again, slices that earlier kernels wrote into a shared buffer (``cat``) are kept, so the results are those of an
untuned launch with the chosen config. kiln's kernels store and never accumulate (no atomics), so the repeated
runs inside one candidate's timing write the same values each time.

Choices are cached in this process and on disk (``autotune_dir``, one checked entry per kernel source, device
name, bucket and Triton version): a second compile, in this process or another, times nothing. Under the
interpreter (CPU) autotuning is a no-op, logged once: interpreter timings say nothing about a GPU. Tests inject a
timer (``set_timer``) to check the selection and the cache on CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import config
from ..blocks import next_pow2
from . import cache, gpu_compile

log = logging.getLogger("kiln")

FORMAT = 1
SUFFIX = ".kat"
#: config keys a choice sets (``RBLOCK`` only for looped reductions: a persistent row needs its whole length)
TUNED = ("XBLOCK", "RBLOCK", "num_warps")

#: a candidate replaces the heuristic config only when it is faster by more than this fraction: timings of one
#: kernel in isolation repeat within about 1-2%, and a noise-level win can be a loss inside the model's step
MARGIN = 0.03
#: (fn, cfg) -> seconds, replacing the GPU timer (tests); None: ``triton.testing.do_bench`` on CUDA
_timer: list[Callable[[Callable[[], Any], dict], float] | None] = [None]
_choices: dict[str, dict] = {}  # key -> chosen config, this process
_noted: set[str] = set()


def set_timer(timer: Callable[[Callable[[], Any], dict], float] | None) -> None:
    """Use ``timer(launch, cfg) -> seconds`` for candidates, on any device (tests); None restores the GPU timer.
    Also forgets this process's choices, so that the next launch reads the disk cache."""
    _timer[0] = timer
    _choices.clear()


def folder() -> str:
    return config.settings().resolved_autotune_dir()


def _note(reason: str) -> None:
    if reason not in _noted:
        _noted.add(reason)
        log.info("kiln: autotuning skipped: %s", reason)


def active(device: torch.device) -> bool:
    """Whether launches on ``device`` can be autotuned in this process (else the reason is logged once)."""
    if _timer[0] is not None:
        return True
    if device.type != "cuda" or config.interpreting():
        _note("kernels run on the CPU through Triton's interpreter, whose timings say nothing about a GPU")
        return False
    return True


def candidates(cfg: dict[str, Any], hint: str, programs: int) -> list[dict[str, Any]]:
    """Alternatives to ``cfg``: blocks per program and warps around it (and chunk rows for column reductions);
    ``cfg`` itself is among them. Pointwise configs have no ``RBLOCK``. An ordered scatter (hint ``ordered``)
    keeps its config: its sums' order depends on the block shape, and must not depend on a timing."""
    if hint == "ordered":
        return [cfg]
    out = []
    xs = sorted({max(1, cfg["XBLOCK"] // 4), max(1, cfg["XBLOCK"] // 2), cfg["XBLOCK"], cfg["XBLOCK"] * 2})
    if "RBLOCK" not in cfg:
        for x in xs:
            for w in (2, 4, 8, 16):
                if x >= 32 * w or (x, w) == (cfg["XBLOCK"], cfg["num_warps"]):
                    out.append({**cfg, "XBLOCK": x, "num_warps": w})
        return out
    looped_outer = hint == "outer" and not programs and not cfg.get("PERSISTENT", True)
    rs = sorted({32, 64, 128, cfg["RBLOCK"]}) if looped_outer else [cfg["RBLOCK"]]
    if looped_outer:  # a narrowed column program still times the standard width (``outer_xblock`` columns)
        xs = sorted(set(xs) | {config.settings().outer_xblock})
    for x in xs:
        for r in rs:
            for w in (2, 4, 8, 16):
                if x * r < 32 * w and (x, r, w) != (cfg["XBLOCK"], cfg["RBLOCK"], cfg["num_warps"]):
                    continue  # fewer elements than threads
                out.append({**cfg, "XBLOCK": x, "RBLOCK": r, "num_warps": w})
    return out


def bucket(xnumel: int, rnumel: int) -> tuple[int, int]:
    """(next power of two of ``xnumel``, of ``rnumel``)."""
    return next_pow2(xnumel), next_pow2(rnumel)


def device_name(device: torch.device) -> str:
    if device.type == "cuda" and not config.interpreting():
        return torch.cuda.get_device_name(device)
    return f"{device.type}-interpreter" if config.interpreting() else device.type


def choice_key(kernel: Any, xnumel: int, rnumel: int, device: torch.device, cfg: dict) -> str:
    """The cache key of a choice: kernel source, hint and grid, device name, size bucket, heuristic config shape,
    Triton version."""
    import triton

    text = json.dumps(
        [
            FORMAT,
            kernel.source,
            kernel.hint,
            kernel.programs,
            device_name(device),
            bucket(xnumel, rnumel),
            sorted(k for k in cfg),
            cfg.get("PERSISTENT"),
            cfg.get("RBLOCK") if cfg.get("PERSISTENT") else None,
            triton.__version__,
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def time_config(
    kernel: Any, args: tuple, cfg: dict, timer: Callable[[Callable[[], Any], dict], float]
) -> float:
    """Seconds of one launch of ``kernel`` (a ``TritonKernel``) with ``args`` under ``cfg`` (Triton's JIT
    launch: ``cfg`` need not be the one the launcher would pick)."""
    nsizes = len(kernel.size_args)
    ints = args[len(kernel.ptr_args) :]
    xnumel = int(ints[nsizes])
    grid = (kernel.programs or (xnumel + cfg["XBLOCK"] - 1) // cfg["XBLOCK"],)
    jit = kernel.jit_function()[grid]
    on_cpu = not any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args)
    own = None if on_cpu or config.interpreting() else _own_launch(kernel, args, cfg, grid[0])
    if own is not None:
        return timer(own, cfg)

    def launch() -> None:
        if on_cpu:  # the interpreter: masked-off lanes may divide by zero, as in the launcher
            with np.errstate(all="ignore"):
                jit(*args, **cfg)
        else:
            jit(*args, **cfg)

    return timer(launch, cfg)


def _own_launch(kernel: Any, args: tuple, cfg: dict, grid0: int) -> Callable[[], None] | None:
    """A launch through kiln's own compile of this config (``gpu_compile.compile_launch``: it waits for the
    worker job ``_submit`` sent, so candidates compile in parallel), as the launcher's fast path calls it; None
    where that path does not apply (Triton's JIT then compiles the candidate)."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    index = device.index if device.index is not None else torch.cuda.current_device()
    compiled = gpu_compile.compile_launch(
        kernel.name, cache.source_path(kernel.source), kernel._fn, args, cfg, index
    )
    if compiled is None:
        return None
    consts = tuple(cfg[k] for k in ("XBLOCK", "RBLOCK", "PERSISTENT") if k in cfg)
    stream = torch._C._cuda_getCurrentRawStream(index)
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata

    def launch() -> None:
        run(grid0, 1, 1, stream, function, metadata, None, None, None, *args, *consts)

    return launch


def _submit(kernel: Any, args: tuple, cands: list[dict]) -> int:
    """Send every candidate's compile to the compile workers at once (GPU, pool on); returns how many."""
    from . import compile_jobs, precompile

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if device is None or device.type != "cuda" or not precompile.enabled():
        return 0
    sent = 0
    try:
        target = gpu_compile.device_target(
            device.index if device.index is not None else torch.cuda.current_device()
        )
        path = cache.source_path(kernel.source)
        for cfg in cands:
            req = gpu_compile.make_request(kernel.name, path, kernel._fn.arg_names, args, cfg, target)
            if not compile_jobs.has(req.key) and not gpu_compile.on_disk(req, kernel._fn):
                precompile.submit(req)
                sent += 1
    except Exception as e:  # noqa: BLE001 - an optimization: candidates then compile one by one
        log.debug(
            "kiln: autotune compiles of %s not sent to workers: %s: %s", kernel.name, type(e).__name__, e
        )
    return sent


def gpu_timer(fn: Callable[[], Any], cfg: dict) -> float:
    """Median seconds of ``fn`` on the GPU (``triton.testing.do_bench``)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median") * 1e-3


def _apply(choice: dict, cfg: dict) -> dict:
    out = dict(cfg)
    for k in TUNED:
        if k in choice and k in cfg and not (k == "RBLOCK" and cfg.get("PERSISTENT")):
            out[k] = int(choice[k])
    return out


def tuned_config(kernel: Any, cfg: dict, args: tuple, xnumel: int, rnumel: int, device: torch.device) -> dict:
    """The config for this launch: the cached choice for its bucket, else the fastest candidate timed now on
    ``args`` (the written buffers restored around it); ``cfg`` unchanged where tuning does not apply."""
    if xnumel == 0 or kernel.hint == "ordered" or not active(device):
        return cfg
    if (
        device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    ):  # no timing inside a CUDA graph capture
        return cfg
    key = choice_key(kernel, xnumel, rnumel, device, cfg)
    choice = _lookup(key)
    if choice is not None:
        gpu_compile.count(autotune_hits=1)
    else:
        choice = _tune(kernel, cfg, args)
        if choice is None:
            return cfg
        gpu_compile.count(autotuned=1)
        _write(key, choice, kernel.name)
    _choices[key] = choice
    return _apply(choice, cfg)


def _lookup(key: str) -> dict | None:
    """The cached choice of ``key``: this process's, else the disk's (then kept for this process)."""
    choice = _choices.get(key)
    if choice is None:
        choice = _read(key)
        if choice is not None:
            _choices[key] = choice
    return choice


def cached_config(kernel: Any, cfg: dict, xnumel: int, rnumel: int, device: torch.device) -> dict:
    """``cfg`` with the choice already cached for this kernel, bucket and device applied (``cfg`` unchanged when
    none is): what the ahead-of-time compile of an autotuned kernel sends to the workers, so that a warm
    compile compiles the chosen config alone and times nothing."""
    if xnumel == 0 or not kernel._autotune:
        return cfg
    choice = _lookup(choice_key(kernel, xnumel, rnumel, device, cfg))
    return _apply(choice, cfg) if choice is not None else cfg


def _tune(kernel: Any, cfg: dict, args: tuple) -> dict | None:
    timer = _timer[0] or gpu_timer
    outs = [
        a for p, a in zip(kernel.ptr_args, args) if p.startswith("out_ptr") and isinstance(a, torch.Tensor)
    ]
    saved = [o.clone() for o in outs]

    def restore() -> None:
        for o, s in zip(outs, saved):
            o.copy_(s)

    best, best_t, timed, base_t = None, float("inf"), [], float("inf")
    cands = candidates(cfg, kernel.hint, kernel.programs)
    kernel.jit_function()  # candidates compile through Triton with the module imported
    _submit(kernel, args, cands)
    try:
        for cand in cands:
            restore()
            try:
                t = time_config(kernel, args, cand, timer)
            except Exception as e:  # noqa: BLE001 - a config the kernel cannot compile or run is no candidate
                log.debug("kiln: autotune %s %s: %s: %s", kernel.name, cand, type(e).__name__, e)
                continue
            timed.append((cand, t))
            if all(cand.get(k) == cfg.get(k) for k in TUNED):
                base_t = t
            if t < best_t:
                best, best_t = cand, t
    finally:
        restore()
    if best is None:
        return None
    if best_t > base_t * (1 - MARGIN):  # within the timer's noise of the heuristic: keep the heuristic
        best, best_t = cfg, base_t
    log.info(
        "kiln: autotuned %s: %s (%.1f us; heuristic %s) of %d configs",
        kernel.name,
        {k: best[k] for k in TUNED if k in best},
        best_t * 1e6,
        {k: cfg[k] for k in TUNED if k in cfg},
        len(timed),
    )
    return {k: best[k] for k in TUNED if k in best}


def _path(key: str) -> str:
    return os.path.join(folder(), key + SUFFIX)


def _read(key: str) -> dict | None:
    if config.settings().cache_mode() == "0":
        return None
    data = cache.read_json_entry(_path(key), FORMAT, key)
    if data is None:
        return None
    try:
        choice = {k: int(v) for k, v in data["choice"].items() if k in TUNED}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    cache.touch(_path(key))
    return choice


def _write(key: str, choice: dict, name: str) -> None:
    if config.settings().cache_mode() != "1":
        return
    try:
        cache.write_entry(
            _path(key), json.dumps({"format": FORMAT, "key": key, "kernel": name, "choice": choice}).encode()
        )
        cache.evict(folder(), SUFFIX, config.settings().cache_max_mb << 20)
    except OSError as e:
        log.warning("kiln: autotune choice of %s not stored: %s", name, e)


def info() -> dict[str, Any]:
    listed = cache.entries(folder(), SUFFIX)
    return {"folder": folder(), "entries": len(listed), "bytes": sum(size for _, size, _ in listed)}


def clear() -> int:
    _choices.clear()
    return cache.clear(folder(), SUFFIX)
