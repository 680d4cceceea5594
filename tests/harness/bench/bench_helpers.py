"""Helpers for the bench tests: synthetic samples and stored runs built without timing anything."""

from __future__ import annotations

import random
import uuid

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
