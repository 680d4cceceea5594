"""Built-in programs: the two bf16 GPU programs (an attention block, a LayerNorm + GELU MLP), their CPU-sized
variants, and small programs for the CI test.

Each is a plain function of tensors with its inputs declared (`numerics_program`/`variant`); the ref
``harness.numerics.programs:NAME`` or just ``NAME`` names it. GPU sizes keep every output at most 4,194,304
elements, so every output is saved in full (see `store.FULL_MAX`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .program import numerics_program, variant


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v: two batched matmuls around a softmax, in the inputs' dtype."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _attention_inputs(b: int, h: int, s: int, d: int, dtype: str = "bf16") -> list[str]:
    return [f"{n}:{dtype}[{b},{h},{s},{d}] randn" for n in ("q", "k", "v")]


def _attention_decl(s: int, d: int) -> dict[str, Any]:
    return {
        "structure": "opaque",
        "reduction": {"out": s, "grad.q": s, "grad.k": s, "grad.v": s},
        "note": f"scores reduce over head dim {d}; softmax and p@v over {s} keys; "
        f"grad.k/grad.v sum over {s} queries",
    }


def _ln_gelu_mlp(
    x: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
) -> torch.Tensor:
    """linear(gelu(linear(layer_norm(x)))): the MLP half of a transformer block, in the inputs' dtype."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    return F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)


def _mlp_inputs(rows: int, dim: int, hidden: int, dtype: str = "bf16") -> list[str]:
    return [
        f"x:{dtype}[{rows},{dim}] randn",
        f"ln_w:{dtype}[{dim}] randn scale=0.1 shift=1",
        f"ln_b:{dtype}[{dim}] randn scale=0.1",
        f"w1:{dtype}[{hidden},{dim}] randn scale={1 / math.sqrt(dim):.6g}",
        f"b1:{dtype}[{hidden}] randn scale=0.1",
        f"w2:{dtype}[{dim},{hidden}] randn scale={1 / math.sqrt(hidden):.6g}",
        f"b2:{dtype}[{dim}] randn scale=0.1",
    ]


def _mlp_decl(rows: int, dim: int, hidden: int) -> dict[str, Any]:
    return {
        "structure": "opaque",
        "reduction": {
            "out": hidden,
            "grad.x": hidden,
            "grad.ln_w": rows,
            "grad.ln_b": rows,
            "grad.w1": rows,
            "grad.b1": rows,
            "grad.w2": rows,
            "grad.b2": rows,
        },
        "note": f"layer norm over {dim}; linear 1 reduces over {dim}, linear 2 over {hidden}; weight and bias "
        f"gradients sum over {rows} rows",
    }


# GPU sizes: attention q/k/v/out 2x8x1024x64 (1,048,576 elements each); MLP x 2048x1024, hidden 4096
attention = variant(_attention, "attention", *_attention_inputs(2, 8, 1024, 64), **_attention_decl(1024, 64))
mlp = variant(_ln_gelu_mlp, "mlp", *_mlp_inputs(2048, 1024, 4096), **_mlp_decl(2048, 1024, 4096))
# CPU sizes (a few thousand elements: kiln runs them through the Triton interpreter)
attention_small = variant(
    _attention, "attention_small", *_attention_inputs(1, 2, 32, 16), **_attention_decl(32, 16)
)
mlp_small = variant(_ln_gelu_mlp, "mlp_small", *_mlp_inputs(32, 32, 64), **_mlp_decl(32, 32, 64))


@numerics_program(
    "x:bf16[64,64] randn",
    "y:bf16[64,64] randn",
    "z:bf16[64,64] randn",
    structure="elementwise",
    note="three roundings in eager (mul, add, mul); one in a fused kernel unless emulating",
)
def bf16_chain(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(x * y + z) * y in bf16."""
    return (x * y + z) * y


@numerics_program("x:bf16[16,128] randn scale=3", structure="rows", row_dim=-1)
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim of 16 rows of 128, in bf16."""
    return torch.softmax(x * 1.7 + 0.3, dim=-1)


@numerics_program("x:bf16[8,32] randn specials=all", structure="elementwise", backward=False)
def bf16_specials(x: torch.Tensor) -> torch.Tensor:
    """exp and reciprocal of inputs holding subnormals, infinities, NaN, the largest values and -0.0."""
    return torch.exp(x) + torch.reciprocal(x)


#: the built-in programs, by name (``python -m harness numerics run attention``)
BUILTIN: dict[str, Callable[..., Any]] = {
    "attention": attention,
    "mlp": mlp,
    "attention_small": attention_small,
    "mlp_small": mlp_small,
    "bf16_chain": bf16_chain,
    "softmax_rows": softmax_rows,
    "bf16_specials": bf16_specials,
}
#: the GPU command's programs (`python -m harness numerics gpu`)
GPU_PROGRAMS = ("attention", "mlp")
