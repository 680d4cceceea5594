"""Bench store revision 3: who recorded each run (fleet store): runner name, GPU model, driver, the
matrix's GPU label and the hardware class baselines stay within (harness/store/runner.py).

Revision ID: bench_0003
Revises: bench_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "bench_0003"
down_revision = "bench_0002"
branch_labels = None
depends_on = None

COLUMNS = ("runner", "gpu_model", "driver", "gpu_label", "hw_class")
_meta = sa.table("meta", sa.column("key", sa.Text), sa.column("value", sa.Text))


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("runs", sa.Column(name, sa.Text))
    op.create_index("runs_by_class", "runs", ["hw_class", "status"])
    op.execute(_meta.update().where(_meta.c.key == "schema_version").values(value="3"))


def downgrade() -> None:
    op.drop_index("runs_by_class", "runs")
    with op.batch_alter_table("runs") as b:
        for name in COLUMNS:
            b.drop_column(name)
    op.execute(_meta.update().where(_meta.c.key == "schema_version").values(value="2"))
