"""The scatter family (index_put, index_add, scatter_add, scatter_reduce, the embedding backward) as Triton kernels
(atomics; float sums order-fixed up to ``ordered_scatter_max`` sources, else atomics with a note), scans (cumsum, cumprod, logcumsumexp) through ``tl.associative_scan``, and the ATen fallbacks that stay
(with their reasons): OpInfo-style cases over dtypes, duplicate and negative indices, broadcast index shapes,
dynamic shapes, empty indices, the determinism switch and a training step of an embedding model."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_layers import staged

import compiler
from kiln_testing import launch_log

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "i64": torch.int64}
#: atomic float sums run in any order (fp32 accumulation for fp16/bf16, where eager may round each add)
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1.6e-2, 3e-2),
    torch.int64: (0, 0),
}
SCATTERS = ("index_put.default", "scatter_add.default", "scatter_reduce.two")


def make(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.randn(shape).to(device, dtype)
    return torch.randint(-20, 20, shape).to(device, dtype)


def run(fn, *args, dynamic=False, **settings):
    torch._dynamo.reset()
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln", dynamic=dynamic)(*args)
    return out, graphs


def check(fn, *args, dynamic=False):
    """Compiled equals eager (within the atomic-order tolerance of the output dtype); returns the graphs."""
    out, graphs = run(fn, *args, dynamic=dynamic)
    want = fn(*args)
    for o, w in zip(out, want) if isinstance(want, tuple) else [(out, want)]:
        rtol, atol = TOL.get(w.dtype, (1e-5, 1e-5))
        torch.testing.assert_close(o, w, rtol=rtol, atol=atol)
    return graphs


def scatter_kernels(graphs) -> list[str]:
    return [src for g in graphs for name, src in g.kernel_sources.items() if name.startswith("kiln_scatter_")]


def assert_lowered(graphs):
    assert [str(r) for g in graphs for r in g.all_fallbacks()] == []
    assert scatter_kernels(graphs), "no scatter kernel"


# ------------------------------------------------------------------------------------------- OpInfo-style cases
def _index_put_acc(x, i, v):
    return torch.index_put(x, (i,), v, accumulate=True)


def _index_put_2d(x, i, j, v):  # broadcast index shapes (3, 1) x (1, 4), duplicates across both
    return torch.index_put(x, (i, j), v, accumulate=True)


def _index_put_inner(x, i, v):  # x[:, i] += v (an index after a full slice)
    return torch.ops.aten.index_put.default(x, [None, i], v, True)


def _index_put_split(x, i, j, v):  # non-adjacent index tensors: the broadcast dims go first
    return torch.ops.aten.index_put.default(x, [i, None, j], v, True)


CASES = {
    # name: (fn, make(dtype, device) -> args)
    "index_put_acc_dup_neg": (
        _index_put_acc,
        lambda t, d: (
            make((10, 4), t, d),
            torch.tensor([0, 3, 3, -1, 9, 0, -10], device=d),
            make((7, 4), t, d),
        ),
    ),
    "index_put_acc_bcast_value": (
        _index_put_acc,
        lambda t, d: (make((6, 5), t, d), torch.tensor([1, 1, 4], device=d), make((5,), t, d)),
    ),
    "index_put_acc_2d_bcast_index": (
        _index_put_2d,
        lambda t, d: (
            make((5, 6), t, d),
            torch.tensor([[0], [2], [0]], device=d),
            torch.tensor([[1, 5, 1, -1]], device=d),
            make((3, 4), t, d),
        ),
    ),
    "index_put_acc_inner": (
        _index_put_inner,
        lambda t, d: (make((3, 8), t, d), torch.tensor([7, 0, 7, 2], device=d), make((3, 4), t, d)),
    ),
    "index_put_acc_split": (
        _index_put_split,
        lambda t, d: (
            make((4, 3, 5), t, d),
            torch.tensor([0, 3, 0], device=d),
            torch.tensor([4, -5, 4], device=d),
            make((3, 3), t, d),
        ),
    ),
    "index_put_store_unique": (
        lambda x, i, v: torch.index_put(x, (i,), v),
        lambda t, d: (make((8, 3), t, d), torch.tensor([5, -1, 0], device=d), make((3, 3), t, d)),
    ),
    "index_put_store_mask_rows": (
        lambda x, i, v: torch.index_put(x, (i,), v[:1] > 0),
        lambda t, d: (make((5, 3), t, d) > 0, torch.tensor([4, 0], device=d), make((2, 3), t, d)),
    ),
    "index_add_dim0": (
        lambda x, i, v: x.index_add(0, i, v, alpha=2),
        lambda t, d: (make((6, 4), t, d), torch.tensor([0, 5, 0, 2, 2], device=d), make((5, 4), t, d)),
    ),
    "index_add_dim1": (
        lambda x, i, v: x.index_add(1, i, v),
        lambda t, d: (make((3, 7), t, d), torch.tensor([6, 6, 1], device=d), make((3, 3), t, d)),
    ),
    "scatter_add_dim0": (
        lambda x, i, v: x.scatter_add(0, i, v),
        lambda t, d: (make((5, 4), t, d), torch.randint(0, 5, (8, 4), device=d), make((8, 4), t, d)),
    ),
    "scatter_add_dim1_small_index": (
        lambda x, i, v: x.scatter_add(1, i, v),
        lambda t, d: (make((3, 6), t, d), torch.randint(0, 6, (2, 9), device=d), make((3, 10), t, d)),
    ),
}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_scatter_family_matches_eager_without_fallback(name, dtype, device):
    fn, mk = CASES[name]
    graphs = check(fn, *mk(DTYPES[dtype], device))
    assert_lowered(graphs)
    src = "\n".join(scatter_kernels(graphs))
    if "store" in name:
        assert "tl.store(" in src and "atomic" not in src
        store = next(line for line in src.splitlines() if "tl.store(" in line)
        assert ".to(tl.float32)" not in store or DTYPES[dtype] == torch.float32  # stores keep eager's dtype
        return
    if not DTYPES[dtype].is_floating_point:  # integer sums are exact in any order: atomics
        assert "tl.atomic_add(" in src
        return
    assert "atomic" not in src and "head" in src  # float sums: the order-fixed kernel
    if DTYPES[dtype] in (torch.float16, torch.bfloat16):  # accumulated in fp32, cast back when read
        assert "tl.float32" in src and "tl.bfloat16" not in src.split("total = tl.zeros(")[-1]


@pytest.mark.parametrize("include_self", [True, False], ids=["self", "noself"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_scatter_reduce_matches_eager(reduce, include_self, dtype, device):
    t = DTYPES[dtype]
    x, src = make((5, 6), t, device), make((7, 6), t, device)
    index = torch.randint(0, 4, (7, 6), device=device)  # row 4 receives nothing: keeps self

    def fn(x, i, s):
        return x.scatter_reduce(0, i, s, reduce, include_self=include_self)

    graphs = check(fn, x, index, src)
    assert_lowered(graphs)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16], ids=["i8", "u8", "i16"])
def test_narrow_integer_sums_wrap_like_eager(dtype, device):
    """8/16-bit integers accumulate in int32 atomics; sums and means overflow (wrap) as eager's own-dtype ones do."""
    x = torch.tensor([100, 5, 120], dtype=dtype, device=device)
    src = torch.tensor([100, 90, 7, 120, 120], dtype=dtype, device=device)
    index = torch.tensor([0, 0, 1, 2, 2], device=device)
    for reduce in ("sum", "mean"):
        for include_self in (True, False):
            fn = lambda x, i, s, reduce=reduce, include_self=include_self: x.scatter_reduce(  # noqa: E731
                0, i, s, reduce, include_self=include_self
            )
            out, graphs = run(fn, x, index, src)
            assert torch.equal(out, fn(x, index, src)), (reduce, include_self)
            assert_lowered(graphs)


def test_scatter_reduce_amax_propagates_nan(device):
    x = torch.tensor([[1.0, float("nan"), 3.0]], device=device)
    src = torch.tensor([[float("nan"), 5.0, 2.0], [4.0, 0.0, 9.0]], device=device)
    index = torch.zeros(2, 3, dtype=torch.int64, device=device)
    for reduce in ("amax", "amin"):
        fn = lambda x, i, s, reduce=reduce: x.scatter_reduce(0, i, s, reduce)  # noqa: E731
        out, graphs = run(fn, x, index, src)
        torch.testing.assert_close(out, fn(x, index, src), equal_nan=True)
        assert_lowered(graphs)


def test_scatter_reduce_prod_falls_back_with_reason(device):
    x, src = torch.randn(4, 3, device=device), torch.randn(6, 3, device=device)
    index = torch.randint(0, 4, (6, 3), device=device)
    fn = lambda x, i, s: x.scatter_reduce(0, i, s, "prod")  # noqa: E731
    out, graphs = run(fn, x, index, src)
    torch.testing.assert_close(out, fn(x, index, src))
    assert [(r.kind, r.op) for r in graphs[0].fallbacks] == [("atomics", "aten.scatter_reduce.two")]


def test_empty_index_leaves_self(device):
    x, v = torch.randn(5, 3, device=device), torch.randn(0, 3, device=device)
    i = torch.zeros(0, dtype=torch.int64, device=device)
    graphs = check(_index_put_acc, x, i, v)
    assert_lowered(graphs)


def test_dynamic_shapes_one_compile_for_several_sizes(device):
    fn = torch.compile(_index_put_acc, backend="kiln", dynamic=True)
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        for n, k in ((10, 7), (13, 30), (4, 2)):
            x, v = torch.randn(n, 5, device=device), torch.randn(k, 5, device=device)
            i = torch.randint(-n, n, (k,), device=device)
            torch.testing.assert_close(fn(x, i, v), _index_put_acc(x, i, v), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1
    assert_lowered(graphs)


def test_out_of_range_indices_write_nothing(device):
    """eager raises on them; the kernel masks them off instead of writing outside the buffer"""
    x, v = torch.zeros(4, device=device), torch.ones(3, device=device)
    i = torch.tensor([1, 4, -5], device=device)
    out, graphs = run(_index_put_acc, x, i, v)
    assert out.tolist() == [0.0, 1.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------- determinism
def test_deterministic_algorithms_keep_aten_with_reason(device):
    x, v = torch.randn(6, 4, device=device), torch.randn(5, 4, device=device)
    i = torch.tensor([0, 5, 0, 2, 2], device=device)
    xi, vi = x.to(torch.int64), v.to(torch.int64)
    idx = torch.randint(0, 6, (5, 4), device=device)
    amax = lambda x, i, s: x.scatter_reduce(0, i, s, "amax")  # noqa: E731
    want = (_index_put_acc(x, i, v), _index_put_acc(xi, i, vi), amax(x, idx, v))  # eager, outside the mode
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = [run(_index_put_acc, x, i, v), run(_index_put_acc, xi, i, vi), run(amax, x, idx, v)]
    finally:
        torch.use_deterministic_algorithms(prev)
    for (out, _), w in zip(got, want):
        torch.testing.assert_close(out, w)
    reasons = [[(r.kind, r.op) for r in graphs[0].fallbacks] for _, graphs in got]
    # float sums keep ATen; order-independent writes (integer sums, maxima) stay lowered
    assert reasons == [[("determinism", "aten.index_put.default")], [], []]
    out, graphs = run(_index_put_acc, x, i, v)  # switched off again: atomics
    assert_lowered(graphs)


def test_flipping_determinism_recompiles(device):
    """Dynamo guards on the switch: one compiled function gets an ATen graph while it is on, and its atomic graph
    back when it is off again."""
    x, v, i = (
        torch.randn(6, 4, device=device),
        torch.randn(3, 4, device=device),
        torch.tensor([0, 1, 1], device=device),
    )
    torch._dynamo.reset()
    f = torch.compile(_index_put_acc, backend="kiln")
    prev = torch.are_deterministic_algorithms_enabled()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        try:
            f(x, i, v)
            torch.use_deterministic_algorithms(True)
            torch.testing.assert_close(f(x, i, v), _index_put_acc(x, i, v))
        finally:
            torch.use_deterministic_algorithms(prev)
        torch.testing.assert_close(f(x, i, v), _index_put_acc(x, i, v))
    assert [[r.kind for r in g.fallbacks] for g in graphs] == [[], ["determinism"]]


# ------------------------------------------------------------------------------------------- scheduling
def test_scatter_kernel_stands_alone_and_readers_run_after_it(device):
    """The target's fill/copy, the atomics and every read of the result are three kernels in that order; a
    reduction over the result (which would fuse with a pointwise producer) reads it only after the atomics."""

    def fn(x, i, v):
        y = torch.index_put(x * 2, (i,), v, accumulate=True)
        return y.sum(1) + 1, y * 3

    # on the test device: a GPU host lowers only GPU tensors (CPU ones run through ATen there)
    x, v, i = (
        torch.randn(6, 4, device=device),
        torch.randn(9, 4, device=device),
        torch.randint(0, 6, (9,), device=device),
    )
    st = staged(fn, x, i, v, upto="schedule")
    groups = st.schedule.groups
    kinds = [g.kind for g in groups]
    assert kinds.count("scatter") == 1
    k = kinds.index("scatter")
    (member,) = groups[k].members
    target = member.buf.definition.target
    assert any(target in g.buffer_names for g in groups[:k])
    readers = [
        j
        for j, g in enumerate(groups)
        if any(member.buf.name in (ld.buffer for ld in _loads(m)) for m in g.members)
    ]
    assert readers and min(readers) > k
    graphs = check(fn, x, i, v)
    assert_lowered(graphs)


def test_schedule_verify_catches_a_scatter_sharing_its_kernel_or_running_first(device):
    from compiler.exc import InvariantError

    x, v, i = (
        torch.randn(6, 4, device=device),
        torch.randn(9, 4, device=device),
        torch.randint(0, 6, (9,), device=device),
    )
    st = staged(
        lambda x, i, v: torch.index_put(x * 2, (i,), v, accumulate=True) + 1, x, i, v, upto="schedule"
    )
    st.schedule.verify()
    items = st.schedule.items
    k = next(j for j, it in enumerate(items) if getattr(it, "kind", "") == "scatter")
    scatter = items[k]
    scatter.members.append(items[k - 1].members[0])
    with pytest.raises(InvariantError, match="holds"):
        st.schedule.verify()
    scatter.members.pop()
    items[k - 1], items[k] = items[k], items[k - 1]
    with pytest.raises(InvariantError, match="before"):
        st.schedule.verify()


def _loads(m):
    from compiler.kexpr import loads

    return loads(m.value)


# ------------------------------------------------------------------------------------------- training
class TinyBert(nn.Module):
    """Word, position and token-type embeddings, a LayerNorm and a linear head (BERT's embedding block)."""

    def __init__(self, vocab=64, hidden=16, dtype=torch.float32):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.pos = nn.Embedding(12, hidden)
        self.kind = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)
        self.to(dtype)

    def forward(self, ids, types):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.word(ids) + self.pos(pos) + self.kind(types))
        return F.cross_entropy(self.head(h).flatten(0, 1).float(), ids.flatten())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_embedding_training_step_has_no_fallback(dtype, device):
    torch.manual_seed(0)
    model = TinyBert(dtype=dtype).to(device)
    ref = TinyBert(dtype=dtype).to(device)
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, 64, (3, 10), device=device)
    ids[0, :3] = 0  # padding rows get no gradient
    ids[1, :4] = 7  # duplicates
    types = torch.randint(0, 2, (3, 10), device=device)
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        torch.compile(model, backend="kiln")(ids, types).backward()
    ref(ids, types).backward()
    assert len(graphs) == 2
    assert [str(r) for g in graphs for r in g.all_fallbacks()] == []
    assert len(scatter_kernels(graphs[1:])) >= 3  # word, position, token type
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m, n=name: f"{n}: {m}")
    assert torch.all(model.word.weight.grad[0] == 0)


def test_embedding_backward_scaled_by_frequency(device):
    """``scale_grad_by_freq``: the decomposition counts each id with a second accumulating index_put"""
    emb = nn.Embedding(20, 8, scale_grad_by_freq=True, padding_idx=3).to(device)
    ref = nn.Embedding(20, 8, scale_grad_by_freq=True, padding_idx=3).to(device)
    ref.load_state_dict(emb.state_dict())
    ids = torch.tensor([[1, 1, 3, 5], [5, 5, 5, 0]], device=device)
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        torch.compile(lambda i: emb(i).pow(2).sum(), backend="kiln")(ids).backward()
    ref(ids).pow(2).sum().backward()
    torch.testing.assert_close(emb.weight.grad, ref.weight.grad)
    assert_lowered(graphs)
    assert len(scatter_kernels(graphs)) == 2


# ------------------------------------------------------------------------------------------- scans
SCANS = {
    "cumsum": lambda x: x.cumsum(-1),
    "cumprod": lambda x: x.cumprod(-1),
    "logcumsumexp": lambda x: x.logcumsumexp(-1),
    "cumsum_dim0_of_1d": lambda x: x.flatten().cumsum(0),
    "cumsum_fp64_out": lambda x: x.cumsum(-1, dtype=torch.float64),
}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("name", sorted(SCANS))
def test_scans_match_eager(name, dtype, device):
    t = DTYPES[dtype]
    if name == "logcumsumexp" and not t.is_floating_point:
        pytest.skip("logcumsumexp is defined for floats only")
    x = make((4, 37), t, device)
    if name == "cumprod":
        x = (x.float() / 20 + 1).to(t) if t.is_floating_point else x % 3 - 1
    out, graphs = run(SCANS[name], x)
    want = SCANS[name](x)
    rtol, atol = TOL[want.dtype] if want.dtype in TOL else (1e-6, 1e-6)
    torch.testing.assert_close(out, want, rtol=rtol * 4, atol=atol * 4)
    assert graphs[0].fallbacks == []
    assert any(n.startswith("kiln_scan_") for n in graphs[0].kernel_sources)


def test_scan_special_values(device):
    x = torch.tensor(
        [[float("-inf"), 0.0, float("inf"), 1.0], [float("nan"), 1.0, 2.0, 3.0], [float("-inf")] * 4],
        device=device,
    )
    for fn in (SCANS["logcumsumexp"], SCANS["cumsum"]):
        out, graphs = run(fn, x)
        torch.testing.assert_close(out, fn(x), equal_nan=True)


def test_looped_scan_carries_across_chunks_and_dynamic_rows(device):
    """A dynamic row length that fitted a block when compiled but not when run loops over chunks with a carry
    (blocks made tiny here: 256 elements)."""
    small = {"persistent_rblock_max": 256, "interp_persistent_rblock_max": 256, "looped_rblock": 256}
    for name in ("cumsum", "cumprod", "logcumsumexp"):
        torch._dynamo.reset()
        fn = SCANS[name]
        f = torch.compile(fn, backend="kiln", dynamic=True)
        with compiler.config.patch(strict=True, **small), compiler.capture() as graphs, launch_log() as log:
            for n in (40, 1000):
                x = torch.randn(3, n, device=device)
                x = x / 50 + 1 if name == "cumprod" else x
                torch.testing.assert_close(f(x), fn(x), rtol=1e-4, atol=1e-4)
        assert len(graphs) == 1 and graphs[0].fallbacks == []
        assert [cfg["PERSISTENT"] for _, cfg in log] == [True, False]


def test_scans_that_do_not_pay_stay_aten_with_reasons(device):
    out, graphs = run(lambda x: x.cumsum(0), torch.randn(8, 16, device=device))
    assert [(r.kind, r.op) for r in graphs[0].fallbacks] == [("layout", "aten.cumsum.default")]
    x = torch.randn(2, 300, device=device)
    out, graphs = run(lambda x: x.cumsum(-1), x, persistent_rblock_max=256)
    assert [(r.kind, r.op) for r in graphs[0].fallbacks] == [("size", "aten.cumsum.default")]
    torch.testing.assert_close(out, x.cumsum(-1))


def test_dynamic_scan(device):
    fn = torch.compile(lambda x: x.cumsum(-1) * 2, backend="kiln", dynamic=True)
    torch._dynamo.reset()
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        for shape in ((3, 20), (5, 33), (2, 7)):
            x = torch.randn(*shape, device=device)
            torch.testing.assert_close(fn(x), x.cumsum(-1) * 2, rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1 and graphs[0].fallbacks == []


# ------------------------------------------------------------------------------------------- order-fixed sums
def _emb_grad(grad, ids):
    return torch.ops.aten.embedding_dense_backward(grad, ids, 24, -1, False)


def _emb_args(device, n=300):
    torch.manual_seed(1)
    return torch.randn(n, 16, device=device), torch.randint(0, 24, (n,), device=device)


def test_small_float_sums_are_ordered_without_atomics_and_unnoted(device):
    """Float-sum scatters up to ``ordered_scatter_max`` sources use the order-fixed kernel (no atomics) and leave
    no ``nondeterministic`` note; integer sums keep their (exact) atomics."""
    grad, ids = _emb_args(device)
    out, graphs = run(_emb_grad, grad, ids)
    torch.testing.assert_close(out, _emb_grad(grad, ids), rtol=1e-5, atol=1e-5)
    (src,) = scatter_kernels(graphs)
    assert "atomic" not in src and "head" in src
    assert [n for g in graphs for n in g.all_nondeterministic()] == []
    x, i = make((6, 4), torch.int64, device), torch.randint(0, 6, (9,), device=device)
    _, graphs = run(_index_put_acc, x, i, make((9, 4), torch.int64, device))
    assert "tl.atomic_add" in scatter_kernels(graphs)[0]


def test_ordered_sum_adds_each_target_in_source_order(device):
    """The ordered kernel's sum of one target's sources is fixed: equal to a float32 sum that adds chunks of
    ``QBLOCK`` sources in source order (checked bitwise on values where order matters: 1e8 and ones)."""
    from compiler.codegen.scatter_kernel import QBLOCK

    n = 4 * QBLOCK
    vals = torch.ones(n, 1)
    vals[0] = 1e8  # 1e8 + 1 == 1e8 in fp32: a sum that adds the ones first differs
    vals[QBLOCK] = -1e8
    ids = torch.zeros(n, dtype=torch.int64)
    grad, ids = vals.to(device), ids.to(device)
    out, _ = run(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 2, -1, False), grad, ids)
    chunks = [vals[k : k + QBLOCK, 0].sum() for k in range(0, n, QBLOCK)]  # each chunk's exact-enough sum
    want = torch.zeros((), dtype=torch.float32)
    for c in chunks:
        want = want + c
    assert out[0, 0].item() == want.item() and out[1, 0].item() == 0


def test_large_or_atomic_float_sums_are_noted(device):
    grad, ids = _emb_args(device)
    for settings, why in (
        ({"ordered_scatter_max": 64}, "more than ordered_scatter_max=64"),
        ({"scatter_order": "atomic"}, "scatter_order=atomic"),
    ):
        out, graphs = run(_emb_grad, grad, ids, **settings)
        torch.testing.assert_close(out, _emb_grad(grad, ids), rtol=1e-5, atol=1e-5)
        assert "tl.atomic_add" in scatter_kernels(graphs)[0]
        notes = [n for g in graphs for n in g.all_nondeterministic()]
        assert [(n.kind, n.op) for n in notes] == [("nondeterministic", "aten.index_put.default")]
        assert why in notes[0].detail


def test_racing_index_put_stores_are_noted(device):
    x, i, v = (
        make((8, 3), torch.float32, device),
        torch.tensor([5, -1, 0], device=device),
        make((3, 3), torch.float32, device),
    )
    _, graphs = run(lambda a, b, c: torch.index_put(a, (b,), c), x, i, v)
    assert [n.kind for g in graphs for n in g.all_nondeterministic()] == ["nondeterministic"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_ordered_scatters_are_bitwise_identical_run_to_run(dtype, device):
    """Two compiles and several runs of every float-sum case give the same bits."""
    t = DTYPES[dtype]
    for name in (
        "index_put_acc_dup_neg",
        "index_put_acc_2d_bcast_index",
        "index_add_dim0",
        "scatter_add_dim0",
    ):
        fn, mk = CASES[name]
        torch.manual_seed(2)
        args = mk(t, device)
        first, graphs = run(fn, *args)
        assert [n for g in graphs for n in g.all_nondeterministic()] == [], name
        again, _ = run(fn, *args)
        compiled = torch.compile(fn, backend="kiln")
        for out in [again] + [compiled(*args) for _ in range(3)]:
            assert torch.equal(
                out.view(torch.uint8) if out.dtype.is_floating_point else out,
                first.view(torch.uint8) if first.dtype.is_floating_point else first,
            ), name
