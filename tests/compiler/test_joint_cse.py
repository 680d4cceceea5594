"""``compiler/joint_cse.py``: the joint graph's common-subexpression elimination and kiln's partition function."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from compiler import joint_cse

ROOT = Path(__file__).resolve().parents[2]
aten = torch.ops.aten


def _joint_graphs(fn, *args) -> list[fx.GraphModule]:
    """The joint graphs AOTAutograd hands its partitioner while it compiles ``fn`` for training (copies)."""
    from functorch.compile import aot_function, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    seen = []

    def capture(joint, inputs, **kw):
        seen.append(copy.deepcopy(joint))
        return min_cut_rematerialization_partition(joint, inputs, **kw)

    def nop(gm, _):
        return make_boxed_func(gm)

    out = aot_function(fn, fw_compiler=nop, bw_compiler=nop, partition_fn=capture)(*args)
    (out[0] if isinstance(out, (tuple, list)) else out).sum().backward()
    return seen


def _block(x, w, b, mask):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    a = (h @ h.transpose(-1, -2)) * 0.125 + mask  # the scaled scores, and the mask added twice below
    a = F.dropout(a.softmax(-1), 0.1, training=True) @ h
    g = F.gelu(a) + F.gelu(a) * F.layer_norm(x, (x.shape[-1],), w, b)  # repeated work to merge
    return g + (h @ h.transpose(-1, -2) * 0.125 + mask).sum(-1, keepdim=True), torch.rand_like(g)


def _mutating(x, y):
    a = x.sin() * 2
    y.mul_(2)  # a mutated input: the joint graph writes it back (copy_) at its end
    return a + x.sin() * 2 + y.cos(), x.sin()


@pytest.mark.parametrize(
    "fn, make",
    [
        (_block, lambda: (torch.randn(2, 8, 16), torch.randn(16), torch.randn(16), torch.randn(8, 8))),
        (_mutating, lambda: (torch.randn(4, 4), torch.randn(4, 4))),
    ],
    ids=["transformer-block", "input-mutation"],
)
def test_joint_graphs_merge_as_functorchs_pass_merges_them(fn, make):
    """On real joint graphs (dropout and rand_like draws, repeated layer norms and products, an input mutation
    written back) kiln's pass leaves the graph functorch's ``fx_graph_cse`` gives, node for node."""
    from torch._functorch.compile_utils import fx_graph_cse

    torch.manual_seed(0)
    args = [a.requires_grad_(i == 0) for i, a in enumerate(make())]
    joints = _joint_graphs(fn, *args)
    assert joints
    for joint in joints:
        theirs = fx_graph_cse(copy.deepcopy(joint).graph)
        ours = copy.deepcopy(joint).graph
        removed = joint_cse.eliminate_common_subexpressions(ours)
        assert _nodes(ours) == _nodes(theirs)
        assert removed == len(joint.graph.nodes) - len(ours.nodes) > 0


def _nodes(g: fx.Graph) -> list[tuple]:
    """Each node's kind, name, target and arguments (by name): the graph as a comparable list."""
    return [(n.op, n.name, str(n.target), repr(n.args), repr(n.kwargs)) for n in g.nodes]


def _graph(build) -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4)
    outs = build(g, x)
    g.output(tuple(outs))
    return g


def _targets(g: fx.Graph) -> list:
    return [n.target for n in g.nodes if n.op == "call_function"]


def test_the_rules_merge_within_a_region_and_never_random_draws_or_retyped_arguments():
    def build(g, x):
        a = g.call_function(aten.mul.Tensor, (x, 2))
        b = g.call_function(aten.mul.Tensor, (x, 2))  # merged into a
        c = g.call_function(aten.mul.Tensor, (x, 2.0))  # 2.0 is not 2: kept
        r1 = g.call_function(aten.rand_like.default, (x,))
        r2 = g.call_function(aten.rand_like.default, (x,))  # each draw is its own: kept
        return [g.call_function(aten.add.Tensor, (a, b)), c, r1, r2]

    g = _graph(build)
    assert joint_cse.eliminate_common_subexpressions(g) == 1
    assert _targets(g).count(aten.mul.Tensor) == 2 and _targets(g).count(aten.rand_like.default) == 2
    add = next(n for n in g.nodes if n.target is aten.add.Tensor)
    assert add.args[0] is add.args[1]


def test_a_mutation_separates_regions_and_the_later_duplicate_survives():
    def build(g, x):
        a = g.call_function(aten.neg.default, (x,))
        g.call_function(aten.add_.Tensor, (x, 1))  # writes x: what follows reads another value
        b = g.call_function(aten.neg.default, (x,))  # kept: another region
        c = g.call_function(aten.neg.default, (x,))  # merged into b, not a
        return [a, b, c]

    g = _graph(build)
    assert joint_cse.eliminate_common_subexpressions(g) == 1
    out = next(n for n in g.nodes if n.op == "output")
    a, b, c = out.args[0]
    assert a is not b and b is c


def test_a_value_sharing_storage_with_an_output_is_not_merged():
    """Eager returns two tensors for two equal computations that are outputs: they must stay two."""

    def build(g, x):
        vals = []
        for _ in range(2):
            n = g.call_function(aten.neg.default, (x,))
            n.meta["val"] = torch.empty(4)
            vals.append(n)
        return vals

    g = _graph(build)
    assert joint_cse.eliminate_common_subexpressions(g) == 0


def test_a_failing_pass_leaves_the_partitioners_own_cse_to_run(monkeypatch, caplog):
    """kiln's pass raising mid-way is no compile error: functorch's CSE runs inside the partitioner instead."""
    import torch._functorch.partitioners as partitioners

    calls = []

    def fake_min_cut(joint, inputs, **kw):
        from torch._functorch import config as functorch_config

        calls.append(functorch_config.cse)
        return "fw", "bw"

    def boom(graph):
        raise RuntimeError("boom")

    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", fake_min_cut)
    monkeypatch.setattr(joint_cse, "eliminate_common_subexpressions", boom)
    joint = fx.GraphModule(torch.nn.Module(), _graph(lambda g, x: [g.call_function(aten.neg.default, (x,))]))
    with caplog.at_level("WARNING", logger="kiln"):
        assert joint_cse.partition(joint, []) == ("fw", "bw")
    assert calls == [True] and "joint-graph CSE failed (RuntimeError: boom)" in caplog.text
    monkeypatch.undo()
    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", fake_min_cut)
    assert joint_cse.partition(joint, []) == ("fw", "bw") and calls == [True, False]


@pytest.mark.parametrize(
    "name, mutating",
    [
        ("add_", True),
        ("copy_", True),
        ("add_.Tensor", True),
        ("_set_grad_enabled", True),
        ("manual_seed", True),
    ]
    + [("__add__", False), ("add", False), ("reset", False), ("offset", False), ("setattr", False)],
)
def test_mutating_names(name, mutating):
    assert joint_cse._mutating_name(name) is mutating


def test_a_kiln_training_compile_does_not_import_inductors_pattern_matcher(tmp_path):
    """functorch's CSE imports Inductor's pattern matcher, and with it Inductor's lowerings and templates (0.6-0.8
    s of a cold process on a CPU box): a training graph compiled by kiln no longer loads it."""
    code = (
        "import sys, torch, compiler\n"
        "compiler.register()\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))\n"
        "f = torch.compile(m, backend='kiln')\n"
        "f(torch.randn(4, 8)).sum().backward()\n"
        "print('loaded' if 'torch._inductor.pattern_matcher' in sys.modules else 'not loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "KILN_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "not loaded"
