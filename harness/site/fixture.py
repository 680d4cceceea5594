"""A planted history for the site's tests and its benchmark (ci/site_bench.py), written through the stores' own
writers: the bench store's `Store.begin_run`/`add_result`/`save_verdicts`/`finish_run` (or `Store.import_` for
the large one) and the test history's `history.record` of results folders as `harness run` writes them.

Terms:
  planted step   from run STEP_RUN on, kiln on STEP_WORKLOAD is 30% slower; that run stored `regressed`,
                 confirmed side by side, and a bench bisection JSON names its commit as BAD.
  planted bump   run BUMP_RUN alone is 25% slower for kiln on BUMP_WORKLOAD; that run stored `rejected` (the
                 side-by-side confirmation did not confirm it).
  tests          FAILING_TEST fails in every run from FAILING_FROM on (failing); FLAKY_TEST fails in FLAKY_RUNS
                 only (flaky); OK_TEST always passes.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC
from pathlib import Path
from typing import Any

WORKLOADS = ("softmax.rows", "layernorm.fwd", "add.bcast", "sum.cols")
COMPILERS = ("kiln", "inductor", "eager")
STEP_WORKLOAD, STEP_RUN = "softmax.rows", 20
BUMP_WORKLOAD, BUMP_RUN = "layernorm.fwd", 12
FAILING_TEST = "tests/suite/test_site_fixture.py::test_always_broken"
FLAKY_TEST = "tests/suite/test_site_fixture.py::test_sometimes[4]"
OK_TEST = "tests/suite/test_site_fixture.py::test_fine"
FAILING_FROM, FLAKY_RUNS = 24, (7, 19)
HW_CLASS = "fixture-cpu"


def _date(i: int) -> str:
    """Run `i`'s time: one run an hour from 2026-11-01."""
    from datetime import datetime, timedelta

    return (datetime(2026, 11, 1, tzinfo=UTC) + timedelta(hours=i)).isoformat()


def commit_of(i: int) -> str:
    return hashlib.sha1(f"kiln-site-fixture-{i}".encode()).hexdigest()


def _samples(rng: random.Random, base_ns: float, n: int) -> list[float]:
    return [base_ns * (1 + rng.gauss(0, 0.02)) for _ in range(n)]


def _base(workload: str, compiler: str) -> float:
    w = 1 + WORKLOADS.index(workload) if workload in WORKLOADS else 1 + sum(workload.encode()) % 7
    return {"kiln": 40_000.0, "inductor": 30_000.0, "eager": 45_000.0}.get(compiler, 50_000.0) * w


def _run_info(i: int, profile: str = "tiny") -> Any:
    from harness.bench.core.records import RunInfo

    return RunInfo(
        id=None,
        uid=f"fixture-{profile}-{i:04d}",
        created_at=_date(i),
        profile=profile,
        device="cpu",
        device_name="cpu: fixture",
        compilers=list(COMPILERS),
        git_ref="main",
        git_commit=commit_of(i),
        label=None,
        ceiling_gbps=10.0,
        env={"source": "fixture", "GITHUB_RUN_ID": str(1000 + i)},
        runner="fixture-runner",
        gpu_model=None,
        driver=None,
        gpu_label=None,
        hw_class=HW_CLASS,
    )


def write_bench(where: Any, runs: int = 30, *, models: int = 6, seed: int = 0) -> list[int]:
    """The planted bench history (module docstring) into the store at `where` (a file or a store URL); run ids."""
    from harness.bench.core.records import Comparison, Result, Verdict
    from harness.bench.stores.store import Store

    rng = random.Random(seed)
    ids: list[int] = []
    with Store(where) as store:
        for i in range(runs):
            rid = store.begin_run(_run_info(i))
            for w in WORKLOADS:
                for c in COMPILERS:
                    base = _base(w, c)
                    if c == "kiln" and w == STEP_WORKLOAD and i >= STEP_RUN:
                        base *= 1.3
                    if c == "kiln" and w == BUMP_WORKLOAD and i == BUMP_RUN:
                        base *= 1.25
                    store.add_result(
                        rid,
                        Result(
                            w,
                            c,
                            f"src-{w}",
                            samples=_samples(rng, base, 15),
                            bytes=200_000,
                            ceiling_gbps=10.0,
                            compile_s=0.5 + 0.1 * (c == "kiln"),
                        ),
                    )
            verdicts = []
            for w in WORKLOADS:
                for c in COMPILERS:
                    if i == 0:
                        verdicts.append(Comparison(w, c, Verdict.NEW))
                    elif c == "kiln" and w == STEP_WORKLOAD and i == STEP_RUN:
                        verdicts.append(
                            Comparison(
                                w,
                                c,
                                Verdict.REGRESSED,
                                1.3,
                                1e-6,
                                baseline=f"run:{ids[-1]}",
                                confirmed=True,
                                suspect=Verdict.REGRESSED,
                                sbs_ratio=1.29,
                                sbs_p=1e-5,
                            )
                        )
                    elif c == "kiln" and w == BUMP_WORKLOAD and i == BUMP_RUN:
                        verdicts.append(
                            Comparison(
                                w,
                                c,
                                Verdict.REJECTED,
                                1.25,
                                1e-4,
                                baseline=f"run:{ids[-1]}",
                                confirmed=False,
                                suspect=Verdict.REGRESSED,
                                sbs_ratio=1.01,
                                sbs_p=0.4,
                            )
                        )
                    else:
                        verdicts.append(
                            Comparison(w, c, Verdict.UNCHANGED, 1.0, 0.5, baseline=f"run:{ids[-1]}")
                        )
            store.save_verdicts(rid, verdicts)
            store.finish_run(rid)
            ids.append(rid)
        for i in range(models):
            rid = store.begin_run(_run_info(i * 5, "models-tiny"))
            for c in COMPILERS:
                store.add_result(
                    rid,
                    Result(
                        "model.gpt2.infer.fp32",
                        c,
                        "src-gpt2",
                        samples=_samples(rng, _base("model.gpt2", c) * 20, 5),
                        compile_s=None if c == "eager" else 8.0 + i * 0.2,
                    ),
                )
            store.finish_run(rid)
    return ids


def write_bisection(folder: Path) -> Path:
    """The bisection JSON a bench job would have written for the planted step (`bisect-W-C.json`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bisect-{STEP_WORKLOAD}-kiln.json"
    bad = commit_of(STEP_RUN)
    path.write_text(
        json.dumps(
            {
                "workload": STEP_WORKLOAD,
                "compiler": "kiln",
                "device": "cpu",
                "good": {"sha": commit_of(STEP_RUN - 1), "subject": "before"},
                "bad": {"sha": bad, "subject": "after"},
                "outcome": "first-bad",
                "message": f"first bad commit: {bad[:10]}",
                "first_bad": {"sha": bad, "subject": "after"},
                "steps": [],
            }
        )
    )
    return path


def _run_folder(folder: Path, i: int, outcomes: dict[str, str]) -> Path:
    """A finished `harness run` results folder: run.json, env.json and one suite's JUnit."""
    (folder / "suites").mkdir(parents=True, exist_ok=True)
    body = {"passed": "", "failed": '<failure message="boom"/>'}
    cases = "".join(
        f'<testcase classname="x" name="{t}" time="0.1"><properties><property name="kiln_nodeid" '
        f'value="{t}"/></properties>{body[o]}</testcase>'
        for t, o in outcomes.items()
    )
    (folder / "suites" / "suite.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    failed = any(o == "failed" for o in outcomes.values())
    (folder / "run.json").write_text(
        json.dumps(
            {
                "backend": "cpu",
                "mode": "native",
                "status": "complete",
                "src": str(folder),
                "started": _date(i),
                "suites": [
                    {
                        "name": "suite",
                        "status": "failed" if failed else "passed",
                        "junit": "suites/suite.xml",
                        "duration_s": 1.0,
                    }
                ],
            }
        )
    )
    (folder / "env.json").write_text(json.dumps({"git": {"sha": commit_of(i)}}))
    return folder


def write_history(where: Any, folders: Path, runs: int = 30) -> None:
    """The planted test history (module docstring) into the store at `where`, from results folders under
    `folders`."""
    from harness.suites import history

    for i in range(runs):
        outs = {
            OK_TEST: "passed",
            FAILING_TEST: "failed" if i >= FAILING_FROM else "passed",
            FLAKY_TEST: "failed" if i in FLAKY_RUNS else "passed",
        }
        history.record(where, _run_folder(folders / f"run-{i:03d}", i, outs))


def big_export(runs: int, workloads: int, *, samples: int = 10, seed: int = 1) -> dict[str, Any]:
    """A bench export (harness/bench/stores/store.py EXPORT_FORMAT) of `runs` runs x `workloads` workloads x 3 compilers,
    every run with stored verdicts (one confirmed regression per 100 runs), for `Store.import_`."""
    from harness.bench.core.records import SCHEMA_VERSION, Verdict

    rng = random.Random(seed)
    names = [f"w{j:02d}.op" for j in range(workloads)]
    out = []
    for i in range(runs):
        info = _run_info(i)
        info.status = "complete"
        res, vs = [], []
        for j, w in enumerate(names):
            for c in COMPILERS:
                step = 1.3 if (c == "kiln" and i >= 500 and j == 0) else 1.0
                base = _base(w, c) * step
                res.append(
                    {
                        "workload": w,
                        "compiler": c,
                        "source_hash": f"s{j}",
                        "bytes": 100_000 * (j + 1),
                        "ceiling_gbps": 10.0,
                        "compile_s": 0.4,
                        "samples": _samples(rng, base, samples),
                    }
                )
                verdict = (
                    Verdict.REGRESSED
                    if (step > 1 and i == 500)
                    else (Verdict.NEW if i == 0 else Verdict.UNCHANGED)
                )
                vs.append(
                    {
                        "workload": w,
                        "compiler": c,
                        "verdict": verdict.value,
                        "ratio": step,
                        "confirmed": True if verdict is Verdict.REGRESSED else None,
                    }
                )
        out.append({**info.as_dict(), "results": res, "verdicts": vs})
    return {"format": "kiln-bench-export", "schema_version": SCHEMA_VERSION, "runs": out}
