"""`--store URL` / `--store-strict` on every verb that reads or writes a store, and the `store` verb:
`python -m harness store push --to URL` / `store pull --from URL`.

Terms:
  store flags  `--store URL` puts both stores at URL for this command (and the processes it starts): it sets
               KILN_STORE_URL, which harness/settings.py documents; `--store-strict` sets KILN_STORE_STRICT
               (an unreachable server is exit 3 instead of a spooled run).
  location     where a verb's store is: its explicit file flag (`--db`, `--history`) when given, else
               KILN_STORE_URL (for writers only without KILN_STORE_READ_ONLY), else the store's own default
               (exactly where it was before the fleet store).
  push         every finished run of this runner's stores (the lasting bench stores and the test history, or
               `--from` a file/URL) copied into `--to` (harness/store/sync.py: by UUID, one transaction per run:
               a second push adds nothing, a killed push resumes).
  pull         the other way: `--from URL` into a local file (`--to`, default: the history store's file).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.exc import UsageError

if TYPE_CHECKING:  # url.py needs SQLAlchemy: imported where a URL is used, so the flags load without it
    from . import url


def add_store_flags(p: argparse.ArgumentParser, *, hidden: bool = False) -> None:
    """The shared `--store URL` and `--store-strict` options (`hidden`: also accepted after a sub-verb)."""
    help_url = (
        argparse.SUPPRESS
        if hidden
        else (
            "both stores at this location: sqlite:///PATH or postgresql://USER@HOST/DB (default $KILN_STORE_URL, "
            "else each store's own file)"
        )
    )
    help_strict = (
        argparse.SUPPRESS
        if hidden
        else ("an unreachable store server is an error (exit 3) instead of results kept in the local spool")
    )
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if hidden else {}
    p.add_argument("--store", metavar="URL", help=help_url, **extra)
    p.add_argument("--store-strict", action="store_true", help=help_strict, **extra)


def apply_store_flags(args: argparse.Namespace) -> None:
    """Make the parsed store flags the settings of this process and its children (see the module docstring)."""
    store = getattr(args, "store", None)
    if store:
        from . import url

        url.parse(store)  # a bad URL is one line now, not deep in a verb
        os.environ["KILN_STORE_URL"] = store
    if getattr(args, "store_strict", False):
        os.environ["KILN_STORE_STRICT"] = "1"


def configured(*, write: bool = False) -> url.Location | None:
    """KILN_STORE_URL's location, or None when unset (or, for a writer, when KILN_STORE_READ_ONLY is set)."""
    from harness.settings import fleet_settings

    from . import url

    s = fleet_settings()
    if not s.store_url or (write and s.read_only):
        return None
    return url.parse(s.store_url)


def location(explicit: str | Path | None, default: Path, *, write: bool = False) -> url.Location:
    """A verb's store: `explicit` (a file flag, or a URL given to it), else KILN_STORE_URL, else `default`; a
    writer's server URL passes `guard_write`."""
    from . import url

    if explicit:
        where = url.parse(str(explicit))
        return guard_write(where) if write else where
    return configured(write=write) or default


def guard_write(where: url.Location) -> url.Location:
    """`where` for a writer. A store server (any URL but a local SQLite file) is written only by a job whose trust
    scope writes the fleet store (harness/trust.py: main, or a machine outside CI); a pull request's or another
    branch's job given one is a UsageError (one line, exit 2), whatever flag or variable named it."""
    from harness import trust

    if isinstance(where, Path):
        return where
    t = trust.resolve()
    if not t.writes_fleet:
        raise UsageError(
            f"a job of trust scope {t.scope} ({t.reason}) never writes a store server; "
            "its results stay on the runner (README: Trust)"
        )
    return where


def exists(where: url.Location) -> bool:
    """Whether a reader has something to read there (a server always may)."""
    return Path(where).is_file() if isinstance(where, Path) else True


# ---- the `store` verb ------------------------------------------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="{push,pull}")
    sub.required = True
    push = sub.add_parser("push", help="copy this runner's stores into a fleet store (idempotent, resumable)")
    push.add_argument(
        "--to", metavar="URL", required=True, help="the fleet store (postgresql://... or sqlite:///...)"
    )
    push.add_argument(
        "--from",
        dest="source",
        metavar="DB",
        action="append",
        help="a store file or URL to push (repeatable; default: the lasting bench stores "
        "($XDG_DATA_HOME/kiln/bench/*.sqlite) and the test history)",
    )
    pull = sub.add_parser("pull", help="copy a fleet store into a local file (for a laptop reproduction)")
    pull.add_argument("--from", dest="source", metavar="URL", required=True, help="the fleet store")
    pull.add_argument(
        "--to",
        metavar="DB",
        help="the local SQLite file (default: the test history's file, "
        "KILN_HISTORY_DB or $XDG_DATA_HOME/kiln/history/history.sqlite; both stores go there)",
    )
    for sp in (push, pull):
        sp.add_argument("--only", choices=["bench", "history"], help="one store only")


def _sources(given: list[str] | None) -> list[url.Location]:
    """`--from`, else this runner's stores: each matrix backend's lasting bench store (KILN_BENCH_STORE, else the
    matrix's bench_store, else the default; as harness.bench.stores.store.lasting_path) and the test history's file."""
    from . import url

    if given:
        return [url.parse(s) for s in given]
    from harness import matrix
    from harness.exc import MatrixError
    from harness.settings import DEFAULT_BENCH_STORE, bench_settings, settings

    s, env = settings(), bench_settings().store
    try:
        backends = matrix.load().backends
    except MatrixError:
        backends = {}
    found: list[url.Location] = []
    looked: list[Path] = []
    for name, b in backends.items():
        raw = str(env) if env is not None else (b.bench_store or str(DEFAULT_BENCH_STORE))
        # CI's lasting store, and the one `nox -s ci` / `nox -s bench` write in the checkout (a developer's runs)
        for path in (
            Path(raw.replace("{backend}", name)).expanduser(),
            s.results_root / "bench" / name / "bench.sqlite",
        ):
            looked.append(path)
            if path.is_file() and path.resolve() not in [
                Path(f).resolve() for f in found if isinstance(f, Path)
            ]:
                found.append(path)
    if not found and looked:
        print(
            f"note: no bench store on this runner to push (looked for {', '.join(map(str, looked))})",
            file=sys.stderr,
            flush=True,
        )
    if s.history_db.is_file():
        found.append(s.history_db)
    if not found:
        raise UsageError(
            "nothing to push: no lasting bench store and no test history on this runner (give --from DB)"
        )
    return found


def copy(src: url.Location, dst: url.Location, only: str | None = None) -> list[str]:
    """Copy every finished run of both stores (or `only` one) from `src` into `dst`; one line per store."""
    from .migrate import BENCH, HISTORY, open_store, read_state
    from .runner import current
    from .sync import copy_runs

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    lines = []
    for kind in (BENCH, HISTORY):
        if only and kind.name != only:
            continue
        if isinstance(src, Path):
            if not src.is_file():
                raise UsageError(f"{src} does not exist")
            probe = open_store(src, kind, write=False, say=say)
            try:
                with probe.conn.begin():
                    empty = read_state(probe.conn, kind).revision is None
            finally:
                probe.close()
            if empty:
                continue  # a file of the other store only
        # a file source is brought to head (backed up first); a server source is only read
        a = open_store(src, kind, write=isinstance(src, Path), say=say)
        if a.revision == 0:
            a.close()
            continue
        try:
            b = open_store(dst, kind, write=True, say=say)
            try:
                done = copy_runs(
                    a.conn,
                    b.conn,
                    kind,
                    what=f"{kind.label} {dst}",
                    fill_runner=current().runner if isinstance(src, Path) else "",
                )
            finally:
                b.close()
        finally:
            a.close()
        lines.append(done.line(f"{kind.label} {src} -> {dst}"))
    return lines


def cli_main(args: argparse.Namespace) -> int:
    """Copy stores into a fleet store (`push`) or out of it (`pull`), by run UUID."""
    from . import url

    if args.action == "push":
        dst = guard_write(url.parse(args.to))
        for src in _sources(args.source):
            for line in copy(src, dst, args.only):
                print(line)
        return 0
    from harness.settings import settings

    dst = url.parse(args.to) if args.to else settings().history_db
    for line in copy(url.parse(args.source), dst, args.only):
        print(line)
    return 0
