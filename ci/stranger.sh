#!/usr/bin/env bash
# The README's main command on a stranger's machine: a fresh clone of this checkout's HEAD, a fresh HOME and data
# folder, a user's PATH, a fresh venv holding only nox, and pip configured to reach the package index alone (none
# of this machine's wheel folders, extra indexes or constraints; only its CA bundle, when pip was given one, so
# that TLS works as it does for the host). Then `nox -s ci` exactly as the README says, timed, with the disk it
# took. Exit status: nox's.
#
# Usage: ci/stranger.sh [COMMAND...]     (default: nox -s ci; e.g. `ci/stranger.sh nox -s tests -- -k mm`)
# Environment (all optional):
#   KILN_STRANGER_DIR        where the clean environment is made and kept (default: a new folder under $TMPDIR,
#                            removed at the end unless KILN_STRANGER_KEEP=1); given again, its clone is reused
#   KILN_STRANGER_PIP_CACHE  pip's download cache to reuse (default: $XDG_CACHE_HOME/kiln/stranger-pip, else
#                            ~/.cache/kiln/stranger-pip; `none`: no cache, every wheel downloaded)
#   KILN_STRANGER_SELECTION  a pytest -k expression for the suites (KILN_TEST_SELECTION of the run): a reduced run
#   KILN_TORCH_INDEX_URL     passed through: the base URL of PyTorch's wheel indexes (torch's CPU build)
#   KILN_CI_BENCH_ONLY, KILN_CI_MODELS_ONLY  passed through: the main job's bench steps narrowed (see noxfile.py)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cmd=("$@")
[ ${#cmd[@]} -gt 0 ] || cmd=(nox -s ci)

work=${KILN_STRANGER_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-stranger.XXXXXX")}
mkdir -p "$work/home" "$work/data"
if [ "${KILN_STRANGER_KEEP:-0}" != 1 ] && [ -z "${KILN_STRANGER_DIR:-}" ]; then
  trap 'rm -rf "$work"' EXIT
fi
cache=${KILN_STRANGER_PIP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/stranger-pip}

# pip's configuration: none of this machine's files (PIP_CONFIG_FILE=/dev/null: pip then reads no configuration
# file at all, not even /etc's), the package index (pip's default) and nothing else
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
pip_env=("PIP_CONFIG_FILE=/dev/null" "PIP_DISABLE_PIP_VERSION_CHECK=1" "PIP_DEFAULT_TIMEOUT=180")
[ -n "$cert" ] && [ -f "$cert" ] && pip_env+=("PIP_CERT=$cert")
if [ "$cache" = none ]; then pip_env+=("PIP_NO_CACHE_DIR=1"); else mkdir -p "$cache"; pip_env+=("PIP_CACHE_DIR=$cache"); fi

# KILN_STRANGER_DIR given again: the same clone and venvs (the README's second command after its first)
[ -d "$work/kiln" ] || git clone --quiet --no-hardlinks "$repo" "$work/kiln"
clean_env=(env -i "PATH=$work/py/bin:/usr/local/bin:/usr/bin:/bin" "HOME=$work/home" "XDG_DATA_HOME=$work/data"
           "XDG_CACHE_HOME=$work/home/.cache" "${pip_env[@]}" "LANG=C.UTF-8" "TERM=dumb")
[ -n "${KILN_STRANGER_SELECTION:-}" ] && clean_env+=("KILN_TEST_SELECTION=$KILN_STRANGER_SELECTION")
[ -n "${KILN_TORCH_INDEX_URL:-}" ] && clean_env+=("KILN_TORCH_INDEX_URL=$KILN_TORCH_INDEX_URL")
for var in KILN_CI_BENCH_ONLY KILN_CI_MODELS_ONLY; do  # a reduced main job: the bench steps narrowed (noxfile.py ci)
  [ -n "${!var:-}" ] && clean_env+=("$var=${!var}")
done

start=$SECONDS
log="$work/log-$(date -u +%Y%m%dT%H%M%S).txt"  # one per command: a second one may run beside the first
if [ ! -x "$work/py/bin/nox" ]; then
  echo "stranger: $work: python3 -m venv py && pip install nox (pip: the package index only)"
  (cd "$work" && "${clean_env[@]}" python3 -m venv py && "${clean_env[@]}" py/bin/pip install --quiet nox)
fi
set_up=$((SECONDS - start))
echo "stranger: ${cmd[*]} in $work/kiln"
set +e
(cd "$work/kiln" && "${clean_env[@]}" "${cmd[@]}") 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
took=$((SECONDS - start))

first=$(grep -m1 -E "^nox > (mode|shared venv|torch)" "$log" || true)
disk() { du -sh "$1" 2>/dev/null | cut -f1; }
echo "stranger: exit $rc; ${cmd[*]} took $((took - set_up))s after ${set_up}s of set-up (venv + nox)"
echo "stranger: first line of the session: ${first:-none}"
echo "stranger: disk: clone+venv $(disk "$work/kiln") (.nox/kiln $(disk "$work/kiln/.nox/kiln")), nox's venv" \
     "$(disk "$work/py"), pip cache $( [ "$cache" = none ] && echo none || disk "$cache")"
exit "$rc"
