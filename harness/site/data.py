"""What the site shows, read once from the stores through their own readers.

Terms:
  bench data    the complete runs of the bench store (harness/bench/stores/store.py `Store.runs`, `results_of`,
                `verdicts_of`), folded into `Point`s per graph (workload, hardware class, profile) and compiler.
  test data     the last N recorded folders of the test history (harness/suites/history.py), folded into one
                `TestRow` per test that failed in the window: failing (it failed, and no rerun passed, in the latest
                folder that ran it) or flaky (it failed in the window otherwise: a rerun passed, some repetitions of
                a flakes folder passed, or a later run passed).
  bisection     a `bench bisect` JSON (`bisect-W-C.json` beside a bench job's run.json, harness/bench/job.py) whose
                BAD commit is the commit of a run that confirmed a regression of W under C; found in `--bisections`
                folders and linked from that mark.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.bench.core.records import Comparison, RunInfo, Verdict
from harness.numerics import report as numerics_report
from harness.numerics.exc import NumericsError

MARKED = (Verdict.REGRESSED, Verdict.REJECTED, Verdict.SUSPECT, Verdict.UNCONFIRMED, Verdict.IMPROVED)


def hw_class(run: RunInfo) -> str:
    """A run's hardware class: its recorded class, else its device name, else its device."""
    return run.hw_class or run.device_name or run.device or "?"


class Point(NamedTuple):
    """One result of a graph: a compiler's median in one run, its IQR and what else the run stored."""

    run_id: int
    uid: str
    commit: str
    created: str
    status: str
    median_ns: float | None = None
    q1_ns: float | None = None
    q3_ns: float | None = None
    frac_ceiling: float | None = None  # achieved GB/s over the copy ceiling (0..1), where both are stored
    compile_s: float | None = None


class Mark(NamedTuple):
    """A stored verdict other than unchanged/new on a graph's point (see the package docstring)."""

    run_id: int
    uid: str
    commit: str
    workload: str
    compiler: str
    verdict: str
    confirmed: bool | None
    ratio: float | None
    p_value: float | None
    baseline: str | None
    bisection: str | None = None  # the site-relative link of its bisection, when one was found


GraphKey = tuple[str, str, str]  # (workload, hardware class, profile)


@dataclass
class BenchData:
    """The bench store as the site shows it (module docstring)."""

    source: str
    runs: list[RunInfo] = field(default_factory=list)  # complete runs, oldest first
    graphs: dict[GraphKey, dict[str, list[Point]]] = field(default_factory=dict)
    devices: dict[GraphKey, str] = field(default_factory=dict)  # the device of the graph's newest run
    verdicts: dict[int, list[Comparison]] = field(default_factory=dict)
    results: dict[int, list[tuple[str, str, Point]]] = field(
        default_factory=dict
    )  # run -> (workload, compiler, pt)
    marks: dict[GraphKey, list[Mark]] = field(default_factory=dict)
    bisections: dict[tuple[str, str, str], Path] = field(default_factory=dict)  # (workload, compiler, commit)
    commit_url: str = (
        ""  # `--commit-url`: a run's commit page, `{commit}` replaced (its CI runs, their artifacts)
    )

    def workloads(self) -> list[str]:
        return sorted({k[0] for k in self.graphs})

    def graphs_of(self, workload: str) -> list[GraphKey]:
        return sorted(k for k in self.graphs if k[0] == workload)

    def run(self, run_id: int) -> RunInfo:
        return self._by_id[run_id]

    def run_by_uid(self, uid: str) -> RunInfo:
        return self._by_uid[uid]

    def index(self) -> None:
        self._by_id = {r.id: r for r in self.runs}
        self._by_uid = {r.uid: r for r in self.runs}


def quartiles(sample_lists: list[list[float]]) -> list[tuple[float, float, float] | None]:
    """(median, q1, q3) of each list as `Stats.of` gives them (Tukey's fences first, then linear quantiles of the
    kept samples), computed for all lists of one length at once with numpy; None for an empty list."""
    import numpy as np

    out: list[tuple[float, float, float] | None] = [None] * len(sample_lists)
    by_n: dict[int, list[int]] = {}
    for i, xs in enumerate(sample_lists):
        if xs:
            by_n.setdefault(len(xs), []).append(i)
    for n, idx in by_n.items():
        a = np.sort(np.array([sample_lists[i] for i in idx], dtype=float), axis=1)
        if n >= 4:
            q1, q3 = _quantile(a, np.full(len(idx), n), 0.25), _quantile(a, np.full(len(idx), n), 0.75)
            lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
            a = np.sort(np.where((a >= lo[:, None]) & (a <= hi[:, None]), a, np.nan), axis=1)  # NaN sort last
        kept = np.sum(~np.isnan(a), axis=1)
        med, q1, q3 = (_quantile(a, kept, q) for q in (0.5, 0.25, 0.75))
        for j, i in enumerate(idx):
            out[i] = (float(med[j]), float(q1[j]), float(q3[j]))
    return out


def _quantile(a: Any, kept: Any, q: float) -> Any:
    """harness.bench.core.stats.quantile of each row's first `kept` (sorted) values."""
    import numpy as np

    pos = (kept - 1) * q
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, kept - 1)
    vlo = np.take_along_axis(a, lo[:, None], 1)[:, 0]
    vhi = np.take_along_axis(a, hi[:, None], 1)[:, 0]
    return vlo + (vhi - vlo) * (pos - lo)


def read_bench(store: Any, *, bisection_dirs: Iterable[Path] = ()) -> BenchData:
    """Every complete run of `store` (an open harness.bench.stores.store.Store) with its results and verdicts."""
    data = BenchData(str(store.path))
    data.runs = list(reversed(store.runs(complete_only=True)))
    data.index()
    ids = [int(r.id) for r in data.runs if r.id is not None]
    results = store.results_of(ids, phase=None)
    stored = store.verdicts_of(ids)
    data.bisections = find_bisections(bisection_dirs)
    chosen: list[tuple[RunInfo, Any]] = []
    for run in data.runs:
        by_key: dict[tuple[str, str], Any] = {}
        for res in results[run.rid]:
            # the main phase's samples; a compile-only result (phase `compile`) where the run has no main one
            if res.phase == "main" or (res.workload, res.compiler) not in by_key:
                by_key[(res.workload, res.compiler)] = res
        chosen += [(run, res) for res in by_key.values()]
    stats = quartiles([res.samples for _, res in chosen])
    for (run, res), st in zip(chosen, stats):
        frac = None
        if st is not None and res.bytes and res.ceiling_gbps and st[0] > 0:
            frac = res.bytes / st[0] / res.ceiling_gbps
        median, q1, q3 = st if st is not None else (None, None, None)
        pt = Point(
            run.rid,
            run.uid,
            run.git_commit or "",
            run.created_at or "",
            res.status,
            median,
            q1,
            q3,
            frac,
            res.compile_s,
        )
        key = (res.workload, hw_class(run), run.profile)
        data.graphs.setdefault(key, {}).setdefault(res.compiler, []).append(pt)
        data.results.setdefault(run.rid, []).append((res.workload, res.compiler, pt))
        data.devices[key] = run.device
    for run in data.runs:
        cls = hw_class(run)
        data.verdicts[run.rid] = list(stored.get(run.rid) or [])
        for v in data.verdicts[run.rid]:
            if v.verdict not in MARKED:
                continue
            key = (v.workload, cls, run.profile)
            commit = run.git_commit or ""
            found = data.bisections.get((v.workload, v.compiler, commit)) if commit else None
            data.marks.setdefault(key, []).append(
                Mark(
                    run.rid,
                    run.uid,
                    commit,
                    v.workload,
                    v.compiler,
                    v.verdict,
                    v.confirmed,
                    v.ratio,
                    v.p,
                    v.baseline,
                    bisection_page(found, commit)
                    if found is not None and v.verdict == Verdict.REGRESSED
                    else None,
                )
            )
    return data


def bisection_page(path: Path, commit: str) -> str:
    """The site's page of the bisection JSON at `path` for the run of `commit`."""
    return f"{path.stem}-{commit[:10]}.html"


def find_bisections(folders: Iterable[Path]) -> dict[tuple[str, str, str], Path]:
    """(workload, compiler, BAD commit) -> the `bench bisect` JSON found in `folders` (recursively)."""
    found: dict[tuple[str, str, str], Path] = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("bisect-*.json")):
            try:
                d = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(d, dict):
                continue
            bad = d.get("bad") or {}
            commit = bad.get("sha") or bad.get("commit") if isinstance(bad, dict) else bad
            workload, compiler = d.get("workload"), d.get("compiler")
            if isinstance(commit, str) and workload and compiler:
                found[(str(workload), str(compiler), commit)] = path
    return found


def spread(values: list[float]) -> bool:
    """Whether positive `values` span more than a decade (a log axis reads them)."""
    pos = [v for v in values if v and v > 0 and math.isfinite(v)]
    return bool(pos) and max(pos) / min(pos) > 10


# ---- the test history --------------------------------------------------------------------------------------


@dataclass
class TestRun:
    """One recorded folder of the test history."""

    __test__ = False

    id: int
    date: str
    commit: str
    backend: str
    source: str
    folder: str
    hw_class: str
    runner: str
    failed: int = 0
    tests: int = 0


@dataclass
class TestRow:
    """One test that failed in the window (module docstring)."""

    __test__ = False

    node_id: str
    state: str  # failing | flaky
    failed: int  # folders of the window in which it failed or errored
    ran: int  # folders of the window that ran it
    flaky: int  # of those, folders where a rerun passed (or some repetitions passed)
    first_seen: TestRun
    last_seen: TestRun
    backends: list[str]
    quarantine: str = ""  # the quarantine entry's reason, when one covers it
    repro: str = ""


@dataclass
class TestData:
    __test__ = False

    source: str
    last: int
    runs: list[TestRun] = field(default_factory=list)  # newest first
    rows: list[TestRow] = field(default_factory=list)


def read_tests(where: Any, last: int, quarantine: Any = None) -> TestData:
    """The last `last` recorded folders of the test history at `where` (a file or a server URL), read-only."""
    from sqlalchemy import func, inspect, select

    from harness.store import tables as t
    from harness.suites.history import connect

    out = TestData(str(where), last)
    r, o = t.history_runs.c, t.history_outcomes.c
    with connect(where, readonly=True) as db:
        cols = {c["name"] for c in inspect(db).get_columns("history_runs")}
        extra = [r[c] for c in ("hw_class", "runner") if c in cols]
        rows = (
            db.execute(
                select(r.id, r.date, r.git_commit, r.backend, r.source, r.folder, *extra)
                .order_by(r.date.desc(), r.id.desc())
                .limit(last)
            )
            .mappings()
            .all()
        )
        runs = {
            int(x["id"]): TestRun(
                int(x["id"]),
                x["date"] or "",
                x["git_commit"] or "",
                x["backend"],
                x["source"],
                x["folder"],
                x.get("hw_class") or "",
                x.get("runner") or "",
            )
            for x in rows
        }
        out.runs = list(runs.values())
        if not runs:
            return out
        ids = list(runs)
        bad = o.outcome.in_(("failed", "error"))
        for rid, total, nbad in db.execute(
            select(o.run_id, func.count(), func.count().filter(bad))
            .where(o.run_id.in_(ids))
            .group_by(o.run_id)
        ):
            runs[int(rid)].tests, runs[int(rid)].failed = int(total), int(nbad)
        per: dict[str, dict[int, list[str]]] = {}
        failing_nodes = {n for (n,) in db.execute(select(o.node_id).where(o.run_id.in_(ids), bad).distinct())}
        if failing_nodes:
            for node, rid, outcome in db.execute(
                select(o.node_id, o.run_id, o.outcome).where(o.run_id.in_(ids), o.node_id.in_(failing_nodes))
            ):
                per.setdefault(node, {}).setdefault(int(rid), []).append(outcome)
        reruns: dict[tuple[str, int], str] = {}
        if inspect(db).has_table("history_retries") and failing_nodes:
            x = t.history_retries.c
            for node, rid, status in db.execute(
                select(x.node_id, x.run_id, x.status).where(x.run_id.in_(ids), x.node_id.in_(failing_nodes))
            ):
                reruns[(node, int(rid))] = status
    order = {rid: i for i, rid in enumerate(ids)}  # 0: newest
    for node, by_run in per.items():
        failed_in = sorted(
            (rid for rid, outs in by_run.items() if set(outs) & {"failed", "error"}), key=order.__getitem__
        )
        if not failed_in:
            continue
        flaky_in = [
            rid
            for rid in failed_in
            if reruns.get((node, rid)) == "flaky"
            or (runs[rid].source == "flakes" and set(by_run[rid]) & {"passed", "xfailed"})
        ]
        latest = min(by_run, key=order.__getitem__)
        latest_failed = latest in failed_in and latest not in flaky_in
        state = "failing" if latest_failed else "flaky"
        row = TestRow(
            node,
            state,
            len(failed_in),
            len(by_run),
            len(flaky_in),
            runs[failed_in[-1]],
            runs[failed_in[0]],
            sorted({runs[rid].backend for rid in failed_in}),
        )
        if quarantine is not None:
            entry = next((e for b in row.backends if (e := quarantine.match(node, b)) is not None), None)
            row.quarantine = entry.reason if entry is not None else ""
        row.repro = repro_line(node, runs[failed_in[0]])
        out.rows.append(row)
    out.rows.sort(key=lambda x: (x.state != "failing", -x.failed, x.node_id))
    return out


def repro_line(node_id: str, run: TestRun) -> str:
    """The run's own repro line for `node_id` (harness/suites/repro.py) when its folder is still here, else a
    plain pytest line."""
    folder = Path(run.folder)
    if run.source == "run" and (folder / "run.json").is_file():
        try:
            from harness.suites.collect import read_record
            from harness.suites.repro import repro_line as line

            return line(read_record(folder), node_id)
        except Exception:  # noqa: BLE001 - an old or partial run.json: the plain line below
            pass
    import shlex

    return shlex.join(["python", "-m", "pytest", "-q", node_id])


# ---- numerics triage reports --------------------------------------------------------------------------------


@dataclass
class NumericsReport:
    folder: Path
    rows: list[tuple[str, str, str, str]]  # (program, output, pair, verdict)
    check: str


def read_numerics(folders: Iterable[Path]) -> list[NumericsReport]:
    """The `numerics compare --out DIR` reports (DIR/report.json) found in `folders`; a report.json this harness
    does not read (another schema, damaged) is left out."""
    out = []
    for folder in folders:
        for path in sorted(Path(folder).rglob("report.json")):
            try:
                report = numerics_report.read_json(path)
            except NumericsError:
                continue
            rows = [
                (comparison.program.ref, output.name, f"{pair.b} vs {pair.a}", pair.verdict)
                for comparison in report.reports
                for output in comparison.outputs
                for pair in output.pairs
            ]
            check = report.check
            if check is None:
                text = "not checked"
            elif check.failures:
                text = "FAILED: " + "; ".join(check.failures)
            else:
                text = "passed"
            out.append(NumericsReport(path.parent, rows, text))
    return out
