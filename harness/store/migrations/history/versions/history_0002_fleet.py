"""Test history revision 2 (fleet store): each recorded run gets a UUID (`uid`, its identity across
stores: `store push`/`pull` key on it) and who recorded it (runner name, GPU model, driver, GPU label, hardware
class); a folder is unique per runner, no longer across the whole store (two runners may write the same path).

Revision ID: history_0002
Revises: history_0001
"""

import uuid

import sqlalchemy as sa
from alembic import op

revision = "history_0002"
down_revision = "history_0001"
branch_labels = None
depends_on = None

COLUMNS = ("runner", "gpu_model", "driver", "gpu_label", "hw_class")
_meta = sa.table("history_meta", sa.column("key", sa.Text), sa.column("value", sa.Text))
_runs = sa.table(
    "history_runs", sa.column("id", sa.Integer), sa.column("uid", sa.Text), sa.column("runner", sa.Text)
)
# revision 1's history_runs less its UNIQUE(folder), as SQLite's copy of the table starts from it (reflecting
# it would drop the unnamed CHECK on `source`)
_REV1_RUNS = sa.Table(
    "history_runs",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("date", sa.Text, nullable=False),
    sa.Column("git_commit", sa.Text),
    sa.Column("backend", sa.Text, nullable=False),
    sa.Column("source", sa.Text, sa.CheckConstraint("source IN ('run', 'flakes')"), nullable=False),
    sa.Column("folder", sa.Text, nullable=False),
    sqlite_autoincrement=True,
)


def upgrade() -> None:
    bind = op.get_bind()
    if (
        bind.dialect.name == "sqlite"
    ):  # no DROP CONSTRAINT: the table is copied (foreign keys off, migrate.py)
        with op.batch_alter_table("history_runs", copy_from=_REV1_RUNS, recreate="always") as b:
            b.add_column(sa.Column("uid", sa.Text))
            for name in COLUMNS:
                b.add_column(sa.Column(name, sa.Text))
    else:
        op.drop_constraint("history_runs_folder_key", "history_runs", type_="unique")
        op.add_column("history_runs", sa.Column("uid", sa.Text))
        for name in COLUMNS:
            op.add_column("history_runs", sa.Column(name, sa.Text))
    ids = [row[0] for row in bind.execute(sa.select(_runs.c.id))]
    for rid in ids:  # runs recorded before: a fresh UUID each, recorded by an unnamed runner ("")
        bind.execute(_runs.update().where(_runs.c.id == rid).values(uid=uuid.uuid4().hex, runner=""))
    op.create_index("history_runs_uid", "history_runs", ["uid"], unique=True)
    op.create_index("history_runs_folder", "history_runs", ["runner", "folder"], unique=True)
    op.execute(_meta.update().where(_meta.c.key == "schema_version").values(value="2"))


def downgrade() -> None:
    raise NotImplementedError("history revision 2 is not downgraded (folders of several runners may collide)")
