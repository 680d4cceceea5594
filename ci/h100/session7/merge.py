"""Issue 25's table from the device calls of 2026-11-26 (sessions 6 and 7): compile seconds from the
`warmcache` probes, autotuning's step and kernel gains from the model tier's side-by-side arms
(kiln and kiln-autotune interleaved in one process). Run from the repository root:
    python ci/h100/session7/merge.py > ci/h100/session7/table.md
"""
import json
import math
from pathlib import Path

from harness.bench.compile_times import CompileTimes, goals, table

H = Path("ci/h100")
rows: dict[tuple[str, str], CompileTimes] = {}
for f in sorted(H.glob("session6/call*/warmcache-g*.json")) + sorted(H.glob("session7/call*/g*/warmcache.json")):
    for r in json.loads(f.read_text()):
        rows[(r["case"], r["compiler"])] = CompileTimes(**r)
order = sorted(rows.values(), key=lambda r: (".infer." in r.case, r.case, r.compiler != "kiln"))
print("## Compile seconds (fresh processes; `warmcache` probes)\n")
print("\n".join(table(order)))
print()
# table() ends with the goals

print("\n## Autotuning's gain, side by side (model tier: kiln and kiln-autotune interleaved in one process)\n")
print("| case | call | kiln step ms | kiln-autotune step ms | step gain | spread kiln / autotune | "
      "kiln kernel ms | kiln-autotune kernel ms | kernel gain |")
print("|---|---|---|---|---|---|---|---|---|")
step_gains, kernel_gains = [], []
for f in sorted(H.glob("session7/call*/g*/*/report.json")):
    for c in json.loads(f.read_text())["cases"]:
        k, a = c["compilers"].get("kiln"), c["compilers"].get("kiln-autotune")
        if not k or not a or k["status"] != "ok" or a["status"] != "ok":
            continue
        sg = k["median_ns"] / a["median_ns"]
        kg = k["kernel"]["kernel_ms"] / a["kernel"]["kernel_ms"]
        step_gains.append(sg)
        kernel_gains.append(kg)
        print(f"| {c['case'].removeprefix('model.')} | {f.parts[2]} {f.parts[3]} | {k['median_ns'] / 1e6:.2f} | "
              f"{a['median_ns'] / 1e6:.2f} | {sg:.3f} | {100 * k['spread']:.1f}% / {100 * a['spread']:.1f}% | "
              f"{k['kernel']['kernel_ms']:.3f} | {a['kernel']['kernel_ms']:.3f} | {kg:.3f} |")


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


print(f"\ngeomean step gain {geo(step_gains):.3f} (min {min(step_gains):.3f}, max {max(step_gains):.3f}), "
      f"geomean kernel gain {geo(kernel_gains):.3f} (min {min(kernel_gains):.3f}, max {max(kernel_gains):.3f}) "
      f"over {len(step_gains)} measurements")
