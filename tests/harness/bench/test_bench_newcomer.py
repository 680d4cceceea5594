"""A newcomer's first day with the bench: one store location every session and verb agree on, a
terminal `bench history` within 120 columns, read-only verbs that create nothing, `--json -`, the opt-in job
summary, and plots that say what they show (title, units, backend, interpreter caveat, one colour per arm, log
axes across decades, no empty figure). The CLI ones run `python -m harness` in a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import make_results, make_run

from harness import arms
from harness.bench.core.records import Meta, Result, RunInfo
from harness.bench.models import catalog as models
from harness.bench.models import report as mrep
from harness.bench.reports import history as hist_mod
from harness.bench.reports import report
from harness.bench.stores.store import Store, default_path, now

ROOT = Path(__file__).resolve().parents[3]
STORE = Path("results") / "bench" / "cpu" / "bench.sqlite"  # where nox -s ci / nox -s bench write on a CPU


def harness(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KILN_BENCH_DB", "GITHUB_STEP_SUMMARY", "KILN_GITHUB_SUMMARY")
    }
    base["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _wide_store(
    path: Path,
    workloads: int = 40,
    runs: int = 3,
    device: str = "cpu",
    compilers: tuple[str, ...] = ("inductor", "eager"),
) -> None:
    """`runs` complete runs of `workloads` workloads, medians from 5 us to 50 ms (decades apart)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store(path) as store:
        for k in range(runs):
            med = {
                (f"family{i:02d}.fwd.fp32.{64 * (i + 1)}x128", c): 5_000.0
                * (1.2**i)
                * (10 if c != "eager" else 1)
                * (1.3 if (k == runs - 1 and i == 3) else 1.0)
                for i in range(workloads)
                for c in compilers
            }
            run = make_run(device=device, commit=f"c{k}")
            run.compilers = list(compilers)
            store.begin_run(run)
            for r in make_results(med, seed=k):
                store.add_result(run.id, r)
            store.finish_run(run.id)


def _no_bench_store_env(tmp_path: Path) -> dict[str, str]:
    return {"KILN_MATRIX": str(ROOT / "ci" / "matrix.json")}


# ---- item 2: one store location -------------------------------------------------------------------------
def test_bench_verbs_without_db_read_the_store_the_sessions_write(tmp_path, monkeypatch):
    from noxfile_loader import noxfile

    _wide_store(tmp_path / STORE, workloads=3, runs=2)
    proc = harness(tmp_path, "bench", "history", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    assert "bench history: 6 series (3 workloads), 2 complete run(s)" in proc.stdout
    listed = harness(tmp_path, "bench", "list", "--json", "-")
    assert listed.returncode == 0 and [r["id"] for r in json.loads(listed.stdout)] == [2, 1]
    # the sessions: `nox -s bench` writes that store (the ci session's bench dir is results/bench/<backend> too)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_NO_VENV", "1")
    monkeypatch.delenv("KILN_BENCH_DB", raising=False)
    calls: list[tuple] = []

    class Session:
        posargs: list[str] = []

        def run(self, *args, **kw):
            calls.append(args)
            return "cpu\n" if "detect" in args else ""

        def log(self, line):
            calls.append(("log", line))

    noxfile().bench.func(Session()) if hasattr(noxfile().bench, "func") else noxfile().bench(Session())
    dbs = [a[a.index("--db") + 1] for a in calls if "--db" in a]
    assert dbs and set(dbs) == {str(default_path())} == {str(STORE)}
    assert any(a[0] == "log" and str(STORE) in a[1] for a in calls)  # the session prints where it writes


# ---- item 3: a terminal history within 120 columns ----------------------------------------------------
def test_terminal_history_fits_120_columns_with_md_and_json_for_the_rest(tmp_path):
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=40, runs=3)
    proc = harness(
        tmp_path, "bench", "history", "--db", str(db), "--md", str(tmp_path / "h.md"), "--no-plots"
    )
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert max(map(len, lines)) <= 120 and len(lines) < 40
    assert "... 60 more series" in proc.stdout  # top 20 of 80
    table = lines[1:23]
    assert table[0].split()[:3] == ["workload", "compiler", "runs"]
    assert table[2].startswith("family03.fwd.fp32.256x128")  # the one that moved (x1.3) comes first
    md = (tmp_path / "h.md").read_text()
    assert max(len(line) for line in md.splitlines()) > 1000  # the wide table: a column per series
    js = harness(tmp_path, "bench", "history", "--db", str(db), "--json", "-", "--no-plots")
    data = json.loads(js.stdout)
    assert len(data["series"]) == 80 and len(data["series"][0]["points"]) == 3
    every = harness(tmp_path, "bench", "history", "--db", str(db), "--all", "--no-plots")
    assert max(map(len, every.stdout.splitlines())) <= 120 and "more series" not in every.stdout


def test_one_run_series_are_one_note_not_one_line_each(tmp_path):
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=30, runs=1)
    proc = harness(tmp_path, "bench", "history", "--db", str(db), "--no-plots")
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "only 1 complete run" in ln]
    assert notes == ["note: 60 series have only 1 complete run: nothing to compare them with yet"]


# ---- item 5: read-only verbs create nothing ---------------------------------------------------------------
@pytest.mark.parametrize(
    "verb",
    [
        ["list"],
        ["show", "latest"],
        ["history"],
        ["export", "out.json"],
        ["compare", "latest", "latest"],
        ["plot", "--out", "plots"],
    ],
)
def test_read_only_verbs_never_create_a_store(tmp_path, verb):
    proc = harness(tmp_path, "bench", *verb, "--db", "typo/bench.sqlite")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert "no bench store at typo/bench.sqlite" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder, no SQLite file, no export, no plot


# ---- item 10: --json - and the opt-in job summary ---------------------------------------------------------
def test_json_dash_writes_only_json_on_stdout_and_no_file_named_dash(tmp_path):
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=2, runs=2)
    show = harness(tmp_path, "bench", "show", "latest", "--db", str(db), "--json", "-")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["run"]["id"] == 2
    assert "run 2 (complete)" in show.stderr  # the tables went to stderr
    assert not (tmp_path / "-").exists()


def test_models_json_dash_writes_the_report_json_on_stdout_and_no_file_named_dash(request):
    """`bench models --json -` (one small case, kiln vs eager on CPU: the session's shared `tiny_model_run`, a
    real subprocess): stdout is the report's JSON alone, the progress and tables are on stderr, and neither a
    file named `-` nor OUT/report.json is written."""
    if models.package_problem("transformers"):
        pytest.skip("transformers is not importable")
    folder, proc = request.getfixturevalue("tiny_model_run")
    assert proc["returncode"] == 0, proc["stderr"][-2000:]
    data = json.loads(proc["stdout"])
    assert data["profile"] == "tiny" and [r["status"] for r in data["runs"]] == ["complete"]
    assert "model.bert.infer.fp32" in json.dumps(data["cases"])
    assert "model tier (tiny)" in proc["stderr"] and "wrote m/report.md, m/export.json" in proc["stderr"]
    assert "bert.infer.fp32" in proc["stderr"] and "cold s (kiln)" in proc["stderr"]  # the tables
    assert not (folder / "-").exists() and not (folder / "m" / "report.json").exists()
    assert (folder / "m" / "report.md").is_file()


def test_overhead_json_dash_writes_strict_json_on_stdout_and_no_file_named_dash(tmp_path):
    """`bench overhead --json -`: stdout is the JSON alone (strict: eager's µs per launch is null, not NaN),
    the per-graph lines and the Markdown table go to stderr, no file named `-`."""
    proc = harness(
        tmp_path,
        "bench",
        "overhead",
        "--device",
        "cpu",
        "--compilers",
        "eager,kiln",
        "--launches",
        "1",
        "--calls",
        "2",
        "--samples",
        "3",
        "--json",
        "-",
        KILN_CACHE="0",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]

    def strict(word: str) -> None:
        raise AssertionError(f"{word} in the JSON")

    data = json.loads(proc.stdout, parse_constant=strict)
    rows = {r["compiler"]: r for r in data["results"]}
    assert data["device"] == "cpu" and sorted(rows) == ["eager", "kiln"]
    assert rows["eager"]["launches"] == 0 and rows["eager"]["us_per_launch"] is None
    assert rows["kiln"]["launches"] >= 1 and rows["kiln"]["us_per_launch"] > 0
    assert "| graph | compiler | us/call |" in proc.stderr and "chain_1" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_bench_verbs_append_to_the_job_summary_only_when_asked(tmp_path):
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=2, runs=2)
    summary = tmp_path / "summary.md"
    harness(tmp_path, "bench", "show", "latest", "--db", str(db), GITHUB_STEP_SUMMARY=str(summary))
    assert not summary.exists()
    proc = harness(
        tmp_path,
        "bench",
        "show",
        "latest",
        "--db",
        str(db),
        "--github-summary",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    assert proc.returncode == 0, proc.stderr
    assert "run 2" in summary.read_text()
    (tmp_path / "r.md").write_text("# planted report\n")
    harness(tmp_path, "bench", "summary", "r.md", GITHUB_STEP_SUMMARY=str(summary))  # this verb writes it
    assert summary.read_text().rstrip().endswith("# planted report")


# ---- item 1: plots ------------------------------------------------------------------------------------------
def _capture(monkeypatch, module) -> list:
    figs: list = []
    monkeypatch.setattr(
        module, "save_figure", lambda fig, path, dpi: (figs.append(fig), path.write_bytes(b"png"))
    )
    return figs


def _colours(ax) -> dict[str, tuple]:
    """legend label -> RGBA of its line or bar."""
    from matplotlib.colors import to_rgba

    handles, labels = ax.get_legend_handles_labels()
    out = {}
    for h, label in zip(handles, labels):
        h = h.lines[0] if hasattr(h, "lines") and h.lines and h.lines[0] is not None else h
        h = h.patches[0] if hasattr(h, "patches") and h.patches else h
        colour = h.get_color() if hasattr(h, "get_color") else h.get_facecolor()
        out[label] = to_rgba(colour)
    return out


@pytest.mark.needs("matplotlib")
def test_history_plot_titles_units_interpreter_caveat_colours_and_log_scale(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgba

    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=1, runs=2, compilers=("kiln", "inductor", "eager"))
    with Store(db, readonly=True) as store:
        h = hist_mod.collect(store, [])
    figs = _capture(monkeypatch, hist_mod)
    hist_mod.plot_workload(h, h.workloads()[0], tmp_path / "h.png")
    ax = figs[0].axes[0]
    assert "Triton CPU interpreter" in ax.get_title() and "median time per run" in ax.get_title()
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel() and "(us" in ax.get_ylabel()
    colours = _colours(ax)
    assert colours["kiln (Triton CPU interpreter)"] == to_rgba(arms.colour("kiln"))
    assert colours["eager"] == to_rgba(arms.colour("eager")) and colours["inductor"] == to_rgba(
        arms.colour("inductor")
    )


def _model_results(compilers: tuple[str, ...]) -> list[Result]:
    out = []
    for case, eager_ms in (("gpt2.infer.fp32", 2.0), ("bert.train.fp32", 5.0)):
        for c in compilers:
            ms = eager_ms * (100 if c == "kiln" else 0.8 if c == "inductor" else 1)
            r = Result(f"model.{case}", c, "h", samples=[ms * 1e6] * 5, timer="wall")
            r.compile_s = None if c == "eager" else (30.0 if c == "kiln" else 0.5)
            r.meta = Meta(accuracy={"pass": True})
            out.append(r)
    return out


@pytest.mark.needs("matplotlib")
def test_models_plot_of_a_cpu_run_says_interpreter_and_keeps_colours(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgba

    run = RunInfo(
        1, "u", now(), status="complete", profile="models-tiny", device="cpu", device_name="cpu: test"
    )
    figs = _capture(monkeypatch, mrep)
    assert mrep.plot_models(_model_results(("eager", "kiln", "inductor")), tmp_path / "m.png", [run])
    fig = figs[0]
    title = fig._suptitle.get_text()
    assert "Model tier" in title and "Triton CPU interpreter" in title and "cpu" in title
    speed, compile_ax = fig.axes[0], fig.axes[1]
    assert speed.get_xscale() == "log" and compile_ax.get_xscale() == "log"  # 0.5 s beside 30 s
    # no memory on a CPU: two panels, not an empty third one (the transcript's models.png), and the title says so
    assert len(fig.axes) == 2 and "memory: GPU runs only" in title
    assert set(_colours(compile_ax)) == {
        "kiln (Triton CPU interpreter)",
        "inductor",
    }  # the compile panel's legend
    colours = _colours(speed)
    assert colours["kiln (Triton CPU interpreter)"] == to_rgba(arms.colour("kiln"))
    assert colours["inductor"] == to_rgba(arms.colour("inductor"))
    # a GPU run with memory measured: the third panel
    gpu = RunInfo(2, "v", now(), status="complete", profile="models-gpu", device="cuda", device_name="H100")
    measured = _model_results(("eager", "kiln"))
    for r in measured:
        r.meta.memory = {
            "definition": "window-v2",
            "peak_allocated_bytes": 100 if r.compiler == "eager" else 80,
        }
    assert mrep.plot_models(measured, tmp_path / "g.png", [gpu])
    assert (
        len(figs[-1].axes) == 3 and "compile time and memory against eager" in figs[-1]._suptitle.get_text()
    )
    assert figs[-1].axes[2].patches and figs[-1].axes[2].patches[0].get_width() == pytest.approx(1.25)
    # nothing but eager: no figure at all
    assert mrep.plot_models(_model_results(("eager",)), tmp_path / "e.png", [run]) is None
    assert not (tmp_path / "e.png").exists()


@pytest.mark.needs("matplotlib")
def test_a_cpu_run_of_kiln_alone_writes_no_empty_speedup_png(tmp_path):
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=2, runs=1, compilers=("kiln", "eager"))
    proc = harness(tmp_path, "bench", "show", "latest", "--db", str(db), "--plots", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    assert "note: no speedup plot for run 1" in proc.stderr and "interpreter" in proc.stderr
    assert list((tmp_path / "plots").glob("*speedups*")) == []
    # with inductor beside it, the figure names the backend and leaves the interpreted kiln out, saying so
    figs: list = []
    run = RunInfo(
        2,
        "u",
        now(),
        status="complete",
        profile="tiny",
        device="cpu",
        device_name="cpu: test",
        compilers=["kiln", "inductor", "eager"],
    )
    res = make_results({("w", "kiln"): 9e6, ("w", "inductor"): 5e3, ("w", "eager"): 1e4})
    orig = report.save_figure
    try:
        report.save_figure = lambda fig, path, dpi: figs.append(fig)
        report.plot_speedups(res, report.speedup_compilers("cpu", run.compilers), tmp_path / "s.png", run=run)
    finally:
        report.save_figure = orig
    ax = figs[0].axes[0]
    assert "not shown: kiln (interpreter)" in ax.get_title() and "cpu" in ax.get_title()
    assert ax.get_xscale() == "log" and "x, log scale" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["inductor"]


def test_a_bench_job_session_on_a_laptop_sets_the_bench_store_aside_never_deletes_it(tmp_path, monkeypatch):
    """`nox -s bench-pr -- --backend cpu` (a CI job the README names) starts from a fresh results/bench/cpu; on a
    laptop that folder is the store `nox -s ci` wrote: it deleted it. Now it is renamed beside it, with a log line."""
    from noxfile_loader import noxfile

    _wide_store(tmp_path / STORE, workloads=2, runs=1)
    monkeypatch.chdir(tmp_path)
    calls: list[tuple] = []

    class Session:
        posargs = ["--backend", "cpu"]

        def run(self, *args, **kw):
            calls.append(args)
            if "backend" in args:  # the measure step without docker (what the transcript's laptop got)
                raise CommandFailed("docker", return_code=3)

        def log(self, line):
            calls.append(("log", line))

        def error(self, line):
            raise SessionError(line)

    class SessionError(Exception):
        pass

    from nox.command import CommandFailed

    # the pre-flight (a real one needs docker here) is the job's first command: before the folder is set aside
    monkeypatch.setattr(
        noxfile(),
        "preflight_first",
        lambda s, python, backend, native: calls.append(
            ("preflight", backend, tuple(native), (tmp_path / STORE).exists())
        ),
    )
    session = noxfile().bench_pr
    with pytest.raises(SessionError) as failed:
        (session.func if hasattr(session, "func") else session)(Session())
    # the step and its exit code, not "measure's exit 1: a confirmed regression" for a docker failure
    assert "the measure (exit 3) step(s) failed" in str(failed.value) and "3: infrastructure" in str(
        failed.value
    )
    kept = [p for p in (tmp_path / "results" / "bench").iterdir() if p.name.startswith("cpu.before-")]
    assert len(kept) == 1 and (kept[0] / "bench.sqlite").is_file() and not (tmp_path / STORE).exists()
    with Store(kept[0] / "bench.sqlite") as store:
        assert len(store.runs()) == 1  # the store as it was
    assert calls[0] == ("preflight", "cpu", (), True)
    logs = [c[1] for c in calls if c[0] == "log"]
    assert any(f"moved to results/bench/{kept[0].name}" in line for line in logs), logs
    assert any(c[0] != "log" and "bench" in c and "backend" in c for c in calls)  # then the job's steps ran
    assert noxfile().set_aside(str(tmp_path / "nothing")) is None


# ---- the time estimate: no guess from the first workload (it pays the one-time costs) ----------------------
def test_progress_estimates_from_the_later_workloads_not_the_first(tmp_path):
    from harness.bench.core.stats import eta_text, time_left

    assert time_left([30.0], 10) is None and eta_text([30.0], 10) == "time left: after the next step"
    assert time_left([30.0, 35.0, 40.0], 10) == 35.0  # 7 left at the median step (5 s), not at 40 s / 3
    proc = harness(
        tmp_path,
        "bench",
        "run",
        "--device",
        "cpu",
        "--compilers",
        "eager",
        "--only",
        "*_s*.fwd.fp32.*",
        "--target-s",
        "0.1",
        "--passes",
        "1",
        "--db",
        str(tmp_path / "b.sqlite"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) == 3, proc.stderr[-2000:]
    assert lines[0].endswith("time left: after the next step)") and lines[1].endswith("s left)"), lines
    assert lines[2].endswith(", done)"), lines


def test_read_only_verbs_leave_no_wal_or_shm_beside_a_store(tmp_path):
    """A writer's close leaves the store in rollback mode: `bench list/show/history` (readers, `mode=ro`) then make
    no `-wal`/`-shm` beside it, and the next writer still works (WAL again while it is open)."""
    db = tmp_path / "b.sqlite"
    _wide_store(db, workloads=3, runs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.sqlite"]
    for verb in (["list"], ["show", "latest"], ["history", "--no-plots"]):
        proc = harness(tmp_path, "bench", *verb, "--db", str(db))
        assert proc.returncode == 0, (verb, proc.stderr[-2000:])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b.sqlite"], verb
    _wide_store(db, workloads=3, runs=1)
    proc = harness(tmp_path, "bench", "list", "--db", str(db))
    assert proc.returncode == 0 and len([ln for ln in proc.stdout.splitlines() if " complete " in ln]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.sqlite"]
