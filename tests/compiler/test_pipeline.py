"""End-to-end facts about the pass pipeline: fusion counts, views, externs, fallbacks, determinism, dumps."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.backend import PASSES


def run(fn, *args, dynamic=False):
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln", dynamic=dynamic)(*args)
    return out, graphs


def test_passes_are_named_and_explained():
    names = [p.name for p in PASSES]
    assert names == [
        "input_strides",
        "attention",
        "conv_layout",
        "mm_layout",
        "addmm_bias",
        "lower",
        "schedule",
        "in_place",
        "split",
        "render",
        "combo",
        "wrap",
        "precompile",
        "dump",
    ]
    assert all(p.why for p in PASSES)
    assert [p.makes for p in PASSES] == [
        None,
        None,
        None,
        None,
        None,
        "program",
        "schedule",
        "schedule",
        "schedule",
        "kernels",
        "kernels",
        "wrapper",
        None,
        None,
    ]
    # each pass reads only products made before it (or the job itself)
    made = {"job"}
    for p in PASSES:
        assert set(p.needs) <= made, p.name
        made |= {p.makes} - {None}


def test_relu_chain_is_one_kernel(device):
    x = torch.randn(64, 32, device=device)
    out, graphs = run(lambda x: torch.relu(x * 2 + 1), x)
    torch.testing.assert_close(out, torch.relu(x * 2 + 1))
    assert graphs[0].kernel_count == 1 and graphs[0].extern_count == 0


@pytest.mark.parametrize(
    "fn",
    [lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, -1), lambda x: F.layer_norm(x, x.shape[-1:])],
    ids=["softmax", "log_softmax", "layer_norm"],
)
def test_row_normalizations_are_one_kernel(device, fn):
    x = torch.randn(16, 100, device=device)
    out, graphs = run(fn, x)
    torch.testing.assert_close(out, fn(x), atol=1e-5, rtol=1e-5)
    assert graphs[0].kernel_count == 1


def test_linear_bias_gelu_is_one_extern_plus_one_kernel(device):
    x, w, b = (
        torch.randn(8, 32, device=device),
        torch.randn(16, 32, device=device),
        torch.randn(16, device=device),
    )
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    out, graphs = run(fn, x, w, b)
    torch.testing.assert_close(out, fn(x, w, b), atol=1e-4, rtol=1e-4)
    assert (graphs[0].extern_count, graphs[0].kernel_count) == (1, 1)
    assert "torch.addmm(" in graphs[0].code and "out = buf" in graphs[0].code


def _packed_positions(x):
    """transformers' packed-sequence check: position ids (a function of the index alone) read at two offsets,
    their differences scanned (``x`` gives the sizes)."""
    i = torch.arange(x.shape[1] + 1, device=x.device).expand(x.shape[0], -1)
    pos = torch.where(i < 1, i - 1, i * 2 + 3)
    return (pos[:, 1:] - pos[:, :-1] != 2).cumsum(-1)


def _read_positions(x):
    """The same with the ids computed from memory (``x``'s own values): a value read twice is then stored."""
    pos = torch.where(x < 1, x - 1, x * 2 + 3)
    return (pos[:, 1:] - pos[:, :-1] != 2).cumsum(-1)


def test_an_index_only_value_read_twice_is_inlined_not_stored(device):
    """A value that loads nothing is recomputed where it is read (integer arithmetic), not stored by a kernel of
    its own and read back: the position ids go into the scan's kernel (GPT-2 inference under transformers 5:
    one launch a step fewer); a value that reads memory and is read twice is still stored once."""
    x = torch.randint(0, 5, (3, 17), device=device)
    out, graphs = run(_packed_positions, x)
    torch.testing.assert_close(out, _packed_positions(x))
    assert graphs[0].kernel_count == 1, graphs[0].code
    out, graphs = run(_read_positions, x)
    torch.testing.assert_close(out, _read_positions(x))
    assert graphs[0].kernel_count == 2, graphs[0].code


def _mask_twice(w1, w2):
    """An index-only mask (kept inline) that two matmuls, extern kernels, read from memory."""
    i = torch.arange(16, device=w1.device).view(16, 1)
    j = torch.arange(16, device=w1.device).view(1, 16)
    mask = torch.where(i >= j, (i - j).float() * 0.5, torch.full((), -3.0, device=w1.device))
    return mask @ w1, mask @ w2


def _scaled_twice(x, w1, w2):
    """A cheap value of an input (kept inline) that two matmuls read from memory."""
    y = x * 2
    return y @ w1, y @ w2


@pytest.mark.parametrize("fn, nargs", [(_mask_twice, 2), (_scaled_twice, 3)], ids=["index-only", "cheap"])
def test_a_value_kept_inline_is_stored_once_for_every_extern_that_reads_it(device, fn, nargs):
    """A Lazy value kept inline (read by several users) and realized by each extern kernel that needs it in memory
    is one buffer computed by one kernel, not a copy per extern."""
    args = [torch.randn(16, 16, device=device) for _ in range(nargs - 2)] + [
        torch.randn(16, 8, device=device) for _ in range(2)
    ]
    out, graphs = run(fn, *args)
    torch.testing.assert_close(out, fn(*args))
    assert (graphs[0].kernel_count, graphs[0].extern_count) == (1, 2), graphs[0].code
    assert graphs[0].code.count("empty_strided") == 3, graphs[0].code  # the value's buffer and two products


def test_slice_transpose_is_a_view_without_kernels(device):
    x = torch.randn(8, 6, device=device)
    out, graphs = run(lambda x: x[2:5].t(), x)
    assert torch.equal(out, x[2:5].t()) and out.stride() == x[2:5].t().stride()
    assert graphs[0].kernel_count == 0 and "reinterpret_tensor" in graphs[0].code


def _norm_then_three_products(x, w1, w2, w3):
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # a graph output too: stored 3-D
    h = normed.reshape(-1, x.shape[-1])
    return normed, h @ w1, h @ w2, (h @ w3).view(x.shape[0], x.shape[1], -1)


def test_a_buffer_read_in_one_geometry_by_several_externs_is_viewed_once(device):
    """The normalized activation that a transformer's Q, K and V products read (kiln's kernel writes it, three
    matmuls read it as a 2-D view): one view node in the wrapper, called as Dynamo's C helper (the buffer is
    the wrapper's own allocation: storage offset 0, no Python frame); a view of a graph input keeps
    ``reinterpret_tensor``, which reads the input's offset at run time."""
    from compiler.runtime.restride import reinterpret_c, reinterpret_tensor

    if reinterpret_c is None:
        pytest.skip("this torch has no C view helper (torch._C._dynamo.guards._reinterpret_tensor)")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, generator=g).to(device)
    ws = [(torch.randn(16, n, generator=g) * 0.2).to(device).t().contiguous().t() for n in (16, 8, 8)]
    out, graphs = run(_norm_then_three_products, x, *ws)
    for got, want in zip(out, _norm_then_three_products(x, *ws)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    gm = graphs[0].wrapper
    views = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in (reinterpret_c, reinterpret_tensor)
    ]
    mms = [n for n in gm.graph.nodes if n.op == "call_function" and "mm" in getattr(n.target, "__name__", "")]
    assert len(mms) == 3 and len(views) >= 2, graphs[0].code
    inputs = {mm.args[0] for mm in mms}
    assert len(inputs) == 1, graphs[0].code  # one view node feeds the three products
    (act,) = inputs
    assert act.target is reinterpret_c, graphs[0].code
    assert all(v.target is reinterpret_tensor for v in views if v.args[0].op == "placeholder"), graphs[0].code


def test_unsupported_op_falls_back_with_reason(device):
    x = torch.randn(4, 9, device=device)
    fn = lambda x: torch.sort(x, -1)[0] * 2  # noqa: E731
    out, graphs = run(fn, x)
    torch.testing.assert_close(out, fn(x))
    reasons = graphs[0].fallbacks
    assert [(r.kind, r.op) for r in reasons] == [("unsupported_op", "aten.sort.default")]
    assert graphs[0].kernel_count == 1


def test_same_graph_gives_identical_sources(device):
    x = torch.randn(4, 33, device=device)
    fn = lambda x: torch.softmax(x * 3, -1) + x.amax(0)  # noqa: E731
    _, g1 = run(fn, x)
    torch._dynamo.reset()
    _, g2 = run(fn, x)
    assert g1[0].kernel_sources == g2[0].kernel_sources
    assert g1[0].code == g2[0].code


def test_dump_dir_writes_wrapper_kernels_and_launch_specs(tmp_path, device):
    x = torch.randn(4, 8, device=device)
    with compiler.config.patch(dump_dir=str(tmp_path)):
        out, graphs = run(lambda x: (x + 1).sum(-1), x)
    kernels = sorted(os.listdir(tmp_path / "kernels"))
    name = next(iter(graphs[0].kernel_sources))
    assert f"{name}.py" in kernels
    specs = [k for k in kernels if k.endswith(".json")]
    assert specs, kernels
    spec = json.loads((tmp_path / "kernels" / specs[0]).read_text())
    assert (
        spec["kernel"] == name and spec["signature"]["in_ptr0"] == "*fp32" and "XBLOCK" in spec["constexprs"]
    )
    assert os.listdir(tmp_path / "graphs")


def test_backward_matches_eager(device):
    w = torch.randn(16, 16, device=device, requires_grad=True)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    fn = lambda x, w: F.layer_norm(torch.tanh(x @ w), (16,)).pow(2).sum()  # noqa: E731
    with compiler.config.patch(strict=True):
        torch.compile(fn, backend="kiln")(x, w).backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    fn(x, w).backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, w.grad, atol=1e-4, rtol=1e-4)


def _allocated_bytes(gm: torch.fx.GraphModule) -> int:
    """Bytes of every buffer a wrapper allocates (`torch.empty_strided` or Dynamo's C allocators)."""
    total = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and "empty_strided" in getattr(n.target, "__name__", ""):
            numel = 1
            for d in n.args[0]:
                numel *= d
            dtype = n.kwargs["dtype"] if "dtype" in n.kwargs else n.args[2]
            total += numel * dtype.itemsize
    assert total, "no allocation found"
    return total


def test_forward_saves_few_activations_for_backward(device):
    # the min-cut partitioner recomputes cheap pointwise work in backward: an RMSNorm forward keeps its
    # input and the per-row rsqrt, not an fp32 copy of the input (which doubled the backward's traffic)
    x = torch.randn(64, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, device=device, dtype=torch.bfloat16, requires_grad=True)

    def rms_norm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(rms_norm, backend="kiln")(x, w)
        out.backward(torch.ones_like(out))
    fwd = graphs[0]
    output_bytes = 64 * 256 * 2
    assert _allocated_bytes(fwd.wrapper) <= output_bytes + 64 * 4, fwd.code
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    ref = rms_norm(x, w)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(gx, x.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gw, w.grad, atol=2e-1, rtol=2e-2)


def test_input_mutation_semantics(device):
    def fn(x, y):
        x.add_(1)
        y.mul_(2)
        return x + y

    a, b = torch.randn(5, device=device), torch.randn(5, device=device)
    a2, b2 = a.clone(), b.clone()
    out = torch.compile(fn, backend="kiln")(a, b)
    ref = fn(a2, b2)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(b, b2)


def test_export_aot_runs_at_new_sizes(device):
    from torch.export import Dim, export

    from compiler.aot import compile_exported

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2, -1)

    s = Dim("s", min=2, max=64)
    ep = export(M(), (torch.randn(5, 4, device=device),), dynamic_shapes={"x": {0: 2 * s + 1}})
    cm = compile_exported(ep)
    assert "floordiv" in cm.wrapper.code  # the size 2*s+1 is solved for s with integer ops
    for n in (5, 9, 31):
        x = torch.randn(n, 4, device=device)
        torch.testing.assert_close(cm(x), torch.softmax(x * 2, -1))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, -1),
        lambda x: F.layer_norm(x, x.shape[-1:]),
        lambda x: x.max(-1),
        lambda x: (x.var(-1), x.argmin(-1), x.prod(-1).abs().log1p()),
        lambda x: x / x.sum(),
    ],
    ids=["softmax", "layer_norm", "max_indices", "var_argmin_prod", "full_sum"],
)
def test_looped_reductions_match_persistent(device, fn):
    """Rows longer than the persistent limit take the looped path (several loops in one kernel)."""
    x = torch.randn(6, 300, device=device)
    ref = fn(x)
    with compiler.config.patch(interp_persistent_rblock_max=64, persistent_rblock_max=64, looped_rblock=64):
        out, graphs = run(fn, x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert graphs[0].kernel_count == 1
    assert "for roffset in range(0, rnumel, RBLOCK):" in next(iter(graphs[0].kernel_sources.values()))


def test_column_reduction_is_marked_outer(device):
    x = torch.randn(300, 40, device=device)
    out, graphs = run(lambda x: x.sum(0) * 2, x)
    torch.testing.assert_close(out, x.sum(0) * 2, atol=1e-4, rtol=1e-4)
    kernel = next(m for m in graphs[0].wrapper.children())
    assert kernel.hint == "outer"


@pytest.mark.parametrize(
    "fn",
    [lambda x: x.sum(), lambda x: x.amax(), lambda x: x.var(), lambda x: x.abs().max()],
    ids=["sum", "amax", "var", "abs_max"],
)
def test_long_rows_split_into_two_stage_reductions(device, fn):
    """A few very long rows run as partial reductions over chunks plus a final pass (two kernels)."""
    x = torch.randn(40009, device=device)
    out, graphs = run(fn, x)
    torch.testing.assert_close(out, fn(x), atol=1e-3, rtol=1e-4)
    assert graphs[0].kernel_count >= 2


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_max_argmax_nan_and_ties_match_eager(device, looped):
    x = torch.randn(5, 100, device=device)
    x[1, 7] = float("nan")
    x[1, 50] = float("nan")
    x[2] = float("-inf")
    x[3, 10] = x[3, 20] = 1e4  # tie: the first index wins
    x[4, 99] = float("inf")
    fn = lambda x: (x.max(-1), x.argmin(-1), x.amin(-1))  # noqa: E731
    limits = (
        dict(interp_persistent_rblock_max=32, persistent_rblock_max=32, looped_rblock=32) if looped else {}
    )
    with compiler.config.patch(**limits):
        out, _ = run(fn, x)
    ref = fn(x)
    torch.testing.assert_close(out[0].values, ref[0].values, equal_nan=True)
    assert torch.equal(out[0].indices, ref[0].indices)
    assert torch.equal(out[1], ref[1])
    torch.testing.assert_close(out[2], ref[2], equal_nan=True)


def test_column_reduction_with_few_columns_splits(device):
    """Bias-gradient shape: a long column sum over few columns runs as partial sums plus a final pass."""
    x = torch.randn(40000, 24, device=device)
    out, graphs = run(lambda x: x.sum(0), x)
    torch.testing.assert_close(out, x.sum(0), atol=1e-3, rtol=1e-4)
    assert graphs[0].kernel_count == 2


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, -1),
        lambda x: torch.log_softmax(x, -1),
        lambda x: torch.softmax(
            x.masked_fill(torch.arange(x.shape[1], device=x.device) > 150, float("-inf")), -1
        ),
    ],
    ids=["softmax", "log_softmax", "masked_softmax"],
)
def test_online_softmax_in_looped_mode(device, fn):
    """max and sum(exp(x - max)) share one loop (running max, rescaled sum): two passes over the row."""
    x = torch.randn(6, 300, device=device) * 5
    x[0] = float("-inf")  # an all -inf row gives NaN, as in eager
    with compiler.config.patch(interp_persistent_rblock_max=32, persistent_rblock_max=32, looped_rblock=32):
        out, graphs = run(fn, x)
    torch.testing.assert_close(out, fn(x), atol=1e-5, rtol=1e-5, equal_nan=True)
    source = next(s for s in graphs[0].kernel_sources.values() if "kiln_reduction" in s)
    assert source.count("for roffset in range(0, rnumel, RBLOCK):") == 2  # not 3


def test_residual_add_output_and_layer_norm_are_one_kernel(device):
    """A realized producer read by a reduction stays in registers: the residual stream is stored once."""

    def block(x, r, w):
        h = x + r
        return h, F.layer_norm(h, (64,), w)

    x, r, w = (
        torch.randn(8, 64, device=device),
        torch.randn(8, 64, device=device),
        torch.randn(64, device=device),
    )
    out, graphs = run(block, x, r, w)
    torch.testing.assert_close(out, block(x, r, w), atol=1e-5, rtol=1e-5)
    assert graphs[0].kernel_count == 1


def test_weight_gradient_reduction_is_outer_despite_row_vectors(device):
    """layer_norm's weight/bias gradients sum columns of [rows, hidden] while also reading per-row stats:
    the [rows, hidden] reads decide the tiling."""
    x = torch.randn(64, 96, device=device, requires_grad=True)
    w = torch.randn(96, device=device, requires_grad=True)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        torch.compile(lambda x, w: F.layer_norm(x, (96,), w), backend="kiln")(x, w).sum().backward()
    gw = w.grad.clone()
    w.grad = None
    F.layer_norm(x, (96,), w).sum().backward()
    torch.testing.assert_close(gw, w.grad, atol=1e-4, rtol=1e-4)
    hints = sorted(m.hint for m in graphs[1].wrapper.children())
    assert hints == ["inner", "outer"]


@pytest.mark.parametrize(
    "name, fn, make",
    [
        (
            "embedding",
            lambda w, i: F.embedding(i, w).sum(-1),
            lambda d, n: (torch.randn(30, 8, device=d), torch.randint(0, 30, (n, 6), device=d)),
        ),
        ("std_mean", lambda x: torch.std_mean(x, 0), lambda d, n: (torch.randn(n, 3, device=d),)),
        (
            "label_smoothing",
            lambda lg, t: F.cross_entropy(lg, t, label_smoothing=0.05),
            lambda d, n: (torch.randn(n, 11, device=d), torch.randint(0, 11, (n,), device=d)),
        ),
    ],
    ids=["embedding", "std_mean", "label_smoothing"],
)
def test_dynamic_programs_with_symbolic_scalars(device, name, fn, make):
    """Symbolic sizes reach kernels as integers and as floats (``0.05 / n`` in label smoothing)."""
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        for n in (5, 9, 14):
            args = make(device, n)
            torch.testing.assert_close(compiled(*args), fn(*args), atol=1e-5, rtol=1e-5)
    assert graphs and all(g.fallbacks == [] for g in graphs)


def test_never_calls_inductor_lowering_scheduler_or_codegen(device, monkeypatch):
    # kiln builds on Dynamo, AOTAutograd (incl. its min-cut partitioner) and torch._decomp only
    import torch._inductor.compile_fx as inductor_compile_fx
    import torch._inductor.graph as inductor_graph
    import torch._inductor.scheduler as inductor_scheduler

    def forbidden(*args, **kwargs):
        raise AssertionError("kiln called into Inductor")

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", forbidden)
    monkeypatch.setattr(inductor_compile_fx, "compile_fx_inner", forbidden)
    monkeypatch.setattr(inductor_graph.GraphLowering, "__init__", forbidden)
    monkeypatch.setattr(inductor_scheduler.Scheduler, "__init__", forbidden)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    w = torch.randn(32, device=device, requires_grad=True)
    fn = lambda x, w: F.layer_norm(x * w, (32,)).softmax(-1).sum()  # noqa: E731
    with compiler.config.patch(strict=True):
        torch.compile(fn, backend="kiln")(x, w).backward()
    assert x.grad is not None and w.grad is not None


def test_heavy_fallbacks_call_the_torch_function(device):
    """A convolution fallback is emitted as ``torch.convolution`` (C-bound arguments), not the OpOverload."""
    x, w = torch.randn(2, 3, 8, 8, device=device), torch.randn(4, 3, 3, 3, device=device)
    fn = lambda x, w: F.conv2d(x, w, padding=1).relu()  # noqa: E731
    out, graphs = run(fn, x, w)
    torch.testing.assert_close(out, fn(x, w), rtol=1e-4, atol=1e-4)
    code = graphs[0].code
    assert "torch.convolution(" in code and "aten.convolution" not in code
