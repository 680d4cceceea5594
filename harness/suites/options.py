"""What `harness run` was asked for besides the backend and the place (harness.suites.place): one dataclass
that the command line builds once and `run_suites` (harness.suites.steps) and `run_shards`
(harness.suites.sharded) take whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.matrix import Retries
from harness.suites.shard import Shard


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """`suites` (None: the matrix's); `run_dir` the run folder (None: a new one under the results root; a
    `--shards` run needs one); `extra` more pytest arguments; `health` the GPU health check first; `echo`
    pytest's output on stdout; `save_numerics` the numerics suite saves its outputs; `shard` only that shard of
    every suite's tests, balanced by the `durations` file (None: by count); `devices` the GPU ids the run is
    pinned to (the place's `pin`, harness.suites.place); `retries` how failed tests are rerun (None: the matrix's);
    `history` the test-history store a complete run is recorded into (None: the default store;
    `record_history=False`: none); `isolate` crash isolation (harness.suites.isolation), off only to measure
    what it costs. A `--shards` run gives `shard`, `devices` and `isolate` to no shard: each has its own."""

    suites: Sequence[str] | None = None
    run_dir: Path | None = None
    extra: Sequence[str] = ()
    health: bool = True
    echo: bool = True
    save_numerics: bool = False
    shard: Shard | None = None
    durations: Path | None = None
    devices: Sequence[str] = ()
    retries: Retries | None = None
    history: Path | None = None
    record_history: bool = True
    isolate: bool = True

    def history_location(self) -> Any:
        """The test-history store the run records into: None with `record_history=False`, else `history`, else
        KILN_STORE_URL, else the default file (harness.suites.history.plan_location)."""
        if not self.record_history:
            return None
        from harness.suites.history import plan_location

        return plan_location(self.history)
