"""The decomposition table: PyTorch's core set read without export's CompositeImplicitAutograd entries, EXTRA
and the overrides on top, KEEP left whole."""

from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions

from compiler import decompositions as d

aten = torch.ops.aten


def _implicit(op) -> bool:
    """A CompositeImplicitAutograd kernel in C++ or in Python (``py_impl``, which AOTAutograd's Python
    dispatcher runs): the op decomposes while it is traced whether the table has it or not."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd") or (
        key in getattr(op, "py_kernels", {})
    )


def test_the_core_table_differs_from_exports_only_by_ops_the_dispatcher_decomposes_itself():
    ours = d.core_table()
    public = dict(core_aten_decompositions())
    assert set(ours) <= set(public)
    assert all(ours[op] is public[op] for op in ours)  # the same decomposition for every op kept
    left_out = [op for op in public if op not in ours]
    not_implicit = [str(op) for op in left_out if not _implicit(op)]
    assert not not_implicit  # each one left out decomposes below autograd by itself
    assert aten.addcmul.default in ours and aten.hardswish.default in ours


def test_the_table_adds_extra_and_overrides_and_keeps_what_kiln_leaves_whole():
    table = d.decomposition_table()
    assert aten._softmax.default in table and aten.native_layer_norm.default in table
    assert table[aten.repeat.default] is d.OVERRIDES[aten.repeat.default]
    assert all(op not in table for op in d.KEEP)


def test_the_export_table_has_the_implicit_ops_that_exports_ir_keeps():
    table = d.export_decomposition_table()
    assert aten.linear.default in table and aten.linear.default not in d.decomposition_table()
    assert set(d.decomposition_table()) <= set(table)
    assert table[aten.repeat.default] is d.OVERRIDES[aten.repeat.default]
    assert all(op not in table for op in d.KEEP)


def _traced_ops(f, *args) -> list[list[str]]:
    """The forward and backward graphs' ops of ``f`` traced by AOTAutograd with kiln's table, then with
    export's entries added under it."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs: list[list[str]] = []

    def grab(gm, _inputs):
        graphs.append(sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
        return make_boxed_func(gm.forward)

    for table in (d.decomposition_table(), {**dict(core_aten_decompositions()), **d.decomposition_table()}):
        out = aot_function(f, fw_compiler=grab, bw_compiler=grab, decompositions=table)(*args)
        out.sum().backward()
    return graphs


def test_an_implicit_op_left_out_traces_to_the_same_graphs():
    """``aten.linear`` (C++ CompositeImplicitAutograd) and ``upsample_nearest2d`` (a Python one) are not in
    kiln's table: the forward and backward graphs are those traced with export's entries for them."""

    def f(x, w, b):
        y = torch.nn.functional.linear(x, w, b).relu()
        return torch.nn.functional.interpolate(y.view(1, 1, 4, 3), scale_factor=2, mode="nearest")

    x, w, b = torch.randn(4, 8), torch.randn(3, 8, requires_grad=True), torch.randn(3)
    fw, bw, fw_export, bw_export = _traced_ops(f, x, w, b)
    assert (fw, bw) == (fw_export, bw_export)
    assert not any("linear" in t or "upsample" in t for t in fw + bw)
