"""Running the shards of one run at once on one machine: `python -m harness run --shards N|auto
[--gpus-per-shard K]`.

The image is built once (container mode); then each shard is its own `python -m harness run --shard I/N
--devices IDS --results RUN/shard-I --quiet` process (one pytest process at a time inside it, as always), pinned
to its GPUs (the place's `pin`, harness.suites.place), its output in RUN/shard-I.log and its summary lines echoed with a
`[shard I/N]` prefix. The GPUs split are the runner's visible set only (harness.gpus: a runner given GPUs 2,3
runs shard 1 on 2 and shard 2 on 3). A shard that runs past the time its suites may take is killed and reported as hung; one
that dies is reported as crashed; the others' results stand. At the end (or on Ctrl-C/SIGTERM, which stops
every shard) RUN holds one merged report (harness.suites.merge). Each shard reruns its own failed tests alone
(harness.suites.retries; `--retries N` is passed on) and its run.json carries their verdicts, which the merged report
reads; the shards record nothing into the test history, the merged run is recorded once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness.commands import with_pythonpath
from harness.exc import HarnessError, RunInterrupted
from harness.matrix import Retries
from harness.process import Terminated, interrupts_after, kill_group, sigterm_interrupts, spawn
from harness.record import RunRecord, RunStatus
from harness.settings import PACKAGE_ROOT, settings
from harness.suites.merge import ShardProcess, merge_shards, shard_dir_name
from harness.suites.options import RunOptions
from harness.suites.place import Place
from harness.suites.shard import Shard

GRACE_S = 60  # a stopped shard gets this long to kill its pytest/container and mark its run incomplete
SLACK_S = 120  # on top of environment capture, health check and suites: reports, container start and removal
KILL_S = 15  # per suite: killing a suite that ran past its timeout


def shard_argv(
    backend: str, shard: Shard, devices: Sequence[str], folder: Path, place: Place, options: RunOptions
) -> list[str]:
    """The `python -m harness run` command line of one shard at `place` (its `--native` or `--image`), with the
    run's `options` (it records nothing into the test history: the merged run is recorded)."""
    argv = [
        sys.executable,
        "-m",
        "harness",
        "run",
        "--backend",
        backend,
        "--shard",
        str(shard),
        "--results",
        str(folder),
        "--quiet",
        "--no-history",
    ]
    if options.retries is not None:
        argv += ["--retries", str(options.retries.attempts)]
    argv += place.cli_args()
    if devices:
        argv += ["--devices", ",".join(devices)]
    if options.durations is not None:
        argv += ["--durations", str(options.durations)]
    if not options.health:
        argv.append("--no-health")
    if options.save_numerics:
        argv.append("--save-numerics")
    for suite in options.suites or ():
        argv += ["--suite", suite]
    return [*argv, "--", *options.extra] if options.extra else argv


def shard_timeout_s(b: matrix_mod.Backend, n_suites: int, retries: Retries | None = None) -> float:
    """How long a shard may take before it counts as hung: environment capture, health check, each suite with
    the reruns of its failed tests (at most `max_tests` x `attempts` of them, each within its own limit)."""
    from harness.suites.retries import retry_timeout_s

    reruns = retries.attempts * retries.max_tests * (retry_timeout_s(b) + KILL_S) if retries else 0
    return 2 * b.timeouts.health_s + n_suites * (b.timeouts.suite_s + KILL_S + reruns) + SLACK_S


def stop_all(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every process group once (each shard then stops its suite and marks its run incomplete; a
    second signal would cut that short) and SIGCONT (a stopped process acts on it only then), SIGKILL those
    still there after `grace_s`."""
    for proc in procs:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(proc, 0)  # SIGTERM again, then at once SIGKILL


@dataclass(kw_only=True)
class ShardsState:
    """A `--shards` run in progress: what was asked (the backend, each shard's GPUs, the place, the run's
    options), the shard processes, what became of them, the verdict. Each step of SHARD_STEPS takes and
    returns it."""

    b: matrix_mod.Backend
    m: matrix_mod.Matrix
    groups: Sequence[Sequence[str]]
    place: Place
    options: RunOptions
    run_dir: Path
    timeout_s: float | None = None
    history_db: Path | None = None
    base: RunRecord | None = None
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, ShardProcess] = field(default_factory=dict)
    readers: list[threading.Thread] = field(default_factory=list)
    interrupted: str = ""
    t0: float = field(default_factory=time.monotonic)
    summary: Any = None  # the merged run's report.Summary

    @property
    def count(self) -> int:
        return len(self.groups)

    @property
    def mode(self) -> str:
        return self.place.mode

    @property
    def suites(self) -> Sequence[str] | None:
        return self.options.suites

    def finish(self, index: int, hung: bool = False) -> None:
        """Note shard `index`'s process as ended (or hung): exit status, wall seconds, GPUs."""
        proc = self.procs[index]
        self.ended[index] = ShardProcess(
            proc.returncode,
            round(time.monotonic() - self.started[index], 2),
            hung,
            tuple(self.groups[index - 1]),
        )


def check_shards(st: ShardsState) -> ShardsState:
    """The suites named exist; the quarantine file reads (it is recorded in the merged run)."""
    from harness.suites import report

    unknown = [s for s in st.suites or () if s not in st.m.suites]
    if unknown:
        raise HarnessError(
            f"unknown suite(s) {', '.join(unknown)}; the matrix lists {', '.join(st.m.suites)}"
        )
    quarantine = report.load_quarantine(settings().root)
    st.base = RunRecord(
        "",
        st.b.name,
        RunStatus.RUNNING,
        mode=st.mode,
        src=str(settings().root),
        history=str(st.history_db) if st.history_db else None,
        quarantine=report.quarantine_json(quarantine),
    )
    return st


def shards_preflight(st: ShardsState) -> ShardsState:
    """Before the image: driver, every shard's GPUs visible, docker, free disk (harness.checks.preflight)."""
    need = len({gpu for group in st.groups for gpu in group})
    print(st.place.preflight(st.b, need_gpus=max(1, need), results=st.run_dir).line(), flush=True)
    return st


def shards_image(st: ShardsState) -> ShardsState:
    """The place made ready once for every shard: in container mode the image built (not once per shard) or
    the one given, which must be present."""
    st.place = st.place.prepared(st.b)
    return st


def launch_shards(st: ShardsState) -> ShardsState:
    """Each shard's `harness run --shard I/N` process, pinned to its GPUs, its output in RUN/shard-I.log."""
    st.run_dir.mkdir(parents=True, exist_ok=True)
    st.timeout_s = st.timeout_s or shard_timeout_s(
        st.b, len(st.suites or st.m.suites), st.options.retries or st.m.retries_for(st.b)
    )
    env = {**with_pythonpath(dict(os.environ), PACKAGE_ROOT), **st.place.cli_env()}
    print(
        f"{st.count} shards [{st.b.name}/{st.mode}] -> {st.run_dir}"
        + "".join(f"; shard {i}: gpu {','.join(g)}" for i, g in enumerate(st.groups, 1) if g),
        flush=True,
    )
    for index, devices in enumerate(st.groups, 1):
        folder = st.run_dir / shard_dir_name(index)
        argv = shard_argv(st.b.name, Shard(index, st.count), devices, folder, st.place, st.options)
        with interrupts_after():  # a stop arriving while the shard starts finds it in st.procs
            spawned = spawn(
                argv,
                st.run_dir / f"{folder.name}.log",
                env=env,
                cwd=settings().root,
                echo=st.options.echo,
                prefix=f"[shard {index}/{st.count}] ",
            )
            st.procs[index] = spawned.proc
            st.started[index] = time.monotonic()
            st.readers.append(spawned.reader)
    return st


def wait_shards(st: ShardsState) -> ShardsState:
    """Until every shard has ended; one past `timeout_s` is stopped as hung."""
    while len(st.ended) < st.count:
        for index, proc in st.procs.items():
            if index in st.ended:
                continue
            if proc.poll() is not None:
                st.finish(index)
            elif time.monotonic() - st.started[index] > (st.timeout_s or 0):
                stop_all([proc], GRACE_S)
                st.finish(index, hung=True)
        time.sleep(0.2)
    return st


def merge_step(st: ShardsState) -> ShardsState:
    """The shards' folders merged into RUN with one report (harness.suites.merge)."""
    st.summary = merge_shards(
        st.run_dir,
        {i: st.run_dir / shard_dir_name(i) for i in range(1, st.count + 1)},
        st.count,
        processes=st.ended,
        base=st.base,
        wall_s=time.monotonic() - st.t0,
        reason=f"run {st.interrupted}" if st.interrupted else "",
    )
    if st.interrupted:
        raise RunInterrupted(
            f"run {st.interrupted}; the shards' results so far are merged in {st.run_dir} (marked incomplete)"
        )
    return st


def history_step(st: ShardsState) -> ShardsState:
    """A complete merged run into the test history, then its reports again (with the history's lines)."""
    from harness.suites import report

    if st.history_db is not None and st.summary.status == "complete":
        from harness.suites.collect import load_run
        from harness.suites.history import record_or_warn

        run = load_run(st.run_dir)
        record_or_warn(st.history_db, run)
        st.summary = report.write_reports(run)
    return st


def report_step(st: ShardsState) -> ShardsState:
    from harness.suites import report
    from harness.suites.collect import load_run

    print(report.render_text(load_run(st.run_dir)), end="", flush=True)
    return st


Step = tuple[str, Callable[[ShardsState], ShardsState]]
SETUP_STEPS: tuple[Step, ...] = (
    ("check", check_shards),
    ("pre-flight", shards_preflight),
    ("image", shards_image),
)
SHARD_STEPS: tuple[Step, ...] = (
    ("launch", launch_shards),
    ("wait", wait_shards),
)  # under the interrupt supervisor
END_STEPS: tuple[Step, ...] = (("merge", merge_step), ("history", history_step), ("report", report_step))


def run_shards(
    backend_name: str,
    groups: Sequence[Sequence[str]],
    place: Place,
    options: RunOptions,
    timeout_s: float | None = None,
) -> tuple[Path, int]:
    """Run len(groups) shards at once at `place`, shard I pinned to GPU ids groups[I-1]; merge them into
    `options.run_dir` (required): the steps of SETUP_STEPS, SHARD_STEPS (Ctrl-C/SIGTERM stops every shard), then
    END_STEPS. A shard still running after `timeout_s` (default: `shard_timeout_s`) is stopped and reported as
    hung. `options.retries`: how the shards rerun failed tests (None: the matrix's); a complete merged run is
    recorded into the test history `options.history` (None: the default store) unless `options.record_history`
    is False; `options.shard`, `devices` and `isolate` are not used (each shard's own).
    Returns (run folder, exit code: 0 when the merged run is complete and green (flaky tests allowed), else 1)."""
    if options.run_dir is None:
        raise HarnessError("a --shards run needs its run folder")
    m = matrix_mod.load()
    st = ShardsState(
        b=m.backend(backend_name),
        m=m,
        groups=groups,
        place=place,
        options=options,
        run_dir=Path(options.run_dir).resolve(),
        timeout_s=timeout_s,
        history_db=options.history_location(),
    )
    for _, step in SETUP_STEPS:
        st = step(st)
    try:
        with sigterm_interrupts():
            for _, step in SHARD_STEPS:
                st = step(st)
    except KeyboardInterrupt as e:
        st.interrupted = "terminated" if isinstance(e, Terminated) else "interrupted"
        stop_all([p for i, p in st.procs.items() if i not in st.ended], GRACE_S)
        for index in st.procs:
            if index not in st.ended:
                st.finish(index)
    finally:
        for reader in st.readers:
            reader.join(timeout=10)
    for _, step in END_STEPS:
        st = step(st)
    return st.run_dir, 0 if st.summary.ok else 1
