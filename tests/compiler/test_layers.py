"""Unit tests of the compiler's layers one at a time (lower -> schedule -> render -> wrap), on FX graphs
traced with kiln's decomposition table: scheduler decisions, the renderer's output (a golden file) and the
wrapper's structure. End-to-end behaviour is covered by the suites; these pin each layer's contract."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.backend import CompileState, lower_pass, render_pass, schedule_pass, wrap_pass
from compiler.decompositions import decomposition_table
from compiler.graph import ExternCall
from compiler.scheduler import KernelGroup

GOLDEN = Path(__file__).parent / "golden"


def staged(fn, *args, upto: str = "wrap") -> CompileState:
    """The compile state of ``fn``'s ATen graph after the passes up to ``upto`` (strict mode)."""
    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    st = CompileState(gm, "t")
    with compiler.config.patch(strict=True):
        for name, fn_pass in (("lower", lower_pass), ("schedule", schedule_pass), ("render", render_pass),
                              ("wrap", wrap_pass)):
            fn_pass(st)
            if name == upto:
                break
    return st


def groups(st: CompileState) -> list[KernelGroup]:
    return [it for it in st.items if isinstance(it, KernelGroup)]


# ------------------------------------------------------------------------------------------- scheduler
def test_pointwise_chain_fuses_into_its_row_reduction():
    st = staged(lambda x: torch.relu(x * 2 + 1).sum(-1), torch.randn(64, 32), upto="schedule")
    (g,) = groups(st)
    assert g.has_reduction and len(st.items) == 1
    assert int(g.xnumel) == 64 and int(g.rnumel) == 32


def test_softmax_is_one_persistent_group_and_is_stored_for_the_matmul():
    st = staged(lambda x, w: torch.softmax(x, -1) @ w, torch.randn(16, 40), torch.randn(40, 8), upto="schedule")
    kinds = [type(it).__name__ for it in st.items]
    assert kinds == ["KernelGroup", "ExternCall"]
    (g,) = groups(st)
    stored = [m.buf.name for m in g.members if m.store]
    mm = next(it for it in st.items if isinstance(it, ExternCall))
    assert len(stored) == 1 and stored[0] in str(mm.args)  # the one stored buffer is the matmul's operand


def test_dead_buffers_are_dropped():
    def fn(x):
        unused = x.exp() * 3  # noqa: F841 - traced, then dead
        return x + 1

    st = staged(fn, torch.randn(8, 8), upto="schedule")
    (g,) = groups(st)
    assert len(g.members) == 1


# -------------------------------------------------------------------------------------------- renderer
def test_rendered_pointwise_kernel_matches_its_golden_file():
    """A reviewer reads generated code here: update with KILN_UPDATE_GOLDEN=1 when a change is intended."""
    st = staged(lambda x: torch.relu(x * 2 + 1), torch.randn(64, 32), upto="render")
    (ks,) = st.kernels.values()
    path = GOLDEN / "pointwise_relu_chain.py"
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1":
        path.write_text(ks.source)
    assert ks.source == path.read_text(), f"kernel source changed; diff against {path}"


def test_rendering_is_deterministic():
    fn = lambda x: torch.softmax(x * 1.5, -1) + x.mean(-1, keepdim=True)  # noqa: E731
    a = staged(fn, torch.randn(16, 40), upto="render")
    b = staged(fn, torch.randn(16, 40), upto="render")
    assert [k.source for k in a.kernels.values()] == [k.source for k in b.kernels.values()]


# --------------------------------------------------------------------------------------------- wrapper
def test_wrapper_allocates_launches_and_calls_the_extern_out_variant():
    st = staged(lambda a, b: torch.relu(a @ b) * 2, torch.randn(8, 16), torch.randn(16, 4))
    code = st.wrapper.code
    assert code.count("torch.mm(") == 1 and "out = " in code
    assert code.count("self.kiln_") == 1  # one fused epilogue kernel
    assert code.count("empty_strided") == 2  # the matmul's output and the kernel's
    calls = [n.op for n in st.wrapper.graph.nodes]
    assert calls[0] == "placeholder" and calls[-1] == "output"
