"""Compile/cache layer: write a kernel's source to the cache folder once and import it.

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


def source_path(source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    folder = config.settings().resolved_cache_dir()
    os.makedirs(folder, exist_ok=True)
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
