"""Summarize `nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader -l 1` samples:
how many seconds saw 1, 2, ... compute processes on the GPUs at once (shards running side by side).
Usage: python3 ci/smi_overlap.py SMI_CSV"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict


def main(path: str) -> int:
    pids: dict[str, set[str]] = defaultdict(set)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[1].isdigit():
                pids[parts[0].split(".")[0]].add(parts[1])  # per second: the distinct processes seen
    seen = Counter(len(v) for v in pids.values())
    most = max(seen, default=0)
    print("seconds by compute processes at once: " + (", ".join(f"{k}: {seen[k]}" for k in sorted(seen)) or "none"))
    print(f"most at once: {most}; distinct processes: {len(set().union(*pids.values())) if pids else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
