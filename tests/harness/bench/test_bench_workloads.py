"""Workload registry, bytes/error accounting, the planted slowdown spec, and failing compilers."""

from __future__ import annotations

import math

import pytest
import torch

from harness.bench.kernels import workloads as wl
from harness.bench.kernels.execute import BenchConfig, Executor, check_compilers, make_call
from harness.bench.kernels.measure import flatten, make_timer, max_errors, unique_bytes
from harness.exc import UsageError
from harness.settings import Plant


def test_tiny_profile_has_at_least_20_distinct_workloads():
    cases = wl.cases("tiny")
    names = [c.name for c in cases]
    assert len(cases) >= 20 and len(set(names)) == len(names)
    assert len({c.source_hash for c in cases}) == len(cases)
    assert {c.dtype_name for c in cases} == {"fp32", "bf16", "fp16"}
    assert {c.mode for c in cases} == {"fwd", "bwd"}
    assert len(wl.cases("gpu")) >= 20


def test_source_hash_is_stable_and_tracks_the_definition():
    a = wl.find("softmax.fwd.fp32.64x128")
    assert a.source_hash == wl.find("softmax.fwd.fp32.64x128").source_hash
    fam = a.family
    changed = wl.Family(fam.name, wl.log_softmax, fam.inputs, fam.cases)
    assert wl._parse(changed, "64x128:fp32").source_hash != a.source_hash
    assert wl._parse(fam, "64x128:fp32:bwd").source_hash != a.source_hash


def test_only_filter_and_bad_names():
    assert [c.name for c in wl.cases("tiny", "softmax.fwd.*")] == [
        "softmax.fwd.fp32.64x128",
        "softmax.fwd.bf16.64x128",
    ]
    assert all(c.family.name == "rms_norm" for c in wl.cases("tiny", "rms_norm"))
    with pytest.raises(UsageError, match="no tiny workload"):
        wl.cases("tiny", "nothing*")
    with pytest.raises(UsageError, match="unknown profile"):
        wl.cases("huge")
    with pytest.raises(UsageError, match="unknown workload"):
        wl.find("softmax.fwd.fp64.1x1")


@pytest.mark.parametrize("case", wl.cases("tiny"), ids=lambda c: c.name)
def test_every_tiny_workload_runs_in_eager_close_to_float64(case):
    inputs = case.make_inputs("cpu")
    ex = Executor(BenchConfig(compilers=["eager"]))
    refs, grad_outs = ex._reference(case, inputs)
    outs = flatten(make_call(case.fn, case.mode, inputs, grad_outs)())
    abs_err, rel_err = max_errors(outs, refs)
    tol = 1e-4 if case.dtype_name == "fp32" else 5e-2
    assert rel_err < tol, (abs_err, rel_err)
    if case.mode == "bwd":
        assert len(outs) > len(flatten(case.fn(*inputs)))  # gradients are part of the outputs


def test_unique_bytes_counts_each_storage_once():
    a = torch.zeros(100, dtype=torch.float32)
    b = torch.zeros(10, dtype=torch.float16)
    assert unique_bytes([a, a[10:20], a.view(10, 10), b]) == 400 + 20


def test_max_errors():
    out = [torch.tensor([1.0, 2.0, 3.5])]
    ref = [torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)]
    assert max_errors(out, ref) == (0.5, 0.125)
    assert max_errors([torch.tensor([float("nan")])], [torch.tensor([1.0])])[0] == math.inf
    with pytest.raises(ValueError):
        max_errors(out, ref + ref)


def test_matmul_flops():
    c = wl.find("matmul_epilogue.fwd.fp32.32x64x32")
    assert c.flops() == 2 * 32 * 64 * 32
    assert wl.find("softmax.fwd.fp32.64x128").flops() is None


def test_plant_spec():
    p = Plant.parse("softmax.*@kiln=0.3")
    assert (p.pattern, p.compiler, p.fraction) == ("softmax.*", "kiln", 0.3)
    assert p.applies("softmax.fwd.fp32.64x128", "kiln") and not p.applies("softmax.fwd.fp32.64x128", "eager")
    assert Plant.parse("x").fraction == 0.2 and Plant.parse("x").compiler is None
    for bad in ("=0.2", "x=abc", "x=-1"):
        with pytest.raises(UsageError):
            Plant.parse(bad)


def test_timers_need_the_right_device():
    with pytest.raises(UsageError, match="needs a GPU"):
        make_timer("event", torch.device("cpu"))
    with pytest.raises(UsageError, match="unknown timer"):
        make_timer("sundial", torch.device("cpu"))
    t = make_timer("wall", torch.device("cpu"))
    assert len(t.sample(lambda: None, 7)) == 7


def _broken_backend(gm, example_inputs):
    raise RuntimeError("this backend always fails\nsecond line")


def test_a_failing_compiler_is_an_error_result_not_a_crash():
    torch._dynamo.register_backend(name="kiln_test_broken")(_broken_backend)
    compilers = check_compilers(["kiln_test_broken", "eager"])
    assert compilers == ["kiln_test_broken", "eager"]
    cfg = BenchConfig(compilers=compilers, target_s=0.002, min_reps=5, max_reps=10, rounds=2, warmup_s=0.0)
    ex = Executor(cfg)
    res = ex.measure_case(wl.find("row_sum.fwd.fp32.64x128"), compilers)
    bad, ok = res
    assert bad.status == "error" and "this backend always fails" in bad.error and "\n" not in bad.error
    assert bad.samples == []
    assert ok.status == "ok" and len(ok.samples) >= 5 and ok.bytes == 64 * 128 * 4 + 64 * 4
    assert ok.max_rel_err is not None and ok.max_rel_err < 1e-5


def test_planted_result_is_marked_and_unknown_compiler_rejected():
    cfg = BenchConfig(
        compilers=["eager"],
        target_s=0.002,
        min_reps=5,
        max_reps=10,
        rounds=1,
        warmup_s=0.0,
        plant=Plant("row_sum.*", None, 0.2),
    )
    (res,) = Executor(cfg).measure_case(wl.find("row_sum.fwd.fp32.64x128"), ["eager"])
    assert res.planted == 0.2
    with pytest.raises(UsageError, match="unknown compiler"):
        check_compilers(["tvm2"])


def test_arms_are_measured_side_by_side_as_runs_of_their_own():
    """The self-test's arms: one compile per case and compiler, each arm its own results and samples, the
    planted arm (only where its plant applies) marked and slower by about its plant."""
    cfg = BenchConfig(
        compilers=["kiln_test_broken", "eager"],
        target_s=0.004,
        min_reps=6,
        max_reps=12,
        rounds=3,
        passes=2,
        warmup_s=0.0,
    )
    if "kiln_test_broken" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name="kiln_test_broken")(_broken_backend)
    cases = [wl.find("row_sum.fwd.fp32.64x128"), wl.find("col_sum.fwd.fp32.64x128")]
    seen = []
    out = Executor(cfg).measure_arms(
        cases,
        cfg.compilers,
        {"A": None, "C": Plant("row_sum.*", "eager", 2.0)},
        lambda i, case, by_arm: seen.append((i, case.name, sorted(by_arm))),
    )
    assert seen == [(0, cases[0].name, ["A", "C"]), (1, cases[1].name, ["A", "C"])]
    assert [(r.workload, r.compiler, r.status) for r in out["A"]] == [
        (c.name, comp, st) for c in cases for comp, st in (("kiln_test_broken", "error"), ("eager", "ok"))
    ]
    a, c = out["A"][1], out["C"][1]
    assert a is not c and a.samples is not c.samples and len(a.samples) == len(c.samples) >= 6
    assert (a.planted, c.planted, out["C"][3].planted) == (
        None,
        2.0,
        None,
    )  # col_sum: the plant does not apply
    assert c.median_ns > 2 * a.median_ns  # 200% extra time, measured in the same rounds as A
    assert out["C"][0].status == "error" and out["C"][0].samples == []


def _slow_backend(gm, example_inputs):
    import time as _t

    _t.sleep(30)
    return gm.forward


def test_a_hanging_compile_is_an_error_result():
    torch._dynamo.register_backend(name="kiln_test_slow")(_slow_backend)
    cfg = BenchConfig(
        compilers=["kiln_test_slow", "eager"],
        target_s=0.002,
        min_reps=5,
        max_reps=10,
        rounds=1,
        warmup_s=0.0,
        compile_timeout_s=0.5,
    )
    slow, ok = Executor(cfg).measure_case(wl.find("row_sum.fwd.fp32.64x128"), ["kiln_test_slow", "eager"])
    assert slow.status == "error" and "took longer than" in slow.error
    assert ok.status == "ok"
