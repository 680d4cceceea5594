"""`harness repro`: rerun a run's failing tests here, at the run's commit, in its image (or natively), with its
environment and seeds; and the reproduction lines: for every failing test of a run, one shell command that reruns
just that test with the same image (or Python), environment, options and per-test timeout as the run.

The rerun (`python -m harness repro SOURCE`): SOURCE is a results folder, a CI artifact (zip or folder) or a run
of the store (harness.suites.repro_source); the run's commit is checked out in a scratch worktree, its image found
or rebuilt by its content hash (harness.suites.repro_rerun); what cannot match is said in one line
(harness.suites.repro_plan); the exit status is the rerun's: 0 when no failing test fails again, 1 when one
does, 3 when the tests could not be run. `--print` prints the lines instead and runs nothing.

Container runs give `docker run --rm --init --network none -v SRC:/src:ro ... IMAGE python -m pytest ...
'tests/...::case'`; native runs give `cd SRC && env K=V ... PYTHON -m pytest ... 'tests/...::case'`.
Both are built by the same functions the runner uses (harness.suites.runner), from run.json; in a merged shard run,
from the run.json of the shard that ran the test (its image, its GPU pinning), never with the shard option.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness.commands import (
    CONTAINER_RESULTS,
    container_argv,
    native_command,
    native_shell_line,
    pytest_argv,
    suite_env,
    without_gpu_options,
)
from harness.exc import EXIT_FAILED, EXIT_INFRA, EXIT_OK, HarnessError, ImageError, ResultsError
from harness.git import output as git_output
from harness.matrix import Backend
from harness.record import FAILING, RunRecord
from harness.settings import settings
from harness.suites.collect import RunResults, latest_run, load_run
from harness.suites.repro_plan import (
    CONTAINER,
    NATIVE,
    Here,
    ReproPlan,
    choose_mode,
    commit_differences,
    differs_line,
    outcome_line,
    plan,
    run_env,
)
from harness.suites.repro_source import RunSource


def repro_argv(record: RunRecord, test_id: str, *more: str, junit: str | None = None) -> list[str]:
    """The inner pytest command for one test (or several), with the run's per-test timeout and extra arguments."""
    extra = [a for a in record.pytest_extra if not a.startswith("--junitxml")]
    timeout = record.test_timeout_s if record.per_test_timeout else None
    return pytest_argv([test_id, *more], junit=junit, test_timeout_s=timeout, extra=extra)


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


# ---- the rerun's command ---------------------------------------------------------------------------------


def rerun_command(
    p: ReproPlan, record: RunRecord, backend: Backend, root: Path, out: Path
) -> tuple[list[str], dict[str, str] | None, Path | None, str | None]:
    """(argv, environment or None for this process's, working folder, container name) of the rerun of plan `p`:
    its tests in one pytest process, JUnit into `out`/repro.xml, from the tree at `root`. A container gets the
    run's container options (its GPU options left out where `p.drop_gpus`), this machine's visible GPUs and
    the runner's uid:gid; natively this machine's Python runs from `root`."""
    from harness.suites.repro_rerun import JUNIT, container_name

    if p.mode == NATIVE:
        inner = repro_argv(record, *p.targets, junit=str(out / JUNIT))
        argv, env = native_command(inner, dict(p.env), src=root)
        return argv, env, root, None
    options = (
        backend.container_options if record.container_options is None else tuple(record.container_options)
    )
    if p.drop_gpus:
        options = tuple(without_gpu_options(options))
    b = replace(backend, container_options=options)
    env = dict(p.env)
    if not p.drop_gpus:
        from harness.suites.place import container_backend

        b, env = container_backend(b, env)
    inner = repro_argv(record, *p.targets, junit=f"{CONTAINER_RESULTS}/{JUNIT}")
    name = container_name(backend.name)
    s = settings()
    argv = container_argv(
        b,
        str(p.image),
        inner,
        src=root,
        env=env,
        results=out,
        name=name,
        docker=s.docker,
        user=s.container_user,
    )
    return argv, None, None, name


def exit_code(rc: int, found: dict[str, str]) -> int:
    """The command's exit status from the rerun's (pytest's): 1 when a failing test fails again, 0 when none
    does and all ran, else 3 (the tests were not run: pytest's usage error, no tests collected, a timeout)."""
    if any(o in FAILING for o in found.values()):
        return EXIT_FAILED
    if rc == 0 and all(o != "not run" for o in found.values()):
        return EXIT_OK
    return EXIT_INFRA


# ---- CLI: `python -m harness repro [SOURCE]` -------------------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument(
        "source",
        nargs="?",
        help="a run's results folder, its CI artifact (zip or folder) or a run "
        "id of the store (uid, folder name or id; KILN_STORE_URL or --store) (default: the latest "
        "run under results/)",
    )
    p.add_argument(
        "--print",
        action="store_true",
        dest="print_lines",
        help="print one command per failing test that reproduces it, run nothing",
    )
    p.add_argument("--test", help="with --print: the line for this test id even if it did not fail")
    p.add_argument("--run", metavar="NAME", help="the run folder to take from an artifact holding several")
    p.add_argument(
        "--repo",
        metavar="DIR",
        help="the git repository holding the run's commit (default: this checkout, KILN_ROOT)",
    )
    p.add_argument(
        "--here", action="store_true", help="rerun on this checkout as it is, not at the run's commit"
    )
    p.add_argument("--native", action="store_true", help="rerun natively even if the run was in a container")
    p.add_argument("--no-build", action="store_true", help="stop instead of building a missing image")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="the repro's scratch folder: worktree, log, JUnit (default: a "
        "new kiln-repro-* folder in the temporary folder)",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch worktree")
    from harness.store.cli import add_store_flags

    add_store_flags(p)


def print_lines(args: Any) -> int:
    """`--print`: one command per failing test that reproduces it (paste it into a shell)."""
    run = load_run(args.source or latest_run())
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
    for one in broken:  # died before (or after) its tests: rerun the whole folder to see why
        why = (
            f"collection error: {one.record.collect_failed}"
            if one.record.collect_failed
            else f"ended badly: {one.record.ended_badly}"
        )
        print(f"# suite {one.name}: {why}")
        print(suite_repro_line(run.record, one.name))
    for suite, test in failing:
        print(f"# {suite}: {test.id} ({test.outcome}: {test.headline[:120]})")
        print(make(run.record_for(test.id), test.id))
    return 0


def cli_main(args: Any) -> int:
    """Rerun a run's failing tests here at its commit, in its image or natively, with its environment and seeds."""
    if args.print_lines or args.test:
        return print_lines(args)
    scratch = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="kiln-repro-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        return _repro(args, scratch)
    except HarnessError:
        from harness.suites.repro_rerun import LOG

        if not args.out and not (scratch / LOG).exists():  # stopped before the rerun: nothing worth keeping
            shutil.rmtree(scratch, ignore_errors=True)
        raise


def _repro(args: Any, scratch: Path) -> int:
    from harness.suites import repro_rerun as rr
    from harness.suites.repro_source import open_source

    src = open_source(args.source or str(latest_run()), scratch, args.run)
    rec = src.record
    sha = src.commit
    print(
        f"repro: {src.where}: run {rec.run_id} ({rec.backend}/{rec.mode or '?'}, commit "
        f"{sha[:12] if sha else 'unknown'}): {len(src.failing)} failing test(s)",
        flush=True,
    )
    if src.note:
        print(f"repro: note: {src.note}", flush=True)
    for broken in src.broken:
        print(
            f"repro: suite {broken}: not rerun (`python -m harness repro --print` gives its command)",
            flush=True,
        )
    if not src.failing:
        print(f"repro: nothing to reproduce: no failing tests in {src.where}")
        return EXIT_OK
    repo = Path(args.repo).resolve() if args.repo else settings().root
    use_here = bool(args.here) or sha is None
    here = Here(
        docker=rr.docker_answers(),
        gpus=rr.local_gpus(),
        versions=rr.local_versions(),
        has_commit=sha is not None and rr.has_commit(repo, sha),
        head=git_output(repo, "rev-parse", "HEAD"),
    )
    commit_differences(src, here, use_here)  # a commit not here stops before anything is made
    tree = repo if use_here else rr.add_worktree(repo, str(sha), scratch / rr.TREE)
    try:
        return _rerun(args, src, here, tree, scratch, use_here)
    finally:
        if not use_here and not args.keep:
            rr.remove_worktree(repo, tree)
        elif not use_here:
            print(f"repro: the worktree is kept at {tree} (git worktree remove {tree})")


def _rerun(args: Any, src: RunSource, here: Here, tree: Path, scratch: Path, use_here: bool) -> int:
    from harness.suites import repro_rerun as rr

    m = matrix_mod.load(tree / "ci" / "matrix.json")
    b = m.backend(src.record.backend)
    if choose_mode(src, here, args.native)[0] == CONTAINER:
        recorded = (src.record.image or {}).get("tag")
        present = rr.image_present(recorded)
        here = replace(
            here, image_present=present, rebuild_tag=None if present else rr.worktree_image_tag(tree, b.name)
        )
    p = plan(src, here, run_env(src, suite_env(m, b)), force_native=args.native, use_here=use_here)
    print(differs_line(p), flush=True)
    if p.mode == CONTAINER and p.build and not rr.image_present(p.image):
        if args.no_build:
            raise ImageError(f"image {p.image} is not here and --no-build was given")
        rr.build_image(tree, b.name, str(p.image))
    argv, env, cwd, name = rerun_command(p, src.record_for(p.targets[0]), b, tree, scratch)
    where = f"in {p.image}" if p.mode == CONTAINER else f"natively with {sys.executable}"
    print(
        f"repro: rerunning {len(p.targets)} test(s) {where}, tree {tree}; log {scratch / rr.LOG}", flush=True
    )
    timeout = src.record.suite_timeout_s or b.timeouts.suite_s
    rc = rr.rerun(argv, env=env, cwd=cwd, log=scratch / rr.LOG, timeout_s=timeout, container=name)
    found = rr.outcomes(scratch / rr.JUNIT, tree, p.targets)
    was = {f.id: f.outcome for f in src.failing}
    for test, outcome in found.items():
        why = rr.why_not_run(test, tree, scratch / rr.LOG) if outcome == "not run" else ""
        print(f"  {test}: {outcome} here (the run: {was.get(test, '?')}){': ' + why if why else ''}")
    code = exit_code(rc, found)
    if code == EXIT_INFRA:
        print(f"repro: the tests did not all run (pytest exited {rc}); see {scratch / rr.LOG}")
    print(outcome_line(sum(o in FAILING for o in found.values()), len(found)), flush=True)
    return code
