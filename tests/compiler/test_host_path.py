"""The host-path profile with stubbed launches, and the launcher's lean GPU path against the path it replaced
(both run here on CPU tensors through ``stubbed_gpu_launches``: the kernel launch itself is a no-op)."""

import pytest
import torch

import compiler
from compiler import config
from compiler.runtime import launcher
from compiler.runtime.launcher import TritonKernel
from compiler.tools import host_path

#: the stubbed launches run kiln's kernels of CPU tensors: compiled only under Triton's interpreter (on a GPU box
#: a CPU graph falls back to ATen and launches nothing)
pytestmark = pytest.mark.skipif(not config.interpreting(), reason="needs Triton's interpreter (CPU kernels)")


def _compiled():
    def f(a, b, c):
        return torch.relu(a * b + c).sum(-1), (a - c).exp()

    a, b, c = (torch.randn(32, 48) for _ in range(3))
    with compiler.capture() as graphs:
        fn = torch.compile(f, backend="kiln")
        fn(a, b, c)
    return (lambda: fn(a, b, c)), graphs, (a, b, c)


class _Recording(host_path._NoopCompiled):
    calls: list[tuple] = []

    @staticmethod
    def run(*args):  # noqa: D102
        _Recording.calls.append(args)


@pytest.fixture
def recording(monkeypatch):
    _Recording.calls = []
    monkeypatch.setattr(TritonKernel, "_compile_own", lambda self, args, launch: _Recording())
    return _Recording.calls


def _launch_args(step, recording, lean: bool) -> list[tuple]:
    saved = launcher.LEAN[0]
    launcher.LEAN[0] = lean
    try:
        recording.clear()
        step()
        return list(recording)
    finally:
        launcher.LEAN[0] = saved


def test_lean_path_calls_the_launcher_with_the_pointers_addresses(recording):
    """The lean path hands Triton's launcher the old path's arguments (grid, stream, function, metadata, pointers,
    sizes, constexprs) with each pointer as its address, an int (Triton's launcher then neither calls
    ``data_ptr()`` nor asks the driver about it), and counts as a fast launch."""
    step, graphs, inputs = _compiled()
    with host_path.stubbed_gpu_launches():
        # stubbed_gpu_launches patched _compile_own too: re-patch with the recording stand-in
        TritonKernel._compile_own = lambda self, args, launch: _Recording()  # type: ignore[method-assign]
        step()  # first launches on device 0: the slow path makes the fast-path entries
        kernels = [m for g in graphs for m in g.wrapper.children() if isinstance(m, TritonKernel)]
        fast_before = sum(k.fast_launches for k in kernels)
        old = _launch_args(step, recording, lean=False)
        lean = _launch_args(step, recording, lean=True)
        assert sum(k.fast_launches for k in kernels) == fast_before + 2 * len(kernels)
    assert len(old) == len(lean) == len(kernels) >= 1
    addresses = set()
    for o, n in zip(old, lean):
        assert len(o) == len(n)
        assert n[:3] == (n[0], 1, 1) and n[3] == 0  # grid, stream 0 (stubbed)
        for a, b in zip(o, n):
            if isinstance(a, torch.Tensor):  # the old path passed the tensor, the lean one its address
                assert type(b) is int and b % 16 == a.data_ptr() % 16 == 0
                addresses.add(b)
            else:
                assert b == a
    # the graph's inputs keep their storage from step to step: their exact addresses are among those passed
    assert {t.data_ptr() for t in inputs} <= addresses


def test_lean_path_leaves_misaligned_pointers_to_the_exact_key(recording):
    """A pointer off 16-byte alignment misses the all-aligned entry: the launch takes the full path, which keys
    the compiled kernel by each pointer's alignment (Triton specializes on it)."""
    step, graphs, _ = _compiled()
    k = next(m for g in graphs for m in g.wrapper.children() if isinstance(m, TritonKernel))
    n = 64
    base = torch.randn(n + 1)
    with host_path.stubbed_gpu_launches():
        TritonKernel._compile_own = lambda self, args, launch: _Recording()  # type: ignore[method-assign]
        args = tuple([base[1:]] * k._nptr) + tuple([n] * (len(k.size_args) + 1 + int(k.reduction)))
        k(*args)
        k(*args)
        launch = k._launches[(args[k._nptr :], 0)]
        assert set(launch.compiled) == {(False,) * k._nptr}
    assert len(recording) == 2


def test_stubbed_launches_restore_everything():
    """The stubs go when the block ends: a CPU build's torch._C has no raw-stream getter again, a CUDA build's
    (a GPU-less machine with the package index's torch) has its own back."""
    saved = (torch.Tensor.get_device, TritonKernel._compile_own, launcher._raw_stream)
    stream = vars(torch._C).get("_cuda_getCurrentRawStream")
    with host_path.stubbed_gpu_launches():
        assert torch.randn(2).get_device() == 0
        assert torch._C._cuda_getCurrentRawStream(0) == 0  # the stub, whatever the build
    assert (torch.Tensor.get_device, TritonKernel._compile_own, launcher._raw_stream) == saved
    assert torch.randn(2).get_device() == -1
    assert vars(torch._C).get("_cuda_getCurrentRawStream") is stream


def test_profile_step_reports_every_phase():
    step, graphs, _ = _compiled()
    prof = host_path.profile_step(step, graphs, reps=2, samples=2, compare=True)
    kernels = sum(1 for g in graphs for m in g.wrapper.children() if isinstance(m, TritonKernel))
    assert prof.launches == kernels >= 1
    phases = prof.phases()
    assert set(phases) == {"outside", "fx", *host_path.KINDS}
    assert all(v >= 0 for v in phases.values())
    assert prof.per_launch_us > 0 and prof.old_per_launch_us is not None and prof.old_per_launch_us > 0
    assert prof.kinds_us["alloc"] > 0  # the outputs are allocated by the wrapper
    assert prof.step_us >= prof.outside_us


def test_node_kinds_of_a_wrapper():
    _, graphs, _ = _compiled()
    kinds = {host_path.node_kind(n) for n in graphs[0].wrapper.graph.nodes if n.op == "call_function"}
    assert "alloc" in kinds
