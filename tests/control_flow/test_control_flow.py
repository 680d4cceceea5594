"""Control flow: ``torch.cond`` branches compiled into wrapper subgraphs, ``torch.while_loop``, graph breaks.

Every cond case runs both predicate values through one compiled artifact and compares with eager; the
structural checks read the wrapper: a ``higher_order.cond`` call whose branches are kiln-compiled subgraphs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._higher_order_ops import while_loop

import compiler
from kiln_testing import (
    assert_close,
    assert_fallback,
    assert_no_fallbacks,
    check,
    compile_kiln,
    frames,
    kernels,
)


def both_ways(fn, make_args, device, compile_kwargs=None, rtol=None, atol=None, **settings):
    """Run ``fn`` compiled once on inputs that take each branch; return the captured graphs."""
    compiled = compile_kiln(fn, **(compile_kwargs or {}))
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        for which in (True, False):
            args = make_args(which)
            expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            assert_close(compiled(*args), expected, rtol, atol)
    return graphs


def cond_graph(graphs):
    """The first captured graph whose wrapper calls torch.cond, and its branch subgraphs."""
    for g in graphs:
        if "higher_order.cond" in g.code:
            return g
    raise AssertionError("no wrapper calls torch.ops.higher_order.cond: " + "\n".join(g.code for g in graphs))


def signed(which: bool, *shape, device):
    x = torch.randn(*shape, device=device).abs() + 0.1
    return x if which else -x


# ------------------------------------------------------------------------------ torch.cond basics
def test_cond_both_branches_compiled_as_subgraphs(device):
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: torch.relu(t * 2 + 1), lambda t: torch.sigmoid(t) - 1, (x,))

    graphs = both_ways(fn, lambda w: (signed(w, 4, 8, device=device),), device)
    g = cond_graph(graphs)
    assert len(graphs) == 1  # both predicate values run through one compiled graph
    names = sorted(s.name.rsplit(".", 1)[-1] for s in g.subgraphs)
    assert names == ["false_graph_0", "true_graph_0"]
    assert all(s.kernel_count == 1 for s in g.subgraphs)  # each branch is one fused kernel
    assert_no_fallbacks(graphs)


@pytest.mark.parametrize("which", [True, False])
def test_cond_code_before_and_after(which, device):
    def fn(x, y):
        h = torch.tanh(x) * y  # before: fused into the kernel that also computes the predicate
        r = torch.cond(h.mean() > 0, lambda a: a.exp(), lambda a: a.neg(), (h,))
        return r.sum(-1) + 1  # after

    x = signed(which, 6, 5, device=device)
    graphs = check(fn, x, torch.rand(6, 5, device=device) + 0.5)
    g = cond_graph(graphs)
    assert g.kernel_count >= 2 and all(s.kernel_count == 1 for s in g.subgraphs)


@pytest.mark.parametrize("which", [True, False])
def test_cond_branches_use_outer_tensors(which, device):
    bias = torch.randn(8, device=device)
    scale = torch.rand(8, device=device) + 0.5

    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t * scale + bias, lambda t: t - bias, (x,))

    check(fn, signed(which, 3, 8, device=device))


@pytest.mark.parametrize("which", [True, False])
def test_cond_multiple_outputs(which, device):
    def fn(x):
        def true_fn(t):
            return t.amax(dim=1), t.softmax(dim=1)

        def false_fn(t):
            return t.amin(dim=1), torch.log_softmax(t, dim=1)

        m, p = torch.cond(x.sum() > 0, true_fn, false_fn, (x,))
        return m * 2, p

    check(fn, signed(which, 4, 16, device=device))


@pytest.mark.parametrize("which", [True, False])
def test_nested_cond(which, device):
    def fn(x, y):
        def outer_true(a, b):
            return torch.cond(b.sum() > 0, lambda p, q: p + q, lambda p, q: p - q, (a, b))

        def outer_false(a, b):
            return a * b

        return torch.cond(a_sum(x) > 0, outer_true, outer_false, (x, y))

    def a_sum(t):
        return t.sum()

    for inner in (True, False):
        torch._dynamo.reset()
        graphs = check(fn, signed(which, 4, 4, device=device), signed(inner, 4, 4, device=device))
        g = cond_graph(graphs)
        inner_subs = [s for s in g.subgraphs if "higher_order.cond" in s.code]
        assert len(inner_subs) == 1 and len(inner_subs[0].subgraphs) == 2


@pytest.mark.parametrize("which", [True, False])
def test_cond_branch_views(which, device):
    def fn(x):
        # views of the branch input are index arithmetic inside the branch kernel (cond outputs must be dense)
        def true_fn(t):
            return t.t()[1:3] * 2

        def false_fn(t):
            return t[:, 1:3].t() + 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))

    check(fn, signed(which, 4, 4, device=device))


@pytest.mark.parametrize("which", [True, False])
def test_cond_with_reductions_in_branches(which, device):
    w = torch.randn(16, device=device)

    def fn(x):
        def ln(t):
            return F.layer_norm(t, (16,), w)

        def rms(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        return torch.cond(x.mean() > 0, ln, rms, (x,))

    graphs = check(fn, signed(which, 3, 16, device=device), rtol=1e-4, atol=1e-4)
    assert all(s.kernel_count == 1 for s in cond_graph(graphs).subgraphs)


# ------------------------------------------------------------------------------ parameters and modules
class Gate(torch.nn.Module):
    """Routes the input through an expert MLP or a cheap residual, depending on its norm."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        def expert(t):
            return F.gelu(self.fc(t))

        def skip(t):
            return t * 0.5

        return torch.cond(x.norm() > 3.0, expert, skip, (x,))


@pytest.mark.parametrize("which", [True, False])
def test_cond_branch_with_parameters_and_matmul(which, device):
    mod = Gate().to(device)
    x = torch.randn(4, 8, device=device)
    x = x * (10.0 if which else 0.01)
    with torch.no_grad():
        graphs = check(mod, x, rtol=1e-4, atol=1e-5)
    g = cond_graph(graphs)
    expert = [s for s in g.subgraphs if s.extern_count]
    assert len(expert) == 1 and expert[0].extern_count == 1 and expert[0].kernel_count == 1


@pytest.mark.parametrize("which", [True, False])
def test_cond_gradient_clipping(which, device):
    # clip_grad_norm_-style: rescale only when the global norm exceeds the limit
    def clip(g, max_norm):
        norm = g.pow(2).sum().sqrt()
        return torch.cond(norm > max_norm, lambda t, n: t * (max_norm / n), lambda t, n: t.clone(), (g, norm))

    g = torch.randn(64, device=device) * (5.0 if which else 0.01)
    check(clip, g, 1.0)


@pytest.mark.parametrize("which", [True, False])
def test_cond_amp_found_inf_skip_step(which, device):
    # AMP-style: skip the update when any gradient is non-finite
    def step(p, g, lr):
        found_inf = ~torch.isfinite(g).all()
        return torch.cond(found_inf, lambda p, g: p.clone(), lambda p, g: p - lr * g, (p, g))

    g = torch.randn(32, device=device)
    if which:
        g[5] = float("inf")
    check(step, torch.randn(32, device=device), g, 0.1)


# ------------------------------------------------------------------------------ predicates
@pytest.mark.parametrize("n", [3, 9])
def test_cond_predicate_from_symbolic_size(n, device):
    def fn(x):
        return torch.cond(x.shape[0] > 4, lambda t: t.sum(0), lambda t: t.amax(0), (x,))

    graphs = check(fn, torch.randn(n, 6, device=device), compile_kwargs={"dynamic": True})
    assert graphs


def test_cond_symbolic_predicate_one_artifact_for_many_sizes(device):
    def fn(x):
        return torch.cond(x.shape[0] > 4, lambda t: t.sum(0) * 2, lambda t: t.amax(0), (x,))

    compiled = compile_kiln(fn, dynamic=True)
    start = frames()
    with compiler.config.patch(strict=True):
        for n in (2, 3, 5, 8, 13, 40):
            x = torch.randn(n, 6, device=device)
            assert_close(compiled(x), fn(x))
    assert frames() - start == 1


@pytest.mark.parametrize("which", [True, False])
def test_cond_predicate_is_bool_tensor_input(which, device):
    def fn(pred, x):
        return torch.cond(pred, lambda t: t.cos(), lambda t: t.sin(), (x,))

    check(fn, torch.tensor(which, device=device), torch.randn(10, device=device))


@pytest.mark.parametrize("which", [True, False])
def test_cond_predicate_from_fused_reduction(which, device):
    # the predicate comes from amax over a tensor computed in the same kernel
    def fn(x, y):
        z = x * y
        return torch.cond(z.amax() > 1.0, lambda t: t / t.amax(), lambda t: t.clone(), (z,))

    x = torch.rand(5, 7, device=device) * (4.0 if which else 0.5)
    check(fn, x, torch.rand(5, 7, device=device))


def test_cond_under_dynamic_shapes_no_recompile(device):
    def fn(x):
        return torch.cond(
            x.sum() > 0, lambda t: t.softmax(-1), lambda t: (t * t).sum(-1, keepdim=True) + t, (x,)
        )

    compiled = compile_kiln(fn, dynamic=True)
    start = frames()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        for n in (3, 6, 11, 20, 33):
            for which in (True, False):
                x = signed(which, n, n + 1, device=device)
                assert_close(compiled(x), fn(x))
    assert frames() - start == 1
    assert len(graphs) == 1


def test_two_sequential_conds(device):
    def fn(x):
        a = torch.cond(x[0] > 0, lambda t: t + 1, lambda t: t - 1, (x,))
        return torch.cond(a[1] > 0, lambda t: t * 2, lambda t: t * 3, (a,))

    for v0 in (1.0, -1.0):
        for v1 in (5.0, -5.0):
            torch._dynamo.reset()
            x = torch.tensor([v0, v1, 0.5], device=device)
            graphs = check(fn, x)
            assert sum(g.code.count("higher_order.cond") for g in graphs) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cond_low_precision(dtype, device):
    def fn(x):
        return torch.cond(x.float().sum() > 0, lambda t: F.silu(t), lambda t: t * t, (x,))

    for which in (True, False):
        check(fn, signed(which, 8, 8, device=device).to(dtype))


def test_cond_branch_fallback_reason_is_recorded(device):
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: torch.sort(t, dim=-1)[0], lambda t: t * 2, (x,))

    for which in (True, False):
        graphs = check(fn, signed(which, 3, 5, device=device))
        assert_fallback(graphs, "aten.sort")


# ------------------------------------------------------------------------------ backward through cond
@pytest.mark.parametrize("which", [True, False])
def test_cond_backward_matches_eager(which, device):
    w = torch.randn(6, 6, device=device, requires_grad=True)

    def fn(x):
        out = torch.cond(x.sum() > 0, lambda t: torch.tanh(t @ w), lambda t: (t * t) @ w, (x,))
        return out.pow(2).mean()

    x = signed(which, 4, 6, device=device).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    gx_ref, gw_ref = torch.autograd.grad(fn(x_ref), (x_ref, w))
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        gx, gw = torch.autograd.grad(compile_kiln(fn)(x), (x, w))
    assert_close((gx, gw), (gx_ref, gw_ref), rtol=1e-4, atol=1e-5)
    assert len(graphs) == 2  # forward and backward
    assert all("higher_order.cond" in g.code for g in graphs)


# ------------------------------------------------------------------------------ while_loop
def test_while_loop_counter_compiled(device):
    def fn(i, x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2 + 1), (i, x))

    graphs = check(fn, torch.tensor(0, device=device), torch.randn(4, device=device))
    assert any("higher_order.while_loop" in g.code for g in graphs)
    subs = [s for g in graphs for s in g.subgraphs]
    assert len(subs) == 2 and all(s.kernel_count >= 1 for s in subs)


def test_while_loop_data_dependent_trip_count(device):
    # halve until the norm is small: the trip count depends on the data
    def fn(x):
        return while_loop(lambda x: x.norm() > 1.0, lambda x: (x * 0.5,), (x,))

    for scale in (0.1, 3.0, 100.0):
        check(fn, torch.randn(16, device=device) * scale)


def test_while_loop_with_constant_init(device):
    def fn(x):
        i0 = torch.zeros((), dtype=torch.int64, device=x.device)
        return while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, s + s.softmax(-1)), (i0, x))

    check(fn, torch.randn(3, 8, device=device))


def test_while_loop_newton_sqrt(device):
    # Newton's iteration for sqrt, a fixed number of steps carried in the loop state
    def fn(a):
        def body(i, y):
            return i + 1, 0.5 * (y + a / y)

        return while_loop(lambda i, y: i < 8, body, (torch.tensor(0, device=a.device), torch.ones_like(a)))[1]

    a = torch.rand(10, device=device) * 9 + 1
    check(fn, a, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ graph breaks
@pytest.mark.parametrize("which", [True, False])
def test_graph_break_on_data_dependent_python_if(which, device):
    def fn(x):
        y = x * 2
        if y.sum() > 0:  # data-dependent Python control flow: Dynamo breaks the graph here
            return torch.relu(y) + 1
        return y.softmax(-1)

    check(fn, signed(which, 4, 6, device=device))


def test_compiled_step_in_python_loop_with_early_exit(device):
    # the data-dependent exit stays in Python; the compiled step is reused at every iteration
    def step(x):
        return x * 0.5 + torch.tanh(x) * 0.1

    def loop(x, fn):
        for _ in range(8):
            x = fn(x)
            if x.abs().max() < 0.5:
                break
        return x

    compiled = compile_kiln(step)
    start = frames()
    with compiler.config.patch(strict=True):
        for scale in (0.1, 10.0):
            x = torch.randn(3, 4, device=device) * scale
            assert_close(loop(x, compiled), loop(x, step))
    assert frames() - start == 1


def test_python_if_on_shape_specializes_correctly(device):
    def fn(x):
        if x.shape[-1] > 8:
            return x.softmax(-1)
        return x.log_softmax(-1)

    compiled = compile_kiln(fn)
    with compiler.config.patch(strict=True):
        for n in (4, 16, 6, 32):
            x = torch.randn(3, n, device=device)
            assert_close(compiled(x), fn(x))


def test_torch_where_as_branchless_select(device):
    # the branch-free rewrite of a cond: both sides in one fused kernel
    def fn(x):
        return torch.where(x > 0, torch.log1p(x), torch.expm1(x))

    graphs = check(fn, torch.randn(50, device=device))
    assert kernels(graphs) == 1
