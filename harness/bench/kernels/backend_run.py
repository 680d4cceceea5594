"""Bench one backend of ci/matrix.json, in its container (the harness's image and `docker run`) or natively.

    python -m harness bench backend --backend cuda [--native] [--results DIR] [-- more `bench run` flags]

The store lives in the results folder (default results/bench/<backend>/bench.sqlite), so history builds up on
a self-hosted runner; each run is compared with the latest complete one when there is one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.bench.stores import env
from harness.exc import UsageError
from harness.settings import bench_settings


def cmd_backend(args: argparse.Namespace) -> int:
    from harness import matrix as matrix_mod
    from harness.commands import suite_env
    from harness.store.runner import current
    from harness.suites import runner
    from harness.suites.place import chosen

    m = matrix_mod.load()
    try:
        b = m.backend(args.backend or matrix_mod.detect_backend(m))
    except Exception as e:  # noqa: BLE001 - an unknown backend name is a usage error here
        raise UsageError(str(e)) from None
    place = chosen(args.native, args.image)  # --native, else KILN_NATIVE, else the backend's container
    out_dir = Path(args.results or Path("results") / "bench" / b.name).resolve()
    extra = list(args.run_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    git = env.git_info(bench_settings().git_ref)  # taken here: the container has the source but not git
    inner = [
        "bench",
        "run",
        "--device",
        "cpu" if b.device == "cpu" else "cuda",
        "--db",
        "{out}/bench.sqlite",
        "--md",
        "{out}/last.md",
        "--json",
        "{out}/last.json",
        "--baseline",
        "latest?",
        "--label",
        f"{b.name}/{place.mode}",
    ]
    inner += [
        *(["--git-ref", git["ref"]] if git["ref"] else []),
        *(["--git-commit", git["commit"]] if git["commit"] else []),
        *extra,
    ]
    print(place.preflight(b, results=out_dir).line(), flush=True)
    place = place.prepared(b)  # a container place: its image described (--image) or the backend's built
    who = current()  # the host's name and GPU label (a container's host name is its id): stored with the run
    who_env = {"RUNNER_NAME": who.runner, **({"KILN_GPU_LABEL": who.gpu_label} if who.gpu_label else {})}
    rc = runner.run_python_module(
        place,
        b,
        inner,
        out_dir,
        "bench",
        env=suite_env(m, b),
        timeout_s=b.timeouts.suite_s,
        extra_env=who_env,
    )
    print(f"bench {b.name} ({place.mode}): exit {rc}; store and reports in {out_dir}")
    return rc
