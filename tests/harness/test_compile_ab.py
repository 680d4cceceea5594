"""``ci/compile_ab.sh``: the summary of an A/B of kiln's cold compile (the runs themselves need a GPU box)."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report(folder: Path, rows: list[tuple[str, str, float | None]]) -> None:
    """A compile-only ``report.json`` as ``harness bench models --compile-only`` writes it: one row per case
    and compiler (None: a failed probe, no cold time)."""
    folder.mkdir(parents=True)
    only = [
        {
            "case": case,
            "compiler": compiler,
            "status": "ok" if cold is not None else "error",
            "compile_cold_s": cold,
        }
        for case, compiler, cold in rows
    ]
    (folder / "report.json").write_text(json.dumps({"cases": [], "compile_only": only}))


def test_the_summary_gives_every_run_and_the_ratio_of_the_means(tmp_path):
    _report(
        tmp_path / "base-1",
        [
            ("model.ci_a.train.fp32", "kiln", 10.0),
            ("model.ci_a.train.fp32", "inductor", 20.0),
            ("model.ci_c.train.fp32", "kiln", None),
        ],
    )
    _report(tmp_path / "base-2", [("model.ci_a.train.fp32", "kiln", 12.0)])
    _report(
        tmp_path / "head-1",
        [("model.ci_a.train.fp32", "kiln", 8.0), ("model.ci_b.infer.bf16", "kiln", 5.0)],
    )
    _report(tmp_path / "head-2", [("model.ci_a.train.fp32", "kiln", 9.0)])
    done = subprocess.run(
        ["bash", "ci/compile_ab.sh", str(tmp_path), str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "AB_REPS": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert "| model.ci_a.train.fp32 | 10.00 / 12.00 | 8.00 / 9.00 | 0.773 |" in lines
    assert "| model.ci_b.infer.bf16 |  | 5.00 | - |" in lines  # measured on one side only: no ratio
    assert not any("inductor" in line or "ci_c" in line for line in lines)  # Inductor's rows, failed probes


def test_a_missing_base_tree_stops_the_script(tmp_path):
    done = subprocess.run(
        ["bash", "ci/compile_ab.sh", str(tmp_path / "absent"), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "absent" in done.stderr
