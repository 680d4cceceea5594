"""Kernels that differ only in name and comments (the layers of a model) share one kernel per graph."""

import torch

import compiler
from compiler.codegen.dedup import body_key, share_identical
from compiler.codegen.triton_kernel import KernelSource
from compiler.runtime.launcher import TritonKernel


class Layer(torch.nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.lin(self.norm(x)))


def test_repeated_layers_share_kernels_and_compute_the_same(device):
    model = torch.nn.Sequential(*[Layer() for _ in range(4)]).to(device)
    x = torch.randn(4, 8, 32, device=device, requires_grad=True)
    with compiler.capture() as graphs:
        out = torch.compile(model, backend="kiln")(x)
        out.sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    ref = model(x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, [x.grad] + [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g in graphs:
        modules = {m.name for m in g.wrapper.children() if isinstance(m, TritonKernel)}
        assert modules == set(g.kernel_sources)
        bodies = {
            body_key(KernelSource(n, s, [], [], 0, 0, False, [], [])) for n, s in g.kernel_sources.items()
        }
        assert len(bodies) == len(g.kernel_sources)
    assert sum(g.kernel_count for g in graphs) > sum(len(g.kernel_sources) for g in graphs)


def _ks(name: str, buf: str, hint: str = "inner") -> KernelSource:
    src = f"import triton\n\n@triton.jit\ndef {name}(in_ptr0, xnumel, XBLOCK: tl.constexpr):\n    # in_ptr0 -> {buf}\n    pass\n"
    return KernelSource(name, src, [("in_ptr0", buf)], [], 8, 1, False, [], [buf], hint)


def test_duplicates_take_the_first_name_and_keep_their_buffers():
    kernels = share_identical([_ks("k_a_1", "buf1"), _ks("k_b_2", "buf7"), _ks("k_c_3", "buf9", "outer")])
    assert [k.name for k in kernels] == ["k_a_1", "k_a_1", "k_c_3"]
    assert kernels[1].source == kernels[0].source and kernels[1].ptr_args == [("in_ptr0", "buf7")]
