"""``libdevice`` stand-in for Triton's interpreter (CPU tensors), and kiln's fixes to the interpreter.

Generated kernels call ``libdevice.tanh`` and friends, which only exist on GPUs. Under
``TRITON_INTERPRET=1`` the kernel module's ``libdevice`` name is rebound to this module, whose functions
apply the NumPy equivalent to the interpreter's tensors, so kernel sources stay identical in both modes.
``install_interpreter_fixes`` also makes the interpreter round bf16 as GPUs do (``fix_bf16_rounding``) and
leave ``triton.language`` as it found it after each launch (``restore_language_after_launches``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
erfc = _unary(
    lambda a: (
        np.asarray(__import__("scipy.special", fromlist=["erfc"]).erfc(a))
        if _has_scipy()
        else 1.0 - np.vectorize(math.erf)(a)
    )
)
pow = _binary(np.power)
atan2 = _binary(np.arctan2)


_rounding_fixed = False


def fix_bf16_rounding() -> None:
    """Make the interpreter convert float <-> bf16 as GPUs (and eager PyTorch) do.

    Triton's interpreter truncates fp32 -> bf16 (and mis-converts fp64 -> bf16), so every bf16 store in
    interpreter mode would be up to one ulp off the GPU result; it also garbles bf16 subnormals when
    widening them. Installed once, for interpreter mode only.
    """
    global _rounding_fixed
    if _rounding_fixed:
        return
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar in (tl.float32, tl.float64, tl.float16):
            t = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return TensorHandle(t.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar in (tl.float32, tl.float64):
            # bf16 -> float widening keeps subnormals (the interpreter's own conversion garbles them)
            t = torch.from_numpy(np.ascontiguousarray(src.data).view(np.int16)).view(torch.bfloat16)
            wide = torch.float32 if dst_type.scalar == tl.float32 else torch.float64
            return TensorHandle(t.to(wide).numpy(), dst_type.scalar)
        return original(self, src, dst_type)

    InterpreterBuilder.cast_impl = cast_impl
    _rounding_fixed = True


#: True once restore_language_after_launches is installed
_launches_restore = False


def _lang_namespaces() -> list[object]:
    """The objects whose attributes Triton's interpreter patches while a kernel runs: ``triton.language``,
    ``triton.language.core``, ``triton.language.math``, the tensor class and the tensor descriptor base."""
    import triton.language as tl

    found = [tl, tl.core, tl.math, tl.tensor, getattr(tl.core, "tensor_descriptor_base", None)]
    return [o for o in found if o is not None]


def restore_language_after_launches() -> None:
    """Leave ``triton.language`` as it was before each interpreted launch once the launch ends.

    The interpreter swaps the builtins of ``triton.language`` (and of ``.core``, ``.math``, the tensor class)
    for versions that compute on NumPy while a kernel runs, and restores them when the launch ends, but a call
    to another jit function inside the kernel (a reduction's combine function, a helper) patches the namespaces
    that function sees and never restores them: after any interpreted ``tl.sum``, ``triton.language.core``'s
    builtins stay the interpreter's for the life of the process, and a real ``triton.compile`` there (a GPU
    target compiled on this machine, as kiln's compile check and compile pool do) fails in its front end. Each
    launch (``GridExecutor.__call__``) now ends with the namespaces as they were when it began: one snapshot a
    launch, not one per device-function call. Installed once, for interpreter mode only."""
    global _launches_restore
    if _launches_restore:
        return
    from triton.runtime import interpreter

    cls = getattr(interpreter, "GridExecutor", None)
    if cls is None:
        _launches_restore = True
        return
    original = cls.__call__

    def __call__(self, *args, **kwargs):
        spaces = _lang_namespaces()
        before = [dict(vars(o)) for o in spaces]
        try:
            return original(self, *args, **kwargs)
        finally:
            for space, was in zip(spaces, before):
                now = vars(space)
                for name in [n for n in now if n not in was]:
                    delattr(space, name)
                for name, value in was.items():
                    if now.get(name, was) is not value:
                        setattr(space, name, value)

    cls.__call__ = __call__
    _launches_restore = True


def install_interpreter_fixes() -> None:
    """Every fix of this module to Triton's interpreter (each installed once)."""
    fix_bf16_rounding()
    restore_language_after_launches()
