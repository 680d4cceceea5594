"""Outside strict mode a kiln bug never breaks the user's program: it runs as ATen, with a recorded reason."""

import pytest
import torch

import compiler
from compiler import backend
from compiler.exc import KernelLaunchError, KilnError
from compiler.runtime.launcher import TritonKernel


def _broken_schedule(st):
    raise RuntimeError("planted scheduler bug")


def test_graph_compile_error_runs_aten_graph(monkeypatch, device):
    passes = [p._replace(run=_broken_schedule) if p.name == "schedule" else p for p in backend.PASSES]
    monkeypatch.setattr(backend, "PASSES", passes)
    x = torch.randn(4, 8, device=device)
    with compiler.config.patch(strict=False), compiler.capture() as graphs:
        out = torch.compile(lambda x: torch.softmax(x, -1) + 1, backend="kiln")(x)
    torch.testing.assert_close(out, torch.softmax(x, -1) + 1)
    assert [f.kind for f in graphs[0].fallbacks] == ["graph_compile_error"]
    assert "planted scheduler bug" in graphs[0].fallbacks[0].detail


def test_graph_compile_error_raises_in_strict_mode(monkeypatch, device):
    passes = [p._replace(run=_broken_schedule) if p.name == "schedule" else p for p in backend.PASSES]
    monkeypatch.setattr(backend, "PASSES", passes)
    with compiler.config.patch(strict=True), pytest.raises(Exception, match="planted scheduler bug"):
        torch.compile(lambda x: x + 1, backend="kiln")(torch.randn(3, device=device))


def test_first_launch_error_switches_to_aten(monkeypatch, device):
    def broken(self, *args):
        raise KernelLaunchError("planted launch failure")

    monkeypatch.setattr(TritonKernel, "forward", broken)
    x = torch.randn(5, device=device)
    f = torch.compile(lambda x: x.sin() * 2, backend="kiln")
    with compiler.config.patch(strict=False), compiler.capture() as graphs:
        first = f(x)
        second = f(x)
    torch.testing.assert_close(first, x.sin() * 2)
    torch.testing.assert_close(second, x.sin() * 2)
    assert [r.kind for r in graphs[0].fallbacks] == ["graph_launch_error"]


def test_kiln_error_is_a_single_base_class():
    assert issubclass(KernelLaunchError, KilnError)


@pytest.mark.parametrize(
    "fn, make",
    [
        (lambda x: (x * 2).abs() + 1, lambda d: torch.randn(4, dtype=torch.complex64, device=d)),
        (lambda x: x.to(torch.float8_e4m3fn).float() * 2, lambda d: torch.randn(4, device=d)),
    ],
    ids=["complex", "float8"],
)
def test_unsupported_dtypes_fall_back_per_op(device, fn, make):
    x = make(device)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(x)
    torch.testing.assert_close(out, fn(x))
    assert {r.kind for r in graphs[0].fallbacks} == {"dtype"}


def test_cpu_scalar_tensors_join_device_kernels(device):
    """``torch.tensor(2.0)`` is a CPU tensor even in a GPU program: it is copied over once, and the op still
    lowers (no fallback); on CPU it is an ordinary input."""
    x = torch.randn(6, 4, device=device)

    def fn(x):
        y = x * torch.tensor(2.0) + 1
        y[1:3] = 0
        return y.relu()

    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(x)
    torch.testing.assert_close(out, fn(x))
    assert [r for r in graphs[0].fallbacks if r.op != "aten.lift_fresh_copy.default"] == []


def test_attention_backward_matches_eager(device):
    """scaled_dot_product_attention keeps its ATen kernel pair, so forward and backward agree on what is saved."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(2, 4, 8, 16, device=device, requires_grad=True) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q * 2, k, v.relu(), is_causal=True)

    with compiler.config.patch(strict=True):
        torch.compile(fn, backend="kiln")(q, k, v).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).sum().backward()
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)


def test_fallback_inputs_keep_eager_layout_and_outputs_are_restrided(device):
    """An ATen fallback gets its inputs laid out as in eager (its output strides follow them), and a result
    whose real strides differ from the FakeTensor's is copied into the expected layout."""
    import torch.nn as nn

    from compiler.runtime.restride import ensure_strides

    attn = nn.MultiheadAttention(32, 4, batch_first=True).to(device)
    x = torch.randn(2, 8, 32, device=device)
    fn = lambda a: attn(a, a, a, need_weights=False)[0]  # noqa: E731
    with compiler.config.patch(strict=True):
        out = torch.compile(fn, backend="kiln")(x)
    torch.testing.assert_close(out, fn(x), atol=1e-5, rtol=1e-5)

    t = torch.randn(3, 4, device=device)
    assert ensure_strides(t, (4, 1)) is t
    moved = ensure_strides(t, (1, 3))
    assert moved.stride() == (1, 3) and torch.equal(moved, t)
