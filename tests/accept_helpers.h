/* SPDX-License-Identifier: MIT */
/*
 * accept_helpers.h - shared helpers for the acceptance tests
 * (test_fixed_window, test_per_key_window, test_sliding_window, test_buckets,
 * test_contract, test_api).
 *
 * The acceptance tests are written from the contract (docs/DESIGN.md section 3
 * and include/tollgate.h), never from the implementation. Time is always driven
 * by hand: through the "_at" variants or through an injected clock. These
 * helpers keep each test a list of "at time t, call X, expect Y" lines; every
 * check reports the caller's file and line and names the field that differs.
 */
#ifndef ACCEPT_HELPERS_H
#define ACCEPT_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tollgate.h"

/* Time in microseconds (what tollgate calls "now") from milliseconds. */
#define MS(x) ((uint64_t)(x)*UINT64_C(1000))
/* An expectation that skips the field it stands for. */
#define ANY (UINT64_MAX - 1)

/* A hand-driven clock for tg_config.clock: returns now_us and counts reads. */
typedef struct manual_clock {
  uint64_t now_us;
  unsigned reads;
} manual_clock;

static inline uint64_t manual_clock_read(void *ctx) {
  manual_clock *c = ctx;
  c->reads++;
  return c->now_us;
}

/* The acceptance tests run on the memory store, and again on the Redis store
 * when TG_TEST_STORE=redis (CTest's *_redis entries run them that way through
 * tests/redis/with_redis.sh, which sets TG_TEST_REDIS_PORT), or on a Redis
 * Cluster when TG_TEST_STORE=cluster (tests/redis/with_cluster.sh sets
 * TG_TEST_CLUSTER_PORTS). Every promise they check holds on all; the few
 * checks of tg_key_count, which Redis cannot answer, are memory-only. */
static inline bool on_cluster(void) {
  const char *s = getenv("TG_TEST_STORE");
  return s && strcmp(s, "cluster") == 0;
}

static inline bool on_redis(void) {
  const char *s = getenv("TG_TEST_STORE");
  return s && (strcmp(s, "redis") == 0 || on_cluster());
}

/* On the Redis store: points cfg at the test server, under a key prefix no
 * other limiter of the run uses (so tests never see each other's keys). *rc
 * must outlive tg_limiter_new only. */
static inline void config_store(tg_config *cfg, tg_redis_config *rc) {
  static unsigned n;
  static char prefix[64];
  static char seeds[64];
  if (!on_redis())
    return;
  if (on_cluster()) {
    /* two of the nodes as seeds; the client finds the rest */
    const char *ports = getenv("TG_TEST_CLUSTER_PORTS");
    const char *second = ports ? strchr(ports, ',') : NULL;
    if (!second) {
      fprintf(stderr, "TG_TEST_STORE=cluster needs TG_TEST_CLUSTER_PORTS: "
                      "run through tests/redis/with_cluster.sh\n");
      exit(1);
    }
    snprintf(seeds, sizeof seeds, "127.0.0.1:%d,127.0.0.1:%d", atoi(ports),
             atoi(second + 1));
    tg_redis_config_init(rc);
    rc->cluster_nodes = seeds;
    snprintf(prefix, sizeof prefix, "acc%ld.%u", (long)getpid(), n++);
    rc->key_prefix = prefix;
    cfg->redis = rc;
    return;
  }
  const char *port = getenv("TG_TEST_REDIS_PORT");
  if (!port) {
    fprintf(stderr, "TG_TEST_STORE=redis needs TG_TEST_REDIS_PORT: run "
                    "through tests/redis/with_redis.sh\n");
    exit(1);
  }
  tg_redis_config_init(rc);
  rc->port = atoi(port);
  snprintf(prefix, sizeof prefix, "acc%ld.%u", (long)getpid(), n++);
  rc->key_prefix = prefix;
  cfg->redis = rc;
}

/* tg_key_count == n, where the store can tell. */
#define ASSERT_KEYS(lim, n)                                                    \
  do {                                                                         \
    if (!on_redis())                                                           \
      assert_int_equal(tg_key_count(lim), (n));                                \
  } while (0)

/* cmocka's setup/teardown pairs: *state becomes a limiter of one algorithm. */
static inline int new_limiter_(void **state, tg_algorithm alg) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  tg_redis_config rc;
  config_store(&cfg, &rc);
  tg_limiter *lim = NULL;
  if (tg_limiter_new(&lim, &cfg) != 0)
    return -1;
  *state = lim;
  return 0;
}

static inline int destroy_limiter(void **state) {
  tg_limiter_destroy(*state);
  *state = NULL;
  return 0;
}

/* Fails the test at file:line with both values when actual != expected
 * (expected ANY matches everything). */
static inline void eq_(uint64_t actual, uint64_t expected, const char *what,
                       const char *file, int line) {
  if (expected == ANY || actual == expected)
    return;
  print_error("%s: expected %" PRIu64 ", actual %" PRIu64 "\n", what, expected,
              actual);
  _fail(file, line);
}

/* Asserts an int status code. */
static inline void rc_(int actual, int expected, const char *what,
                       const char *file, int line) {
  if (actual == expected)
    return;
  print_error("%s: expected %s (%d), actual %s (%d)\n", what,
              tg_err_name(expected), expected, tg_err_name(actual), actual);
  _fail(file, line);
}
#define ASSERT_RC(call, expected)                                              \
  rc_((call), (expected), #call, __FILE__, __LINE__)

/* Checks every field of a result (ANY skips one). */
static inline void check_result_(const tg_result *r, int allowed,
                                 uint64_t count, uint64_t remaining,
                                 uint64_t retry, uint64_t reset,
                                 const char *file, int line) {
  eq_(r->allowed ? 1u : 0u, allowed ? 1u : 0u, "allowed", file, line);
  eq_(r->count, count, "count", file, line);
  eq_(r->remaining, remaining, "remaining", file, line);
  eq_(r->retry_after_ms, retry, "retry_after_ms", file, line);
  eq_(r->reset_after_ms, reset, "reset_after_ms", file, line);
  eq_(r->degraded ? 1u : 0u, 0, "degraded", file, line);
}
#define CHECK_RESULT(r, allowed, count, remaining, retry, reset)               \
  check_result_(&(r), (allowed), (count), (remaining), (retry), (reset),       \
                __FILE__, __LINE__)

/* tg_hit_at on a NUL-terminated key, asserting it returns 0. */
static inline tg_result hit_(tg_limiter *lim, uint64_t now_us, const char *key,
                             const tg_quota *q, uint64_t cost, const char *file,
                             int line) {
  tg_result r;
  memset(&r, 0x5a, sizeof r);
  rc_(tg_hit_at(lim, now_us, key, strlen(key), q, cost, &r), 0, "tg_hit_at",
      file, line);
  return r;
}
#define HIT(lim, now_us, key, q, cost)                                         \
  hit_((lim), (now_us), (key), (q), (cost), __FILE__, __LINE__)

/* One hit with every field of its result checked. */
static inline void expect_hit_(tg_limiter *lim, uint64_t now_us,
                               const char *key, const tg_quota *q,
                               uint64_t cost, int allowed, uint64_t count,
                               uint64_t remaining, uint64_t retry,
                               uint64_t reset, const char *file, int line) {
  tg_result r = hit_(lim, now_us, key, q, cost, file, line);
  check_result_(&r, allowed, count, remaining, retry, reset, file, line);
}
#define EXPECT_HIT(lim, now_us, key, q, cost, allowed, count, remaining,       \
                   retry, reset)                                               \
  expect_hit_((lim), (now_us), (key), (q), (cost), (allowed), (count),         \
              (remaining), (retry), (reset), __FILE__, __LINE__)
/* Only the decision (and, for ALLOW, retry 0; for DENY, retry > 0). */
#define ALLOW(lim, now_us, key, q, cost)                                       \
  expect_hit_((lim), (now_us), (key), (q), (cost), 1, ANY, ANY, 0, ANY,        \
              __FILE__, __LINE__)
#define DENY(lim, now_us, key, q, cost)                                        \
  deny_((lim), (now_us), (key), (q), (cost), __FILE__, __LINE__)
static inline tg_result deny_(tg_limiter *lim, uint64_t now_us, const char *key,
                              const tg_quota *q, uint64_t cost,
                              const char *file, int line) {
  tg_result r = hit_(lim, now_us, key, q, cost, file, line);
  eq_(r.allowed ? 1u : 0u, 0, "allowed", file, line);
  if (r.retry_after_ms == 0) {
    print_error("denied with retry_after_ms 0\n");
    _fail(file, line);
  }
  return r;
}

/* tg_get_at / tg_expires_at_at / tg_set_at / tg_inc_at asserting success. */
static inline uint64_t get_(tg_limiter *lim, uint64_t now_us, const char *key,
                            const tg_quota *q, const char *file, int line) {
  uint64_t v = 0x5a5a5a5a;
  rc_(tg_get_at(lim, now_us, key, strlen(key), q, &v), 0, "tg_get_at", file,
      line);
  return v;
}
#define GET(lim, now_us, key, q)                                               \
  get_((lim), (now_us), (key), (q), __FILE__, __LINE__)
#define EXPECT_GET(lim, now_us, key, q, v)                                     \
  eq_(GET(lim, now_us, key, q), (v), "tg_get_at", __FILE__, __LINE__)

static inline uint64_t expires_(tg_limiter *lim, uint64_t now_us,
                                const char *key, const tg_quota *q,
                                const char *file, int line) {
  uint64_t v = 0x5a5a5a5a;
  rc_(tg_expires_at_at(lim, now_us, key, strlen(key), q, &v), 0,
      "tg_expires_at_at", file, line);
  return v;
}
#define EXPECT_EXPIRES(lim, now_us, key, q, at_ms)                             \
  eq_(expires_((lim), (now_us), (key), (q), __FILE__, __LINE__), (at_ms),      \
      "tg_expires_at_at", __FILE__, __LINE__)

#define SET(lim, now_us, key, q, v)                                            \
  rc_(tg_set_at((lim), (now_us), (key), strlen(key), (q), (v)), 0,             \
      "tg_set_at", __FILE__, __LINE__)

static inline uint64_t inc_(tg_limiter *lim, uint64_t now_us, const char *key,
                            const tg_quota *q, uint64_t cost, const char *file,
                            int line) {
  uint64_t v = 0x5a5a5a5a;
  rc_(tg_inc_at(lim, now_us, key, strlen(key), q, cost, &v), 0, "tg_inc_at",
      file, line);
  return v;
}
#define EXPECT_INC(lim, now_us, key, q, cost, v)                               \
  eq_(inc_((lim), (now_us), (key), (q), (cost), __FILE__, __LINE__), (v),      \
      "tg_inc_at count", __FILE__, __LINE__)

#define RESET(lim, key)                                                        \
  rc_(tg_reset((lim), (key), strlen(key)), 0, "tg_reset", __FILE__, __LINE__)

/* The retry contract: `r` is the answer to (key, q, cost) at now_us, a denial
 * with a finite retry_after_ms R. Then the same call made R - 1 ms later is
 * still denied and made exactly R ms later is allowed. Every algorithm's
 * denied calls leave the answer to that question unchanged (windows count
 * them inside the same window; the others record nothing), so both probes can
 * run on the same key in that order. */
static inline void retry_exact_(tg_limiter *lim, uint64_t now_us,
                                const char *key, const tg_quota *q,
                                uint64_t cost, tg_result r, const char *file,
                                int line) {
  eq_(r.allowed ? 1u : 0u, 0, "allowed", file, line);
  if (r.retry_after_ms == 0 || r.retry_after_ms == TG_NEVER) {
    print_error("retry_after_ms %" PRIu64 " is not a finite wait\n",
                r.retry_after_ms);
    _fail(file, line);
  }
  tg_result early =
      hit_(lim, now_us + MS(r.retry_after_ms - 1), key, q, cost, file, line);
  eq_(early.allowed ? 1u : 0u, 0, "allowed 1 ms before retry_after_ms", file,
      line);
  tg_result on_time =
      hit_(lim, now_us + MS(r.retry_after_ms), key, q, cost, file, line);
  eq_(on_time.allowed ? 1u : 0u, 1, "allowed after exactly retry_after_ms",
      file, line);
}
/* Denies (key, q, cost) at now_us and checks its retry_after_ms is exact. */
#define DENY_RETRY_EXACT(lim, now_us, key, q, cost)                            \
  retry_exact_((lim), (now_us), (key), (q), (cost),                            \
               deny_((lim), (now_us), (key), (q), (cost), __FILE__, __LINE__), \
               __FILE__, __LINE__)

/* ---- scenarios every algorithm runs (test_contract.c) ----
 * ALL5(f) registers scenario f five times, "<algorithm>/f", each on a new
 * limiter of that algorithm (on the store TG_TEST_STORE names), as BOTH(f)
 * does for the two buckets; the scenario reads its algorithm from
 * contract_alg. */
static tg_algorithm contract_alg;

static inline int contract_setup_(void **state, tg_algorithm alg) {
  contract_alg = alg;
  return new_limiter_(state, alg);
}
static inline int setup_fixed_window(void **state) {
  return contract_setup_(state, TG_FIXED_WINDOW);
}
static inline int setup_per_key_window(void **state) {
  return contract_setup_(state, TG_FIXED_WINDOW_PER_KEY);
}
static inline int setup_sliding_window(void **state) {
  return contract_setup_(state, TG_SLIDING_WINDOW);
}
static inline int setup_token_bucket(void **state) {
  return contract_setup_(state, TG_TOKEN_BUCKET);
}
static inline int setup_leaky_bucket(void **state) {
  return contract_setup_(state, TG_LEAKY_BUCKET);
}

#define ALL5(f)                                                                \
  {"fixed_window/" #f, f, setup_fixed_window, destroy_limiter, NULL},          \
      {"per_key_window/" #f, f, setup_per_key_window, destroy_limiter, NULL},  \
      {"sliding_window/" #f, f, setup_sliding_window, destroy_limiter, NULL},  \
      {"token_bucket/" #f, f, setup_token_bucket, destroy_limiter, NULL}, {    \
    "leaky_bucket/" #f, f, setup_leaky_bucket, destroy_limiter, NULL           \
  }

#endif /* ACCEPT_HELPERS_H */
