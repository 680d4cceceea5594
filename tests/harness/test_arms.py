"""The registry of compiler arms (harness/arms.py): each arm's torch.compile call, what every tier builds from
it, the tiers' defaults, and one error for an unknown name."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness import arms
from harness.exc import UsageError


@pytest.fixture
def compiled(monkeypatch):
    """torch.compile replaced by a recorder: every call's (function, keyword arguments)."""
    calls: list[tuple[object, dict]] = []

    def fake_compile(fn, **kw):
        calls.append((fn, kw))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


EXPECTED = {
    "kiln": {"backend": "kiln"},
    "inductor": {"backend": "inductor"},
    "kiln-cg": {"backend": "kiln", "options": {"cudagraphs": True}},
    "inductor-cg": {"backend": "inductor", "mode": "reduce-overhead"},
    "kiln-emulate": {"backend": "kiln"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_arm_compiles_with_its_torch_compile_arguments(name, compiled):
    def fn(x):
        return x + 1

    arm = arms.get(name)
    assert arm.compile(fn) is fn
    assert compiled == [(fn, EXPECTED[name])]
    assert arm.compile_kwargs(dynamic=False) == {**EXPECTED[name], "dynamic": False}


def test_eager_runs_the_function_as_written(compiled):
    def fn(x):
        return x

    assert arms.get("eager").compile(fn) is fn and compiled == []
    with pytest.raises(ValueError, match="no torch.compile"):
        arms.get("eager").compile_kwargs()


def test_arm_facts():
    a = arms.ARMS
    assert [n for n in a if a[n].kiln] == ["kiln", "kiln-cg", "kiln-emulate", "kiln-autotune"]
    assert [n for n in a if a[n].needs_cuda] == ["kiln-cg", "inductor-cg"] == arms.cuda_graph_arms(list(a))
    assert {n: a[n].peer for n in a} == {
        "eager": "inductor",
        "kiln": "inductor",
        "inductor": "inductor",
        "kiln-cg": "inductor-cg",
        "inductor-cg": "inductor-cg",
        "kiln-emulate": "inductor",
        "kiln-autotune": "inductor",
        "inductor-combo": "inductor",
    }
    assert [n for n in a if a[n].marks_steps] == ["inductor-cg"]
    assert a["kiln-emulate"].settings == {"emulate_eager_precision": True}
    assert all(isinstance(a[n].context(), contextlib.nullcontext) for n in a if n != "kiln-emulate")
    assert a["kiln"].step_hook()() is None
    assert a["inductor-cg"].step_hook() is torch.compiler.cudagraph_mark_step_begin


def test_the_tiers_defaults_are_unchanged():
    assert arms.default("kernel") == "kiln,inductor,eager"
    assert arms.default("model") == "kiln,inductor,kiln-cg,inductor-cg,eager"
    assert arms.default("overhead") == "eager,kiln,inductor,kiln-cg,inductor-cg"
    assert arms.default("numerics") == "kiln,kiln-emulate,inductor,eager"
    assert arms.default("numerics", eager_first=True) == "eager,kiln,kiln-emulate,inductor"


def test_the_autotuned_arm_runs_when_named_and_never_by_default():
    arm = arms.get("kiln-autotune", "model")
    assert arm.compile_kwargs() == {"backend": "kiln", "mode": "max-autotune-no-cudagraphs"}
    assert arms.get("kiln-autotune", "kernel") is arm and "kiln-autotune" not in arms.default("model").split(
        ","
    )
    with pytest.raises(UsageError, match="kiln-autotune runs in the kernel, model tiers"):
        arms.get("kiln-autotune", "numerics")


def test_inductors_combo_kernels_arm_runs_when_named_and_never_by_default():
    """The peer of kiln's combo kernels: Inductor with its ``combo_kernels`` option on, run only when named."""
    import torch._inductor.config as inductor_config

    arm = arms.get("inductor-combo", "model")
    assert arm.compile_kwargs() == {"backend": "inductor", "options": {"combo_kernels": True}}
    assert hasattr(inductor_config, "combo_kernels")  # the option this torch reads
    assert arms.get("inductor-combo", "kernel") is arm and not arm.kiln and arm.peer == "inductor"
    assert "inductor-combo" not in arms.default("model").split(",")
    assert arms.colour("inductor-combo") not in {arms.colour(n) for n in arms.ARMS if n != "inductor-combo"}
    with pytest.raises(UsageError, match="inductor-combo runs in the kernel, model tiers"):
        arms.get("inductor-combo", "numerics")


def test_an_unknown_name_is_one_usage_error_listing_the_known_ones():
    with pytest.raises(UsageError) as e:
        arms.get("tvm")
    assert str(e.value) == (
        "unknown compiler 'tvm' (known: eager, inductor, inductor-cg, inductor-combo, kiln, kiln-autotune, "
        "kiln-cg, kiln-emulate)"
    )
    with pytest.raises(arms.UnknownArm) as e:
        arms.get("kiln-cg", "kernel")
    assert str(e.value) == (
        "unknown compiler 'kiln-cg' (known: eager, inductor, inductor-combo, kiln, kiln-autotune); kiln-cg "
        "runs in the model, overhead tiers"
    )
    with pytest.raises(arms.UnknownArm, match=r"unknown compiler 'tvm9' \(known: .*aot_eager.*\)"):
        arms.check(
            ["kiln", "tvm9"], "kernel", any_backend=True
        )  # (tvm is a registered torch.compile backend)


def test_a_registered_backend_is_a_plain_arm_where_a_tier_takes_any(compiled):
    assert [a.name for a in arms.check(["aot_eager", "kiln", "aot_eager"], "model", any_backend=True)] == [
        "aot_eager",
        "kiln",
    ]
    arm = arms.get("aot_eager", "kernel", any_backend=True)
    arm.compile(len, dynamic=False)
    assert compiled == [(len, {"backend": "aot_eager", "dynamic": False})]
    with pytest.raises(arms.UnknownArm):
        arms.get("aot_eager", "overhead")


def test_every_tier_builds_from_the_registry(compiled):
    from harness.bench.kernels import execute, overhead
    from harness.bench.models import run as model_run
    from harness.numerics import capture

    def fn(x):
        return x

    execute.compile_fn(fn, "inductor")  # the kernel tier: a private copy, dynamic=False
    ((clone, kw),) = compiled
    assert (
        clone is not fn
        and clone.__code__ is not fn.__code__
        and kw == {"backend": "inductor", "dynamic": False}
    )
    assert execute.compile_fn(fn, "eager") is fn
    with pytest.raises(UsageError, match="unknown compiler 'kiln-cg'"):
        execute.check_compilers(["kiln-cg"])

    compiled.clear()
    out, notes = model_run.check_compilers(["inductor-cg", "kiln-cg", "kiln"], "cpu")
    assert out == ["eager", "kiln"] and notes == [
        "inductor-cg, kiln-cg: CUDA graphs need a CUDA device; skipped on cpu"
    ]
    with pytest.raises(UsageError, match="unknown compiler 'kiln-emulate'"):
        model_run.check_compilers(["kiln-emulate"], "cuda")

    got, hook = overhead.compile_for("inductor-cg", fn)
    assert compiled == [(fn, {"backend": "inductor", "mode": "reduce-overhead"})]
    assert hook is torch.compiler.cudagraph_mark_step_begin
    got, hook = overhead.compile_for("kiln-cg", fn)
    assert compiled[-1] == (fn, {"backend": "kiln", "options": {"cudagraphs": True}}) and hook() is None
    assert overhead.COMPILERS == ("eager", "kiln", "inductor", "kiln-cg", "inductor-cg")

    assert capture.COMPILERS == ("kiln", "kiln-emulate", "inductor", "eager")
    emulate = capture.standard("kiln-emulate")
    assert emulate.kiln and emulate.name == "kiln-emulate"
    with emulate.context():
        import compiler

        assert compiler.config.settings().emulate_eager_precision is True
    with capture.standard("kiln").context():
        assert compiler.config.settings().emulate_eager_precision is False
    from harness.numerics.exc import NumericsError

    with pytest.raises(NumericsError, match="unknown compiler 'kiln-cg'"):
        capture.standard("kiln-cg")
