"""Alembic's environment script: hands over to harness.store.migrate, which passes the open connection."""

from alembic import context

from harness.store.migrate import run_environment

run_environment(context)
