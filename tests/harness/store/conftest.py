"""Fixtures of the fleet-store tests: one parametrized `store_url`, a fresh store per test on each engine.

sqlite      a file in the test's temporary folder (`sqlite:///...`)
postgresql  a fresh database on a real PostgreSQL server: $KILN_TEST_PG_URL when set (`.ci/run` starts one
            with ci/postgres.sh), else one this session starts with ci/postgres.sh (initdb + pg_ctl on a Unix
            socket in a temporary folder, stopped at the end). Without initdb or psycopg the postgresql
            params are skipped with the reason, never passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _pg_problem() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg 3 is not installed (pip install 'kiln[fleet]')"
    if os.environ.get("KILN_TEST_PG_URL"):
        return None
    if not (shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))):
        return "no PostgreSQL here (initdb not found; Debian's postgresql package provides it)"
    return None


@pytest.fixture(scope="session")
def pg_server():
    """The URL of a PostgreSQL server's `kiln` database (see the module docstring)."""
    if why := _pg_problem():
        pytest.skip(why)
    if given := os.environ.get("KILN_TEST_PG_URL"):
        yield given
        return
    folder = tempfile.mkdtemp(prefix="kiln-pg-")
    script = str(ROOT / "ci" / "postgres.sh")
    try:
        out = subprocess.run([script, "start", folder], capture_output=True, text=True, timeout=120)
        if out.returncode:  # the script's own last line says why (not only "exit status 127")
            why = (out.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.fail(f"ci/postgres.sh start exited {out.returncode}: {why}", pytrace=False)
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", folder], capture_output=True, timeout=120, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as db:
        db.execute(sql)


def fresh_database(server: str) -> str:
    """A new empty database on the server of `server` (a URL), as a store URL."""
    from sqlalchemy.engine import make_url

    name = f"t_{uuid.uuid4().hex[:12]}"
    _admin(server, f'CREATE DATABASE "{name}"')
    return make_url(server).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A store URL on each engine, fresh for the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fleet.sqlite'}"
        return
    yield fresh_database(request.getfixturevalue("pg_server"))


@pytest.fixture
def both_urls(request, tmp_path):
    """(sqlite URL, postgresql URL), both fresh: for output compared across engines."""
    yield f"sqlite:///{tmp_path / 'same.sqlite'}", fresh_database(request.getfixturevalue("pg_server"))


@pytest.fixture
def pg_admin(request):
    """(run SQL as the server's admin, make a fresh database's URL) on the PostgreSQL server of `pg_server`."""
    server = request.getfixturevalue("pg_server")
    return (lambda sql: _admin(server, sql)), (lambda: fresh_database(server))
