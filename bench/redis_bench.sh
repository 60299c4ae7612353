#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# redis_bench.sh [--pin] [ARG...] - builds the Redis benchmark (Release) and
# runs it beside a private redis-server (tests/redis/with_redis.sh starts it
# on a free loopback port and kills it at the end). Other arguments go to the
# benchmark: --quick, --reps N, --time S, --filter TEXT. Figures and how to
# read them: BENCHMARKS.md, "Redis store".
#
# --pin runs the server, the benchmark and redis-benchmark on CPU 0. On a
# virtual machine a loopback round trip between two idle vCPUs mostly
# measures how long the hypervisor takes to wake the other vCPU (tens of us);
# on one CPU it measures the work: client, kernel and server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pin=
if [ "${1:-}" = --pin ]; then
  pin=1
  shift
fi
build=${TG_BENCH_BUILD:-build/bench-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTG_WERROR=ON \
  -DTG_WITH_REDIS=ON -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target tollgate_redis_bench -j"$(nproc)" >/dev/null
bench=$build/bench/tollgate_redis_bench
if [ -n "$pin" ]; then
  # runs inside with_redis.sh, once the server is up: pin it, then ourselves
  exec tests/redis/with_redis.sh bash -c \
    'taskset -pc 0 "$(cat "$TG_TEST_REDIS_PIDFILE")" >/dev/null &&
     exec taskset -c 0 "$0" --pinned "$@"' "$bench" "$@"
fi
exec tests/redis/with_redis.sh "$bench" "$@"
