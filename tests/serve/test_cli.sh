#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_cli.sh - the `tollgate` program's other commands as a user runs them:
# demo (its summary, its notes, algorithm names in any case), simulate (its
# table, an SVG that is well-formed XML, progress, refusals that name the
# limit), shm ls / shm rm (over a server's segments and garbage files in
# /dev/shm), bench (finds and runs the benchmark), version (-V, --version),
# help, and bad usage answered with exit status 2.
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

# simulate: a run too large is refused with the limit and the values at
# fault; progress goes to stderr only when asked (stderr is no terminal here)
big_err=$("$TOLLGATE" simulate --periods 100000 --limit 1000 2>&1 >/dev/null)
check "simulate: too many requests is bad usage" \
  eq "$(status "$TOLLGATE" simulate --periods 100000 --limit 1000)" "2"
check "simulate: the refusal names the limit's value" has "$big_err" "20000000"
check "simulate: ... and what was asked" has "$big_err" "100000000 requests"
check "simulate: no progress on a non-terminal unless asked" \
  eq "$("$TOLLGATE" simulate --no-svg --periods 400 --limit 2000 2>&1 >/dev/null)" ""
prog=$("$TOLLGATE" simulate --no-svg --progress --periods 400 --limit 2000 2>&1 >/dev/null)
check "simulate --progress reports each algorithm to the end" \
  has "$prog" "5/5 leaky_bucket 100% (800000 of 800000 requests)"

# demo: algorithm names in any case (as serve reads them); a note that
# explains one algorithm's answer appears beside that algorithm only
check "demo: algorithm names in any case" \
  eq "$("$TOLLGATE" demo --algorithm Token_Bucket | grep -c '^== ')" "2"
check "demo: a window-only note only beside the fixed window" \
  eq "$("$TOLLGATE" demo | grep 'new fixed window' | wc -l | tr -d ' ')" "1"
check "demo: ... in the fixed window's section" \
  eq "$("$TOLLGATE" demo --algorithm fixed_window | grep -c 'new fixed window')" "1"

# shm ls / shm rm over real segments (made by serve --shm) and garbage
shm=/tgcli-$$
trap 'rm -f /dev/shm/tgcli-$$*; tg_cleanup' EXIT
printf 'not a table' >"/dev/shm${shm}-garbage"
: >"/dev/shm${shm}-empty"
head -c 4096 /dev/urandom >"/dev/shm${shm}-random"
python3 -c 'import sys; open(sys.argv[1], "wb").write(b"TGTABLE1" + b"\x04\0\0\0" + b"\x07" * 600)' \
  "/dev/shm${shm}-badheader"
# a table of format version 3 (tollgate before the tables hashed with
# SipHash-1-3): recognised, and named by its version
python3 -c 'import sys; open(sys.argv[1], "wb").write(b"TGTABLE1" + b"\x03\0\0\0" + b"\x07" * 600)' \
  "/dev/shm${shm}-oldversion"
start_server --shm "$shm"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'TG.HIT a token_bucket 10 1000\r\nTG.HIT b token_bucket 10 1000\r\nPING\r\n' >&3
reply=""
while IFS= read -r -t 10 line <&3; do
  reply+="$line"$'\n'
  [ "${line%$'\r'}" = "+PONG" ] && break
done
exec 3<&-
before=$(md5sum "/dev/shm${shm}.token_bucket")
ls_out=$("$TOLLGATE" shm ls)
after=$(md5sum "/dev/shm${shm}.token_bucket")
stop_server
check "shm ls: the server answered the hits" has "$reply" "+PONG"
check "shm ls: a heading" has "$ls_out" "^NAME  *ALGORITHM  *CAPACITY  *LIVE  *BYTES  *OWNER  *MODE  *STATE$"
check "shm ls: each of the server's five tables, sound" \
  eq "$(grep -c "^${shm}\.[a-z_]*  .*  ok$" <<<"$ls_out")" "5"
check "shm ls: algorithm, capacity, live keys, owner and mode" \
  has "$ls_out" "^${shm}\.token_bucket  *token_bucket  *65536  *2  *[0-9][0-9]*  *$(id -un)  *0600  *ok$"
check "shm ls: other files skipped" \
  eq "$(grep -c -e "${shm}-garbage" -e "${shm}-empty" -e "${shm}-random" <<<"$ls_out")" "0"
check "shm ls: a damaged table is listed as such" \
  has "$ls_out" "^${shm}-badheader  *?  .*corrupt header$"
check "shm ls: a table of an older format is named by its version" \
  has "$ls_out" "^${shm}-oldversion  .*format version 3$"
check "shm ls: only reads (the segment is unchanged)" eq "$after" "$before"
check "shm rm: refuses what is not a tollgate table" \
  eq "$(status "$TOLLGATE" shm rm "${shm}-garbage")" "1"
check "shm rm: ... and left it" test -e "/dev/shm${shm}-garbage"
check "shm rm --force: removes it" \
  eq "$(status "$TOLLGATE" shm rm --force "${shm}-garbage")" "0"
check "shm rm: a table, by its listed name" \
  eq "$(status "$TOLLGATE" shm rm "${shm}.token_bucket")" "0"
check "shm rm: ... which is gone" test ! -e "/dev/shm${shm}.token_bucket"
check "shm rm: the leading / may be left out" \
  eq "$(status "$TOLLGATE" shm rm "${shm#/}.fixed_window")" "0"
check "shm rm: an absent name fails" \
  eq "$(status "$TOLLGATE" shm rm "${shm}.token_bucket")" "1"
check "shm rm: a malformed name is bad usage" \
  eq "$(status "$TOLLGATE" shm rm /a/b)" "2"
check "shm: an unknown subcommand is bad usage" \
  eq "$(status "$TOLLGATE" shm nope)" "2"
check "shm --help" has "$("$TOLLGATE" shm --help)" "^usage: tollgate shm ls"
rm -f /dev/shm/tgcli-$$*

bench=$("$TOLLGATE" bench --quick --filter name=clock 2>&1)
check "bench runs the benchmark suite" has "$bench" "^name=clock"
# its numbers whole or refused (atoi took "5x" for 5 and 2^32 + 1 for 1),
# and --quick never overrides an option given before it
for bad in "--reps 5x" "--reps 4294967297" "--min-time 0.5s" "--attempts -1"; do
  # shellcheck disable=SC2086 # the option and its value are two words
  check "bench $bad is bad usage" eq "$(status "$TOLLGATE" bench $bad)" "2"
done
check "bench --reps before --quick is kept" has \
  "$("$TOLLGATE" bench --reps 7 --quick --filter name=none 2>&1 | head -1)" \
  "median of 7 reps"
check "bench --bench with a missing program fails" \
  eq "$(status "$TOLLGATE" bench --bench /nonexistent)" "1"
# --bench anywhere among the options, the others passed on in order
check "bench --bench after other options runs that program" \
  eq "$("$TOLLGATE" bench --quick --bench /bin/echo --filter x 2>&1)" \
  "--quick --filter x"
check "bench --bench=PATH" \
  eq "$("$TOLLGATE" bench --bench=/bin/echo a 2>&1)" "a"

check "version" has "$("$TOLLGATE" version)" "^tollgate [0-9]"
check "-V is version" eq "$("$TOLLGATE" -V)" "$("$TOLLGATE" version)"
check "--version is version" eq "$("$TOLLGATE" --version)" "$("$TOLLGATE" version)"
for c in serve simulate demo bench shm version help; do
  check "help lists $c" has "$("$TOLLGATE" help)" "^  $c "
done
# the README's command table lists exactly the program's commands
readme="$(dirname "$0")/../../README.md"
help_cmds=$("$TOLLGATE" help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p' | sort)
readme_cmds=$(sed -n 's/^| `tollgate \([a-z][a-z]*\).*/\1/p' "$readme" | sort -u)
check "README's command table matches tollgate help" eq "$readme_cmds" "$help_cmds"
check "--help is help" eq "$("$TOLLGATE" --help)" "$("$TOLLGATE" help)"
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
long=$(printf 'x%.0s' $(seq 255))
check "shm rm: a name of 255 bytes after '/' is bad usage" \
  eq "$(status "$TOLLGATE" shm rm "/$long")" "2"
# output that cannot be written is a failure (it was exit status 0)
for c in version help demo "shm ls"; do
  # shellcheck disable=SC2086 # "shm ls" is two words
  rc=$("$TOLLGATE" $c >/dev/full 2>/dev/null; echo $?)
  check "$c into a full device fails" eq "$rc" "1"
done
finish
