#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_serve_redis.sh - `tollgate serve --redis`: two servers over one private
# redis-server (tests/redis/with_redis.sh started it, on a free loopback
# port) share one limit; the state is in Redis under hash-tagged names with
# TTLs; when Redis goes away the answers are the failure policy's, marked
# degraded, and the servers recover by themselves when it comes back.
#
# usage: with_redis.sh test_serve_redis.sh PATH/TO/tollgate
TOLLGATE=${1:?usage: $0 PATH/TO/tollgate}
. "$(dirname "$0")/lib.sh"
need redis-cli redis-tools
: "${TG_TEST_REDIS_PORT:?run through tests/redis/with_redis.sh}"

rc() { redis-cli -p "$1" "${@:2}"; }
line() { rc "$@" | tr '\n' ' ' | sed 's/ $//'; }
eq() { [ "$1" = "$2" ] || { echo "  got '$1', want '$2'" >&2; return 1; }; }
has() { grep -q -- "$2" <<<"$1" || { echo "  '$2' not in: $1" >&2; return 1; }; }
R=$TG_TEST_REDIS_PORT
H=3600000

start_server --redis "127.0.0.1:$R" --redis-prefix srv
A=$PORT
A_PID=$SERVER_PID
A_LOG=$SERVER_LOG
start_server --redis-unix "$TG_TEST_REDIS_SOCK" --redis-prefix srv
B=$PORT

check "INFO names the store" has "$(rc $A INFO)" "store:redis:127.0.0.1:$R db 0 prefix srv"
check "first hit on server A" eq "$(line $A TG.HIT u:1 sliding_window 3 $H)" "1 1 2 0 $H 0"
check "second hit on server B (over the unix socket to Redis)" \
  has "$(line $B TG.HIT u:1 sliding_window 3 $H)" "^1 2 1 0 "
check "third hit on A" has "$(line $A TG.HIT u:1 sliding_window 3 $H)" "^1 3 0 0 "
check "fourth hit on B is denied: one limit for both" \
  has "$(line $B TG.HIT u:1 sliding_window 3 $H)" "^0 3 0 "
check "the log is in Redis under its hash-tagged name" \
  eq "$(rc $R EXISTS 'srv:{u:1}:sw')" "1"
ttl=$(rc $R PTTL 'srv:{u:1}:sw')
check "with a TTL of about an hour" test "$ttl" -gt 3500000 -a "$ttl" -le 3600002
check "TG.INC and TG.GET across servers" \
  eq "$(rc $A TG.INC w fixed_window_per_key 5 $H COST 3; rc $B TG.GET w fixed_window_per_key 5 $H)" \
  "3
3"
check "TG.RESET on B forgets the key for A" \
  eq "$(rc $B TG.RESET u:1 sliding_window; rc $A TG.GET u:1 sliding_window 3 $H)" "OK
0"

# Requests pipelined to the server go to Redis as one pipeline: 200 TG.HIT
# sent in one write cost Redis far fewer reads than 200 (one at a time, the
# server would wait for each reply before sending the next), and every
# reply is still in order, each key counted exactly
reads() { rc $R INFO stats | tr -d '\r' | sed -n 's/^total_reads_processed://p'; }
before=$(reads)
burst=
for ((i = 0; i < 200; i++)); do
  burst+="TG.HIT p:$((i % 7)) fixed_window_per_key 1000 $H"$'\r\n'
done
replies=$(exec 3<>/dev/tcp/127.0.0.1/$A && printf '%s' "$burst" >&3 &&
  timeout 30 head -n 1400 <&3 | tr -d '\r')
after=$(reads)
check "200 pipelined hits: all answered" eq "$(grep -c '^\*6$' <<<"$replies")" 200
check "in order, each key counted exactly" eq "$(awk '
  /^\*6$/ { n++; line = 0; next }
  { line++ }
  line == 2 { k = (n - 1) % 7; want = ++seen[k]; if ($0 != ":" want) bad++ }
  END { print bad + 0 }' <<<"$replies")" 0
check "and Redis read them in far fewer than 200 reads ($((after - before)))" \
  test $((after - before)) -lt 100

# Redis goes away: every decision is the failure policy's (fail open by
# default), marked degraded; then it comes back, empty, and both recover
kill -KILL "$(cat "$TG_TEST_REDIS_PIDFILE")"
for ((i = 0; i < 100; i++)); do
  redis-cli -p $R PING >/dev/null 2>&1 || break
  sleep 0.05
done
check "Redis down: allowed, degraded" \
  has "$(line $A TG.HIT u:2 token_bucket 1 $H)" "^1 0 0 0 0 1$"
check "Redis down: TG.GET is an error naming the failure" \
  has "$(rc $B TG.GET u:2 token_bucket 1 $H 2>&1)" "^TG_ECONNECT"
redis-server "$TG_TEST_REDIS_CONF"
for ((i = 0; i < 100; i++)); do
  [ "$(redis-cli -p $R PING 2>/dev/null)" = PONG ] && break
  sleep 0.05
done
ok=
for ((i = 0; i < 100; i++)); do
  if [ "$(line $A TG.HIT u:3 token_bucket 1 $H)" = "1 0 0 0 $H 0" ]; then
    ok=1
    break
  fi
  sleep 0.05
done
check "A recovers by itself once Redis is back" test -n "$ok"
check "and B sees A's decision" has "$(line $B TG.HIT u:3 token_bucket 1 $H)" "^0 0 0 "

stop_server
SERVER_PID=$A_PID
SERVER_LOG=$A_LOG
stop_server
finish
