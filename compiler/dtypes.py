"""kiln's dtype vocabulary, in one table: every torch dtype kiln's kernels handle and what the rest of the
compiler calls it (Triton's language type, the name in a kernel signature, the pointer element type Triton's
JIT specializes on, the rounding op that emulates eager's precision). Every other module reads this one.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class DtypeInfo:
    """One dtype kiln kernels load, compute and store."""

    dtype: torch.dtype
    #: Triton language type in kernel source (``tl.float32``)
    triton: str
    #: type name in a kernel's signature (launch specs, ``triton.compile``): ``fp32``, ``i64``...
    signature: str
    #: fp16/bf16: computed in fp32 inside kernels, rounded where eager rounds (``emulate_eager_precision``)
    low_precision: bool = False
    #: the fp32 -> fp32 op that rounds to this dtype's precision (low-precision dtypes only)
    rounding_op: str | None = None
    #: pointer element type as Triton's JIT names it, where it differs from ``signature`` (bool: ``u1``)
    pointer_override: str | None = None

    @property
    def pointer(self) -> str:
        return self.pointer_override or self.signature


#: every dtype kiln kernels handle; anything else (complex, float8, uint32...) falls back to ATen
TABLE: dict[torch.dtype, DtypeInfo] = {
    d.dtype: d
    for d in (
        DtypeInfo(torch.float32, "tl.float32", "fp32"),
        DtypeInfo(torch.float16, "tl.float16", "fp16", low_precision=True, rounding_op="round_fp16"),
        DtypeInfo(torch.bfloat16, "tl.bfloat16", "bf16", low_precision=True, rounding_op="round_bf16"),
        DtypeInfo(torch.float64, "tl.float64", "fp64"),
        DtypeInfo(torch.int64, "tl.int64", "i64"),
        DtypeInfo(torch.int32, "tl.int32", "i32"),
        DtypeInfo(torch.int16, "tl.int16", "i16"),
        DtypeInfo(torch.int8, "tl.int8", "i8"),
        DtypeInfo(torch.uint8, "tl.uint8", "u8"),
        DtypeInfo(torch.bool, "tl.int1", "i1", pointer_override="u1"),
    )
}

#: the supported dtypes, in the table's order
SUPPORTED: tuple[torch.dtype, ...] = tuple(TABLE)
#: fp16 and bf16
LOW_PRECISION: tuple[torch.dtype, ...] = tuple(d for d, i in TABLE.items() if i.low_precision)
#: floating-point dtypes of kiln's extern matmuls (fp32, fp16, bf16, fp64)
FLOAT: tuple[torch.dtype, ...] = tuple(d for d in TABLE if d.is_floating_point)
#: fp16 -> "round_fp16", bf16 -> "round_bf16"
ROUNDING_OPS: dict[torch.dtype, str] = {d: i.rounding_op for d, i in TABLE.items() if i.rounding_op}


def info(dtype: torch.dtype) -> DtypeInfo:
    """The table's entry for ``dtype`` (``NotImplementedError`` when kiln kernels do not handle it)."""
    try:
        return TABLE[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no Triton equivalent") from None


def tl_dtype(dtype: torch.dtype) -> str:
    """Triton's language type for ``dtype`` (``tl.float32``)."""
    return info(dtype).triton


def signature_type(dtype: torch.dtype) -> str:
    """The type name of ``dtype`` in a kernel signature (``fp32``)."""
    return info(dtype).signature


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: fp16/bf16 are computed in fp32 inside kernels."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def widens_exactly(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether converting fp16/bf16 ``src`` to ``dst`` is an upcast that holds every value exactly (to fp32 or
    fp64): the narrow value can be stored instead of the wide one and widened on every read."""
    return src in LOW_PRECISION and dst in (torch.float32, torch.float64)
