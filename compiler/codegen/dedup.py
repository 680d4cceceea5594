"""One kernel per distinct body within a graph: kernels that differ only in their name and comments share
the first one's name and source.

A kernel's name carries the op it came from and a hash of its text, and its text names the buffers it was
rendered for (``# in_ptr0 -> buf12``). The layers of a transformer render the same kernel once per layer
under different names, and Triton compiles each name separately (its cache key hashes the function's text,
comments included): a 12-layer model compiled every per-layer kernel 12 times. Sharing is safe: the code of
the kernels is identical, parameters included; each launch still passes its own buffers and sizes (a
duplicate keeps its own ``ptr_args``, sizes and stores). The shared source's buffer comments are those of
the first kernel.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from .triton_kernel import KernelSource

_COMMENT_LINE = re.compile(r"^\s*#.*\n", re.MULTILINE)


def body_key(ks: KernelSource) -> tuple:
    """What makes two kernels the same: the text without comment lines and with the name neutral, plus
    the launch facts the launcher's heuristics read."""
    text = _COMMENT_LINE.sub("", ks.source).replace(ks.name, "KERNEL_NAME")
    return text, ks.reduction, ks.hint, ks.programs


def share_identical(kernels: Sequence[KernelSource]) -> list[KernelSource]:
    """``kernels`` (in launch order) with every duplicate renamed to its first occurrence."""
    first: dict[tuple, KernelSource] = {}
    out: list[KernelSource] = []
    for ks in kernels:
        seen = first.setdefault(body_key(ks), ks)
        out.append(ks if seen is ks else dataclasses.replace(ks, name=seen.name, source=seen.source))
    return out
