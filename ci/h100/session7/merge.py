"""Issue 25's table from the device calls of 2026-11-26 (sessions 6 and 7): compile seconds from the
`warmcache` probes, autotuning's step and kernel gains from the model tier's side-by-side arms
(kiln and kiln-autotune interleaved in one process: ``harness.bench.autotune_gain``). Run from the repository root:
    python ci/h100/session7/merge.py > ci/h100/session7/table.md
"""
import json
from pathlib import Path

from harness.bench import autotune_gain
from harness.bench.compile_times import CompileTimes, table
from harness.bench.model_report import collect
from harness.bench.store import Store

H = Path("ci/h100")


def rows_of(files):
    rows: dict[tuple[str, str], CompileTimes] = {}
    for f in files:
        for r in json.loads(f.read_text()):
            rows[(r["case"], r["compiler"])] = CompileTimes(**r)
    return sorted(rows.values(), key=lambda r: (".infer." in r.case, r.case, r.compiler != "kiln"))


print("## Compile seconds, every row (fresh processes; `warmcache` probes; session 6 calls 2-3 at 333b56e..23382f4, "
      "session 7 calls 2-3 at 3f39309)\n")
print("\n".join(table(rows_of(sorted(H.glob("session6/call*/warmcache-g*.json"))
                              + sorted(H.glob("session7/call[23]/g*/warmcache.json"))))))
print("\n## Again at 3f39309, kiln and Inductor side by side in one call (session 7 call 4, GPU 0)\n")
print("\n".join(table(rows_of([H / "session7/call4/g0/warmcache.json"]))))
print("\n## Autotuned warm against warm at 3f39309 (session 7 call 4, GPU 1)\n")
print("\n".join(table(rows_of([H / "session7/call4/g1/warmcache.json"]))))

print("\n## Autotuning's gain, side by side (model tier: kiln and kiln-autotune interleaved in one process; "
      "`harness.bench.autotune_gain` on each call's stored samples)\n")
results = []
for f in sorted(H.glob("session7/call*/g*/*/bench.sqlite")):
    with Store(str(f), readonly=True) as store:
        got = collect(store, "gpu")[1]
    results += got
    print(f"- {f.parent.relative_to(H)}: " + ", ".join(dict.fromkeys(r.workload.removeprefix("model.") for r in got)))
print()
print("\n".join(autotune_gain.report_lines(results)[4:]))
