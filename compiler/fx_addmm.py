"""The form of each linear layer's matmul, chosen by a GPU timing at compile time (the ``addmm_bias`` pass).

Terms:
- *bias addmm*: ``addmm(bias, a, b)`` with a 1-D ``bias`` of N elements and alpha = beta = 1, a linear layer
  (``F.linear`` of a 2-D or contiguous 3-D input traces to it).
- *forms*: three ways to compute it, equal up to rounding; which one is fastest depends on M, N, K, the
  dtype and the GPU, so none is right everywhere:
  - ``lt``: as traced. Given a 1-D bias, ATen's CUDA addmm calls cuBLASLt with the bias in the GEMM's
    epilogue.
  - ``expand``: ``addmm(bias.expand(M, N), a, b)``, a stride-0 2-D bias: ATen copies it into the output and
    runs cuBLAS's GEMM with beta 1 (the form Inductor passes, ``reinterpret_tensor(bias, (M, N), (0, 1))``).
    On the H200, GPT-2's fp32 projections ran 1.291 ms a step in the ``lt`` form against Inductor's 1.186 ms.
  - ``mm``: ``mm(a, b) + bias``: the add is a kiln value, so it fuses into the kernel of the product's
    consumers at no launch of its own. Offered only where every consumer (through views) is pointwise and
    the product is not a graph output (else the sum would be written once more). In fp16/bf16 the product
    is rounded once before the add (the other forms round the sum only).
- *timing*: each form on random data of the operands' sizes and strides into a preallocated output, as
  the wrapper calls it (``out=``): device time, ``fx_passes.bench_ms`` (what a CUDA-graph replay sees); the
  ``mm`` form's add is not timed (it rides in a kernel that runs anyway). A form replaces ``lt`` only when
  ``MIN_SPEEDUP`` faster. Timings are cached per geometry for the process; a graph-cache hit reuses the
  rewritten graph without timing.

Under ``addmm_bias=bench`` (the default) only static-shape float addmms on a GPU outside the interpreter of
at least ``MIN_MACS`` multiply-adds are timed; ``lt``, ``expand`` and ``mm`` force that form everywhere it
applies (any device), which the tests use.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.fx as fx

from . import config
from .fx_passes import (
    FLOAT_DTYPES,
    VIEW_OPS,
    Rewrite,
    bench_ms,
    fake_mode_of,
    meta_val,
    random_strided,
    through_views,
)

log = logging.getLogger("kiln")
aten = torch.ops.aten

FORMS = ("lt", "expand", "mm")
#: a form replaces the traced one only when this much faster in the compile-time timing
MIN_SPEEDUP = 1.03
#: smaller addmms are left as traced without timing (their launch, not the GEMM, decides)
MIN_MACS = 1 << 24
#: the timed decisions of this process (``decision_log``), the first MAX_LOGGED
_log: list[dict[str, Any]] = []
MAX_LOGGED = 1000


def decision_log() -> list[dict[str, Any]]:
    """Each timed decision of this process (the first ``MAX_LOGGED``): the product's ``m``, ``n``, ``k`` and
    ``dtype``, each form's microseconds (``us``) and the ``form`` chosen. Timings come from a per-process
    cache, so a second compile of the same geometry logs the same numbers again."""
    return [dict(d) for d in _log]


def reset_decisions() -> None:
    """Forget this process's decision log (the timings stay cached)."""
    _log.clear()


def bias_addmm(node: fx.Node) -> bool:
    """``node`` is a bias addmm (module docstring) of float operands whose sizes FX knows."""
    if node.op != "call_function" or node.target is not aten.addmm.default or len(node.args) != 3:
        return False
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return False
    bias, a, b, out = (meta_val(x) for x in (*node.args, node))
    if not all(isinstance(t, torch.Tensor) for t in (bias, a, b, out)):
        return False
    return bias.dim() == 1 and out.dim() == 2 and out.dtype in FLOAT_DTYPES and bias.dtype == out.dtype


def _pointwise(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return node.op == "call_function" and torch.Tag.pointwise in tags


def fusable_consumers(node: fx.Node) -> bool:
    """Every consumer of ``node``, looked at through views, is a pointwise op (kiln fuses an add into its
    kernel) and none is the graph's output."""
    users = through_views(node)
    return bool(users) and all(
        _pointwise(u) or (u.op == "call_function" and u.target in VIEW_OPS) for u in users
    )


def forms_of(node: fx.Node) -> tuple[str, ...]:
    """The forms a bias addmm admits: always ``lt``; ``expand`` when its output's size is static (the
    expand names it); ``mm`` where its consumers fuse an add."""
    static = all(isinstance(d, int) for d in meta_val(node).shape)
    return tuple(f for f, ok in zip(FORMS, (True, static, fusable_consumers(node))) if ok)


def _geometry(node: fx.Node) -> tuple[tuple, tuple, int] | None:
    """((size, stride) of a, (size, stride) of b, M*N*K) of a static-shape addmm, else None."""
    a, b = meta_val(node.args[1]), meta_val(node.args[2])
    dims = (*a.shape, *a.stride(), *b.shape, *b.stride())
    if not all(isinstance(d, int) for d in dims):
        return None
    (m, k), n = a.shape, b.shape[1]
    return (tuple(a.shape), tuple(a.stride())), (tuple(b.shape), tuple(b.stride())), m * n * k


@functools.lru_cache(maxsize=512)
def timed_forms(
    a_geom: tuple, b_geom: tuple, dtype: torch.dtype, device: str, forms: tuple[str, ...]
) -> dict[str, float]:
    """Milliseconds of each form of a bias addmm with operands of these (size, stride) geometries, as the
    wrapper calls it (``out=`` a preallocated output); cached per geometry for the process."""
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch(), torch.no_grad():  # real tensors, even when called under a FakeTensorMode
        gen = torch.Generator(device=device).manual_seed(0)
        a, b = random_strided(a_geom, dtype, gen), random_strided(b_geom, dtype, gen)
        m, n = a.shape[0], b.shape[1]
        bias = torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype)
        out = torch.empty((m, n), device=device, dtype=dtype)
        wide = bias.expand(m, n)
        runs = {
            "lt": lambda: torch.addmm(bias, a, b, out=out),
            "expand": lambda: torch.addmm(wide, a, b, out=out),
            "mm": lambda: torch.mm(a, b, out=out),
        }
        return {form: bench_ms(runs[form]) for form in forms}


def pick(times: dict[str, float]) -> str:
    """The form to use given each form's time: the fastest, when it beats ``lt`` by ``MIN_SPEEDUP``."""
    best = min(times, key=times.__getitem__)
    return best if times["lt"] > MIN_SPEEDUP * times[best] else "lt"


def on_gpu(out: torch.Tensor) -> bool:
    """The addmm runs on a CUDA GPU outside Triton's interpreter, where its forms can be timed."""
    return out.device.type == "cuda" and not config.interpreting() and torch.cuda.is_available()


def choose(node: fx.Node) -> str:
    """The form of a bias addmm under the ``addmm_bias`` setting."""
    mode = config.settings().addmm_bias
    forms = forms_of(node)
    if mode != "bench":
        return mode if mode in forms else "lt"
    out = meta_val(node)
    if not on_gpu(out):
        return "lt"
    geom = _geometry(node)
    if geom is None or geom[2] < MIN_MACS:
        return "lt"
    try:
        times = timed_forms(geom[0], geom[1], out.dtype, str(out.device), forms)
    except Exception as e:  # noqa: BLE001 - a failed measurement (out of memory) means: leave it as traced
        log.info("kiln addmm_bias: timing %s failed (%s: %s); left as traced", node.name, type(e).__name__, e)
        return "lt"
    form = pick(times)
    if len(_log) < MAX_LOGGED:
        (m, k), n = geom[0][0], geom[1][0][1]
        us = {f: round(t * 1e3, 2) for f, t in times.items()}
        _log.append({"m": m, "n": n, "k": k, "dtype": str(out.dtype), "us": us, "form": form})
    log.debug(
        "kiln addmm_bias %s x %s %s: %s -> %s",
        geom[0],
        geom[1],
        out.dtype,
        ", ".join(f"{k} {v:.4f} ms" for k, v in times.items()),
        form,
    )
    return form


def choose_forms(gm: fx.GraphModule) -> dict[str, int]:
    """Rewrite each bias addmm of ``gm`` into the form ``choose`` names; returns how many took each form
    that changed the graph (empty when none did, or the rewrite was rolled back)."""
    fake = fake_mode_of(gm)
    if fake is None:
        return {}
    rw = Rewrite(gm, fake)
    counts: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if not bias_addmm(node):
            continue
        form = choose(node)
        if form == "lt":
            continue
        bias, a, b = node.args
        m, n = meta_val(node).shape
        with gm.graph.inserting_before(node):
            if form == "expand":
                wide = rw.node(aten.expand.default, (bias, [m, n]))
                new = rw.node(aten.addmm.default, (wide, a, b))
            else:
                new = rw.node(aten.add.Tensor, (rw.node(aten.mm.default, (a, b)), bias))
        rw.replace(node, new)
        counts[form] = counts.get(form, 0) + 1
    return counts if rw.commit() else {}
