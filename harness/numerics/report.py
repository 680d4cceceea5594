"""Reports of a comparison: Markdown, JSON and an optional PNG plot (matplotlib).

A comparison (`compare.compare`) is one program; a suite comparison is a list of them (one per case). Output
is deterministic: the same runs give byte-identical reports (no times, numbers at fixed precision).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import arms
from harness.results import markdown_table

from . import SCHEMA
from .compare import ULP_BUCKETS, fmt
from .comparison import (
    Check,
    Comparison,
    Context,
    Nondeterminism,
    OutputComparison,
    Pair,
    RowSummary,
    SideDescription,
)
from .exc import NumericsError, RecordError
from .store import write_bytes
from .store import write_json as _write_json

LIST_SHOWN = 20


def _at(where: list[int]) -> str:
    return "[" + ", ".join(map(str, where)) + "]"


def _side_cell(s: SideDescription) -> list[Any]:
    dev = s.device or "?"
    if s.gpus:
        dev += f" ({', '.join(s.gpus)})"
    git = (s.git or "-")[:10] + (" (dirty)" if s.dirty else "")
    info = s.info
    kiln = (
        f"{info.kernels} kernels, {len(info.fallbacks or [])} fallbacks" if info.kernels is not None else "-"
    )
    return [s.label, f"`{s.run}`", s.compiler, dev, s.torch or "-", s.triton or "-", git, s.repeats, kiln]


def _run_to_run(nd: Nondeterminism | None) -> str:
    if nd is None:
        return "ran once"
    if nd.identical:
        return f"identical ({nd.repeats} runs)"
    return f"**{nd.differing} differ**, max {fmt(nd.max_abs_diff)} ({nd.repeats} runs)"


def _inputs_cell(ctx: Context) -> str:
    parts = []
    for n, v in ctx.items():
        if isinstance(v, RowSummary):
            body = f"row of {v.length}"
            if v.min is not None:
                body += f": min {fmt(v.min)}, max {fmt(v.max or 0.0)}, mean {fmt(v.mean or 0.0)}"
            if v.nonfinite:
                body += f", {v.nonfinite} non-finite"
            parts.append(f"{n} {body}")
        else:
            parts.append(f"{n}={fmt(v)}")
    return "; ".join(parts) or "-"


def _pair_md(o: OutputComparison, p: Pair) -> list[str]:
    a, b = p.a, p.b
    lines = ["", f"#### {b} vs {a}", "", f"**{p.verdict}.**", ""]
    if not p.differing:
        return lines
    mis = ", ".join(_at(w) for w in p.mismatched_at[:LIST_SHOWN])
    more = " ..." if p.mismatched > LIST_SHOWN else ""
    cm, cd = p.closer_mismatched, p.closer_differing
    return lines + [
        (
            f"- differing bits: {p.differing:,} of {o.compared:,} elements; closer to fp64 on them: "
            f"{a} {cd.a:,}, {b} {cd.b:,}, tie {cd.tie:,}"
        ),
        f"- mismatched (rtol {o.rtol:g}, atol {o.atol:g}): {p.mismatched:,}"
        + (f" at {mis}{more}" if p.mismatched else ""),
        f"- closer to fp64 on the mismatched: {a} {cm.a:,}, {b} {cm.b:,}, tie {cm.tie:,}",
        (
            f"- greatest absolute difference {fmt(p.max_abs_diff)} at {_at(p.max_abs_diff_at)}; "
            f"greatest relative difference {fmt(p.max_rel_diff)} at {_at(p.max_rel_diff_at)}"
        ),
        "",
        f"Worst {'mismatched' if p.mismatched else 'differing'} elements:",
        "",
        *markdown_table(
            ["at", a, b, "fp64", f"error {a} (ULP)", f"error {b} (ULP)", "closer", "inputs"],
            (
                [
                    _at(w.at),
                    f"{w.value.a:.8g}",
                    f"{w.value.b:.8g}",
                    f"{w.fp64:.8g}",
                    f"{fmt(w.err.a)} ({fmt(w.ulp.a)})",
                    f"{fmt(w.err.b)} ({fmt(w.ulp.b)})",
                    w.closer,
                    _inputs_cell(w.inputs),
                ]
                for w in p.worst
            ),
        ),
    ]


def _output_md(o: OutputComparison, labels: list[str]) -> list[str]:
    red = f", reduction length {o.reduction_length}" if o.reduction_length else ""
    compared = (
        f"{o.compared:,} sampled of {o.numel:,} elements (mismatch counts are over the sample)"
        if o.sampled
        else f"all {o.numel:,} elements"
    )
    lines = [
        f"### `{o.name}` {o.dtype}{o.shape}{red}",
        "",
        f"Compared: {compared}; rtol {o.rtol:g}, atol {o.atol:g}.",
        "",
        *markdown_table(
            [
                "side",
                "max error vs fp64 (at)",
                "mean error",
                "max ULP",
                "mean ULP",
                "non-finite errors",
                "run to run",
            ],
            (
                [
                    s.label,
                    f"{fmt(s.max_abs)} at {_at(s.max_abs_at)}",
                    fmt(s.mean_abs),
                    fmt(s.max_ulp),
                    fmt(s.mean_ulp),
                    s.nonfinite_errors,
                    _run_to_run(s.nondeterminism),
                ]
                for s in o.sides
            ),
        ),
    ]
    histogram = (
        [bucket, *(f"{s.histogram[i]:,}" for s in o.sides)]
        for i, bucket in enumerate(ULP_BUCKETS)
        if any(s.histogram[i] for s in o.sides)
    )
    lines += [
        "",
        "Elements per ULP error against fp64:",
        "",
        *markdown_table(["ULP error", *labels], histogram),
    ]
    for p in o.pairs:
        lines += _pair_md(o, p)
    return lines


def markdown(report: Comparison, level: int = 1) -> str:
    """The Markdown report of one comparison."""
    h = "#" * level
    prog = report.program
    labels = [s.label for s in report.sides]
    ins = ", ".join(f"{n} {i.dtype}{i.shape} `{i.digest[:12]}`" for n, i in report.inputs.items())
    lines = [f"{h} Numerics: `{prog.ref}`", ""]
    if prog.note:
        lines += [f"Program: {prog.note}.", ""]
    lines += [
        (
            f"Reference: {report.reference}. Seed {report.seed}; inputs (sha256, identical on every side): "
            f"{ins}."
        ),
        "",
        *markdown_table(
            ["side", "run", "compiler", "device", "torch", "triton", "git", "repeats", "kiln"],
            map(_side_cell, report.sides),
        ),
        "",
        f"{h}# Summary",
        "",
    ]
    summary = []
    for o in report.outputs:
        errs = [f"{fmt(s.max_abs)} ({fmt(s.max_ulp)})" for s in o.sides]
        mis = ", ".join(f"{p.b} {p.mismatched:,}" for p in o.pairs) or "-"
        nd = (
            ", ".join(
                f"{s.label} {s.nondeterminism.differing:,}"
                for s in o.sides
                if s.nondeterminism and not s.nondeterminism.identical
            )
            or "none seen"
        )
        summary.append([f"`{o.name}`", *errs, mis, nd])
    lines += markdown_table(
        [
            "output",
            *(f"max error {x} (ULP)" for x in labels),
            f"mismatched vs {report.baseline}",
            "run to run",
        ],
        summary,
    )
    lines += [
        "",
        (
            "ULP errors are measured at the fp64 value: results near zero (cancelling sums) show large ULP "
            "errors for small absolute ones; the absolute error is the steadier measure there."
        ),
        "",
    ]
    lines += [f"- `{o.name}`, {p.b} vs {p.a}: {p.verdict}" for o in report.outputs for p in o.pairs]
    if report.check:
        c = report.check
        lines += [
            "",
            f"Check (max error <= {c.ratio:g} x closest side's + 1 ULP"
            + (f", max ULP <= {c.max_ulp:g}" if c.max_ulp is not None else "")
            + "): "
            + ("**FAILED**: " + "; ".join(c.failures) if c.failures else "passed"),
        ]
    lines += ["", f"{h}# Outputs", ""]
    for o in report.outputs:
        lines += _output_md(o, labels) + [""]
    return "\n".join(lines).rstrip() + "\n"


def markdown_many(reports: list[Comparison], title: str) -> str:
    """One Markdown document for several comparisons (the cases of a suite run): a summary, then each."""
    if len(reports) == 1:
        return markdown(reports[0])
    rows = (
        [f"`{r.program.ref}`", f"`{o.name}`", f"{b} vs {a}: {verdict}"]
        for r in reports
        for o in r.outputs
        for b, a, verdict in [(p.b, p.a, p.verdict) for p in o.pairs] or [("-", "-", "one side")]
    )
    lines = [f"# {title}", "", *markdown_table(["program", "output", "verdict"], rows)]
    return "\n".join(lines) + "\n\n" + "\n".join(markdown(r, level=2) for r in reports)


def side_names(r: Comparison) -> dict[str, str]:
    """Each side's label -> `label (compiler)`, as the terminal names sides (`A (kiln)`)."""
    return {s.label: f"{s.label} ({s.compiler})" for s in r.sides}


def verdict_lines(reports: list[Comparison]) -> list[str]:
    """For the terminal: per program, one line saying which compiler and run folder each side label is, then one
    line per (output, pair) with each label followed by its compiler (`B (eager) vs A (kiln): run B (eager) ...`)."""
    lines = []
    for r in reports:
        names = side_names(r)

        def named(m: re.Match[str], names: dict[str, str] = names) -> str:
            return m.group(1) + names.get(m.group(2), m.group(2))

        if r.sides:
            lines.append(
                f"{r.program.ref} sides: " + ", ".join(f"{s.label} = {s.compiler} ({s.run})" for s in r.sides)
            )
        for o in r.outputs:
            for p in o.pairs:
                text = re.sub(r"\b(run |for )([A-Z]|S\d+)\b", named, p.verdict)
                lines.append(
                    f"{r.program.ref} {o.name}: {names.get(p.b, p.b)} vs {names.get(p.a, p.a)}: {text}"
                )
    return lines


def write_json(path: Path, reports: list[Comparison], check: Check | None = None) -> None:
    """The comparisons as JSON (atomically): {"schema", "reports", "check"}."""
    _write_json(
        path,
        {
            "schema": SCHEMA,
            "reports": [r.to_dict() for r in reports],
            "check": None if check is None else check.to_dict(),
        },
    )


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


HATCHES = ("", "//", "..", "xx", "\\\\")


def side_styles(compilers: list[str]) -> list[tuple[str, str]]:
    """(colour, hatch) of each side's bars: its compiler's colour in every harness plot (harness.arms.colour), a
    hatch for the second, third... side of the same compiler (two runs' kiln: `A kiln`, `E kiln`)."""
    seen: dict[str, int] = {}
    styles = []
    for compiler in compilers:
        k = seen.get(compiler, 0)
        seen[compiler] = k + 1
        styles.append((arms.colour(compiler), HATCHES[k % len(HATCHES)]))
    return styles


def plot(path: Path, reports: list[Comparison]) -> Path:
    """A PNG with one panel per output: elements per ULP-error bucket, one bar per side (coloured by compiler)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NumericsError(
            "--plot needs matplotlib (pip install matplotlib); Markdown and JSON need nothing"
        ) from None
    panels = [(r, o) for r in reports for o in r.outputs]
    cols = min(3, len(panels)) or 1
    rows = (len(panels) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (r, o) in zip(axes.flat, panels):
        n, names = len(o.sides), {s.label: s.compiler for s in r.sides}
        styles = side_styles([names[s.label] for s in o.sides])
        for j, (s, (colour, hatch)) in enumerate(zip(o.sides, styles)):
            xs = [i + (j - (n - 1) / 2) * 0.8 / n for i in range(len(ULP_BUCKETS))]
            ax.bar(
                xs,
                [max(c, 0) for c in s.histogram],
                width=0.8 / n,
                color=colour,
                hatch=hatch,
                edgecolor="white" if hatch else colour,
                label=f"{s.label} {names[s.label]}",
            )
        ax.set_yscale("symlog")
        ax.set_xticks(range(len(ULP_BUCKETS)), ULP_BUCKETS, rotation=45, fontsize=7)
        ax.set_xlabel("error against fp64 (ULP of the output dtype)", fontsize=7)
        ax.set_ylabel("elements (symlog)", fontsize=7)
        ax.set_title(f"{r.program.ref} {o.name}", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    devices = sorted({str(s.device or "?") for r in reports for s in r.sides})
    cpu = " (kiln on CPU: Triton interpreter)" if "cpu" in devices else ""
    fig.suptitle(
        f"elements per ULP error against fp64; device {', '.join(devices)}{cpu}; colour: compiler, "
        "hatch: another run of it"
    )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    write_bytes(path, png.getvalue())
    return path


@dataclass(frozen=True)
class ReportFile:
    """A report.json as `write_json` writes it: every comparison, and the check over all of them (if asked)."""

    schema: int
    reports: list[Comparison]
    check: Check | None


def read_json(path: Path) -> ReportFile:
    """A report.json read back; `NumericsError` (one line) when it is not one this harness reads."""
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise NumericsError(f"{path} is not a numerics report: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("reports"), list):
        raise NumericsError(f"{path} is not a numerics report: no list of reports")
    if d.get("schema") != SCHEMA:
        raise NumericsError(
            f"{path} has schema version {d.get('schema')}; this harness reads version {SCHEMA}"
        )
    try:
        check = d.get("check")
        return ReportFile(
            SCHEMA,
            [Comparison.from_dict(r) for r in d["reports"]],
            None if check is None else Check.from_dict(check),
        )
    except RecordError as e:
        raise NumericsError(f"{path}: {e}") from None
