"""A hand-written kernel that only Triton's interpreter accepts: it runs as plain Python under
TRITON_INTERPRET=1, but Triton's compiler rejects the `try` statement (line 14) for every target."""

import triton
import triton.language as tl


@triton.jit
def kiln_planted_interp_only(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x
    try:
        y = x + 1.0
    except ValueError:
        y = x
    tl.store(y_ptr + offs, y, mask=mask)
