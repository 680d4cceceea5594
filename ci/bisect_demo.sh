#!/usr/bin/env bash
# bench bisect on a planted change: a scratch repository of this checkout's committed compiler and harness,
# base -> good -> a host sleep of $SLEEP s per kiln launch (compiler/runtime/launcher.py) -> good -> good;
# `bench bisect base HEAD --only $WORKLOAD` must name the planted commit. Usage: ci/bisect_demo.sh OUT
set -euo pipefail
mkdir -p "$1" && out=$(cd "$1" && pwd)
W=${WORKLOAD:-softmax.fwd.fp32.8192x8192} SLEEP=${SLEEP:-0.001}
here=$PWD
s=$(mktemp -d)/repo
mkdir -p "$s"
git archive --format=tar HEAD compiler harness ci pyproject.toml | tar -x -C "$s"
cd "$s"
g() { git -c user.name=kiln -c user.email=kiln@localhost -c commit.gpgsign=false "$@"; }
g init -q -b main && g add -A . && g commit -q -m base
base=$(git rev-parse HEAD)
echo one > NOTES.txt && g add -A . && g commit -q -m "good: a note"
anchor='        nptr = self._nptr'
grep -qF "$anchor" compiler/runtime/launcher.py || { echo "anchor moved: $anchor" >&2; exit 2; }
python3 - "$SLEEP" <<'PY'
import sys
from pathlib import Path
p = Path("compiler/runtime/launcher.py")
a = "        nptr = self._nptr\n"
p.write_text(p.read_text().replace(a, f"        __import__('time').sleep({sys.argv[1]})  # planted\n" + a, 1))
PY
g commit -q -am "planted: every kiln launch sleeps ${SLEEP}s"
planted=$(git rev-parse HEAD)
for w in two three; do echo "$w" >> NOTES.txt && g commit -q -am "good: note $w"; done
git log --oneline
echo "planted commit: $planted"
cd "$here"
rc=0
python3 -m harness bench bisect "$base" HEAD --only "$W" --compiler kiln --repo "$s" \
  --json "$out/bisect.json" --md "$out/bisect.md" || rc=$?
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); fb=d.get('first_bad') or {}; \
print('verdict:', d['outcome'], fb.get('sha','')[:10], 'planted' if fb.get('sha')==sys.argv[2] else 'NOT the planted commit')" \
  "$out/bisect.json" "$planted"
exit $rc
