"""kiln benchmarks: workloads, timing, statistics, stored history, regression detection, reports.

Sub-packages, bottom to top; each imports only from itself, from those before it and from outside the bench
(tests/harness/test_imports.py checks it):

- `core`: the typed records (`records`: Result and its Meta, RunInfo, Verdict, Comparison), `stats`, and the
  executor skeleton both tiers share (`executor`);
- `stores`: the bench store (`store`) and a run's environment (`env`);
- `judge`: comparing with a baseline (`compare`), the paired side-by-side test (`paired`), a job's verdict
  lines (`verdict`);
- `reports`: tables, Markdown, JSON and plots (`report`), what moved over the stored runs (`history`);
- `kernels`: the kernel tier (`workloads`, `measure`, `execute`, `session`, side-by-side confirmation
  `sidebyside` + `sbs_worker`, `noise_check`, `selftest`, `gpu_run`, `backend_run`, `bisect`, `overhead`);
- `models`: the model tier (`catalog` of real models, `run`: `bench models`, `report`, `memory`, `memcheck`,
  `profile`, `step_facts`, `compile_times`, `autotune_gain`, `warmcache`).

On top: `cli` (`python -m harness bench`) and `job` (the CI bench jobs' summaries and bisections).
"""

from harness.bench.core.records import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION"]
