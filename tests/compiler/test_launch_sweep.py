"""``python -m compiler.tools.launch_sweep``: its cases, and its refusal without a GPU."""

import pytest
import torch

from compiler.tools import launch_sweep


def test_the_adamw_case_updates_the_model_tiers_gpt2_parameters():
    """The ``adamw`` case's tensors are the model tier's ``gpt2.opt_adamw`` row's: the parameters of its
    GPT-2 (built on the meta device: shapes only), in order."""
    transformers = pytest.importorskip("transformers")
    from harness.bench.models import catalog

    cfg = transformers.GPT2Config(**catalog._GPT2_GPU)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    want = [tuple(p.shape) for p in model.parameters()]
    assert launch_sweep._gpt2_shapes() == want
    assert len(want) == 52


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_stops_with_one_line(capsys):
    assert launch_sweep.main(["--case", "adamw"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err
