"""``python -m compiler.tools.split_sweep``: its cases compile under kiln at every chunk size with eager's
results, the constant it patches moves the split, and it stops with one line on bad input or without a GPU."""

import pytest
import torch

from compiler import config
from compiler.lowering import reductions
from compiler.runtime.launcher import TritonKernel
from compiler.tools import split_sweep


def _partial_rows(fn, xs, chunk: int, monkeypatch) -> set[int]:
    """The reduction launches' xnumel (for a split one: chunks x columns) when ``fn`` compiles at ``chunk``-row
    chunks."""
    seen: set[int] = set()
    forward = TritonKernel.forward

    def recording(self, *args):
        if self.reduction:
            seen.add(int(args[-2]))
        return forward(self, *args)

    monkeypatch.setattr(TritonKernel, "forward", recording)
    monkeypatch.setattr(reductions, "OUTER_SPLIT_CHUNK_ROWS", chunk)
    with config.patch(cache="0"):
        torch._dynamo.reset()
        got = torch.compile(fn, backend="kiln")(*xs)
    monkeypatch.undo()
    assert split_sweep._close(got, fn(*xs))
    return seen


def test_the_chunk_constant_sets_how_many_partial_rows_a_column_sum_writes(monkeypatch):
    fn, xs = split_sweep.make_case("ln3_2048x512_fp32", "cpu")
    # 2048 rows x 512 columns: 2 chunks of 1024 rows, or 16 of 128 (then 512 columns summed once more)
    assert 2 * 512 in _partial_rows(fn, xs, 1024, monkeypatch)
    assert 16 * 512 in _partial_rows(fn, xs, 128, monkeypatch)


def test_every_case_builds_with_the_inputs_its_kind_takes():
    for name, (rows, cols, dtype, kind) in split_sweep.CASES.items():
        if rows * cols > 4_000_000:
            continue  # the large cases allocate hundreds of MB: their builders are the same code
        fn, xs = split_sweep.make_case(name, "cpu")
        mats = [x for x in xs if x.dim() == 2]
        assert all(x.shape == (rows, cols) and x.dtype == dtype for x in mats)
        assert all(x.shape == (cols,) for x in xs if x.dim() == 1)
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        sums = [o for o in outs if o.dim() == 1]
        assert all(o.shape == (cols,) for o in sums) and len(sums) >= 1
        # the bnrelu kind also returns the input gradient, a (rows, cols) tensor
        assert len(outs) - len(sums) == (1 if kind == "bnrelu" else 0)
        assert (len(mats), len(xs) - len(mats)) == {
            "ln3": (3, 0),
            "sum": (1, 0),
            "ln2": (2, 0),
            "bn2": (2, 0),
            "bnrelu": (3, 3),
        }[kind]


def test_bad_arguments_stop_with_one_line(capsys):
    assert split_sweep.main(["--cases", "nope"]) == 2
    assert "unknown case(s) nope" in capsys.readouterr().err
    assert split_sweep.main(["--chunks", "64,x"]) == 2
    assert "--chunks must be integers" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_stops_with_one_line(capsys):
    assert split_sweep.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err
