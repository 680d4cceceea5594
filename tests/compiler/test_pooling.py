"""``max_pool2d_with_indices`` lowered to a pointwise kernel over its window (``compiler/lowering/pooling.py``)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import compiler


def _compiled(fn, *args):
    torch._dynamo.reset()
    compiler.register()
    with compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    return out, [r for g in graphs for r in g.all_fallbacks()]


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation,ceil_mode",
    [
        (3, 2, 1, 1, False),
        (2, 2, 0, 1, False),
        (3, 1, 1, 1, False),
        (3, 2, 1, 2, False),
        (3, 2, 0, 1, True),
        ((2, 3), (1, 2), (1, 0), 1, False),
    ],
)
def test_values_and_indices_match_eager(kernel, stride, padding, dilation, ceil_mode):
    """Values and argmax indices as eager's, NaN and ties included (a NaN wins its windows; of equal values
    the first tap in row-major window order)."""

    def f(x):
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)

    x = torch.randn(2, 3, 11, 10)
    x[0, 0, 2, 3] = float("nan")
    x[1, 1, 4, :] = 0.5  # ties along a row
    (v, i), fallbacks = _compiled(f, x)
    ev, ei = f(x)
    torch.testing.assert_close(v, ev, equal_nan=True)
    assert torch.equal(i, ei)
    assert not [r for r in fallbacks if "max_pool" in str(r.op)]


def test_a_resnet_stem_fuses_the_pool_and_trains():
    """Conv, batch norm, ReLU and a 3x3/2 max pool on a channels-last input: no pooling in ATen, forward or
    backward, and the gradients match eager's. The conv has no bias, as in ResNet: ahead of batch norm a bias's
    gradient is zero up to rounding, which no tolerance relative to it can compare."""
    torch.manual_seed(0)
    stem = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),
    ).to(memory_format=torch.channels_last)
    ref = copy.deepcopy(stem)
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    compiler.register()
    with compiler.capture() as graphs:  # the backward graph compiles at the first backward call
        y = torch.compile(stem, backend="kiln")(x)
        y.sum().backward()
    assert not [r for g in graphs for r in g.all_fallbacks() if "max_pool" in str(r.op)]
    want = ref(x)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    want.sum().backward()
    for p, q in zip(stem.parameters(), ref.parameters()):
        scale = float(q.grad.abs().max())
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4 * max(scale, 1e-3))


def test_a_large_window_stays_with_aten_with_its_reason():
    def f(x):
        return F.max_pool2d(x, 7, 1, 3)

    x = torch.randn(1, 2, 9, 9)
    y, fallbacks = _compiled(f, x)
    torch.testing.assert_close(y, f(x))
    assert any("7x7 pooling window" in r.detail for r in fallbacks)


@pytest.mark.parametrize(
    "kernel,stride,padding,ceil_mode",
    [(3, 2, 1, False), (2, 2, 0, False), (3, 1, 1, False), (3, 2, 0, True), ((2, 3), (1, 2), (1, 0), False)],
)
def test_backward_matches_eager(kernel, stride, padding, ceil_mode):
    """The input gradient sums the output gradients routed by the indices, overlapping windows (stride 1: one
    input element picked by several outputs) and ties included, with no ATen pooling backward left."""

    def f(x, w):
        return (F.max_pool2d(x, kernel, stride, padding, 1, ceil_mode) * w).sum()

    x = torch.randn(2, 3, 11, 10)
    x[1, 1, 4, :] = 0.5
    w = torch.randn_like(F.max_pool2d(x, kernel, stride, padding, 1, ceil_mode))
    xc = x.clone().requires_grad_()
    torch._dynamo.reset()
    compiler.register()
    with compiler.capture() as graphs:  # the backward graph compiles at the first backward call
        torch.compile(f, backend="kiln")(xc, w).backward()
    fallbacks = [r for g in graphs for r in g.all_fallbacks()]
    assert len(graphs) >= 2
    xe = x.clone().requires_grad_()
    f(xe, w).backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert not [r for r in fallbacks if "max_pool" in str(r.op)]


def _stem_block(x, w_stem, w1, mean, var):
    """BN + ReLU + pool after a stem conv, the pool read by a conv and by a residual add (ResNet's layer 1)."""
    y = F.relu(F.batch_norm(F.conv2d(x, w_stem, stride=2, padding=3), mean, var, training=False))
    p = F.max_pool2d(y, 3, 2, 1)
    return F.relu(F.conv2d(p, w1, padding=1) + p)


def test_a_pool_read_by_two_consumers_is_computed_once_and_its_batch_norm_once_per_element():
    """The pooled value feeds a conv (an extern: realized) and an add: the add reads that buffer instead of
    recomputing the window (9 taps of BN + ReLU over the stem's output), and in the pool's own kernel the
    batch norm's per-channel loads are not masked per tap, so its square root is emitted once, not nine times."""
    torch.manual_seed(0)
    args = (
        torch.randn(2, 3, 32, 32),
        torch.randn(8, 3, 7, 7),
        torch.randn(8, 8, 3, 3),
        torch.randn(8),
        torch.rand(8) + 0.5,
    )
    torch._dynamo.reset()
    with compiler.capture() as graphs, torch.no_grad():
        out = torch.compile(_stem_block, backend="kiln")(*args)
    torch.testing.assert_close(out, _stem_block(*args), rtol=1e-4, atol=1e-4)
    sources = [s for g in graphs for s in g.kernel_sources.values()]
    pools = [s for s in sources if "PropagateNan.ALL" in s]  # the window's NaN-propagating maximum
    assert len(pools) == 1, "the window is computed in one kernel only"
    assert pools[0].count("sqrt") == 1


def test_the_argmax_chain_is_emitted_once_per_node(monkeypatch):
    """The argmax of a 3x3 window is a chain in which each tap's running best is read twice (the comparison
    and the select): the renderer emits each expression node once per scope; walked as a tree, the chain is
    re-emitted once per path to each node (38343 emissions for this graph, against 397 as a DAG)."""
    from compiler.codegen import triton_kernel

    calls = 0
    emit = triton_kernel.Scope._emit

    def counting(self, e):
        nonlocal calls
        calls += 1
        return emit(self, e)

    monkeypatch.setattr(triton_kernel.Scope, "_emit", counting)
    monkeypatch.setenv("KILN_CACHE", "0")

    def f(x):
        return torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])

    x = torch.randn(2, 3, 9, 9)
    (values, indices), _ = _compiled(f, x)
    want_values, want_indices = f(x)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    assert 0 < calls < 1000, calls


@pytest.mark.parametrize("n", [16, 1, 2, "s", "s+2", "2s"])
@pytest.mark.parametrize("i", ["2x-1", "2x", "2x+1", "3x-3", "x", "3", "-2", "40", "0", "xs-1", "x+s-2"])
def test_a_tap_index_clamps_as_sympy_evaluates_it(i, n):
    """A tap's index clamped into [0, n) is built without sympy's Min/Max evaluation (its assumption queries
    cost milliseconds per tap) and equals what that evaluation gives on window indices and sizes."""
    import sympy

    from compiler.lowering.pooling import _clamp

    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    s = sympy.Symbol("s1", integer=True, positive=True)
    names = {"x": x, "s": s}
    ii = sympy.sympify(i.replace("xs", "x*s").replace("2x", "2*x").replace("3x", "3*x"), locals=names)
    nn = sympy.sympify(str(n).replace("2s", "2*s"), locals=names)
    assert _clamp(ii, nn) == sympy.Min(sympy.Max(ii, 0), nn - 1)
