"""``compiler.tools.sweeps``: a failing variant is a cell, bad arguments stop with one line."""

import pytest
import torch

from compiler.tools import sweeps


def test_a_failing_variant_is_an_error_cell_and_the_rest_are_microseconds():
    def boom() -> float:
        raise AssertionError("differs from eager")

    assert sweeps.timed_cell(boom) == "error: AssertionError"
    assert sweeps.timed_cell(lambda: 12.345) == "12.3"


def test_bad_cases_or_values_stop_with_one_line(capsys):
    assert sweeps.check_args("s", "a,z", ["a", "b"], "--n", "1") is None
    err = capsys.readouterr().err
    assert err == "s: unknown case(s) z; known: a, b\n"
    assert sweeps.check_args("s", "a", ["a"], "--n", "1,x") is None
    assert capsys.readouterr().err == "s: --n must be integers, got '1,x'\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_good_arguments_still_need_a_gpu(capsys):
    assert sweeps.check_args("s", "a", ["a"], "--n", "1,2") is None
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_table_is_markdown(capsys):
    sweeps.print_head(["case", "x"])
    sweeps.print_row(["a", "1.0"])
    assert capsys.readouterr().out == "| case | x |\n|---|---|\n| a | 1.0 |\n"
