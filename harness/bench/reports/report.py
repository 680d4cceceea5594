"""Reports: terminal tables, Markdown (CI job summary), JSON, and PNG plots (matplotlib, optional).

Tables are lists of rows (lists of strings) rendered by `terminal()` or `markdown()`, so every report has
the same content in both forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import arms
from harness.bench.core.records import INTERPRETER_LABEL, Result, RunInfo, Verdict, by_case
from harness.bench.core.stats import Stats
from harness.bench.judge.compare import VERDICTS, Comparison, counts
from harness.exc import BenchError
from harness.results import markdown_table

Table = list[list[str]]
SPREAD_MIN_NS = 100_000.0  # spread between runs is judged on workloads above 100 microseconds


class PlotUnavailable(BenchError):
    """matplotlib is missing; plots can be made later from an exported JSON."""


def fmt_ns(ns: float | None) -> str:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    for unit, div in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= div:
            return f"{ns / div:.3g} {unit}" if ns / div < 100 else f"{ns / div:.0f} {unit}"
    return f"{ns:.0f} ns"


def _g(x: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def terminal(table: Table) -> str:
    """Left-aligned first column, right-aligned others, a rule under the header."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = []
    for n, row in enumerate(table):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(table: Table) -> str:
    """A table (header row first) in Markdown: the first column left-aligned, the numbers right."""
    return "\n".join(markdown_table(table[0], table[1:], "l" + "r" * (len(table[0]) - 1)))


# ------------------------------------------------------------------ interpreter runs
INTERPRETER_NOTE = (
    "kiln (interpreter: pipeline check, not kernel speed): on a CPU kiln runs through Triton's interpreter: its times measure the interpreter (NumPy, program by "
    "program), not generated code, and compare with neither eager's nor Inductor's C++ kernels. kiln's "
    "column shows no speedup over eager; read it against kiln's own history (`of base`: its ratio to the "
    "baseline run, when the run was compared). Its regressions fail a job only when confirmed side by side "
    "(both builds under the interpreter on this machine, taking turns): a slower pipeline, not slower kernels."
)


def interpreted(device: str, compilers: Sequence[str]) -> set[str]:
    """Those of `compilers` whose times on `device` are interpreter times (kiln and its modes off the GPU)."""
    return set() if device.startswith("cuda") else {c for c in compilers if arms.is_kiln(c)}


def speedup_compilers(device: str, compilers: Sequence[str]) -> list[str]:
    """The compilers whose speedup over eager means something on `device`."""
    skip = interpreted(device, compilers)
    return [c for c in compilers if c not in skip]


# ------------------------------------------------------------------ tables
def latency_cell(r: Result | None, eager: Result | None, fmt: Callable[[float], str]) -> str:
    """A table cell: ``-`` (not measured), ``error``, or the median with its speedup over ``eager`` (none for
    eager itself: pass ``eager=None``)."""
    if r is None:
        return "-"
    if r.status != "ok":
        return "error"
    if r.median_ns is None:
        return "-"
    cell = fmt(r.median_ns)
    if eager is not None and eager.median_ns and r.median_ns:
        cell += f" ({eager.median_ns / r.median_ns:.2f}x)"
    return cell


def side_by_side(
    results: list[Result],
    compilers: Sequence[str],
    device: str = "cuda",
    cmps: list[Comparison] | None = None,
) -> Table:
    """One row per workload: median per compiler and its speedup over eager, and the best GB/s. On a CPU,
    kiln's cells (interpreter times) carry its ratio to the baseline instead (`INTERPRETER_NOTE`)."""
    by = by_case(results)
    interp = interpreted(device, compilers)
    base = {(c.workload, c.compiler): c for c in cmps or []}
    head = ["workload"] + [f"{c} (interpreter)" if c in interp else c for c in compilers]
    rows = [head + ["best GB/s", "best %ceil"]]
    for w, per in by.items():
        eager = per.get("eager")
        row = [w]
        best: Result | None = None
        for c in compilers:
            r = per.get(c)
            if c in interp:
                cell = latency_cell(r, None, fmt_ns)
                cmp = base.get((w, c))
                if cell not in ("-", "error") and cmp is not None and cmp.ratio:
                    cell += f" ({cmp.ratio:.2f}x of base)"
                row.append(cell)
                continue
            row.append(latency_cell(r, None if c == "eager" else eager, fmt_ns))
            if r is not None and r.status == "ok":
                if best is None or (r.median_ns or math.inf) < (best.median_ns or math.inf):
                    best = r
        row += [
            _g(best.gbps, "{:.1f}") if best else "-",
            _g(best.frac_ceiling * 100 if best and best.frac_ceiling else None, "{:.0f}%"),
        ]
        rows.append(row)
    return rows


def details(results: list[Result]) -> Table:
    """Every result: median, spread, bandwidth, compute, error vs float64, compile time, status."""
    rows = [
        [
            "workload",
            "compiler",
            "median",
            "spread",
            "n",
            "GB/s",
            "%ceil",
            "TFLOP/s",
            "max err",
            "rel err",
            "compile s",
            "status",
        ]
    ]
    for r in results:
        s: Stats | None = r.stats
        rows.append(
            [
                r.workload,
                r.compiler,
                fmt_ns(s.median if s else None),
                _g(s.spread * 100 if s else None, "{:.1f}%"),
                str(s.n) if s else "0",
                _g(r.gbps, "{:.1f}"),
                _g(r.frac_ceiling * 100 if r.frac_ceiling else None, "{:.0f}%"),
                _g(r.tflops, "{:.1f}"),
                _g(r.max_abs_err, "{:.2e}"),
                _g(r.max_rel_err, "{:.2e}"),
                _g(r.compile_s, "{:.2f}"),
                "ok" + (f" (planted {r.planted:+.0%})" if r.planted else "")
                if r.status == "ok"
                else (r.error or "error"),
            ]
        )
    return rows


def comparison_table(cmps: list[Comparison], only_flagged: bool = False) -> Table:
    """Per comparison: the stored comparison's medians, ratio and p (baseline = its stored samples), the
    side-by-side ratio and p where the suspect was measured beside the baseline build, the verdict."""
    rows = [["workload", "compiler", "baseline", "new", "ratio", "p", "side by side", "verdict", "note"]]
    for c in cmps:
        if only_flagged and c.verdict == Verdict.UNCHANGED:
            continue
        rows.append(
            [
                c.workload,
                c.compiler + (" (interpreter)" if c.interpreter else ""),
                fmt_ns(c.base_ns),
                fmt_ns(c.new_ns),
                _g(c.ratio, "{:.3f}"),
                _g(c.p, "{:.2g}"),
                "-" if c.sbs_ratio is None else f"{c.sbs_ratio:.3f} (p={c.sbs_p:.2g})",
                c.verdict
                + (" (confirmed)" if c.confirmed else "")
                + (" (recomputed)" if c.recomputed else ""),
                c.note,
            ]
        )
    return rows


def counts_line(cmps: list[Comparison]) -> str:
    """Counts per verdict: regressed always, the others when present."""
    line = ", ".join(f"{v}: {n}" for v, n in counts(cmps).items() if n or v == Verdict.REGRESSED)
    if any(c.interpreter for c in cmps):
        line += f"; kiln {INTERPRETER_LABEL}"
    return line


def spread_table(
    a: list[Result], b: list[Result], min_ns: float = SPREAD_MIN_NS
) -> tuple[Table, dict[str, Any]]:
    """Median of the same workload+compiler in two runs: |b - a| / a, for results above `min_ns`."""
    base = {(r.workload, r.compiler): r for r in a if r.status == "ok"}
    rows = [["workload", "compiler", "run 1", "run 2", "spread"]]
    spreads = []
    for r in b:
        x = base.get((r.workload, r.compiler))
        if r.status != "ok" or x is None or not x.median_ns or not r.median_ns:
            continue
        if min(x.median_ns, r.median_ns) < min_ns:
            continue
        s = abs(r.median_ns - x.median_ns) / x.median_ns
        spreads.append(s)
        rows.append([r.workload, r.compiler, fmt_ns(x.median_ns), fmt_ns(r.median_ns), f"{s * 100:.2f}%"])
    summary = {
        "count": len(spreads),
        "max_spread": max(spreads) if spreads else None,
        "median_spread": Stats.of(spreads).median if spreads else None,
        "under_3pct": sum(1 for s in spreads if s < 0.03),
    }
    return rows, summary


def run_header(run: RunInfo) -> str:
    return (
        f"run {run.id} ({run.status}) profile={run.profile} device={run.device_name or run.device} "
        f"compilers={','.join(run.compilers)} ref={run.git_ref or '-'} commit={(run.git_commit or '-')[:10]} "
        f"ceiling={_g(run.ceiling_gbps, '{:.1f}')} GB/s timer={run.config.get('timer', '-')}"
    )


def markdown_report(
    run: RunInfo, results: list[Result], cmps: list[Comparison] | None, baseline: list[RunInfo] | None = None
) -> str:
    """A CI job summary: header, comparison verdicts (flagged first), side-by-side table, details folded."""
    parts = [f"## kiln bench: run {run.id}", "", f"`{run_header(run)}`", ""]
    if cmps is not None:
        names = ", ".join(str(b.id) for b in baseline or [])
        parts += [f"### Against baseline run(s) {names}", "", counts_line(cmps), ""]
        flagged = [c for c in cmps if c.verdict != Verdict.UNCHANGED]
        parts += [
            markdown(comparison_table(flagged))
            if flagged
            else "Nothing regressed, improved, new or missing.",
            "",
        ]
    if interpreted(run.device, run.compilers):
        parts += [f"> {INTERPRETER_NOTE}", ""]
    parts += [
        "### Latency side by side (speedup over eager)",
        "",
        markdown(side_by_side(results, run.compilers, run.device, cmps)),
        "",
        "```",
        text_bars(results, speedup_compilers(run.device, run.compilers)),
        "```",
        "",
        "<details><summary>Every result</summary>",
        "",
        markdown(details(results)),
        "",
        "</details>",
        "",
    ]
    return "\n".join(parts)


def json_report(
    run: RunInfo, results: list[Result], cmps: list[Comparison] | None, baseline: list[RunInfo] | None = None
) -> dict[str, Any]:
    return {
        "run": {k: v for k, v in run.as_dict().items() if k != "env"},
        "environment": run.env,
        "results": [{k: v for k, v in r.as_dict().items() if k != "samples"} for r in results],
        "baseline_runs": [b.id for b in baseline or []],
        # who the baseline runs are beyond this store (ids differ between stores; uid and commit do not)
        "baseline": [
            {k: getattr(b, k) for k in ("id", "uid", "created_at", "git_ref", "git_commit")}
            for b in baseline or []
        ],
        "comparisons": [c.as_dict() for c in cmps] if cmps is not None else None,
        "counts": counts(cmps) if cmps is not None else None,
        "verdicts": list(VERDICTS),
    }


# ------------------------------------------------------------------ plots
def save_figure(fig: Any, path: Path, dpi: int) -> None:
    """Save a matplotlib figure as PNG atomically: rendered in memory, then written and renamed into place."""
    import io

    from harness.results import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "matplotlib is not installed: skipping plots. Export the runs "
            "(`python -m harness.bench export OUT.json`) and run "
            "`python -m harness.bench plot --from-json OUT.json "
            "--out DIR` where matplotlib is installed."
        ) from None
    return plt


INTERPRETER_CAVEAT = "kiln on CPU: Triton CPU interpreter times (a pipeline check, not kernel speed)"


def backend_label(device: str, device_name: str | None = None) -> str:
    """The backend a plot's title names: `cuda: NVIDIA H100` or `cpu: AMD EPYC (Triton CPU interpreter)`."""
    kind = "cuda" if device.startswith("cuda") else device
    name = (
        device_name
        if device_name and device_name.startswith(kind)
        else f"{kind}: {device_name}"
        if device_name and device_name != device
        else kind
    )
    return name if kind.startswith("cuda") else f"{name} (Triton CPU interpreter for kiln)"


def plot_title(
    what: str,
    run: RunInfo | None = None,
    *,
    device: str | None = None,
    device_name: str | None = None,
    extra: str = "",
) -> str:
    """`what`, then the backend and run on a second line (`backend_label`)."""
    dev = device or (run.device if run is not None else "")
    name = device_name or (run.device_name if run is not None else None)
    where = [backend_label(dev, name)] if dev else []
    if run is not None:
        where.append(f"run {run.id}, {run.profile}, {(run.git_commit or '-')[:8]}")
    if extra:
        where.append(extra)
    return what + ("\n" + "; ".join(where) if where else "")


def no_speedup_reason(run: RunInfo) -> str:
    """Why a run has no speedup plot (only interpreted compilers besides eager)."""
    return (
        f"its compilers ({', '.join(run.compilers)}) have no speedup over eager on {run.device}: "
        f"{INTERPRETER_CAVEAT}"
    )


def series_label(compiler: str, device: str) -> str:
    """A compiler's legend entry: `kiln (Triton CPU interpreter)` where its times are interpreter times."""
    return f"{compiler} (Triton CPU interpreter)" if interpreted(device, [compiler]) else compiler


def spans_decades(values: Sequence[float], decades: float = 1.0) -> bool:
    """True when the positive `values` span more than `decades` powers of ten (a log axis reads them)."""
    pos = [v for v in values if v and v > 0]
    return bool(pos) and max(pos) / min(pos) > 10**decades


def time_unit(values_ns: Sequence[float]) -> tuple[float, str]:
    """(divisor, unit) that shows the smallest of `values_ns` as at least 1: ms, us or ns."""
    pos = [v for v in values_ns if v and v > 0]
    low = min(pos) if pos else 0.0
    return next(((d, u) for d, u in ((1e6, "ms"), (1e3, "us")) if low >= d), (1.0, "ns"))


def plot_speedups(
    results: list[Result], compilers: Sequence[str], path: Path, run: RunInfo | None = None
) -> Path:
    """Horizontal bars: speedup of each compiler over eager, per workload (log scale), one colour per compiler
    (arms.colour). `compilers` are those whose speedup means something (`speedup_compilers`): a caller with only
    eager there writes no figure (no empty PNG)."""
    plt = pyplot()
    eager = {
        r.workload: r.median for r in results if r.compiler == "eager" and r.status == "ok" and r.median_ns
    }
    workloads = list(dict.fromkeys(r.workload for r in results))
    others = [c for c in compilers if c != "eager"]
    if not others:
        raise BenchError("no compiler besides eager to plot a speedup of")
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(workloads) * max(1, len(others)) + 2))
    h = 0.8 / max(1, len(others))
    device = run.device if run is not None else "cuda"
    for j, c in enumerate(others):
        med = {r.workload: r.median for r in results if r.compiler == c and r.status == "ok" and r.median_ns}
        ys = [i + j * h for i in range(len(workloads))]
        vals = [eager[w] / med[w] if w in med and eager.get(w) else 0 for w in workloads]
        ax.barh(ys, vals, height=h, label=series_label(c, device), color=arms.colour(c))
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(workloads))], workloads, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over eager (x, log scale; > 1: faster than eager)")
    skipped = sorted(interpreted(device, run.compilers)) if run is not None else []
    ax.set_title(
        plot_title(
            "Kernel speedup over eager (median time per call)",
            run,
            extra=f"not shown: {', '.join(skipped)} (interpreter)" if skipped else "",
        ),
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_ratios(cmps: list[Comparison], threshold: float, path: Path, run: RunInfo | None = None) -> Path:
    """Bars: new/baseline median ratio per workload+compiler, threshold lines, regressions in red."""
    plt = pyplot()
    rows = [c for c in cmps if c.ratio is not None]
    ratios = [c.ratio - 1 for c in cmps if c.ratio is not None]
    fig, ax = plt.subplots(figsize=(9, 0.22 * len(rows) + 2))
    colors = [
        "tab:red"
        if c.verdict == Verdict.REGRESSED
        else "tab:green"
        if c.verdict == Verdict.IMPROVED
        else "tab:gray"
        for c in rows
    ]
    ax.barh(range(len(rows)), ratios, left=1, color=colors)
    for x in (1 - threshold, 1 + threshold):
        ax.axvline(x, color="k", ls="--", lw=0.7)
    device = run.device if run is not None else "cuda"
    ax.set_yticks(
        range(len(rows)), [f"{c.workload} [{series_label(c.compiler, device)}]" for c in rows], fontsize=6
    )
    ax.invert_yaxis()
    ax.set_xlabel(
        f"median time new / baseline (x; > 1: slower; dashed: +-{threshold:.0%}; red: regressed, "
        "green: improved)"
    )
    ax.set_title(plot_title("Change against the baseline run", run), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_history(
    history: dict[str, dict[str, list[tuple[int, float]]]], path: Path, run: RunInfo | None = None
) -> Path:
    """Small multiples: median per run for each workload, one line per compiler (arms.colour), a log time axis
    where a panel's times span more than a decade (eager in us beside kiln's interpreter in ms)."""
    plt = pyplot()
    names = list(history)
    cols = 4
    nrows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.4 * nrows + 0.8), squeeze=False)
    device = run.device if run is not None else "cuda"
    for ax, w in zip(axes.flat, names):
        values = [p[1] for pts in history[w].values() for p in pts]
        div, unit = time_unit(values)
        for c, pts in history[w].items():
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] / div for p in pts],
                    marker="o",
                    ms=3,
                    label=series_label(c, device),
                    color=arms.colour(c),
                )
        if spans_decades(values):
            ax.set_yscale("log")
        ax.set_title(w, fontsize=7)
        ax.tick_params(labelsize=6)
        ax.set_xlabel("run id", fontsize=6)
        ax.set_ylabel(f"median ({unit})", fontsize=6)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if names:
        axes.flat[0].legend(fontsize=6)
    fig.suptitle(
        plot_title(
            "Median time per run and workload",
            None,
            device=device,
            device_name=run.device_name if run is not None else None,
        ),
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path


def text_bars(results: list[Result], compilers: Sequence[str], width: int = 40) -> str:
    """A plot in text form: speedup over eager per workload and compiler, as bars (| marks 1.0x)."""
    eager = {
        r.workload: r.median for r in results if r.compiler == "eager" and r.status == "ok" and r.median_ns
    }
    others = [c for c in compilers if c != "eager"]
    rows = [
        (r.workload, r.compiler, eager[r.workload] / r.median)
        for r in results
        if r.compiler in others and r.status == "ok" and r.median_ns and eager.get(r.workload)
    ]
    if not rows:
        return "(no compiled results to plot)"
    top = max(2.0, max(x for _, _, x in rows))
    one = round(width / top)
    name_w = max(len(f"{w} [{c}]") for w, c, _ in rows)
    lines = [f"speedup over eager (each # = {top / width:.2f}x, | = 1.0x)"]
    for w, c, x in rows:
        n = round(x / top * width)
        bar = "#" * n + " " * max(0, one - 1 - n) + ("|" if n < one else "")
        lines.append(f"{f'{w} [{c}]':<{name_w}}  {bar:<{width}}  {x:.2f}x")
    return "\n".join(lines)
