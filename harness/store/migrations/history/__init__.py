"""Alembic migration scripts of the stores (see harness/store/migrate.py); run programmatically."""
