"""``python -m compiler cache info|clear``: the on-disk caches of kiln (graph cache, autotune choices, binary
index, kernel sources). Errors are one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys

#: what ``cache clear`` may remove
PARTS = ("graphs", "autotune", "binaries", "kernels")


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def cache_info() -> list[str]:
    from . import config
    from .runtime import autotune, binary_index, cache, graph_cache

    g = graph_cache.info()
    state = {"1": "on", "read": "read-only", "0": "off"}[g["state"]]
    a = autotune.info()
    b = binary_index.info()
    kdir = config.settings().resolved_cache_dir()
    kernels = cache.entries(kdir, ".py")
    return [
        f"graph cache ({state}): {g['folder']}: {g['entries']} entries, {_mb(g['bytes'])} of "
        f"{_mb(g['max_bytes'])}",
        f"autotune choices ({'on' if config.settings().autotune else 'off'} by default): {a['folder']}: "
        f"{a['entries']} entries, {_mb(a['bytes'])}",
        f"binary index ({state}): {b['folder']}: {b['entries']} entries, {_mb(b['bytes'])} of "
        f"{_mb(b['max_bytes'])}",
        f"kernel sources: {kdir}: {len(kernels)} files, {_mb(sum(s for _, s, _ in kernels))}",
    ]


def cache_clear(parts: tuple[str, ...]) -> list[str]:
    from . import config
    from .runtime import autotune, binary_index, cache, graph_cache

    out = []
    if "graphs" in parts:
        out.append(f"graph cache: removed {graph_cache.clear()} entries from {graph_cache.folder()}")
    if "autotune" in parts:
        out.append(f"autotune choices: removed {autotune.clear()} entries from {autotune.folder()}")
    if "binaries" in parts:
        out.append(f"binary index: removed {binary_index.clear()} entries from {binary_index.folder()}")
    if "kernels" in parts:
        kdir = config.settings().resolved_cache_dir()
        out.append(f"kernel sources: removed {cache.clear(kdir, '.py')} files from {kdir}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compiler", description="kiln's command line (caches).")
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("cache", help="the on-disk caches: info, clear")
    c.add_argument("action", choices=("info", "clear"))
    c.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"clear: comma-separated parts among {', '.join(PARTS)} (default: all)",
    )
    args = p.parse_args(argv)
    from .exc import KilnError

    try:
        if args.action == "info":
            lines = cache_info()
        else:
            parts = tuple(x.strip() for x in args.only.split(",") if x.strip())
            bad = [x for x in parts if x not in PARTS]
            if bad or not parts:
                print(
                    f"compiler cache clear: --only {args.only!r}: expected parts among {', '.join(PARTS)}",
                    file=sys.stderr,
                )
                return 2
            lines = cache_clear(parts)
    except (KilnError, OSError) as e:
        print(f"compiler cache {args.action}: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
