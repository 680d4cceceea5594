#!/usr/bin/env bash
# Two stage lists of ci/device_check.sh at once on a two-GPU box, one GPU each (CUDA_VISIBLE_DEVICES=0 and 1),
# outputs in $OUT/g0 and $OUT/g1; both summaries last. Stages that time GPU work must not share a GPU: give
# each side its own (the model tier on one, compile-time probes on the other).
# Usage: ci/device_pair.sh "STAGE..." "STAGE..."   (the stages' own variables are shared by both sides)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device}
mkdir -p "$OUT/g0" "$OUT/g1"
# shellcheck disable=SC2086  # the stage lists are word lists
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/g0" bash ci/device_check.sh $1 > "$OUT/g0/device_check.log" 2>&1 &
a=$!
# shellcheck disable=SC2086
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/g1" bash ci/device_check.sh $2 > "$OUT/g1/device_check.log" 2>&1 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
for g in g0 g1; do echo "=== $g ==="; sed -n '/=== summary ===/,$p' "$OUT/$g/device_check.log"; done
exit $(( ra | rb ))
