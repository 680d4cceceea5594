"""Higher-order ops (``torch.cond``, ``torch.while_loop``...): every subgraph is compiled by kiln itself and
the wrapper calls the higher-order op with the compiled subgraphs (``get_attr``), for every predicate value.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..graph import GraphLowering, SubgraphCall, SubgraphRef, _map_values, _values_of, register_lowering

HOPS = []
for _name in ("cond", "while_loop"):
    _op = getattr(torch.ops.higher_order, _name, None)
    if _op is not None:
        HOPS.append(_op)


def lower_hop(g: GraphLowering, node: fx.Node, *args, **kwargs):
    new_args = []
    subgraphs = {}
    for a_fx, a in zip(node.args, args):
        if isinstance(a_fx, fx.Node) and a_fx.op == "get_attr":
            sub = getattr(g.gm, a_fx.target)
            attr = f"{a_fx.target}"
            subgraphs[attr] = g.subgraph_compiler(sub, f"{g.name}.{a_fx.target}")
            new_args.append(SubgraphRef(attr))
        else:
            new_args.append(_map_values(a, g.realize))
    outputs = g._extern_outputs(node.meta.get("val"))
    g.steps.append(SubgraphCall(node.target, tuple(new_args), subgraphs, outputs, node.name))
    return _values_of(outputs)


for _op in HOPS:
    register_lowering(_op)(lower_hop)
