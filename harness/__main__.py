"""Command line: `python -m harness <verb> [options]`.

A verb is a module that defines `cli_add_arguments(parser)` and `cli_main(args) -> int` (its docstring
is the verb's help). Adding a verb is one line in VERBS. Only the chosen verb's module is imported.
Any `HarnessError` is printed as one line `harness <verb>: error: ...` with its exit code, no traceback.
Exit codes (harness/exc.py, listed in every verb's `--help`): 0 ok, 1 tests failed or a regression, 2 usage or
input error, 3 infrastructure (docker, image, health, device, tools, locks), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from harness import conventions
from harness.exc import EXIT_CODES_EPILOG, EXIT_OK, EXIT_USAGE, guarded
from harness.settings import require_compiler_settings

# verb -> (module, one-line help). Keep sorted by the order a person meets them.
VERBS: dict[str, tuple[str, str]] = {
    "run": ("harness.suites.steps", "run the suites for a backend, in its container or natively"),
    "detect": ("harness.suites.runner", "print the backend this machine supports: cuda, rocm or cpu"),
    "preflight": (
        "harness.checks.preflight",
        "cheap runner check before a job: GPU driver and count, docker, free disk",
    ),
    "health": ("harness.checks.health", "GPU health check: a matmul and a compiled kernel on every device"),
    "env": ("harness.envinfo", "print the environment record (git, versions, driver, GPUs, config)"),
    "image": (
        "harness.images.image_check",
        "build the hash-tagged backend image, --check it, --pin base images by digest",
    ),
    "report": ("harness.suites.report", "print the report of a results folder"),
    "repro": (
        "harness.suites.repro",
        "rerun a run's failing tests here at its commit, in its image (--print: the commands)",
    ),
    "merge": (
        "harness.suites.merge",
        "merge the shards of a run (`run --shard I/N` folders) into one report",
    ),
    "durations": (
        "harness.suites.shard",
        "record tests' durations from results folders (balances `run --shard`)",
    ),
    "history": (
        "harness.suites.history",
        "test history (SQLite): record results folders, show failure counts",
    ),
    "matrix": ("harness.matrix", "validate and print ci/matrix.json"),
    "workflows": (
        "harness.workflows",
        "write (or check) the workflows' shared env and runner labels from their one place",
    ),
    "cleanup": (
        "harness.images.cleanup",
        "a CI job's teardown: its containers, stale ones, superseded kiln image tags",
    ),
    "flakes": ("harness.suites.flakes", "run tests N times (pytest-flakefinder): passing, failing or flaky"),
    "compile-check": (
        "harness.checks.compile_check",
        "compile every dumped kernel for the matrix's GPU targets",
    ),
    "bench": ("harness.bench.cli", "benchmarks: measure latency/bandwidth, store history, flag regressions"),
    "numerics": (
        "harness.numerics.cli",
        "numerics triage: run a program under several compilers, compare vs fp64",
    ),
    "store": (
        "harness.store.cli",
        "fleet store: push this runner's stores into a shared database, pull them back",
    ),
    "site": (
        "harness.site.build",
        "build the history site: static HTML of runs, trends, flaky tests (no server)",
    ),
    "trust": (
        "harness.trust_cli",
        "print this job's trust scope and the folders and stores it reads and writes",
    ),
    "settings": (
        "harness.settings",
        "print every environment variable of the harness and the compiler (docs/settings.md)",
    ),
}

# Verbs whose module serves several verbs use cli_<verb>_add_arguments / cli_<verb>_main.

# verbs that compile with kiln in this process (or its native children): a bad compiler setting stops them first
# (`run` checks the suites' own environment; `bench` checks the verbs that measure; `env` records the error)
COMPILING_VERBS = frozenset({"health", "compile-check", "numerics"})

# verb -> an example a person can paste (shown in the verb's --help, before the exit codes)
EXAMPLES: dict[str, str] = {
    "run": "python -m harness run --backend cpu --native --quiet",
    "detect": "python -m harness detect --mode",
    "health": "python -m harness health",
    "env": "python -m harness env --part device",
    "image": "python -m harness image --check",
    "report": "python -m harness report --json - | jq .counts",
    "repro": "python -m harness repro results-cpu.zip       # a CI artifact, a results folder or a store run id\n"
    "python -m harness repro --print results/20261125T120000Z-cpu-native",
    "merge": "python -m harness merge results/shard-1 results/shard-2 --out results/merged",
    "durations": "python -m harness durations results/20261125T120000Z-cpu-native --backend cpu",
    "history": "python -m harness history show --json -",
    "matrix": "python -m harness matrix",
    "flakes": "python -m harness flakes --backend cpu --native --runs 20 tests/numerics",
    "compile-check": "python -m harness compile-check --help",
    "bench": "python -m harness bench history            # the store `nox -s ci`/`nox -s bench` wrote\n"
    "python -m harness bench list --json -",
    "numerics": "python -m harness numerics run attention --repeat 2",
    "preflight": "python -m harness preflight --backend cuda --gpus 2",
    "workflows": "python -m harness workflows --write",
    "cleanup": "python -m harness cleanup --dry-run",
    "store": "python -m harness store push --to postgresql://kiln@HOST/kiln",
    "site": "python -m harness site --out results/site   # then open results/site/index.html",
    "trust": "python -m harness trust",
    "settings": "python -m harness settings --md   # --write refreshes docs/settings.md, --check compares",
}


def _usage() -> str:
    width = max(map(len, VERBS))
    lines = ["usage: python -m harness <verb> [options]", "", "verbs:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in VERBS.items()]
    lines += ["", "`python -m harness <verb> --help` shows a verb's options.", "", EXIT_CODES_EPILOG]
    return "\n".join(lines)


def _entry(module: object, verb: str, what: str):
    specific = getattr(module, f"cli_{verb}_{what}", None)
    return specific or getattr(module, f"cli_{what}")


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the verb's module; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return EXIT_OK if argv else EXIT_USAGE
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"harness: error: unknown verb {verb!r}; known: {', '.join(VERBS)}", file=sys.stderr)
        return EXIT_USAGE
    module_name, help_ = VERBS[verb]

    def run() -> int:
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"python -m harness {verb}", description=help_)
        _entry(module, verb, "add_arguments")(parser)
        conventions.finish(parser, EXAMPLES.get(verb), getattr(module, "SUB_EXAMPLES", None))
        args = parser.parse_args(rest)
        conventions.apply(args)
        from harness import trust

        trust.resolve()  # a KILN_CACHE_SCOPE that would widen the job's trust: one line, exit 2, before anything
        from harness.commands import scope_this_process

        scope_this_process()  # this process's compiler caches (and its children's) are its scope's
        if getattr(args, "store", None) or getattr(args, "store_strict", False):
            from harness.store.cli import apply_store_flags

            apply_store_flags(args)  # `--store URL` / `--store-strict`: the settings of this process
        if (verb in COMPILING_VERBS and getattr(args, "action", None) != "compare") or (
            verb == "flakes" and _flakes_run_natively(args)
        ):
            require_compiler_settings()  # one line, exit 2, before any kernel or worker starts
        return int(_entry(module, verb, "main")(args) or 0)

    return guarded(verb, run)


def _flakes_run_natively(args: argparse.Namespace) -> bool:
    """Whether `flakes` runs the tests in this machine's Python (`--native`, or KILN_NATIVE=1 without the flag),
    where kiln's settings of this process are the ones its tests compile with."""
    from harness.suites.place import NativePlace, chosen

    return isinstance(chosen(getattr(args, "native", None)), NativePlace)


def with_exit_codes(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The shared tail of `parser`'s help and every sub-verb's under it: the exit codes (EXIT_CODES_EPILOG) and
    `--github-summary` (harness.conventions.finish, without an example)."""
    return conventions.finish(parser)


if __name__ == "__main__":
    sys.exit(main())
