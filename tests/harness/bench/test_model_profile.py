"""`bench model-profile`: per-compiler step profiles of a real tiny model on CPU (kiln vs eager)."""

from __future__ import annotations

import json

import pytest

from harness.bench.cli import main
from harness.bench.models import catalog as mdl
from harness.bench.models import profile as mp
from harness.bench.models import step_facts


@pytest.fixture
def transformers_present() -> None:
    problem = mdl.package_problem("transformers")
    if problem:
        pytest.skip(f"transformers is not importable: {problem}")


def test_profile_of_tiny_gpt2_names_kernels_and_kiln_graphs(tmp_path, transformers_present, capsys):
    md = tmp_path / "profile.md"
    rc = main(
        [
            "model-profile",
            "--only",
            "model.gpt2.infer.fp32",
            "--compilers",
            "kiln,eager",
            "--device",
            "cpu",
            "--steps",
            "2",
            "--top",
            "5",
            "--md",
            str(md),
        ]
    )
    assert rc == 0
    text = md.read_text()
    assert "| model.gpt2.infer.fp32 | eager |" in text and "| model.gpt2.infer.fp32 | kiln |" in text
    assert "## model.gpt2.infer.fp32 under kiln" in text and "kiln graphs:" in text
    assert "`aten::" in text  # CPU: the innermost ATen ops are the work
    lines = capsys.readouterr().out.splitlines()
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("model.gpt2")) == ["eager", "kiln"]


def test_markdown_shares_and_host_bound_time():
    p = mp.Profile(
        "model.x.infer.fp32",
        "kiln",
        step_ms=2.0,
        device_ms=0.5,
        launches=10,
        top=[("k1", 0.4, 2.0), ("k2", 0.1, 1.0)],
        graphs=["3 kernels, fallbacks: none"],
    )
    text = mp.markdown([p])
    assert "| model.x.infer.fp32 | kiln | 2.000 | 0.500 | 1.500 | 10 |" in text
    assert "| `k1` | 0.4000 | 80.0 | 2 |" in text and "- 3 kernels, fallbacks: none" in text


def test_unknown_case_is_a_usage_error(capsys):
    rc = main(["model-profile", "--only", "model.nope.*", "--device", "cpu"])
    assert rc == 2 and "no tiny model matches" in capsys.readouterr().err


def _graphs_with_a_cpu_scalar_wait_and_a_host_sync():
    """Two kiln graph records (as `compiler.capture()` gives them) whose CUDA-graph runners ran unrecorded: a
    backward that waited on 0-d CPU inputs for one call, and a graph that syncs with the host."""
    from types import SimpleNamespace

    import torch

    from compiler.graph import FallbackReason
    from compiler.runtime.cudagraphs import CudaGraphRunner, GraphFacts

    bw = CudaGraphRunner(lambda a: a, "graph_1", GraphFacts((), (), frozenset(), 0, ""), [])
    bw.stats.warmups, bw.stats.replays = 1, 5
    bw.stats.note_unrecorded("0-d CPU tensor input(s) 7, 8: recorded once every tensor input is on the GPU")
    fb = [
        FallbackReason("fallback", "aten.index_put.default", "accumulate"),
        FallbackReason("fallback", "aten.index_put.default", "accumulate"),
    ]
    sync = CudaGraphRunner(lambda a: a, "graph_2", GraphFacts((), (), frozenset(), None, "aten::nonzero"), fb)
    sync([torch.zeros(1)])
    sync([torch.zeros(1)])
    return [
        SimpleNamespace(kernel_count=3, cudagraphs=bw, all_fallbacks=lambda: []),
        SimpleNamespace(kernel_count=2, cudagraphs=sync, all_fallbacks=lambda: list(fb)),
    ]


def test_graph_report_names_fallback_ops_and_why_graphs_ran_unrecorded():
    rep = step_facts.graph_report(_graphs_with_a_cpu_scalar_wait_and_a_host_sync())
    assert (rep["graphs"], rep["kernels"], rep["fallbacks"]) == (2, 5, {"aten.index_put.default": 2})
    bw, sync = rep["cudagraphs"]
    assert (bw["graph"], bw["role"], bw["replays"], bw["unrecorded"]) == ("graph_1", "backward", 5, 1)
    assert sync["role"] == "inference" and sync["reasons"][0].startswith("the graph syncs with the host")
    lines = step_facts.unrecorded_lines(rep)
    assert lines[0].startswith("graph_1 (backward): 1 of 6 calls after warm-up unrecorded: 0-d CPU tensor")
    assert lines[1].startswith("graph_2 (inference): 2 of 2 calls after warm-up unrecorded: the graph syncs")
    json.dumps(rep)


def test_host_gaps_sum_idle_device_time_and_count_runtime_calls():
    from types import SimpleNamespace

    import torch

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, start, end, dev=cuda):
        return SimpleNamespace(name=name, device_type=dev, time_range=SimpleNamespace(start=start, end=end))

    events = [
        ev("k1", 0, 10),
        ev("k2", 10, 20),
        ev("k3", 70, 80),
        ev("k4", 75, 90),
        ev("k5", 100, 110),
        ev("cudaGraphLaunch", 0, 1, cpu),
        ev("cudaLaunchKernel", 60, 62, cpu),
        ev("cudaLaunchKernel", 90, 91, cpu),
        ev("aten::mm", 0, 5, cpu),
    ]
    g = mp.host_gaps(events, steps=2, top=1)
    assert g["idle_ms"] == pytest.approx((50 + 10) / 1e3 / 2)  # k2 -> k3 and k4 -> k5; k3/k4 overlap
    assert g["top"] == [(50, "k2", "k3")]
    assert g["runtime_calls"] == {"cudaGraphLaunch": 0.5, "cudaLaunchKernel": 1.0}


def test_kernel_time_is_per_step_device_work():
    import torch

    a = torch.randn(64, 64)
    one = step_facts.kernel_time(lambda: a @ a, torch.device("cpu"), steps=4)
    two = step_facts.kernel_time(lambda: (a @ a, a @ a), torch.device("cpu"), steps=4)
    assert one["launches"] >= 1 and two["launches"] == 2 * one["launches"]  # innermost ops, per step
    assert one["kernel_ms"] > 0 and two["kernel_ms"] > 0
