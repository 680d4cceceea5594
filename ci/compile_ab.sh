#!/usr/bin/env bash
# kiln's cold compile at two trees, alternated: BASE (a folder holding another checkout, e.g. a shallow clone of
# the commit before a change) and this checkout, REPS times each, every run compile-only and cold-only, with
# MODELS_COMPILE_JOBS cases at once on their share of the CPUs; then per row the cold seconds of every run and
# the ratio of the means (head / base), from each run's report.json (its compile-only rows; failed probes
# left out). Alternating the trees spreads the host's drift over both.
# Usage: ci/compile_ab.sh BASE_TREE OUT   (AB_ONLY: rows, default the four below; AB_REPS, default 2;
#        AB_JOBS, default 4; AB_BUDGET_S per run, default 120)
set -euo pipefail
base=$(cd "$1" && pwd)
mkdir -p "$2" && out=$(cd "$2" && pwd)
head=$(pwd)
only=${AB_ONLY:-model.ci_resnet18.train.amp,model.ci_llama.train.fp32,model.ci_bert.train.fp32,model.ci_t5.infer.bf16}
for rep in $(seq "${AB_REPS:-2}"); do
  for side in base head; do
    tree=$base; [ "$side" = head ] && tree=$head
    echo "== $side run $rep ($(git -C "$tree" rev-parse --short HEAD 2>/dev/null || echo "$tree"))"
    (cd "$tree" && timeout $(( ${AB_BUDGET_S:-120} + 60 )) python3 -m harness bench models --compile-only --cold-only \
      --compile-jobs "${AB_JOBS:-4}" --compile-times kiln --compilers kiln --only "$only" \
      --budget-s "${AB_BUDGET_S:-120}" --out "$out/$side-$rep" > "$out/$side-$rep.log" 2>&1) || echo "   exit $? (see $out/$side-$rep.log)"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
cold: dict[str, dict[str, list[float]]] = {}
for report in sorted(glob.glob(os.path.join(out, "*-*", "report.json"))):
    side = os.path.basename(os.path.dirname(report)).split("-")[0]
    with open(report, encoding="utf-8") as f:
        rows = json.load(f).get("compile_only") or []
    for r in rows:  # the report's compile-only rows: one per case and compiler
        if r.get("compiler") == "kiln" and r.get("status") == "ok" and r.get("compile_cold_s") is not None:
            cold.setdefault(r["case"], {}).setdefault(side, []).append(float(r["compile_cold_s"]))
print("| row | base cold s | head cold s | head / base (means) |\n|---|---|---|---:|")
for row, sides in sorted(cold.items()):
    b, h = sides.get("base", []), sides.get("head", [])
    ratio = f"{(sum(h) / len(h)) / (sum(b) / len(b)):.3f}" if b and h else "-"
    print(f"| {row} | {' / '.join(f'{x:.2f}' for x in b)} | {' / '.join(f'{x:.2f}' for x in h)} | {ratio} |")
PY
