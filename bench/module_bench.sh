#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# module_bench.sh [--rounds N] [--requests-percent P] - the Redis module (tollgate.so) beside plain
# INCR and the Redis store's Lua script, on one private redis-server that has
# loaded the module (tests/redis/with_redis.sh --module: free loopback port,
# temporary directory, killed at the end). Figures and how to read them:
# BENCHMARKS.md, "Redis module".
#
# Each round measures, in turn, with redis-benchmark -P 16 -c 50 over 100,000
# keys (-r): INCR, TG.HIT token_bucket, TG.HIT fixed_window, EVALSHA of
# the store's script with the arguments the library sends for a token-bucket
# hit, and the floor module's FLOOR.HIT and FLOOR.NOOP (bench/module_floor.c:
# what the module API alone costs a command that does what TG.HIT must do,
# and a module command's dispatch); before each, CONFIG RESETSTAT, after it, INFO commandstats, whose
# usec_per_call is the server's CPU per command. Every quota admits every
# call, so every call writes, and keeps its keys alive for the whole run, as
# INCR's are: the fixed window 1e9 per hour, the token bucket 1000 per hour
# with a burst of 1e6 (each hit keeps the key 3.6 s longer; the script's
# arithmetic stays on its fast path in doubles, below 2^52). A bucket of 1e9
# per second would be full again a few ns after each hit: its key would
# expire at once, and the figure would measure Redis creating and expiring
# keys. Then tollgate_redis_bench's
# batch16 lines: tg_hit_batch of 16 through the library (which finds the
# module and sends TG.STEP) beside redis-benchmark INCR -c 1 -P 16, rounds
# interleaved inside the program; and its policy2 line: a two-rule policy
# (one TG.STEPS) beside one tg_hit. Medians of the rounds are printed, one
# line per result, with the ratio to the baseline (the median of the
# rounds' own ratios, and their range) and whether the target (issue 15) is
# met.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=5
if [ "${1:-}" = --rounds ]; then
  rounds=${2:?}
  shift 2
fi
# --requests-percent P: each case's request count scaled to P % (the
# defaults take about a minute a round on a quiet machine)
n_scale=100
if [ "${1:-}" = --requests-percent ]; then
  n_scale=${2:?}
  shift 2
fi
if [ "${1:-}" = --inside ]; then
  # ---- runs inside with_redis.sh: TG_TEST_REDIS_PORT is the server ----
  port=$TG_TEST_REDIS_PORT
  cli() { redis-cli -p "$port" "$@"; }
  sha=$(cli SCRIPT LOAD "$(cat src/store/redis.lua)")
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  # name | redis-benchmark command | commandstats name | requests (each
  # case its own keys: a TG.HIT on an INCR counter is TG_ECORRUPT, which
  # stops redis-benchmark)
  cases=(
    "incr|INCR i:__rand_int__|incr|3000000"
    "module_tg_hit_token_bucket|TG.HIT t:__rand_int__ token_bucket 1000 3600000 BURST 1000000|tg.hit|3000000"
    "module_tg_hit_fixed_window|TG.HIT f:__rand_int__ fixed_window 1000000000 3600000|tg.hit|3000000"
    "script_evalsha_token_bucket|EVALSHA $sha 1 tg:{e:__rand_int__}:tb h 3 '' 3600000000 3600000000000000|evalsha|400000"
    "floor_module_hit|FLOOR.HIT l:__rand_int__|floor.hit|3000000"
    "floor_module_noop|FLOOR.NOOP n:__rand_int__|floor.noop|3000000"
  )
  # Each round starts one case later (rotation): on a shared machine the
  # load moves within a round, and a fixed order would give one case the
  # same slot every round. ${n_scale} scales the requests (--quick runs).
  nc=${#cases[@]}
  for r in $(seq 1 "$rounds"); do
    for j in $(seq 0 $((nc - 1))); do
      c=${cases[$(((j + r) % nc))]}
      IFS='|' read -r name cmd stat n <<<"$c"
      n=$((n * n_scale / 100))
      cli CONFIG RESETSTAT >/dev/null
      # eval: the empty argument '' must reach redis-benchmark as one argv
      rps=$(eval "redis-benchmark -p $port -P 16 -c 50 -r 100000 -n $n -q $cmd" \
        2>/dev/null | tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
      usec=$(cli INFO commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$stat:.*usec_per_call=\([0-9.]*\),.*failed_calls=\([0-9]*\).*/\1 \2/p")
      echo "$name $r ${rps:-0} ${usec:-0 0} $(cut -d' ' -f1 /proc/loadavg)" >>"$out"
    done
  done
  /usr/bin/python3 - "$out" "$rounds" <<'PY'
import statistics, sys
# Ratios are the median over rounds of each round's own ratio (the cases of
# a round ran within seconds of each other), not a ratio of medians: on a
# shared machine the load moves between rounds.
rows, by_round, loads = {}, {}, []
for line in open(sys.argv[1]):
    name, r, rps, usec, failed, load = line.split()
    rows.setdefault(name, []).append((float(rps), float(usec), int(failed)))
    by_round.setdefault(r, {})[name] = (float(rps), float(usec))
    loads.append(float(load))
med = {n: (statistics.median(r for r, _, _ in v),
           statistics.median(u for _, u, _ in v),
           sum(f for _, _, f in v)) for n, v in rows.items()}
def ratio(a, b, i=0, inv=False):
    x = [(v[b][i] / v[a][i]) if inv else (v[a][i] / v[b][i])
         for v in by_round.values()]
    return statistics.median(x), min(x), max(x)
print("# load average (1 min) during the cases: min %.2f median %.2f max %.2f"
      % (min(loads), statistics.median(loads), max(loads)))
incr = med["incr"]
print("name=incr requests_per_s=%.0f server_usec_per_call=%.3f failed=%d "
      "rounds=%s stat=median" % (incr[0], incr[1], incr[2], sys.argv[2]))
for n in ("module_tg_hit_token_bucket", "module_tg_hit_fixed_window",
          "floor_module_hit", "floor_module_noop"):
    m = med[n]
    rr, lo, hi = ratio(n, "incr")
    cr = ratio(n, "incr", 1)[0]
    target = (" target=ratio>=0.8 met=%s" % ("yes" if rr >= 0.8 else "no")
              if n.startswith("module") else "")
    print("name=%s requests_per_s=%.0f server_usec_per_call=%.3f failed=%d "
          "baseline=incr ratio=%.2f ratio_min=%.2f ratio_max=%.2f%s "
          "cpu_ratio_vs_incr=%.2f rounds=%s stat=median_of_round_ratios"
          % (n, m[0], m[1], m[2], rr, lo, hi, target, cr, sys.argv[2]))
s = med["script_evalsha_token_bucket"]
print("name=script_evalsha_token_bucket requests_per_s=%.0f "
      "server_usec_per_call=%.3f failed=%d rounds=%s stat=median"
      % (s[0], s[1], s[2], sys.argv[2]))
rr, lo, hi = ratio("module_tg_hit_token_bucket", "script_evalsha_token_bucket")
cr = ratio("module_tg_hit_token_bucket", "script_evalsha_token_bucket", 1,
           inv=True)[0]
print("name=module_vs_script alg=token_bucket ratio=%.2f ratio_min=%.2f "
      "ratio_max=%.2f target=ratio>=5 met=%s cpu_ratio=%.2f "
      "stat=median_of_round_ratios"
      % (rr, lo, hi, "yes" if rr >= 5 else "no", cr))
PY
  "$TG_BENCH_BIN" --reps "$rounds" --filter batch16
  exec "$TG_BENCH_BIN" --reps "$rounds" --filter policy2
fi

build=${TG_BENCH_BUILD:-build/bench-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTG_WERROR=ON \
  -DTG_WITH_REDIS=ON -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target tollgate_redis_bench tollgate_module \
  tollgate_module_floor -j"$(nproc)" >/dev/null
echo "# tollgate module bench: $(git rev-parse --short HEAD 2>/dev/null || echo ?)," \
  "$(date -u '+%Y-%m-%d %H:%M UTC'), $(redis-server --version | cut -d' ' -f3)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
export TG_BENCH_BIN=$build/bench/tollgate_redis_bench
exec tests/redis/with_redis.sh --module "$build/redis-module/tollgate.so" \
  --also-load "$build/redis-module/tollgate_floor.so" \
  bash "$0" --rounds "$rounds" --requests-percent "$n_scale" --inside
