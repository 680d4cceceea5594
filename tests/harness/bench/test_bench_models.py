"""The model tier: registry and config hashes, the accuracy check, reports over synthetic results, the store
round trip, package problems, failing compilers, and one real tiny model end to end (kiln vs eager, CPU)."""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from bench_helpers import TINY_MODEL_ARGS, samples

from harness.bench.cli import main
from harness.bench.core.records import COMPILE_PHASE, Result, RunInfo
from harness.bench.models import catalog as mdl
from harness.bench.models import compile_times as ct
from harness.bench.models import report as mrep
from harness.bench.models import run as mr
from harness.bench.stores.store import Store, now
from harness.exc import UsageError


def _transformers_or_skip() -> None:
    problem = mdl.package_problem("transformers")
    if problem:
        pytest.skip(f"transformers is not importable: {problem}")


# ------------------------------------------------------------------ registry and hashes
def test_tiny_and_gpu_profiles():
    tiny = mdl.all_cases("tiny", "cpu")
    names = [c.name for c in tiny]
    assert len(tiny) >= 5 and len(set(names)) == len(names)
    assert len({c.source_hash for c in tiny}) == len(tiny)
    assert {c.spec.package for c in tiny} == {"transformers"}  # PyPI torchvision does not load on CPU torch
    assert {c.mode for c in tiny} == {"infer", "train"} and {c.dtype_name for c in tiny} == {"fp32"}
    assert {c.spec.kind for c in tiny} == {"decoder", "encoder", "encoder-decoder", "vision"}
    gpu = {c.name: c for c in mdl.all_cases("gpu", "cuda")}
    assert 10 <= len(gpu) - len(mdl.cases("gpu", "ci_*", "cuda")) <= 14
    for name in (
        "model.gpt2.infer.bf16",
        "model.gpt2.train.fp32",
        "model.bert.infer.bf16",
        "model.llama.train.fp32",
        "model.resnet50.infer.bf16",
        "model.vit_b16.infer.bf16",
        "model.t5.infer.bf16",
    ):
        assert name in gpu
    g = gpu["model.gpt2.infer.bf16"]
    assert (g.sizes.batch, g.sizes.seq, g.sizes.config["n_layer"]) == (8, 256, 4)
    assert gpu["model.gpt2.train.fp32"].optimizer == "adamw"
    assert gpu["model.resnet50.train.amp"].autocast and gpu["model.resnet50.train.amp"].optimizer == "sgd"
    assert gpu["model.resnet50.infer.bf16"].sizes.batch == 32


def test_ci_size_rows_are_gpu_only_distinct_and_leave_the_other_rows_alone():
    ci = mdl.cases("gpu", "ci_*", "cuda")
    assert [c.name for c in ci] == [
        "model.ci_gpt2.train.fp32",
        "model.ci_gpt2.infer.fp32",
        "model.ci_gpt2.infer.bf16",
        "model.ci_bert.train.fp32",
        "model.ci_bert.infer.bf16",
        "model.ci_llama.train.fp32",
        "model.ci_llama.infer.fp32",
        "model.ci_llama.infer.bf16",
        "model.ci_qwen2.train.fp32",
        "model.ci_qwen2.infer.bf16",
        "model.ci_t5.infer.bf16",
        "model.ci_resnet18.infer.bf16",
        "model.ci_resnet18.train.amp",
        "model.ci_mobilenet_v3.infer.bf16",
        "model.ci_efficientnet_b0.infer.bf16",
        "model.ci_convnext_tiny.infer.bf16",
        "model.ci_vit_small.infer.bf16",
    ]
    for c in ci:
        assert (
            c.name.startswith(mdl.PREFIX + mdl.CI_PREFIX) and "tiny" not in c.spec.sizes
        )  # never on the CPU tier
    text = [c for c in ci if c.spec.package == "transformers"]
    for c in text:  # 4 layers at hidden 512, 8 x 256 tokens; training with AdamW
        cfg = c.sizes.config
        hidden = cfg.get("n_embd", cfg.get("hidden_size", cfg.get("d_model")))
        layers = cfg.get("n_layer", cfg.get("num_hidden_layers", cfg.get("num_layers")))
        assert (hidden, layers, c.sizes.batch, c.sizes.seq) == (512, 4, 8, 256), c.name
        assert c.optimizer == ("adamw" if c.mode == "train" else None), c.name
    assert {c.spec.package for c in ci if c.spec.kind == "vision"} == {"torchvision", "timm"}
    infer = [c for c in ci if c.mode == "infer"]
    assert all(8 <= c.sizes.batch <= 32 for c in infer)
    assert all(c.model_dtype == (torch.float32 if c.dtype_name == "fp32" else torch.bfloat16) for c in infer)
    full = {c.name: c.source_hash for c in mdl.all_cases("gpu", "cuda") if c not in ci}
    assert not set(full) & {c.name for c in ci} and len(set(full.values())) == len(full)
    assert mdl.cases("gpu", "gpt2", "cuda") == [
        c for c in mdl.all_cases("gpu", "cuda") if c.spec.name == "gpt2"
    ]
    assert all(not c.spec.name.startswith(mdl.CI_PREFIX) for c in mdl.all_cases("tiny", "cpu"))


def test_dtype_follows_the_device_for_unspecified_cases():
    assert mdl.find("gpt2.infer.fp32", "tiny", "cpu").model_dtype == torch.float32
    on_gpu = mdl.find("model.gpt2.infer.bf16", "tiny", "cuda")
    assert on_gpu.model_dtype == torch.bfloat16 and not on_gpu.autocast
    assert mdl.find("gpt2.train.fp32", "tiny", "cuda").dtype_name == "fp32"  # training stays fp32
    with pytest.raises(UsageError, match="unknown tiny model case"):
        mdl.find("gpt2.infer.bf16", "tiny", "cpu")


def test_only_patterns_select_cases_and_models():
    assert [c.name for c in mdl.cases("tiny", "gpt2")] == ["model.gpt2.infer.fp32", "model.gpt2.train.fp32"]
    assert [c.name for c in mdl.cases("tiny", "*.train.*,llama")] == [
        "model.gpt2.train.fp32",
        "model.llama.infer.fp32",
    ]
    assert [c.name for c in mdl.cases("gpu", "model.bert.*,t5", "cuda")] == [
        "model.bert.infer.bf16",
        "model.t5.infer.bf16",
    ]
    # the patterns' order (a budgeted run measures what was named first), each pattern's cases in the tier's
    assert [c.name for c in mdl.cases("tiny", "llama,*.train.*,gpt2")] == [
        "model.llama.infer.fp32",
        "model.gpt2.train.fp32",
        "model.gpt2.infer.fp32",
    ]
    with pytest.raises(UsageError, match="no tiny model matches 'nope'"):
        mdl.cases("tiny", "nope")
    with pytest.raises(UsageError, match="unknown profile"):
        mdl.cases("huge")


def test_source_hash_tracks_config_mode_dtype_optimizer_and_package_version(monkeypatch):
    a = mdl.find("gpt2.train.fp32", "tiny")
    assert a.source_hash == mdl.find("gpt2.train.fp32", "tiny").source_hash
    spec = a.spec
    sizes = spec.sizes["tiny"]
    bigger = mdl.Sizes({**sizes.config, "n_layer": 2}, sizes.batch, sizes.cases, seq=sizes.seq)
    changed = mdl.ModelSpec(spec.name, spec.kind, spec.package, spec.build, {"tiny": bigger})
    assert mdl._parse(changed, "tiny", "train:adamw", "cpu").source_hash != a.source_hash
    longer = mdl.Sizes(sizes.config, sizes.batch, sizes.cases, seq=sizes.seq * 2)
    assert (
        mdl._parse(
            mdl.ModelSpec(spec.name, spec.kind, spec.package, spec.build, {"tiny": longer}),
            "tiny",
            "train:adamw",
            "cpu",
        ).source_hash
        != a.source_hash
    )
    assert mdl._parse(spec, "tiny", "train", "cpu").source_hash != a.source_hash  # no optimizer step
    assert mdl._parse(spec, "tiny", "train:amp:adamw", "cpu").source_hash != a.source_hash
    assert mdl._parse(spec, "tiny", "infer", "cpu").source_hash != a.source_hash
    other_builder = mdl.ModelSpec(spec.name, spec.kind, spec.package, mdl.build_llama, spec.sizes)
    assert mdl._parse(other_builder, "tiny", "train:adamw", "cpu").source_hash != a.source_hash
    monkeypatch.setattr(mdl, "package_version", lambda pkg: "0.0.1-other")
    assert mdl._parse(spec, "tiny", "train:adamw", "cpu").source_hash != a.source_hash
    with pytest.raises(ValueError, match="optimizer in an infer case"):
        mdl._parse(spec, "tiny", "infer:adamw", "cpu")


def test_missing_package_skips_its_models_with_one_line():
    spec = mdl.ModelSpec(
        "ghost",
        "vision",
        "kiln_no_such_package",
        mdl.build_timm,
        {"tiny": mdl.Sizes({"arch": "x"}, 2, ("infer",), image=8, classes=2)},
    )
    ghost = mdl._parse(spec, "tiny", "infer", "cpu")
    _transformers_or_skip()
    real = mdl.find("bert.infer.fp32", "tiny")
    ok, notes = mdl.available([real, ghost])
    assert ok == [real]
    line = notes["kiln_no_such_package"]
    assert line.startswith("kiln_no_such_package: not importable (ModuleNotFoundError: ")
    assert line.endswith("): ghost skipped") and "\n" not in line


def test_check_compilers_orders_validates_and_skips_cuda_graphs_on_cpu():
    out, notes = mr.check_compilers(["kiln", "inductor", "kiln-cg", "inductor-cg", "eager"], "cpu")
    assert out == ["eager", "kiln", "inductor"]
    assert notes == ["kiln-cg, inductor-cg: CUDA graphs need a CUDA device; skipped on cpu"]
    out, notes = mr.check_compilers(["inductor-cg", "kiln"], "cuda")
    assert out == ["eager", "inductor-cg", "kiln"] and notes == []
    with pytest.raises(UsageError, match="unknown compiler 'tvmx'"):
        mr.check_compilers(["tvmx"], "cpu")


# ------------------------------------------------------------------ accuracy
def _outs(seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"output": torch.randn(4, 64, generator=g) * scale, "grad:w": torch.randn(16, generator=g)}


def test_rel_err_is_normwise_and_catches_non_finite_values():
    ref = torch.ones(1000, dtype=torch.float64)
    assert mr.rel_err(ref.float(), ref) == 0.0
    assert mr.rel_err(ref * 1.01, ref) == pytest.approx(0.01)
    bad = ref.clone()
    bad[3] = math.nan
    assert mr.rel_err(bad, ref) == math.inf
    both = ref.clone()
    both[3] = math.inf
    assert mr.rel_err(both, both) == 0.0  # non-finite where the reference is too: ignored
    assert mr.rel_err(torch.ones(3), torch.ones(4)) == math.inf
    assert mr.rel_err(torch.zeros(5), torch.zeros(5)) == 0.0
    big = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    assert mr.rel_err(big * 1.5, big, chunk=64) == pytest.approx(0.5)


def test_accuracy_check_passes_close_outputs_and_fails_a_planted_wrong_one():
    ref = {k: v.double() for k, v in _outs().items()}
    eager = {
        k: (v + 1e-7 * torch.randn(v.shape, generator=torch.Generator().manual_seed(2))).float()
        for k, v in ref.items()
    }
    good = mr.check_accuracy({k: v.clone() for k, v in eager.items()}, eager, ref, "fp32")
    assert good.ok and good.err < 1e-6 and good.limit == mr.FLOOR["fp32"] and good.note == ""
    wrong = dict(eager, output=eager["output"] * 1.1)  # planted: 10% off
    acc = mr.check_accuracy(wrong, eager, ref, "fp32")
    assert not acc.ok and acc.worst == "output" and acc.err == pytest.approx(0.1, rel=1e-3)
    assert acc.note.startswith("output: error 0.1 > limit 0.0001")
    grad = dict(eager, **{"grad:w": eager["grad:w"] * -1})
    assert mr.check_accuracy(grad, eager, ref, "fp32").worst == "grad:w"
    assert not mr.check_accuracy({"output": eager["output"]}, eager, ref, "fp32").ok  # a gradient missing
    shape = dict(eager, output=eager["output"][:2])
    assert "shape (2, 64) != eager (4, 64)" in mr.check_accuracy(shape, eager, ref, "fp32").note
    nan = dict(eager, output=eager["output"].clone())
    nan["output"][0, 0] = math.nan
    assert not mr.check_accuracy(nan, eager, ref, "fp32").ok


def test_low_precision_limit_scales_with_eagers_own_error():
    ref = {"output": torch.randn(256, 256, generator=torch.Generator().manual_seed(3)).double()}
    eager = {"output": ref["output"].bfloat16()}
    e_err = mr.rel_err(eager["output"], ref["output"])
    assert 1e-3 < e_err < 1e-2
    fp32_result = {"output": ref["output"].float()}  # more accurate than eager: fine
    assert mr.check_accuracy(fp32_result, eager, ref, "bf16").ok
    off = {"output": (ref["output"] * 1.05).bfloat16()}
    acc = mr.check_accuracy(off, eager, ref, "bf16")
    assert not acc.ok and acc.limit == pytest.approx(max(mr.MULT * e_err, mr.FLOOR["bf16"]))
    no_ref = mr.check_accuracy(eager, eager, None, "bf16")  # the reference step failed: eager is it
    assert no_ref.ok and no_ref.err == 0.0


# ------------------------------------------------------------------ reports over synthetic results
def _res(
    case: str,
    compiler: str,
    ms: float | None,
    *,
    ok: bool = True,
    passed: bool = True,
    peak: int | None = None,
    cold: float | None = None,
    warm: float | None = None,
    h: str = "h1",
    seed: int = 0,
) -> Result:
    r = Result(
        f"model.{case}",
        compiler,
        f"{h}-{case}",
        timer="step",
        meta={"family": case.split(".")[0], "mode": case.split(".")[1]},
    )
    if not ok:
        r.status, r.error = "error", "BackendCompilerFailed: boom"
        return r
    r.samples = samples(ms * 1e6, n=30, noise=0.001, seed=seed)
    r.meta.accuracy = {"pass": passed, **({} if passed else {"note": "output: error 0.1 > limit 0.0001"})}
    if peak:
        r.meta.peak_mem_bytes = peak
    if warm is not None:
        r.meta.compile_warm_s = warm
    r.compile_s = cold
    return r


def _synthetic(h: str = "h1") -> list[Result]:
    return [
        _res("gpt2.infer.bf16", "eager", 10.0, peak=4000, h=h),
        _res("gpt2.infer.bf16", "kiln", 5.0, peak=2000, cold=20.0, warm=4.0, h=h),
        _res("gpt2.infer.bf16", "inductor", 4.0, peak=2500, cold=10.0, warm=2.0, h=h),
        _res("bert.infer.bf16", "eager", 8.0, peak=1000, h=h),
        _res("bert.infer.bf16", "kiln", 2.0, peak=1000, cold=30.0, warm=6.0, passed=False, h=h),
        _res("bert.infer.bf16", "inductor", 4.0, peak=500, cold=14.0, warm=4.0, h=h),
        _res("resnet50.infer.bf16", "eager", 20.0, peak=3000, h=h),
        _res("resnet50.infer.bf16", "kiln", None, ok=False, h=h),
        _res("resnet50.infer.bf16", "inductor", 10.0, peak=3000, cold=12.0, warm=3.0, h=h),
    ]


def test_summary_gives_the_dashboard_numbers():
    s = mrep.summary(_synthetic())
    k, i = s["compilers"]["kiln"], s["compilers"]["inductor"]
    assert (k["cases"], k["passed"], i["passed"]) == (3, 1, 3)
    assert k["pass_rate"] == pytest.approx(1 / 3) and i["pass_rate"] == 1.0
    assert k["geomean_speedup"] == pytest.approx(2.0, rel=0.01)  # the failing bert row is left out
    assert i["geomean_speedup"] == pytest.approx((2.5 * 2 * 2) ** (1 / 3), rel=0.01)
    assert k["compile_cold_s_mean"] == pytest.approx(25.0) and k["compile_warm_s_mean"] == pytest.approx(5.0)
    assert i["memory_ratio_geomean"] == pytest.approx((1.6 * 2 * 1) ** (1 / 3), rel=1e-6)
    assert k["memory_ratio_geomean"] == pytest.approx(2.0)
    ratio = s["step_ratio"]["inductor/kiln"]
    assert ratio["cases"] == 1 and ratio["geomean"] == pytest.approx(0.8, rel=0.01)
    assert "inductor-cg/kiln-cg" not in s["step_ratio"]
    assert mrep.ratio_lines(s) == [
        ("geomean inductor step ms / kiln step ms = 0.800 over 1 case(s) passed by both (kiln slower)")
    ]


def test_tables_markdown_json_and_plot(tmp_path):
    results = _synthetic()
    table = mrep.model_table(results)
    head = table[0]
    assert head[:5] == ["model", "pass", "eager ms", "kiln ms", "inductor ms"]
    assert "kiln compile s cold/warm" in head and "inductor mem ratio" in head
    rows = {r[0]: dict(zip(head, r)) for r in table[1:]}
    assert rows["gpt2.infer.bf16"]["pass"] == "all" and rows["gpt2.infer.bf16"]["kiln x"] == "2.00x"
    assert (
        rows["bert.infer.bf16"]["pass"] == "fail: kiln" and rows["bert.infer.bf16"]["kiln x"] == "4.00x FAIL"
    )
    assert (
        rows["resnet50.infer.bf16"]["kiln ms"] == "error" and rows["resnet50.infer.bf16"]["kiln x"] == "error"
    )
    assert rows["gpt2.infer.bf16"]["kiln compile s cold/warm"] == "20.0/4.0"
    assert rows["gpt2.infer.bf16"]["kiln mem ratio"] == "2.00"
    short = mrep.short_table(results)
    assert short[0][-1] == "cold s (kiln/inductor)" and short[1][-1] == "20.0/10.0"
    assert short[2][2] == "2 (4.00x) FAIL"
    run = RunInfo(1, "u", now(), status="complete", profile="models-gpu", device="cuda", device_name="H100")
    md = mrep.markdown_report("gpu", [run], results, ["timm: not importable (x): vit_b16 skipped"])
    for part in (
        "### Summary (the dashboard numbers)",
        "| kiln | 1/3 (33%) | 2.000x (n=1)",
        "### Per model",
        "speedup over eager",
        "BackendCompilerFailed: boom",
        "accuracy: output: error 0.1",
        "timm: not importable (x): vit_b16 skipped",
        "Device: H100; runs: 1 (complete",
    ):
        assert part in md, part
    js = mrep.json_report("gpu", [run], results, [])
    gpt2 = next(c for c in js["cases"] if c["case"] == "model.gpt2.infer.bf16")
    assert gpt2["compilers"]["kiln"]["speedup"] == pytest.approx(2.0, rel=0.01)
    assert gpt2["compilers"]["kiln"]["memory_ratio"] == 2.0 and gpt2["compilers"]["kiln"]["pass"] is True
    json.dumps(js)
    pytest.importorskip("matplotlib")
    png = mrep.plot_models(results, tmp_path / "m.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_gpu_report_has_kernel_ms_fallbacks_unrecorded_graphs_and_says_what_memory_counts():
    from harness.bench.models import memory as model_memory

    def mem(alloc):
        return {
            "definition": model_memory.DEFINITION,
            "peak_allocated_bytes": alloc,
            "peak_reserved_bytes": 2 * alloc,
        }

    graphs = {
        "graphs": 2,
        "kernels": 9,
        "fallbacks": {"aten.index_put.default": 2},
        "cudagraphs": [
            {"graph": "graph_4", "role": "forward", "replays": 9, "unrecorded": 0, "reasons": []},
            {
                "graph": "graph_5",
                "role": "backward",
                "replays": 0,
                "unrecorded": 9,
                "reasons": [],
                "unrecorded_why": {"saved outputs of the previous call still referenced": 9},
            },
        ],
    }
    results = [
        _res("ci_bert.train.fp32", "eager", 10.0, peak=400 * 2**20),
        _res("ci_bert.train.fp32", "kiln-cg", 5.0, peak=200 * 2**20),
        _res("ci_bert.train.fp32", "inductor-cg", 4.0, peak=100),  # stored before the current definition
    ]
    for r, alloc in zip(results[:2], (400 * 2**20, 200 * 2**20)):
        r.meta.memory = mem(alloc)
        r.meta.kernel = {"kernel_ms": 3.25 if r.compiler == "eager" else 2.5, "launches": 100.0}
    results[1].meta.kiln_graphs = graphs
    table = mrep.model_table(results)
    row = dict(zip(table[0], table[1]))
    assert row["eager kernel ms"] == "3.25" and row["kiln-cg kernel ms"] == "2.5"
    assert "inductor-cg kernel ms" not in row  # no column for a compiler never profiled
    assert row["kiln-cg mem ratio"] == "2.00" and row["inductor-cg mem ratio"] == "-"  # definitions differ
    assert row["kiln-cg fallbacks"] == "index_put x2"
    assert row["kiln-cg unrecorded graphs"] == "1/2: graph_5 (backward)"
    run = RunInfo(1, "u", now(), status="complete", profile="models-gpu", device="cuda", device_name="H100")
    md = mrep.markdown_report("gpu", [run], results, [])
    assert f"Counted: {model_memory.DESCRIPTION}." in md
    assert "| ci_bert.train.fp32 | 400/800 | 200/400 | old def |" in md
    assert (
        "- ci_bert.train.fp32 kiln-cg: graph_5 (backward): 9 of 9 calls after warm-up unrecorded: saved "
        "outputs of the previous call still referenced (x9)"
    ) in md
    js = mrep.json_report("gpu", [run], results, [])
    cell = js["cases"][0]["compilers"]["kiln-cg"]
    assert (
        cell["reserved_ratio"] == 2.0 and cell["kiln_graphs"] == graphs and cell["kernel"]["kernel_ms"] == 2.5
    )
    assert js["memory_definition"]["name"] == model_memory.DEFINITION


# ------------------------------------------------------------------ store round trip
def _store_run(
    store: Store,
    results: list[Result],
    device_name: str = "H100",
    status: str = "complete",
    skipped: dict | None = None,
    profile: str = "models-gpu",
) -> RunInfo:
    run = RunInfo(
        None,
        uuid.uuid4().hex,
        now(),
        profile=profile,
        device="cuda",
        device_name=device_name,
        compilers=["eager", "kiln", "inductor"],
        config={"skipped": skipped or {}, "notes": ["n1"]},
    )
    store.begin_run(run)
    for r in results:
        store.add_result(run.id, r)
    if status != "running":
        store.finish_run(run.id, status)
    return run


def test_store_round_trip_and_report_over_chunks(tmp_path):
    with Store(tmp_path / "b.sqlite") as store:
        other = _store_run(store, _synthetic(), device_name="A100")  # another device: left out
        first = _store_run(
            store,
            [r for r in _synthetic() if r.workload != "model.resnet50.infer.bf16"],
            skipped={"model.vit_b16.infer.bf16": "timm: not importable (x): vit_b16 skipped"},
        )
        chunk = _store_run(
            store, [r for r in _synthetic() if r.workload == "model.resnet50.infer.bf16"], status="running"
        )  # an interrupted chunk: its stored results still count
        rerun = [_res("gpt2.infer.bf16", "eager", 9.0), _res("gpt2.infer.bf16", "kiln", 3.0)]
        rerun[1].meta.host_load = {"other_cores": 6.5, "wall_s": 3.0, "other_cpu_s": 19.5, "cpus": 32}
        again = _store_run(store, rerun)  # a later run of only eager+kiln: inductor comes from `first`
        changed = [
            _res("bert.infer.bf16", "eager", 8.0, h="h2"),
            _res("bert.infer.bf16", "kiln", 4.0, h="h2"),
        ]
        newest = _store_run(store, changed)  # new definition: inductor's old bert row must not be mixed in
        _store_run(store, [_res("gpt2.infer.fp32", "eager", 1.0)], profile="models-tiny")  # other profile
        runs, results, notes, alone = mrep.collect(store, "gpu")
    assert alone == []
    by = {(r.workload, r.compiler): r for r in results}
    assert [r.id for r in runs] == [newest.id, again.id, chunk.id, first.id]
    assert f"runs {other.id} ran on another device and are left out" in notes
    assert by[("model.gpt2.infer.bf16", "kiln")].median_ns == pytest.approx(3e6, rel=0.01)
    assert by[("model.gpt2.infer.bf16", "inductor")].meta.run_id == first.id
    assert by[("model.bert.infer.bf16", "kiln")].source_hash == "h2-bert.infer.bf16"
    assert ("model.bert.infer.bf16", "inductor") not in by
    assert by[("model.resnet50.infer.bf16", "inductor")].meta.run_id == chunk.id
    assert "model.gpt2.infer.fp32" not in {r.workload for r in results}
    assert [r.workload for r in results][:3] == ["model.gpt2.infer.bf16"] * 3  # registry order, eager first
    assert [r.compiler for r in results][:3] == ["eager", "kiln", "inductor"]
    assert "model.vit_b16.infer.bf16: skipped (timm: not importable (x): vit_b16 skipped)" in notes
    busy = [n for n in notes if "other processes kept" in n]  # the stored host load comes back as a note
    assert busy == [
        "gpt2.infer.bf16 kiln: other processes kept 6.5 of 32 cores busy while it was sampled "
        "(host-bound figures read the neighbour too)"
    ]
    stored = by[("model.bert.infer.bf16", "kiln")]
    assert stored.meta.accuracy["pass"] is True and stored.timer == "step"
    assert by[("model.gpt2.infer.bf16", "kiln")].samples == _res("gpt2.infer.bf16", "kiln", 3.0).samples


def test_export_import_keeps_model_meta(tmp_path):
    with Store(tmp_path / "a.sqlite") as a:
        _store_run(a, _synthetic())
        data = a.export()
    with Store(tmp_path / "b.sqlite") as b:
        assert b.import_(data) == (1, 0)
        _, results, _, _ = mrep.collect(b, "gpu")
    kiln = next(r for r in results if r.workload == "model.gpt2.infer.bf16" and r.compiler == "kiln")
    assert kiln.compile_s == 20.0 and kiln.meta.compile_warm_s == 4.0 and kiln.meta.peak_mem_bytes == 2000


def test_report_command_and_errors(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["models", "--report", "--profile", "gpu", "--out", str(out)]) == 2
    assert "error: no gpu model runs in" in capsys.readouterr().err
    with Store(out / "bench.sqlite") as store:
        _store_run(store, _synthetic())
    assert main(["models", "--report", "--profile", "gpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gpt2.infer.bf16" in text and "geomean inductor step ms / kiln step ms = 0.800" in text
    assert (out / "report.md").read_text().startswith("## kiln bench: model tier (gpu)")
    assert json.loads((out / "report.json").read_text())["summary"]["cases"] == 3
    assert json.loads((out / "export.json").read_text())["format"] == "kiln-bench-export"
    assert main(["models", "--device", "cpu", "--only", "nothing*", "--out", str(out)]) == 2
    assert "error: no tiny model matches 'nothing*'" in capsys.readouterr().err
    assert main(["models", "--device", "cpu", "--compilers", "tvmx", "--out", str(out)]) == 2
    assert main(["models", "--device", "cpu", "--list"]) == 0
    assert "model.gpt2.train.fp32" in capsys.readouterr().out


def test_probe_output_is_parsed_and_failures_are_one_line(tmp_path):
    from harness.bench.models.compile_times import Probe, probe

    def run(code: str) -> dict:
        return probe(Probe([sys.executable, "-c", code], mr.probe_env, mr.PROBE_TAG, str(tmp_path), 60), {})

    assert run(f"print('noise'); print({mr.PROBE_TAG!r} + '{{\"compile_s\": 1.5}}')") == {"compile_s": 1.5}
    assert run(f'print({mr.PROBE_TAG!r} + \'{{"error": "RuntimeError: x"}}\')') == {
        "error": "RuntimeError: x"
    }
    crash = "import sys; print('Traceback\\nValueError: bad', file=sys.stderr); sys.exit(3)"
    assert run(crash) == {"error": "probe exit 3: ValueError: bad"}


def test_probe_env_moves_every_compiler_cache_the_harness_process_points_at(tmp_path, monkeypatch):
    """The harness scopes its own process's compiler caches (`commands.scope_this_process`); a probe's
    environment replaces every one of them (and XDG_CACHE_HOME) with a folder under its own, else its cold
    compile would load the graphs the tier compiled in-process."""
    from harness.commands import cache_env

    shared = tmp_path / "scope"
    for var, folder in cache_env(str(shared)).items():
        monkeypatch.setenv(var, folder)
    env = mr.probe_env(tmp_path / "probe")
    moved = [*cache_env("x"), "XDG_CACHE_HOME"]
    assert len(moved) >= 6 and all(Path(env[v]).parent == tmp_path / "probe" for v in moved)
    assert all(Path(env[v]).is_dir() for v in moved)


@pytest.mark.needs("transformers")
def test_a_cold_probe_is_cold_when_the_harness_scoped_its_caches(tmp_path, monkeypatch):
    """A real kiln compile probe (tiny BERT on the CPU), twice, with the harness's scope variables set to one
    shared folder: both probes trace with AOTAutograd and run kiln's passes (neither finds the other's graphs)
    and the shared folder stays empty."""
    from harness.bench.models import compile_times as ct
    from harness.commands import cache_env

    shared = tmp_path / "scope"
    for var, folder in cache_env(str(shared)).items():
        monkeypatch.setenv(var, folder)
    monkeypatch.setenv("KILN_CACHE", "1")  # the graph cache on, as outside the tests
    case = mdl.find("model.bert.infer.fp32", "tiny", "cpu")
    probe = mr.compile_probe(case, "kiln", mr.ModelBenchConfig(device="cpu"))
    for _ in range(2):
        t = ct.measure(case.name, "kiln", probe, autotune=False, warm=False)
        assert not t.error and t.cold_s is not None
        assert t.breakdown.get("aot_autograd", 0) > 0 and "kiln.pass.lower" in t.breakdown
        assert t.counts["graph_hits"] == 0  # the probe's compile counters came back with it
    assert not shared.exists() or not any(p.is_file() for p in shared.rglob("*"))


# ------------------------------------------------------------------ real models (CPU)
def _register(name: str, fn) -> None:
    if name not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name=name)(fn)


def _broken_backend(gm, example_inputs):
    raise RuntimeError("planted compile failure")


def _wrong_backend(gm, example_inputs):
    def run(*args):
        outs = gm(*args)
        return type(outs)(
            o * 1.1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs
        )

    return run


def test_failing_and_wrong_compilers_are_results_not_crashes():
    _transformers_or_skip()
    _register("kiln_test_broken_model", _broken_backend)
    _register("kiln_test_wrong", _wrong_backend)
    cfg = mr.ModelBenchConfig(
        compilers=["eager", "kiln_test_broken_model", "kiln_test_wrong"],
        compile_times=[],
        target_s=0.01,
        rounds=1,
        min_samples=2,
        max_samples=2,
    )
    case = mdl.find("hf_resnet.infer.fp32", "tiny")
    out = {r.compiler: r for r in mr.ModelExecutor(cfg).measure_case(case, cfg.compilers)}
    assert out["eager"].status == "ok" and out["eager"].meta.accuracy["pass"] is True
    assert "replay" not in out["eager"].meta.accuracy  # eager is the baseline: only its first step counts
    broken = out["kiln_test_broken_model"]
    assert broken.status == "error" and "planted compile failure" in broken.error and "\n" not in broken.error
    wrong = out["kiln_test_wrong"]
    assert wrong.status == "ok" and len(wrong.samples) == 2
    assert wrong.meta.accuracy["pass"] is False and wrong.meta.accuracy["first"]["worst"] == "output"
    assert wrong.max_rel_err == pytest.approx(0.1, rel=1e-3)


@pytest.mark.slow
def test_tiny_model_end_to_end_kiln_vs_eager(request, tmp_path, capsys):
    """A real tiny model through the CLI on CPU (the session's shared `tiny_model_run`, a subprocess): kiln in
    Triton's interpreter vs eager, accuracy, timing, cold and warm compile s from fresh subprocesses, the store;
    then `--resume` here on a copy of its folder: nothing measured, the report files written again."""
    _transformers_or_skip()
    shared, proc = request.getfixturevalue("tiny_model_run")
    assert proc["returncode"] == 0, proc["stderr"][-2000:]
    assert "kiln-cg: CUDA graphs need a CUDA device; skipped on cpu" in proc["stderr"]
    out = tmp_path / "models"
    shutil.copytree(shared / "m", out)
    with Store(out / "bench.sqlite") as store:
        (run,) = store.runs()
        results = {r.compiler: r for r in store.results(run.id)}
    assert run.status == "complete" and run.profile == "models-tiny" and run.compilers == ["eager", "kiln"]
    kiln, eager = results["kiln"], results["eager"]
    assert kiln.status == "ok", kiln.error
    assert kiln.meta.accuracy["pass"] is True and kiln.meta.accuracy["replay"]["ok"] is True
    assert kiln.max_rel_err < 1e-4 and kiln.source_hash == eager.source_hash
    assert len(kiln.samples) >= 2 and kiln.median_ns > 0 and eager.median_ns > 0
    assert kiln.compile_s is not None and kiln.compile_s >= 0, kiln.meta.compile_probe_error
    assert kiln.meta.compile_warm_s is not None and kiln.meta.first_call_s > 0
    assert kiln.meta.peak_mem_bytes is None and kiln.meta.kernel is None  # CPU: n/a
    graphs = kiln.meta.kiln_graphs  # kiln's graphs of the step, recorded while it compiled
    assert graphs["graphs"] >= 1 and graphs["kernels"] >= 1 and graphs["cudagraphs"] == []  # no runner on CPU
    assert eager.meta.kiln_graphs is None and eager.meta.combo_guard is None
    guard = kiln.meta.combo_guard  # the combo guard's decisions: on the CPU interpreter every combo by rule
    assert set(guard["counts"]) == {"combined", "split", "cached", "rule", "earlier"}
    assert guard["counts"]["rule"] == len(guard["decisions"]) and all(
        d["how"] == "rule" for d in guard["decisions"]
    )
    # everything stored: nothing measured, the report rewritten (report.json too: no `--json -` here)
    assert main(["models", *TINY_MODEL_ARGS, "--out", str(out), "--quiet", "--resume"]) == 0
    cap = capsys.readouterr()
    assert "resume: every selected case is stored" in cap.err
    assert "kiln-cg: CUDA graphs need a CUDA device; skipped on cpu" in cap.err
    assert "bert.infer.fp32" in cap.out and "cold s (kiln)" in cap.out
    for name in ("report.md", "report.json", "export.json"):
        assert (out / name).stat().st_size > 0
    assert "| bert.infer.fp32 | all |" in (out / "report.md").read_text()
    with Store(out / "bench.sqlite") as store:
        assert len(store.runs()) == 1


def test_resume_skips_stored_cases_and_budget_defers_the_rest(tmp_path, monkeypatch):
    from harness.bench.stores import env

    cases = mdl.cases("tiny", "gpt2,bert")
    gpt2_infer, gpt2_train, bert = cases
    with Store(tmp_path / "b.sqlite") as store:
        run = RunInfo(
            None,
            uuid.uuid4().hex,
            now(),
            profile="models-tiny",
            device="cpu",
            device_name=env.device_name("cpu"),
        )
        store.begin_run(run)
        for c in ("eager", "kiln"):
            store.add_result(
                run.id, Result(gpt2_infer.name, c, gpt2_infer.source_hash, status="error", error="x")
            )
        store.add_result(run.id, Result(gpt2_train.name, "eager", gpt2_train.source_hash))  # kiln missing
        store.add_result(run.id, Result(bert.name, "eager", "old-hash"))
        store.add_result(run.id, Result(bert.name, "kiln", "old-hash"))
        assert mr.stored_cases(store, "tiny", "cpu", cases, ["eager", "kiln"]) == {gpt2_infer.name}
        assert mr.stored_cases(store, "tiny", "cpu", cases, ["eager"]) == {gpt2_infer.name, gpt2_train.name}
        assert mr.stored_cases(store, "gpu", "cpu", cases, ["eager"]) == set()

        calls = []

        def fake_measure(self, case, compilers):
            calls.append(case.name)
            time.sleep(0.05)
            return [
                Result(case.name, c, case.source_hash, samples=[1.0, 2.0], timer="step") for c in compilers
            ]

        monkeypatch.setattr(mr.ModelExecutor, "measure_case", fake_measure)
        cfg = mr.ModelBenchConfig(compilers=["eager"], budget_s=0.08)
        done, results, deferred = mr.run_models(cfg, store, cases, progress=False)
        assert calls == [gpt2_infer.name] and deferred == [gpt2_train.name, bert.name]
        assert done.status == "complete" and [r.workload for r in results] == [gpt2_infer.name]
        cfg.budget_s = 60.0
        _, results, deferred = mr.run_models(cfg, store, cases, progress=False)
        assert deferred == [] and len(results) == 3


def test_latest_baseline_is_per_case_and_ignores_other_chunks(tmp_path):
    from harness.bench.judge.compare import CompareConfig, compare

    with Store(tmp_path / "b.sqlite") as store:
        old = _store_run(store, _synthetic())
        chunk = _store_run(store, [r for r in _synthetic() if r.workload == "model.gpt2.infer.bf16"])
        _store_run(store, [_res("bert.infer.bf16", "kiln", 1.0)], status="running")  # never a baseline
        new = [_res("bert.infer.bf16", "eager", 8.0, seed=7), _res("bert.infer.bf16", "kiln", 2.6, seed=8)]
        run = _store_run(store, new)
        base = mr._model_baseline(store, "latest", run, new)
        assert [b.id for b in base.runs] == [old.id] and set(base.results) == {
            ("model.bert.infer.bf16", c) for c in ("eager", "kiln", "inductor")
        }
        cmps = {c.compiler: c for c in compare(new, base, CompareConfig().for_device("cuda"), new_run=run)}
        assert cmps["kiln"].verdict == "regressed" and cmps["eager"].verdict == "unchanged"
        assert cmps["inductor"].verdict == "missing"  # measured for this case before, not now
        gpt2_only = mr._model_baseline(store, "latest", run, [_res("gpt2.infer.bf16", "eager", 1.0)])
        assert [b.id for b in gpt2_only.runs] == [chunk.id]
        with pytest.raises(mr.BaselineError, match="no earlier complete models-gpu run"):
            mr._model_baseline(store, "latest", run, [_res("t5.infer.bf16", "eager", 1.0)])
        assert set(mr._model_baseline(store, f"run:{old.id}", run, new).results) == set(base.results)


def test_interrupted_run_is_aborted_keeps_its_results_and_is_never_a_baseline(tmp_path, monkeypatch):
    cases = mdl.cases("tiny", "bert,t5")

    def interrupted(self, case, compilers):
        if case.name == cases[1].name:
            raise KeyboardInterrupt
        return [Result(case.name, c, case.source_hash, samples=[1.0, 2.0], timer="step") for c in compilers]

    monkeypatch.setattr(mr.ModelExecutor, "measure_case", interrupted)
    with Store(tmp_path / "b.sqlite") as store:
        with pytest.raises(KeyboardInterrupt):
            mr.run_models(mr.ModelBenchConfig(compilers=["eager"]), store, cases, progress=False)
        (run,) = store.runs()
        assert run.status == "aborted" and [r.workload for r in store.results(run.id)] == [cases[0].name]
        later = _store_run(
            store,
            [Result(cases[0].name, "eager", cases[0].source_hash, samples=[1.0])],
            profile="models-tiny",
            device_name=run.device_name,
        )
        with pytest.raises(mr.BaselineError):
            mr._model_baseline(store, "latest", later, store.results(later.id))


# ------------------------------------------------------------------ compile times alone
def _compile_res(case: str, compiler: str, cold: float | None, warm: float | None, h: str = "h1") -> Result:
    r = Result(f"model.{case}", compiler, f"{h}-{case}", phase=COMPILE_PHASE, timer="step")
    r.compile_s, r.meta.compile_warm_s = cold, warm
    if cold is None:
        r.status, r.error = "error", "cold: probe exit 1: boom"
        r.meta.compile_probe_error = r.error
    return r


def test_compile_only_results_fill_in_compile_times_of_older_step_results(tmp_path):
    """A `--compile-only` run's numbers go beside the step results of the same definition when they are
    newer; a step run measured after them keeps its own; a changed definition or a case without steps
    gets a note instead; the step samples never change."""
    with Store(tmp_path / "b.sqlite") as store:
        steps = _store_run(store, _synthetic())
        probes = _store_run(
            store,
            [
                _compile_res("gpt2.infer.bf16", "kiln", 7.0, 0.5),
                _compile_res("gpt2.infer.bf16", "inductor", None, None),  # the newest probe failed
                _compile_res("bert.infer.bf16", "kiln", 9.0, 1.0, h="h0"),  # an older definition
                _compile_res("t5.infer.bf16", "kiln", 3.0, 0.2),  # no step result at all
            ],
        )
        later = _store_run(store, [_res("resnet50.infer.bf16", "inductor", 9.0, cold=11.0, warm=2.5)])
        _store_run(
            store, [_compile_res("resnet50.infer.bf16", "inductor", 99.0, 9.0)]
        )  # newer than `later`: it wins
        runs, results, notes, alone = mrep.collect(store, "gpu")
    by = {(r.workload, r.compiler): r for r in results}
    assert all(r.phase == "main" for r in results)
    assert [(r.workload, r.compiler, r.compile_s, r.meta.compile_run_id) for r in alone] == [
        ("model.t5.infer.bf16", "kiln", 3.0, probes.id)
    ]
    kiln = by[("model.gpt2.infer.bf16", "kiln")]
    assert (kiln.compile_s, kiln.meta.compile_warm_s, kiln.meta.compile_run_id) == (7.0, 0.5, probes.id)
    assert kiln.median_ns == pytest.approx(5e6, rel=0.01) and kiln.meta.run_id == steps.id
    ind = by[("model.gpt2.infer.bf16", "inductor")]
    assert ind.compile_s is None and "boom" in ind.meta.compile_probe_error
    assert by[("model.bert.infer.bf16", "kiln")].compile_s == 30.0  # the h0 probe is another definition
    # the newest compile-only run is newer than `later`, so it wins; a step run after it would keep its own
    assert by[("model.resnet50.infer.bf16", "inductor")].compile_s == 99.0
    assert probes.id in {r.id for r in runs} and later.id in {r.id for r in runs}
    assert not any("model.t5.infer.bf16" in n for n in notes)  # reported on its own, not "not measured"
    assert any("model.bert.infer.bf16: compile times of kiln" in n for n in notes)
    s = mrep.summary(results)
    assert s["compilers"]["kiln"]["compile_cold_s_mean"] == pytest.approx((7.0 + 30.0) / 2)


def test_a_compile_only_store_reports_its_compile_times(tmp_path, capsys):
    """A store holding only `--compile-only` runs (no step timed): the report gives each case's cold and warm s
    per compiler, kiln's cold s over Inductor's, the per-phase breakdown and the failed probe, in Markdown,
    JSON and on the terminal; before, every measurement was a "left out" note under an empty table."""
    kiln = _compile_res("ci_gpt2.train.fp32", "kiln", 12.4, 3.0)
    kiln.meta.compile_cpus = 4
    kiln.meta.compile_breakdown = {"dynamo": 1.5, "aot_autograd": 2.0, "kiln.pass.render": 0.4}
    with Store(tmp_path / "bench.sqlite") as store:
        run = _store_run(
            store,
            [
                kiln,
                _compile_res("ci_gpt2.train.fp32", "inductor", 22.4, 4.3),
                _compile_res("ci_resnet18.train.amp", "kiln", None, None),
            ],
        )
        assert mrep.write_reports(store, "gpu", tmp_path / "out") == 0
    out = capsys.readouterr().out
    md = (tmp_path / "out" / "report.md").read_text()
    assert "### Compile times without step results" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| ci_gpt2.train.fp32 | kiln |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:] == ["12.40", "3.00", "0.554 (inductor)", "4", str(run.id)]
    ratio = (
        "geomean kiln cold compile s / inductor cold compile s = 0.554 over 1 case(s) "
        "(least 0.554 ci_gpt2.train.fp32, greatest 0.554 ci_gpt2.train.fp32)"
    )
    assert f"- {ratio}" in md
    assert "| ci_resnet18.train.amp | kiln | error: cold: probe exit 1: boom |" in md
    assert "### Cold compile per phase" in md and "render 0.40" in md
    assert "left out" not in md
    js = json.loads((tmp_path / "out" / "report.json").read_text())
    got = {(c["case"], c["compiler"]): c for c in js["compile_only"]}
    assert got[("model.ci_gpt2.train.fp32", "inductor")]["compile_cold_s"] == 22.4
    assert got[("model.ci_resnet18.train.amp", "kiln")]["status"] == "error"
    assert "compile times without step results:" in out and "0.554 (inductor)" in out and ratio in out
    assert got[("model.ci_gpt2.train.fp32", "kiln")]["compile_cpus"] == 4


@pytest.mark.needs("transformers")  # the CLI selects the tiny models only where their package imports
def test_compile_only_cli_stores_compile_phase_resumes_and_reports(tmp_path, monkeypatch, capsys):
    """`--compile-only` through the CLI (the subprocess probes replaced: the real ones are covered by the
    end-to-end test above): one compile-phase result per --compile-times compiler and case, no step run,
    `--resume` skips what is stored, and bad option combinations are one-line usage errors."""
    calls = []

    def fake_measure(case, compiler, p, autotune=True, warm=True):
        calls.append((case, compiler))
        assert warm and p.cpus is None  # one job: the probe has every CPU
        if compiler == "kiln":
            return ct.CompileTimes(case, compiler, 2.5, 0.25)
        return ct.CompileTimes(case, compiler, error="cold: probe exit 1: no")

    monkeypatch.setattr(ct, "measure", fake_measure)
    out = tmp_path / "m"
    args = ["models", "--device", "cpu", "--only", "gpt2.infer.*", "--out", str(out), "--quiet"]
    assert main([*args, "--compile-only", "--compile-times", "kiln,inductor"]) == 0
    assert calls == [("model.gpt2.infer.fp32", "kiln"), ("model.gpt2.infer.fp32", "inductor")]
    with Store(out / "bench.sqlite") as store:
        (run,) = store.runs()
        assert store.results(run.id) == []  # nothing of phase main
        got = {r.compiler: r for r in store.results(run.id, phase=COMPILE_PHASE)}
    assert run.compilers == ["kiln", "inductor"] and run.config["compile_only"] is True
    assert got["kiln"].status == "ok" and got["kiln"].compile_s == 2.5 and got["kiln"].samples == []
    assert got["inductor"].status == "error" and "probe exit 1" in got["inductor"].error
    capsys.readouterr()
    assert main([*args, "--compile-only", "--compile-times", "kiln,inductor", "--resume"]) == 0
    assert "resume: every selected case is stored" in capsys.readouterr().err and len(calls) == 2
    for bad, why in (
        (["--compile-only", "--compile-times", "none"], "needs --compile-times"),
        (["--compile-only", "--compile-times", "eager"], "eager has no compile time"),
        (["--compile-only", "--compile-times", "kiln", "--compile-jobs", "0"], "--compile-jobs 0: give 1 to"),
        (["--compile-jobs", "2"], "--compile-jobs above 1 needs --compile-only"),
    ):
        assert main([*args, *bad]) == 2
        assert why in capsys.readouterr().err


@pytest.mark.needs("transformers")  # the CLI selects the tiny models only where their package imports
def test_compile_jobs_probe_cases_at_once_on_disjoint_cpus(tmp_path, monkeypatch, capsys):
    """`--compile-jobs 2 --cold-only`: two cases probed at once, each on its own half of the CPUs (a case's
    compilers in turn on the same half), no warm probe; every result stored with the CPUs its probes had."""
    import os
    import threading

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two CPUs")
    from harness.bench.models import compile_times as ct

    halves = ct.cpu_slices(2)
    seen: list[tuple[str, str, tuple[int, ...] | None, bool]] = []
    inside, most = [0], [0]
    lock = threading.Lock()
    both_started = threading.Barrier(2, timeout=30)

    def fake_measure(case, compiler, p, autotune=True, warm=True):
        with lock:
            seen.append((case, compiler, p.cpus, warm))
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        if compiler == "kiln":
            both_started.wait()  # the two cases' first probes overlap, or this times out
        with lock:
            inside[0] -= 1
        return ct.CompileTimes(case, compiler, 2.0 if compiler == "kiln" else 4.0)

    monkeypatch.setattr(ct, "measure", fake_measure)
    out = tmp_path / "m"
    only = "gpt2.infer.*,bert.infer.*"
    args = ["models", "--device", "cpu", "--only", only, "--out", str(out), "--quiet", "--compile-only"]
    assert main([*args, "--compile-times", "kiln,inductor", "--compile-jobs", "2", "--cold-only"]) == 0
    assert most[0] == 2 and len(seen) == 4 and not any(warm for *_, warm in seen)
    per_case = {}
    for case, compiler, cpus, _ in seen:
        per_case.setdefault(case, []).append((compiler, cpus))
    assert {c for c in per_case} == {"model.gpt2.infer.fp32", "model.bert.infer.fp32"}
    for probes in per_case.values():
        assert [c for c, _ in probes] == ["kiln", "inductor"] and probes[0][1] == probes[1][1]
    assert sorted(p[0][1] for p in per_case.values()) == sorted(halves)
    with Store(out / "bench.sqlite") as store:
        (run,) = store.runs()
        got = store.results(run.id, phase=COMPILE_PHASE)
    assert len(got) == 4 and {r.meta.compile_cpus for r in got} == {len(halves[0]), len(halves[1])}
    assert run.config["compile_jobs"] == 2 and run.config["compile_warm"] is False
    md = (out / "report.md").read_text()
    assert "geomean kiln cold compile s / inductor cold compile s = 0.500 over 2 case(s)" in md


def test_optimizer_rows_compile_the_step_alone():
    """`opt` cases: the optimizer's step alone over fixed gradients (foreach), named with their optimizer; the
    step moves the weights, and the captured tensors are the compared parameters after it."""
    from harness.bench.models.run import Stepper

    gpu = {c.name: c for c in mdl.all_cases("gpu", "cuda")}
    assert {
        "model.resnet50.opt_adamw.fp32",
        "model.resnet50.opt_sgd.fp32",
        "model.gpt2.opt_adamw.fp32",
    } <= set(gpu)
    assert (
        gpu["model.resnet50.opt_sgd.fp32"].optimizer == "sgd"
        and gpu["model.resnet50.opt_sgd.fp32"].mode == "opt"
    )
    with pytest.raises(ValueError, match="without its optimizer"):
        mdl._parse(mdl.MODELS[0], "tiny", "opt", "cpu")
    _transformers_or_skip()
    case = mdl._parse(mdl.MODELS[0], "tiny", "opt:sgd", "cpu")
    assert case.name == "model.gpt2.opt_sgd.fp32"
    base = case.build(0)
    st = Stepper(case, base, "eager", torch.device("cpu"))
    assert st.opt is not None and all(g["foreach"] for g in st.opt.param_groups)
    # primed: every parameter has its momentum buffer before the first step, the weights are still the model's
    params = list(st.model.parameters())
    assert all(st.opt.state[p].get("momentum_buffer") is not None for p in params)
    assert all(torch.equal(p, q) for p, q in zip(params, base.parameters()))
    assert [g["lr"] for g in st.opt.param_groups] == [1e-2]
    first = st.step(capture=True)
    assert first and all(k.startswith("param:") for k in first)
    again = st.step(capture=True)
    assert any(not torch.equal(first[k], again[k]) for k in first)  # momentum keeps moving the weights
    ref = Stepper(case, base, "eager", torch.device("cpu"), dtype=torch.float64).step(capture=True)
    for k, v in first.items():
        torch.testing.assert_close(v.double(), ref[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_primed_optimizer_step_compiles_once(optimizer):
    """The compiled step of an `opt` case is the steady-state one: its first and later calls run the same kiln
    graph (unprimed, the first call compiled a state-creating graph and the second recompiled), and it moves
    the weights as eager's step does."""
    import compiler
    from harness.bench.models.run import Stepper

    _transformers_or_skip()
    case = mdl._parse(mdl.MODELS[0], "tiny", f"opt:{optimizer}", "cpu")
    base = case.build(0)
    torch._dynamo.reset()
    with compiler.capture() as graphs:
        st = Stepper(case, base, "kiln", torch.device("cpu"))
        got = st.step(capture=True)
        after_first = len(graphs)
        st.step()
    assert after_first >= 1 and len(graphs) == after_first
    want = Stepper(case, base, "eager", torch.device("cpu")).step(capture=True)
    assert got and want and got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_combo_table_counts_each_kiln_arms_guard_decisions_and_the_time_they_save():
    from harness.bench.core.records import Result
    from harness.bench.models.report import combo_table

    timed = [
        {
            "kernel": "combo_0",
            "parts": 12,
            "how": "timed",
            "split": False,
            "combo_us": 10.0,
            "parts_us": 31.5,
        },
        {"kernel": "combo_1", "parts": 3, "how": "timed", "split": True, "combo_us": 9.0, "parts_us": 8.0},
        {"kernel": "combo_2", "parts": 2, "how": "cached", "split": False},
    ]
    counts = {"combined": 1, "split": 1, "cached": 1, "rule": 0}
    rs = [
        Result(
            "model.x.opt_adamw.fp32",
            "kiln",
            "h",
            meta={"combo_guard": {"counts": counts, "decisions": timed}},
        ),
        Result(
            "model.x.opt_adamw.fp32",
            "kiln-cg",
            "h",
            meta={"combo_guard": {"counts": {"rule": 2}, "decisions": [{"how": "rule", "split": False}] * 2}},
        ),
        Result(
            "model.x.infer.fp32",
            "kiln-cg",
            "h",
            meta={
                "combo_guard": {"counts": {"earlier": 1}, "decisions": [{"how": "earlier", "split": True}]}
            },
        ),
        Result("model.x.opt_adamw.fp32", "inductor", "h"),
        Result("model.y.infer.fp32", "kiln", "h", meta={"combo_guard": {"counts": {}, "decisions": []}}),
    ]
    table = combo_table(rs)
    assert table[0] == [
        "model",
        "compiler",
        "combos",
        "combined",
        "split",
        "cached",
        "rule",
        "earlier",
        "us saved",
    ]
    assert table[1:] == [
        ["x.opt_adamw.fp32", "kiln", "3", "1", "1", "1", "0", "0", "21.5"],
        ["x.opt_adamw.fp32", "kiln-cg", "2", "0", "0", "0", "2", "0", "-"],
        ["x.infer.fp32", "kiln-cg", "1", "0", "0", "0", "0", "1", "-"],
    ]


def test_addmm_table_counts_distinct_products_by_form_and_the_time_saved():
    from harness.bench.core.records import Result
    from harness.bench.models.report import addmm_table

    def d(m, form, lt, chosen):
        return {
            "m": m,
            "n": 512,
            "k": 512,
            "dtype": "torch.float32",
            "us": {"lt": lt, form: chosen},
            "form": form,
        }

    log = [
        d(2048, "expand", 30.0, 25.5),
        d(2048, "expand", 30.0, 25.5),
        d(4096, "lt", 50.0, 50.0),
        d(8, "mm", 9.0, 8.0),
    ]
    rs = [
        Result("model.x.train.fp32", "kiln", "h", meta={"addmm_forms": log}),
        Result("model.x.train.fp32", "kiln-cg", "h", meta={"addmm_forms": []}),
        Result("model.x.train.fp32", "inductor", "h"),
    ]
    table = addmm_table(rs)
    assert table == [
        ["model", "compiler", "timed", "lt", "expand", "mm", "us saved"],
        ["x.train.fp32", "kiln", "3", "1", "1", "1", "5.5"],
    ]
    again = Result.from_dict(rs[0].as_dict())
    assert again.meta.addmm_forms == log


def test_host_time_is_sampled_in_every_round_the_compilers_taking_turns():
    """The model tier takes its host samples where it takes its step samples: in each arm's turn of every round,
    so both compilers' host figures come from the same stretch of the host's life (not one after the other,
    each right after its own compile); an arm without `host_steps` (CPU) takes none."""
    from harness.bench.core.executor import OpenCase

    log: list[tuple[str, str]] = []

    class Stub:
        def __init__(self, arm: str) -> None:
            self.arm = arm

        def step(self, capture: bool = False) -> None:
            log.append((self.arm, "host"))

        def timed(self, steps: int) -> float:
            log.append((self.arm, "step"))
            return 1.0

    cfg = mr.ModelBenchConfig(compilers=["eager"], compile_times=[], rounds=2)
    arms = {
        a: mr.Prepared(Stub(a), Result("model.x.infer.fp32", a, "h"), 1, 2, None, host_steps=1, launches=4.0)
        for a in ("kiln", "inductor")
    }
    mr.ModelExecutor(cfg).sample_case(OpenCase("x", dict(arms)))
    turns = [a for k, (a, kind) in enumerate(log) if kind == "step" and (k == 0 or log[k - 1][0] != a)]
    assert turns == ["kiln", "inductor", "kiln", "inductor"]
    assert [kind for a, kind in log if a == "kiln"] == ["step", "host", "host"] * 2  # idle start, loop
    for a in arms.values():
        h = a.result.meta.host
        assert h["host_n"] == 2 and h["host_us_per_launch"] == pytest.approx(h["host_ms"] * 250, abs=0.01)
    cpu = mr.Prepared(Stub("eager"), Result("model.x.infer.fp32", "eager", "h"), 1, 2)
    mr.ModelExecutor(cfg).take(cpu, 1)
    assert not cpu.result.meta.host


def test_host_samples_and_their_table():
    """`HostSamples` times each step's return on an idle device and back to back, and the process's CPU time
    per step (here: CPU steps of known work: a sleep takes wall time and almost no CPU time, a busy loop both),
    adding samples at every `take`; the summary divides by the launches it is given; the report's host table
    shows it per compiler, `-` where not measured."""
    from harness.bench.core.records import Result
    from harness.bench.models.report import host_table
    from harness.bench.models.step_facts import HostSamples

    calls = []

    def sleeping():
        calls.append(1)
        time.sleep(0.002)

    h = HostSamples()
    h.take(sleeping, torch.device("cpu"), 3)
    h.take(sleeping, torch.device("cpu"), 2)
    s = h.summary(launches=4.0)
    assert len(calls) == 10 and s["host_n"] == 5  # five started on an idle device, five back to back
    assert s["host_ms"] >= 2.0 and s["host_ms_loop"] >= 2.0 and s["host_cpu_ms"] < 1.0
    assert s["host_us_per_launch"] == pytest.approx(s["host_ms"] * 250, rel=0.01)
    assert "host_us_per_launch" not in h.summary() and HostSamples().summary() == {}

    def busy():
        t0 = time.process_time()
        while time.process_time() - t0 < 0.003:
            pass

    b = HostSamples()
    b.take(busy, torch.device("cpu"), 3)
    assert b.summary()["host_cpu_ms"] >= 3.0
    rs = [
        Result(
            "model.x.opt_sgd.fp32",
            "kiln",
            "h",
            meta={
                "host": {"host_ms": 1.5, "host_us_per_launch": 7.5},
                "kernel": {"kernel_ms": 0.2, "launches": 200},
            },
        ),
        Result("model.x.opt_sgd.fp32", "inductor", "h"),
        Result(
            "model.y.infer.fp32",
            "kiln",
            "h",
            meta={
                "host": {"host_ms": 3.2, "host_ms_loop": 1.5},
                "kernel": {"kernel_ms": 0.4, "launches": 60},
            },
        ),
    ]
    table = host_table(rs, ["kiln", "inductor"])
    assert table[0][:4] == ["model", "kiln host ms", "kiln launches", "kiln us/launch"]
    assert table[1] == [
        "x.opt_sgd.fp32",
        "1.500",
        "200",
        "7.5",
        "-",
        "-",
        "-",
    ]  # stored before the loop figure
    assert table[2] == ["y.infer.fp32", "3.200 (1.500)", "60", "-", "-", "-", "-"]
    rs[2].meta.host["host_cpu_ms"] = 1.25
    assert host_table(rs, ["kiln"])[2][1] == "3.200 (1.500; cpu 1.250)"
