#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# serve_load.sh - the load comparison of issue 6: redis-benchmark sending
# TG.HIT to `tollgate serve`, beside redis-benchmark sending plain INCR and
# the Redis store's script (EVALSHA of src/store/redis.lua, what a decision
# costs a Redis server) to a redis-server this script starts: same machine,
# same run, same -c and -P, the same keys.
#
#   bench/serve_load.sh [--tollgate PATH] [--script PATH] [--reps N]
#                       [--seconds S] [--pin] [--quick]
#
#   --tollgate PATH  the tollgate program (default build/release/tools/
#                    tollgate, built with the release preset if missing)
#   --script PATH    the Redis store's Lua script (default
#                    src/store/redis.lua); without it the EVALSHA lines are
#                    left out and say so
#   --reps N         measurements of each figure, interleaved (default 3);
#                    the median is reported
#   --seconds S      about how long each measurement lasts (default 2)
#   --pin            run both servers and redis-benchmark on CPU 0
#   --quick          1 rep of about 0.3 s: a smoke run, not a figure
#
# Every decision admits (quota: a billion per second, burst a billion), so
# every TG.HIT and every EVALSHA writes, as every INCR does. Workloads: one
# hot key, and 100,000 keys drawn at random by redis-benchmark (-r 100000);
# clients and pipeline depth: -c 50 -P 1 and -c 50 -P 16. Each measurement
# is sized by a short probe of the same command so that it lasts about
# --seconds. After the run the script checks that neither server answered a
# single error (an error reply is cheaper than a decision and would flatter
# the figure) and that tollgate counted every decision.
#
# Output: one line per figure, then the ratios:
#   name=serve_load keys=K c=C P=P cmd=X ops_per_s=MEDIAN
#     server_cpu_ns_per_op=MEDIAN n=N runs=A/B/C
#   name=ratio keys=K c=C P=P alg=A tg_hit_over_incr=R tg_hit_over_evalsha=R
#     target=tg_hit>=2x_evalsha met=yes|no server_cpu_evalsha_over_tg_hit=R
# server_cpu_ns_per_op is the CPU time (user + system, from /proc, in steps
# of a clock tick: 10 ms, about 1 % of a run) the server process used during
# the run, divided by the requests: what one request costs the server,
# whether or not the benchmark client was the bottleneck.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOLLGATE=build/release/tools/tollgate
SCRIPT=src/store/redis.lua
REPS=3
SECONDS_PER=2
PIN=()
while [ $# -gt 0 ]; do
  case $1 in
  --tollgate) TOLLGATE=$2; shift 2 ;;
  --script) SCRIPT=$2; shift 2 ;;
  --reps) REPS=$2; shift 2 ;;
  --seconds) SECONDS_PER=$2; shift 2 ;;
  --pin) PIN=(taskset -c 0); shift ;;
  --quick) REPS=1; SECONDS_PER=0.3; shift ;;
  *) echo "usage: $0 [--tollgate PATH] [--script PATH] [--reps N] [--seconds S] [--pin] [--quick]" >&2; exit 2 ;;
  esac
done

for t in redis-server redis-cli redis-benchmark; do
  command -v $t >/dev/null || { echo "$t missing (Debian: apt-get install redis-server redis-tools)" >&2; exit 1; }
done
if [ ${#PIN[@]} -gt 0 ] && ! command -v taskset >/dev/null; then
  echo "--pin needs taskset (util-linux)" >&2
  exit 1
fi
if [ ! -x "$TOLLGATE" ]; then
  echo "serve_load: building the release preset for $TOLLGATE" >&2
  cmake --preset release >/dev/null && cmake --build --preset release >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-serve-load.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# redis-server on a free loopback port, in the temp dir, persisting nothing
rport=
for _ in $(seq 20); do
  p=$((20000 + RANDOM % 40000))
  (cd "$tmp" && exec "${PIN[@]}" redis-server --port $p --bind 127.0.0.1 \
    --save "" --appendonly no --daemonize no >"$tmp/redis.log" 2>&1) &
  rpid=$!
  for _ in $(seq 50); do
    redis-cli -p $p PING >/dev/null 2>&1 && { rport=$p; break; }
    kill -0 $rpid 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$rport" ] && { pids+=($rpid); break; }
  kill $rpid 2>/dev/null || true
done
[ -n "$rport" ] || { echo "could not start redis-server" >&2; cat "$tmp/redis.log" >&2; exit 1; }

# tollgate serve on a free port; capacity well above the 100,000 keys
"${PIN[@]}" "$TOLLGATE" serve --port 0 --capacity 262144 >"$tmp/tg.log" 2>&1 &
tpid=$!
pids+=($tpid)
for _ in $(seq 100); do
  grep -q '^tollgate serve: ready$' "$tmp/tg.log" && break
  sleep 0.1
done
tport=$(sed -n 's/^tollgate serve: listening on .* port \([0-9]*\)$/\1/p' "$tmp/tg.log")
[ -n "$tport" ] || { echo "tollgate serve did not start" >&2; cat "$tmp/tg.log" >&2; exit 1; }

sha=
if [ -f "$SCRIPT" ]; then
  sha=$(redis-cli -p "$rport" SCRIPT LOAD "$(cat "$SCRIPT")")
fi

# CPU time a process has used, in clock ticks (utime + stime)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# rate PORT N C P R CMD...: ops/s of one redis-benchmark run
rate() {
  local port=$1 n=$2 c=$3 pp=$4 r=$5
  shift 5
  local rflag=()
  [ "$r" = 0 ] || rflag=(-r "$r")
  "${PIN[@]}" redis-benchmark -p "$port" -n "$n" -c "$c" -P "$pp" "${rflag[@]}" -q "$@" 2>&1 |
    tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1
}

# commands of a workload, KEY being the key argument ("key" or
# "key:__rand_int__"): name|port|command words
commands() {
  local key=$1
  echo "tg.hit.fixed_window|$tport|TG.HIT $key fixed_window 1000000000 1000"
  echo "tg.hit.token_bucket|$tport|TG.HIT $key token_bucket 1000000000 1000"
  echo "incr|$rport|INCR $key"
  if [ -n "$sha" ]; then
    # the Redis store's transitions for the same quota: a window add (op w,
    # algorithm 0: cost 1, period 1000 ms) and a bucket hit (op h,
    # algorithm 3: cost x T = 1 ns, tau = burst x T = 1e9 ns), "" = the
    # server's TIME, the key named as redis.c names it
    echo "evalsha.fixed_window|$rport|EVALSHA $sha 1 tg:{$key}:fw w 0 '' 1 1000"
    echo "evalsha.token_bucket|$rport|EVALSHA $sha 1 tg:{$key}:tb h 3 '' 1 1000000000"
  fi
}

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "# tollgate $("$TOLLGATE" version | cut -d' ' -f2) serve_load: $(redis-server --version | cut -d' ' -f3) on port $rport, tollgate serve on port $tport, reps=$REPS, ~${SECONDS_PER}s each, placement=${PIN[*]:-default}"
echo "# $(date -u +%FT%TZ) loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
if [ -n "$sha" ]; then
  echo "# EVALSHA: $SCRIPT, SHA1 $sha"
else
  echo "# EVALSHA: not measured: no Redis store script at $SCRIPT"
fi
declare -A total_tg=()
for keys in hot 100000; do
  if [ $keys = hot ]; then key=key r=0; else key='key:__rand_int__' r=100000; fi
  for pp in 1 16; do
    c=50
    declare -A runs=() size=() cpu=()
    mapfile -t cmds < <(commands "$key")
    for line in "${cmds[@]}"; do # size each measurement with a probe
      IFS='|' read -r name port words <<<"$line"
      eval "set -- $words"
      probe=$(rate "$port" $((pp == 1 ? 20000 : 100000)) $c $pp $r "$@")
      size[$name]=$(awk -v r="$probe" -v s="$SECONDS_PER" 'BEGIN {n = int(r * s); print n < 10000 ? 10000 : n}')
    done
    for ((rep = 0; rep < REPS; rep++)); do
      for line in "${cmds[@]}"; do
        IFS='|' read -r name port words <<<"$line"
        eval "set -- $words"
        pid=$rpid
        [ "$port" = "$tport" ] && pid=$tpid
        t0=$(ticks $pid)
        runs[$name]="${runs[$name]:-} $(rate "$port" "${size[$name]}" $c $pp $r "$@")"
        t1=$(ticks $pid)
        cpu[$name]="${cpu[$name]:-} $(awk -v t=$((t1 - t0)) -v hz="$hz" -v n="${size[$name]}" 'BEGIN {printf "%.0f", t * 1e9 / hz / n}')"
        [[ $name == tg.hit.* ]] && total_tg[x]=$((${total_tg[x]:-0} + ${size[$name]}))
      done
    done
    declare -A med=() mcpu=()
    for line in "${cmds[@]}"; do
      IFS='|' read -r name _ _ <<<"$line"
      med[$name]=$(echo ${runs[$name]} | median)
      mcpu[$name]=$(echo ${cpu[$name]} | median)
      echo "name=serve_load keys=$keys c=$c P=$pp cmd=$name ops_per_s=${med[$name]} server_cpu_ns_per_op=${mcpu[$name]} n=${size[$name]} runs=$(echo ${runs[$name]} | tr ' ' '/')"
    done
    for alg in fixed_window token_bucket; do
      tg=${med[tg.hit.$alg]}
      line="name=ratio keys=$keys c=$c P=$pp alg=$alg tg_hit_over_incr=$(awk -v a="$tg" -v b="${med[incr]}" 'BEGIN {printf "%.2f", a / b}')"
      if [ -n "$sha" ]; then
        ev=${med[evalsha.$alg]}
        x=$(awk -v a="$tg" -v b="$ev" 'BEGIN {printf "%.2f", a / b}')
        met=$(awk -v x="$x" 'BEGIN {print (x >= 2 ? "yes" : "no")}')
        cx=$(awk -v a="${mcpu[evalsha.$alg]}" -v b="${mcpu[tg.hit.$alg]}" 'BEGIN {printf "%.1f", a / b}')
        line="$line tg_hit_over_evalsha=$x target=tg_hit>=2x_evalsha met=$met server_cpu_evalsha_over_tg_hit=$cx"
      else
        line="$line tg_hit_over_evalsha=not_measured"
      fi
      echo "$line"
    done
    unset runs size cpu med mcpu
  done
done
echo "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# honesty checks: no error replies anywhere, every decision counted
tinfo=$(redis-cli -p "$tport" INFO stats | tr -d '\r')
rerr=$(redis-cli -p "$rport" INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p')
terr=$(sed -n 's/^total_error_replies://p' <<<"$tinfo")
allowed=$(sed -n 's/^decisions_allowed://p' <<<"$tinfo")
echo "# checks: tollgate error replies $terr, redis error replies $rerr, tollgate decisions allowed $allowed (>= $((total_tg[x])) measured; probes add more)"
if [ "$terr" != 0 ] || [ "$rerr" != 0 ] || [ "$allowed" -lt "${total_tg[x]}" ]; then
  echo "serve_load: a server answered errors or missed decisions: the figures above are void" >&2
  exit 1
fi
