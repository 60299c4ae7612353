/* SPDX-License-Identifier: MIT */
/*
 * test_custom_store.c - the custom store (tg_config.custom_store) from the
 * outside: what tollgate writes, when it calls which callback, what a broken
 * or busy store turns into. The store under test is the example adapter,
 * examples/custom_store_map.c, behind a recording wrapper
 * (custom_helpers.h). Long random runs against the memory store and threads
 * are in test_custom_store_runs.c.
 *
 *   1. layout: the documented serialisation (version, algorithm, zero bytes,
 *      u32 n, little-endian u64 fields), checked byte for byte in both
 *      directions for all five algorithms, with a byte encoder written here.
 *   2. protocol: one lock_and_get per store call, then exactly one of
 *      set_and_unlock (the state changed) or unlock (it did not); nothing
 *      after BUSY or ERROR; TTL = ms until the state is fresh, rounded up.
 *   3. failures: BUSY -> TG_EBUSY, ERROR -> TG_ESTORE, bad bytes ->
 *      TG_ECORRUPT, each with the policy's degraded answer and the lock
 *      released; random garbage never crashes.
 *   4. reset, tg_clean, tg_key_count.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../examples/custom_store_map.h"
#include "accept_helpers.h"
#include "custom_helpers.h"
#include "tollgate.h"
#include "util.h"

/* ==== 1. layout ==== */

static void layout_fixed_window(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_FIXED_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 0};
  unsigned char want[24], got[SCRATCH];
  const uint64_t end = UINT64_C(1700000001000000); /* the epoch window's end */

  hit(&f, "k", &q, 3, TG_OK);
  CALLS(f.r, 1, 1, 0);
  assert_true(f.r->last_cap >= 24);
  WROTE(&f, want, pair(want, TG_FIXED_WINDOW, end, 3), 877);
  BYTES_EQ(got, stored(&f, "k", got, sizeof got), want, 24);

  /* reading: a planted count is the one tollgate continues from */
  plant(&f, "r", want, pair(want, TG_FIXED_WINDOW, end, 7));
  assert_int_equal(get(&f, "r", &q), 7);
  tg_result r = hit(&f, "r", &q, 1, TG_OK);
  CHECK_RESULT(r, 1, 8, 2, 0, 877);
  WROTE(&f, want, pair(want, TG_FIXED_WINDOW, end, 8), 877);
  /* a window that has ended reads as empty */
  plant(&f, "old", want, pair(want, TG_FIXED_WINDOW, end - 1000000, 9));
  assert_int_equal(get(&f, "old", &q), 0);
  fx_close(&f);
}

static void layout_per_key_window(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_FIXED_WINDOW_PER_KEY, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 10, .period_ms = 1500, .burst = 0};
  unsigned char want[24];

  hit(&f, "k", &q, 2, TG_OK);
  WROTE(&f, want, pair(want, TG_FIXED_WINDOW_PER_KEY, T0 + 1500000, 2), 1500);
  f.clock.now_us = T0 + 400300;
  hit(&f, "k", &q, 1, TG_OK);
  WROTE(&f, want, pair(want, TG_FIXED_WINDOW_PER_KEY, T0 + 1500000, 3), 1100);

  f.clock.now_us = T0;
  plant(&f, "r", want, pair(want, TG_FIXED_WINDOW_PER_KEY, T0 + 500000, 4));
  assert_int_equal(get(&f, "r", &q), 4);
  uint64_t at;
  ASSERT_RC(tg_expires_at(f.lim, "r", 1, &q, &at), TG_OK);
  assert_int_equal(at, UINT64_C(1700000000624)); /* ceil((T0+0.5 s)/1 ms) */
  fx_close(&f);
}

static void layout_sliding_window(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_SLIDING_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 0};
  unsigned char want[8 + 16 * 4];

  hit(&f, "k", &q, 2, TG_OK);
  assert_true(f.r->last_cap >= 8 + 16 * 1024); /* default max entries */
  WROTE(&f, want, logbytes(want, 1, (uint64_t[]){T0}, (uint64_t[]){2}), 1000);
  f.clock.now_us = T0 + 100;
  hit(&f, "k", &q, 3, TG_OK);
  WROTE(&f, want,
        logbytes(want, 2, (uint64_t[]){T0, T0 + 100}, (uint64_t[]){2, 3}),
        1000);
  hit(&f, "k", &q, 1, TG_OK); /* same microsecond: one entry */
  WROTE(&f, want,
        logbytes(want, 2, (uint64_t[]){T0, T0 + 100}, (uint64_t[]){2, 4}),
        1000);
  f.clock.now_us = T0 + 250;
  hit(&f, "k", &q, 1, TG_OK);
  WROTE(&f, want,
        logbytes(want, 3, (uint64_t[]){T0, T0 + 100, T0 + 250},
                 (uint64_t[]){2, 4, 1}),
        1000);
  /* the oldest entry expires; even a peek stores the pruned log, whose TTL
   * runs to the newest entry's expiry: 250 us -> 1 ms */
  f.clock.now_us = T0 + 1000000;
  CALLS(f.r, 4, 4, 0);
  hit(&f, "k", &q, 0, TG_OK);
  CALLS(f.r, 1, 1, 0);
  WROTE(&f, want,
        logbytes(want, 2, (uint64_t[]){T0 + 100, T0 + 250}, (uint64_t[]){4, 1}),
        1);

  /* reading */
  f.clock.now_us = T0;
  plant(&f, "r", want,
        logbytes(want, 2, (uint64_t[]){T0 - 500000, T0 - 100000},
                 (uint64_t[]){3, 2}));
  assert_int_equal(get(&f, "r", &q), 5);
  /* 5 + 6 > 10: one unit must expire, the oldest entry at T0 + 500 ms */
  tg_result r = hit(&f, "r", &q, 6, TG_OK);
  CHECK_RESULT(r, 0, 5, 5, 500, 900);
  fx_close(&f);
}

static void layout_sliding_merge_at_cap(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_SLIDING_WINDOW, TG_POLICY_FAIL_OPEN, 2);
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 0};
  unsigned char want[8 + 16 * 2];
  for (uint64_t dt = 0; dt <= 20; dt += 10) {
    f.clock.now_us = T0 + dt;
    hit(&f, "k", &q, 1, TG_OK);
  }
  /* at the cap the new cost joins the newest entry, which takes its time */
  WROTE(&f, want,
        logbytes(want, 2, (uint64_t[]){T0, T0 + 20}, (uint64_t[]){1, 2}), 1000);
  assert_true(f.r->last_cap >= 8 + 16 * 2);
  fx_close(&f);
}

/* n is a little-endian u32: 258 entries are 02 01 00 00 on the way in and
 * 03 01 00 00 on the way out. */
static void layout_sliding_n_little_endian(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_SLIDING_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 100000, .period_ms = 1000, .burst = 0};
  static unsigned char want[8 + 16 * 259];
  uint64_t t[259], c[259];
  for (int i = 0; i < 259; i++) {
    t[i] = T0 - 1000 + (uint64_t)i;
    c[i] = 1;
  }
  plant(&f, "k", want, logbytes(want, 258, t, c));
  assert_int_equal(want[4], 2);
  assert_int_equal(want[5], 1);
  assert_int_equal(get(&f, "k", &q), 258);
  f.clock.now_us = T0 - 1000 + 258;
  hit(&f, "k", &q, 1, TG_OK);
  WROTE(&f, want, logbytes(want, 259, t, c), 1000);
  assert_int_equal(f.r->set_data[4], 3);
  assert_int_equal(f.r->set_data[5], 1);
  fx_close(&f);
}

static void layout_token_bucket(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_TOKEN_BUCKET, TG_POLICY_FAIL_OPEN, 0);
  /* T = 100 ms = 1e8 ns, tau = 5e8 ns */
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 5};
  unsigned char want[24];
  hit(&f, "k", &q, 2, TG_OK);
  WROTE(&f, want, pair(want, TG_TOKEN_BUCKET, T0 * 1000 + 200000000, 0), 200);
  f.clock.now_us = T0 + 50000;
  hit(&f, "k", &q, 1, TG_OK);
  WROTE(&f, want, pair(want, TG_TOKEN_BUCKET, T0 * 1000 + 300000000, 0), 250);

  f.clock.now_us = T0;
  plant(&f, "r", want, pair(want, TG_TOKEN_BUCKET, T0 * 1000 + 300000000, 0));
  assert_int_equal(get(&f, "r", &q), 2);
  fx_close(&f);
}

static void layout_leaky_bucket(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_LEAKY_BUCKET, TG_POLICY_FAIL_OPEN, 0);
  /* T = ceil(1e9 / 3) = 333333334 ns */
  const tg_quota q = {.limit = 3, .period_ms = 1000, .burst = 4};
  unsigned char want[24];
  hit(&f, "k", &q, 1, TG_OK);
  WROTE(&f, want, pair(want, TG_LEAKY_BUCKET, T0 * 1000 + 333333334, 0), 334);
  plant(&f, "r", want,
        pair(want, TG_LEAKY_BUCKET, T0 * 1000 + 2 * UINT64_C(333333334), 0));
  assert_int_equal(get(&f, "r", &q), 2);
  fx_close(&f);
}

/* ==== 2. protocol ==== */

static const tg_quota proto_q = {.limit = 2, .period_ms = 1000, .burst = 0};

/* Calls that change nothing unlock, whatever the algorithm; a fresh key is
 * NOT_FOUND and still unlocked. */
static void protocol_reads_unlock(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    uint64_t v;
    for (int round = 0; round < 2; round++) {
      ASSERT_RC(tg_get(f.lim, "k", 1, &proto_q, &v), TG_OK);
      CALLS(f.r, 1, 0, 1);
      assert_int_equal(f.r->last_get,
                       round ? TG_CUSTOM_OK : TG_CUSTOM_NOT_FOUND);
      ASSERT_RC(tg_expires_at(f.lim, "k", 1, &proto_q, &v), TG_OK);
      CALLS(f.r, 1, 0, 1);
      hit(&f, "k", &proto_q, 0, TG_OK); /* peek */
      CALLS(f.r, 1, 0, 1);
      if (round == 0) {
        hit(&f, "k", &proto_q, 1, TG_OK);
        CALLS(f.r, 1, 1, 0);
      }
    }
    fx_close(&f);
  }
}

/* A denied call: the windows count it (a change), the others do not. */
static void protocol_denied(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    hit(&f, "k", &proto_q, 2, TG_OK);
    CALLS(f.r, 1, 1, 0);
    tg_result r = hit(&f, "k", &proto_q, 1, TG_OK);
    assert_false(r.allowed);
    bool counts = a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
    CALLS(f.r, 1, counts ? 1 : 0, counts ? 0 : 1);
    r = hit(&f, "k", &proto_q, 3, TG_OK); /* more than the limit: never */
    assert_int_equal(r.retry_after_ms, TG_NEVER);
    CALLS(f.r, 1, counts ? 1 : 0, counts ? 0 : 1);
    fx_close(&f);
  }
}

/* inc and set: a change unless inc adds 0; unsupported operations and
 * invalid input never reach the store. */
static void protocol_writes_and_refusals(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    bool window = a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
    uint64_t v;
    ASSERT_RC(tg_inc(f.lim, "k", 1, &proto_q, 0, &v),
              window ? TG_OK : TG_ENOTSUP);
    CALLS(f.r, window, 0, window);
    ASSERT_RC(tg_inc(f.lim, "k", 1, &proto_q, 2, &v),
              window ? TG_OK : TG_ENOTSUP);
    CALLS(f.r, window, window, 0);
    bool settable = a != TG_SLIDING_WINDOW;
    ASSERT_RC(tg_set(f.lim, "k", 1, &proto_q, 1),
              settable ? TG_OK : TG_ENOTSUP);
    CALLS(f.r, settable, settable, 0);

    const tg_quota bad = {.limit = 0, .period_ms = 1000, .burst = 0};
    tg_result r;
    ASSERT_RC(tg_hit(f.lim, "k", 1, &bad, 1, &r), TG_EQUOTA);
    ASSERT_RC(tg_hit(f.lim, "", 0, &proto_q, 1, &r), TG_EKEY);
    ASSERT_RC(tg_hit_at(f.lim, TG_NOW_MAX_US + 1, "k", 1, &proto_q, 1, &r),
              TG_ETIME);
    ASSERT_RC(tg_reset(f.lim, "", 0), TG_EKEY);
    CALLS(f.r, 0, 0, 0);
    fx_close(&f);
  }
}

/* Errors of the arithmetic itself (TG_EOVERFLOW, TG_ERANGE) are found with
 * the lock held: it must be released, and the answer is not degraded. */
static void protocol_step_errors_unlock(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    if (a == TG_SLIDING_WINDOW)
      continue;
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    if (a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY) {
      ASSERT_RC(tg_set(f.lim, "k", 1, &proto_q, UINT64_MAX), TG_OK);
      CALLS(f.r, 1, 1, 0);
      tg_result r = hit(&f, "k", &proto_q, 1, TG_EOVERFLOW);
      CALLS(f.r, 1, 0, 1);
      assert_false(r.allowed);
      assert_false(r.degraded);
      ASSERT_RC(tg_inc(f.lim, "k", 1, &proto_q, 1, NULL), TG_EOVERFLOW);
      CALLS(f.r, 1, 0, 1);
    } else {
      ASSERT_RC(tg_set(f.lim, "k", 1, &proto_q, 3), TG_ERANGE); /* > burst */
      CALLS(f.r, 1, 0, 1);
    }
    fx_close(&f);
  }
}

/* TTL = ms until the written state is fresh, rounded up; 0 when it already
 * is (and the example store then deletes the key). */
static void protocol_ttl_rules(void **state) {
  (void)state;
  fx f;
  unsigned char buf[SCRATCH];
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};

  fx_open(&f, TG_FIXED_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  f.clock.now_us = UINT64_C(1700000000999999); /* 1 us before the end */
  hit(&f, "k", &q, 1, TG_OK);
  assert_int_equal(f.r->set_ttl, 1);
  f.clock.now_us = UINT64_C(1700000001000000); /* a new window */
  hit(&f, "k", &q, 1, TG_OK);
  assert_int_equal(f.r->set_ttl, 1000);
  assert_int_equal(map_store_live(f.map), 1);
  ASSERT_RC(tg_set(f.lim, "k", 1, &q, 0), TG_OK); /* count 0: fresh */
  assert_int_equal(f.r->set_ttl, 0);
  assert_int_equal(map_store_live(f.map), 0);
  assert_int_equal(stored(&f, "k", buf, sizeof buf), SIZE_MAX);
  fx_close(&f);

  fx_open(&f, TG_FIXED_WINDOW_PER_KEY, TG_POLICY_FAIL_OPEN, 0);
  ASSERT_RC(tg_set(f.lim, "k", 1, &q, 0), TG_OK); /* an active window */
  assert_int_equal(f.r->set_ttl, 1000);
  fx_close(&f);

  for (int a = TG_TOKEN_BUCKET; a <= TG_LEAKY_BUCKET; a++) {
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    /* T = 1 us: one unit is 1000 ns, still 1 ms of TTL */
    const tg_quota fast = {.limit = 1000, .period_ms = 1, .burst = 0};
    hit(&f, "k", &fast, 1, TG_OK);
    assert_int_equal(f.r->set_ttl, 1);
    hit(&f, "k", &fast, 999, TG_OK);
    assert_int_equal(f.r->set_ttl, 1);
    /* setting the fresh value (full tokens, empty level) gives TTL 0 */
    ASSERT_RC(tg_set(f.lim, "k", 1, &fast, a == TG_TOKEN_BUCKET ? 1000 : 0),
              TG_OK);
    assert_int_equal(f.r->set_ttl, 0);
    assert_int_equal(map_store_live(f.map), 0);
    fx_close(&f);
  }

  fx_open(&f, TG_SLIDING_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  hit(&f, "k", &q, 1, TG_OK);
  f.clock.now_us = T0 + 999;
  hit(&f, "k", &q, 1, TG_OK);
  assert_int_equal(f.r->set_ttl, 1000); /* newest + period - now */
  f.clock.now_us = T0 + 1000000;        /* the first entry expires */
  assert_int_equal(get(&f, "k", &q), 1);
  assert_int_equal(f.r->set_ttl, 1); /* 999 us left */
  f.clock.now_us = T0 + 1000999;     /* all expired: an empty log, TTL 0 */
  CALLS(f.r, 3, 3, 0);
  assert_int_equal(get(&f, "k", &q), 0);
  CALLS(f.r, 1, 1, 0);
  unsigned char want[8];
  WROTE(&f, want, head(want, 1, TG_SLIDING_WINDOW, 0), 0);
  assert_int_equal(map_store_live(f.map), 0);
  fx_close(&f);
}

/* ==== 3. failures ==== */

/* The answer a failed hit must carry under each policy. */
static void degraded_(const tg_result *r, tg_policy pol, uint64_t period_ms,
                      const char *file, int line) {
  eq_(r->degraded, 1, "degraded", file, line);
  eq_(r->allowed, pol == TG_POLICY_FAIL_OPEN, "allowed", file, line);
  eq_(r->retry_after_ms,
      pol == TG_POLICY_FAIL_OPEN     ? 0
      : pol == TG_POLICY_FAIL_CLOSED ? period_ms
                                     : TG_NEVER,
      "retry_after_ms", file, line);
}
#define DEGRADED(r, pol, period)                                               \
  degraded_(&(r), (pol), (period), __FILE__, __LINE__)

/* lock_and_get answers `code`: every operation returns `want`, a hit carries
 * the policy's answer, and nothing more is called. */
static void failing_get(int code, int want) {
  const tg_policy pols[] = {TG_POLICY_FAIL_OPEN, TG_POLICY_FAIL_CLOSED,
                            TG_POLICY_ERROR};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    for (size_t p = 0; p < 3; p++) {
      fx f;
      fx_open(&f, (tg_algorithm)a, pols[p], 0);
      const tg_quota q = {.limit = 5, .period_ms = 2500, .burst = 0};
      hit(&f, "k", &q, 1, TG_OK); /* an existing key, then a failing store */
      CALLS(f.r, 1, 1, 0);
      f.r->force_get = code;
      tg_result r = hit(&f, "k", &q, 1, want);
      DEGRADED(r, pols[p], 2500);
      r = hit(&f, "new", &q, 0, want);
      DEGRADED(r, pols[p], 2500);
      CALLS(f.r, 2, 0, 0);
      uint64_t v;
      ASSERT_RC(tg_get(f.lim, "k", 1, &q, &v), want);
      ASSERT_RC(tg_expires_at(f.lim, "k", 1, &q, &v), want);
      ASSERT_RC(tg_reset(f.lim, "k", 1), want);
      CALLS(f.r, 3, 0, 0);
      bool window = a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
      ASSERT_RC(tg_inc(f.lim, "k", 1, &q, 1, &v), window ? want : TG_ENOTSUP);
      ASSERT_RC(tg_set(f.lim, "k", 1, &q, 1),
                a == TG_SLIDING_WINDOW ? TG_ENOTSUP : want);
      CALLS(f.r, (unsigned)window + (a != TG_SLIDING_WINDOW), 0, 0);
      f.r->force_get = 0;
      assert_int_equal(get(&f, "k", &q), a == TG_TOKEN_BUCKET ? 4 : 1);
      fx_close(&f);
    }
}

static void failure_busy(void **state) {
  (void)state;
  failing_get(TG_CUSTOM_BUSY, TG_EBUSY);
}

static void failure_error(void **state) {
  (void)state;
  failing_get(TG_CUSTOM_ERROR, TG_ESTORE);
}

/* set_and_unlock fails (having released the lock, as it must): TG_ESTORE
 * with the policy's answer; the store keeps its old state. */
static void failure_set_and_unlock(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_CLOSED, 0);
    const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
    hit(&f, "k", &q, 1, TG_OK);
    f.r->fail_set = true;
    tg_result r = hit(&f, "k", &q, 1, TG_ESTORE);
    DEGRADED(r, TG_POLICY_FAIL_CLOSED, 1000);
    CALLS(f.r, 2, 2, 0);
    ASSERT_RC(tg_reset(f.lim, "k", 1), TG_ESTORE);
    CALLS(f.r, 1, 1, 0);
    f.r->fail_set = false;
    uint64_t v = get(&f, "k", &q); /* the lock was released: not BUSY */
    assert_int_equal(v, a == TG_TOKEN_BUCKET ? 4 : 1);
    fx_close(&f);
  }
}

/* A store failure in a policy, at a rule whose limiter is in shadow mode:
 * answered as shadow mode answers a failure (allowed, shadow_denied where
 * the failure policy denied), the policy's answer and every rule's result
 * alike; at a rule in no shadow mode, the failure policy's answer, unless
 * the call is in shadow mode (TG_RULES_SHADOW). */
static void failure_in_shadow_policy(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_TOKEN_BUCKET, TG_POLICY_FAIL_CLOSED, 0);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  cfg.on_failure = TG_POLICY_FAIL_CLOSED;
  cfg.shadow = true;
  cfg.clock = sim_read;
  cfg.clock_ctx = &f.clock;
  cfg.custom_store = &f.cs;
  tg_limiter *sh;
  assert_int_equal(tg_limiter_new(&sh, &cfg), TG_OK);
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
  f.r->force_get = TG_CUSTOM_ERROR;
  /* keys are locked in key order: "a" first, so its rule fails */
  for (int shadow_fails = 1; shadow_fails >= 0; shadow_fails--)
    for (unsigned flags = 0; flags <= TG_RULES_SHADOW; flags++) {
      tg_rule r[2];
      memset(r, 0, sizeof r);
      r[0] = (tg_rule){f.lim, shadow_fails ? "b" : "a", 1, &q, 1, 0, {0}};
      r[1] = (tg_rule){sh, shadow_fails ? "a" : "b", 1, &q, 1, 0, {0}};
      tg_rules_result out;
      ASSERT_RC(tg_hit_rules_at(T0, r, 2, flags, &out), TG_ESTORE);
      size_t at = shadow_fails ? 1 : 0;
      assert_int_equal(out.denied_by, at);
      assert_int_equal(r[at].status, TG_ESTORE);
      assert_true(out.r.degraded);
      bool allowed = shadow_fails || flags;
      assert_int_equal(out.r.allowed, allowed);
      assert_int_equal(out.r.shadow_denied, allowed);
      for (size_t i = 0; i < 2; i++) {
        assert_int_equal(r[i].result.allowed, out.r.allowed);
        assert_int_equal(r[i].result.shadow_denied, out.r.shadow_denied);
        assert_int_equal(r[i].result.retry_after_ms, out.r.retry_after_ms);
      }
    }
  f.r->force_get = 0;
  tg_limiter_destroy(sh);
  fx_close(&f);
}

/* A real held lock with the trylock store: BUSY, fail open by default. */
static void failure_real_busy(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_TOKEN_BUCKET, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 1, .period_ms = 1000, .burst = 1};
  unsigned char buf[64];
  size_t len;
  int got =
      f.r->inner.lock_and_get(f.r->inner.ctx, "k", 1, buf, sizeof buf, &len);
  assert_int_equal(got, TG_CUSTOM_NOT_FOUND);
  for (int i = 0; i < 3; i++) {
    tg_result r = hit(&f, "k", &q, 1, TG_EBUSY);
    DEGRADED(r, TG_POLICY_FAIL_OPEN, 1000);
  }
  f.r->inner.unlock(f.r->inner.ctx, "k", 1);
  CALLS(f.r, 3, 0, 0);
  assert_true(hit(&f, "k", &q, 1, TG_OK).allowed);
  assert_false(hit(&f, "k", &q, 1, TG_OK).allowed); /* busy calls took none */
  fx_close(&f);
}

/* The bounded wait: a lock held by someone else past the wait is BUSY; one
 * released within it is taken. */
typedef struct holder {
  tg_custom_store cs;
  pthread_barrier_t *locked;
  unsigned hold_ms;
  int got; /* out */
} holder;

static void *holder_run(void *arg) {
  holder *h = arg;
  unsigned char buf[64];
  size_t len;
  h->got = h->cs.lock_and_get(h->cs.ctx, "k", 1, buf, sizeof buf, &len);
  pthread_barrier_wait(h->locked);
  const struct timespec hold = {0, (long)h->hold_ms * 1000000L};
  nanosleep(&hold, NULL);
  if (h->got == TG_CUSTOM_OK || h->got == TG_CUSTOM_NOT_FOUND)
    h->cs.unlock(h->cs.ctx, "k", 1);
  return NULL;
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int hit_while_held(int64_t wait_us, unsigned hold_ms,
                          uint64_t *elapsed_ms) {
  map_store_options mo;
  map_store_options_init(&mo);
  mo.lock_wait_us = wait_us;
  map_store *m;
  assert_int_equal(map_store_new(&m, &mo), 0);
  tg_config cfg;
  tg_config_init(&cfg);
  tg_custom_store cs;
  map_store_callbacks(m, &cs);
  cfg.custom_store = &cs;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  pthread_barrier_t locked;
  pthread_barrier_init(&locked, NULL, 2);
  holder h = {cs, &locked, hold_ms, -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, holder_run, &h), 0);
  pthread_barrier_wait(&locked);
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
  tg_result r;
  uint64_t t = mono_ms();
  int rc = tg_hit(lim, "k", 1, &q, 1, &r);
  *elapsed_ms = mono_ms() - t;
  pthread_join(th, NULL);
  pthread_barrier_destroy(&locked);
  assert_int_equal(h.got, TG_CUSTOM_NOT_FOUND);
  assert_int_equal(r.degraded, rc != TG_OK);
  tg_limiter_destroy(lim);
  map_store_free(m);
  return rc;
}

static void failure_bounded_wait(void **state) {
  (void)state;
  uint64_t ms;
  assert_int_equal(hit_while_held(2000, 300, &ms), TG_EBUSY);
  assert_true(ms >= 2);
  assert_int_equal(hit_while_held(10000000, 20, &ms), TG_OK);
  assert_int_equal(hit_while_held(MAP_STORE_WAIT_FOREVER, 20, &ms), TG_OK);
}

/* One stored blob that is not a state of this limiter. */
typedef struct bad {
  const char *what;
  unsigned char b[8 + 16 * 5];
  size_t len;
} bad;

/* Every operation on a key holding the blob is TG_ECORRUPT, releases the
 * lock, writes nothing, and a hit answers by the policy; reset repairs. */
static void expect_corrupt(tg_algorithm alg, const bad *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    fx f;
    fx_open(&f, alg, TG_POLICY_FAIL_CLOSED, 4);
    const tg_quota q = {.limit = 5, .period_ms = 700, .burst = 0};
    plant(&f, "k", cases[i].b, cases[i].len);
    print_message("  %s: %s\n", tg_algorithm_name(alg), cases[i].what);
    tg_result r = hit(&f, "k", &q, 1, TG_ECORRUPT);
    DEGRADED(r, TG_POLICY_FAIL_CLOSED, 700);
    CALLS(f.r, 1, 0, 1);
    uint64_t v;
    ASSERT_RC(tg_get(f.lim, "k", 1, &q, &v), TG_ECORRUPT);
    ASSERT_RC(tg_expires_at(f.lim, "k", 1, &q, &v), TG_ECORRUPT);
    CALLS(f.r, 2, 0, 2);
    if (alg != TG_SLIDING_WINDOW) {
      ASSERT_RC(tg_set(f.lim, "k", 1, &q, 1), TG_ECORRUPT);
      CALLS(f.r, 1, 0, 1);
    }
    unsigned char now[SCRATCH];
    BYTES_EQ(now, stored(&f, "k", now, sizeof now), cases[i].b, cases[i].len);
    ASSERT_RC(tg_reset(f.lim, "k", 1), TG_OK);
    CALLS(f.r, 1, 1, 0);
    assert_true(hit(&f, "k", &q, 1, TG_OK).allowed);
    fx_close(&f);
  }
}

static void corrupt_state(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    if (a == TG_SLIDING_WINDOW)
      continue;
    tg_algorithm alg = (tg_algorithm)a;
    bad c[32];
    memset(c, 0, sizeof c);
    size_t n = 0;
    const uint64_t end = T0 + 100000, v = a <= 1 ? 2 : 0;
#define CASE(name) (c[n].what = (name), &c[n])
    /* truncated */
    CASE("empty")->len = 0, n++;
    CASE("7 bytes")->len = pair(c[n].b, alg, end, v) - 17, n++;
    CASE("head only")->len = pair(c[n].b, alg, end, v) - 16, n++;
    CASE("23 bytes")->len = pair(c[n].b, alg, end, v) - 1, n++;
    /* oversized (the last two exceed the cap tollgate offers) */
    CASE("25 bytes")->len = pair(c[n].b, alg, end, v) + 1, n++;
    CASE("40 bytes")->len = pair(c[n].b, alg, end, v) + 16, n++;
    CASE("88 bytes")->len = pair(c[n].b, alg, end, v) + 64, n++;
    /* head */
    const unsigned versions[] = {0, 2, 255};
    for (int k = 0; k < 3; k++) {
      CASE("wrong version")->len = pair(c[n].b, alg, end, v);
      c[n++].b[0] = (unsigned char)versions[k];
    }
    for (unsigned other = 0; other < 7; other++) {
      if (other == (unsigned)a)
        continue;
      CASE("wrong algorithm")->len = pair(c[n].b, alg, end, v);
      c[n++].b[1] = (unsigned char)(other == 6 ? 255 : other);
    }
    CASE("byte 2 set")->len = pair(c[n].b, alg, end, v);
    c[n++].b[2] = 1;
    CASE("byte 3 set")->len = pair(c[n].b, alg, end, v);
    c[n++].b[3] = 0x80;
    CASE("n = 1")->len = pair(c[n].b, alg, end, v);
    c[n++].b[4] = 1;
    CASE("n = 2^24")->len = pair(c[n].b, alg, end, v);
    c[n++].b[7] = 1;
#undef CASE
    assert_true(n <= sizeof c / sizeof c[0]);
    expect_corrupt(alg, c, n);
  }
}

static void corrupt_sliding_log(void **state) {
  (void)state;
  bad c[32];
  memset(c, 0, sizeof c);
  size_t n = 0;
  const uint64_t t2[] = {T0 - 2000, T0 - 1000}, c2[] = {1, 2};
  const uint64_t teq[] = {T0 - 1000, T0 - 1000},
                 tdown[] = {T0 - 1000, T0 - 2000};
  const uint64_t t5[] = {T0 - 5, T0 - 4, T0 - 3, T0 - 2, T0 - 1},
                 c5[] = {1, 1, 1, 1, 1};
#define CASE(name) (c[n].what = (name), &c[n])
  CASE("empty")->len = 0, n++;
  CASE("7 bytes")->len = logbytes(c[n].b, 0, NULL, NULL) - 1, n++;
  CASE("n = 0 with an entry")->len = logbytes(c[n].b, 0, NULL, NULL) + 16;
  le64(c[n].b + 8, T0 - 1), le64(c[n].b + 16, 1), n++;
  CASE("n = 2, one entry")->len = logbytes(c[n].b, 2, t2, c2) - 16, n++;
  CASE("n = 2, a byte short")->len = logbytes(c[n].b, 2, t2, c2) - 1, n++;
  CASE("n = 2, a byte over")->len = logbytes(c[n].b, 2, t2, c2) + 1, n++;
  CASE("n = 2, three entries")->len = logbytes(c[n].b, 2, t2, c2) + 16, n++;
  CASE("n = max + 1 (oversized)")->len = logbytes(c[n].b, 5, t5, c5), n++;
  CASE("n = 2^32 - 1")->len = head(c[n].b, 1, TG_SLIDING_WINDOW, UINT32_MAX);
  n++;
  CASE("equal times")->len = logbytes(c[n].b, 2, teq, c2), n++;
  CASE("decreasing times")->len = logbytes(c[n].b, 2, tdown, c2), n++;
  CASE("wrong version")->len = logbytes(c[n].b, 2, t2, c2);
  c[n++].b[0] = 2;
  CASE("wrong algorithm")->len = logbytes(c[n].b, 2, t2, c2);
  c[n++].b[1] = TG_FIXED_WINDOW;
  CASE("a window's state")->len = pair(c[n].b, TG_FIXED_WINDOW, T0 + 1000, 1),
  n++;
  CASE("byte 2 set")->len = logbytes(c[n].b, 2, t2, c2);
  c[n++].b[2] = 1;
#undef CASE
  expect_corrupt(TG_SLIDING_WINDOW, c, n);
}

/* Random bytes, often behind a valid head, at random times including the
 * ends of the range: never a crash (run it under ASan/UBSan), always the
 * lock released, only the codes the arithmetic can give. */
static void corrupt_random_garbage(void **state) {
  (void)state;
  uint64_t seed = UINT64_C(0xc0ffee);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 3);
    for (int i = 0; i < 20000; i++) {
      unsigned char b[8 + 16 * 5];
      size_t len = (size_t)rng_below(&seed, sizeof b + 1);
      for (size_t k = 0; k < len; k++)
        b[k] = (unsigned char)rng_next(&seed);
      if (len >= 8 && rng_below(&seed, 4) != 0) {
        uint32_t n = a == TG_SLIDING_WINDOW ? (uint32_t)(len - 8) / 16 : 0;
        if (rng_below(&seed, 4) == 0)
          n = (uint32_t)rng_next(&seed);
        head(b, 1, (unsigned)a, n);
        if (rng_below(&seed, 2)) /* plausible numbers */
          for (size_t k = 8; k + 8 <= len; k += 8)
            le64(b + k, T0 + rng_below(&seed, 4000000) - 2000000);
      }
      plant(&f, "g", b, len);
      const uint64_t times[] = {0, 1, T0, TG_NOW_MAX_US};
      uint64_t now = times[rng_below(&seed, 4)];
      tg_quota q = {.limit = 1 + rng_below(&seed, 20),
                    .period_ms = 1 + rng_below(&seed, 5000),
                    .burst = rng_below(&seed, 30)};
      uint64_t arg = rng_below(&seed, 8) ? rng_below(&seed, 40) : UINT64_MAX;
      uint64_t v;
      tg_result r;
      int rc;
      switch (rng_below(&seed, 5)) {
      case 0:
        rc = tg_hit_at(f.lim, now, "g", 1, &q, arg, &r);
        break;
      case 1:
        rc = tg_get_at(f.lim, now, "g", 1, &q, &v);
        break;
      case 2:
        rc = tg_expires_at_at(f.lim, now, "g", 1, &q, &v);
        break;
      case 3:
        rc = tg_set_at(f.lim, now, "g", 1, &q, arg);
        break;
      default:
        rc = tg_inc_at(f.lim, now, "g", 1, &q, arg, &v);
        break;
      }
      if (rc != TG_OK && rc != TG_ECORRUPT && rc != TG_EOVERFLOW &&
          rc != TG_ERANGE && rc != TG_ENOTSUP)
        fail_msg("step %d: unexpected %s", i, tg_err_name(rc));
      assert_false(f.r->held);
      assert_int_equal(f.r->violations, 0);
      assert_int_equal(f.r->locks, f.r->sets + f.r->unlocks);
      f.r->locks = f.r->sets = f.r->unlocks = 0;
    }
    fx_close(&f);
  }
}

/* State that parses but that tollgate can never have written (times past
 * TG_NOW_MAX_US plus the longest period or tolerance) must not turn into a
 * wrapped answer: either TG_ECORRUPT, or answers that follow the contract
 * (a bucket with a TAT centuries ahead denies, a live log gets a TTL). */
/* The two tests below fail against src/store/custom.c as of this writing:
 * it checks the layout but not the range of the numbers, so a TAT near 2^64
 * wraps the bucket's debt (the hit is allowed, 9 of 10 tokens left) and a
 * log entry near 2^64 wraps t + period (a live log stored with TTL 0). Their
 * fixture is closed by the teardown so a failure leaks nothing. */
static int fx_setup_token(void **state) {
  fx *f = malloc(sizeof *f);
  if (!f)
    return -1;
  fx_open(f, TG_TOKEN_BUCKET, TG_POLICY_FAIL_OPEN, 0);
  *state = f;
  return 0;
}

static int fx_setup_sliding(void **state) {
  fx *f = malloc(sizeof *f);
  if (!f)
    return -1;
  fx_open(f, TG_SLIDING_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fx_close(*state);
  free(*state);
  return 0;
}

static void corrupt_out_of_range_bucket(void **state) {
  fx *f = *state;
  unsigned char b[24];
  uint64_t at;
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 0};
  plant(f, "k", b, pair(b, TG_TOKEN_BUCKET, UINT64_MAX - 5, 0));
  f->clock.now_us = 1000;
  tg_result r;
  int rc = tg_hit(f->lim, "k", 1, &q, 1, &r);
  if (rc != TG_ECORRUPT) {
    ASSERT_RC(rc, TG_OK);
    if (r.allowed)
      fail_msg("TAT 2^64-6 ns, now 1 ms: hit allowed with %" PRIu64
               " tokens left (the debt wrapped)",
               r.count);
    ASSERT_RC(tg_expires_at(f->lim, "k", 1, &q, &at), TG_OK);
    assert_true(at > UINT64_C(18000000000000)); /* ~ 2^64 ns in ms */
  }
}

static void corrupt_out_of_range_sliding_log(void **state) {
  fx *f = *state;
  unsigned char b[24];
  tg_result r;
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 0};
  plant(f, "k", b,
        logbytes(b, 1, (uint64_t[]){UINT64_MAX - 5}, (uint64_t[]){3}));
  int rc = tg_hit(f->lim, "k", 1, &q, 1, &r);
  if (rc != TG_ECORRUPT) {
    ASSERT_RC(rc, TG_OK);
    assert_int_equal(r.count, 4); /* the entry is live */
    if (r.reset_after_ms == 0 || f->r->set_ttl == 0)
      fail_msg("an entry at t = 2^64-6 us is live (count %" PRIu64
               ") but reset_after_ms = %" PRIu64 " and the TTL is %" PRIu64
               " ms: t + period wrapped",
               r.count, r.reset_after_ms, f->r->set_ttl);
  }
}

/* ==== 4. reset, clean, counts ==== */

static void reset_writes_fresh_state(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
    hit(&f, "k", &q, 2, TG_OK);
    CALLS(f.r, 1, 1, 0);
    assert_int_equal(map_store_live(f.map), 1);
    ASSERT_RC(tg_reset(f.lim, "k", 1), TG_OK);
    CALLS(f.r, 1, 1, 0);
    unsigned char want[24];
    size_t n = a == TG_SLIDING_WINDOW ? head(want, 1, (unsigned)a, 0)
                                      : pair(want, (tg_algorithm)a, 0, 0);
    WROTE(&f, want, n, 0);
    assert_int_equal(map_store_live(f.map), 0); /* TTL 0: deleted */
    assert_int_equal(get(&f, "k", &q), a == TG_TOKEN_BUCKET ? 5 : 0);
    CALLS(f.r, 1, 0, 1);
    /* an unknown key: locked, found absent, unlocked */
    ASSERT_RC(tg_reset(f.lim, "nobody", 6), TG_OK);
    CALLS(f.r, 1, 0, 1);
    /* a fresh state kept by a store that ignores TTL 0 reads as absent */
    plant(&f, "kept", want, n);
    assert_int_equal(get(&f, "kept", &q), a == TG_TOKEN_BUCKET ? 5 : 0);
    fx_close(&f);
  }
}

/* A tg_set to a fresh state (a full bucket, an empty window) on a key the
 * store does not hold creates nothing, as on the memory store and Redis:
 * a later call with an earlier now then finds no state on either, and
 * both answer alike (the custom store used to write the state, and a call
 * 5 s earlier found the bucket drained). The same inside a policy. */
static void set_fresh_creates_nothing(void **state) {
  (void)state;
  const tg_quota q = {.limit = 1, .period_ms = 1000, .burst = 1};
  const uint64_t before = T0 - UINT64_C(5000000);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    if (a == TG_SLIDING_WINDOW)
      continue; /* not settable */
    fx f;
    fx_open(&f, (tg_algorithm)a, TG_POLICY_FAIL_OPEN, 0);
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = (tg_algorithm)a;
    tg_limiter *mem;
    assert_int_equal(tg_limiter_new(&mem, &cfg), TG_OK);
    uint64_t fresh = a == TG_TOKEN_BUCKET ? q.burst : 0;
    /* a per-key window set to 0 opens a window (it is not fresh), on every
     * store */
    bool opens = a == TG_FIXED_WINDOW_PER_KEY;
    ASSERT_RC(tg_set_at(f.lim, T0, "k", 1, &q, fresh), TG_OK);
    CALLS(f.r, 1, opens, !opens); /* locked, nothing written */
    assert_int_equal(map_store_live(f.map), opens);
    ASSERT_RC(tg_set_at(mem, T0, "k", 1, &q, fresh), TG_OK);
    tg_result rcs, rm;
    ASSERT_RC(tg_hit_at(f.lim, before, "k", 1, &q, 1, &rcs), TG_OK);
    ASSERT_RC(tg_hit_at(mem, before, "k", 1, &q, 1, &rm), TG_OK);
    assert_true(rcs.allowed);
    assert_int_equal(rcs.allowed, rm.allowed);
    assert_int_equal(rcs.remaining, rm.remaining);
    assert_int_equal(rcs.retry_after_ms, rm.retry_after_ms);
    assert_int_equal(rcs.reset_after_ms, rm.reset_after_ms);
    /* in a policy of two rules (both keys locked, on the map directly:
     * rec holds one lock at a time): a key set fresh, then taken 5 s
     * earlier, is allowed on both stores */
    tg_custom_store cs2;
    map_store_callbacks(f.map, &cs2);
    tg_config_init(&cfg);
    cfg.algorithm = (tg_algorithm)a;
    cfg.clock = sim_read;
    cfg.clock_ctx = &f.clock;
    cfg.custom_store = &cs2;
    tg_limiter *pol;
    assert_int_equal(tg_limiter_new(&pol, &cfg), TG_OK);
    ASSERT_RC(tg_set_at(pol, T0, "p", 1, &q, fresh), TG_OK);
    ASSERT_RC(tg_set_at(mem, T0, "p", 1, &q, fresh), TG_OK);
    assert_int_equal(map_store_live(f.map), 1 + opens); /* "k" (and "p") */
    tg_rule rules[2] = {
        {.lim = pol, .key = "p", .key_len = 1, .q = &q, .cost = 1},
        {.lim = pol, .key = "z", .key_len = 1, .q = &q, .cost = 1}};
    tg_rules_result out;
    ASSERT_RC(tg_hit_rules_at(before, rules, 2, 0, &out), TG_OK);
    tg_result pm;
    ASSERT_RC(tg_hit_at(mem, before, "p", 1, &q, 1, &pm), TG_OK);
    assert_true(out.r.allowed);
    assert_int_equal(rules[0].result.remaining, pm.remaining);
    assert_int_equal(rules[0].result.reset_after_ms, pm.reset_after_ms);
    tg_limiter_destroy(pol);
    tg_limiter_destroy(mem);
    fx_close(&f);
  }
}

static void clean_and_counts(void **state) {
  (void)state;
  fx f;
  fx_open(&f, TG_FIXED_WINDOW, TG_POLICY_FAIL_OPEN, 0);
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
  hit(&f, "a", &q, 1, TG_OK);
  hit(&f, "b", &q, 1, TG_OK);
  size_t removed = 123;
  ASSERT_RC(tg_clean(f.lim, &removed), TG_ENOTSUP);
  assert_int_equal(removed, 0);
  removed = 123;
  ASSERT_RC(tg_clean_at(f.lim, T0, &removed), TG_ENOTSUP);
  assert_int_equal(removed, 0);
  ASSERT_RC(tg_clean(f.lim, NULL), TG_ENOTSUP);
  assert_int_equal(tg_key_count(f.lim), 0);
  assert_int_equal(tg_store_bytes(f.lim), 0);
  assert_int_equal(map_store_live(f.map), 2);
  fx_close(&f);

  /* a custom store needs all three callbacks */
  tg_custom_store cs = {rec_lock_and_get, rec_set_and_unlock, NULL, NULL};
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.custom_store = &cs;
  tg_limiter *lim;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layout_fixed_window),
      cmocka_unit_test(layout_per_key_window),
      cmocka_unit_test(layout_sliding_window),
      cmocka_unit_test(layout_sliding_merge_at_cap),
      cmocka_unit_test(layout_sliding_n_little_endian),
      cmocka_unit_test(layout_token_bucket),
      cmocka_unit_test(layout_leaky_bucket),
      cmocka_unit_test(protocol_reads_unlock),
      cmocka_unit_test(protocol_denied),
      cmocka_unit_test(protocol_writes_and_refusals),
      cmocka_unit_test(protocol_step_errors_unlock),
      cmocka_unit_test(protocol_ttl_rules),
      cmocka_unit_test(failure_busy),
      cmocka_unit_test(failure_error),
      cmocka_unit_test(failure_set_and_unlock),
      cmocka_unit_test(failure_real_busy),
      cmocka_unit_test(failure_in_shadow_policy),
      cmocka_unit_test(failure_bounded_wait),
      cmocka_unit_test(corrupt_state),
      cmocka_unit_test(corrupt_sliding_log),
      cmocka_unit_test(corrupt_random_garbage),
      cmocka_unit_test_setup_teardown(corrupt_out_of_range_bucket,
                                      fx_setup_token, fx_teardown),
      cmocka_unit_test_setup_teardown(corrupt_out_of_range_sliding_log,
                                      fx_setup_sliding, fx_teardown),
      cmocka_unit_test(reset_writes_fresh_state),
      cmocka_unit_test(set_fresh_creates_nothing),
      cmocka_unit_test(clean_and_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
