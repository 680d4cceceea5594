"""The typed products of the pass pipeline (``graph.Program``, ``scheduler.Schedule``, ``codegen.kernels.Kernels``,
``codegen.wrapper.Wrapper``) and their ``verify()``: a sound product passes, a product broken the way a pass bug would break it is caught,
and under ``strict`` the pipeline verifies each product right after the pass that made it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_layers import staged  # the compile state after the passes up to one (strict: products verified)

import compiler
from compiler import backend
from compiler.codegen.kernels import Kernels
from compiler.exc import InvariantError
from compiler.graph import ExternCall
from compiler.scheduler import Schedule, schedule
from kiln_testing import randn


def softmax_mm(x, w):
    return torch.softmax(x, -1) @ w


def two_kernels(x):
    y = torch.relu(x) + 1  # inlined into both reductions: a column-sum kernel and a row-sum kernel
    return y.sum(0), y.sum(1)


ARGS = (randn(16, 40), randn(40, 8))


def _fails(product, match: str) -> None:
    with pytest.raises(InvariantError, match=match):
        product.verify()


# ------------------------------------------------------------------------------------------- sound products
@pytest.mark.parametrize(
    "fn, args",
    [(softmax_mm, ARGS), (two_kernels, ARGS[:1]), (lambda x: (x.sin() * 2, x.sum()), ARGS[:1])],
    ids=["softmax_mm", "two_kernels", "pointwise_and_sum"],
)
def test_sound_products_verify(fn, args):
    st = staged(fn, *args)
    st.program.verify()
    st.schedule.verify()
    st.kernels.verify()
    st.wrapper.verify()
    assert st.kernels.schedule is st.schedule and len(st.kernels.sources) == len(st.schedule.groups)
    assert [n.target for n in st.wrapper.module.graph.nodes if n.op == "call_module"] == [
        ks.name for ks in st.kernels.launches
    ]


def test_render_leaves_the_schedule_as_it_was():
    """``render`` is a function of the schedule: it returns the kernels and sets nothing on the schedule."""
    st = staged(two_kernels, ARGS[0], upto="schedule")
    before = [dict(vars(g)) for g in st.schedule.groups]
    kernels = backend.render(st.schedule)
    assert [dict(vars(g)) for g in st.schedule.groups] == before
    assert isinstance(kernels, Kernels) and [g for g, _ in kernels.pairs()] == st.schedule.groups


# ------------------------------------------------------------------------------------------------ program
def test_program_buffer_registered_under_another_name():
    st = staged(softmax_mm, *ARGS, upto="lower")
    buf = next(iter(st.program.buffers.values()))
    st.program.buffers["alias"] = buf
    _fails(st.program, "registered as")


def test_program_extern_reads_a_buffer_before_it_is_computed():
    st = staged(softmax_mm, *ARGS, upto="lower")
    steps = st.program.steps
    mm = next(k for k, s in enumerate(steps) if isinstance(s, ExternCall))
    steps.insert(0, steps.pop(mm))  # the matmul before the softmax it reads
    _fails(st.program, "before step")


def test_program_output_of_an_unregistered_buffer():
    st = staged(softmax_mm, *ARGS, upto="lower")
    out = next(v for v in st.program.outputs if v is not None)
    del st.program.buffers[out.buffer.name]
    _fails(st.program, "not its registered buffer")


def test_program_constant_without_a_buffer():
    st = staged(softmax_mm, *ARGS, upto="lower")
    st.program.constants["ghost"] = torch.zeros(2)
    _fails(st.program, "constant ghost has no buffer")


# ----------------------------------------------------------------------------------------------- schedule
def test_schedule_value_kept_in_registers_but_read_by_a_later_item():
    st = staged(softmax_mm, *ARGS, upto="schedule")
    (g,) = st.schedule.groups
    (m,) = [m for m in g.members if m.store]  # the matmul's operand
    m.store = False
    _fails(st.schedule, "keeps in registers")


def test_schedule_output_not_stored():
    st = staged(lambda x: torch.relu(x) * 2, ARGS[0], upto="schedule")
    (g,) = st.schedule.groups
    g.members[-1].store = False
    _fails(st.schedule, "graph output .* is not stored")


def test_schedule_reader_launched_before_its_producer():
    st = staged(softmax_mm, *ARGS, upto="schedule")
    st.schedule.items.reverse()
    _fails(st.schedule, "before item")


def test_schedule_buffer_computed_twice():
    st = staged(softmax_mm, *ARGS, upto="schedule")
    (g,) = st.schedule.groups
    st.schedule.items.insert(0, dataclasses.replace(g, members=list(g.members)))
    _fails(st.schedule, "produced by items 0 and 1")


def test_schedule_unknown_item():
    st = staged(softmax_mm, *ARGS, upto="schedule")
    st.schedule.items.append("launch something")
    _fails(st.schedule, "item 2 is a str")


def _with_sources(kernels: Kernels, sources) -> Kernels:
    return dataclasses.replace(kernels, sources=tuple(sources))


# ------------------------------------------------------------------------------------------------ kernels
def test_kernels_one_missing():
    st = staged(two_kernels, ARGS[0], upto="render")
    _fails(_with_sources(st.kernels, st.kernels.sources[:-1]), "1 kernels for 2 groups")


def test_kernels_of_another_group():
    st = staged(two_kernels, ARGS[0], upto="render")
    a, b = st.kernels.sources[:2]
    _fails(_with_sources(st.kernels, [b, a]), "stores")


def test_kernels_one_name_for_two_sources():
    st = staged(two_kernels, ARGS[0], upto="render")
    a, b = st.kernels.sources[:2]
    _fails(_with_sources(st.kernels, [a, dataclasses.replace(b, name=a.name)]), "two different sources")


def test_kernels_passing_an_unknown_buffer():
    st = staged(two_kernels, ARGS[0], upto="render")
    a, *rest = st.kernels.sources
    a = dataclasses.replace(a, ptr_args=[("in_ptr0", "nowhere")] + a.ptr_args[1:])
    _fails(_with_sources(st.kernels, [a, *rest]), "unknown buffer nowhere")


# ------------------------------------------------------------------------------------------------ wrapper
def test_wrapper_launch_missing():
    st = staged(two_kernels, ARGS[0])
    graph = st.wrapper.module.graph
    launch = next(n for n in graph.nodes if n.op == "call_module")
    graph.erase_node(launch)
    _fails(st.wrapper, "launches")


def test_wrapper_kernel_writes_a_graph_input():
    st = staged(two_kernels, ARGS[0])
    graph = st.wrapper.module.graph
    x = next(n for n in graph.nodes if n.op == "placeholder")
    launch = next(n for n in graph.nodes if n.op == "call_module")
    ks = st.kernels.launches[0]
    out = next(i for i, (p, _) in enumerate(ks.ptr_args) if p.startswith("out_ptr"))
    launch.args = launch.args[:out] + (x,) + launch.args[out + 1 :]
    _fails(st.wrapper, "not an allocation")


def test_wrapper_module_with_another_source():
    st = staged(two_kernels, ARGS[0])
    name = st.kernels.launches[0].name
    getattr(st.wrapper.module, name).source += "# edited\n"
    _fails(st.wrapper, "does not hold its kernel's source")


def test_wrapper_node_used_before_defined():
    st = staged(softmax_mm, *ARGS)
    graph = st.wrapper.module.graph
    launch = next(n for n in graph.nodes if n.op == "call_module")
    next(n for n in graph.nodes if n.op == "placeholder").prepend(launch)  # before its allocation
    _fails(st.wrapper, "wrapper of t")


# ------------------------------------------------------------------------------------------------ pipeline
def test_strict_pipeline_stops_at_the_pass_that_broke_its_product(monkeypatch):
    def careless_schedule(program):
        made = schedule(program)
        for g in made.groups:
            for m in g.members:
                m.store = False
        return made

    passes = [p._replace(run=careless_schedule) if p.name == "schedule" else p for p in backend.PASSES]
    monkeypatch.setattr(backend, "PASSES", passes)
    # Dynamo wraps the backend's error (BackendCompilerFailed)
    with (
        compiler.config.patch(strict=True),
        pytest.raises(Exception, match="after kiln pass 'schedule'.*registers"),
    ):
        torch.compile(lambda x: torch.softmax(x, -1) @ x.t(), backend="kiln")(randn(4, 8))


def test_products_are_not_verified_outside_strict(monkeypatch):
    calls = []
    for product in (Schedule, Kernels):
        monkeypatch.setattr(
            product, "verify", lambda self, verify=product.verify: calls.append(self) or verify(self)
        )
    fn = lambda x: torch.relu(x) + 1  # noqa: E731
    with compiler.config.patch(strict=False):
        torch.compile(fn, backend="kiln")(randn(8))
    assert calls == []
    torch._dynamo.reset()
    with compiler.config.patch(strict=True):
        torch.compile(fn, backend="kiln")(randn(8))
    # after schedule, in_place and split, after render and combo
    assert [type(c) for c in calls] == [Schedule, Schedule, Schedule, Kernels, Kernels]
