#!/usr/bin/env bash
# The download-artifact stand-in's body (see action.yml).
set -euo pipefail
store=${KILN_REHEARSE_ARTIFACTS:?"download-artifact stand-in: KILN_REHEARSE_ARTIFACTS is not set (run through nox -s rehearse)"}/${GITHUB_RUN_ID:-1}
cd "${GITHUB_WORKSPACE:?}"
dest=${STANDIN_PATH:-.}
mkdir -p "$dest"
if [ -n "$STANDIN_NAME" ]; then
  [ -d "$store/$STANDIN_NAME" ] || { echo "download-artifact stand-in: error: no artifact $STANDIN_NAME in $store" >&2; exit 1; }
  cp -a "$store/$STANDIN_NAME/." "$dest/"
  echo "download-artifact stand-in (NOT actions/download-artifact): $STANDIN_NAME into $dest"
  exit 0
fi
n=0
for dir in "$store"/*/; do
  name=$(basename "$dir")
  # shellcheck disable=SC2053  # the pattern is a glob
  [[ -z "$STANDIN_PATTERN" || "$name" == $STANDIN_PATTERN ]] || continue
  if [ "$STANDIN_MERGE" = true ]; then cp -a "$dir." "$dest/"; else mkdir -p "$dest/$name"; cp -a "$dir." "$dest/$name/"; fi
  echo "download-artifact stand-in (NOT actions/download-artifact): $name into $dest"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "::warning::download-artifact stand-in: no artifact matched '${STANDIN_PATTERN:-*}' in $store"
