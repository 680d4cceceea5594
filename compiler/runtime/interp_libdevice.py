"""``libdevice`` stand-in for Triton's interpreter (CPU tensors).

Generated kernels call ``libdevice.tanh`` and friends, which only exist on GPUs. Under
``TRITON_INTERPRET=1`` the kernel module's ``libdevice`` name is rebound to this module, whose functions
apply the NumPy equivalent to the interpreter's tensors, so kernel sources stay identical in both modes.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


def _has_scipy() -> bool:
    try:
        import scipy.special  # noqa: F401
        return True
    except ImportError:
        return False


def _unary(fn: Callable[[np.ndarray], np.ndarray]):
    def apply(x):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        if not isinstance(x, tl.tensor):
            return fn(np.asarray(x)).item()
        data = x.handle.data
        return tl.tensor(TensorHandle(fn(data).astype(data.dtype), x.handle.dtype.scalar), x.type)

    return apply


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def apply(a, b):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        if not isinstance(a, tl.tensor):
            a, b = b * 0 + a, b  # lift the scalar to b's type and shape
        if not isinstance(b, tl.tensor):
            b = a * 0 + b
        a, b = tl.broadcast(a, b) if a.shape != b.shape else (a, b)
        da, db = a.handle.data, b.handle.data
        return tl.tensor(TensorHandle(fn(da, db).astype(da.dtype), a.handle.dtype.scalar), a.type)

    return apply


tanh = _unary(np.tanh)
sin = _unary(np.sin)
cos = _unary(np.cos)
log1p = _unary(np.log1p)
expm1 = _unary(np.expm1)
trunc = _unary(np.trunc)
nearbyint = _unary(np.rint)
sinh = _unary(np.sinh)
cosh = _unary(np.cosh)
tan = _unary(np.tan)
asin = _unary(np.arcsin)
acos = _unary(np.arccos)
atan = _unary(np.arctan)
log10 = _unary(np.log10)
erfc = _unary(lambda a: np.asarray(__import__("scipy.special", fromlist=["erfc"]).erfc(a))
              if _has_scipy() else 1.0 - np.vectorize(math.erf)(a))
pow = _binary(np.power)
atan2 = _binary(np.arctan2)
