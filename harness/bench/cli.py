"""Command line: `python -m harness.bench VERB ...` (also `python -m harness bench VERB ...`).

Verbs: run, compare, list, show, export, import, summary, plot, history, workloads, selftest, bisect, gpu,
models, model-profile, job-summary, verdict.
Exit codes: 0 fine; 1 a regression was confirmed side by side (`bench run`; unless --no-fail) or a self-test
expectation failed (`bench compare` of stored runs only raises suspects: exit 0);
2 bad input (one-line message); 130 interrupted (the run is marked aborted and never used as a baseline).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import arms, conventions
from harness.bench.core.records import Verdict
from harness.exc import UsageError
from harness.settings import Plant, bench_settings, settings


def path_or_url(value: str) -> Path | str:
    """A `--db` value: a store URL kept as typed (a Path would fold its `://` into `:/`), else a Path."""
    return value if "://" in value else Path(value)


def _add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        type=path_or_url,
        default=None,
        help="SQLite store or store URL (default $KILN_STORE_URL, else "
        "$KILN_BENCH_DB, else results/bench/<backend>/bench.sqlite: the store `nox -s ci` and `nox -s bench` write)",
    )
    from harness.store.cli import add_store_flags

    add_store_flags(p)  # --store URL, --store-strict


def _add_lasting(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lasting",
        metavar="BACKEND",
        help="instead of --db: the CI's lasting store of BACKEND on this runner: $KILN_BENCH_STORE ({backend} "
        "replaced), else the backend's bench_store in ci/matrix.json, else ~/.local/share/kiln/bench/BACKEND.sqlite "
        "(never inside the checkout); locked while in use; missing: a fresh one (readers: empty); corrupt: moved "
        "aside to STORE.corrupt-TIME",
    )


def _add_reports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--md",
        type=Path,
        help="write a Markdown report here (and to $GITHUB_STEP_SUMMARY with --github-summary)",
    )
    conventions.add_json(p)
    p.add_argument("--plots", type=Path, help="write PNG plots into this folder (needs matplotlib)")


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="fraction slower that may count as regression "
        "(default $KILN_BENCH_THRESHOLD, else 0.05 on GPU, 0.10 on CPU)",
    )
    p.add_argument(
        "--drift",
        choices=["auto", "on", "off"],
        default="auto",
        help="divide out eager's median ratio over all workloads (auto: on for CPU runs)",
    )
    p.add_argument("--alpha", type=float, default=None, help="Mann-Whitney level (default 0.01)")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when something regressed")
    p.add_argument(
        "--any-hardware",
        action="store_true",
        help="baselines may come from another hardware "
        "class (GPU label or model) than the run's: off by default",
    )


def _add_measure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda, cuda:N")
    p.add_argument("--profile", choices=["tiny", "gpu"], help="size table (default: gpu on a GPU, else tiny)")
    p.add_argument(
        "--compilers", default=arms.default("kernel"), help="comma-separated; eager is always included"
    )
    p.add_argument("--only", help="comma-separated fnmatch patterns of workload or family names")
    p.add_argument(
        "--timer", help="wall (CPU), event (GPU default), graph (CUDA graphs), profiler (kernel time)"
    )
    p.add_argument("--target-s", type=float, help="measuring seconds per workload+compiler")
    p.add_argument("--rounds", type=int, help="interleaved rounds per workload")
    p.add_argument(
        "--passes", type=int, help="sweeps over all workloads, each taking a share of the samples (CPU: 3)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs; default 1)")
    p.add_argument("--plant", help="plant a slowdown: PATTERN[@COMPILER][=FRACTION] (tests only)")
    p.add_argument("--label", help="free-text label stored with the run")
    p.add_argument(
        "--git-ref", help="git ref to record (default $KILN_BENCH_GIT_REF, $GITHUB_REF_NAME or git)"
    )
    p.add_argument("--git-commit", help="git commit to record (default: git's HEAD)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


EXAMPLE = """python -m harness bench history             # what moved, in the store the sessions wrote
python -m harness bench list --json - | jq '.[0]'
python -m harness bench run --only 'softmax*' --baseline latest?"""


# sub-verb -> its example in `bench VERB --help`
SUB_EXAMPLES = {
    "run": "python -m harness bench run --only 'softmax*' --baseline latest? --plots results/bench/plots",
    "compare": "python -m harness bench compare latest run:1",
    "list": "python -m harness bench list --limit 5 --json -",
    "show": "python -m harness bench show latest --md run.md",
    "export": "python -m harness bench export runs.json --runs latest",
    "import": "python -m harness bench import runs.json",
    "plot": "python -m harness bench plot --out results/bench/plots",
    "history": "python -m harness bench history 'softmax.*' --top 10 --md history.md",
    "summary": "python -m harness bench summary results/bench/cpu/last.md",
    "workloads": "python -m harness bench workloads --profile gpu",
    "selftest": "python -m harness bench selftest --md results/bench/selftest.md",
    "backend": "python -m harness bench backend --backend cpu --native -- --only 'softmax*'",
    "models": "python -m harness bench models --profile tiny --only 'gpt2*'",
    "verdict": "python -m harness bench verdict --step kernels results/bench/cpu/last.json 0",
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m harness.bench", description="kiln benchmarks: measure, store, compare, report."
    )
    cli_add_arguments(ap)
    return conventions.finish(ap, EXAMPLE, SUB_EXAMPLES)


def cli_add_arguments(ap: argparse.ArgumentParser) -> None:
    """The bench sub-verbs (also used by `python -m harness bench`)."""
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("run", help="measure workloads under several compilers, store, optionally compare")
    _add_measure(p)
    _add_store(p)
    _add_lasting(p)
    _add_reports(p)
    _add_compare(p)
    p.add_argument(
        "--baseline",
        help="compare with: run:ID, ref:NAME, window:N or latest (a trailing ? makes "
        "it optional: no comparison when nothing matches)",
    )
    p = sub.add_parser("compare", help="compare a stored run with a baseline (no re-measurement)")
    p.add_argument("run", help="run id, or 'latest'")
    p.add_argument("baseline", help="run:ID, ID, ref:NAME, window:N or latest")
    _add_store(p)
    _add_reports(p)
    _add_compare(p)
    p = sub.add_parser("list", help="list stored runs, newest first")
    p.add_argument("--limit", type=int, default=20)
    _add_store(p)
    _add_lasting(p)
    conventions.add_json(p, "the runs")
    p = sub.add_parser("show", help="report of one stored run")
    p.add_argument("run", help="run id, or 'latest'")
    _add_store(p)
    _add_reports(p)
    p = sub.add_parser("export", help="write runs (with every sample) as JSON")
    p.add_argument("out", type=Path)
    p.add_argument("--runs", help="comma-separated run ids, or latest (default: all)")
    p.add_argument(
        "--baseline",
        help="the runs a baseline names instead (ref:main: the latest complete run of "
        "main); a trailing ? exports none when nothing matches",
    )
    _add_store(p)
    _add_lasting(p)
    p = sub.add_parser("import", help="merge JSON exports into the store (runs already present are skipped)")
    p.add_argument("files", type=Path, nargs="+")
    _add_store(p)
    _add_lasting(p)
    p = sub.add_parser("plot", help="PNG plots: speedups of a run and history of every workload")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--from-json", dest="from_json", type=Path, help="plot an export instead of the store")
    p.add_argument("--run", default="latest", help="run for the speedup plot (default latest)")
    _add_store(p)
    p = sub.add_parser(
        "history",
        help="what moved over the stored runs: the series that moved most (within 120 "
        "columns), --md the table of every run, --json every point, a PNG per workload",
    )
    from harness.bench.reports.history import add_arguments as _add_history

    _add_history(p)
    p = sub.add_parser("summary", help="append Markdown reports (a run's --md) to $GITHUB_STEP_SUMMARY")
    p.add_argument("files", type=Path, nargs="+")
    p = sub.add_parser("workloads", help="list the workloads of a profile")
    p.add_argument("--profile", choices=["tiny", "gpu"], default="tiny")
    p = sub.add_parser("selftest", help="CI check: self-compare, identical runs and a planted 20%% slowdown")
    p.add_argument(
        "--compilers",
        default="inductor,eager",
        help="default inductor,eager: kiln in Triton's "
        "interpreter takes up to a second a call, which proves nothing more about the pipeline",
    )
    p.add_argument("--only", help="restrict workloads (fnmatch patterns)")
    p.add_argument("--plant-workload", default="softmax.fwd.fp32.64x128")
    p.add_argument("--fraction", type=float, default=0.2)
    _add_store(p)
    p.add_argument("--md", type=Path, help="write the self-test Markdown report here")
    p = sub.add_parser(
        "bisect",
        help="find the commit of GOOD..BAD that slowed a workload (scratch worktree, "
        "each commit measured by its own code)",
    )
    from harness.bench.kernels.bisect import add_arguments as _add_bisect

    _add_bisect(p)
    p = sub.add_parser(
        "job-summary",
        help="end of a CI bench job: the runs compared and, on main, automatic "
        "bisection of confirmed regressions, into the job summary",
    )
    from .job import add_arguments as _add_job

    _add_job(p)
    p = sub.add_parser(
        "verdict",
        help="end of a job: one line per bench step (its report and exit status), "
        "exit 1 when a regression was confirmed side by side or a step failed",
    )
    from harness.bench.judge.verdict import add_arguments as _add_verdict

    _add_verdict(p)
    p = sub.add_parser("backend", help="bench one backend of ci/matrix.json in its container (or --native)")
    p.add_argument("--backend", help="cpu, cuda or rocm (default: detected)")
    p.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="this machine's Python instead of a container (also KILN_NATIVE=1)",
    )
    p.add_argument("--results", help="folder of the store and reports (default results/bench/<backend>)")
    p.add_argument("--image", help="use this local image instead of building the hash-tagged one")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="after `--`: more `bench run` flags")
    p = sub.add_parser(
        "overhead", help="host overhead: us per call of graphs with 1, 10 and 50 kernel launches"
    )
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    p.add_argument(
        "--compilers", default=arms.default("overhead"), help="comma-separated (the -cg modes need CUDA)"
    )
    p.add_argument("--launches", default="1,10,50", help="chain lengths (kernel launches per call)")
    p.add_argument("--calls", type=int, default=200, help="calls per sample")
    p.add_argument("--samples", type=int, default=25, help="samples per graph and compiler")
    p.add_argument("--md", type=Path, help="write the Markdown table here")
    p.add_argument(
        "--json",
        type=Path,
        help="write every result (samples included) here; `--json -` prints only the JSON on stdout",
    )
    p.add_argument("--profile", type=Path, help="also write a cProfile of each compiler's calls here")
    p = sub.add_parser("gpu", help="full GPU run twice (kiln, inductor, eager) and the spread between runs")
    p.add_argument("--out", type=Path, default=Path("results/gpu"))
    p.add_argument("--compilers", default=arms.default("kernel"))
    p.add_argument("--only", help="restrict workloads (fnmatch patterns)")
    p.add_argument(
        "--timer",
        default="event",
        help="event (default; includes host launch time, so host-bound "
        "backward workloads vary between runs), profiler (kernel time), graph (CUDA graph replays)",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--target-s", type=float, default=None)
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="rehearse the pipeline on CPU (tiny sizes; with --device cpu)",
    )
    _add_models(sub)
    p = sub.add_parser(
        "model-profile", help="profile model steps per compiler: top kernels, launches, host time"
    )
    p.add_argument(
        "--only", required=True, help="comma-separated fnmatch patterns of model cases (as `models`)"
    )
    p.add_argument("--compilers", default="kiln,inductor,eager", help="comma-separated (as `models`)")
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda, cuda:N")
    p.add_argument(
        "--profile", choices=["tiny", "gpu"], help="model sizes (default: gpu on a GPU, else tiny)"
    )
    p.add_argument("--steps", type=int, default=10, help="profiled steps (after 3 warm-up steps)")
    p.add_argument("--top", type=int, default=15, help="kernels listed per case and compiler")
    p.add_argument("--md", type=Path, help="write the Markdown report here (default: stdout)")


def _add_models(sub) -> None:
    """The `models` verb: the model tier (harness/bench/models/run.py)."""
    p = sub.add_parser(
        "models",
        help="model tier: transformers/torchvision/timm models with random weights under each compiler",
        description="Real models built from configs with random weights (GPT-2, Llama, BERT, T5, ViT, ResNet) "
        "under eager, kiln, inductor and (CUDA) kiln-cg, inductor-cg: pass/fail against eager, step latency, "
        "speedup, cold/warm compile s in fresh processes, peak memory. Each invocation adds a run to the "
        "store in --out and rewrites the report over every case stored there, so the GPU tier can be run in "
        "chunks (--only) into one folder; --report only rewrites the report.",
    )
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda, cuda:N")
    p.add_argument(
        "--profile", choices=["tiny", "gpu"], help="model sizes (default: gpu on a GPU, else tiny)"
    )
    p.add_argument(
        "--only",
        help="comma-separated fnmatch patterns of cases (model.gpt2.infer.bf16, "
        "gpt2.infer.*) or models (gpt2)",
    )
    p.add_argument(
        "--compilers",
        default=arms.default("model"),
        help="comma-separated; eager is always included; -cg modes are skipped on CPU",
    )
    p.add_argument(
        "--compile-times",
        help="compilers whose cold/warm compile s are measured in fresh "
        "subprocesses, or 'none' (default: kiln,inductor on a GPU, kiln on CPU)",
    )
    p.add_argument(
        "--autotune-times",
        action="store_true",
        help="also autotuned compile s (cold, warm) of the "
        "--compile-times compilers, in fresh subprocesses (harness/bench/models/compile_times.py)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="run folder: report.md, report.json, export.json, models.png (default "
        "the models/ folder beside the machine's bench store, results/bench/<backend>/models)",
    )
    p.add_argument(
        "--db",
        type=Path,
        help="SQLite store (default: with --out, OUT/bench.sqlite; else the machine's "
        "bench store, shared with the kernel tier: model runs have profile models-PROFILE)",
    )
    p.add_argument("--md", type=Path, help="Markdown report here instead of OUT/report.md")
    p.add_argument(
        "--json",
        type=Path,
        help="JSON report here instead of OUT/report.json; `--json -` prints only "
        "the JSON on stdout (the tables go to stderr)",
    )
    p.add_argument("--plots", type=Path, help="PNG plot folder instead of OUT")
    p.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: rewrite the report over every case stored for the profile",
    )
    p.add_argument(
        "--list", action="store_true", help="list the profile's cases and whether they can run here"
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="measure only the cold/warm compile s of the "
        "--compile-times compilers (no step timing); the report puts them beside the newest step "
        "results of the same case definition",
    )
    p.add_argument(
        "--compile-jobs",
        type=int,
        default=1,
        help="with --compile-only: cases probed at once, each on its own equal share of the CPUs "
        "(a case's compilers take turns on one share); the report says how many CPUs a probe had",
    )
    p.add_argument(
        "--cold-only",
        action="store_true",
        help="compile probes: the cold one alone (no warm-cache process after it)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip cases already stored in the store for this "
        "profile, device and source hash (with every selected compiler)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        help="start no case that would likely end after this many seconds "
        "(the rest are listed; run again with --resume)",
    )
    p.add_argument("--target-s", type=float, help="measuring seconds per case and compiler")
    p.add_argument("--rounds", type=int, help="interleaved rounds per case")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs; default 1)")
    p.add_argument("--label", help="free-text label stored with the run")
    p.add_argument(
        "--git-ref", help="git ref to record (default $KILN_BENCH_GIT_REF, $GITHUB_REF_NAME or git)"
    )
    p.add_argument(
        "--baseline",
        help="compare with earlier runs: latest (per case, the newest complete run "
        "that has it), run:ID, ref:NAME, window:N; a trailing ? makes it optional",
    )
    _add_compare(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def open_bench_store(
    db: Path | None, lasting: str | None = None, *, write: bool = True, must_exist: bool | None = None
):
    """The store of `--db` (a file or a URL), else $KILN_STORE_URL (the fleet store), else store.default_path
    ($KILN_BENCH_DB, else the backend's results/bench store); with `--lasting BACKEND` that backend's lasting store
    (or the fleet store). `write=False` opens it read-only (never created, migrated or moved). A local store that
    must exist (readers' default) and is not there is one line, exit 2."""
    from harness import trust
    from harness.bench.stores.store import Store, lasting_path, open_fleet, open_lasting
    from harness.store.cli import configured, guard_write

    fleet = configured(write=write)  # KILN_STORE_URL (or --store URL); KILN_STORE_READ_ONLY: readers only
    if lasting:
        if db:
            raise UsageError("give --db or --lasting, not both")
        if fleet is not None:
            return open_fleet(fleet, write=write)
        path = lasting_path(
            lasting
        )  # a scope other than main's writes its own file beside main's, never main's
        return open_lasting(trust.scoped_path(path, settings().cache_scope) if write else path, write=write)
    if db and "://" in str(db):
        from harness.store import url

        where = url.parse(str(db))
        return Store(guard_write(where) if write else where, readonly=not write)
    if fleet is not None and not db:
        return Store(fleet, readonly=not write)
    from harness.bench.stores.store import default_path, missing_store

    path = Path(db) if db else default_path()
    if (
        not write if must_exist is None else must_exist
    ) and not path.is_file():  # a reader never creates a store (nor a folder) at a mistyped path
        raise missing_store(path)
    return Store(path, readonly=not write)


def _run_id(store, spec: str) -> int:
    if spec == "latest":
        runs = store.runs(limit=1)
        if not runs:
            raise UsageError(f"no runs in {store.path}")
        return runs[0].id
    if not spec.isdigit():
        raise UsageError(f"bad run id {spec!r} (a number or 'latest')")
    return int(spec)


def _cmp_cfg(args: argparse.Namespace):
    from harness.bench.judge.compare import config_from_args

    return config_from_args(args)


def emit_reports(args: argparse.Namespace, run, results, cmps, baseline, threshold: float = 0.05) -> None:
    """Terminal tables on stdout; Markdown/JSON/PNG where asked."""
    from harness.bench.reports import report
    from harness.results import append_job_summary, atomic_write_text

    with conventions.human_to_stderr(conventions.to_stdout(getattr(args, "json", None))):
        _emit_terminal(run, results, cmps, baseline)
    md = report.markdown_report(run, results, cmps, baseline)
    if getattr(args, "md", None):
        atomic_write_text(args.md, md)
    append_job_summary(md)
    if getattr(args, "json", None):
        conventions.write_json(args.json, report.json_report(run, results, cmps, baseline))
    if getattr(args, "plots", None):
        try:
            args.plots.mkdir(parents=True, exist_ok=True)
            compilers = report.speedup_compilers(run.device, run.compilers)
            if [c for c in compilers if c != "eager"]:
                report.plot_speedups(results, compilers, args.plots / f"run{run.id}_speedups.png", run=run)
            else:  # a CPU run of kiln alone: its interpreter times have no speedup to show
                print(
                    f"note: no speedup plot for run {run.id}: {report.no_speedup_reason(run)}",
                    file=sys.stderr,
                )
            if cmps is not None:
                report.plot_ratios(cmps, threshold, args.plots / f"run{run.id}_ratios.png", run=run)
        except report.PlotUnavailable as e:
            print(f"note: {e}", file=sys.stderr)


def _emit_terminal(run, results, cmps, baseline) -> None:
    """The terminal half of `emit_reports`: header, interpreter note, tables."""
    from harness.bench.reports import report

    print(report.run_header(run))
    if report.interpreted(run.device, run.compilers):
        print(f"note: {report.INTERPRETER_NOTE}")
    print(report.terminal(report.side_by_side(results, run.compilers, run.device, cmps)))
    if cmps is not None:
        print()
        print(f"against baseline run(s) {', '.join(str(b.id) for b in baseline)}: {report.counts_line(cmps)}")
        flagged = report.comparison_table(cmps, only_flagged=True)
        if len(flagged) > 1:
            print(report.terminal(flagged))


def _exit_for(cmps, no_fail: bool) -> int:
    if cmps is None or no_fail:
        return 0
    return 1 if any(c.verdict == Verdict.REGRESSED for c in cmps) else 0


def cmd_run(args: argparse.Namespace) -> int:
    from harness.bench.kernels.execute import BenchConfig, defaults_for, resolve_device
    from harness.bench.kernels.session import run_bench

    device = resolve_device(args.device)
    kw = defaults_for(device)
    for name in ("profile", "timer", "target_s", "rounds", "passes"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if kw.get("passes", 1) < 1:
        raise UsageError(f"--passes must be at least 1, not {kw['passes']}")
    s = bench_settings()
    plant = Plant.parse(args.plant) if args.plant else s.plant
    cfg = BenchConfig(
        device=device,
        compilers=[c.strip() for c in args.compilers.split(",") if c.strip()],
        only=args.only,
        plant=plant,
        **kw,
    )
    cmp_cfg = _cmp_cfg(args).for_device(device)
    from harness.bench.kernels.bisect import sigterm_as_interrupt

    # SIGTERM (a cancelled CI job) is Ctrl-C: the run is marked aborted, its stored results kept
    with sigterm_as_interrupt(), open_bench_store(args.db, args.lasting) as store:
        out = run_bench(
            cfg,
            store,
            label=args.label,
            git_ref=args.git_ref or s.git_ref,
            git_commit=args.git_commit,
            baseline=args.baseline,
            cmp_cfg=cmp_cfg,
            progress=not args.quiet,
            threads=args.threads,
        )
        emit_reports(args, out.run, out.results, out.comparisons, out.baseline, cmp_cfg.threshold)
    return _exit_for(out.comparisons, args.no_fail)


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.bench.judge.compare import compare, load_baseline, mark_suspects, resolve_baseline
    from harness.bench.reports import report

    cmp_cfg = _cmp_cfg(args)
    with open_bench_store(args.db, must_exist=True) as store:
        run = store.run(_run_id(store, args.run))
        cmp_cfg = cmp_cfg.for_device(run.device)
        base_runs = resolve_baseline(store, args.baseline, run, any_hardware=cmp_cfg.any_hardware)
        results = store.results(run.id)
        cmps = compare(results, load_baseline(store, base_runs), cmp_cfg, new_run=run)
        # stored samples against stored samples: suspects only (no side-by-side measurement here)
        mark_suspects(cmps, "the baseline's stored samples")
        interp = report.interpreted(run.device, run.compilers)
        for c in cmps:
            c.interpreter = c.compiler in interp
        emit_reports(args, run, results, cmps, base_runs, cmp_cfg.threshold)
    return _exit_for(cmps, args.no_fail)


def cmd_list(args: argparse.Namespace) -> int:
    from harness.bench.reports.report import terminal

    with open_bench_store(args.db, args.lasting, write=False) as store:
        runs = store.runs(limit=args.limit)
    if args.json:
        conventions.write_json(args.json, [_run_json(r) for r in runs])
        if conventions.to_stdout(args.json):
            return 0
    rows = [["id", "status", "created", "profile", "device", "compilers", "ref", "commit", "label"]]
    rows += [
        [
            str(r.id),
            r.status,
            r.created_at,
            r.profile,
            r.device_name or r.device,
            ",".join(r.compilers),
            r.git_ref or "-",
            (r.git_commit or "-")[:10],
            r.label or "",
        ]
        for r in runs
    ]
    print(terminal(rows) if len(rows) > 1 else "no runs")
    return 0


def _run_json(r) -> dict:
    """One stored run as `bench list --json` writes it."""
    return {
        "id": r.id,
        "uid": getattr(r, "uid", None),
        "status": r.status,
        "created_at": r.created_at,
        "profile": r.profile,
        "device": r.device,
        "device_name": r.device_name,
        "compilers": list(r.compilers),
        "git_ref": r.git_ref,
        "git_commit": r.git_commit,
        "label": r.label,
    }


def cmd_show(args: argparse.Namespace) -> int:
    from harness.bench.reports import report

    with open_bench_store(args.db, write=False) as store:
        run = store.run(_run_id(store, args.run))
        results = store.results(run.id)
        stored = store.verdicts(run.id)
        cmps = stored or None
        base = _stored_baseline(store, stored)
    emit_reports(args, run, results, cmps, base)
    with conventions.human_to_stderr(conventions.to_stdout(getattr(args, "json", None))):
        print()
        print(report.terminal(report.details(results)))
    return 0


def _stored_baseline(store, stored) -> list:
    """The baseline runs that stored verdicts name (`run:ID,ID (commit C)`), those still in the store."""
    from harness.exc import StoreError

    if not stored or not (stored[0].baseline or "").startswith("run:"):
        return []
    out = []
    for x in stored[0].baseline[4:].split(" ")[0].split(","):
        try:
            out.append(store.run(int(x)))
        except (ValueError, StoreError):
            pass
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from harness.bench.judge.compare import resolve_baseline
    from harness.exc import BaselineError

    with open_bench_store(args.db, args.lasting, write=False) as store:
        if args.runs and args.baseline:
            raise UsageError("give --runs or --baseline, not both")
        ids = None
        if args.runs:
            ids = [_run_id(store, x.strip()) for x in args.runs.split(",")]
        elif args.baseline:
            try:
                ids = [r.rid for r in resolve_baseline(store, args.baseline.rstrip("?"))]
            except BaselineError as e:
                if not args.baseline.endswith("?"):
                    raise
                print(f"note: no baseline to export ({e})", file=sys.stderr)
                ids = []
        if ids == []:  # Store.export([]) would export every run
            from harness.bench.core.records import SCHEMA_VERSION
            from harness.bench.stores.store import EXPORT_FORMAT, now

            data: dict[str, Any] = {
                "format": EXPORT_FORMAT,
                "schema_version": SCHEMA_VERSION,
                "exported_at": now(),
                "runs": [],
            }
        else:
            data = store.export(ids)
    from harness.results import atomic_write_text

    atomic_write_text(args.out, json.dumps(data, default=str))
    print(f"exported {len(data['runs'])} run(s) to {args.out}")
    return 0


def _read_json(path: Path) -> dict:
    from harness.exc import ImportFormatError

    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ImportFormatError(f"{path} is not JSON: {e}") from None


def cmd_import(args: argparse.Namespace) -> int:
    with open_bench_store(args.db, args.lasting) as store:
        for f in args.files:
            added, skipped = store.import_(_read_json(f))
            print(f"{f}: {added} run(s) added, {skipped} already present")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from harness.bench.reports import report
    from harness.bench.stores.store import Store

    store = Store(":memory:") if args.from_json else open_bench_store(args.db, write=False)
    with store:
        if args.from_json:
            store.import_(_read_json(args.from_json))
        run = store.run(_run_id(store, args.run))
        results = store.results(run.rid)
        hist: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for r in results:
            pts = [(h.rid, m) for h, m in store.history(r.workload, r.compiler) if m]
            hist.setdefault(r.workload, {})[r.compiler] = pts
        args.out.mkdir(parents=True, exist_ok=True)
        written = []
        compilers = report.speedup_compilers(run.device, run.compilers)
        if [c for c in compilers if c != "eager"]:
            written.append(
                report.plot_speedups(results, compilers, args.out / f"run{run.id}_speedups.png", run=run)
            )
        else:
            print(f"note: no speedup plot for run {run.id}: {report.no_speedup_reason(run)}", file=sys.stderr)
        written.append(report.plot_history(hist, args.out / "history.png", run=run))
    print(f"wrote {' and '.join(map(str, written))}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from harness.results import append_job_summary

    for f in args.files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as e:
            text = f"> bench: no report {f} ({e.strerror}): the run ended before writing it; see the job log"
        if not append_job_summary(text, force=True):  # this verb exists to write the job summary
            print(f"note: $GITHUB_STEP_SUMMARY is not set; {f} not appended", file=sys.stderr)
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    from harness.bench.kernels import workloads as wl

    cs = wl.cases(args.profile)
    for c in cs:
        print(f"{c.name:<45} {c.source_hash}")
    print(f"{len(cs)} workloads in profile {args.profile}")
    return 0


# verb -> (module, function) of the verbs that live in a module of their own (the others are cmd_<verb> here)
VERB_MODULES: dict[str, tuple[str, str]] = {
    "selftest": (".kernels.selftest", "cmd_selftest"),
    "gpu": (".kernels.gpu_run", "cmd_gpu"),
    "overhead": (".kernels.overhead", "cli_main"),
    "backend": (".kernels.backend_run", "cmd_backend"),
    "models": (".models.run", "cmd_models"),
    "bisect": (".kernels.bisect", "cmd_bisect"),
    "job-summary": (".job", "cmd_job_summary"),
    "verdict": (".judge.verdict", "cmd_verdict"),
    "history": (".reports.history", "cmd_history"),
    "model-profile": (".models.profile", "cmd_model_profile"),
}


# the verbs that compile and measure (in this process, its workers, or natively): they check the compiler
# settings first
MEASURING_VERBS = frozenset(
    {"run", "selftest", "gpu", "overhead", "models", "model-profile", "bisect", "backend"}
)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m harness.bench`: the verbs below, errors reported as `python -m harness bench` reports them."""
    from harness.exc import guarded

    def run() -> int:
        args = parser().parse_args(argv)
        conventions.apply(args)
        from harness.commands import scope_this_process

        scope_this_process()  # the trust scope's compiler caches (Inductor's, kiln's, Triton's) for every arm
        return cli_main(args)

    return guarded("bench", run)


def cli_main(args: argparse.Namespace) -> int:
    """Benchmarks: measure, store, compare and report latency and bandwidth (see `bench --help`). Errors
    (`HarnessError`s, the bench's included) and Ctrl-C are `harness.__main__.guarded`'s to report."""
    if getattr(args, "store", None) and getattr(args, "db", None):
        raise UsageError("give --db or --store, not both")
    if getattr(args, "store", None) or getattr(args, "store_strict", False):
        from harness.store.cli import apply_store_flags

        apply_store_flags(args)
    if args.verb in MEASURING_VERBS and (args.verb != "backend" or args.native):
        from harness.settings import require_compiler_settings

        require_compiler_settings()  # one line, exit 2: not a run full of kiln errors, nor a traceback per worker
    if args.verb in ("run", "selftest", "gpu", "overhead", "models", "model-profile") and "kiln" in getattr(
        args, "compilers", ""
    ):
        from harness.bench.kernels.session import prepare_kiln

        prepare_kiln()  # before Dynamo imports triton, so kiln may pick the interpreter
    where = VERB_MODULES.get(args.verb)
    if where is not None:
        module, function = where
        return getattr(importlib.import_module(module, __package__), function)(args)
    return globals()[f"cmd_{args.verb}"](args)
