"""Indirect indexing lowers into the consuming kernel instead of falling back."""

import pytest
import torch
import torch.nn.functional as F

import compiler


def run(fn, *args):
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    return out, graphs


@pytest.mark.parametrize(
    "name, fn, make",
    [
        (
            "embedding",
            lambda w, i: F.embedding(i, w) * 2,
            lambda d: (torch.randn(20, 8, device=d), torch.randint(0, 20, (4, 5), device=d)),
        ),
        (
            "gather",
            lambda x, i: torch.gather(x, 1, i) + 1,
            lambda d: (torch.randn(4, 10, device=d), torch.randint(0, 10, (4, 3), device=d)),
        ),
        (
            "negative_index",
            lambda x, i: x[i],
            lambda d: (torch.randn(10, 3, device=d), torch.tensor([-1, 0, -10, 4], device=d)),
        ),
        (
            "two_index_tensors",
            lambda x, i, j: x[i, :, j],
            lambda d: (
                torch.randn(5, 3, 7, device=d),
                torch.tensor([0, 4, 2], device=d),
                torch.tensor([6, 0, 1], device=d),
            ),
        ),
        (
            "cross_entropy",
            lambda logits, t: F.cross_entropy(logits, t),
            lambda d: (torch.randn(8, 10, device=d), torch.randint(0, 10, (8,), device=d)),
        ),
    ],
)
def test_indirect_reads_fuse(device, name, fn, make):
    args = make(device)
    out, graphs = run(fn, *args)
    torch.testing.assert_close(out, fn(*args), atol=1e-5, rtol=1e-5)
    assert graphs[0].fallbacks == []
    assert graphs[0].kernel_count >= 1


def test_boolean_mask_index_falls_back_with_reason(device):
    """``x[mask]`` has a data-dependent size: captured in the graph it runs as ATen, with a recorded reason,
    and the unbacked size it produces still reaches the fused kernel that follows."""
    x = torch.randn(6, device=device)
    m = x > 0
    fn = lambda x, m: x[m] * 2  # noqa: E731
    with (
        torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True),
        compiler.config.patch(strict=True),
        compiler.capture() as graphs,
    ):
        out = torch.compile(fn, backend="kiln")(x, m)
    torch.testing.assert_close(out, fn(x, m))
    assert ("unsupported_args", "aten.index.Tensor") in [(r.kind, r.op) for r in graphs[0].fallbacks]
    assert graphs[0].kernel_count == 1


def test_one_hot_scatter_is_pointwise_and_cross_entropy_backward_has_no_fallback(device):
    x, i = torch.randn(4, 6, device=device), torch.randint(0, 6, (4, 1), device=device)
    out, graphs = run(lambda x, i: x.scatter(1, i, 2.5), x, i)
    assert torch.equal(out, x.scatter(1, i, 2.5)) and graphs[0].fallbacks == []
    logits = torch.randn(8, 10, device=device, requires_grad=True)
    target = torch.randint(0, 10, (8,), device=device)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        torch.compile(lambda lg, t: F.cross_entropy(lg, t), backend="kiln")(logits, target).backward()
    grad = logits.grad.clone()
    logits.grad = None
    F.cross_entropy(logits, target).backward()
    torch.testing.assert_close(grad, logits.grad)
    assert [g.fallbacks for g in graphs] == [[], []]


def test_general_scatter_falls_back_with_reason(device):
    x, i = torch.randn(4, 6, device=device), torch.randint(0, 6, (4, 2), device=device)
    out, graphs = run(lambda x, i: x.scatter(1, i, 1.0), x, i)
    assert torch.equal(out, x.scatter(1, i, 1.0))
    assert [r.op for r in graphs[0].fallbacks] == ["aten.scatter.value"]


def test_functionalized_slice_assignment_lowers_without_fallback(device):
    def fn(x):
        y = x * 2
        y[:, 0] += 1
        y[2:5] = 0
        y[::2, 1:] *= -1
        return y

    x = torch.randn(7, 5, device=device)
    out, graphs = run(fn, x)
    torch.testing.assert_close(out, fn(x))
    # (on a GPU the literal 0 is a 0-d CPU tensor constant, which may fall back for its device: allowed)
    assert [r for r in graphs[0].fallbacks if r.kind != "device"] == []
    assert "aten.slice_scatter.default" not in graphs[0].fallback_ops
