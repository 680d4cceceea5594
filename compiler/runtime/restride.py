"""Run-time guard for ATen fallback outputs, and the C view helper the wrapper and CUDA graphs use.

Kernels that read a fallback's output were compiled for the strides its FakeTensor had. A real kernel may
choose other strides (some CPU and vendor kernels do); then the output is copied into the expected layout
before anything reads it. When the strides agree, which is the usual case, it is returned as is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: Dynamo's C view helper ``(base, size, stride, offset relative to base's own)``, or None in a torch without it;
#: the wrapper calls it directly on buffers it allocated (storage offset 0: the relative offset is the offset)
reinterpret_c: Callable | None = getattr(torch._C._dynamo.guards, "_reinterpret_tensor", None)

_reinterpret: Callable = reinterpret_c or (
    lambda t, size, stride, increment: t.as_strided(size, stride, t.storage_offset() + increment)
)


def reinterpret_tensor(
    base: torch.Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int
) -> torch.Tensor:
    """``base.as_strided(size, stride, storage_offset)`` (the offset counts from the storage's start, as in
    ``as_strided``) through Dynamo's C helper, which takes an offset *relative to base's own offset*: a fifth
    of the host time of ``aten.as_strided``."""
    return _reinterpret(base, size, stride, storage_offset - base.storage_offset())


def alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object over exactly ``t``'s memory (size, strides and offset kept)."""
    return _reinterpret(t, t.size(), t.stride(), 0)


def ensure_strides(t: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``t`` when every dim longer than 1 has the expected stride, else a copy with exactly ``stride``."""
    if not isinstance(t, torch.Tensor):
        return t
    have = t.stride()
    if have == stride:  # the usual case, one tuple comparison
        return t
    if all(size <= 1 or have == want for size, have, want in zip(t.shape, have, stride)):
        return t
    out = torch.empty_strided(t.shape, tuple(stride), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
