"""The command line end to end on a tiny subset (eager only, CPU): run, compare, list, show, export/import,
plot, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import make_results, medians, store_run

from harness.bench.cli import main
from harness.bench.stores.store import Store

ROOT = Path(__file__).resolve().parents[3]
FAST = [
    "--device",
    "cpu",
    "--compilers",
    "eager",
    "--only",
    "softmax.fwd.*,row_sum.*,layer_norm.fwd.fp32.*",
    "--target-s",
    "0.01",
    "--rounds",
    "2",
    "--quiet",
]


@pytest.mark.needs("matplotlib")
def test_run_compare_report_export_import_plot(tmp_path, capsys):
    db = tmp_path / "b.sqlite"
    assert main(["run", *FAST, "--db", str(db), "--label", "first"]) == 0
    md, js, plots = tmp_path / "r.md", tmp_path / "r.json", tmp_path / "plots"
    code = main(
        [
            "run",
            *FAST,
            "--db",
            str(db),
            "--baseline",
            "latest",
            "--md",
            str(md),
            "--json",
            str(js),
            "--plots",
            str(plots),
            "--threshold",
            "0.9",
        ]
    )
    assert code == 0
    cap = capsys.readouterr()
    out = cap.out
    assert "softmax.fwd.fp32.64x128" in out and "against baseline run(s) 1" in out
    report = json.loads(js.read_text())
    assert report["counts"]["regressed"] == 0 and len(report["results"]) == 4
    assert report["results"][0]["gbps"] > 0 and report["environment"]
    assert "## kiln bench: run 2" in md.read_text()
    # eager alone has no speedup to draw: no empty figure, a note instead; the ratios are drawn
    assert not (plots / "run2_speedups.png").exists() and (plots / "run2_ratios.png").stat().st_size > 0
    assert "note: no speedup plot for run 2" in cap.err

    assert main(["compare", "2", "run:1", "--db", str(db), "--no-fail"]) == 0
    assert main(["list", "--db", str(db)]) == 0
    assert main(["show", "latest", "--db", str(db)]) == 0
    exp = tmp_path / "e.json"
    assert main(["export", str(exp), "--db", str(db)]) == 0
    db2 = tmp_path / "merged.sqlite"
    assert main(["import", str(exp), str(exp), "--db", str(db2)]) == 0
    out = capsys.readouterr().out
    assert "2 run(s) added" in out and "2 already present" in out
    assert main(["plot", "--from-json", str(exp), "--out", str(tmp_path / "p2")]) == 0
    assert (tmp_path / "p2" / "history.png").exists()


def test_compare_of_stored_runs_raises_suspects_only(tmp_path, capsys):
    """Stored samples against stored samples can only raise a suspect (nothing is measured side by side): exit 0,
    the slowdown reported as `suspect` (synthetic samples: no timing involved)."""
    db = tmp_path / "b.sqlite"
    with Store(db) as s:
        a = store_run(s, make_results(medians(), seed=1))
        b = store_run(s, make_results(medians({("w04", "inductor"): 1.2}), seed=2))
        c = store_run(s, make_results(medians(), seed=3))
    assert main(["compare", str(b.id), f"run:{a.id}", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert (
        "regressed: 0" in out and "suspect: 1" in out and "w04" in out and "not confirmed side by side" in out
    )
    assert main(["compare", str(b.id), f"run:{a.id}", "--db", str(db), "--threshold", "0.3"]) == 0
    assert main(["compare", str(c.id), f"run:{a.id}", "--db", str(db)]) == 0
    assert main(["compare", "latest", "window:2", "--db", str(db)]) == 0  # c against runs b and a pooled


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--device", "cpu", "--only", "nope*"], "no tiny workload matches"),
        (["run", "--device", "cpu", "--compilers", "tvm9"], "unknown compiler"),
        (["run", "--device", "cpu", "--timer", "event"], "needs a GPU"),
        (["run", "--device", "tpu"], "bad device"),
        (["run", "--device", "cpu", "--plant", "x=y"], "bad plant"),
        (["run", "--device", "cpu", "--baseline", "window:0"], "window needs a positive count"),
        (["run", "--device", "cpu", "--threshold", "5"], "between 0 and 1"),
        (["compare", "7", "latest"], "no run 7"),
        (["show", "abc"], "bad run id"),
        (["import", "missing.json"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    if argv[0] in (
        "compare",
        "show",
    ):  # readers need a store (a missing one is its own error: test_bench_newcomer)
        Store(tmp_path / "b.sqlite").close()
    assert main([*argv, "--db", str(tmp_path / "b.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("harness bench: error: ")


def test_import_of_non_json_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    assert main(["import", str(bad), "--db", str(tmp_path / "b.sqlite")]) == 2
    assert "is not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("KILN_BENCH_ALPHA", "often", "KILN_BENCH_ALPHA='often': expected a number"),
        ("KILN_BENCH_THRESHOLD", "5%", "KILN_BENCH_THRESHOLD='5%': expected a number"),
        (
            "KILN_BENCH_PLANT",
            "softmax*=lots",
            "KILN_BENCH_PLANT='softmax*=lots': fraction 'lots' is not a number",
        ),
    ],
)
def test_bad_environment_value_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, var, value, message):
    """The bench's variables are read through harness/settings.py; a bad value stops the run before it starts."""
    monkeypatch.setenv(var, value)
    assert main(["run", "--device", "cpu", "--only", "nope*", "--db", str(tmp_path / "b.sqlite")]) == 2
    assert capsys.readouterr().err.strip() == f"harness bench: error: {message}"


def test_bench_errors_are_harness_errors():
    from harness.exc import BaselineError, BenchError, HarnessError, ImportFormatError, StoreError, UsageError

    for cls in (BenchError, UsageError, StoreError, ImportFormatError, BaselineError):
        assert issubclass(cls, HarnessError) and cls.exit_code == 2


def test_harness_verb_and_module_entry_point(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["-m", "harness.bench", "workloads"], ["-m", "harness", "bench", "workloads"]):
        p = subprocess.run(
            [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0, p.stderr
        assert "27 workloads in profile tiny" in p.stdout


def test_backend_verb_native_keeps_history_in_the_results_folder(tmp_path, capsys):
    """`bench backend --native` (nox bench-cuda/rocm without a container), run twice: history builds."""
    out = tmp_path / "res"
    argv = [
        "backend",
        "--backend",
        "cpu",
        "--native",
        "--results",
        str(out),
        "--",
        "--compilers",
        "eager",
        "--only",
        "row_sum.*",
        "--target-s",
        "0.01",
        "--quiet",
        # this test is about history; whether 0.01 s of samples flag a change is the machine's noise: no failure,
        # and a threshold (90%) that this noise does not reach, so that no suspect is measured again side by side
        "--no-fail",
        "--threshold",
        "0.9",
    ]
    assert main(argv) == 0
    assert main(argv) == 0
    from harness.bench.stores.store import Store

    with Store(out / "bench.sqlite") as s:
        runs = s.runs()
        assert [r.status for r in runs] == ["complete", "complete"]
        assert runs[0].git_commit and runs[0].label == "cpu/native"
    assert "against baseline run(s) 1" in (out / "bench.log").read_text()
