"""`bench history`: how workloads moved over the stored runs, as PNG plots and a Markdown table.

Terms:
- *series*: one workload under one compiler over the complete runs of one kind (profile and device). Model
  tier cases (`model.*`) are stored with profile `models-<profile>`, so `--profile tiny` selects the kernel
  runs of profile `tiny` and the model runs of profile `models-tiny`. Without `--profile`/`--device`, a
  workload's series uses the kind (profile, device name) of the newest complete run that has it, so one plot
  never mixes machines or sizes.
- *step*: the verdict of each point is the one its `bench run` stored (`Store.verdicts`: the same verdict,
  ratio and times as that run's comparison table, side-by-side confirmation included; its baseline is the
  run's baseline). A run that stored none (an older run, or one run without a baseline) is *recomputed*:
  compared with the previous point of the same series by `compare.compare` (ratio of medians, threshold,
  one-sided Mann-Whitney, eager's drift divided out where the device's defaults say so); nothing here
  re-measures, so a recomputed flag is only a `suspect`, never a regression, and the run is labelled
  `recomputed` in the table.
- Times are medians of the run's main samples, as `fmt_ns` prints them in the comparison table; kiln on a
  CPU is labelled `(interpreter)`: those are pipeline checks, not kernel speed.
- Plots: `OUT/history_<workload>.png`, median per compiler with an IQR bar (the samples' 25th to 75th
  percentile after outlier removal), x labelled by short commit and date, regressed steps marked.
- Table: the last N runs (default 10), one column per workload+compiler: median, ratio to the previous run
  and a verdict mark (`MARKS`). That wide table is the Markdown report (`--md`); `--json` writes every point.
- Terminal: the *long format*, one row per series (workload, compiler, runs, first and last median, the last
  step's ratio and mark), the series that moved first (flagged, then by the size of the last step), `--top N`
  of them (default 20; `--all`: every one), each line within 120 columns.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from harness import arms, conventions
from harness.bench.core.records import Result, RunInfo, Verdict
from harness.bench.judge.compare import Baseline, CompareConfig, Comparison, compare, drift_of, mark_suspects
from harness.bench.reports.report import (
    INTERPRETER_LABEL,
    PlotUnavailable,
    fmt_ns,
    interpreted,
    markdown,
    plot_title,
    pyplot,
    save_figure,
    series_label,
    spans_decades,
    terminal,
    time_unit,
)
from harness.bench.stores.store import Store, default_path, missing_store
from harness.exc import StoreError, UsageError

WIDTH = 120  # the terminal report fits this many columns
DEFAULT_TOP = 20

MARKS: dict[Verdict | str, str] = {
    Verdict.REGRESSED: "▲",
    Verdict.IMPROVED: "▼",
    Verdict.UNCHANGED: "=",
    Verdict.REJECTED: "= rejected",
    Verdict.UNCONFIRMED: "? unconfirmed",
    Verdict.INCONCLUSIVE: "? inconclusive",
    Verdict.SUSPECT: "? suspect",
    Verdict.NOT_COMPARABLE: "≠",
    Verdict.NEW: "·",
    Verdict.MISSING: "-",
}
LEGEND = (
    "Marks: ▲ regressed, ▼ improved (both confirmed side by side), = unchanged, '= rejected' (flagged against "
    "stored samples, rejected side by side), '? unconfirmed' (could not be measured side by side), '? suspect' "
    "(flagged against stored samples only), ≠ not comparable, · first run. The run's own stored verdicts; "
    "runs marked `recomputed` stored none (compared here with the previous run of the series)."
)


@dataclass
class Point:
    run: RunInfo
    result: Result
    cmp: Comparison | None = None  # the run's stored verdict, else recomputed against the previous point


@dataclass
class History:
    """Series per (workload, compiler), each a list of points oldest first; runs: every run of a point."""

    series: dict[tuple[str, str], list[Point]] = field(default_factory=dict)
    runs: list[RunInfo] = field(default_factory=list)
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)  # workload -> (profile, device name)

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(w for w, _ in self.series))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "workloads",
        nargs="*",
        metavar="WORKLOAD",
        help="fnmatch patterns of workload names (default: all), e.g. 'softmax.*' 'model.gpt2.*'",
    )
    p.add_argument(
        "--db",
        type=Path,
        default=None,
        help="SQLite store (default $KILN_BENCH_DB, else results/bench/<backend>/bench.sqlite: the "
        "store `nox -s ci` and `nox -s bench` write)",
    )
    p.add_argument(
        "--profile",
        help="tiny or gpu (model cases: models-PROFILE); default: each workload's newest run's profile",
    )
    p.add_argument("--device", help="only runs whose device (cpu, cuda) or device name contains this")
    p.add_argument("--runner", help="only runs recorded by this runner (RUNNER_NAME or host name)")
    p.add_argument("--hw-class", help="only runs of this hardware class (GPU label, else GPU model)")
    from harness.store.cli import add_store_flags

    add_store_flags(p)
    p.add_argument("--last", type=int, default=10, help="runs in the table (default 10)")
    p.add_argument(
        "--out", type=Path, help="write a PNG plot per workload into this folder (no plots without it)"
    )
    p.add_argument(
        "--top",
        type=int,
        default=DEFAULT_TOP,
        help=f"series in the terminal report, those that moved most first (default {DEFAULT_TOP})",
    )
    p.add_argument("--all", action="store_true", help="every series in the terminal report")
    p.add_argument("--no-plots", action="store_true", help="write no PNG even with --out")
    p.add_argument("--md", type=Path, help="write the wide Markdown table (a column per series) here")
    conventions.add_json(p, "every series with its points")
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="as `bench compare` (default $KILN_BENCH_THRESHOLD, else 0.05 GPU, 0.10 CPU)",
    )
    p.add_argument("--alpha", type=float, default=None, help="Mann-Whitney level (default 0.01)")
    p.add_argument(
        "--drift",
        choices=["auto", "on", "off"],
        default="auto",
        help="divide out eager's median ratio over all workloads (auto: on for CPU runs)",
    )


def _profile_ok(run: RunInfo, workload: str, profile: str | None) -> bool:
    if profile is None:
        return True
    want = f"models-{profile}" if workload.startswith("model.") else profile
    return run.profile in (want, profile)


def _device_ok(run: RunInfo, device: str | None) -> bool:
    if not device:
        return True
    d = device.lower()
    return run.device.lower() == d or d in (run.device_name or "").lower()


def collect(
    store: Store,
    patterns: list[str],
    profile: str | None = None,
    device: str | None = None,
    cfg: CompareConfig | None = None,
    *,
    runner: str | None = None,
    hw_class: str | None = None,
) -> History:
    """The series of every workload matching `patterns` over the complete runs (of one runner or hardware
    class, when given; see module docstring)."""
    cfg = cfg or CompareConfig()
    runs = [
        r
        for r in reversed(store.runs(complete_only=True, runner=runner, hw_class=hw_class))
        if _device_ok(r, device)
    ]
    if not runs:
        where = (
            (f" on device {device!r}" if device else "")
            + (f" of runner {runner!r}" if runner else "")
            + (f" of hardware class {hw_class!r}" if hw_class else "")
        )
        raise StoreError(f"no complete runs{where} in {store.path}")
    results = store.results_of([r.rid for r in runs])
    pats = patterns or ["*"]
    names = list(dict.fromkeys(x.workload for r in runs for x in results[r.rid]))
    chosen = [w for w in names if any(fnmatch(w, p) for p in pats)]
    if profile is not None:
        chosen = [
            w
            for w in chosen
            if any(_profile_ok(r, w, profile) and any(x.workload == w for x in results[r.rid]) for r in runs)
        ]
    if not chosen:
        raise UsageError(
            f"no stored workload matches {' '.join(pats)}"
            + (f" in profile {profile}" if profile else "")
            + f" ({len(names)} workloads in {len(runs)} complete runs; see `bench show latest`)"
        )
    hist = History()
    stored = {
        i: {(v.workload, v.compiler): v for v in (vs or [])}
        for i, vs in store.verdicts_of([r.rid for r in runs]).items()
    }
    drifts: dict[tuple[int, int], float] = {}
    used: dict[int, RunInfo] = {}
    for w in chosen:
        have = [
            r for r in runs if _profile_ok(r, w, profile) and any(x.workload == w for x in results[r.rid])
        ]
        kind = (have[-1].profile, have[-1].device_name)
        hist.kinds[w] = kind
        cls = have[-1].hw_class  # nor hardware classes (runs from before runners were recorded name none)
        have = [
            r for r in have if (r.profile, r.device_name) == kind and (not cls or r.hw_class in (None, cls))
        ]
        for run in have:
            for res in results[run.rid]:
                if res.workload != w:
                    continue
                pts = hist.series.setdefault((w, res.compiler), [])
                pt = Point(run, res)
                mine = stored[run.rid].get((w, res.compiler))
                if mine is not None:
                    pt.cmp = mine
                elif stored[run.rid] and mine is None and pts:
                    pt.cmp = None  # the run compared and stored verdicts, this key had none
                elif pts:
                    pt.cmp = mark_suspects(
                        [_step(pts[-1], pt, results, cfg, drifts)],
                        "the previous run's stored samples (recomputed)",
                    )[0]
                    pt.cmp.recomputed = True
                if pt.cmp is not None:
                    pt.cmp.interpreter = res.compiler in interpreted(run.device, [res.compiler])
                pts.append(pt)
                used[run.rid] = run
    hist.runs = [used[i] for i in sorted(used)]
    return hist


def _step(
    prev: Point,
    pt: Point,
    results: dict[int, list[Result]],
    cfg: CompareConfig,
    drifts: dict[tuple[int, int], float],
) -> Comparison:
    """`bench compare`'s verdict for one workload+compiler: `pt`'s run against `prev`'s run."""
    c = cfg.for_device(pt.run.device)
    key = (pt.run.rid, prev.run.rid)
    if key not in drifts:
        drifts[key] = (
            drift_of(results[pt.run.rid], Baseline.of([prev.run], [results[prev.run.rid]]))
            if c.normalize_drift
            else 1.0
        )
    base = Baseline.of([prev.run], [[prev.result]])
    return compare([pt.result], base, c, new_run=pt.run, drift=drifts[key])[0]


# ------------------------------------------------------------------ table
def _label(run: RunInfo) -> tuple[str, str, str]:
    return str(run.id), (run.created_at or "")[:10], (run.git_commit or "-")[:8]


def _source(hist: History, run: RunInfo) -> str:
    """`stored` when the run's verdicts were stored by its `bench run`, `recomputed` when they are recomputed
    here, `-` when nothing of it was compared."""
    cmps = [p.cmp for pts in hist.series.values() for p in pts if p.run.id == run.id and p.cmp is not None]
    if not cmps:
        return "-"
    return "recomputed" if any(c.recomputed for c in cmps) else "stored"


def cell(pt: Point | None) -> str:
    if pt is None:
        return ""
    med = fmt_ns(pt.result.median_ns) if pt.result.status == "ok" else "failed"
    if pt.cmp is None:
        return f"{med} {MARKS[Verdict.NEW]}"
    ratio = f" x{pt.cmp.ratio:.2f}" if pt.cmp.ratio is not None else ""
    return f"{med}{ratio} {MARKS.get(pt.cmp.verdict, '?')}"


def table(hist: History, last: int = 10) -> list[list[str]]:
    """Rows: the last `last` runs, newest first; a column per workload+compiler (median, ratio, mark)."""
    keys = list(hist.series)
    by_run = {k: {p.run.id: p for p in pts} for k, pts in hist.series.items()}
    interp = {k for k, pts in hist.series.items() if any(interpreted(p.run.device, [k[1]]) for p in pts)}
    rows = [
        ["run", "date", "commit"]
        + [f"{w} [{c}{' (interpreter)' if (w, c) in interp else ''}]" for w, c in keys]
        + ["verdicts"]
    ]
    for run in list(reversed(hist.runs))[: max(1, last)]:
        rows.append([*_label(run)] + [cell(by_run[k].get(run.id)) for k in keys] + [_source(hist, run)])
    return rows


def regressions(hist: History) -> list[Point]:
    """Points whose run confirmed a regression side by side."""
    return [p for pts in hist.series.values() for p in pts if p.cmp and p.cmp.verdict == Verdict.REGRESSED]


def flagged(hist: History) -> list[Point]:
    """Points with a verdict other than unchanged/new: regressed, improved, rejected, unconfirmed, suspect..."""
    return [
        p
        for pts in hist.series.values()
        for p in pts
        if p.cmp and p.cmp.verdict not in (Verdict.UNCHANGED, Verdict.NEW)
    ]


def verdict_line(p: Point) -> str:
    """One line of a flagged point, with the numbers of its run's comparison table."""
    c = p.cmp
    assert c is not None
    text = f"{c.verdict}: {p.result.workload} [{p.result.compiler}] run {p.run.id}"
    if c.ratio is not None:
        text += f" x{c.ratio:.2f} (p={c.p:.2g}; {fmt_ns(c.base_ns)} -> {fmt_ns(c.new_ns)})"
    if c.sbs_ratio is not None:
        text += f", side by side x{c.sbs_ratio:.2f} (p={c.sbs_p:.2g})"
    text += " recomputed against the previous run" if c.recomputed else " as its run stored it"
    return text + (f" {INTERPRETER_LABEL}" if c.interpreter else "")


def markdown_report(hist: History, last: int = 10) -> str:
    regs = regressions(hist)
    lines = [
        f"## Bench history: {len(hist.workloads())} workload(s), {len(hist.runs)} complete run(s)",
        "",
        markdown(table(hist, last)),
        "",
        LEGEND,
        "",
    ]
    if regs:
        lines.append(
            "Regressed steps: "
            + "; ".join(
                f"{p.result.workload} [{p.result.compiler}] run {p.run.id} x{p.cmp.ratio:.2f}"  # type: ignore[union-attr]
                for p in regs
            )
        )
    else:
        lines.append("No regressed step.")
    lines += [""] + [f"- {verdict_line(p)}" for p in flagged(hist) if p.cmp.verdict != Verdict.REGRESSED]  # type: ignore[union-attr]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ plots
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def plot_workload(hist: History, workload: str, path: Path) -> Path:
    """Median per compiler over the workload's runs, IQR bars, regressed steps ringed in red."""
    plt = pyplot()
    runs = sorted(
        {p.run.id: p.run for (w, _), pts in hist.series.items() if w == workload for p in pts}.values(),
        key=lambda r: r.id or 0,
    )
    xs = {r.id: i for i, r in enumerate(runs)}
    meds = [
        p.result.median_ns
        for (w, _), pts in hist.series.items()
        if w == workload
        for p in pts
        if p.result.median_ns
    ]
    div, unit = time_unit(meds)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(runs) + 2), 3.6))
    flagged = False
    for (w, c), pts in hist.series.items():
        pts = [p for p in pts if w == workload and p.result.stats]
        if not pts:
            continue
        x = [xs[p.run.id] for p in pts]
        st = [p.result.stats for p in pts]
        y = [s.median / div for s in st]  # type: ignore[union-attr]
        err = [[(s.median - s.q1) / div for s in st], [(s.q3 - s.median) / div for s in st]]  # type: ignore[union-attr]
        ax.errorbar(
            x,
            y,
            yerr=err,
            marker="o",
            ms=4,
            capsize=3,
            label=series_label(c, pts[-1].run.device),
            color=arms.colour(c),
        )
        reg = [(xx, yy) for xx, yy, p in zip(x, y, pts) if p.cmp and p.cmp.verdict == Verdict.REGRESSED]
        if reg:
            flagged = True
            ax.scatter(
                [r[0] for r in reg],
                [r[1] for r in reg],
                s=160,
                facecolors="none",
                edgecolors="tab:red",
                linewidths=2,
                zorder=5,
            )
    if flagged:
        ax.scatter(
            [], [], s=80, facecolors="none", edgecolors="tab:red", linewidths=2, label=str(Verdict.REGRESSED)
        )
    ax.set_xticks(
        range(len(runs)),
        [f"{(r.git_commit or '-')[:7]}\n{(r.created_at or '')[:10]}" for r in runs],
        fontsize=6,
    )
    ax.set_xlim(-0.5, len(runs) - 0.5)
    prof, dev = hist.kinds.get(workload, ("", ""))
    device = runs[-1].device if runs else ""
    if spans_decades(meds):  # eager in us beside kiln's interpreter in ms: a linear axis would flatten one
        ax.set_yscale("log")
    ax.set_title(
        plot_title(f"{workload}: median time per run ({prof})", None, device=device, device_name=dev),
        fontsize=8,
    )
    ax.set_ylabel(f"median ({unit}{', log scale' if spans_decades(meds) else ''}), bar: IQR", fontsize=7)
    ax.set_xlabel("run (commit, date)", fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path


def plot_all(hist: History, out: Path, say: Callable[[str], None] | None = None) -> list[Path]:
    """One PNG per workload into `out`; `say` gets a progress line every few plots (they take a second each)."""
    import time

    workloads, paths, t0 = hist.workloads(), [], time.monotonic()
    for i, w in enumerate(workloads):
        paths.append(plot_workload(hist, w, out / f"history_{_safe(w)}.png"))
        if say and (i + 1 == len(workloads) or (i + 1) % 5 == 0):
            say(f"plots: {i + 1}/{len(workloads)} written ({time.monotonic() - t0:.0f}s)")
    return paths


# ------------------------------------------------------------------ terminal (long format) and JSON
def _moved(pts: list[Point]) -> tuple[int, float]:
    """Sort key of a series: flagged last step first, then the size of its last step (|log ratio|)."""
    last = pts[-1].cmp
    if last is None or last.ratio is None or last.ratio <= 0:
        return (2, 0.0)
    import math

    return (0 if last.verdict not in (Verdict.UNCHANGED, Verdict.NEW) else 1, -abs(math.log(last.ratio)))


def long_rows(hist: History, top: int | None) -> tuple[list[list[str]], int]:
    """(the long-format table, header first, of the `top` series that moved most (None: all); series left out)."""
    keys = sorted(hist.series, key=lambda k: (_moved(hist.series[k]), k))
    shown = keys if top is None else keys[: max(0, top)]
    rows = [["workload", "compiler", "runs", "first", "last", "step", "mark"]]
    for w, c in shown:
        pts = hist.series[(w, c)]
        first, last = pts[0].result, pts[-1].result
        cmp = pts[-1].cmp
        ratio = f"x{cmp.ratio:.2f}" if cmp is not None and cmp.ratio is not None else "-"
        mark = MARKS.get(cmp.verdict, "?") if cmp is not None else MARKS[Verdict.NEW]
        name = w if len(w) <= 48 else w[:45] + "..."
        comp = f"{c} (interp.)" if interpreted(pts[-1].run.device, [c]) else c
        rows.append([name, comp, str(len(pts)), fmt_ns(first.median_ns), fmt_ns(last.median_ns), ratio, mark])
    return rows, len(keys) - len(shown)


def terminal_report(hist: History, top: int | None = DEFAULT_TOP) -> str:
    """What `bench history` prints: a header, the long-format table, the flagged steps; lines within WIDTH."""
    rows, left = long_rows(hist, top)
    runs = hist.runs
    span = f"runs {runs[0].id}..{runs[-1].id}" if runs else "no runs"
    lines = [
        f"bench history: {len(hist.series)} series ({len(hist.workloads())} workloads), "
        f"{len(runs)} complete run(s), {span}",
        terminal(rows),
    ]
    if left:
        lines.append(f"... {left} more series (--top N, --all; --md FILE for the table of every run)")
    single = sum(1 for pts in hist.series.values() if len(pts) < 2)
    if single:
        lines.append(f"note: {single} series have only 1 complete run: nothing to compare them with yet")
    if any(interpreted(p.run.device, [c]) for (_, c), pts in hist.series.items() for p in pts[-1:]):
        lines.append(f"note: kiln on CPU {INTERPRETER_LABEL}")
    lines.append(
        "marks: ▲ regressed ▼ improved = unchanged ? suspect/unconfirmed ≠ not comparable · first run"
    )
    marked = flagged(hist)
    lines += [_short_verdict(p) for p in marked[:10]]
    if len(marked) > 10:
        lines.append(f"... {len(marked) - 10} more flagged steps (--md FILE or --json - lists them all)")
    if any(p.cmp is not None and p.cmp.recomputed for p in marked):
        lines.append(
            "(recomputed: its run stored no verdicts; the step is recomputed against the previous run: a suspect at most)"
        )
    return "\n".join(_fit(line) for text in lines for line in text.splitlines())


def _short_verdict(p: Point) -> str:
    """One flagged step in a terminal line: verdict, series, run, ratio, medians and the side-by-side ratio (the
    p-values: `verdict_line`, in --md)."""
    c = p.cmp
    assert c is not None
    ratio = f" x{c.ratio:.2f} ({fmt_ns(c.base_ns)} -> {fmt_ns(c.new_ns)})" if c.ratio is not None else ""
    if c.sbs_ratio is not None:
        ratio += f", side by side x{c.sbs_ratio:.2f}"
    source = "recomputed" if c.recomputed else "as its run stored it"
    return f"{c.verdict}: {p.result.workload} [{p.result.compiler}] run {p.run.id}{ratio} {source}"


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def json_report(hist: History) -> dict:
    """Every series with its points (run, commit, median, ratio, verdict) for `--json`."""

    def point(p: Point) -> dict:
        c = p.cmp
        return {
            "run": p.run.id,
            "commit": p.run.git_commit,
            "created_at": p.run.created_at,
            "status": p.result.status,
            "median_ns": p.result.median_ns,
            "ratio": c.ratio if c is not None else None,
            "verdict": c.verdict if c is not None else Verdict.NEW,
            "recomputed": bool(c is not None and c.recomputed),
        }

    return {
        "runs": [r.id for r in hist.runs],
        "series": [
            {
                "workload": w,
                "compiler": c,
                "profile": hist.kinds.get(w, ("", ""))[0],
                "device_name": hist.kinds.get(w, ("", ""))[1],
                "interpreter": any(interpreted(p.run.device, [c]) for p in pts),
                "points": [point(p) for p in pts],
            }
            for (w, c), pts in hist.series.items()
        ],
    }


# ------------------------------------------------------------------ command
def cmd_history(args: argparse.Namespace) -> int:
    from harness.bench.judge.compare import config_from_args
    from harness.results import atomic_write_text

    if args.last < 1:
        raise UsageError(f"--last must be at least 1, not {args.last}")
    cfg = config_from_args(args)
    from harness.store.cli import exists, location

    db = location(args.db, default_path())
    if not exists(db):
        raise missing_store(db)
    with Store(db, readonly=True) as store:
        hist = collect(
            store,
            list(args.workloads),
            args.profile,
            args.device,
            cfg,
            runner=getattr(args, "runner", None),
            hw_class=getattr(args, "hw_class", None),
        )
    with conventions.human_to_stderr(conventions.to_stdout(args.json)):
        print(terminal_report(hist, None if args.all else args.top))
        if args.md:
            atomic_write_text(args.md, markdown_report(hist, args.last))
        if args.out and not args.no_plots:  # plots only when asked for, with progress lines
            try:
                paths = plot_all(hist, args.out, say=lambda m: print(m, file=sys.stderr, flush=True))
                print(f"wrote {len(paths)} plot(s) into {args.out}")
            except PlotUnavailable as e:
                print(f"note: {e}", file=sys.stderr)
        elif not args.out:
            print("(a PNG plot per workload: --out DIR)", file=sys.stderr)
    if args.json:
        conventions.write_json(args.json, json_report(hist))
    return 0
