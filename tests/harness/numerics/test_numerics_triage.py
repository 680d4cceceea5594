"""Numerics triage end to end on the CPU: planted errors are named exactly, the closer side is found, and
real kiln runs (Triton interpreter) are compared with eager and fp64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from numerics_helpers import harness, planted, save

from harness.numerics import compare as cmp
from harness.numerics import reference, report
from harness.numerics.compare import fmt
from harness.numerics.comparison import Closer
from harness.numerics.program import resolve
from harness.numerics.records import ProgramKind

SHAPE = (64, 64)
#: planted larger errors (+1.0): flat positions in the 64x64 bf16 output of bf16_chain
BIG = [7, 2222, 3333]


def _multi(flat: list[int]) -> list[list[int]]:
    return [[f // SHAPE[1], f % SHAPE[1]] for f in sorted(flat)]


@pytest.fixture(scope="module")
def last_bit_positions() -> list[int]:
    """Four elements where eager's bf16 result is within 0.4 ULP of fp64: flipping their last bit makes them
    strictly further from fp64 (at least 0.6 ULP), so the expected 'closer' side is known."""
    prog = resolve("bf16_chain")
    prog.backward = False
    inputs = prog.cpu_inputs(0)
    eager = prog.fn(*inputs.values()).double().reshape(-1).numpy()
    ref = reference.compute(prog, inputs, {})["out"].reshape(-1).numpy()
    ulps = cmp.ulp_error(eager, ref, torch.bfloat16)
    good = np.flatnonzero(ulps < 0.4)
    picks = [int(good[np.searchsorted(good, start)]) for start in (100, 1500, 2900, 4000)]
    assert not set(picks) & set(BIG)
    return picks


def _flip_last_bit(positions: list[int]):
    def change(out: torch.Tensor, call: int) -> torch.Tensor:
        out.view(-1).view(torch.int16)[positions] ^= 1
        return out

    return change


def _add_one(out: torch.Tensor, call: int) -> torch.Tensor:
    out.view(-1)[BIG] += 1.0
    return out


@pytest.fixture(scope="module")
def planted_runs(
    tmp_path_factory: pytest.TempPathFactory, last_bit_positions: list[int]
) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("planted")
    a = save(base / "lastbit", [planted("eager-lastbit", _flip_last_bit(last_bit_positions))])
    b = save(base / "plus-one", [planted("eager-plus-one", _add_one)])
    return a, b


@pytest.mark.needs("matplotlib")  # --plot
def test_compare_names_exactly_the_planted_elements_and_the_closer_side(
    planted_runs, last_bit_positions, tmp_path, capsys
):
    a, b = planted_runs
    rc, out, err = harness(
        capsys,
        "numerics",
        "compare",
        a,
        b,
        "--json",
        tmp_path / "r.json",
        "--md",
        tmp_path / "r.md",
        "--plot",
        tmp_path / "r.png",
    )
    assert rc == 0, err
    rep = report.read_json(tmp_path / "r.json").reports[0]
    assert [o.name for o in rep.outputs] == ["out"]
    o = rep.outputs[0]
    assert (o.compared, o.sampled, o.dtype) == (4096, False, "bfloat16")
    p = o.pairs[0]
    assert (p.a, p.b) == ("A", "B")
    # exactly the planted elements: the +1.0 ones are the mismatches, all planted ones differ in bits
    assert p.mismatched_at == _multi(BIG)
    assert p.differing_at == _multi(BIG + last_bit_positions)
    assert (p.mismatched, p.differing) == (3, 7)
    # which side is closer: A on the +1.0 elements, B (eager bits) on the flipped ones
    assert p.closer_mismatched == Closer(a=3, b=0, tie=0)
    assert p.closer_differing == Closer(a=3, b=4, tie=0)
    # by how much: there, B's error is the planted 1.0 (bf16-rounded), A's under one bf16 ULP (eager rounds thrice)
    err, ulps = p.max_err_mismatched, p.max_ulp_mismatched
    assert 0.9 <= err.b <= 1.1 and err.a < 2**-7 and ulps.a < 1
    assert p.verdict == (
        f"run B is further from fp64 on 3 of 3 mismatched elements; its max error there is "
        f"{fmt(err.b)} vs {fmt(err.a)} for A ({fmt(ulps.b)} vs {fmt(ulps.a)} ULP)"
    )
    # the worst elements are the planted ones, with the input values that produced them (elementwise program)
    x = (
        torch.from_numpy(np.fromfile(a / "inputs" / "x.bin", dtype=np.int16))
        .view(torch.bfloat16)
        .reshape(SHAPE)
    )
    assert sorted(w.at for w in p.worst[:3]) == _multi(BIG)
    for w in p.worst[:3]:
        assert w.closer == "A"
        assert w.inputs["x"] == float(x[tuple(w.at)])
        assert set(w.inputs) == {"x", "y", "z"}
    md = (tmp_path / "r.md").read_text()
    assert p.verdict in md
    assert (
        "mismatched (rtol 0.016, atol 0.016): 3 at " + ", ".join(f"[{i}, {j}]" for i, j in _multi(BIG)) in md
    )
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    # the terminal gets the verdict lines, each side named with its compiler
    assert (
        "run B (eager-plus-one) is further from fp64 on 3 of 3 mismatched elements; its max error there is "
        "1.01 vs 0.00675 for A (eager-lastbit)"
    ) in out


def test_check_fails_on_the_side_further_from_fp64(planted_runs, capsys):
    a, b = planted_runs
    rc, out, _ = harness(capsys, "numerics", "compare", a, b, "--check", "--md", "/dev/null")
    assert rc == 1
    failed = [ln for ln in out.splitlines() if ln.startswith("check failed:")]
    assert len(failed) == 1 and "bf16_chain out: run B max error" in failed[0]
    rc, _, _ = harness(capsys, "numerics", "compare", a, a, "--check", "--md", "/dev/null")
    assert rc == 0


def test_reports_are_deterministic(planted_runs, tmp_path, capsys):
    a, b = planted_runs
    for name in ("1", "2"):
        assert harness(capsys, "numerics", "compare", a, b, "--out", tmp_path / name)[0] == 0
    for f in ("report.md", "report.json"):
        assert (tmp_path / "1" / f).read_text() == (tmp_path / "2" / f).read_text()


def test_nondeterminism_between_repeats_is_reported(tmp_path, capsys):
    def noisy(out: torch.Tensor, call: int) -> torch.Tensor:
        if call % 2 == 0:  # the second execution of each side differs in two elements
            out.view(-1)[[5, 77]] *= 1.5
        return out

    run = save(tmp_path / "noisy", [planted("noisy", noisy), "eager"], repeat=2)
    rc, _out, err = harness(
        capsys, "numerics", "compare", run, "--json", tmp_path / "r.json", "--md", tmp_path / "r.md"
    )
    assert rc == 0, err
    noisy_side, eager_side = report.read_json(tmp_path / "r.json").reports[0].outputs[0].sides
    nd = noisy_side.nondeterminism
    assert nd is not None and (nd.repeats, nd.identical, nd.differing, nd.note) == (2, False, 2, None)
    assert nd.max_abs_diff > 0
    assert eager_side.nondeterminism is not None and eager_side.nondeterminism.identical is True
    assert "**2 differ**" in (tmp_path / "r.md").read_text()


def test_kiln_against_eager_and_fp64_forward_and_backward(tmp_path, capsys):
    """Real kiln on the interpreter: the fused chain rounds once (closer to fp64 than eager's three roundings);
    kiln-emulate rounds like eager, bit for bit; nothing differs between repeats."""
    run = tmp_path / "chain"
    rc, _, err = harness(
        capsys,
        "numerics",
        "run",
        "bf16_chain",
        "--out",
        run,
        "--compilers",
        "eager,kiln,kiln-emulate",
        "--repeat",
        "2",
        "--device",
        "cpu",
    )
    assert rc == 0, err
    rc, _out, err = harness(
        capsys, "numerics", "compare", run, "--json", tmp_path / "r.json", "--md", tmp_path / "r.md"
    )
    assert rc == 0, err
    rep = report.read_json(tmp_path / "r.json").reports[0]
    assert [s.compiler for s in rep.sides] == ["eager", "kiln", "kiln-emulate"]
    assert (rep.sides[1].info.kernels or 0) >= 2  # a forward and a backward kernel at least
    outs = {o.name: o for o in rep.outputs}
    assert sorted(outs) == ["grad.x", "grad.y", "grad.z", "out"]
    for o in outs.values():
        assert all(s.nondeterminism and s.nondeterminism.identical for s in o.sides)
        emulate = o.pairs[1]
        assert emulate.b == "C" and emulate.differing == 0, (o.name, emulate.verdict)
    fwd = outs["out"]
    kiln, eager = fwd.pairs[0], fwd.sides
    assert kiln.differing > 100
    assert kiln.closer_differing.b > 0.9 * kiln.differing
    assert eager[1].mean_abs < eager[0].mean_abs and eager[1].max_ulp <= 0.5 < eager[0].max_ulp


def test_gpu_command_runs_its_programs_on_cpu_sizes(tmp_path, capsys):
    """The lead's command, with the CPU-sized variants of the two GPU programs and two compilers."""
    rc, _out, err = harness(
        capsys,
        "numerics",
        "gpu",
        "--out",
        tmp_path,
        "--programs",
        "attention_small,mlp_small",
        "--compilers",
        "eager,kiln",
        "--device",
        "cpu",
    )
    assert rc == 0, err
    md = (tmp_path / "report.md").read_text()
    assert "# Numerics: `attention_small`" in md and "# Numerics: `mlp_small`" in md
    rep = report.read_json(tmp_path / "report.json").reports
    names = {r.program.ref: [o.name for o in r.outputs] for r in rep}
    assert names["attention_small"] == ["out", "grad.k", "grad.q", "grad.v"]
    assert "grad.w1" in names["mlp_small"] and "grad.ln_w" in names["mlp_small"]
    assert all(s.repeats == 2 for r in rep for s in r.sides)
    assert rep[0].outputs[0].reduction_length == 32


def test_exported_program_runs_under_kiln_and_compares(tmp_path, capsys):
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.lin(x) * 2, -1)

    torch.manual_seed(0)
    pt2 = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(Block(), (torch.randn(4, 16),)), str(pt2))
    rc, _, err = harness(
        capsys,
        "numerics",
        "run",
        pt2,
        "--out",
        tmp_path / "run",
        "--compilers",
        "eager,kiln",
        "--device",
        "cpu",
    )
    assert rc == 0, err
    rc, _, err = harness(
        capsys, "numerics", "compare", tmp_path / "run", "--json", tmp_path / "r.json", "--md", "/dev/null"
    )
    assert rc == 0, err
    rep = report.read_json(tmp_path / "r.json").reports[0]
    assert rep.program.kind is ProgramKind.EXPORT and rep.inputs["x"].shape == [4, 16]
    assert (rep.sides[1].info.kernels or 0) >= 1 and rep.sides[1].info.fallbacks == []
    out = rep.outputs[0]
    assert out.name == "out" and out.pairs[0].mismatched == 0
    assert all(s.max_ulp < 8 for s in out.sides)  # fp32 softmax of a linear: a few ULP of fp64 at most
