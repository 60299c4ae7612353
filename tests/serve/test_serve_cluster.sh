#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_serve_cluster.sh - `tollgate serve --redis-cluster`: two servers over
# one private Redis Cluster (tests/redis/with_cluster.sh started it: three
# masters, three replicas on loopback ports) share one limit per key,
# whichever node holds it; each key lives on the master of its hash slot;
# requests a client pipelines go to the nodes as pipelines and come back in
# order, each counted exactly; a bad seed list stops the server at start.
#
# usage: with_cluster.sh test_serve_cluster.sh PATH/TO/tollgate
TOLLGATE=${1:?usage: $0 PATH/TO/tollgate}
. "$(dirname "$0")/lib.sh"
need redis-cli redis-tools
: "${TG_TEST_CLUSTER_PORTS:?run through tests/redis/with_cluster.sh}"

IFS=, read -r -a P <<<"$TG_TEST_CLUSTER_PORTS"
rc() { redis-cli -p "$1" "${@:2}"; }
line() { rc "$@" | tr '\n' ' ' | sed 's/ $//'; }
eq() { [ "$1" = "$2" ] || { echo "  got '$1', want '$2'" >&2; return 1; }; }
has() { grep -q -- "$2" <<<"$1" || { echo "  '$2' not in: $1" >&2; return 1; }; }
H=3600000
SEEDS=127.0.0.1:${P[0]},127.0.0.1:${P[3]}

start_server --redis-cluster "$SEEDS" --redis-prefix srvc
A=$PORT
A_PID=$SERVER_PID
A_LOG=$SERVER_LOG
start_server --redis-cluster "127.0.0.1:${P[1]}" --redis-prefix srvc
B=$PORT

check "INFO names the store" has "$(rc $A INFO)" "store:redis-cluster:$SEEDS prefix srvc"

# 30 keys over the three masters, hit from both servers in turn: 3 each
bad=0
for ((k = 0; k < 30; k++)); do
  got=
  for ((i = 0; i < 5; i++)); do
    s=$A
    ((i % 2)) && s=$B
    got+="$(rc $s TG.HIT "u:$k" sliding_window 3 $H | head -1)"
  done
  [ "$got" = 11100 ] || { echo "  key u:$k: $got" >&2; bad=$((bad + 1)); }
done
check "30 keys hit 5 times from two servers: 3 allowed each, one limit" eq "$bad" 0

# each key is on exactly one node, the master of its slot: the others
# answer MOVED (or 0, a replica's view), and they spread over the masters
misplaced=0
masters=
for ((k = 0; k < 30; k++)); do
  name="srvc:{u:$k}:sw"
  here=
  for port in "${P[@]}"; do
    [ "$(rc "$port" EXISTS "$name")" = 1 ] &&
      [ "$(rc "$port" ROLE | head -1)" = master ] && here+="$port "
  done
  [ "$(wc -w <<<"$here")" = 1 ] || misplaced=$((misplaced + 1))
  masters+="$here"
done
check "every key on one master, the one of its slot" eq "$misplaced" 0
check "spread over the three masters" \
  eq "$(tr ' ' '\n' <<<"$masters" | sort -u | grep -c .)" 3

# 300 pipelined hits over 10 keys: answered in order, each key exact
burst=
for ((i = 0; i < 300; i++)); do
  burst+="TG.HIT p:$((i % 10)) fixed_window_per_key 1000 $H"$'\r\n'
done
replies=$(exec 3<>/dev/tcp/127.0.0.1/$A && printf '%s' "$burst" >&3 &&
  timeout 30 head -n 2100 <&3 | tr -d '\r')
check "300 pipelined hits: all answered" eq "$(grep -c '^\*6$' <<<"$replies")" 300
check "in order, each key counted exactly" eq "$(awk '
  /^\*6$/ { n++; line = 0; next }
  { line++ }
  line == 2 { k = (n - 1) % 10; want = ++seen[k]; if ($0 != ":" want) bad++ }
  END { print bad + 0 }' <<<"$replies")" 0

# a seed list that is not one: the server says so and does not start
out=$("$TOLLGATE" serve --port 0 --redis-cluster "127.0.0.1:${P[0]},nonsense" 2>&1)
status=$?
check "a bad seed list: no start" test "$status" -ne 0
check "and the reason" has "$out" "invalid argument"
out=$("$TOLLGATE" serve --port 0 --redis-cluster "127.0.0.1:${P[0]}" \
  --redis 127.0.0.1:6379 2>&1)
check "--redis-cluster and --redis together: refused" has "$out" "excludes"

stop_server
SERVER_PID=$A_PID
SERVER_LOG=$A_LOG
stop_server
finish
