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
from harness.settings import bench_settings, settings


def cmd_backend(args: argparse.Namespace) -> int:
    from harness import matrix as matrix_mod
    from harness.images import image as image_mod
    from harness.suites import runner

    m = matrix_mod.load()
    try:
        b = m.backend(args.backend or matrix_mod.detect_backend(m))
    except Exception as e:  # noqa: BLE001 - an unknown backend name is a usage error here
        raise UsageError(str(e)) from None
    native = bool(args.native or settings().native)
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
        f"{b.name}/{'native' if native else 'container'}",
    ]
    inner += [
        *(["--git-ref", git["ref"]] if git["ref"] else []),
        *(["--git-commit", git["commit"]] if git["commit"] else []),
        *extra,
    ]
    from harness.checks import preflight

    print(preflight.check(b, native=native, results=out_dir).line(), flush=True)
    image = None
    if not native:
        image_mod.require_docker()
        image = args.image or image_mod.build(b).tag
    from harness.store.runner import current

    who = current()  # the host's name and GPU label (a container's host name is its id): stored with the run
    who_env = {"RUNNER_NAME": who.runner, **({"KILN_GPU_LABEL": who.gpu_label} if who.gpu_label else {})}
    from harness.commands import suite_env
    from harness.suites.place import chosen

    rc = runner.run_python_module(
        chosen(native, image),
        b,
        inner,
        out_dir,
        "bench",
        env=suite_env(m, b),
        timeout_s=b.timeouts.suite_s,
        extra_env=who_env,
    )
    print(
        f"bench {b.name} ({'native' if native else 'container'}): exit {rc}; store and reports in {out_dir}"
    )
    return rc
