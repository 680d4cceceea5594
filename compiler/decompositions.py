"""The decomposition table AOTAutograd applies before kiln sees a graph.

PyTorch's core-ATen set, plus composite ops kiln would rather see as pointwise + reduction pieces so they
fuse into one kernel (softmax, layer_norm, gelu, batch_norm...). Ops kiln lowers directly (e.g. ``clamp``)
are not decomposed. The table is built once; ``EXTRA`` lists what is added to the core set and why; the
``_foreach_*`` ops become one op per tensor (``compiler/foreach.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch._decomp
from torch._decomp import core_aten_decompositions, get_decompositions

from . import foreach

aten = torch.ops.aten

#: composite ops decomposed on top of core ATen: each one fuses as pointwise + reductions
EXTRA = [
    aten._softmax,  # amax, sub, exp, sum, div: one persistent-reduction kernel
    aten._log_softmax,
    aten.native_layer_norm,  # var_mean + pointwise epilogue
    aten.native_batch_norm,
    aten.gelu,  # erf/tanh pointwise
    aten.elu,
    aten.erfc,
    aten.linalg_vector_norm,
    aten.native_dropout,
    aten._to_copy,  # only its dtype-only form survives as _to_copy/convert_element_type
    aten.embedding,  # index_select... still falls back, but decomposed views fuse
    aten.index_select,
    aten.addmv,
    aten.repeat,
    aten.flip,
    aten.narrow,
    aten.rms_norm,
    aten._fused_rms_norm,
    aten._native_batch_norm_legit_no_training,  # eval-mode batch norm: pointwise
    aten._native_batch_norm_legit_functional,  # train-mode batch norm: var_mean over (N, H, W)
    aten._native_batch_norm_legit,
    aten.native_group_norm,
    aten.native_batch_norm_backward,
    aten.native_group_norm_backward,
    aten.upsample_nearest2d,  # index arithmetic with gathers
]

#: ops kiln lowers itself, removed from the core table so they reach kiln intact
KEEP = [
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.gelu.default,
    aten.silu.default,
    aten.hardtanh.default,
    aten._to_copy.default,
    aten.var_mean.correction,
    aten.std.correction,
    # attention kernels stay whole (ATen fallbacks): the CPU flash decomposition saves the attention
    # probabilities where its ATen backward expects the log-sum-exp, which corrupts gradients
    aten._scaled_dot_product_flash_attention_for_cpu.default,
]


def _repeat(a: torch.Tensor, repeats: list) -> torch.Tensor:
    """torch's repeat decomposition ends in a permuted layout (its clone follows the input's layout, and its
    permute the repeated dims); eager's repeat is always contiguous, and graph outputs keep the decomposed
    strides, so ``x.repeat(...).view(-1)`` failed where eager works."""
    return torch._refs.repeat(a, repeats).contiguous()


#: decompositions kiln replaces (op -> function), applied after the core and EXTRA tables
OVERRIDES: dict[Any, Callable] = {aten.repeat.default: _repeat}


def core_table() -> dict[Any, Callable]:
    """PyTorch's core-ATen decompositions as AOTAutograd's post-autograd tracing needs them. The public
    ``core_aten_decompositions()`` is export's table: reading it adds every CompositeImplicitAutograd op of
    every namespace, each mapped to its own implicit decomposition (about 500 entries, for export's
    pre-dispatch IR, where such ops survive), which takes 0.3-0.4 s per process; while AOTAutograd traces,
    the dispatcher decomposes those ops by itself, so the table without them traces the same graphs. The
    post-autograd table is read directly where this torch has it (2.6 and later)."""
    post_autograd = getattr(torch._decomp, "_core_aten_decompositions_post_autograd", None)
    if post_autograd is not None:
        return dict(post_autograd())
    return dict(core_aten_decompositions())


def _with_kiln_entries(table: dict[Any, Callable]) -> dict[Any, Callable]:
    """``table`` with EXTRA, OVERRIDES and the foreach ops added and KEEP removed."""
    table.update(get_decompositions(EXTRA))
    table.update(OVERRIDES)
    table.update(foreach.table())  # optimizer steps: one fused kernel per parameter, not ATen foreach calls
    for op in KEEP:
        table.pop(op, None)
    return table


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable]:
    """The table AOTAutograd applies for kiln's ``torch.compile`` backend, built once per process."""
    return _with_kiln_entries(core_table())


@functools.lru_cache(maxsize=1)
def export_decomposition_table() -> dict[Any, Callable]:
    """The table for an ExportedProgram's ``run_decompositions`` (``compiler.aot``): export's IR keeps
    CompositeImplicitAutograd ops (``linear``...) unless the table names them, so this one starts from the
    public core table, those ops included."""
    return _with_kiln_entries(dict(core_aten_decompositions()))
