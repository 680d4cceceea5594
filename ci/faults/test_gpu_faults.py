"""Planted GPU faults for `ci/gpu_faults.sh` (copied into a scratch project as tests/gpu_faults/; the name
`test_gpu_faults.py` sits outside tests/, so no suite collects it here).

test_segfault kills its process; test_illegal_access leaves the device unusable (a Triton store far out of
bounds: CUDA's error is sticky, every later kernel of that process fails). The tests around them are healthy
and must pass: the ones after the faults in a fresh process, neither failed nor flaky."""

import ctypes

import torch
import triton
import triton.language as tl


@triton.jit
def _store_far(ptr):
    tl.store(ptr + (1 << 40), 1.0)  # a terabyte past the buffer: an illegal address


def _healthy_step():
    a = torch.randn(256, 256, device="cuda")
    torch.testing.assert_close(a @ torch.eye(256, device="cuda"), a)


def test_before():
    _healthy_step()


def test_segfault():
    ctypes.string_at(0)


def test_between():
    _healthy_step()


def test_illegal_access():
    buf = torch.zeros(16, device="cuda")
    _store_far[(1,)](buf)
    torch.cuda.synchronize()


def test_after_matmul():
    _healthy_step()


def test_after_kiln():
    import compiler  # noqa: F401  (registers the backend)

    f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="kiln")
    x = torch.randn(64, 128, device="cuda")
    torch.testing.assert_close(f(x), torch.softmax(x * 2, -1))
