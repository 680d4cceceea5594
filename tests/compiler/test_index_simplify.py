"""Index simplification (compiler/index_simplify.py) and what it does to rendered kernels.

Each rule is checked for exactness by evaluating the expression before and after over its whole index domain
(``index_eval``), and for effect on the index expressions views produce: a tensor read in its memory order
through any split of its dims is read at ``xindex``.
"""

import itertools
import math
import re

import numpy as np
import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

import compiler
from compiler.index_eval import evaluate
from compiler.index_simplify import simplify, upper
from compiler.scheduler import RINDEX, XINDEX

x, r = XINDEX, RINDEX


def digits(flat: sympy.Expr, sizes: tuple[int, ...], strides: tuple[int, ...]) -> sympy.Expr:
    """The address of logical element ``flat`` (row-major over ``sizes``) in a buffer of ``strides``: the
    form views give, one floor division and modulo per dim."""
    out, inner = sympy.Integer(0), 1
    for i in reversed(range(len(sizes))):
        part = FloorDiv(flat, inner) if i == 0 else ModularIndexing(flat, inner, sizes[i])
        out += strides[i] * part
        inner *= sizes[i]
    return out


def same_values(a: sympy.Expr, b: sympy.Expr, bounds: dict) -> bool:
    grids = np.meshgrid(*[np.arange(bounds[s] + 1) for s in bounds], indexing="ij")
    env = dict(zip(bounds, grids))
    return bool(
        np.all(
            np.broadcast_to(evaluate(a, env), grids[0].shape)
            == np.broadcast_to(evaluate(b, env), grids[0].shape)
        )
    )


def contiguous_strides(sizes):
    return tuple(math.prod(sizes[i + 1 :]) for i in range(len(sizes)))


@pytest.mark.parametrize("sizes", [(64, 32), (2, 8, 8, 32), (3, 5, 7), (16, 1, 4, 6)])
def test_a_buffer_read_in_memory_order_is_read_at_xindex(sizes):
    e = digits(x, sizes, contiguous_strides(sizes))
    assert simplify(e, {x: math.prod(sizes) - 1}) == x
    assert simplify(e, {}) == x  # the digit merge needs no bounds


def test_nested_views_collapse_bottom_up():
    """An addmm's 2-d output read through a 4-d view of it (the GELU epilogue of a channels-last MLP)."""
    inner = digits(x, (128, 128), (128, 1))
    e = digits(inner, (2, 8, 8, 128), (8192, 1024, 128, 1))
    assert simplify(e, {x: 16383}) == x


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))))
def test_permuted_reads_keep_their_values(perm):
    """Iterating a (2, 3, 4, 5) buffer in another dim order: the result addresses the same elements, and is
    the plain index only where the order is the memory order."""
    sizes = (2, 3, 4, 5)
    strides = contiguous_strides(sizes)
    psizes, pstrides = tuple(sizes[p] for p in perm), tuple(strides[p] for p in perm)
    e = digits(x, psizes, pstrides)
    bounds = {x: math.prod(sizes) - 1}
    s = simplify(e, bounds)
    assert same_values(e, s, bounds)
    assert (s == x) == (perm == (0, 1, 2, 3))


def test_range_rule_uses_the_row_bound():
    """A LayerNorm row of 32 channels read through the 4-d channels-last view of its buffer."""
    flat = r + 32 * x
    e = digits(flat, (2, 8, 8, 32), (2048, 256, 32, 1))  # (N, H, W, C) over an NHWC buffer
    bounds = {x: 127, r: 31}
    s = simplify(e, bounds)
    assert s == r + 32 * x
    assert same_values(e, s, bounds)
    # without the row bound, rindex may carry into xindex's digits: the floor division must stay
    assert simplify(FloorDiv(r + 32 * x, 32), bounds) == x
    assert simplify(FloorDiv(r + 32 * x, 32), {x: 127}) != x
    assert simplify(ModularIndexing(r + 32 * x, 256, 8), bounds) == ModularIndexing(x, 8, 8)


def test_padded_rows_are_not_mistaken_for_contiguous():
    e = 64 * FloorDiv(x, 32) + ModularIndexing(x, 1, 32)
    s = simplify(e, {x: 255})
    assert s != x and same_values(e, s, {x: 255})


def test_modulo_and_division_of_a_bounded_index_drop():
    assert simplify(ModularIndexing(x, 1, 64), {x: 63}) == x
    assert simplify(FloorDiv(x, 64), {x: 63}) == 0
    assert simplify(ModularIndexing(x, 4, 64), {x: 63}) == FloorDiv(x, 4)
    assert simplify(ModularIndexing(x, 1, 64), {}) == ModularIndexing(x, 1, 64)


def test_upper_bounds():
    assert upper(r + 32 * x, {x: 3, r: 31}) == 127
    assert upper(ModularIndexing(x, 1, 8), {}) == 7
    assert upper(FloorDiv(x, 8), {}) is None


def test_symbolic_sizes_merge_digits():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    e = s0 * FloorDiv(x, s0) + ModularIndexing(x, 1, s0)
    assert simplify(e, {}) == x


# --------------------------------------------------------------------------------- rendered kernels
class _Block(torch.nn.Module):
    """A ConvNeXt block: depthwise conv, LayerNorm over channels (NHWC), Linear-GELU-Linear, layer scale,
    residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = torch.nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
        self.gamma = torch.nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        y = self.fc2(F.gelu(self.fc1(self.norm(self.dw(t).permute(0, 2, 3, 1)))))
        return t + y.mul(self.gamma).permute(0, 3, 1, 2)


def test_channels_last_epilogues_read_and_write_contiguously(device):
    """Every load and store of the block's kernels is at ``xindex`` (pointwise), ``rindex + C*xindex`` (rows of
    the LayerNorm) or a channel vector (``xindex % C``, ``rindex``): no division chains; three kernels (the
    LayerNorm with the convolution's bias, the GELU after the first addmm, layer scale and residual after the
    second); the only ATen fallback is the convolution."""
    torch.manual_seed(0)
    c = 32
    m = _Block(c).to(device, torch.bfloat16).eval()
    t = torch.randn(2, c, 8, 8, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    with (
        compiler.config.patch(conv_layout="always", conv_bias="split", strict=True),
        torch.no_grad(),
        compiler.capture() as gs,
    ):
        got = torch.compile(m, backend="kiln")(t)
    with torch.no_grad():
        ref = m(t)
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
    assert got.stride() == ref.stride()
    (g,) = gs
    assert len(g.kernel_sources) == 3
    assert {f.op for f in g.fallbacks} == {"aten.convolution.default"}
    allowed = {"xindex", f"(xindex % {c})", "rindex", f"(rindex + ({c} * xindex))"}
    for name, src in g.kernel_sources.items():
        idx = set(re.findall(r"tl\.(?:load|store)\(\w+ \+ ([^,]*),", src))
        assert idx and idx <= allowed, (name, idx - allowed)
