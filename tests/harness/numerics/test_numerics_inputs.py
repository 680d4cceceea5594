"""Seeded CPU inputs: the same bits for the same spec and seed, special values on request, digests, specs."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from harness.numerics import inputs as inp
from harness.numerics.exc import InputSpecError, ProgramError
from harness.numerics.program import resolve
from harness.numerics.store import sample_indices


def test_spec_text_round_trips():
    spec = inp.parse("x:bf16[8,64] rand scale=2.5 shift=-1 specials=nan,neg0 count=5 grad=0")
    assert (spec.name, spec.shape, spec.dtype, spec.dist, spec.scale, spec.shift) == (
        "x",
        (8, 64),
        "bfloat16",
        "rand",
        2.5,
        -1.0,
    )
    assert (spec.specials, spec.count, spec.grad, spec.wants_grad) == (("nan", "neg0"), 5, False, False)
    assert inp.parse(spec.text()) == spec
    assert inp.parse("i:int64[3] randint low=-4 high=4").wants_grad is False


@pytest.mark.parametrize(
    "text,message",
    [
        ("x[3]", "expected NAME:DTYPE[D0,D1,...] first"),
        ("x:bf17[3]", "unknown dtype 'bf17'"),
        ("x:fp32[3] gauss", "bad token 'gauss'"),
        ("x:fp32[3] specials=denormal", "unknown special value kind(s) denormal"),
        ("i:int32[3] specials=nan", "special values need a floating dtype, not int32"),
        ("x:fp32[3] grad=maybe", "bad token 'grad=maybe'"),
    ],
)
def test_bad_specs_are_refused(text, message):
    with pytest.raises(
        InputSpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        inp.parse(text)


def test_same_spec_and_seed_give_the_same_bits_other_names_other_bits():
    spec = inp.parse("x:bf16[32,16] randn")
    a, b = inp.generate(spec, 3), inp.generate(spec, 3)
    assert inp.digest(a) == inp.digest(b) == hashlib.sha256(a.view(torch.uint8).numpy().tobytes()).hexdigest()
    assert inp.digest(inp.generate(spec, 4)) != inp.digest(a)
    assert inp.digest(inp.generate(inp.parse("y:bf16[32,16] randn"), 3)) != inp.digest(a)
    # each input has its own generator: adding an input changes no other
    one = inp.generate_all([spec], 3)
    two = inp.generate_all([inp.parse("w:fp32[5]"), spec], 3)
    assert torch.equal(one["x"], two["x"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_special_values_are_placed_exactly(dtype):
    name = inp.dtype_name(dtype)
    x = inp.generate(inp.parse(f"x:{name}[16,16] randn specials=all"), 0)
    fi = torch.finfo(dtype)
    v = x.double().reshape(-1)
    smallest_sub = fi.smallest_normal * fi.eps
    assert int(torch.isnan(v).sum()) == 1
    assert int(torch.isposinf(v).sum()) == 1 and int(torch.isneginf(v).sum()) == 1
    assert int((v == fi.max).sum()) == 1 and int((v == -fi.max).sum()) == 1
    assert int((v == smallest_sub).sum()) >= 1 and int((v == -smallest_sub).sum()) >= 1
    assert int(((v.abs() < fi.smallest_normal) & (v != 0)).sum()) >= 3  # subnormals survive the cast
    assert int(((v == 0) & torch.signbit(v)).sum()) == 1  # -0.0
    assert int((v == fi.smallest_normal).sum()) >= 1
    # asking for more elements than values cycles through them
    many = inp.generate(inp.parse(f"x:{name}[16,16] randn specials=nan count=9"), 0)
    assert int(torch.isnan(many).sum()) == 9


def test_specials_on_the_device_copy_keep_their_bits():
    x = inp.generate(inp.parse("x:bf16[64] randn specials=all"), 1)
    moved = x.to("cpu", copy=True)
    assert inp.digest(moved) == inp.digest(x)
    assert torch.equal(
        inp.from_bytes(inp.tensor_bytes(x), x.shape, x.dtype).view(torch.int16), x.view(torch.int16)
    )


def test_cotangents_are_seeded_by_output_name():
    a = inp.cotangent(0, "out", (4, 4), torch.bfloat16)
    assert a.dtype == torch.bfloat16 and torch.equal(a, inp.cotangent(0, "out", (4, 4), torch.bfloat16))
    assert not torch.equal(a, inp.cotangent(0, "out.1", (4, 4), torch.bfloat16))


def test_sample_indices_are_fixed_distinct_and_cover_the_ends():
    idx = sample_indices(10_000_019, 4096)
    assert idx.size == 4096 and np.all(np.diff(idx) > 0)
    assert idx[0] == 0 and idx[-1] == 10_000_018
    assert np.array_equal(idx, sample_indices(10_000_019, 4096))
    even = sample_indices(2**22, 1000)  # a power of two: the multiplier is odd, so still distinct
    assert even.size == 1000 and math.gcd(2_654_435_761, 2) == 1
    assert np.array_equal(sample_indices(10, 50), np.arange(10))


def test_program_refs_resolve(tmp_path):
    assert resolve("harness.numerics.programs:bf16_chain").inputs == resolve("bf16_chain").inputs
    prog = resolve("numerics:softmax[bf16]")
    assert (prog.kind, prog.structure, prog.backward) == ("suite", "rows", False)
    same = resolve("tests/numerics/test_numerics.py::test_error_vs_fp64_not_worse_than_eager[softmax-bf16]")
    assert same.ref == prog.ref
    a, b = prog.cpu_inputs(0), same.cpu_inputs(0)
    assert list(a) == ["arg0"] and a["arg0"].dtype == torch.bfloat16 and torch.equal(a["arg0"], b["arg0"])
    with pytest.raises(ProgramError, match="declares no inputs"):
        resolve("harness.numerics.programs:_attention")
    with pytest.raises(ProgramError, match="only test_error_vs_fp64_not_worse_than_eager"):
        resolve("tests/numerics/test_numerics.py::test_division_by_zero[x]")
