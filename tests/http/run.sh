#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh SERVER - the example HTTP server (examples/http_server.c) through
# curl: one client's policy of 5 per second and 20 per minute answers 200
# five times, then 429 with Retry-After and the RateLimit fields; another
# client is not affected; --legacy writes the older fields. The server is
# started on a free loopback port and always stopped.
set -euo pipefail
server=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/tg-http.XXXXXX")
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  [ -z "$pid" ] || wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

start() {
  "$server" --max-requests 50 "$@" >"$dir/port" 2>"$dir/err" &
  pid=$!
  for _ in $(seq 100); do
    [ -s "$dir/port" ] && break
    sleep 0.05
  done
  port=$(head -1 "$dir/port")
  [ -n "$port" ] || { echo "server did not start"; cat "$dir/err"; exit 1; }
}

fail() { echo "FAIL: $*"; exit 1; }

# six requests from one curl process, milliseconds apart: the per-second
# bucket refills a request every 200 ms, which six curl processes in a row
# can take on a loaded machine
six() { # CLIENT PREFIX: headers of six requests into PREFIX1..PREFIX6
  local u="http://127.0.0.1:$port/"
  curl -s -D "$2.all" --max-time 10 -H "X-Client: $1" \
    -o /dev/null -o /dev/null -o /dev/null -o /dev/null -o /dev/null \
    -o /dev/null "$u" "$u" "$u" "$u" "$u" "$u" || fail "curl $1"
  awk -v p="$2" '/^HTTP\//{n++} {print > (p n)}' "$2.all"
  [ -s "${2}6" ] || fail "six responses expected: $(cat "$2.all")"
}

start
six alice "$dir/h"
for i in 1 2 3 4 5; do
  grep -q '^HTTP/1.1 200' "$dir/h$i" || fail "request $i not 200: $(cat "$dir/h$i")"
done
h=$dir/h6
grep -q '^HTTP/1.1 429' "$h" || fail "request 6 not 429: $(cat "$h")"
grep -q '^Retry-After: 1' "$h" || fail "no Retry-After: 1: $(cat "$h")"
grep -q '^RateLimit-Policy: "per-second";q=5;w=1, "per-minute";q=20;w=60' "$h" ||
  fail "RateLimit-Policy: $(cat "$h")"
grep -q '^RateLimit: "per-second";r=0;t=1, "per-minute";r=15;t=' "$h" ||
  fail "RateLimit: $(cat "$h")"
grep -q '^RateLimit: "per-second";r=4;t=1, "per-minute";r=19;t=' "$dir/h1" ||
  fail "first RateLimit: $(cat "$dir/h1")"
curl -s -D "$dir/bob" -o /dev/null --max-time 5 -H 'X-Client: bob' \
  "http://127.0.0.1:$port/" || fail "curl bob"
grep -q '^HTTP/1.1 200' "$dir/bob" || fail "bob: $(cat "$dir/bob")"
# a client that leaves before its answer (the server's second write then
# meets a reset connection: SIGPIPE, were it not for MSG_NOSIGNAL), three
# times, and one that connects and sends nothing: the server lives on, and
# answers the next client once the idle one has been dropped (2 s)
for _ in 1 2 3; do
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf 'GET / HTTP/1.1\r\nX-Client: dave\r\n\r\n' >&3
  exec 3>&-
  sleep 0.2
done
exec 4<>"/dev/tcp/127.0.0.1/$port"
curl -s -D "$dir/erin" -o /dev/null --max-time 10 -H 'X-Client: erin' \
  "http://127.0.0.1:$port/" || fail "curl erin after an idle client"
exec 4>&-
grep -q '^HTTP/1.1 200' "$dir/erin" || fail "erin: $(cat "$dir/erin")"
kill -0 "$pid" || fail "the server died"
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=

start --legacy
six carol "$dir/l"
h=$dir/l6
grep -q '^HTTP/1.1 429' "$h" || fail "legacy 6 not 429"
grep -q '^RateLimit-Limit: 5, 5;w=1, 20;w=60' "$h" || fail "legacy limit: $(cat "$h")"
grep -q '^RateLimit-Remaining: 0' "$h" || fail "legacy remaining"
grep -q '^RateLimit-Reset: 1' "$h" || fail "legacy reset: $(cat "$h")"
echo "http_server: 2 passed, 0 failed"
