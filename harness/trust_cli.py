"""`python -m harness trust`: this job's trust scope, why, and every lasting folder and store it reads or writes on
the runner (harness/trust.py has the model; README: Trust on a shared runner fleet).

A job's log starts with this table in CI, so a reader sees which folders a pull request could reach; `--json -`
prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from harness import commands, trust
from harness.settings import DEFAULT_BENCH_STORE, bench_settings, fleet_settings, settings


def rows() -> list[dict[str, str]]:
    """(what, where, access) of every lasting folder and store of this job, in this job's scope."""
    s, t = settings(), trust.resolve()
    cache = commands.native_cache_env()
    out = []
    for name, what in (
        ("TRITON_CACHE_DIR", "Triton's kernel cache"),
        ("KILN_CACHE_DIR", "kiln's kernels and binary index"),
        ("KILN_GRAPH_CACHE_DIR", "kiln's graph and front caches"),
        ("KILN_AUTOTUNE_DIR", "kiln's autotune choices"),
        ("TORCHINDUCTOR_CACHE_DIR", "Inductor's cache"),
    ):
        where = (
            cache.get(name) or os.environ.get(name) or "the tool's default (compile cache off, outside CI)"
        )
        out.append({"what": what + " (native)", "where": where, "access": "read and write"})
    if s.compile_cache is not None:
        out.append(
            {
                "what": "compile caches of containers (mounted at /cache)",
                "where": str(s.compile_cache / t.scope / "<image tag>"),
                "access": "read and write",
            }
        )
    signed = (
        "entries signed with the runner key; unsigned ones never load" if t.auth_required else "checksum only"
    )
    if trust.key_missing(t):
        signed = "no KILN_CACHE_KEY: kiln's on-disk caches are off (nothing unauthenticated loads)"
    out.append({"what": "cache entry authentication", "where": "-", "access": signed})
    out.append({"what": "test history", "where": str(s.history_db), "access": "read and write"})
    out.append(
        {
            "what": "shard durations (written by ci-durations)",
            "where": str(s.history_db.parent / "durations"),
            "access": "read and write",
        }
    )
    bench = str(bench_settings().store or DEFAULT_BENCH_STORE)
    out.append(
        {
            "what": "lasting bench stores",
            "where": str(trust.scoped_path(Path(bench), t.scope)),
            "access": "read and write" if t.feeds_main else f"write (reads main's {bench})",
        }
    )
    f = fleet_settings()
    out.append(
        {
            "what": "fleet store (KILN_STORE_URL)",
            "where": "set" if f.store_url else "unset",
            "access": "read only" if f.read_only else "read and write",
        }
    )
    out.append({"what": "fleet store spool", "where": str(f.spool), "access": "read and write"})
    out.append(
        {
            "what": "images this job builds",
            "where": trust.scoped_image("kiln-<backend>:<inputs hash>", t.scope),
            "access": "tag (runs main's image of the same inputs when present)",
        }
    )
    return out


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", metavar="FILE", help="write the scope and its folders as JSON to FILE (`-`: stdout)"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Print this job's trust scope and what it reads and writes (module docstring)."""
    t = trust.resolve()
    table = rows()
    if args.json:
        text = json.dumps(
            {"scope": t.scope, "derived": t.derived, "reason": t.reason, "folders": table}, indent=1
        )
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
        return 0
    print(t.line())
    problem = trust.untrusted_key_problem(t)
    if problem:
        print(problem)
    width = max(len(r["what"]) for r in table)
    for r in table:
        print(f"  {r['what'].ljust(width)}  {r['where']}  ({r['access']})")
    return 0
