"""Index expressions print as integer Triton arithmetic, deterministically."""

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from compiler.codegen.triton_kernel import pexpr
from compiler.scheduler import XINDEX, decompose

s0 = sympy.Symbol("s0", integer=True, positive=True)


def test_floor_div_and_modular_indexing_use_integer_ops():
    assert pexpr(FloorDiv(XINDEX, s0)) == "(xindex // s0)"
    assert pexpr(ModularIndexing(XINDEX, 4, s0)) == "((xindex // 4) % s0)"
    assert "/" not in pexpr(FloorDiv(XINDEX, 8)).replace("//", "")


def test_linear_index_is_stable():
    e = 3 * XINDEX + s0 * 16 + 7
    assert pexpr(e) == pexpr(sympy.sympify(str(e), locals={"xindex": XINDEX, "s0": s0}))


def test_decompose_row_major_and_unit_dims():
    idx = decompose(XINDEX, [sympy.Integer(4), sympy.Integer(1), sympy.Integer(8)])
    assert idx[1] == 0
    assert idx[0] == FloorDiv(XINDEX, 8)
    assert decompose(XINDEX, [s0]) == [XINDEX]
    assert decompose(XINDEX, [sympy.Integer(5)], numel_is_one=True) == [0]


def test_decompose_hands_out_fresh_lists_of_its_cached_index():
    """``decompose`` is cached per (var, ranges): each caller gets its own list (the scheduler edits them)."""
    ranges = [sympy.Integer(4), s0]
    a = decompose(XINDEX, ranges)
    a[0] = sympy.Integer(99)
    assert decompose(XINDEX, tuple(ranges)) == [FloorDiv(XINDEX, s0), ModularIndexing(XINDEX, 1, s0)]


def test_same_compares_integers_directly_and_expressions_for_every_value():
    from compiler.scheduler import same

    assert same(sympy.Integer(6), 6) and not same(sympy.Integer(6), sympy.Integer(7)) and not same(6, 7)
    assert same(2 * s0, s0 + s0) and same(s0 * (s0 + 1), s0**2 + s0) and not same(s0, s0 + 1)


def test_index_evaluator_computes_what_the_kernel_computes():
    """``index_eval.evaluate`` walks the sympy tree; it agrees with the printed integer arithmetic (``pexpr``)
    evaluated as Python, and refuses what a kernel computes otherwise (``tl.maximum``) or not at all."""
    import numpy as np
    import pytest

    from compiler.index_eval import Unevaluable, evaluate
    from compiler.scheduler import RINDEX

    x = np.arange(40, dtype=np.int64)[:, None]
    r = np.arange(12, dtype=np.int64)[None, :]
    exprs = [
        ModularIndexing(3 * XINDEX + RINDEX, 4, 5) + FloorDiv(XINDEX * 12 + RINDEX, 7) * 2,
        sympy.Mod(XINDEX, 3) * 5 - RINDEX + 100,
        (XINDEX + 1) ** 2,
        sympy.Integer(9),
    ]
    for e in exprs:
        printed = eval(pexpr(e), {"__builtins__": {}, "xindex": x, "rindex": r})  # noqa: S307 - test oracle
        assert np.array_equal(
            np.broadcast_to(evaluate(e, {XINDEX: x, RINDEX: r}), (40, 12)), np.broadcast_to(printed, (40, 12))
        )
    for bad in (sympy.Max(XINDEX, 3), XINDEX / 2, s0 + XINDEX):
        with pytest.raises(Unevaluable):
            evaluate(bad, {XINDEX: x, RINDEX: r})
