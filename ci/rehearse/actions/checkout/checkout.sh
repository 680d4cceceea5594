#!/usr/bin/env bash
# The checkout stand-in's body (see action.yml): a local `git clone` of $KILN_REHEARSE_SOURCE into the workspace,
# then the source's working-tree changes copied over, so the job sees the tree as it is (committed or not).
set -euo pipefail
src=${KILN_REHEARSE_SOURCE:?"checkout stand-in: KILN_REHEARSE_SOURCE is not set (run through nox -s rehearse)"}
ws=$(realpath -m "${GITHUB_WORKSPACE:?"checkout stand-in: GITHUB_WORKSPACE is not set"}")
dest=$(realpath -m "$ws${STANDIN_PATH:+/$STANDIN_PATH}")
case "$dest" in "$ws"|"$ws"/*) ;; *) echo "checkout stand-in: error: path $STANDIN_PATH leaves the workspace" >&2; exit 1;; esac
echo "checkout stand-in (NOT actions/checkout; nothing is fetched): cloning $src into $dest"
mkdir -p "$dest"
find "$dest" -mindepth 1 -maxdepth 1 -exec rm -rf {} +   # checkout's `clean: true`: the workspace starts empty
git clone --quiet --no-hardlinks "$src" "$dest"
git -C "$dest" checkout --quiet --detach "$(git -C "$src" rev-parse HEAD)"
# the working tree as it is: modified and untracked (not ignored) files over the clone, deleted files removed
# (`ls-files --modified` also names deleted files: only those still there are copied)
list=$(mktemp)
(cd "$src" && git ls-files -z --modified --others --exclude-standard \
  | while IFS= read -r -d '' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done) > "$list"
changed=$(tr -cd '\0' < "$list" | wc -c)
(cd "$src" && tar --null -T "$list" -cf -) | tar -C "$dest" -xf -
(cd "$src" && git ls-files -z --deleted) | (cd "$dest" && xargs -0 -r rm -f --)
rm -f "$list"
echo "checkout stand-in: HEAD $(git -C "$dest" rev-parse --short HEAD); $changed uncommitted or untracked file(s) copied over"
