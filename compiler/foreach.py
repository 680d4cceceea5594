"""Decompositions of the ``_foreach_*`` ops (what ``torch.optim``'s ``foreach`` implementations and gradient
clipping call) into one ATen op per tensor: each element's update then lowers to kiln kernels and fuses with the
rest of that tensor's update (AdamW's moment, bias-correction and parameter updates: one kernel per parameter),
instead of running as an ATen fallback per foreach op.

``_foreach_X.<overload>(lists and scalars)``: element ``i`` calls ``aten.X`` with the ``i``-th tensor of each
list argument (and of each ``Scalar[]``), the other arguments as they are. Special forms: a ``Tensor scalars``
of ``addcmul``/``addcdiv`` (one value per tensor, a 1-D tensor) is spelled out as ``self + scalars[i] * t1 *
t2`` (``/`` for addcdiv); ``maximum``/``minimum`` with a number are ``clamp_min``/``clamp_max``; ``norm`` is
``linalg_vector_norm``; ``copy`` copies each source into each destination; ``zero`` is ``zeros_like``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

#: foreach ops whose elements are ``aten.<name>`` of the same arguments
SAME_NAME = (
    "add",
    "sub",
    "mul",
    "div",
    "addcmul",
    "addcdiv",
    "lerp",
    "pow",
    "clamp_min",
    "clamp_max",
    "abs",
    "acos",
    "asin",
    "atan",
    "ceil",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "exp",
    "expm1",
    "floor",
    "frac",
    "lgamma",
    "log",
    "log10",
    "log1p",
    "log2",
    "neg",
    "reciprocal",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    "maximum",
    "minimum",
    "copy",
    "zero",
    "norm",
)


def _pick(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, (list, tuple)) else value


def _length(args: tuple) -> int:
    for a in args:
        if isinstance(a, (list, tuple)):
            return len(a)
    raise ValueError("a foreach op without a list argument")


def _element(name: str, overload: str) -> Callable[..., Any]:
    """The function computing one element of ``_foreach_<name>.<overload>`` from that element's arguments."""
    if name in ("addcmul", "addcdiv") and overload == "Tensor":
        combine = torch.mul if name == "addcmul" else torch.div

        def scaled(s, t1, t2, scalars, i):  # the scalars tensor holds one value per element
            return aten.add.Tensor(s, aten.mul.Tensor(scalars[i], combine(t1, t2)))

        return scaled
    if name in (
        "addcmul",
        "addcdiv",
    ):  # the foreach form passes ``value`` by position, ATen's takes it by name
        op3 = getattr(aten, name)
        return lambda s, t1, t2, value=1, i=0: op3(s, t1, t2, value=value)
    if name in ("maximum", "minimum") and overload in ("Scalar", "ScalarList"):
        clamp = aten.clamp_min if name == "maximum" else aten.clamp_max
        return lambda s, v, i: clamp(s, v)
    if name == "norm":
        return lambda s, ord=2, dtype=None, i=0: aten.linalg_vector_norm(s, ord, dtype=dtype)
    if name == "copy":
        return lambda s, src, non_blocking=False, i=0: aten.copy.default(s, src, non_blocking)
    if name == "zero":
        return lambda s, i=0: aten.zeros_like.default(s)
    op = getattr(aten, name)
    return lambda *args, i=0, **kwargs: op(*args, **kwargs)


def _decomposition(name: str, overload: str) -> Callable[..., list]:
    element = _element(name, overload)
    tensor_scalars = name in ("addcmul", "addcdiv") and overload == "Tensor"

    def decomposed(*args: Any, **kwargs: Any) -> list:
        out = []
        for i in range(_length(args)):
            picked = [a if tensor_scalars and k == 3 else _pick(a, i) for k, a in enumerate(args)]
            out.append(element(*picked, i=i, **{k: _pick(v, i) for k, v in kwargs.items()}))
        return out

    return decomposed


def table() -> dict[Any, Callable[..., list]]:
    """Every functional overload of the ``_foreach_*`` ops this torch has -> its per-tensor decomposition."""
    out: dict[Any, Callable[..., list]] = {}
    for name in SAME_NAME:
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if overload.endswith("out") or overload.startswith("out"):
                continue
            out[getattr(packet, overload)] = _decomposition(name, overload)
    return out
