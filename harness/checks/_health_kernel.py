"""The Triton kernel the health check compiles and runs (imported only after TRITON_INTERPRET is set)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    """out = alpha * x + y over n elements."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


def axpy(x, y, alpha: float):
    """Launch axpy_kernel on x's device; returns a new tensor."""
    import torch

    out = torch.empty_like(x)
    n = x.numel()
    block = 256
    axpy_kernel[(triton.cdiv(n, block),)](x, y, out, alpha, n, BLOCK=block)
    return out
