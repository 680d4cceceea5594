"""Registry of benchmark workloads.

Terms:
- *family*: one Python function to compile (e.g. `softmax`) with an input builder and, per profile, a
  table of concrete cases.
- *case*: one family at one shape and dtype, in mode `fwd` (forward) or `bwd` (forward + backward, timed
  together); its name is `family.mode.dtype.shape`, e.g. `softmax.fwd.bf16.32768x1024`.
- *profile*: a size table: `tiny` (CPU, Triton interpreter: proves the pipeline, not the numbers) and
  `gpu` (H100-sized: memory-bound cases above 100 microseconds).
- *source hash*: sha256 of the family's function and input-builder source, the case's shape, dtype and mode,
  and `PROTOCOL`; two results are comparable only when their source hashes are equal.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
import torch.nn.functional as F

from harness.exc import UsageError

# Bump when the way a case is executed or timed changes its meaning (invalidates old comparisons).
PROTOCOL = "kiln-bench-case-v1"

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PROFILES = ("tiny", "gpu")

Inputs = tuple[torch.Tensor, ...]
Builder = Callable[[tuple[int, ...], torch.dtype, torch.device, torch.Generator], Inputs]


def _acc(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp32 for low-precision inputs, else the input's own (fp64 stays exact)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- functions under test
def pointwise_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a * 2 + b).sigmoid()


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def broadcast_mul_add(x: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    return x * row + col


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


def col_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def row_amax(x: torch.Tensor) -> torch.Tensor:
    return x.amax(-1)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.to(_acc(x))
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.to(_acc(logits)), target)


def residual_norm(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    h = x + res
    return F.layer_norm(h, h.shape[-1:], w, b, 1e-5), h


def matmul_epilogue(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b + bias)


# ---------------------------------------------------------------- input builders
def _randn(shape, dtype, device, gen, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def in_one(shape, dtype, device, gen) -> Inputs:
    return (_randn(shape, dtype, device, gen),)


def in_two(shape, dtype, device, gen) -> Inputs:
    return (_randn(shape, dtype, device, gen), _randn(shape, dtype, device, gen))


def in_row_col(shape, dtype, device, gen) -> Inputs:
    m, n = shape
    return (
        _randn(shape, dtype, device, gen),
        _randn((n,), dtype, device, gen),
        _randn((m, 1), dtype, device, gen),
    )


def in_x_w_b(shape, dtype, device, gen) -> Inputs:
    n = shape[-1]
    return (
        _randn(shape, dtype, device, gen),
        _randn((n,), dtype, device, gen),
        _randn((n,), dtype, device, gen),
    )


def in_x_w(shape, dtype, device, gen) -> Inputs:
    return (_randn(shape, dtype, device, gen), _randn((shape[-1],), dtype, device, gen))


def in_logits_target(shape, dtype, device, gen) -> Inputs:
    m, n = shape
    return (_randn(shape, dtype, device, gen), torch.randint(0, n, (m,), generator=gen, device=device))


def in_x_res_w_b(shape, dtype, device, gen) -> Inputs:
    n = shape[-1]
    return (
        _randn(shape, dtype, device, gen),
        _randn(shape, dtype, device, gen),
        _randn((n,), dtype, device, gen),
        _randn((n,), dtype, device, gen),
    )


def in_matmul(shape, dtype, device, gen) -> Inputs:
    m, n, k = shape
    s = 1 / math.sqrt(k)
    return (
        _randn((m, k), dtype, device, gen),
        _randn((k, n), dtype, device, gen, s),
        _randn((n,), dtype, device, gen),
    )


def flops_matmul(shape: tuple[int, ...], mode: str) -> int:
    m, n, k = shape
    return 2 * m * n * k * (3 if mode == "bwd" else 1)


# ---------------------------------------------------------------- registry
@dataclass(frozen=True)
class Family:
    """A function under test, its input builder, and its case table per profile ("SHAPE:DTYPE[:bwd]")."""

    name: str
    fn: Callable[..., Any]
    inputs: Builder
    cases: dict[str, tuple[str, ...]]
    flops: Callable[[tuple[int, ...], str], int] | None = None


@dataclass(frozen=True)
class Case:
    """One concrete workload (see module docstring)."""

    name: str
    family: Family = field(repr=False)
    shape: tuple[int, ...]
    dtype_name: str
    mode: str  # "fwd" or "bwd" (forward + backward)
    source_hash: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def fn(self) -> Callable[..., Any]:
        return self.family.fn

    def make_inputs(self, device: torch.device | str, seed: int = 0) -> Inputs:
        """Fresh, deterministic inputs on `device`; floating inputs require grad in `bwd` mode."""
        device = torch.device(device)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        xs = self.family.inputs(self.shape, self.dtype, device, gen)
        if self.mode == "bwd":
            xs = tuple(x.requires_grad_(True) if x.is_floating_point() else x for x in xs)
        return xs

    def flops(self) -> int | None:
        return self.family.flops(self.shape, self.mode) if self.family.flops else None


def _x(*dims: int) -> str:
    return "x".join(str(d) for d in dims)


FAMILIES: tuple[Family, ...] = (
    Family(
        "pointwise_chain",
        pointwise_chain,
        in_two,
        {"tiny": ("4096:fp32", "4096:bf16"), "gpu": (f"{2**26}:fp32", f"{2**27}:bf16")},
    ),
    Family(
        "gelu_tanh",
        gelu_tanh,
        in_one,
        {"tiny": ("4096:fp32", "4096:fp16"), "gpu": (f"{2**27}:bf16", f"{2**26}:fp16")},
    ),
    Family(
        "broadcast_mul_add",
        broadcast_mul_add,
        in_row_col,
        {"tiny": ("64x128:fp32",), "gpu": ("16384x8192:fp32", "16384x8192:bf16")},
    ),
    Family("row_sum", row_sum, in_one, {"tiny": ("64x128:fp32",), "gpu": ("16384x8192:fp32",)}),
    Family("col_sum", col_sum, in_one, {"tiny": ("64x128:fp32",), "gpu": ("16384x8192:fp32",)}),
    Family("row_amax", row_amax, in_one, {"tiny": ("64x128:bf16",), "gpu": ("16384x8192:bf16",)}),
    Family(
        "softmax",
        softmax,
        in_one,
        {
            "tiny": ("64x128:fp32", "64x128:bf16", "64x128:fp32:bwd"),
            "gpu": ("8192x8192:fp32", "32768x1024:bf16", "32768x1024:bf16:bwd"),
        },
    ),
    Family(
        "log_softmax",
        log_softmax,
        in_one,
        {"tiny": ("64x128:fp32", "64x128:fp32:bwd"), "gpu": ("8192x8192:fp32", "16384x4096:bf16:bwd")},
    ),
    Family(
        "layer_norm",
        layer_norm,
        in_x_w_b,
        {
            "tiny": ("64x128:fp32", "64x128:bf16", "64x128:fp32:bwd"),
            "gpu": ("16384x4096:bf16", "16384x4096:fp32", "16384x4096:bf16:bwd"),
        },
    ),
    Family(
        "rms_norm",
        rms_norm,
        in_x_w,
        {
            "tiny": ("64x128:fp32", "64x128:fp16", "64x128:fp32:bwd"),
            "gpu": ("16384x4096:bf16", "16384x4096:fp16", "16384x4096:bf16:bwd"),
        },
    ),
    Family(
        "bias_gelu",
        bias_gelu,
        in_x_w,
        {"tiny": ("64x128:fp32", "64x128:bf16:bwd"), "gpu": ("16384x8192:bf16", "16384x8192:bf16:bwd")},
    ),
    Family(
        "cross_entropy",
        cross_entropy,
        in_logits_target,
        {"tiny": ("32x256:fp32", "32x256:fp32:bwd"), "gpu": ("8192x32768:bf16", "8192x32768:bf16:bwd")},
    ),
    Family(
        "residual_norm",
        residual_norm,
        in_x_res_w_b,
        {"tiny": ("64x128:fp32", "64x128:fp32:bwd"), "gpu": ("16384x4096:bf16", "16384x4096:bf16:bwd")},
    ),
    Family(
        "matmul_epilogue",
        matmul_epilogue,
        in_matmul,
        {
            "tiny": ("32x64x32:fp32", "32x64x32:bf16"),
            "gpu": ("4096x4096x4096:bf16", "4096x4096x4096:fp16", "4096x4096x4096:bf16:bwd"),
        },
        flops_matmul,
    ),
)


def _hash(fam: Family, shape: tuple[int, ...], dtype: str, mode: str) -> str:
    shared = inspect.getsource(_acc) + inspect.getsource(_randn)
    parts = [
        PROTOCOL,
        shared,
        inspect.getsource(fam.fn),
        inspect.getsource(fam.inputs),
        repr(shape),
        dtype,
        mode,
    ]
    if fam.flops:
        parts.append(inspect.getsource(fam.flops))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _parse(fam: Family, spec: str) -> Case:
    bits = spec.split(":")
    shape = tuple(int(d) for d in bits[0].split("x"))
    dtype, mode = bits[1], ("bwd" if bits[2:] == ["bwd"] else "fwd")
    if dtype not in DTYPES:
        raise ValueError(f"{fam.name}: unknown dtype {dtype!r} in case {spec!r}")
    name = f"{fam.name}.{mode}.{dtype}.{_x(*shape)}"
    return Case(name, fam, shape, dtype, mode, _hash(fam, shape, dtype, mode))


def cases(profile: str, only: str | None = None) -> list[Case]:
    """Cases of `profile` in registry order; `only` is a comma-separated list of fnmatch patterns."""
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
    out = [_parse(fam, spec) for fam in FAMILIES for spec in fam.cases.get(profile, ())]
    if only:
        pats = [p.strip() for p in only.split(",") if p.strip()]
        out = [c for c in out if any(fnmatchcase(c.name, p) or fnmatchcase(c.family.name, p) for p in pats)]
        if not out:
            raise UsageError(
                f"no {profile} workload matches {only!r} (see `python -m harness.bench workloads`)"
            )
    return out


def find(name: str, profile: str | None = None) -> Case:
    """The case called `name` in any profile (or only `profile`)."""
    for prof in (profile,) if profile else PROFILES:
        for c in cases(prof):
            if c.name == name:
                return c
    raise UsageError(f"unknown workload {name!r}")
