# SPDX-License-Identifier: MIT
# lib.sh - sourced by the shell tests of `tollgate serve`: starts servers on
# a free loopback port (--port 0; the port is read from the ready line) and
# always stops them, from an EXIT trap if the script dies first. Nothing
# depends on a server left running. Tests count their checks and end with
# "N passed, N failed".
#
#   TOLLGATE=path/to/tollgate . lib.sh
#   start_server [serve options...]   -> $SERVER_PID, $PORT, $SERVER_LOG
#   stop_server                       SIGTERM; fails unless it exits 0
#   check "what" COMMAND...           runs COMMAND; counts a pass or failure
set -u

: "${TOLLGATE:?set TOLLGATE to the tollgate program}"
TG_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tg-serve-test.XXXXXX")
TG_PIDS=()
PASSED=0
FAILED=0

tg_cleanup() {
  local p
  for p in "${TG_PIDS[@]+"${TG_PIDS[@]}"}"; do
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$TG_TMP"
}
trap tg_cleanup EXIT

# need TOOL PACKAGE: fails the test with a clear message if TOOL is missing.
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "FAIL: $1 is not installed (Debian: apt-get install $2)" >&2
    exit 1
  fi
}

check() {
  local what=$1
  shift
  if "$@"; then
    PASSED=$((PASSED + 1))
    echo "ok: $what"
  else
    FAILED=$((FAILED + 1))
    echo "FAIL: $what" >&2
  fi
}

# start_server [options...]: waits up to 60 s for the ready line.
start_server() {
  SERVER_LOG=$(mktemp "$TG_TMP/server.XXXXXX")
  "$TOLLGATE" serve --port 0 "$@" >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  TG_PIDS+=("$SERVER_PID")
  local i
  for ((i = 0; i < 600; i++)); do
    if grep -q '^tollgate serve: ready$' "$SERVER_LOG"; then
      PORT=$(sed -n 's/^tollgate serve: listening on .* port \([0-9]*\)$/\1/p' \
        "$SERVER_LOG" | head -1)
      return 0
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "FAIL: the server did not start:" >&2
      cat "$SERVER_LOG" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "FAIL: no ready line from the server within 60 s:" >&2
  cat "$SERVER_LOG" >&2
  exit 1
}

# stop_server: SIGTERM, then waits up to 60 s; the exit status must be 0
# (under the sanitizers that also means no leak and no report).
stop_server() {
  kill -TERM "$SERVER_PID"
  local i
  for ((i = 0; i < 600; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "FAIL: the server ignored SIGTERM for 60 s" >&2
    kill -KILL "$SERVER_PID"
    FAILED=$((FAILED + 1))
    return 1
  fi
  local rc=0
  wait "$SERVER_PID" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: the server exited with status $rc:" >&2
    cat "$SERVER_LOG" >&2
    FAILED=$((FAILED + 1))
    return 1
  fi
  PASSED=$((PASSED + 1))
  echo "ok: the server stopped cleanly on SIGTERM"
}

# finish: the closing line, and the exit status.
finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}
