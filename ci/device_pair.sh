#!/usr/bin/env bash
# Two stage lists of ci/device_check.sh at once on a two-GPU box, one GPU each (CUDA_VISIBLE_DEVICES=0 and 1),
# outputs in $OUT/g0 and $OUT/g1; both summaries last. Stages that time GPU work must not share a GPU: give
# each side its own (the model tier on one, compile-time probes on the other).
# The two sides share the host's CPUs: a side that compiles (cold probes, autotuning, Inductor's workers) slows the
# other side's host-bound steps (2026-11-26: ResNet-50 training's autotuned probe step, 24 vs 15 ms, was measured
# while the other GPU autotuned ViT). Compare step times within one process (the model tier's arms, interleaved)
# or with the other side idle; compile seconds of probes are far less sensitive.
# Usage: ci/device_pair.sh "STAGE..." "STAGE..."   (the stages' own variables are shared by both sides; a variable
# G0_NAME / G1_NAME sets NAME for that side alone, e.g. G0_MODELS_ONLY='*.train.*' G1_MODELS_ONLY='ci_*')
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device}
mkdir -p "$OUT/g0" "$OUT/g1"
side() {  # side N STAGES: the stages on GPU N with that side's G<N>_ variables
  local n=$1 v
  shift
  (for v in $(compgen -v "G${n}_"); do export "${v#G"${n}"_}=${!v}"; done
   # shellcheck disable=SC2086  # the stage list is a word list
   CUDA_VISIBLE_DEVICES=$n OUT="$OUT/g$n" exec bash ci/device_check.sh $1) > "$OUT/g$n/device_check.log" 2>&1
}
side 0 "$1" &
a=$!
side 1 "$2" &
b=$!
wait $a; ra=$?
wait $b; rb=$?
for g in g0 g1; do echo "=== $g ==="; sed -n '/=== summary ===/,$p' "$OUT/$g/device_check.log"; done
if [ -n "${PAIR_TAR:-}" ]; then  # one archive instead of many files (the device returns only a few files a call)
  tar czf "$OUT/pair.tgz" -C "$OUT" g0 g1 && rm -rf "$OUT/g0" "$OUT/g1" && echo "outputs in $OUT/pair.tgz"
fi
exit $(( ra | rb ))
