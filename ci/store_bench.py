"""Fleet store throughput, both engines side by side: `python ci/store_bench.py [--pg URL]`.

Writes RUNS bench runs of RESULTS results with SAMPLES samples each, the way `bench run` does (a run row, one
transaction per result, the finishing update), into a fresh SQLite file and a fresh PostgreSQL database, in turns,
and prints runs/s and results/s for each; then fills each with HISTORY_RUNS complete runs (`store push`) and
times `python -m harness bench history` on them (a fresh process, plots included when matplotlib is there).
Without `--pg` it starts a PostgreSQL of its own with ci/postgres.sh (initdb on a Unix socket, stopped at the end).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.bench.core.records import Result, RunInfo  # noqa: E402
from harness.bench.stores.store import Store, now  # noqa: E402


def fresh_database(server: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    return make_url(server).set(database=name).render_as_string(hide_password=False)


def write_runs(url: str, runs: int, results: int, samples: int) -> float:
    """Seconds to write `runs` runs (see the module docstring) into the store at `url` (opened once)."""
    with Store(url) as store:
        t0 = time.perf_counter()
        for i in range(runs):
            run = RunInfo(
                id=None,
                uid=uuid.uuid4().hex,
                created_at=now(),
                device="cpu",
                device_name="cpu: bench",
                compilers=["kiln", "eager"],
                git_ref="main",
                git_commit=f"c{i:05d}",
            )
            run_id = store.begin_run(run)
            for k in range(results):
                store.add_result(
                    run_id,
                    Result(
                        f"w{k // 2}",
                        ("kiln", "eager")[k % 2],
                        "h",
                        timer="wall",
                        bytes=1 << 20,
                        samples=[1e5 + j + i for j in range(samples)],
                    ),
                )
            store.finish_run(run_id)
        return time.perf_counter() - t0


def history_seconds(url: str, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "harness", "bench", "history", "--store", url, "--out", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=1800,
    )
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", help="a PostgreSQL server URL (default: start one with ci/postgres.sh)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--results", type=int, default=10)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="turns per engine (the best is reported)")
    ap.add_argument("--history-runs", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-store-bench-"))
    pg_dir = None
    try:
        server = args.pg
        if not server:
            pg_dir = tempfile.mkdtemp(prefix="kiln-pg-bench-")
            server = subprocess.run(
                [str(ROOT / "ci" / "postgres.sh"), "start", pg_dir],
                check=True,
                text=True,
                capture_output=True,
            ).stdout.split()[-1]
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for engine in ("sqlite", "postgresql"):
                url = f"sqlite:///{tmp / f'w{r}.sqlite'}" if engine == "sqlite" else fresh_database(server)
                s = write_runs(url, args.runs, args.results, args.samples)
                best[engine] = min(best.get(engine, s), s)
        print(
            f"write: {args.runs} runs x {args.results} results x {args.samples} samples, best of {args.rounds}"
        )
        print("| engine | runs/s | results/s | samples/s |")
        print("|---|---|---|---|")
        for engine, s in best.items():
            n = args.runs
            per = n * args.results
            print(f"| {engine} | {n / s:.1f} | {per / s:.0f} | {per * args.samples / s:.0f} |")
        src = tmp / "history-source.sqlite"
        write_runs(f"sqlite:///{src}", args.history_runs, 4, 20)
        print(
            f"\n`bench history` on {args.history_runs} runs (4 results x 20 samples each; a fresh process):"
        )
        print("| engine | seconds |")
        print("|---|---|")
        for engine in ("sqlite", "postgresql"):
            url = f"sqlite:///{tmp / 'history.sqlite'}" if engine == "sqlite" else fresh_database(server)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    "store",
                    "push",
                    "--only",
                    "bench",
                    "--from",
                    str(src),
                    "--to",
                    url,
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=True,
                capture_output=True,
            )
            print(f"| {engine} | {history_seconds(url, tmp / f'plots-{engine}'):.2f} |")
    finally:
        if pg_dir:
            subprocess.run(
                [str(ROOT / "ci" / "postgres.sh"), "stop", pg_dir], capture_output=True, check=False
            )
            shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
