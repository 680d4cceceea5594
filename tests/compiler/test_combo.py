"""Combo kernels (``codegen/combo.py``, ``runtime/combo.py``): which kernels are combined, the generated source
(a golden file), results identical to the kernels launched one by one, the size limits, and the guard's
decisions (an injected timer, the disk cache beside the autotune choices)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from test_layers import staged  # the products after the passes up to one (strict: verified)

import compiler
from compiler.codegen import combo as combo_pass
from compiler.codegen.kernels import Kernels
from compiler.exc import InvariantError
from compiler.runtime import combo as combo_runtime
from compiler.runtime.combo import ComboKernel
from compiler.runtime.launcher import TritonKernel
from compiler.scheduler import Schedule
from kiln_testing import DEVICE, compiled_optimizer_steps, model_with_grads, randn

GOLDEN = Path(__file__).parent / "golden"


def _three(a, b, c, d):
    """Three independent pointwise kernels of different sizes."""
    return a * 2 + 1, (c - d).relu(), b.sigmoid() * 3


def _args():
    torch.manual_seed(0)
    return randn(100), randn(7, 5), randn(50, 3), randn(50, 3)


def _compile(fn, args, **settings):
    torch._dynamo.reset()
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln")(*args)
    return out, graphs


def _combos(graph) -> list[ComboKernel]:
    return [m for _, m in graph.wrapper.named_children() if isinstance(m, ComboKernel)]


@pytest.fixture(autouse=True)
def _fresh_guard():
    combo_runtime.set_timer(None)
    combo_runtime.reset_decisions()
    yield
    combo_runtime.set_timer(None)


def test_independent_pointwise_kernels_launch_as_one_combo_with_identical_results(device):
    args = _args()
    # small blocks: every part runs several programs, so the program id ranges are exercised
    got, graphs = _compile(_three, args, interp_pointwise_xblock=16)
    want, plain = _compile(_three, args, interp_pointwise_xblock=16, combo_kernels=False)
    assert plain[0].kernel_launches == 3 and graphs[0].kernel_launches == 1
    (combo,) = _combos(graphs[0])
    assert [p.name for p in combo.parts] == list(plain[0].kernel_sources)
    assert combo.name in graphs[0].code and "kiln_pointwise" not in graphs[0].code
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_combo_source_shows_its_parts():
    _, graphs = _compile(_three, _args())
    (name,) = graphs[0].kernel_sources
    src = graphs[0].kernel_sources[name]
    assert name.startswith("kiln_combo3_")
    for part in _combos(graphs[0])[0].parts:
        assert f"def {part.name}(pid, " in src and f"        {part.name}(" in src
    assert src.count("tl.program_id(0)") == 1 and src.count("@triton.jit") == 5  # 3 parts, _relu, the combo


def test_generated_combo_kernel_matches_its_golden_file():
    """A reviewer reads generated code here: update with KILN_UPDATE_GOLDEN=1 when a change is intended."""
    _, graphs = _compile(_three, _args())
    (src,) = graphs[0].kernel_sources.values()
    path = GOLDEN / "combo_three_pointwise.py"
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1":
        path.write_text(src)
    assert src == path.read_text(), f"combo kernel source changed; diff against {path}"


def test_combo_pass_is_deterministic():
    _, a = _compile(_three, _args())
    _, b = _compile(_three, _args())
    assert a[0].kernel_sources == b[0].kernel_sources


def _five(a, b, c, d, e):
    return a + 1, b * 2, c.exp(), d.abs(), e.cos()


def _five_args():
    torch.manual_seed(0)
    return tuple(randn(n) for n in (10, 11, 12, 13, 14))  # five sizes: five kernels


def test_size_limits_cut_runs_into_several_combos():
    args = _five_args()
    want, plain = _compile(_five, args, combo_kernels=False)
    got, graphs = _compile(_five, args, combo_max_parts=2)
    assert plain[0].kernel_launches == 5 and graphs[0].kernel_launches == 3  # 2 + 2 + 1
    assert [len(c.parts) for c in _combos(graphs[0])] == [2, 2]
    _, by_args = _compile(_five, args, combo_max_args=6)  # 2 pointers and a size a kernel: two a combo
    assert [len(c.parts) for c in _combos(by_args[0])] == [2, 2]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_large_kernels_are_not_parts():
    args = _five_args()
    _, graphs = _compile(_five, args, combo_max_numel=12)  # the 13- and 14-element kernels are too big
    (combo,) = _combos(graphs[0])
    assert len(combo.parts) == 3 and graphs[0].kernel_launches == 3
    _, none = _compile(_five, args, combo_max_numel=10)  # one kernel left: nothing to combine
    assert not _combos(none[0]) and none[0].kernel_launches == 5


def _groups(st, max_numel=1 << 20):
    return combo_pass._groups(st.schedule, st.kernels, max_numel, 64, 240)


def test_a_kernel_reading_what_a_part_stores_joins_no_combo_with_it():
    st = staged(lambda a, b, c: (a * 2, b + 1, c.cos()), randn(10), randn(11), randn(12), upto="render")
    k0, k1, k2 = st.kernels.sources
    assert _groups(st) == [[0, 1, 2]]
    reader = dataclasses.replace(k1, ptr_args=[("in_ptr0", k0.stores[0])] + k1.ptr_args[1:])
    kernels = dataclasses.replace(st.kernels, sources=(k0, reader, k2))
    assert combo_pass._groups(st.schedule, kernels, 1 << 20, 64, 240) == [[0, 2]]


def _first(st, item: int) -> tuple[Schedule, Kernels]:
    """``st``'s schedule and kernels with the independent kernel group at ``item`` launched first."""
    items = list(st.schedule.items)
    group = items.pop(item)
    sched = Schedule(st.schedule.program, [group] + items, st.schedule.in_place)
    k = st.schedule.groups.index(group)
    sources = list(st.kernels.sources)
    sources.insert(0, sources.pop(k))
    return sched, Kernels(sched, tuple(sources))


def _around_a_reduction(a, b, c):
    return a * 2, b.sum(-1), c.cos()


def test_kernels_apart_combine_across_a_kernel_they_do_not_touch():
    st = staged(_around_a_reduction, randn(10), randn(6, 7), randn(12), upto="render")
    assert [g.has_reduction for g in st.schedule.groups] == [True, False, False]
    sched, kernels = _first(st, 1)  # a * 2, then the reduction, then c.cos()
    kernels.verify()
    assert combo_pass._groups(sched, kernels, 1 << 20, 64, 240) == [[0, 2]]
    combined = combo_pass.combine(sched, kernels)
    combined.verify()  # c.cos() is launched with a * 2, before the reduction: independent of it
    assert [c.indices for c in combined.combos] == [(0, 2)]
    assert [ks.name for ks in combined.launches] == [combined.combos[0].name, kernels.sources[1].name]


def test_a_kernel_reading_what_a_kernel_between_writes_stays_behind_it():
    def fn(a, b, c):
        s = b.sum(-1)
        return a * 2, s, c * s[0]

    st = staged(fn, randn(10), randn(6, 7), randn(12), upto="render")
    sched, kernels = _first(st, 1)  # a * 2, the reduction, then c * s[0], which reads the reduction's result
    assert combo_pass._groups(sched, kernels, 1 << 20, 64, 240) == []
    k0, _, k2 = kernels.sources
    forced = dataclasses.replace(kernels, combos=(combo_pass.combo_source([k0, k2], (0, 2)),))
    with pytest.raises(InvariantError, match=r"depends on kernel 1, launched between"):
        forced.verify()


def test_an_extern_call_ends_the_combos_before_it():
    def fn(a, b, c):
        return a * 2, (b * 3) @ b, c.cos()

    st = staged(fn, randn(10), randn(8, 8), randn(12), upto="render")
    kinds = [type(it).__name__ for it in st.schedule.items]
    assert kinds == ["KernelGroup", "ExternCall", "KernelGroup", "KernelGroup"]
    sched, kernels = _first(st, 2)  # a * 2, b * 3 (64 elements: no part below), the matmul, c.cos()
    assert combo_pass._groups(sched, kernels, 1 << 20, 64, 240) == [[0, 1]]
    assert combo_pass._groups(sched, kernels, 32, 64, 240) == []


def test_combo_off_keeps_every_kernel():
    _, graphs = _compile(_three, _args(), combo_kernels=False)
    assert not _combos(graphs[0]) and graphs[0].kernel_launches == 3


#: kernel launches of an optimizer step of ``model_with_grads`` (six parameters: 128, 16, 16, 16, 64 and 4
#: elements): without combo kernels (a kernel per parameter size and AdamW's step counts), and with them, at the
#: default part size limit and at 20 elements (the 128- and 64-element updates launch alone, between the
#: combo's parts: AdamW's first step count joins the update combo launched after the update that reads it)
OPTIMIZER_LAUNCHES = {
    ("adamw", None): (5, 2),
    ("adamw", 20): (5, 4),
    ("sgd", None): (4, 1),
    ("sgd", 20): (4, 3),
}


@pytest.mark.parametrize(("opt", "max_numel"), list(OPTIMIZER_LAUNCHES), ids=lambda v: str(v))
def test_optimizer_step_with_combos_is_bitwise_the_step_without(opt, max_numel, device):
    model = model_with_grads(device)
    limit = {} if max_numel is None else {"combo_max_numel": max_numel}
    results, launches = {}, {}
    for on in (False, True):
        m, _, graphs = compiled_optimizer_steps(
            model, opt, combo_kernels=on, interp_pointwise_xblock=16, **limit
        )
        results[on] = [p.detach().clone() for p in m.parameters()]
        launches[on] = graphs[-1].kernel_launches
    assert (launches[False], launches[True]) == OPTIMIZER_LAUNCHES[opt, max_numel]
    for a, b in zip(results[False], results[True]):
        if device == "cpu":
            assert torch.equal(a, b)
        else:  # the GPU compiles a part inside the combo (inlined) and alone: float contraction may differ
            diff = (a - b).abs().max().item()
            torch.testing.assert_close(
                a, b, rtol=2e-6, atol=1e-7, msg=lambda m, d=diff: f"{m}; max abs diff {d:.3g}"
            )


# ------------------------------------------------------------------------------------------------ the guard
def test_without_a_timer_the_interpreter_combines_by_rule_and_a_gpu_times():
    _compile(_three, _args())
    d = combo_runtime.decisions()
    if DEVICE == "cpu":
        assert d["rule"] == 1 and d["split"] == d["combined"] == 0
        (entry,) = combo_runtime.decision_log()
        assert (
            entry["how"] == "rule"
            and entry["split"] is False
            and entry["parts"] == 3
            and "combo_us" not in entry
        )
    else:  # the first launch on the GPU times the combo against its parts
        assert d["rule"] == 0 and d["split"] + d["combined"] + d["cached"] == 1


def test_guard_runs_the_parts_when_they_are_faster_and_results_stay_identical(monkeypatch):
    launched: list[str] = []
    orig = TritonKernel.forward

    def spy(self, *a):
        launched.append(self.name)
        return orig(self, *a)

    monkeypatch.setattr(TritonKernel, "forward", spy)
    # the timer: the combo is slow (its launch passes through ``TritonKernel.forward`` of the combo)
    combo_runtime.set_timer(lambda fn: 1.0 if _times_combo(fn) else 0.5)
    args = _args()
    got, graphs = _compile(_three, args)
    (combo,) = _combos(graphs[0])
    assert combo_runtime.decisions()["split"] == 1
    (entry,) = combo_runtime.decision_log()
    assert entry == {
        "kernel": combo.name,
        "parts": len(combo.parts),
        "how": "timed",
        "split": True,
        "combo_us": 1e6,
        "parts_us": 5e5,
    }
    launched.clear()
    graphs[0].wrapper(*[a for a in (args[0], args[1], args[2], args[3])])
    assert combo.name not in launched and sorted(launched) == sorted(p.name for p in combo.parts)
    want, _ = _compile(_three, args, combo_kernels=False)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _times_combo(fn) -> bool:
    return fn.__name__ == "combo"


def test_guard_keeps_the_combo_when_it_is_faster_and_caches_the_decision(tmp_path):
    combo_runtime.set_timer(lambda fn: 0.5 if _times_combo(fn) else 1.0)
    with compiler.config.patch(cache="1", autotune_dir=str(tmp_path)):
        _compile(_three, _args())
        assert combo_runtime.decisions()["combined"] == 1
        assert len(list(tmp_path.glob("*.kcb"))) == 1
        combo_runtime.set_timer(lambda fn: pytest.fail("a cached decision is timed again"))
        _compile(_three, _args())
    assert combo_runtime.decisions()["cached"] == 1
    assert [(d["how"], d["split"]) for d in combo_runtime.decision_log()] == [
        ("timed", False),
        ("cached", False),
    ]


def test_a_second_compile_of_the_graph_takes_the_decision_made_earlier_in_the_process():
    """A graph compiled again in the same process (a CUDA-graph arm after a plain one) gets new kernel objects;
    their combo reuses this process's decision without timing, counted and logged as ``earlier``."""
    combo_runtime.set_timer(lambda fn: 1.0 if _times_combo(fn) else 0.5)
    _compile(_three, _args())
    # a timer that fails, set without forgetting the decisions (set_timer would; the fixture restores it)
    combo_runtime._timer[0] = lambda fn: pytest.fail("timed again")
    _compile(_three, _args())
    assert combo_runtime.decisions()["split"] == 1 and combo_runtime.decisions()["earlier"] == 1
    assert [(d["how"], d["split"]) for d in combo_runtime.decision_log()] == [
        ("timed", True),
        ("earlier", True),
    ]


def test_guard_restores_the_buffers_it_wrote_while_timing():
    def timer(fn):
        fn()
        return 1.0

    combo_runtime.set_timer(timer)
    args = _args()
    got, _ = _compile(_three, args)
    want, _ = _compile(_three, args, combo_kernels=False)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_graph_cache_round_trips_a_combo(gc_dir):
    args = _args()
    first, graphs = _compile(_three, args)
    assert graphs[0].cache == "stored"
    again, hit = _compile(_three, args)
    assert hit[0].cache == "hit" and len(_combos(hit[0])) == 1
    assert [p.name for p in _combos(hit[0])[0].parts] == [p.name for p in _combos(graphs[0])[0].parts]
    for g, w in zip(again, first):
        assert torch.equal(g, w)
