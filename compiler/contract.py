"""The lowering contract: what ``graph.register_lowering`` applies around every lowering, so that a lowering
states only its op's semantics.

Around every lowering (``Lowering.__call__``):

- **device check**: tensor operands live on the result's device (0-d CPU scalars were already copied over by
  ``GraphLowering``); otherwise ``NotLowered(kind="device")``, an ATen fallback. Factories (which read no
  operand values) and device copies register with ``same_device=False``.
- **output dtype**: every value a lowering returns has eager's dtype (its FakeTensor's); a lowering that
  disagrees is an internal error (``LoweringError``: strict mode raises, otherwise the op falls back).
- **rounding point**: under ``emulate_eager_precision`` every result narrowed to fp16/bf16 (an implicit cast
  at the top of a returned ``Lazy``'s element, or a fill constant) is made a rounding point
  (``kexpr.mark_rounding``), as eager rounds every fp16/bf16 tensor it makes; a fused consumer keeps it.
  Lowerings whose results are elements of an operand (``max.dim`` values: exact in the output dtype) register
  with ``exact=True`` and get no rounding.

Elementwise ops register with a type-promotion kind (``promote=``, torch's ``ELEMENTWISE_TYPE_PROMOTION_KIND``)
and are called with an ``Elementwise`` instead of ``(g, node)``: torch's promotion over the operands
(``operands``: positions in ``node.args``, all of them by default) gives the compute dtype (fp16/bf16
compute in fp32), ``Elementwise.load`` broadcasts an operand to the output's size and casts it, and
``Elementwise.lazy`` casts the lowering's element to the output dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K
from torch._prims_common import elementwise_dtypes

from .config import Settings
from .dtypes import compute_dtype
from .exc import LoweringError, NotLowered
from .ir import Index, Lazy, SymScalar, Value, sym
from .kexpr import Const, IndexValue, KExpr, cast, mark_rounding


class LoweringContext(Protocol):
    """What the contract reads of the lowering it runs in (``graph.GraphLowering``): its settings. A protocol,
    so that ``graph`` (which registers lowerings with this contract) and this module do not import each other."""

    settings: Settings


#: a promotion kind, or a function of the node choosing one (``div`` with a rounding mode)
Promotion = K | Callable[[fx.Node], K]


# ------------------------------------------------------------------------------------- operands
def broadcast_index(size: Sequence[sympy.Expr], out_size: Sequence[sympy.Expr], index: Index) -> list:
    """Index into a tensor of ``size`` broadcast to ``out_size`` (trailing-aligned, 1-dims read at 0)."""
    off = len(out_size) - len(size)
    return [
        sympy.Integer(0) if (s == 1 and out_size[off + i] != 1) else index[off + i]
        for i, s in enumerate(size)
    ]


def load_arg(arg: Any, out_size: Sequence[sympy.Expr], index: Index, dtype: torch.dtype) -> KExpr:
    """An operand at ``index`` (broadcast to ``out_size``) in ``dtype``: a tensor value, a SymInt/SymFloat,
    or a Python scalar."""
    if isinstance(arg, Value):
        return cast(arg.load(broadcast_index(arg.size, out_size, index)), dtype)
    if isinstance(arg, SymScalar):
        if arg.py_type is float:
            from .codegen.printer import pfloat
            from .exc import CodegenError

            try:
                pfloat(arg.expr)
            except CodegenError as e:
                raise NotLowered(f"symbolic float scalar: {e}") from None
            return cast(IndexValue(arg.expr, torch.float64), dtype)
        return cast(IndexValue(arg.expr, torch.int64), dtype)
    if isinstance(arg, (bool, int, float)):
        return Const(arg, dtype) if dtype != torch.bool else Const(bool(arg), dtype)
    raise NotLowered(f"operand of type {type(arg).__name__}")


def arg_cost(args: Sequence[Any]) -> int:
    """The inlining cost of an element computed from ``args``: one op plus what their Lazy producers cost."""
    return 1 + sum(a.cost for a in args if isinstance(a, Lazy))


def meta_of(node_arg: Any) -> Any:
    """A stand-in for type promotion: FakeTensor for tensors, Python scalar samples for symbols."""
    if hasattr(node_arg, "meta"):
        v = node_arg.meta.get("val")
        if isinstance(v, torch.SymInt):
            return 0
        if isinstance(v, torch.SymFloat):
            return 0.0
        if isinstance(v, torch.SymBool):
            return False
        return v
    return node_arg


# ------------------------------------------------------------------------------------- elementwise
@dataclasses.dataclass(frozen=True)
class Elementwise:
    """One elementwise op's shape and types, from its node: ``size`` (the output's: operands broadcast to it),
    ``device``, ``out`` (eager's result dtype) and ``comp`` (the promoted dtype it computes in)."""

    node: fx.Node
    size: tuple
    device: torch.device
    out: torch.dtype
    comp: torch.dtype

    @classmethod
    def of(cls, node: fx.Node, kind: K, operands: Sequence[int] | None = None) -> Elementwise:
        """Torch's elementwise type promotion of ``kind`` over the operands (``None`` args skipped)."""
        out = node.meta["val"]
        args = node.args if operands is None else [node.args[i] for i in operands]
        comp, _ = elementwise_dtypes(*[meta_of(a) for a in args if a is not None], type_promotion_kind=kind)
        return cls(node, tuple(sym(s) for s in out.shape), out.device, out.dtype, compute_dtype(comp))

    def load(self, arg: Any, index: Index, dtype: torch.dtype | None = None) -> KExpr:
        """Operand ``arg`` broadcast to the output and cast to ``dtype`` (default: the compute dtype)."""
        return load_arg(arg, self.size, index, self.comp if dtype is None else dtype)

    def lazy(self, element: Callable[[Index], KExpr], operands: Sequence[Any]) -> Lazy:
        """The result: ``element`` (in the compute dtype, or bool) cast to the output dtype."""
        out = self.out
        return Lazy(self.size, out, self.device, lambda idx: cast(element(idx), out), arg_cost(operands))


# ------------------------------------------------------------------------------------- the wrapper
@dataclasses.dataclass(frozen=True)
class Lowering:
    """A registered lowering with the contract around it (see the module docstring). ``fn`` is called as
    ``fn(g, node, *args, **kwargs)``, or ``fn(Elementwise, *args, **kwargs)`` when ``promote`` is set."""

    fn: Callable[..., Any]
    promote: Promotion | None = None
    operands: tuple[int, ...] | None = None
    same_device: bool = True
    exact: bool = False  # results are elements of an operand (max.dim values): narrowing them loses nothing

    def __call__(self, g: LoweringContext, node: fx.Node, *args: Any, **kwargs: Any) -> Any:
        if self.same_device:
            check_device(node, (args, kwargs))
        if self.promote is None:
            out = self.fn(g, node, *args, **kwargs)
        else:
            kind = self.promote if isinstance(self.promote, K) else self.promote(node)
            out = self.fn(Elementwise.of(node, kind, self.operands), *args, **kwargs)
        check_dtypes(node, out)
        return rounding_points(out) if g.settings.emulate_eager_precision and not self.exact else out


def check_device(node: fx.Node, operands: Any) -> None:
    """Every tensor value among ``operands`` (any nesting) lives on the device of ``node``'s result."""
    device = _result_device(node.meta.get("val"))
    if device is None:
        return
    for a in pytree.tree_leaves(operands):
        if isinstance(a, Value) and a.device != device:
            if len(a.size) == 0:
                raise NotLowered(f"0-d tensor on {a.device} used with {device} tensors", kind="device")
            raise NotLowered(f"operands on {a.device} and {device}", kind="device")


def _result_device(val: Any) -> torch.device | None:
    for v in pytree.tree_leaves(val):
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def check_dtypes(node: fx.Node, out: Any) -> None:
    """The values a lowering returns have the dtypes of eager's results (matched leaf by leaf)."""
    got = pytree.tree_leaves(out)
    want = pytree.tree_leaves(node.meta.get("val"))
    if len(got) != len(want):
        return  # results eager has but kiln does not model (None outputs, opaque values)
    for v, meta in zip(got, want):
        if isinstance(v, Value) and isinstance(meta, torch.Tensor) and v.dtype != meta.dtype:
            raise LoweringError(
                f"{node.target} ({node.name}) returned {v.dtype} where eager has {meta.dtype}"
            )


def rounding_points(out: Any) -> Any:
    """``out`` with every Lazy result's narrowing to fp16/bf16 made a rounding point (``mark_rounding``)."""

    def marked(v: Lazy) -> Lazy:
        fn = v.fn
        return Lazy(v.size, v.dtype, v.device, lambda idx: mark_rounding(fn(idx)), v.cost, v.widens)

    return pytree.tree_map_only(Lazy, marked, out)
