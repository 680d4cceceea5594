"""A writer process of the fleet-store tests: `python fleet_writer.py URL RUNS [kill-after-results]` records RUNS
bench runs (two results each, 20 samples) into the store at URL as the runner its environment names
(RUNNER_NAME, KILN_GPU_LABEL), then prints their uids. `kill`: the last run is left half-written: the process
SIGKILLs itself after its results, before `finish_run`."""

from __future__ import annotations

import os
import signal
import sys
import uuid

from harness.bench.core.records import Result, RunInfo
from harness.bench.stores.store import Store, now


def main(url: str, runs: int, kill: bool = False) -> None:
    with Store(url) as store:
        for i in range(runs):
            run = RunInfo(
                id=None,
                uid=uuid.uuid4().hex,
                created_at=now(),
                device="cpu",
                device_name="cpu: test",
                compilers=["inductor", "eager"],
                git_ref="main",
                git_commit=f"c{i:04d}",
            )
            store.begin_run(run)
            for k, comp in enumerate(("inductor", "eager")):
                store.add_result(
                    run.id,
                    Result(
                        f"w{i % 3}",
                        comp,
                        "h",
                        timer="wall",
                        bytes=4096,
                        samples=[1000.0 + i + k + j / 8 for j in range(20)],
                    ),
                )
            if kill and i == runs - 1:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            store.finish_run(run.id)
            print(run.uid, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "kill")
