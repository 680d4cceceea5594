"""The launcher: launch configs per size, and (on GPUs) the compiled-kernel fast path per specialization."""

import torch

import compiler
from compiler.runtime.launcher import TritonKernel


def _kernel(device):
    with compiler.capture() as graphs:
        torch.compile(lambda x: x * 3 + 1, backend="kiln")(torch.randn(64, device=device))
    return next(m for m in graphs[0].wrapper.children() if isinstance(m, TritonKernel))


def test_reuse_across_sizes_and_misaligned_views(device):
    """Specializations differ for misaligned pointers and odd sizes; each call must compute correctly."""
    k = _kernel(device)
    base = torch.randn(4096 + 7, device=device)
    for n, offset in [(64, 0), (64, 1), (1000, 0), (1000, 3), (64, 0), (17, 5), (1, 0)]:
        x = base[offset : offset + n]
        out = torch.full((n,), float("nan"), device=device)
        k(x, out, n)
        torch.testing.assert_close(out, x * 3 + 1)


def test_zero_elements_launch_nothing(device):
    k = _kernel(device)
    out = torch.empty(0, device=device)
    assert k(torch.empty(0, device=device), out, 0) is None


def test_launch_hook_detection_understands_hook_chains():
    from compiler.runtime.launcher import _hook_set

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not _hook_set(None) and not _hook_set(Chain([]))
    assert _hook_set(Chain([print])) and _hook_set(print)


def _cfg(hint: str, programs: int, xnumel: int, rnumel: int) -> str:
    k = TritonKernel("k", "", [], [], True, hint, programs)
    c = k.heuristic_config(xnumel, rnumel, interp=False)
    return f"X{c['XBLOCK']}/R{c['RBLOCK']}/w{c['num_warps']}"


# (hint, programs of a mixed kernel, xnumel, rnumel, the GPU heuristic's pick). Shapes and best configs from an
# H100 ``python -m compiler.tools.launch_sweep --case convnext,resnet,vit``; mixed kernels from an H200
# ``python -m compiler.tools.mix_sweep`` with each kernel autotuned, at the scheduler's programs (full-tile
# accumulators up to 512 columns, one-row accumulators above). For column (outer) kernels xnumel is the output
# columns (split partials x channels) and rnumel the rows each sums.
NEW_PICKS = [
    ("inner", 0, 50176, 96, "X16/R128/w8"),  # ConvNeXt LayerNorm: many short rows, measured best
    ("inner", 1024, 100352, 256, "X4/R256/w4"),  # ResNet BatchNorm backward, mixed: autotuned best
    ("inner", 512, 100352, 64, "X32/R64/w4"),  # the same at 64 channels: autotuned best
    ("inner", 1024, 25088, 512, "X2/R512/w4"),  # at 512 channels (autotuned: X2 w2, within 1 us)
    ("inner", 1024, 6272, 1024, "X8/R1024/w8"),  # at 1024 channels (autotuned: X8 w16), one-row accumulators
    ("inner", 1024, 6304, 768, "X8/R1024/w8"),  # ViT LayerNorm backward, mixed: autotuned best
    ("inner", 512, 6304, 768, "X4/R1024/w4"),  # chunks of 13 rows: 8-row steps measured 48.6 us, 4-row 26.0
    ("outer", 0, 6272, 1024, "X16/R64/w16"),  # BatchNorm var_mean, 98 programs at 64 columns: 16 columns and
    # 16 warps won in both sweeps
    ("outer", 0, 4608, 1051, "X16/R64/w16"),  # ViT LayerNorm weight grad, 72 programs at 64 columns
]

# picks that matched the measured best before and must stay
KEPT_PICKS = [
    ("outer", 0, 256, 256, "X16/R64/w8"),
    ("outer", 0, 64, 256, "X16/R64/w8"),
    ("outer", 0, 256, 98, "X16/R64/w8"),
    ("outer", 0, 64, 98, "X16/R64/w8"),
    ("outer", 0, 25088, 1024, "X64/R64/w8"),
    ("outer", 0, 13824, 1051, "X64/R64/w8"),
    ("outer", 0, 768, 253, "X16/R64/w8"),
    ("outer", 0, 3072, 253, "X64/R64/w8"),
    ("outer", 0, 2304, 253, "X64/R64/w8"),
    ("outer", 0, 2304, 6, "X64/R8/w4"),
    ("outer", 0, 768, 6, "X64/R8/w4"),
    ("inner", 0, 6304, 768, "X4/R1024/w4"),
    ("inner", 253, 6304, 3072, "X1/R4096/w16"),
    ("inner", 0, 12544, 192, "X4/R256/w4"),
    ("inner", 0, 4096, 96, "X8/R128/w4"),  # short rows, but few of them: programs to spare stay as they were
]


def test_gpu_reduction_picks_follow_the_h100_sweep():
    assert [_cfg(*case[:4]) for case in NEW_PICKS] == [case[4] for case in NEW_PICKS]
    assert [_cfg(*case[:4]) for case in KEPT_PICKS] == [case[4] for case in KEPT_PICKS]


def test_gpu_reduction_rules_at_their_edges():
    # long columns: the narrowing starts at OUTER_LONG_RNUMEL rows and stops once 64 columns fill the SMs
    assert _cfg("outer", 0, 6272, 511) == "X64/R64/w8"
    assert (
        _cfg("outer", 0, 64 * 132, 1024) == "X64/R64/w8" and _cfg("outer", 0, 64 * 131, 1024) == "X16/R64/w16"
    )
    assert _cfg("outer", 0, 8, 4096) == "X8/R64/w8"  # fewer than 16 columns: no 16 warps over 512 elements
    # a mixed kernel never steps over more rows than a program owns (2048 rows in 256 programs: 8 each)
    assert _cfg("inner", 256, 2048, 64) == "X8/R64/w4"
    # many short rows: the rule needs rows of 32 to 128 elements, a row hint and INNER_MANY_ROWS rows
    assert _cfg("inner", 0, 16384, 64) == "X32/R64/w8" and _cfg("inner", 0, 16383, 64) == "X16/R64/w4"
    assert _cfg("inner", 0, 50176, 256) == "X4/R256/w4" and _cfg("outer", 0, 50176, 64) == "X16/R64/w4"


def test_interpreter_mixed_steps_stop_at_the_rows_a_program_owns():
    """Under the interpreter a mixed kernel's block is capped by its program's rows, not only by the
    interpreter's 64K-element tile: lanes past them would be masked numpy work (about twice the step time of a
    LayerNorm backward over 4100 x 48)."""
    k = TritonKernel("k", "", [], [], True, "inner", 513)
    assert k.heuristic_config(4100, 48, interp=True)["XBLOCK"] == 8  # 513 programs of 8 rows
    assert (
        TritonKernel("k", "", [], [], True, "inner", 4).heuristic_config(4100, 48, interp=True)["XBLOCK"]
        == 1024
    )
    assert (
        TritonKernel("k", "", [], [], True, "inner").heuristic_config(4100, 48, interp=True)["XBLOCK"] == 1024
    )


def _pointwise_cfg(pointers: int, xnumel: int, interp: bool = False) -> str:
    k = TritonKernel("k", "", [f"p{i}" for i in range(pointers)], [], False)
    c = k.heuristic_config(xnumel, 1, interp=interp)
    return f"X{c['XBLOCK']}/w{c['num_warps']}"


def test_gpu_pointwise_kernels_over_many_tensors_take_fewer_elements_a_thread():
    """H200 ``launch_sweep --case adamw``: the AdamW update of eight (768, 3072) weights in one kernel (40
    pointers) ran 1.37x faster at XBLOCK 256 than 1024, four (20 pointers) 1.06x at 512, one (5) the same."""
    big = 768 * 3072 * 8
    picks = {n: _pointwise_cfg(n, big) for n in (1, 5, 12, 13, 20, 24, 25, 40, 48, 49, 300)}
    assert picks == {
        1: "X1024/w4",
        5: "X1024/w4",
        12: "X1024/w4",
        13: "X512/w4",
        20: "X512/w4",
        24: "X512/w4",
        25: "X256/w4",
        40: "X256/w4",
        48: "X256/w4",
        49: "X128/w4",
        300: "X128/w4",
    }
    assert _pointwise_cfg(40, 100) == "X128/w4"  # small sizes: still the next power of two, under the cap
    # the interpreter's blocks do not change with the pointers
    assert _pointwise_cfg(40, big, interp=True) == _pointwise_cfg(1, big, interp=True)


def test_gpu_reduction_picks_compute_correctly(monkeypatch, device):
    """The GPU heuristic's block sizes (16-column long column sums, mixed steps of short rows with either
    accumulator, 32 short rows a program) give the right values: on the GPU, or under the interpreter with the GPU configs."""
    import torch.nn.functional as F

    from kiln_testing import launch_log

    monkeypatch.setattr(
        TritonKernel, "launch_config", lambda self, x, r, d: self.heuristic_config(x, r, interp=False)
    )
    torch._dynamo.reset()
    x = torch.randn(8192, 64, device=device)
    with launch_log() as seen:
        got = torch.compile(lambda t: t.sum(0), backend="kiln")(x)
    torch.testing.assert_close(got, x.sum(0), rtol=1e-4, atol=1e-3)
    assert any(c["XBLOCK"] == 16 and c["num_warps"] == 16 and c["rnumel"] >= 512 for _, c in seen)

    torch._dynamo.reset()
    from compiler import scheduler

    rows = 64 * scheduler.mix_programs(1 << 20, 64)  # many narrow rows: programs of 64 rows
    # full-tile accumulators step over 32 of a program's rows with 4 warps, one-row accumulators over all 64 with
    # 8; the forward's many short rows go 32 a program with 8 warps
    for tile_cols, mixed_pick in ((512, (32, 4)), (0, (64, 8))):
        torch._dynamo.reset()
        xs = [
            torch.randn(rows, 64, device=device, requires_grad=True),
            torch.randn(64, device=device, requires_grad=True),
            torch.randn(64, device=device, requires_grad=True),
        ]
        go = torch.randn(rows, 64, device=device)
        with compiler.config.patch(strict=True, mix_tile_acc_cols=tile_cols, cache="0"), launch_log() as seen:
            out = torch.compile(lambda a, w, b: F.layer_norm(a, (64,), w, b, 1e-5), backend="kiln")(*xs)
            got = torch.autograd.grad(out, xs, go)
        want = torch.autograd.grad(F.layer_norm(xs[0], (64,), xs[1], xs[2], 1e-5), xs, go)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-3)
        picks = {(c["XBLOCK"], c["num_warps"]) for _, c in seen if c.get("RBLOCK") == 64}
        assert picks >= {(32, 8), mixed_pick}, (tile_cols, picks)
