#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# with_redis.sh [--module PATH [--also-load PATH]] CMD [ARG...] - runs CMD
# beside a private redis-server; with --module, one that has loaded the
# Redis module at PATH (tollgate.so), so the Redis store's calls go through
# it instead of the script.
#
# The server listens on 127.0.0.1 at a free port and on a unix socket, keeps
# everything in a temporary directory, persists nothing, and is killed (with
# the directory removed) by an EXIT trap however CMD ends. CMD finds it
# through the environment:
#   TG_TEST_REDIS_PORT     TCP port on 127.0.0.1
#   TG_TEST_REDIS_SOCK     unix socket path
#   TG_TEST_REDIS_CONF     config file: `redis-server $TG_TEST_REDIS_CONF`
#                          starts it again (daemonized) after a test stopped it
#   TG_TEST_REDIS_PIDFILE  where the running server writes its pid
#   TG_TEST_REDIS_MODULE   the module's path when it is loaded, else empty
# Nothing here depends on a server left running, or leaves one behind.
set -euo pipefail

module=
if [ "${1:-}" = --module ]; then
  module=${2:?--module needs the path of tollgate.so}
  shift 2
  [ -f "$module" ] || { echo "with_redis.sh: no module at $module" >&2; exit 1; }
  module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module") # the server chdirs
fi
# --also-load PATH: another module beside it (bench/module_bench.sh's floor
# module); not in TG_TEST_REDIS_MODULE
also=
if [ "${1:-}" = --also-load ]; then
  also=${2:?--also-load needs a module path}
  shift 2
  [ -f "$also" ] || { echo "with_redis.sh: no module at $also" >&2; exit 1; }
  also=$(cd "$(dirname "$also")" && pwd)/$(basename "$also")
fi
if [ $# -eq 0 ]; then
  echo "usage: with_redis.sh [--module PATH] CMD [ARG...]" >&2
  exit 2
fi
for tool in redis-server redis-cli; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "with_redis.sh: $tool not found (Debian: apt-get install redis-server)" >&2
    exit 1
  fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/tg-redis.XXXXXX")
pidfile=$dir/redis.pid
cleanup() {
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill -CONT "$pid" 2>/dev/null || true # a test may have stopped it
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

# A port below the kernel's ephemeral range. Tests kill this server and
# reconnect to its port while it is down; a port inside the range can be
# handed to that very connection as its local port, and the socket then
# connects to itself (TCP simultaneous open) and reads its own command back
# as the reply, or to another test's connection that took the port.
eph=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
span=$((eph - 20000))
[ "$span" -gt 100 ] || span=40000 # an odd range: take our chances
started=
for _ in $(seq 1 20); do
  port=$((20000 + RANDOM % span))
  cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
port $port
unixsocket $dir/redis.sock
unixsocketperm 700
dir $dir
daemonize yes
pidfile $pidfile
logfile $dir/redis.log
save ""
appendonly no
CONF
  [ -z "$module" ] || printf "loadmodule %s\nenable-module-command local\n" "$module" >>"$dir/redis.conf"
  [ -z "$also" ] || printf "loadmodule %s\n" "$also" >>"$dir/redis.conf"
  rm -f "$pidfile"
  redis-server "$dir/redis.conf" || continue
  for _ in $(seq 1 100); do
    if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
      started=1
      break
    fi
    sleep 0.05
  done
  [ -n "$started" ] && break
  # a module that does not load will not load on another port either
  grep -q "Can't load module" "$dir/redis.log" 2>/dev/null && break
  # the port was taken (or the server died): stop whatever started, retry
  [ -s "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
done
if [ -z "$started" ]; then
  echo "with_redis.sh: could not start redis-server; its log:" >&2
  cat "$dir/redis.log" >&2 || true
  exit 1
fi

export TG_TEST_REDIS_PORT=$port
export TG_TEST_REDIS_SOCK=$dir/redis.sock
export TG_TEST_REDIS_CONF=$dir/redis.conf
export TG_TEST_REDIS_PIDFILE=$pidfile
export TG_TEST_REDIS_MODULE=$module
"$@"
