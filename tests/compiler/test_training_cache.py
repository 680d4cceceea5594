"""The training front cache (compiler/runtime/training_cache.py): a static training graph whose forward and
backward are in the graph cache is answered without AOTAutograd in a later compile, and its outputs and
gradients are those of the cold compile (bit for bit: the same kernels) and of eager; BatchNorm's running
statistics, autocast, unused and non-differentiable outputs, transposed outputs, an optimizer's in-place updates
and double backward behave as through AOTAutograd; what the rebuilt wrapper cannot mirror is refused with a
reason. CPU, through the interpreter."""

from __future__ import annotations

import json
import os

import pytest
import torch

from compiler import config
from compiler.runtime import cache, compile_stats, inference_cache, reset_compile_stats
from kiln_testing import DEVICE


def _entries(folder):
    return (
        [p for p in os.listdir(folder) if p.endswith(inference_cache.SUFFIX)] if os.path.isdir(folder) else []
    )


@pytest.fixture
def aot(monkeypatch):
    """Counts AOTAutograd's entry calls (kiln_backend imports it at each compile)."""
    import torch._functorch.aot_autograd as aot_mod

    calls = {"n": 0}
    real = aot_mod.aot_module_simplified

    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(aot_mod, "aot_module_simplified", counted)
    return calls


def _step(make, x, loss=lambda out: out.float().pow(2).sum(), compile_=True):
    """A fresh model from ``make()`` (seeded), one forward and backward; (outputs, grads by name, model)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(DEVICE)
    fn = torch.compile(model, backend="kiln") if compile_ else model
    out = fn(x)
    loss(out).backward()
    outs = out if isinstance(out, tuple) else (out,)
    return (
        [o.detach() for o in outs],
        {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
        model,
    )


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8)
    )


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def test_a_training_step_skips_aot_autograd_when_warm_and_matches(gc_dir, aot):
    x = torch.randn(4, 16, device=DEVICE)
    out1, g1, _ = _step(_mlp, x)
    assert aot["n"] == 1 and len(_entries(gc_dir)) == 1 and compile_stats().front_hits == 0
    reset_compile_stats()
    out2, g2, _ = _step(_mlp, x)
    assert aot["n"] == 1 and compile_stats().front_hits == 1 and compile_stats().graph_hits == 2
    assert _same(out1, out2) and _same(list(g1.values()), list(g2.values())) and g1.keys() == g2.keys()
    ref_out, ref_g, _ = _step(_mlp, x, compile_=False)
    assert torch.allclose(out2[0], ref_out[0], atol=1e-5)
    assert all(torch.allclose(g2[k], ref_g[k], atol=1e-4) for k in ref_g)


def test_batchnorm_running_statistics_and_optimizer_steps_on_a_hit(gc_dir, aot):
    def make():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 6 * 6, 4),
        )

    x = torch.randn(2, 3, 8, 8, device=DEVICE)

    def train(compile_):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = make().to(DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fn = torch.compile(model, backend="kiln") if compile_ else model
        losses = []
        for _ in range(3):  # in-place parameter updates between steps: the graph reads the new values
            opt.zero_grad()
            loss = fn(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses, model.state_dict()

    cold, cold_state = train(True)
    reset_compile_stats()
    warm, warm_state = train(True)
    assert aot["n"] == 1 and compile_stats().front_hits == 1
    assert _same(cold, warm) and all(torch.equal(cold_state[k], warm_state[k]) for k in cold_state)
    eager, eager_state = train(False)
    assert torch.allclose(torch.stack(warm), torch.stack(eager), rtol=1e-4, atol=1e-5)
    assert torch.allclose(warm_state["1.running_mean"], eager_state["1.running_mean"], atol=1e-5)
    assert warm_state["1.num_batches_tracked"] == 3


def test_autocast_training_is_answered(gc_dir, aot):
    x = torch.randn(4, 16, device=DEVICE)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return _step(_mlp, x)

    out1, g1, _ = step()
    reset_compile_stats()
    out2, g2, _ = step()
    assert aot["n"] == 1 and compile_stats().front_hits == 1
    assert (
        out2[0].dtype == torch.bfloat16 and _same(out1, out2) and _same(list(g1.values()), list(g2.values()))
    )
    _, plain_g, _ = _step(_mlp, x)  # autocast is in the key: without it, another entry
    assert (
        aot["n"] == 2 and len(_entries(gc_dir)) == 2 and not _same(list(plain_g.values()), list(g2.values()))
    )


class _Heads(torch.nn.Module):
    """Several outputs: a transposed view of an intermediate, an unused one, a non-differentiable one."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 6), torch.nn.Linear(8, 5)

    def forward(self, x):
        h = self.a(x)
        return h.t(), self.b(x), h.argmax(-1), (h * 2).detach()


def test_unused_transposed_and_non_differentiable_outputs(gc_dir, aot):
    x = torch.randn(4, 8, device=DEVICE)

    def loss(out):  # only the transposed output: the others get no gradient
        return (out[0] * torch.arange(24.0, device=DEVICE).view(6, 4)).sum()

    out1, g1, _ = _step(_Heads, x, loss)
    reset_compile_stats()
    out2, g2, _ = _step(_Heads, x, loss)
    assert aot["n"] == 1 and compile_stats().front_hits == 1
    assert _same(out1, out2) and _same(list(g1.values()), list(g2.values())) and set(g2) == set(g1)
    _, ref_g, _ = _step(_Heads, x, loss, compile_=False)
    assert all(torch.allclose(g2[k], ref_g[k], atol=1e-4) for k in ref_g)
    assert torch.count_nonzero(g2["b.weight"]) == 0  # the unused output's gradient arrived as zeros

    torch._dynamo.reset()
    model = _Heads().to(DEVICE)
    t, _, idx, det = torch.compile(model, backend="kiln")(x)
    assert compile_stats().front_hits == 2
    assert t.requires_grad and not idx.requires_grad and not det.requires_grad and t._base is None


def test_double_backward_raises_as_with_aot_autograd(gc_dir):
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)

    def f(x):
        return torch.sin(x @ w).sum()

    x = torch.randn(3, 4, device=DEVICE)
    for _ in range(2):  # cold, then warm (answered by the front cache)
        torch._dynamo.reset()
        (g,) = torch.autograd.grad(torch.compile(f, backend="kiln")(x), w, create_graph=True)
    assert compile_stats().front_hits == 1
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_a_mutated_input_that_requires_grad_is_refused(gc_dir, aot):
    w = torch.randn(5, device=DEVICE, requires_grad=True)

    def f(a):
        a.mul_(2)  # a non-leaf input that requires grad: AOTAutograd applies the mutation outside the graph
        return (a * a).sum()

    for _ in range(2):
        torch._dynamo.reset()
        a = w * 1
        torch.compile(f, backend="kiln")(a).backward()
        assert torch.allclose(a, w * 2)
    assert torch.allclose(w.grad, 2 * (8 * w.detach()))
    assert aot["n"] == 2 and compile_stats().front_hits == 0
    assert any("input mutation" in r for r in inference_cache.skipped())


def test_a_graph_break_answers_both_graphs(gc_dir, aot):
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(h * 2)

    x = torch.randn(3, 8, device=DEVICE)
    out1, g1, _ = _step(Broken, x)
    reset_compile_stats()
    out2, g2, _ = _step(Broken, x)
    assert aot["n"] == 2 and compile_stats().front_hits == 2
    assert _same(out1, out2) and _same(list(g1.values()), list(g2.values()))


def test_damaged_entries_are_misses_and_the_setting_turns_it_off(gc_dir, aot):
    x = torch.randn(4, 16, device=DEVICE)
    _step(_mlp, x)
    (name,) = _entries(gc_dir)
    key = name[: -len(inference_cache.SUFFIX)]
    data = inference_cache._read(key)
    assert data is not None and data["kind"] == "training"
    for bad in (
        f'{{"format": 1, "key": "{key}", "kind": "training", "fw": "../x", "bw": "../y"}}',
        f'{{"format": 1, "key": "{key}", "kind": "training", "fw": "{data["fw"]}", "bw": "{data["bw"]}", '
        '"returns": -1}',
        json.dumps({**data, "tangents": [{**t, "dtype": "save"} for t in data["tangents"]]}),
    ):
        cache.write_entry(str(gc_dir / name), bad.encode())
        assert inference_cache._read(key) is None
        reset_compile_stats()
        out, _, _ = _step(_mlp, x)  # compiled through AOTAutograd (graph cache hits), the entry rewritten
        assert compile_stats().front_hits == 0 and compile_stats().graph_hits == 2
        assert inference_cache._read(key) is not None
    with config.patch(training_cache=False):
        reset_compile_stats()
        _step(_mlp, x)
    assert compile_stats().front_hits == 0 and aot["n"] == 5


def test_retain_graph_runs_the_backward_twice_on_a_hit(gc_dir):
    x = torch.randn(4, 16, device=DEVICE)
    grads = []
    for _ in range(2):  # cold, then warm
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _mlp().to(DEVICE)
        loss = torch.compile(model, backend="kiln")(x).pow(2).sum()
        loss.backward(retain_graph=True)
        once = [p.grad.clone() for p in model.parameters()]
        loss.backward()
        grads.append((once, [p.grad.clone() for p in model.parameters()]))
    assert compile_stats().front_hits == 1
    (cold_once, cold_twice), (warm_once, warm_twice) = grads
    assert _same(cold_once, warm_once) and _same(cold_twice, warm_twice)
    assert all(torch.allclose(t, 2 * o, rtol=1e-5, atol=1e-6) for o, t in zip(warm_once, warm_twice))
