"""Running the suites: one pytest process per suite, in the backend's container or natively.

Terms:
  inner command  the `python -m pytest ...` argv that runs inside the container (or, with this
                 machine's Python, natively). Built by `pytest_argv`; identical in both modes.
  container mode `docker run --rm --init --network none` with the source tree mounted read-only at /src,
                 the output folder at /results, the backend's container options (GPU flags: only the
                 runner's visible GPUs, harness.gpus) and env; run as the runner's uid:gid (nothing
                 world-writable), labelled with the job, with the per-runner compile cache at /cache.
                 The harness kills the container when the suite timeout passes (on top of
                 pytest-timeout's per-test limit) and removes it whatever happens.
  native mode    the inner command with this machine's Python, from the source tree, same env.
  run folder     results/<run id>/ (see harness.results); run.json records status
                 running -> complete, or incomplete when interrupted (what was written is kept).
  shards         `--shard I/N` runs shard I of N of every suite's tests (harness.suites.shard, by a pytest plugin in
                 each suite's process); `--shards N|auto` runs N shards at once, each pinned to its GPUs,
                 into shard-I/ folders merged into one report (harness.suites.sharded, harness.suites.merge).
  retries        a failed suite test is run again alone in a fresh process (harness.suites.retries; the matrix's
                 `retries`, `--retries N`): passed on a retry = flaky (reported, does not fail the run),
                 failed every time = failing. Their attempts go into the suite's entry of run.json.
  history        a complete run is recorded into the test history (harness.suites.history; `--history DB`, else
                 KILN_HISTORY_DB, else history/history.sqlite in the lasting data folder outside the checkout,
                 harness.settings.data_dir; `--no-history` skips it), so the report can
                 say "failed K of the last N runs" and flake rates build up.

Command lines come from `harness.commands`; functions other modules call: `execute`, `run_pytest`,
`run_python_module`, `run_suite_isolated`, `retry_failed` (harness.suites.steps runs the suites: `harness run`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import os
import re
import secrets
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.suites import isolation
from harness import matrix as matrix_mod
from harness import results as res
from harness.suites import retries as retries_mod
from harness import gpus
from harness.commands import (BACKEND_LABEL, CONTAINER_RESULTS, JOB_LABEL, compile_cache_dir,
                              container_argv, native_cache_env, native_command, pytest_argv, scope_env, suite_env)
from harness.exc import HarnessError, MissingTool
from harness.matrix import Backend, Matrix, Retries
from harness.process import execute
from harness.record import ProcessRecord, RetryRecord, SuiteRecord, SuiteRetries, SuiteStatus, TestOutcome
from harness.settings import settings

EXIT_NO_TESTS = 5  # pytest: no tests collected


# ---- one pytest process ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PytestRun:
    """What one pytest invocation left behind: JUnit and log paths on the host, exit status."""

    name: str
    junit: Path
    log: Path
    returncode: int
    timed_out: bool
    duration_s: float
    argv: list[str]
    left: list[Any] = field(default_factory=list)  # processes it left running, ended (harness.leftovers.Proc)


def pytest_timeout_available() -> bool:
    """Whether this Python has pytest-timeout (native mode only; images always have it)."""
    return importlib.util.find_spec("pytest_timeout") is not None


def _check_native_python() -> bool:
    """Native mode needs pytest; without pytest-timeout per-test timeouts are off (warned)."""
    if importlib.util.find_spec("pytest") is None:  # the suites need torch and triton too: name all it lacks
        lacks = ", ".join(m for m in ("pytest", "torch", "triton") if importlib.util.find_spec(m) is None)
        raise MissingTool(f"pytest is not installed for {sys.executable} (it lacks {lacks}); native mode runs the "
                          "suites with this Python: drop KILN_NO_VENV (the sessions' shared venv .nox/kiln has them), "
                          "or install the project into it (pip install -e '.[test]' with the matrix's torch and triton)")
    if not pytest_timeout_available():
        warnings.warn("pytest-timeout is not installed: per-test timeouts are off, only the suite timeout "
                      "applies (pip install pytest-timeout)", stacklevel=3)
        return False
    return True


def _container_name(backend: str, name: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", name)[:40]
    return f"kiln-{backend}-{safe}-{secrets.token_hex(4)}"


def container_backend(b: Backend, env: dict[str, str]) -> tuple[Backend, dict[str, str]]:
    """(backend, env) of a container run: a GPU backend not yet confined to its GPUs (harness.gpus.pin: shards
    and `run` pin theirs) gets the runner's visible set, its renumbered variables added to `env`."""
    if gpus.vendor(b) is None or gpus.pinned(b):
        return b, env
    pinned = gpus.pin(b, native=False)
    return pinned, {**env, **{k: v for k, v in pinned.env.items() if k not in b.env}}


def container_extras(b: Backend, image: str | None) -> dict[str, Any]:
    """container_argv's runner options: the docker client, the runner's uid:gid (KILN_CONTAINER_USER), the
    job's labels, the compile-cache folder of this trust scope and image (made here, owned by the runner), the
    scope's variables and, for main's jobs only, the cache key (harness/trust.py)."""
    from harness.images.cleanup import mark_used

    s = settings()
    labels = {BACKEND_LABEL: b.name, **({JOB_LABEL: s.job_id} if s.job_id else {})}
    if image:
        mark_used(image)  # `harness cleanup` keeps an image a run started a container from lately
    cache = None
    if s.compile_cache is not None and image:
        cache = compile_cache_dir(s.compile_cache, s.cache_scope, toolchain_key(image))
        cache.mkdir(parents=True, exist_ok=True)
    holds_key = s.cache_scope in ("main", "local")  # harness.trust.Trust.holds_key
    key_file = os.environ.get("KILN_CACHE_KEY_FILE", "").strip() if holds_key else ""
    key_env = holds_key and bool(os.environ.get("KILN_CACHE_KEY", "").strip())
    return {"docker": s.docker, "user": s.container_user, "labels": labels, "cache": cache,
            "scope_vars": scope_env(s.cache_scope), "key_file": Path(key_file).expanduser() if key_file else None,
            "key_env": key_env}


HASH_TAG = re.compile(r":[0-9a-f]{16}$")  # harness.images.image's tags: the hash of the image's inputs


@functools.lru_cache(maxsize=32)
def toolchain_key(image: str) -> str:
    """The compile cache's key of `image`: its tag when it is a hash tag (`kiln-cuda:<inputs hash>`: torch,
    triton, the lock), else the tag and its local image id (`--image kiln-cuda:dev` rebuilt is another key)."""
    if HASH_TAG.search(image):
        return image
    from harness.images.image import image_id

    try:
        found = image_id(image)
    except (OSError, HarnessError):
        found = None
    return f"{image}-{found.split(':')[-1][:16]}" if found else image


def run_pytest(backend: Backend, targets: Sequence[str], out_dir: Path, name: str, *, native: bool,
               image: str | None = None, extra: Sequence[str] = (), m: Matrix | None = None,
               timeout_s: float | None = None, echo: bool = True, env_extra: dict[str, str] | None = None,
               watchdog: Callable[[], str | None] | None = None) -> PytestRun:
    """Run pytest once on `targets` (paths or node ids relative to the source root).

    JUnit lands in `out_dir/<name>.xml`, the output in `out_dir/<name>.log`. This is the step the
    suites, the flake session and others call; `extra` are more pytest arguments; `env_extra` more
    environment variables, where {out} stands for `out_dir` as pytest sees it; `watchdog` (process.execute)
    may stop the process early.
    """
    m = m or matrix_mod.load()
    container = _container_name(backend.name, name)  # container mode's (unused natively)
    src = settings().root
    out_dir = out_dir.resolve()  # docker needs absolute paths for bind mounts
    out_dir.mkdir(parents=True, exist_ok=True)
    seen_out = str(out_dir) if native else CONTAINER_RESULTS
    env = {**suite_env(m, backend), **{k: v.replace("{out}", seen_out) for k, v in (env_extra or {}).items()}}
    timeout_s = timeout_s or backend.timeouts.suite_s
    test_timeout = backend.timeouts.test_s
    junit, log = out_dir / f"{name}.xml", out_dir / f"{name}.log"
    junit.unlink(missing_ok=True)
    start = time.monotonic()
    left: list[Any] = []
    if native:
        if not _check_native_python():
            test_timeout = 0
        inner = pytest_argv(targets, junit=str(junit), test_timeout_s=test_timeout, extra=extra)
        argv, full_env = native_command(inner, {**native_cache_env(), **env}, src=src)
        rc, timed_out = execute(argv, log=log, timeout_s=timeout_s, env=full_env, cwd=src, echo=echo,
                                watchdog=watchdog, left=left)
    else:
        if not image:
            raise HarnessError("container mode needs an image tag (build one with `python -m harness image build`)")
        inner = pytest_argv(targets, junit=f"{CONTAINER_RESULTS}/{name}.xml", test_timeout_s=test_timeout,
                            extra=extra)
        cb, cenv = container_backend(backend, env)
        argv = container_argv(cb, image, inner, src=src, env=cenv, results=out_dir, name=container,
                              **container_extras(backend, image))
        rc, timed_out = execute(argv, log=log, timeout_s=timeout_s, container=container, echo=echo,
                                watchdog=watchdog)
    return PytestRun(name, junit, log, rc, timed_out, round(time.monotonic() - start, 2), argv, left)


def run_python_module(backend: Backend, module_args: Sequence[str], out_dir: Path, name: str, *,
                      native: bool, image: str | None, m: Matrix, timeout_s: float,
                      echo: bool = True, extra_env: dict[str, str] | None = None) -> int:
    """Run `python -m harness <module_args>` where the suites run (container or native); return exit code.
    Paths in `module_args` may use {out} for the output folder as seen by that process; `extra_env` is added
    to the suites' environment (what the host knows and a container cannot: the runner's name)."""
    src = settings().root
    out_dir = out_dir.resolve()  # docker needs absolute paths for bind mounts
    out_dir.mkdir(parents=True, exist_ok=True)
    container = _container_name(backend.name, name)  # container mode's (unused natively)
    env = {**suite_env(m, backend), **(extra_env or {})}
    if native:
        args = [a.replace("{out}", str(out_dir)) for a in module_args]
        argv, full_env = native_command(["python", "-m", "harness", *args], {**native_cache_env(), **env}, src=src)
        rc, _ = execute(argv, log=out_dir / f"{name}.log", timeout_s=timeout_s, env=full_env, cwd=src, echo=echo)
        return rc
    args = [a.replace("{out}", CONTAINER_RESULTS) for a in module_args]
    cb, cenv = container_backend(backend, env)
    argv = container_argv(cb, str(image), ["python", "-m", "harness", *args], src=src, env=cenv,
                          results=out_dir, name=container, **container_extras(backend, str(image)))
    rc, _ = execute(argv, log=out_dir / f"{name}.log", timeout_s=timeout_s, container=container, echo=echo)
    return rc


# ---- the suites ------------------------------------------------------------------------------------------


def suite_status(run: PytestRun, tests: list[TestOutcome]) -> str:
    """passed / failed / empty / timeout / error for one suite run."""
    if run.timed_out:
        return "timeout"
    if run.returncode == EXIT_NO_TESTS and not tests:
        return "empty"
    if any(t.failing for t in tests) or run.returncode == 1:
        return "failed"
    if run.returncode != 0:
        return "error"
    return "passed"


def new_run_dir(backend: str, mode: str, results_root: Path | None = None) -> Path:
    """results/<UTC time>-<backend>-<mode>[-n]: a fresh folder."""
    root = results_root or settings().results_root
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = root / f"{stamp}-{backend}-{mode}"
    root.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:  # mkdir is the claim: two runs started in one second (parallel test workers) get two folders
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = Path(f"{base}-{n}")


def _error_line(log: Path) -> str:
    """The most telling line of a log: the last one that mentions an error, else the last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1]


def run_suite_isolated(b: Backend, suite: str, suite_dir: Path, *, seen: str, native: bool, image: str | None,
                       extra: Sequence[str], m: Matrix, echo: bool, env_extra: dict[str, str] | None,
                       on_interrupt: Callable[[SuiteRecord, list[TestOutcome], str | None], None]
                       ) -> tuple[SuiteRecord, list[TestOutcome], Path]:
    """One suite under crash isolation (harness.suites.isolation): (its record, tests, the suite's JUnit).
    On Ctrl-C/SIGTERM the record of what finished goes to `on_interrupt(record, tests, running test)` first."""
    junit = suite_dir / f"{suite}.xml"

    def attempt(k: int, name: str, more: list[str], timeout_s: float, watchdog: Callable[[], str | None]):
        return run_pytest(b, [f"tests/{suite}"], suite_dir, name, native=native, image=image, extra=[*extra, *more],
                          m=m, timeout_s=timeout_s, echo=echo, env_extra=env_extra, watchdog=watchdog)

    def record_of(sr: isolation.SuiteRun, status: str) -> SuiteRecord:
        isolation.write_junit(junit, suite, sr.finished)
        return SuiteRecord(
            suite, SuiteStatus(status), f"suites/{junit.name}", f"suites/{suite}.log",
            sr.attempts[-1].returncode if sr.attempts else None, sr.timed_out,
            round(sum(a.duration_s for a in sr.attempts), 2), res.counts(sr.tests()),
            tuple(sr.attempts[0].argv) if sr.attempts else (),
            attempts=tuple(ProcessRecord(f"suites/{a.log.name}", a.returncode, a.duration_s) for a in sr.attempts),
            crashes=tuple(sr.crashes), not_run=tuple(sr.not_run), collect_failed=sr.collect_failed,
            ended_badly=sr.ended_badly)

    sr = isolation.run_suite(attempt, suite, suite_dir, seen, suite_s=b.timeouts.suite_s, test_s=b.timeouts.test_s,
                             on_interrupt=lambda part: on_interrupt(record_of(part, "interrupted"), part.tests(),
                                                                    part.running))
    return record_of(sr, sr.status()), sr.tests(), junit


def run_suite_plain(b: Backend, suite: str, suite_dir: Path, *, native: bool, image: str | None,
                    extra: Sequence[str], m: Matrix, echo: bool, env_extra: dict[str, str] | None
                    ) -> tuple[SuiteRecord, list[TestOutcome], Path]:
    """One suite as one pytest process, no isolation (`--no-isolation`: what isolation costs is measured
    against this); a crash loses the suite's JUnit."""
    run = run_pytest(b, [f"tests/{suite}"], suite_dir, suite, native=native, image=image, extra=extra, m=m,
                     echo=echo, env_extra=env_extra)
    tests = res.parse_junit(run.junit, settings().root) if run.junit.exists() else []
    status = suite_status(run, tests)
    if not run.junit.exists() and status == "passed":
        status = "error"
    return SuiteRecord(suite, SuiteStatus(status), f"suites/{run.junit.name}", f"suites/{run.log.name}",
                       run.returncode, run.timed_out, run.duration_s, res.counts(tests), tuple(run.argv)), tests, \
        run.junit


def retry_failed(b: Backend, suite: str, failed: Sequence[TestOutcome], policy: Retries, *, run_dir: Path,
                 junit: Path, native: bool, image: str | None, m: Matrix, extra: Sequence[str] = (),
                 echo: bool = False, quarantined: Callable[[str], bool] = lambda _: False) -> SuiteRetries:
    """Rerun each failed test of one suite alone (its node id, a fresh `run_pytest`), up to `policy.attempts`
    times until it passes; returns the suite record's `retries` (harness.suites.retries).

    Tests outside the quarantine go first; past `policy.max_tests` the rest stay failing without a rerun.
    `extra` are the run's own pytest arguments (never the shard options: one node id is one test).
    """
    out_dir = junit.parent / retries_mod.RETRY_DIR
    ordered = retries_mod.order(failed, quarantined)
    chosen = ordered[:policy.max_tests] if policy.attempts > 0 else []
    first = {t.id: t for t in reversed(failed)}  # the first record of each id
    extra = [a for a in extra if not a.startswith("--junitxml")]
    root = settings().root
    seen = str(out_dir.resolve()) if native else CONTAINER_RESULTS  # the reruns' folder as pytest sees it
    retried = []
    for k, test_id in enumerate(chosen, 1):
        tries = [retries_mod.write_first_attempt(out_dir, run_dir, suite, k, junit, first[test_id], root)]
        for n in range(1, policy.attempts + 1):
            name = f"{suite}-{k}.{n}"  # a rerun that hangs is stopped by the same watchdog as the suite's tests
            journal = ["-p", "harness.suites.journal_plugin", f"--kiln-journal={seen}/{name}.journal"]
            watchdog = isolation.make_watchdog(out_dir / f"{name}.journal", b.timeouts.test_s, [])
            run = run_pytest(b, [test_id], out_dir, name, native=native, image=image, extra=[*extra, *journal],
                             m=m, timeout_s=retries_mod.retry_timeout_s(b), echo=echo, watchdog=watchdog)
            tries.append(retries_mod.rerun_attempt(n, test_id, run, run_dir, root))
            if tries[-1].outcome not in res.FAILING:
                break
        r = RetryRecord(test_id, suite, retries_mod.classify([a.outcome for a in tries]), tuple(tries))
        retried.append(r)
        print(f"  retried {test_id} alone: {r.status.upper()}: {r.describe()}", flush=True)
    return retries_mod.suite_retries(policy.attempts, policy.max_tests, retried, ordered[len(chosen):])


def retry_line(suite: str, label: str, found: SuiteRetries) -> str:
    """`suite alpha [cpu/native] retried 2 failed tests alone: 1 flaky, 1 failing (1 more not retried)`."""
    statuses = [str(t.status) for t in found.tests]
    body = ", ".join(f"{statuses.count(s)} {s}" for s in (retries_mod.FLAKY, retries_mod.FAILING)
                     if statuses.count(s)) or "none"
    more = f" ({len(found.not_retried)} more not retried: past max_tests {found.max_tests})" \
        if found.not_retried else ""
    return (f"suite {suite} [{label}] retried {len(statuses)} failed test(s) alone, up to {found.attempts} "
            f"time(s) each: {body}{more}")


# ---- CLI: `python -m harness detect` (`run` is harness.suites.steps') -------------------------------------------


def detect_mode() -> str:
    """`container` when a docker daemon answers, else `native`."""
    from harness.images import image
    from harness.exc import DockerError

    try:
        image.require_docker()
    except DockerError:
        return "native"
    return "container"


def cli_detect_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--field", help="print this matrix field of the detected backend instead of its name")
    p.add_argument("--mode", action="store_true",
                   help="print `container` when a docker daemon answers, else `native`, instead")


def cli_detect_main(args: argparse.Namespace) -> int:
    """Print the backend this machine supports: the first GPU backend whose devices exist, else cpu."""
    if args.mode:
        print(detect_mode())
        return 0
    m = matrix_mod.load()
    name = matrix_mod.detect_backend(m)
    print(name if not args.field else getattr(m.backend(name), args.field))
    return 0
