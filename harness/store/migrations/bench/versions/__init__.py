"""Revisions of this store, oldest first (Alembic skips this file)."""
