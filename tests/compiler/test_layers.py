"""Unit tests of the compiler's layers one at a time (lower -> schedule -> render -> wrap), on FX graphs
traced with kiln's decomposition table: scheduler decisions, the renderer's output (a golden file) and the
wrapper's structure. End-to-end behaviour is covered by the suites; these pin each layer's contract."""

from __future__ import annotations

import os
import types
from pathlib import Path

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.backend import PASSES, GraphJob, run_pass
from compiler.codegen.kernels import index_dtype
from compiler.decompositions import decomposition_table
from compiler.graph import ExternCall
from compiler.scheduler import KernelGroup
from kiln_testing import DEVICE, randn

GOLDEN = Path(__file__).parent / "golden"


def staged(fn, *args, upto: str = "wrap") -> types.SimpleNamespace:
    """The products of ``fn``'s ATen graph after the passes up to ``upto`` (``.job``, ``.program``,
    ``.schedule``, ``.kernels``, ``.wrapper`` as far as made; strict mode: each product verified after the pass
    that made it)."""
    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    job = GraphJob(gm, "t")
    products = {"job": job}
    layers = {p.name: p for p in PASSES}
    with compiler.config.patch(strict=True):
        for name in ("lower", "schedule", "render", "wrap"):
            run_pass(job, layers[name], products)
            if name == upto:
                break
    return types.SimpleNamespace(**products)


def groups(st: types.SimpleNamespace) -> list[KernelGroup]:
    return st.schedule.groups


# ------------------------------------------------------------------------------------------- scheduler
def test_pointwise_chain_fuses_into_its_row_reduction():
    st = staged(lambda x: torch.relu(x * 2 + 1).sum(-1), randn(64, 32), upto="schedule")
    (g,) = groups(st)
    assert g.has_reduction and len(st.schedule.items) == 1
    assert int(g.xnumel) == 64 and int(g.rnumel) == 32


def test_softmax_is_one_persistent_group_and_is_stored_for_the_matmul():
    st = staged(lambda x, w: torch.softmax(x, -1) @ w, randn(16, 40), randn(40, 8), upto="schedule")
    kinds = [type(it).__name__ for it in st.schedule.items]
    assert kinds == ["KernelGroup", "ExternCall"]
    (g,) = groups(st)
    stored = [m.buf.name for m in g.members if m.store]
    mm = next(it for it in st.schedule.items if isinstance(it, ExternCall))
    assert len(stored) == 1 and stored[0] in str(mm.args)  # the one stored buffer is the matmul's operand


def test_dead_buffers_are_dropped():
    def fn(x):
        unused = x.exp() * 3  # noqa: F841 - traced, then dead
        return x + 1

    st = staged(fn, randn(8, 8), upto="schedule")
    (g,) = groups(st)
    assert len(g.members) == 1


def _lerp_and_step_size(x, g, s):
    """A value with two users (kept in memory) and a scalar derived from a step count, computed after it and
    read by one of its users: an optimizer's new moment and bias-corrected step size."""
    a = x.lerp(g, 0.1)
    t = 1.0 / (1 - 0.9 ** (s + 1))
    return a * t, t.sqrt(), a * 2


def test_a_scalar_computed_after_a_value_launches_before_it_so_the_value_stays_in_registers():
    x, g, s = randn(64, 32), randn(64, 32), torch.tensor(3.0, device=DEVICE)
    st = staged(_lerp_and_step_size, x, g, s, upto="schedule")
    gs = groups(st)
    assert [int(k.xnumel) for k in gs] == [1, 64 * 32]  # the scalar's kernel moved before the value's
    big = gs[1]
    assert len(big.members) == 3  # the lerp and both of its users, one kernel
    assert [m.store for m in big.members].count(True) == 2  # the two outputs; the lerp itself is not stored
    out = torch.compile(_lerp_and_step_size, backend="kiln")(x, g, s)
    for got, want in zip(out, _lerp_and_step_size(x, g, s)):
        torch.testing.assert_close(got, want)


def test_kernels_are_never_moved_across_an_extern_call():
    def f(x, g, s, w):
        a = x.lerp(g, 0.1)
        y = w @ w  # an extern call between the value's kernel and the scalar's
        t = 1.0 / (1 - 0.9 ** (s + 1))
        return a * t, t.sqrt(), a * 2, y

    st = staged(
        f, randn(64, 32), randn(64, 32), torch.tensor(3.0, device=DEVICE), randn(8, 8), upto="schedule"
    )
    kinds = [type(it).__name__ if isinstance(it, ExternCall) else int(it.xnumel) for it in st.schedule.items]
    assert kinds == [2048, "ExternCall", 1, 2048]  # in graph order: the product waits for the scalar


# -------------------------------------------------------------------------------------------- renderer
def test_rendered_pointwise_kernel_matches_its_golden_file():
    """A reviewer reads generated code here: update with KILN_UPDATE_GOLDEN=1 when a change is intended."""
    st = staged(lambda x: torch.relu(x * 2 + 1), randn(64, 32), upto="render")
    (ks,) = st.kernels.launches
    path = GOLDEN / "pointwise_relu_chain.py"
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1":
        path.write_text(ks.source)
    assert ks.source == path.read_text(), f"kernel source changed; diff against {path}"


def test_rendering_is_deterministic():
    fn = lambda x: torch.softmax(x * 1.5, -1) + x.mean(-1, keepdim=True)  # noqa: E731
    a = staged(fn, randn(16, 40), upto="render")
    b = staged(fn, randn(16, 40), upto="render")
    assert [k.source for k in a.kernels.launches] == [k.source for k in b.kernels.launches]


def test_index_math_is_int32_only_when_every_size_of_the_group_and_the_program_is_static_and_small():
    small = KernelGroup(sympy.Integer(1024), sympy.Integer(1), [])
    assert index_dtype(small, True) == "tl.int32"
    assert index_dtype(small, False) == "tl.int64"  # some buffer of the graph is large or symbolic
    assert index_dtype(KernelGroup(sympy.Integer(2**31), sympy.Integer(1), []), True) == "tl.int64"
    assert (
        index_dtype(KernelGroup(sympy.Symbol("s0", positive=True), sympy.Integer(1), []), True) == "tl.int64"
    )
    st = staged(lambda x: (x + 1).sum(-1), randn(16, 40), upto="render")
    assert all("to(tl.int32)" in k.source for k in st.kernels.launches)


# --------------------------------------------------------------------------------------------- wrapper
def test_wrapper_allocates_launches_and_calls_the_extern_out_variant():
    st = staged(lambda a, b: torch.relu(a @ b) * 2, randn(8, 16), randn(16, 4))
    code = st.wrapper.code
    assert code.count("torch.mm(") == 1 and "out = " in code
    assert code.count("self.kiln_") == 1  # one fused epilogue kernel
    assert code.count("empty_strided") == 2  # the matmul's output and the kernel's
    calls = [n.op for n in st.wrapper.module.graph.nodes]
    assert calls[0] == "placeholder" and calls[-1] == "output"


def test_wrapper_writes_mutated_inputs_back_in_one_foreach_copy_per_dtype():
    """Mutated inputs (BatchNorm's running statistics and step counters in training) get their new values
    in one ``torch._foreach_copy_`` per dtype after every kernel, not one copy launch each (a list of mixed
    dtypes would take ATen's slow path); the caller sees every update."""

    def f(a, b, c, n, m):
        a.add_(1)
        b.mul_(2)
        c.copy_(a + b)
        n.add_(1)
        m.add_(n)
        return (a * b).sum()

    args = [randn(8, 8) for _ in range(3)] + [
        torch.zeros((), dtype=torch.int64, device=DEVICE) for _ in range(2)
    ]
    expected_args = [t.clone() for t in args]
    expected = f(*expected_args)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        got = torch.compile(f, backend="kiln")(*args)
    code = graphs[0].code
    assert code.count("torch._foreach_copy_(") == 2 and ".copy_(" not in code  # float32 and int64
    assert code.index("torch._foreach_copy_(") > code.rindex("self.kiln_")  # after every kernel
    torch.testing.assert_close(got, expected)
    for a, e in zip(args, expected_args):
        torch.testing.assert_close(a, e)


def test_index_equality_on_a_static_domain_sees_through_reshapes():
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from compiler.scheduler import RINDEX, XINDEX, same, same_on_domain

    flat = 1024 * FloorDiv(XINDEX, 32) + 32 * ModularIndexing(XINDEX, 1, 32) + RINDEX  # [4,32,32] row-major
    nested = 64 * FloorDiv(flat, 2048) + 32 * ModularIndexing(flat, 1024, 2) + ModularIndexing(flat, 32, 32)
    assert not same(nested, XINDEX)  # sympy alone cannot tell
    assert same_on_domain(nested, XINDEX, 128, 32)  # ... but they agree on every (x, r) of the group
    assert not same_on_domain(nested, XINDEX + 1, 128, 32)
    assert not same_on_domain(nested, XINDEX, 128, 33)  # r = 32 carries into the next row
    import sympy

    assert not same_on_domain(nested, XINDEX, sympy.Symbol("s0", positive=True, integer=True), 32)


def test_index_equality_sees_split_and_joined_digits_on_a_domain_too_large_to_evaluate():
    """A [B, S, V] view of [B*S, V] logits (Qwen2's 2048 rows of a 151936 vocabulary: past EVAL_LIMIT) indexes
    as digits of the row joined again; written as floors only they cancel, so a loss backward's reduction and
    its epilogue still compare equal and share a kernel."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from compiler.scheduler import EVAL_LIMIT, RINDEX, XINDEX, floors_only, same, same_on_domain

    rows, vocab = 2048, 151936
    assert rows * vocab > EVAL_LIMIT
    joined = RINDEX + 256 * vocab * FloorDiv(XINDEX, 256) + vocab * ModularIndexing(XINDEX, 1, 256)
    flat = RINDEX + vocab * XINDEX
    assert not same(joined, flat)  # sympy alone cannot tell
    assert sympy.expand(floors_only(joined) - flat) == 0
    assert same_on_domain(joined, flat, sympy.Integer(rows), sympy.Integer(vocab))
    wrong = RINDEX + 256 * vocab * FloorDiv(XINDEX, 256) + vocab * ModularIndexing(XINDEX, 1, 128)
    assert not same_on_domain(wrong, flat, sympy.Integer(rows), sympy.Integer(vocab))


def test_attention_softmax_through_a_reshape_is_one_kernel():
    """[B, H, S, S] scores normalized and reshaped into the [B*H, S, S] operand of the second bmm: the row
    reductions and the normalizing epilogue share one kernel (the epilogue's loads of the reductions are the
    same offsets, written through FloorDiv/ModularIndexing)."""

    def attn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.125
        p = torch.softmax(s, -1)
        return torch.bmm(p.reshape(-1, 32, 32), v.reshape(-1, 32, 16)).reshape(2, 2, 32, 16)

    q, k, v = (randn(2, 2, 32, 16) for _ in range(3))
    st = staged(attn, q, k, v, upto="schedule")
    reductions = [g for g in groups(st) if g.has_reduction]
    assert len(reductions) == 1 and len([g for g in groups(st)]) == 1
    out = torch.compile(attn, backend="kiln")(q, k, v)
    torch.testing.assert_close(out, attn(q, k, v), rtol=1e-5, atol=1e-5)


def _softmax_chain(x):
    for i in range(5):
        x = torch.softmax(x * 1.5, dim=i % 2)
    return x


def _allocations(st: types.SimpleNamespace) -> list:
    from compiler.codegen.wrapper import _allocates

    return [n for n in st.wrapper.module.graph.nodes if _allocates(n)]


def test_wrapper_reuses_the_memory_of_dead_buffers():
    """Five softmaxes: their row statistics and activations go to recycled buffers (4 allocations, not 10);
    the wrapper still computes the chain."""
    x = randn(64, 64)
    st = staged(_softmax_chain, x)
    launches = [n for n in st.wrapper.module.graph.nodes if n.op == "call_module"]
    assert len(launches) >= 5 and len(_allocations(st)) == 4
    torch.testing.assert_close(st.wrapper.module(x)[0], _softmax_chain(x))


def test_wrapper_never_hands_out_memory_that_escapes():
    """A graph output and a buffer a fallback reads (its result may alias it) keep their memory: the two
    intermediates of equal layout here are both outputs or read by sort, so nothing is reused."""

    def f(x):
        a = (x * 2).relu()
        b = torch.sort(a + 1, dim=1).values
        return a, (b * 3).exp()

    x = randn(16, 32)
    st = staged(f, x)
    allocs = _allocations(st)
    assert len(allocs) == len({n.name for n in allocs})
    got = st.wrapper.module(x)
    for g, r in zip(got, f(x)):
        torch.testing.assert_close(g, r)
    before = len(allocs)
    from compiler.codegen.wrapper import reuse_buffers

    assert reuse_buffers(st.wrapper.module.graph) == 0 and len(_allocations(st)) == before


def test_a_loss_backward_over_a_viewed_vocabulary_is_one_kernel_past_the_evaluation_limit(monkeypatch):
    """Cross-entropy of [B, S, V] logits viewed as [B*S, V], the logits returned too (HF's causal LMs): the
    backward's row sum and its full-size epilogue share one kernel even where the domain is too large to
    compare their indices by evaluation (here EVAL_LIMIT is lowered to force that)."""
    import torch.nn.functional as F

    import compiler.scheduler as scheduler

    monkeypatch.setattr(scheduler, "EVAL_LIMIT", 1)

    def lm_loss(logits, labels):
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1)), logits

    torch.manual_seed(0)
    logits = torch.randn(4, 16, 300, requires_grad=True)
    labels = torch.randint(0, 300, (4, 16))
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        loss, out = torch.compile(lm_loss, backend="kiln")(logits, labels)
        (loss + out.sum() * 1e-3).backward()
    ref = logits.detach().clone().requires_grad_(True)
    rl, ro = lm_loss(ref, labels)
    (rl + ro.sum() * 1e-3).backward()
    torch.testing.assert_close(logits.grad, ref.grad)
    backward = graphs[-1].wrapper.code
    assert backward.count("self.kiln_") == 1, backward
