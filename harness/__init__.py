"""Kiln's CI harness: runs the compiler's suites in pinned CPU/CUDA/ROCm containers (or natively),
captures the environment, collects JUnit results, reports, and prints a reproduction line per failure.

The harness is a chain of small steps, each a function another module (or a nox session) can call:
  matrix.load          -> the backends' data from ci/matrix.json (the one source of truth)
  image.build          -> a hash-tagged image for a backend (bootstrapping a base image if needed)
  health.check         -> a matmul and a compiled Triton kernel on every visible device
  envinfo.capture      -> git sha, versions, driver, GPUs, compiler config
  place.chosen         -> where a run's processes run (NativePlace or ContainerPlace), chosen once per run
  runner.run_pytest    -> one pytest invocation at a place; returns where JUnit landed
  steps.run_suites     -> the four suites, one summary line each, into a results folder (harness.suites.steps:
                          SETUP, STEPS, END, each a function of the run's typed state)
  record.RunRecord     -> run.json, typed (suites, retries, crashes, shards); schema 2, schema 1 read
  shard.assign         -> which tests shard I of N runs (by recorded durations, else by count)
  gpus.pin             -> a backend confined to the GPUs the runner was given (its *_VISIBLE_DEVICES)
  sharded.run_shards   -> every shard at once, each pinned to its GPUs; merge.merge_shards -> one report
  collect.load_run     -> a results folder parsed and classified: its RunRecord and every suite's tests
  report.render        -> the text/markdown report
  repro.repro_line     -> the command that reproduces one failing test
  cleanup.cleanup      -> a CI job's teardown: its containers, stale ones, superseded kiln image tags

Child processes are started and stopped through harness.process (SIGTERM becomes an interrupt only inside
`process.sigterm_interrupts`, the one handler); every git call goes through harness.git.
The command line is `python -m harness <verb>`; see harness/__main__.py.
This package imports only the standard library at import time; torch/triton are imported lazily.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
