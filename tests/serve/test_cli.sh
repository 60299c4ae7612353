#!/usr/bin/env bash
# test_cli.sh - the `tollgate` program's other commands as a user runs them:
# demo (its summary), simulate (its table, and an SVG that is well-formed
# XML), bench (finds and runs the benchmark), version, help, and bad usage
# answered with exit status 2.
#
# usage: test_cli.sh PATH/TO/tollgate
TOLLGATE=${1:?usage: $0 PATH/TO/tollgate}
. "$(dirname "$0")/lib.sh"
need python3 python3

eq() { [ "$1" = "$2" ] || { echo "  got '$1', want '$2'" >&2; return 1; }; }
has() { grep -q -- "$2" <<<"$1" || { echo "  '$2' not in: $1" >&2; return 1; }; }
status() { "$@" >/dev/null 2>&1; echo $?; }
xml_ok() { python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$1"; }

demo=$("$TOLLGATE" demo)
check "demo: the fixed window lets 6 through in a minute, the log 3" \
  has "$demo" "^fixed_window  *15  *2  *6  *3$"
check "demo --help" has "$("$TOLLGATE" demo --help)" "^usage: tollgate demo"
check "demo: one algorithm" \
  eq "$("$TOLLGATE" demo --algorithm token_bucket | grep -c '^== ')" "2"

cd "$TG_TMP" || exit 1
sim=$("$TOLLGATE" simulate)
check "simulate: the boundary attack by default" has "$sim" "^tollgate simulate: boundary"
check "simulate: fixed window admits 2x the limit in a period" \
  has "$sim" "^fixed_window  *100  *0  *20  *2.00$"
check "simulate: the sliding log holds the limit" \
  has "$sim" "^sliding_window  *50  *50  *10  *1.00$"
check "simulate: writes its timeline" test -s simulate-boundary.svg
check "simulate: the timeline is well-formed XML" xml_ok simulate-boundary.svg
for p in steady bursty many_keys; do
  "$TOLLGATE" simulate --pattern $p --periods 6 --keys 100 --svg "$p.svg" >/dev/null
  check "simulate --pattern $p draws well-formed XML" xml_ok "$p.svg"
done
check "simulate --svg - writes the SVG to stdout" \
  has "$("$TOLLGATE" simulate --svg - 2>/dev/null | head -2)" "^<svg "
check "simulate --no-svg" test ! -e nosvg.svg -a \
  "$(status "$TOLLGATE" simulate --no-svg --svg nosvg.svg)" = 0
check "simulate: unknown pattern is bad usage" \
  eq "$(status "$TOLLGATE" simulate --pattern nope)" "2"
check "simulate: limit 0 is bad usage" \
  eq "$(status "$TOLLGATE" simulate --limit 0)" "2"

bench=$("$TOLLGATE" bench --quick --filter name=clock 2>&1)
check "bench runs the benchmark suite" has "$bench" "^name=clock"
check "bench --bench with a missing program fails" \
  eq "$(status "$TOLLGATE" bench --bench /nonexistent)" "1"

check "version" has "$("$TOLLGATE" version)" "^tollgate [0-9]"
check "help lists serve" has "$("$TOLLGATE" help)" "serve"
check "serve --help" has "$("$TOLLGATE" serve --help)" "TG.HIT key algorithm"
check "serve: an unknown option is bad usage" \
  eq "$(status "$TOLLGATE" serve --nope)" "2"
check "serve: a bad port is bad usage" \
  eq "$(status "$TOLLGATE" serve --port 70000)" "2"
check "serve: a bad --shm name is bad usage" \
  eq "$(status "$TOLLGATE" serve --shm noslash)" "2"
for bad in "--max-new-keys-per-client 10" "--max-new-keys-per-client 0/1000" \
  "--max-new-keys-per-client 10/x" "--max-period-ms 0" "--lock-timeout-ms x" \
  "--redis-timeout-ms 0" "--backoff-ms -1" "--sliding-max-entries 0"; do
  # shellcheck disable=SC2086 # the option and its value are two words
  check "serve: $bad is bad usage" eq "$(status "$TOLLGATE" serve $bad)" "2"
done
help=$("$TOLLGATE" serve --help)
for opt in --requirepass --unix-mode --lock-timeout-ms --redis-timeout-ms \
  --backoff-ms --require-store --max-period-ms --max-new-keys-per-client \
  --sliding-max-entries --capacity; do
  check "serve --help documents $opt" has "$help" "^  $opt "
done
start_server
in_use=$(status "$TOLLGATE" serve --port "$PORT")
stop_server
check "serve: a port in use fails to start" eq "$in_use" "1"
check "an unknown command is bad usage" eq "$(status "$TOLLGATE" nope)" "2"
finish
