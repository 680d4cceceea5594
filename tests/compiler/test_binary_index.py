"""The binary index (``runtime/binary_index.py``) on CPU: a first launch records which Triton cache group holds its
kernel; a fresh process loads that group with no ``triton.compile``, no ``triton_key()`` and no import of the
kernel's module; another toolchain, a damaged entry or a missing Triton file is a miss (today's path), and the
entry is written again; ``KILN_CACHE=read`` reads only, ``0`` neither reads nor writes.

Compiles run for GPUTarget("cuda", 90, 32) without a GPU (the binary is not loaded: ``_init_handles`` is replaced),
in subprocesses with the interpreter off where Triton must code-generate; this process (Triton's interpreter) only
finds kernels in Triton's cache. Each test has its own TRITON_CACHE_DIR and kiln cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from compiler import config
from compiler.runtime import binary_index, cache, compile_jobs, gpu_compile
from compiler.runtime.launcher import LazyJit, TritonKernel, source_params
from kiln_testing import gpu_jit_function, run_tagged_json

triton = pytest.importorskip("triton")
from triton import knobs  # noqa: E402 - triton is optional: imported after importorskip
from triton.backends.compiler import GPUTarget  # noqa: E402 - triton is optional: imported after importorskip
from triton.compiler import CompiledKernel  # noqa: E402 - triton is optional: imported after importorskip

SM90 = GPUTarget("cuda", 90, 32)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "kiln_pointwise_binidx_0123456789"
SOURCE = f"""import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def {NAME}(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0).to(tl.int32) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, libdevice.exp(tl.load(in_ptr0 + xindex, xmask)) * 3.0, xmask)
"""
CFG = {"XBLOCK": 1024, "num_warps": 4}

#: one first launch through the launcher (``_prepare`` + ``_compile_own``, as ``_launch_slow`` does on a GPU), with
#: the binary compiled for sm_90 and not loaded; counts ``triton.compile`` and ``triton_key`` calls
SCRIPT = r"""
import hashlib, json, os, sys
import torch
import compiler
from compiler.runtime import gpu_compile
from compiler.runtime.launcher import TritonKernel
import triton
import triton.runtime.cache as tcache
from triton.backends.compiler import GPUTarget
from triton.compiler import CompiledKernel

if os.environ.get("FAKE_TRITON_VERSION"):
    triton.__version__ = os.environ["FAKE_TRITON_VERSION"]
calls = {"compile": 0, "triton_key": 0}


def counted(name, module, attr):
    orig = getattr(module, attr)

    def wrapper(*a, **k):
        calls[name] += 1
        return orig(*a, **k)
    setattr(module, attr, wrapper)


counted("compile", triton, "compile")
counted("triton_key", tcache, "triton_key")
gpu_compile.device_target = lambda index: GPUTarget("cuda", 90, 32)
CompiledKernel._init_handles = lambda self: (setattr(self, "function", 1), setattr(self, "_run", print))
name, source = sys.argv[1], open(sys.argv[2]).read()
x = torch.randn(4096)
args = (x, torch.empty_like(x), 4096)
k = TritonKernel(name, source, ["in_ptr0", "out_ptr0"], [], False)
launch = k._prepare((4096,), 0, args)
kernel = k._compile_own(args, launch)
print("RESULT " + json.dumps({"stats": gpu_compile.compile_stats().__dict__, "calls": calls,
                              "modules": sorted(m for m in sys.modules if m.startswith("kiln_kernels.")),
                              "fn_loaded": k._fn is not None, "cubin": hashlib.sha256(kernel.kernel).hexdigest(),
                              "name": kernel.name, "lazy": type(launch.jit).__name__}))
"""


def first_launch(tmp_path, mode: str = "1", **env: str) -> dict:
    """Run SCRIPT in a fresh process with Triton's cache and kiln's caches in ``tmp_path``."""
    script, src = tmp_path / "first_launch.py", tmp_path / "kernel_source.py"
    script.write_text(SCRIPT)
    src.write_text(SOURCE)
    full = dict(
        os.environ,
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        KILN_CACHE_DIR=str(tmp_path / "kiln"),
        KILN_CACHE=mode,
        KILN_INTERPRET="0",
        TRITON_INTERPRET="0",
        KILN_COMPILE_THREADS="1",
        **env,
    )
    full["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(script), NAME, str(src)], env=full, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def entries(folder) -> list[str]:
    return (
        sorted(p for p in os.listdir(folder) if p.endswith(binary_index.SUFFIX))
        if os.path.isdir(folder)
        else []
    )


# ------------------------------------------------------------------------------------------ fresh processes
def test_a_fresh_process_loads_the_binary_without_compiling_or_importing(tmp_path):
    """Cold: compiled, recorded. Warm: the index's group, no triton.compile/triton_key, no kernel module, the same
    binary. Triton's entry removed: a miss, compiled again, the entry written again; then a hit again."""
    index = tmp_path / "kiln" / "binaries"
    cold = first_launch(tmp_path)
    assert (
        cold["stats"]["compiled"] == 1 and cold["stats"]["binary_hits"] == 0 and cold["calls"]["compile"] == 1
    )
    assert cold["modules"] and cold["fn_loaded"] and len(entries(index)) == 1

    warm = first_launch(tmp_path)
    assert warm["calls"] == {"compile": 0, "triton_key": 0}, warm
    assert (warm["stats"]["binary_hits"], warm["stats"]["cache_hits"], warm["stats"]["compiled"]) == (1, 1, 0)
    assert warm["modules"] == [] and not warm["fn_loaded"] and warm["lazy"] == "LazyJit"
    assert (warm["cubin"], warm["name"]) == (cold["cubin"], NAME)

    cubins = [p for p in (tmp_path / "triton").rglob("*.cubin")]
    assert len(cubins) == 1
    # Triton's entry of the kernel removed (its whole folder: Triton 3.6 itself takes a group with a file missing
    # for a hit and fails on it; the index's check of single files is tested in process below)
    shutil.rmtree(cubins[0].parent)
    before = (index / entries(index)[0]).stat().st_mtime_ns
    missing = first_launch(tmp_path)
    assert missing["stats"]["binary_hits"] == 0 and missing["calls"]["compile"] == 1 and missing["fn_loaded"]
    assert missing["cubin"] == cold["cubin"] and len(entries(index)) == 1
    assert (index / entries(index)[0]).stat().st_mtime_ns != before  # written again
    again = first_launch(tmp_path)
    assert again["stats"]["binary_hits"] == 1 and again["calls"] == {"compile": 0, "triton_key": 0}


def test_another_triton_version_misses_and_records_its_own_entry(tmp_path):
    index = tmp_path / "kiln" / "binaries"
    first_launch(tmp_path)
    other = first_launch(tmp_path, FAKE_TRITON_VERSION="0.0.0-other")
    # Triton's own key (its real version) still finds the binary: the index only missed
    assert (
        other["stats"]["binary_hits"] == 0
        and other["calls"]["compile"] == 1
        and other["stats"]["cache_hits"] == 1
    )
    assert len(entries(index)) == 2
    assert first_launch(tmp_path, FAKE_TRITON_VERSION="0.0.0-other")["stats"]["binary_hits"] == 1


# ------------------------------------------------------------------------------------------ in this process
@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A Triton cache holding the kernel for sm_90 (compiled in a fresh process, index off)."""
    folder = tmp_path_factory.mktemp("binidx")
    first_launch(folder, mode="0")
    return folder / "triton"


@pytest.fixture
def here(compiled, tmp_path, monkeypatch):
    """This process set up to find the kernel in ``compiled``: sm_90 target, binaries not loaded, fresh stats, the
    index in ``tmp_path``; yields a function making one first launch (``compile_launch``) and returning the kernel."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(compiled))
    monkeypatch.setitem(gpu_compile._OWN, "ok", True)
    monkeypatch.setattr(gpu_compile, "device_target", lambda index: SM90)
    monkeypatch.setattr(gpu_compile, "_loaded", {})
    monkeypatch.setattr(compile_jobs, "_pending", {})
    monkeypatch.setattr(
        CompiledKernel,
        "_init_handles",
        lambda self: (setattr(self, "function", 1), setattr(self, "_run", print)),
    )
    binary_index.forget_toolchain()
    gpu_compile.reset_compile_stats()
    fns = []

    def launch(**kw):
        gpu_compile._loaded.clear()  # each call a first launch, as in a new process
        x = torch.randn(4096)
        fn, arg_names = (jit, None) if kw.get("loaded") else (loader, names)
        return gpu_compile.compile_launch(
            NAME, path, fn, [x, torch.empty_like(x), 4096], dict(CFG), 0, arg_names
        )

    def loader():
        fns.append(jit)
        return jit

    with config.patch(cache="1", cache_dir=str(tmp_path / "kiln")):
        jit, path = jit_function(SOURCE, NAME)
        names = list(jit.arg_names)
        launch.loads, launch.jit, launch.path = fns, jit, path
        launch.index = tmp_path / "kiln" / "binaries"
        yield launch
    binary_index.forget_toolchain()
    gpu_compile.reset_compile_stats()


def jit_function(source: str, name: str):
    return gpu_jit_function(source, name, "binidx")


def no_compile(monkeypatch):
    monkeypatch.setattr(gpu_compile, "compile_here", lambda req, fn: pytest.fail("triton.compile was called"))


def stats() -> tuple[int, int, int]:
    s = gpu_compile.compile_stats()
    return s.cache_hits, s.binary_hits, s.compiled


def test_recorded_then_found_with_no_module_import(here, monkeypatch):
    first = here()
    assert first is not None and len(here.loads) == 1 and stats() == (1, 0, 0)
    assert len(entries(here.index)) == 1
    with monkeypatch.context() as m:
        no_compile(m)
        m.setattr(
            "triton.runtime.cache.get_cache_key", lambda *a, **k: pytest.fail("Triton's key was computed")
        )
        hit = here()
        assert hit is not first and hit.kernel == first.kernel and hit.name == NAME and hit.function == 1
        assert hit.src.fn.__name__ == NAME and hit.src.signature == first.src.signature
        assert len(here.loads) == 1 and stats() == (2, 1, 0)
        assert here(loaded=True) is not None and stats() == (
            3,
            2,
            0,
        )  # with the JITFunction at hand: the same
        req = gpu_compile.make_request(
            NAME,
            cache.source_path(SOURCE),
            list(hit.src.signature),
            [torch.randn(4096), torch.randn(4096), 4096],
            dict(CFG),
            SM90,
        )
        assert gpu_compile.on_disk(req, None)  # the ahead-of-time check asks the index first


def test_ahead_of_time_check_imports_the_module_only_without_an_entry(here):
    x = torch.randn(4096)
    req = gpu_compile.make_request(NAME, here.path, list(here.jit.arg_names), [x, x, 4096], dict(CFG), SM90)
    calls = []
    with config.patch(cache="0"):  # no index: Triton's key, from the imported JITFunction
        assert gpu_compile.on_disk(req, lambda: calls.append(1) or here.jit) and calls == [1]
    assert not gpu_compile.on_disk(
        gpu_compile.CompileRequest(**{**req.__dict__, "key": "other"}), lambda: fake_jit(["a"])
    )  # names that are not the request's: unsure
    here()
    assert gpu_compile.on_disk(req, lambda: pytest.fail("the module was imported"))


def fake_jit(names):
    return type("FakeJit", (), {"arg_names": names})()


def test_damaged_entry_is_a_miss_and_is_replaced(here, monkeypatch):
    here()
    (entry,) = entries(here.index)
    path = here.index / entry
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert cache.read_entry(str(path)) is None
    assert here() is not None and stats() == (2, 0, 0) and len(here.loads) == 2
    assert cache.read_entry(str(path)) is not None  # written again
    with monkeypatch.context() as m:
        no_compile(m)
        assert here() is not None and stats() == (3, 1, 0)


def test_entry_naming_another_kernel_or_a_missing_group_is_a_miss(here, monkeypatch):
    here()
    (entry,) = entries(here.index)
    path = here.index / entry
    payload = json.loads(cache.read_entry(str(path)))
    cache.write_entry(
        str(path), json.dumps({**payload, "hash": hashlib.sha256(b"gone").hexdigest()}).encode()
    )
    assert here() is not None and stats() == (2, 0, 0)  # no such group in Triton's cache: compiled as before
    cache.write_entry(str(path), json.dumps({**payload, "files": payload["files"] + ["x.cubin"]}).encode())
    assert here() is not None and stats() == (3, 0, 0)
    cache.write_entry(str(path), json.dumps({**payload, "key": "another"}).encode())
    assert here() is not None and stats() == (4, 0, 0)
    with monkeypatch.context() as m:
        no_compile(m)
        assert here() is not None and stats() == (5, 1, 0)


def test_another_toolchain_misses(here, monkeypatch):
    here()
    installed = binary_index._installed()
    cases = [
        lambda m: m.setattr(binary_index, "_installed", lambda: {**installed, "triton": "0.0-other"}),
        lambda m: m.setattr(
            binary_index, "_installed", lambda: {**installed, "libtriton": installed["libtriton"][:2] + [1]}
        ),
        lambda m: m.setenv("TRITON_PTXAS_BLACKWELL_PATH", "/nonexistent/ptxas"),
        lambda m: m.setenv("TRITON_MOCK_PTX_VERSION", "12.0"),
        lambda m: m.setattr(
            binary_index,
            "_stat",
            lambda p, s=binary_index._stat: (  # another libdevice
                s(p) + [1] if p.endswith(".bc") else s(p)
            ),
        ),
    ]
    for i, change in enumerate(cases):
        with monkeypatch.context() as m:
            change(m)
            binary_index.forget_toolchain()
            assert here() is not None and stats()[1] == 0 and len(here.loads) == 2 + i, i
        binary_index.forget_toolchain()
    assert len(entries(here.index)) == 1 + len(cases)  # each toolchain its own entry
    with monkeypatch.context() as m:
        no_compile(m)
        assert here() is not None and stats()[1] == 1


def test_the_fingerprint_follows_tritons_environment_within_a_process(here, monkeypatch):
    base = binary_index.toolchain()
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/nonexistent/ptxas")
    assert binary_index.toolchain() != base
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    assert binary_index.toolchain() == base
    monkeypatch.setenv("TRITON_CACHE_DIR", "/nonexistent/triton")
    assert binary_index.toolchain() != base


def test_read_mode_reads_only_and_off_mode_neither(here, monkeypatch):
    with config.patch(cache="read"):
        here()
        assert entries(here.index) == []
    here()
    assert len(entries(here.index)) == 1
    (entry,) = entries(here.index)
    with config.patch(cache="read"):
        stamp = (here.index / entry).stat().st_mtime_ns
        with monkeypatch.context() as m:
            no_compile(m)
            assert here() is not None and stats()[1] == 1
        assert (here.index / entry).stat().st_mtime_ns == stamp  # not even touched
    with config.patch(cache="0"):
        assert not binary_index.usable()
        assert here() is not None and stats()[1] == 1 and len(here.loads) == 3
        assert len(entries(here.index)) == 1


def test_cache_command_lists_and_clears_the_index(here, capsys):
    from compiler.__main__ import main

    here()
    assert main(["cache", "info"]) == 0
    assert f"binary index (on): {here.index}: 1 entries" in capsys.readouterr().out
    assert main(["cache", "clear", "--only", "binaries"]) == 0
    assert "binary index: removed 1 entries" in capsys.readouterr().out and entries(here.index) == []


def test_compile_listener_or_always_compile_bypass_the_index(here, monkeypatch):
    here()
    monkeypatch.setattr(knobs.compilation, "always_compile", True)
    assert not binary_index.usable()
    monkeypatch.setattr(knobs.compilation, "always_compile", False)
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: None)
    assert not binary_index.usable()
    monkeypatch.setattr(knobs.compilation, "listener", None)
    assert binary_index.usable()


# ------------------------------------------------------------------------------------------ the launcher
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="compiles CPU graphs through the interpreter"
)
def test_launcher_parameter_names_are_the_kernels(device):
    """Without importing a kernel's module the launcher keys its request by the parameter names of the source's
    ``def`` line (else those kiln's renderer writes): for pointwise, reduction (inner, outer, looped), mixed and
    scan kernels both are the JITFunction's."""
    seen = []
    forward = TritonKernel.forward

    def recording(self, *args):
        seen.append((self, args))
        return forward(self, *args)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TritonKernel, "forward", recording)
        x = torch.randn(64, 300, device=device)
        torch.compile(
            lambda a: (
                torch.softmax(a * 2, -1),
                a.sum(0),
                a.cumsum(-1),
                torch.nn.functional.layer_norm(a, (300,)),
                (a - a.mean()).relu(),
            ),
            backend="kiln",
        )(x)
        torch.compile(lambda a: a.sum(-1), backend="kiln")(torch.randn(4, 100000, device=device))
    assert len({k.name for k, _ in seen}) >= 5
    for k, args in seen:
        ints = args[len(k.ptr_args) :]
        xnumel = ints[len(k.size_args)]
        rnumel = ints[-1] if k.reduction else 1
        real = list(k.jit_function().arg_names)
        assert source_params(k.source, k.name) == real
        for interp in (False, True):
            cfg = k.heuristic_config(xnumel, rnumel, interp)
            assert k.param_names(cfg) == real, k.name
            k._params = []  # no def line found: the renderer's order
            assert k.param_names(cfg) == real, k.name
            k._params = None
    assert source_params("def f(a, b: tl.constexpr = 4):\n", "f") == ["a", "b"]
    assert source_params("def f(a,\n      b):\n", "f") == ["a", "b"]
    assert source_params("def f(a: T(1)):\n", "f") is None and source_params("def g(a):\n", "f") is None


def test_gpu_launch_builds_the_jit_function_lazily(monkeypatch):
    """A GPU launch's ``Launch`` holds a ``LazyJit``: the kernel's module is imported at its first call
    (Triton's JIT fallback), once; a CPU launch imports it when prepared, as before."""
    imported = []

    class FakeJit:
        def __getitem__(self, grid):
            return lambda *a, **kw: ("launched", grid, a, kw)

    monkeypatch.setattr(cache, "load_kernel", lambda source, name: imported.append(name) or FakeJit())
    monkeypatch.setattr("compiler.runtime.launcher.multi_gpu", lambda: False)
    k = TritonKernel("kiln_lazy", "source", ["in_ptr0", "out_ptr0"], [], False)
    launch = k._prepare((4096,), 0, ())
    assert isinstance(launch.jit, LazyJit) and imported == [] and k._fn is None
    assert launch.jit(1, 2, XBLOCK=8) == ("launched", (launch.grid0,), (1, 2), {"XBLOCK": 8})
    assert launch.jit(3) == ("launched", (launch.grid0,), (3,), {}) and imported == ["kiln_lazy"]
    cpu = k._prepare((4096,), -1, ())
    assert not isinstance(cpu.jit, LazyJit) and imported == ["kiln_lazy"]
    other = TritonKernel("kiln_eager", "source", ["in_ptr0"], [], False)
    other._prepare((16,), -1, ())
    assert imported == ["kiln_lazy", "kiln_eager"]


GPU_SCRIPT = r"""
import json, sys, torch, compiler
from compiler.runtime import compile_stats
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                            torch.nn.Linear(64, 64)).cuda()
x = torch.randn(8, 16, 64, device="cuda", requires_grad=True)
out = torch.compile(model, backend="kiln")(x)
out.sum().backward()
grad, x.grad = x.grad.clone(), None
ref = model(x)
ref.sum().backward()
torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(grad, x.grad, rtol=1e-4, atol=1e-4)
print("STATS " + json.dumps({**compile_stats().__dict__,
                             "modules": sorted(m for m in sys.modules if m.startswith("kiln_kernels."))}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_warm_process_loads_every_kernel_through_the_index(tmp_path):
    """On a GPU: a warm process (graph cache and index written by a cold one) launches every kernel from the index:
    nothing compiled, nothing left to Triton's JIT, no kernel module imported, results as eager's."""
    script = tmp_path / "run.py"
    script.write_text(GPU_SCRIPT)
    env = dict(
        os.environ,
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        KILN_CACHE_DIR=str(tmp_path / "kiln"),
        XDG_CACHE_HOME=str(tmp_path / "xdg"),
        KILN_CACHE="1",
        KILN_COMPILE_THREADS="1",
        KILN_STRICT="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)

    def run() -> dict:
        return run_tagged_json([sys.executable, str(script)], env)

    cold = run()
    assert cold["compiled"] >= 2 and cold["binary_hits"] == 0 and cold["jit_compiles"] == 0, cold
    assert len(entries(tmp_path / "kiln" / "binaries")) == cold["compiled"] + cold["cache_hits"]
    warm = run()
    assert warm["graph_hits"] >= 2 and warm["compiled"] == 0 and warm["jit_compiles"] == 0, warm
    assert warm["binary_hits"] == warm["cache_hits"] >= cold["compiled"], warm
    assert warm["modules"] == [], warm


def test_tritons_platform_key_is_asked_once_a_process(monkeypatch):
    from triton.runtime import build

    from compiler.runtime import gpu_compile

    calls = []

    def key():
        calls.append(1)
        return "x86_64,Linux,64bit,ELF"

    monkeypatch.setattr(build, "platform_key", key)
    gpu_compile.memo_platform_key()
    assert build.platform_key() == build.platform_key() == "x86_64,Linux,64bit,ELF" and len(calls) == 1
    gpu_compile.memo_platform_key()  # a second call does not wrap the memo again
    assert build.platform_key.kiln_memo and build.platform_key() and len(calls) == 1
