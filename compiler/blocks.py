"""Block-size arithmetic shared by the scheduler, the code generator and the launcher.

Triton blocks are powers of two: a dimension of ``n`` elements takes a block of ``next_pow2(n)`` lanes, and a
grid over ``n`` elements in blocks of ``b`` has ``cdiv(n, b)`` programs. ``tile_accumulators`` is the one place
that decides the accumulator form of a mixed row/column kernel (``Scheduler.mix_column_partials``): the code
generator writes that form and the launcher sizes its steps for it, so both must ask the same question.
"""

from __future__ import annotations

from . import config


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n`` <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceil-division with integer ops only."""
    return (a + b - 1) // b


def tile_accumulators(rnumel: int) -> bool:
    """Whether a mixed row/column kernel with rows of ``rnumel`` elements keeps its column partial sums in full
    ``XBLOCK x RBLOCK`` tiles (``config.mix_tile_acc_cols``: rows whose block is at most that many elements)
    rather than one-row accumulators."""
    limit = config.settings().mix_tile_acc_cols
    return bool(limit) and next_pow2(rnumel) <= limit
