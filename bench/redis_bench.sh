#!/usr/bin/env bash
# redis_bench.sh [ARG...] - builds the Redis benchmark (Release) and runs it
# beside a private redis-server (tests/redis/with_redis.sh starts it on a free
# loopback port and kills it at the end). Arguments go to the benchmark:
# --quick, --reps N, --time S, --filter TEXT. Figures: BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${TG_BENCH_BUILD:-build/bench-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTG_WERROR=ON \
  -DTG_WITH_REDIS=ON -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target tollgate_redis_bench -j"$(nproc)" >/dev/null
exec tests/redis/with_redis.sh "$build/bench/tollgate_redis_bench" "$@"
