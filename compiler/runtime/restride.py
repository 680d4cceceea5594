"""Run-time guard for ATen fallback outputs.

Kernels that read a fallback's output were compiled for the strides its FakeTensor had. A real kernel may
choose other strides (some CPU and vendor kernels do); then the output is copied into the expected layout
before anything reads it. When the strides agree, which is the usual case, it is returned as is.
"""

from __future__ import annotations

from typing import Sequence

import torch


def ensure_strides(t: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``t`` when every dim longer than 1 has the expected stride, else a copy with exactly ``stride``."""
    if not isinstance(t, torch.Tensor):
        return t
    if all(size <= 1 or have == want for size, have, want in zip(t.shape, t.stride(), stride)):
        return t
    out = torch.empty_strided(t.shape, tuple(stride), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
