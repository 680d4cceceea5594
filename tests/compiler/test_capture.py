"""compiler.capture: records only inside a block, and keeps no compiled graph alive after it."""

from __future__ import annotations

import gc

import torch

import compiler
from compiler.capture import CompiledGraph


def _alive() -> int:
    gc.collect()
    return sum(
        type(o) is CompiledGraph for o in gc.get_objects()
    )  # isinstance would touch deprecated module attrs


def test_capture_collects_the_graphs_compiled_inside_the_block_only(device):
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).relu(), backend="kiln")
    f(torch.randn(8, device=device))  # compiled outside: not recorded
    g = torch.compile(lambda x: (x + 1).sigmoid(), backend="kiln")
    with compiler.capture() as graphs:
        g(torch.randn(8, device=device))
    assert len(graphs) == 1 and graphs[0].kernel_count == 1


def test_a_dropped_compiled_function_leaves_no_compiled_graph_alive():
    # a compiled graph holds its CUDA-graph runner and so its recordings' pool memory: nothing in kiln may
    # keep one after the function, its model and Dynamo's caches are gone (a list of recent graphs did)
    torch._dynamo.reset()
    before = _alive()
    f = torch.compile(lambda x: torch.softmax(x * 3, -1), backend="kiln")
    f(torch.randn(4, 16))
    with compiler.capture() as graphs:
        torch.compile(lambda x: x.cos() + 1, backend="kiln")(torch.randn(4, 16))
    assert _alive() >= before + 2
    del f, graphs
    torch._dynamo.reset()
    assert _alive() == before
