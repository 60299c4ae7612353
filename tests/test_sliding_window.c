/* SPDX-License-Identifier: MIT */
/*
 * test_sliding_window.c - acceptance tests for TG_SLIDING_WINDOW, written from
 * docs/DESIGN.md section 3 and include/tollgate.h: a log of allowed (time,
 * cost) entries; a call is allowed when the costs of entries younger than
 * period plus its cost <= limit, so no interval of length period admits more
 * than limit; denied calls are not recorded; retry_after_ms is the time until
 * enough old entries expire; memory is capped by sliding_max_entries, whose
 * overflow merges into the newest entry (conservative, never permissive).
 */
#include "accept_helpers.h"

#include <stdio.h>

#define T0 MS(UINT64_C(1700000000777))
#define T0_MS (T0 / 1000)

static const tg_quota q5 = {.limit = 5, .period_ms = 1000, .burst = 0};

static int setup(void **state) {
  return new_limiter_(state, TG_SLIDING_WINDOW);
}

static tg_limiter *new_capped(uint32_t max_entries) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_SLIDING_WINDOW;
  cfg.sliding_max_entries = max_entries;
  tg_redis_config rc;
  config_store(&cfg, &rc);
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  return lim;
}

static void first_hit(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0 + MS(250), "k", &q5, 1, 1, 1, 4, 0, 1000);
  EXPECT_GET(lim, T0 + MS(250), "k", &q5, 1);
  EXPECT_EXPIRES(lim, T0 + MS(250), "k", &q5, T0_MS + 1250);
}

static void within_limit_then_denied(void **state) {
  tg_limiter *lim = *state;
  for (uint64_t i = 0; i < 5; i++)
    EXPECT_HIT(lim, T0 + MS(100 * i), "k", &q5, 1, 1, i + 1, 4 - i, 0, 1000);
  /* full: the oldest entry (t = 0) frees a slot at 1000 */
  EXPECT_HIT(lim, T0 + MS(500), "k", &q5, 1, 0, 5, 0, 500, 900);
  EXPECT_HIT(lim, T0 + MS(999) + 999, "k", &q5, 1, 0, 5, 0, 1, 401);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q5, 1, 1, 5, 0, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q5, 1, 0, 5, 0, 100, 1000);
  EXPECT_GET(lim, T0 + MS(1100), "k", &q5, 4);
}

/* Denied calls are not recorded: a denied storm does not push the key's
 * recovery further away. */
static void denied_calls_are_not_recorded(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 2, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 1);
  ALLOW(lim, T0 + MS(10), "k", &q, 1);
  for (uint64_t t = 20; t < 1000; t += 20) {
    EXPECT_HIT(lim, T0 + MS(t), "k", &q, 1, 0, 2, 0, 1000 - t, 1010 - t);
    EXPECT_GET(lim, T0 + MS(t), "k", &q, 2);
    EXPECT_EXPIRES(lim, T0 + MS(t), "k", &q, T0_MS + 1010);
  }
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q, 1, 1, 2, 0, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(1010), "k", &q, 1, 1, 2, 0, 0, 1000);
}

/* Mixed costs: the wait is until enough of the oldest entries expire. */
static void mixed_costs(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 6, .period_ms = 1000};
  EXPECT_HIT(lim, T0, "k", &q, 2, 1, 2, 4, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(300), "k", &q, 3, 1, 5, 1, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(600), "k", &q, 1, 1, 6, 0, 0, 1000);
  /* cost 3 needs the first two entries gone (at 1300); cost 2 only the
   * first (at 1000); both report the same live sum */
  EXPECT_HIT(lim, T0 + MS(700), "k", &q, 3, 0, 6, 0, 600, 900);
  EXPECT_HIT(lim, T0 + MS(700), "k", &q, 2, 0, 6, 0, 300, 900);
  EXPECT_HIT(lim, T0 + MS(700), "k", &q, 6, 0, 6, 0, 900, 900);
  DENY_RETRY_EXACT(lim, T0 + MS(700), "k", &q, 3); /* allowed at 1300 */
  EXPECT_GET(lim, T0 + MS(1300), "k", &q, 4);
}

/* An entry is live while now - t < period: it stops counting exactly at
 * t + period (microseconds). */
static void entries_expire_exactly_after_one_period(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 1000};
  uint64_t t = T0 + 500; /* sub-millisecond: expires at T0 + 1000.5 ms */
  EXPECT_HIT(lim, t, "k", &q, 1, 1, 1, 0, 0, 1000);
  EXPECT_EXPIRES(lim, t, "k", &q, T0_MS + 1001);
  EXPECT_HIT(lim, T0 + MS(500), "k", &q, 1, 0, 1, 0, 501, 501);
  EXPECT_GET(lim, t + MS(1000) - 1, "k", &q, 1);
  EXPECT_HIT(lim, t + MS(1000) - 1, "k", &q, 1, 0, 1, 0, 1, 1);
  EXPECT_GET(lim, t + MS(1000), "k", &q, 0);
  EXPECT_EXPIRES(lim, t + MS(1000), "k", &q, 0);
  EXPECT_HIT(lim, t + MS(1000), "k", &q, 1, 1, 1, 0, 0, 1000);
}

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
      ALLOW(lim, t, key, &q, 1);
      ALLOW(lim, t + waits[j] / 2, key, &q, 2);
      DENY_RETRY_EXACT(lim, t + waits[j], key, &q, 1);
      DENY_RETRY_EXACT(lim, t + waits[j] + MS(1000), key, &q, 3);
    }
  }
}

/* cost > limit: TG_NEVER, and nothing is recorded. */
static void cost_above_limit_is_never(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "fresh", &q5, 6, 0, 0, 5, TG_NEVER, 0);
  EXPECT_GET(lim, T0, "fresh", &q5, 0);
  EXPECT_EXPIRES(lim, T0, "fresh", &q5, 0);
  ALLOW(lim, T0, "k", &q5, 2);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q5, 6, 0, 2, 3, TG_NEVER, 900);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q5, UINT64_MAX, 0, 2, 3, TG_NEVER, 900);
  EXPECT_GET(lim, T0 + MS(100), "k", &q5, 2);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q5, 3, 1, 5, 0, 0, 1000);
}

static void cost_zero_is_a_peek(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q5, 0, 1, 0, 5, 0, 0);
  ASSERT_KEYS(lim, 0);
  EXPECT_EXPIRES(lim, T0, "k", &q5, 0);
  ALLOW(lim, T0 + MS(100), "k", &q5, 2);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q5, 0, 1, 2, 3, 0, 900);
  EXPECT_EXPIRES(lim, T0 + MS(200), "k", &q5, T0_MS + 1100);
  ALLOW(lim, T0 + MS(300), "k", &q5, 3);
  EXPECT_HIT(lim, T0 + MS(400), "k", &q5, 0, 1, 5, 0, 0, 900);
  EXPECT_GET(lim, T0 + MS(400), "k", &q5, 5);
  /* the peek did not add an entry: everything is gone at 1300 */
  EXPECT_HIT(lim, T0 + MS(1300), "k", &q5, 0, 1, 0, 5, 0, 0);
  EXPECT_HIT(lim, T0 + MS(1300), "k", &q5, 5, 1, 5, 0, 0, 1000);
}

static void get_and_expires_at(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  EXPECT_GET(lim, T0, "k", &q, 0);
  ALLOW(lim, T0, "k", &q, 3);
  ALLOW(lim, T0 + MS(400), "k", &q, 4);
  EXPECT_GET(lim, T0 + MS(999), "k", &q, 7);
  EXPECT_EXPIRES(lim, T0 + MS(999), "k", &q, T0_MS + 1400);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q, 4);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q, T0_MS + 1400);
  EXPECT_GET(lim, T0 + MS(1400), "k", &q, 0);
  EXPECT_EXPIRES(lim, T0 + MS(1400), "k", &q, 0);
}

/* set and inc are not supported by the log; they change nothing. */
static void set_and_inc_are_not_supported(void **state) {
  tg_limiter *lim = *state;
  uint64_t v = 77;
  ALLOW(lim, T0, "k", &q5, 2);
  ASSERT_RC(tg_set_at(lim, T0, "k", 1, &q5, 4), TG_ENOTSUP);
  ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q5, 1, &v), TG_ENOTSUP);
  ASSERT_RC(tg_inc_at(lim, T0, "new", 3, &q5, 1, NULL), TG_ENOTSUP);
  EXPECT_GET(lim, T0, "k", &q5, 2);
  EXPECT_GET(lim, T0, "new", &q5, 0);
  EXPECT_HIT(lim, T0, "k", &q5, 3, 1, 5, 0, 0, 1000);
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
  EXPECT_HIT(lim, T0 + MS(20), "k", &q5, 5, 1, 5, 0, 0, 1000);
  EXPECT_GET(lim, T0 + MS(20), "other", &q5, 1);
  RESET(lim, "never-seen");
}

/* An entry newer than now is not older for it: its age is clamped at 0. */
static void time_going_backwards_keeps_entries_live(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1, .period_ms = 1000};
  ALLOW(lim, T0 + MS(1000), "k", &q, 1);
  DENY(lim, T0, "k", &q, 1);
  EXPECT_GET(lim, T0, "k", &q, 1);
  DENY(lim, T0 + MS(1999), "k", &q, 1);
  ALLOW(lim, T0 + MS(2000), "k", &q, 1);
}

/* A reference model of the contract, checked call by call on a long
 * pseudo-random sequence: decision, count, remaining, retry, reset. */
typedef struct entry {
  uint64_t t_us, cost;
} entry;

static void model_decide(const entry *log, size_t n, const tg_quota *q,
                         uint64_t now, uint64_t cost, tg_result *r) {
  const uint64_t period = MS(q->period_ms);
  uint64_t sum = 0, newest = 0;
  int any = 0;
  for (size_t i = 0; i < n; i++)
    if (now - log[i].t_us < period) {
      sum += log[i].cost;
      newest = log[i].t_us;
      any = 1;
    }
  r->allowed = cost <= q->limit && sum + cost <= q->limit;
  r->count = sum + (r->allowed ? cost : 0);
  r->remaining = q->limit > r->count ? q->limit - r->count : 0;
  r->retry_after_ms = 0;
  if (!r->allowed && cost > q->limit) {
    r->retry_after_ms = TG_NEVER;
  } else if (!r->allowed) {
    uint64_t left = sum;
    for (size_t i = 0; i < n; i++) {
      if (now - log[i].t_us >= period)
        continue;
      left -= log[i].cost;
      if (left + cost <= q->limit) {
        r->retry_after_ms = (log[i].t_us + period - now + 999) / 1000;
        break;
      }
    }
  }
  if (r->allowed && cost > 0)
    r->reset_after_ms = q->period_ms;
  else if (any && r->count > 0)
    r->reset_after_ms = (newest + period - now + 999) / 1000;
  else
    r->reset_after_ms = 0;
}

static uint64_t lcg(uint64_t *s) {
  *s = *s * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
  return *s >> 33;
}

static void matches_a_model_and_never_exceeds_the_limit(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  enum { CALLS = 4000 };
  static entry log[CALLS];
  size_t n = 0;
  uint64_t seed = 42, now = T0;
  for (int i = 0; i < CALLS; i++) {
    /* bursts of calls in the same microsecond, then gaps up to 0.3 s */
    uint64_t step = lcg(&seed) % 4 == 0 ? 0 : lcg(&seed) % 300000;
    now += step;
    uint64_t cost = lcg(&seed) % 5; /* 0 (peek) .. 4 */
    tg_result want, got = HIT(lim, now, "k", &q, cost);
    model_decide(log, n, &q, now, cost, &want);
    if (got.allowed != want.allowed || got.count != want.count ||
        got.remaining != want.remaining ||
        got.retry_after_ms != want.retry_after_ms ||
        got.reset_after_ms != want.reset_after_ms) {
      print_error(
          "call %d at +%" PRIu64 " us cost %" PRIu64
          ": want allowed %d count %" PRIu64 " remaining %" PRIu64
          " retry %" PRIu64 " reset %" PRIu64 ", got allowed %d count %" PRIu64
          " remaining %" PRIu64 " retry %" PRIu64 " reset %" PRIu64 "\n",
          i, now - T0, cost, want.allowed, want.count, want.remaining,
          want.retry_after_ms, want.reset_after_ms, got.allowed, got.count,
          got.remaining, got.retry_after_ms, got.reset_after_ms);
      fail();
    }
    if (got.allowed && cost > 0)
      log[n++] = (entry){now, cost};
  }
  assert_true(n > 100);
  /* no half-open interval [t, t + period) holds more than limit */
  for (size_t i = 0; i < n; i++) {
    uint64_t sum = 0;
    for (size_t j = i; j < n && log[j].t_us < log[i].t_us + MS(q.period_ms);
         j++)
      sum += log[j].cost;
    assert_true(sum <= q.limit);
  }
}

/* Entries of the same microsecond are merged and do not use up the cap. */
static void same_microsecond_entries_are_merged(void **state) {
  (void)state;
  tg_limiter *lim = new_capped(2);
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 1);
  ALLOW(lim, T0, "k", &q, 1);
  ALLOW(lim, T0, "k", &q, 1);
  ALLOW(lim, T0 + MS(100), "k", &q, 1);
  EXPECT_GET(lim, T0 + MS(999), "k", &q, 4);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q, 1);
  EXPECT_GET(lim, T0 + MS(1100), "k", &q, 0);
  tg_limiter_destroy(lim);
}

/* Past the cap a new entry merges into the newest one, which takes the later
 * time: memory stays bounded, answers become conservative, the limit holds. */
static void entry_cap_merges_into_the_newest(void **state) {
  (void)state;
  tg_limiter *lim = new_capped(2);
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q, 1);
  ALLOW(lim, T0 + MS(100), "k", &q, 1);
  ALLOW(lim, T0 + MS(200), "k", &q, 1); /* merged: (100, 1) -> (200, 2) */
  EXPECT_GET(lim, T0 + MS(999), "k", &q, 3);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q, 2);
  EXPECT_GET(lim, T0 + MS(1199), "k", &q, 2);
  EXPECT_EXPIRES(lim, T0 + MS(1199), "k", &q, T0_MS + 1200);
  EXPECT_GET(lim, T0 + MS(1200), "k", &q, 0);
  tg_limiter_destroy(lim);

  /* cap 1: one entry; the limit is never exceeded */
  lim = new_capped(1);
  const tg_quota q3 = {.limit = 3, .period_ms = 1000};
  ALLOW(lim, T0, "k", &q3, 1);
  ALLOW(lim, T0 + MS(400), "k", &q3, 1);
  ALLOW(lim, T0 + MS(800), "k", &q3, 1); /* one entry (800, 3) */
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q3, 1, 0, 3, 0, 800, 800);
  DENY(lim, T0 + MS(1799), "k", &q3, 1);
  EXPECT_HIT(lim, T0 + MS(1800), "k", &q3, 3, 1, 3, 0, 0, 1000);
  tg_limiter_destroy(lim);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, destroy_limiter)
  const struct CMUnitTest tests[] = {
      T(first_hit),
      T(within_limit_then_denied),
      T(denied_calls_are_not_recorded),
      T(mixed_costs),
      T(entries_expire_exactly_after_one_period),
      T(retry_after_is_exact_at_every_phase),
      T(cost_above_limit_is_never),
      T(cost_zero_is_a_peek),
      T(get_and_expires_at),
      T(set_and_inc_are_not_supported),
      T(reset_deletes_state),
      T(time_going_backwards_keeps_entries_live),
      T(matches_a_model_and_never_exceeds_the_limit),
      T(same_microsecond_entries_are_merged),
      T(entry_cap_merges_into_the_newest),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
