"""Higher-order ops (``torch.cond``, ``torch.while_loop``...): every subgraph is compiled by kiln itself and
the wrapper calls the higher-order op with the compiled subgraphs (``get_attr``), for every predicate value.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..graph import GraphLowering, SubgraphCall, SubgraphRef, map_values, register_lowering, values_of

HOPS = []
for _name in ("cond", "while_loop"):
    _op = getattr(torch.ops.higher_order, _name, None)
    if _op is not None:
        HOPS.append(_op)


class SingleOutput(torch.nn.Module):
    """A compiled subgraph whose source returned a single value rather than a tuple."""

    def __init__(self, wrapper: torch.nn.Module) -> None:
        super().__init__()
        self.wrapper = wrapper

    def forward(self, *args):
        return self.wrapper(*args)[0]


def lower_hop(g: GraphLowering, node: fx.Node, *args, **kwargs):
    new_args = []
    subgraphs = {}
    for a_fx, a in zip(node.args, args):
        if isinstance(a_fx, fx.Node) and a_fx.op == "get_attr":
            assert isinstance(a_fx.target, str)  # a get_attr node names its attribute
            sub = getattr(g.gm, a_fx.target)
            attr = f"{a_fx.target}"
            compiled = g.subgraph_compiler(sub, f"{g.name}.{a_fx.target}")
            # kiln wrappers return tuples; a subgraph returning one bare value (while_loop's cond_fn) keeps that form
            out_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
            subgraphs[attr] = (
                compiled if isinstance(out_node.args[0], (tuple, list)) else SingleOutput(compiled)
            )
            new_args.append(SubgraphRef(attr))
        else:
            new_args.append(map_values(a, g.realize))
    outputs = g._extern_outputs(node.meta.get("val"))
    g.steps.append(SubgraphCall(node.target, tuple(new_args), subgraphs, outputs, node.name))
    return values_of(outputs)


for _op in HOPS:  # operands (a CPU predicate...) go to the higher-order op as they are
    register_lowering(_op, same_device=False)(lower_hop)
