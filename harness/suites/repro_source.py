"""Where `harness repro` reads a run from: a results folder, a CI artifact (a zip, or the folder
download-artifact extracts), or a run of the test-history store (KILN_STORE_URL, `--store`, else the local
history file).

Terms:
  source      what the command line names, resolved into a `RunSource`: the run's record (run.json as
              harness.record.RunRecord), its failing tests, the suites that never ran theirs, and what env.json
              says of the hardware and versions it ran on.
  artifact    a zip (members are checked to stay inside the folder it is extracted into) or a folder that
              holds one or more run folders (a folder with run.json) at any depth up to MAX_DEPTH; the run
              folders of a merged run's shards count as that run. With several runs, `--run NAME` picks one,
              else the latest started.
  store run   a row of `history_runs` named by its uid, its folder's name or its row id. When the folder it
              names is on this machine, its run.json is read; else a record is rebuilt from the row: commit,
              backend, mode (the folder name ends in -native or -container), failing tests; the image, the
              environment and the seeds are then those of the commit's matrix (`from_store` says so).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.exc import HarnessError, ResultsError
from harness.record import FAILING, RunRecord, RunStatus
from harness.suites.collect import RunResults, load_run

MAX_DEPTH = 4


@dataclass(frozen=True)
class Failing:
    """One failing test of the run: its suite, node id, outcome and the first line of its message."""

    suite: str
    id: str
    outcome: str
    headline: str = ""


@dataclass(frozen=True)
class RunSource:
    """A run to reproduce (module docstring). `records` maps a test id to the record of the run (or shard) that
    ran it, when it differs from `record`."""

    where: str
    record: RunRecord
    failing: tuple[Failing, ...]
    broken: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    folder: Path | None = None
    from_store: bool = False
    records: Mapping[str, RunRecord] = field(default_factory=dict)
    note: str = ""

    def record_for(self, test_id: str) -> RunRecord:
        return self.records.get(test_id, self.record)

    @property
    def commit(self) -> str | None:
        """The git sha the run tested: the record's `commit`, else None."""
        sha = (self.record.commit or {}).get("sha")
        return str(sha) if sha else None


# ---- folders and artifacts -------------------------------------------------------------------------------


def extract_zip(path: Path, dest: Path) -> Path:
    """Extract the zip at `path` into `dest` (made); a member that would land outside it is a ResultsError."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                target = (dest / name).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise ResultsError(
                        f"{path}: member {name!r} would be extracted outside its folder; not a "
                        "harness artifact"
                    )
            z.extractall(dest)
    except zipfile.BadZipFile as e:
        raise ResultsError(f"{path} is not a readable zip ({e})") from None
    return dest


def run_folders(folder: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """The run folders (a run.json inside) at or below `folder`, at most `depth` levels down, in name order;
    a run folder's own sub-folders (a merged run's shards) are not searched."""
    if (folder / "run.json").is_file():
        return [folder]
    if depth == 0:
        return []
    found: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
        found += run_folders(child, depth - 1)
    return found


def pick_run(folders: list[Path], given: str, name: str | None) -> tuple[Path, str]:
    """(the run folder to reproduce, a note naming the choice when there was one) of `folders` found in
    `given`: the one named `name`, else the only one, else the latest started."""
    if not folders:
        raise ResultsError(f"{given} holds no run.json: neither a results folder nor a harness artifact")
    if name:
        named = [f for f in folders if f.name == name]
        if not named:
            raise ResultsError(f"no run {name!r} in {given}; it holds {', '.join(f.name for f in folders)}")
        return named[0], ""
    if len(folders) == 1:
        return folders[0], ""

    def started(f: Path) -> str:
        try:
            return str(json.loads((f / "run.json").read_text()).get("started") or "")
        except (OSError, ValueError, AttributeError):
            return ""

    chosen = max(folders, key=lambda f: (started(f), f.name))
    return chosen, (
        f"{given} holds {len(folders)} runs; reproducing {chosen.name}, the latest started "
        "(--run NAME picks another)"
    )


def _env_facts(folder: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """(GPU models, versions python/torch/triton/cuda/hip) a run folder's env.json records; empty when absent."""
    try:
        env = json.loads((folder / "env.json").read_text())
    except (OSError, ValueError):
        return (), {}
    device = env.get("device") if isinstance(env, dict) else None
    if not isinstance(device, dict):
        return (), {}
    versions = {k: str(device[k]) for k in ("python", "torch", "triton", "cuda", "hip") if device.get(k)}
    return tuple(str(g) for g in device.get("gpus") or ()), versions


def from_results(run: RunResults, where: str, note: str = "") -> RunSource:
    """The RunSource of a loaded results folder: its failing tests, the suites that never ran theirs, env.json's
    facts (a merged run's from its first shard)."""
    failing = tuple(Failing(suite, t.id, str(t.outcome), t.headline) for suite, t in run.failing)
    broken = tuple(
        f"{s.name}: {s.record.collect_failed or s.record.ended_badly}"
        for s in run.suites
        if s.record.collect_failed or s.record.ended_badly
    )
    records = {f.id: run.record_for(f.id) for f in failing if run.record_for(f.id) is not run.record}
    record = run.record
    env_folder = run.path
    if run.merged and run.shard_runs:
        first = run.shard_runs[min(run.shard_runs)]
        env_folder = first.path
        if record.commit is None:  # a merged record written before `commit` was shared: its shard's
            record = replace(record, commit=first.record.commit)
    gpus, versions = _env_facts(env_folder)
    if record.commit is None:
        from harness.suites.history import folder_commit

        sha = folder_commit(env_folder)
        if sha:
            record = replace(record, commit={"sha": sha})
    return RunSource(where, record, failing, broken, gpus, versions, run.path, False, records, note)


def from_path(given: str, scratch: Path, run_name: str | None = None) -> RunSource:
    """The RunSource of a results folder, an artifact folder or an artifact zip (extracted under `scratch`)."""
    path = Path(given).expanduser()
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise ResultsError(
                f"{given} is a file but not a zip: give a results folder, an artifact (zip or "
                "folder) or a run id of the store"
            )
        path = extract_zip(path, scratch / "artifact")
    elif not path.is_dir():
        raise ResultsError(f"{given} does not exist")
    folder, note = pick_run(run_folders(path.resolve()), given, run_name)
    return from_results(load_run(folder), given, note)


# ---- the store -------------------------------------------------------------------------------------------


def _mode_of_folder(folder: str) -> str:
    name = Path(folder).name
    return "native" if "-native" in name else "container" if "-container" in name else ""


def store_row(location: Any, run_id: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(the history_runs row named `run_id`: uid, folder name or row id; its failing (node id, outcome)) in the
    store at `location`, read-only."""
    from sqlalchemy import or_, select

    from harness.store import tables as t
    from harness.suites.history import connect

    r, o = t.history_runs.c, t.history_outcomes.c
    by = [r.uid == run_id, r.folder.like(f"%/{run_id}")]
    if run_id.isdigit():
        by.append(r.id == int(run_id))
    with connect(location, readonly=True) as db:
        rows = [dict(x) for x in db.execute(select(t.history_runs).where(or_(*by)).order_by(r.id)).mappings()]
        if not rows:
            raise ResultsError(
                f"no run {run_id!r} in the store {location} (give its uid, folder name or id; "
                "`python -m harness history show` lists what it holds)"
            )
        if len({x["uid"] for x in rows}) > 1:
            raise ResultsError(
                f"{len(rows)} runs of the store {location} match {run_id!r}; give one's uid: "
                + ", ".join(str(x["uid"]) for x in rows[:5])
            )
        row = rows[0]
        failing = [
            (str(n), str(oc))
            for n, oc in db.execute(
                select(o.node_id, o.outcome)
                .where(o.run_id == row["id"], o.outcome.in_(FAILING))
                .order_by(o.node_id)
            ).all()
        ]
    return row, list(dict.fromkeys(failing))


def from_store_row(row: Mapping[str, Any], failing: list[tuple[str, str]], where: str) -> RunSource:
    """The RunSource of a store row (module docstring): its folder's when that is on this machine, else rebuilt."""
    folder = Path(str(row.get("folder") or ""))
    if folder.is_absolute() and (folder / "run.json").is_file():
        src = from_results(
            load_run(folder),
            where,
            f"the store's run {row.get('uid')} is the folder {folder} on this machine: its run.json is read",
        )
        return src
    commit = {"sha": row["git_commit"]} if row.get("git_commit") else None
    record = RunRecord(
        run_id=folder.name or str(row.get("uid") or ""),
        backend=str(row["backend"]),
        status=RunStatus.COMPLETE,
        mode=_mode_of_folder(str(folder)),
        started=row.get("date"),
        commit=commit,
    )
    tests = tuple(
        Failing(n.split("/")[1] if n.startswith("tests/") and n.count("/") > 1 else "", n, oc)
        for n, oc in failing
    )
    gpus = (str(row["gpu_model"]),) if row.get("gpu_model") else ()
    return RunSource(
        where,
        record,
        tests,
        gpus=gpus,
        from_store=True,
        note=f"the store keeps no image, environment or seeds of run {row.get('uid')}: they come from "
        "the commit's matrix",
    )


def from_store(run_id: str, location: Any = None) -> RunSource:
    """The RunSource of a run of the test-history store (default: KILN_STORE_URL, else the history file)."""
    from harness.suites.history import default_path

    where = location if location is not None else default_path()
    if isinstance(where, Path) and not where.is_file():
        raise ResultsError(
            f"{run_id} is not a results folder or an artifact, and there is no store to look it "
            f"up in ({where} does not exist; set KILN_STORE_URL or give --store URL)"
        )
    row, failing = store_row(where, run_id)
    return from_store_row(row, failing, f"run {run_id} of the store {where}")


def open_source(given: str, scratch: Path, run_name: str | None = None) -> RunSource:
    """What `harness repro GIVEN` reproduces: a path (folder or zip) when one exists or looks like one, else a
    run of the store."""
    if Path(given).expanduser().exists() or given.endswith(".zip") or "/" in given:
        return from_path(given, scratch, run_name)
    try:
        return from_store(given)
    except HarnessError:
        raise
    except Exception as e:  # noqa: BLE001 - the store's own failures arrive as SQLAlchemy errors
        raise ResultsError(f"cannot read run {given!r} from the store: {type(e).__name__}: {e}") from None
