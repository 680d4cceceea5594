"""Bench store revision 1: the schema of the hand-written store (meta schema_version 1), exactly.

Revision ID: bench_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from harness.store.types import INT8, REAL8  # same DDL on SQLite; 8 bytes on PostgreSQL

revision = "bench_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta", sa.Column("key", sa.Text, primary_key=True), sa.Column("value", sa.Text, nullable=False)
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uid", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        *(
            sa.Column(c, sa.Text)
            for c in ("profile", "device", "device_name", "compilers", "git_ref", "git_commit", "label")
        ),
        sa.Column("ceiling_gbps", REAL8),
        sa.Column("config", sa.Text),
        sa.Column("env", sa.Text),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "results",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        *(
            sa.Column(c, sa.Text, nullable=False)
            for c in ("workload", "compiler", "phase", "source_hash", "status")
        ),
        sa.Column("error", sa.Text),
        sa.Column("median_ns", REAL8),
        *(sa.Column(c, INT8) for c in ("n", "bytes", "flops")),
        *(sa.Column(c, REAL8) for c in ("max_abs_err", "max_rel_err", "compile_s")),
        sa.Column("timer", sa.Text),
        *(sa.Column(c, REAL8) for c in ("planted", "ceiling_gbps")),
        sa.Column("meta", sa.Text),
        sa.UniqueConstraint("run_id", "workload", "compiler", "phase"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "samples",
        sa.Column("result_id", sa.Integer, sa.ForeignKey("results.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("ns", REAL8, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("results_by_run", "results", ["run_id"])
    op.create_index("results_by_workload", "results", ["workload", "compiler"])
    meta = sa.table("meta", sa.column("key", sa.Text), sa.column("value", sa.Text))
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    for table in ("samples", "results", "runs", "meta"):
        op.drop_table(table)
