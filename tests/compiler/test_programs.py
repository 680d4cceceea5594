"""Regression tests from realistic programs (losses, norms, training steps) compared with eager."""

import copy

import torch
import torch.nn.functional as F

import compiler


def compiled_grads(fn, *args, dynamic=False):
    """Output and input gradients of ``fn(*args).sum()`` under kiln, and the same under eager."""
    results = []
    for compile_it in (True, False):
        leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        f = torch.compile(fn, backend="kiln", dynamic=dynamic) if compile_it else fn
        with compiler.config.patch(strict=True):
            out = f(*leaves)
            out.sum().backward()
        results.append((out.detach(), [a.grad for a in leaves if a.requires_grad]))
    return results


def test_normalize_backward_reads_saved_expand_with_eager_strides(device):
    # the forward saves `norm.clamp_min(eps).expand_as(x)` (stride 0 along the row); the backward was
    # traced against those strides, so the forward must not store it as a dense (rows, cols) buffer
    a, b = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
    fn = lambda a, b: F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    (out, grads), (ref, ref_grads) = compiled_grads(fn, a, b)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_graph_outputs_keep_eager_strides(device):
    x = torch.randn(4, 6, device=device)
    for fn in (
        lambda x: (x * 2)[:, ::2],
        lambda x: (x * 2).sum(-1, keepdim=True).expand(4, 6),
        lambda x: (x + 1).t(),
    ):
        with compiler.config.patch(strict=True):
            out = torch.compile(fn, backend="kiln")(x)
        torch.testing.assert_close(out, fn(x))
        assert out.stride() == fn(x).stride()


def test_bool_arithmetic_is_logic(device):
    # True + True is True in eager; a 1-bit integer add wraps to False
    m = torch.tensor([True, True, False, False], device=device)
    n = torch.tensor([True, False, True, False], device=device)
    for fn in (lambda m, n: m + n, lambda m, n: m * n, torch.maximum, torch.minimum):
        torch._dynamo.reset()
        with compiler.config.patch(strict=True):
            assert torch.equal(torch.compile(fn, backend="kiln")(m, n), fn(m, n))


def test_integer_and_bool_to_bfloat16(device):
    # c10 converts integers to bfloat16 through float32; the interpreter's direct cast reinterpreted bits
    x = torch.tensor([-300, -3, 0, 1, 7, 250, 9999], device=device)
    fn = lambda x: (x.to(torch.bfloat16) * 1.5, (x > 0).to(torch.bfloat16), x.to(torch.int32).bfloat16())
    with compiler.config.patch(strict=True):
        outs = torch.compile(fn, backend="kiln")(x)
    for out, ref in zip(outs, fn(x)):
        torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_patchify_reshape_under_dynamic_shapes(device):
    # sizes such as Max(1, s0 // (s0 // 4)) use torch's own sympy Max, not sympy.Max
    def patchify(x, p: int = 4):
        B, C, H, W = x.shape
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(B, (H // p) * (W // p), p * p * C) * 2

    f = torch.compile(patchify, backend="kiln", dynamic=True)
    for shape in ((2, 3, 8, 8), (3, 3, 8, 12)):
        x = torch.randn(*shape, device=device)
        with compiler.config.patch(strict=True):
            torch.testing.assert_close(f(x), patchify(x))


def test_arange_with_symbolic_start_step_and_float_sizes(device):
    fns = [
        lambda x: torch.arange(x.shape[0], 2 * x.shape[0], device=x.device) * x.long(),
        lambda x: torch.arange(0, x.shape[0], 2, dtype=torch.float32, device=x.device) + 1,
        lambda x: torch.arange(x.shape[0] // 2, x.shape[0], 1.5, device=x.device),
        lambda x: torch.arange(0.5, x.shape[0] * 0.5, 0.25, device=x.device),
    ]
    for fn in fns:
        torch._dynamo.reset()
        f = torch.compile(fn, backend="kiln", dynamic=True)
        for n in (7, 10):
            x = torch.randn(n, device=device)
            with compiler.config.patch(strict=True):
                torch.testing.assert_close(f(x), fn(x))


def test_kernels_using_data_dependent_scalars_launch_after_their_producer(device):
    # `x.sum().item()` and `nonzero(x).shape[0]` are symbols defined by extern calls; a kernel that uses one
    # must not be fused into a group launched before that call
    fns = [
        lambda x: torch.tensor(x.sum().item(), device=x.device) * x,
        lambda x: x[x > 0].sum() + torch.nonzero(x > 0).shape[0],
    ]
    x = torch.randn(10, device=device)
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        for fn in fns:
            torch._dynamo.reset()
            with compiler.config.patch(strict=True):
                torch.testing.assert_close(torch.compile(fn, backend="kiln")(x), fn(x))


def test_out_of_range_int_scalars_wrap_like_eager(device):
    # eager casts the scalar to the tensor's dtype (int8: -1000 -> 24); the literal was out of range in Triton
    x = torch.tensor([5, -100, 100], dtype=torch.int8, device=device)
    u = torch.tensor([0, 5, 255], dtype=torch.uint8, device=device)
    fn = lambda x, u: (x > -1000, x == 300, x + 300, x * 1000, u > -1, u == 261, u + 260)
    with compiler.config.patch(strict=True):
        outs = torch.compile(fn, backend="kiln")(x, u)
    for out, ref in zip(outs, fn(x, u)):
        assert torch.equal(out, ref)


def test_export_aot_module_with_parameters(device):
    # parameters require grad; the wrapper's `addmm.out` refused them under autograd
    from torch.export import Dim, export

    from compiler.aot import compile_exported

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(device)
    ep = export(m, (torch.randn(3, 4, device=device),), dynamic_shapes=({0: Dim("b")},))
    cm = compile_exported(ep)
    for n in (3, 7):
        x = torch.randn(n, 4, device=device)
        torch.testing.assert_close(cm(x), m(x).detach(), atol=1e-5, rtol=1e-5)


def test_slice_with_symbolic_start_backward(device):
    # the backward of x[:, n // 2:] is a slice_scatter whose start is a size expression (a SymScalar)
    fn = lambda x: (x[:, x.shape[1] // 2 :] * 2).exp().sum()
    f = torch.compile(fn, backend="kiln", dynamic=True)
    for shape in ((3, 8), (4, 11)):
        x = torch.randn(*shape, device=device, requires_grad=True)
        with compiler.config.patch(strict=True):
            f(x).backward()
        g = x.grad
        x.grad = None
        fn(x).backward()
        torch.testing.assert_close(g, x.grad)


def test_indexing_a_gathered_value(device):
    # an index of a gather: the gather's own index load reads the outer index's symbol, which was left
    # unbound ("size symbol indirect3 cannot be computed")
    x = torch.randn(5, 7, 6, device=device)
    idx = torch.randint(0, 6, (5, 7, 6), device=device)
    rows = torch.tensor([4, 0, 4], device=device)
    fns = [
        lambda x, i, r: x.gather(2, i)[r],
        lambda x, i, r: torch.roll(x.gather(0, i % 5), 1, 2),
        lambda x, i, r: x[r].gather(1, i[:3, :2]),
    ]
    for fn in fns:
        torch._dynamo.reset()
        with compiler.config.patch(strict=True):
            torch.testing.assert_close(torch.compile(fn, backend="kiln")(x, idx, rows), fn(x, idx, rows))


def test_pad_bounds_on_size_one_dims_fold(device):
    # a pad's bounds test at a constant index (a size-1 dim) is folded: the interpreter mis-typed the 0-d
    # comparison once combined into a load mask ("mask has unsupported dtype")
    for shape, pad in (((2, 1, 1), (0, 0)), ((3, 1), (0, 0, 0, 0)), ((2, 1, 5), (0, 0, 1, 1))):
        x = torch.randn(*shape, device=device)
        fn = lambda x, pad=pad: F.pad(x, pad, value=0.5) * 2
        torch._dynamo.reset()
        with compiler.config.patch(strict=True):
            torch.testing.assert_close(torch.compile(fn, backend="kiln")(x), fn(x))


def test_outputs_that_view_one_storage_share_one_buffer(device):
    # AOTAutograd rebuilds `t1` from `t0` with as_strided and the storage offset the graph returned; a
    # separate buffer for `t1` (offset 0 instead of 1) gave wrong values under dynamic shapes
    def fn(x):
        t0 = x[torch.tensor([0, x.shape[0] - 1, 0], device=x.device)]
        return t0, t0.narrow(2, 1, t0.shape[2] - 1), t0[:, 0]

    f = torch.compile(fn, backend="kiln", dynamic=True)
    for shape in ((2, 2, 3), (3, 4, 5)):
        x = torch.randn(*shape, device=device, requires_grad=True)
        with compiler.config.patch(strict=True):
            outs = f(x)
        for out, ref in zip(outs, fn(x)):
            torch.testing.assert_close(out, ref)
            assert out.stride() == ref.stride() and out.storage_offset() == ref.storage_offset()


def test_map_and_scan_fall_back_with_their_subgraphs(device):
    # the subgraph of a map/scan fallback is a get_attr the wrapper never registered (KeyError at wrap time)
    from torch._higher_order_ops.map import map as hop_map
    from torch._higher_order_ops.scan import scan

    xs, y = torch.randn(3, 4, 5, device=device), torch.randn(5, device=device)

    def step(c, xi):
        return c + xi, (c * xi).sum(-1, keepdim=True)

    fns = [
        (lambda xs, y: hop_map(lambda x, y: (x * y).sum(-1), xs, y), (xs, y)),
        (
            lambda x: scan(step, torch.zeros(4, device=x.device), x, dim=0),
            (torch.randn(5, 4, device=device),),
        ),
    ]
    for fn, args in fns:
        torch._dynamo.reset()
        with compiler.config.patch(strict=True):
            out = torch.compile(fn, backend="kiln")(*args)
        ref = fn(*args)
        for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            torch.testing.assert_close(o, r)


def test_roll_of_a_padded_size_one_dim(device):
    # the bounds test of the pad, at a computed (not literal) constant index, is a 0-d condition; combined
    # into a load mask with `&` the interpreter typed it int32 ("mask has unsupported dtype")
    fn = lambda x: torch.roll(F.pad(x.argmax(2, keepdim=True).float(), (0, 0)), -1, 2)
    x = torch.randn(1, 3, 4, device=device)
    with compiler.config.patch(strict=True):
        torch.testing.assert_close(torch.compile(fn, backend="kiln")(x), fn(x))


def test_gather_at_loaded_scalar_position_in_a_reduction(device):
    # cross-entropy's target gather reads at a position that comes only from scalar loads: the pointer was
    # 0-d under a block mask ("Mask argument cannot be block type if pointer argument is not a block")
    def fn(x):
        t = x.argmax(2, keepdim=True).float()
        target = (t.detach()[:, 0].abs() * 3).long().clamp(max=t.shape[1] - 1)
        return F.cross_entropy(t, target, label_smoothing=0.1)

    x = torch.randn(1, 2, 8, device=device)
    with compiler.config.patch(strict=True):
        torch.testing.assert_close(torch.compile(fn, backend="kiln")(x), fn(x))


def test_compiled_train_step_with_backward_inside(device):
    # loss.backward() inside a compiled function runs kiln's backward while Dynamo's frame hook is active;
    # Dynamo then traced kiln's wrapper and the Triton interpreter as user code (launch error)
    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(device)
    m2 = copy.deepcopy(m1)
    o1, o2 = torch.optim.SGD(m1.parameters(), lr=0.1), torch.optim.SGD(m2.parameters(), lr=0.1)

    def step(m, o, x, y):
        o.zero_grad(set_to_none=True)
        loss = F.mse_loss(m(x), y)
        loss.backward()
        o.step()
        return loss

    compiled = torch.compile(step, backend="kiln")
    for _ in range(2):
        x, y = torch.randn(5, 4, device=device), torch.randn(5, 2, device=device)
        with compiler.config.patch(strict=True):
            loss = compiled(m1, o1, x, y)
        torch.testing.assert_close(loss, step(m2, o2, x, y))
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b)


def test_parameters_updated_under_no_grad_get_no_gradient(device):
    # an EMA teacher updated in place under no_grad: its parameters' new values were graph outputs whose
    # backward passed the incoming tangents through, so they got zero gradients instead of None (an
    # optimizer then applies weight decay and momentum to them); input mutations now stay in the graph
    class Teacher(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                for pt, ps in zip(self.teacher.parameters(), self.student.parameters()):
                    pt.mul_(0.9).add_(ps.detach(), alpha=0.1)
                t = self.teacher(x).softmax(-1)
            return -(t * self.student(x).log_softmax(-1)).sum(-1).mean()

    torch.manual_seed(0)
    m1 = Teacher().to(device)
    m2 = copy.deepcopy(m1)
    x = torch.randn(3, 4, device=device)
    with compiler.config.patch(strict=True):
        torch.compile(m1, backend="kiln")(x).backward()
    m2(x).backward()
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b)
        assert (a.grad is None) == (b.grad is None)
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad)


def test_input_write_backs_run_after_every_kernel(device):
    # kernels recompute the mutated value from the input's old contents (x[0] below reads x * 2 from x);
    # a kernel placed after the write-back read the already-updated input
    def fn(x, y):
        x.t().mul_(2)
        r = x[0] + y[0]
        y.masked_fill_(x > 0, 7.0)
        return r, x + y

    x0, y0 = torch.randn(3, 3, device=device), torch.randn(3, 3, device=device)
    xr, yr, xc, yc = x0.clone(), y0.clone(), x0.clone(), y0.clone()
    ref = fn(xr, yr)
    with compiler.config.patch(strict=True):
        out = torch.compile(fn, backend="kiln")(xc, yc)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    torch.testing.assert_close(xc, xr)
    torch.testing.assert_close(yc, yr)


def test_repeat_of_a_permuted_input_is_contiguous(device):
    # torch's repeat decomposition clones in the input's layout; eager's repeat is contiguous, and code that
    # calls .view() on the result relies on it
    x = torch.randn(5, 4, 2, device=device).permute(2, 1, 0)
    fn = lambda x: x.unsqueeze(1).repeat(1, 2, 1, 1)
    with compiler.config.patch(strict=True):
        out = torch.compile(fn, backend="kiln")(x)
    ref = fn(x)
    torch.testing.assert_close(out, ref)
    assert out.stride() == ref.stride()
    assert torch.equal(out.view(-1), ref.view(-1))
