#!/usr/bin/env bash
# A throwaway PostgreSQL for the fleet-store tests, on a Unix socket in DIR (no TCP port).
#   ci/postgres.sh start DIR   initdb into DIR/data, start it, create database `kiln`, print its URL
#                              (DIR/data there already: start that server again)
#   ci/postgres.sh stop DIR    stop it (fast shutdown); DIR is left for the caller to remove
# Run as root (as .ci/run is), the server runs as the `postgres` user (PostgreSQL refuses root); Debian's
# `postgresql` package is installed when no initdb is found. Trust authentication: local socket only.
set -euo pipefail
cmd=${1:?usage: ci/postgres.sh start|stop DIR}
dir=${2:?usage: ci/postgres.sh start|stop DIR}

bin=""
for cand in "$(command -v initdb 2>/dev/null || true)" /usr/lib/postgresql/*/bin/initdb; do
  if [ -n "$cand" ] && [ -x "$cand" ]; then bin=$(dirname "$(readlink -f "$cand")"); break; fi
done
if [ -z "$bin" ] && [ "$cmd" = start ] && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
  bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | tail -n 1)")
fi
[ -n "$bin" ] || { echo "ci/postgres.sh: no initdb (install Debian's postgresql package)" >&2; exit 3; }

# runuser lives in /usr/sbin (util-linux), which a root shell's PATH may lack (`env -i`, some terminals)
runuser=$(command -v runuser 2>/dev/null || ls /usr/sbin/runuser /sbin/runuser 2>/dev/null | head -n 1 || true)
as_owner() {
  if [ "$(id -u)" = 0 ]; then (cd / && "${runuser:-runuser}" -u postgres -- "$@"); else "$@"; fi  # from /: the caller's folder may be closed to postgres
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
    fresh=0
    if [ ! -d "$dir/data" ]; then  # a second start of DIR restarts the server it made (the tests' outage)
      as_owner "$bin/initdb" -D "$dir/data" -A trust -U kiln --no-sync >"$dir/initdb.log"
      fresh=1
    fi
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
      -o "-c listen_addresses='' -k $dir -c fsync=off -c max_connections=200" start >/dev/null
    if [ "$fresh" = 1 ]; then
      "$bin/psql" -h "$dir" -U kiln -d postgres -qAt -c "CREATE DATABASE kiln" >/dev/null
    fi
    echo "postgresql://kiln@/kiln?host=$dir"
    ;;
  stop)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
  *) echo "usage: ci/postgres.sh start|stop DIR" >&2; exit 2 ;;
esac
