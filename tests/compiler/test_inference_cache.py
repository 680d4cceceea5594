"""The inference front cache (compiler/runtime/inference_cache.py): a static inference graph with a trivial
AOTAutograd wrapper is answered from the graph cache without AOTAutograd (a parameter-holding module, its
weights changed in place); graphs that mutate inputs, return aliases, have dynamic shapes, need autograd or call
user functions are refused with a reason and still compile and run as eager does. CPU, through the interpreter."""

from __future__ import annotations

import os

import torch

import compiler
from compiler import config
from compiler.runtime import compile_stats, inference_cache, reset_compile_stats
from kiln_testing import DEVICE


def _fronts(folder):
    return (
        [p for p in os.listdir(folder) if p.endswith(inference_cache.SUFFIX)] if os.path.isdir(folder) else []
    )


class _AotCalls:
    """Counts AOTAutograd's entry calls (kiln_backend imports it at each compile)."""

    def __init__(self, monkeypatch):
        import torch._functorch.aot_autograd as aot

        self.n = 0
        real = aot.aot_module_simplified

        def counted(*a, **k):
            self.n += 1
            return real(*a, **k)

        monkeypatch.setattr(aot, "aot_module_simplified", counted)


def _compile_run(fn, *args, dynamic=False):
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln", dynamic=dynamic)(*args)
    return graphs, out


def test_a_parameter_holding_module_skips_aot_autograd_when_warm(gc_dir, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8)
    ).to(DEVICE)
    x = torch.randn(4, 16, device=DEVICE)
    aot = _AotCalls(monkeypatch)
    with torch.no_grad():
        graphs, out = _compile_run(model, x)
        assert [g.cache for g in graphs] == ["stored"] and len(_fronts(gc_dir)) == 1 and aot.n == 1
        assert torch.allclose(out, model(x), atol=1e-5)
        for p in model.parameters():  # weights are inputs of the Dynamo graph: a hit reads the new values
            p.mul_(0.5)
        reset_compile_stats()
        graphs, out = _compile_run(model, x)
        assert aot.n == 1 and compile_stats().front_hits == 1 and [g.cache for g in graphs] == ["hit"]
        assert torch.allclose(out, model(x), atol=1e-5)


def test_an_input_mutation_kept_in_the_graph_is_answered(gc_dir, monkeypatch):
    def f(x):  # a data mutation AOTAutograd keeps in the graph: the compiled graph's own write-back
        x.mul_(2)
        return x + 1

    aot = _AotCalls(monkeypatch)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, device=DEVICE)
            ref = x.clone()
            _, out = _compile_run(f, x)
            assert torch.allclose(x, ref * 2) and torch.allclose(out, ref * 2 + 1)
    assert aot.n == 1 and compile_stats().front_hits == 1


def test_an_output_aliasing_an_input_is_refused(gc_dir):
    def f(x):
        return x.view(-1), x * 2

    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 4, device=DEVICE)
            _, (view, doubled) = _compile_run(f, x)
            view[0] = 42.0  # the view still aliases the input, as in eager
            assert x[0, 0] == 42.0 and torch.allclose(doubled.view(-1)[1:], x.view(-1)[1:] * 2)
    assert not _fronts(gc_dir) and compile_stats().front_hits == 0
    assert any("output of kind" in r for r in inference_cache.skipped())


def test_dynamic_shapes_are_refused(gc_dir):
    def f(x):
        return torch.softmax(x * 2, -1)

    with torch.no_grad():
        for n in (8, 8, 12):
            x = torch.randn(n, 10, device=DEVICE)
            _, out = _compile_run(f, x, dynamic=True)
            assert torch.allclose(out, f(x), atol=1e-6)
    assert not _fronts(gc_dir) and compile_stats().front_hits == 0
    assert any("symbolic sizes" in r for r in inference_cache.skipped())


def test_a_training_graph_with_its_setting_off_and_a_user_function_are_refused(gc_dir):
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    with config.patch(training_cache=False):
        _compile_run(lambda x: (x @ w).sum(), torch.randn(2, 4, device=DEVICE))
    assert any("training graph" in r for r in inference_cache.skipped())

    @torch._dynamo.allow_in_graph
    def user(x):
        return x + 1

    with torch.no_grad():
        _, out = _compile_run(lambda x: user(x) * 2, torch.ones(3, device=DEVICE))
    assert torch.equal(out, torch.full((3,), 4.0, device=DEVICE)) and not _fronts(gc_dir)
    assert any("a call of" in r for r in inference_cache.skipped())


def test_a_global_state_change_misses(gc_dir, monkeypatch):
    aot = _AotCalls(monkeypatch)
    x = torch.randn(64, device=DEVICE)
    with torch.no_grad():
        _compile_run(lambda t: t.cumsum(0) * 2, x)
        torch.use_deterministic_algorithms(True)
        try:
            _, out = _compile_run(lambda t: t.cumsum(0) * 2, x)
        finally:
            torch.use_deterministic_algorithms(False)
    assert aot.n == 2 and compile_stats().front_hits == 0 and len(_fronts(gc_dir)) == 2
    assert torch.allclose(out, x.cumsum(0) * 2, atol=1e-5)


def test_cache_off_or_setting_off_stores_no_front_entry(gc_dir):
    x = torch.randn(8, device=DEVICE)
    with torch.no_grad(), config.patch(inference_cache=False):
        _compile_run(lambda t: t * 3, x)
    assert not _fronts(gc_dir)


def test_a_cond_graph_is_answered_with_its_branches(gc_dir, monkeypatch):
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

    aot = _AotCalls(monkeypatch)
    pos, neg = torch.ones(6, device=DEVICE), -torch.ones(6, device=DEVICE)
    with torch.no_grad():
        _compile_run(f, pos)
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="kiln")
        assert torch.equal(compiled(pos), pos * 2) and torch.equal(compiled(neg), neg - 1)
    assert aot.n == 1 and compile_stats().front_hits == 1


def test_a_damaged_or_foreign_front_entry_is_a_miss(gc_dir):
    from compiler.runtime import cache

    x = torch.randn(8, device=DEVICE)
    with torch.no_grad():
        _compile_run(lambda t: t * 3, x)
        (name,) = _fronts(gc_dir)
        key = name[: -len(inference_cache.SUFFIX)]
        cache.write_entry(
            str(gc_dir / name), b'{"format": 1, "key": "%s", "graph": "../../elsewhere"}' % key.encode()
        )
        reset_compile_stats()
        _, out = _compile_run(
            lambda t: t * 3, x
        )  # not answered by the front cache; the graph cache still hits
    assert compile_stats().front_hits == 0 and compile_stats().graph_hits == 1 and torch.allclose(out, x * 3)
    assert inference_cache._read(key) is not None  # replaced by a whole entry
