/* SPDX-License-Identifier: MIT */
/*
 * test_per_key_window.c - acceptance tests for TG_FIXED_WINDOW_PER_KEY,
 * written from docs/DESIGN.md section 3 and include/tollgate.h: a window opens
 * at the key's first hit and ends at that moment + period; it is active while
 * end > now (strict); hits inside it do not move the end; the first hit after
 * it opens a fresh window at that moment; denied calls are counted; set
 * re-anchors the window to now; get/expires_at are 0 once it has ended.
 */
#include "accept_helpers.h"

#include <stdio.h>

/* An arbitrary start time (ms since the epoch): nothing is epoch-aligned. */
#define T0 MS(UINT64_C(1700000000777))
#define T0_MS (T0 / 1000)

static const tg_quota q5 = {.limit = 5, .period_ms = 1000, .burst = 0};

static int setup(void **state) {
  return new_limiter_(state, TG_FIXED_WINDOW_PER_KEY);
}

static void first_hit(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0 + MS(250), "k", &q5, 1, 1, 1, 4, 0, 1000);
  EXPECT_GET(lim, T0 + MS(250), "k", &q5, 1);
  EXPECT_EXPIRES(lim, T0 + MS(250), "k", &q5, T0_MS + 1250);
}

/* The scenario: limit 1 per 2000 ms, two users. */
static void bob_and_alice(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 2000};
  EXPECT_HIT(lim, T0 + MS(0), "Bob", &q, 1, 1, 1, 0, 0, 2000);
  EXPECT_HIT(lim, T0 + MS(999), "Bob", &q, 1, 0, 2, 0, 1001, 1001);
  EXPECT_HIT(lim, T0 + MS(1000), "Bob", &q, 1, 0, 3, 0, 1000, 1000);
  EXPECT_HIT(lim, T0 + MS(1000), "Alice", &q, 1, 1, 1, 0, 0, 2000);
  EXPECT_HIT(lim, T0 + MS(1001), "Alice", &q, 1, 0, 2, 0, 1999, 1999);
  EXPECT_HIT(lim, T0 + MS(2001), "Alice", &q, 1, 0, 3, 0, 999, 999);
  EXPECT_HIT(lim, T0 + MS(2001), "Bob", &q, 1, 1, 1, 0, 0, 2000);
  EXPECT_HIT(lim, T0 + MS(2001), "Bob", &q, 1, 0, 2, 0, 2000, 2000);
  EXPECT_HIT(lim, T0 + MS(3002), "Alice", &q, 1, 1, 1, 0, 0, 2000);
  EXPECT_HIT(lim, T0 + MS(3003), "Alice", &q, 1, 0, 2, 0, 1999, 1999);
}

static void within_limit_then_denied(void **state) {
  tg_limiter *lim = *state;
  for (uint64_t i = 0; i < 5; i++)
    EXPECT_HIT(lim, T0 + MS(100 * i), "k", &q5, 1, 1, i + 1, 4 - i, 0,
               1000 - 100 * i);
  EXPECT_HIT(lim, T0 + MS(500), "k", &q5, 1, 0, 6, 0, 500, 500);
  /* denied calls are counted too */
  EXPECT_GET(lim, T0 + MS(500), "k", &q5, 6);
  EXPECT_HIT(lim, T0 + MS(999) + 999, "k", &q5, 1, 0, 7, 0, 1, 1);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q5, 1, 1, 1, 4, 0, 1000);
}

static void mixed_costs(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  const uint64_t costs[] = {3, 1, 1, 4, 1};
  const uint64_t counts[] = {3, 4, 5, 9, 10};
  for (size_t i = 0; i < 5; i++)
    EXPECT_HIT(lim, T0 + MS(i), "hammer", &q, costs[i], 1, counts[i],
               10 - counts[i], 0, 1000 - i);
  EXPECT_HIT(lim, T0 + MS(10), "hammer", &q, 2, 0, 12, 0, 990, 990);
  /* a smaller call is denied as well: the denied cost was counted */
  EXPECT_HIT(lim, T0 + MS(11), "mixed", &q, 8, 1, 8, 2, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(12), "mixed", &q, 3, 0, 11, 0, 999, 999);
  EXPECT_HIT(lim, T0 + MS(13), "mixed", &q, 1, 0, 12, 0, 998, 998);
}

/* Hits inside an active window do not move its end. */
static void hits_inside_do_not_move_the_end(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q5, 1);
  ALLOW(lim, T0 + MS(100), "k", &q5, 1);
  EXPECT_EXPIRES(lim, T0 + MS(100), "k", &q5, T0_MS + 1000);
  ALLOW(lim, T0 + MS(999), "k", &q5, 1);
  EXPECT_EXPIRES(lim, T0 + MS(999), "k", &q5, T0_MS + 1000);
  DENY(lim, T0 + MS(999), "k", &q5, 5);
  EXPECT_EXPIRES(lim, T0 + MS(999), "k", &q5, T0_MS + 1000);
  EXPECT_GET(lim, T0 + MS(999) + 999, "k", &q5, 8);
  /* active while end > now: at now == end the window is over */
  EXPECT_GET(lim, T0 + MS(1000), "k", &q5, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q5, 0);
  /* the next hit opens a fresh window at that moment */
  EXPECT_HIT(lim, T0 + MS(1700), "k", &q5, 1, 1, 1, 4, 0, 1000);
  EXPECT_EXPIRES(lim, T0 + MS(1700), "k", &q5, T0_MS + 2700);
}

/* Two keys hit 50 ms apart have windows that end 50 ms apart. */
static void keys_hit_50ms_apart_end_50ms_apart(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 2, .period_ms = 60000};
  ALLOW(lim, T0, "a", &q, 1);
  ALLOW(lim, T0 + MS(50), "b", &q, 1);
  EXPECT_EXPIRES(lim, T0 + MS(50), "a", &q, T0_MS + 60000);
  EXPECT_EXPIRES(lim, T0 + MS(50), "b", &q, T0_MS + 60050);
  ALLOW(lim, T0 + MS(30000), "a", &q, 1);
  ALLOW(lim, T0 + MS(30000), "b", &q, 1);
  EXPECT_HIT(lim, T0 + MS(59990), "a", &q, 1, 0, 3, 0, 10, 10);
  EXPECT_HIT(lim, T0 + MS(59990), "b", &q, 1, 0, 3, 0, 60, 60);
  EXPECT_HIT(lim, T0 + MS(60000), "a", &q, 1, 1, 1, 1, 0, 60000);
  EXPECT_HIT(lim, T0 + MS(60000), "b", &q, 1, 0, 4, 0, 50, 50);
  EXPECT_HIT(lim, T0 + MS(60050), "b", &q, 1, 1, 1, 1, 0, 60000);
}

/* The window is anchored at the first hit's microsecond, not its ms. */
static void sub_millisecond_start(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 1000};
  uint64_t start = T0 + MS(100) + 300; /* ends at T0 + 1100.3 ms */
  EXPECT_HIT(lim, start, "k", &q, 1, 1, 1, 0, 0, 1000);
  EXPECT_EXPIRES(lim, start, "k", &q, T0_MS + 1101);
  EXPECT_HIT(lim, T0 + MS(500), "k", &q, 1, 0, 2, 0, 601, 601);
  EXPECT_HIT(lim, T0 + MS(1100), "k", &q, 1, 0, 3, 0, 1, 1);
  EXPECT_GET(lim, T0 + MS(1100) + 299, "k", &q, 3);
  EXPECT_GET(lim, T0 + MS(1100) + 300, "k", &q, 0);
  EXPECT_HIT(lim, T0 + MS(1100) + 300, "k", &q, 1, 1, 1, 0, 0, 1000);
}

/* Waiting exactly retry_after_ms admits the same call, 1 ms less does not. */
static void retry_after_is_exact_at_every_phase(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 3, .period_ms = 1000};
  const uint64_t starts[] = {0, 1, 499, 500, 999, MS(1) + 1, MS(333) + 333};
  const uint64_t waits[] = {
      0,           1,       999,     1000,        MS(1),
      MS(500) + 1, MS(998), MS(999), MS(999) + 1, MS(999) + 999};
  unsigned n = 0;
  for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
    for (size_t j = 0; j < sizeof waits / sizeof waits[0]; j++) {
      char key[32];
      snprintf(key, sizeof key, "k%u", n++);
      uint64_t t = T0 + starts[i];
      ALLOW(lim, t, key, &q, 2);
      DENY_RETRY_EXACT(lim, t + waits[j], key, &q, 2);
    }
  }
  /* a longer, odd period */
  const tg_quota q7 = {.limit = 1, .period_ms = 7777};
  for (uint64_t s = 0; s < 5; s++) {
    char key[32];
    snprintf(key, sizeof key, "odd%" PRIu64, s);
    ALLOW(lim, T0 + s * 1234567, key, &q7, 1);
    DENY_RETRY_EXACT(lim, T0 + s * 1234567 + MS(4000) + s, key, &q7, 1);
  }
}

/* cost > limit: TG_NEVER; it is counted and opens a window of one period. */
static void cost_above_limit_is_never(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q5, 6, 0, 6, 0, TG_NEVER, 1000);
  EXPECT_GET(lim, T0 + MS(1), "k", &q5, 6);
  EXPECT_EXPIRES(lim, T0 + MS(1), "k", &q5, T0_MS + 1000);
  EXPECT_HIT(lim, T0 + MS(400), "k", &q5, 1, 0, 7, 0, 600, 600);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q5, 5, 1, 5, 0, 0, 1000);
  /* inside an active window as well */
  EXPECT_HIT(lim, T0 + MS(1500), "k", &q5, 100, 0, 105, 0, TG_NEVER, 500);
  EXPECT_EXPIRES(lim, T0 + MS(1500), "k", &q5, T0_MS + 2000);
}

/* cost 0 reports without writing: it never opens a window. */
static void cost_zero_is_a_peek(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q5, 0, 1, 0, 5, 0, 0);
  ASSERT_KEYS(lim, 0);
  EXPECT_EXPIRES(lim, T0, "k", &q5, 0);
  /* the window opens at the first real hit, not at the peek */
  EXPECT_HIT(lim, T0 + MS(500), "k", &q5, 2, 1, 2, 3, 0, 1000);
  EXPECT_EXPIRES(lim, T0 + MS(500), "k", &q5, T0_MS + 1500);
  EXPECT_HIT(lim, T0 + MS(600), "k", &q5, 0, 1, 2, 3, 0, 900);
  EXPECT_GET(lim, T0 + MS(600), "k", &q5, 2);
  ALLOW(lim, T0 + MS(700), "k", &q5, 3);
  EXPECT_HIT(lim, T0 + MS(800), "k", &q5, 0, 1, 5, 0, 0, 700);
  DENY(lim, T0 + MS(800), "k", &q5, 1);
  EXPECT_HIT(lim, T0 + MS(900), "k", &q5, 0, 0, 6, 0, 600, 600);
  EXPECT_GET(lim, T0 + MS(900), "k", &q5, 6);
  /* after the end a peek sees a fresh key and reopens nothing */
  EXPECT_HIT(lim, T0 + MS(1500), "k", &q5, 0, 1, 0, 5, 0, 0);
  EXPECT_HIT(lim, T0 + MS(1600), "k", &q5, 0, 1, 0, 5, 0, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1600), "k", &q5, 0);
  EXPECT_HIT(lim, T0 + MS(1700), "k", &q5, 1, 1, 1, 4, 0, 1000);
}

/* set re-anchors the window to [now, now + period) with that count. */
static void set_reanchors_to_now(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 1);
  SET(lim, T0 + MS(600), "k", &q, 5);
  EXPECT_GET(lim, T0 + MS(600), "k", &q, 5);
  EXPECT_EXPIRES(lim, T0 + MS(600), "k", &q, T0_MS + 1600);
  EXPECT_HIT(lim, T0 + MS(1200), "k", &q, 1, 1, 6, 4, 0, 400);
  EXPECT_GET(lim, T0 + MS(1599), "k", &q, 6);
  EXPECT_GET(lim, T0 + MS(1600), "k", &q, 0);
  /* set on an unknown key opens a window at now */
  SET(lim, T0 + MS(100) + 1, "new", &q, 10);
  EXPECT_EXPIRES(lim, T0 + MS(100) + 1, "new", &q, T0_MS + 1101);
  EXPECT_HIT(lim, T0 + MS(200), "new", &q, 1, 0, 11, 0, 901, 901);
  /* a count above the limit is accepted for windows */
  SET(lim, T0 + MS(3000), "k", &q, 50);
  EXPECT_HIT(lim, T0 + MS(3000), "k", &q, 0, 0, 50, 0, 1000, 1000);
}

static void inc_adds_without_checking(void **state) {
  tg_limiter *lim = *state;
  /* inc on a fresh key opens a window at now */
  EXPECT_INC(lim, T0 + MS(10), "k", &q5, 4, 4);
  EXPECT_EXPIRES(lim, T0 + MS(10), "k", &q5, T0_MS + 1010);
  /* inside the window: no check, no move of the end */
  EXPECT_INC(lim, T0 + MS(500), "k", &q5, 10, 14);
  EXPECT_EXPIRES(lim, T0 + MS(500), "k", &q5, T0_MS + 1010);
  EXPECT_HIT(lim, T0 + MS(510), "k", &q5, 1, 0, 15, 0, 500, 500);
  /* an ended window is reopened at now */
  EXPECT_INC(lim, T0 + MS(2000), "k", &q5, 2, 2);
  EXPECT_EXPIRES(lim, T0 + MS(2000), "k", &q5, T0_MS + 3000);
  EXPECT_HIT(lim, T0 + MS(2000), "k", &q5, 3, 1, 5, 0, 0, 1000);
}

/* inc of 0 adds nothing: like a peek, it must not open a window. */
static void inc_of_zero_writes_nothing(void **state) {
  tg_limiter *lim = *state;
  EXPECT_INC(lim, T0, "k", &q5, 0, 0);
  EXPECT_EXPIRES(lim, T0, "k", &q5, 0);
  ASSERT_KEYS(lim, 0);
  ALLOW(lim, T0 + MS(300), "k", &q5, 2);
  EXPECT_INC(lim, T0 + MS(400), "k", &q5, 0, 2);
  EXPECT_EXPIRES(lim, T0 + MS(400), "k", &q5, T0_MS + 1300);
  EXPECT_INC(lim, T0 + MS(1300), "k", &q5, 0, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1300), "k", &q5, 0);
}

static void inc_overflow_is_an_error(void **state) {
  tg_limiter *lim = *state;
  uint64_t v = 0;
  SET(lim, T0, "k", &q5, UINT64_MAX);
  ASSERT_RC(tg_inc_at(lim, T0 + MS(1), "k", 1, &q5, 1, &v), TG_EOVERFLOW);
  EXPECT_GET(lim, T0 + MS(1), "k", &q5, UINT64_MAX);
  EXPECT_EXPIRES(lim, T0 + MS(1), "k", &q5, T0_MS + 1000);
}

static void reset_deletes_state(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q5, 5);
  ALLOW(lim, T0, "other", &q5, 1);
  DENY(lim, T0 + MS(10), "k", &q5, 1);
  size_t keys = tg_key_count(lim);
  RESET(lim, "k");
  ASSERT_KEYS(lim, keys); /* fresh, and kept until reclaimed (tg_reset) */
  EXPECT_GET(lim, T0 + MS(20), "k", &q5, 0);
  EXPECT_EXPIRES(lim, T0 + MS(20), "k", &q5, 0);
  /* the next hit opens a new window at its own time */
  EXPECT_HIT(lim, T0 + MS(30), "k", &q5, 1, 1, 1, 4, 0, 1000);
  EXPECT_EXPIRES(lim, T0 + MS(30), "k", &q5, T0_MS + 1030);
  EXPECT_GET(lim, T0 + MS(30), "other", &q5, 1);
  RESET(lim, "never-seen");
}

/* A call earlier than the window's start is inside it (elapsed clamped at
 * 0): it is counted and does not move the window. */
static void time_going_backwards_does_not_move_the_window(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 2, .period_ms = 1000};
  ALLOW(lim, T0 + MS(1000), "k", &q, 1);
  EXPECT_HIT(lim, T0 + MS(500), "k", &q, 1, 1, 2, 0, 0, ANY);
  DENY(lim, T0 + MS(600), "k", &q, 1);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q, T0_MS + 2000);
  EXPECT_HIT(lim, T0 + MS(2000), "k", &q, 1, 1, 1, 1, 0, 1000);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, destroy_limiter)
  const struct CMUnitTest tests[] = {
      T(first_hit),
      T(bob_and_alice),
      T(within_limit_then_denied),
      T(mixed_costs),
      T(hits_inside_do_not_move_the_end),
      T(keys_hit_50ms_apart_end_50ms_apart),
      T(sub_millisecond_start),
      T(retry_after_is_exact_at_every_phase),
      T(cost_above_limit_is_never),
      T(cost_zero_is_a_peek),
      T(set_reanchors_to_now),
      T(inc_adds_without_checking),
      T(inc_of_zero_writes_nothing),
      T(inc_overflow_is_an_error),
      T(reset_deletes_state),
      T(time_going_backwards_does_not_move_the_window),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
