"""The lowering contract applied where lowerings are registered (``graph.register_lowering``): device
check, broadcasting, type promotion, output dtype and the rounding point of every narrowing result."""

from __future__ import annotations

import pytest
import torch

from kiln_testing import run_compiled


@pytest.mark.parametrize("emulate", [False, True], ids=["default", "emulate"])
def test_fill_values_round_to_the_fill_dtype_under_emulation_only(emulate, device):
    x = torch.randn(64, device=device).to(torch.bfloat16)

    def fn(x):
        return torch.full_like(x, 1.7) * x

    out, _ = run_compiled(fn, x, emulate_eager_precision=emulate)
    same = torch.equal(out, fn(x))
    assert same == emulate  # default mode keeps fp32 intermediates, fills included


# ------------------------------------------------------------------------------------- the contract itself
def _node(fn, *args):
    """The last call node of ``fn``'s ATen graph (FakeTensor metadata attached)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*args)
    return [n for n in gm.graph.nodes if n.op == "call_function"][-1]


def test_every_registered_lowering_runs_inside_the_contract():
    import compiler.lowering  # noqa: F401
    from compiler.contract import Lowering
    from compiler.graph import LOWERINGS

    assert LOWERINGS and all(isinstance(lw, Lowering) for lw in LOWERINGS.values())


def test_lowerings_leave_promotion_devices_and_rounding_to_the_contract():
    from pathlib import Path

    import compiler.lowering as pkg

    for path in Path(pkg.__file__).parent.glob("*.py"):
        text = path.read_text()
        for name in (
            "elementwise_dtypes",
            "check_device(",
            "mark_rounding",
            "settings.emulate_eager_precision",
        ):
            assert name not in text, f"{path.name} does the contract's work itself ({name})"


def test_elementwise_promotes_over_the_chosen_operands():
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

    from compiler.contract import Elementwise

    c, a, b = torch.rand(4) > 0.5, torch.ones(4, dtype=torch.int32), torch.ones(1, 4, dtype=torch.bfloat16)
    e = Elementwise.of(_node(torch.where, c, a, b), K.NO_OPMATH, (1, 2))
    assert (e.out, e.comp, len(e.size)) == (torch.bfloat16, torch.float32, 2)  # bf16 computes in fp32
    e = Elementwise.of(_node(lambda x: x / 2, a), K.INT_TO_FLOAT)
    assert (e.out, e.comp) == (torch.float32, torch.float32)


def test_device_check_and_output_dtype_are_checked_for_every_lowering():
    from compiler import exc
    from compiler.contract import check_device, check_dtypes
    from compiler.ir import Lazy

    node = _node(lambda x: x * 2, torch.ones(3))
    on_meta = Lazy((3,), torch.float32, torch.device("meta"), lambda idx: None)
    with pytest.raises(exc.NotLowered) as info:
        check_device(node, ((on_meta, 2), {}))
    assert info.value.kind == "device"
    with pytest.raises(exc.LoweringError, match="float16"):
        check_dtypes(node, Lazy((3,), torch.float16, torch.device("cpu"), lambda idx: None))


def test_rounding_points_mark_narrowing_results_and_fill_constants():
    from compiler.contract import rounding_points
    from compiler.ir import Lazy
    from compiler.kexpr import Const, Load, Op, cast

    wide = Load("buf0", 0, torch.float32, buffer_dtype=torch.float32)
    narrowed = Lazy((), torch.bfloat16, torch.device("cpu"), lambda idx: cast(wide, torch.bfloat16))
    fill = Lazy((), torch.bfloat16, torch.device("cpu"), lambda idx: Const(1.7, torch.bfloat16))
    a, b = rounding_points((narrowed, fill))
    assert isinstance(a.load([]), Op) and a.load([]).round_trip
    assert cast(a.load([]), torch.float32).op == "round_bf16"  # a consumer's widening keeps the rounding
    assert b.load([]).value == 1.703125  # bf16(1.7), as eager's full_like holds it
    assert cast(narrowed.load([]), torch.float32) is wide  # outside the mode: fp32 intermediates kept
