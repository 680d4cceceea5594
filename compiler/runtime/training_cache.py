"""The training front cache: a Dynamo graph that needs autograd, whose compiled forward and backward are both in
the graph cache, is answered before AOTAutograd runs (a warm process skips AOTAutograd's joint trace,
functionalization and min-cut partition, seconds for a model's training step).

Terms: the *front key* and the eligibility of the Dynamo graph are the inference front cache's
(``inference_cache.front_key``/``check_graph``); grad mode, each input's ``requires_grad`` and autocast are in the
key. The *training entry* (``<key>.kfc``, ``"kind": "training"``) names the graph cache keys of the forward and
backward graphs AOTAutograd made and the *facts* of their calling convention, read at the cold compile from
AOTAutograd's metadata (``fw_metadata``) and the two graphs:
- ``returns``: the forward's user outputs (the first outputs of the forward graph); the rest are *saved*
  tensors for the backward (``vc`` of them version-checked through ``ctx.save_for_backward``, the others kept
  on ``ctx``, as AOTAutograd splits them);
- ``nondiff``: outputs that do not require grad (marked non-differentiable); ``tangents``: the outputs whose
  gradients the backward graph takes, with the shape, stride and dtype it was compiled for (a gradient of
  other strides is copied to them, as AOTAutograd coerces a tangent's memory format);
- ``detach``: non-leaf inputs that require grad but get no gradient (detached before the call, as AOTAutograd
  does); ``amp``: autocast was on at the compile (both graphs then run with it off, as AOTAutograd runs them).

Refused (the graph compiles through AOTAutograd as before, ``inference_cache.skipped()`` says why), besides the
inference front cache's rules: saved symbolic ints or opaque objects, a backward graph whose inputs are not the
saved tensors followed by the tangents, a backward that does not return one gradient slot per input, CUDA
graphs or value tracing on, compiled autograd on.

The rebuilt callable does what AOTAutograd's runtime wrapper and its ``CompiledFunction`` do for such a graph:
grad mode on, view replay on, an ``autograd.Function`` whose forward runs the compiled forward and saves the
tensors, whose backward runs the compiled backward (double backward raises, as with AOTAutograd). A forward that
fails at its first launch switches the graph to the Dynamo graph run eagerly, for good (recorded as a fallback).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..graph import FallbackReason
from . import aot_meta

log = logging.getLogger("kiln")


Refused = aot_meta.Refused


def _outputs(gm: fx.GraphModule) -> list:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    args = out.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def _val(v: Any) -> Any:
    return v.meta.get("val") if isinstance(v, fx.Node) else v


def forward_facts(n_inputs: int, fw_gm: fx.GraphModule) -> dict:
    """The facts AOTAutograd's metadata and the forward graph give (``Refused`` when its wrapper is not
    trivial); called while AOTAutograd compiles the forward."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        raise Refused("no AOTAutograd metadata")
    aot_meta.trivial_metadata(meta)
    if len(meta.input_info) != n_inputs:
        raise Refused(f"AOTAutograd saw {len(meta.input_info)} inputs, the Dynamo graph {n_inputs}")
    if getattr(meta, "num_symints_saved_for_bw", 0) or getattr(meta, "num_opaque_objects_saved_for_bw", 0):
        raise Refused("symbolic ints or opaque objects saved for backward")
    returns = getattr(meta, "num_forward_returns", None)
    if returns != len(meta.output_info):
        raise Refused("forward returns other than the user outputs")
    outs = _outputs(fw_gm)
    saved = outs[returns:]
    if not all(isinstance(_val(o), torch.Tensor) for o in saved):
        raise Refused("a saved value that is not a tensor")
    no_vc = getattr(meta, "num_tensors_saved_with_no_vc_check", 0) or 0
    placeholders = [n for n in fw_gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_inputs:
        raise Refused(f"the forward graph takes {len(placeholders)} inputs, the Dynamo graph {n_inputs}")
    grads = [bool(getattr(o, "requires_grad_for_backward", o.requires_grad)) for o in meta.output_info]
    return {
        "kind": "training",
        "returns": returns,
        "unsafe_views": aot_meta.unsafe_views(meta),
        "saved": len(saved),
        "vc": len(saved) - no_vc,
        "nondiff": [i for i, o in enumerate(meta.output_info) if not o.requires_grad],
        "tangent_of": [i for i, g in enumerate(grads) if g],
        "inputs": [[bool(i.requires_grad), bool(getattr(i, "is_leaf", True))] for i in meta.input_info],
        "amp": bool(torch._C._is_any_autocast_enabled()),
    }


def backward_facts(facts: dict, bw_gm: fx.GraphModule, example_inputs: list) -> dict:
    """``facts`` completed from the backward graph AOTAutograd compiles now (``Refused`` when it does not take
    the saved tensors then the tangents, or does not return one slot per input)."""
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    n_tangents = len(placeholders) - facts["saved"]
    if n_tangents != len(facts["tangent_of"]) or len(example_inputs) != len(placeholders):
        raise Refused(
            f"the backward takes {len(placeholders)} inputs, not {facts['saved']} saved tensors and "
            f"{len(facts['tangent_of'])} tangents"
        )
    tangents = []
    for t in list(example_inputs)[facts["saved"] :]:
        if not isinstance(t, torch.Tensor) or any(
            isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride())
        ):
            raise Refused("a tangent that is not a tensor of static shape")
        tangents.append(
            {
                "shape": list(t.shape),
                "stride": list(t.stride()),
                "dtype": str(t.dtype).split(".")[-1],
                "device": str(t.device),
            }
        )
    outs = _outputs(bw_gm)
    if len(outs) != len(facts["inputs"]):
        raise Refused(f"the backward returns {len(outs)} values for {len(facts['inputs'])} inputs")
    detach = [
        i for i, ((grad, leaf), o) in enumerate(zip(facts["inputs"], outs)) if o is None and grad and not leaf
    ]
    return {**facts, "tangents": tangents, "detach": detach}


def check_facts(data: dict) -> dict:
    """The facts of a training entry read from disk, checked for type and range (``ValueError`` otherwise)."""

    def ints(v: Any, hi: int) -> list[int]:
        if not isinstance(v, list) or not all(type(i) is int and 0 <= i < hi for i in v):
            raise ValueError("bad index list")
        return v

    returns, saved, vc = data["returns"], data["saved"], data["vc"]
    if not all(type(v) is int and v >= 0 for v in (returns, saved, vc)) or vc > saved:
        raise ValueError("bad counts")
    inputs = data["inputs"]
    if not isinstance(inputs, list) or not all(isinstance(p, list) and len(p) == 2 for p in inputs):
        raise ValueError("bad inputs")
    ints(data["nondiff"], returns)
    ints(data["tangent_of"], returns)
    ints(data["detach"], len(inputs))
    ints(data["unsafe_views"], returns)
    tangents = data["tangents"]
    if not isinstance(tangents, list) or len(tangents) != len(data["tangent_of"]):
        raise ValueError("bad tangents")
    for t in tangents:
        if not isinstance(getattr(torch, str(t["dtype"]), None), torch.dtype):
            raise ValueError("bad tangent dtype")
        torch.device(t["device"])
        if len(t["shape"]) != len(t["stride"]) or not all(
            type(v) is int for v in (*t["shape"], *t["stride"])
        ):
            raise ValueError("bad tangent layout")
    if not isinstance(data["amp"], bool):
        raise ValueError("bad amp")
    return data


# --------------------------------------------------------------------------------------------- the runtime
class _FirstLaunchFailed(Exception):
    """A rebuilt forward failed at its first launch: the caller switches to the Dynamo graph."""


def _coerce(grad: torch.Tensor | None, t: dict) -> torch.Tensor:
    """A gradient in the layout the backward graph was compiled for."""
    shape, stride, dtype = tuple(t["shape"]), tuple(t["stride"]), getattr(torch, t["dtype"])
    if grad is None:  # an output the loss did not use, its gradient not materialized
        return torch.empty_strided(shape, stride, dtype=dtype, device=t["device"]).zero_()
    if tuple(grad.shape) != shape or grad.dtype != dtype:
        raise RuntimeError(
            f"kiln: a gradient of shape {tuple(grad.shape)} and dtype {grad.dtype} reached a compiled "
            f"backward built for shape {shape} and dtype {dtype}"
        )
    if grad.stride() == stride or grad.numel() <= 1:
        return grad
    return torch.empty_strided(shape, stride, dtype=dtype, device=grad.device).copy_(grad)


class _NoDoubleBackward(torch.autograd.Function):
    """Under ``create_graph=True``: the gradients as outputs of a node over the backward's inputs (so that they
    require grad where those do, as AOTAutograd's ``CompiledFunctionBackward``), whose own backward raises."""

    @staticmethod
    def forward(ctx: Any, grads: tuple, *inputs: Any) -> Any:
        return tuple(g.clone() for g in grads)  # fresh outputs, not the inputs' aliases

    @staticmethod
    def backward(ctx: Any, *args: Any) -> Any:
        raise RuntimeError("torch.compile with aot_autograd does not currently support double backward")


def rebuild(
    facts: dict, fw_run: Callable, bw_run: Callable, gm: fx.GraphModule, name: str, fallbacks: list
) -> Callable:
    """The training callable of a front hit: ``fw_run``/``bw_run`` are the boxed runners of the cached forward
    and backward (their safety nets raise), ``gm`` the Dynamo graph (the fallback of a failed first forward)."""
    returns, saved, vc = facts["returns"], facts["saved"], facts["vc"]
    nondiff, tangent_of, tangents = facts["nondiff"], facts["tangent_of"], facts["tangents"]
    detach, amp, views = facts["detach"], facts["amp"], facts["unsafe_views"]
    unsafe_view = torch.ops.aten._unsafe_view
    # a backward runs wherever loss.backward() is called, maybe inside another compiled frame: never traced
    bw_run = torch._dynamo.disable(bw_run, reason="kiln: do not trace a compiled graph")

    def quiet_amp() -> Any:
        return torch._C._DisableAutocast() if amp else _Null()

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            outs = fw_run(list(args))
            kept = outs[returns : returns + saved]
            kept = [x.detach() if x._is_view() else x for x in kept]
            ctx.save_for_backward(*kept[:vc])
            ctx.kiln_no_vc = kept[vc:]
            fresh = list(outs[:returns])
            for i in views:  # views of an intermediate leave as fresh tensors (autograd's view checks)
                fresh[i] = unsafe_view(fresh[i], fresh[i].shape)
            ret = tuple(fresh)
            ctx.mark_non_differentiable(*[ret[i] for i in nondiff if isinstance(ret[i], torch.Tensor)])
            ctx._materialize_non_diff_grads = False
            return ret

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            args = [*ctx.saved_tensors, *ctx.kiln_no_vc]
            keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)()
            if not keep:  # freed as save_for_backward's tensors are: not held until the graph is dropped
                ctx.kiln_no_vc = []
            args += [_coerce(grads[i], t) for i, t in zip(tangent_of, tangents)]
            double = torch.is_grad_enabled()
            with torch.no_grad(), quiet_amp():
                out = bw_run(args)
            out = tuple(out)
            if double:
                idx = [i for i, g in enumerate(out) if isinstance(g, torch.Tensor)]
                if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                    args.insert(0, torch.empty(0, requires_grad=True))  # so that the node is recorded
                wrapped = _NoDoubleBackward.apply(tuple(out[i] for i in idx), *args)
                out = list(out)
                for i, g in zip(idx, wrapped):
                    out[i] = g
                out = tuple(out)
            return out

    CompiledFunction.__name__ = CompiledFunction.__qualname__ = f"CompiledFunction_{name}"
    state = {"eager": False}
    view_replay = getattr(torch._C, "_is_view_replay_enabled", None)

    def forward(*args: Any) -> list:
        if state["eager"]:
            return list(_as_tuple(gm(*args)))
        args_ = list(args)
        for i in detach:
            args_[i] = args_[i].detach()
        prev = view_replay() if view_replay is not None else True
        try:
            if not prev:
                torch._C._set_view_replay_enabled(True)
            with torch.enable_grad(), quiet_amp():
                outs = CompiledFunction.apply(*args_)
        except _FirstLaunchFailed:
            state["eager"] = True
            fallbacks.append(
                FallbackReason(
                    "graph_launch_error",
                    name,
                    "the cached training forward failed at its first launch: its Dynamo graph runs eagerly",
                )
            )
            return list(_as_tuple(gm(*args)))
        finally:
            if not prev:
                torch._C._set_view_replay_enabled(False)
        return list(outs)

    return forward


def fw_fallback(*args: Any) -> Any:
    """The safety net of a rebuilt forward: tell ``rebuild``'s wrapper to run the Dynamo graph."""
    raise _FirstLaunchFailed()


def bw_fallback(*args: Any) -> Any:
    """The safety net of a rebuilt backward: none (the ATen graph is not at hand, the forward already ran)."""
    raise RuntimeError(
        "kiln: a compiled backward rebuilt from the graph cache failed at its first launch; "
        "run with KILN_CACHE=0 (or clear it: python -m compiler cache clear)"
    )


def _as_tuple(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
