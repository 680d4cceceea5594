"""kiln: a ``torch.compile`` backend that lowers ATen graphs to fused Triton kernels.

``import compiler`` on its own has no side effects: it sets no variable, imports neither torch nor triton and
never exits, so ``compiler.config`` (the settings) is readable anywhere. Hooking kiln into torch is
``register()``: it applies the ``interpret`` setting (``config.select_interpreter``: with no GPU, or
``KILN_INTERPRET=1``, ``TRITON_INTERPRET=1`` so that kernels run on CPU tensors through Triton's interpreter)
and then registers the backend ``"kiln"`` with Dynamo. The order matters: Dynamo's import loads
``triton.language``, whose own ``@jit`` helpers are built as interpreted functions only when
``TRITON_INTERPRET`` is set by then. ``import compiler`` calls ``register()`` when torch is already imported
(the usual ``import torch; import compiler``); where the project is installed, the entry point
(``torch_dynamo_backends`` in pyproject.toml) registers the backend too, and compiling applies the setting
again at its start (too late for Triton's helpers if nothing did before: set ``TRITON_INTERPRET=1`` or call
``register()`` first).

Public API: ``config``, ``register()``, ``capture()``, ``CompiledGraph``, ``FallbackReason``, ``kiln_backend``,
``compile_graph``; all but the first three load the compiler (torch, triton) on first use.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from typing import Any

from . import config

# public name -> the module that defines it (imported on first use: it imports torch and triton)
_LAZY = {
    "CompiledGraph": "capture",
    "FallbackReason": "graph",
    "kiln_backend": "backend",
    "compile_graph": "backend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def capture() -> contextlib.AbstractContextManager[list]:
    """Collect every top-level graph compiled inside the block (``compiler.capture.capture``)."""
    from .capture import capture as collect

    return collect()


class _Package(types.ModuleType):
    """This package's module type: importing the submodule ``compiler.capture`` leaves the attribute
    ``capture`` the function above (the import system binds a submodule to its parent's attribute)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "capture" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _kiln(gm: Any, example_inputs: list, **kwargs: Any) -> Any:
    """The backend as Dynamo calls it before ``compiler.backend`` is loaded: loads it, then compiles."""
    from .backend import kiln_backend

    return kiln_backend(gm, example_inputs, **kwargs)


def register() -> None:
    """Choose Triton's interpreter or not (``config.select_interpreter``), then register ``"kiln"`` with Dynamo
    (which imports torch and triton); the registration is skipped when it is registered already."""
    try:
        config.select_interpreter()  # before Dynamo imports triton.language (module docstring)
    finally:  # a bad setting (ConfigError) still leaves the backend registered: compiling reports it again
        from torch._dynamo.backends import registry

        if "kiln" not in registry._COMPILER_FNS:
            try:
                registry.register_backend(name="kiln")(_kiln)
            except AssertionError as e:  # registered meanwhile (the entry point, another thread)
                if "kiln" not in str(e):
                    raise


if sys.modules.get("torch") is not None:  # torch came first (the usual order): "kiln" works at once
    try:
        register()
    except config.ConfigError:  # a bad KILN_* value: the first compile raises it (one line in the harness)
        pass

__all__ = [
    "config",
    "capture",
    "CompiledGraph",
    "FallbackReason",
    "kiln_backend",
    "compile_graph",
    "register",
]
