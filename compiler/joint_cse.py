"""Common-subexpression elimination of AOTAutograd's joint graph, and kiln's partition function around it.

AOTAutograd's min-cut partitioner first merges repeated computations of the joint (forward + backward) graph
(functorch's ``fx_graph_cse``, under ``torch._functorch.config.cse``). That helper imports Inductor's pattern
matcher for two small functions, and the import loads Inductor's lowerings and kernel templates: 0.6-0.8 s of
a cold training compile on a CPU box, in a process that never runs Inductor. ``partition`` runs the same merge
(``eliminate_common_subexpressions``) and then the min-cut partitioner with its own pass off.

Terms:
- *key* of a node: its target and its arguments with nodes standing for their values (a size ``SymInt`` by its
  symbolic node), each flattened argument paired with its type (``1`` and ``1.0`` differ), plus the argument
  structure. Two nodes with equal keys compute the same value unless something between them wrote memory.
- *mutation region*: the stretch of the graph between two mutating nodes (an ATen overload whose schema
  mutates, a function or method named as an in-place op, or a call with an ``out=`` argument); nodes merge only
  within one region. A later duplicate in another region becomes the survivor for the rest of the graph.
- Never merged: placeholders, outputs and attributes, random ops (functorch's ``rand_ops``: every draw is its
  own), ``aten.empty`` (its contents are unspecified), nodes whose value shares storage with a graph output
  (eager returns distinct tensors there), and nodes defining an unbacked symbol.

The survivors keep their names and metadata and the graph is edited in place, so the partitioner sees the
graph functorch's pass would give it (checked against ``fx_graph_cse`` in the tests).
"""

from __future__ import annotations

import logging
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch.compile_utils import get_aten_target, rand_ops
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten
log = logging.getLogger("kiln")

#: words of a function or method name that mark a change of state (``_set_grad_enabled``, ``manual_seed``)
_STATE_WORDS = frozenset({"set", "seed", "enter", "exit"})


def _mutating_name(name: str) -> bool:
    """An in-place op's name (``add_``, ``copy_``; not a dunder) or one with a state word between underscores."""
    name = name.split(".")[0]  # "add_.Tensor" names the op "add_"
    if name.endswith("_") and not name.endswith("__"):
        return True
    return any(word in _STATE_WORDS for word in name.split("_"))


def mutates(node: fx.Node) -> bool:
    """Whether ``node`` may write memory another node reads (the start of a new mutation region)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.is_mutable)
    if node.op == "call_function" and _mutating_name(getattr(target, "__name__", "")):
        return True
    if node.op == "call_method" and isinstance(target, str) and _mutating_name(target):
        return True
    return node.kwargs.get("out") is not None


def _storage(node: fx.Node) -> StorageWeakRef | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except NotImplementedError:  # a tensor without storage (a sparse or nested one)
        return None


def _flat(value: Any) -> tuple[tuple, Any]:
    leaves, spec = pytree.tree_flatten(value)
    out = []
    for leaf in leaves:
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            leaf = leaf.node
        out.append((leaf, type(leaf)))
    return tuple(out), spec


def _mergeable(node: fx.Node, aliases_output: set[fx.Node]) -> bool:
    if node.op in ("placeholder", "output", "get_attr") or node in aliases_output:
        return False
    target = get_aten_target(node)
    if target in rand_ops or target is aten.empty:
        return False
    val = node.meta.get("val")
    return not (isinstance(val, sympy.Symbol) and free_unbacked_symbols(val))


def eliminate_common_subexpressions(graph: fx.Graph) -> int:
    """Merge the repeated nodes of ``graph`` in place (module docstring); returns how many were removed."""
    nodes = list(graph.nodes)
    output = nodes[-1]
    if output.op != "output":
        raise ValueError(f"the graph's last node is {output.op!r}, not its output")
    returned = {s for n in output.all_input_nodes if (s := _storage(n)) is not None}
    aliases_output = {n for n in nodes if (s := _storage(n)) is not None and s in returned}
    region = 0
    seen: dict[tuple, list[tuple[Any, fx.Node, int]]] = {}  # key without specs -> (specs, survivor, region)
    removed = 0
    for node in nodes:
        if mutates(node):
            region += 1
        if not _mergeable(node, aliases_output):
            continue
        args, args_spec = _flat(node.args)
        kwargs, kwargs_spec = _flat(node.kwargs)
        key = (node.target, args, kwargs)
        entries = seen.setdefault(key, [])
        match = next((e for e in entries if e[0] == (args_spec, kwargs_spec)), None)
        if match is not None and match[2] == region:
            node.replace_all_uses_with(match[1])
            graph.erase_node(node)
            removed += 1
            continue
        if match is not None:
            entries.remove(match)  # a later region: this node is the survivor from here on
        entries.append(((args_spec, kwargs_spec), node, region))
    return removed


def partition(
    joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """AOTAutograd's min-cut partition of ``joint`` after kiln's common-subexpression elimination (the
    partitioner's own, which would import Inductor, is turned off for the call). Should kiln's pass fail, the
    merges it made stand (each is valid on its own) and the partitioner's own pass does the rest."""
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if not functorch_config.cse:
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    try:
        joint.graph.eliminate_dead_code()
        eliminate_common_subexpressions(joint.graph)
        joint.recompile()
    except Exception as e:  # noqa: BLE001 - an optimization with a fallback: functorch's own pass
        log.warning(
            "kiln: joint-graph CSE failed (%s: %s); the partitioner's own CSE runs", type(e).__name__, e
        )
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    with functorch_config.patch(cse=False):
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
