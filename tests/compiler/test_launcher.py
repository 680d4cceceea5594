"""The launcher: launch configs per size, and (on GPUs) the compiled-kernel fast path per specialization."""

import torch

import compiler
from compiler.runtime.launcher import TritonKernel, cdiv, next_pow2


def test_integer_helpers():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 1000, 1024, 1025)] == [1, 1, 2, 4, 1024, 1024, 2048]
    assert [cdiv(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def _kernel(device):
    with compiler.capture() as graphs:
        torch.compile(lambda x: x * 3 + 1, backend="kiln")(torch.randn(64, device=device))
    return next(m for m in graphs[0].wrapper.children() if isinstance(m, TritonKernel))


def test_reuse_across_sizes_and_misaligned_views(device):
    """Specializations differ for misaligned pointers and odd sizes; each call must compute correctly."""
    k = _kernel(device)
    base = torch.randn(4096 + 7, device=device)
    for n, offset in [(64, 0), (64, 1), (1000, 0), (1000, 3), (64, 0), (17, 5), (1, 0)]:
        x = base[offset:offset + n]
        out = torch.full((n,), float("nan"), device=device)
        k(x, out, n)
        torch.testing.assert_close(out, x * 3 + 1)


def test_zero_elements_launch_nothing(device):
    k = _kernel(device)
    out = torch.empty(0, device=device)
    assert k(torch.empty(0, device=device), out, 0) is None


def test_launch_hook_detection_understands_hook_chains():
    from compiler.runtime.launcher import _hook_set

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not _hook_set(None) and not _hook_set(Chain([]))
    assert _hook_set(Chain([print])) and _hook_set(print)
