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
