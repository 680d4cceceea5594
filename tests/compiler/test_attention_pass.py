"""The ``attention`` rewrite (compiler/fx_attention.py): eager attention -> one fused ATen SDPA call.

The matcher is checked on the ATen graph ``make_fx`` gives with kiln's decompositions (what AOTAutograd hands
kiln): which nodes are left, and the rewritten graph's values against eager's. On CPU ``attention=fuse`` emits
``_scaled_dot_product_flash_attention_for_cpu``; a graph traced on fake CUDA tensors shows the GPU's
``_scaled_dot_product_efficient_attention`` under ``auto``. End to end, torch.compile records exactly the SDPA
op as a fallback.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler import config, fx_attention
from compiler.decompositions import decomposition_table
from compiler.exc import ConfigError

aten = torch.ops.aten
SDPA = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
)
UNFUSED = (aten.bmm.default, aten.amax.default, aten.exp.default, aten._softmax.default)

HEADS = 4


def _heads(t, d):
    b, s, _ = t.shape
    return t.view(b, s, HEADS, d).permute(0, 2, 1, 3)


def bert_attention(
    x,
    wq,
    wk,
    wv,
    mask,
    scale_q=False,
    mask_first=False,
    return_probs=False,
    bool_mask=False,
    two_masks=False,
    out_dtype=None,
):
    """BERT's eager self-attention: linear q/k/v, [B, H, S, D] heads, scaled scores plus an additive mask."""
    b, s, h = x.shape
    d = h // HEADS
    q, k, v = _heads(x @ wq, d), _heads(x @ wk, d), _heads(x @ wv, d)
    if scale_q:
        q = q * d**-0.5
        scores = torch.matmul(q, k.transpose(-1, -2))
    else:
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    if bool_mask:
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None and mask_first:
        scores = (torch.matmul(q, k.transpose(-1, -2)) + mask) / math.sqrt(d)
    elif mask is not None:
        scores = scores + mask
        if two_masks:  # T5's decoder: a position bias, then the causal mask
            scores = scores + mask.transpose(-1, -2).sin()
    probs = torch.softmax(scores, dim=-1).to(out_dtype or v.dtype)
    out = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, h)
    return (out, probs) if return_probs else out


def attention(**opts):
    """``bert_attention`` with ``opts``, as a function of its five tensors (what ``make_fx`` traces)."""

    def fn(x, wq, wk, wv, mask):
        return bert_attention(x, wq, wk, wv, mask, **opts)

    return fn


BERT = attention()


def _args(b=2, s=16, h=64, mask_shape="b11s", dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, h, generator=g)
    ws = [torch.randn(h, h, generator=g) / math.sqrt(h) for _ in range(3)]
    shapes = {"b11s": (b, 1, 1, s), "b1ss": (b, 1, s, s), "bhss": (b, HEADS, s, s), "s": (s,)}
    mask = None
    if mask_shape is not None:
        mask = torch.zeros(shapes[mask_shape])
        mask[..., s - 3 :] = -1e4  # the last keys are padding
        mask = mask + 0.1 * torch.randn(shapes[mask_shape], generator=g)  # a bias, not only 0 / -inf
    return [t.to(device=device, dtype=dtype) if t is not None else None for t in [x, *ws, mask]]


def _trace(fn, args, mode="fake"):
    return make_fx(fn, tracing_mode=mode, decomposition_table=decomposition_table())(*args)


def _count(gm, targets):
    return sum(n.op == "call_function" and n.target in targets for n in gm.graph.nodes)


def _fused(fn, args, mode="fake", setting="fuse"):
    gm = _trace(fn, args, mode)
    with config.patch(attention=setting):
        n = fx_attention.fuse_attention(gm)
    return gm, n


# ------------------------------------------------------------------------------------------------ matcher
@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(scale_q=True),
        dict(mask_shape=None),
        dict(mask_shape="b1ss"),
        dict(mask_shape="bhss"),
        dict(mask_shape="s"),
        dict(s=8),
        dict(s=13, mask_shape="b1ss"),
        dict(h=32),
        dict(two_masks=True),
    ],
)
def test_eager_attention_becomes_one_sdpa_call(variant):
    """Each variant (scale on q or on the scores, masks of every broadcast shape, aligned or padded, two masks
    added one after the other, head dims 16 and 8) leaves one SDPA node, no bmm or softmax piece, and the eager
    values."""
    kwargs = {k: variant[k] for k in ("scale_q", "two_masks") if k in variant}
    args = _args(**{k: v for k, v in variant.items() if k not in kwargs})

    fn = attention(**kwargs)
    gm, n = _fused(fn, args)
    assert n == 1
    assert _count(gm, SDPA) == 1 and _count(gm, UNFUSED) == 0
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    d = args[0].shape[-1] // HEADS
    assert sdpa.kwargs["scale"] == pytest.approx(d**-0.5)
    assert (sdpa.kwargs["attn_mask"] is None) == (args[4] is None)
    torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-5, atol=1e-5)


def test_unaligned_mask_is_padded_and_aligned_mask_is_not():
    """The bias's strides but the last must be multiples of 16 elements: an 8-key mask is padded to 16 and
    sliced back, a 16-key one goes in as it is (expanded to [B, H, S, Sk])."""
    for s, padded in ((8, True), (16, False)):
        gm, _ = _fused(BERT, _args(s=s))
        assert _count(gm, (aten.constant_pad_nd.default,)) == padded
        sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
        bias = sdpa.kwargs["attn_mask"].meta["val"]
        assert list(bias.shape) == [2, HEADS, s, s] and bias.stride(-1) == 1
        assert all(st % 16 == 0 for st in bias.stride()[:-1])


def _unchanged(fn, args):
    gm = _trace(fn, args)
    code = gm.code
    with config.patch(attention="fuse"):
        assert fx_attention.fuse_attention(gm) == 0
    assert gm.code == code


@pytest.mark.parametrize(
    "case", ["probs_returned", "head_dim_12", "bool_mask", "mask_before_scale", "f64_mask"]
)
def test_what_does_not_match_leaves_the_graph_unchanged(case):
    args = _args(h=48) if case == "head_dim_12" else _args()
    kwargs = {
        "probs_returned": dict(return_probs=True),
        "bool_mask": dict(bool_mask=True),
        "mask_before_scale": dict(mask_first=True),
    }.get(case, {})
    if case == "bool_mask":
        args[4] = args[4] < -1
    if case == "f64_mask":  # the add promotes the scores to fp64: no kernel computes in that
        args[4] = args[4].double()
        kwargs = dict(out_dtype=torch.float32)
    _unchanged(attention(**kwargs), args)


def test_attention_with_odd_head_dim_or_grouped_heads_is_left_alone():
    """A head dim the kernel's aligned loads do not take (5), and k/v broadcast over the heads (an expand that
    changes the shape: grouped-query attention), keep their bmms."""
    x = torch.randn(2, 3, 8, 5)
    _unchanged(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, [x, x, x])
    kv = torch.randn(2, 1, 8, 8)
    _unchanged(
        lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, [torch.randn(2, 3, 8, 8), kv, kv]
    )


def test_bf16_attention_keeps_eager_accuracy():
    """bf16: the softmax runs on fp32 casts of the scores, which the match takes in; the fused result is as close
    to an fp64 reference as eager's."""
    args = _args(s=32, dtype=torch.bfloat16)
    gm, n = _fused(BERT, args)
    assert n == 1 and _count(gm, (aten._to_copy.default,)) == 0
    ref = bert_attention(*[t.double() for t in args])
    eager_err = (bert_attention(*args).double() - ref).abs().max()
    assert (gm(*args).double() - ref).abs().max() <= 2 * eager_err


def test_dynamic_batch_is_fused_and_symbolic_head_dim_is_not(device):
    """A symbolic batch (Dynamo's ``mark_dynamic``) keeps the rewrite: one graph serves two batch sizes. A
    symbolic head dim cannot be checked against the kernel's limits without a guard: left alone."""
    with config.patch(attention="fuse", strict=True), torch.no_grad(), compiler.capture() as gs:
        fn = torch.compile(BERT, backend="kiln")
        for b in (3, 5):
            args = _args(b=b, device=device)
            torch._dynamo.mark_dynamic(args[0], 0)
            torch._dynamo.mark_dynamic(args[4], 0)
            torch.testing.assert_close(fn(*args), BERT(*args), rtol=1e-4, atol=1e-4)
    (g,) = gs
    assert sum("attention" in op for op in g.fallback_ops) == 1 and _count(g.aten_graph, UNFUSED) == 0
    assert any(isinstance(n.meta["val"], torch.SymInt) for n in g.aten_graph.graph.nodes if "val" in n.meta)
    gm, n = _fused(BERT, _args(b=3), mode="symbolic")  # every size symbolic, the head dim too
    assert n == 0 and _count(gm, SDPA) == 0


@pytest.mark.parametrize("setting", ["auto", "keep"])
def test_auto_and_keep_leave_cpu_graphs_alone(setting):
    gm, n = _fused(BERT, _args(), setting=setting)
    assert n == 0 and _count(gm, SDPA) == 0


def test_auto_fuses_gpu_graphs_with_the_efficient_kernel(monkeypatch):
    """A graph traced on (fake) CUDA tensors gets ``_scaled_dot_product_efficient_attention`` under ``auto``
    outside the interpreter, with an additive bias in the query's dtype and q/k/v of unit last stride."""
    monkeypatch.setattr(config, "interpreting", lambda: False)
    with FakeTensorMode():
        args = [torch.empty(t.shape, device="cuda", dtype=torch.float16) for t in _args(mask_shape="b1ss")]
    gm = make_fx(BERT, tracing_mode="real", decomposition_table=decomposition_table())(*args)
    with config.patch(attention="auto"):
        assert fx_attention.fuse_attention(gm) == 1
    (sdpa,) = [n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_efficient_attention.default]
    q, k, v, bias = (a.meta["val"] for a in sdpa.args[:4])
    assert sdpa.args[4:] == (False, 0.0, False) and sdpa.kwargs["scale"] == pytest.approx(0.25)
    assert all(t.stride(-1) == 1 and t.dtype == torch.float16 for t in (q, k, v, bias))
    assert list(bias.shape) == [2, HEADS, 16, 16]


# ---------------------------------------------------------------------------------------------- end to end
def test_compiled_attention_runs_one_sdpa_fallback(device):
    args = _args(device=device)
    with config.patch(attention="fuse", strict=True), torch.no_grad(), compiler.capture() as gs:
        got = torch.compile(BERT, backend="kiln")(*args)
    torch.testing.assert_close(got, bert_attention(*args), rtol=1e-4, atol=1e-4)
    (g,) = gs
    want = (
        "_scaled_dot_product_flash_attention_for_cpu"
        if device == "cpu"
        else "_scaled_dot_product_efficient_attention"
    )
    assert [op for op in g.fallback_ops if "attention" in op] == [f"aten.{want}.default"]
    assert _count(g.aten_graph, UNFUSED) == 0


def test_training_graphs_keep_their_matmuls(device):
    """The forward of a training graph would have to save the probabilities: the pass leaves it alone."""
    args = _args(device=device)
    args[1].requires_grad_(True)
    with config.patch(attention="fuse", strict=True), compiler.capture() as gs:
        torch.compile(BERT, backend="kiln")(*args).sum().backward()
    assert gs and not any("attention" in op for g in gs for op in g.fallback_ops)


def test_hf_bert_eager_attention_is_fused(device):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    m = transformers.BertModel(cfg).eval().to(device)
    ids = torch.randint(0, 64, (2, 16), device=device)
    am = torch.ones(2, 16, dtype=torch.long, device=device)
    am[1, 10:] = 0
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=am).last_hidden_state
        with config.patch(attention="fuse", strict=True), compiler.capture() as gs:
            got = torch.compile(m, backend="kiln")(input_ids=ids, attention_mask=am).last_hidden_state
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert sum("attention" in op for g in gs for op in g.fallback_ops) == 2  # one per layer
    assert all(_count(g.aten_graph, (aten.bmm.default,)) == 0 for g in gs)


def test_bad_value_is_a_config_error():
    with pytest.raises(ConfigError, match="KILN_ATTENTION"):
        config.from_env({"KILN_ATTENTION": "flash"})


def test_reference_sdpa_agrees_with_the_eager_module():
    """The module under test is eager attention: F.scaled_dot_product_attention gives its values."""
    x, wq, wk, wv, mask = _args()
    d = x.shape[-1] // HEADS
    ref = F.scaled_dot_product_attention(_heads(x @ wq, d), _heads(x @ wk, d), _heads(x @ wv, d), mask)
    torch.testing.assert_close(bert_attention(x, wq, wk, wv, mask), ref.permute(0, 2, 1, 3).reshape(x.shape))


def test_misaligned_operands_and_mask_are_copied():
    """q/k/v and a mask that start off a 16-byte boundary (views at an odd offset) reach the kernel as copies;
    a k^T that is not a transpose of anything gets a permute."""

    def fn(qkv, mask):
        q, k, v = (qkv[:, :, :, 1 + 16 * i : 17 + 16 * i] for i in range(3))
        p = torch.softmax(q @ k.transpose(-1, -2).contiguous() * 0.25 + mask[..., 1:], -1)
        return p @ v

    args = [torch.randn(2, HEADS, 16, 49), torch.randn(2, 1, 1, 17)]
    gm, n = _fused(fn, args)
    assert n == 1
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    for t in [*(a.meta["val"] for a in sdpa.args[:3]), sdpa.kwargs["attn_mask"].meta["val"]]:
        assert t.storage_offset() * t.element_size() % 16 == 0 and t.stride(-1) == 1
    torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-5, atol=1e-5)


def _flat_attention(q, k, v, mask):
    """BART's older eager attention: heads folded into the batch, ``torch.bmm`` on [N, S, D] operands."""
    p = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25 + mask, dim=-1)
    return torch.bmm(p, v)


@pytest.mark.parametrize("d,fused", [(16, True), (4, False)])
def test_flat_bmm_attention_runs_as_one_batch_of_heads(d, fused):
    """[N, S, D] operands run as [1, N, S, D] (unsqueezed in, squeezed out); a head dim of 4 is left alone."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(6, 16, d, generator=g) for _ in range(3)] + [torch.randn(6, 1, 16, generator=g)]
    gm, n = _fused(_flat_attention, args)
    assert n == fused and _count(gm, SDPA) == fused and _count(gm, (aten.bmm.default,)) == 2 * (not fused)
    if fused:
        sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
        assert [list(a.meta["val"].shape) for a in sdpa.args[:3]] == [[1, 6, 16, d]] * 3
    torch.testing.assert_close(gm(*args), _flat_attention(*args), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ SDPA's math form
def _math_sdpa(q, k, v, mask):
    """PyTorch's math SDPA (what a model calling F.scaled_dot_product_attention reaches kiln as when the math
    backend runs): fp32 upcasts, sqrt(scale) on q and on k^T, an additive mask, a safe softmax, a downcast."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(dtype=torch.bfloat16, b=2, s=16, d=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, HEADS, s, d, generator=g).to(dtype) for _ in range(3)]


def _fused_dce(fn, args):
    gm = _trace(fn, args)
    gm.graph.eliminate_dead_code()  # make_fx keeps unused nodes that AOTAutograd's graphs do not have
    gm.recompile()
    with config.patch(attention="fuse"):
        n = fx_attention.fuse_attention(gm)
    return gm, n


@pytest.mark.parametrize("mask", ["bool", "bf16", "none"])
def test_math_sdpa_runs_on_the_bf16_operands(mask):
    """The math form of bf16 SDPA: the upcasts of q/k/v and the downcast of the result go, the SDPA node takes
    the bf16 tensors (the kernels accumulate in fp32), the two sqrt(scale) factors make one scale, and the
    ``where(bool, 0, -inf)`` mask goes in as a bf16 bias; the safe softmax's zero rows are the kernels' too."""
    q, k, v = _qkv()
    m = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    m[1, ..., 11:] = False
    m[0, 0, 3] = False  # a row with no key: zeros from the safe softmax and from the fused kernels
    am = {"bool": m, "bf16": torch.where(m, 0.0, -1e4).to(torch.bfloat16), "none": None}[mask]
    gm, n = _fused_dce(_math_sdpa, [q, k, v, am])
    assert n == 1 and _count(gm, UNFUSED) == 0
    assert _count(gm, (aten._to_copy.default, torch.ops.prims.convert_element_type.default)) == 0
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    assert all(a.meta["val"].dtype == torch.bfloat16 for a in sdpa.args[:3])
    assert sdpa.kwargs["scale"] == pytest.approx(0.25)
    bias = sdpa.kwargs["attn_mask"]
    assert (bias is None) == (am is None) and (bias is None or bias.meta["val"].dtype == torch.bfloat16)
    got, want = gm(q, k, v, am), _math_sdpa(q, k, v, am)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def _upcast_attention(q, k, v, mask):
    """bf16 q/k/v cast to fp32 by hand, a scale on both q (a div) and k^T (a mul), an fp32 mask, the result cast
    back to bf16."""
    q32, k32, v32 = q.float(), k.float(), v.float()
    p = torch.softmax((q32 / 2.0) @ (k32.transpose(-1, -2) * 0.125) + mask, dim=-1)
    return (p @ v32).to(torch.bfloat16)


def test_scale_on_both_sides_and_upcast_downcast_are_taken_in():
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 12:] = torch.finfo(torch.float32).min  # HF's padding: finfo.min becomes -inf in bf16
    gm, n = _fused_dce(_upcast_attention, [q, k, v, mask])
    assert n == 1 and _count(gm, (aten.bmm.default, aten.mul.Tensor, aten.div.Tensor)) == 0
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    assert sdpa.kwargs["scale"] == pytest.approx(0.0625)
    assert [a.meta["val"].dtype for a in sdpa.args[:3]] == [torch.bfloat16] * 3
    assert sdpa.kwargs["attn_mask"].meta["val"].dtype == torch.bfloat16  # the fp32 mask cast to the operands'
    torch.testing.assert_close(gm(q, k, v, mask), _upcast_attention(q, k, v, mask), rtol=2e-2, atol=2e-2)


def test_fp32_scale_on_both_sides_with_divisions():
    q, k, v = _qkv(torch.float32)

    def fn(q, k, v):
        return torch.softmax((q / 2.0) @ (k.transpose(-1, -2) / 4.0), dim=-1) @ v

    gm, n = _fused_dce(fn, [q, k, v])
    assert n == 1 and next(n for n in gm.graph.nodes if n.target in SDPA).kwargs["scale"] == pytest.approx(
        0.125
    )
    torch.testing.assert_close(gm(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)


def test_fp32_mask_on_bf16_scores_is_cast_to_bf16():
    """bf16 scores plus an fp32 mask (the add promotes; eager's softmax runs on fp32 scores): the mask goes in as
    a bf16 bias, the fused kernel's softmax runs in fp32 as well."""
    args = _args(dtype=torch.bfloat16)
    args[4] = args[4].float()
    gm, n = _fused(BERT, args)
    assert n == 1 and _count(gm, UNFUSED) == 0
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    assert sdpa.kwargs["attn_mask"].meta["val"].dtype == torch.bfloat16
    torch.testing.assert_close(gm(*args), BERT(*args), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["no_downcast", "upcast_read_elsewhere", "mixed_dtypes"])
def test_upcasts_stay_where_dropping_them_would_change_the_result(case):
    """The SDPA node runs on the fp32 casts (kept) when the result is not cast back (eager's output is fp32), when
    the fp32 q is also read elsewhere, or when q and k come from different dtypes."""
    q, k, v = _qkv()
    if case == "mixed_dtypes":
        k = k.half()

    def fn(q, k, v):
        q32, k32, v32 = q.float(), k.float(), v.float()
        out = torch.softmax(q32 @ k32.transpose(-1, -2) * 0.25, dim=-1) @ v32
        if case == "upcast_read_elsewhere":
            return out.to(q.dtype), q32.sum()
        return out if case == "no_downcast" else out.to(q.dtype)

    gm, n = _fused_dce(fn, [q, k, v])
    assert n == 1 and _count(gm, (aten._to_copy.default,)) == 3 + (case != "no_downcast")
    sdpa = next(n for n in gm.graph.nodes if n.target in SDPA)
    assert [a.meta["val"].dtype for a in sdpa.args[:3]] == [torch.float32] * 3
    torch.testing.assert_close(gm(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)


def test_hf_bert_sdpa_math_form_is_fused(device):
    """HF BERT with ``attn_implementation="sdpa"`` in bf16 under the math backend (what reaches kiln on the GPU
    with a mask): one SDPA fallback per layer, as close to an fp32 reference as eager."""
    transformers = pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=512,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    m = transformers.BertModel(cfg).eval().to(device)
    ids = torch.randint(0, 512, (2, 16), device=device)
    am = torch.ones(2, 16, dtype=torch.long, device=device)
    am[1, 10:] = 0
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        ref = m(ids, attention_mask=am).last_hidden_state
        m = m.to(torch.bfloat16)
        eager = m(ids, attention_mask=am).last_hidden_state
        with config.patch(attention="fuse", strict=True), compiler.capture() as gs:
            got = torch.compile(m, backend="kiln")(ids, attention_mask=am).last_hidden_state
    want = (
        "_scaled_dot_product_flash_attention_for_cpu"
        if device == "cpu"
        else "_scaled_dot_product_efficient_attention"
    )
    assert [op for g in gs for op in g.fallback_ops if "attention" in op] == [f"aten.{want}.default"] * 2
    assert all(_count(g.aten_graph, (aten.bmm.default,)) == 0 for g in gs)
    torch.testing.assert_close(got, eager, rtol=2e-2, atol=6e-2)
    assert (got.float() - ref).abs().max() <= 2 * (eager.float() - ref).abs().max()


def test_gpu_math_form_gets_the_efficient_kernel_on_bf16_operands(monkeypatch):
    """On (fake) CUDA tensors under ``auto``: upcast bf16 attention with an fp32 mask (the GPU's math form adds
    ``where(bool, 0, -inf)`` in fp32) becomes the efficient kernel on the bf16 tensors, with a bf16 bias."""
    monkeypatch.setattr(config, "interpreting", lambda: False)
    with FakeTensorMode():
        args = [torch.empty(2, HEADS, 16, 16, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        args.append(torch.empty(2, 1, 16, 16, device="cuda"))
    gm = make_fx(_upcast_attention, tracing_mode="real", decomposition_table=decomposition_table())(*args)
    with config.patch(attention="auto"):
        assert fx_attention.fuse_attention(gm) == 1
    (sdpa,) = [n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_efficient_attention.default]
    assert [a.meta["val"].dtype for a in sdpa.args[:4]] == [torch.bfloat16] * 4
    assert sdpa.kwargs["scale"] == pytest.approx(0.0625) and _count(gm, (aten.bmm.default,)) == 0


def test_an_expanded_bias_is_computed_once_per_distinct_element():
    """A mask turned into an additive bias and expanded over the heads reaches the attention call as eager
    passes it: a (batch, 1, q, k) buffer read through stride 0 along the heads, not a (batch, heads, q, k)
    buffer of copies (GPT-2's causal bias on the H200: 4x 16 MB written a step, and 8x the bias reads in the
    fused attention kernel)."""
    from compiler.codegen.wrapper import _allocates

    b, h, t, d = 2, HEADS, 16, 8

    def f(mask, q, k, v):
        bias = torch.where(mask, 0.0, float("-inf")).expand(b, h, t, t)
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[0]

    g = torch.Generator().manual_seed(0)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool)).expand(b, 1, t, t).clone()
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    torch._dynamo.reset()
    with config.patch(cache="0"), compiler.capture() as gs:
        got = torch.compile(f, backend="kiln")(mask, q, k, v)
    torch.testing.assert_close(got, f(mask, q, k, v))
    (graph,) = gs
    shapes = [n.args[0] for n in graph.wrapper.graph.nodes if _allocates(n)]
    assert shapes == [(b, 1, t, t)], shapes
