"""One arm of a side-by-side confirmation (harness/bench/kernels/sidebyside.py): a process that measures workloads with
the code of the tree first on its PYTHONPATH (the baseline commit's scratch worktree, or the candidate's tree).

It is started by file path, so this driver is the caller's while `harness.bench.kernels.workloads`, the executor and
`compiler` are the tree's own. Protocol: one JSON object a line on stdin, one answer a line on the original
stdout (anything the measured code prints goes to stderr):

- first line `{"cfg": {...BenchConfig fields...}, "cases": [names], "compilers": [...], "plant": spec|null,
  "threads": n, "clock": "process"|null}` -> `{"ready": {case: {compiler: "ok" | error}}, "reps": {case: {compiler: planned samples}},
  "est": {case: {compiler: ns a call}}}` once every case is compiled and warmed up;
- `{"op": "sample", "case": name, "n": {compiler: n}}` -> `{"block": {compiler: 25th percentile ns}}`: one
  untimed call (the first call after the other process ran is slow), then `n` timed samples added to the
  case's results; the block's lower quartile, since load on a shared host only ever adds time. With
  `"clock": "process"` (CPU runs) each sample is the process's CPU time over the call
  (`time.process_time_ns`), not wall time: the time the process waited for a core while other processes
  ran is then not counted, only the work it did;
- `{"op": "finish"}` -> `{"results": [Result.as_dict() ...]}` and the process exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
# started as a script: drop this folder from the path, so `harness` and `compiler` come from PYTHONPATH's tree
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _bench(name: str) -> Any:
    """`harness.bench.kernels.<name>` (or `core` for stats) of the tree on PYTHONPATH, or the flat
    `harness.bench.<name>` of a baseline commit that predates the bench's sub-packages."""
    import importlib

    pkg = "core" if name == "stats" else "kernels"
    try:
        return importlib.import_module(f"harness.bench.{pkg}.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"harness.bench.{name}")


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the measured code's prints go to stderr; stdout carries the protocol only

    def send(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj, default=str) + "\n")
        proto.flush()

    hello = json.loads(sys.stdin.readline())
    compilers: list[str] = hello["compilers"]
    # Only names every tree's harness has since this protocol began (no `harness.arms`, no `executor`): this
    # driver runs over the baseline commit's harness too, which may predate them.
    if "kiln" in compilers:
        _bench("session").prepare_kiln()
    import torch

    from harness.settings import Plant

    wl = _bench("workloads")
    BenchConfig, Executor = _bench("execute").BenchConfig, _bench("execute").Executor

    names = BenchConfig.__dataclass_fields__
    cfg = BenchConfig(**{k: v for k, v in hello["cfg"].items() if k in names and k != "plant"})
    cfg.plant = Plant.parse(hello["plant"]) if hello.get("plant") else None
    if cfg.device == "cpu" and hello.get("threads"):
        torch.set_num_threads(int(hello["threads"]))
    ex = Executor(cfg, log=lambda msg: None)
    ex.measure_ceiling()
    wanted = set(hello["cases"])
    cases = [c for c in wl.cases(cfg.profile, None) if c.name in wanted]
    torch._dynamo.reset()
    opened = {c.name: ex.open_case(c, compilers, phase="confirm") for c in cases}

    def live(oc: Any) -> dict[str, Any]:
        return {c: p for c, p in oc.prepared.items() if hasattr(p, "call") and p.result.status == "ok"}

    send(
        {
            "ready": {
                name: {
                    c: ("ok" if c in live(oc) else (getattr(p, "error", None) or "error"))
                    for c, p in oc.prepared.items()
                }
                for name, oc in opened.items()
            },
            "reps": {name: {c: p.reps for c, p in live(oc).items()} for name, oc in opened.items()},
            "est": {name: {c: p.est_ns for c, p in live(oc).items()} for name, oc in opened.items()},
        }
    )
    gc_paused, Stats = _bench("execute").gc_paused, _bench("stats").Stats

    def cpu_sample(fn: Any, reps: int) -> list[float]:
        clock, out = time.process_time_ns, []
        for _ in range(reps):
            t0 = clock()
            fn()
            out.append(float(clock() - t0))
        return out

    sample = cpu_sample if hello.get("clock") == "process" else ex.timer.sample

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "sample":
            block: dict[str, float] = {}
            for c, p in live(opened[cmd["case"]]).items():
                try:
                    with gc_paused():
                        p.call()
                        ex.timer.sync()
                        got = sample(p.call, max(1, int(cmd["n"].get(c, 1))))
                except Exception as e:  # noqa: BLE001 - a failing call is an error result, as in `bench run`
                    p.result.status, p.result.error = "error", f"{type(e).__name__}: {e}"
                    continue
                p.result.samples += got
                block[c] = Stats.of(got).q1
            send({"block": block})
        elif cmd["op"] == "finish":
            results = [r.as_dict() for oc in opened.values() for r in ex.close_case(oc)]
            send({"results": results})
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
