"""Ahead-of-time path: a ``torch.export`` program in, kiln's wrapper ``GraphModule`` out.

The exported program is decomposed with kiln's table, compiled by the same passes as ``torch.compile``
graphs, and returned as a module taking the program's user inputs. Its sizes stay symbolic: a dimension
exported as ``2*s + 1`` is solved for ``s`` at run time, so the module runs at new sizes without
recompiling.
"""

from __future__ import annotations

from typing import Any

import torch

from .backend import compile_graph
from .capture import CompiledGraph, record
from .decompositions import export_decomposition_table
from .exc import KilnError


class CompiledExport(torch.nn.Module):
    """An exported program compiled by kiln. ``wrapper`` is the readable FX wrapper."""

    def __init__(self, compiled: CompiledGraph, lifted: list[torch.Tensor], n_user: int) -> None:
        super().__init__()
        self.compiled = compiled
        self.wrapper = compiled.wrapper
        self._lifted = lifted
        self._n_user = n_user

    def forward(self, *args: Any) -> Any:
        if len(args) != self._n_user:
            raise KilnError(f"expected {self._n_user} inputs, got {len(args)}")
        # an inference artifact: extern kernels write ``out=`` buffers, which autograd refuses when a
        # parameter (or an input) requires grad
        with torch.no_grad():
            outs = self.wrapper(*self._lifted, *args)
        return outs[0] if len(outs) == 1 else outs


def compile_exported(ep: torch.export.ExportedProgram, name: str = "export") -> CompiledExport:
    """Compile an ExportedProgram with kiln. Parameters and buffers are bound; user inputs stay inputs."""
    ep = ep.run_decompositions(export_decomposition_table())
    sig = ep.graph_signature
    lifted: list[torch.Tensor] = []
    n_user = 0
    for spec in sig.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            n_user += 1
            continue
        if n_user:
            raise KilnError("exported programs with parameters after user inputs are not supported")
        target = spec.target
        if kind == "PARAMETER":
            lifted.append(ep.state_dict[target])
        elif kind == "BUFFER":
            lifted.append(ep.state_dict[target] if target in ep.state_dict else ep.constants[target])
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            lifted.append(ep.constants[target])
        else:
            raise KilnError(f"unsupported exported input kind {kind}")
    if any(s.kind.name != "USER_OUTPUT" for s in sig.output_specs):
        raise KilnError("exported programs that mutate buffers are not supported by the AOT path")
    cg = compile_graph(ep.graph_module, name)
    record(cg)
    return CompiledExport(cg, lifted, n_user)
