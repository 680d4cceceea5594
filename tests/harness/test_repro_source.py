"""Where `harness repro` reads a run from (harness/suites/repro_source.py): a results folder, an artifact zip or
folder, a run of the test-history store."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from test_record import write_schema1_run

from harness.exc import ResultsError
from harness.suites import history
from harness.suites.repro_source import extract_zip, from_path, from_store, open_source, run_folders

SHA = "0123456789abcdef0123456789abcdef01234567"
FAILING = [
    "tests/alpha/test_a.py::test_flaky",
    "tests/alpha/test_a.py::test_q",
    "tests/alpha/test_a.py::test_crash",
]


def run_folder(
    folder: Path, *, started: str = "2026-11-01T10:00:00+00:00", gpus: tuple[str, ...] = ()
) -> Path:
    """A finished native cpu run (test_record's schema-1 run: three failing tests) with an env.json naming SHA."""
    write_schema1_run(folder, Path("/ci/src"))
    data = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**data, "started": started}))
    (folder / "env.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "host": {"git": {"sha": SHA, "dirty": False}},
                "device": {"python": "3.11.2", "torch": "2.13.0", "triton": "3.9.0", "gpus": list(gpus)},
            }
        )
    )
    return folder


def zip_folder(folder: Path, dest: Path) -> Path:
    """`folder`'s contents zipped as upload-artifact does: paths relative to it."""
    with zipfile.ZipFile(dest, "w") as z:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                z.write(f, f.relative_to(folder).as_posix())
    return dest


def test_a_results_folder_gives_its_failing_tests_commit_and_the_hardware_env_json_records(tmp_path):
    folder = run_folder(tmp_path / "20261101T100000Z-cpu-native", gpus=("NVIDIA H100 80GB HBM3",))
    src = from_path(str(folder), tmp_path / "scratch")
    assert [f.id for f in src.failing] == FAILING
    assert {f.suite for f in src.failing} == {"alpha"} and src.failing[0].outcome == "failed"
    assert src.commit == SHA  # a schema-1 run.json has no `commit`: env.json's host.git
    assert src.gpus == ("NVIDIA H100 80GB HBM3",) and src.versions["torch"] == "2.13.0"
    assert src.record.env["PYTHONHASHSEED"] == "0" and not src.from_store and src.note == ""


def test_an_artifact_zip_with_several_runs_takes_the_latest_started_unless_one_is_named(tmp_path):
    art = tmp_path / "art"
    run_folder(art / "20261101T100000Z-cpu-native", started="2026-11-01T10:00:00+00:00")
    run_folder(art / "20261102T100000Z-cpu-native", started="2026-11-02T10:00:00+00:00")
    (art / "logs").mkdir()
    (art / "logs" / "build-cpu.log").write_text("x\n")
    zipped = zip_folder(art, tmp_path / "results-cpu.zip")
    src = from_path(str(zipped), tmp_path / "scratch")
    assert src.record.run_id == "20261102T100000Z-cpu-native"
    assert "holds 2 runs" in src.note and "--run NAME" in src.note
    assert src.folder is not None and src.folder.is_relative_to(tmp_path / "scratch" / "artifact")
    named = from_path(str(zipped), tmp_path / "scratch2", "20261101T100000Z-cpu-native")
    assert named.record.run_id == "20261101T100000Z-cpu-native" and named.note == ""
    with pytest.raises(ResultsError, match="no run 'nope'"):
        from_path(str(zipped), tmp_path / "scratch3", "nope")


def test_a_downloaded_artifact_folder_is_searched_but_not_inside_a_run_folder(tmp_path):
    art = tmp_path / "download" / "results-cpu"
    run = run_folder(art / "results" / "20261101T100000Z-cpu-native")
    run_folder(run / "shard-1")  # a merged run's shard: part of its run, not another run
    assert run_folders(tmp_path / "download") == [run]
    assert from_path(str(tmp_path / "download"), tmp_path / "s").record.run_id == run.name


def test_a_zip_member_that_escapes_its_folder_is_refused(tmp_path):
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../escaped.txt", "x")
    with pytest.raises(ResultsError, match="outside its folder"):
        extract_zip(bad, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: p / "missing-folder", "does not exist"),
        (lambda p: (p / "notes.txt").write_text("hi") and p / "notes.txt", "is a file but not a zip"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no run.json"),
    ],
)
def test_what_is_not_a_run_is_one_line(tmp_path, make, says):
    with pytest.raises(ResultsError) as e:
        from_path(str(make(tmp_path)), tmp_path / "scratch")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_store_run_is_found_by_uid_folder_name_or_id_and_read_from_its_folder_when_here(tmp_path):
    folder = run_folder(tmp_path / "20261101T100000Z-cpu-native")
    db = tmp_path / "history.sqlite"
    rec = history.record(db, folder)
    with history.connect(db, readonly=True) as conn:
        uid = conn.exec_driver_sql("SELECT uid, git_commit FROM history_runs").first()
    assert uid[1] == SHA  # the commit is recorded from env.json's host.git
    for key in (uid[0], folder.name, str(rec.run_id)):
        src = from_store(key, db)
        assert [f.id for f in src.failing] == FAILING and not src.from_store and "on this machine" in src.note


def test_a_store_run_whose_folder_is_gone_is_rebuilt_from_its_row(tmp_path):
    folder = run_folder(tmp_path / "20261101T100000Z-cpu-native")
    db = tmp_path / "history.sqlite"
    history.record(db, folder)
    shutil.rmtree(folder)
    src = from_store(folder.name, db)
    assert src.from_store and src.record.mode == "native" and src.record.backend == "cpu"
    assert src.commit == SHA and sorted(f.id for f in src.failing) == sorted(FAILING)
    assert src.failing[0].suite == "alpha" and src.record.env == {}
    assert "keeps no image, environment or seeds" in src.note
    with pytest.raises(ResultsError, match="no run 'nope' in the store"):
        from_store("nope", db)


def test_a_bare_name_without_a_store_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HISTORY_DB", str(tmp_path / "none.sqlite"))
    with pytest.raises(ResultsError, match="KILN_STORE_URL"):
        open_source("20261101T100000Z-cpu-native", tmp_path / "scratch")
