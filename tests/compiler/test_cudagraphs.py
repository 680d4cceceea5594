"""CUDA graphs (``runtime/cudagraphs.py``): what a graph's facts say, how options reach the backend, and on a
GPU: recording per size key, copied-in and moving inputs, training with saved tensors, and the fallbacks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.backend import backend_overrides
from compiler.exc import ConfigError
from compiler.runtime.cudagraphs import GraphFacts

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


# ------------------------------------------------------------------ facts and options (any machine)
def test_facts_find_mutated_inputs_host_syncs_and_key_arguments():
    def fn(x, y, n):
        x.add_(1)
        return x * n, y.nonzero()

    facts = GraphFacts.of(make_fx(fn)(torch.randn(3), torch.randn(4), 3))
    assert facts.mutated_args == frozenset({0})
    assert facts.host_sync == "aten::nonzero"
    gm = make_fx(lambda x, y: (x + 1, y * 2), tracing_mode="symbolic")(torch.randn(3, 4), torch.randn(5))
    facts = GraphFacts.of(gm)
    assert (
        facts.symbolic_tensor_args == (0, 1) and facts.mutated_args == frozenset() and facts.host_sync == ""
    )


def test_modes_and_options_become_settings():
    assert backend_overrides(None, "reduce-overhead") == {"cudagraphs": True}
    assert backend_overrides({"cudagraphs": False}, "reduce-overhead") == {"cudagraphs": False}
    assert backend_overrides({"emulate_eager_precision": True}) == {"emulate_eager_precision": True}
    with pytest.raises(ConfigError, match="unknown kiln setting"):
        backend_overrides({"cuda_graphs": True})
    with pytest.raises(ConfigError, match="not one of kiln's"):
        backend_overrides(None, "fastest")


def test_cpu_graphs_run_without_a_runner(device):
    if device != "cpu":
        pytest.skip("the CPU path")
    f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="kiln", options={"cudagraphs": True})
    x = torch.randn(4, 8)
    with compiler.capture() as graphs:
        out = f(x)
    torch.testing.assert_close(out, torch.softmax(x * 2, -1))
    assert graphs[0].cudagraphs is None


# ------------------------------------------------------------------ on a GPU
def _compiled(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, backend="kiln", options={"cudagraphs": True}, **kw)


def _runners(graphs):
    return [g.cudagraphs for g in graphs if g.cudagraphs is not None]


@gpu
def test_inference_records_once_and_replays_with_new_inputs():
    w = torch.randn(64, 64, device="cuda")
    fn = lambda x: F.gelu(F.layer_norm(x @ w, (64,)))  # noqa: E731
    f = _compiled(fn)
    with compiler.capture() as graphs:
        for _ in range(5):
            x = torch.randn(32, 64, device="cuda")  # a new address every call: copied in
            torch.testing.assert_close(f(x), fn(x), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(graphs)
    assert (runner.stats.warmups, runner.stats.recordings, runner.stats.replays) == (1, 1, 4)
    assert runner.stats.copied_in >= 4


@gpu
def test_a_moved_static_input_is_recorded_again():
    x = torch.randn(16, 32, device="cuda")
    f = _compiled(lambda x, w: torch.relu(x @ w))
    w1 = torch.randn(32, 32, device="cuda")
    with compiler.capture() as graphs:
        for _ in range(3):
            f(x, w1)
        w2 = torch.randn(32, 32, device="cuda")
        for _ in range(3):
            torch.testing.assert_close(f(x, w2), torch.relu(x @ w2), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(graphs)
    assert runner.stats.recordings == 2 and runner.stats.replays == 5


@gpu
def test_one_recording_per_size_under_dynamic_shapes():
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    f = _compiled(fn, dynamic=True)
    with compiler.capture() as graphs:
        for n in (8, 16, 8, 16, 8, 16):
            x = torch.randn(n, 40, device="cuda")
            torch.testing.assert_close(f(x), fn(x))
    (runner,) = _runners(graphs)
    assert len(runner.entries) == 2 and runner.stats.recordings == 2 and runner.stats.replays == 4


@gpu
def test_in_place_update_of_a_copied_in_input_reaches_the_caller():
    def fn(x, y):
        x.mul_(2)
        return x + y

    f = _compiled(fn)
    y = torch.randn(64, device="cuda")
    for _ in range(4):
        x = torch.randn(64, device="cuda")
        expect_x, expect = x * 2, x * 2 + y
        out = f(x, y)
        torch.testing.assert_close(x, expect_x)
        torch.testing.assert_close(out, expect)


@gpu
def test_training_steps_match_eager_and_replay_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).cuda()
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    step = _compiled(lambda x, y: F.cross_entropy(model(x), y))
    with compiler.capture() as graphs:
        for _ in range(5):
            x, y = torch.randn(16, 32, device="cuda"), torch.randint(0, 8, (16,), device="cuda")
            for _m, o, f in ((model, opt, step), (ref, ref_opt, lambda x, y: F.cross_entropy(ref(x), y))):
                o.zero_grad()
                f(x, y).backward()
                o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    runners = _runners(graphs)
    assert len(runners) == 2 and all(r.stats.replays >= 3 for r in runners)
    # the backward reads the forward's saved activations in place (recorded outputs, static inputs): only its
    # tangent is copied in, and the forward copies x and y; before, every saved activation was copied each step
    backward = [r for r in runners if r.facts.saved_from == 0]  # the forward's kept outputs start at 1
    assert len(backward) == 1 and backward[0].stats.recordings == 1
    (entry,) = backward[0].entries.values()
    assert len(entry.recording.placeholders) <= 1 and len(entry.recording.static_args) >= 4, entry.recording


@gpu
def test_two_forwards_before_their_backwards_keep_saved_tensors():
    """Gradient accumulation order fwd1, fwd2, bwd2, bwd1: fwd2 must not overwrite what bwd1 needs."""
    torch.manual_seed(0)
    w = torch.randn(32, 32, device="cuda", requires_grad=True)
    fn = lambda x: torch.tanh(x @ w).pow(2).sum()  # noqa: E731
    f = _compiled(fn)
    xs = [torch.randn(8, 32, device="cuda") for _ in range(2)]
    for _ in range(3):  # warm-up and recording
        f(xs[0]).backward()
    w.grad = None
    with compiler.capture():
        l1, l2 = f(xs[0]), f(xs[1])
        l2.backward()
        l1.backward()
    got = w.grad.clone()
    w.grad = None
    fn(xs[0]).backward()
    fn(xs[1]).backward()
    torch.testing.assert_close(got, w.grad, rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.parametrize("micro_batches", [1, 3])
def test_gradients_adopted_as_grad_are_not_overwritten_by_the_next_backward(micro_batches):
    """AccumulateGrad adopts a backward's output as ``.grad`` (no copy) when ``.grad`` is None: with gradient
    accumulation the next micro-batch's backward must not replay into the memory that ``.grad`` now is (it
    would double the last gradient); one micro-batch per step replays every step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    step = _compiled(lambda x: model(x).pow(2).mean())
    with compiler.capture() as graphs:
        for _ in range(5):
            xs = [torch.randn(16, 32, device="cuda") for _ in range(micro_batches)]
            for _m, o, f in ((model, opt, step), (ref, ref_opt, lambda x: ref(x).pow(2).mean())):
                o.zero_grad(set_to_none=True)
                for x in xs:
                    f(x).backward()
                o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    if micro_batches == 1:
        assert all(r.stats.replays >= 3 for r in _runners(graphs))


@gpu
def test_batch_norm_running_stats_update_once_per_call():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(16).cuda()
    ref = copy.deepcopy(bn)
    f = _compiled(bn)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(32, 16, device="cuda")
            torch.testing.assert_close(f(x), ref(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)


@gpu
def test_host_sync_falls_back_with_a_reason():
    fn = lambda x: x[x > 0].sum() * 2  # noqa: E731
    f = _compiled(fn)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), compiler.capture() as graphs:
        for _ in range(3):
            x = torch.randn(100, device="cuda")
            torch.testing.assert_close(f(x), fn(x))
    reasons = [r for g in graphs for r in g.all_fallbacks() if r.kind == "cudagraph"]
    assert reasons and all(r.detail for r in reasons)


@gpu
def test_a_failed_capture_falls_back_and_leaves_random_numbers_working(monkeypatch):
    # hide the boolean-mask index from the facts, so that recording is tried and fails inside the capture
    monkeypatch.setattr(
        GraphFacts,
        "of",
        staticmethod(lambda gm, saved_from=None: GraphFacts((), (), frozenset(), saved_from, "")),
    )
    fn = lambda x: x[x > 0].sum() * 2  # noqa: E731
    f = _compiled(fn)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), compiler.capture() as graphs:
        for _ in range(4):
            x = torch.randn(100, device="cuda")  # fails once the generator is left capturing
            torch.testing.assert_close(f(x), fn(x))
    details = [r.detail for g in graphs for r in g.all_fallbacks() if r.kind == "cudagraph"]
    assert any(d.startswith("capture failed") for d in details), details


def test_reinterpret_tensor_takes_offsets_from_the_storage_start_and_alias_keeps_them():
    from compiler.runtime.restride import alias, reinterpret_tensor

    t = torch.arange(10.0)[2:]
    assert reinterpret_tensor(t, (2,), (1,), 3).tolist() == [3.0, 4.0]
    a = alias(t)
    assert a is not t and a.storage_offset() == 2 and torch.equal(a, t)


@gpu
def test_outputs_at_a_storage_offset_are_handed_out_in_place():
    """q, k, v split from one projection (GPT-2's c_attn): outputs that start inside their buffer."""
    w = torch.randn(64, 192, device="cuda")
    fn = lambda x: [t.transpose(1, 2) for t in (x @ w).split(64, dim=-1)]  # noqa: E731
    f = _compiled(fn)
    for _ in range(4):
        x = torch.randn(4, 8, 64, device="cuda")
        for got, want in zip(f(x), fn(x)):
            assert got.storage_offset() == want.storage_offset()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ inputs' devices and unrecorded calls (any machine)
def _on(device: str, *shape: int) -> torch.Tensor:
    """A tensor that reports `device` without that device being here (a FakeTensor over a meta tensor)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    return FakeTensor(FakeTensorMode(), torch.empty(shape, device="meta"), torch.device(device))


def test_cpu_scalar_inputs_wait_for_the_gpu_other_cpu_inputs_never_record():
    from compiler.runtime.cudagraphs import input_devices

    gpu_args = [_on("cuda:0", 4, 4), 3, _on("cuda:0", 4)]
    assert input_devices(gpu_args) == ("", "")
    # memory-efficient attention's RNG seed and offset outside a capture: 0-d CPU tensors (unused without
    # dropout); inside one they are GPU tensors, so the graph records once its forward replays
    never, not_now = input_devices(gpu_args + [_on("cpu"), _on("cpu")])
    assert never == "" and not_now.startswith("0-d CPU tensor input(s) 3, 4")
    never, not_now = input_devices(gpu_args + [_on("cpu", 2)])
    assert never == "inputs not on a CUDA device: 3 (cpu)" and not_now == ""
    if not torch.cuda.is_available() or torch.cuda.device_count() > 1:  # where CUDA is real, a FakeTensor on
        # cuda:1 needs that device (a one-GPU box checks the rest; the CPU run checks this too)
        assert input_devices([_on("cuda:0", 2), _on("cuda:1", 2)])[0].startswith("inputs on several devices")
    assert input_devices([_on("cpu"), 1])[0] == "no tensor inputs on a CUDA device"


def test_unrecorded_calls_are_counted_per_reason_and_summarized():
    from compiler.runtime.cudagraphs import CudaGraphRunner

    calls = []
    facts = GraphFacts((), (), frozenset(), 0, "aten::nonzero")  # a backward (kept outputs from 0) that syncs
    fallbacks = []
    runner = CudaGraphRunner(lambda args: calls.append(len(args)) or args[0], "graph_7", facts, fallbacks)
    x = torch.randn(3)
    for _ in range(3):
        assert runner([x]) is x
    assert calls == [1, 1, 1]
    assert [f.kind for f in fallbacks] == ["cudagraph"] and "syncs with the host" in fallbacks[0].detail
    s = runner.summary()
    assert (s["graph"], s["role"], s["unrecorded"], s["replays"]) == ("graph_7", "backward", 3, 0)
    assert s["unrecorded_why"] == {fallbacks[0].detail: 3}
    assert (
        CudaGraphRunner(lambda a: a, "g", GraphFacts((), (), frozenset(), None, ""), []).role == "inference"
    )
    assert CudaGraphRunner(lambda a: a, "g", GraphFacts((), (), frozenset(), 2, ""), []).role == "forward"


@gpu
def test_training_with_memory_efficient_attention_records_its_backward():
    """fp32 SDPA runs ATen's memory-efficient attention, whose seed and offset are 0-d CPU tensors at the
    backward's warm-up (its forward ran unrecorded) and GPU tensors once the forward replays: the backward
    must record then, not run unrecorded for good."""
    torch.manual_seed(0)
    qkv = torch.nn.Linear(64, 192).cuda()
    ref = copy.deepcopy(qkv)

    def attn(lin, x):
        q, k, v = lin(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).pow(2).mean()

    step = _compiled(lambda x: attn(qkv, x))
    x = torch.randn(2, 128, 64, device="cuda")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), compiler.capture() as graphs:
        for _ in range(5):
            for lin, f in ((qkv, step), (ref, lambda x: attn(ref, x))):
                lin.zero_grad(set_to_none=True)
                f(x).backward()
    for p, q in zip(qkv.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    runners = _runners(graphs)
    assert {r.role for r in runners} == {"forward", "backward"}
    assert all(r.stats.recordings == 1 and r.stats.replays >= 3 for r in runners), [
        r.summary() for r in runners
    ]
    assert not [f for g in graphs for f in g.all_fallbacks() if f.kind == "cudagraph"]


def test_a_gpt2_style_training_step_has_nothing_that_keeps_it_off_cuda_graphs(device):
    """The graphs of a tiny GPT-2-style training step (forward, loss, their backwards; HF's loss-type warning
    breaks the graph before the loss) carry no host synchronization and write no input: what keeps such a
    step off a recording is at run time (inputs' devices, kept outputs), which the runner reports."""
    if device != "cpu":
        pytest.skip("reads the graphs on the CPU path")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=128,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(1, 128, (2, 16))
    f = _compiled(model)
    with compiler.capture() as graphs:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            f(input_ids=ids, labels=ids).loss.backward()
    assert len(graphs) >= 2
    for g in graphs:
        facts = GraphFacts.of(g.aten_graph)
        assert facts.host_sync == "" and facts.mutated_args == frozenset(), (g.name, facts)
