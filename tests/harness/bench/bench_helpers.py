"""Helpers for the bench tests: synthetic samples and stored runs built without timing anything, and folders
that one real (costly) bench command fills once per test session for several tests to read."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from pathlib import Path

from harness.bench.core.records import Result, RunInfo
from harness.bench.stores.store import Store, now


def samples(median: float, n: int = 120, noise: float = 0.02, seed: int = 0) -> list[float]:
    """Deterministic, slightly skewed timing-like samples around `median`."""
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, noise)) + abs(rng.gauss(0, noise * median)) for _ in range(n)]


def make_run(
    device: str = "cpu",
    ref: str = "main",
    commit: str = "abc123",
    profile: str = "tiny",
    device_name: str | None = None,
) -> RunInfo:
    return RunInfo(
        id=None,
        uid=uuid.uuid4().hex,
        created_at=now(),
        profile=profile,
        device=device,
        device_name=device_name or f"{device}: test",
        compilers=["inductor", "eager"],
        git_ref=ref,
        git_commit=commit,
    )


def make_results(
    medians: dict[tuple[str, str], float], seed: int = 0, hashes: dict[str, str] | None = None, n: int = 120
) -> list[Result]:
    out = []
    for i, ((w, c), m) in enumerate(medians.items()):
        out.append(
            Result(
                w,
                c,
                (hashes or {}).get(w, f"h-{w}"),
                samples=samples(m, n=n, seed=seed * 1000 + i),
                bytes=4096,
                timer="wall",
            )
        )
    return out


def store_run(store: Store, results: list[Result], complete: bool = True, **kw) -> RunInfo:
    run = make_run(**kw)
    store.begin_run(run)
    for r in results:
        store.add_result(run.id, r)
    if complete:
        store.finish_run(run.id)
        run.status = "complete"
    return run


WORKLOADS = [f"w{i:02d}" for i in range(24)]


def medians(
    scale: dict[tuple[str, str], float] | None = None, eager: float = 10_000.0
) -> dict[tuple[str, str], float]:
    """24 workloads under inductor and eager with fixed medians; `scale` multiplies chosen keys."""
    m: dict[tuple[str, str], float] = {}
    for i, w in enumerate(WORKLOADS):
        m[(w, "inductor")] = eager * (0.5 + i / 48)
        m[(w, "eager")] = eager * (1 + i / 24)
    for k, f in (scale or {}).items():
        m[k] *= f
    return m


# one real tiny model on CPU: kiln (Triton's interpreter) vs eager, kiln's cold and warm compile times from fresh
# subprocesses, kiln-cg named so that its skip note is printed; the report's JSON on stdout (`--json -`)
TINY_MODEL_ARGS = [
    "--device",
    "cpu",
    "--profile",
    "tiny",
    "--only",
    "bert.infer.fp32",
    "--compilers",
    "kiln,kiln-cg",
    "--compile-times",
    "kiln",
    "--target-s",
    "0.2",
    "--rounds",
    "2",
]


def once_per_session(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder that `make(folder)` fills once per pytest session and every test of the session reads: with
    pytest-xdist, the workers share it (it lies beside their own temporary folders, and a file lock lets one
    worker make it while the others wait). A `make` that raised raises again, with its message, in every test
    that asks for the folder afterwards. Tests that change what the folder holds copy it first."""
    import fcntl
    import shutil
    import traceback

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, failed = root / f"once-{name}", root / f"once-{name}.failed"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            raise RuntimeError(f"making the shared folder {name!r} failed earlier:\n{failed.read_text()}")
        if not (folder / ".done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                failed.write_text(traceback.format_exc())
                raise
            (folder / ".done").touch()
    return folder
