"""Reports tell the truth on a laptop: kiln's CPU times are Triton-interpreter times, so they get no speedup
over eager (kernel tier and model tier alike); they are read against kiln's own history instead."""

from __future__ import annotations

from bench_helpers import make_results, make_run

from harness.bench.core.records import Meta
from harness.bench.judge.compare import Comparison
from harness.bench.models import report as mrep
from harness.bench.reports import report

MEDIANS = {("softmax", "kiln"): 9e6, ("softmax", "inductor"): 2e4, ("softmax", "eager"): 1e4}


def test_cpu_side_by_side_gives_kiln_no_speedup_but_its_ratio_to_base():
    results = make_results(MEDIANS)
    cmps = [Comparison("softmax", "kiln", "unchanged", ratio=1.03)]
    rows = report.side_by_side(results, ["kiln", "inductor", "eager"], "cpu", cmps)
    assert rows[0][:4] == ["workload", "kiln (interpreter)", "inductor", "eager"]
    kiln, inductor = rows[1][1], rows[1][2]
    assert kiln.endswith("(1.03x of base)") and "x)" not in kiln.replace("x of base)", "")
    assert inductor.endswith("(0.50x)")  # native code: the speedup over eager stands


def test_gpu_side_by_side_keeps_kiln_speedups():
    rows = report.side_by_side(make_results(MEDIANS), ["kiln", "inductor", "eager"], "cuda")
    assert rows[0][1] == "kiln" and rows[1][1].endswith("x)")


def test_cpu_markdown_report_says_interpreter_and_plots_no_kiln_speedup():
    run = make_run("cpu")
    run.compilers = ["kiln", "inductor", "eager"]
    md = report.markdown_report(run, make_results(MEDIANS), None)
    assert report.INTERPRETER_NOTE in md
    bars = md.split("```")[1]
    assert "[inductor]" in bars and "[kiln]" not in bars
    gpu = make_run("cuda")
    gpu.compilers = run.compilers
    assert report.INTERPRETER_NOTE not in report.markdown_report(gpu, make_results(MEDIANS), None)


def test_model_tier_summary_on_cpu_has_no_kiln_speedup_or_ratio():
    results = make_results({("model.gpt2.infer.fp32", c): m for (_, c), m in MEDIANS.items()})
    for r in results:
        r.meta = Meta(accuracy={"ok": True})
    interp = frozenset({"kiln"})
    s = mrep.summary(results)
    table = mrep.summary_table(s, device_is_gpu=False, interp=interp)
    kiln_row = next(r for r in table if r[0] == "kiln")
    assert kiln_row[2] == "n/a (interpreter)"
    assert all("kiln" not in line for line in mrep.ratio_lines(s, interp))
    head = mrep.model_table(results, interp=interp)[0]
    assert "kiln ms (interpreter)" in head and "kiln x" not in head and "inductor x" in head
