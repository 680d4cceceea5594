"""The ``attention`` rewrite: eager attention in an inference ATen graph becomes one fused ATen SDPA call.

Terms:
- *eager attention*: ``softmax(q @ k^T * scale + mask) @ v`` written out as ops, as HF BERT's eager path does.
  After AOTAutograd it reaches kiln as ``bmm(view(clone(expand(q))), view(clone(expand(k^T))))``, a ``view``
  back to ``[B, H, S, Sk]``, optional ``mul``/``div`` by a number, ``add``s of masks (T5: a position bias, then
  a causal mask; summed into one bias), an optional cast to fp32, the decomposed softmax (``amax``, ``sub``,
  ``exp``, ``sum``, ``div``; or ``_softmax``), optional casts back and clones (eval dropout), and a second
  ``bmm`` with ``v``. kiln would run the two bmms as cuBLAS calls and the softmax as its own kernel, writing and
  reading the ``[B, H, S, Sk]`` scores twice; a fused kernel never writes them.
- *math form*: PyTorch's math SDPA (``F.scaled_dot_product_attention`` when the math backend runs, as HF's
  ``sdpa`` attention with a mask does on the GPU): fp16/bf16 q, k, v *upcast* to fp32 (``_to_copy`` or
  ``convert_element_type``), sqrt(scale) multiplied on q and on k^T, the mask added (``where(bool, 0, -inf)``
  for a bool mask), a *safe softmax* (rows of -inf give zeros, as the fused kernels' do) and the result cast
  back. Matched as eager attention with: ``mul``/``div`` by numbers on q, on k^T (before or after its permute)
  and on the scores, all multiplied into one scale; upcasts of q, k and v that only the pattern reads, dropped
  (the SDPA call takes the fp16/bf16 tensors and its result replaces the downcast; the kernels accumulate in
  fp32) when all three come from one dtype and the result is cast back to it, else kept (fp32 operands, the
  dtype eager's result has); a float mask of another dtype than the scores (cast to the operands' dtype:
  -inf and finfo.min stay -inf or a large negative), and an fp32 mask added to fp16/bf16 scores (the add
  promotes them to fp32, as the kernels' softmax runs).
- *flat attention*: older models fold the heads into the batch and call ``torch.bmm`` on ``[N, S, D]`` tensors
  themselves; those run as ``[1, N, S, D]`` (static shapes only).
- *SDPA call*: on a GPU ``aten._scaled_dot_product_efficient_attention`` (takes an additive bias, fp16, bf16
  and fp32); on the CPU ``aten._scaled_dot_product_flash_attention_for_cpu``. Both stay whole in kiln (no
  lowering: an ATen fallback like the attention ops Dynamo already emits for ``F.scaled_dot_product_attention``).
- *bias*: the mask expanded to ``[B, H, S, Sk]`` (the efficient kernel takes no broadcasting) in the query's
  dtype; its strides, but the last (1), must be multiples of 16 elements, else the mask is padded to that and
  sliced back first, as ATen's own ``scaled_dot_product_attention`` does.

Where eager differs: a row whose mask is -inf for every key gives NaN in eager's softmax and zeros from the
fused kernels (masks of ``finfo.min``, as HF builds them, give the same result either way).

Matched only in inference graphs (a training forward would have to save the probabilities for its backward),
only when every intermediate (scores, probabilities; a scale, permute or upcast taken in) has no user outside
the pattern, q/k/v share a dtype (after the upcasts) and a static head dim that the kernel takes, and the scale
is a plain number. Not matched: a mask added before a scale, a mask promoting the scores to fp64, a bool mask
used through ``masked_fill``, returned probabilities, broadcast (grouped-query) heads, a symbolic head dim.
Anything else leaves the graph as it was; a rewrite that fails to propagate its FakeTensors is rolled back
(``fx_passes.Rewrite``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any, TypeGuard

import torch
import torch.fx as fx

from . import config
from .fx_passes import Rewrite, fake_mode_of, meta_val

aten = torch.ops.aten
prims = torch.ops.prims

#: head dims the rewrite takes: a multiple of 8 (the kernels' aligned loads for 16-bit types) up to this
MAX_HEAD_DIM = 128
HEAD_DIM_MULTIPLE = 8
#: the efficient kernel's bias alignment (elements) for every stride but the last
BIAS_ALIGN = 16
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOW = (torch.float16, torch.bfloat16)
CASTS = (aten._to_copy.default, prims.convert_element_type.default)
VIEWS = (aten.view.default, aten._unsafe_view.default)


def _known(cond: Any) -> bool:
    """``cond`` holds for every value of its symbols (no guard added); plain bools as they are."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return cond if isinstance(cond, bool) else statically_known_true(cond)


def _same_shape(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(_known(x == y) for x, y in zip(a, b))


def _call(n: Any, *targets: Any) -> TypeGuard[fx.Node]:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _only_user(n: fx.Node | None) -> fx.Node | None:
    return next(iter(n.users)) if n is not None and len(n.users) == 1 else None


def _seq(a: Any) -> list[Any]:
    """An FX argument that is a list or tuple (dims, sizes), as a list; [] for any other argument."""
    return list(a) if isinstance(a, (list, tuple)) else []


def _input(n: fx.Node) -> fx.Node:
    """The tensor node that ``n`` (a view, scale, permute or cast the patterns walk through) reads."""
    x = n.args[0]
    assert isinstance(x, fx.Node), f"{n.name} reads no tensor node"
    return x


def _number(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclasses.dataclass
class Match:
    """One eager attention: the 4-D q ``[B, H, S, D]``, k^T ``[B, H, D, Sk]`` and v ``[B, H, Sk, D]`` nodes, the
    scale, the additive mask nodes (in the order added), ``sizes`` (the scores' view sizes: ints or size
    nodes), the view of the second bmm's result that the SDPA output replaces, and every node of the pattern."""

    q: fx.Node
    kt: fx.Node
    v: fx.Node
    scale: float
    masks: list[fx.Node]
    sizes: list
    out: fx.Node
    nodes: list[fx.Node]
    #: q, k^T and v are ``[N, S, D]`` operands of the bmms themselves (heads folded into the batch), run as
    #: ``[1, N, S, D]``
    flat: bool = False
    #: ``kt`` holds k itself (``[B, H, Sk, D]``): the pattern transposed it
    key: bool = False


def _peel(n: Any, nodes: list[fx.Node]) -> fx.Node | None:
    """The 4-D tensor that ATen's matmul decomposition flattened into bmm operand ``n`` (``view`` of an
    optional ``clone`` of an optional same-shape ``expand``); None when ``n`` is not such a view."""
    if not _call(n, *VIEWS) or len(n.users) != 1:
        return None
    chain = [n]
    x = _input(n)
    for target in (aten.clone.default, aten.expand.default):
        if _call(x, target) and len(x.users) == 1:
            if target is aten.expand.default and not _same_shape(
                meta_val(x).shape, meta_val(x.args[0]).shape
            ):
                return None  # broadcast heads (grouped-query attention): left alone
            chain.append(x)
            x = _input(x)
    val, flat = meta_val(x), meta_val(n)
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or flat.dim() != 3:
        return None
    if not _same_shape(flat.shape, (val.shape[0] * val.shape[1], val.shape[2], val.shape[3])):
        return None
    nodes.extend(chain)
    return x


def _flat(n: Any) -> TypeGuard[fx.Node]:
    """A 3-D bmm operand of static shape (flat attention: ``[N, S, D]`` with heads folded into N)."""
    val = meta_val(n)
    return (
        isinstance(n, fx.Node)
        and isinstance(val, torch.Tensor)
        and val.dim() == 3
        and all(isinstance(s, int) for s in val.shape)
    )


def _shape4(n: fx.Node, flat: bool) -> tuple:
    """``n``'s shape as the kernel sees it: ``[1, N, S, D]`` for a flat operand."""
    shape = tuple(meta_val(n).shape)
    return (1, *shape) if flat else shape


SCALES = (aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar)


def _factor(x: Any) -> float | None:
    """The factor of ``x``, a ``mul``/``div`` of a tensor by a nonzero number in the tensor's dtype; else None."""
    if (
        _call(x, *SCALES)
        and len(x.args) == 2
        and not x.kwargs
        and isinstance(x.args[0], fx.Node)
        and _number(x.args[1])
        and x.args[1] != 0
        and math.isfinite(x.args[1])
        and meta_val(x.args[0]).dtype == meta_val(x).dtype
    ):
        return float(x.args[1]) if x.target in (aten.mul.Tensor, aten.mul.Scalar) else 1.0 / float(x.args[1])
    return None


def _upcast(x: Any) -> bool:
    """``x`` casts an fp16/bf16 tensor to fp32 on its device (an *upcast*)."""
    if not _call(x, *CASTS) or not isinstance(x.args[0], fx.Node) or meta_val(x).dtype != torch.float32:
        return False
    src = meta_val(x.args[0])
    extra = set(x.kwargs) - {"dtype", "memory_format", "layout", "device"}
    return src.dtype in LOW and src.device == meta_val(x).device and not extra


@dataclasses.dataclass
class Operand:
    """An SDPA operand found above a bmm operand ``x``: ``hi`` (x less the scales and the k^T permute read only by
    the pattern, down to the first upcast, itself kept) and, where there is an upcast, ``lo`` (below it too: the
    low-precision tensor). ``*_k``: the node is k itself (the pattern transposes it), not k^T."""

    hi: fx.Node
    hi_scale: float
    hi_k: bool
    hi_nodes: list[fx.Node]
    lo: fx.Node | None = None
    lo_scale: float = 1.0
    lo_k: bool = False
    lo_nodes: list[fx.Node] = dataclasses.field(default_factory=list)

    def pick(self, low: bool, nodes: list[fx.Node]) -> tuple[fx.Node, float, bool]:
        """(node, scale, is k) of the low-precision (``low``) or the fp32 form; its nodes join ``nodes``."""
        nodes.extend(self.lo_nodes if low else self.hi_nodes)
        if low:
            assert self.lo is not None  # low only where every operand has an upcast (_low)
            return self.lo, self.lo_scale, self.lo_k
        return self.hi, self.hi_scale, self.hi_k


def _operand_of(x: fx.Node, scales: bool, transpose: bool) -> Operand:
    """The ``Operand`` above ``x``: ``scales`` absorbs ``mul``/``div`` by numbers, ``transpose`` one permute
    swapping the last two dims (k^T = permute(k)); at most one upcast. Each node taken has one user."""
    steps: list[fx.Node] = []
    scale, is_k, cast_at = 1.0, False, None
    swap = list(range(meta_val(x).dim() - 2)) + [meta_val(x).dim() - 1, meta_val(x).dim() - 2]
    while len(x.users) == 1:  # every node taken is read by the pattern alone
        f = _factor(x) if scales else None
        if f is not None:
            scale *= f
        elif transpose and not is_k and _call(x, aten.permute.default) and _seq(x.args[1]) == swap:
            is_k = True
        elif cast_at is None and _upcast(x):
            cast_at = (x, scale, is_k, list(steps))
        else:
            break
        steps.append(x)
        x = _input(x)
    if cast_at is None:
        return Operand(x, scale, is_k, steps)
    return Operand(cast_at[0], cast_at[1], cast_at[2], cast_at[3], x, scale, is_k, steps)


def _softmax(x: fx.Node, nodes: list[fx.Node]) -> fx.Node | None:
    """The probabilities node of a softmax of ``x`` over its last dim (decomposed or ``_softmax``) whose
    intermediates only the softmax reads; None when ``x`` feeds none."""
    last = (-1, meta_val(x).dim() - 1)
    u = _only_user(x)
    if _call(u, aten._softmax.default):
        if u.args[1] in last and not u.args[2]:
            nodes.append(u)
            return u
        return None
    users = list(x.users)
    amax = next((m for m in users if _call(m, aten.amax.default)), None)
    sub = next((s for s in users if _call(s, aten.sub.Tensor)), None)
    eq = next((e for e in users if _call(e, aten.eq.Scalar)), None)
    if len(users) != 2 + (eq is not None) or amax is None or sub is None:
        return None
    if _seq(amax.args[1]) not in ([d] for d in last):
        return None
    if not (len(amax.args) > 2 and amax.args[2]) or sub.args != (x, amax) or len(amax.users) != 1:
        return None
    exp = _only_user(sub)
    if not _call(exp, aten.exp.default) or len(exp.users) != 2:
        return None
    total = next((s for s in exp.users if _call(s, aten.sum.dim_IntList)), None)
    div = next((d for d in exp.users if _call(d, aten.div.Tensor)), None)
    if (
        total is None
        or div is None
        or _seq(total.args[1]) not in ([d] for d in last)
        or len(total.users) != 1
    ):
        return None
    if not (len(total.args) > 2 and total.args[2]) or total.kwargs.get("dtype") or div.args != (exp, total):
        return None
    nodes.extend([amax, sub, exp, total, div])
    if eq is None:
        return div
    return _safe(x, eq, div, last, nodes)


def _safe(x: fx.Node, eq: fx.Node, div: fx.Node, last: tuple, nodes: list[fx.Node]) -> fx.Node | None:
    """The result of a *safe softmax* (SDPA's math form: rows of ``x`` that are -inf throughout give zeros, as the
    fused kernels do): ``where(not(any(not(x == -inf), -1)), full_like(div, 0), div)``; None otherwise."""
    not1 = _only_user(eq)
    anyd = _only_user(not1) if _call(not1, aten.logical_not.default) else None
    not2 = _only_user(anyd) if _call(anyd, aten.any.dim) else None
    where = _only_user(not2) if _call(not2, aten.logical_not.default) else None
    if (
        not1 is None
        or anyd is None
        or not2 is None
        or not _call(where, aten.where.self)
        or eq.args != (x, float("-inf"))
        or len(div.users) != 2
    ):
        return None
    if anyd.args[1] not in last or not (len(anyd.args) > 2 and anyd.args[2]) or len(anyd.args) > 3:
        return None
    zeros = where.args[1]
    if not _call(zeros, aten.full_like.default) or zeros.args[:2] != (div, 0) or len(zeros.users) != 1:
        return None
    if zeros.kwargs.get("dtype") not in (None, meta_val(div).dtype) or where.args != (not2, zeros, div):
        return None
    nodes.extend([eq, not1, anyd, not2, zeros, where])
    return where


def match(b1: fx.Node) -> Match | None:
    """The eager attention whose first matmul is ``bmm`` node ``b1``, or None."""
    nodes: list[fx.Node] = [b1]
    a0, a1 = b1.args[0], b1.args[1]
    q, kt = _peel(a0, nodes), _peel(a1, nodes)
    if q is None and kt is None and _flat(a0) and _flat(a1):  # bmm of [N, S, D] operands as they are
        flat, q, kt = True, a0, a1
    elif q is None or kt is None:
        return None
    else:
        flat = False
    qs, ks, dtype = _shape4(q, flat), _shape4(kt, flat), meta_val(q).dtype
    qo, ko = _operand_of(q, True, False), _operand_of(kt, True, True)  # scales on q and on k^T: both taken
    scale = 1.0
    sc = b1 if flat else _only_user(b1)
    if sc is None or (not flat and (not _call(sc, *VIEWS) or meta_val(sc).dim() != 4)):
        return None
    B, H, S, D = qs
    if not _same_shape(_shape4(sc, flat), (B, H, S, ks[3])) or not _same_shape(ks[:3], (B, H, D)):
        return None
    nodes.append(sc)
    x, masks = sc, list[fx.Node]()
    while True:  # scales, then masks, and a cast, each read only by the next
        u = _only_user(x)
        if u is None:  # the softmax's amax and sub
            break
        factor = _factor(u)
        if factor is not None and u.args[0] is x and not masks:
            scale *= factor
        elif (
            _call(u, aten.add.Tensor)
            and not u.kwargs
            and len(u.args) == 2
            and x in u.args
            and u.args[0] is not u.args[1]
        ):
            mask = u.args[1] if u.args[0] is x else u.args[0]
            if not isinstance(mask, fx.Node):  # a number added: no mask
                return None
            masks.append(mask)
            mv = meta_val(mask)
            if not isinstance(mv, torch.Tensor) or mv.dim() > 4 or not mv.dtype.is_floating_point:
                return None
            promoted = (
                meta_val(x).dtype in LOW and mv.dtype == meta_val(u).dtype == torch.float32
            )  # an fp32 mask
            if not _same_shape(meta_val(u).shape, meta_val(x).shape) or (
                meta_val(u).dtype != meta_val(x).dtype and not promoted
            ):
                return None
        elif _call(u, *CASTS) and meta_val(u).dtype == torch.float32 and meta_val(x).dtype in DTYPES:
            pass
        else:
            break
        nodes.append(u)
        x = u
    p = _softmax(x, nodes)
    if p is None:
        return None
    u = _only_user(p)
    while _call(u, aten.clone.default) or (
        _call(u, *CASTS) and meta_val(u).dtype == dtype
    ):  # eval dropout: a clone
        nodes.append(u)
        p, u = u, _only_user(u)
    v: fx.Node | None
    out: fx.Node | None
    sizes: list[Any]
    if flat:
        second = u.args[1] if _call(u, aten.bmm.default) else None
        if not _call(u, aten.bmm.default) or u.args[0] is not p or not _flat(second):
            return None
        v, out = second, u
        sizes = [1, *meta_val(b1).shape]
    else:
        if (
            _call(u, aten.expand.default)
            and _same_shape(meta_val(u).shape, meta_val(p).shape)
            and len(u.users) == 1
        ):
            nodes.append(u)
            u = _only_user(u)
        if not _call(u, *VIEWS) or len(u.users) != 1:
            return None
        b2 = _only_user(u)
        if not _call(b2, aten.bmm.default) or b2.args[0] is not u:
            return None
        nodes.extend([u, b2])
        v, out = _peel(b2.args[1], nodes), _only_user(b2)
        if v is None or not _call(out, *VIEWS):
            return None
        sizes = _seq(sc.args[1])
    if not _same_shape(_shape4(out, flat), qs) or not _same_shape(_shape4(v, flat), (B, H, ks[3], D)):
        return None
    if not (
        meta_val(p).dtype == dtype
        and meta_val(kt).dtype == dtype
        and meta_val(v).dtype == dtype
        and dtype in DTYPES
    ):
        return None
    vo = _operand_of(v, False, False)
    low = _low(qo, ko, vo, out)
    if low is not None:  # upcasts of q, k, v and the downcast of the result: the SDPA runs on the originals
        nodes.append(out)
        out = low
    q, qf, _ = qo.pick(low is not None, nodes)
    kt, kf, key = ko.pick(low is not None, nodes)
    v, _, _ = vo.pick(low is not None, nodes)
    scale *= qf * kf
    if not isinstance(D, int) or D % HEAD_DIM_MULTIPLE or D > MAX_HEAD_DIM:
        return None
    if any(isinstance(s, int) and s < 0 for s in sizes):
        return None
    nodes.append(out)
    return Match(q, kt, v, scale, masks, sizes, out, nodes, flat, key)


def _low(qo: Operand, ko: Operand, vo: Operand, out: fx.Node) -> fx.Node | None:
    """The downcast of ``out`` when q, k and v are upcasts of one low-precision dtype that ``out`` (their fp32
    attention) is cast back to, read by the pattern alone; else None (the fp32 operands stay)."""
    lows = {None if o.lo is None else meta_val(o.lo).dtype for o in (qo, ko, vo)}
    u = _only_user(out)
    if len(lows) != 1 or None in lows or not _call(u, *CASTS) or meta_val(u).dtype not in lows:
        return None
    return u if meta_val(u).device == meta_val(out).device else None


def _aligned(val: torch.Tensor) -> bool:
    """The bias layout the efficient kernel takes: unit last stride, other strides and the offset multiples of
    ``BIAS_ALIGN`` elements."""
    st = val.stride()
    return _known(st[-1] == 1) and all(_known(s % BIAS_ALIGN == 0) for s in (*st[:-1], val.storage_offset()))


def _bias(m: Match, rw: Rewrite, gm: fx.GraphModule, at: fx.Node, dtype: torch.dtype) -> fx.Node | None:
    """The masks as the kernel's bias (module docstring), inserted before ``at``; None (nothing inserted) when
    they cannot be."""
    vals = [meta_val(n) for n in m.masks]
    sizes = _shape4(m.out, m.flat)[:3] + (_shape4(m.v, m.flat)[2],)
    with vals[0].fake_mode:
        mv = functools.reduce(torch.add, vals)
        conv = torch.empty_like(mv, dtype=dtype) if mv.dtype != dtype else mv
        aligned = _aligned(conv.expand(sizes))
    last = mv.shape[-1] if mv.dim() else 1
    if not aligned and (not isinstance(last, int) or last == 1):
        return None  # a symbolic or broadcast key dim: no static padding to make
    with gm.graph.inserting_before(at):
        mask = m.masks[0]
        for other in m.masks[1:]:
            mask = rw.node(aten.add.Tensor, (mask, other))
        if mv.dtype != dtype:
            mask = rw.node(aten._to_copy.default, (mask,), {"dtype": dtype})
        if not aligned and last % BIAS_ALIGN == 0:  # a dense copy has every stride a multiple of the last dim
            mask = rw.node(aten.clone.default, (mask,), {"memory_format": torch.contiguous_format})
        elif (
            not aligned
        ):  # pad the last dim to the alignment and slice back: every other stride is then aligned
            padded = rw.node(aten.constant_pad_nd.default, (mask, [0, (-last) % BIAS_ALIGN], 0.0))
            mask = rw.node(aten.slice.Tensor, (padded, -1, 0, last))
        return rw.node(aten.expand.default, (mask, m.sizes))


def _operand(
    x: fx.Node, rw: Rewrite, gm: fx.GraphModule, at: fx.Node, flat: bool, transpose: bool = False
) -> fx.Node:
    """``x`` (transposed in its last two dims; ``[1, N, S, D]`` when ``flat``) as a kernel operand: unit stride in
    its last dim, data 16-byte aligned (a copy where it is not)."""
    st, offset = (
        meta_val(x).stride(),
        meta_val(x).storage_offset() * meta_val(x).element_size(),
    )  # views keep the offset
    swap = [*range(len(st) - 2), len(st) - 1, len(st) - 2]
    if transpose and _call(x, aten.permute.default) and _seq(x.args[1]) == swap:  # k^T = permute(k): k itself
        x, transpose = _input(x), False
        st = meta_val(x).stride()
    with gm.graph.inserting_before(at):
        if flat:
            x = rw.node(aten.unsqueeze.default, (x, 0))
            st = (0, *st)
        if transpose:
            x = rw.node(aten.permute.default, (x, [0, 1, 3, 2]))
            st = st[:2] + (st[3], st[2])
        if not _known(st[-1] == 1) or not _known(offset % 16 == 0):  # the kernels load 16 bytes at a time
            x = rw.node(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    return x


def _replace(m: Match, rw: Rewrite, gm: fx.GraphModule) -> bool:
    """Insert the SDPA call of ``m`` and move the users of its output to it; False (nothing inserted) when the
    mask cannot be made a bias."""
    at, qv = m.out, meta_val(m.q)
    bias = _bias(m, rw, gm, at, qv.dtype) if m.masks else None
    if m.masks and bias is None:
        return False
    q = _operand(m.q, rw, gm, at, m.flat)
    k = _operand(m.kt, rw, gm, at, m.flat, transpose=not m.key)
    v = _operand(m.v, rw, gm, at, m.flat)
    with gm.graph.inserting_before(at):
        if qv.device.type == "cuda":
            sdpa = rw.node(
                aten._scaled_dot_product_efficient_attention.default,
                (q, k, v, bias, False, 0.0, False),
                {"scale": m.scale},
            )
        else:
            sdpa = rw.node(
                aten._scaled_dot_product_flash_attention_for_cpu.default,
                (q, k, v, 0.0, False),
                {"attn_mask": bias, "scale": m.scale},
            )
        out = rw.node(operator.getitem, (sdpa, 0))
        if m.flat:
            out = rw.node(aten.squeeze.dim, (out, 0))
    rw.replace(m.out, out)
    return True


def fuse_attention(gm: fx.GraphModule) -> int:
    """Replace each eager attention of an inference graph by one SDPA call (module docstring); returns the
    number replaced (0: the graph is unchanged). ``attention=auto`` does so for CUDA graphs outside the
    interpreter, ``fuse`` on any device, ``keep`` never."""
    mode = config.settings().attention
    if mode == "keep" or (mode == "auto" and (config.interpreting() or torch.version.hip is not None)):
        return 0  # auto: CUDA only (ROCm's efficient attention depends on how torch was built)
    fake = fake_mode_of(gm)
    if fake is None:
        return 0
    matches: list[Match] = []
    taken: set[fx.Node] = set()
    for n in list(gm.graph.nodes):
        if not _call(n, aten.bmm.default) or n in taken:
            continue
        m = match(n)
        if m is None or taken.intersection(m.nodes):
            continue
        if mode == "auto" and meta_val(m.q).device.type != "cuda":
            continue
        matches.append(m)
        taken.update(m.nodes)
    if not matches:
        return 0
    rw = Rewrite(gm, fake)
    done = [m for m in matches if _replace(m, rw, gm)]
    if not done or not rw.commit():
        return 0
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    for m in done:  # the pattern's nodes are dead now: drop them, last first
        dead = set(m.nodes) | {n for n in (m.q, m.kt, m.v) if n.op == "call_function"}  # a k^T unpermuted
        for n in sorted((n for n in dead if n in pos), key=pos.__getitem__, reverse=True):
            if not n.users:
                gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    return len(done)
