"""The ``split`` pass (``compiler/split.py``): which groups are split into their independent components, what a
component holds, and that a split graph computes what the unsplit one does."""

from __future__ import annotations

import pytest
import torch
from test_layers import staged  # the products after the passes up to one (strict: verified)

import compiler
from compiler.kexpr import loads
from compiler.scheduler import KernelGroup
from compiler.split import components, split_independent
from kiln_testing import randn


def _split(fn, *args, **settings):
    st = staged(fn, *args, upto="schedule")
    before = [list(g.buffer_names) for g in st.schedule.groups]
    with compiler.config.patch(strict=True, **settings):
        after = split_independent(st.schedule)
        after.verify()
    return before, [list(g.buffer_names) for g in after.groups]


def test_independent_members_of_one_size_become_groups_of_their_own():
    before, after = _split(lambda a, b, c: (a + 1, b * 2, c.exp()), randn(10), randn(10), randn(10))
    assert len(before) == 1 and len(before[0]) == 3
    assert after == [[name] for name in before[0]]


def test_members_that_read_each_other_or_one_buffer_stay_together():
    def fn(a, b, c):
        x = a + 1
        return x, x * b, c.sin(), c.cos(), b.neg()

    before, after = _split(fn, randn(10), randn(10), randn(10))
    (members,) = before
    x, xb, sin, cos, neg = members
    # x*b reads x and b; b.neg() reads b too: one component; sin and cos both read c
    assert after == [[x, xb, neg], [sin, cos]]


def test_a_member_stored_in_place_stays_with_the_readers_of_its_input():
    st = staged(lambda a, b, c: (a + 1, b * 2, c.exp()), randn(10), randn(10), randn(10), upto="schedule")
    (g,) = st.schedule.groups
    m0, m1, m2 = g.members
    (a_input,) = {ld.buffer for ld in loads(m0.value)}
    # m1 stored into the input m0 reads: one component (the kernel that stores it reads that input first)
    parts = components(g.members, {m1.buf.name: a_input})
    assert [[m.buf.name for m in p] for p in parts] == [[m0.buf.name, m1.buf.name], [m2.buf.name]]


@pytest.mark.parametrize(
    "settings",
    [{"combo_kernels": False}, {"combo_max_numel": 9}],
    ids=["combo_kernels_off", "larger_than_combo_parts"],
)
def test_groups_that_are_not_split(settings):
    before, after = _split(lambda a, b: (a + 1, b * 2), randn(10), randn(10), **settings)
    assert after == before


def test_reductions_are_not_split():
    st = staged(lambda a, b: (a.sum(-1), b.sum(-1)), randn(4, 8), randn(4, 8), upto="schedule")
    groups = list(st.schedule.groups)
    assert len(groups) == 1 and groups[0].has_reduction
    with compiler.config.patch(strict=True):
        assert [g for g in split_independent(st.schedule).items if isinstance(g, KernelGroup)] == groups


def test_a_split_graph_computes_what_the_fused_one_does():
    def fn(a, b, c, d):
        x = a * 2  # kept in registers: read by its own component only
        return x + b, c.sigmoid(), d.relu() - 1

    args = tuple(randn(37) for _ in range(4))
    torch._dynamo.reset()
    with compiler.config.patch(strict=True, combo_kernels=False), compiler.capture() as plain:
        want = torch.compile(fn, backend="kiln")(*args)
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as split:
        got = torch.compile(fn, backend="kiln")(*args)
    assert plain[0].kernel_launches == 1 and split[0].kernel_launches == 1  # three parts, one combo launch
    assert [len(m.parts) for _, m in split[0].wrapper.named_children() if hasattr(m, "parts")] == [3]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
