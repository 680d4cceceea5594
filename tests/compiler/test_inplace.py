"""The ``in_place`` pass (``compiler/inplace.py``): mutated inputs stored into by their kernels, with no
write-back copy, only where that is safe; results identical to the write-back."""

from __future__ import annotations

import pytest
import torch

import compiler
from kiln_testing import compiled_optimizer_steps, model_with_grads, randn


def _run(fn, args, **settings):
    torch._dynamo.reset()
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    return out, graphs


def _copies(graph) -> int:
    code = graph.code
    return code.count("_foreach_copy_(") + code.count("aten.copy_.default(")


def _scale(x, y):
    x.mul_(2).add_(y)
    return (x * y).cos()


def test_a_pointwise_update_is_stored_into_its_input(device):
    x, y = randn(64), randn(64)
    ex, gx = x.clone(), x.clone()
    want = _scale(ex, y)
    got, graphs = _run(_scale, (gx, y))
    assert _copies(graphs[0]) == 0
    assert torch.equal(gx, ex) and torch.allclose(got, want)


def test_the_store_into_the_input_comes_after_every_load():
    x, y = randn(64), randn(64)
    _, graphs = _run(lambda x, y: (x.mul_(2), (x * 0 + y).cos())[1], (x, y))
    for src in graphs[0].kernel_sources.values():
        lines = src.splitlines()
        stores = [i for i, line in enumerate(lines) if "tl.store(" in line]
        loads = [i for i, line in enumerate(lines) if "tl.load(" in line]
        assert not loads or not stores or max(loads) < min(stores)


def test_an_update_read_at_other_positions_keeps_its_write_back():
    def flipped(x):
        x.mul_(2)
        return x.flip(0) + 1  # the same kernel reads element 63 - i where it writes element i

    x = randn(64)
    ex, gx = x.clone(), x.clone()
    want = flipped(ex)
    got, graphs = _run(flipped, (gx,))
    assert _copies(graphs[0]) == 1
    assert torch.equal(gx, ex) and torch.equal(got, want)


def test_a_reduction_update_keeps_its_write_back():
    def summed(x):
        x.mul_(2)
        return x.sum()

    x = randn(64)
    _, graphs = _run(summed, (x.clone(),))
    assert _copies(graphs[0]) == 1


def test_setting_off_keeps_every_write_back():
    x, y = randn(64), randn(64)
    gx = x.clone()
    _, graphs = _run(_scale, (gx, y), write_in_place=False)
    assert _copies(graphs[0]) == 1


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_optimizer_step_updates_in_place_as_the_write_back_did(opt, device):
    model = model_with_grads(device)
    results, copies = {}, {}
    for on in (False, True):
        m, o, graphs = compiled_optimizer_steps(model, opt, write_in_place=on)
        results[on] = [p.detach().clone() for p in m.parameters()]
        results[on] += [
            v.clone() for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        ]
        copies[on] = _copies(graphs[-1])
    assert copies[False] >= 1 and copies[True] == 0
    for a, b in zip(results[False], results[True]):
        assert torch.equal(a, b)
