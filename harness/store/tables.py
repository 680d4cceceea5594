"""The newest schema of both stores, written once through SQLAlchemy (no engine's own DDL), for queries.

The migrations (harness/store/migrations/*/versions) build the same tables step by step and stay as they were
written; these tables describe the head revision. Tables of the bench store: `meta`, `runs`, `results`,
`samples`, `verdicts` (harness/bench/stores/store.py); of the test history: `history_*` (harness/suites/history.py). The
prefixes let both stores share one file.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)

from .types import INT8
from .types import REAL8 as REAL

RUNNER_COLUMNS = ("runner", "gpu_model", "driver", "gpu_label", "hw_class")  # revision 3 (bench), 2 (history)

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")


def _in(column: str, values: tuple[str, ...]) -> CheckConstraint:
    return CheckConstraint(f"{column} IN ({', '.join(repr(v) for v in values)})")


bench = MetaData()

meta = Table("meta", bench, Column("key", Text, primary_key=True), Column("value", Text, nullable=False))

runs = Table(
    "runs",
    bench,
    Column("id", Integer, primary_key=True),
    Column("uid", Text, nullable=False, unique=True),
    Column("created_at", Text, nullable=False),
    Column("finished_at", Text),
    Column("status", Text, nullable=False),
    *(
        Column(c, Text)
        for c in ("profile", "device", "device_name", "compilers", "git_ref", "git_commit", "label")
    ),
    Column("ceiling_gbps", REAL),
    Column("config", Text),
    Column("env", Text),
    *(Column(c, Text) for c in RUNNER_COLUMNS),
    Index("runs_by_class", "hw_class", "status"),
    sqlite_autoincrement=True,
)

results = Table(
    "results",
    bench,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    *(Column(c, Text, nullable=False) for c in ("workload", "compiler", "phase", "source_hash", "status")),
    Column("error", Text),
    Column("median_ns", REAL),
    *(Column(c, INT8) for c in ("n", "bytes", "flops")),
    *(Column(c, REAL) for c in ("max_abs_err", "max_rel_err", "compile_s")),
    Column("timer", Text),
    *(Column(c, REAL) for c in ("planted", "ceiling_gbps")),
    Column("meta", Text),
    UniqueConstraint("run_id", "workload", "compiler", "phase"),
    Index("results_by_run", "run_id"),
    Index("results_by_workload", "workload", "compiler"),
    sqlite_autoincrement=True,
)

samples = Table(
    "samples",
    bench,
    Column("result_id", Integer, ForeignKey("results.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("ns", REAL, nullable=False),
    sqlite_with_rowid=False,
)

# revision 2: a run's compared verdicts, confirmation included (records.Comparison.stored())
verdicts = Table(
    "verdicts",
    bench,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("workload", Text, nullable=False),
    Column("compiler", Text, nullable=False),
    Column("verdict", Text, nullable=False),
    Column("ratio", REAL),
    Column("p_value", REAL),
    Column("baseline", Text),
    Column("confirmed", Integer),
    Column("detail", Text, nullable=False, server_default="{}"),
    UniqueConstraint("run_id", "workload", "compiler"),
)


history = MetaData()

history_meta = Table(
    "history_meta", history, Column("key", Text, primary_key=True), Column("value", Text, nullable=False)
)

history_runs = Table(
    "history_runs",
    history,
    Column("id", Integer, primary_key=True),
    Column("date", Text, nullable=False),
    Column("git_commit", Text),
    Column("backend", Text, nullable=False),
    Column("source", Text, _in("source", ("run", "flakes")), nullable=False),
    Column("folder", Text, nullable=False),
    Column("uid", Text),
    *(Column(c, Text) for c in RUNNER_COLUMNS),
    Index("history_runs_uid", "uid", unique=True),
    Index("history_runs_folder", "runner", "folder", unique=True),
    sqlite_autoincrement=True,
)

history_outcomes = Table(
    "history_outcomes",
    history,
    Column("run_id", Integer, ForeignKey("history_runs.id", ondelete="CASCADE"), nullable=False),
    Column("node_id", Text, nullable=False),
    Column("outcome", Text, _in("outcome", OUTCOMES), nullable=False),
    Column("duration_s", REAL, nullable=False, server_default="0"),
    Index("history_outcomes_node", "node_id", "run_id"),
    Index("history_outcomes_run", "run_id"),
)

history_retries = Table(
    "history_retries",
    history,
    Column("run_id", Integer, ForeignKey("history_runs.id", ondelete="CASCADE"), nullable=False),
    Column("node_id", Text, nullable=False),
    Column("attempt", Integer, CheckConstraint("attempt >= 1"), nullable=False),
    Column("outcome", Text, _in("outcome", OUTCOMES), nullable=False),
    Column("duration_s", REAL, nullable=False, server_default="0"),
    Column("status", Text, _in("status", ("flaky", "failing")), nullable=False),
    Index("history_retries_node", "node_id", "run_id"),
)
