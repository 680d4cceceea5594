"""Every error class kiln raises, in one place.

Terms: a *lowering* turns one ATen op into kiln IR; a *fallback* runs an ATen op as-is from the wrapper.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class ConfigError(KilnError, ValueError):
    """An environment variable or config override has a value kiln cannot use."""


class NotLowered(KilnError):
    """A lowering declines an op (unsupported arguments, dtype, device...). The op falls back to ATen.

    ``kind`` classifies the reason for reports (e.g. ``"unsupported_op"``, ``"dtype"``, ``"device"``).
    """

    def __init__(self, detail: str, kind: str = "unsupported_args") -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class LoweringError(KilnError):
    """A lowering hit an internal error. In strict mode it propagates; otherwise the op falls back."""


class CodegenError(KilnError):
    """Rendering a kernel or the wrapper failed: a compiler bug, never a user error."""


class SymbolResolutionError(CodegenError):
    """A size symbol used by a kernel cannot be computed from the wrapper's inputs."""


class InvariantError(KilnError):
    """A pass product broke a structural invariant its ``verify()`` checks (run between passes under
    ``strict``): a compiler bug, caught at the pass that made it rather than where it would surface."""


def require(ok: bool, message: str) -> None:
    """Raise ``InvariantError(message)`` unless ``ok``: the checks of the pass products' ``verify()``."""
    if not ok:
        raise InvariantError(message)


class KernelLaunchError(KilnError):
    """A generated kernel could not be compiled or launched on the device at hand."""


class KernelCompileError(KernelLaunchError):
    """A generated kernel failed to compile for its GPU (in this process or in a compile worker).

    ``worker_failed``: the compile worker died, or failed on something other than the kernel's code (the
    kernel is then compiled in-process, where a real error shows with its full traceback)."""

    def __init__(self, message: str, worker_failed: bool = False) -> None:
        super().__init__(message)
        self.worker_failed = worker_failed


class ValueTraceError(KilnError):
    """Value tracing (``trace_values``) cannot record here: inside a CUDA graph capture, or its trace file
    cannot be written."""
