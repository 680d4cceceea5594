"""Autotuning (compiler/runtime/autotune.py) on CPU through the interpreter, with an injected timer: the fastest
candidate is chosen and used, written buffers are restored around every candidate, choices are cached per size
bucket on disk (a second compile times nothing), and without a timer the CPU is a logged no-op."""

from __future__ import annotations

import logging

import pytest
import torch

import compiler
from compiler import config
from compiler.backend import backend_overrides
from compiler.runtime import autotune, compile_stats, reset_compile_stats
from compiler.runtime.launcher import TritonKernel
from kiln_testing import DEVICE


class FakeTimer:
    """Runs each candidate once (so the kernel really launches) and says the one with the fewest warps, then
    the smallest XBLOCK, is fastest."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, launch, cfg: dict) -> float:
        launch()
        self.calls.append(dict(cfg))
        return cfg["num_warps"] * 1e-3 + cfg["XBLOCK"] * 1e-9


@pytest.fixture
def tuned(tmp_path):
    timer = FakeTimer()
    autotune.set_timer(timer)
    with config.patch(
        autotune=True,
        cache="1",
        autotune_dir=str(tmp_path / "autotune"),
        strict=True,
        cache_dir=str(tmp_path / "kernels"),
    ):
        reset_compile_stats()
        yield timer
    autotune.set_timer(None)


def _f(x):
    return (x * 2).relu() + 1


def _run(fn, *args, **kw):
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        out = torch.compile(fn, backend="kiln", **kw)(*args)
    return graphs, out


def _launch_cfgs(graphs):
    out = []
    for _, m in graphs[0].wrapper.named_children():
        if isinstance(m, TritonKernel):
            out += [launch.cfg for launch in m._launches.values()]
    return out


def test_the_fastest_candidate_is_used_and_the_second_compile_times_nothing(tuned):
    x = torch.randn(3000, device=DEVICE)
    graphs, out = _run(_f, x)
    assert torch.allclose(out, _f(x))
    assert len(tuned.calls) > 1 and compile_stats().autotuned == 1
    best = min(tuned.calls, key=lambda c: (c["num_warps"], c["XBLOCK"]))
    (cfg,) = _launch_cfgs(graphs)
    assert (cfg["XBLOCK"], cfg["num_warps"]) == (best["XBLOCK"], best["num_warps"])
    n = len(tuned.calls)
    autotune.set_timer(tuned)  # forgets this process's choices: the next compile must read them from disk
    graphs, out = _run(_f, x)
    assert len(tuned.calls) == n and compile_stats().autotune_hits == 1  # no timing the second time
    assert torch.allclose(out, _f(x))
    assert _launch_cfgs(graphs)[0]["XBLOCK"] == best["XBLOCK"]


def test_a_noise_level_win_keeps_the_heuristic(tmp_path):
    x = torch.randn(3000, device=DEVICE)
    with config.patch(strict=True, cache_dir=str(tmp_path / "kernels")):
        (base,) = _launch_cfgs(_run(_f, x)[0])  # the heuristic's config, untuned
    seen = []

    def timer(launch, cfg):  # every other candidate 1% faster than the heuristic: noise
        launch()
        seen.append(dict(cfg))
        same = all(cfg.get(k) == base.get(k) for k in autotune.TUNED)
        return 1.0e-3 if same else 0.99e-3

    autotune.set_timer(timer)
    try:
        with config.patch(
            autotune=True,
            cache="1",
            autotune_dir=str(tmp_path / "autotune"),
            strict=True,
            cache_dir=str(tmp_path / "kernels"),
        ):
            graphs, out = _run(_f, x)
    finally:
        autotune.set_timer(None)
    (cfg,) = _launch_cfgs(graphs)
    assert len(seen) > 1 and torch.allclose(out, _f(x))
    assert all(cfg[k] == base[k] for k in autotune.TUNED if k in base)


def test_a_size_bucket_shares_its_choice(tuned):
    graphs, _ = _run(_f, torch.randn(3000, device=DEVICE), dynamic=True)
    n = len(tuned.calls)
    compiled = torch.compile(_f, backend="kiln", dynamic=True)
    x = torch.randn(2500, device=DEVICE)  # same bucket (4096): no timing
    assert torch.allclose(compiled(x), _f(x)) and len(tuned.calls) == n
    x = torch.randn(9000, device=DEVICE)  # another bucket: timed
    assert torch.allclose(compiled(x), _f(x)) and len(tuned.calls) > n


def test_reductions_are_tuned_and_stay_correct(tuned):
    def f(x):
        return torch.softmax(x, -1) * x.sum(0)

    x = torch.randn(64, 300, device=DEVICE)
    _, out = _run(f, x)
    assert torch.allclose(out, f(x), atol=1e-5) and compile_stats().autotuned >= 2
    persistent = [c for c in tuned.calls if c.get("PERSISTENT")]
    # a whole row stays in one block: rows of 300 (softmax) and of 64 (the column sum)
    assert persistent and {c["RBLOCK"] for c in persistent} == {512, 64}


def test_written_buffers_are_restored_before_every_candidate(tuned):
    with config.patch(autotune=False):
        graphs, _ = _run(_f, torch.randn(3000, device=DEVICE))
    (kernel,) = [m for _, m in graphs[0].wrapper.named_children() if isinstance(m, TritonKernel)]
    x = torch.randn(3000, device=DEVICE)
    out = torch.full((3000,), 7.0, device=DEVICE)
    seen = []

    def timer(launch, cfg):
        seen.append(bool((out == 7.0).all()))  # each candidate starts from the state before the launch
        launch()
        return cfg["num_warps"]

    autotune.set_timer(timer)
    args = (x, out, 3000) if kernel.ptr_args == ["in_ptr0", "out_ptr0"] else pytest.skip(str(kernel.ptr_args))
    cfg = kernel.heuristic_config(3000, 1, interp=config.interpreting())
    choice = autotune._tune(kernel, cfg, args)
    assert choice is not None and len(seen) > 1 and all(seen)
    assert (out == 7.0).all()  # and the buffers are back to it afterwards: the real launch writes them


@pytest.mark.skipif(not config.interpreting(), reason="on a GPU, autotuning without a timer times for real")
def test_cpu_without_a_timer_is_a_logged_no_op(tmp_path, caplog):
    autotune.set_timer(None)
    autotune._noted.clear()
    reset_compile_stats()
    with config.patch(autotune=True, autotune_dir=str(tmp_path)), caplog.at_level(logging.INFO, "kiln"):
        x = torch.randn(100, device=DEVICE)
        _, out = _run(_f, x)
    assert torch.allclose(out, _f(x))
    assert compile_stats().autotuned == 0 and not list(tmp_path.iterdir())
    assert any("autotuning skipped" in r.message and "interpreter" in r.message for r in caplog.records)


def test_max_autotune_mode_turns_it_on(tuned):
    assert backend_overrides(mode="max-autotune")["autotune"] is True
    assert backend_overrides(mode="max-autotune-no-cudagraphs") == {"autotune": True}
    with config.patch(autotune=False):  # the mode alone turns it on, for this compiled function
        x = torch.randn(3000, device=DEVICE)
        _, out = _run(_f, x, mode="max-autotune-no-cudagraphs")
    assert torch.allclose(out, _f(x)) and tuned.calls


def test_candidates_keep_the_heuristic_and_fill_the_threads():
    cfg = {"XBLOCK": 8, "RBLOCK": 128, "PERSISTENT": True, "num_warps": 4}
    cands = autotune.candidates(cfg, "inner", 0)
    assert cfg in cands and all(c["RBLOCK"] == 128 for c in cands)
    assert all(c["XBLOCK"] * c["RBLOCK"] >= 32 * c["num_warps"] for c in cands if c != cfg)
    outer = autotune.candidates({"XBLOCK": 64, "RBLOCK": 64, "PERSISTENT": False, "num_warps": 8}, "outer", 0)
    assert {c["RBLOCK"] for c in outer} == {32, 64, 128}
    pw = autotune.candidates({"XBLOCK": 1024, "num_warps": 4}, "inner", 0)
    assert {"XBLOCK": 1024, "num_warps": 4} in pw and all("RBLOCK" not in c for c in pw)


def test_candidates_hold_the_measured_winners():
    """The winners of an H100 ``launch_sweep`` (convnext, resnet, vit) are among the candidates around the
    heuristic's pick for their shapes, so autotuning can find them."""

    def cands(hint, programs, xnumel, rnumel):
        cfg = TritonKernel("k", "", [], [], True, hint, programs).heuristic_config(
            xnumel, rnumel, interp=False
        )
        return {(c["XBLOCK"], c["RBLOCK"], c["num_warps"]) for c in autotune.candidates(cfg, hint, programs)}

    assert (64, 128, 8) in cands("outer", 0, 25088, 1024) and (64, 32, 8) in cands("outer", 0, 13824, 1051)
    assert {(64, 64, 16), (16, 64, 16)} <= cands("outer", 0, 6272, 1024)  # the standard width, narrowed
    assert {(16, 128, 4), (16, 32, 16)} <= cands("outer", 0, 4608, 1051)
    assert (1, 1024, 2) in cands("inner", 0, 6304, 768)
    assert (16, 128, 8) in cands("inner", 0, 50176, 96) and (64, 64, 8) in cands("inner", 256, 100352, 64)


def test_choices_follow_the_cache_setting(tuned, tmp_path):
    x = torch.randn(3000, device=DEVICE)
    with config.patch(cache="0"):
        _run(_f, x)
    assert len(tuned.calls) > 1 and not (tmp_path / "autotune").exists()  # tuned, nothing written
    n = len(tuned.calls)
    autotune.set_timer(tuned)
    with config.patch(cache="read"):
        _, out = _run(_f, x)
    assert (
        len(tuned.calls) > n and not (tmp_path / "autotune").exists()
    )  # read-only: timed again, not written
    assert torch.allclose(out, _f(x))


def test_a_cached_choice_compiles_no_candidate_and_costs_what_a_plain_warm_compile_costs(
    tuned, tmp_path, monkeypatch
):
    """A warm autotuned compile (graph cache hit, choice on disk): no candidate is listed, sent to the workers,
    compiled or timed, and kernels are loaded exactly as often as in a plain warm compile."""
    from compiler.runtime import cache

    x = torch.randn(3000, device=DEVICE)
    with config.patch(graph_cache_dir=str(tmp_path / "graphs")):
        _run(_f, x)  # cold: tuned, graph and choice stored
        assert compile_stats().autotuned == 1
        counts = {"candidates": 0, "time_config": 0, "_submit": 0, "load_kernel": 0}

        def counting(mod, name):
            real = getattr(mod, name)

            def wrapped(*a, **k):
                counts[name] += 1
                return real(*a, **k)

            monkeypatch.setattr(mod, name, wrapped)

        for name in ("candidates", "time_config", "_submit"):
            counting(autotune, name)
        counting(cache, "load_kernel")
        loads = {}
        for tune in (False, True):
            autotune.set_timer(
                tuned
            )  # forget this process's choices and loaded kernels: as a new process would
            cache._modules.clear()
            counts["load_kernel"] = 0
            reset_compile_stats()
            with config.patch(autotune=tune):
                graphs, out = _run(_f, x)
            assert torch.allclose(out, _f(x)) and [g.cache for g in graphs] == ["hit"]
            loads[tune] = counts["load_kernel"]
        assert compile_stats().autotune_hits == 1 and compile_stats().autotuned == 0
    assert counts["candidates"] == counts["time_config"] == counts["_submit"] == 0
    # one kernel module loaded from the cache on the CPU; on a GPU the binary index serves the compiled kernel and
    # no module is loaded at all: either way a tuned warm compile loads exactly what a plain one does
    assert loads[True] == loads[False] == (1 if DEVICE == "cpu" else 0)


def test_cached_config_applies_a_stored_choice_only(tuned):
    graphs, _ = _run(_f, torch.randn(3000, device=DEVICE))
    (kernel,) = [m for _, m in graphs[0].wrapper.named_children() if isinstance(m, TritonKernel)]
    device = torch.device(DEVICE)
    heuristic = kernel.heuristic_config(3000, 1, interp=config.interpreting())
    (used,) = _launch_cfgs(graphs)
    assert used != heuristic  # the timer prefers fewer warps than the heuristic's
    autotune.set_timer(tuned)  # the choice is read from disk
    assert kernel.cached_tuned_config(heuristic, 3000, 1, device) == used
    assert (
        kernel.cached_tuned_config(heuristic, 100000, 1, device) == heuristic
    )  # another bucket: none cached
