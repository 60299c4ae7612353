#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_shm_tmpfs.sh SHM_TMPFS - runs each scenario of the shm_tmpfs helper
# (tests/shm_tmpfs.c) where /dev/shm is a small tmpfs of its own: a private
# mount namespace (unshare -m) with a fresh tmpfs mounted over /dev/shm, so
# the host's /dev/shm is never touched and nothing outlives the scenario.
# Needs root (CI runs as root); without permission to unshare it says so
# and exits 77, which CTest reports as skipped.
set -uo pipefail

helper=$1

if ! unshare -m --propagation private true 2>/dev/null; then
  echo "test_shm_tmpfs: SKIPPED: cannot create a mount namespace here" \
    "(unshare -m needs root or CAP_SYS_ADMIN)"
  exit 77
fi

status=0
# run SIZE SCENARIO: the helper in a private namespace on a SIZE tmpfs
run() {
  local size=$1 scenario=$2
  unshare -m --propagation private sh -c \
    'mount -t tmpfs -o "size=$1" tmpfs /dev/shm && exec "$2" "$3"' \
    sh "$size" "$helper" "$scenario"
  local rc=$?
  if [ $rc -eq 0 ]; then
    echo "test_shm_tmpfs: $scenario on a $size tmpfs: ok"
  elif [ $rc -gt 128 ]; then
    echo "test_shm_tmpfs: $scenario on a $size tmpfs: killed by signal" \
      "$((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))" >&2
    status=1
  else
    echo "test_shm_tmpfs: $scenario on a $size tmpfs: failed ($rc)" >&2
    status=1
  fi
}

run 1m create
run 64m sliding
run 2m long
run 16m nearly-full
run 16m hostile-log
run 16m steady
exit $status
