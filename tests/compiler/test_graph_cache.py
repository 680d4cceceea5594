"""The graph cache (compiler/runtime/graph_cache.py): hits rebuild what a fresh compile made, misses on a changed
setting or toolchain, damaged entries, the size bound, KILN_CACHE=0/read, dynamic shapes, cond, training graphs,
two processes at once, and ``python -m compiler cache``. All on CPU through the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import compiler
from compiler import config
from compiler.runtime import cache, compile_stats, fx_codec, graph_cache
from kiln_testing import DEVICE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fn(x, y):
    return torch.softmax(x * 2 + y, -1).sum(0), x.relu() @ y.t()


def _compile_run(fn, *args, dynamic=False):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=dynamic)
    with compiler.capture() as graphs:
        out = compiled(*args)
    return compiled, graphs, out


def _close(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def _entries(folder):
    return (
        sorted(p for p in os.listdir(folder) if p.endswith(graph_cache.SUFFIX))
        if os.path.isdir(folder)
        else []
    )


def test_hit_rebuilds_what_the_fresh_compile_made(gc_dir):
    x, y = torch.randn(8, 100, device=DEVICE), torch.randn(8, 100, device=DEVICE)
    _, first, out1 = _compile_run(_fn, x, y)
    assert [g.cache for g in first] == ["stored"] and len(_entries(gc_dir)) == 1
    _, second, out2 = _compile_run(_fn, x, y)
    assert [g.cache for g in second] == ["hit"]
    assert second[0].code == first[0].code
    assert second[0].kernel_sources == first[0].kernel_sources
    assert (second[0].kernel_launches, second[0].extern_count) == (
        first[0].kernel_launches,
        first[0].extern_count,
    )
    assert _close(out2, _fn(x, y)) and _close(out1, out2)
    stats = compile_stats()
    assert (stats.graph_hits, stats.graph_misses) == (1, 1)


@pytest.mark.parametrize("change", [{"emulate_eager_precision": True}, {"interp_persistent_rblock_max": 64}])
def test_a_codegen_setting_change_misses(gc_dir, change):
    x, y = torch.randn(8, 100, device=DEVICE), torch.randn(8, 100, device=DEVICE)
    _compile_run(_fn, x, y)
    with config.patch(**change):
        _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["stored"] and len(_entries(gc_dir)) == 2
    assert _close(out, _fn(x, y))
    with config.patch(log_fallbacks=True):  # no effect on what the passes make: still a hit
        _, graphs, _ = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["hit"]


@pytest.mark.parametrize("what", ["torch", "kiln"])
def test_a_version_change_misses(gc_dir, monkeypatch, what):
    x, y = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    _compile_run(_fn, x, y)
    if what == "torch":
        real = graph_cache.toolchain
        monkeypatch.setattr(graph_cache, "toolchain", lambda devices: {**real(devices), "torch": "9.9.9"})
    else:  # kiln's own source changed
        monkeypatch.setattr(graph_cache, "_source_hash", ["0" * 64])
    _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["stored"] and len(_entries(gc_dir)) == 2
    assert _close(out, _fn(x, y))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "foreign_json"])
def test_a_damaged_entry_is_ignored_and_replaced(gc_dir, damage):
    x, y = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    _compile_run(_fn, x, y)
    (name,) = _entries(gc_dir)
    path = os.path.join(gc_dir, name)
    data = open(path, "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    elif damage == "garbage":
        data = b"not an entry at all"
    with open(path, "wb") as f:
        f.write(data)
    if damage == "foreign_json":  # a well-formed file whose content is not a graph of this key
        cache.write_entry(path, b"\x05\x00\x00\x00\x00\x00\x00\x00{}[]x")
    _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["stored"]  # a miss, no error, and the entry written again
    assert _close(out, _fn(x, y))
    assert cache.read_entry(path) is not None
    _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["hit"] and _close(out, _fn(x, y))


def test_the_folder_stays_under_its_size_bound(gc_dir):
    os.makedirs(gc_dir)
    old = []
    for i in range(4):  # 4 x 300 KiB of older entries: with a real one, over a 1 MiB bound
        p = os.path.join(gc_dir, f"old{i}{graph_cache.SUFFIX}")
        cache.write_entry(p, os.urandom(300 << 10))
        os.utime(p, (time.time() - 1000 + i, time.time() - 1000 + i))
        old.append(p)
    with config.patch(cache_max_mb=1):
        _, graphs, _ = _compile_run(_fn, torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE))
    assert graphs[0].cache == "stored"
    total = sum(os.path.getsize(os.path.join(gc_dir, n)) for n in _entries(gc_dir))
    assert total <= 1 << 20
    assert not os.path.exists(old[0]) and os.path.exists(old[-1])  # least recently used first
    assert any(not n.startswith("old") for n in _entries(gc_dir))  # the new entry stays


def test_cache_off_and_read_only(gc_dir):
    x, y = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    with config.patch(cache="0"):
        _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == [""] and _entries(gc_dir) == [] and _close(out, _fn(x, y))
    assert compile_stats().graph_misses == 0
    with config.patch(cache="read"):
        _, graphs, _ = _compile_run(_fn, x, y)
    assert _entries(gc_dir) == []  # read-only never writes
    _compile_run(_fn, x, y)
    with config.patch(cache="read"):
        _, graphs, out = _compile_run(_fn, x, y)
    assert [g.cache for g in graphs] == ["hit"] and _close(out, _fn(x, y))
    assert config.from_env({"KILN_CACHE": "off"}).cache == "0"


def test_dynamic_shapes_through_a_cached_graph(gc_dir):
    x, y = torch.randn(8, 100, device=DEVICE), torch.randn(8, 100, device=DEVICE)
    _compile_run(_fn, x, y, dynamic=True)
    compiled, graphs, out = _compile_run(_fn, x, y, dynamic=True)
    assert [g.cache for g in graphs] == ["hit"] and _close(out, _fn(x, y))
    for shape in [(3, 7), (5, 33), (1, 129)]:
        a, b = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
        assert _close(compiled(a, b), _fn(a, b)), shape


def test_a_cond_graph_is_cached_with_its_compiled_branches(gc_dir):
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: (t * 2).sin(), lambda t: (t - 1).cos(), (x,))

    x = torch.randn(4, 8, device=DEVICE)
    _, first, _ = _compile_run(f, x)
    compiled, second, out = _compile_run(f, x)
    assert [g.cache for g in second] == ["hit"]
    assert len(second[0].subgraphs) == len(first[0].subgraphs) >= 2
    assert [s.kernel_sources for s in second[0].subgraphs] == [s.kernel_sources for s in first[0].subgraphs]
    for t in (x, -x.abs() - 1, x.abs() + 1):
        assert _close(compiled(t), f(t))


def test_training_graphs_hit_forward_and_backward(gc_dir):
    def run():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4)
        ).to(DEVICE)
        inp = torch.randn(8, 16, device=DEVICE)
        torch._dynamo.reset()
        with compiler.capture() as graphs:
            torch.compile(model, backend="kiln")(inp).square().mean().backward()
        return graphs, [p.grad for p in model.parameters()]

    first, grads1 = run()
    second, grads2 = run()
    assert [g.cache for g in first] == ["stored", "stored"]
    assert [g.cache for g in second] == ["hit", "hit"]
    assert all(torch.allclose(a, b) for a, b in zip(grads1, grads2))


def test_a_graph_the_codec_cannot_store_is_skipped_with_a_reason(gc_dir, monkeypatch):
    monkeypatch.setattr(fx_codec, "_FUNCTION_NAMES", {})  # the wrapper's allocator is now an unknown function
    x, y = torch.randn(8, 100, device=DEVICE), torch.randn(8, 100, device=DEVICE)
    _, graphs, out = _compile_run(_fn, x, y)
    assert graphs[0].cache.startswith("not stored: Unsupported: call target"), graphs[0].cache
    assert _entries(gc_dir) == [] and compile_stats().graph_skips == 1 and _close(out, _fn(x, y))
    assert any("call target" in r for r in graph_cache.skipped())


_WORKER = textwrap.dedent("""
    import os, sys, time
    import torch, compiler
    from compiler.runtime import compile_stats
    go = sys.argv[1]
    while not os.path.exists(go):
        time.sleep(0.01)
    def f(x, y):
        return torch.softmax(x * 2 + y, -1).sum(0), x.relu() @ y.t()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.randn(6, 50, device=dev), torch.randn(6, 50, device=dev)
    with compiler.capture() as graphs:
        out = torch.compile(f, backend="kiln")(x, y)
    ref = f(x, y)
    ok = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out, ref))
    print("RESULT", ok, graphs[0].cache, compile_stats().graph_hits)
""")


def test_two_processes_compiling_one_graph_at_once(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        KILN_CACHE="1",
        KILN_GRAPH_CACHE_DIR=str(tmp_path / "graphs"),
        KILN_CACHE_DIR=str(tmp_path / "kernels"),
        KILN_STRICT="1",
    )
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(1.0)
    go.write_text("")
    outs = [p.communicate(timeout=300)[0] for p in procs]
    results = [next(line for line in o.splitlines() if line.startswith("RESULT")).split() for o in outs]
    assert [r[1] for r in results] == ["True", "True"], outs
    assert all(r[2] in ("stored", "hit") for r in results), results
    assert len(_entries(tmp_path / "graphs")) == 1
    assert not [n for n in os.listdir(tmp_path / "graphs") if n.endswith(".part")]  # no temporary file left
    third = subprocess.run(
        [sys.executable, str(script), str(go)], env=env, capture_output=True, text=True, timeout=300
    )
    assert "RESULT True hit 1" in third.stdout, third.stdout + third.stderr


def test_cache_command_info_and_clear(gc_dir, capsys):
    from compiler.__main__ import main

    _compile_run(_fn, torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"graph cache (on): {gc_dir}: 1 entries" in out
    assert main(["cache", "clear", "--only", "graphs"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out and _entries(gc_dir) == []
    assert main(["cache", "clear", "--only", "bogus"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "bogus" in err


def test_constants_are_stored_with_their_bytes_and_layout(gc_dir):
    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0], device=x.device) + 1

    x = torch.randn(4, 3, device=DEVICE)
    _, first, _ = _compile_run(f, x)
    compiled, second, out = _compile_run(f, x)
    assert [g.cache for g in second] == ["hit"] and _close(out, f(x))
    ((name, want),) = dict(first[0].wrapper.named_buffers()).items()
    have = dict(second[0].wrapper.named_buffers())[name]
    assert torch.equal(have, want)
    base = torch.arange(24.0, device=DEVICE).reshape(4, 6)
    view = base[1:, ::2]  # offset and strides of a view: kept, over a copy of its whole storage
    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    gm.register_buffer("c", view)
    blobs: list[bytes] = []
    back = fx_codec.decode_attr(fx_codec.encode_attr(gm.c, blobs), blobs)
    assert torch.equal(back, view) and back.stride() == view.stride()
    assert back.storage_offset() == view.storage_offset()


def test_a_graph_whose_passes_add_shape_guards_is_not_stored(gc_dir, monkeypatch):
    from compiler import backend

    def guarding(job):  # a pass that specializes on an input size: a guard Dynamo must keep
        val = next(
            n
            for n in job.gm.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        ).meta["val"]
        assert isinstance(val.shape[0], torch.SymInt)
        if val.shape[0] == 8:  # bool() of a symbolic comparison adds the guard
            pass

    monkeypatch.setattr(backend, "PASSES", [backend.Pass("guarding", "test", guarding), *backend.PASSES])
    x, y = torch.randn(8, 100, device=DEVICE), torch.randn(8, 100, device=DEVICE)
    _, graphs, out = _compile_run(_fn, x, y, dynamic=True)
    assert graphs[0].cache.startswith("not stored: kiln's passes added 1 shape guards"), graphs[0].cache
    assert _entries(gc_dir) == [] and _close(out, _fn(x, y))


def test_a_stored_kernel_that_is_not_triton_only_is_refused(gc_dir):
    import json
    import struct

    x, y = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    _compile_run(_fn, x, y)
    (name,) = _entries(gc_dir)
    path = os.path.join(gc_dir, name)
    payload = cache.read_entry(path)
    (n,) = struct.unpack_from("<Q", payload)
    header = json.loads(payload[8 : 8 + n])
    kernel = next(a for a in header["wrapper"]["attrs"].values() if a["kind"] == "kernel")
    kernel["source"] += "\nimport os\nos._exit(3)\n"  # a planted entry with a valid checksum
    text = json.dumps(header).encode()
    cache.write_entry(path, struct.pack("<Q", len(text)) + text + payload[8 + n :])
    _, graphs, out = _compile_run(_fn, x, y)  # still alive: the entry was refused, the graph compiled
    assert [g.cache for g in graphs] == ["stored"] and _close(out, _fn(x, y))


@pytest.mark.parametrize(
    "body", ["open('/etc/passwd')", "__import__('os')", "tl.__dict__", "x = lambda: 0", "import os"]
)
def test_kernel_source_check(body):
    good = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def k(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n"
        "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
        "    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xindex < xnumel), xindex < xnumel)\n"
    )
    fx_codec.check_kernel_source(good)
    with pytest.raises(fx_codec.Unsupported):
        fx_codec.check_kernel_source(good + f"    {body}\n")


def test_a_kernel_source_already_in_the_kernel_folder_is_not_parsed_again(tmp_path, monkeypatch):
    good = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def k2(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n"
        "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
        "    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xindex < xnumel) * 3, xindex < xnumel)\n"
    )
    bad = good + "    __import__('os')\n"
    parsed = []
    real = fx_codec._check_module
    monkeypatch.setattr(fx_codec, "_check_module", lambda src: (parsed.append(src), real(src)))
    monkeypatch.setattr(fx_codec, "_checked", set())
    with config.patch(cache_dir=str(tmp_path / "kernels")):
        fx_codec.check_kernel_source(good)  # not in the folder: parsed
        assert parsed == [good]
        fx_codec._checked.clear()
        cache.write_atomic(cache.source_path(good), good)  # as kiln writes a kernel it launches
        fx_codec.check_kernel_source(good)  # the same bytes as its file: taken as checked, no parse
        assert parsed == [good]
        cache.write_atomic(
            cache.source_path(bad), good
        )  # a file whose bytes differ from the source: parsed, refused
        with pytest.raises(fx_codec.Unsupported):
            fx_codec.check_kernel_source(bad)
        assert parsed == [good, bad]


def test_a_run_expected_warm_fails_when_the_graph_cache_answered_nothing(tmp_path):
    """KILN_EXPECT_WARM_CACHE=1 (`nox -s tests`' warm cache phase, tests/conftest.py): a session whose tests pass
    still fails, saying why, when kiln's graph cache answered no graph (here: a test that compiles none)."""
    env = {**os.environ, "KILN_EXPECT_WARM_CACHE": "1", "KILN_CACHE": "1", "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "tests/compiler/test_config.py::test_compile_threads_and_workers",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    assert "kiln graph cache, warm run: 0 hits (0 before AOTAutograd), 0 graphs compiled again" in proc.stdout
    assert "FAILED: a warm run must answer every stored graph from the cache" in proc.stdout
