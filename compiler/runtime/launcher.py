"""Launch layer: a ``TritonKernel`` module picks block sizes from run-time sizes and launches the kernel.

The wrapper calls it as ``self.<kernel>(ptrs..., sizes..., xnumel[, rnumel])``. Launch heuristics:
- pointwise: ``XBLOCK`` = next power of two of ``xnumel``, capped (1024 on GPUs, larger in the interpreter;
  ``ORDERED_XBLOCK`` for an ordered scatter on a GPU; on GPUs fewer elements a thread for kernels of more than
  12 pointers, ``POINTWISE_POINTER_ELEMENTS``).
- reduction: persistent (whole row in one block) when ``rnumel`` fits ``persistent_rblock_max``; otherwise a
  looped reduction over ``RBLOCK`` chunks. ``XBLOCK`` rows per program fill a block of a few thousand elements.
- column (outer) reduction: ``outer_xblock`` adjacent columns x ``outer_rblock`` rows per step. 64 x 64 with
  8 warps was the best uniform choice of an H100 sweep (fwd+bwd kernel us, old 32 x 128 -> 64 x 64): col_sum
  fp32 187 -> 180, RMSNorm bwd weight grad 135 -> 102, LayerNorm bwd 157 -> 147, bias-GELU bwd 107 -> 96.
  Fewer than ``OUTER_MIN_PROGRAMS`` x 64 columns: narrower programs (at least 16 columns). Long columns
  (``OUTER_LONG_RNUMEL`` rows or more) whose 64-column programs would not fill the SMs once
  (``OUTER_FILL_PROGRAMS``): 16 columns and 16 warps (H100 ``launch_sweep``, ResNet BatchNorm var_mean
  6272 x 1024: 23.4 -> 12.8 us; ViT LayerNorm weight grads 4608 x 1051: best measured configs were 16 columns).
- short rows (32 to 128 elements, ``INNER_MANY_ROWS`` rows or more): 2048 elements and 8 warps a program, not
  1024 and 4 (ConvNeXt LayerNorm 50176 x 96: 30.0 -> 21.3 us).
- mixed row/column kernels (``programs`` fixed): full-tile accumulators step over ``MIX_TILE_STEP`` elements
  (``MIX_TILE_NARROW_STEP`` for rows of at most 64) with 4 warps; one-row accumulators take a program's rows in
  one step with 8 warps when they fit ``MIX_ROW_STEP`` elements (rows of up to ``MIX_ROW_STEP_MAX_COLS``),
  otherwise at most 4 rows a step; never more rows a step than a program owns.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import reduce
from operator import or_
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import config, phase_times
from ..blocks import cdiv, next_pow2, tile_accumulators
from ..dtypes import signature_type
from ..exc import KernelLaunchError
from . import cache, gpu_compile

#: column reductions with few columns narrow their programs to keep at least this many (H100 sweep,
#: ``compiler.tools.launch_sweep``: the second stage of a ViT LayerNorm's weight gradient, 768 columns x 253
#: partial rows, 17.3 us at 64 columns a program (12 programs) and 8.0 us at 16)
OUTER_MIN_PROGRAMS = 48

#: column reductions over at least this many rows loop long enough per program that the grid must fill the GPU
OUTER_LONG_RNUMEL = 512

#: programs that fill the GPU once: the SM count of the H100 the launch heuristics were measured on
OUTER_FILL_PROGRAMS = 132

#: row reductions with at least this many rows have programs to spare (16 rows a program still gives 1024 programs)
INNER_MANY_ROWS = 16384

#: a pointwise kernel's elements per thread times its pointers stays within this: a kernel over many tensors at
#: once (an optimizer's update of several parameters, ``combo``/``split`` leftovers) holds every pointer's
#: elements in registers. H200 ``launch_sweep --case adamw``, the eight (768, 3072) AdamW updates in one kernel
#: (40 pointers): 187.5 us at 8 elements a thread (XBLOCK 1024, 4 warps), 136.9 us at 2 (XBLOCK 256); the four
#: (768, 2304) ones (20 pointers): 57.1 -> 54.1 us at 4; one tensor's (5 pointers) the same at 8 and 2
POINTWISE_POINTER_ELEMENTS = 96


#: elements a step of a mixed row/column kernel (``programs`` fixed) whose column partials are full-tile
#: accumulators (rows of at most ``config.mix_tile_acc_cols`` elements): no reduction across warps per step, so
#: small steps keep the two tiles' registers low. H200 ``compiler.tools.mix_sweep`` with each kernel autotuned: 64
#: columns took 32 rows and 4 warps where these rules had 64 and 8 (100352 x 64 at 512 programs), 256 and 512
#: columns 4 and 2 rows where they had 16 and 4 (100352 x 256, 25088 x 512 at 1024 programs). The sweep's whole
#: BatchNorm backward, old steps -> these at 512 programs: 100352 x 64 27.8 -> 23.6 us, 100352 x 256 115.1 -> 94.0
MIX_TILE_STEP = 1024
MIX_TILE_NARROW_STEP = 2048
#: the same with one-row accumulators (a reduction across warps every step), rows of at most
#: ``MIX_ROW_STEP_MAX_COLS`` elements, when a program's rows fit one step: all of them at once with 8 warps
#: (autotuned: 6272 x 1024 and ViT-B's LayerNorm 6304 x 768 at 1024 programs, chunks of 8 rows, took 8 rows and
#: 8-16 warps where these rules had 4 and 4; sweep 25.4 -> 24.9 and 21.3 -> 19.3 us). Programs of more rows keep
#: the earlier steps (4 rows): at 512 programs (chunks of 13) 8-row steps took the LayerNorm from 26.0 to 48.6 us
MIX_ROW_STEP = 8192
MIX_ROW_STEP_MAX_COLS = 1024

#: sources per program of an ordered scatter on a GPU (``codegen/scatter_kernel.py``)
ORDERED_XBLOCK = 64


class TritonKernel(torch.nn.Module):
    """One generated kernel. ``source`` is the module text; ``name`` its ``@triton.jit`` function."""

    def __init__(
        self,
        name: str,
        source: str,
        ptr_args: list[str],
        size_args: list[str],
        reduction: bool,
        hint: str = "inner",
        programs: int = 0,
    ) -> None:
        super().__init__()
        self.hint = hint
        self.programs = programs  # fixed grid of a mixed row/column kernel (whole rows per block); 0: none
        self.name = name
        self.source = source
        self.ptr_args = ptr_args
        self._nptr = len(ptr_args)
        self.size_args = size_args
        self.reduction = reduction
        self._fn = None
        self._params: list[str] | None = None  # parameter names read from the source (``param_names``)
        self._dumped: set[str] = set()
        # GPU launch paths taken [fast, jit] (a list: nn.Module.__setattr__ costs microseconds per launch)
        self._counts = [0, 0]
        self._compiled: dict[tuple, Any] = {}  # specialization -> Triton CompiledKernel (GPU fast path)
        self._launches: dict[tuple, Launch] = {}  # (xnumel, rnumel, device index or -1 for CPU) -> launch
        self._all_aligned = (
            True,
        ) * self._nptr  # the alignment key of a launch whose pointers are all aligned
        self._dump_dir = config.settings().dump_dir
        self._autotune = (
            config.settings().autotune
        )  # read now: per-compile options are active only while compiling

    @property
    def fast_launches(self) -> int:
        return self._counts[0]

    @property
    def jit_launches(self) -> int:
        return self._counts[1]

    def extra_repr(self) -> str:
        kind = f"reduction, {self.hint}" if self.reduction else "pointwise"
        return f"{self.name} ({kind}; args: {', '.join(self.ptr_args + self.size_args)})"

    # ------------------------------------------------------------------ configuration
    def launch_config(self, xnumel: int, rnumel: int, device: torch.device) -> dict[str, Any]:
        """Block sizes and warps for a launch at these sizes on ``device`` in this process."""
        return self.heuristic_config(xnumel, rnumel, config.interpreting())

    def cached_tuned_config(
        self, cfg: dict[str, Any], xnumel: int, rnumel: int, device: torch.device
    ) -> dict:
        """``cfg`` with the autotune choice already cached for these sizes applied (``cfg`` when none is, or
        autotuning is off): what the ahead-of-time compile sends, so a warm compile compiles no other config."""
        if not self._autotune:
            return cfg
        from . import autotune

        return autotune.cached_config(self, cfg, xnumel, rnumel, device)

    def heuristic_config(self, xnumel: int, rnumel: int, interp: bool) -> dict[str, Any]:
        """Block sizes and warps for these sizes, for the interpreter or for a GPU (heuristics tuned on an
        H100; see the module docstring)."""
        s = config.settings()
        if not self.reduction:
            cap = s.interp_pointwise_xblock if interp else s.pointwise_xblock
            if self.hint == "ordered" and not interp:  # an ordered scatter: XBLOCK x QBLOCK tiles per step
                cap = min(cap, ORDERED_XBLOCK)
            if not interp:  # 4 warps (128 threads) with at most POINTWISE_POINTER_ELEMENTS / pointers each
                per_thread = 1 << max(0, (POINTWISE_POINTER_ELEMENTS // max(self._nptr, 1)).bit_length() - 1)
                if per_thread < 8:
                    cap = min(cap, 128 * per_thread)
            xblock = min(next_pow2(xnumel), cap)
            return {"XBLOCK": xblock, "num_warps": 4 if xblock <= 1024 else 8}
        if interp:
            if rnumel <= s.interp_persistent_rblock_max or self.programs:
                rblock = next_pow2(max(rnumel, 1))
                xblock = max(1, min(next_pow2(xnumel), 65536 // rblock))
                if self.programs:
                    # a mixed kernel's program owns cdiv(xnumel, programs) rows: no lanes past them
                    xblock = min(xblock, next_pow2(cdiv(xnumel, self.programs)))
                return {"XBLOCK": xblock, "RBLOCK": rblock, "PERSISTENT": True, "num_warps": 1}
            return {
                "XBLOCK": 1,
                "RBLOCK": s.interp_persistent_rblock_max,
                "PERSISTENT": False,
                "num_warps": 1,
            }
        if self.hint == "outer" and rnumel > 64 and not self.programs:
            # column reductions: adjacent columns per program (coalesced), a chunk of the reduced dim per step;
            # few columns get narrower programs, so that the grid still has OUTER_MIN_PROGRAMS of them
            xblock = min(s.outer_xblock, next_pow2(xnumel), max(16, next_pow2(xnumel // OUTER_MIN_PROGRAMS)))
            warps = s.outer_num_warps
            if rnumel >= OUTER_LONG_RNUMEL:
                if cdiv(xnumel, xblock) < OUTER_FILL_PROGRAMS:
                    # long columns in fewer programs than SMs: 16 columns a program (4x the programs at 64), so
                    # that every SM streams (H100: 6272 x 1024 BatchNorm var_mean 23.4 -> 12.8 us)
                    xblock = min(xblock, 16)
                if xblock == 16:
                    warps = (
                        16  # narrow programs over long columns: more warps in flight along the reduced dim
                    )
            return {
                "XBLOCK": xblock,
                "RBLOCK": min(s.outer_rblock, next_pow2(rnumel)),
                "PERSISTENT": False,
                "num_warps": warps,
            }
        if rnumel <= s.persistent_rblock_max or self.programs:
            rblock = next_pow2(max(rnumel, 1))
            warps = max(4, min(16, rblock // 256))
            if self.programs:
                # a mixed row/column kernel loops over its rows, never more rows a step than a program owns
                # (the rest would be masked lanes); step sizes: MIX_TILE_STEP, MIX_ROW_STEP
                owned = next_pow2(cdiv(xnumel, self.programs))
                if tile_accumulators(rblock):
                    step = MIX_TILE_NARROW_STEP if rblock <= 64 else MIX_TILE_STEP
                    xblock, warps = max(1, min(step // rblock, owned)), 4
                elif rblock <= MIX_ROW_STEP_MAX_COLS and owned * rblock <= MIX_ROW_STEP:
                    xblock, warps = owned, 8
                else:
                    xblock = max(1, min(4096 // rblock, 4, owned))
            else:
                per_row = 1024 if rblock <= 256 else 4096
                if self.hint == "inner" and 32 <= rblock <= 128 and xnumel >= INNER_MANY_ROWS:
                    # many short rows: twice the rows (2048 elements) and warps a program halve the programs
                    # and their per-program loads (a LayerNorm's weight and bias): ConvNeXt 50176 x 96 30 -> 21 us
                    per_row, warps = 2048, 8
                xblock = max(1, min(next_pow2(xnumel), per_row // rblock, 64 if rblock <= 256 else 4))
            return {"XBLOCK": xblock, "RBLOCK": rblock, "PERSISTENT": True, "num_warps": warps}
        return {"XBLOCK": 1, "RBLOCK": s.looped_rblock, "PERSISTENT": False, "num_warps": 8}

    # ------------------------------------------------------------------ launching
    def forward(self, *args: Any) -> None:
        """Launch with ``args`` = pointers, sizes, ``xnumel`` (and ``rnumel``) as the wrapper passes them.

        The host time of this path is kiln's per-launch overhead (``harness bench overhead``, and per phase
        ``python -m harness.bench.models.host_path``): a launch is looked up by the exact integer arguments and
        device (``Launch``), its compiled kernel by the 16-byte alignment of the pointers, and called directly
        through Triton's launcher. The lean path (``LEAN``) reads the pointers' device from the first one and
        their alignment as one OR over all of them, in C (``map``/``reduce``: no Python per argument); the
        launcher call's leading arguments come prebound from the ``Launch``. The pointers reach Triton's launcher
        as the addresses read for that check: given a tensor, its C launcher calls ``data_ptr()`` again and asks
        the driver about the pointer (``cuPointerGetAttribute``), a driver call per pointer per launch, hundreds a
        launch for a combo kernel over an optimizer's parameters; given an int it takes the address as it is. The
        first launch of each specialization passes the tensors (``_launch_slow``), so a pointer Triton cannot
        reach (a CPU tensor) fails there with Triton's message. On a GPU the kernel's module is imported (its
        ``JITFunction`` built) only when Triton must compile it or its JIT launches it: a first launch that the
        binary index serves needs neither (``LazyJit``, ``_compile_own``).
        """
        nptr = self._nptr
        if LEAN[0] and nptr:
            try:
                where = args[0].get_device()
            except AttributeError:  # a pointer argument that is not a tensor: the first one that is
                where = device_index_of(args[:nptr])
            ints = args[nptr:]
            launch = self._launches.get((ints, where))
            if launch is not None and where >= 0 and not launch.switch_device and not self._dump_dir:
                ptrs = tuple(map(_data_ptr, args[:nptr]))
                if reduce(or_, ptrs) & 15:
                    fast = None  # some pointer not 16-byte aligned: the exact alignment key, below
                else:
                    fast = launch.compiled.get(self._all_aligned)
                if (
                    fast is not None
                    and _HOOK_CHAINS
                    and not (_HOOKS.launch_enter_hook.calls or _HOOKS.launch_exit_hook.calls)
                ):
                    self._counts[0] += 1
                    try:
                        fast[0](
                            *fast[1], _raw_stream(launch.device_index), *fast[2], *ptrs, *ints, *launch.consts
                        )
                    except Exception as e:
                        raise self._launch_error(launch, e) from e
                    return None
        return self._forward(args)

    def _forward(self, args: tuple) -> None:
        """The full launch path: first launches, CPU (the interpreter), several GPUs, spec dumps, hooks."""
        nptr = self._nptr
        first = args[0] if nptr else None
        where = first.get_device() if type(first) is torch.Tensor else device_index_of(args[:nptr])
        ints = args[nptr:]
        launch = self._launches.get((ints, where))
        if launch is None:
            launch = self._prepare(ints, where, args)
        if launch.empty:
            return None
        try:
            if where < 0:
                with np.errstate(all="ignore"):  # masked-off lanes may divide by zero; results are discarded
                    launch.jit(*args, **launch.cfg)
            elif launch.switch_device and where != torch.cuda.current_device():
                with torch.cuda.device(where):
                    self._launch_gpu(launch, args)
            else:
                self._launch_gpu(launch, args)
        except Exception as e:  # keep the kernel name and source location in the message
            raise self._launch_error(launch, e) from e
        if self._dump_dir:
            # the spec is for compiling ahead of time for GPUs: record the GPU launch config for these sizes
            self._dump_spec(args, self.heuristic_config(launch.xnumel, launch.rnumel, interp=False))
        return None

    def _launch_error(self, launch: Launch, e: Exception) -> KernelLaunchError:
        """The launch's failure with the kernel name, source location and config in the message."""
        return KernelLaunchError(
            f"launching {self.name} ({cache.source_path(self.source)}) "
            f"with {launch.cfg} failed: {type(e).__name__}: {e}"
        )

    def __call__(self, *args: Any) -> None:
        # nn.Module.__call__ runs hook machinery on every launch; a kernel has no hooks
        return self.forward(*args)

    def _prepare(self, ints: tuple, where: int, args: tuple = ()) -> Launch:
        nsizes = len(self.size_args)
        xnumel = int(ints[nsizes])
        rnumel = int(ints[nsizes + 1]) if self.reduction else 1
        device = torch.device("cpu") if where < 0 else torch.device("cuda", where)
        cfg = self.launch_config(xnumel, rnumel, device)
        if where < 0:  # the interpreter runs the JITFunction; a GPU launch imports it lazily
            self.jit_function()
        if (
            self._autotune and args
        ):  # time candidates on these arguments once per size bucket (runtime/autotune.py)
            from . import autotune

            with phase_times.phase("autotune"):
                cfg = autotune.tuned_config(self, cfg, args, xnumel, rnumel, device)
        grid0 = self.programs or cdiv(xnumel, cfg["XBLOCK"])
        consts = tuple(cfg[k] for k in ("XBLOCK", "RBLOCK", "PERSISTENT") if k in cfg)
        # Triton specializes an int on being 1, a multiple of 16 and 32-bit: launches whose ints agree on that
        # share compiled kernels (``self._compiled``); a launch keeps its own by pointer alignment
        int_spec = tuple((a == 1, a % 16 == 0, -2147483648 <= a <= 2147483647) for a in ints)
        jit = self._fn[(grid0,)] if self._fn is not None else LazyJit(self, grid0)
        launch = Launch(
            jit,
            cfg,
            grid0,
            consts,
            (where, int_spec, tuple(sorted(cfg.items()))),
            max(where, 0),
            device,
            xnumel,
            rnumel,
            xnumel == 0,
            where >= 0 and multi_gpu(),
            {},
        )
        if len(self._launches) >= MAX_LAUNCHES:  # sizes that never repeat (dynamic shapes): start over
            self._launches.clear()
        self._launches[(ints, where)] = launch
        return launch

    def _launch_gpu(self, launch: Launch, args: tuple) -> None:
        """Call the compiled kernel for this launch and pointer alignment directly (Triton's ``JITFunction.run``
        re-binds and re-specializes every argument on every call: tens of microseconds of Python). A miss
        (first launch of a specialization) or active launch hooks (profilers) take ``_launch_slow``."""
        aligned = tuple([a.data_ptr() & 15 == 0 for a in args[: self._nptr]])
        fast = launch.compiled.get(aligned)
        if fast is None or _launch_hooks_active():
            return self._launch_slow(launch, args, aligned)
        self._counts[0] += 1
        run, (grid0, _, _), (function, metadata, _, _, _) = fast
        run(
            grid0,
            1,
            1,
            torch._C._cuda_getCurrentRawStream(launch.device_index),
            function,
            metadata,
            None,
            None,
            None,
            *args,
            *launch.consts,
        )

    def _launch_slow(self, launch: Launch, args: tuple, aligned: tuple) -> None:
        """Launch through a compiled kernel found or made for this specialization (kiln's own compile, else
        Triton's JIT), and remember it for the fast path."""
        key = (aligned, launch.key)
        compiled = self._compiled.get(key) if _FAST_LAUNCH["ok"] else None
        hooks = _launch_hooks_active()
        if compiled is None or hooks:
            own = (
                None
                if compiled is not None or not _FAST_LAUNCH["ok"] or hooks
                else self._compile_own(args, launch)
            )
            if own is None:
                with phase_times.phase("triton_compile"):  # Triton's JIT: compiles at its first call
                    kernel = launch.jit(*args, **launch.cfg)
                if kernel is not None and _FAST_LAUNCH["ok"]:
                    self._compiled[key] = kernel
                    launch.compiled[aligned] = fast_entry(kernel, launch.grid0)
                self._counts[1] += 1
                return
            compiled = self._compiled[key] = own
        self._counts[0] += 1
        stream = torch._C._cuda_getCurrentRawStream(launch.device_index)
        try:
            compiled.run(
                launch.grid0,
                1,
                1,
                stream,
                compiled.function,
                compiled.packed_metadata,
                None,
                None,
                None,
                *args,
                *launch.consts,
            )
        except TypeError:  # a Triton whose launcher takes other arguments: use the JIT path from now on
            _FAST_LAUNCH["ok"] = False
            launch.compiled.clear()
            launch.jit(*args, **launch.cfg)
            return
        launch.compiled[aligned] = fast_entry(compiled, launch.grid0)

    def jit_function(self) -> Any:
        """The kernel's ``@triton.jit`` function (its module imported at the first call)."""
        if self._fn is None:
            self._fn = cache.load_kernel(self.source, self.name)
        return self._fn

    def param_names(self, cfg: dict[str, Any]) -> list[str]:
        """The kernel's parameter names without importing its module (what ``gpu_compile`` keys a request by):
        read from the ``def`` line of the source, else as kiln's renderer writes them (pointers, sizes,
        ``xnumel``, ``rnumel``, then the constexprs of ``cfg``)."""
        if self._params is None:
            self._params = source_params(self.source, self.name) or []
        if self._params:
            return list(self._params)
        names = self.ptr_args + self.size_args + ["xnumel"] + (["rnumel"] if self.reduction else [])
        return names + [k for k in gpu_compile.CONSTEXPR_NAMES if k in cfg]

    def _compile_own(self, args: tuple, launch: Launch) -> Any:
        """The compile-on-miss of the fast path: kiln's own load (binary index) or ``triton.compile`` of this
        specialization (``gpu_compile.compile_launch``; waits for a compile worker's job first), or None: then
        Triton's JIT compiles it, as before. The kernel's module is imported only when ``triton.compile`` runs."""
        loaded = self._fn is not None
        with phase_times.phase("triton_compile"):
            kernel = gpu_compile.compile_launch(
                self.name,
                cache.source_path(self.source),
                self._fn if loaded else self.jit_function,
                args,
                launch.cfg,
                launch.device_index,
                None if loaded else self.param_names(launch.cfg),
            )
        if kernel is None:
            gpu_compile.count_jit()
        return kernel

    def _dump_spec(self, args: tuple, cfg: dict[str, Any]) -> None:
        names = self.ptr_args + self.size_args + ["xnumel"] + (["rnumel"] if self.reduction else [])
        signature: dict[str, str] = {}
        for n, a in zip(names, args):
            if isinstance(a, torch.Tensor):
                signature[n] = "*" + signature_type(a.dtype)
            else:
                signature[n] = "i32" if -(2**31) <= int(a) < 2**31 else "i64"
        constexprs = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
        for k in constexprs:
            signature[k] = "constexpr"
        spec = {
            "kernel": self.name,
            "source": f"{self.name}.py",
            "signature": signature,
            "constexprs": constexprs,
            "num_warps": cfg.get("num_warps", 4),
            "num_stages": cfg.get("num_stages", 3),
        }
        text = json.dumps(spec, sort_keys=True, indent=1)
        tag = hashlib.sha256(text.encode()).hexdigest()[:8]
        if tag in self._dumped:
            return
        self._dumped.add(tag)
        folder = os.path.join(self._dump_dir, "kernels")
        path = os.path.join(folder, f"{self.name}.{tag}.json")
        if not os.path.exists(path):
            cache.write_atomic(path, text + "\n")
        src = os.path.join(folder, f"{self.name}.py")
        if not os.path.exists(src):
            cache.write_atomic(src, self.source)


_DEF = re.compile(r"^def (\w+)\(([^()]*)\):", re.MULTILINE)


def source_params(source: str, name: str) -> list[str] | None:
    """The parameter names of function ``name`` in ``source`` (annotations and defaults dropped), or None when its
    ``def`` line is not the one-line form kiln's renderer writes."""
    for m in _DEF.finditer(source):
        if m.group(1) == name:
            names = [p.split(":")[0].split("=")[0].strip() for p in m.group(2).split(",") if p.strip()]
            return names if all(n.isidentifier() for n in names) else None
    return None


def fast_entry(kernel: Any, grid0: int) -> tuple[Any, tuple, tuple]:
    """What the fast path calls for a compiled kernel: (its launcher, the arguments before the stream, those after
    it and before the kernel's own)."""
    return kernel.run, (grid0, 1, 1), (kernel.function, kernel.packed_metadata, None, None, None)


_data_ptr = torch.Tensor.data_ptr


def _resolve_stream(index: int) -> int:
    """The current raw CUDA stream of device ``index``; binds ``_raw_stream`` to torch's function at its first
    call (it does not exist in a CPU build)."""
    global _raw_stream
    _raw_stream = torch._C._cuda_getCurrentRawStream
    return _raw_stream(index)


#: the current raw CUDA stream of a device (torch's own function once a GPU launch has run)
_raw_stream = _resolve_stream


class LazyJit:
    """Triton's JIT launcher for one grid of a kernel, made at its first call (a GPU launch that kiln's own path
    serves, from the binary index, never imports the kernel's module nor builds its ``JITFunction``)."""

    __slots__ = ("kernel", "grid0", "_jit")

    def __init__(self, kernel: TritonKernel, grid0: int) -> None:
        self.kernel = kernel
        self.grid0 = grid0
        self._jit: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._jit is None:
            self._jit = self.kernel.jit_function()[(self.grid0,)]
        return self._jit(*args, **kwargs)


class Launch(NamedTuple):
    """Everything a launch at one set of integer arguments and device needs, computed once."""

    jit: Any  # Triton's JIT launcher for the grid (on a GPU a ``LazyJit`` until the module is imported)
    cfg: dict
    grid0: int
    consts: tuple  # constexpr values in parameter order (appended to the arguments)
    key: tuple  # (device index, int specialization, config items): part of the compiled-kernel cache key
    device_index: int
    device: torch.device
    xnumel: int
    rnumel: int
    empty: bool  # xnumel == 0: nothing to launch
    switch_device: bool  # several GPUs: make the tensors' device current around the launch
    compiled: dict  # pointer alignment -> ``fast_entry`` (launcher and its leading arguments): the fast path


#: the launcher's lean host path (on by default); ``[False]`` takes the path it replaced (``host_path --compare``)
LEAN = [True]

#: distinct integer-argument sets one kernel keeps launches for (dynamic sizes that never repeat start over)
MAX_LAUNCHES = 1024


#: flips to False for good if this Triton's compiled-kernel launcher has another signature
_FAST_LAUNCH = {"ok": True}


def _hook_holder() -> Any:
    """Where this Triton keeps its launch hooks (``knobs.runtime``, or ``CompiledKernel`` in older ones)."""
    try:
        from triton import knobs

        return knobs.runtime
    except Exception:
        from triton.compiler import CompiledKernel

        return CompiledKernel


_HOOKS = _hook_holder()


def _hook_set(hook: Any) -> bool:
    """A launch hook is set: a callable, or a non-empty ``HookChain`` (Triton 3.5+ always has the chains)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


def _launch_hooks_active() -> bool:
    return _hook_set(getattr(_HOOKS, "launch_enter_hook", None)) or _hook_set(
        getattr(_HOOKS, "launch_exit_hook", None)
    )


#: Triton 3.5+: launch hooks live in two ``HookChain``s (the lean path reads their ``calls``; older: no lean path)
_HOOK_CHAINS = hasattr(getattr(_HOOKS, "launch_enter_hook", None), "calls")

if _HOOK_CHAINS:

    def _launch_hooks_active() -> bool:  # noqa: F811  (the same test, four attribute loads: it runs every launch)
        return bool(_HOOKS.launch_enter_hook.calls or _HOOKS.launch_exit_hook.calls)


_gpu_count: list[int] = []


def multi_gpu() -> bool:
    """More than one visible GPU (then launches set the device of their tensors)."""
    if not _gpu_count:
        _gpu_count.append(torch.cuda.device_count())
    return _gpu_count[0] > 1


def device_index_of(values: tuple) -> int:
    """The device index of the first tensor among ``values``: -1 for CPU (or no tensor), else the CUDA index."""
    for t in values:
        if isinstance(t, torch.Tensor):
            return t.get_device()
    return -1
