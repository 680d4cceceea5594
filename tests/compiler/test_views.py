"""View lowerings: a reshape's index remap, by runs of dims (``views.dim_groups``) or by a whole-shape flatten."""

import itertools
import random

import pytest
import sympy
import torch

import compiler
from compiler.ir import Lazy, sym
from compiler.kexpr import Const
from compiler.lowering import views


def _shapes(numel: int, rank: int, rng: random.Random) -> tuple[int, ...]:
    """A random shape of ``rank`` dims (1s included) with ``numel`` elements."""
    dims = [1] * rank
    n = numel
    for p in (2, 2, 2, 3, 3, 5, 7):
        while n % p == 0 and rng.random() < 0.8:
            dims[rng.randrange(rank)] *= p
            n //= p
    dims[rng.randrange(rank)] *= n
    return tuple(dims)


def _remapped(in_size, out_size) -> list[list[int]]:
    """For every output index (row-major), the input index ``reshape_value`` maps it to, evaluated."""
    x = Lazy(
        tuple(sympy.Integer(n) for n in in_size),
        torch.float32,
        torch.device("cpu"),
        lambda idx: Const(0.0, torch.float32),
    )
    remap = views.reshape_value(x, tuple(sympy.Integer(n) for n in out_size))
    idx = [sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(len(out_size))]
    exprs = remap(idx)
    out = []
    for point in itertools.product(*(range(n) for n in out_size)):
        env = dict(zip(idx, point))
        out.append([int(sympy.sympify(e).xreplace(env)) for e in exprs])
    return out


def test_reshape_remap_agrees_with_row_major_order_on_random_shapes():
    """Output element k (row-major) is input element k, for shapes that split into runs and shapes that do not
    (6x4 -> 4x6 has no common run: the whole-shape flatten)."""
    rng = random.Random(0)
    pairs = [
        ((6, 4), (4, 6)),
        ((2, 3, 4), (6, 4)),
        ((6, 4), (2, 3, 2, 2)),
        ((1, 12, 1), (3, 1, 4)),
        ((5,), (5,)),
    ]
    for _ in range(40):
        numel = rng.choice([12, 24, 30, 36, 60])
        pairs.append((_shapes(numel, rng.randint(1, 4), rng), _shapes(numel, rng.randint(1, 4), rng)))
    for in_size, out_size in pairs:
        got = _remapped(in_size, out_size)
        want = [list(t) for t in itertools.product(*(range(n) for n in in_size))]
        assert got == want, (in_size, out_size)


def test_dim_groups_pairs_runs_of_equal_element_counts():
    s0 = sym(sympy.Symbol("s0", integer=True, positive=True))
    assert views.dim_groups((2, 3, 4), (6, 4)) == [([0], [0, 1]), ([1], [2])]
    assert views.dim_groups((6, 1, 4), (2, 3, 4)) == [([0, 1], [0]), ([2], [2])]
    assert views.dim_groups((s0, 128, 512), (s0 * 128, 512)) == [([0], [0, 1]), ([1], [2])]
    assert views.dim_groups((6, 4), (4, 6)) is None  # 6 and 4 neither equal nor divide: no common run
    assert views.dim_groups((s0, 4), (4, s0)) is None


@pytest.mark.parametrize(
    "shape,view",
    [((4, 6, 8), (24, 8)), ((24, 8), (4, 6, 2, 4)), ((4, 6, 8), (8, 24)), ((2, 12, 8), (4, 3, 16))],
)
def test_compiled_reshapes_match_eager(shape, view):
    """A pointwise op before and after the view, so that the reshape remaps a Lazy value's index."""

    def f(x):
        return (torch.sin(x) * 2).reshape(view).cos() + 1

    x = torch.randn(shape)
    torch._dynamo.reset()
    compiler.register()
    got = torch.compile(f, backend="kiln")(x)
    torch.testing.assert_close(got, f(x))
