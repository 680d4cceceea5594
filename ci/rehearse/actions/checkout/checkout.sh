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

# The rehearsal's venv seed (KILN_REHEARSE_VENV_SEED: a folder whose .nox holds nox's virtualenvs, built once by the
# rehearsal in that folder for this tree's pins, ci/rehearse/rehearsal/seed.py): its venvs are linked into the
# workspace's .nox (hard links: seconds, no copy) and the seed folder's path in their scripts and the editable
# install's files is rewritten to the workspace, so `nox` reuses them (its own stamp still decides) instead of
# installing torch again in every job, as a runner with a lasting venv would. A real runner's job installs them.
seed=${KILN_REHEARSE_VENV_SEED:-}
if [ -n "$seed" ] && [ -d "$seed/.nox" ]; then
  mkdir -p "$dest/.nox"
  for venv in "$seed"/.nox/*/; do
    venv=${venv%/}; name=$(basename "$venv"); [ -f "$venv/pyvenv.cfg" ] || continue
    cp -al "$venv" "$dest/.nox/$name"
    # only small text files name the seed's path: scripts, pyvenv.cfg, .pth files, the editable finder, direct_url
    { find "$dest/.nox/$name/bin" -maxdepth 1 -type f; echo "$dest/.nox/$name/pyvenv.cfg"
      find "$dest/.nox/$name"/lib/python*/site-packages -maxdepth 1 -type f \( -name '*.pth' -o -name '__editable__*.py' \)
      find "$dest/.nox/$name"/lib/python*/site-packages -maxdepth 2 -path '*.dist-info/direct_url.json'; } 2>/dev/null \
      | xargs -r grep -lIF "$seed" 2>/dev/null | while IFS= read -r f; do
          sed "s|$seed|$dest|g" "$f" > "$f.seed" && chmod --reference="$f" "$f.seed" && mv -f "$f.seed" "$f"; done
  done
  echo "checkout stand-in: .nox/{$(ls "$seed/.nox" | paste -sd, -)} linked from the rehearsal's venv seed $seed (not on GitHub: a runner's job installs them)"
fi
