"""Running the shards of one run at once on one machine: `python -m harness run --shards N|auto
[--gpus-per-shard K]`.

The image is built once (container mode); then each shard is its own `python -m harness run --shard I/N
--devices IDS --results RUN/shard-I --quiet` process (one pytest process at a time inside it, as always), pinned
to its GPUs (harness.shard.pin_devices), its output in RUN/shard-I.log and its summary lines echoed with a
`[shard I/N]` prefix. A shard that runs past the time its suites may take is killed and reported as hung; one
that dies is reported as crashed; the others' results stand. At the end (or on Ctrl-C/SIGTERM, which stops
every shard) RUN holds one merged report (harness.merge). Each shard reruns its own failed tests alone
(harness.retries; `--retries N` is passed on) and its run.json carries their verdicts, which the merged report
reads; the shards record nothing into the test history, the merged run is recorded once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness.commands import with_pythonpath
from harness.exc import HarnessError, RunInterrupted
from harness.matrix import Retries
from harness.merge import ShardProcess, merge_shards, shard_dir_name
from harness.process import die_with_parent, kill_group
from harness.settings import PACKAGE_ROOT, settings
from harness.shard import Shard

GRACE_S = 60  # a stopped shard gets this long to kill its pytest/container and mark its run incomplete
SLACK_S = 120  # on top of environment capture, health check and suites: reports, container start and removal
KILL_S = 15  # per suite: killing a suite that ran past its timeout


def shard_argv(backend: str, shard: Shard, devices: Sequence[str], folder: Path, *, native: bool,
               suites: Sequence[str] | None, image_tag: str | None, base_image: str | None, extra: Sequence[str],
               health: bool, save_numerics: bool, durations: Path | None,
               retries: Retries | None = None) -> list[str]:
    """The `python -m harness run` command line of one shard (it records nothing into the test history: the
    merged run is recorded)."""
    argv = [sys.executable, "-m", "harness", "run", "--backend", backend, "--shard", str(shard),
            "--results", str(folder), "--quiet", "--no-history"]
    if retries is not None:
        argv += ["--retries", str(retries.attempts)]
    argv += ["--native"] if native else ["--image", str(image_tag)]
    if base_image and not native:
        argv += ["--base-image", base_image]
    if devices:
        argv += ["--devices", ",".join(devices)]
    if durations is not None:
        argv += ["--durations", str(durations)]
    if not health:
        argv.append("--no-health")
    if save_numerics:
        argv.append("--save-numerics")
    for suite in suites or ():
        argv += ["--suite", suite]
    return [*argv, "--", *extra] if extra else argv


def shard_timeout_s(b: matrix_mod.Backend, n_suites: int, retries: Retries | None = None) -> float:
    """How long a shard may take before it counts as hung: environment capture, health check, each suite with
    the reruns of its failed tests (at most `max_tests` x `attempts` of them, each within its own limit)."""
    from harness.retries import retry_timeout_s

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


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so the same cleanup runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def run_shards(backend_name: str, groups: Sequence[Sequence[str]], *, native: bool, run_dir: Path,
               suites: Sequence[str] | None = None, image_tag: str | None = None, base_image: str | None = None,
               extra: Sequence[str] = (), health: bool = True, save_numerics: bool = False,
               durations: Path | None = None, echo: bool = True, timeout_s: float | None = None,
               retries: Retries | None = None, history: Path | None = None,
               record_history: bool = True) -> tuple[Path, int]:
    """Run len(groups) shards at once, shard I pinned to GPU ids groups[I-1]; merge them into `run_dir`.
    A shard still running after `timeout_s` (default: `shard_timeout_s`) is stopped and reported as hung.
    `retries`: how the shards rerun failed tests (None: the matrix's); a complete merged run is recorded into
    the test history `history` (None: the default store) unless `record_history` is False.
    Returns (run folder, exit code: 0 when the merged run is complete and green (flaky tests allowed), else 1)."""
    from harness import health as health_mod
    from harness import image as image_mod
    from harness import report

    m = matrix_mod.load()
    b = m.backend(backend_name)
    unknown = [s for s in suites or () if s not in m.suites]
    if unknown:
        raise HarnessError(f"unknown suite(s) {', '.join(unknown)}; the matrix lists {', '.join(m.suites)}")
    quarantine = report.load_quarantine(settings().root)
    if not native:
        health_mod.require_host_devices(b)
        image_mod.require_docker()
        if image_tag:
            if not image_mod.image_id(image_tag):
                raise HarnessError(f"image {image_tag} is not present locally")
        else:
            built = image_mod.build(b, base_image=base_image)  # once, not once per shard
            image_tag, base_image = built.tag, built.base_image
    count = len(groups)
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    mode = "native" if native else "container"
    history_db = (history or settings().history_db).resolve() if record_history else None
    base = {"backend": b.name, "mode": mode, "src": str(settings().root),
            "history": str(history_db) if history_db else None, "quarantine": report.quarantine_json(quarantine)}
    timeout_s = timeout_s or shard_timeout_s(b, len(suites or m.suites), retries or m.retries_for(b))
    env = with_pythonpath(dict(os.environ), PACKAGE_ROOT)
    env["KILN_NATIVE"] = "1" if native else "0"
    label = f"{b.name}/{mode}"
    print(f"{count} shards [{label}] -> {run_dir}" + "".join(
        f"; shard {i}: gpu {','.join(g)}" for i, g in enumerate(groups, 1) if g), flush=True)

    procs: dict[int, subprocess.Popen] = {}
    started: dict[int, float] = {}
    ended: dict[int, ShardProcess] = {}
    readers: list[threading.Thread] = []

    def pump(index: int, proc: subprocess.Popen, log: Path) -> None:
        with open(log, "w", encoding="utf-8", errors="replace") as fh:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                if echo:
                    sys.stdout.write(f"[shard {index}/{count}] {line}")
                    sys.stdout.flush()

    def finish(index: int, hung: bool = False) -> None:
        proc = procs[index]
        ended[index] = ShardProcess(proc.returncode, round(time.monotonic() - started[index], 2), hung,
                                    tuple(groups[index - 1]))

    t0 = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    interrupted = ""
    try:
        for index, devices in enumerate(groups, 1):
            folder = run_dir / shard_dir_name(index)
            argv = shard_argv(b.name, Shard(index, count), devices, folder, native=native, suites=suites,
                              image_tag=image_tag, base_image=base_image, extra=extra, health=health,
                              save_numerics=save_numerics, durations=durations, retries=retries)
            procs[index] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                            cwd=settings().root, text=True, errors="replace", start_new_session=True,
                                            preexec_fn=die_with_parent)  # noqa: PLW1509 - no shard outlives the harness
            started[index] = time.monotonic()
            reader = threading.Thread(target=pump, args=(index, procs[index], run_dir / f"{folder.name}.log"),
                                      daemon=True)
            reader.start()
            readers.append(reader)
        while len(ended) < count:
            for index, proc in procs.items():
                if index in ended:
                    continue
                if proc.poll() is not None:
                    finish(index)
                elif time.monotonic() - started[index] > timeout_s:
                    stop_all([proc], GRACE_S)
                    finish(index, hung=True)
            time.sleep(0.2)
    except KeyboardInterrupt as e:
        interrupted = "terminated" if isinstance(e, _Terminated) else "interrupted"
        stop_all([p for i, p in procs.items() if i not in ended], GRACE_S)
        for index in procs:
            if index not in ended:
                finish(index)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for reader in readers:
            reader.join(timeout=10)
    summary = merge_shards(run_dir, {i: run_dir / shard_dir_name(i) for i in range(1, count + 1)}, count,
                           processes=ended, base=base, wall_s=time.monotonic() - t0,
                           reason=f"run {interrupted}" if interrupted else "")
    if interrupted:
        raise RunInterrupted(f"run {interrupted}; the shards' results so far are merged in {run_dir} (marked "
                             "incomplete)")
    from harness.collect import load_run

    if history_db is not None and summary.status == "complete":
        from harness.history import record_or_warn

        record_or_warn(history_db, run_dir)
        summary = report.write_reports(run_dir)  # now with the history's lines
    print(report.render_text(load_run(run_dir)), end="", flush=True)
    return run_dir, 0 if summary.ok else 1
