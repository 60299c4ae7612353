/* SPDX-License-Identifier: MIT */
/*
 * test_fixed_window.c - acceptance tests for TG_FIXED_WINDOW, written from
 * docs/DESIGN.md section 3 and include/tollgate.h: windows aligned to the Unix
 * epoch (window = floor(now_ms / period)), a call adds its cost and is allowed
 * while count <= limit, denied calls are still counted, retry_after_ms = end of
 * window - now (rounded up, in [1, period]), TG_NEVER when cost > limit.
 */
#include "accept_helpers.h"

#include <stdio.h>

/* A round time (ms since the epoch, a multiple of 60 000): window starts. */
#define T0 MS(UINT64_C(1700000040000))

static const tg_quota q10 = {.limit = 10, .period_ms = 1000, .burst = 0};

static int setup(void **state) { return new_limiter_(state, TG_FIXED_WINDOW); }

static void first_hit(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0 + MS(250), "k", &q10, 1, 1, 1, 9, 0, 750);
  EXPECT_GET(lim, T0 + MS(250), "k", &q10, 1);
  EXPECT_EXPIRES(lim, T0 + MS(250), "k", &q10, T0 / 1000 + 1000);
}

static void within_limit_then_denied(void **state) {
  tg_limiter *lim = *state;
  for (uint64_t i = 0; i < 10; i++)
    EXPECT_HIT(lim, T0 + MS(10 * i), "k", &q10, 1, 1, i + 1, 9 - i, 0,
               1000 - 10 * i);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q10, 1, 0, 11, 0, 900, 900);
  EXPECT_HIT(lim, T0 + MS(999), "k", &q10, 1, 0, 12, 0, 1, 1);
  /* the next window is fresh */
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q10, 1, 1, 1, 9, 0, 1000);
}

/* Hammer's example: limit 10, costs 3,1,1,4,1 then 2. */
static void hammer_costs(void **state) {
  tg_limiter *lim = *state;
  const uint64_t costs[] = {3, 1, 1, 4, 1};
  const uint64_t counts[] = {3, 4, 5, 9, 10};
  for (size_t i = 0; i < 5; i++)
    EXPECT_HIT(lim, T0 + MS(100 + i), "hammer", &q10, costs[i], 1, counts[i],
               10 - counts[i], 0, 900 - i);
  EXPECT_HIT(lim, T0 + MS(200), "hammer", &q10, 2, 0, 12, 0, 800, 800);
  EXPECT_GET(lim, T0 + MS(200), "hammer", &q10, 12);
}

/* Mixed allow/deny: a denied call is counted, so a smaller call after it is
 * denied too (Hammer and the Redis INCR pattern behave the same way). */
static void denied_calls_are_counted(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 5, .period_ms = 1000};
  EXPECT_HIT(lim, T0, "k", &q, 3, 1, 3, 2, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(1), "k", &q, 3, 0, 6, 0, 999, 999);
  EXPECT_HIT(lim, T0 + MS(2), "k", &q, 1, 0, 7, 0, 998, 998);
  EXPECT_GET(lim, T0 + MS(3), "k", &q, 7);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q, 2, 1, 2, 3, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(1001), "k", &q, 3, 1, 5, 0, 0, 999);
  EXPECT_HIT(lim, T0 + MS(1002), "k", &q, 1, 0, 6, 0, 998, 998);
}

static void windows_are_aligned_to_the_epoch(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q7 = {.limit = 1, .period_ms = 7};
  /* windows of 7 ms: [7, 14), [14, 21) from the epoch, whatever the first hit
   */
  EXPECT_HIT(lim, 13998, "a", &q7, 1, 1, 1, 0, 0, 1);
  EXPECT_HIT(lim, 13999, "a", &q7, 1, 0, 2, 0, 1, 1);
  EXPECT_HIT(lim, 14000, "a", &q7, 1, 1, 1, 0, 0, 7);
  EXPECT_EXPIRES(lim, 14000, "a", &q7, 21);

  /* a minute window at a realistic time: window 28333334 = [1700000040000,
   * 1700000100000) ms */
  const tg_quota qmin = {.limit = 1, .period_ms = 60000};
  uint64_t t = T0 + MS(12345) + 456; /* 1700000052345.456 ms */
  EXPECT_HIT(lim, t, "m", &qmin, 1, 1, 1, 0, 0, 47655);
  EXPECT_HIT(lim, t, "m", &qmin, 1, 0, 2, 0, 47655, 47655);
  EXPECT_EXPIRES(lim, t, "m", &qmin, UINT64_C(1700000100000));
  EXPECT_HIT(lim, MS(UINT64_C(1700000100000)) - 1, "m", &qmin, 1, 0, 3, 0, 1,
             1);
  EXPECT_HIT(lim, MS(UINT64_C(1700000100000)), "m", &qmin, 1, 1, 1, 0, 0,
             60000);
}

/* get returns 0 as soon as the window index changes, and expires_at too. */
static void get_is_zero_once_the_window_changes(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0 + MS(999) + 999, "k", &q10, 4);
  EXPECT_GET(lim, T0 + MS(999) + 999, "k", &q10, 4);
  EXPECT_EXPIRES(lim, T0 + MS(999) + 999, "k", &q10, T0 / 1000 + 1000);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q10, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q10, 0);
  EXPECT_GET(lim, T0 + MS(5000), "k", &q10, 0);
}

/* retry_after_ms = end - now rounded up, always within [1, period]. */
static void retry_after_is_end_minus_now(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 1);
  EXPECT_HIT(lim, T0, "k", &q, 1, 0, 2, 0, 1000, 1000);
  EXPECT_HIT(lim, T0 + 1, "k", &q, 1, 0, 3, 0, 1000, 1000);
  EXPECT_HIT(lim, T0 + 1000, "k", &q, 1, 0, 4, 0, 999, 999);
  EXPECT_HIT(lim, T0 + MS(500) + 500, "k", &q, 1, 0, 5, 0, 500, 500);
  EXPECT_HIT(lim, T0 + MS(999) + 1, "k", &q, 1, 0, 6, 0, 1, 1);
  EXPECT_HIT(lim, T0 + MS(999) + 999, "k", &q, 1, 0, 7, 0, 1, 1);
}

/* Waiting exactly retry_after_ms admits the same call, 1 ms less does not:
 * at many phases, including sub-millisecond ones, and with mixed costs. */
static void retry_after_is_exact_at_every_phase(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 3, .period_ms = 1000};
  const uint64_t phases[] = {
      0,           1,         999,           1000,
      1001,        MS(1) + 1, MS(499) + 500, MS(500),
      MS(998) + 7, MS(999),   MS(999) + 1,   MS(999) + 999};
  for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
    char key[32];
    snprintf(key, sizeof key, "phase-%zu", i);
    uint64_t t = T0 + MS(7000) + phases[i];
    ALLOW(lim, t, key, &q, 3);
    DENY_RETRY_EXACT(lim, t, key, &q, 1);
    /* mixed costs: 2 then 2 (denied) two windows later */
    uint64_t t2 = t + MS(2000);
    ALLOW(lim, t2, key, &q, 2);
    DENY_RETRY_EXACT(lim, t2, key, &q, 2);
  }
  /* the same with a period that is not a divisor of a second */
  const tg_quota q7 = {.limit = 2, .period_ms = 7};
  for (uint64_t p = 0; p < 7000; p += 333) {
    char key[32];
    snprintf(key, sizeof key, "p7-%" PRIu64, p);
    ALLOW(lim, T0 + p, key, &q7, 2);
    DENY_RETRY_EXACT(lim, T0 + p, key, &q7, 1);
  }
}

static void custom_costs(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 100, .period_ms = 60000};
  EXPECT_HIT(lim, T0, "k", &q, 40, 1, 40, 60, 0, 60000);
  EXPECT_HIT(lim, T0 + MS(1), "k", &q, 60, 1, 100, 0, 0, 59999);
  EXPECT_HIT(lim, T0 + MS(2), "k", &q, 1, 0, 101, 0, 59998, 59998);
  /* exactly the limit in one call on a fresh window */
  EXPECT_HIT(lim, T0, "k2", &q, 100, 1, 100, 0, 0, 60000);
}

/* cost > limit can never be allowed: TG_NEVER, and it is still counted. */
static void cost_above_limit_is_never(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 5, .period_ms = 1000};
  EXPECT_HIT(lim, T0 + MS(100), "k", &q, 6, 0, 6, 0, TG_NEVER, 900);
  EXPECT_GET(lim, T0 + MS(100), "k", &q, 6);
  EXPECT_EXPIRES(lim, T0 + MS(100), "k", &q, T0 / 1000 + 1000);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q, 1, 0, 7, 0, 800, 800);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q, 6, 0, 6, 0, TG_NEVER, 1000);
  EXPECT_HIT(lim, T0 + MS(2000), "k", &q, UINT64_C(1) << 40, 0,
             UINT64_C(1) << 40, 0, TG_NEVER, 1000);
  EXPECT_HIT(lim, T0 + MS(3000), "k", &q, 5, 1, 5, 0, 0, 1000);
}

/* cost 0 reports without consuming; allowed unless already over the limit. */
static void cost_zero_is_a_peek(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0 + MS(100), "k", &q10, 0, 1, 0, 10, 0, 0);
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 0);
  EXPECT_EXPIRES(lim, T0 + MS(100), "k", &q10, 0);
  ASSERT_KEYS(lim, 0);

  ALLOW(lim, T0 + MS(100), "k", &q10, 4);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q10, 0, 1, 4, 6, 0, 800);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q10, 0, 1, 4, 6, 0, 800);
  EXPECT_GET(lim, T0 + MS(200), "k", &q10, 4);
  ALLOW(lim, T0 + MS(200), "k", &q10, 6);
  EXPECT_HIT(lim, T0 + MS(300), "k", &q10, 0, 1, 10, 0, 0, 700);
  DENY(lim, T0 + MS(300), "k", &q10, 1);
  EXPECT_HIT(lim, T0 + MS(400), "k", &q10, 0, 0, 11, 0, 600, 600);
  EXPECT_GET(lim, T0 + MS(400), "k", &q10, 11);
  /* a peek in the next window sees it fresh */
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q10, 0, 1, 0, 10, 0, 0);
}

static void get_and_set(void **state) {
  tg_limiter *lim = *state;
  EXPECT_GET(lim, T0, "k", &q10, 0);
  SET(lim, T0 + MS(100), "k", &q10, 7);
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 7);
  EXPECT_EXPIRES(lim, T0 + MS(100), "k", &q10, T0 / 1000 + 1000);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q10, 3, 1, 10, 0, 0, 800);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q10, 1, 0, 11, 0, 800, 800);
  SET(lim, T0 + MS(300), "k", &q10, 2);
  EXPECT_HIT(lim, T0 + MS(300), "k", &q10, 1, 1, 3, 7, 0, 700);
  /* set above the limit is allowed for windows: the key is then over it */
  SET(lim, T0 + MS(400), "k", &q10, 20);
  EXPECT_HIT(lim, T0 + MS(400), "k", &q10, 0, 0, 20, 0, 600, 600);
  /* set(0): the key has no count in its window */
  SET(lim, T0 + MS(500), "k", &q10, 0);
  EXPECT_GET(lim, T0 + MS(500), "k", &q10, 0);
  EXPECT_EXPIRES(lim, T0 + MS(500), "k", &q10, 0);
  /* set only concerns the current window */
  SET(lim, T0 + MS(600), "k", &q10, 9);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q10, 0);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q10, 1, 1, 1, 9, 0, 1000);
}

static void inc_adds_without_checking(void **state) {
  tg_limiter *lim = *state;
  EXPECT_INC(lim, T0 + MS(10), "k", &q10, 4, 4);
  EXPECT_INC(lim, T0 + MS(20), "k", &q10, 10, 14);
  EXPECT_GET(lim, T0 + MS(30), "k", &q10, 14);
  EXPECT_EXPIRES(lim, T0 + MS(30), "k", &q10, T0 / 1000 + 1000);
  EXPECT_HIT(lim, T0 + MS(40), "k", &q10, 1, 0, 15, 0, 960, 960);
  /* the count_out pointer may be NULL */
  ASSERT_RC(tg_inc_at(lim, T0 + MS(50), "k", 1, &q10, 1, NULL), 0);
  EXPECT_GET(lim, T0 + MS(50), "k", &q10, 16);
  /* a new window starts from 0 */
  EXPECT_INC(lim, T0 + MS(1000), "k", &q10, 1, 1);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q10, 9, 1, 10, 0, 0, 1000);
}

static void inc_overflow_is_an_error(void **state) {
  tg_limiter *lim = *state;
  uint64_t v = 0;
  SET(lim, T0, "k", &q10, UINT64_MAX - 1);
  EXPECT_INC(lim, T0, "k", &q10, 1, UINT64_MAX);
  ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q10, 1, &v), TG_EOVERFLOW);
  EXPECT_GET(lim, T0, "k", &q10, UINT64_MAX);
  SET(lim, T0, "k", &q10, 5);
  ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q10, UINT64_MAX, &v), TG_EOVERFLOW);
  EXPECT_GET(lim, T0, "k", &q10, 5);
}

static void expires_at(void **state) {
  tg_limiter *lim = *state;
  EXPECT_EXPIRES(lim, T0, "k", &q10, 0);
  ALLOW(lim, T0 + MS(250) + 1, "k", &q10, 1);
  EXPECT_EXPIRES(lim, T0 + MS(250) + 1, "k", &q10, T0 / 1000 + 1000);
  EXPECT_EXPIRES(lim, T0 + MS(999) + 999, "k", &q10, T0 / 1000 + 1000);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q10, 0);
}

static void reset_deletes_state(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 2, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 2);
  ALLOW(lim, T0, "other", &q, 1);
  DENY(lim, T0, "k", &q, 1);
  size_t keys = tg_key_count(lim);
  assert_true(on_redis() || keys >= 2);
  RESET(lim, "k");
  ASSERT_KEYS(lim, keys); /* fresh, and kept until reclaimed (tg_reset) */
  EXPECT_GET(lim, T0 + MS(1), "k", &q, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1), "k", &q, 0);
  EXPECT_HIT(lim, T0 + MS(1), "k", &q, 1, 1, 1, 1, 0, 999);
  /* the other key is untouched; resetting an unknown key is not an error */
  EXPECT_GET(lim, T0 + MS(1), "other", &q, 1);
  RESET(lim, "never-seen");
}

static void keys_are_independent(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 1000};
  ALLOW(lim, T0, "a", &q, 1);
  DENY(lim, T0, "a", &q, 1);
  ALLOW(lim, T0, "b", &q, 1);
  ALLOW(lim, T0, "ab", &q, 1);
  EXPECT_GET(lim, T0, "a", &q, 2);
  EXPECT_GET(lim, T0, "b", &q, 1);
}

/* A quota whose period shrank under a key: the stored window (2 s) stays
 * the call's (300 ms) only while the call's own window ends no later, so a
 * refusal's wait ends at the start of the call's period that holds the
 * stored end (T0 + 1800 ms), not at that end (T0 + 2000): the wait quoted
 * was 200 ms too long, and a deny cache that trusted it refused calls the
 * store would allow. Probed with cost 0, which counts nothing. */
static void retry_exact_after_period_change(void **state) {
  tg_limiter *lim = *state;
  const tg_quota longer = {.limit = 5, .period_ms = 2000};
  const tg_quota shorter = {.limit = 2, .period_ms = 300};
  EXPECT_HIT(lim, T0, "k", &longer, 4, 1, 4, 1, 0, 2000);
  EXPECT_HIT(lim, T0 + MS(1220), "k", &shorter, 0, 0, 4, 0, 580, 780);
  EXPECT_HIT(lim, T0 + MS(1799), "k", &shorter, 0, 0, 4, 0, 1, 201);
  EXPECT_HIT(lim, T0 + MS(1800), "k", &shorter, 0, 1, 0, 2, 0, ANY);
  /* periods that agree: the end, as before */
  EXPECT_HIT(lim, T0 + MS(1900), "k", &shorter, 2, 1, 2, 0, 0, 200);
  EXPECT_HIT(lim, T0 + MS(1950), "k", &shorter, 1, 0, 3, 0, 150, 150);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, destroy_limiter)
  const struct CMUnitTest tests[] = {
      T(first_hit),
      T(within_limit_then_denied),
      T(hammer_costs),
      T(denied_calls_are_counted),
      T(windows_are_aligned_to_the_epoch),
      T(get_is_zero_once_the_window_changes),
      T(retry_after_is_end_minus_now),
      T(retry_after_is_exact_at_every_phase),
      T(retry_exact_after_period_change),
      T(custom_costs),
      T(cost_above_limit_is_never),
      T(cost_zero_is_a_peek),
      T(get_and_set),
      T(inc_adds_without_checking),
      T(inc_overflow_is_an_error),
      T(expires_at),
      T(reset_deletes_state),
      T(keys_are_independent),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
