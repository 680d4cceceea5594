"""Compile/cache layer: write a kernel's source to the cache folder once and import it; checked entry files
(``write_entry``/``read_entry``: magic, checksum or signature, atomic replace) and LRU eviction for the graph and
autotune caches.

The file name is the hash of the source, so the same graph always maps to the same file; the module is run from
the source kiln holds, never from what the file holds now (a file another process changed is rewritten). Under
the interpreter the module's ``libdevice`` is rebound to ``interp_libdevice``.

Entries come in two kinds. *Checked* (``KILNENT1``): the payload's sha256, which proves the file whole but not
who wrote it (anyone can recompute it). *Signed* (``KILNENT2``): an HMAC-SHA256 of the payload keyed by the
cache key (``config.Settings.cache_secret``), which only a holder of the key can make. With a key, entries are
written signed and only signed entries whose HMAC matches are loaded; without one, checked entries are written
and loaded, and with ``cache_auth`` on and no key nothing is (``Settings.cache_mode``).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import linecache
import os
import sys
import tempfile
from types import ModuleType

from .. import config, phase_times

_modules: dict[str, ModuleType] = {}


_made: set[str] = set()  # kernel folders this process made sure exist


def source_path(source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    folder = config.settings().resolved_cache_dir()
    if folder not in _made:
        os.makedirs(folder, exist_ok=True)
        _made.add(folder)
    return os.path.join(folder, f"k{digest}.py")


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no half-written files)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _file_holds(path: str, source: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == source
    except (OSError, UnicodeDecodeError):
        return False


def load_kernel(source: str, name: str):
    """Run the module of ``source`` (its file in the kernel folder, written or rewritten when it does not hold
    ``source`` byte for byte) and return its ``@triton.jit`` function ``name``. The module runs from ``source``
    itself, and ``linecache`` serves that text for the file (Triton reads a kernel's source through
    ``inspect``), so what the file holds when it is read again cannot change the kernel."""
    path = source_path(source)
    mod = _modules.get(path)
    if mod is None:
        with phase_times.phase("kernel_load"):
            mod = _load_module(path, source)
    return getattr(mod, name)


def _load_module(path: str, source: str) -> ModuleType:
    """Write (when needed) and run the kernel module of ``source`` at ``path``; remembered in ``_modules``."""
    if not _file_holds(path, source):
        write_atomic(path, source)
    mod_name = "kiln_kernels." + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_loader(mod_name, loader=None, origin=path)
    assert spec is not None  # a spec with no loader always exists
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = path
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    sys.modules[mod_name] = mod
    exec(compile(source, path, "exec"), mod.__dict__)  # noqa: S102 - kiln's own generated kernel source
    if config.interpreting():
        from . import interp_libdevice

        mod.__dict__["libdevice"] = interp_libdevice
        interp_libdevice.install_interpreter_fixes()
    _modules[path] = mod
    return mod


# --------------------------------------------------------------------------------------------- entry files
#: first bytes of every checked cache entry (graph cache, autotune choices); the digit is the file format
ENTRY_MAGIC = b"KILNENT1"
#: first bytes of every signed entry: an HMAC-SHA256 of the payload keyed by the cache key (module docstring)
SIGNED_MAGIC = b"KILNENT2"
_DIGEST = 32  # sha256 or HMAC-SHA256 of the payload, right after the magic


def _seal(payload: bytes) -> bytes:
    """Magic and digest of ``payload``: signed with the cache key when there is one, else checked."""
    key = config.settings().cache_secret()
    if key is not None:
        return SIGNED_MAGIC + hmac.new(key, payload, hashlib.sha256).digest()
    return ENTRY_MAGIC + hashlib.sha256(payload).digest()


def write_entry(path: str, payload: bytes) -> None:
    """Write an entry: magic, the payload's digest (signed or checked, module docstring), the payload; through a
    temporary file in the same folder and ``os.replace``, so that a reader in another process sees the old file
    or the new one, never half of one (two writers of one key: the last rename wins, both files were whole).
    Nothing is written with ``cache_auth`` on and no key."""
    s = config.settings()
    if s.cache_auth and s.cache_secret() is None:
        return
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_seal(payload) + payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_entry(path: str) -> bytes | None:
    """The payload of an entry this process may trust, or None: the file is missing, of another format,
    truncated or corrupt, or it does not carry the digest this process requires (with a cache key: a matching
    HMAC; without one: a matching sha256, and nothing at all with ``cache_auth`` on). Such a file is a miss, and
    the next write replaces it."""
    s = config.settings()
    if s.cache_auth and s.cache_secret() is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(ENTRY_MAGIC) + _DIGEST
    if len(data) < head:
        return None
    payload = data[head:]
    key = s.cache_secret()
    if key is not None:
        if not data.startswith(SIGNED_MAGIC):
            return None
        expected = hmac.new(key, payload, hashlib.sha256).digest()
    else:
        if not data.startswith(ENTRY_MAGIC):
            return None
        expected = hashlib.sha256(payload).digest()
    if not hmac.compare_digest(expected, data[len(ENTRY_MAGIC) : head]):
        return None
    return payload


def read_json_entry(path: str, fmt: int, key: str) -> dict | None:
    """The JSON object of a checked entry written for ``key`` in format ``fmt`` (its ``format`` and ``key``
    fields), or None: missing, damaged, not JSON, or another format or key (a miss, as ``read_entry``)."""
    import json

    payload = read_entry(path)
    if payload is None:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != fmt or data.get("key") != key:
        return None
    return data


def touch(path: str) -> None:
    """Mark an entry as used now (eviction removes the least recently used first, by modification time)."""
    try:
        os.utime(path)
    except OSError:
        pass


def entries(folder: str, suffix: str) -> list[tuple[float, int, str]]:
    """(modification time, bytes, path) of the entries ending in ``suffix`` in ``folder``, oldest first."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if not name.endswith(suffix):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except OSError:  # removed by another process meanwhile
            continue
        out.append((st.st_mtime, st.st_size, path))
    out.sort()
    return out


def evict(folder: str, suffix: str, max_bytes: int) -> int:
    """Remove the least recently used entries of ``folder`` until they total at most 90% of ``max_bytes``
    (when they exceed ``max_bytes``); returns how many were removed. Safe beside other processes doing the
    same (a file another one removed first is skipped)."""
    listed = entries(folder, suffix)
    total = sum(size for _, size, _ in listed)
    if total <= max_bytes:
        return 0
    removed = 0
    for _, size, path in listed:
        if total <= max_bytes * 0.9:
            break
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
        total -= size
    return removed


def clear(folder: str, suffix: str) -> int:
    """Remove every entry ending in ``suffix`` (and stale temporary files) from ``folder``; returns the count."""
    n = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.endswith(suffix) or (name.startswith(".tmp-") and name.endswith(".part")):
            try:
                os.unlink(os.path.join(folder, name))
                n += name.endswith(suffix)
            except OSError:
                pass
    return n
