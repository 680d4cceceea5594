"""The addmm_bias pass (compiler/fx_addmm.py): each linear layer's addmm in the form a GPU timing picks.

On CPU the forced settings (``lt``/``expand``/``mm``) exercise each rewrite end to end (values and gradients
against eager, the wrapper's calls); the ``bench`` decision is checked with the timing replaced by given
numbers, so the choice rule, not a GPU, is under test.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler import fx_addmm

aten = torch.ops.aten


def addmm_nodes(gm):
    return [n for n in gm.graph.nodes if n.target is aten.addmm.default]


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def linear_out(x, w, b):
    return F.linear(x, w, b)


ARGS = (torch.randn(64, 48), torch.randn(40, 48), torch.randn(40))


def compiled(fn, *args, **settings):
    with compiler.config.patch(**settings), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    return out, "\n".join(g.wrapper.code for g in graphs)


def test_a_linear_layer_is_a_bias_addmm_and_its_consumers_decide_the_forms():
    gm = traced(linear_gelu, *ARGS)
    (node,) = addmm_nodes(gm)
    assert fx_addmm.bias_addmm(node)
    assert fx_addmm.forms_of(node) == ("lt", "expand", "mm")
    (node,) = addmm_nodes(traced(linear_out, *ARGS))
    assert fx_addmm.forms_of(node) == ("lt", "expand")  # the product is the output: no fused add
    gm = traced(lambda x, w, b: torch.addmm(b, x, w.t(), beta=2), *ARGS)
    assert not fx_addmm.bias_addmm(addmm_nodes(gm)[0])
    gm = traced(lambda x, w, b: torch.addmm(b.expand(64, 40), x, w.t()), *ARGS)
    assert not fx_addmm.bias_addmm(addmm_nodes(gm)[0])  # already 2-D


@pytest.mark.parametrize("form", ["lt", "expand", "mm"])
def test_each_form_matches_eager(form):
    out, code = compiled(linear_gelu, *ARGS, addmm_bias=form)
    torch.testing.assert_close(out, linear_gelu(*ARGS))
    if form == "lt":
        assert "torch.addmm(arg" in code and "torch.mm(" not in code
    elif form == "expand":
        assert "[64, 40], [0, 1]" in code and "torch.addmm(reinterpret_tensor" in code
    else:
        assert "torch.addmm(" not in code and "torch.mm(" in code


def test_mm_form_keeps_an_output_product_as_traced():
    out, code = compiled(linear_out, *ARGS, addmm_bias="mm")
    torch.testing.assert_close(out, linear_out(*ARGS))
    assert "torch.addmm(" in code and "torch.mm(" not in code


@pytest.mark.parametrize("form", ["expand", "mm"])
def test_training_gradients_match_eager_in_each_form(form):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    ref = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    ref.load_state_dict(mlp.state_dict())
    x = torch.randn(32, 48)
    with compiler.config.patch(addmm_bias=form):
        torch.compile(mlp, backend="kiln")(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(mlp.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


def test_pick_needs_the_margin_over_the_traced_form():
    assert fx_addmm.pick({"lt": 1.0, "expand": 0.99}) == "lt"
    assert fx_addmm.pick({"lt": 1.0, "expand": 0.95}) == "expand"
    assert fx_addmm.pick({"lt": 1.0, "expand": 0.9, "mm": 0.8}) == "mm"
    assert fx_addmm.pick({"lt": 0.5, "expand": 0.9, "mm": 0.8}) == "lt"


@pytest.fixture
def fake_gpu(monkeypatch):
    """``bench`` as on a GPU: every addmm counts as timeable and large, with the timings given by the test."""
    timings: dict[str, float] = {}
    asked: list[tuple] = []

    def timed_forms(a_geom, b_geom, dtype, device, forms):
        asked.append((a_geom, b_geom, forms))
        return {f: timings[f] for f in forms}

    monkeypatch.setattr(fx_addmm, "on_gpu", lambda out: True)
    monkeypatch.setattr(fx_addmm, "MIN_MACS", 1)
    monkeypatch.setattr(fx_addmm, "timed_forms", timed_forms)
    return timings, asked


def test_bench_rewrites_to_the_fastest_form(fake_gpu):
    timings, asked = fake_gpu
    timings.update(lt=1.0, expand=0.8, mm=0.9)
    gm = traced(linear_gelu, *ARGS)
    fx_addmm.reset_decisions()
    with compiler.config.patch(addmm_bias="bench"):
        assert fx_addmm.choose_forms(gm) == {"expand": 1}
    assert fx_addmm.decision_log() == [
        {
            "m": 64,
            "n": 40,
            "k": 48,
            "dtype": "torch.float32",
            "us": {"lt": 1000.0, "expand": 800.0, "mm": 900.0},
            "form": "expand",
        }
    ]
    assert asked == [(((64, 48), (48, 1)), ((48, 40), (1, 48)), ("lt", "expand", "mm"))]
    (node,) = addmm_nodes(gm)
    assert node.args[0].target is aten.expand.default
    assert tuple(node.args[0].meta["val"].stride()) == (0, 1)


def test_bench_keeps_the_traced_form_when_nothing_beats_it(fake_gpu):
    timings, _ = fake_gpu
    timings.update(lt=1.0, expand=0.99, mm=1.2)
    gm = traced(linear_gelu, *ARGS)
    with compiler.config.patch(addmm_bias="bench"):
        assert fx_addmm.choose_forms(gm) == {}
    assert len(addmm_nodes(gm)) == 1 and addmm_nodes(gm)[0].args[0].op == "placeholder"


def test_bench_leaves_cpu_graphs_untimed(monkeypatch):
    def never(*a):
        raise AssertionError("timed on CPU")

    monkeypatch.setattr(fx_addmm, "timed_forms", never)
    out, code = compiled(linear_gelu, *ARGS, addmm_bias="bench")
    torch.testing.assert_close(out, linear_gelu(*ARGS))
    assert "torch.addmm(arg" in code


def test_a_failed_timing_leaves_the_addmm_as_traced(fake_gpu, monkeypatch):
    def oom(*a):
        raise torch.OutOfMemoryError("no room")

    monkeypatch.setattr(fx_addmm, "timed_forms", oom)
    gm = traced(linear_gelu, *ARGS)
    with compiler.config.patch(addmm_bias="bench"):
        assert fx_addmm.choose_forms(gm) == {}
