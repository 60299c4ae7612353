/* SPDX-License-Identifier: MIT */
/*
 * test_reserve.c - reservations (tg_reserve, tg_cancel), written from
 * tollgate.h's "Reservations" section: exact spacing to the nanosecond of
 * GCRA's emission interval, refusals that consume nothing, nginx
 * limit_req's burst/delay mapping, what cancelling may and may not give
 * back, shadow mode; on the custom store and on the memory store.
 */
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
#include <time.h>

#include "../examples/custom_store_map.h"
#include "tollgate.h"

#define MS(x) ((uint64_t)(x)*UINT64_C(1000))
#define T0 UINT64_C(1699999980000000)

static uint64_t hand_now = T0;
static uint64_t hand_clock(void *ctx) {
  (void)ctx;
  return hand_now;
}

static bool on_memory, on_redis;

/* Under tests/redis/with_cluster.sh: two of the Cluster's nodes as seeds
 * (the Redis kind then runs on the Cluster store), else NULL. */
static const char *cluster_seeds(void) {
  static char seeds[64];
  const char *ports = getenv("TG_TEST_CLUSTER_PORTS");
  const char *second = ports ? strchr(ports, ',') : NULL;
  if (!second)
    return NULL;
  snprintf(seeds, sizeof seeds, "127.0.0.1:%d,127.0.0.1:%d", atoi(ports),
           atoi(second + 1));
  return seeds;
}

typedef struct fixture {
  map_store *map;
  tg_custom_store cs;
  tg_redis_config rc;
  char prefix[64];
  tg_limiter *lim;
} fixture;

static void make(fixture *f, tg_algorithm alg, bool shadow) {
  memset(f, 0, sizeof *f);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.clock = hand_clock;
  cfg.clean_period_ms = 0;
  cfg.shadow = shadow;
  if (on_redis) {
    static unsigned n;
    tg_redis_config_init(&f->rc);
    if (cluster_seeds())
      f->rc.cluster_nodes = cluster_seeds();
    else
      f->rc.port = atoi(getenv("TG_TEST_REDIS_PORT"));
    snprintf(f->prefix, sizeof f->prefix, "resv%u.%u", (unsigned)rand(), n++);
    f->rc.key_prefix = f->prefix;
    cfg.redis = &f->rc;
  } else if (!on_memory) {
    map_store_options o;
    map_store_options_init(&o);
    o.clock = hand_clock;
    o.recursive = 1;
    assert_int_equal(map_store_new(&f->map, &o), 0);
    map_store_callbacks(f->map, &f->cs);
    cfg.custom_store = &f->cs;
  }
  assert_int_equal(tg_limiter_new(&f->lim, &cfg), 0);
}

static void unmake(fixture *f) {
  tg_limiter_destroy(f->lim);
  map_store_free(f->map);
}

/* 3 per second: T = ceil(1e9 / 3) = 333333334 ns. */
static const tg_quota RATE3 = {3, 1000, 1};
#define T3 UINT64_C(333333334)

static uint64_t reserve_delay(fixture *f, uint64_t now, const tg_quota *q,
                              uint64_t max_wait_ms, tg_reservation *r) {
  assert_int_equal(tg_reserve_at(f->lim, now, "job", 3, q, 1, max_wait_ms, r),
                   0);
  return r->ok ? r->delay_ns : UINT64_MAX;
}

/* N reservations at one moment are spaced exactly T apart, after the
 * burst's worth that go at once. */
static void test_spacing(void **state) {
  (void)state;
  for (int alg = TG_TOKEN_BUCKET; alg <= TG_LEAKY_BUCKET; alg++) {
    fixture f;
    make(&f, (tg_algorithm)alg, false);
    tg_reservation r;
    for (uint64_t i = 0; i < 8; i++) {
      assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &r), i * T3);
      assert_int_equal(r.delay_ms, (i * T3 + 999999) / 1000000);
      assert_true(r.result.allowed);
    }
    /* a burst of 3: three at once, then T, 2T */
    const tg_quota b3 = {3, 1000, 3};
    for (uint64_t i = 0; i < 5; i++) {
      assert_int_equal(tg_reserve_at(f.lim, T0, "b3", 2, &b3, 1, 10000, &r), 0);
      assert_int_equal(r.delay_ns, i < 3 ? 0 : (i - 2) * T3);
    }
    /* half an interval later, the queue has moved by half an interval */
    assert_int_equal(
        tg_reserve_at(f.lim, T0 + 166666, "b3", 2, &b3, 1, 10000, &r), 0);
    assert_int_equal(r.delay_ns, 3 * T3 - 166666000);
    unmake(&f);
  }
}

/* A reservation whose delay would pass max_wait is refused and consumes
 * nothing; a tg_hit waits behind the queue. */
static void test_refused(void **state) {
  (void)state;
  fixture f;
  make(&f, TG_TOKEN_BUCKET, false);
  tg_reservation r;
  for (uint64_t i = 0; i < 4; i++) /* 3T = 1000000002 ns > 1000 ms */
    assert_int_equal(reserve_delay(&f, T0, &RATE3, 1000, &r),
                     i < 3 ? i * T3 : UINT64_MAX);
  assert_false(r.ok);
  assert_false(r.result.allowed);
  assert_int_equal(r.delay_ns, 0);
  assert_int_equal(r.result.retry_after_ms, 1); /* 2 ns too early */
  /* it consumed nothing: with more patience the same slot is there */
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 2000, &r), 3 * T3);
  /* a hit now waits behind the four reservations */
  tg_result h;
  assert_int_equal(tg_hit_at(f.lim, T0, "job", 3, &RATE3, 1, &h), 0);
  assert_false(h.allowed);
  assert_int_equal(h.retry_after_ms, (4 * T3 + 999999) / 1000000);
  /* a cost above the burst: never */
  assert_int_equal(tg_reserve_at(f.lim, T0, "job", 3, &RATE3, 2, 1000, &r), 0);
  assert_false(r.ok);
  assert_int_equal(r.result.retry_after_ms, TG_NEVER);
  /* refusals of input */
  assert_int_equal(
      tg_reserve_at(f.lim, T0, "job", 3, &RATE3, 1, TG_PERIOD_MAX_MS + 1, &r),
      TG_EINVAL);
  assert_int_equal(tg_reserve_at(f.lim, T0, "job", 3, &RATE3, 1, 0, NULL),
                   TG_EINVAL);
  /* the input before the wait, as tg_reserve_rules checks them */
  assert_int_equal(
      tg_reserve_at(f.lim, T0, "job", 0, &RATE3, 1, TG_PERIOD_MAX_MS + 1, &r),
      TG_EKEY);
  unmake(&f);
  make(&f, TG_FIXED_WINDOW, false);
  assert_int_equal(tg_reserve_at(f.lim, T0, "job", 3, &RATE3, 1, 0, &r),
                   TG_ENOTSUP);
  unmake(&f);
}

/* nginx: limit_req rate=10r/s burst=5 (no nodelay) is a bucket of burst 1
 * with max_wait 5 * T: one at once, five queued 100 ms apart, the seventh
 * refused; with delay=2, burst 3 and max_wait 3 * T. */
static void test_nginx(void **state) {
  (void)state;
  fixture f;
  make(&f, TG_TOKEN_BUCKET, false);
  const tg_quota r10 = {10, 1000, 1};
  tg_reservation r;
  for (uint64_t i = 0; i < 7; i++) {
    assert_int_equal(tg_reserve_at(f.lim, T0, "ip", 2, &r10, 1, 5 * 100, &r),
                     0);
    assert_int_equal(r.ok, i < 6);
    if (r.ok)
      assert_int_equal(r.delay_ms, 100 * i);
  }
  const tg_quota d2 = {10, 1000, 3};
  for (uint64_t i = 0; i < 7; i++) {
    assert_int_equal(tg_reserve_at(f.lim, T0, "ip2", 3, &d2, 1, 3 * 100, &r),
                     0);
    assert_int_equal(r.ok, i < 6);
    if (r.ok)
      assert_int_equal(r.delay_ms, i < 3 ? 0 : 100 * (i - 2));
  }
  unmake(&f);
}

/* limit_req's burst=2 at 10,000 per second (T = 100 us): the queue holds
 * exactly 2 with the wait in ns (TG_RULES_WAIT_NS, 2T), where a wait in
 * whole ms (1 ms, 2T rounded up) holds 10. */
static void test_nginx_fast(void **state) {
  (void)state;
  fixture f;
  make(&f, TG_LEAKY_BUCKET, false);
  const tg_quota fast = {10000, 1000, 1};
  const uint64_t t = 100000;
  for (int unit = 0; unit < 2; unit++) {
    const char *key = unit ? "ms" : "ns";
    uint64_t wait = unit ? 1 : 2 * t;
    unsigned flags = unit ? 0 : TG_RULES_WAIT_NS;
    unsigned passed = 0;
    for (uint64_t i = 0; i < 15; i++) {
      tg_rule ru = {
          .lim = f.lim, .key = key, .key_len = 2, .q = &fast, .cost = 1};
      tg_rules_reservation out;
      tg_reservation res;
      assert_int_equal(
          tg_reserve_rules_at(T0, &ru, 1, &wait, flags, &out, &res), 0);
      if (out.ok) {
        assert_int_equal(out.delay_ns, passed * t);
        passed++;
      }
    }
    assert_int_equal(passed, unit ? 11 : 3);
  }
  /* a wait above the longest there is, in ns; the flag outside a policy
   * of reservations */
  tg_rule ru = {.lim = f.lim, .key = "x", .key_len = 1, .q = &fast, .cost = 1};
  tg_rules_reservation out;
  uint64_t too_long = TG_PERIOD_MAX_MS * UINT64_C(1000000) + 1;
  assert_int_equal(
      tg_reserve_rules_at(T0, &ru, 1, &too_long, TG_RULES_WAIT_NS, &out, NULL),
      TG_EINVAL);
  tg_rules_result hr;
  assert_int_equal(tg_hit_rules_at(T0, &ru, 1, TG_RULES_WAIT_NS, &hr),
                   TG_EINVAL);
  unmake(&f);
}

/* Cancelling gives back only what no later reservation is scheduled
 * behind, and only until its time has passed; twice is a no-op. */
static void test_cancel(void **state) {
  (void)state;
  fixture f;
  make(&f, TG_TOKEN_BUCKET, false);
  tg_reservation a, b, c, d;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &a), 0);
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &b), T3);
  /* the last one: its slot comes back whole */
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &b), 0);
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &c), T3);
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &d), 2 * T3);
  /* one in the middle: c is promised T and d 2T; giving c back would let
   * the next one in at 2T beside d, so nothing comes back */
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &c), 0);
  tg_reservation e;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &e), 3 * T3);
  /* twice, and a refused one: no-ops */
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &c), 0);
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &b), 0);
  tg_reservation g;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 0, &g), UINT64_MAX);
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &g), 0);
  tg_reservation h;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &h), 4 * T3);
  /* the last one, before its time: all of it comes back */
  assert_int_equal(tg_cancel_at(f.lim, T0, "job", 3, &RATE3, &h), 0);
  tg_reservation i2;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &i2), 4 * T3);
  /* one that went at once, cancelled half way through its interval: the
   * half that has not passed comes back (the next one goes at once, where
   * without the cancel it would wait the other half) */
  tg_reservation x, y;
  assert_int_equal(tg_reserve_at(f.lim, T0, "x", 1, &RATE3, 1, 0, &x), 0);
  assert_int_equal(tg_reserve_at(f.lim, T0, "y", 1, &RATE3, 1, 0, &y), 0);
  uint64_t mid = T0 + 166667; /* us */
  assert_int_equal(tg_cancel_at(f.lim, mid, "x", 1, &RATE3, &x), 0);
  assert_int_equal(tg_reserve_at(f.lim, mid, "x", 1, &RATE3, 1, 1000, &x), 0);
  assert_int_equal(x.delay_ns, 0);
  assert_int_equal(tg_reserve_at(f.lim, mid, "y", 1, &RATE3, 1, 1000, &y), 0);
  assert_int_equal(y.delay_ns, T3 - 166667000);
  /* after its whole interval has passed, nothing is left to give */
  tg_reservation z;
  assert_int_equal(tg_reserve_at(f.lim, T0, "z", 1, &RATE3, 1, 0, &z), 0);
  assert_int_equal(tg_cancel_at(f.lim, T0 + T3 / 1000 + 1, "z", 1, &RATE3, &z),
                   0);
  tg_result hr;
  assert_int_equal(tg_hit_at(f.lim, T0 + T3 / 1000 + 1, "z", 1, &RATE3, 1, &hr),
                   0);
  assert_true(hr.allowed);
  unmake(&f);
}

/* Shadow: the reservation is made as usual, the answer always goes now. */
static void test_shadow(void **state) {
  (void)state;
  fixture f;
  make(&f, TG_TOKEN_BUCKET, true);
  tg_reservation r;
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &r), 0);
  assert_false(r.result.shadow_denied);
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 10000, &r), 0);
  assert_true(r.ok);
  assert_true(r.result.shadow_denied); /* really: wait T */
  assert_int_equal(reserve_delay(&f, T0, &RATE3, 0, &r), 0);
  assert_true(r.result.shadow_denied); /* really: refused */
  /* the counter follows the field: the one that would have waited counts
   * as a shadow denial, as the one that would have been refused */
  tg_stats st;
  assert_int_equal(tg_limiter_stats(f.lim, &st, sizeof st), 0);
  assert_int_equal(st.allowed, 1);
  assert_int_equal(st.shadow_denied, 2);
  unmake(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spacing), cmocka_unit_test(test_refused),
      cmocka_unit_test(test_nginx),   cmocka_unit_test(test_nginx_fast),
      cmocka_unit_test(test_cancel),  cmocka_unit_test(test_shadow),
  };
  /* under tests/redis/with_redis.sh, or with_cluster.sh */
  if (getenv("TG_TEST_REDIS_PORT") || cluster_seeds()) {
    on_redis = true;
    srand((unsigned)time(NULL));
    return cmocka_run_group_tests_name("redis store", tests, NULL, NULL);
  }
  int rc = cmocka_run_group_tests_name("custom store", tests, NULL, NULL);
  on_memory = true;
  rc |= cmocka_run_group_tests_name("memory store", tests, NULL, NULL);
  return rc;
}
