"""The local spool: where a writer keeps its runs while the store's server is unreachable.

Terms:
  spool     a SQLite file on the runner (KILN_STORE_SPOOL, default spool/store.sqlite in the lasting data folder),
            holding both stores' tables at the head revision, written exactly as a file store is.
  spooling  a writer (bench run, history record) that cannot reach the server says so in one line and writes
            into the spool instead; its verdict is not changed. With `--store-strict` (KILN_STORE_STRICT=1) the
            unreachable server is an error instead (exit 3).
  drain     the next writer that reaches the server first copies every finished spooled run into it (by UUID:
            harness/store/sync.py, one transaction per run, so a killed drain resumes) and deletes the copied
            runs from the spool, with one note line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .migrate import BENCH, HISTORY, open_store
from .sync import copy_runs, delete_runs
from .url import ServerURL


def path() -> Path:
    from harness.settings import fleet_settings

    return fleet_settings().spool


def strict(flag: bool | None = None) -> bool:
    """`--store-strict` when given, else KILN_STORE_STRICT."""
    from harness.settings import fleet_settings

    return fleet_settings().strict if flag is None else flag


def spooling_line(e: Exception, where: Path) -> str:
    return f"note: {e}; results spooled to {where}: the next run that reaches the server pushes them"


def drain(server: ServerURL, say: Callable[[str], None]) -> int:
    """Push the spool's finished runs into `server` and delete them from the spool (see the module docstring);
    returns the runs pushed. Nothing to do without a spool file. Unreachable server: StoreUnreachable."""
    spool = path()
    if not spool.is_file() or not spool.stat().st_size:
        return 0
    from .runner import current

    pushed = 0
    for kind in (BENCH, HISTORY):
        src = open_store(spool, kind, write=True, say=say)
        try:
            dst = open_store(server, kind, write=True, say=say)
            try:
                done = copy_runs(
                    src.conn, dst.conn, kind, what=f"{kind.label} {server}", fill_runner=current().runner
                )
            finally:
                dst.close()
            delete_runs(src.conn, kind, done.uids, what=f"spool {spool}")
        finally:
            src.close()
        pushed += done.added + done.replaced
    if pushed:
        say(f"note: pushed {pushed} spooled run(s) from {spool} to {server}")
    return pushed
