"""A pool of kernel compile worker processes, shared by every graph of a process.

Each worker is ``python compile_worker.py``: a fresh interpreter (no fork of a process holding CUDA, no
re-import of the user's ``__main__``) that imports only Triton and kernel modules and never touches CUDA.
One parent thread drives each worker (write a request, read the answer), so ``submit`` returns a
``concurrent.futures.Future`` at once. Workers start on demand, up to ``compile_workers``; a worker that
dies is replaced at its next job (the job it had fails with ``KernelCompileError(worker_failed=True)``, as do
jobs that fail on anything but a ``CompilationError`` of the kernel: the launch compiles those in-process).
The pool lives until the process exits (``atexit`` stops the workers; closing their stdin also stops them).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Any

from .. import config
from ..exc import KernelCompileError
from .compile_worker import read_message, write_message

log = logging.getLogger("kiln")

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")


def worker_env() -> dict[str, str]:
    """This process's environment without ``TRITON_INTERPRET`` (Triton picks the interpreter at import)."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


class CompilePool:
    """``size`` worker processes compiling requests (``compile_worker`` messages) in submission order."""

    def __init__(self, size: int) -> None:
        self.size = max(1, int(size))
        self._jobs: queue.Queue[tuple[dict, str, Future] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # worker processes started so far (tests, stats)

    def submit(self, message: dict, label: str) -> Future:
        """Compile ``message`` in a worker. The future's result is the worker's answer
        (``{"ok": True, "hit", "seconds", "launcher"}``); a compile error is ``KernelCompileError``
        naming ``label`` (kernel and target)."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise KernelCompileError(f"compiling {label}: the compile pool is shut down")
            self._jobs.put((message, label, fut))
            if len(self._threads) < self.size:
                self._start_thread(prestart=False)
        return fut

    def warm_up(self) -> None:
        """Start every worker now (Python and Triton imports take about a second), before jobs arrive."""
        with self._lock:
            while not self._closed and len(self._threads) < self.size:
                self._start_thread(prestart=True)

    def _start_thread(self, prestart: bool) -> None:
        t = threading.Thread(
            target=self._serve, args=(prestart,), name=f"kiln-compile-{len(self._threads)}", daemon=True
        )
        self._threads.append(t)
        t.start()

    def _spawn(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, WORKER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=worker_env(),
            start_new_session=True,
        )
        with self._lock:
            self._procs.add(proc)
            self.started += 1
        assert proc.stdout is not None  # a pipe
        hello = read_message(proc.stdout)
        if not isinstance(hello, dict) or "ready" not in hello:
            self._stop(proc)
            raise OSError(f"compile worker did not start (exit code {proc.poll()})")
        return proc

    def _serve(self, prestart: bool) -> None:
        proc: subprocess.Popen | None = None
        if prestart:
            try:
                proc = self._spawn()
            except Exception as e:  # noqa: BLE001 - the first job spawns again and reports
                log.debug("kiln: compile worker did not start: %s", e)
        while True:
            item = self._jobs.get()
            if item is None:
                break
            message, label, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if proc is None or proc.poll() is not None:
                    proc = self._spawn()
                assert proc.stdin is not None and proc.stdout is not None  # pipes (_spawn)
                write_message(proc.stdin, message)
                answer = read_message(proc.stdout)
                if answer is None:
                    raise OSError(f"compile worker exited with code {proc.wait()}")
            except Exception as e:  # noqa: BLE001 - a lost worker fails its job, never the pool
                if proc is not None:
                    self._stop(proc)
                proc = None
                fut.set_exception(KernelCompileError(f"compiling {label}: {e}", worker_failed=True))
                continue
            if answer.get("ok"):
                fut.set_result(answer)
            else:
                fut.set_exception(
                    KernelCompileError(
                        f"compiling {label} failed in a compile worker: {answer.get('error', '?')}",
                        worker_failed=not answer.get("compile_error"),
                    )
                )
        if proc is not None:
            self._stop(proc)

    def _stop(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except Exception:  # noqa: BLE001 - a broken pipe is what we are closing
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def shutdown(self) -> None:
        """Stop every worker now; jobs not started fail."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            threads = list(self._threads)
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[2].cancel()
        for proc in procs:
            try:
                proc.kill()
            except OSError:
                pass
        for _ in threads:
            self._jobs.put(None)


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def pool_size() -> int:
    """Workers for ahead-of-time compiles: 0 (compile serially in-process) when ``compile_threads`` or
    ``compile_workers`` is 1."""
    s = config.settings()
    return 0 if s.compile_threads <= 1 or s.compile_workers <= 1 else s.compile_workers


def get_pool() -> CompilePool:
    """The process's pool, created on first use with ``compile_workers`` workers."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = CompilePool(config.settings().compile_workers)
        return _pool


def shutdown_pool() -> None:
    """Stop the process's pool (a later ``get_pool`` starts a new one)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown()


atexit.register(shutdown_pool)


def describe(pool: Any = None) -> str:
    p = pool or _pool
    return "no compile pool" if p is None else f"compile pool: {p.size} workers, {p.started} started"
