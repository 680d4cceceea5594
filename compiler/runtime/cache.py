"""Compile/cache layer: write a kernel's source to the cache folder once and import it; checked entry files
(``write_entry``/``read_entry``: magic, checksum, atomic replace) and LRU eviction for the graph and autotune caches.

The file name is the hash of the source, so the same graph always maps to the same file. Under the
interpreter the module's ``libdevice`` is rebound to ``interp_libdevice``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from types import ModuleType

from .. import config

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


def load_kernel(source: str, name: str):
    """Import the module holding ``source`` and return its ``@triton.jit`` function ``name``."""
    path = source_path(source)
    mod = _modules.get(path)
    if mod is None:
        if not os.path.exists(path):
            write_atomic(path, source)
        mod_name = "kiln_kernels." + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
        if config.interpreting():
            from . import interp_libdevice
            mod.libdevice = interp_libdevice
            interp_libdevice.fix_bf16_rounding()
        _modules[path] = mod
    return getattr(mod, name)


# --------------------------------------------------------------------------------------------- entry files
#: first bytes of every checked cache entry (graph cache, autotune choices); the digit is the file format
ENTRY_MAGIC = b"KILNENT1"
_DIGEST = 32  # sha256 of the payload, right after the magic


def write_entry(path: str, payload: bytes) -> None:
    """Write a checked entry: magic, the payload's sha256, the payload; through a temporary file in the same
    folder and ``os.replace``, so that a reader in another process sees the old file or the new one, never
    half of one (two writers of one key: the last rename wins, both files were whole)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_entry(path: str) -> bytes | None:
    """The payload of a checked entry, or None when the file is missing, of another format, truncated or
    corrupt (its checksum does not match): such a file is a miss, and the next write replaces it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(ENTRY_MAGIC) + _DIGEST
    if len(data) < head or not data.startswith(ENTRY_MAGIC):
        return None
    payload = data[head:]
    if hashlib.sha256(payload).digest() != data[len(ENTRY_MAGIC):head]:
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
