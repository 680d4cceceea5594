"""The fleet store on both engines (conftest.py: `store_url` is a SQLite file and a real PostgreSQL
database): migrations to head, 4 writer processes x 50 runs at once with nothing lost, a killed writer's run never
complete, two runners whose baselines never cross hardware classes, UUID-keyed push/pull (twice adds nothing, a
killed push resumes), identical CLI output from either engine, and the read-only readers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select

from harness.bench.core.records import RunInfo
from harness.bench.judge.compare import resolve_baseline
from harness.bench.stores.store import Store, now
from harness.exc import BaselineError, StoreError
from harness.store import BENCH, HISTORY, head, open_store
from harness.store import tables as t
from harness.store.url import parse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WRITER = HERE / "fleet_writer.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_STORE", "RUNNER_NAME", "KILN_GPU"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _writer(url: str, runs: int, *, runner: str, label: str = "", kill: bool = False) -> subprocess.Popen:
    args = [sys.executable, str(WRITER), url, str(runs), *(["kill"] if kill else [])]
    return subprocess.Popen(
        args,
        env=_env(RUNNER_NAME=runner, KILN_GPU_LABEL=label),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _count(url: str, table) -> int:
    opened = open_store(parse(url), BENCH, write=False)
    try:
        with opened.conn.begin():
            return int(opened.conn.execute(select(func.count()).select_from(table)).scalar_one())
    finally:
        opened.close()


def test_both_stores_migrate_to_head_and_readers_cannot_write(store_url):
    for kind in (BENCH, HISTORY):
        opened = open_store(parse(store_url), kind, write=True)
        assert opened.revision == head(kind)
        opened.close()
    reader = open_store(parse(store_url), BENCH, write=False)
    try:
        assert reader.revision == head(BENCH)
        with pytest.raises(Exception, match="(?i)read.only|readonly"):  # PostgreSQL: read-only transactions
            with reader.conn.begin():
                reader.conn.execute(insert(t.meta).values(key="x", value="y"))
    finally:
        reader.close()


def test_four_writers_fifty_runs_each_lose_nothing(store_url):
    procs = [_writer(store_url, 50, runner=f"runner-{k}") for k in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-2000:] for _, e in outs]
    uids = [u for out, _ in outs for u in out.split()]
    assert len(uids) == 200 == len(set(uids))
    with Store(store_url, readonly=True) as store:
        runs = store.runs(complete_only=True)
        assert len(runs) == 200 and {r.uid for r in runs} == set(uids)
        assert len({r.id for r in runs}) == 200
        assert {r.runner for r in runs} == {f"runner-{k}" for k in range(4)}
        assert len(store.runs(runner="runner-2")) == 50
        some = runs[17]
        res = store.results(some.id)
        assert len(res) == 2 and all(len(r.samples) == 20 for r in res)
    assert _count(store_url, t.results) == 400 and _count(store_url, t.samples) == 8000


def test_a_killed_writer_leaves_no_run_counted_complete(store_url):
    p = _writer(store_url, 3, runner="doomed", kill=True)
    out, err = p.communicate(timeout=300)
    assert p.returncode == -9, err[-2000:]
    assert len(out.split()) == 2
    with Store(store_url, readonly=True) as store:
        assert [r.status for r in store.runs()] == ["running", "complete", "complete"]
        assert len(store.runs(complete_only=True)) == 2
        killed = store.runs()[0]
        assert resolve_baseline(store, "latest", None)[0].id != killed.id


def test_two_runners_share_one_store_and_baselines_stay_in_their_class(store_url):
    for runner, label in (("box-a", "h100"), ("box-b", "mi300"), ("box-c", "h100")):
        p = _writer(store_url, 1, runner=runner, label=label)
        assert p.wait(timeout=300) == 0, p.stderr.read()[-2000:]
    new = RunInfo(
        id=None, uid="new", created_at=now(), device="cpu", device_name="cpu: test", hw_class="mi300"
    )
    with Store(store_url, readonly=True) as store:
        by_runner = {r.runner: r for r in store.runs()}
        assert {r.hw_class for r in store.runs()} == {"h100", "mi300"}
        assert resolve_baseline(store, "latest", new) == [by_runner["box-b"]]  # not box-c's newer h100 run
        assert resolve_baseline(store, "window:5", new) == [by_runner["box-b"]]
        assert resolve_baseline(store, "latest", new, any_hardware=True) == [by_runner["box-c"]]
        new.hw_class = "gfx950"
        with pytest.raises(BaselineError):
            resolve_baseline(store, "latest", new)
        assert [r.runner for r in store.runs(hw_class="h100")] == ["box-c", "box-a"]


def test_a_store_of_another_kind_on_the_server_is_refused_in_one_line(store_url):
    opened = open_store(parse(store_url), BENCH, write=True)
    try:
        with opened.conn.begin():
            opened.conn.exec_driver_sql("DROP TABLE samples")
    finally:
        opened.close()
    with pytest.raises(StoreError) as err:
        Store(store_url)
    assert len(str(err.value).splitlines()) == 1 and "samples" in str(err.value)


def test_without_psycopg_the_postgresql_params_skip_with_the_reason(tmp_path):
    """Never a silent pass: with psycopg unimportable, the sqlite param runs and the postgresql one is skipped
    naming psycopg (a real pytest process; a sitecustomize hides the module). The conftests above this folder's
    are left out (`--confcutdir`): they import torch, which the store's tests do not need."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("KILN_TEST_PG_URL", None)
    test = f"{Path(__file__).relative_to(ROOT)}::test_both_stores_migrate_to_head_and_readers_cannot_write"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["--confcutdir", str(HERE), test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 passed, 1 skipped" in proc.stdout and "psycopg 3 is not installed" in proc.stdout


def test_store_urls_parse_hide_passwords_and_refuse_other_schemes(tmp_path):
    from harness.exc import UsageError
    from harness.store.url import ServerURL

    assert parse(f"sqlite:///{tmp_path}/a.sqlite") == tmp_path / "a.sqlite"
    assert parse("sqlite:///rel/a.sqlite") == Path("rel/a.sqlite")
    assert parse("plain.sqlite") == Path("plain.sqlite")
    server = parse("postgresql://kiln:s3cret@db.example/kiln")
    assert isinstance(server, ServerURL) and server.url.drivername == "postgresql+psycopg"
    assert "s3cret" not in str(server) and "***" in str(server) and server.url.password == "s3cret"
    for bad in ("mysql://u@h/db", "sqlite://", "sqlite:///:memory:"):
        with pytest.raises(UsageError) as err:
            parse(bad)
        assert len(str(err.value).splitlines()) == 1
    with pytest.raises(UsageError) as err:
        parse("mysql://u:s3cret@h/db")
    assert "s3cret" not in str(err.value)
