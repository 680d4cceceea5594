"""Signed cache entries (compiler/runtime/cache.py, ``cache_auth``/``cache_key``/``cache_key_file``): with a key an
entry is loaded only when its HMAC matches, so a job without the key cannot forge one, however well it recomputes
a checksum; ``cache_auth`` without a key loads and writes nothing; without either, checked entries as before. And a
kernel file changed on disk never changes the kernel that runs. On CPU through the interpreter."""

from __future__ import annotations

import hashlib
import os

import torch

import compiler
from compiler import config
from compiler.runtime import cache, graph_cache
from kiln_testing import DEVICE


def _fn(x):
    return x * 3.0 + 1.0


def _run(x):
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        out = torch.compile(_fn, backend="kiln")(x)
    return [g.cache for g in graphs], out


def _entries(folder):
    return sorted(folder.glob("*" + graph_cache.SUFFIX)) if folder.is_dir() else []


def test_a_signed_entry_loads_only_with_its_key(tmp_path):
    path = str(tmp_path / "e.kgc")
    with config.patch(cache_key="k1"):
        cache.write_entry(path, b"payload")
        with open(path, "rb") as f:
            data = f.read()
        assert data.startswith(cache.SIGNED_MAGIC) and cache.read_entry(path) == b"payload"
    with config.patch(cache_key="k2"):
        assert cache.read_entry(path) is None  # another key: not ours
    assert cache.read_entry(path) is None  # no key: a signature it cannot check is not trusted either
    forged = cache.ENTRY_MAGIC + hashlib.sha256(b"evil").digest() + b"evil"  # what anyone can make
    with open(path, "wb") as f:
        f.write(forged)
    assert cache.read_entry(path) == b"evil"  # without a key: integrity only, as before
    with config.patch(cache_key="k1"):
        assert cache.read_entry(path) is None  # with one: a checksum proves nothing
    assert "k1" not in repr(config.Settings(cache_key="k1"))


def test_the_key_may_come_from_a_file(tmp_path):
    key = tmp_path / "key"
    key.write_text("from-a-file\n")
    with config.patch(cache_key_file=str(key)):
        assert config.settings().cache_secret() == b"from-a-file"
    with config.patch(cache_key_file=str(tmp_path / "missing"), cache_auth=True):
        assert config.settings().cache_secret() is None and config.settings().cache_mode() == "0"
    assert config.from_env({"KILN_CACHE_AUTH": "1", "KILN_CACHE_KEY": "k"}).cache_mode() == "1"


def test_auth_without_a_key_loads_and_writes_nothing(gc_dir):
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    assert _run(x)[0] == ["stored"]  # an entry written without a key
    with config.patch(cache_auth=True):
        assert not graph_cache.enabled()
        caches, out = _run(x)
        assert caches == [""] and torch.equal(out, _fn(x))  # not loaded: compiled, and not stored
        path = str(gc_dir / "x.kgc")
        cache.write_entry(path, b"p")
        assert not os.path.exists(path) and cache.read_entry(str(_entries(gc_dir)[0])) is None


def test_with_a_key_the_graph_cache_hits_its_own_entries_and_misses_unsigned_ones(gc_dir):
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    assert _run(x)[0] == ["stored"]
    (unsigned,) = _entries(gc_dir)
    with config.patch(cache_auth=True, cache_key="main's key"):
        caches, out = _run(x)
        assert caches == ["stored"] and torch.equal(
            out, _fn(x)
        )  # same key (the key is no part of it): replaced
        assert _entries(gc_dir) == [unsigned] and unsigned.read_bytes().startswith(cache.SIGNED_MAGIC)
        assert _run(x)[0] == ["hit"]
    assert _run(x)[0] == ["stored"]  # a keyless job cannot use main's signed entry (nor forge one)


def test_a_kernel_file_changed_on_disk_never_changes_the_kernel(gc_dir):
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        torch.compile(_fn, backend="kiln")(x)
    (source,) = graphs[0].kernel_sources.values()
    path = cache.source_path(source)

    def on_disk() -> str:
        with open(path) as f:
            return f.read()

    assert on_disk() == source
    with open(path, "w") as f:  # another job with write access to the kernel folder
        f.write(source.replace("tl.full([], 1.0, tl.float32)", "tl.full([], 1000.0, tl.float32)"))
    cache._modules.clear()
    with config.patch(cache="0"):
        _, out = _run(x)
    assert torch.equal(out, _fn(x)) and on_disk() == source  # kiln's source ran; the file is whole again


def test_a_compile_worker_refuses_a_kernel_file_changed_on_disk(tmp_path):
    import pytest

    from compiler.runtime import compile_worker

    source = "def f():\n    return 1\n"
    name = "k" + hashlib.sha256(source.encode()).hexdigest()[:24]
    good = tmp_path / "good" / f"{name}.py"
    good.parent.mkdir()
    good.write_text(source)
    assert compile_worker.load_function(str(good), "f", "kiln_kernels.test_worker_good")() == 1
    bad = tmp_path / "bad" / f"{name}.py"
    bad.parent.mkdir()
    bad.write_text(source.replace("1", "1000"))  # the name of kiln's source, another job's text
    with pytest.raises(ValueError, match="does not hold the source its name hashes"):
        compile_worker.load_function(str(bad), "f", "kiln_kernels.test_worker_bad")
