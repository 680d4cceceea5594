"""Copying runs between two stores by their UUID: `store push` / `store pull`, and the spool's drain.

Terms:
  run key    a bench run's `uid`, a history run's `uid` (revision 2): the run's identity in every store. Row
             ids (`id`, `run_id`, `result_id`) are each store's own and are remapped on the way.
  finished   a bench run whose status is not `running` (complete or aborted); a history run always is.
             Unfinished runs are left where they are (a run still being written, or one whose writer was
             killed) and counted as such.
  copy       one run and its rows (bench: results, samples, verdicts; history: outcomes, retries) inserted in
             ONE transaction of the destination: a killed copy leaves nothing of that run, so running the
             copy again resumes where it stopped (runs already there are skipped by key).
  replace    a destination run left `running` (its writer lost the server mid-run and spooled the run) whose
             source copy is finished is deleted (its rows cascade) and copied again, in one transaction.
  runner fill  a source run recorded before revision 3/2 names no runner: the copy records `fill_runner` (the
             machine pushing its own stores is the one that recorded them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Table, delete, insert, select, text

from . import tables as t
from .migrate import BENCH, StoreKind
from .sqlite import inserted_id, transaction


@dataclass
class Copied:
    """What a copy did, per store kind."""

    added: int = 0
    present: int = 0
    replaced: int = 0
    unfinished: int = 0
    uids: list[str] = field(
        default_factory=list
    )  # the runs now in the destination (added, present, replaced)

    def line(self, label: str) -> str:
        tail = f", {self.unfinished} unfinished left behind" if self.unfinished else ""
        again = f", {self.replaced} replaced (left running there)" if self.replaced else ""
        return f"{label}: {self.added} run(s) copied, {self.present} already there{again}{tail}"


def _tables(kind: StoreKind) -> tuple[Table, list[tuple[Table, str]]]:
    if kind is BENCH:
        return t.runs, [(t.results, "run_id"), (t.verdicts, "run_id")]
    return t.history_runs, [(t.history_outcomes, "run_id"), (t.history_retries, "run_id")]


def _rows(db: Connection, table: Table, where) -> list[dict]:
    return [dict(r) for r in db.execute(select(table).where(where)).mappings()]


def _copy_one(src: Connection, dst: Connection, kind: StoreKind, run: dict, fill_runner: str) -> None:
    runs, children = _tables(kind)
    row = {k: v for k, v in run.items() if k != "id"}
    if not row.get("runner"):
        row["runner"] = fill_runner
    new_id = inserted_id(dst.execute(insert(runs).values(**row)))
    for table, fk in children:
        rows = _rows(src, table, table.c[fk] == run["id"])
        if not rows:
            continue
        if table is t.results:
            for r in rows:
                old = r.pop("id")
                rid = inserted_id(dst.execute(insert(t.results).values(**{**r, fk: new_id})))
                samples = [
                    {**s, "result_id": rid} for s in _rows(src, t.samples, t.samples.c.result_id == old)
                ]
                if samples:
                    dst.execute(insert(t.samples), samples)
        else:
            dst.execute(
                insert(table), [{k: v for k, v in r.items() if k != "id"} | {fk: new_id} for r in rows]
            )


def copy_runs(
    src: Connection,
    dst: Connection,
    kind: StoreKind,
    *,
    what: str,
    fill_runner: str = "",
    uids: set[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Copied:
    """Copy every finished run of `src` (of `uids`, if given) missing from `dst` (see the module docstring);
    both are connections opened at the head revision outside any transaction."""
    runs, _ = _tables(kind)
    bench = kind is BENCH
    with src.begin():
        listed = [dict(r) for r in src.execute(select(runs).order_by(runs.c.id)).mappings()]
    out = Copied()
    for n, run in enumerate(listed):
        if uids is not None and run["uid"] not in uids:
            continue
        if bench and run["status"] == "running":
            out.unfinished += 1
            continue
        with transaction(dst, write=True, error=kind.error, what=what) as db:
            if db.dialect.name == "postgresql":  # two pushers of one run wait for each other (SQLite: BEGIN
                db.execute(
                    text("SELECT pg_advisory_xact_lock(hashtext(:u))"), {"u": run["uid"]}
                )  # IMMEDIATE)
            there = db.execute(
                select(runs.c.id, *([runs.c.status] if bench else [])).where(runs.c.uid == run["uid"])
            ).first()
            if there is not None and not (bench and there[1] == "running"):
                out.present += 1
            else:
                if there is not None:
                    db.execute(delete(runs).where(runs.c.id == there[0]))
                    out.replaced += 1
                else:
                    out.added += 1
                with src.begin():
                    _copy_one(src, db, kind, run, fill_runner)
        out.uids.append(run["uid"])
        if progress:
            progress(n)
    return out


def delete_runs(db: Connection, kind: StoreKind, uids: list[str], *, what: str) -> None:
    """Delete the runs `uids` (their rows cascade) from the store behind `db`, in one transaction."""
    runs, _ = _tables(kind)
    if uids:
        with transaction(db, write=True, error=kind.error, what=what) as conn:
            for i in range(0, len(uids), 500):
                conn.execute(delete(runs).where(runs.c.uid.in_(uids[i : i + 500])))
