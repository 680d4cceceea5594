"""Merging the shards of one run (`harness run --shard I/N`, one folder each, e.g. from the jobs of a CI
matrix) into one results folder with one report: `python -m harness merge DIR... --out OUT`.

OUT gets each shard's folder as OUT/shard-I/ (copied unless it is there already), env.json from the first
shard, run.json with `shards` (a harness.record.ShardRecord per shard 1..N: status, reason, GPUs, wall
seconds, folder) and the reports (harness.suites.report). The merged run is `complete` when every shard is; a shard that crashed, hung,
was interrupted, failed its health check or is missing makes it `incomplete` (the reason names the shard),
while the other shards' results stand. The shards must agree: each suite's shard records (written by
harness.suites.shard_plugin) must show the same collected tests and durations, disjoint selections that cover
every collected test when all shards are there, and no test may appear in two shards' JUnit files;
otherwise the merged run is `inconsistent`.

Failed tests a shard reran alone (harness.suites.retries) keep their verdicts (flaky or failing) and attempts' logs in
that shard's run.json and folder; the merged report reads them from there, so a flaky test in one shard leaves
the merged run green. `--history DB` records the merged run into the test history.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import results as res
from harness.exc import ResultsError
from harness.record import SHARED_KEYS, RunRecord, RunStatus, ShardRecord, ShardStatus, SuiteRecord
from harness.suites.collect import read_record

MAX_PROBLEMS = 20
SHARD_STATUSES = tuple(ShardStatus)


@dataclass(frozen=True)
class ShardProcess:
    """What the process that ran a shard next to the others saw (harness.suites.sharded): exit status, wall
    seconds, whether it was killed for running past its time, its GPUs."""

    returncode: int | None
    wall_s: float
    hung: bool = False
    devices: tuple[str, ...] = ()


def shard_dir_name(index: int) -> str:
    return f"shard-{index}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _read(folder: Path | None) -> RunRecord | None:
    """The record of a shard's folder, None when it has none or an unreadable one."""
    if folder is None or not (folder / "run.json").is_file():
        return None
    try:
        return read_record(folder)
    except ResultsError:
        return None


def shard_state(
    record: RunRecord | None, proc: ShardProcess | None, log: str = ""
) -> tuple[ShardStatus, str]:
    """(status, reason) of one shard from its record and, for a local shard, its process."""
    see = f"; see {log}" if log else ""
    if proc is not None and proc.hung:
        return ShardStatus.HUNG, f"killed after {proc.wall_s:.0f}s without finishing{see}"
    if record is None:
        if proc is None:
            return ShardStatus.MISSING, "no results folder for this shard"
        return ShardStatus.CRASHED, f"exit {proc.returncode} before writing run.json{see}"
    if record.status == RunStatus.COMPLETE:
        return ShardStatus.COMPLETE, ""
    if (
        record.status == RunStatus.RUNNING
    ):  # its process died without a word: a crash, or a kill (a job timeout)
        rc = f" (exit {proc.returncode})" if proc is not None else " (crashed, or killed: a job timeout?)"
        return ShardStatus.CRASHED, f"stopped without finishing{rc}{see}"
    if record.status in (RunStatus.INCOMPLETE, RunStatus.ABORTED):
        return ShardStatus(record.status.value), record.reason or ""
    return ShardStatus.CRASHED, f"run.json says {str(record.status)!r}"


def _shard_json(folder: Path, suite: SuiteRecord) -> dict[str, Any] | None:
    """The shard record harness.suites.shard_plugin wrote next to the suite's JUnit (`<suite>.shard.json`)."""
    path = folder / Path(suite.junit).with_suffix(".shard.json") if suite.junit else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def consistency_problems(folders: dict[int, Path], records: dict[int, RunRecord], count: int) -> list[str]:
    """Why the shards do not partition the tests (empty when they do, as far as the shards present tell)."""
    from harness.suites.collect import load_run

    problems: list[str] = []
    suites: dict[str, dict[int, dict[str, Any] | None]] = {}
    quarantines = {
        i: json.dumps(r.quarantine, sort_keys=True) for i, r in records.items() if r.quarantine is not None
    }
    if (
        len(set(quarantines.values())) > 1
    ):  # the merged run is judged by one quarantine: the shards' must agree
        problems.append(
            "the shards ran under different quarantines (run.json `quarantine`): "
            + "; ".join(
                f"shard {i}: {len((records[i].quarantine or {}).get('entries') or [])} entries"
                for i in sorted(quarantines)
            )
        )
    for index, record in sorted(records.items()):
        shard = record.shard
        if shard is None or shard.index != index or shard.count != count:
            got = f"{shard.index}/{shard.count}" if shard is not None else "None/None"
            problems.append(f"{folders[index]} is shard {got}, not {index}/{count}")
        for suite in record.suites:
            if suite.status in ("missing", "error", "timeout") and not suite.junit:
                continue
            suites.setdefault(suite.name, {})[index] = _shard_json(folders[index], suite)
    for name, found in sorted(suites.items()):
        present = {i: r for i, r in found.items() if r is not None}
        lacking = sorted(i for i, r in found.items() if r is None)
        statuses = {i: next(s.status for s in records[i].suites if s.name == name) for i in lacking}
        lacking = [
            i for i in lacking if statuses[i] not in ("error", "timeout")
        ]  # a broken suite says so itself
        if lacking:
            problems.append(
                f"suite {name}: shard(s) {', '.join(map(str, lacking))} wrote no shard record "
                "(was the suite run without --shard?)"
            )
        if len({r.get("collected_sha256") for r in present.values()}) > 1:
            sizes = ", ".join(f"shard {i}: {r.get('collected')}" for i, r in sorted(present.items()))
            problems.append(
                f"suite {name}: the shards collected different tests ({sizes}); "
                "a test may have run in two shards or in none"
            )
        if len({r.get("durations_sha256") for r in present.values()}) > 1:
            problems.append(f"suite {name}: the shards were balanced with different durations files")
        seen: dict[str, int] = {}
        for i, r in sorted(present.items()):
            for test in r.get("selected", []):
                if test in seen:
                    problems.append(f"suite {name}: {test} was selected by shards {seen[test]} and {i}")
                seen.setdefault(test, i)
        collected = {r.get("collected") for r in present.values()}
        if len(present) == count and len(collected) == 1 and len(seen) != collected.pop():
            problems.append(
                f"suite {name}: the shards selected {len(seen)} tests of {present[1].get('collected')}"
            )
    ran: dict[str, int] = {}
    for index in sorted(records):
        try:
            run = load_run(folders[index])
        except ResultsError:
            continue
        for suite_results in run.suites:
            for t in suite_results.tests:
                if t.id in ran and ran[t.id] != index:
                    problems.append(f"{t.id} ran in shards {ran[t.id]} and {index}")
                ran.setdefault(t.id, index)
    return problems


def _place(out: Path, folders: dict[int, Path]) -> dict[int, Path]:
    """Copy each shard's folder to OUT/shard-I (unless it is there already); index -> its place."""
    placed: dict[int, Path] = {}
    for index, folder in sorted(folders.items()):
        target = out / shard_dir_name(index)
        folder = Path(folder).resolve()
        if folder != target:
            if target.exists():
                shutil.rmtree(target)
            if folder.is_dir():
                shutil.copytree(folder, target)
        placed[index] = target
    return placed


def merge_shards(
    out: Path,
    folders: dict[int, Path],
    count: int,
    *,
    processes: dict[int, ShardProcess] | None = None,
    base: RunRecord | None = None,
    history: str | None = None,
    wall_s: float | None = None,
    reason: str = "",
):
    """Merge shard folders (index -> folder; absent indexes are missing shards) into `out`; returns the
    report's Summary. `processes`: what the local shard processes did; `base`: the record's fields for when no
    shard wrote a run.json; `history`: the test-history store the merged run records into (else `base`'s);
    `reason`: why the whole run stopped early (an interrupt), if it did."""
    from harness.suites import report
    from harness.suites.collect import load_run

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    processes = processes or {}
    placed = _place(out, folders)
    records = {i: r for i, r in ((i, _read(f)) for i, f in placed.items()) if r is not None}
    first = records[min(records)] if records else None
    shards, stopped = [], []
    for index in range(1, count + 1):
        proc = processes.get(index)
        log = f"{shard_dir_name(index)}.log"
        log = log if proc is not None and (out / log).exists() else ""
        status, why = shard_state(records.get(index), proc, log)
        rec = records.get(index)
        shards.append(
            ShardRecord(
                index,
                count,
                status,
                why,
                shard_dir_name(index) if index in placed and placed[index].is_dir() else "",
                tuple(proc.devices) if proc is not None else (rec.devices if rec else ()),
                proc.wall_s if proc is not None else (rec.wall_s if rec else None),
                rec.run_id if rec else None,
                rec.started if rec else None,
                rec.finished if rec else None,
            )
        )
        if status != ShardStatus.COMPLETE:
            stopped.append(f"shard {index}/{count} {status}" + (f": {why}" if why else ""))
    problems = consistency_problems(placed, records, count)
    if len(problems) > MAX_PROBLEMS:
        problems = problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more"]
    run_status = (
        RunStatus.INCONSISTENT
        if problems
        else RunStatus.INCOMPLETE
        if stopped or reason
        else RunStatus.COMPLETE
    )
    reasons = ([reason] if reason else []) + stopped + problems
    starts = [s.started for s in shards if s.started]
    like = first or base or RunRecord("", "", RunStatus.RUNNING)
    shared = {k: getattr(like, k) for k in SHARED_KEYS}
    if first is not None and first.quarantine is None and base is not None:
        shared["quarantine"] = base.quarantine
    merged = replace(
        RunRecord(out.name, like.backend, run_status),
        **shared,
        history=history if history is not None else (base.history if base else None),
        started=min(starts, default=None),
        finished=_now(),
        shard_count=count,
        shards=tuple(shards),
        problems=tuple(problems),
        wall_s=round(wall_s, 2) if wall_s is not None else None,
        reason="; ".join(reasons) if reasons else None,
    )
    for index in sorted(records):
        env = placed[index] / "env.json"
        if env.is_file():
            shutil.copyfile(env, out / "env.json")
            break
    res.atomic_write_json(out / "run.json", merged.to_json())
    return report.write_reports(load_run(out))


def find_shards(paths: Sequence[Path], exclude: Path | None = None) -> tuple[dict[int, Path], int]:
    """(shard index -> folder, shard count) of the shard results folders in or under `paths` (a shard's
    folder, a merged run's folder, or any folder holding them, e.g. downloaded CI artifacts). `exclude`
    (the merge's output folder) is not searched when it lies below one of `paths`."""
    found: dict[int, Path] = {}
    counts: dict[int, Path] = {}
    skip = Path(exclude).resolve() if exclude is not None else None
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise ResultsError(f"{path} is not a folder")
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if (Path(dirpath) / d).resolve() != skip)
            if "run.json" not in filenames:
                continue
            record = _read(Path(dirpath))
            shard = record.shard if record is not None else None
            if shard is None:
                continue  # a merged run's own run.json, or not a shard: look below it
            dirnames.clear()  # a shard's folder holds no other shard
            folder = Path(dirpath).resolve()
            index, count = shard.index, shard.count
            if index in found and found[index] != folder:
                raise ResultsError(f"two folders hold shard {index}/{count}: {found[index]} and {folder}")
            found[index] = folder
            counts.setdefault(count, folder)
    if not found:
        raise ResultsError(
            "no shard results folders (run.json of a `--shard I/N` run) in " + ", ".join(map(str, paths))
        )
    if len(counts) > 1:
        raise ResultsError(
            "the folders are shards of different splits: "
            + ", ".join(f"{folder} of {count}" for count, folder in sorted(counts.items()))
        )
    return found, next(iter(counts))


# ---- CLI: `python -m harness merge DIR... --out OUT` -----------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="shard results folders, or folders that hold them (CI artifacts)")
    p.add_argument(
        "--out", required=True, help="merged results folder to write (shards copied into shard-I/)"
    )
    p.add_argument("--markdown", action="store_true", help="print markdown instead of text")
    p.add_argument("--check", action="store_true", help="exit 1 unless every shard is complete and green")
    p.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the markdown report to $GITHUB_STEP_SUMMARY when it is set",
    )
    p.add_argument("--history", metavar="DB", help="record the merged run into this test-history store")
    from harness.store.cli import add_store_flags

    add_store_flags(p)


def cli_main(args: argparse.Namespace) -> int:
    """Merge the shards of a run into one results folder and report (`--check`: exit 1 unless green)."""
    from harness.suites import report
    from harness.suites.collect import load_run

    res.output_folder(args.out, "--out")  # a file there: one line, before anything is copied
    folders, count = find_shards([Path(d) for d in args.dirs], exclude=Path(args.out))
    history: Any = str(Path(args.history).resolve()) if args.history else None
    if history is None and getattr(args, "store", None):  # `--store URL`: the merged run goes there
        from harness.suites.history import plan_location

        history = plan_location(None)
    summary = merge_shards(Path(args.out), folders, count, history=str(history) if history else None)
    if history and summary.status == "complete":
        from harness.suites.history import record_or_warn

        record_or_warn(Path(history) if isinstance(history, str) else history, Path(args.out), out=sys.stderr)
        summary = report.write_reports(Path(args.out))
    run = load_run(args.out)
    print(report.render_markdown(run) if args.markdown else report.render_text(run), end="")
    if args.github_summary:
        res.append_job_summary(report.render_markdown(run), force=True)
    return 1 if args.check and not summary.ok else 0
