#!/usr/bin/env bash
# The upload-artifact stand-in's body (see action.yml). One folder named alone is the artifact's root (as
# upload-artifact does); files and globs keep their paths relative to the workspace.
set -euo pipefail
store=${KILN_REHEARSE_ARTIFACTS:?"upload-artifact stand-in: KILN_REHEARSE_ARTIFACTS is not set (run through nox -s rehearse)"}
dest=$store/${GITHUB_RUN_ID:-1}/$STANDIN_NAME
if [ -e "$dest" ]; then
  echo "upload-artifact stand-in: error: an artifact named $STANDIN_NAME already exists in run ${GITHUB_RUN_ID:-1}" >&2
  exit 1
fi
cd "${GITHUB_WORKSPACE:?}"
shopt -s nullglob globstar
matched=()
while IFS= read -r line; do
  line=${line#"${line%%[![:space:]]*}"}; line=${line%"${line##*[![:space:]]}"}
  [ -n "$line" ] || continue
  case "$line" in '!'*) echo "upload-artifact stand-in: error: exclude patterns ($line) are not supported" >&2; exit 1;; esac
  # shellcheck disable=SC2206  # the glob is meant to expand
  hits=($line)
  for h in "${hits[@]}"; do [ -e "$h" ] && matched+=("$h"); done
done <<< "$STANDIN_PATHS"
if [ "${#matched[@]}" -eq 0 ]; then
  msg="upload-artifact stand-in: no files found for $STANDIN_NAME (path: $STANDIN_PATHS)"
  case "$STANDIN_IF_NONE" in
    error) echo "$msg" >&2; exit 1;;
    ignore) echo "$msg (ignored)"; exit 0;;
    *) echo "::warning::$msg"; exit 0;;
  esac
fi
mkdir -p "$dest"
if [ "${#matched[@]}" -eq 1 ] && [ -d "${matched[0]}" ]; then
  cp -a "${matched[0]}/." "$dest/"
else
  for f in "${matched[@]}"; do cp -a --parents "$f" "$dest/"; done
fi
files=$(find "$dest" -type f | wc -l)
size=$(du -sh "$dest" | cut -f1)
echo "upload-artifact stand-in (NOT actions/upload-artifact; nothing leaves this machine): artifact $STANDIN_NAME, $files file(s), $size, in $dest"
(cd "$dest" && find . -type f | sed 's|^\./||' | sort | sed -n '1,40s/^/  /p')  # sed reads every line: no SIGPIPE under pipefail (head did, past 40 files)
[ "$files" -le 40 ] || echo "  ... and $((files - 40)) more"
