#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# insn_ab.sh - instructions per hot-key decision of two commits, by
# callgrind: did a change make the decision path longer? Counts do not move
# with the machine's load, so two runs give the same figures; they are not
# times (a cache miss costs one instruction here and a hundred cycles
# there), so read them beside tollgate_bench's same-run ratios.
#
#   bench/insn_ab.sh OLD_COMMIT NEW_COMMIT
#
# Each commit is cloned from this repository into a temporary directory
# and built with the release preset; bench/insn_decision.c (from this
# checkout) is linked with each static library. Per algorithm and store
# (memory, shm) it prints the instructions of one decision, OLD and NEW:
# (Ir(120,000 calls) - Ir(20,000 calls)) / 100,000, so set-up and exit
# cancel out. Needs valgrind.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OLD_COMMIT NEW_COMMIT" >&2; exit 2; }
command -v valgrind >/dev/null ||
  { echo "valgrind missing (Debian: apt-get install valgrind)" >&2; exit 1; }
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-insn.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
libs=$(pkg-config --exists hiredis 2>/dev/null && echo -lhiredis || true)
for side in old new; do
  rev=$1; [ $side = new ] && rev=$2
  git clone -q "$src" "$tmp/$side"
  git -C "$tmp/$side" checkout -q "$rev"
  (cd "$tmp/$side" && cmake --preset release >/dev/null &&
    cmake --build build/release --target tollgate_static >/dev/null)
  cc -O2 -DTG_STATIC -I"$tmp/$side/include" "$src/bench/insn_decision.c" \
    "$tmp/$side/build/release/libtollgate.a" $libs -lpthread -o "$tmp/drv-$side"
done
ir() { # PROGRAM ALGORITHM N SHM -> instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
echo "# insn_ab.sh: $(git -C "$tmp/old" rev-parse --short HEAD) -> $(git -C "$tmp/new" rev-parse --short HEAD), instructions per hot-key tg_hit_at (callgrind)"
names=(fixed_window fixed_window_per_key sliding_window token_bucket leaky_bucket)
for shm in 0 1; do
  for alg in 0 1 2 3 4; do
    line="store=$([ $shm = 1 ] && echo shm || echo memory) alg=${names[$alg]}"
    for side in old new; do
      a=$(ir "$tmp/drv-$side" $alg 20000 $shm)
      b=$(ir "$tmp/drv-$side" $alg 120000 $shm)
      eval "v_$side=$(( (b - a) / 100000 ))"
    done
    echo "$line old=$v_old new=$v_new ratio=$(awk -v o="$v_old" -v n="$v_new" 'BEGIN{printf "%.3f", n/o}')"
  done
done
