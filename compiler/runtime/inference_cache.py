"""The inference front cache: a Dynamo graph whose compiled inference graph is in the graph cache is answered from
the cache before AOTAutograd runs, so that a warm process skips AOTAutograd's tracing (two traces of the graph
with decompositions, functionalization) for it.

Terms: the *front key* is a sha256 over the Dynamo FX graph (its code, every node's example metadata, nested
graphs and constants' values), the real example inputs' metadata (dtype, device, sizes, strides, offset,
requires_grad, which share a storage), the process state AOTAutograd's trace and kiln's passes read (grad mode,
autocast per device and its dtype, deterministic algorithms, default dtype, scaled-dot-product backend flags,
``torch._functorch.config``), kiln's settings and the toolchain (``graph_cache.toolchain``). The *front entry*
(``<key>.kfc`` beside the graph cache's entries, checked as they are) names the graph cache key of the ATen
inference graph AOTAutograd made for it and the facts of its calling convention.

What AOTAutograd's runtime wrapper does for an inference graph is rebuilt exactly only when it is trivial, so a
graph is refused (``skipped()`` says why; it then compiles through AOTAutograd as before) unless:
- it is an inference graph: grad mode off, or no input requires grad; autocast is off (AOTAutograd's wrapper
  would turn it off around the call, and the safety net's eager run would need it on); training graphs go to
  ``training_cache.py`` (same key and rules, its own entry kind and wrapper);
- every input is a plain tensor (no subclass, no symbolic size: static shapes only; AOTAutograd's trace could
  add shape guards to Dynamo's ShapeEnv that a hit would not add), no two inputs share a storage (AOTAutograd's
  de-duplication and synthetic bases), no complex dtype;
- the Dynamo graph holds no parameters or buffers of its own (AOTAutograd would lift them), calls no module and
  calls only torch's operators and functions, ``operator``/``math``/builtins (a user function allowed in the
  graph could change behind the same graph code);
- AOTAutograd's metadata of the cold compile (``fw_metadata``) shows no input mutation but data mutations kept in
  the graph (its trailing ``copy_``), every output a fresh tensor or a view of an intermediate (returned through
  ``aten._unsafe_view``, as AOTAutograd does; no alias of an input or of another output, no intermediate base),
  no effect tokens, no functionalized RNG, no subclass, and the ATen graph takes exactly the Dynamo graph's inputs;
- CUDA graphs and value tracing are off (they read the ATen graph, which a hit does not have).
The rebuilt wrapper then does what AOTAutograd's does for such a graph: grad mode off around the call, the
boxed call, the outputs as a list. A first launch that fails runs the Dynamo graph eagerly instead (the ATen graph is not at hand).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
import math
import operator
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .. import config
from . import aot_meta, cache, gpu_compile, graph_cache, training_cache

log = logging.getLogger("kiln")

FORMAT = 1
SUFFIX = ".kfc"

_skipped: list[str] = []


Refused = aot_meta.Refused
trivial_metadata = aot_meta.trivial_metadata
unsafe_views = aot_meta.unsafe_views


def skipped() -> list[str]:
    """Why recent graphs were not answered or stored by the front cache (this process, newest last)."""
    return list(_skipped)


def _refuse(reason: str) -> None:
    _skipped.append(reason)
    del _skipped[:-32]
    log.debug("kiln: inference front cache: %s", reason)


def enabled() -> bool:
    s = config.settings()
    return s.cache_mode() != "0" and s.inference_cache and not s.cudagraphs and not s.trace_values


# --------------------------------------------------------------------------------------------- eligibility
_MODULES = ("torch", "_operator", "operator", "math", "builtins")
#: higher-order ops whose every callable argument is a subgraph of the graph (hashed with it); others (user
#: Triton kernels held in a side table, effects) are refused
_HOPS = frozenset({"cond", "while_loop", "map_impl", "wrap", "tag_activation_checkpoint"})


def _target_ok(target: Any) -> bool:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return getattr(target, "namespace", None) in ("aten", "prims")
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name() in _HOPS
    if any(target is v for mod in (operator, math, builtins) for v in vars(mod).values()):
        return True
    module = getattr(target, "__module__", None) or ""
    if module.startswith(("torch._dynamo", "torch.testing")):  # wrappers around user code
        return False
    return module.split(".")[0] in _MODULES


def _symbolic(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, (list, tuple)):
        return any(_symbolic(a) for a in v)
    return False


def _no_callable(v: Any) -> Any:
    """An argument that is a function or other callable object (its body is not in the graph's code) refuses."""
    if callable(v) and not isinstance(
        v, (fx.Node, type, torch.dtype, torch.device, torch.memory_format, torch.layout)
    ):
        raise Refused(f"a callable argument {getattr(v, '__qualname__', type(v).__name__)!r}")
    return v


def is_training(example_inputs: list) -> bool:
    """AOTAutograd traces a joint forward-backward graph for these inputs: grad mode on and one requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs
    )


def _compiled_autograd() -> bool:
    try:
        return bool(torch._dynamo.config.compiled_autograd)
    except AttributeError:
        return False


def check_graph(gm: fx.GraphModule, example_inputs: list, depth: int = 0) -> None:
    """``Refused`` unless ``gm`` (a Dynamo graph) and its inputs can be answered by the front cache (module
    docstring, all but the facts only AOTAutograd's metadata gives)."""
    if depth == 0:
        training = is_training(example_inputs)
        if training and not config.settings().training_cache:
            raise Refused("a training graph (an input requires grad; the training_cache setting is off)")
        if not training and getattr(torch._C, "_is_any_autocast_enabled", lambda: True)():
            raise Refused(
                "autocast is on in an inference graph"
            )  # the safety net's eager run would need it on
        if training and _compiled_autograd():
            raise Refused("compiled autograd is on")
        storages = set()
        for a in example_inputs:
            if _symbolic(a):
                raise Refused("symbolic sizes (dynamic shapes)")
            if type(a) not in (torch.Tensor, torch.nn.Parameter):
                raise Refused(f"an input of type {type(a).__name__}")
            if a.is_complex() or a.is_sparse or a.is_quantized:
                raise Refused(f"an input of dtype {a.dtype} / layout {a.layout}")
            ref = (a.untyped_storage().data_ptr(), a.device)
            if ref in storages and a.untyped_storage().nbytes():
                raise Refused("two inputs share a storage")
            storages.add(ref)
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        raise Refused("the graph holds parameters or buffers")
    for n in gm.graph.nodes:
        if _symbolic(n.meta.get("example_value", n.meta.get("val"))):
            raise Refused("symbolic sizes (dynamic shapes)")
        if n.op == "call_module":
            raise Refused(f"a module call ({n.target})")
        if n.op == "call_function" and not _target_ok(n.target):
            raise Refused(f"a call of {getattr(n.target, '__qualname__', n.target)!r}")
        fx.node.map_aggregate((n.args, n.kwargs), _no_callable)
        if n.op == "get_attr":
            obj: Any = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, fx.GraphModule):
                check_graph(obj, [], depth + 1)


def global_state() -> str:
    """The process state that AOTAutograd's trace and kiln's passes read (see the module docstring)."""
    parts = [
        f"grad={torch.is_grad_enabled()}",
        graph_cache.global_state(),
        f"dtype={torch.get_default_dtype()}",
    ]
    for dev in ("cpu", "cuda"):
        try:
            parts.append(f"amp_{dev}={torch.is_autocast_enabled(dev)},{torch.get_autocast_dtype(dev)}")
        except (RuntimeError, TypeError, AttributeError):
            parts.append(f"amp_{dev}=?")
    cuda = torch.backends.cuda
    for flag in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"):
        fn = getattr(cuda, flag, None)
        parts.append(f"{flag}={fn() if fn is not None else '?'}")
    functorch = torch._functorch.config
    try:
        items = sorted(functorch.get_config_copy().items())
    except Exception:  # noqa: BLE001 - a torch without it: the version in the key covers its defaults
        items = []
    parts.append(repr([(k, v) for k, v in items if isinstance(v, (bool, int, float, str, type(None)))]))
    return ";".join(parts)


def front_key(gm: fx.GraphModule, example_inputs: list) -> str:
    """The front key of ``gm`` with these inputs under the active settings (``Refused``/``Unsupported`` when it
    has none)."""
    check_graph(gm, example_inputs)
    fp = graph_cache._Fingerprint()
    fp.meta_key = "example_value"
    s = config.settings()
    settings = {
        f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in graph_cache.NOT_IN_KEY
    }
    fp.add("front", FORMAT, json.dumps(settings, sort_keys=True), global_state())
    fp.graph(gm)
    fp.add("inputs", len(example_inputs), *(fp.value(a) for a in example_inputs))
    devices = [a.device for a in example_inputs]
    fp.add("toolchain", json.dumps(graph_cache.toolchain(devices), sort_keys=True))
    return fp.h.hexdigest()


# --------------------------------------------------------------------------------------------- entries
def _path(key: str) -> str:
    return os.path.join(graph_cache.folder(), key + SUFFIX)


def aot_facts(n_inputs: int, aten_gm: fx.GraphModule) -> dict:
    """The calling-convention facts of the inference graph AOTAutograd is compiling now (its ``fw_metadata``),
    ``Refused`` when its runtime wrapper is not trivial."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        raise Refused("no AOTAutograd metadata")
    trivial_metadata(meta)
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_inputs:
        raise Refused(f"the ATen graph takes {len(placeholders)} inputs, the Dynamo graph {n_inputs}")
    return {"outputs": len(meta.output_info), "unsafe_views": unsafe_views(meta)}


def store(key: str, graphs: dict[str, str], facts: dict) -> None:
    """Write the front entry of ``key``: ``graphs`` names the graph cache keys (``graph`` of an inference graph,
    ``fw``/``bw`` of a training graph), ``facts`` its calling convention."""
    if config.settings().cache_mode() != "1":
        return
    payload = json.dumps({"format": FORMAT, "key": key, **graphs, **facts}, sort_keys=True).encode()
    cache.write_entry(_path(key), payload)


def _sha(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _read(key: str) -> dict | None:
    """The checked front entry of ``key``, or None (none, damaged, of another format: a miss)."""
    data = cache.read_json_entry(_path(key), FORMAT, key)
    if data is None:
        return None
    try:
        if data.get("kind") == "training":  # graph keys are sha256 digests, never paths
            return training_cache.check_facts(data) if _sha(data.get("fw")) and _sha(data.get("bw")) else None
        views, n = data.get("unsafe_views", []), data.get("outputs")
        if not isinstance(views, list) or not all(
            type(i) is int and type(n) is int and 0 <= i < n for i in views
        ):
            return None
        return data if _sha(data.get("graph")) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class Front:
    """The front cache's view of one Dynamo graph being compiled: ``lookup()`` before AOTAutograd; from its
    compiles (cold) ``note()`` (an inference graph) or ``note_forward()`` then ``note_backward()`` (a training
    graph: the entry is written once both graphs are in the graph cache); ``key`` None when refused."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list) -> None:
        self.gm, self.n_inputs, self.key = gm, len(example_inputs), None
        self.training = is_training(list(example_inputs))
        self._pending: tuple[str, dict] | None = None  # a training forward's graph key and facts
        if not enabled():
            return
        try:
            with graph_cache._real_tensors():
                self.key = front_key(gm, list(example_inputs))
        except (Refused, graph_cache.fx_codec.Unsupported) as e:
            _refuse(f"refused: {e}")
        except Exception as e:  # noqa: BLE001 - a graph the key cannot read: AOTAutograd as before
            _refuse(f"no key ({type(e).__name__}: {e})")

    def lookup(self, name: str, finish: Callable[[Any, Callable], Callable]) -> Callable | None:
        """The compiled callable from the caches, with AOTAutograd's calling convention, or None.
        ``finish(cg, fallback)``: the boxed runner of a rebuilt ``CompiledGraph``."""
        if self.key is None:
            return None
        data = _read(self.key)
        if data is None or (data.get("kind") == "training") != self.training:
            return None
        graphs = [data["fw"], data["bw"]] if self.training else [data["graph"]]
        cgs = []
        for i, key in enumerate(graphs):
            hit = graph_cache.load(key, f"{name}_bw" if i else name, None)
            if hit is None:
                return None
            cg = hit[0]
            cg.cache, cg.cache_key = "hit", key
            cgs.append(cg)
        n_in = [len([n for n in cg.wrapper.graph.nodes if n.op == "placeholder"]) for cg in cgs]
        if n_in[0] != self.n_inputs or (self.training and n_in[1] != data["saved"] + len(data["tangents"])):
            return None
        gpu_compile.count(graph_hits=len(cgs), front_hits=1)
        cache.touch(_path(self.key))
        gm = self.gm
        if self.training:
            fw = finish(cgs[0], training_cache.fw_fallback)
            bw = finish(cgs[1], training_cache.bw_fallback)
            return training_cache.rebuild(data, fw, bw, gm, name, cgs[0].fallbacks)

        def fallback(*args: Any) -> Any:  # the Dynamo graph, eagerly
            return gm(*args)

        return wrap_inference(finish(cgs[0], fallback), data.get("unsafe_views", []))

    def note(self, cg: Any, aten_gm: fx.GraphModule) -> None:
        """From the inference compile of a miss: store the front entry when the graph cache holds ``cg``."""
        if self.key is None or cg.cache not in ("stored", "hit") or not cg.cache_key:
            return
        try:
            facts = aot_facts(self.n_inputs, aten_gm)
            store(self.key, {"graph": cg.cache_key}, facts)
        except (Refused, OSError) as e:
            _refuse(f"not stored: {e}")

    def note_forward(self, cg: Any, fw_gm: fx.GraphModule) -> None:
        """From the forward compile of a training miss: keep its graph key and facts for ``note_backward``."""
        if self.key is None or cg.cache not in ("stored", "hit") or not cg.cache_key:
            return
        try:
            self._pending = (cg.cache_key, training_cache.forward_facts(self.n_inputs, fw_gm))
        except (Refused, training_cache.Refused) as e:
            _refuse(f"not stored: {e}")

    def note_backward(self, cg: Any, bw_gm: fx.GraphModule, example_inputs: Any) -> None:
        """From the backward compile of a training miss: store the front entry when both graphs are cached."""
        pending, self._pending = self._pending, None
        if self.key is None or pending is None or cg.cache not in ("stored", "hit") or not cg.cache_key:
            return
        try:
            facts = training_cache.backward_facts(pending[1], bw_gm, list(example_inputs))
            store(self.key, {"fw": pending[0], "bw": cg.cache_key}, facts)
        except (training_cache.Refused, OSError) as e:
            _refuse(f"not stored: {e}")


def wrap_inference(run: Callable, views: list[int]) -> Callable:
    """What AOTAutograd's runtime wrapper does around a trivial inference graph compiled without autocast: grad
    mode off, the boxed call, ``views`` (outputs that are views of an intermediate) made fresh tensors; called
    with the graph's inputs unboxed, as Dynamo calls it."""
    unsafe_view = torch.ops.aten._unsafe_view

    def forward(*args: Any) -> list:
        grad = torch.is_grad_enabled()
        try:
            if grad:
                torch._C._set_grad_enabled(False)
            out = list(run(list(args)))
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        for i in views:
            out[i] = unsafe_view(out[i], out[i].shape)
        return out

    return forward


def clear() -> int:
    return cache.clear(graph_cache.folder(), SUFFIX)
