"""Mixed row/column kernels (scheduler.Scheduler.mix_column_partials): a backward's weight-gradient column
sums computed as per-program partials inside the row kernel that reads the same (rows x columns)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import compiler


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def residual_norm(x, r, w, b):
    h = x + r
    return F.layer_norm(h, h.shape[-1:], w, b, 1e-5), h


def bias_gelu(x, b):
    return F.gelu(x + b)


def linear_layer_norm(x, w, b, lw, lb):
    # the linear layer's bias gradient (a sum over the flattened rows, kept as a (1, N) row) beside the norm's
    # weight gradients (sums over every leading dim): one column reduction of differently shaped sources
    h = F.linear(x, w, b)
    return F.layer_norm(h, h.shape[-1:], lw, lb, 1e-6)


def _grads(fn, inputs, dynamic=False, gos=None):
    """(compiled grads, eager grads, backward CompiledGraph, output grads); random output grads unless given."""
    torch._dynamo.reset()
    xs = [t.detach().requires_grad_(True) for t in inputs]
    with compiler.config.patch(strict=True), compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln", dynamic=dynamic)(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        gos = gos or [torch.randn_like(o) for o in outs]
        got = torch.autograd.grad(outs, xs, gos)
    ref = fn(*xs)
    want = torch.autograd.grad(ref if isinstance(ref, tuple) else (ref,), xs, gos)
    return got, want, graphs[-1], gos


def _mixed(cg) -> list:
    return [m for m in cg.wrapper.children() if getattr(m, "programs", 0)]


# rows >= reductions.OUTER_SPLIT_MIN_ROWS (1024) so the column reductions split (the mixed kernel replaces
# their first stage)
CASES = [
    ("layer_norm_1030_rows", layer_norm, [(1030, 40), (40,), (40,)], torch.float32),
    ("layer_norm_ragged_rows", layer_norm, [(4100, 48), (48,), (48,)], torch.float32),
    ("layer_norm_3d", layer_norm, [(8, 520, 40), (40,), (40,)], torch.float32),
    ("rms_norm_bf16_stage_moves_after_rows", rms_norm, [(4096, 64), (64,)], torch.bfloat16),
    ("residual_norm", residual_norm, [(4096, 32), (4096, 32), (32,), (32,)], torch.float32),
    # 2048 rows split in chunks of 1024 over 1024 columns: the first stage's 2 x 1024 outputs of 1024 rows equal
    # the row kernel's 2048 rows of 1024, which must not fuse it there as a plain reduction (scheduler._stages_agree)
    ("rms_norm_chunk_as_wide_as_the_rows", rms_norm, [(2048, 1024), (1024,)], torch.float32),
    ("bias_gelu_pointwise_as_rows", bias_gelu, [(4096, 64), (64,)], torch.float32),
    (
        "linear_bias_beside_norm_grads",
        linear_layer_norm,
        [(2048, 64), (64, 64), (64,), (64,), (64,)],
        torch.float32,
    ),
    (
        "linear_bias_beside_norm_grads_3d",
        linear_layer_norm,
        [(8, 260, 48), (48, 48), (48,), (48,), (48,)],
        torch.float32,
    ),
]


@pytest.mark.parametrize("name, fn, shapes, dtype", CASES, ids=[c[0] for c in CASES])
def test_weight_grads_fuse_into_the_row_kernel(device, name, fn, shapes, dtype):
    inputs = [torch.randn(s, device=device, dtype=dtype) for s in shapes]
    got, want, bwd, gos = _grads(fn, inputs)
    if dtype == torch.float32:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    else:  # sums of 4096 low-precision products: at least as close to float64 as eager is
        _, exact, _, _ = _grads(fn, [t.double() for t in inputs], gos=[g.double() for g in gos])
        for a, b, e in zip(got, want, exact):
            err, eager_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
            assert err <= 2 * eager_err + 1e-2, (float(err), float(eager_err))
    assert len(_mixed(bwd)) == 1, bwd.code
    assert bwd.kernel_count == 2, bwd.code  # the row kernel with partials + the partials' final sum


def test_symbolic_rows_keep_separate_kernels(device):
    # no split (and so no mixing) without static sizes; results stay right
    x = torch.randn(4100, 48, device=device)
    w, b = torch.randn(48, device=device), torch.randn(48, device=device)
    got, want, bwd, _ = _grads(layer_norm, [x, w, b], dynamic=True)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
    assert not _mixed(bwd)


def test_program_count_by_shape_class():
    from compiler import scheduler

    # narrow rows (at most MIX_NARROW_COLS) and wide ones (more than MIX_WIDE_COLS): fewer programs; the rest,
    # few rows or many: the base count
    assert (
        scheduler.mix_programs(100352, 64)
        == scheduler.mix_programs(401408, 32)
        == scheduler.MIX_NARROW_PROGRAMS
    )
    assert scheduler.mix_programs(100352, 256) == scheduler.mix_programs(6304, 768) == scheduler.MIX_PROGRAMS
    assert scheduler.mix_programs(6272, 1024) == scheduler.MIX_PROGRAMS
    assert (
        scheduler.mix_programs(16384, 4096)
        == scheduler.mix_programs(2048, 1025)
        == scheduler.MIX_WIDE_PROGRAMS
    )
    assert scheduler.MIX_WIDE_PROGRAMS < scheduler.MIX_NARROW_PROGRAMS < scheduler.MIX_PROGRAMS


def test_a_pointwise_row_kernel_mixes_only_when_its_rows_fill_most_of_their_block(device):
    """A GELU backward beside its linear layer's bias gradient: rows of 48 (three quarters of a 64 block) keep
    the column sum in its own kernel, rows of 56 mix it into the row kernel."""
    for cols, mixed in ((48, False), (56, True)):
        h, b = torch.randn(2048, cols, device=device), torch.randn(cols, device=device)
        got, want, bwd, _ = _grads(bias_gelu, [h, b])
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
        assert bool(_mixed(bwd)) == mixed, cols


def test_a_compiled_mixed_kernel_takes_the_rules_programs_in_whole_chunks(device):
    from compiler import scheduler

    rows = 4100  # few rows: the rule's count asks for chunks under MIX_MIN_ROWS, so chunks of 8 rows it is
    x = torch.randn(rows, 96, device=device)
    w, b = torch.randn(96, device=device), torch.randn(96, device=device)
    got, want, bwd, _ = _grads(layer_norm, [x, w, b])
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
    chunk = max(scheduler.MIX_MIN_ROWS, -(-rows // scheduler.mix_programs(rows, 96)))
    assert [m.programs for m in _mixed(bwd)] == [-(-rows // chunk)] == [513]


@pytest.mark.parametrize(
    "limit, cols, tile",
    [(0, 64, False), (64, 64, True), (64, 48, True), (32, 48, False)],
    ids=["off", "rows_fit", "ragged_rows_fit_their_block", "rows_too_wide"],
)
def test_full_tile_accumulators_for_narrow_rows_when_configured(device, limit, cols, tile):
    x = torch.randn(4096, cols, device=device, dtype=torch.bfloat16)
    w = torch.randn(cols, device=device, dtype=torch.bfloat16)
    with compiler.config.patch(mix_tile_acc_cols=limit, cache="0"):
        got, want, bwd, gos = _grads(rms_norm, [x, w])
    _, exact, _, _ = _grads(rms_norm, [x.double(), w.double()], gos=[g.double() for g in gos])
    for a, b, e in zip(got, want, exact):
        err, eager_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
        assert err <= 2 * eager_err + 1e-2, (float(err), float(eager_err))
    (mixed,) = _mixed(bwd)
    assert ("tl.full([XBLOCK, RBLOCK], 0, tl.float32)" in mixed.source) == tile, mixed.source
    assert ("tl.sum(tl.where(xrmask" in mixed.source) != tile  # a one-row accumulator reduces every step


def test_a_fixed_program_count_overrides_the_rule(device):
    from compiler import scheduler

    with compiler.config.patch(mix_programs=64):
        assert scheduler.mix_programs(100352, 256) == 64
        x = torch.randn(4100, 48, device=device)
        w, b = torch.randn(48, device=device), torch.randn(48, device=device)
        got, want, bwd, _ = _grads(layer_norm, [x, w, b])
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
    assert [m.programs for m in _mixed(bwd)] == [64]  # 4100 rows in chunks of 65
    assert scheduler.mix_programs(100352, 256) == scheduler.MIX_PROGRAMS  # the rule again
