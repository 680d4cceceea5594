"""Compile jobs sent to the worker pool and not yet claimed: ``runtime.precompile`` adds one per request it
submits; the first launch of that specialization (``gpu_compile.compile_launch``) takes its own and waits for
it. A module of its own, so that the submitting and the waiting side need not import each other."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from ..exc import KernelCompileError

log = logging.getLogger("kiln")

#: request key -> (request, the worker's future); popped by the first launch that needs it
_pending: dict[str, tuple[Any, Future]] = {}


def add(req: Any, fut: Future) -> None:
    """Record the worker job ``fut`` of ``req`` (a ``gpu_compile.CompileRequest``)."""
    _pending[req.key] = (req, fut)


def has(key: str) -> bool:
    """A job for the request with this key is sent and not yet claimed."""
    return key in _pending


def wait_for(req: Any) -> dict | None:
    """Wait for the worker job of ``req``, if one was sent: its answer, or None (no job, or the worker was
    lost: the caller compiles in-process). A compile error in the worker raises ``KernelCompileError``."""
    item = _pending.pop(req.key, None)
    if item is None:
        return None
    try:
        return item[1].result()
    except KernelCompileError as e:
        if e.worker_failed:
            log.warning("kiln: %s; compiling it in this process", e)
            return None
        raise


def pending() -> int:
    """Requests sent and not yet claimed by a launch."""
    return len(_pending)
