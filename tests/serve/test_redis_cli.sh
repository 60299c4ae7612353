#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_redis_cli.sh - `tollgate serve` driven by redis-cli and
# redis-benchmark, Redis's own clients: decisions, errors, INFO, pipelining
# (redis-cli --pipe), concurrent clients on one key, the unix socket, the
# shared-memory store across two servers, a password (redis-cli -a), and a
# clean stop on SIGTERM.
#
# usage: test_redis_cli.sh PATH/TO/tollgate
TOLLGATE=${1:?usage: $0 PATH/TO/tollgate}
. "$(dirname "$0")/lib.sh"
need redis-cli redis-tools
need redis-benchmark redis-tools

rc() { redis-cli -p "$PORT" "$@"; }
# one reply's lines joined by spaces
line() { rc "$@" | tr '\n' ' ' | sed 's/ $//'; }
eq() { [ "$1" = "$2" ] || { echo "  got '$1', want '$2'" >&2; return 1; }; }
has() { grep -q -- "$2" <<<"$1" || { echo "  '$2' not in: $1" >&2; return 1; }; }

start_server --unix "$TG_TMP/tg.sock"
H="3600000" # an hour: no window or log entry ends during the test

check "PING" eq "$(rc PING)" "PONG"
check "first hit: allowed 1, count 1, remaining 2, no wait, fresh in an hour" \
  eq "$(line TG.HIT u:1 sliding_window 3 $H)" "1 1 2 0 $H 0"
check "second hit" has "$(line TG.HIT u:1 sliding_window 3 $H)" "^1 2 1 0 "
check "third hit" has "$(line TG.HIT u:1 sliding_window 3 $H)" "^1 3 0 0 "
denied=$(line TG.HIT u:1 sliding_window 3 $H)
check "fourth hit denied, count 3" has "$denied" "^0 3 0 "
retry=$(cut -d' ' -f4 <<<"$denied")
check "its retry_after_ms is within the hour" \
  test "$retry" -gt 0 -a "$retry" -le "$H"
check "TG.GET reads the log" eq "$(rc TG.GET u:1 sliding_window 3 $H)" "3"
check "TG.RESET forgets it" eq "$(rc TG.RESET u:1 sliding_window)" "OK"
check "TG.GET after reset" eq "$(rc TG.GET u:1 sliding_window 3 $H)" "0"
check "TG.INC on a window" eq "$(rc TG.INC w fixed_window_per_key 5 $H COST 3)" "3"
check "TG.SET then TG.GET on a bucket" \
  eq "$(rc TG.SET b token_bucket 10 $H 4 BURST 10; rc TG.GET b token_bucket 10 $H BURST 10)" \
  "OK
4"
at=$(rc TG.EXPIRESAT w fixed_window_per_key 5 $H)
now_ms=$(($(date +%s) * 1000))
check "TG.EXPIRESAT is about an hour ahead" \
  test "$at" -gt $((now_ms + 3500000)) -a "$at" -le $((now_ms + 3700000))
check "a library status is an error named after it" \
  has "$(rc TG.HIT k fixed_window 0 1000 2>&1)" "^TG_EQUOTA invalid quota"
check "TG.INC on the sliding log is not supported" \
  has "$(rc TG.INC k sliding_window 1 1000 2>&1)" "^TG_ENOTSUP"
check "an unknown algorithm" \
  has "$(rc TG.HIT k nope 1 1000 2>&1)" "^ERR unknown algorithm 'nope'"
check "an unknown command" has "$(rc FLUSHALL 2>&1)" "^ERR unknown command"
check "HELLO 3 is refused" has "$(rc HELLO 3 2>&1)" "^NOPROTO"
check "the unix socket" eq "$(redis-cli -s "$TG_TMP/tg.sock" PING)" "PONG"

# pipelining: 1000 requests in one stream through redis-cli --pipe, then
# the log holds exactly the 600 the limit admits
for i in $(seq 1000); do
  printf '*5\r\n$6\r\nTG.HIT\r\n$4\r\npipe\r\n$14\r\nsliding_window\r\n$3\r\n600\r\n$7\r\n3600000\r\n'
done >"$TG_TMP/pipe.resp"
piped=$(rc --pipe <"$TG_TMP/pipe.resp" 2>&1)
check "redis-cli --pipe: 1000 replies, no error" has "$piped" "errors: 0, replies: 1000"
check "the pipelined hits admitted exactly the limit" \
  eq "$(rc TG.GET pipe sliding_window 600 $H)" "600"

# 8 concurrent clients, 50 hits each, on one token bucket of 200 that
# refills one token an hour: exactly 200 are admitted
clients=()
for c in $(seq 8); do
  rc -r 50 TG.HIT shared token_bucket 1 $H BURST 200 >"$TG_TMP/conc.$c" &
  clients+=($!)
done
wait "${clients[@]}" # not a bare wait: the server is a child too
admitted=$(cat "$TG_TMP"/conc.* | awk 'NR % 6 == 1 && $1 == 1' | wc -l)
answered=$(cat "$TG_TMP"/conc.* | wc -l)
check "8 concurrent clients: 400 answers of 6 lines" eq "$answered" "2400"
check "8 concurrent clients: exactly 200 admitted" eq "$admitted" "200"

# redis-benchmark: pipelined, concurrent, and every decision counted
before=$(rc INFO stats | tr -d '\r' | sed -n 's/^decisions_allowed://p')
errors=$(rc INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p')
bench=$(redis-benchmark -p "$PORT" -n 5000 -c 10 -P 8 -r 1000 -q \
  TG.HIT 'b:__rand_int__' fixed_window 1000000000 $H 2>&1 | tr '\r' '\n')
check "redis-benchmark runs" has "$bench" "requests per second"
after=$(rc INFO stats | tr -d '\r' | sed -n 's/^decisions_allowed://p')
check "redis-benchmark: 5000 decisions, all allowed" eq "$((after - before))" "5000"
check "redis-benchmark: no error reply" \
  eq "$(rc INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p')" "$errors"
info=$(rc INFO | tr -d '\r')
check "INFO reports keys" has "$info" "^keys:[1-9]"
check "INFO reports the store" has "$info" "^store:memory$"
check "INFO reports memory" has "$info" "^store_bytes:[1-9]"
check "DBSIZE counts the keys" test "$(rc DBSIZE)" -gt 500

stop_server
check "the unix socket is removed on exit" test ! -e "$TG_TMP/tg.sock"
check "the log says it stopped" has "$(cat "$SERVER_LOG")" "stopped after"

# two servers on one shared-memory store share one limit
shm="/tg-test-$$"
trap 'tg_cleanup; rm -f /dev/shm/tg-test-$$.*' EXIT
start_server --shm "$shm"
port_a=$PORT pid_a=$SERVER_PID log_a=$SERVER_LOG
start_server --shm "$shm"
check "shm: a hit on server A" \
  has "$(redis-cli -p "$port_a" TG.HIT s sliding_window 2 $H | tr '\n' ' ')" "^1 1 "
check "shm: ...is seen by server B" \
  has "$(redis-cli -p "$PORT" TG.HIT s sliding_window 2 $H | tr '\n' ' ')" "^1 2 "
check "shm: ...and the limit holds across both" \
  has "$(redis-cli -p "$port_a" TG.HIT s sliding_window 2 $H | tr '\n' ' ')" "^0 2 "
check "shm: INFO names the store" \
  has "$(rc INFO server | tr -d '\r')" "^store:shm:$shm"
stop_server
SERVER_PID=$pid_a SERVER_LOG=$log_a
stop_server

# a password (from the environment, so it is not in ps): redis-cli -a
TOLLGATE_REQUIREPASS='s3cret pw' start_server
check "requirepass: without AUTH, NOAUTH" \
  has "$(rc PING 2>&1)" "^NOAUTH Authentication required"
check "requirepass: TG.HIT without AUTH, NOAUTH" \
  has "$(rc TG.HIT k fixed_window 1 $H 2>&1)" "^NOAUTH"
check "requirepass: redis-cli -a" \
  eq "$(rc -a 's3cret pw' --no-auth-warning PING)" "PONG"
check "requirepass: redis-cli --user default --pass" \
  eq "$(rc --user default --pass 's3cret pw' --no-auth-warning PING)" "PONG"
check "requirepass: a decision once authenticated" \
  has "$(rc -a 's3cret pw' --no-auth-warning TG.HIT k fixed_window 1 $H | tr '\n' ' ')" "^1 1 0 "
check "requirepass: a wrong password is WRONGPASS" \
  has "$(rc -a nope --no-auth-warning PING 2>&1)" "WRONGPASS"
check "requirepass: redis-benchmark -a" \
  has "$(redis-benchmark -p "$PORT" -a 's3cret pw' -n 200 -q PING 2>&1 | tr '\r' '\n')" \
  "per second"
stop_server
finish
