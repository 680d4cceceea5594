"""The site's HTML pages, each a function of the data it shows (harness/site/data.py) to one HTML string.

Terms:
  page names  flat in the site folder: index.html, tests.html, models.html, numerics.html, runs.html,
              workload-<name>.html, run-<uid>.html, bisect-<workload>-<compiler>-<commit>.html.
  DOM hooks   what a test (or a reader's script) may query: charts are inline <svg class="chart"> inside
              <figure class="graph" data-workload data-hw-class data-profile data-metric>; marks are SVG groups
              `g.mark.<verdict>` with data-run, data-commit, data-workload, data-compiler, data-ratio; the tests
              page's rows are `tr.test-row.<state>` with data-node-id; a run page's body has data-run-uid.
Pages carry their CSS inline and no script: they open from disk with no network.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from harness import arms
from harness.bench.core.records import INTERPRETER_LABEL, RunInfo, Verdict
from harness.bench.core.stats import geomean
from harness.bench.reports.report import fmt_ns, interpreted, series_label, spans_decades, time_unit

from . import charts
from .data import BenchData, GraphKey, Mark, NumericsReport, Point, TestData, TestRun, hw_class

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em auto;max-width:1200px;padding:0 1em;color:#222}
nav a{margin-right:1em} h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em} h3{font-size:1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em} th,td{border:1px solid #ccc;padding:.2em .5em;
text-align:left;vertical-align:top} th{background:#f3f3f3} code,pre{font-size:.85em} pre{background:#f7f7f7;
padding:.6em;overflow:auto;max-height:30em} .regressed{color:#b00;font-weight:bold} .failing{color:#b00}
.flaky{color:#a60} .rejected{color:#666} .note{color:#555;font-size:.9em} figure{margin:.8em 0}
svg.chart{max-width:100%;height:auto} .swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
"""

NAV = [
    ("index.html", "Index"),
    ("runs.html", "Runs"),
    ("tests.html", "Tests"),
    ("models.html", "Models"),
    ("numerics.html", "Numerics"),
]


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def workload_page(workload: str) -> str:
    return f"workload-{slug(workload)}.html"


def run_page(uid: str) -> str:
    return f"run-{slug(uid)}.html"


def document(title: str, body: str, *, attrs: str = "") -> str:
    """A whole page: head with the inline CSS, the navigation, `body`."""
    nav = " ".join(f'<a href="{href}">{name}</a>' for href, name in NAV)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} - kiln</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
        f"<body{attrs}><nav>{nav}</nav><h1>{esc(title)}</h1>\n{body}\n</body></html>\n"
    )


def table(
    head: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    row_attrs: Iterable[str] | None = None,
    cls: str = "",
) -> str:
    """An HTML table; cells are HTML already (escape text with `esc`)."""
    attrs = iter(row_attrs) if row_attrs is not None else None
    out = [
        f"<table{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
    ]
    for r in rows:
        a = next(attrs) if attrs is not None else ""
        out.append(f"<tr{a}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _short(commit: str | None) -> str:
    return (commit or "-")[:8]


def _run_link(run: RunInfo) -> str:
    return f'<a href="{run_page(run.uid)}">run {esc(run.id)}</a>'


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"x{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# ---- workload pages ------------------------------------------------------------------------------------------


def _runs_of(series: dict[str, list[Point]]) -> list[tuple[int, str, str, str]]:
    """(run id, uid, commit, date) of every run of a graph, oldest first."""
    seen = {p.run_id: (p.run_id, p.uid, p.commit, p.created) for pts in series.values() for p in pts}
    return [seen[k] for k in sorted(seen)]


def graph_charts(key: GraphKey, series: dict[str, list[Point]], marks: Sequence[Mark], device: str) -> str:
    """The latency chart (and the bandwidth chart where a ceiling is stored) of one graph, as <figure>s."""
    workload, cls, profile = key
    runs = _runs_of(series)
    pos = {r[0]: i for i, r in enumerate(runs)}
    xlabels = [f"{_short(c)[:7]}\n{d[:10]}" for _, _, c, d in runs]
    meds = [p.median_ns for pts in series.values() for p in pts if p.median_ns]
    div, unit = time_unit(meds)
    log = spans_decades(meds)
    cid = f"c-{slug(workload)}-{slug(cls)}-{slug(profile)}"
    lat = []
    for comp in _ordered(series):
        pts = [p for p in series[comp] if p.median_ns]
        lat.append(
            charts.Series(
                comp,
                [pos[p.run_id] for p in pts],
                [(p.median_ns or 0.0) / div for p in pts],
                [(p.q1_ns or p.median_ns or 0.0) / div for p in pts],
                [(p.q3_ns or p.median_ns or 0.0) / div for p in pts],
                series_label(comp, device),
            )
        )
    by_point = {(p.run_id, comp): p for comp, pts in series.items() for p in pts}
    cmarks = []
    for m in marks:
        p = by_point.get((m.run_id, m.compiler))
        if p is None or not p.median_ns or m.run_id not in pos:
            continue
        cmarks.append(
            charts.ChartMark(
                m.verdict,
                pos[m.run_id],
                p.median_ns / div,
                f"{cid}-mark-{m.verdict}-{slug(m.compiler)}-r{m.run_id}",
                {
                    "data-verdict": m.verdict,
                    "data-confirmed": str(m.confirmed).lower(),
                    "data-run": str(m.run_id),
                    "data-run-uid": m.uid,
                    "data-commit": m.commit,
                    "data-workload": m.workload,
                    "data-compiler": m.compiler,
                    "data-ratio": "" if m.ratio is None else f"{m.ratio:.4f}",
                    "data-bisection": m.bisection or "",
                },
                f"{m.verdict}: {m.workload} [{m.compiler}] run {m.run_id} ({_short(m.commit)}) {_ratio(m.ratio)}"
                + (f"; bisection: {m.bisection}" if m.bisection else ""),
                m.bisection or run_page(m.uid),
            )
        )
    where = f"{cls}, profile {profile}, device {device}"
    title = f"{workload}: median latency per run\n{where}"
    ylabel = f"median latency ({unit}{', log scale' if log else ''}); band: IQR"
    figs = [
        _figure(
            key,
            "latency",
            charts.trend_svg(
                chart_id=f"{cid}-latency",
                title=title,
                ylabel=ylabel,
                xlabels=xlabels,
                series=lat,
                marks=cmarks,
                log=log,
            ),
        )
    ]
    bw = []
    for comp in _ordered(series):
        pts = [p for p in series[comp] if p.frac_ceiling]
        if pts:
            bw.append(
                charts.Series(
                    comp,
                    [pos[p.run_id] for p in pts],
                    [100 * (p.frac_ceiling or 0.0) for p in pts],
                    label=series_label(comp, device),
                )
            )
    if bw:
        figs.append(
            _figure(
                key,
                "bandwidth",
                charts.trend_svg(
                    chart_id=f"{cid}-bandwidth",
                    title=f"{workload}: bandwidth per run, % of the copy ceiling\n{where}",
                    ylabel="achieved bandwidth (% of copy ceiling)",
                    xlabels=xlabels,
                    series=bw,
                    height=2.8,
                ),
            )
        )
    return "\n".join(figs)


def _ordered(series: dict[str, Any]) -> list[str]:
    known = list(arms.ARMS)
    return sorted(series, key=lambda c: (known.index(c) if c in known else len(known), c))


def _figure(key: GraphKey, metric: str, svg: str) -> str:
    w, cls, profile = key
    return (
        f'<figure class="graph" data-workload="{esc(w)}" data-hw-class="{esc(cls)}" data-profile="{esc(profile)}"'
        f' data-metric="{metric}">{svg}</figure>'
    )


def marks_table(marks: Sequence[Mark], data: BenchData) -> str:
    if not marks:
        return '<p class="note">No flagged step: every stored verdict was unchanged or new.</p>'
    rows, attrs = [], []
    for m in sorted(marks, key=lambda m: (-m.run_id, m.compiler)):
        run = data.run(m.run_id)
        rows.append(
            [
                f'<span class="{esc(m.verdict)}">{esc(m.verdict)}</span>'
                + (" (confirmed side by side)" if m.confirmed else ""),
                esc(m.compiler),
                _run_link(run),
                f"<code>{esc(_short(m.commit))}</code>",
                esc(_ratio(m.ratio)),
                "-" if m.p_value is None else f"{m.p_value:.2g}",
                esc(m.baseline or "-"),
                f'<a href="{esc(m.bisection)}">bisection</a>' if m.bisection else "-",
            ]
        )
        attrs.append(
            f' class="mark-row {esc(m.verdict)}" data-run="{m.run_id}" data-compiler="{esc(m.compiler)}"'
        )
    return table(
        ["verdict", "compiler", "run", "commit", "ratio", "p", "baseline", "bisection"], rows, row_attrs=attrs
    )


def render_workload(data: BenchData, workload: str) -> str:
    parts = [
        f'<p class="note">Median latency per compiler over the complete runs of each hardware class (one graph '
        f"each), with the IQR of its samples as a band; marks: the verdicts each run stored ({legend()}). "
        f"Store: <code>{esc(data.source)}</code>.</p>"
    ]
    for key in data.graphs_of(workload):
        _, cls, profile = key
        series = data.graphs[key]
        marks = data.marks.get(key, [])
        parts.append(f"<h2>{esc(cls)} &middot; profile {esc(profile)}</h2>")
        if interpreted(data.devices[key], list(series)):
            parts.append(f'<p class="note">kiln on {esc(data.devices[key])}: {esc(INTERPRETER_LABEL)}</p>')
        parts.append(graph_charts(key, series, marks, data.devices[key]))
        parts.append("<h3>Flagged steps</h3>" + marks_table(marks, data))
        parts.append("<h3>Last runs</h3>" + _last_runs(series, data))
    return document(f"Workload {workload}", "\n".join(parts), attrs=f' data-workload="{esc(workload)}"')


def legend() -> str:
    return "; ".join(f"{charts.MARK_LABEL[v]}" for v in charts.MARK_STYLE)


def _last_runs(series: dict[str, list[Point]], data: BenchData, n: int = 10) -> str:
    comps = _ordered(series)
    runs = _runs_of(series)[-n:][::-1]
    by = {(p.run_id, c): p for c, pts in series.items() for p in pts}
    rows = []
    for rid, _uid, commit, date in runs:
        cells = []
        for c in comps:
            p = by.get((rid, c))
            if p is None:
                cells.append("")
            elif p.median_ns is None:
                cells.append(esc(p.status))
            else:
                iqr = f" [{fmt_ns(p.q1_ns)}..{fmt_ns(p.q3_ns)}]" if p.q1_ns is not None else ""
                cells.append(esc(fmt_ns(p.median_ns) + iqr))
        rows.append([_run_link(data.run(rid)), f"<code>{esc(_short(commit))}</code>", esc(date[:19]), *cells])
    head = ["run", "commit", "date"] + [
        f'<span class="swatch" style="background:{_css_colour(c)}"></span>{esc(c)}' for c in comps
    ]
    return table(head, rows)


def _css_colour(name: str) -> str:
    import matplotlib.colors as mc

    return mc.to_hex(arms.colour(name))


# ---- index, runs ---------------------------------------------------------------------------------------------


def _verdict_counts(data: BenchData, run: RunInfo) -> str:
    vs = data.verdicts.get(run.rid) or []
    if not vs:
        return "no verdicts stored"
    counts: dict[str, int] = {}
    for v in vs:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    return ", ".join(f'<span class="{esc(k)}">{n} {esc(k)}</span>' for k, n in sorted(counts.items()))


def render_index(data: BenchData | None, tests: TestData | None, notes: Sequence[str]) -> str:
    parts = [f'<p class="note">{"<br>".join(esc(n) for n in notes)}</p>'] if notes else []
    if data is not None and data.runs:
        latest: dict[tuple[str, str, str], RunInfo] = {}
        for r in data.runs:
            latest[(r.device, hw_class(r), r.profile)] = r
        rows = []
        for (dev, cls, prof), r in sorted(latest.items()):
            flagged = [
                v for v in data.verdicts.get(r.rid) or [] if v.verdict not in (Verdict.UNCHANGED, Verdict.NEW)
            ]
            links = ", ".join(
                f'<a href="{workload_page(v.workload)}" class="{esc(v.verdict)}">'
                f"{esc(v.workload)} [{esc(v.compiler)}] {esc(v.verdict)} {esc(_ratio(v.ratio))}</a>"
                for v in flagged[:12]
            )
            rows.append(
                [
                    esc(dev),
                    esc(cls),
                    esc(prof),
                    _run_link(r),
                    f"<code>{esc(_short(r.git_commit))}</code>",
                    esc((r.created_at or "")[:19]),
                    _verdict_counts(data, r),
                    links or "-",
                ]
            )
        parts.append(
            "<h2>Latest bench run per backend and hardware class</h2>"
            + table(
                ["backend", "hardware class", "profile", "run", "commit", "date", "verdicts", "flagged"], rows
            )
        )
        rows = []
        for w in data.workloads():
            keys = data.graphs_of(w)
            marks = [m for k in keys for m in data.marks.get(k, [])]
            reg = sum(m.verdict == Verdict.REGRESSED for m in marks)
            rej = sum(m.verdict == Verdict.REJECTED for m in marks)
            n = max(len(_runs_of(data.graphs[k])) for k in keys)
            rows.append(
                [
                    f'<a href="{workload_page(w)}">{esc(w)}</a>',
                    esc(", ".join(sorted({k[1] for k in keys}))),
                    str(n),
                    f'<span class="{Verdict.REGRESSED}">{reg}</span>' if reg else "0",
                    str(rej),
                ]
            )
        parts.append(
            f"<h2>Workloads ({len(rows)})</h2>"
            + table(
                ["workload", "hardware classes", "runs", "confirmed regressions", "suspects rejected"], rows
            )
        )
    elif data is not None:
        parts.append("<p>The bench store holds no complete run.</p>")
    if tests is not None:
        latest_t: dict[tuple[str, str], TestRun] = {}
        for t in reversed(tests.runs):
            latest_t[(t.backend, t.hw_class)] = t
        rows = [
            [
                esc(b),
                esc(c or "-"),
                esc(t.source),
                esc(t.date[:19]),
                f"<code>{esc(_short(t.commit))}</code>",
                str(t.tests),
                f'<span class="failing">{t.failed}</span>' if t.failed else "0",
            ]
            for (b, c), t in sorted(latest_t.items())
        ]
        failing = sum(x.state == "failing" for x in tests.rows)
        flaky = sum(x.state == "flaky" for x in tests.rows)
        parts.append(
            f"<h2>Latest test run per backend and hardware class</h2>"
            f'<p><a href="tests.html">{failing} failing and {flaky} flaky test(s)</a> over the last '
            f"{len(tests.runs)} recorded runs.</p>"
            + table(["backend", "hardware class", "source", "date", "commit", "tests", "failed"], rows)
        )
    return document("kiln history", "\n".join(parts))


def render_runs(data: BenchData) -> str:
    rows = [
        [
            _run_link(r),
            esc(r.device),
            esc(hw_class(r)),
            esc(r.profile),
            f"<code>{esc(_short(r.git_commit))}</code>",
            esc(r.git_ref or "-"),
            esc((r.created_at or "")[:19]),
            _verdict_counts(data, r),
        ]
        for r in reversed(data.runs)
    ]
    return document(
        f"Bench runs ({len(rows)})",
        table(["run", "device", "hardware class", "profile", "commit", "ref", "date", "verdicts"], rows),
    )


def render_run(data: BenchData, run: RunInfo, export_name: str) -> str:
    fields = [(k, v) for k, v in run.as_dict().items() if k not in ("env", "config")]
    parts = [table(["field", "value"], ([esc(k), f"<code>{esc(v)}</code>"] for k, v in fields))]
    links = [f'<a href="{export_name}">this run\'s record and results (JSON)</a>']
    gh = _actions_url(run.env)
    if gh:
        links.append(f'<a href="{esc(gh)}">the CI run and its artifacts</a>')
    if data.commit_url and run.git_commit:
        url = data.commit_url.replace("{commit}", run.git_commit)
        links.append(
            f'<a href="{esc(url)}">commit {esc(_short(run.git_commit))}: its CI runs and their artifacts</a>'
        )
    parts.append("<h2>Artifacts</h2><ul>" + "".join(f"<li>{x}</li>" for x in links) + "</ul>")
    vs = data.verdicts.get(run.rid) or []
    if vs:
        parts.append(
            "<h2>Verdicts</h2>"
            + table(
                ["workload", "compiler", "verdict", "ratio", "p", "confirmed"],
                (
                    [
                        f'<a href="{workload_page(v.workload)}">{esc(v.workload)}</a>',
                        esc(v.compiler),
                        f'<span class="{esc(v.verdict)}">{esc(v.verdict)}</span>',
                        esc(_ratio(v.ratio)),
                        "-" if v.p is None else f"{v.p:.2g}",
                        esc(v.confirmed),
                    ]
                    for v in vs
                ),
            )
        )
    res = data.results.get(run.rid) or []
    parts.append(
        "<h2>Results</h2>"
        + table(
            ["workload", "compiler", "status", "median", "IQR", "% of copy ceiling", "compile s"],
            (
                [
                    f'<a href="{workload_page(w)}">{esc(w)}</a>',
                    esc(c),
                    esc(p.status),
                    esc(fmt_ns(p.median_ns)),
                    esc(f"{fmt_ns(p.q1_ns)}..{fmt_ns(p.q3_ns)}" if p.q1_ns is not None else "-"),
                    esc(_pct(p.frac_ceiling)),
                    "-" if p.compile_s is None else f"{p.compile_s:.2f}",
                ]
                for w, c, p in res
            ),
        )
    )
    parts.append(
        "<h2>Environment record</h2><pre>" + esc(json.dumps(run.env, indent=2, sort_keys=True)) + "</pre>"
    )
    if run.config:
        parts.append(
            "<h2>Configuration</h2><pre>" + esc(json.dumps(run.config, indent=2, sort_keys=True)) + "</pre>"
        )
    return document(
        f"Bench run {run.id} ({_short(run.git_commit)})",
        "\n".join(parts),
        attrs=f' data-run-uid="{esc(run.uid)}"',
    )


def _actions_url(env: dict[str, Any]) -> str | None:
    """The GitHub Actions run page of a run whose environment record names it."""
    flat: dict[str, Any] = {}

    def walk(d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                if isinstance(v, (dict, list)):
                    walk(v)
                else:
                    flat.setdefault(str(k), v)
        elif isinstance(d, list):
            for v in d:
                walk(v)

    walk(env)
    server, repo, rid = (
        flat.get("GITHUB_SERVER_URL"),
        flat.get("GITHUB_REPOSITORY"),
        flat.get("GITHUB_RUN_ID"),
    )
    if server and repo and rid:
        return f"{server}/{repo}/actions/runs/{rid}"
    return None


def run_export(data: BenchData, run: RunInfo) -> str:
    """The run's record, verdicts and result summaries as JSON (the run page's artifact; samples stay in the store)."""
    res = [
        {
            "workload": w,
            "compiler": c,
            "status": p.status,
            "median_ns": p.median_ns,
            "q1_ns": p.q1_ns,
            "q3_ns": p.q3_ns,
            "frac_ceiling": p.frac_ceiling,
            "compile_s": p.compile_s,
        }
        for w, c, p in data.results.get(run.rid) or []
    ]
    return (
        json.dumps(
            {
                "run": run.as_dict(),
                "verdicts": [v.as_dict() for v in data.verdicts.get(run.rid) or []],
                "results": res,
            },
            sort_keys=True,
            default=str,
        )
        + "\n"
    )


# ---- tests, models, numerics, bisections --------------------------------------------------------------------


def render_tests(tests: TestData | None) -> str:
    if tests is None:
        return document(
            "Tests",
            "<p>No test history was found (record runs: <code>python -m harness history "
            "record RUN_DIR</code>).</p>",
        )
    rows, attrs = [], []
    for x in tests.rows:
        rows.append(
            [
                f"<code>{esc(x.node_id)}</code>",
                f'<span class="{x.state}">{x.state}</span>',
                f"{x.failed} of {x.ran}",
                str(x.flaky),
                f"{esc(x.first_seen.date[:19])} <code>{esc(_short(x.first_seen.commit))}</code>",
                f"{esc(x.last_seen.date[:19])} <code>{esc(_short(x.last_seen.commit))}</code>",
                esc(", ".join(x.backends)),
                esc(x.quarantine) or "no",
                f"<code>{esc(x.repro)}</code>",
            ]
        )
        attrs.append(
            f' class="test-row {x.state}" data-node-id="{esc(x.node_id)}" data-state="{x.state}"'
            f' data-failed="{x.failed}" data-ran="{x.ran}" data-quarantined="{str(bool(x.quarantine)).lower()}"'
        )
    body = (
        f'<p class="note">Tests that failed in the last {len(tests.runs)} recorded runs of '
        f"<code>{esc(tests.source)}</code> (window: {tests.last}). <b>failing</b>: it failed, and no rerun passed, "
        "in the latest run that ran it; <b>flaky</b>: it failed otherwise (a rerun alone passed, some "
        "repetitions passed, or a later run passed).</p>"
    )
    body += (
        table(
            [
                "test",
                "state",
                "failed (runs)",
                "flaky in",
                "first seen",
                "last seen",
                "backends",
                "quarantined",
                "repro",
            ],
            rows,
            row_attrs=attrs,
            cls="tests",
        )
        if rows
        else "<p>No test failed in the window.</p>"
    )
    runs = [
        [
            esc(r.id),
            esc(r.date[:19]),
            f"<code>{esc(_short(r.commit))}</code>",
            esc(r.backend),
            esc(r.hw_class or "-"),
            esc(r.source),
            str(r.tests),
            str(r.failed),
        ]
        for r in tests.runs
    ]
    body += "<h2>Recorded runs</h2>" + table(
        ["id", "date", "commit", "backend", "hardware class", "source", "tests", "failed"], runs
    )
    return document("Failing and flaky tests", body)


def render_models(data: BenchData | None) -> str:
    if data is None or not data.runs:
        return document("Model tier and compile times", "<p>No bench runs.</p>")
    parts = []
    model_keys = sorted(k for k in data.graphs if k[0].startswith("model."))
    groups = sorted({(k[1], k[2]) for k in data.graphs})
    for cls, profile in groups:
        keys = [k for k in data.graphs if k[1:] == (cls, profile)]
        runs = sorted(
            {
                p.run_id: (p.run_id, p.commit, p.created)
                for k in keys
                for pts in data.graphs[k].values()
                for p in pts
            }.values()
        )
        pos = {r[0]: i for i, r in enumerate(runs)}
        xlabels = [f"{_short(c)[:7]}\n{d[:10]}" for _, c, d in runs]
        cid = f"m-{slug(cls)}-{slug(profile)}"
        figs = []
        comp_s: dict[str, dict[int, list[float]]] = {}
        speed: dict[str, dict[int, list[float]]] = {}
        for k in keys:
            eager = {p.run_id: p.median_ns for p in data.graphs[k].get("eager", []) if p.median_ns}
            for comp, pts in data.graphs[k].items():
                for p in pts:
                    if p.compile_s:
                        comp_s.setdefault(comp, {}).setdefault(p.run_id, []).append(p.compile_s)
                    if comp != "eager" and p.median_ns and eager.get(p.run_id) and k[0].startswith("model."):
                        speed.setdefault(comp, {}).setdefault(p.run_id, []).append(
                            eager[p.run_id] / p.median_ns
                        )
        where = f"{cls}, profile {profile}"
        for what, per_run, title, unit in (
            (
                "speedup",
                speed,
                "model tier: geomean step speedup over eager per run",
                "speedup over eager (x, geomean of cases",
            ),
            ("compile", comp_s, "compile time per run (geomean over workloads)", "compile time (s"),
        ):
            if per_run:
                figs.append(
                    _geomean_trend(
                        per_run,
                        pos,
                        xlabels,
                        (("model tier" if what == "speedup" else what), cls, profile),
                        what,
                        f"{cid}-{what}",
                        f"{title}\n{where}",
                        unit,
                    )
                )
        if figs:
            parts.append(f"<h2>{esc(cls)} &middot; profile {esc(profile)}</h2>" + "\n".join(figs))
    if model_keys:
        parts.append(
            "<h2>Model cases</h2><ul>"
            + "".join(
                f'<li><a href="{workload_page(w)}">{esc(w)}</a></li>'
                for w in sorted({k[0] for k in model_keys})
            )
            + "</ul>"
        )
    if not parts:
        parts.append("<p>No model-tier run and no compile time stored.</p>")
    return document("Model tier and compile times", "\n".join(parts))


def render_numerics(reports: Sequence[NumericsReport]) -> str:
    if not reports:
        return document(
            "Numerics triage",
            "<p>No numerics triage report was given (<code>--numerics DIR</code>: "
            "folders of <code>numerics compare --out DIR</code>).</p>",
        )
    parts = []
    for r in reports:
        parts.append(
            f"<h2><code>{esc(r.folder)}</code></h2><p>Check: {esc(r.check)}</p>"
            + table(["program", "output", "pair", "verdict"], ([esc(x) for x in row] for row in r.rows))
        )
    return document("Numerics triage", "\n".join(parts))


def render_bisection(report: dict[str, Any], name: str, json_name: str) -> str:
    fb = report.get("first_bad") or {}
    rows = [
        ["workload", esc(report.get("workload"))],
        ["compiler", esc(report.get("compiler"))],
        ["outcome", esc(report.get("outcome"))],
        ["message", esc(report.get("message"))],
        ["good", f"<code>{esc((report.get('good') or {}).get('sha'))}</code>"],
        ["bad", f"<code>{esc((report.get('bad') or {}).get('sha'))}</code>"],
        ["first bad", f"<code>{esc(fb.get('sha'))}</code> {esc(fb.get('subject'))}" if fb else "-"],
    ]
    steps = report.get("steps") or []
    body = table(["", ""], rows) + f'<p><a href="{esc(json_name)}">the bisection\'s JSON</a></p>'
    if steps:
        body += "<h2>Steps</h2>" + table(
            ["#", "commit", "role", "median", "ratio", "p", "verdict"],
            (
                [
                    esc(s.get("n")),
                    f"<code>{esc(str(s.get('sha'))[:10])}</code>",
                    esc(s.get("role")),
                    esc(fmt_ns(s.get("median_ns"))),
                    esc(_ratio(s.get("ratio"))),
                    esc(s.get("p")),
                    esc(s.get("verdict")),
                ]
                for s in steps
            ),
        )
    return document(f"Bisection {name}", body)


def _geomean_trend(
    per_run: dict[str, dict[int, list[float]]],
    pos: dict[int, int],
    xlabels: list[str],
    key: tuple[str, str, str],
    what: str,
    chart_id: str,
    title: str,
    unit: str,
) -> str:
    """One trend figure: per compiler, the geomean of its values in each run (`per_run[compiler][run id]`),
    log scale where the values span decades (`unit` is the y label up to its closing parenthesis)."""
    ser = [
        charts.Series(
            c, [pos[r] for r in sorted(per_run[c])], [geomean(per_run[c][r]) or 0 for r in sorted(per_run[c])]
        )
        for c in _ordered(per_run)
    ]
    vals = [y for s in ser for y in s.ys]
    log = spans_decades(vals)
    return _figure(
        key,
        what,
        charts.trend_svg(
            chart_id=chart_id,
            title=title,
            ylabel=f"{unit}{', log scale' if log else ''})",
            xlabels=xlabels,
            series=ser,
            log=log,
        ),
    )
