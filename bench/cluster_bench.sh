#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cluster_bench.sh [ARG...] - builds cluster_bench (Release) and runs it
# beside a private Redis Cluster of three masters with a replica each
# (tests/redis/with_cluster.sh) and a private single redis-server
# (tests/redis/with_redis.sh), both on loopback ports, both killed at the
# end. Arguments go to the benchmark: --rounds N, --time S, --threads T,
# --quick. Prints the machine (CPUs, model, load average) before and after,
# since the figures depend on what else it was doing. Figures and how to
# read them: BENCHMARKS.md, "Redis Cluster and the non-blocking API".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${1:-}" = --inside ]; then
  shift
  IFS=, read -r -a p <<<"$TG_TEST_CLUSTER_PORTS"
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  echo "redis: $(redis-server --version | cut -d' ' -f3)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$bench" --single "$TG_TEST_REDIS_PORT" \
    --cluster "127.0.0.1:${p[0]},127.0.0.1:${p[1]}" "$@"
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi
build=${TG_BENCH_BUILD:-build/bench-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTG_WERROR=ON \
  -DTG_WITH_REDIS=ON -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target cluster_bench -j2 >/dev/null
export bench=$build/bench/cluster_bench
exec tests/redis/with_cluster.sh tests/redis/with_redis.sh \
  bash "${BASH_SOURCE[0]}" --inside "$@"
