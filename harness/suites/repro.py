"""Reproduction lines: for every failing test of a run, one shell command that reruns just that test
with the same image (or Python), environment, options and per-test timeout as the run.

Container runs give `docker run --rm --init --network none -v SRC:/src:ro ... IMAGE python -m pytest ...
'tests/...::case'`; native runs give `cd SRC && env K=V ... PYTHON -m pytest ... 'tests/...::case'`.
Both are built by the same functions the runner uses (harness.suites.runner), from run.json; in a merged shard run,
from the run.json of the shard that ran the test (its image, its GPU pinning), never with the shard option.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness.suites.collect import RunResults, latest_run, load_run
from harness.exc import ResultsError
from harness.commands import container_argv, native_shell_line, pytest_argv
from harness.record import RunRecord


def repro_argv(record: RunRecord, test_id: str) -> list[str]:
    """The inner pytest command for one test, with the run's per-test timeout and extra arguments."""
    extra = [a for a in record.pytest_extra if not a.startswith("--junitxml")]
    timeout = record.test_timeout_s if record.per_test_timeout else None
    return pytest_argv([test_id], test_timeout_s=timeout, extra=extra)


def repro_line(record: RunRecord, test_id: str) -> str:
    """The shell line that reproduces `test_id` as run in the run `record` describes (run.json)."""
    if not record.src:
        raise ResultsError("run.json has no `src`; cannot build a repro line")
    env = dict(record.env)
    inner = repro_argv(record, test_id)
    if record.mode == "native":
        argv = [record.python or "python", *inner[1:]]
        return native_shell_line(argv, env, Path(record.src))
    image = (record.image or {}).get("tag")
    if not image:
        raise ResultsError("run.json of a container run has no image tag")
    backend = matrix_mod.load().backend(record.backend)
    # the run's own container options win over today's matrix, so the line matches what ran
    if record.container_options is not None:
        backend = replace(backend, container_options=tuple(record.container_options))
    return shlex.join(container_argv(backend, image, inner, src=record.src, env=env, docker=record.docker))


def suite_repro_line(record: RunRecord, suite: str) -> str:
    """The shell line that reruns a whole suite's folder as the run did: for a suite that never ran its tests
    (a collection error), the one command that shows why."""
    return repro_line(record, f"tests/{suite}")


def repro_lines(run: RunResults) -> list[tuple[str, str, str]]:
    """(suite, test id, line) for every failing test, in report order."""
    return [(suite, t.id, repro_line(run.record_for(t.id), t.id)) for suite, t in run.failing]


def image_hint(record: RunRecord) -> str | None:
    """How to get the run's image on another machine (it is built locally, not pushed)."""
    image = (record.image or {}).get("tag")
    if record.mode == "native" or not image:
        return None
    base = (record.image or {}).get("base")
    base_arg = f" --base-image {shlex.quote(base)}" if base else ""
    return f"python -m harness image build --backend {record.backend}{base_arg}  # builds {image}"


# ---- CLI: `python -m harness repro [RESULTS_DIR]` ------------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument("results_dir", nargs="?", help="a run folder (default: the latest under results/)")
    p.add_argument("--test", help="print the line for this test id even if it did not fail")


def cli_main(args: Any) -> int:
    """Print one command per failing test that reproduces it (paste it into a shell)."""
    run = load_run(args.results_dir or latest_run())
    make = repro_line
    if args.test:
        print(make(run.record_for(args.test), args.test))
        return 0
    failing = run.failing
    broken = [s for s in run.suites if s.record.collect_failed or s.record.ended_badly]
    if not failing and not broken:
        state = "" if run.complete else f" (run is {run.record.status}, not complete)"
        print(f"# no failing tests in {run.path}{state}")
        return 0
    hint = image_hint(run.record_for(failing[0][1].id) if failing else run.record)
    if hint:
        print(f"# image: {hint}")
    for suite in broken:  # died before (or after) its tests: rerun the whole folder to see why
        why = (f"collection error: {suite.record.collect_failed}" if suite.record.collect_failed
               else f"ended badly: {suite.record.ended_badly}")
        print(f"# suite {suite.name}: {why}")
        print(suite_repro_line(run.record, suite.name))
    for suite, test in failing:
        print(f"# {suite}: {test.id} ({test.outcome}: {test.headline[:120]})")
        print(make(run.record_for(test.id), test.id))
    return 0
