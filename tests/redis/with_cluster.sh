#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# with_cluster.sh [--module PATH] CMD [ARG...] - runs CMD beside a private
# Redis Cluster of three masters, each with one replica (six redis-server
# processes); with --module, every node has loaded the Redis module at PATH
# (tollgate.so), so the Redis store's calls go through it instead of the
# script.
#
# The nodes listen on 127.0.0.1 at six consecutive free ports below the
# ephemeral range (their cluster bus on port + 10000, below it too), keep everything in one temporary directory, persist
# nothing, and are all killed (the directory removed) by an EXIT trap however
# CMD ends. The cluster is made by `redis-cli --cluster create`, and CMD
# starts only once every node reports cluster_state:ok and knows all six.
# cluster-node-timeout is 2000 ms: a killed master is failed over in a few
# seconds, yet a loaded machine does not make healthy nodes look dead. CMD
# finds the cluster through the environment:
#   TG_TEST_CLUSTER_PORTS  the six ports, comma-separated (masters first, as
#                          created; a failover may swap roles)
#   TG_TEST_CLUSTER_DIR    the directory: node-PORT.conf starts node PORT
#                          again (`redis-server DIR/node-PORT.conf`),
#                          node-PORT.pid holds its pid
#   TG_TEST_REDIS_MODULE   the module's path when it is loaded, else empty
# Nothing here depends on a server left running, or leaves one behind.
set -euo pipefail

module=
if [ "${1:-}" = --module ]; then
  module=${2:?--module needs the path of tollgate.so}
  shift 2
  [ -f "$module" ] || { echo "with_cluster.sh: no module at $module" >&2; exit 1; }
  module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module") # the server chdirs
fi
if [ $# -eq 0 ]; then
  echo "usage: with_cluster.sh [--module PATH] CMD [ARG...]" >&2
  exit 2
fi
for tool in redis-server redis-cli; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "with_cluster.sh: $tool not found (Debian: apt-get install redis-server)" >&2
    exit 1
  fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/tg-cluster.XXXXXX")
ports=()
kill_nodes() {
  local f pid
  for f in "$dir"/node-*.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill -CONT "$pid" 2>/dev/null || true # a test may have stopped it
    kill -9 "$pid" 2>/dev/null || true
  done
}
cleanup() {
  kill_nodes
  rm -rf "$dir"
}
trap cleanup EXIT

# node_conf PORT: the configuration of one node.
node_conf() {
  local port=$1
  cat >"$dir/node-$port.conf" <<CONF
bind 127.0.0.1
port $port
dir $dir
daemonize yes
pidfile $dir/node-$port.pid
logfile $dir/node-$port.log
cluster-enabled yes
cluster-config-file $dir/nodes-$port.conf
cluster-node-timeout 2000
cluster-require-full-coverage no
repl-diskless-sync-delay 0
save ""
appendonly no
CONF
  [ -z "$module" ] || printf "loadmodule %s\nenable-module-command local\n" "$module" >>"$dir/node-$port.conf"
}

ping_ok() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }

# Ports below the kernel's ephemeral range, bus ports (port + 10000)
# included: a bus port in that range is often taken by some connection's
# local port (TIME_WAIT after a benchmark), and the node then aborts.
eph=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
span=$((eph - 10006 - 20000))
[ "$span" -gt 100 ] || span=35000 # an odd range: take our chances
started=
for _ in $(seq 1 20); do
  base=$((20000 + RANDOM % span))
  ports=()
  ok=1
  for i in 0 1 2 3 4 5; do
    port=$((base + i))
    ports+=("$port")
    node_conf "$port"
    rm -f "$dir/node-$port.pid" "$dir/nodes-$port.conf"
    redis-server "$dir/node-$port.conf" >/dev/null || { ok=; break; }
  done
  if [ -n "$ok" ]; then
    for port in "${ports[@]}"; do
      up=
      for _ in $(seq 1 100); do
        if ping_ok "$port"; then up=1; break; fi
        # a node that could not bind its port (or bus port) has given up
        grep -q "aborting" "$dir/node-$port.log" 2>/dev/null && break
        sleep 0.05
      done
      [ -n "$up" ] || { ok=; break; }
    done
  fi
  [ -n "$ok" ] && { started=1; break; }
  # a module that does not load will not load on other ports either
  grep -q "Can't load module" "$dir"/node-*.log 2>/dev/null && break
  # a port (or its bus port) was taken: stop what started, try elsewhere
  kill_nodes
  sleep 0.2
done
if [ -z "$started" ]; then
  echo "with_cluster.sh: could not start six redis-server nodes; logs:" >&2
  tail -n 20 "$dir"/node-*.log >&2 || true
  exit 1
fi

hosts=()
for port in "${ports[@]}"; do hosts+=("127.0.0.1:$port"); done
if ! redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 \
  --cluster-yes >"$dir/create.log" 2>&1; then
  echo "with_cluster.sh: redis-cli --cluster create failed:" >&2
  cat "$dir/create.log" >&2
  exit 1
fi

# Every node must say the cluster is ok and know all six nodes (the gossip
# that spreads them takes a moment, longer on a loaded machine), and every
# replica must have synchronised with its master: one that never has is not
# promoted when its master dies.
ready=
for _ in $(seq 1 600); do
  ready=1
  for port in "${ports[@]}"; do
    info=$(redis-cli -p "$port" cluster info 2>/dev/null || true)
    case $info in
    *cluster_state:ok*cluster_known_nodes:6*) ;;
    *) ready= ;;
    esac
    repl=$(redis-cli -p "$port" info replication 2>/dev/null || true)
    case $repl in
    *role:slave*master_link_status:up*) ;;
    *role:slave*) ready= ;;
    esac
    [ -n "$ready" ] || break
  done
  [ -n "$ready" ] && break
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "with_cluster.sh: the cluster did not become ready in 60 s" >&2
  for port in "${ports[@]}"; do redis-cli -p "$port" cluster info >&2 || true; done
  exit 1
fi

export TG_TEST_CLUSTER_PORTS=$(IFS=,; echo "${ports[*]}")
export TG_TEST_CLUSTER_DIR=$dir
export TG_TEST_REDIS_MODULE=$module
"$@"
