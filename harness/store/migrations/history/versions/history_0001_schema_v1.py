"""Test history revision 1: the schema of the hand-written store (history_meta schema_version 1), exactly.

Revision ID: history_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from harness.store.types import REAL8  # same DDL on SQLite; 8 bytes on PostgreSQL

revision = "history_0001"
down_revision = None
branch_labels = None
depends_on = None

_OUTCOMES = "outcome IN ('passed', 'failed', 'error', 'skipped', 'xfailed')"


def upgrade() -> None:
    op.create_table(
        "history_meta",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "history_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("date", sa.Text, nullable=False),
        sa.Column("git_commit", sa.Text),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("source", sa.Text, sa.CheckConstraint("source IN ('run', 'flakes')"), nullable=False),
        sa.Column("folder", sa.Text, nullable=False, unique=True),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "history_outcomes",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("history_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("node_id", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, sa.CheckConstraint(_OUTCOMES), nullable=False),
        sa.Column("duration_s", REAL8, nullable=False, server_default="0"),
    )
    op.create_index("history_outcomes_node", "history_outcomes", ["node_id", "run_id"])
    op.create_index("history_outcomes_run", "history_outcomes", ["run_id"])
    op.create_table(
        "history_retries",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("history_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("node_id", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, sa.CheckConstraint("attempt >= 1"), nullable=False),
        sa.Column("outcome", sa.Text, sa.CheckConstraint(_OUTCOMES), nullable=False),
        sa.Column("duration_s", REAL8, nullable=False, server_default="0"),
        sa.Column("status", sa.Text, sa.CheckConstraint("status IN ('flaky', 'failing')"), nullable=False),
    )
    op.create_index("history_retries_node", "history_retries", ["node_id", "run_id"])
    meta = sa.table("history_meta", sa.column("key", sa.Text), sa.column("value", sa.Text))
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    for table in ("history_retries", "history_outcomes", "history_runs", "history_meta"):
        op.drop_table(table)
