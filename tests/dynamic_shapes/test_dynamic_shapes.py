"""Dynamic shapes: one compiled artifact serves every size.

Every case compiles once (``dynamic=True`` or ``mark_dynamic``), runs at several sizes, compares with eager
and asserts that Dynamo compiled no further frame (no recompiles) and kiln compiled no further graph.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import compiler
from kiln_testing import (
    assert_close,
    assert_fallback,
    check,
    compile_kiln,
    fallback_ops,
    frames,
    kernels,
    launch_log,
    run_compiled,
)

SIZES = [3, 17, 64, 100, 257]


def run_sizes(fn, make_args, sizes, device, compile_kwargs=None, rtol=None, atol=None, **settings):
    """Compile ``fn`` once and run it at every size; assert eager agreement and exactly one frame/graph set."""
    start = frames()
    with compiler.config.patch(strict=True, **settings), compiler.capture() as graphs:
        compiled = compile_kiln(fn, **(compile_kwargs if compile_kwargs is not None else {"dynamic": True}))
        n_graphs = None
        for n in sizes:
            args = make_args(n)
            expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            actual = compiled(*args)
            assert_close(actual, expected, rtol, atol)
            if n_graphs is None:
                n_graphs = len(graphs)
    assert frames() - start == 1, f"recompiled: {frames() - start} frames for sizes {sizes}"
    assert len(graphs) == n_graphs, f"kiln compiled {len(graphs) - n_graphs} more graphs after the first size"
    return graphs


# ------------------------------------------------------------------------------ one artifact, many sizes
def test_pointwise_five_sizes_one_kernel_no_recompile(device):
    with launch_log() as log:
        graphs = run_sizes(
            lambda x: torch.relu(x * 2 + 1), lambda n: (torch.randn(n, 5, device=device),), SIZES, device
        )
    assert kernels(graphs) == 1
    # the same kernel ran at every size, with the size passed as a run-time argument
    assert len({name for name, _ in log}) == 1
    assert [cfg["xnumel"] for _, cfg in log] == [n * 5 for n in SIZES]
    src = next(iter(graphs[0].kernel_sources.values()))
    assert "xnumel" in src and "tl.int64" in src  # symbolic sizes get 64-bit index math


def test_softmax_dynamic_rows_and_cols(device):
    graphs = run_sizes(
        lambda x: torch.softmax(x, dim=-1),
        lambda n: (torch.randn(n % 7 + 2, n, device=device),),
        SIZES,
        device,
    )
    assert kernels(graphs) == 1


def test_mark_dynamic_batch_layer_norm(device):
    w = torch.randn(32, device=device)
    b = torch.randn(32, device=device)

    def fn(x):
        return F.layer_norm(x, (32,), w, b, eps=1e-5)

    def make(n):
        x = torch.randn(n, 32, device=device)
        torch._dynamo.mark_dynamic(x, 0)
        return (x,)

    graphs = run_sizes(fn, make, SIZES, device, compile_kwargs={}, rtol=1e-4, atol=1e-4)
    assert kernels(graphs) == 1


def test_size_arithmetic_reaches_kernels_as_arguments(device):
    # the kernel's numel is n*m, computed in the wrapper with integer ops; no size is baked into the source
    def fn(x):
        return x * x.shape[0] + x.shape[1]

    # GPUs contract x*n + m into one FMA (one rounding instead of eager's two): results near 0 differ by
    # about one ulp of n*|x| (up to ~1e-5 at these sizes), so the absolute tolerance covers that ulp
    graphs = run_sizes(fn, lambda n: (torch.randn(n, n + 3, device=device),), SIZES, device, atol=1e-4)
    code = graphs[0].code
    assert "operator.mul" in code or " * " in code
    assert "truediv" not in code and " / " not in code
    src = next(iter(graphs[0].kernel_sources.values()))
    for n in SIZES:
        assert f"{n + 3})" not in src


def test_flatten_view_of_dynamic_tensor(device):
    run_sizes(
        lambda x: (x.reshape(-1) * 3).view(x.shape[0], -1).sum(1),
        lambda n: (torch.randn(n, 6, 4, device=device),),
        SIZES,
        device,
    )


# ------------------------------------------------------------------------------ broadcasting
def test_bias_broadcast_against_dynamic_batch(device):
    bias = torch.randn(8, device=device)
    graphs = run_sizes(
        lambda x: F.silu(x + bias), lambda n: (torch.randn(n, 8, device=device),), SIZES, device
    )
    assert kernels(graphs) == 1


def test_outer_product_broadcast_two_dynamic_dims(device):
    graphs = run_sizes(
        lambda a, b: a[:, None] * b[None, :] - 1,
        lambda n: (torch.randn(n, device=device), torch.randn(n + 2, device=device)),
        SIZES,
        device,
    )
    assert kernels(graphs) == 1


def test_expand_unsqueeze_dynamic(device):
    run_sizes(
        lambda x: x.unsqueeze(1).expand(-1, 4, -1) * 2,
        lambda n: (torch.randn(n, 6, device=device),),
        SIZES,
        device,
    )


def test_row_vector_broadcast_with_keepdim_mean(device):
    # center each row: the (n, 1) mean broadcasts back over a dynamic row length
    graphs = run_sizes(
        lambda x: x - x.mean(dim=1, keepdim=True),
        lambda n: (torch.randn(4, n, device=device),),
        SIZES,
        device,
    )
    assert kernels(graphs) == 1


# ------------------------------------------------------------------------------ reductions over dynamic dims
def test_reduction_over_dynamic_dim_persistent(device):
    with launch_log() as log:
        run_sizes(lambda x: x.sum(dim=-1), lambda n: (torch.randn(6, n, device=device),), SIZES, device)
    assert log and all(cfg["PERSISTENT"] for _, cfg in log)


def test_reduction_over_dynamic_dim_looped_and_persistent_same_kernel(device):
    # one compiled kernel: rows <= 64 run persistent, longer rows loop over RBLOCK chunks
    with launch_log() as log:
        graphs = run_sizes(
            lambda x: x.sum(dim=-1) * 2,
            lambda n: (torch.randn(5, n, device=device),),
            [17, 40, 65, 200, 333],
            device,
            interp_persistent_rblock_max=64,
            persistent_rblock_max=64,
        )
    assert kernels(graphs) == 1
    names = {name for name, _ in log}
    assert len(names) == 1
    modes = [(cfg["rnumel"], cfg["PERSISTENT"]) for _, cfg in log]
    assert modes == [(17, True), (40, True), (65, False), (200, False), (333, False)]


def test_rmsnorm_looped_over_dynamic_hidden(device):
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    with launch_log() as log:
        graphs = run_sizes(
            rmsnorm,
            lambda n: (torch.randn(3, n, device=device), torch.randn(n, device=device)),
            [50, 130, 257, 300, 401],
            device,
            interp_persistent_rblock_max=64,
            persistent_rblock_max=64,
            rtol=1e-4,
            atol=1e-4,
        )
    assert kernels(graphs) == 1
    assert any(not cfg["PERSISTENT"] for _, cfg in log)


def test_softmax_looped_dynamic(device):
    with launch_log() as log:
        run_sizes(
            lambda x: torch.log_softmax(x, -1),
            lambda n: (torch.randn(2, n, device=device),),
            [70, 129, 200, 255, 513],
            device,
            interp_persistent_rblock_max=64,
            persistent_rblock_max=64,
        )
    assert all(not cfg["PERSISTENT"] for _, cfg in log)


def test_batch_norm_stats_over_dynamic_batch(device):
    def stats(x):
        mean = x.mean(dim=0)
        var = x.var(dim=0, unbiased=False)
        return (x - mean) / torch.sqrt(var + 1e-5)

    run_sizes(stats, lambda n: (torch.randn(n, 12, device=device),), SIZES, device, rtol=1e-4, atol=1e-4)


def test_argmax_and_max_over_dynamic_dim(device):
    def fn(x):
        v, i = x.max(dim=1)
        return v, i, x.argmin(dim=1)

    run_sizes(fn, lambda n: (torch.randn(4, n, device=device),), SIZES, device)


def test_full_reduction_dynamic(device):
    run_sizes(
        lambda x: (x.abs().sum(), x.amax()), lambda n: (torch.randn(n, 7, device=device),), SIZES, device
    )


# ------------------------------------------------------------------------------ strides and views
def test_transposed_input_symbolic_strides(device):
    graphs = run_sizes(lambda x: x * 2 + 1, lambda n: (torch.randn(6, n, device=device).t(),), SIZES, device)
    assert kernels(graphs) == 1


def test_strided_slice_input(device):
    run_sizes(
        lambda x: torch.tanh(x) + x.sum(-1, keepdim=True),
        lambda n: (torch.randn(n, 16, device=device)[:, ::2],),
        SIZES,
        device,
    )


def test_storage_offset_input(device):
    # a view into the middle of a bigger buffer: the storage offset is a run-time value too
    run_sizes(lambda x: x.exp(), lambda n: (torch.randn(n + 5, 4, device=device)[5:],), SIZES, device)


def test_slice_of_dynamic_dim_launches_no_kernel(device):
    def fn(x):
        return x[1:-1].t()

    graphs = run_sizes(fn, lambda n: (torch.randn(n, 4, device=device),), [6, 17, 64, 100, 257], device)
    assert kernels(graphs) == 0


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_slice_transpose_view_launches_no_kernel(dynamic, device):
    # x[2:5].t() is a view of the input: the wrapper returns an as_strided view, no kernel, no copy
    x = torch.randn(8, 6, device=device)
    graphs = check(lambda t: t[2:5].t(), x, compile_kwargs={"dynamic": dynamic})
    assert kernels(graphs) == 0 and graphs[0].extern_count == 0
    out, _ = run_compiled(lambda t: t[2:5].t(), x, compile_kwargs={"dynamic": dynamic})
    assert out.data_ptr() == x[2:5].data_ptr() and out.stride() == x[2:5].t().stride()


def test_expanded_zero_stride_input(device):
    run_sizes(
        lambda x: x.sum(0) + x, lambda n: (torch.randn(1, n, device=device).expand(5, n),), SIZES, device
    )


# ------------------------------------------------------------------------------ 0- and 1-sized dims
@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (1, 4), (4, 1), (1, 1)])
def test_zero_and_one_sized_dims(shape, device):
    def fn(x):
        return torch.relu(x * 3), x.sum(dim=1), (x + 1).amax(dim=0) if x.shape[0] else x.sum(dim=0)

    x = torch.randn(*shape, device=device)
    check(fn, x, compile_kwargs={"dynamic": True})


def test_empty_then_nonempty_sizes_are_correct(device):
    # Dynamo specializes 0 and 1; kiln must still be right for each of them and for the general size
    compiled = compile_kiln(lambda x: x.softmax(-1) * 2, dynamic=True)
    with compiler.config.patch(strict=True):
        for n in (0, 1, 2, 9, 33):
            x = torch.randn(n, 5, device=device)
            assert_close(compiled(x), x.softmax(-1) * 2)


# ------------------------------------------------------------------------------ programs people write
def test_causal_masked_softmax_dynamic_seq(device):
    def attn_probs(scores):
        n = scores.shape[-1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=scores.device), diagonal=1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")) / math.sqrt(8.0), dim=-1)

    run_sizes(attn_probs, lambda n: (torch.randn(2, n, n, device=device),), [3, 5, 9, 12, 20], device)


def test_pad_to_multiple_of_eight(device):
    def pad8(x):
        n = x.shape[-1]
        return F.pad(x, (0, (8 - n % 8) % 8), value=0.0)

    start = frames()
    compiled = compile_kiln(pad8, dynamic=True)
    with compiler.config.patch(strict=True):
        for n in (3, 9, 17, 30, 41):
            x = torch.randn(2, n, device=device)
            assert_close(compiled(x), pad8(x))
    # the pad amount (8 - n % 8) % 8 stays a symbolic expression: one frame serves every size
    assert frames() - start == 1


def test_cat_along_dynamic_dim(device):
    graphs = run_sizes(
        lambda a, b: torch.cat([a * 2, b + 1], dim=0),
        lambda n: (torch.randn(n, 6, device=device), torch.randn(n + 1, 6, device=device)),
        SIZES,
        device,
    )
    assert kernels(graphs) == 1


def test_arange_positions_dynamic(device):
    def fn(x):
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
        return x + torch.sin(pos / 10.0)

    graphs = run_sizes(fn, lambda n: (torch.randn(2, n, device=device),), SIZES, device)
    assert kernels(graphs) == 1


def _scaled_scores(q, k):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)


def test_attention_scores_matmul_dynamic_seq(device):
    graphs = run_sizes(
        _scaled_scores,
        lambda n: (torch.randn(2, n, 8, device=device), torch.randn(2, n, 8, device=device)),
        SIZES,
        device,
        rtol=1e-4,
        atol=1e-5,
    )
    assert graphs[0].extern_count == 1


def test_attention_scores_dynamic_scale_fuses_into_softmax(device):
    """The scaled scores are realized (two readers) but still fuse into the softmax kernel as registers."""
    graphs = run_sizes(
        _scaled_scores,
        lambda n: (torch.randn(2, n, 8, device=device), torch.randn(2, n, 8, device=device)),
        SIZES,
        device,
        rtol=1e-4,
        atol=1e-5,
    )
    assert kernels(graphs) == 1 and graphs[0].extern_count == 1


@pytest.mark.parametrize(
    "fn",
    [lambda x, idx: x[idx, 2] * 2 + 1, lambda x, idx: (x[idx].sum(-1), x.index_select(0, idx) * 3)],
    ids=["element", "rows"],
)
def test_gather_at_indices_scaled_by_a_dynamic_row_stride(fn, device):
    """``x[idx, 2]`` reads at ``2 + s1 * idx``: the row stride ``s1`` is a kernel argument even when nothing
    else in the kernel uses it (it once went missing beside the loaded index: NameError at launch)."""
    graphs = run_sizes(
        fn,
        lambda n: (torch.randn(n, n + 3, device=device), torch.tensor([0, n - 1, n // 2, 1], device=device)),
        SIZES,
        device,
        rtol=1e-4,
        atol=1e-5,
    )
    assert not [f for g in graphs for f in g.fallbacks]


def test_cross_entropy_dynamic_batch(device):
    def fn(logits, target):
        return F.cross_entropy(logits, target)

    run_sizes(
        fn,
        lambda n: (torch.randn(n, 10, device=device), torch.randint(0, 10, (n,), device=device)),
        SIZES,
        device,
        rtol=1e-4,
        atol=1e-5,
    )


def test_mlp_backward_dynamic_batch(device):
    w1 = torch.randn(16, 8, device=device, requires_grad=True)
    w2 = torch.randn(4, 16, device=device, requires_grad=True)

    def fn(x):
        return F.linear(F.gelu(F.linear(x, w1)), w2).pow(2).mean()

    compiled = compile_kiln(fn, dynamic=True)
    start = frames()
    with compiler.config.patch(strict=True):
        for n in (3, 7, 12, 30, 65):
            x = torch.randn(n, 8, device=device)
            g_ref = torch.autograd.grad(fn(x), (w1, w2))
            g = torch.autograd.grad(compiled(x), (w1, w2))
            assert_close(g, g_ref, rtol=1e-4, atol=1e-4)
    assert frames() - start == 1


# ------------------------------------------------------------------------------ torch.export and the AOT path
def _export(mod, args, dynamic_shapes):
    return torch.export.export(mod, args, dynamic_shapes=dynamic_shapes)


def test_export_dim_expression_solved_for_symbol(device):
    from torch.export import Dim

    import compiler.aot

    class Halves(torch.nn.Module):
        def forward(self, a):
            n = (a.shape[0] - 1) // 2
            return a[:n] * 2 + a[n + 1 :]

    n = Dim("n", min=2, max=64)
    ep = _export(Halves(), (torch.randn(11, device=device),), {"a": {0: 2 * n + 1}})
    with compiler.config.patch(strict=True):
        m = compiler.aot.compile_exported(ep)
    assert "floordiv" in m.wrapper.code  # (size - 1) // 2 recovers n, with integer ops
    for k in (2, 5, 9, 30, 64):
        a = torch.randn(2 * k + 1, device=device)
        assert_close(m(a), Halves()(a))


def test_export_two_inputs_related_dims(device):
    from torch.export import Dim

    import compiler.aot

    class Interleave(torch.nn.Module):
        def forward(self, a, b):
            return torch.cat([a, b], dim=0).sum(0) + b.shape[0]

    n = Dim("n", min=2, max=50)
    ep = _export(
        Interleave(),
        (torch.randn(5, 3, device=device), torch.randn(11, 3, device=device)),
        {"a": {0: n}, "b": {0: 2 * n + 1}},
    )
    with compiler.config.patch(strict=True):
        m = compiler.aot.compile_exported(ep)
    for k in (2, 4, 10, 33, 50):
        a, b = torch.randn(k, 3, device=device), torch.randn(2 * k + 1, 3, device=device)
        assert_close(m(a, b), Interleave()(a, b))


def test_export_module_with_parameters_runs_at_new_sizes(device):
    from torch.export import Dim

    import compiler.aot

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return x + F.gelu(self.fc(self.norm(x)))

    mod = Block().to(device).eval()
    batch = Dim("batch", min=2, max=128)
    ep = _export(mod, (torch.randn(4, 16, device=device),), {"x": {0: batch}})
    with compiler.config.patch(strict=True):
        m = compiler.aot.compile_exported(ep)
    assert m.compiled.extern_count == 1
    with torch.no_grad():
        for k in (2, 3, 17, 64, 128):
            x = torch.randn(k, 16, device=device)
            assert_close(m(x), mod(x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ data-dependent sizes
def test_item_without_capture_graph_breaks_correctly(device):
    def fn(x):
        k = int(x.sum().item() > 0)
        return x * (k + 1)

    for n in (3, 8):
        x = torch.randn(n, device=device)
        check(fn, x)


def test_item_scale_with_capture_scalar_outputs_fuses(device):
    # a 0-d tensor's .item() used as a multiplier: functionalization keeps it a tensor operand, one kernel
    def fn(x, s):
        scale = s.item()
        return x * scale + 1

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        graphs = check(fn, torch.randn(7, device=device), torch.tensor(2.5, device=device))
    assert kernels(graphs) == 1


def test_item_as_unbacked_size_falls_back_with_reason(device):
    # .item() used as a length: _local_scalar_dense runs as ATen and its result sizes the kernels
    def fn(x, s):
        k = s.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return (x[:k] * 2).sum() + torch.ones(k, device=x.device).sum()

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = compile_kiln(fn)
        with compiler.config.patch(strict=True), compiler.capture() as graphs:
            for k in (3, 7, 5, 2):
                x = torch.randn(7, device=device)
                s = torch.tensor(k, device=device)
                assert_close(compiled(x, s), fn(x, s))
    assert len(graphs) == 1  # an unbacked size: no recompile per value
    assert_fallback(graphs, "aten._local_scalar_dense")


def test_nonzero_with_dynamic_output_shapes_falls_back(device):
    def fn(x):
        idx = torch.nonzero(x > 0).squeeze(1)
        return (idx * 2).float().sum() + x.sum()

    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        graphs = check(fn, torch.randn(20, device=device))
    assert_fallback(graphs, "aten.nonzero")


def test_nonzero_without_capture_graph_breaks_correctly(device):
    def fn(x):
        idx = torch.nonzero(x > 0)
        return idx.sum() + x.sum()

    check(fn, torch.randn(20, device=device))


def test_boolean_mask_select_with_capture(device):
    def fn(x):
        y = x[x > 0]
        return y.exp().sum(), y.shape[0]

    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        graphs = check(fn, torch.randn(33, device=device))
    assert fallback_ops(graphs)  # the data-dependent op itself ran as ATen, with a reason
