"""Regression tests from realistic programs (losses, norms, training steps) compared with eager."""

import torch
import torch.nn.functional as F

import compiler


def compiled_grads(fn, *args, dynamic=False):
    """Output and input gradients of ``fn(*args).sum()`` under kiln, and the same under eager."""
    results = []
    for compile_it in (True, False):
        leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        f = torch.compile(fn, backend="kiln", dynamic=dynamic) if compile_it else fn
        with compiler.config.patch(strict=True):
            out = f(*leaves)
            out.sum().backward()
        results.append((out.detach(), [a.grad for a in leaves if a.requires_grad]))
    return results


def test_normalize_backward_reads_saved_expand_with_eager_strides(device):
    # the forward saves `norm.clamp_min(eps).expand_as(x)` (stride 0 along the row); the backward was
    # traced against those strides, so the forward must not store it as a dense (rows, cols) buffer
    a, b = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
    fn = lambda a, b: F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T  # noqa: E731
    (out, grads), (ref, ref_grads) = compiled_grads(fn, a, b)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_graph_outputs_keep_eager_strides(device):
    x = torch.randn(4, 6, device=device)
    for fn in (lambda x: (x * 2)[:, ::2], lambda x: (x * 2).sum(-1, keepdim=True).expand(4, 6),
               lambda x: (x + 1).t()):
        out = torch.compile(fn, backend="kiln")(x)
        torch.testing.assert_close(out, fn(x))
        assert out.stride() == fn(x).stride()
