"""compiler.blocks: power-of-two blocks, grid sizes, and the accumulator form of mixed row/column kernels."""

import compiler
from compiler.blocks import cdiv, next_pow2, tile_accumulators
from compiler.runtime.launcher import TritonKernel


def test_integer_helpers():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 1000, 1024, 1025)] == [1, 1, 2, 4, 1024, 1024, 2048]
    assert [cdiv(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_tile_accumulators_follow_the_setting_by_the_rows_block():
    with compiler.config.patch(mix_tile_acc_cols=512):
        assert [tile_accumulators(n) for n in (1, 64, 300, 512, 513, 1024)] == [True] * 4 + [False] * 2
    with compiler.config.patch(mix_tile_acc_cols=0):
        assert not any(tile_accumulators(n) for n in (1, 64, 512))


def test_the_launcher_sizes_a_mixed_kernels_steps_for_the_form_the_code_has():
    """The same rows take full-tile steps (4 warps, 1024 elements) or one-row steps (a program's 8 rows at once,
    8 warps) as the setting flips, so a kernel's code and its launch config never disagree."""
    k = TritonKernel("k", "", [], [], True, "inner", 1024)
    picks = {}
    for limit in (512, 0):
        with compiler.config.patch(mix_tile_acc_cols=limit):
            c = k.heuristic_config(6272, 256, interp=False)
            picks[limit] = (c["XBLOCK"] * c["RBLOCK"], c["num_warps"])
    assert picks == {512: (1024, 4), 0: (2048, 8)}
