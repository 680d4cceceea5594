"""Bench store revision 2: `verdicts`, a run's compared verdicts with their confirmation.

Revision ID: bench_0002
Revises: bench_0001
"""

import sqlalchemy as sa
from alembic import op

from harness.store.types import REAL8  # same DDL on SQLite; 8 bytes on PostgreSQL

revision = "bench_0002"
down_revision = "bench_0001"
branch_labels = None
depends_on = None

_meta = sa.table("meta", sa.column("key", sa.Text), sa.column("value", sa.Text))


def upgrade() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("workload", sa.Text, nullable=False),
        sa.Column("compiler", sa.Text, nullable=False),
        sa.Column("verdict", sa.Text, nullable=False),
        sa.Column("ratio", REAL8),
        sa.Column("p_value", REAL8),
        sa.Column("baseline", sa.Text),
        sa.Column("confirmed", sa.Integer),
        sa.Column("detail", sa.Text, nullable=False, server_default="{}"),
        sa.UniqueConstraint("run_id", "workload", "compiler"),
    )
    # code from before the Alembic stores reads meta's schema_version: 2 makes it refuse this store, not
    # write it
    op.execute(_meta.update().where(_meta.c.key == "schema_version").values(value="2"))


def downgrade() -> None:
    op.drop_table("verdicts")
    op.execute(_meta.update().where(_meta.c.key == "schema_version").values(value="1"))
