"""The graph rewrites before lowering (compiler/fx_passes.py): padded matmuls and channels-last convolutions.

Each rewrite is checked on its own (the FX graph after the pass: what was inserted, the FakeTensors, the
outputs' layouts) and end to end through torch.compile (values and output strides equal eager's). On CPU
the ``pad``/``contiguous``/``always`` modes force the rewrites that ``bench``/``auto`` keep for GPUs.
"""

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler import fx_passes
from compiler.exc import ConfigError

aten = torch.ops.aten


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def output_vals(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a.meta["val"] for a in out.all_input_nodes]


@pytest.fixture
def small_pads(monkeypatch):
    monkeypatch.setattr(fx_passes, "PAD_MIN_MACS", 1)


# --------------------------------------------------------------------------------------------- mm_layout
def test_misaligned_pads_only_misaligned_dims(small_pads):
    gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(64, 32), torch.randn(32, 50257))
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert fx_passes._misaligned(mm) == (0, 0, 3)  # fp32: 4 elements make 16 bytes
    gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(64, 32), torch.randn(32, 48))
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert fx_passes._misaligned(mm) is None


def test_small_matmuls_are_left_alone():
    gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(8, 7), torch.randn(7, 5))
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert fx_passes._misaligned(mm) is None


@pytest.mark.parametrize("setting,padded", [("pad", 1), ("off", 0)])
def test_padding_rewrites_and_keeps_output_layout(small_pads, setting, padded):
    a, b = torch.randn(30, 21), torch.randn(21, 45)
    gm = make_fx(lambda a, b: (a @ b, (a @ b).relu()), tracing_mode="fake")(a, b)
    with compiler.config.patch(mm_layout=setting):
        done = fx_passes.matmul_layouts(gm)
    assert done == 2 * padded
    if padded:
        assert aten.constant_pad_nd.default in targets(gm) and aten.slice.Tensor in targets(gm)
        mms = [n for n in gm.graph.nodes if n.target is aten.mm.default]
        assert all(tuple(n.meta["val"].shape) == (32, 48) for n in mms)  # 30, 21, 45 -> 32, 24, 48
    for v in output_vals(gm):  # graph outputs stay as eager laid them out
        assert tuple(v.shape) == (30, 45) and v.stride() == (45, 1)
    outs = gm(a, b)
    torch.testing.assert_close(outs[0], a @ b)
    torch.testing.assert_close(outs[1], (a @ b).relu())


def test_free_outputs_keep_the_padded_layout(small_pads):
    """An inference graph's outputs leave padded (no copy back), also through a view of the matmul."""
    a, b = torch.randn(30, 21), torch.randn(21, 45)
    gm = make_fx(lambda a, b: ((a @ b).view(3, 10, 45), (a @ b).relu()), tracing_mode="fake")(a, b)
    with compiler.config.patch(mm_layout="pad"):
        assert fx_passes.matmul_layouts(gm, free_outputs=True) == 2
    assert aten.clone.default not in targets(gm)
    view, relu = output_vals(gm)
    assert tuple(view.shape) == (3, 10, 45) and view.stride() == (480, 48, 1)
    assert relu.stride() == (45, 1)  # computed by an op of its own: eager's layout
    got = gm(a, b)
    assert got[0].stride() == (480, 48, 1)
    torch.testing.assert_close(got[0], (a @ b).view(3, 10, 45))
    torch.testing.assert_close(got[1], (a @ b).relu())


def test_a_copy_back_is_timed_for_an_output_behind_a_view():
    gm = make_fx(lambda a, b: (a @ b).view(3, 10, 45), tracing_mode="fake")(
        torch.randn(30, 21), torch.randn(21, 45)
    )
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert [u.op for u in fx_passes.through_views(mm)] == ["call_function", "output"]


def test_addmm_pads_its_bias_and_bmm_its_batches(small_pads):
    x, w, bias = torch.randn(6, 13), torch.randn(19, 13), torch.randn(19)
    q, k = torch.randn(3, 10, 6), torch.randn(3, 6, 7)
    fn = lambda x, w, bias, q, k: (F.linear(x, w, bias), torch.bmm(q, k))  # noqa: E731
    gm = make_fx(fn, tracing_mode="fake")(x, w, bias, q, k)
    assert aten.addmm.default in targets(gm)
    with compiler.config.patch(mm_layout="pad"):
        assert fx_passes.matmul_layouts(gm) == 2
    addmm = next(n for n in gm.graph.nodes if n.target is aten.addmm.default)
    assert tuple(addmm.meta["val"].shape) == (8, 20) and tuple(addmm.args[0].meta["val"].shape) == (20,)
    got = gm(x, w, bias, q, k)
    torch.testing.assert_close(got[0], F.linear(x, w, bias))
    torch.testing.assert_close(got[1], torch.bmm(q, k))


def test_scaled_addmm_is_left_alone(small_pads):
    gm = make_fx(lambda c, a, b: torch.addmm(c, a, b, beta=0.5), tracing_mode="fake")(
        torch.randn(5, 7), torch.randn(5, 3), torch.randn(3, 7)
    )
    with compiler.config.patch(mm_layout="pad"):
        assert fx_passes.matmul_layouts(gm) == 0


def test_padded_matmuls_compile_end_to_end(device, small_pads):
    """Through Dynamo, AOTAutograd and kiln's lowering: a tied LM head (odd vocabulary) and its backward."""
    emb = torch.randn(101, 24, device=device, requires_grad=True)
    h = torch.randn(2, 9, 24, device=device, requires_grad=True)

    def head(h, emb):
        return F.linear(h, emb).float().log_softmax(-1)

    with compiler.config.patch(mm_layout="pad", strict=True):
        out = torch.compile(head, backend="kiln")(h, emb)
        out.sum().backward()
    ref_h, ref_e = h.detach().clone().requires_grad_(), emb.detach().clone().requires_grad_()
    ref = head(ref_h, ref_e)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert out.stride() == ref.stride()
    torch.testing.assert_close(h.grad, ref_h.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(emb.grad, ref_e.grad, rtol=1e-4, atol=1e-4)


def test_inference_logits_leave_padded_and_equal_eager(device, small_pads):
    """Under no_grad AOTAutograd compiles an inference graph: the tied LM head's logits reach the caller
    with the padded row stride (Inductor's padded matmuls do the same), values as eager's; with autograd
    recording, the same head keeps eager's layout (test above)."""
    emb, h = torch.randn(101, 24, device=device), torch.randn(2, 9, 24, device=device)
    head = lambda h, emb: F.linear(h, emb)  # noqa: E731
    with compiler.config.patch(mm_layout="pad", strict=True), torch.no_grad():
        out = torch.compile(head, backend="kiln")(h, emb)
    assert out.stride() == (9 * 104, 104, 1)  # fp32: 101 -> 104
    torch.testing.assert_close(out, head(h, emb), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.view(-1, 101), head(h, emb).view(-1, 101), rtol=1e-4, atol=1e-4)


def test_transposed_operand_is_padded_in_its_own_layout(small_pads):
    """A tied LM head reads the embedding transposed: padding it through its transpose keeps the copy in
    order (row-major padding of a column-major view was a 6x slower copy on the H100)."""
    h, emb = torch.randn(30, 24), torch.randn(101, 24)
    gm = make_fx(lambda h, emb: h @ emb.t(), tracing_mode="fake")(h, emb)
    with compiler.config.patch(mm_layout="pad"):
        assert fx_passes.matmul_layouts(gm) == 1
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    b = mm.args[1].meta["val"]
    assert tuple(b.shape) == (24, 104) and b.stride() == (1, 24)
    torch.testing.assert_close(gm(h, emb), h @ emb.t())


def test_contiguous_rewrite_copies_transposed_operands_only(small_pads):
    h, emb, w = torch.randn(30, 24), torch.randn(101, 24), torch.randn(24, 101)
    gm = make_fx(lambda h, emb, w: (h @ emb.t(), h @ w), tracing_mode="fake")(h, emb, w)
    with compiler.config.patch(mm_layout="contiguous"):
        assert fx_passes.matmul_layouts(gm) == 1  # the second matmul has no transposed operand
    clones = [n for n in gm.graph.nodes if n.target is aten.clone.default]
    assert len(clones) == 1 and clones[0].meta["val"].stride() == (101, 1)
    assert aten.slice.Tensor not in targets(gm) and aten.constant_pad_nd.default not in targets(gm)
    got = gm(h, emb, w)
    torch.testing.assert_close(got[0], h @ emb.t())
    assert got[0].stride() == (101, 1)


def test_bench_mode_never_rewrites_without_a_gpu(small_pads):
    gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(30, 21), torch.randn(21, 45))
    with compiler.config.patch(mm_layout="bench"):
        assert fx_passes.matmul_layouts(gm) == 0


def test_compile_time_timings_of_long_calls_take_three_single_calls(monkeypatch):
    """A call of LONG_CALL_MS or more (GPT-2's LM-head product: 2-3 ms in fp32) is timed 3 times alone, the first
    timing counted; shorter ones keep the 7 timings of 5 calls that small matmuls need."""
    assert fx_passes.timing_plan(2.5, 7, 5) == (3, 1) and fx_passes.timing_plan(0.25, 7, 5) == (3, 1)
    assert fx_passes.timing_plan(0.2, 7, 5) == (7, 5) and fx_passes.timing_plan(1.0, 2, 5) == (2, 1)
    for first, want_inner, want_ms in ((2.0, [1, 1, 1], 2.0), (0.05, [1] + [5] * 7, 0.04)):
        inners: list[int] = []

        def timed(fn, inner, first=first, inners=inners):
            inners.append(inner)
            return first if len(inners) == 1 else (first if first >= 0.25 else 0.04)

        monkeypatch.setattr(fx_passes, "_timed_ms", timed)
        calls = []
        assert fx_passes.bench_ms(lambda calls=calls: calls.append(1)) == want_ms
        assert inners == want_inner and len(calls) == 2  # the two warm-up calls; the timings are faked


# ------------------------------------------------------------------------------------------ conv_layout
def _block(x, w1, w2, scale):
    y = F.conv2d(x, w1, padding=1).mul(scale).relu()
    y = F.conv2d(y, w2, padding=1) + x
    return y.relu(), y.mean((2, 3))


def _block_args(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 6, 6, generator=g)
    w1, w2 = torch.randn(8, 8, 3, 3, generator=g) * 0.1, torch.randn(8, 8, 3, 3, generator=g) * 0.1
    scale = torch.rand(1, 8, 1, 1, generator=g) + 0.5
    return [t.to(device) for t in (x, w1, w2, scale)]


def test_convs_channels_last_converts_once_and_restores_outputs():
    args = _block_args()
    gm = make_fx(_block, tracing_mode="fake")(*args)
    before = [v.stride() for v in output_vals(gm)]
    with compiler.config.patch(conv_layout="always"):
        copies = fx_passes.convs_channels_last(gm)
    assert copies == 3  # the input and both 3x3 weights; the second conv's input is already NHWC
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert all(c.meta["val"].is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert [v.stride() for v in output_vals(gm)] == before
    got, ref = gm(*args), _block(*args)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
        assert g.stride() == r.stride()


def test_auto_layout_leaves_cpu_and_fp32_graphs_alone():
    gm = make_fx(_block, tracing_mode="fake")(*_block_args())
    code = gm.code
    with compiler.config.patch(conv_layout="auto"):
        assert fx_passes.convs_channels_last(gm) == 0
    assert gm.code == code


@pytest.fixture
def no_tf32():
    """fp32 convolutions without TF32: cuDNN's NHWC and NCHW algorithms then agree to float rounding."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def test_channels_last_graph_compiles_end_to_end(device, no_tf32):
    args = _block_args(device)
    with compiler.config.patch(conv_layout="always", strict=True), torch.no_grad():
        got = torch.compile(_block, backend="kiln")(*args)
    ref = _block(*args)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
        assert g.stride() == r.stride()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="auto converts GPU convolutions only")
def test_auto_layout_converts_bf16_gpu_convolutions():
    args = [t.to("cuda", torch.bfloat16) for t in _block_args()]
    gm = make_fx(_block, tracing_mode="fake")(*args)
    with compiler.config.patch(conv_layout="auto"):
        assert fx_passes.convs_channels_last(gm) == 3


def _nhwc(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def test_training_graphs_run_channels_last_end_to_end(device, no_tf32):
    """The forward saves its activations NHWC and reports their strides; the backward adopts them and runs its
    convolution_backward ops NHWC; outputs, gradients and their strides match eager's."""
    args = _block_args(device)
    x, w1, w2 = (t.requires_grad_() for t in args[:3])
    with compiler.config.patch(conv_layout="always", strict=True), compiler.capture() as graphs:
        out = torch.compile(_block, backend="kiln")(*args)
        (out[0].sum() + out[1].square().sum()).backward()
    got = [t.grad for t in (x, w1, w2)]
    refs = [t.detach().clone().requires_grad_() for t in (x, w1, w2)]
    ref = _block(*refs, args[3])
    (ref[0].sum() + ref[1].square().sum()).backward()
    for g, r in zip(list(out) + got, list(ref) + [t.grad for t in refs]):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
        assert g.stride() == r.stride()
    fw, bw = graphs
    saved = [n.meta["val"] for n in fx_passes.graph_outputs(fw.aten_graph)[2:] if isinstance(n, fx.Node)]
    assert any(_nhwc(v) for v in saved), "no activation was saved channels-last"
    bw_inputs = [n for n in bw.aten_graph.graph.nodes if n.op == "placeholder"]
    assert any(_nhwc(n.meta["val"]) for n in bw_inputs), "the backward did not adopt the saved layout"
    conv_bw = [n for n in bw.aten_graph.graph.nodes if n.target is aten.convolution_backward.default]
    assert len(conv_bw) == 2 and all(_nhwc(n.args[1].meta["val"]) for n in conv_bw)


def test_adopt_input_strides_retraces_and_keeps_outputs():
    gm = make_fx(lambda x: ((x * 2).relu(), x.sum((2, 3))), tracing_mode="fake")(torch.randn(2, 3, 4, 5))
    before = [v.stride() for v in output_vals(gm)]
    fake = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    with fake.fake_mode:
        real = torch.empty_strided(fake.shape, (60, 1, 15, 3))
    assert fx_passes.adopt_input_strides(gm, [real]) == 1
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.meta["val"].stride() == (60, 1, 15, 3)
    assert [v.stride() for v in output_vals(gm)] == before
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    got = gm(x)
    torch.testing.assert_close(got[0], (x * 2).relu())
    assert got[0].stride() == before[0]
    assert fx_passes.adopt_input_strides(gm, [real]) == 0  # nothing left to adopt


def test_adopt_input_strides_copies_where_a_view_rejects_the_layout():
    gm = make_fx(lambda x: x.view(2, -1) * 3, tracing_mode="fake")(torch.randn(2, 3, 4, 5))
    fake = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    with fake.fake_mode:
        real = torch.empty_strided(fake.shape, (60, 1, 15, 3))
    assert fx_passes.adopt_input_strides(gm, [real]) == 1
    assert aten.copy.default in targets(gm)
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    torch.testing.assert_close(gm(x), x.reshape(2, -1) * 3)


# -------------------------------------------------------------------------------------------- conv_bias
def _biased(x, w, b, w2):
    return (
        F.layer_norm(F.conv2d(x, w, b, padding=1, groups=8).permute(0, 2, 3, 1), (8,)).permute(0, 3, 1, 2)
        + F.conv_transpose2d(x, w2, b)[:, :, :6, :6]
    )


def _biased_args(device="cpu"):
    g = torch.Generator().manual_seed(0)
    ts = (
        torch.randn(2, 8, 6, 6, generator=g),
        torch.randn(8, 1, 3, 3, generator=g),
        torch.randn(8, generator=g),
        torch.randn(8, 8, 1, 1, generator=g),
    )
    return [t.to(device) for t in ts]


def test_split_conv_bias_moves_every_bias_into_an_add():
    args = _biased_args()
    gm = make_fx(_biased, tracing_mode="fake")(*args)
    with compiler.config.patch(conv_bias="split"):
        assert fx_passes.split_conv_bias(gm) == 2  # the grouped convolution and the transposed one
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert len(convs) == 2 and all(c.args[2] is None for c in convs)
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor and n.args[0] in convs]
    assert len(adds) == 2 and all(list(a.args[1].meta["val"].shape) == [8, 1, 1] for a in adds)
    torch.testing.assert_close(gm(*args), _biased(*args))


def _aliasing(gm, vals):
    """Per node, which of its inputs' tensors its own tensors share storage with (views, in-place results)."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        mine = {t.untyped_storage()._cdata for t in fx_passes._tensors(vals.get(n))}
        out[n] = [
            a.name
            for a in n.all_input_nodes
            for t in fx_passes._tensors(vals.get(a))
            if t.untyped_storage()._cdata in mine
        ]
    return out


def _matches_a_full_propagation(gm):
    """The graph's FakeTensors as the rewrites left them equal, node by node (geometry, dtype, which inputs
    each aliases), those of propagating the whole graph again."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    kept = {n: n.meta.get("val") for n in gm.graph.nodes}
    inputs = [kept[n] for n in gm.graph.nodes if n.op == "placeholder"]
    FakeTensorProp(gm, mode=fx_passes.fake_mode_of(gm)).propagate_dont_convert_inputs(*inputs)
    full = {n: n.meta.get("val") for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        assert fx_passes._same_values(kept[n], full[n]), (n.name, kept[n], full[n])
    assert _aliasing(gm, kept) == _aliasing(gm, full)


def test_layout_rewrites_recompute_only_what_an_edit_reaches():
    """A rewrite recomputes the FakeTensors downstream of its edits only as far as they change: moving a
    bias out of a convolution changes no layout, so the nodes after the add keep their FakeTensors (the same
    objects); channels-last then changes every activation's. Either way the graph's FakeTensors are those of
    a full propagation, views included."""

    def f(x, w, b, w2):
        y = F.conv2d(x, w, b, padding=1).relu()
        z = y.view(2, 8, 36).transpose(1, 2) * 2  # views of the relu: they alias its storage
        return F.conv2d(y, w2) + z.transpose(1, 2).reshape(2, 8, 6, 6), y.sum((2, 3))

    g = torch.Generator().manual_seed(0)
    args = [
        torch.randn(2, 8, 6, 6, generator=g),
        torch.randn(8, 8, 3, 3, generator=g),
        torch.randn(8, generator=g),
        torch.randn(8, 8, 1, 1, generator=g),
    ]
    gm = make_fx(f, tracing_mode="fake")(*args)
    relu = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
    after = [n for n in gm.graph.nodes if n.op == "call_function" and n not in relu.all_input_nodes]
    before = {n: n.meta["val"] for n in after}
    with compiler.config.patch(conv_bias="split"):
        assert fx_passes.split_conv_bias(gm) == 1
    assert all(n.meta["val"] is before[n] for n in after if n in gm.graph.nodes and n is not relu)
    _matches_a_full_propagation(gm)
    with compiler.config.patch(conv_layout="always"):
        assert fx_passes.convs_channels_last(gm) > 0
    assert relu.meta["val"].is_contiguous(memory_format=torch.channels_last)
    _matches_a_full_propagation(gm)
    for got, want in zip(gm(*args), f(*args)):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_adopted_input_strides_match_a_full_propagation():
    gm = make_fx(lambda x: ((x * 2).relu().view(2, 3, 20), x.sum((2, 3))), tracing_mode="fake")(
        torch.randn(2, 3, 4, 5)
    )
    fake = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    with fake.fake_mode:
        real = torch.empty_strided(fake.shape, (60, 1, 15, 3))
    assert fx_passes.adopt_input_strides(gm, [real]) == 1
    _matches_a_full_propagation(gm)


@pytest.mark.parametrize("setting", ["auto", "keep"])
def test_conv_bias_stays_in_cpu_convolutions_unless_split(setting):
    gm = make_fx(_biased, tracing_mode="fake")(*_biased_args())
    code = gm.code
    with compiler.config.patch(conv_bias=setting):
        assert fx_passes.split_conv_bias(gm) == 0
    assert gm.code == code


def test_split_conv_bias_fuses_the_add_into_the_consumer_kernel(device):
    """The bias is read by the LayerNorm's kernel after the convolution: no ATen call adds it, and the kernel
    count is that of the unsplit graph."""
    args = _biased_args(device)
    counts = {}
    for setting in ("keep", "split"):
        torch._dynamo.reset()
        with compiler.config.patch(conv_bias=setting, strict=True), torch.no_grad(), compiler.capture() as gs:
            got = torch.compile(_biased, backend="kiln")(*args)
        torch.testing.assert_close(got, _biased(*args), rtol=1e-4, atol=1e-4)
        (g,) = gs
        counts[setting] = len(g.kernel_sources)
        conv_lines = [ln for ln in g.code.splitlines() if "torch.convolution(" in ln]
        assert len(conv_lines) == 2
        if setting == "split":
            assert all(", None, [" in ln for ln in conv_lines)  # no bias operand left in ATen's calls
            assert all(r.op == "aten.convolution.default" for r in g.fallbacks)
    assert counts["split"] == counts["keep"]


def test_split_conv_bias_in_training_keeps_gradients(device, no_tf32):
    """A training forward with its biases split: outputs and every parameter's gradient (the biases' come from
    the backward's ``convolution_backward``, which the split leaves alone) equal eager's."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),
        torch.nn.GELU(),
    ).to(device)
    ref_m = copy.deepcopy(m)
    x = _biased_args(device)[0]
    with (
        compiler.config.patch(conv_layout="always", conv_bias="split", strict=True),
        compiler.capture() as gs,
    ):
        y = torch.compile(m, backend="kiln")(x)
        y.square().sum().backward()
    ref = ref_m(x)
    ref.square().sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3)
    assert all(", None, [" in ln for ln in gs[0].code.splitlines() if "torch.convolution(" in ln)


@pytest.mark.parametrize(
    "name,value",
    [("mm_layout", "sometimes"), ("conv_layout", "nhwc"), ("conv_bias", "fuse"), ("addmm_bias", "cublas")],
)
def test_bad_values_are_config_errors(name, value):
    with pytest.raises(ConfigError, match=f"KILN_{name.upper()}"):
        compiler.config.from_env({f"KILN_{name.upper()}": value})
