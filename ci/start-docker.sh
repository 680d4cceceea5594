#!/usr/bin/env bash
# Make docker and debootstrap usable on a CI machine (root, Debian-like, fresh): install docker.io and
# debootstrap with apt-get when missing, start dockerd in the background when no daemon answers, and
# wait until it does. On failure the dockerd log is shown and the exit status is non-zero.
# Called by .ci/run before the harness builds the CPU image.
set -euo pipefail

LOG=${KILN_DOCKERD_LOG:-/tmp/kiln-dockerd.log}
DOCKER=${KILN_DOCKER:-/usr/bin/docker}

die() { echo "start-docker: error: $*" >&2; exit 1; }

need=()
if ! command -v dockerd >/dev/null 2>&1 || [ ! -x "$DOCKER" ]; then need+=(docker.io); fi
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "need root to install ${need[*]} (or install them yourself)"
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install ${need[*]} yourself"
  echo "start-docker: installing ${need[*]}"
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
fi
[ -x "$DOCKER" ] || die "docker client $DOCKER not found after installing docker.io"

if "$DOCKER" version >/dev/null 2>&1; then
  echo "start-docker: daemon already running ($("$DOCKER" version --format '{{.Server.Version}}'))"
  exit 0
fi

echo "start-docker: starting dockerd (log: $LOG)"
nohup dockerd >"$LOG" 2>&1 &
pid=$!
for _ in $(seq 60); do
  if "$DOCKER" version >/dev/null 2>&1; then
    echo "start-docker: daemon up ($("$DOCKER" version --format '{{.Server.Version}}'), pid $pid)"
    exit 0
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
echo "start-docker: error: dockerd did not come up (pid $pid); last lines of $LOG:" >&2
tail -n 40 "$LOG" >&2 || true
exit 1
