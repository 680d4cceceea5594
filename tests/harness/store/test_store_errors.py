"""Store errors that are configuration, not outage (harness/store/migrate.py `denied_reason`, url.parse): a server
that answers and refuses us (wrong password, no right to connect) is an error, exit 3, never spooled; a store URL
that does not parse is one line, exit 2. Each through the real `python -m harness`."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[3]


def harness(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    spool = tmp_path / "spool" / "store.sqlite"
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={
            **base,
            "PYTHONPATH": str(ROOT),
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "KILN_STORE_SPOOL": str(spool),
            **env,
        },
    )


def flakes_folder(tmp_path: Path) -> Path:
    """A results folder `history record` reads (a flakes folder: flakes.json and its JUnit)."""
    folder = tmp_path / "flakes"
    folder.mkdir()
    (folder / "flakes.json").write_text('{"kind": "flakes", "backend": "cpu"}')
    (folder / "pytest.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="1"><testcase '
        'classname="tests.a.test_a" name="test_x" time="0.1"/></testsuite></testsuites>'
    )
    return folder


def _role(admin, password: str | None) -> str:
    name = f"r_{uuid.uuid4().hex[:10]}"
    admin(f"CREATE ROLE {name} LOGIN" + (f" PASSWORD '{password}'" if password else ""))
    return name


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://u:secret@localhost:abc/db",
        "postgresql://u@[::1/db",
        "mysql://u@h/db",
        "sqlite://relative.sqlite",
    ],
)
def test_a_malformed_store_url_is_one_line_exit_2(tmp_path, text):
    for args in (["history", "show"], ["bench", "list"], ["store", "push", "--to", text]):
        proc = harness(tmp_path, *args, KILN_STORE_URL=text)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert len(err) == 1 and "store URL" in err[0] and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "secret" not in proc.stderr + proc.stdout


def test_a_role_the_server_refuses_is_an_error_not_a_spool(tmp_path, pg_admin):
    admin, fresh_database = pg_admin
    db = fresh_database()
    name = make_url(db).database
    role = _role(admin, None)
    admin(f'REVOKE CONNECT ON DATABASE "{name}" FROM PUBLIC')
    url = make_url(db).set(username=role).render_as_string(hide_password=False)
    proc = harness(tmp_path, "history", "--store", url, "record", str(flakes_folder(tmp_path)))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refused access" in proc.stderr and "permission denied" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "spooled" not in proc.stdout + proc.stderr
    assert not (tmp_path / "spool" / "store.sqlite").exists()


def test_a_wrong_password_is_an_error_not_a_spool(tmp_path, pg_server, pg_admin):
    """The server asks this role for a password (a pg_hba.conf line for it alone, removed after)."""
    import psycopg

    admin_url = pg_server.replace("postgresql+psycopg://", "postgresql://")
    admin, fresh_database = pg_admin
    role = _role(admin, "right-one")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        if not os.access(hba, os.W_OK):
            pytest.skip(f"cannot make this server ask for a password ({hba} is not writable here)")
        before = hba.read_text()
        hba.write_text(f"local all {role} scram-sha-256\nhost all {role} all scram-sha-256\n{before}")
        conn.execute("SELECT pg_reload_conf()")
    try:
        url = make_url(fresh_database()).set(username=role, password="wrong-one")
        proc = harness(
            tmp_path,
            "history",
            "--store",
            url.render_as_string(hide_password=False),
            "record",
            str(flakes_folder(tmp_path)),
        )
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            hba.write_text(before)
            conn.execute("SELECT pg_reload_conf()")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "password authentication failed" in proc.stderr and "wrong-one" not in proc.stderr, proc.stderr
    assert "spooled" not in proc.stdout + proc.stderr and not (tmp_path / "spool" / "store.sqlite").exists()
