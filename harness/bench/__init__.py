"""kiln benchmarks: workloads, timing, statistics, SQLite history, regression detection, reports.

Modules: workloads (registry), measure (timers), stats (Stats, Mann-Whitney U), execute (one workload under
several compilers), store (SQLite), compare (verdicts), report (tables, Markdown, JSON, PNG), session (a whole
run), cli (`python -m harness.bench`), selftest (the CI check), gpu_run (the GPU run done twice); the model
tier: models (registry of real models), model_run (`bench models`), model_report (its tables and plots).
"""

from harness.bench.core.records import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION"]
