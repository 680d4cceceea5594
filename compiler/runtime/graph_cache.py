"""The graph cache: a compiled graph (wrapper, kernels, fallback records) stored on disk and rebuilt in a later
process without running kiln's passes.

*Key*: a sha256 over the ATen FX graph (its code; every node's FakeTensor metadata: dtype, device, symbolic
sizes, strides and offset, requires_grad, which outputs share a storage; the values of baked-in tensor
constants and the code of nested graphs), the example inputs' metadata (the same, plus the value ranges of
their size symbols), the graph's role and what the passes read from AOTAutograd (saved-activation slice),
every setting of ``config.Settings`` that can change what the passes make (``NOT_IN_KEY`` lists the others)
and the toolchain (``toolchain()``: torch, triton, Python, a hash of kiln's own source files, interpreter or
not, each input device's name and capability, the visible GPU count). *Entry*: ``<key>.kgc`` in
``graph_cache_dir``, a checked file (``cache.write_entry``: magic, checksum, atomic replace; a truncated or
corrupt one is a miss and is replaced), holding JSON (the wrapper as ``fx_codec`` data, kernel sources,
fallback reasons, the strides a training forward reports to AOTAutograd) and the constants' bytes; nothing in
it is unpickled or executed as Python (a kernel source is imported only after ``fx_codec.check_kernel_source``
found it to be Triton only).
The folder is kept under ``cache_max_mb`` (least recently used first; a hit renews an entry).

Not stored, with a reason (``skipped()``), and compiled as before: graphs whose passes added guards to the
ShapeEnv (a hit would not add them), graphs holding something ``fx_codec`` does not store, constants above
64 MiB. ``KILN_CACHE=0`` turns the cache off, ``KILN_CACHE=read`` only reads it.

AOTAutograd's own cache (``torch._functorch._aot_autograd.autograd_cache``, checked on torch 2.13) is not open
to kiln: ``aot_module_simplified`` consults it only when the forward compiler is a
``SerializableAOTDispatchCompiler`` returning an ``OutputCode`` (a class of ``torch._inductor.output_code``; the
bundled entries of recent torch accept any subclass, which is how the regional-Inductor backend plugs in), its
key is built on Inductor's ``FxGraphHashDetails``, its ``check_cacheable`` requires Inductor's FX graph cache
setting, and its entries are pickles (the extra-key hook of newer torch only adds data to that key). All of it
is private API, kiln does not import ``torch._inductor`` in ``compiler/`` and stores no pickles, so kiln caches
at its own compile of each forward, backward or inference graph: Dynamo and AOTAutograd still trace in a warm
process; kiln's passes and kernel renders do not run. Inference graphs of static shapes whose AOTAutograd
wrapper is trivial are also found by their Dynamo graph before AOTAutograd runs (``runtime/inference_cache.py``:
what it refuses and why); training graphs are not (their runtime wrapper is an ``autograd.Function`` built from
AOTAutograd's metadata and its lazy backward, private API that changes between releases). Size hints (example sizes) are not in the key: the passes
use them only to pick among choices that are valid at every size (an order of strides to try, an alias root),
each then checked symbolically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .. import config
from . import cache, fx_codec, gpu_compile

log = logging.getLogger("kiln")

#: the entry format and key recipe; a change makes every older entry a miss
FORMAT = 1
SUFFIX = ".kgc"

#: settings that cannot change what the passes make (runtime behaviour, logging, where caches live)
NOT_IN_KEY = frozenset(
    {
        "dump_dir",
        "compile_threads",
        "compile_workers",
        "log_fallbacks",
        "cudagraphs",
        "cache",
        "cache_dir",
        "graph_cache_dir",
        "cache_max_mb",
        "autotune",
        "autotune_dir",
        "inference_cache",
        "training_cache",
        "cache_auth",
        "cache_key",
        "cache_key_file",
    }
)

#: the last few reasons graphs were not stored, newest last: "graph_3: kiln's passes added 2 shape guards"
_skipped: list[str] = []


def enabled() -> bool:
    return config.settings().cache_mode() != "0"


def folder() -> str:
    return config.settings().resolved_graph_cache_dir()


def skipped() -> list[str]:
    """Why recent graphs were not stored (this process, newest last)."""
    return list(_skipped)


def _skip(name: str, reason: str, cg: Any = None) -> None:
    if cg is not None:
        cg.cache = f"not stored: {reason}"
    _skipped.append(f"{name}: {reason}")
    del _skipped[:-32]
    gpu_compile.count(graph_skips=1)
    log.info("kiln: graph cache: %s not stored: %s", name, reason)


# --------------------------------------------------------------------------------------------- the key
_source_hash: list[str] = []


def kiln_source_hash() -> str:
    """sha256 of every ``.py`` file of the ``compiler`` package (paths and contents), once per process."""
    if not _source_hash:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(filenames):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, root).encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read() + b"\0")
        _source_hash.append(h.hexdigest())
    return _source_hash[0]


#: (interpreting, device names) -> ``toolchain()``'s answer, once per process
_toolchains: dict[tuple, dict[str, Any]] = {}


def toolchain(devices: list[torch.device]) -> dict[str, Any]:
    """Versions and devices the artifact depends on (computed once per process and device set)."""
    names = tuple(sorted({str(d) for d in devices}))
    current = torch.cuda.current_device() if "cuda" in names and not config.interpreting() else None
    memo = (config.interpreting(), names, current)  # "cuda" without an index: the current device's name
    if memo not in _toolchains:
        _toolchains[memo] = _toolchain(names)
    return {**_toolchains[memo], "kiln": kiln_source_hash()}


def _toolchain(names: tuple[str, ...]) -> dict[str, Any]:
    import triton

    out: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "interpreting": config.interpreting(),
    }
    for d in names:
        dev = torch.device(d)
        if dev.type == "cuda" and not config.interpreting():
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            out[d] = [
                torch.cuda.get_device_name(idx),
                list(torch.cuda.get_device_capability(idx)),
                torch.cuda.device_count(),
            ]
    return out


def _sym(v: Any) -> str:
    node = getattr(v, "node", None)
    return str(node.expr) if node is not None else repr(v)


class _Fingerprint:
    """Collects what identifies a graph: metadata strings and the symbols they mention."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.storages: dict[Any, int] = {}
        self.symbols: set = set()
        self.constant_bytes = 0
        self.meta_key = (
            "val"  # where nodes keep their FakeTensor: "val" (ATen graphs), "example_value" (Dynamo's)
        )

    def add(self, *parts: Any) -> None:
        for p in parts:
            self.h.update(str(p).encode() + b"\x1f")

    def value(self, v: Any) -> str:
        """Metadata of one FakeTensor/SymInt/structure, as text (storage sharing as the index of the first
        tensor seen on that storage)."""
        if isinstance(v, torch.Tensor):
            from torch.multiprocessing.reductions import StorageWeakRef

            try:
                ref: Any = StorageWeakRef(v.untyped_storage())
            except Exception:  # noqa: BLE001 - tensors without storage (sparse...): no sharing to record
                ref = None
            share = self.storages.setdefault(ref, len(self.storages)) if ref is not None else -1
            sizes = [_sym(s) for s in v.shape] + [_sym(s) for s in v.stride()] + [_sym(v.storage_offset())]
            for s in list(v.shape) + list(v.stride()) + [v.storage_offset()]:
                node = getattr(s, "node", None)
                if node is not None:
                    self.symbols |= node.expr.free_symbols
            return (
                f"T({type(v).__name__},{v.dtype},{v.layout},{v.device},{v.requires_grad},{','.join(sizes)},"
                f"s{share})"
            )
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            self.symbols |= v.node.expr.free_symbols
            return f"S({_sym(v)})"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(self.value(a) for a in v) + "]"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{self.value(a)}" for k, a in v.items()) + "}"
        if v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.device)):
            return repr(v)
        return type(v).__name__

    def graph(self, gm: fx.GraphModule, depth: int = 0) -> None:
        if depth > 8:
            raise fx_codec.Unsupported("graphs nested more than 8 deep")
        self.add("graph", gm.code)
        for n in gm.graph.nodes:
            self.add(n.name, self.value(n.meta.get(self.meta_key)))
            if n.op == "get_attr":
                self.attribute(gm, n.target, depth)

    def attribute(self, gm: fx.GraphModule, target: str, depth: int) -> None:
        obj: Any = gm
        for part in target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, fx.GraphModule):
            self.graph(obj, depth + 1)
        elif isinstance(obj, torch.Tensor):
            if type(obj) not in (torch.Tensor, torch.nn.Parameter):
                raise fx_codec.Unsupported(f"constant {target} of type {type(obj).__name__}")
            storage = obj.untyped_storage()
            self.constant_bytes += storage.nbytes()
            if (
                self.constant_bytes > fx_codec.MAX_CONSTANT_BYTES
            ):  # weights held as constants: not hashed each time
                raise fx_codec.Unsupported(f"constants above {fx_codec.MAX_CONSTANT_BYTES >> 20} MiB")
            raw = torch.empty(0, dtype=torch.uint8).set_(
                storage.cpu() if storage.device.type != "cpu" else storage
            )
            self.add(target, self.value(obj), hashlib.sha256(raw.numpy().tobytes()).hexdigest())
        else:
            raise fx_codec.Unsupported(f"attribute {target} of type {type(obj).__name__}")


def graph_key(gm: fx.GraphModule, example_inputs: Any, role: str, extra: Any = None) -> str:
    """The cache key of compiling ``gm`` in ``role`` with these example inputs under the active settings
    (``extra``: anything else the passes read, such as the saved-activation slice). ``Unsupported`` when the
    graph cannot be keyed (then it is not cached)."""
    with _real_tensors():  # the compiler runs under AOTAutograd's FakeTensorMode; constants are read for real
        return _graph_key(gm, example_inputs, role, extra)


def _real_tensors() -> Any:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _graph_key(gm: fx.GraphModule, example_inputs: Any, role: str, extra: Any) -> str:
    fp = _Fingerprint()
    s = config.settings()
    settings = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in NOT_IN_KEY}
    fp.add("format", FORMAT, "role", role, "extra", repr(extra), json.dumps(settings, sort_keys=True))
    fp.graph(gm)
    inputs = list(example_inputs) if example_inputs is not None else []
    fp.add("inputs", len(inputs), *(fp.value(a) for a in inputs))
    devices = [a.device for a in inputs if isinstance(a, torch.Tensor)]
    fp.add("toolchain", json.dumps(toolchain(devices), sort_keys=True), "global", global_state())
    env = _shape_env()
    if env is not None:  # the symbols' value ranges (a graph specialized for s0 >= 2 is not one for s0 >= 0)
        ranges = getattr(env, "var_to_range", {})
        fp.add("ranges", *sorted(f"{s}:{ranges.get(s)}" for s in fp.symbols))
    return fp.h.hexdigest()


def global_state() -> str:
    """Process-wide torch state that the passes read (deterministic algorithms: float sums stay ATen)."""
    return f"det={torch.are_deterministic_algorithms_enabled()},{torch.is_deterministic_algorithms_warn_only_enabled()}"


def _shape_env() -> Any:
    ctx = torch._guards.TracingContext.try_get()
    return getattr(getattr(ctx, "fake_mode", None), "shape_env", None)


def _guard_state() -> tuple[int, int]:
    """(guards, deferred runtime asserts) of the ShapeEnv being compiled: a miss compares them before and after
    the passes; a graph whose passes added any is not stored (a hit would not add them)."""
    env = _shape_env()
    if env is None:
        return (0, 0)
    asserts = getattr(env, "deferred_runtime_asserts", {}) or {}
    return (len(getattr(env, "guards", ()) or ()), sum(len(v) for v in asserts.values()))


# --------------------------------------------------------------------------------------------- entries
def _path(key: str) -> str:
    return os.path.join(folder(), key + SUFFIX)


def _record(cg: Any, parent: str = "") -> dict:
    """A ``CompiledGraph``'s fields other than its wrapper (subgraphs: by their attribute in the parent)."""
    return {
        "attr": cg.name[len(parent) + 1 :] if parent else "",
        "kernel_sources": dict(cg.kernel_sources),
        "kernel_launches": int(cg.kernel_launches),
        "extern_count": int(cg.extern_count),
        "fallbacks": [[f.kind, f.op, f.detail] for f in cg.fallbacks],
        "nondeterministic": [[f.kind, f.op, f.detail] for f in cg.nondeterministic],
        "subgraphs": [_record(sub, cg.name) for sub in cg.subgraphs],
    }


def encode_entry(key: str, cg: Any, moved_strides: list | None) -> bytes:
    """The payload of an entry: 8-byte header length, the JSON header, the constants' bytes."""
    blobs: list[bytes] = []
    wrapper = fx_codec.encode_module(cg.wrapper, blobs)
    header = {
        "format": FORMAT,
        "key": key,
        "record": _record(cg),
        "wrapper": wrapper,
        "moved_strides": moved_strides,
        "blobs": [len(b) for b in blobs],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def decode_entry(payload: bytes, key: str, name: str, gm: fx.GraphModule | None) -> tuple[Any, list | None]:
    """(CompiledGraph named ``name``, moved strides) from a payload (``Unsupported``/``ValueError`` when it is
    not an entry of this key and format); ``gm``: the ATen graph (None: not at hand, ``aten_graph`` stays None)."""
    from ..capture import CompiledGraph
    from ..graph import FallbackReason

    (n,) = struct.unpack_from("<Q", payload)
    header = json.loads(payload[8 : 8 + n])
    if header.get("format") != FORMAT or header.get("key") != key:
        raise ValueError("entry of another format or key")
    blobs, pos = [], 8 + n
    for size in header["blobs"]:
        blobs.append(payload[pos : pos + size])
        pos += size
    if pos != len(payload):
        raise ValueError("entry length does not match its header")
    wrapper = fx_codec.decode_module(header["wrapper"], blobs)
    placeholders = [p for p in wrapper.graph.nodes if p.op == "placeholder"]
    originals = [p for p in gm.graph.nodes if p.op == "placeholder"] if gm is not None else []
    if len(placeholders) == len(originals):  # as the wrap pass leaves them: each with its input's FakeTensor
        for p, o in zip(placeholders, originals):
            p.meta["val"] = o.meta.get("val")

    def build(rec: dict, module: Any, graph_name: str, aten: Any) -> Any:
        subs = []
        for sub in rec["subgraphs"]:
            inner = getattr(module, sub["attr"], None)
            inner = getattr(inner, "wrapper", inner)  # a ``SingleOutput`` holds the compiled subgraph
            if not isinstance(inner, fx.GraphModule):
                raise fx_codec.Unsupported(f"subgraph {sub['attr']} not in the stored wrapper")
            subs.append(build(sub, inner, f"{graph_name}.{sub['attr']}", None))
        return CompiledGraph(
            graph_name,
            module,
            dict(rec["kernel_sources"]),
            rec["kernel_launches"],
            rec["extern_count"],
            [FallbackReason(*f) for f in rec["fallbacks"]],
            subs,
            aten_graph=aten,
            nondeterministic=[FallbackReason(*f) for f in rec.get("nondeterministic", [])],
        )

    strides = header["moved_strides"]
    moved = [tuple(s) if s is not None else None for s in strides] if strides is not None else None
    return build(header["record"], wrapper, name, gm), moved


def load(key: str, name: str, gm: fx.GraphModule | None) -> tuple[Any, list | None] | None:
    """The cached (CompiledGraph, moved strides) of ``key``, or None (no entry, or one that is damaged, of
    another format or not rebuildable here: a miss, never an error)."""
    path = _path(key)
    payload = cache.read_entry(path)
    if payload is None:
        return None
    try:
        with _real_tensors():
            out = decode_entry(payload, key, name, gm)
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry is a miss; the compile replaces it
        log.info("kiln: graph cache: entry %s ignored (%s: %s)", os.path.basename(path), type(e).__name__, e)
        return None
    cache.touch(path)
    return out


def store(key: str, cg: Any, moved_strides: list | None) -> None:
    """Write the entry of ``key`` and keep the folder under its size bound (``Unsupported``: not storable)."""
    with _real_tensors():
        payload = encode_entry(key, cg, moved_strides)
    cache.write_entry(_path(key), payload)
    cache.evict(folder(), SUFFIX, config.settings().cache_max_mb << 20)


def compile_cached(
    gm: fx.GraphModule,
    example_inputs: Any,
    role: str,
    name: str,
    extra: Any,
    compile_fn: Callable[[], tuple[Any, list | None]],
) -> tuple[Any, list | None]:
    """``compile_fn()`` (kiln's passes: a ``CompiledGraph`` and the forward's moved output strides) through the
    cache: a hit returns the stored graph rebuilt under ``name``; a miss compiles and stores. Cache trouble
    (unkeyable graph, damaged entry, full disk) costs a compile, never an error; errors of ``compile_fn``
    propagate unchanged."""
    if not enabled():
        return compile_fn()
    try:
        key = graph_key(gm, example_inputs, role, extra)
    except Exception as e:  # noqa: BLE001 - an unkeyable graph is compiled as before
        gpu_compile.count(graph_misses=1)
        cg, moved = compile_fn()
        _skip(name, f"no key ({type(e).__name__}: {e})", cg)
        return cg, moved
    hit = load(key, name, gm)
    if hit is not None:
        hit[0].cache, hit[0].cache_key = "hit", key
        gpu_compile.count(graph_hits=1)
        log.debug("kiln: graph cache hit for %s (%s)", name, key[:16])
        return hit
    gpu_compile.count(graph_misses=1)
    before = _guard_state()
    cg, moved = compile_fn()
    if config.settings().cache_mode() != "1":
        return cg, moved
    after = _guard_state()
    if after != before:
        _skip(
            name,
            f"kiln's passes added {after[0] - before[0]} shape guards and "
            f"{after[1] - before[1]} runtime asserts",
            cg,
        )
        return cg, moved
    try:
        store(key, cg, moved)
        cg.cache, cg.cache_key = "stored", key
    except Exception as e:  # noqa: BLE001 - a graph the codec cannot store, or a full disk: compiled, not stored
        _skip(name, f"{type(e).__name__}: {e}", cg)
    return cg, moved


def info() -> dict[str, Any]:
    """Entries and bytes of the graph cache folder, with its bound and state."""
    listed = cache.entries(folder(), SUFFIX)
    return {
        "folder": folder(),
        "entries": len(listed),
        "bytes": sum(size for _, size, _ in listed),
        "max_bytes": config.settings().cache_max_mb << 20,
        "state": config.settings().cache_mode(),
    }


def clear() -> int:
    """Remove every graph cache entry; returns how many."""
    return cache.clear(folder(), SUFFIX)
