"""Upcasts of values their narrow type holds exactly (kexpr.holds_exactly): an fp32 upcast of a bf16/fp16 value
that several kernels read stays inline when it reads at most graph.RECOMPUTE_MAX_READS tensors, is stored in
the narrow type and widened on each read when it reads more (GraphLowering._realize_narrow), and is stored as
computed when the narrow type does not hold it."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F

import compiler
from compiler.kexpr import Const, Load, Op, cast, holds_exactly

BF16, F32 = torch.bfloat16, torch.float32
IDX = sympy.Symbol("i", integer=True, nonnegative=True)


def _load(dtype: torch.dtype, buffer: str = "a") -> Load:
    return Load(buffer, IDX, dtype, buffer_dtype=dtype)


def _up(x):
    return cast(x, F32)


A, B = _up(_load(BF16, "a")), _up(_load(BF16, "b"))
COND = Op("le", (A, Const(0.0, F32)), torch.bool)

EXACT = [
    ("a bf16 read", _load(BF16)),
    ("its upcast", A),
    ("relu gradient", Op("where", (COND, Const(0.0, F32), B), F32)),
    ("negation", Op("neg", (A,), F32)),
    ("max of two reads", Op("maximum", (A, B), F32)),
    ("a constant bf16 holds", Const(-2.5, F32)),
    ("nan", Const(float("nan"), F32)),
    ("narrowed back", cast(Op("abs", (A,), F32), BF16)),
]
INEXACT = [
    ("a sum", Op("add", (A, B), F32)),
    ("a where over a product", Op("where", (COND, A, Op("mul", (A, B), F32)), F32)),
    ("an fp32 read", _load(F32)),
    ("a constant bf16 rounds", Const(0.1, F32)),
    ("an fp16 read", _up(_load(torch.float16))),
    ("a bool cast", cast(COND, F32)),
]


@pytest.mark.parametrize("name, expr", EXACT, ids=[c[0] for c in EXACT])
def test_exact_values(name, expr):
    assert holds_exactly(expr, BF16)


@pytest.mark.parametrize("name, expr", INEXACT, ids=[c[0] for c in INEXACT])
def test_inexact_values(name, expr):
    assert not holds_exactly(expr, BF16)


def _allocations(cg) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every buffer the wrapper allocates."""
    out = []
    for n in cg.wrapper.graph.nodes:
        if n.op == "call_function" and "empty_strided" in getattr(n.target, "__name__", str(n.target)):
            out.append((tuple(n.args[0]), n.args[2]))
    return out


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-12))


def _as_close_as_eager(got, eager, ref64) -> None:
    """Each of kiln's results is as close to the fp64 result as eager's (within a factor of two, or 1e-3)."""
    for k, e, r in zip(got, eager, ref64):
        assert _rel_err(k, r) <= 2 * _rel_err(e, r) + 1e-3, (_rel_err(k, r), _rel_err(e, r))


def _fp64(fn, inputs):
    out = fn(*[t.double() for t in inputs])
    return [o.double() for o in out]


def _compile(fn, inputs):
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        got = torch.compile(fn, backend="kiln")(*inputs)
    return got, graphs[-1]


def _stats(d, x, m):
    """The shape of AOTAutograd's BatchNorm backward: the upcast gradient ``d`` read by both column sums and
    by the input gradient."""
    s1, s2 = d.sum(0), (d * (x.float() - m)).sum(0)
    return s1, s2, (d - s1 * (x.float() - m) * s2).to(torch.bfloat16)


def relu_grad_stats(r, g, x, m):
    """After a ReLU: the gradient selected by the mask (two tensors read)."""
    return _stats(torch.where(r <= 0, torch.zeros_like(g), g).float(), x, m)


def max_grad_stats(r, g, x, m):
    """A selection that reads three tensors."""
    return _stats(torch.where(r <= 0, torch.zeros_like(g), torch.maximum(g, x)).float(), x, m)


def residual_grad_stats(r, g, x, m):
    """After a residual add: the gradient is a sum, which bf16 does not hold exactly."""
    return _stats(torch.where(r <= 0, torch.zeros_like(g), g + x).float(), x, m)


def _inputs(rows: int, cols: int, device: str):
    gen = torch.Generator().manual_seed(0)
    bf = [torch.randn(rows, cols, generator=gen).to(BF16).to(device) for _ in range(3)]
    return (*bf, torch.randn(cols, generator=gen).to(device))


@pytest.mark.parametrize(
    "fn, stored",
    [(relu_grad_stats, []), (max_grad_stats, [BF16]), (residual_grad_stats, [F32])],
    ids=["two_reads_inline", "three_reads_stored_narrow", "inexact_stored_fp32"],
)
def test_where_the_upcast_gradient_lives(device, fn, stored):
    """Buffers of the gradient's shape: the bf16 input gradient, and the upcast gradient's own buffer where
    it is stored (in the type the case names); every result as close to fp64 as eager's."""
    inputs = _inputs(2048, 32, device)
    got, cg = _compile(fn, inputs)
    rows = sorted((dt for shape, dt in _allocations(cg) if shape == (2048, 32)), key=str)
    assert rows == sorted([BF16, *stored], key=str), _allocations(cg)
    _as_close_as_eager(got, fn(*inputs), _fp64(fn, inputs))


def test_batch_norm_relu_backward_matches_eager_in_bf16(device):
    """A BatchNorm + ReLU + 1x1 convolution training step in bf16, channels-last (a ResNet layer: the backward
    reads the saved ReLU output and the convolution's input gradient): no activation-sized fp32 buffer in
    the backward, gradients as close to fp64 as eager's."""
    gen = torch.Generator().manual_seed(1)
    cw = torch.randn(16, 16, 1, 1, generator=gen).to(BF16).to(device)

    def block(x, w, b):
        return F.conv2d(F.relu(F.batch_norm(x, None, None, w, b, training=True)), cw.to(x.dtype))

    x = torch.randn(8, 16, 12, 12, generator=gen).to(BF16).to(device).to(memory_format=torch.channels_last)
    w = torch.rand(16, generator=gen).to(BF16).to(device) + 0.5
    b = torch.randn(16, generator=gen).to(BF16).to(device)
    xs = [t.detach().requires_grad_(True) for t in (x, w, b)]
    go = torch.randn(8, 16, 12, 12, generator=gen).to(BF16).to(device).to(memory_format=torch.channels_last)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(block, backend="kiln")(*xs)
        got = torch.autograd.grad(out, xs, go)
    eager = torch.autograd.grad(block(*xs), xs, go)
    x64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    ref64 = torch.autograd.grad(block(*x64), x64, go.double())
    backward = graphs[-1]
    big = [dt for shape, dt in _allocations(backward) if len(shape) == 4 and shape[0] == 8]
    assert F32 not in big, _allocations(backward)
    _as_close_as_eager(got, eager, ref64)
