"""How long `python -m harness site` takes on a large history (1,000 runs x 30 workloads in seconds).

    python ci/site_bench.py [--runs 1000] [--workloads 30] [--tests-runs 100] [--jobs N] [--keep DIR]

Writes a bench store of RUNS runs x WORKLOADS workloads x 3 compilers (10 samples each, stored verdicts) through
`Store.import_`, and a test history of TESTS_RUNS recorded folders through `history.record`
(harness/site/fixture.py), then builds the site three times into one folder: cold (every page), warm (nothing
changed: no page rendered), and after one more run that measured one workload (that workload's page, the run's
pages, the index and the lists). Prints one line per build; the store writing is not timed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_s() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--workloads", type=int, default=30)
    p.add_argument("--tests-runs", type=int, default=100)
    p.add_argument("--jobs", type=int, default=None, help="chart workers (default: the CPUs)")
    p.add_argument("--keep", type=Path, help="build here and keep it (default: a temporary folder)")
    args = p.parse_args()

    from harness.bench.stores.store import Store
    from harness.site import build, fixture

    root = args.keep or Path(tempfile.mkdtemp(prefix="kiln-site-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    db, hist, out = root / "bench.sqlite", root / "history.sqlite", root / "site"
    t0 = time.perf_counter()
    if not db.exists():
        with Store(db) as store:
            store.import_(fixture.big_export(args.runs, args.workloads))
    if not hist.exists():
        fixture.write_history(hist, root / "runs", args.tests_runs)
    print(
        f"stores written in {time.perf_counter() - t0:.1f} s: {db} ({args.runs} runs x {args.workloads} "
        f"workloads x 3 compilers), {hist} ({args.tests_runs} recorded runs)"
    )
    kw = dict(db=str(db), history=str(hist), jobs=args.jobs)

    def timed(what: str) -> None:
        """One build, its wall time and the CPU seconds it used (this process and its chart workers: on a
        shared machine the wall time also counts other work)."""
        before = cpu_s()
        b = build.build(out, **kw)
        print(f"{what}: {b.line()}; {cpu_s() - before:.1f} CPU s")

    for what in ("cold", "warm"):
        timed(what)
    from harness.bench.core.records import Result

    with Store(db) as store:
        info = fixture._run_info(args.runs)
        rid = store.begin_run(info)
        store.add_result(rid, Result("w00.op", "kiln", "s0", samples=[40_000.0 + i for i in range(10)]))
        store.finish_run(rid)
    timed("one more run")
    print(f"site: {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
