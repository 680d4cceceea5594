"""kiln's own GPU compile path on CPU: requests match Triton's JIT, workers compile for sm_90 into the on-disk
cache, the launch's compile and a second process find them, errors name the kernel, one thread means no pool.

Compiles run for GPUTarget("cuda", 90, 32) without a GPU (as the compile check does); each test uses its own
TRITON_CACHE_DIR.
"""

from __future__ import annotations

import os

import pytest
import torch

import compiler
from compiler import backend
from compiler.exc import KernelCompileError
from compiler.runtime import cache, compile_jobs, compile_pool, compile_worker, gpu_compile, precompile
from compiler.runtime.launcher import TritonKernel
from kiln_testing import gpu_jit_function, run_tagged_json

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402 - triton is optional: imported after importorskip
from triton.compiler.compiler import make_backend  # noqa: E402 - triton is optional: imported after importorskip
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402 - triton is optional: imported after importorskip

SM90 = GPUTarget("cuda", 90, 32)


@pytest.fixture(autouse=True)
def _own_path_on(monkeypatch):
    monkeypatch.setitem(gpu_compile._OWN, "ok", True)  # a test that disables it must not leak into others


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    folder = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder))
    monkeypatch.setattr(compile_jobs, "_pending", {})
    gpu_compile.reset_compile_stats()
    yield folder
    gpu_compile.reset_compile_stats()


@pytest.fixture
def pool():
    p = compile_pool.CompilePool(2)
    yield p
    p.shutdown()


def jit_function(source: str, name: str):
    return gpu_jit_function(source, name, "jit")


def graph_kernels(fn, *inputs, dynamic=False):
    """Compile ``fn`` on CPU; return what the precompile pass saw for each graph and every launch's args."""
    seen, launches = [], []

    def record(lowering, kernels, wrapper):
        from compiler.ir import size_hints

        seen.append((lowering, list(kernels), wrapper, size_hints()))
        return 0

    forward = TritonKernel.forward

    def recording_forward(self, *args):
        launches.append((self, args))
        return forward(self, *args)

    mp = pytest.MonkeyPatch()
    mp.setattr(precompile, "precompile_graph", record)
    mp.setattr(TritonKernel, "forward", recording_forward)
    try:
        out = torch.compile(fn, backend="kiln", dynamic=dynamic)(*inputs)
    finally:
        mp.undo()
    return seen, launches, out


def first_launches(launches) -> dict:
    """Kernel name -> the arguments of its first launch (``graph_kernels``'s launches)."""
    first: dict = {}
    for kernel, args in launches:
        first.setdefault(kernel.name, args)
    return first


def jit_asks_for(fn, args, cfg):
    """What Triton's JIT passes to ``triton.compile`` for this launch: its own binder and ``_pack_args``."""
    be = make_backend(SM90)
    binder = create_function_from_signature(fn.signature, fn.params, be)
    kwargs = gpu_compile._jit_kwargs(cfg)
    bound, spec, _ = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(be, kwargs, bound, spec, None)
    return spec, options.__dict__, signature, constexprs, attrs


KERNEL_SOURCE = """import triton
import triton.language as tl


@triton.jit
def {name}(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, {width})
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * {factor}, xmask)
"""


def small_kernel(name: str, factor: float = 3.0, width: str = "XBLOCK") -> tuple[str, str]:
    return name, KERNEL_SOURCE.format(name=name, factor=factor, width=width)


def request(name, source, n=1024, target=SM90):
    fn, path = jit_function(source, name)
    x = torch.randn(n)
    return gpu_compile.make_request(
        name, path, fn.arg_names, [x, torch.empty_like(x), n], {"XBLOCK": 1024, "num_warps": 4}, target
    ), fn


# ------------------------------------------------------------------------------------------ requests
#: these compile CPU graphs and record their launches: on a GPU box CPU graphs run as ATen (no interpreter)
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="records kiln launches of CPU graphs, which need the Triton interpreter",
)


@needs_interpreter
@pytest.mark.parametrize("offset, n", [(0, 1024), (1, 1000), (0, 1), (3, 2**31 + 16)])
def test_request_is_what_tritons_jit_asks_for(offset, n, device):
    """Specialization, signature, constexprs, attrs and options equal those of Triton's own binder for the
    launches of a real graph, with pointers shifted off 16-byte alignment and the first int replaced."""
    _, launches, _ = graph_kernels(
        lambda x, w: (torch.softmax(x * 2, -1) * w, x.sum(0), w.exp() + 1),
        torch.randn(8, 100, device=device),
        torch.randn(100, device=device),
    )
    assert len(launches) >= 2
    for kernel, args in launches:
        fn, path = jit_function(kernel.source, kernel.name)
        tensors = [_shifted(a, offset) for a in args if isinstance(a, torch.Tensor)]
        ints = [a for a in args if not isinstance(a, torch.Tensor)]
        ints[0] = n
        xnumel = ints[len(kernel.size_args)]
        cfg = kernel.heuristic_config(xnumel, ints[-1] if kernel.reduction else 1, interp=False)
        spec, options, signature, constexprs, attrs = jit_asks_for(fn, tensors + ints, cfg)
        req = gpu_compile.make_request(kernel.name, path, fn.arg_names, tensors + ints, cfg, SM90)
        ours = [gpu_compile.specialize(a) for a in tensors + ints]
        assert ours == [tuple(s) for s in spec[: len(ours)]]
        assert (req.signature, req.constexprs, req.attrs, req.options) == (
            signature,
            constexprs,
            attrs,
            options,
        )


def _shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s shape and dtype, ``offset`` elements into a bigger buffer."""
    return torch.zeros(t.numel() + offset, dtype=t.dtype, device=t.device)[offset:].view(t.shape)


def test_pointer_and_int_specialization_of_every_dtype():
    be = make_backend(SM90)
    from triton._C.libtriton import native_specialize_impl

    for dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    ):
        t = torch.zeros(64, dtype=dtype)
        for view in (t, t[1:]):
            assert gpu_compile.specialize(view) == tuple(native_specialize_impl(be, view, False, True, True))
    for v in (0, 1, 2, 16, 17, 48, 2**31 - 1, 2**31, 2**40 + 16):
        assert gpu_compile.specialize(v) == tuple(native_specialize_impl(be, v, False, True, True))
    with pytest.raises(gpu_compile.Unsupported):
        gpu_compile.specialize(1.5)


def test_hand_built_request_agrees_without_tritons_pack_args(monkeypatch):
    name, source = small_kernel("kiln_test_pack")
    req, _ = request(name, source, n=1000)
    monkeypatch.delattr(JITFunction, "_pack_args")
    bare, _ = request(name, source, n=1000)
    assert (bare.signature, bare.constexprs, bare.options) == (req.signature, req.constexprs, req.options)
    assert {k: v for k, v in bare.attrs.items() if v} == {k: v for k, v in req.attrs.items() if v}
    assert bare.attrs[(0,)] == [["tt.divisibility", 16]] and (2,) in bare.attrs and not bare.attrs[(2,)]


@needs_interpreter
@pytest.mark.parametrize("dynamic", [False, True])
def test_ahead_of_time_request_is_the_first_launchs(dynamic, device):
    """The request the precompile pass builds from sizes and dtypes (pointers guessed aligned unless the
    input's storage offset says otherwise) equals the one the first launch builds from its arguments."""
    base = torch.randn(16 * 100 + 1, device=device)
    x = base[1:].view(16, 100)  # a misaligned input pointer
    seen, launches, _ = graph_kernels(
        lambda x, w: torch.softmax(x * 2, -1) * w + x.sum(),
        x,
        torch.randn(100, device=device),
        dynamic=dynamic,
    )
    first = first_launches(launches)
    compared = 0
    for lowering, kernels, wrapper, hints in seen:
        for ks in kernels:
            req, fn = precompile.request_for(ks, getattr(wrapper, ks.name), lowering, hints, SM90)
            args = first[ks.name]
            k = getattr(wrapper, ks.name)
            ints = [a for a in args if not isinstance(a, torch.Tensor)]
            cfg = k.heuristic_config(
                ints[-2] if k.reduction else ints[-1], ints[-1] if k.reduction else 1, interp=False
            )
            launch = gpu_compile.make_request(
                ks.name, cache.source_path(ks.source), fn().arg_names, args, cfg, SM90
            )
            assert req.key == launch.key, (ks.name, req.attrs, launch.attrs)
            compared += 1
    assert compared >= 2
    assert any(
        not r
        for r in [
            gpu_compile.specialize(a)[1] for _, args in launches for a in args if isinstance(a, torch.Tensor)
        ]
    )  # the misaligned input was seen


@needs_interpreter
def test_combo_and_its_parts_are_sent_ahead_with_the_requests_their_first_launch_makes(device):
    """A combo kernel's first launch on a GPU times the combo against its parts, so the precompile pass sends
    both: each part's request and the combo's own (its ``XBLOCK_p<k>`` constexprs after its arguments), equal
    to what the launches build from their arguments and to what Triton's JIT asks ``triton.compile`` for."""
    from compiler.codegen.kernels import ComboSource
    from compiler.runtime.combo import ComboKernel

    torch._dynamo.reset()
    args = (
        torch.randn(100, device=device),
        torch.randn(7, 5, device=device),
        torch.randn(50, 3, device=device),
    )
    seen, launches, _ = graph_kernels(lambda a, b, c: (a * 2 + 1, b.sigmoid() * 3, (c - 1).relu()), *args)
    first = first_launches(launches)
    combos = 0
    for lowering, kernels, wrapper, hints in seen:
        for cs in kernels:
            if not isinstance(cs, ComboSource):
                continue
            combos += 1
            ck = getattr(wrapper, cs.name)
            assert isinstance(ck, ComboKernel)
            jobs = precompile.requests_for(cs, ck, lowering, hints, SM90, precompile.input_metas(lowering))
            assert [r.kernel for r, _ in jobs] == [p.name for p in cs.parts] + [cs.name]
            req = jobs[-1][0]
            a = first[cs.name]
            cfg = ck.combo_config(tuple(x for x in a if not isinstance(x, torch.Tensor)), False)
            fn, _ = jit_function(cs.source, cs.name)  # a JITFunction, also under the interpreter
            launch = gpu_compile.make_request(
                cs.name, cache.source_path(cs.source), fn.arg_names, a, cfg, SM90
            )
            assert req.key == launch.key
            assert list(fn.arg_names[-len(cs.parts) :]) == [f"XBLOCK_p{k}" for k in range(len(cs.parts))]
            _, options, signature, constexprs, attrs = jit_asks_for(fn, a, cfg)
            assert (req.signature, req.constexprs, req.attrs) == (signature, constexprs, attrs)
            assert dict(req.options) == options
    assert combos == 1


def test_constexpr_names_put_a_combos_part_blocks_after_kilns_own_in_part_order():
    cfg = {"XBLOCK_p10": 8, "num_warps": 4, "XBLOCK_p2": 64, "XBLOCK_p0": 128}
    assert gpu_compile.constexpr_names(cfg) == ["XBLOCK_p0", "XBLOCK_p2", "XBLOCK_p10"]
    assert gpu_compile.constexpr_names({"RBLOCK": 8, "XBLOCK": 1, "num_stages": 1}) == ["XBLOCK", "RBLOCK"]


# ------------------------------------------------------------------------------------------ the pool
def test_pool_compiles_for_sm90_and_a_second_compile_hits_the_cache(triton_cache, pool):
    name, source = small_kernel("kiln_test_pool")
    req, fn = request(name, source)
    assert not gpu_compile.on_disk(req, fn)
    first = pool.submit(req.wire(gpu_compile.cache_env()), req.label).result(timeout=300)
    assert first["ok"] and not first["hit"]
    assert any(p.name.endswith(".cubin") for p in triton_cache.rglob("*"))
    assert gpu_compile.on_disk(req, fn)
    again = pool.submit(req.wire(gpu_compile.cache_env()), req.label).result(timeout=300)
    assert again["ok"] and again["hit"]
    other = compile_pool.CompilePool(1)  # a fresh process: compiles nothing it has seen
    try:
        assert other.submit(req.wire(gpu_compile.cache_env()), req.label).result(timeout=300)["hit"]
    finally:
        other.shutdown()
    kernel, hit = gpu_compile.compile_here(req, fn)  # this process's own compile: the same cache key
    assert hit is True and kernel.metadata.target.arch == 90


def _wrapped_ptxas(folder) -> str:
    """A ptxas that runs Triton's own but reports one more line of version (so its cache keys differ), as
    PyTorch's bundled ptxas differs from Triton's."""
    from triton import knobs

    real = knobs.nvidia.ptxas.path
    wrapper = folder / "ptxas"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then "{real}" --version; echo "kiln test wrapper"; exit 0; fi\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_worker_follows_a_ptxas_set_after_it_started(triton_cache, pool, tmp_path, monkeypatch):
    """Inductor sets TRITON_PTXAS_PATH in a process on its first compile there; kiln's workers, started before
    and with Triton's ptxas version memoized, must then compile under the parent's keys (the parent's own
    compile finds the worker's kernel)."""
    from triton.backends.nvidia import compiler as nvidia

    name, source = small_kernel("kiln_test_ptxas_before")
    req, _ = request(name, source)
    assert pool.submit(req.wire(gpu_compile.cache_env()), req.label).result(timeout=300)["ok"]  # memos filled
    ptxas = _wrapped_ptxas(tmp_path)
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):  # the one Triton reads for sm_90 varies
        monkeypatch.setenv(var, ptxas)
    nvidia.get_ptxas_version.cache_clear()  # a parent whose first key comes after the variable was set
    name, source = small_kernel("kiln_test_ptxas_after", factor=7.0)
    req, fn = request(name, source)
    env = gpu_compile.cache_env()
    assert env["TRITON_PTXAS_PATH"] == ptxas and env["TRITON_MOCK_PTX_VERSION"] is None
    answers = [pool.submit(req.wire(env), req.label).result(timeout=300) for _ in range(2)]  # both workers
    assert all(a["ok"] for a in answers) and not answers[0]["hit"] and answers[1]["hit"]
    kernel, hit = gpu_compile.compile_here(req, fn)
    assert hit is True and "kiln test wrapper" in nvidia.get_ptxas_version(90)
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH")
    compile_worker.follow_ptxas_env()  # unset again: the next key is Triton's own ptxas's
    assert "kiln test wrapper" not in nvidia.get_ptxas_version(90)


@needs_interpreter
def test_a_gpu_compile_works_after_interpreted_reductions(triton_cache):
    """An interpreted reduction calls its combine function (a jit function) from the kernel; the interpreter's
    patches for that call are undone when it returns (``interp_libdevice.restore_language_after_launches``), so
    ``triton.language`` is Triton's own again and a real compile for sm_90 in the same process works."""
    import triton.language as tl

    builtins = {name: getattr(tl.core, name) for name in ("program_id", "arange", "load", "mul", "reduce")}
    torch._dynamo.reset()
    x = torch.randn(64, 300)
    got = torch.compile(lambda t: torch.softmax(t, -1) * t.sum(0), backend="kiln")(x)
    torch.testing.assert_close(got, torch.softmax(x, -1) * x.sum(0))
    assert {name: getattr(tl.core, name) for name in builtins} == builtins
    name, source = small_kernel("kiln_test_after_interp", factor=2.0)
    req, fn = request(name, source)
    kernel, _ = gpu_compile.compile_here(req, fn)
    assert kernel.metadata.target.arch == 90


def test_first_launch_waits_for_the_worker_and_loads_its_result(triton_cache, pool, monkeypatch):
    """compile_launch (the launcher's compile-on-miss) finds the worker's job by its request and the
    worker's kernel in the cache: one compile in all, done by the worker."""
    name, source = small_kernel("kiln_test_launch", factor=5.0)
    req, fn = request(name, source)
    monkeypatch.setattr(compile_pool, "_pool", pool)
    monkeypatch.setattr(gpu_compile, "device_target", lambda index: SM90)
    monkeypatch.setattr(
        triton.compiler.CompiledKernel,
        "_init_handles",  # no GPU to load the binary on
        lambda self: (setattr(self, "function", 1), setattr(self, "_run", print)),
    )
    precompile.submit(req)
    assert compile_jobs.pending() == 1
    x = torch.randn(1024)
    kernel = gpu_compile.compile_launch(
        name, req.path, fn, [x, torch.empty_like(x), 1024], {"XBLOCK": 1024, "num_warps": 4}, 0
    )
    assert kernel is not None and kernel.function == 1 and compile_jobs.pending() == 0
    s = gpu_compile.compile_stats()
    assert (s.compiled, s.worker_compiles, s.worker_misses, s.cache_hits, s.submitted) == (1, 1, 0, 0, 1)
    assert s.worker_seconds > 0 and gpu_compile._OWN["ok"]
    assert compiler.runtime.compile_stats() == s
    # another specialization (a misaligned pointer, an odd size): no worker job, compiled here
    # (this process runs Triton's interpreter, which cannot code-generate: record the request instead)
    asked = []
    monkeypatch.setattr(gpu_compile, "compile_here", lambda r, f: (asked.append(r) or kernel, False))
    assert (
        gpu_compile.compile_launch(
            name, req.path, fn, [x[1:], torch.empty_like(x), 1023], {"XBLOCK": 1024, "num_warps": 4}, 0
        )
        is kernel
    )
    assert asked[0].attrs[(0,)] == [] and asked[0].attrs[(2,)] == [] and asked[0].key != req.key
    s = gpu_compile.compile_stats()
    assert (s.compiled, s.worker_compiles, s.cache_hits) == (2, 1, 0)


def test_worker_compile_error_names_the_kernel(triton_cache, pool):
    name, source = small_kernel("kiln_test_broken", width="3")  # arange of a non-power-of-two: no compile
    req, _ = request(name, source)
    fut = pool.submit(req.wire(gpu_compile.cache_env()), req.label)
    with pytest.raises(KernelCompileError, match="kiln_test_broken for cuda sm_90.*power of 2") as info:
        fut.result(timeout=300)
    assert not info.value.worker_failed
    compile_jobs.add(req, fut)
    with pytest.raises(KernelCompileError, match="kiln_test_broken"):
        compile_jobs.wait_for(req)


def test_a_lost_worker_fails_its_job_only(triton_cache, pool):
    name, source = small_kernel("kiln_test_crash")
    source += "\nimport os\nos._exit(3)\n"  # the worker dies importing the module
    req, _ = request(name, source.replace("os._exit(3)", "pass"))
    crash = gpu_compile.CompileRequest(**{**req.__dict__, "path": cache.source_path(source)})
    cache.write_atomic(crash.path, source)
    fut = pool.submit(crash.wire(gpu_compile.cache_env()), crash.label)
    with pytest.raises(KernelCompileError, match="kiln_test_crash.*exited with code 3") as info:
        fut.result(timeout=300)
    assert info.value.worker_failed
    compile_jobs.add(crash, fut)
    assert compile_jobs.wait_for(crash) is None  # the launch then compiles in-process
    assert pool.submit(req.wire(gpu_compile.cache_env()), req.label).result(timeout=300)["ok"]
    missing = gpu_compile.CompileRequest(**{**req.__dict__, "path": str(triton_cache / "gone.py")})
    with pytest.raises(KernelCompileError, match="kiln_test_crash.*FileNotFoundError") as info:
        pool.submit(missing.wire(gpu_compile.cache_env()), missing.label).result(timeout=300)
    assert info.value.worker_failed  # not the kernel's fault: the launch compiles it in-process


def test_warm_up_starts_every_worker_before_any_job(pool):
    import time

    pool.warm_up()
    deadline = time.monotonic() + 120
    while pool.started < pool.size and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.started == 2 and len(pool._procs) == 2
    pool.warm_up()  # idempotent
    assert len(pool._threads) == 2


def test_warm_up_only_for_gpu_graphs_with_workers(monkeypatch):
    warmed = []
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(
        compile_pool, "get_pool", lambda: type("P", (), {"warm_up": lambda self: warmed.append(1)})()
    )
    with compiler.config.patch(compile_threads=4, compile_workers=4):
        assert not precompile.warm_up([torch.randn(2), 3])  # CPU graphs compile nothing
        monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
        assert precompile.warm_up([torch.randn(2)])
    with compiler.config.patch(compile_threads=1):
        assert not precompile.warm_up([torch.randn(2)])
    assert warmed == [1]


def test_warm_up_computes_tritons_cache_key_once_in_the_background(monkeypatch):
    """A GPU graph's warm-up starts one thread that computes Triton's cache key (``triton_key``), which the
    precompile pass's first ``on_disk`` would otherwise compute after the graph was traced; once per process."""
    from compiler.runtime import compile_worker

    calls = []
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(compile_pool, "get_pool", lambda: type("P", (), {"warm_up": lambda self: None})())
    monkeypatch.setattr(compile_worker, "prime_triton_key", lambda: calls.append(1) or True)
    monkeypatch.setattr(precompile, "_primed", [])
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
    with compiler.config.patch(compile_threads=4, compile_workers=4):
        assert precompile.warm_up([torch.randn(2)]) and precompile.warm_up([torch.randn(2)])
    (thread,) = precompile._primed
    thread.join(timeout=60)
    assert calls == [1]


def test_prime_triton_key_fills_tritons_own_cache():
    """The worker (before it says it is ready) and the parent compute the key with Triton's own function, so
    that the compile that follows finds it cached."""
    import importlib

    from compiler.runtime import compile_worker

    homes = ("triton.runtime.cache", "triton.compiler.compiler")  # where Triton versions keep it
    key = next(k for k in (getattr(importlib.import_module(m), "triton_key", None) for m in homes) if k)
    key.cache_clear()
    assert compile_worker.prime_triton_key()
    assert key.cache_info().currsize == 1


# ------------------------------------------------------------------------------------------ when to use it
def test_no_workers_with_one_compile_thread_or_worker(monkeypatch):
    sent = []
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU
    monkeypatch.setattr(precompile, "_cuda_device", lambda ks, lowering: 0)
    monkeypatch.setattr(gpu_compile, "device_target", lambda index: SM90)
    monkeypatch.setattr(
        precompile,
        "request_for",
        lambda *a: (
            gpu_compile.CompileRequest("k", "p", {}, {}, {}, {}, ("cuda", 90, 32), f"key{len(sent)}"),
            None,
        ),
    )
    monkeypatch.setattr(gpu_compile, "on_disk", lambda req, fn: False)
    monkeypatch.setattr(precompile, "submit", lambda req: sent.append(req))
    monkeypatch.setattr(compile_pool, "get_pool", lambda: pytest.fail("no pool may be created"))
    kernels = [type("KS", (), {"name": "k"})()]
    wrapper = torch.nn.Module()
    wrapper.k = torch.nn.Module()
    for threads, workers in [(1, 8), (8, 1), (1, 1)]:
        with compiler.config.patch(compile_threads=threads, compile_workers=workers):
            assert compile_pool.pool_size() == 0 and not precompile.enabled()
            assert precompile.precompile_graph(None, kernels, wrapper) == 0
    assert sent == []
    with compiler.config.patch(compile_threads=4, compile_workers=4):
        assert compile_pool.pool_size() == 4
        assert precompile.precompile_graph(None, kernels, wrapper) == 1
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter compiles nothing
    with compiler.config.patch(compile_threads=4, compile_workers=4):
        assert precompile.precompile_graph(None, kernels, wrapper) == 0
    assert len(sent) == 1


def test_precompile_pass_runs_after_wrap():
    names = [p.name for p in backend.PASSES]
    assert names.index("precompile") == names.index("wrap") + 1


GPU_SCRIPT = """
import json, sys, torch, compiler
from compiler.runtime import compile_stats
sys.path.insert(0, {tests!r})
from test_dedup import Layer
torch.manual_seed(0)
model = torch.nn.Sequential(*[Layer(64) for _ in range(3)]).cuda()
x = torch.randn(8, 16, 64, device="cuda", requires_grad=True)
out = torch.compile(model, backend="kiln")(x)
out.sum().backward()
ref = model(x)
torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
print("STATS " + json.dumps(compile_stats().__dict__))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_kernels_compile_in_workers_and_a_second_process_compiles_nothing(tmp_path):
    import sys

    script = tmp_path / "run.py"
    script.write_text(GPU_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__))))
    env = dict(
        os.environ,
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        KILN_CACHE_DIR=str(tmp_path / "kiln"),
        KILN_COMPILE_THREADS="2",
        KILN_COMPILE_WORKERS="2",
        KILN_STRICT="1",
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)

    def run() -> dict:
        return run_tagged_json([sys.executable, str(script)], env)

    cold = run()
    assert cold["submitted"] >= 1 and cold["worker_compiles"] >= 1 and cold["worker_misses"] == 0, cold
    assert cold["jit_compiles"] == 0 and cold["compiled"] >= cold["worker_compiles"], cold
    warm = run()
    assert warm["compiled"] == 0 and warm["submitted"] == 0 and warm["jit_compiles"] == 0, warm
    assert warm["cache_hits"] >= cold["compiled"] and warm["skipped_on_disk"] >= 1, warm


def test_launch_sites_of_one_source_load_its_kernel_once_per_device(triton_cache, monkeypatch):
    """Two first launches of one request (two launch sites of a shared kernel source, as a model's repeated
    layers have) compile-or-load once on a device; another device loads its own."""
    name, source = small_kernel("kiln_test_shared_load", factor=7.0)
    req, fn = request(name, source)
    monkeypatch.setattr(gpu_compile, "device_target", lambda index: SM90)
    monkeypatch.setattr(gpu_compile, "_loaded", {})
    loads = []

    def load(r, f):
        kernel = type("Loaded", (), {"function": len(loads) + 1, "run": print})()
        loads.append(r.key)
        return kernel, True

    monkeypatch.setattr(gpu_compile, "compile_here", load)
    x = torch.randn(1024)
    cfg = {"XBLOCK": 1024, "num_warps": 4}
    first = gpu_compile.compile_launch(name, req.path, fn, [x, torch.empty_like(x), 1024], cfg, 0)
    again = gpu_compile.compile_launch(
        name, req.path, fn, [torch.randn(1024), torch.empty_like(x), 1024], cfg, 0
    )
    other = gpu_compile.compile_launch(name, req.path, fn, [x, torch.empty_like(x), 1024], cfg, 1)
    assert first is again and other is not first and loads == [req.key, req.key]
    s = gpu_compile.compile_stats()
    assert (s.cache_hits, s.shared_loads) == (2, 1)
