"""A kernel compile worker: a process that runs ``triton.compile`` for requests read from its stdin.

Started by ``compile_pool`` as ``python compile_worker.py`` (a script, never ``import compiler``: a worker
imports only the standard library, Triton and the kernel modules; it never imports torch or initializes
CUDA). Protocol, one request at a time: the parent writes an 8-byte big-endian length and a pickled dict
(``gpu_compile.CompileRequest.wire``); the worker answers the same way with a dict ``{"ok", "hit", "seconds",
"launcher", "error", "compile_error"}``. Compiled kernels land in Triton's on-disk cache, where the parent's own
``triton.compile`` of the same source then finds them. The worker's stdout is the protocol channel: anything
else printed to stdout goes to stderr.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import linecache
import os
import pickle
import struct
import sys
import time
import traceback
from typing import IO, Any

if (
    __name__ == "__main__"
    and sys.path
    and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__))
):
    sys.path.pop(0)  # the script's folder (compiler/runtime) must not shadow top-level modules

_HEADER = struct.Struct(">Q")
_functions: dict[tuple[str, str], Any] = {}


def read_message(stream: IO[bytes]) -> Any | None:
    """One length-prefixed pickle from ``stream``, or None at end of file."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def write_message(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def verified_source(path: str) -> str:
    """The text of kernel file ``path`` when it is the source its name hashes (``k`` and the first 24 hex digits
    of its sha256, as ``cache.source_path`` names it); a ValueError when another process changed the file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem != "k" + hashlib.sha256(text.encode()).hexdigest()[:24]:
        raise ValueError(f"kernel file {path} does not hold the source its name hashes (changed on disk)")
    return text


def load_function(path: str, name: str, module_name: str) -> Any:
    """The ``@triton.jit`` function ``name`` of the kernel module at ``path`` (imported once), run from the text
    read and checked once (``verified_source``; ``linecache`` serves that text to Triton's ``inspect``)."""
    fn = _functions.get((path, name))
    if fn is None:
        mod = sys.modules.get(module_name)
        if mod is None or getattr(mod, "__file__", None) != path:
            text = verified_source(path)
            spec = importlib.util.spec_from_loader(module_name, loader=None, origin=path)
            assert spec is not None  # a spec with no loader always exists
            mod = importlib.util.module_from_spec(spec)
            mod.__file__ = path
            linecache.cache[path] = (len(text), None, text.splitlines(True), path)
            sys.modules[module_name] = mod
            exec(compile(text, path, "exec"), mod.__dict__)  # noqa: S102 - kiln's kernel, checked against its name
        fn = getattr(mod, name)
        _functions[(path, name)] = fn
    return fn


#: the variables that choose ptxas for Triton's NVIDIA backend, whose version is part of every cache key
PTXAS_ENV = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_MOCK_PTX_VERSION")
#: the values of PTXAS_ENV when ``follow_ptxas_env`` last ran in this process (empty: never)
_ptxas_seen: list[tuple[str | None, ...]] = []


def follow_ptxas_env() -> None:
    """Make this process's next Triton cache key use the ptxas that ``PTXAS_ENV`` names now. Triton reads the
    ptxas version once per process (``get_ptxas_version`` is memoized), but the variables can change within one:
    Inductor sets ``TRITON_PTXAS_PATH`` (PyTorch's bundled ptxas) on its first compile in a process. The memo is
    dropped at the first call and whenever the variables changed since the last (one ``ptxas --version`` run on
    the next compile). A no-op where Triton has no such memo."""
    now = tuple(os.environ.get(name) for name in PTXAS_ENV)
    if _ptxas_seen and _ptxas_seen[0] == now:
        return
    _ptxas_seen[:] = [now]
    try:
        from triton.backends.nvidia import compiler as nvidia
    except Exception:  # noqa: BLE001 - no NVIDIA backend in this Triton: nothing memoized
        return
    clear = getattr(getattr(nvidia, "get_ptxas_version", None), "cache_clear", None)
    if clear is not None:
        clear()


def _apply_env(env: dict[str, str | None]) -> None:
    """Make Triton's cache folder, its cache-invalidating variables and the ptxas variables those of the parent
    (same cache keys); None: unset in the parent."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    follow_ptxas_env()


def _build_launcher(kernel: Any) -> bool:
    """Triton versions that build a C launcher per signature (3.6: a C compiler run, about a second, in the
    parent's first launch otherwise): build it here too, into the same on-disk cache. Best effort: False
    where this Triton has no such launcher or it cannot be built here (no libcuda: a CPU-only machine)."""
    try:
        from triton.backends.nvidia import driver as nv
    except Exception:
        return False
    if not hasattr(nv, "make_launcher") or kernel.metadata.target.backend != "cuda":
        return False
    try:
        nv.CudaLauncher(kernel.src, kernel.metadata)
        return True
    except Exception:
        return False


def _is_compile_error(e: Exception) -> bool:
    """An error in the kernel's code (the parent's compile would fail the same way)."""
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:
        return False
    return isinstance(e, CompilationError)


def compile_request(req: dict) -> dict:
    """Compile one request; never raises (errors come back in the answer)."""
    start = time.perf_counter()
    hits: list[bool] = []
    try:
        _apply_env(req["env"])
        import triton
        from triton import knobs
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        fn = load_function(req["path"], req["kernel"], req["module"])
        src = ASTSource(fn, dict(req["signature"]), dict(req["constexprs"]), dict(req["attrs"]))
        knobs.compilation.listener = lambda **kw: hits.append(bool(kw.get("cache_hit")))
        try:
            kernel = triton.compile(src, target=GPUTarget(*req["target"]), options=dict(req["options"]))
        finally:
            knobs.compilation.listener = None
        launcher = _build_launcher(kernel) if req.get("launcher", True) else False
    except Exception as e:  # a compile error is an answer, not a worker failure
        detail = getattr(e, "error_message", None) or str(e)
        lines = [ln for ln in str(detail).splitlines() if ln.strip()]
        return {
            "ok": False,
            "hit": False,
            "seconds": time.perf_counter() - start,
            "launcher": False,
            "error": f"{type(e).__name__}: {' | '.join(lines[-6:])}",
            "compile_error": _is_compile_error(e),
            "traceback": traceback.format_exc(limit=8),
        }
    return {
        "ok": True,
        "hit": bool(hits and hits[0]),
        "seconds": time.perf_counter() - start,
        "launcher": launcher,
        "error": "",
    }


def prime_triton_key() -> bool:
    """Compute Triton's own cache key now (``triton_key``: a hash of Triton's sources and of its ``libtriton``
    library, about half a second to a second, cached in the process). Every process that compiles a kernel or
    asks for one's cache key computes it once; done ahead (a worker before it says it is ready, the parent in a
    thread while Dynamo and AOTAutograd trace) it is off the path of the first compile. False when this Triton
    has no such function (then the first compile computes what it needs)."""
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            key = getattr(importlib.import_module(module), "triton_key", None)
        except ImportError:
            continue
        if callable(key):
            try:
                key()
            except Exception:
                return False
            return True
    return False


def main() -> int:
    """Serve requests until stdin closes."""
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (compiler warnings) must not corrupt the protocol stream
    sys.stdout = sys.stderr
    proto_in = sys.stdin.buffer
    import triton.compiler  # noqa: F401  (the slow part of a worker's start, before the first request)

    prime_triton_key()
    write_message(proto_out, {"ready": os.getpid()})
    while True:
        req = read_message(proto_in)
        if req is None:
            return 0
        write_message(proto_out, compile_request(req))


if __name__ == "__main__":
    sys.exit(main())
