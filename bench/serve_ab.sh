#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# serve_ab.sh - did a change make `tollgate serve`'s request path slower? Two
# builds of the program side by side in one session: three servers up at
# once (OLD; NEW with its defaults; NEW with the per-client limits and a
# password, to show what they cost), and redis-benchmark sending TG.HIT to
# each in turn, round after round, so that whatever else the machine does
# falls on all three alike.
#
#   bench/serve_ab.sh OLD_TOLLGATE NEW_TOLLGATE [ROUNDS]
#
# Workloads: one hot key and 100,000 random keys, -c 50 at -P 1 and -P 16;
# every decision admits (a billion per second), so every request writes.
# Per run it prints ops/s and the server's CPU time per request (user +
# system from /proc, in clock ticks: about 1 % of a run), then, per
# workload, the median over rounds of NEW / OLD and LIMITS / OLD measured in
# the same round, with the interquartile range. CPU per request is the
# figure to read: ops/s also moves with the benchmark client and the rest of
# the machine. It checks that no server answered an error.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_TOLLGATE NEW_TOLLGATE [ROUNDS]" >&2
  exit 2
fi
OLD=$1 NEW=$2 ROUNDS=${3:-12}
N1=60000    # requests per run at -P 1
N16=600000  # requests per run at -P 16
command -v redis-benchmark >/dev/null ||
  { echo "redis-benchmark missing (Debian: apt-get install redis-tools)" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-serve-ab.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

declare -A port pid
start() { # NAME PROGRAM OPTIONS...
  local name=$1 bin=$2
  shift 2
  "$bin" serve --port 0 --capacity 262144 "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  pid[$name]=$!
  for _ in $(seq 100); do
    grep -q '^tollgate serve: ready$' "$tmp/$name.log" && break
    sleep 0.1
  done
  port[$name]=$(sed -n 's/^tollgate serve: listening on .* port \([0-9]*\)$/\1/p' "$tmp/$name.log" | head -1)
  [ -n "${port[$name]}" ] || { echo "$name did not start:" >&2; cat "$tmp/$name.log" >&2; exit 1; }
}
start old "$OLD"
start new "$NEW"
start limits "$NEW" --requirepass pw --max-period-ms 86400000 \
  --max-new-keys-per-client 1000000000/1000

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
echo "# serve_ab: $(date -u +%FT%TZ), $ROUNDS rounds, loadavg $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
for round in $(seq "$ROUNDS"); do
  for keys in hot 100000; do
    if [ $keys = hot ]; then key=key r=(); else key='key:__rand_int__' r=(-r 100000); fi
    for pp in 1 16; do
      n=$N1
      [ $pp = 16 ] && n=$N16
      for which in old new limits; do
        auth=()
        [ $which = limits ] && auth=(-a pw)
        t0=$(ticks "${pid[$which]}")
        ops=$(redis-benchmark -p "${port[$which]}" "${auth[@]}" -n $n -c 50 -P $pp "${r[@]}" -q \
          TG.HIT "$key" fixed_window 1000000000 1000 2>/dev/null | tr '\r' '\n' |
          sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
        t1=$(ticks "${pid[$which]}")
        echo "round=$round keys=$keys P=$pp build=$which ops_per_s=$ops cpu_ns_per_op=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v n=$n 'BEGIN {printf "%.0f", t * 1e9 / hz / n}')"
      done
    done
  done
done | tee "$tmp/runs"

for which in old new limits; do
  auth=()
  [ $which = limits ] && auth=(-a pw --no-auth-warning)
  errors=$(redis-cli -p "${port[$which]}" "${auth[@]}" INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p')
  [ "$errors" = 0 ] || { echo "$which answered $errors errors: the figures are void" >&2; exit 1; }
done

# per workload: the median (and quartiles) over rounds of each build's
# figure divided by OLD's in the same round
awk '
  { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    k = f["keys"] " " f["P"] " " f["round"]
    cpu[k, f["build"]] = f["cpu_ns_per_op"]; ops[k, f["build"]] = f["ops_per_s"]
    seen[k] = 1 }
  END {
    for (k in seen) {
      split(k, p, " "); w = "keys=" p[1] " P=" p[2]
      for (b = 1; b <= 2; b++) {
        name = b == 1 ? "new" : "limits"
        print w, name, "cpu", cpu[k, name] / cpu[k, "old"]
        print w, name, "ops", ops[k, name] / ops[k, "old"]
      }
    }
  }' "$tmp/runs" | sort -k1,4 -k5,5g |
  awk '
    { g = $1 " " $2 " " $3 " " $4; v[g, ++n[g]] = $5; order[g] = 1 }
    END {
      for (g in order) {
        m = n[g]
        split(g, p, " ")
        printf "name=ratio %s %s %s_over_old figure=%s median=%.3f q1=%.3f q3=%.3f rounds=%d\n", \
          p[1], p[2], p[3], p[4] == "cpu" ? "cpu_ns_per_op" : "ops_per_s", \
          v[g, int((m + 1) / 2)], v[g, int(m / 4) + 1], v[g, int(3 * m / 4) + 1], m
      }
    }' | sort
