"""Moving history between stores: `store push` twice adds nothing, a killed push resumes, `store pull`
brings a fleet store home; `bench show`, `bench history` and `history show` print the same from either engine;
an unreachable server spools the results (one line) and the next run pushes them, `--store-strict` exits 3; a
server stopped mid-run loses nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.bench.core.records import Comparison, Result, RunInfo, Verdict
from harness.bench.stores.store import Store, now
from harness.exc import StoreUnreachable
from harness.store import BENCH, HISTORY, open_store
from harness.store.sync import copy_runs
from harness.store.url import parse
from harness.suites import history

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # test_history's results-folder maker
from test_history import fake_run  # noqa: E402

UNREACHABLE = "postgresql://kiln@/kiln?host=/nonexistent-kiln-socket-dir"


@pytest.fixture(autouse=True)
def _runner(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNNER_NAME", "box-a")
    monkeypatch.setenv("KILN_GPU_LABEL", "h100")
    monkeypatch.setenv("KILN_STORE_SPOOL", str(tmp_path / "spool" / "store.sqlite"))
    monkeypatch.delenv("KILN_BENCH_DB", raising=False)


def _bench_run(store: Store, i: int, *, finish: bool = True) -> RunInfo:
    run = RunInfo(
        id=None,
        uid=uuid.uuid4().hex,
        created_at=f"2026-01-0{i + 1}T00:00:00+00:00",
        device="cpu",
        device_name="cpu: test",
        compilers=["inductor", "eager"],
        git_ref="main",
        git_commit=f"c{i}",
    )
    store.begin_run(run)
    for comp in ("inductor", "eager"):
        slow = 1.3 if (i == 2 and comp == "inductor") else 1.0
        store.add_result(
            run.id,
            Result(
                "softmax.fwd",
                comp,
                "h",
                timer="wall",
                bytes=4096,
                samples=[slow * (1000.0 + j % 7) for j in range(40)],
            ),
        )
    if finish:
        store.save_verdicts(
            run.id, [Comparison("softmax.fwd", "inductor", Verdict.UNCHANGED, ratio=1.0, p=0.5)]
        )
        store.finish_run(run.id)
    return run


def _source(tmp_path: Path) -> Path:
    """A runner's SQLite store: 3 complete bench runs + 1 left running, 2 recorded test runs."""
    db = tmp_path / "local.sqlite"
    with Store(db) as store:
        for i in range(3):
            _bench_run(store, i)
        _bench_run(store, 3, finish=False)
    for k in range(2):
        outcomes = {"t::ok": ("passed", 1.0), "t::flaky": ("failed" if k else "passed", 0.5)}
        history.record(
            db, fake_run(tmp_path / f"run-{k}", outcomes, started=f"2026-01-0{k + 1}T00:00:00+00:00")
        )
    return db


def _counts(where: str | Path) -> dict[str, int]:
    out = {}
    with Store(where, readonly=True) as store:
        out["runs"] = len(store.runs())
        out["results"] = sum(len(store.results(r.id)) for r in store.runs())
        out["samples"] = sum(len(x.samples) for r in store.runs() for x in store.results(r.id))
        out["uids"] = len({r.uid for r in store.runs()})
    with history.connect(where, readonly=True) as db:
        out["history"] = db.exec_driver_sql("SELECT count(*) FROM history_runs").scalar_one()
        out["outcomes"] = db.exec_driver_sql("SELECT count(*) FROM history_outcomes").scalar_one()
    return out


def test_push_twice_adds_nothing_and_pull_brings_it_home(store_url, tmp_path, capsys):
    src = _source(tmp_path)
    assert main(["store", "push", "--from", str(src), "--to", store_url]) == 0
    first = capsys.readouterr().out
    assert "3 run(s) copied, 0 already there, 1 unfinished left behind" in first
    assert "history store" in first and "2 run(s) copied" in first
    after_one = _counts(store_url)
    assert after_one == {"runs": 3, "results": 6, "samples": 240, "uids": 3, "history": 2, "outcomes": 4}
    assert main(["store", "push", "--from", str(src), "--to", store_url]) == 0
    assert "0 run(s) copied, 3 already there" in capsys.readouterr().out
    assert _counts(store_url) == after_one
    home = tmp_path / "home.sqlite"
    assert main(["store", "pull", "--from", store_url, "--to", str(home)]) == 0
    assert _counts(home) == after_one
    with Store(home, readonly=True) as a, Store(store_url, readonly=True) as b:
        assert [r.as_dict() | {"id": 0} for r in a.runs()] == [r.as_dict() | {"id": 0} for r in b.runs()]
        assert all(r.runner == "box-a" and r.hw_class == "h100" for r in a.runs())


def test_a_push_killed_midway_resumes_with_nothing_duplicated(store_url, tmp_path):
    src = _source(tmp_path)
    a = open_store(src, BENCH, write=True)
    b = open_store(parse(store_url), BENCH, write=True)

    def kill_after(n: int) -> None:
        if n == 1:
            raise KeyboardInterrupt  # as a Ctrl-C or SIGTERM between two runs' transactions

    try:
        with pytest.raises(KeyboardInterrupt):
            copy_runs(a.conn, b.conn, BENCH, what="test", progress=kill_after)
        done = copy_runs(a.conn, b.conn, BENCH, what="test")
    finally:
        a.close()
        b.close()
    assert (done.added, done.present, done.unfinished) == (1, 2, 1)
    assert main(["store", "push", "--from", str(src), "--to", store_url]) == 0
    assert _counts(store_url)["runs"] == 3 and _counts(store_url)["uids"] == 3


def test_two_pushes_at_once_copy_each_run_once(store_url, tmp_path):
    """The per-run lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock on the run's uid) makes two
    pushers of the same runs wait for each other instead of both inserting."""
    src = _source(tmp_path)
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "harness", "store", "push", "--from", str(src), "--to", store_url],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert _counts(store_url) == {
        "runs": 3,
        "results": 6,
        "samples": 240,
        "uids": 3,
        "history": 2,
        "outcomes": 4,
    }


def _normalized(argv: list[str], url: str, capsys) -> str:
    assert main(argv) == 0
    out = capsys.readouterr().out
    for where in (str(parse(url)), url):
        out = out.replace(where, "<store>")
    return out


def test_the_reports_are_identical_from_either_engine(both_urls, tmp_path, capsys):
    src = _source(tmp_path)
    outputs = []
    for url in both_urls:
        assert main(["store", "push", "--from", str(src), "--to", url]) == 0
        capsys.readouterr()
        outputs.append(
            [
                _normalized(["bench", "show", "latest", "--store", url], url, capsys),
                _normalized(["bench", "show", "1", "--store", url], url, capsys),
                _normalized(
                    ["bench", "history", "--store", url, "--out", str(tmp_path / "plots")], url, capsys
                ),
                _normalized(["bench", "list", "--store", url], url, capsys),
                _normalized(
                    [
                        "bench",
                        "history",
                        "--store",
                        url,
                        "--runner",
                        "box-a",
                        "--hw-class",
                        "h100",
                        "--out",
                        str(tmp_path / "plots"),
                    ],
                    url,
                    capsys,
                ),
                _normalized(["history", "show", "--store", url], url, capsys),
                _normalized(
                    ["history", "show", "--store", url, "--hw-class", "h100", "--failing"], url, capsys
                ),
            ]
        )
    sqlite_out, pg_out = outputs
    assert sqlite_out == pg_out
    assert "softmax.fwd" in sqlite_out[2] and "t::flaky: failed 1 of the last 2 runs" in sqlite_out[5]
    assert sqlite_out[4] == sqlite_out[2]  # every run is box-a's, of class h100
    assert main(["bench", "history", "--store", both_urls[1], "--runner", "box-z"]) == 2  # no run of box-z
    assert "no complete runs" in capsys.readouterr().err


def test_an_unreachable_server_spools_and_strict_exits_3(tmp_path, capsys, monkeypatch):
    spool = tmp_path / "spool" / "store.sqlite"
    with Store(UNREACHABLE, log=print) as store:
        run = _bench_run(store, 0)
        assert store.spooled == spool
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "unreachable" in notes[0] and str(spool) in notes[0] and "***" not in notes[0]
    with Store(spool, readonly=True) as s:
        assert [r.uid for r in s.runs(complete_only=True)] == [run.uid]
    with pytest.raises(StoreUnreachable):
        Store(UNREACHABLE, strict=True)
    folder = fake_run(tmp_path / "r1", {"t::ok": ("passed", 1.0)})
    assert main(["history", "record", str(folder), "--store", UNREACHABLE, "--store-strict"]) == 3
    assert "unreachable" in capsys.readouterr().err
    monkeypatch.delenv("KILN_STORE_STRICT")  # `--store-strict` set it for this process and its children
    assert main(["history", "record", str(folder), "--store", UNREACHABLE]) == 0
    err = capsys.readouterr().err
    assert err.count("spooled to") == 1
    with history.connect(spool, readonly=True) as db:
        assert db.exec_driver_sql("SELECT count(*) FROM history_runs").scalar_one() == 1


def test_a_server_stopped_mid_run_loses_nothing(pg_server, tmp_path, capsys):
    folder = tempfile.mkdtemp(prefix="kiln-pg-outage-")
    script = str(Path(__file__).resolve().parents[3] / "ci" / "postgres.sh")
    try:
        url = subprocess.run(
            [script, "start", folder], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split()[-1]
        with Store(url, log=print) as store:
            run = RunInfo(
                id=None,
                uid=uuid.uuid4().hex,
                created_at=now(),
                device="cpu",
                device_name="cpu: t",
                compilers=["eager"],
            )
            store.begin_run(run)
            store.add_result(run.id, Result("a", "eager", "h", timer="wall", samples=[1.0, 2.0, 3.0]))
            subprocess.run([script, "stop", folder], check=True, timeout=120)
            store.add_result(run.id, Result("b", "eager", "h", timer="wall", samples=[4.0, 5.0]))
            store.save_verdicts(run.id, [Comparison("a", "eager", Verdict.NEW)])
            store.finish_run(run.id)
            assert store.spooled is not None and [x.workload for x in store.results(run.id)] == ["a", "b"]
        assert capsys.readouterr().out.count("results spooled to") == 1
        done = fake_run(tmp_path / "r1", {"t::ok": ("passed", 1.0)})
        history.record(url, done)  # the server still down: spooled too
        subprocess.run([script, "start", folder], check=True, timeout=120, capture_output=True)
        with Store(url, log=print) as store:  # the next run reaches it: the spool is pushed first
            (got,) = store.runs()
            assert got.uid == run.uid and got.status == "complete"
            assert [(x.workload, x.samples) for x in store.results(got.id)] == [
                ("a", [1.0, 2.0, 3.0]),
                ("b", [4.0, 5.0]),
            ]
            assert [v.verdict for v in store.verdicts(got.id)] == ["new"]
        assert "pushed 2 spooled run(s)" in capsys.readouterr().out  # the bench run and the history run
        with history.connect(url, readonly=True) as db:
            assert db.exec_driver_sql("SELECT count(*) FROM history_runs").scalar_one() == 1
        with Store(tmp_path / "spool" / "store.sqlite", readonly=True) as s:
            assert s.runs() == []
    finally:
        subprocess.run([script, "stop", folder], capture_output=True, timeout=120, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def test_kinds_stay_apart_in_one_file(tmp_path):
    """Both stores in one SQLite file (the `sqlite:///` URL's layout), neither seeing the other's tables."""
    db = tmp_path / "both.sqlite"
    for kind in (BENCH, HISTORY):
        open_store(db, kind, write=True).close()
    with Store(db, readonly=True) as s:
        assert s.runs() == []


def test_a_read_only_job_reads_the_fleet_store_and_writes_its_own(store_url, tmp_path, monkeypatch, capsys):
    """KILN_STORE_READ_ONLY (a pull request's job): readers see the fleet store, writers keep their defaults."""
    src = _source(tmp_path)
    assert main(["store", "push", "--from", str(src), "--to", store_url]) == 0
    before = _counts(store_url)
    monkeypatch.setenv("KILN_STORE_URL", store_url)
    monkeypatch.setenv("KILN_STORE_READ_ONLY", "1")
    monkeypatch.setenv("KILN_BENCH_STORE", str(tmp_path / "lasting" / "{backend}.sqlite"))
    capsys.readouterr()
    assert main(["history", "show"]) == 0
    assert "t::flaky: failed 1 of the last 2 runs" in capsys.readouterr().out  # read from the fleet store
    folder = fake_run(tmp_path / "pr-run", {"t::ok": ("passed", 1.0)})
    assert main(["history", "record", str(folder)]) == 0
    local = history.default_path(write=True)
    assert isinstance(local, Path) and local.is_file() and str(tmp_path) not in str(local)
    from harness.bench.cli import open_bench_store

    with open_bench_store(
        None, "cpu", write=True
    ) as store:  # `bench run --lasting cpu`: the runner's own store
        assert store.path == tmp_path / "lasting" / "cpu.sqlite" and store.runs() == []
    with open_bench_store(None, "cpu", write=False) as store:  # the PR's baseline read: the fleet store
        assert len(store.runs(complete_only=True)) == 3
    assert _counts(store_url) == before


def test_push_without_from_takes_this_runners_lasting_stores_and_history(
    store_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("KILN_BENCH_STORE", str(tmp_path / "lasting" / "{backend}.sqlite"))
    # the checkout's results folder is a source too (`nox -s ci` writes results/bench/cpu/bench.sqlite): an
    # empty one here, so that a developer's earlier main job is not pushed with this test's runs
    monkeypatch.setenv("KILN_RESULTS", str(tmp_path / "results"))
    with Store(tmp_path / "lasting" / "cpu.sqlite") as store:
        _bench_run(store, 0)
    history.record(history.default_path(write=True), fake_run(tmp_path / "r1", {"t::ok": ("passed", 1.0)}))
    assert main(["store", "push", "--to", store_url]) == 0
    out = capsys.readouterr().out
    assert out.count("1 run(s) copied") == 2, out
    counts = _counts(store_url)
    assert counts["runs"] == 1 and counts["history"] == 1


def test_bench_backend_hands_the_hosts_identity_to_the_measuring_process(tmp_path, monkeypatch):
    """`bench backend` measures in a container (here natively: the same environment hand-over), whose host name
    is no runner's: the host's runner name and GPU label reach the run it stores."""
    from harness.store import runner

    host = runner.Runner("host-x", "", "", "l40s", "l40s")
    monkeypatch.setattr(runner, "current", lambda device_name="": host)
    monkeypatch.delenv("RUNNER_NAME", raising=False)
    monkeypatch.delenv("KILN_GPU_LABEL", raising=False)
    out = tmp_path / "res"
    assert (
        main(
            [
                "bench",
                "backend",
                "--backend",
                "cpu",
                "--native",
                "--results",
                str(out),
                "--",
                "--compilers",
                "eager",
                "--only",
                "row_sum.*",
                "--target-s",
                "0.01",
                "--quiet",
                "--no-fail",
            ]
        )
        == 0
    )
    with Store(out / "bench.sqlite", readonly=True) as s:
        (run,) = s.runs()
        assert (run.runner, run.gpu_label, run.hw_class) == ("host-x", "l40s", "l40s")


def test_push_takes_the_checkouts_bench_store_and_says_when_there_is_none(tmp_path):
    """`store push --to sqlite:///...` on a developer's machine: the bench store `nox -s ci`/`nox -s bench` write
    (results/bench/<backend>/bench.sqlite) is pushed with the test history; with no bench store anywhere, a note
    says where it looked (never a silent history-only push)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KILN_")},
        "PYTHONPATH": str(ROOT),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "KILN_RESULTS": str(tmp_path / "results"),
        "KILN_BENCH_STORE": str(tmp_path / "no-lasting" / "{backend}.sqlite"),
    }
    history.record(
        tmp_path / "data" / "kiln" / "history" / "history.sqlite",
        fake_run(tmp_path / "r1", {"t::ok": ("passed", 1.0)}),
    )

    def push(to: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", "store", "push", "--to", f"sqlite:///{to}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    alone = push(tmp_path / "fleet1.sqlite")
    assert alone.returncode == 0, alone.stderr
    assert "note: no bench store on this runner to push (looked for" in alone.stderr
    assert str(tmp_path / "results" / "bench" / "cpu" / "bench.sqlite") in alone.stderr
    local = tmp_path / "results" / "bench" / "cpu" / "bench.sqlite"
    local.parent.mkdir(parents=True)
    with Store(local) as store:
        _bench_run(store, 0)
    both = push(tmp_path / "fleet2.sqlite")
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("1 run(s) copied") == 2, both.stdout
    counts = _counts(tmp_path / "fleet2.sqlite")
    assert counts["runs"] == 1 and counts["history"] == 1
