"""What AOTAutograd's metadata of a graph (``ViewAndMutationMeta``, ``TracingContext.fw_metadata``) says about
its runtime wrapper, for the front caches (``inference_cache.py``, ``training_cache.py``): a graph whose wrapper is
*trivial* can be answered without AOTAutograd, by a wrapper kiln rebuilds."""

from __future__ import annotations

from typing import Any

import torch


class Refused(Exception):
    """The graph is not for the front cache (the message says why)."""


def unsafe_views(meta: Any) -> list[int]:
    """The outputs AOTAutograd returns through ``aten._unsafe_view`` (views of an intermediate)."""
    return [
        i
        for i, o in enumerate(meta.output_info)
        if getattr(o.output_type, "name", str(o.output_type)) == "unsafe_view_alias"
    ]


def trivial_metadata(meta: Any) -> None:
    """``Refused`` unless AOTAutograd's metadata (``ViewAndMutationMeta``) shows a trivial runtime wrapper: no
    input mutation the wrapper applies (a data mutation kept in the graph, ``MUTATED_IN_GRAPH``, is the graph's
    own trailing ``copy_``: a BatchNorm's running statistics), every output a fresh tensor, no intermediate
    bases, effect tokens, functionalized RNG, grad-mode change or tensor subclass. (An *unsafe view* output, a
    view of an intermediate, is returned as a fresh tensor by ``aten._unsafe_view``, as AOTAutograd does:
    ``unsafe_views``.)"""
    for i in meta.input_info:
        if i.mutates_metadata or i.mutates_storage_metadata or i.mutation_inductor_storage_resize:
            raise Refused("an input mutation of its metadata or storage")
        if i.mutates_data and getattr(getattr(i, "mutation_type", None), "name", "") != "MUTATED_IN_GRAPH":
            raise Refused("an input mutation applied outside the graph")
    for o in meta.output_info:
        if getattr(o.output_type, "name", str(o.output_type)) not in ("non_alias", "unsafe_view_alias"):
            raise Refused(f"an output of kind {getattr(o.output_type, 'name', o.output_type)}")
    if getattr(meta, "num_intermediate_bases", 0) or getattr(meta, "tokens", None):
        raise Refused("intermediate bases or effect tokens")
    if (
        getattr(meta, "is_rng_op_functionalized", False)
        or getattr(meta, "grad_enabled_mutation", None) is not None
    ):
        raise Refused("functionalized RNG or a grad-mode change")
    for m in [
        *(getattr(meta, "subclass_inp_meta", None) or []),
        *(getattr(meta, "subclass_fw_graph_out_meta", None) or []),
    ]:
        if not isinstance(m, int) and type(m).__name__ != "PlainTensorMeta":
            raise Refused("tensor subclasses")
    for o in meta.output_info:
        if not issubclass(getattr(o, "raw_type", torch.Tensor), torch.Tensor):
            raise Refused(f"an output of type {o.raw_type.__name__}")
