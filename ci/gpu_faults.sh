#!/usr/bin/env bash
# Faults on the GPU box: (1) a planted suite with a segfaulting test and a Triton store far out of bounds (a
# sticky illegal-address error) run natively through the harness: every other result must stand, the tests after
# the access pass in a fresh process (neither failed nor flaky); (2) the real suites' time with and without the
# crash isolation, measured one after the other on the same machine.
# Usage: ci/gpu_faults.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT folder}
mkdir -p "$OUT"
proj=$(mktemp -d)/proj
mkdir -p "$proj/ci" "$proj/tests/gpu_faults"
cp ci/faults/test_gpu_faults.py "$proj/tests/gpu_faults/test_gpu_faults.py"
python3 - "$proj" <<'PY'
import json, sys
m = json.load(open("ci/matrix.json"))
m["suites"] = ["gpu_faults"]
json.dump(m, open(f"{sys.argv[1]}/ci/matrix.json", "w"))
PY
export PYTHONPATH=$PWD
KILN_ROOT=$proj KILN_RESULTS=$proj/results timeout 300 python3 -m harness run --backend cuda --native --no-health \
  --no-history --retries 1 --results "$OUT/faults-run" --quiet
echo "planted faults: exit $?"
python3 - "$OUT/faults-run" <<'PY'
import json, sys
run = json.load(open(f"{sys.argv[1]}/run.json"))
suite = run["suites"][0]
print("status", run["status"], "suite", suite["status"], "counts", suite["counts"])
for c in suite["crashes"]:
    print("crashed:", c["id"], "|", c["reason"], "| attempt", c["attempt"])
for t in suite.get("retries", {}).get("tests", []):
    print("retried:", t["id"], t["status"])
print(open(f"{sys.argv[1]}/report.txt").read())
PY
# A B A: the first run also warms the kernel caches (a cold first run measured 197 s against 116 s warm)
k=0
for mode in ${MODES:-no-isolation isolation no-isolation}; do
  k=$((k + 1)); flag=""; [ "$mode" = no-isolation ] && flag="--no-isolation"
  start=$SECONDS
  timeout 280 python3 -m harness run --backend cuda --native --no-health --no-history --quiet $flag \
    --results "$OUT/suites-$k-$mode" > "$OUT/suites-$k-$mode.log" 2>&1
  echo "run $k, suites with $mode: exit $? in $((SECONDS - start))s"
  grep -E "^suite |^kiln " "$OUT/suites-$k-$mode.log"
done
