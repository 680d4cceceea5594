#!/usr/bin/env bash
# The kernel bench (profiler timer: kernel time per call) at BASE and at HEAD, into one store, then HEAD
# compared with BASE by bench compare's statistics. Run from the repository root of a full clone (BASE must
# be in its history). Usage: ci/kernels_vs.sh BASE OUT   (COMPILERS, default kiln; eager always runs)
set -euo pipefail
base=$1
mkdir -p "$2" && out=$(cd "$2" && pwd)
db="$out/kernels.sqlite"
wt=$(mktemp -d)/base
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$wt" "$base"
args=(--profile gpu --timer profiler --compilers "${COMPILERS:-kiln}" --db "$db" --quiet)
echo "== base $(git -C "$wt" rev-parse --short HEAD)"
(cd "$wt" && PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" python3 -m harness bench run "${args[@]}" --label base --md "$out/kernels-base.md")
echo "== head $(git rev-parse --short HEAD)"
python3 -m harness bench run "${args[@]}" --label head --baseline latest --no-fail --md "$out/kernels-head.md" \
  --json "$out/kernels-head.json" || true
python3 -m harness bench list --db "$db"
