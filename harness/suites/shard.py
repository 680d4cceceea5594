"""Sharding the suites: which tests shard I of N runs, the durations that balance the shards, the GPUs each
shard gets.

Terms:
  shard       `I/N`: the I-th (1-based) of N disjoint parts of every suite's tests. Each suite's pytest
              process loads `harness.suites.shard_plugin`, which deselects the tests outside the shard after
              collection (in the same process and environment as the run, so every shard sees the same
              tests); `assign` decides, from the collected node ids alone, so every test runs in exactly
              one shard.
  durations   seconds per test id from earlier runs' JUnit files, a JSON file
              `{"schema": 1, "tests": {node id: seconds}}` (`python -m harness durations RUN... --out FILE`).
              The default file is ci/durations/<backend>.json when it exists (committed, so every runner of
              a CI job matrix balances with the same numbers), else durations/<backend>.json next to the
              test history outside the checkout (main's CI job writes it with `durations --from-history`
              after every run, see lasting_durations_path); without one, shards are balanced by count.
  balance     greedy, longest first (ties by node id) into the lightest shard (ties: the lower index, counted
              from the suite's `offset`: the harness gives the k-th suite offset k, so the first and heaviest
              test of each suite's split lands on a different shard); a test missing from the durations
              weighs the mean of the known ones.
  devices     the GPU ids a shard is pinned to, drawn from the runner's visible set only (harness.gpus):
              `--gpus device=K` for CUDA containers, the GPU's render node for ROCm containers (renumbered
              from 0 inside), the runner's own visible-devices variable natively.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.exc import HarnessError, ResultsError

DURATIONS_SCHEMA = 1
MIN_WEIGHT_S = (
    0.005  # a test that took no time still costs its setup: zero weights would all pile on one shard
)
_SHARD_RE = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True, order=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`I/N` with 1 <= I <= N, or a HarnessError that says what is wrong."""
    m = _SHARD_RE.fullmatch(text or "")
    if not m:
        raise HarnessError(f"--shard {text!r}: expected I/N, e.g. 1/2 (shard I of N, counted from 1)")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1:
        raise HarnessError(f"--shard {text}: the number of shards must be at least 1")
    if not 1 <= index <= count:
        raise HarnessError(f"--shard {text}: the shard index must be between 1 and {count}")
    return Shard(index, count)


def parse_shard_count(text: str) -> int | None:
    """`--shards`: a positive number, or `auto` (None: as many as the GPUs allow)."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise HarnessError(f"--shards {text!r}: expected a positive number of shards or `auto`")
    return int(text)


# ---- assignment ------------------------------------------------------------------------------------------


def weights(ids: Iterable[str], durations: dict[str, float] | None = None) -> dict[str, float]:
    """Each id's weight: its recorded duration, the mean of the known ones when it has none, 1 without any."""
    ids = list(ids)
    durations = durations or {}
    known = [float(durations[i]) for i in ids if i in durations]
    default = sum(known) / len(known) if known else 1.0
    return {i: max(float(durations.get(i, default)), MIN_WEIGHT_S) for i in ids}


def assign(
    ids: Iterable[str], count: int, durations: dict[str, float] | None = None, offset: int = 0
) -> list[list[str]]:
    """Split `ids` into `count` shards (list i holds shard i+1's ids, sorted).

    Deterministic: depends only on the set of ids, the durations and `offset`, not on the ids' order. Longest
    first (ties by id) into the lightest shard (ties: the lowest index counted from shard `offset` % count,
    0-based); without durations every test weighs the same, so shard sizes differ by at most one."""
    if count < 1:
        raise HarnessError(f"cannot split tests into {count} shards")
    w = weights(sorted(set(ids)), durations)
    heap = sorted((0.0, (k - offset) % count, k) for k in range(count))  # sorted: a valid heap
    shards: list[list[str]] = [[] for _ in range(count)]
    for test in sorted(w, key=lambda i: (-w[i], i)):
        load, rank, k = heapq.heappop(heap)
        shards[k].append(test)
        heapq.heappush(heap, (load + w[test], rank, k))
    return [sorted(s) for s in shards]


def select(
    ids: Sequence[str], shard: Shard, durations: dict[str, float] | None = None, offset: int = 0
) -> list[str]:
    """The ids of `ids` that `shard` runs, in the given order."""
    mine = set(assign(ids, shard.count, durations, offset)[shard.index - 1])
    return [i for i in ids if i in mine]


def digest(ids: Iterable[str]) -> str:
    """sha256 of the sorted ids: shards of one run must agree on it (same tests collected)."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


# ---- durations -------------------------------------------------------------------------------------------


def default_durations_path(root: Path, backend: str) -> Path:
    """The checkout's durations file of `backend` (ci/durations/<backend>.json)."""
    return root / "ci" / "durations" / f"{backend}.json"


def lasting_durations_path(backend: str) -> Path:
    """The durations file kept next to the test history, outside the checkout (`durations/<backend>.json` in
    the history store's folder): main's CI writes it from the history after every run, so it lasts."""
    from harness.settings import settings

    return settings().history_db.parent / "durations" / f"{backend}.json"


def find_durations(root: Path, backend: str) -> Path | None:
    """The durations file `run --shard` uses without `--durations`: the checkout's, else the lasting one, else
    None (split by count)."""
    for path in (default_durations_path(root, backend), lasting_durations_path(backend)):
        if path.is_file():
            return path
    return None


def load_durations(path: Path) -> dict[str, float]:
    """The durations file's tests -> seconds (see the module docstring), with a clear error."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise HarnessError(f"durations file {path} not found") from None
    except (OSError, json.JSONDecodeError) as e:
        raise HarnessError(f"durations file {path} is unreadable: {e}") from None
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in tests.values()
    ):
        raise HarnessError(f'durations file {path}: expected {{"schema": 1, "tests": {{node id: seconds}}}}')
    return {str(k): float(v) for k, v in tests.items()}


def durations_digest(durations: dict[str, float]) -> str:
    return hashlib.sha256(json.dumps(durations, sort_keys=True).encode()).hexdigest()


def write_durations(path: Path, durations: dict[str, float], backend: str = "") -> None:
    from harness.results import atomic_write_json

    data: dict[str, Any] = {
        "schema": DURATIONS_SCHEMA,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        "tests": {k: round(v, 3) for k, v in sorted(durations.items())},
    }
    if backend:
        data["backend"] = backend
    atomic_write_json(path, data)


def durations_of_runs(run_dirs: Sequence[Path]) -> tuple[dict[str, float], str]:
    """(test id -> seconds, backend) from the JUnit files of results folders (plain or merged shard runs);
    a later folder's value wins. Tests that did not run (skipped, errored at setup) count too: they cost
    their setup. Folders of different backends are refused."""
    from harness.suites.collect import load_run

    out: dict[str, float] = {}
    backends = set()
    for run_dir in run_dirs:
        run = load_run(run_dir)
        backends.add(run.record.backend)
        for suite in run.suites:
            for t in suite.tests:
                out[t.id] = t.duration_s
    if len(backends) > 1:
        raise ResultsError(
            f"the results folders are of different backends ({', '.join(sorted(backends))}); "
            "durations are recorded per backend"
        )
    return out, next(iter(backends), "")


# ---- devices ---------------------------------------------------------------------------------------------


def visible_gpus(backend: str, env: dict[str, str] | None = None) -> list[str]:
    """The GPU ids this runner offers to `backend` (cuda, rocm): its visible set (harness.gpus.visible: the
    *_VISIBLE_DEVICES ids as written) when set, else 0..count-1 from the driver's device files (CUDA:
    /dev/nvidiaK; ROCm: the KFD topology's GPU nodes)."""
    from harness import gpus

    kind = {"cuda": gpus.NVIDIA, "rocm": gpus.AMD}.get(backend)
    if kind is None:
        return []
    vis = gpus.visible(kind, env)
    if vis.ids is not None:
        return list(vis.ids)
    return [str(i) for i in range(gpus.count_gpus(kind))]


def device_groups(
    is_gpu: bool, shards: int | None, gpus_per_shard: int, gpus: Sequence[str], *, backend: str = ""
) -> list[list[str]]:
    """The GPU ids of each shard (`shards` None: as many as `gpus` allow, the first ones when fewer); without
    a GPU, empty groups (one shard for `auto`)."""
    if gpus_per_shard < 1:
        raise HarnessError(f"--gpus-per-shard {gpus_per_shard}: expected at least 1")
    if not is_gpu:
        return [[] for _ in range(shards or 1)]
    possible = len(gpus) // gpus_per_shard
    if possible < 1:
        raise HarnessError(f"{backend}: {len(gpus)} GPU(s) visible, a shard needs {gpus_per_shard}")
    n = possible if shards is None else shards
    if n > possible:
        raise HarnessError(
            f"--shards {n} with --gpus-per-shard {gpus_per_shard} needs {n * gpus_per_shard} "
            f"GPUs; {len(gpus)} visible ({', '.join(gpus)})"
        )
    return [list(gpus[k * gpus_per_shard : (k + 1) * gpus_per_shard]) for k in range(n)]


# ---- CLI: `python -m harness durations RUN_DIR... | --from-history DB --backend B  --out FILE` -------------


def cli_durations_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results_dirs", nargs="*", help="results folders (plain or merged shard runs), oldest first"
    )
    p.add_argument(
        "--from-history",
        metavar="DB",
        help="instead: the median durations of the history store DB "
        "(harness/suites/history.py) for --backend",
    )
    p.add_argument("--backend", help="with --from-history: whose runs' durations")
    from harness.store.cli import add_store_flags

    add_store_flags(p)  # `--from-history` may also be a store URL
    p.add_argument("--out", help="durations file to update (default: ci/durations/<backend>.json)")
    p.add_argument("--replace", action="store_true", help="start from nothing instead of the file's entries")


def cli_durations_main(args: argparse.Namespace) -> int:
    """Record the tests' durations of results folders into a durations file (shards are balanced by it)."""
    from harness.settings import settings

    if args.from_history:
        if args.results_dirs or not args.backend:
            raise HarnessError("--from-history DB takes --backend B and no results folders")
        from harness.suites.history import median_durations

        found, backend = median_durations(args.from_history, args.backend), args.backend
    elif not args.results_dirs or args.backend:
        raise HarnessError("name results folders, or --from-history DB --backend B")
    else:
        found, backend = durations_of_runs([Path(d) for d in args.results_dirs])
    out = Path(args.out) if args.out else default_durations_path(settings().root, backend)
    old = load_durations(out) if out.exists() and not args.replace else {}
    write_durations(out, {**old, **found}, backend)
    print(
        f"{out}: {len(found)} test durations recorded ({len(old) + len(set(found) - set(old))} in the file)"
    )
    return 0
