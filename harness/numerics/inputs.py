"""Reproducible inputs: generated from a seed on the CPU, then moved to the device.

Terms:
  input spec      name, dtype, shape and distribution of one input (`InputSpec`). Text form:
                  ``x:bf16[8,64] randn scale=2 shift=1 specials=nan,inf count=4 grad=0``.
  distribution    randn (normal), rand (uniform [0, 1)), randint (integers in [low, high)), ones, zeros,
                  arange; then ``value * scale + shift``, computed in float32 (float64 for float64 inputs)
                  and rounded once to the input's dtype.
  special values  on request, placed at seeded positions: subnormal (+-smallest subnormal, a mid-range
                  subnormal), inf (+-inf), nan, max (+-largest finite), neg0 (-0.0), tiny (smallest normal);
                  ``specials=all`` asks for every kind; ``count`` is how many elements get one (default:
                  one per value, cycling through the values when larger).
  input seed      each input has its own generator, seeded from (run seed, input name): adding an input
                  changes no other input.
  digest          sha256 of a tensor's bytes (contiguous, row-major, little-endian), the same for the CPU
                  copy and the device copy.
  cotangent       the seeded tensor that multiplies a float output in the fixed backward loss
                  ``sum_i (out_i * cot_i).sum()``; generated like an input named ``cotangent:<output>``.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .exc import InputSpecError

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "f16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp64": torch.float64,
    "f64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "long": torch.int64,
    "bool": torch.bool,
}
DISTRIBUTIONS = ("randn", "rand", "randint", "ones", "zeros", "arange")
SPECIAL_KINDS = ("subnormal", "inf", "nan", "max", "neg0", "tiny")


def dtype_name(dtype: torch.dtype) -> str:
    """The canonical name of a dtype: ``bfloat16``, ``float32``, ``int64``..."""
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    """A dtype from any of its names in DTYPES."""
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise InputSpecError(f"unknown dtype {name!r}; known: {', '.join(sorted(set(DTYPES)))}") from None


@dataclass(frozen=True)
class InputSpec:
    """One input of a program (see the module docstring for the fields' meaning)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    dist: str = "randn"
    scale: float = 1.0
    shift: float = 0.0
    low: int = 0
    high: int = 10
    specials: tuple[str, ...] = ()
    count: int = 0
    #: None: floating inputs get gradients when the program has a backward
    grad: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", self.name):
            raise InputSpecError(f"input name {self.name!r}: letters, digits, '_' and '.' only")
        object.__setattr__(self, "dtype", dtype_name(to_dtype(self.dtype)))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise InputSpecError(f"input {self.name}: negative size in {list(self.shape)}")
        if self.dist not in DISTRIBUTIONS:
            raise InputSpecError(
                f"input {self.name}: distribution {self.dist!r}; known: {', '.join(DISTRIBUTIONS)}"
            )
        specials = tuple(SPECIAL_KINDS) if self.specials in (("all",), "all") else tuple(self.specials)
        unknown = [s for s in specials if s not in SPECIAL_KINDS]
        if unknown:
            raise InputSpecError(
                f"input {self.name}: unknown special value kind(s) {', '.join(unknown)}; "
                f"known: {', '.join(SPECIAL_KINDS)}, all"
            )
        if specials and not self.torch_dtype.is_floating_point:
            raise InputSpecError(f"input {self.name}: special values need a floating dtype, not {self.dtype}")
        object.__setattr__(self, "specials", specials)

    @property
    def torch_dtype(self) -> torch.dtype:
        return to_dtype(self.dtype)

    @property
    def wants_grad(self) -> bool:
        """Whether gradients are taken wrt this input (when the program has a backward)."""
        return self.torch_dtype.is_floating_point if self.grad is None else bool(self.grad)

    def text(self) -> str:
        """The spec's text form (parse(spec.text()) == spec)."""
        parts = [f"{self.name}:{self.dtype}[{','.join(map(str, self.shape))}]", self.dist]
        defaults = InputSpec(self.name, self.shape, self.dtype)
        for key in ("scale", "shift", "low", "high", "count"):
            if getattr(self, key) != getattr(defaults, key):
                parts.append(f"{key}={getattr(self, key)}")
        if self.specials:
            parts.append("specials=" + ",".join(self.specials))
        if self.grad is not None:
            parts.append(f"grad={int(self.grad)}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"], d["specials"] = list(self.shape), list(self.specials)
        d.pop("extra")
        return d


_HEAD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*):([A-Za-z0-9]+)\[([0-9, ]*)\]$")


def parse(text: str) -> InputSpec:
    """An InputSpec from its text form, e.g. ``x:bf16[8,64] randn scale=2 specials=all``."""
    tokens = text.split()
    m = _HEAD.match(tokens[0]) if tokens else None
    if not m:
        raise InputSpecError(f"input spec {text!r}: expected NAME:DTYPE[D0,D1,...] first, e.g. x:bf16[8,64]")
    name, dtype, dims = m.groups()
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    kw: dict[str, Any] = {}
    for tok in tokens[1:]:
        if tok in DISTRIBUTIONS:
            kw["dist"] = tok
            continue
        key, sep, value = tok.partition("=")
        try:
            if not sep:
                raise ValueError("expected KEY=VALUE")
            if key in ("scale", "shift"):
                kw[key] = float(value)
            elif key in ("low", "high", "count"):
                kw[key] = int(value)
            elif key == "specials":
                kw[key] = tuple(s for s in value.split(",") if s)
            elif key == "grad":
                kw[key] = {"1": True, "0": False, "true": True, "false": False}[value.lower()]
            else:
                raise ValueError(f"unknown key {key!r}")
        except (ValueError, KeyError) as e:
            raise InputSpecError(f"input spec {text!r}: bad token {tok!r} ({e})") from None
    return InputSpec(name, shape, dtype, **kw)


def input_seed(seed: int, name: str) -> int:
    """The generator seed of input `name` in a run seeded with `seed`."""
    h = hashlib.sha256(f"kiln-numerics:{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def special_values(dtype: torch.dtype) -> dict[str, list[float]]:
    """The values each special kind places, for a floating dtype."""
    fi = torch.finfo(dtype)
    smallest_sub = fi.smallest_normal * fi.eps  # 2**(emin - mantissa bits)
    return {
        "subnormal": [smallest_sub, -smallest_sub, fi.smallest_normal / 2],
        "inf": [float("inf"), float("-inf")],
        "nan": [float("nan")],
        "max": [fi.max, -fi.max],
        "neg0": [-0.0],
        "tiny": [fi.smallest_normal],
    }


def generate(spec: InputSpec, seed: int) -> torch.Tensor:
    """The input on the CPU: the same bits for the same (spec, seed) on every machine."""
    g = torch.Generator(device="cpu").manual_seed(input_seed(seed, spec.name))
    dtype = spec.torch_dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    shape = spec.shape
    if spec.dist == "randn":
        t = torch.randn(shape, generator=g, dtype=work)
    elif spec.dist == "rand":
        t = torch.rand(shape, generator=g, dtype=work)
    elif spec.dist == "randint":
        t = torch.randint(spec.low, spec.high, shape, generator=g, dtype=torch.int64)
    elif spec.dist == "ones":
        t = torch.ones(shape, dtype=work)
    elif spec.dist == "zeros":
        t = torch.zeros(shape, dtype=work)
    else:
        t = torch.arange(int(torch.tensor(shape).prod().item()), dtype=work).reshape(shape)
    if spec.dist != "randint" and (spec.scale != 1.0 or spec.shift != 0.0):
        t = t * spec.scale + spec.shift
    t = t.to(dtype)
    if spec.specials and t.numel():
        values = [v for kind in spec.specials for v in special_values(dtype)[kind]]
        count = min(spec.count or len(values), t.numel())
        pos = torch.randperm(t.numel(), generator=g)[:count].sort().values
        flat = t.view(-1)
        for i, p in enumerate(pos.tolist()):
            flat[p] = values[i % len(values)]
    return t.contiguous()


def generate_all(specs: Iterable[InputSpec], seed: int) -> dict[str, torch.Tensor]:
    """Every input of a program, on the CPU, in spec order."""
    return {s.name: generate(s, seed) for s in specs}


def cotangent(
    seed: int, output: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """The seeded cotangent of a float output (normal values rounded to the output dtype)."""
    spec = InputSpec(f"cotangent.{output}", tuple(shape), dtype_name(dtype))
    return generate(spec, seed)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes: contiguous, row-major, on the CPU, little-endian."""
    if sys.byteorder != "little":  # pragma: no cover - every supported machine is little-endian
        raise InputSpecError("numerics triage needs a little-endian machine")
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def digest(t: torch.Tensor) -> str:
    """sha256 (hex) of the tensor's bytes."""
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def from_bytes(data: bytes, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
    """The inverse of tensor_bytes."""
    shape = tuple(shape)
    store = torch.uint8 if dtype == torch.bool else dtype
    if not data:
        return torch.empty(shape, dtype=dtype)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(store).reshape(shape)
    return t.to(torch.bool) if dtype == torch.bool else t
