"""The binary index: which Triton cache group holds the compiled binary of a kiln compile request, so that a later
process loads it without ``triton.compile`` (whose cache key hashes all of ``libtriton.so`` once per process:
about 0.3 s on a CPU box) and without importing the kernel's module.

Terms: a *request* is ``gpu_compile.CompileRequest`` (kernel source file, name, signature, constexprs, attrs, the
backend's parsed options, target; ``req.key`` hashes them). A *group* is what Triton's cache manager stores per
compiled kernel: ``<name>.json`` (metadata) and the IR and binary files, under the folder of Triton's own key hash.
The *toolchain fingerprint* (``toolchain()``) covers what Triton's key covers and ``req.key`` does not, without
hashing any large file:

- Triton's version, and size and mtime_ns of every file its ``triton_key()`` hashes: ``libtriton.so`` and the
  Python files of ``triton/compiler``, ``triton/backends`` (also their bundled binaries: ptxas, libdevice),
  ``triton/language`` and ``triton/runtime/cache.py`` (a patched Triton of the same version is another toolchain);
- the backend's hash input: the ptxas versions, as the paths ``TRITON_PTXAS_PATH`` /
  ``TRITON_PTXAS_BLACKWELL_PATH`` name (with their size and mtime_ns) and ``TRITON_MOCK_PTX_VERSION``; Triton
  3.6 and 3.9 pick the Blackwell ptxas from different archs, so both tools are in for every arch;
- the options' hash input beyond their values (which ``req.key`` has): the size and mtime_ns of each
  ``extern_libs`` file (libdevice), which Triton hashes;
- Triton's cache-invalidating environment variables (``get_cache_invalidating_env_vars``, as ``triton.compile``
  reads them);
- where the groups live: ``TRITON_CACHE_DIR`` (``knobs.cache.dir``); only Triton's default file cache manager
  is used (a custom ``TRITON_CACHE_MANAGER``: no index).

*Entry*: ``<sha256(req.key, fingerprint)>.kbi`` in ``folder()`` (``Settings.resolved_binary_index_dir``: beside the
kernel sources of ``KILN_CACHE_DIR``, which the harness keeps per trust scope next to ``TRITON_CACHE_DIR``), a
checked file (``cache.write_entry``) holding JSON: the request key, the fingerprint, Triton's hash, the group's name
and its file names (only files under this process's ``TRITON_CACHE_DIR`` are ever loaded). ``load``
finds the entry, checks the group's files exist under the Triton cache folder, and builds Triton's
``CompiledKernel`` from them; any doubt (no entry, another fingerprint, a damaged entry, a missing file, a
metadata mismatch, a Triton whose API differs) returns None and the caller compiles as before (its result is
recorded again). Skipped while a compile listener, a stages-inspection hook or ``TRITON_ALWAYS_COMPILE`` is set.
The ``CompiledKernel``'s source names the kernel through a stub (``source_stub``) when its ``JITFunction`` was not
imported: Triton's launcher reads only the signature and constants (Triton 3.6 and 3.9).
``KILN_CACHE=0``: no index; ``KILN_CACHE=read``: read, never written. The folder is kept under
``MAX_BYTES`` (least recently used first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
import types
from typing import Any

from .. import config
from . import cache, compile_worker

log = logging.getLogger("kiln")

FORMAT = 1
SUFFIX = ".kbi"
#: size bound of the index folder (an entry is about 600 bytes)
MAX_BYTES = 64 << 20
#: writes between two evictions in a process (the first write of a process evicts too)
EVICT_EVERY = 512

_toolchain: dict[Any, Any] = {}  # "installed": ``_installed()``; an ``_environment()`` -> its fingerprint
_writes = [0]


def folder() -> str:
    return config.settings().resolved_binary_index_dir()


def mode() -> str:
    """The ``cache`` setting: "1" read and write, "read" read only, "0" off."""
    return config.settings().cache_mode()


# ------------------------------------------------------------------------------------------- fingerprint
def _stat(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns]


def _tree(root: str, sub: str) -> list:
    """(relative path, size, mtime_ns) of every file under ``root/sub``, in a fixed order."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return out


def _installed() -> dict[str, Any]:
    """The installed Triton: version, ``libtriton.so`` and the files ``triton_key()`` hashes, by size and mtime."""
    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__))
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files = hashlib.sha256()
    for sub in ("compiler", "backends", "language"):
        files.update(repr(_tree(root, sub)).encode())
    return {
        "format": FORMAT,
        "triton": triton.__version__,
        "libtriton": _stat(os.path.join(root, "_C", f"libtriton.{ext}")),
        "cache_py": _stat(os.path.join(root, "runtime", "cache.py")),
        "files": files.hexdigest(),
    }


#: environment variables read for the fingerprint on every lookup (cheap), beside Triton's invalidating list
ENV = compile_worker.PTXAS_ENV


def _environment() -> tuple:
    """What can change within a process: Triton's cache folder, its cache-invalidating variables, the ptxas
    paths (a few microseconds: read at every lookup, as ``triton.compile`` reads them at every compile)."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars

    env = tuple(sorted((k, str(v)) for k, v in get_cache_invalidating_env_vars().items()))
    return os.path.abspath(knobs.cache.dir), env, tuple(os.environ.get(k) for k in ENV)


def _fingerprint(environment: tuple) -> dict[str, Any]:
    """What identifies this process's Triton toolchain (see the module docstring), as plain data."""
    installed = _toolchain.get("installed")
    if installed is None:
        installed = _toolchain["installed"] = _installed()
    cache_dir, env, tools = environment
    ptxas = [[var, value, _stat(value) if value else None] for var, value in zip(ENV[:2], tools[:2])]
    return {
        **installed,
        "ptxas": ptxas,
        "mock_ptx": tools[2],
        "env": [list(kv) for kv in env],
        "cache_dir": cache_dir,
    }


def toolchain() -> str:
    """The sha256 of ``_fingerprint()``: the installed part computed once per process, the environment's read
    at every call (a new value computes the fingerprint again)."""
    environment = _environment()
    fp = _toolchain.get(environment)
    if fp is None:
        fp = hashlib.sha256(json.dumps(_fingerprint(environment), sort_keys=True).encode()).hexdigest()
        _toolchain[environment] = fp
    return fp


def request_toolchain(req: Any) -> str:
    """``toolchain()`` with the size and mtime_ns of ``req``'s ``extern_libs`` files (libdevice), whose contents
    Triton's options hash covers and ``req.key`` (their paths only) does not."""
    fp = toolchain()
    libs = req.options.get("extern_libs") or ()
    if not libs:
        return fp
    memo = (fp, repr(libs))
    out = _toolchain.get(memo)
    if out is None:
        stats = [[name, _stat(path)] for name, path in libs]
        out = _toolchain[memo] = hashlib.sha256(json.dumps([fp, stats]).encode()).hexdigest()
    return out


def forget_toolchain() -> None:
    """Compute the fingerprint again at the next use (tests; a Triton installed anew under a running process)."""
    _toolchain.clear()


# ------------------------------------------------------------------------------------------- entries
def usable() -> bool:
    """Whether the index may be consulted now: the cache is on and nothing wants Triton's own compile path
    (a compile listener, a stages-inspection hook, ``TRITON_ALWAYS_COMPILE``, a custom cache manager)."""
    if mode() == "0":
        return False
    try:
        from triton import knobs

        return (
            knobs.compilation.listener is None
            and knobs.runtime.add_stages_inspection_hook is None
            and not knobs.compilation.always_compile
            and knobs.cache.manager_class is None
        )
    except Exception:  # noqa: BLE001 - a Triton without these knobs: today's path
        return False


def entry_path(key: str, fp: str) -> str:
    digest = hashlib.sha256(f"{key}\0{fp}".encode()).hexdigest()[:40]
    return os.path.join(folder(), digest + SUFFIX)


def group_name(req: Any) -> str:
    """The metadata file name of ``req``'s group (``triton.compile`` truncates the kernel name to 150)."""
    return f"{req.kernel[:150]}.json"


def lookup(req: Any) -> tuple[str, dict[str, str]] | None:
    """(Triton's hash, the group: file name -> path) recorded for ``req`` under this toolchain, its files all
    present in Triton's cache folder; None otherwise."""
    if not usable():
        return None
    try:
        fp = request_toolchain(req)
        path = entry_path(req.key, fp)
        data = cache.read_json_entry(path, FORMAT, req.key)
        if data is None or data.get("toolchain") != fp or data.get("group") != group_name(req):
            return None
        group = _group(data["hash"], data["group"], data["files"])
        if group is None:
            return None
        if mode() == "1":
            cache.touch(path)
        return data["hash"], group
    except Exception as e:  # noqa: BLE001 - a damaged entry or another Triton: a miss
        log.debug("kiln: binary index lookup of %s failed: %s", getattr(req, "kernel", "?"), e)
        return None


def _group(hash_: str, name: str, files: list[str]) -> dict[str, str] | None:
    """The group ``name`` of Triton's cache entry ``hash_`` when it holds every file in ``files``, each under
    ``TRITON_CACHE_DIR``; None otherwise (Triton 3.6's ``get_group`` drops missing files silently)."""
    from triton import knobs
    from triton.runtime.cache import get_cache_manager

    if name not in files or not any(not f.endswith(".json") for f in files):
        return None
    group = get_cache_manager(hash_).get_group(name)
    if not group or any(f not in group for f in files):
        return None
    root = os.path.join(os.path.abspath(knobs.cache.dir), "")
    for f in files:
        p = os.path.abspath(group[f])
        if not p.startswith(root) or not os.path.isfile(p):
            return None
    return {f: group[f] for f in files}


def source_stub(req: Any) -> Any:
    """What ``CompiledKernel`` and Triton's launcher read from a kernel's ``@triton.jit`` function: its name and
    parameter names (the launch path never reads more), so that a hit needs no import of the kernel module."""
    return types.SimpleNamespace(__name__=req.kernel, arg_names=list(req.signature), launch_metadata=None)


def load(req: Any, fn: Any = None) -> Any | None:
    """Triton's ``CompiledKernel`` for ``req`` built from the group the index names, without ``triton.compile``;
    ``fn`` the kernel's ``JITFunction`` when loaded (else a stub stands in). None on any doubt."""
    found = lookup(req)
    if found is None:
        return None
    hash_, group = found
    try:
        from triton.compiler import ASTSource, CompiledKernel

        src = ASTSource(
            fn if fn is not None else source_stub(req),
            dict(req.signature),
            dict(req.constexprs),
            dict(req.attrs),
        )
        kernel = CompiledKernel(src, group, hash_)
        md = kernel.metadata
        target = (md.target.backend, md.target.arch, md.target.warp_size)
        if (
            md.name != req.kernel
            or target != tuple(req.target)
            or getattr(md, "hash", hash_) != hash_
            or md.num_warps != req.options.get("num_warps", md.num_warps)
        ):
            log.debug("kiln: binary index entry of %s does not match its group's metadata", req.kernel)
            return None
        return kernel
    except Exception as e:  # noqa: BLE001 - unreadable files, another CompiledKernel: today's path
        log.debug("kiln: binary index load of %s failed: %s", req.kernel, e)
        return None


def record(req: Any, kernel: Any) -> bool:
    """Note that ``kernel`` (a ``CompiledKernel`` of ``req`` from ``triton.compile``) lives in its Triton cache
    group; True when an entry was written. Never raises."""
    if mode() != "1" or not usable():
        return False
    try:
        name = group_name(req)
        group = getattr(kernel, "metadata_group", None)
        hash_ = getattr(kernel, "hash", None)
        if not isinstance(group, dict) or name not in group or not isinstance(hash_, str):
            return False
        files = sorted(group)
        if (
            _group(hash_, name, files) is None
        ):  # what a later lookup will check: the files are where Triton keeps them
            return False
        fp = request_toolchain(req)
        payload = json.dumps(
            {
                "format": FORMAT,
                "key": req.key,
                "toolchain": fp,
                "hash": hash_,
                "group": name,
                "files": files,
                "kernel": req.kernel,
            },
            sort_keys=True,
        ).encode()
        cache.write_entry(entry_path(req.key, fp), payload)
        _writes[0] += 1
        if _writes[0] % EVICT_EVERY == 1:
            cache.evict(folder(), SUFFIX, MAX_BYTES)
        return True
    except Exception as e:  # noqa: BLE001 - an optimization for the next process: never fail this launch
        log.debug("kiln: binary index write for %s failed: %s", getattr(req, "kernel", "?"), e)
        return False


def info() -> dict[str, Any]:
    listed = cache.entries(folder(), SUFFIX)
    return {
        "folder": folder(),
        "entries": len(listed),
        "bytes": sum(s for _, s, _ in listed),
        "max_bytes": MAX_BYTES,
        "state": mode(),
    }


def clear() -> int:
    _writes[0] = 0
    return cache.clear(folder(), SUFFIX)
