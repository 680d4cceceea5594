"""`bench history`: series over stored runs, the table of the last runs with ratios and verdict marks, the
per-workload PNG plots, and one-line errors (missing store, no matching workload, no complete run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import make_results, medians, store_run

from harness.bench.cli import main
from harness.bench.reports import history
from harness.bench.stores.store import Store

pytest.importorskip("matplotlib")

PLANTED = ("w03", "inductor")


def _fill(path: Path, n: int = 4, planted_at: int = 3) -> None:
    """`n` complete CPU runs of 24 workloads; run `planted_at` (0-based) makes w03 under inductor 30% slower,
    the runs after it keep that level; an aborted run and a model-tier run are stored too."""
    with Store(path) as s:
        for i in range(n):
            scale = {PLANTED: 1.3} if i >= planted_at else None
            store_run(s, make_results(medians(scale), seed=i), commit=f"c{i}0000000000")
        store_run(s, make_results(medians({PLANTED: 3.0}), seed=99), complete=False, commit="dead")
        store_run(
            s, make_results({("model.gpt2.infer.fp32", "eager"): 1e6}), profile="models-tiny", commit="m0"
        )


def test_runs_without_stored_verdicts_are_recomputed_and_flag_only_suspects(tmp_path):
    db = tmp_path / "b.sqlite"
    _fill(db, n=5, planted_at=3)
    with Store(db) as s:
        h = history.collect(s, ["w0[0-4]"], profile="tiny")
    assert h.workloads() == ["w00", "w01", "w02", "w03", "w04"]
    assert [r.git_commit[:2] for r in h.runs] == ["c0", "c1", "c2", "c3", "c4"]  # the aborted run is left out
    # nothing measured side by side: a recomputed flag is a suspect, never a regression
    assert history.regressions(h) == []
    sus = history.flagged(h)
    assert [(p.result.workload, p.result.compiler, p.run.git_commit[:2], p.cmp.verdict) for p in sus] == [
        ("w03", "inductor", "c3", "suspect")
    ]
    assert 1.2 < sus[0].cmp.ratio < 1.4 and sus[0].cmp.recomputed
    rows = history.table(h, last=3)
    assert rows[0][:3] == ["run", "date", "commit"] and rows[0][-1] == "verdicts"
    assert len(rows) == 1 + 3 and [r[2] for r in rows[1:]] == ["c4000000", "c3000000", "c2000000"]
    assert [r[-1] for r in rows[1:]] == ["recomputed"] * 3
    col = rows[0].index("w03 [inductor]")
    assert rows[2][col].endswith("? suspect") and "x1.3" in rows[2][col]  # run c3: the planted step
    assert rows[1][col].endswith("=")  # c4 stays at the new level: unchanged against c3
    assert all(r[c].endswith("=") for r in rows[1:] for c in range(3, len(r) - 1) if c != col)
    first = history.table(h, last=10)[-1]
    assert (
        first[2] == "c0000000"
        and all(x.endswith(history.MARKS["new"]) for x in first[3:-1])
        and first[-1] == "-"
    )


def test_cli_writes_markdown_and_plots(tmp_path, capsys):
    db, md, out = tmp_path / "b.sqlite", tmp_path / "h.md", tmp_path / "plots"
    _fill(db)
    code = main(["history", "w03", "w1*", "--db", str(db), "--md", str(md), "--out", str(out), "--last", "2"])
    assert code == 0
    text = md.read_text()
    assert "| run | date | commit | w03 [inductor] | w03 [eager] |" in text
    assert "No regressed step." in text and "- suspect: w03 [inductor] run 4 x1.3" in text
    assert text.count("| c3000000 |") == 1 and "c1000000" not in text  # --last 2
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs[0] == "history_w03.png" and len(pngs) == 11
    assert all((out / p).stat().st_size > 1000 for p in pngs)
    o = capsys.readouterr().out
    assert "suspect: w03 [inductor] run 4 x1.3" in o and "recomputed against the previous run" in o
    assert "wrote 11 plot(s)" in o and "regressed:" not in o


def test_model_cases_use_their_models_profile(tmp_path, capsys):
    db, out = tmp_path / "b.sqlite", tmp_path / "plots"
    _fill(db)
    assert main(["history", "model.*", "--profile", "tiny", "--db", str(db), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    row = next(ln for ln in cap.out.splitlines() if ln.startswith("model.gpt2.infer.fp32"))
    assert row.split()[1:3] == ["eager", "1"]  # the long format: workload, compiler, runs
    assert "note: 1 series have only 1 complete run: nothing to compare them with yet" in cap.out
    assert (out / "history_model.gpt2.infer.fp32.png").is_file()


def test_plots_only_when_asked_with_progress_lines(tmp_path):
    """`bench history` writes no PNG unasked (nothing beside the store); `--out DIR` writes one per workload and
    says how far it got while it plots. Through a real process, as a user runs it."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    db = tmp_path / "sub" / "b.sqlite"
    _fill(db, n=2)

    def history(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", "bench", "history", "--db", str(db), *more],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "PYTHONPATH": str(root)},
        )

    plain = history()
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert sorted(p.name for p in db.parent.iterdir()) == ["b.sqlite"] and not list(tmp_path.rglob("*.png"))
    assert "(a PNG plot per workload: --out DIR)" in plain.stderr
    plotted = history("--out", str(tmp_path / "plots"))
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    pngs = sorted((tmp_path / "plots").glob("history_*.png"))
    assert pngs and f"plots: {len(pngs)}/{len(pngs)} written" in plotted.stderr


@pytest.mark.parametrize(
    "argv, fill, message",
    [
        (["history"], False, "no bench store at"),
        (["history", "nothing.*"], True, "no stored workload matches nothing.*"),
        (["history", "w00", "--device", "cuda"], True, "no complete runs on device 'cuda'"),
        (
            ["history", "model.*", "--profile", "gpu"],
            True,
            "no stored workload matches model.* in profile gpu",
        ),
        (["history", "--last", "0"], True, "--last must be at least 1"),
        (["history", "--threshold", "2"], True, "--threshold and --alpha must be between 0 and 1"),
    ],
)
def test_errors_are_one_line_with_exit_2(tmp_path, capsys, argv, fill, message):
    db = tmp_path / "b.sqlite"
    if fill:
        _fill(db, n=2)
    assert main([*argv, "--db", str(db), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("harness bench: error: ") and message in err and "\n" not in err
    assert fill or not db.exists()  # a missing store is not created


def test_only_incomplete_runs_is_an_error(tmp_path, capsys):
    db = tmp_path / "b.sqlite"
    with Store(db) as s:
        store_run(s, make_results(medians()), complete=False)
    assert main(["history", "--db", str(db)]) == 2
    assert "no complete runs in" in capsys.readouterr().err
