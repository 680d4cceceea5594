"""kiln: a ``torch.compile`` backend that lowers ATen graphs to fused Triton kernels.

``import compiler`` registers the backend ``"kiln"``. With no GPU present (or ``KILN_INTERPRET=1``) it
sets ``TRITON_INTERPRET=1`` before Triton is imported, so kernels run on CPU tensors through Triton's
interpreter. Public API: ``config``, ``capture()``, ``kiln_backend``, ``compile_graph``.
"""

from __future__ import annotations

import logging
import os
import sys

from . import config

log = logging.getLogger("kiln")


def _select_interpreter() -> None:
    mode = config.settings().interpret
    if mode == "0":
        return
    if mode == "auto":
        import torch

        if torch.cuda.is_available():
            return
    if config.interpreting():
        return
    if "triton" in sys.modules:
        log.warning("kiln: triton was imported before kiln chose the interpreter; CPU graphs will fall back "
                    "to ATen. Import compiler first or set TRITON_INTERPRET=1.")
        return
    os.environ["TRITON_INTERPRET"] = "1"


try:
    _select_interpreter()
except config.ConfigError as _e:
    if sys.argv[:1] == ["-m"]:  # `python -m compiler...` (the package imports first): one line, exit 2
        print(f"python -m compiler: {_e}", file=sys.stderr)
        sys.exit(2)
    raise

import torch  # noqa: E402

if config.interpreting():
    # triton lazily imports gluon on its first launch; do it now, outside the interpreter's patched scope
    try:
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # older tritons have no gluon
        pass

from .backend import compile_graph, kiln_backend  # noqa: E402
from .capture import CompiledGraph, capture  # noqa: E402
from .graph import FallbackReason  # noqa: E402

try:
    torch._dynamo.register_backend(name="kiln")(kiln_backend)
except Exception as e:  # already registered through the entry point
    if "kiln" not in str(e):
        raise

__all__ = ["config", "capture", "CompiledGraph", "FallbackReason", "kiln_backend", "compile_graph"]
