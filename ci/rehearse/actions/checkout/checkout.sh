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
# checkout's `clean: true`: the workspace starts empty (KILN_REHEARSE_KEEP: one name kept, for the rehearsal's venv seed)
find "$dest" -mindepth 1 -maxdepth 1 ! -name "${KILN_REHEARSE_KEEP:-/}" -exec rm -rf {} +
if [ -n "${KILN_REHEARSE_KEEP:-}" ]; then  # the folder is not empty: clone beside it, then move the clone in
  tmp=$(mktemp -d "$dest/.clone.XXXXXX")
  git clone --quiet --no-hardlinks "$src" "$tmp/tree"
  (shopt -s dotglob; mv "$tmp/tree"/* "$dest"/)
  rm -rf "$tmp"
else
  git clone --quiet --no-hardlinks "$src" "$dest"
fi
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

# The rehearsal's venv seed, built once by the rehearsal for this tree's pins (ci/rehearse/rehearsal/seed.py):
# KILN_REHEARSE_VENV_SEED, a folder whose .nox holds nox's virtualenvs, and KILN_REHEARSE_TEMP_SEED, a folder holding
# what the jobs' "Install nox" step puts in $RUNNER_TEMP. The .nox venvs are hard-linked into the workspace's .nox
# (seconds, no copy), the other is copied into $RUNNER_TEMP, and the seed's paths in their scripts and the editable install's
# files are rewritten to where they now are; the jobs' steps then find them installed (nox's stamp and pip still
# decide) instead of installing torch again in every job, as on a runner with lasting venvs. On GitHub the jobs
# install them.
seed=${KILN_REHEARSE_VENV_SEED:-}
temp_seed=${KILN_REHEARSE_TEMP_SEED:-}
linked=()
relink() {  # relink FROM TO VENV: FROM rewritten to TO in the small text files of the venv VENV that name it
  { find "$3" -maxdepth 3 -path '*/bin/*' -type f; find "$3" -maxdepth 2 -name pyvenv.cfg
    find "$3" -maxdepth 5 -path '*/site-packages/*' -type f \( -name '*.pth' -o -name '__editable__*.py' \)
    find "$3" -maxdepth 6 -path '*.dist-info/direct_url.json'; } 2>/dev/null \
    | xargs -r grep -lIF "$1" 2>/dev/null | while IFS= read -r f; do
        sed "s|$1|$2|g" "$f" > "$f.seed" && chmod --reference="$f" "$f.seed" && mv -f "$f.seed" "$f"; done
}
if [ -n "$seed" ] && [ -d "$seed/.nox" ]; then
  mkdir -p "$dest/.nox"
  for venv in "$seed"/.nox/*/; do
    venv=${venv%/}; name=$(basename "$venv"); [ -f "$venv/pyvenv.cfg" ] || continue
    cp -al "$venv" "$dest/.nox/$name" && relink "$seed" "$dest" "$dest/.nox/$name" && linked+=(".nox/$name")
  done
fi
if [ -n "$temp_seed" ] && [ -n "${RUNNER_TEMP:-}" ] && [ -d "$temp_seed" ]; then
  mkdir -p "$RUNNER_TEMP"
  for item in "$temp_seed"/*; do
    [ -e "$item" ] || continue
    name=$(basename "$item"); rm -rf "${RUNNER_TEMP:?}/$name"
    cp -a "$item" "$RUNNER_TEMP/$name" && relink "$item" "$RUNNER_TEMP/$name" "$RUNNER_TEMP/$name" && linked+=("\$RUNNER_TEMP/$name")
  done
fi
if [ ${#linked[@]} -gt 0 ]; then
  echo "checkout stand-in: ${linked[*]} from the rehearsal's venv seed (not on GitHub: there the job installs them)"
fi
