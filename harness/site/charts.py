"""The site's charts: matplotlib figures written as SVG text, to be inlined in a page (so its DOM holds them).

Terms:
  trend    values of one measure over the runs of a graph, one line per series (a compiler arm, in its colour:
           harness/arms.py), an optional band (the IQR), and marks (harness/site/__init__.py) drawn as separate
           markers whose SVG group carries the mark's id, classes, data attributes and a <title>, wrapped in a
           link where the mark has one.
  x axis   the graph's runs in order (oldest left), ticks labelled by short commit and date.
Every chart has a title, axis labels with units, and a log y axis where the values span more than a decade.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness import arms
from harness.bench.core.records import Verdict

# one marker per verdict: a filled red triangle for a confirmed regression, hollow ones for the rest
MARK_STYLE: dict[str, dict[str, object]] = {
    Verdict.REGRESSED: {"marker": "^", "ms": 11, "mfc": "tab:red", "mec": "black", "mew": 1.0},
    Verdict.REJECTED: {"marker": "o", "ms": 11, "mfc": "none", "mec": "dimgray", "mew": 1.5},
    Verdict.SUSPECT: {"marker": "D", "ms": 9, "mfc": "none", "mec": "goldenrod", "mew": 1.5},
    Verdict.UNCONFIRMED: {"marker": "s", "ms": 9, "mfc": "none", "mec": "purple", "mew": 1.5},
    Verdict.IMPROVED: {"marker": "v", "ms": 11, "mfc": "tab:green", "mec": "black", "mew": 1.0},
}
MARK_LABEL: dict[str, str] = {
    Verdict.REGRESSED: "regressed (confirmed side by side)",
    Verdict.REJECTED: "suspect rejected side by side",
    Verdict.SUSPECT: "suspect (stored samples only)",
    Verdict.UNCONFIRMED: "suspect, unconfirmed",
    Verdict.IMPROVED: "improved (confirmed)",
}


@dataclass
class Series:
    """One line: `ys` at run positions `xs`; `lo`/`hi` the band (same length) or empty."""

    name: str
    xs: list[int]
    ys: list[float]
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    label: str = ""


@dataclass
class ChartMark:
    """A marked point: its verdict, position, the attributes of its SVG group and an optional link."""

    verdict: str
    x: int
    y: float
    gid: str
    attrs: Mapping[str, str]
    title: str
    url: str | None = None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def trend_svg(
    *,
    chart_id: str,
    title: str,
    ylabel: str,
    xlabels: Sequence[str],
    series: Sequence[Series],
    marks: Sequence[ChartMark] = (),
    log: bool = False,
    width: float = 9.0,
    height: float = 3.4,
) -> str:
    """The SVG text (no XML prolog) of one trend chart (module docstring)."""
    plt = _plt()
    import matplotlib as mpl

    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": chart_id, "path.simplify": True}):
        fig, ax = plt.subplots(figsize=(width, height))
        for s in series:
            colour = arms.colour(s.name)
            if s.lo and len(s.lo) == len(s.xs):
                ax.fill_between(
                    s.xs,
                    s.lo,
                    s.hi,
                    color=colour,
                    alpha=0.18,
                    linewidth=0,
                    gid=f"{chart_id}-band-{_slug(s.name)}",
                )
            ax.plot(
                s.xs,
                s.ys,
                color=colour,
                marker="o" if len(s.xs) <= 60 else None,
                ms=3,
                linewidth=1.4,
                label=s.label or s.name,
                gid=f"{chart_id}-line-{_slug(s.name)}",
            )
        shown: set[str] = set()
        for m in marks:
            style = MARK_STYLE.get(m.verdict, MARK_STYLE[Verdict.SUSPECT])
            (line,) = ax.plot(
                [m.x],
                [m.y],
                linestyle="none",
                zorder=5,
                gid=m.gid,
                label=MARK_LABEL.get(m.verdict, m.verdict) if m.verdict not in shown else None,
                **style,
            )
            shown.add(m.verdict)
            if m.url:
                line.set_url(m.url)
        n = len(xlabels)
        step = max(1, -(-n // 8))  # at most 8 labelled runs: a label is a commit and a date
        ticks = list(range(0, n, step))
        ax.set_xticks(ticks, [xlabels[i] for i in ticks], fontsize=7)
        ax.set_xlim(-0.5, max(n - 0.5, 0.5))
        if log:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xlabel("run (commit, date), oldest left", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return _decorate(buf.getvalue(), chart_id, title, marks)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)


def _decorate(svg: str, chart_id: str, title: str, marks: Sequence[ChartMark]) -> str:
    """Strip the prolog, name the chart (role, aria label, id) and give each mark's group its classes, data
    attributes and a <title>."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(
        r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.S
    )  # the RDF block: nothing to show
    svg = svg.replace(
        "<svg ",
        f'<svg id="{chart_id}" class="chart" role="img" '
        f'aria-label="{html.escape(title.replace(chr(10), " "))}" ',
        1,
    )
    for m in marks:
        attrs = " ".join(f'{k}="{html.escape(str(v))}"' for k, v in m.attrs.items())
        svg = svg.replace(
            f'<g id="{m.gid}">',
            f'<g id="{m.gid}" class="mark {m.verdict}" {attrs}><title>{html.escape(m.title)}</title>',
            1,
        )
    return svg
