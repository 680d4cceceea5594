"""Summarize `nvidia-smi --query-compute-apps=timestamp,pid,used_memory,gpu_bus_id --format=csv,noheader -l 1`
samples: how many seconds saw 1, 2, ... compute processes at once, and on how many GPUs (shards side by side;
the bus id column is optional).
Usage: python3 ci/smi_overlap.py SMI_CSV"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict


def main(path: str) -> int:
    pids: dict[str, set[str]] = defaultdict(set)
    gpus: dict[str, set[str]] = defaultdict(set)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[1].isdigit():
                second = parts[0].split(".")[0]
                pids[second].add(parts[1])  # per second: the distinct processes seen
                if len(parts) >= 4 and parts[3]:
                    gpus[second].add(parts[3])
    seen = Counter(len(v) for v in pids.values())
    most = max(seen, default=0)
    print(
        "seconds by compute processes at once: "
        + (", ".join(f"{k}: {seen[k]}" for k in sorted(seen)) or "none")
    )
    print(f"most at once: {most}; distinct processes: {len(set().union(*pids.values())) if pids else 0}")
    if gpus:
        busy = Counter(len(v) for v in gpus.values())
        print(
            "seconds by GPUs busy at once: "
            + ", ".join(f"{k}: {busy[k]}" for k in sorted(busy))
            + f"; GPUs seen: {', '.join(sorted(set().union(*gpus.values())))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
