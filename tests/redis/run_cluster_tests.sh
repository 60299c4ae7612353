#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_cluster_tests.sh TEST_CLUSTER ACCEPTANCE... - what runs on one private
# Redis Cluster (inside tests/redis/with_cluster.sh, which starts it): the
# acceptance suites with TG_TEST_STORE=cluster (test_rules and test_reserve
# find the Cluster by TG_TEST_CLUSTER_PORTS), so every promise they check
# is checked on the Cluster store too, then test_cluster, whose last test
# kills a master. One cluster for all of them: forming one takes seconds.
set -euo pipefail
cluster_test=$1
shift
for t in "$@"; do
  echo "=== $(basename "$t") on the cluster"
  TG_TEST_STORE=cluster "$t"
done
echo "=== $(basename "$cluster_test")"
"$cluster_test"
