"""The GPU run's pipeline rehearsed on CPU (`--allow-cpu`, tiny sizes): two runs, spread report, exports."""

from __future__ import annotations

import json

from harness.bench.cli import main


def test_gpu_run_pipeline_on_cpu(tmp_path, capsys):
    out = tmp_path / "gpu"
    code = main(
        [
            "gpu",
            "--device",
            "cpu",
            "--allow-cpu",
            "--compilers",
            "eager",
            "--only",
            "softmax.bwd.*,row_sum.*",
            "--target-s",
            "0.01",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "run 2 against run 1:" in text and "spread between runs for workloads above 100 us" in text
    for name in (
        "bench.sqlite",
        "report.md",
        "report.json",
        "export.json",
        "run2_vs_run1.png",
    ):
        assert (out / name).exists(), name
    assert not (out / "speedups.png").exists()  # eager alone: no empty speedup figure
    rep = json.loads((out / "report.json").read_text())
    assert rep["spread"]["goal"] == 0.03 and rep["baseline_runs"] == [1]
    assert len(json.loads((out / "export.json").read_text())["runs"]) == 2
    md = (out / "report.md").read_text()
    assert "### Spread between run 1 and run 2" in md and "speedup over eager" in md


def test_gpu_run_refuses_cpu_without_flag(tmp_path, capsys):
    assert main(["gpu", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "needs a GPU" in capsys.readouterr().err
