"""``python -m compiler.tools.mix_sweep``: its cases compile under kiln into a mixed row/column kernel with
eager's results, the count it patches sets the kernel's programs, and it stops with one line on bad input or
without a GPU."""

import pytest
import torch

from compiler import scheduler
from compiler.runtime.launcher import TritonKernel
from compiler.tools import mix_sweep


def _small(name: str, rows: int, monkeypatch) -> tuple:
    """Case ``name`` at ``rows`` rows on the CPU: (function, inputs)."""
    _, cols, kind = mix_sweep.CASES[name]
    monkeypatch.setitem(mix_sweep.CASES, name, (rows, cols, kind))
    return mix_sweep.make_case(name, "cpu")


def _programs(fn, xs, count: int | None, monkeypatch, **kw) -> list[int]:
    """The mixed kernels' program counts when the sweep compiles ``fn`` with ``count`` programs asked (None:
    the rule)."""
    seen: list[int] = []
    forward = TritonKernel.forward

    def recording(self, *args):
        if self.programs:
            seen.append(self.programs)
        return forward(self, *args)

    monkeypatch.setattr(TritonKernel, "forward", recording)
    mix_sweep.compile_kiln(fn, xs, count, **kw)  # raises if a result differs from eager's
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("name", ["bn_100352x64", "ln_6304x768"])
def test_each_kind_compiles_to_one_mixed_kernel_whose_programs_follow_the_patched_count(name, monkeypatch):
    fn, xs = _small(name, 2048, monkeypatch)
    # 2048 rows: 64 programs of 32 rows; 1024 asked are 256 of MIX_MIN_ROWS (8) rows
    assert _programs(fn, xs, 64, monkeypatch) == [64]
    fn, xs = _small(name, 2048, monkeypatch)
    assert _programs(fn, xs, 1024, monkeypatch) == [2048 // scheduler.MIX_MIN_ROWS]


def test_the_gelu_case_stays_unmixed_at_any_count(monkeypatch):
    # rows of 3072 fill three quarters of their 4096 block: scheduler.MIX_MIN_FILL keeps the bias gradient apart
    for count in (64, None):
        fn, xs = _small("gelu_6304x3072", 2048, monkeypatch)
        assert _programs(fn, xs, count, monkeypatch) == []


def test_unmixed_keeps_the_column_sums_apart_and_the_rule_is_back_afterwards(monkeypatch):
    fn, xs = _small("bn_100352x256", 2048, monkeypatch)
    assert _programs(fn, xs, None, monkeypatch, mixed=False) == []
    assert scheduler.mix_programs(2048, 256) == scheduler.MIX_PROGRAMS  # unpatched again
    fn, xs = _small("bn_100352x256", 2048, monkeypatch)
    assert _programs(fn, xs, None, monkeypatch) == [2048 // scheduler.MIX_MIN_ROWS]


def test_the_bnrelu_gradient_is_inline_by_the_rule_and_mixes_only_when_stored(monkeypatch):
    """The masked gradient reads two tensors: the rule and "inline" recompute it (no row kernel to mix into),
    "store" keeps it in bf16 and its column sums mix into that kernel; the constant is restored after each."""
    from compiler import graph

    before = graph.RECOMPUTE_MAX_READS
    for narrow, mixed in (("rule", False), ("inline", False), ("store", True)):
        fn, xs = _small("bnrelu_6272x256", 2048, monkeypatch)
        assert bool(_programs(fn, xs, None, monkeypatch, narrow=narrow)) == mixed, narrow
        assert graph.RECOMPUTE_MAX_READS == before


def test_bad_arguments_stop_with_one_line(capsys):
    assert mix_sweep.main(["--cases", "nope"]) == 2
    assert "unknown case(s) nope" in capsys.readouterr().err
    assert mix_sweep.main(["--programs", "256,x"]) == 2
    assert "--programs must be integers" in capsys.readouterr().err
    assert mix_sweep.main(["--tile-acc-cols", "-1"]) == 2
    assert "--tile-acc-cols must be 0 or more" in capsys.readouterr().err


def test_bf16_row_results_may_round_to_a_neighbouring_value_and_fp32_sums_stay_close():
    rows = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    up = rows + rows * 2**-7  # one bf16 step above each (8 significant bits)
    assert (up != rows).all()
    sums = torch.tensor([100.0, -3.0])
    assert mix_sweep._close((up, sums), (rows, sums))
    assert not mix_sweep._close((rows + 0.125, sums), (rows, sums))  # several steps off
    assert not mix_sweep._close((rows, sums + 0.2), (rows, sums))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_stops_with_one_line(capsys):
    assert mix_sweep.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err
