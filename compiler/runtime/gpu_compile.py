"""kiln's own GPU compile path: the Triton specialization of a launch, ``triton.compile`` of it, and stats.

Triton's JIT specializes a kernel on its arguments at every launch and compiles each new specialization
serially on the launching thread. kiln instead builds the ``ASTSource(fn, signature, constexprs, attrs)``
itself — from a launch's arguments (``compile_launch``, the launcher's compile-on-miss) or, ahead of time,
from the sizes a graph was compiled for (``runtime.precompile``, which sends the requests to the worker
pool of ``runtime.compile_pool`` and leaves the jobs in ``runtime.compile_jobs``). Both sides build a request with ``make_request``, so a worker's compile
and the first launch's compile of the same specialization have the same Triton cache key: the launch finds
the worker's result in Triton's on-disk cache (``TRITON_CACHE_DIR``), and a later process finds both. Each
request compiled or loaded here is noted in the binary index (``runtime/binary_index.py``): a later process
builds its ``CompiledKernel`` from the Triton cache files it names, without ``triton.compile`` (whose cache key
hashes ``libtriton.so`` once per process) and without importing the kernel's module.

Specialization (as Triton's JIT does it): pointers are ``*<dtype>`` with ``tt.divisibility=16`` when
16-byte aligned; ints are i32/i64 (u64 above), ``tt.divisibility=16`` when divisible by 16, and a
constexpr when equal to 1; the launch config's XBLOCK/RBLOCK/PERSISTENT are constexprs; ``num_warps`` is
an option. Anything else (another backend than CUDA, a Triton this module cannot drive) returns None and
the launcher uses Triton's JIT as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import threading
import time
import types
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .. import dtypes
from ..exc import KernelCompileError
from . import binary_index, compile_jobs, compile_worker

log = logging.getLogger("kiln")

CONSTEXPR_NAMES = ("XBLOCK", "RBLOCK", "PERSISTENT")
#: a combo kernel's per-part block sizes (``codegen/combo.py``): constexprs after its arguments, in part order
_PART_BLOCK = re.compile(r"XBLOCK_p(\d+)")


def constexpr_names(cfg: dict) -> list[str]:
    """The constexpr parameters a launch config sets, in the order kiln's kernels declare them: ``XBLOCK``,
    ``RBLOCK``, ``PERSISTENT``, then a combo's ``XBLOCK_p0``, ``XBLOCK_p1``, ..."""
    parts = sorted((k for k in cfg if _PART_BLOCK.fullmatch(k)), key=lambda k: int(k[len("XBLOCK_p") :]))
    return [k for k in CONSTEXPR_NAMES if k in cfg] + parts


class Unsupported(TypeError):
    """An argument kiln's compile path does not specialize (that launch uses Triton's JIT)."""


class Ptr(NamedTuple):
    """A pointer argument known ahead of time by dtype and (guessed) 16-byte alignment only."""

    dtype: torch.dtype
    aligned: bool = True


@dataclasses.dataclass
class CompileStats:
    """What kiln's compile path did in this process (``compiler.runtime.compile_stats()``)."""

    compiled: int = 0  # specializations compiled from scratch, here or in a worker
    cache_hits: int = 0  # specializations found in Triton's on-disk cache (compiled by an earlier process)
    binary_hits: int = 0  # of ``cache_hits``: loaded through kiln's binary index (no ``triton.compile``)
    worker_compiles: int = 0  # of ``compiled``: compiled in worker processes
    worker_misses: int = 0  # a worker compiled it, yet the launch's compile missed the cache (should be 0)
    jit_compiles: int = 0  # first launches left to Triton's JIT (launch hooks, non-CUDA, fallbacks)
    submitted: int = 0  # requests sent to compile workers
    skipped_on_disk: int = 0  # ahead-of-time requests not sent: already in the on-disk cache
    seconds: float = 0.0  # main thread, first launches: compile, load and wait
    wait_seconds: float = 0.0  # of ``seconds``: waiting for workers
    worker_seconds: float = 0.0  # summed time of workers' compiles
    graph_hits: int = (
        0  # graphs rebuilt from the graph cache (``runtime/graph_cache.py``): no kiln passes ran
    )
    graph_misses: int = 0  # graphs compiled by the passes with the graph cache on (stored unless skipped)
    graph_skips: int = 0  # of ``graph_misses``: not stored (``graph_cache.skipped()`` says why)
    front_hits: int = (
        0  # of ``graph_hits``: inference graphs found by their Dynamo graph (AOTAutograd skipped)
    )
    shared_loads: int = (
        0  # first launches answered by a kernel this process had loaded (same request and device)
    )
    autotuned: int = 0  # kernels whose launch configs were timed (``runtime/autotune.py``)
    autotune_hits: int = 0  # autotuned launches that found their choice cached (no timing)

    def summary(self) -> str:
        return (
            f"{self.compiled} compiled ({self.worker_compiles} in workers), {self.cache_hits} cache hits "
            f"({self.binary_hits} through the binary index), "
            f"{self.shared_loads} loaded once for several launch sites, "
            f"{self.jit_compiles} via Triton's JIT; {self.seconds:.2f} s at first launches "
            f"({self.wait_seconds:.2f} s waiting for workers), {self.worker_seconds:.2f} s in workers; "
            f"graph cache {self.graph_hits} hits ({self.front_hits} before AOTAutograd), {self.graph_misses} misses "
            f"({self.graph_skips} not stored); "
            f"autotune {self.autotuned} timed, {self.autotune_hits} cached"
        )


STATS = CompileStats()
_stats_lock = threading.Lock()


def compile_stats() -> CompileStats:
    """A copy of this process's compile counters."""
    with _stats_lock:
        return dataclasses.replace(STATS)


def reset_compile_stats() -> None:
    with _stats_lock:
        for f in dataclasses.fields(CompileStats):
            setattr(STATS, f.name, f.default)


def count(**deltas: float) -> None:
    with _stats_lock:
        for k, v in deltas.items():
            setattr(STATS, k, getattr(STATS, k) + v)


# ---------------------------------------------------------------------------------------- specialization
def specialize(value: Any) -> tuple[str, Any]:
    """(type, specialization) of one non-constexpr argument, as Triton's JIT computes it: ``"D"`` marks
    16-byte alignment (pointers) or divisibility by 16 (ints); an int equal to 1 becomes a constexpr."""
    if isinstance(value, torch.Tensor):
        return "*" + _pointer_type(value.dtype), "D" if value.data_ptr() % 16 == 0 else ""
    if isinstance(value, Ptr):
        return "*" + _pointer_type(value.dtype), "D" if value.aligned else ""
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 1:
            return "constexpr", 1
        if -(2**31) <= value <= 2**31 - 1:
            kind = "i32"
        elif -(2**63) <= value <= 2**63 - 1:
            kind = "i64"
        else:
            kind = "u64"
        return kind, "D" if value % 16 == 0 else ""
    raise Unsupported(f"kiln's compile path does not specialize {type(value).__name__} arguments")


def _pointer_type(dtype: torch.dtype) -> str:
    try:
        return dtypes.info(dtype).pointer  # as Triton's JIT names them (bool tensors are ``*u1`` there)
    except NotImplementedError:
        raise Unsupported(f"no Triton pointer type for {dtype}") from None


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """One specialization of one kernel, as ``triton.compile`` gets it (picklable parts only)."""

    kernel: str  # the @triton.jit function
    path: str  # its module file (kiln's kernel cache: the name is the source hash)
    signature: dict  # arg name -> "*fp32" / "i32" / "constexpr" ...
    constexprs: dict  # (arg index,) -> value
    attrs: dict  # (arg index,) -> [["tt.divisibility", 16]] (Triton's parsed form)
    options: dict  # the backend's parsed options (what the JIT passes to triton.compile)
    target: tuple  # GPUTarget fields (backend, arch, warp_size)
    key: str  # identifies the request: pending worker jobs are found by it

    def wire(self, env: dict) -> dict:
        """The message a compile worker gets (``env``: Triton's cache folder and cache-relevant vars)."""
        return {
            "kernel": self.kernel,
            "path": self.path,
            "module": module_name(self.path),
            "signature": self.signature,
            "constexprs": self.constexprs,
            "attrs": self.attrs,
            "options": self.options,
            "target": self.target,
            "env": env,
        }

    @property
    def label(self) -> str:
        backend, arch, _ = self.target
        return f"{self.kernel} for {backend} {'sm_' + str(arch) if backend == 'cuda' else arch}"


def module_name(path: str) -> str:
    """The module name kiln's cache gives a kernel file (``cache.load_kernel``)."""
    import os

    return "kiln_kernels." + os.path.splitext(os.path.basename(path))[0]


def make_request(
    kernel: str, path: str, arg_names: Sequence[str], args: Sequence[Any], cfg: dict, target: Any
) -> CompileRequest:
    """The request for launching ``kernel`` with ``args`` (tensors, ``Ptr`` guesses, ints) and the launch
    config ``cfg`` (constexprs and ``num_warps``/``num_stages``) on ``target`` (a ``GPUTarget``)."""
    from triton.compiler.compiler import make_backend

    names = list(arg_names)
    consts = constexpr_names(cfg)
    if names[len(args) :] != consts:
        raise Unsupported(f"{kernel}: parameters {names} are not {len(args)} arguments + constexprs {consts}")
    spec = [specialize(a) for a in args] + [("constexpr", cfg[k]) for k in consts]
    bound = dict(zip(names, list(args) + [cfg[k] for k in consts]))
    kwargs = _jit_kwargs(cfg)
    backend = make_backend(target)
    options, signature, constexprs, attrs = _pack(backend, names, kwargs, bound, spec)
    opts = dict(options.__dict__)
    tgt = (target.backend, target.arch, target.warp_size)
    key = hashlib.sha256(
        repr(
            (
                path,
                kernel,
                sorted(signature.items()),
                sorted(constexprs.items()),
                sorted(attrs.items()),
                sorted(opts.items()),
                tgt,
            )
        ).encode()
    ).hexdigest()
    return CompileRequest(kernel, path, signature, constexprs, attrs, opts, tgt, key)


def _jit_kwargs(cfg: dict) -> dict:
    """The keyword arguments Triton's ``JITFunction.run`` parses options from."""
    from triton import knobs

    kwargs = dict(cfg)
    kwargs["debug"] = bool(knobs.runtime.debug)
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):  # Triton 3.9
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    return kwargs


def _pack(backend: Any, names: list[str], kwargs: dict, bound: dict, spec: list) -> tuple:
    """(options, signature, constexprs, attrs) from a specialization: Triton's own ``_pack_args`` (the
    exact form of this version, so kiln's and the JIT's cache keys agree), else the same by hand."""
    from triton.runtime.jit import JITFunction

    pack = getattr(JITFunction, "_pack_args", None)
    if pack is not None:
        shim = types.SimpleNamespace(params=[types.SimpleNamespace(name=n) for n in names])
        try:
            return pack(shim, backend, kwargs, bound, spec, None)
        except (TypeError, AttributeError, KeyError) as e:
            log.debug("kiln: Triton's _pack_args failed (%s); building the signature by hand", e)
    options = backend.parse_options(kwargs)
    signature = {n: s[0] for n, s in zip(names, spec)}
    constexprs = {(i,): bound[n] for i, (n, s) in enumerate(zip(names, spec)) if s[0] == "constexpr"}
    attrs = {(i,): backend.parse_attr(s[1]) for i, s in enumerate(spec) if isinstance(s[1], str)}
    return options, signature, constexprs, attrs


def ast_source(req: CompileRequest, fn: Any) -> Any:
    from triton.compiler import ASTSource

    return ASTSource(fn, dict(req.signature), dict(req.constexprs), dict(req.attrs))


def cache_env() -> dict:
    """Triton's cache folder, the cache-invalidating variables of this process, and the ptxas variables
    (``compile_worker.PTXAS_ENV``, None where unset): a worker copies them, so its cache keys are this process's. The
    ptxas paths are not on Triton's invalidating list, yet the ptxas version is part of each key, and Inductor
    sets ``TRITON_PTXAS_PATH`` (PyTorch's bundled ptxas) in a process on its first compile there: without them a
    worker started before that would compile with Triton's own ptxas, under keys this process never looks up.
    This process's own keys (``on_disk``, ``compile_here``) follow the same variables where they are computed."""
    import os

    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars

    env: dict[str, str | None] = dict(get_cache_invalidating_env_vars())
    env.update({name: os.environ.get(name) for name in compile_worker.PTXAS_ENV})
    env["TRITON_CACHE_DIR"] = knobs.cache.dir
    return env


def on_disk(req: CompileRequest, fn: Any) -> bool:
    """True when Triton's on-disk cache already holds this request's kernel (the binary index's entry for it, else
    the key ``triton.compile`` computes; ``fn``: the kernel's ``JITFunction`` or a function returning it, called
    only then). False when unsure."""
    if binary_index.lookup(req) is not None:
        return True
    try:
        if not hasattr(fn, "arg_names"):
            fn = fn()
        if list(fn.arg_names) != list(req.signature):
            return False
        from triton import knobs
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import get_cache_key, get_cache_manager

        if knobs.runtime.add_stages_inspection_hook is not None or knobs.compilation.always_compile:
            return False
        compile_worker.follow_ptxas_env()
        src = ast_source(req, fn)
        backend = make_backend(GPUTarget(*req.target))
        options = backend.parse_options(dict(req.options))
        key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
        name = f"{src.name[:150]}.json"
        group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name)
        return bool(group) and name in group
    except Exception as e:  # noqa: BLE001 - a Triton without these internals: compile as usual
        log.debug("kiln: on-disk cache check failed: %s", e)
        return False


_compile_lock = threading.Lock()


def compile_here(req: CompileRequest, fn: Any) -> tuple[Any, bool | None]:
    """``triton.compile`` of ``req`` in this process: (CompiledKernel, cache hit or None when unknown)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    hits: list[bool] = []
    compile_worker.follow_ptxas_env()
    with _compile_lock:  # the listener is global: one compile at a time tells its own hit from others'
        previous = knobs.compilation.listener

        def listener(**kw: Any) -> None:
            hits.append(bool(kw.get("cache_hit")))
            if previous is not None:
                previous(**kw)

        knobs.compilation.listener = listener
        try:
            kernel = triton.compile(
                ast_source(req, fn), target=GPUTarget(*req.target), options=dict(req.options)
            )
        finally:
            knobs.compilation.listener = previous
    return kernel, (hits[0] if hits else None)


# ---------------------------------------------------------------------------------------- first launch
#: False for good once this Triton cannot be driven (a launch then uses Triton's JIT)
_OWN = {"ok": True}
_targets: dict[int, Any] = {}
#: (request key, device index) -> the CompiledKernel this process loaded for it: the launch sites of one source
#: (a model's repeated layers share a kernel source; each is its own ``TritonKernel``) load its binary once
_loaded: dict[tuple[str, int], Any] = {}


def memo_platform_key() -> None:
    """Make Triton's ``runtime.build.platform_key`` (part of the key of each kernel's C launcher, built at its first
    load) answer from memory after its first call: it calls ``platform.architecture()``, which starts a ``file``
    subprocess every time (about 4 ms a kernel: half a second for a ResNet-50 training step's 142 kernels in a
    warm process). The machine, OS and interpreter it names cannot change within a process."""
    import functools

    try:
        from triton.runtime import build
    except ImportError:  # pragma: no cover - a Triton without it
        return
    fn = getattr(build, "platform_key", None)
    if callable(fn) and not getattr(fn, "kiln_memo", False):
        memo = functools.lru_cache(maxsize=1)(fn)
        memo.kiln_memo = True  # type: ignore[attr-defined]
        build.platform_key = memo


def device_target(index: int) -> Any:
    """The ``GPUTarget`` of CUDA device ``index`` (Triton's driver, asked once per device)."""
    target = _targets.get(index)
    if target is None:
        memo_platform_key()
        from triton.runtime import driver

        with torch.cuda.device(index):
            target = driver.active.get_current_target()
        _targets[index] = target
    return target


def compile_launch(
    name: str,
    source_path: str,
    fn: Any,
    args: Sequence[Any],
    cfg: dict,
    device_index: int,
    arg_names: Sequence[str] | None = None,
) -> Any | None:
    """The compiled kernel for a first launch of this specialization, ready for ``CompiledKernel.run``;
    None when kiln's path does not apply (the caller then uses Triton's JIT).

    ``fn`` is the kernel's ``JITFunction``, or a function of no arguments that imports it (``arg_names``: the
    kernel's parameter names, as the launcher knows them): it is called only when the kernel must go through
    ``triton.compile``. A request this process already loaded on this device returns that kernel (no Triton
    cache lookup, no second module load); one the binary index knows (``runtime/binary_index.py``: an earlier
    process's compile or load of it under this toolchain) is built from its Triton cache files, with no
    ``triton.compile`` and no import of the kernel's module. Otherwise a worker job for the same request
    (``precompile``) is waited for first; its result is in the on-disk cache, so the compile here only loads it.
    A compile error raises ``KernelCompileError``.
    """
    if not _OWN["ok"]:
        return None
    start = time.perf_counter()
    jit_fn = fn if hasattr(fn, "arg_names") else None
    try:
        target = device_target(device_index)
        if target.backend != "cuda":
            _OWN["ok"] = False
            return None
        if arg_names is None:
            assert jit_fn is not None, "a kernel loader comes with the kernel's parameter names"
            arg_names = jit_fn.arg_names
        names = list(arg_names)
        req = make_request(name, source_path, names, args, cfg, target)
    except Unsupported as e:
        log.debug("kiln: %s", e)
        return None
    except Exception as e:  # noqa: BLE001 - arguments or a Triton kiln cannot drive: the JIT path
        _disable(e)
        return None
    loaded = _loaded.get((req.key, device_index))
    if loaded is not None:
        if compile_jobs.has(req.key):  # a job sent for it meanwhile: claim it, its result is this kernel
            compile_jobs.wait_for(req)
        count(shared_loads=1)
        return loaded
    if not compile_jobs.has(req.key):
        kernel = _from_index(req, jit_fn)
        if kernel is not None:
            count(cache_hits=1, binary_hits=1, seconds=time.perf_counter() - start)
            _loaded[(req.key, device_index)] = kernel
            return kernel
    if jit_fn is None:
        try:
            jit_fn = fn()
            if list(jit_fn.arg_names) != names:  # the launcher's names were wrong: Triton's are the kernel's
                req = make_request(name, source_path, jit_fn.arg_names, args, cfg, target)
        except Unsupported as e:
            log.debug("kiln: %s", e)
            return None
    fn = jit_fn
    answer = compile_jobs.wait_for(req)
    wait = time.perf_counter() - start
    try:
        kernel, hit = compile_here(req, fn)
        _check_loaded(kernel)
    except Exception as e:
        if _is_compile_error(e):
            raise KernelCompileError(f"compiling {req.label} failed: {type(e).__name__}: {e}") from e
        _disable(e)
        return None
    if answer is not None and answer.get("ok"):
        count(worker_seconds=answer["seconds"])
        if answer["hit"]:
            count(cache_hits=1)
        else:
            count(compiled=1, worker_compiles=1, worker_misses=0 if hit in (True, None) else 1)
            if hit is False:
                log.warning("kiln: %s was compiled in a worker but missed Triton's cache here", req.label)
    elif hit:
        count(cache_hits=1)
    else:
        count(compiled=1)
    binary_index.record(req, kernel)
    count(seconds=time.perf_counter() - start, wait_seconds=wait)
    _loaded[(req.key, device_index)] = kernel
    return kernel


def _check_loaded(kernel: Any) -> None:
    """Load the binary now (the fast path reads ``.function`` before ``.run``) and check it can be launched."""
    if hasattr(kernel, "_init_handles"):
        kernel._init_handles()
    if getattr(kernel, "function", None) is None or not callable(getattr(kernel, "run", None)):
        raise TypeError("CompiledKernel has no function/run after _init_handles")


def _from_index(req: CompileRequest, fn: Any) -> Any | None:
    """``req``'s kernel loaded through the binary index, or None (no entry, or any doubt: then the caller's
    ``triton.compile`` decides, and raises what it raises)."""
    kernel = binary_index.load(req, fn)
    if kernel is None:
        return None
    try:
        _check_loaded(kernel)
    except Exception as e:  # noqa: BLE001 - e.g. out of resources: today's path reports it as it does
        log.debug("kiln: binary index hit of %s could not be loaded: %s", req.label, e)
        return None
    return kernel


def count_jit() -> None:
    count(jit_compiles=1)


def _is_compile_error(e: Exception) -> bool:
    from triton.compiler.errors import CompilationError

    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # pragma: no cover - older layouts
        OutOfResources = ()
    return isinstance(e, (CompilationError, OutOfResources))


def _disable(e: Exception) -> None:
    _OWN["ok"] = False
    log.warning(
        "kiln: own GPU compile path disabled, launches use Triton's JIT (%s: %s)", type(e).__name__, e
    )
