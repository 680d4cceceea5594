"""The ``_foreach_*`` decompositions (``compiler/foreach.py``): each overload against ATen's own foreach op on
real tensors, and compiled optimizer steps (AdamW, SGD with momentum, foreach) without ATen fallbacks."""

from __future__ import annotations

import copy

import pytest
import torch

import compiler
from compiler import foreach
from compiler.codegen.wrapper import _allocates

aten = torch.ops.aten


def _lists(n=3):
    torch.manual_seed(0)
    shapes = [(4,), (2, 3), ()]
    return [[torch.rand(s) + 0.5 for s in shapes[:n]] for _ in range(3)]


def _cases():
    a, b, c = _lists()
    return {
        "add.Scalar": (a, 2.5),
        "add.List": (a, b),
        "add.ScalarList": (a, [1.0, 2.0, 3.0]),
        "add.Tensor": (a, torch.tensor(0.5)),
        "sub.List": (a, b),
        "mul.Scalar": (a, 0.9),
        "div.List": (a, b),
        "div.Tensor": (a, torch.tensor(3.0)),
        "addcmul.Scalar": (a, b, c, 0.25),
        "addcmul.ScalarList": (a, b, c, [1.0, 2.0, 3.0]),
        "addcmul.Tensor": (a, b, c, torch.tensor([1.0, -2.0, 0.5])),
        "addcdiv.Scalar": (a, b, c, -0.1),
        "addcdiv.Tensor": (a, b, c, torch.tensor([0.5, 1.0, 2.0])),
        "lerp.Scalar": (a, b, 0.3),
        "lerp.List": (a, b, c),
        "pow.Scalar": (a, 2.0),
        "pow.List": (a, b),
        "pow.ScalarAndTensor": (2.0, a),
        "sqrt.default": (a,),
        "neg.default": (a,),
        "reciprocal.default": (a,),
        "maximum.List": (a, b),
        "maximum.Scalar": (a, 1.0),
        "minimum.ScalarList": (a, [0.7, 0.8, 0.9]),
        "clamp_max.Scalar": (a, 1.0),
        "norm.Scalar": (a, 2),
        "copy.default": (a, b),
        "zero.default": (a,),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_decomposition_matches_aten_foreach(name):
    args = _cases()[name]
    base, overload = name.split(".")
    op = getattr(getattr(aten, f"_foreach_{base}"), overload)
    got = foreach.table()[op](*args)
    want = op(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)


def test_every_functional_overload_has_a_decomposition():
    t = foreach.table()
    for name in ("add", "mul", "addcdiv", "lerp", "sqrt", "maximum"):
        packet = getattr(aten, f"_foreach_{name}")
        for overload in packet.overloads():
            if "out" not in overload:
                assert getattr(packet, overload) in t, f"_foreach_{name}.{overload}"


def _same_grads(params, refs) -> None:
    """Give each parameter a small random gradient and its reference twin the same one."""
    for p, q in zip(params, refs):
        p.grad = torch.randn_like(p) * 1e-2
        q.grad = p.grad.clone()


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_compiled_optimizer_step_matches_eager_without_fallbacks(opt, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).to(
        device
    )
    ref = copy.deepcopy(model)
    _same_grads(model.parameters(), ref.parameters())

    def make(ps):
        if opt == "adamw":
            return torch.optim.AdamW(ps, lr=1e-3, foreach=True)
        return torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True)

    o, r = make(list(model.parameters())), make(list(ref.parameters()))
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        step = torch.compile(o.step, backend="kiln")
        for _ in range(3):
            step()
            r.step()
    assert graphs and [str(f) for g in graphs for f in g.all_fallbacks()] == []
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("foreach", [False, True])
def test_a_primed_adamw_step_keeps_no_parameter_sized_temporary(foreach, device):
    """The steady-state AdamW step (state present, as after a first step) computes each parameter's new moments
    and update in registers: the wrapper allocates nothing but 0-d step counts, whichever implementation
    (one tensor at a time or foreach) the optimizer runs; the single-tensor step once stored its first
    parameter's moments in two temporaries of its size (its step size was computed in a later kernel)."""
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (16, 16), (16,)]
    ps = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    _same_grads(ps, ref)
    o = torch.optim.AdamW(ps, lr=1e-3, foreach=foreach)
    r = torch.optim.AdamW(ref, lr=1e-3, foreach=foreach)
    o.step()
    r.step()
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        step = torch.compile(o.step, backend="kiln")
        for _ in range(2):
            step()
            r.step()
    (g,) = graphs
    allocated = [tuple(n.args[0]) for n in g.wrapper.graph.nodes if _allocates(n)]
    assert set(allocated) <= {()}, allocated
    for p, q in zip(ps, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o.state[p]["exp_avg_sq"], r.state[q]["exp_avg_sq"], rtol=1e-5, atol=1e-9)
