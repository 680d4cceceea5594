"""`python -m harness site --out DIR`: build (or bring up to date) the history site from the stores.

Terms:
  stores      the bench store as every bench reader finds it (`--db FILE|URL`, `--lasting BACKEND`, else
              KILN_STORE_URL / `--store URL`, else results/bench/<backend>/bench.sqlite; harness/bench/cli.py) and
              the test history (`--history DB`, else KILN_STORE_URL, else KILN_HISTORY_DB or the lasting folder's
              file; harness/suites/history.py), both opened read-only: the site never migrates or writes a store.
  page spec   a page's name, its inputs (the data it shows) and how to render it.
  manifest    DIR/manifest.json: per page its inputs hash (its data, RENDER_VERSION and the source of the site's
              modules) and the sha256 of what was written. A page whose inputs hash is unchanged (and whose file is
              still there) is skipped: not rendered, not rewritten; one rendered again into the same bytes is not
              rewritten either. Pages of an earlier build that this one no longer makes are removed.
Workload pages (the charts), run pages and run exports render in worker processes (`--jobs`, default: the CPUs
this process may use).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import marshal
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.exc import UsageError
from harness.results import append_job_summary, atomic_write_text

from . import pages
from .data import BenchData, TestData, read_bench, read_numerics, read_tests

RENDER_VERSION = "1"  # bump to rebuild every page once (the renderers' own source is hashed in as well)
MANIFEST = "manifest.json"
DEFAULT_LAST = 50


@dataclass
class PageSpec:
    name: str
    inputs: str  # hash of what the page shows
    render: Callable[[], str] | None = None
    job: tuple[str, str] | None = None  # (kind, key) rendered in a worker: ("workload", name), ("run", uid)

    def render_here(self) -> str:
        """The page rendered in this process: its job, else its render function."""
        if self.job is not None:
            return _render_job(self.job)
        assert self.render is not None, f"page {self.name}: neither a job nor a render function"
        return self.render()


@dataclass
class Built:
    """What one build did: pages written, unchanged (skipped) and removed, and its seconds."""

    out: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    read_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"site {self.out}: {len(self.written)} page(s) written, {len(self.unchanged)} unchanged, "
            f"{len(self.removed)} removed in {self.seconds:.2f} s (stores read in {self.read_s:.2f} s)"
        )


@functools.lru_cache(maxsize=1)
def _renderer() -> bytes:
    """RENDER_VERSION and a hash of the site's own modules: a change to how pages look rebuilds them."""
    h = hashlib.sha256(RENDER_VERSION.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.digest()


def _hash(obj: Any) -> str:
    """A page's inputs hash (with `_renderer`): `obj` marshalled (plain tuples, lists, dicts, numbers and text:
    the fast path for the large inputs), else pickled (the stores' records)."""
    try:
        raw = marshal.dumps(obj)
    except ValueError:
        raw = pickle.dumps(obj, protocol=5)
    return hashlib.sha256(_renderer() + raw).hexdigest()


def _constant(text: str) -> Callable[[], str]:
    """A render function that returns `text`."""
    return lambda: text


def _vsig(data: BenchData, run_id: int) -> tuple:
    return tuple(
        (v.workload, v.compiler, str(v.verdict), v.ratio, v.p, v.baseline, v.confirmed)
        for v in data.verdicts.get(run_id) or []
    )


_DATA: BenchData | None = None  # the bench data, inherited by the forked workers


def _render_job(job: tuple[str, str]) -> str:
    """A page of the bench data (`PageSpec.job`), in this process or a forked worker."""
    assert _DATA is not None
    kind, key = job
    if kind == "workload":
        return pages.render_workload(_DATA, key)
    run = _DATA.run_by_uid(key)
    if kind == "run":
        return pages.render_run(_DATA, run, f"run-{pages.slug(run.uid)}.json")
    return pages.run_export(_DATA, run)


def specs(
    data: BenchData | None, tests: TestData | None, numerics: list[Any], notes: list[str]
) -> list[PageSpec]:
    """Every page of the site (module docstring)."""
    out = [
        PageSpec(
            "tests.html",
            _hash(tests and (tests.source, tests.last, tests.runs, tests.rows)),
            lambda: pages.render_tests(tests),
        ),
        PageSpec(
            "numerics.html",
            _hash([(r.folder, r.rows, r.check) for r in numerics]),
            lambda: pages.render_numerics(numerics),
        ),
    ]
    bench_sig = data and [
        (
            r.id,
            r.uid,
            r.git_commit,
            r.created_at,
            r.profile,
            r.device,
            r.hw_class,
            r.device_name,
            r.git_ref,
            _vsig(data, r.rid),
        )
        for r in data.runs
    ]
    workloads_sig = data and [(k, len(v)) for k, v in sorted(data.marks.items())]
    out.append(
        PageSpec(
            "index.html",
            _hash(
                (
                    bench_sig,
                    workloads_sig,
                    data and sorted(data.graphs),
                    tests and (tests.runs, [(x.node_id, x.state) for x in tests.rows]),
                    notes,
                )
            ),
            lambda: pages.render_index(data, tests, notes),
        )
    )
    if data is None:
        return out
    out.append(PageSpec("runs.html", _hash(bench_sig), lambda: pages.render_runs(data)))
    out.append(
        PageSpec(
            "models.html",
            _hash(
                [
                    (k, [(c, [tuple(p) for p in pts]) for c, pts in sorted(v.items())])
                    for k, v in sorted(data.graphs.items())
                    if k[0].startswith("model.") or any(p.compile_s for pts in v.values() for p in pts)
                ]
            ),
            lambda: pages.render_models(data),
        )
    )
    for w in data.workloads():
        keys = data.graphs_of(w)
        sig = [
            (
                k,
                data.devices[k],
                [(c, [tuple(p) for p in pts]) for c, pts in sorted(data.graphs[k].items())],
                [tuple(m) for m in data.marks.get(k, [])],
            )
            for k in keys
        ]
        out.append(PageSpec(pages.workload_page(w), _hash(sig), job=("workload", w)))
    for run in data.runs:
        run_sig = (
            json.dumps(run.as_dict(), sort_keys=True, default=str),
            _vsig(data, run.rid),
            data.commit_url,
            [(w, c, tuple(p)) for w, c, p in data.results.get(run.rid) or []],
        )
        out.append(PageSpec(pages.run_page(run.uid), _hash(run_sig), job=("run", run.uid)))
        out.append(
            PageSpec(f"run-{pages.slug(run.uid)}.json", _hash(("export", run_sig)), job=("export", run.uid))
        )
    for (_w, _c, commit), path in data.bisections.items():
        name = f"{path.stem}-{commit[:10]}"
        try:
            text = path.read_text()
            report = json.loads(text)
        except (OSError, ValueError):
            continue
        out.append(PageSpec(f"{name}.json", _hash(text), _constant(text)))
        out.append(
            PageSpec(
                f"{name}.html",
                _hash(("page", text)),
                functools.partial(pages.render_bisection, report, name, f"{name}.json"),
            )
        )
    return out


def _read_manifest(out: Path) -> dict[str, dict[str, str]]:
    try:
        m = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(m, dict) and m.get("format") == "kiln-site" and isinstance(m.get("pages"), dict)
    return m["pages"] if ok else {}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_site(out: Path, all_specs: list[PageSpec], *, jobs: int = 1, built: Built | None = None) -> Built:
    """Render and write the pages whose inputs changed (module docstring: manifest)."""
    built = built or Built(out)
    out.mkdir(parents=True, exist_ok=True)
    old = _read_manifest(out)
    new: dict[str, dict[str, str]] = {}
    todo: list[PageSpec] = []
    for s in all_specs:
        prev = old.get(s.name)
        if prev and prev.get("inputs") == s.inputs and (out / s.name).is_file():
            new[s.name] = prev
            built.unchanged.append(s.name)
        else:
            todo.append(s)
    rendered: dict[str, str] = {}
    in_workers = [s for s in todo if s.job is not None]
    if jobs > 1 and len(in_workers) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(
            max_workers=min(jobs, len(in_workers)), mp_context=multiprocessing.get_context("fork")
        ) as pool:
            charts = [s for s in in_workers if s.job and s.job[0] == "workload"]
            light = [s for s in in_workers if s.job and s.job[0] != "workload"]
            done = [
                (charts, pool.map(_render_job, [s.job for s in charts], chunksize=1)),
                (
                    light,
                    pool.map(_render_job, [s.job for s in light], chunksize=max(1, len(light) // (4 * jobs))),
                ),
            ]
            for group, texts in done:
                for s, page in zip(group, texts):
                    rendered[s.name] = page
    for s in todo:
        text = rendered.get(s.name)
        if text is None:
            text = s.render_here()
        sha = _sha(text)
        prev = old.get(s.name)
        if prev and prev.get("sha256") == sha and (out / s.name).is_file():
            built.unchanged.append(s.name)  # new inputs, the same page: left as it is
        else:
            atomic_write_text(out / s.name, text)
            built.written.append(s.name)
        new[s.name] = {"inputs": s.inputs, "sha256": sha}
    for name in sorted(set(old) - set(new)):
        if "/" not in name and (out / name).is_file():
            (out / name).unlink()
            built.removed.append(name)
    atomic_write_text(
        out / MANIFEST,
        json.dumps({"format": "kiln-site", "version": RENDER_VERSION, "pages": new}, indent=0, sort_keys=True)
        + "\n",
    )
    return built


def build(
    out: Path,
    *,
    db: Any = None,
    lasting: str | None = None,
    history: Any = None,
    no_history: bool = False,
    no_bench: bool = False,
    last: int = DEFAULT_LAST,
    bisections: list[Path] | None = None,
    numerics: list[Path] | None = None,
    quarantine: Path | None = None,
    jobs: int | None = None,
    commit_url: str = "",
) -> Built:
    """Read the stores and write the site into `out` (module docstring)."""
    global _DATA
    t0 = time.perf_counter()
    built = Built(out)
    notes: list[str] = []
    data = None if no_bench else _read_bench(db, lasting, bisections or [], notes)
    if data is not None:
        data.commit_url = commit_url
    tests = None if no_history else _read_history(history, last, quarantine, notes)
    nums = read_numerics(numerics or [])
    built.read_s = time.perf_counter() - t0
    _DATA = data
    try:
        write_site(out, specs(data, tests, nums, notes), jobs=jobs or _cpus(), built=built)
    finally:
        _DATA = None
    built.notes = notes
    built.seconds = time.perf_counter() - t0
    return built


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _read_bench(db: Any, lasting: str | None, bisections: list[Path], notes: list[str]) -> BenchData | None:
    from harness.bench.cli import open_bench_store
    from harness.exc import StoreError
    from harness.store.cli import configured

    explicit = bool(db or lasting or configured())
    if lasting and not db and configured() is None:
        db = _lasting_or_local(lasting, notes)
        lasting = None if db else lasting
    try:
        with open_bench_store(db, lasting, write=False) as store:
            data = read_bench(store, bisection_dirs=bisections)
    except StoreError as e:
        if explicit:
            raise
        notes.append(f"no bench store read: {e}")
        return None
    notes.append(f"bench store: {data.source} ({len(data.runs)} complete runs)")
    return data


def _lasting_or_local(backend: str, notes: list[str]) -> Path | None:
    """For `--lasting B` (`nox -s site -- --backend B`): None when B's lasting store exists (it is read); else the
    store the local sessions write (results/bench/B/bench.sqlite), with a note, when that one exists; else a
    StoreError naming both (a site of no runs is not built)."""
    from harness.bench.stores.store import lasting_path
    from harness.exc import StoreError

    lasting = lasting_path(backend)
    if lasting.is_file():
        return None
    local = Path("results") / "bench" / backend / "bench.sqlite"
    if local.is_file():
        notes.append(f"no lasting bench store at {lasting} (CI's); read the local one, {local}")
        return local
    raise StoreError(
        f"no bench store for {backend}: neither the lasting store {lasting} (CI's) nor the local "
        f"{local} exists; record runs first (`nox -s ci`, `nox -s bench`) or give --db FILE"
    )


def _read_history(history: Any, last: int, quarantine: Path | None, notes: list[str]) -> TestData | None:
    from harness.exc import HistoryError
    from harness.settings import settings
    from harness.store.cli import exists, location
    from harness.suites import history as hist
    from harness.suites import quarantine as q

    where = location(history, hist.default_path()) if history else hist.default_path()
    if not exists(where):
        if history:
            raise HistoryError(f"history store {where} does not exist")
        notes.append(f"no test history at {where}")
        return None
    qpath = quarantine or q.default_path(settings().root)
    quar = q.load(qpath) if qpath.is_file() else None
    try:
        tests = read_tests(where, last, quar)
    except HistoryError as e:
        if history:
            raise
        notes.append(f"no test history read: {e}")
        return None
    notes.append(f"test history: {where} (last {len(tests.runs)} recorded runs)")
    return tests


# ---- the verb ----------------------------------------------------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the site's folder (made; pages updated in place)")
    p.add_argument(
        "--db",
        help="the bench store: a SQLite file or a store URL (default as `bench history`: "
        "$KILN_STORE_URL, else $KILN_BENCH_DB, else results/bench/<backend>/bench.sqlite)",
    )
    p.add_argument(
        "--lasting", metavar="BACKEND", help="instead of --db: the CI's lasting bench store of BACKEND"
    )
    p.add_argument(
        "--history",
        metavar="DB",
        help="the test history (default: $KILN_STORE_URL, else "
        "$KILN_HISTORY_DB, else $XDG_DATA_HOME/kiln/history/history.sqlite)",
    )
    p.add_argument("--no-history", action="store_true", help="no tests page data")
    p.add_argument("--no-bench", action="store_true", help="no bench data (the tests page only)")
    p.add_argument(
        "--last",
        type=int,
        default=DEFAULT_LAST,
        help=f"recorded test runs the tests page looks back on (default {DEFAULT_LAST})",
    )
    p.add_argument(
        "--bisections",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="folders holding `bench bisect` JSON reports (bisect-W-C.json; a bench job's "
        "results/bench/B), linked from the regressions they bisected (repeatable)",
    )
    p.add_argument(
        "--numerics",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="folders of `numerics compare --out DIR` reports (report.json) to show (repeatable)",
    )
    p.add_argument("--quarantine", type=Path, help="the quarantine file (default ci/quarantine.toml)")
    p.add_argument(
        "--jobs", type=int, default=None, help="worker processes for the charts (default: the CPUs)"
    )
    p.add_argument(
        "--commit-url",
        default="",
        metavar="TEMPLATE",
        help="a commit's page, `{commit}` replaced, linked from each run's page (its CI runs and their "
        "artifacts), e.g. https://github.com/OWNER/REPO/commit/{commit}; `nox -s site` sets it on GitHub",
    )
    p.add_argument(
        "--link",
        metavar="URL",
        help="only add a link to the built site (the uploaded artifact's URL) "
        "to the job summary; build nothing",
    )
    from harness.store.cli import add_store_flags

    add_store_flags(p)


def cli_main(args: argparse.Namespace) -> int:
    """Build the history site (module docstring); one line of what was written."""
    if args.link:
        index = args.out / "index.html"
        append_job_summary(
            f"**History site**: [{args.link}]({args.link}) (download, unzip, open "
            f"`index.html`; built into `{args.out}`" + ("" if index.is_file() else ", not built here") + ")",
            force=True,
        )
        print(f"job summary: history site link {args.link}")
        return 0
    if args.last < 1:
        raise UsageError(f"--last must be at least 1, not {args.last}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    if args.db and args.lasting:
        raise UsageError("give --db or --lasting, not both")
    for folder in [*args.bisections, *args.numerics]:
        if not folder.is_dir():
            raise UsageError(f"{folder} is not a folder")
    built = build(
        args.out,
        db=args.db,
        lasting=args.lasting,
        history=args.history,
        no_history=args.no_history,
        no_bench=args.no_bench,
        last=args.last,
        bisections=args.bisections,
        numerics=args.numerics,
        quarantine=args.quarantine,
        jobs=args.jobs,
        commit_url=args.commit_url,
    )
    for n in built.notes:
        print(f"note: {n}", file=sys.stderr)
    print(built.line())
    print(f"open {args.out / 'index.html'}")
    append_job_summary(f"History site built: {built.line()}")
    return 0
