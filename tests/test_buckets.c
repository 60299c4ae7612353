/* SPDX-License-Identifier: MIT */
/*
 * test_buckets.c - acceptance tests for TG_TOKEN_BUCKET and TG_LEAKY_BUCKET,
 * written from docs/DESIGN.md section 3 and include/tollgate.h.
 *
 * Both buckets are GCRA with emission interval T = ceil(period_ms * 10^6 /
 * limit) ns and tolerance burst * T (burst 0 = limit). A token bucket starts
 * full and counts whole tokens left; a leaky bucket starts empty and counts
 * its level rounded up. They admit exactly the same calls: a call is allowed
 * when tokens >= cost (level + cost <= burst), a denied call changes nothing,
 * retry_after_ms is the exact wait rounded up, TG_NEVER when cost > burst.
 * Tests that hold for both run twice (token_bucket/..., leaky_bucket/...).
 */
#include "accept_helpers.h"

#include <stdio.h>

#define T0 MS(UINT64_C(1700000000777))
#define T0_MS (T0 / 1000)

/* 10 per second: T = 100 ms exactly, burst 10. */
static const tg_quota q10 = {.limit = 10, .period_ms = 1000, .burst = 0};

/* The algorithm of the running test (set by its setup). */
static tg_algorithm alg;
#define TOKEN (alg == TG_TOKEN_BUCKET)

static int setup_token(void **state) {
  alg = TG_TOKEN_BUCKET;
  return new_limiter_(state, alg);
}
static int setup_leaky(void **state) {
  alg = TG_LEAKY_BUCKET;
  return new_limiter_(state, alg);
}

/* ---- token bucket ------------------------------------------------------- */

static void token_first_hit(void **state) {
  tg_limiter *lim = *state;
  EXPECT_GET(lim, T0, "k", &q10, 10); /* an unknown key is full */
  EXPECT_HIT(lim, T0 + MS(250), "k", &q10, 1, 1, 9, 9, 0, 100);
  EXPECT_GET(lim, T0 + MS(250), "k", &q10, 9);
  EXPECT_EXPIRES(lim, T0 + MS(250), "k", &q10, T0_MS + 350);
}

static void token_starts_full_and_empties(void **state) {
  tg_limiter *lim = *state;
  for (uint64_t i = 0; i < 10; i++)
    EXPECT_HIT(lim, T0, "k", &q10, 1, 1, 9 - i, 9 - i, 0, 100 * (i + 1));
  EXPECT_HIT(lim, T0, "k", &q10, 1, 0, 0, 0, 100, 1000);
  /* a bigger burst than the rate: 20 at once */
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 20};
  EXPECT_GET(lim, T0, "big", &q, 20);
  EXPECT_HIT(lim, T0, "big", &q, 20, 1, 0, 0, 0, 2000);
  EXPECT_HIT(lim, T0, "big", &q, 1, 0, 0, 0, 100, 2000);
}

/* Refill is continuous: no whole-second steps, no lost remainders. */
static void token_refills_continuously(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q10, 10);
  EXPECT_GET(lim, T0 + MS(50), "k", &q10, 0);
  EXPECT_GET(lim, T0 + MS(99) + 999, "k", &q10, 0);
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 1);
  EXPECT_GET(lim, T0 + MS(250), "k", &q10, 2);
  EXPECT_GET(lim, T0 + MS(999) + 999, "k", &q10, 9);
  EXPECT_GET(lim, T0 + MS(1000), "k", &q10, 10);
  EXPECT_GET(lim, T0 + MS(5000), "k", &q10, 10);
  /* 1.5 tokens at 150 ms: one call leaves half a token, which is kept */
  EXPECT_HIT(lim, T0 + MS(150), "k", &q10, 1, 1, 0, 0, 0, 950);
  EXPECT_HIT(lim, T0 + MS(200), "k", &q10, 1, 1, 0, 0, 0, 1000);
  EXPECT_HIT(lim, T0 + MS(250), "k", &q10, 1, 0, 0, 0, 50, 950);
}

/* Paced at 0.7 of the rate, the bucket admits exactly floor(0.7 n) calls:
 * fractions of a token accumulate across calls. */
static void token_keeps_fractions(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q10, 10);
  unsigned allowed = 0;
  for (uint64_t k = 1; k <= 100; k++)
    allowed += HIT(lim, T0 + MS(70 * k), "k", &q10, 1).allowed;
  assert_int_equal(allowed, 70);
}

static void token_set(void **state) {
  tg_limiter *lim = *state;
  SET(lim, T0, "k", &q10, 3);
  EXPECT_GET(lim, T0, "k", &q10, 3);
  EXPECT_EXPIRES(lim, T0, "k", &q10, T0_MS + 700);
  EXPECT_HIT(lim, T0, "k", &q10, 4, 0, 3, 3, 100, 700);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q10, 4, 1, 0, 0, 0, 1000);
  ASSERT_RC(tg_set_at(lim, T0 + MS(100), "k", 1, &q10, 11), TG_ERANGE);
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 0);
  SET(lim, T0 + MS(100), "k", &q10, 10); /* full = fresh */
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 10);
  EXPECT_EXPIRES(lim, T0 + MS(100), "k", &q10, 0);
  SET(lim, T0 + MS(100), "k", &q10, 0);
  EXPECT_HIT(lim, T0 + MS(100), "k", &q10, 1, 0, 0, 0, 100, 1000);
}

/* ---- leaky bucket ---------------------------------------------------------
 */

static void leaky_first_hit(void **state) {
  tg_limiter *lim = *state;
  EXPECT_GET(lim, T0, "k", &q10, 0); /* an unknown key is empty */
  EXPECT_HIT(lim, T0 + MS(250), "k", &q10, 1, 1, 1, 9, 0, 100);
  EXPECT_GET(lim, T0 + MS(250), "k", &q10, 1);
  EXPECT_EXPIRES(lim, T0 + MS(250), "k", &q10, T0_MS + 350);
}

static void leaky_starts_empty_and_fills(void **state) {
  tg_limiter *lim = *state;
  for (uint64_t i = 0; i < 10; i++)
    EXPECT_HIT(lim, T0, "k", &q10, 1, 1, i + 1, 9 - i, 0, 100 * (i + 1));
  EXPECT_HIT(lim, T0, "k", &q10, 1, 0, 10, 0, 100, 1000);
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 20};
  EXPECT_HIT(lim, T0, "big", &q, 20, 1, 20, 0, 0, 2000);
  EXPECT_HIT(lim, T0, "big", &q, 1, 0, 20, 0, 100, 2000);
}

/* The level drains continuously and is reported rounded up. */
static void leaky_drains_continuously(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q10, 3, 1, 3, 7, 0, 300);
  EXPECT_GET(lim, T0 + MS(1), "k", &q10, 3);
  EXPECT_GET(lim, T0 + MS(100), "k", &q10, 2);
  EXPECT_GET(lim, T0 + MS(150), "k", &q10, 2);
  EXPECT_GET(lim, T0 + MS(299) + 999, "k", &q10, 1);
  EXPECT_GET(lim, T0 + MS(300), "k", &q10, 0);
  /* level 1.5 at 150 ms; + 1 = 2.5: count 3, room for 7 whole calls */
  EXPECT_HIT(lim, T0 + MS(150), "k", &q10, 1, 1, 3, 7, 0, 250);
  EXPECT_EXPIRES(lim, T0 + MS(150), "k", &q10, T0_MS + 400);
}

static void leaky_set(void **state) {
  tg_limiter *lim = *state;
  SET(lim, T0, "k", &q10, 7);
  EXPECT_GET(lim, T0, "k", &q10, 7);
  EXPECT_EXPIRES(lim, T0, "k", &q10, T0_MS + 700);
  EXPECT_HIT(lim, T0, "k", &q10, 4, 0, 7, 3, 100, 700);
  EXPECT_HIT(lim, T0, "k", &q10, 3, 1, 10, 0, 0, 1000);
  ASSERT_RC(tg_set_at(lim, T0, "k", 1, &q10, 11), TG_ERANGE);
  EXPECT_GET(lim, T0, "k", &q10, 10);
  SET(lim, T0, "k", &q10, 0); /* empty = fresh */
  EXPECT_EXPIRES(lim, T0, "k", &q10, 0);
  EXPECT_HIT(lim, T0, "k", &q10, 10, 1, 10, 0, 0, 1000);
}

/* The level never exceeds burst, whatever the calls. */
static void leaky_level_never_exceeds_burst(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 7, .period_ms = 1000, .burst = 5};
  uint64_t now = T0, seed = 7;
  for (int i = 0; i < 3000; i++) {
    seed = seed * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
    now += (seed >> 40) % 90000;
    tg_result r = HIT(lim, now, "k", &q, (seed >> 20) % 7);
    assert_true(r.count <= 5);
    assert_true(GET(lim, now, "k", &q) <= 5);
  }
}

/* ---- both buckets -----------------------------------------------------------
 */

/* 55 per second: T = 18181819 ns; an empty bucket answers 19 ms. */
static void precision_55_per_second(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 55, .period_ms = 1000};
  for (int i = 0; i < 55; i++)
    ALLOW(lim, T0, "k", &q, 1);
  EXPECT_HIT(lim, T0, "k", &q, 1, 0, TOKEN ? 0 : 55, 0, 19, 1001);
  DENY_RETRY_EXACT(lim, T0, "k", &q, 1);
  /* empty again, at a sub-millisecond phase */
  ALLOW(lim, T0 + MS(5000) + 321, "j", &q, 55);
  EXPECT_HIT(lim, T0 + MS(5000) + 321, "j", &q, 1, 0, ANY, 0, 19, ANY);
  DENY(lim, T0 + MS(5018) + 321, "j", &q, 1);
  ALLOW(lim, T0 + MS(5019) + 321, "j", &q, 1);
}

/* A rate above the capacity is honoured: 1000/s with burst 10 admits about
 * 1000 paced calls per second, not 10. */
static void rate_above_capacity_is_honoured(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 1000, .period_ms = 1000, .burst = 10};
  unsigned allowed = 0;
  for (uint64_t ms = 0; ms < 1000; ms++)
    allowed += HIT(lim, T0 + MS(ms), "paced", &q, 1).allowed;
  assert_int_equal(allowed, 1000);
  /* twice the rate: the rate plus the burst, never more */
  allowed = 0;
  for (uint64_t us = 0; us < 1000000; us += 500)
    allowed += HIT(lim, T0 + us, "fast", &q, 1).allowed;
  assert_in_range(allowed, 1000, 1011);
}

/* A whole-nanosecond emission interval that is not a whole ms: 3 per second
 * is T = 333333334 ns. */
static void odd_emission_interval(void **state) {
  tg_limiter *lim = *state;
  const tg_quota q = {.limit = 3, .period_ms = 1000};
  EXPECT_HIT(lim, T0, "k", &q, 1, 1, TOKEN ? 2 : 1, 2, 0, 334);
  EXPECT_EXPIRES(lim, T0, "k", &q, T0_MS + 334);
  ALLOW(lim, T0, "k", &q, 2);
  EXPECT_HIT(lim, T0, "k", &q, 1, 0, TOKEN ? 0 : 3, 0, 334, 1001);
  EXPECT_HIT(lim, T0 + 333333, "k", &q, 1, 0, ANY, 0, 1, ANY);
  ALLOW(lim, T0 + 333334, "k", &q, 1);
}

static void mixed_costs(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q10, 3, 1, TOKEN ? 7 : 3, 7, 0, 300);
  EXPECT_HIT(lim, T0, "k", &q10, 4, 1, TOKEN ? 3 : 7, 3, 0, 700);
  /* 3 tokens left (level 7): cost 4 needs one more, 100 ms */
  EXPECT_HIT(lim, T0, "k", &q10, 4, 0, TOKEN ? 3 : 7, 3, 100, 700);
  EXPECT_HIT(lim, T0, "k", &q10, 10, 0, TOKEN ? 3 : 7, 3, 700, 700);
  DENY_RETRY_EXACT(lim, T0, "k", &q10, 4);
  /* after the retry at 100 ms: 0 tokens (level 10) */
  EXPECT_HIT(lim, T0 + MS(100), "k", &q10, 3, 0, TOKEN ? 0 : 10, 0, 300, 1000);
  EXPECT_HIT(lim, T0 + MS(400), "k", &q10, 3, 1, TOKEN ? 0 : 10, 0, 0, 1000);
}

static void retry_after_is_exact_at_every_phase(void **state) {
  tg_limiter *lim = *state;
  const tg_quota quotas[] = {
      {.limit = 10, .period_ms = 1000},
      {.limit = 7, .period_ms = 1000},
      {.limit = 55, .period_ms = 1000, .burst = 3},
      {.limit = 3, .period_ms = 7, .burst = 5},
      {.limit = 1, .period_ms = 60000},
  };
  const uint64_t starts[] = {0, 1, 499, 500, 999, MS(1) + 1, MS(333) + 333};
  const uint64_t waits[] = {0, 1, 999, 1000, MS(1) + 7, MS(13) + 1};
  unsigned n = 0;
  for (size_t k = 0; k < sizeof quotas / sizeof quotas[0]; k++) {
    const tg_quota *q = &quotas[k];
    uint64_t burst = q->burst ? q->burst : q->limit;
    uint64_t interval_us = q->period_ms * 1000 / q->limit;
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
      for (size_t j = 0; j < sizeof waits / sizeof waits[0]; j++) {
        char key[32];
        snprintf(key, sizeof key, "k%u", n++);
        /* waits shorter than one emission interval: still empty */
        uint64_t w = waits[j] < interval_us ? waits[j] : waits[j] / 100;
        uint64_t t = T0 + starts[i];
        ALLOW(lim, t, key, q, burst);
        DENY_RETRY_EXACT(lim, t + w, key, q, 1);
        /* and a cost of the whole burst once it is empty again */
        uint64_t t2 = t + MS(200000);
        ALLOW(lim, t2, key, q, burst);
        DENY_RETRY_EXACT(lim, t2 + w, key, q, burst);
      }
  }
}

/* cost > burst: TG_NEVER, and nothing changes. */
static void cost_above_burst_is_never(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "fresh", &q10, 11, 0, TOKEN ? 10 : 0, 10, TG_NEVER, 0);
  EXPECT_GET(lim, T0, "fresh", &q10, TOKEN ? 10 : 0);
  EXPECT_EXPIRES(lim, T0, "fresh", &q10, 0);
  ASSERT_KEYS(lim, 0);
  ALLOW(lim, T0, "k", &q10, 4);
  EXPECT_HIT(lim, T0, "k", &q10, UINT64_MAX, 0, TOKEN ? 6 : 4, 6, TG_NEVER,
             400);
  EXPECT_HIT(lim, T0, "k", &q10, 6, 1, TOKEN ? 0 : 10, 0, 0, 1000);
  /* with burst above the limit the bound is burst */
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 15};
  EXPECT_HIT(lim, T0, "b", &q, 16, 0, TOKEN ? 15 : 0, 15, TG_NEVER, 0);
  EXPECT_HIT(lim, T0, "b", &q, 15, 1, TOKEN ? 0 : 15, 0, 0, 1500);
}

/* cost 0 reports without consuming; a bucket is never over its limit. */
static void cost_zero_is_a_peek(void **state) {
  tg_limiter *lim = *state;
  EXPECT_HIT(lim, T0, "k", &q10, 0, 1, TOKEN ? 10 : 0, 10, 0, 0);
  ASSERT_KEYS(lim, 0);
  ALLOW(lim, T0, "k", &q10, 4);
  EXPECT_HIT(lim, T0 + MS(50), "k", &q10, 0, 1, TOKEN ? 6 : 4, 6, 0, 350);
  EXPECT_HIT(lim, T0 + MS(50), "k", &q10, 0, 1, TOKEN ? 6 : 4, 6, 0, 350);
  ALLOW(lim, T0 + MS(50), "k", &q10, 6);
  EXPECT_HIT(lim, T0 + MS(50), "k", &q10, 0, 1, TOKEN ? 0 : 10, 0, 0, 950);
  EXPECT_GET(lim, T0 + MS(50), "k", &q10, TOKEN ? 0 : 10);
  EXPECT_EXPIRES(lim, T0 + MS(50), "k", &q10, T0_MS + 1000);
}

static void inc_is_not_supported(void **state) {
  tg_limiter *lim = *state;
  uint64_t v = 5;
  ALLOW(lim, T0, "k", &q10, 2);
  ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q10, 1, &v), TG_ENOTSUP);
  ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q10, 1, NULL), TG_ENOTSUP);
  EXPECT_GET(lim, T0, "k", &q10, TOKEN ? 8 : 2);
}

static void reset_deletes_state(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q10, 10);
  ALLOW(lim, T0, "other", &q10, 1);
  DENY(lim, T0, "k", &q10, 1);
  size_t keys = tg_key_count(lim);
  RESET(lim, "k");
  ASSERT_KEYS(lim, keys); /* fresh, and kept until reclaimed (tg_reset) */
  EXPECT_GET(lim, T0, "k", &q10, TOKEN ? 10 : 0);
  EXPECT_EXPIRES(lim, T0, "k", &q10, 0);
  ALLOW(lim, T0, "k", &q10, 10);
  EXPECT_GET(lim, T0, "other", &q10, TOKEN ? 9 : 1);
  RESET(lim, "never-seen");
}

/* A fully recovered bucket is fresh again. */
static void recovery_makes_the_key_fresh(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0, "k", &q10, 10);
  EXPECT_EXPIRES(lim, T0, "k", &q10, T0_MS + 1000);
  EXPECT_EXPIRES(lim, T0 + MS(1000), "k", &q10, 0);
  EXPECT_HIT(lim, T0 + MS(1000), "k", &q10, 0, 1, TOKEN ? 10 : 0, 10, 0, 0);
}

/* A call earlier than what the key has seen gets no refill from it. */
static void time_going_backwards_gives_no_refill(void **state) {
  tg_limiter *lim = *state;
  ALLOW(lim, T0 + MS(1000), "k", &q10, 10);
  DENY(lim, T0, "k", &q10, 1);
  DENY(lim, T0 + MS(1099), "k", &q10, 1);
  ALLOW(lim, T0 + MS(1100), "k", &q10, 1);
}

/* The header's GCRA, call by call, on a long pseudo-random sequence. */
static void model(uint64_t *tat, const tg_quota *q, uint64_t now_us,
                  uint64_t cost, tg_result *r) {
  uint64_t burst = q->burst ? q->burst : q->limit;
  uint64_t t_ns = (q->period_ms * 1000000 + q->limit - 1) / q->limit;
  uint64_t tau = burst * t_ns, now = now_us * 1000;
  uint64_t base = *tat > now ? *tat : now;
  r->allowed = cost <= burst && base + cost * t_ns - now <= tau;
  if (r->allowed)
    *tat = base + cost * t_ns;
  uint64_t d = (r->allowed ? *tat : base) - now;
  r->remaining = (tau - d) / t_ns;
  r->count = TOKEN ? r->remaining : (d + t_ns - 1) / t_ns;
  r->retry_after_ms = r->allowed ? 0
                      : cost > burst
                          ? TG_NEVER
                          : (base + cost * t_ns - now - tau + 999999) / 1000000;
  r->reset_after_ms = (d + 999999) / 1000000;
}

static void matches_the_gcra_model(void **state) {
  tg_limiter *lim = *state;
  const tg_quota quotas[] = {
      {.limit = 10, .period_ms = 1000, .burst = 0},
      {.limit = 55, .period_ms = 1000, .burst = 20},
      {.limit = 7, .period_ms = 3000, .burst = 2},
  };
  for (size_t k = 0; k < sizeof quotas / sizeof quotas[0]; k++) {
    const tg_quota *q = &quotas[k];
    uint64_t seed = 99 + k, now = T0, tat = 0;
    char key[16];
    snprintf(key, sizeof key, "m%zu", k);
    for (int i = 0; i < 3000; i++) {
      seed =
          seed * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
      now += (seed >> 40) % 4 == 0 ? 0 : (seed >> 24) % 200000;
      uint64_t cost = (seed >> 8) % 4;
      tg_result want, got = HIT(lim, now, key, q, cost);
      model(&tat, q, now, cost, &want);
      if (got.allowed != want.allowed || got.count != want.count ||
          got.remaining != want.remaining ||
          got.retry_after_ms != want.retry_after_ms ||
          got.reset_after_ms != want.reset_after_ms) {
        print_error("quota %zu call %d at +%" PRIu64 " us cost %" PRIu64
                    ": want allowed %d count %" PRIu64 " remaining %" PRIu64
                    " retry %" PRIu64 " reset %" PRIu64
                    ", got allowed %d count %" PRIu64 " remaining %" PRIu64
                    " retry %" PRIu64 " reset %" PRIu64 "\n",
                    k, i, now - T0, cost, want.allowed, want.count,
                    want.remaining, want.retry_after_ms, want.reset_after_ms,
                    got.allowed, got.count, got.remaining, got.retry_after_ms,
                    got.reset_after_ms);
        fail();
      }
    }
  }
}

int main(void) {
#define TOK(f)                                                                 \
  { "token_bucket/" #f, f, setup_token, destroy_limiter, NULL }
#define LKY(f)                                                                 \
  { "leaky_bucket/" #f, f, setup_leaky, destroy_limiter, NULL }
#define BOTH(f) TOK(f), LKY(f)
  const struct CMUnitTest tests[] = {
      TOK(token_first_hit),
      TOK(token_starts_full_and_empties),
      TOK(token_refills_continuously),
      TOK(token_keeps_fractions),
      TOK(token_set),
      LKY(leaky_first_hit),
      LKY(leaky_starts_empty_and_fills),
      LKY(leaky_drains_continuously),
      LKY(leaky_set),
      LKY(leaky_level_never_exceeds_burst),
      BOTH(precision_55_per_second),
      BOTH(rate_above_capacity_is_honoured),
      BOTH(odd_emission_interval),
      BOTH(mixed_costs),
      BOTH(retry_after_is_exact_at_every_phase),
      BOTH(cost_above_burst_is_never),
      BOTH(cost_zero_is_a_peek),
      BOTH(inc_is_not_supported),
      BOTH(reset_deletes_state),
      BOTH(recovery_makes_the_key_fresh),
      BOTH(time_going_backwards_gives_no_refill),
      BOTH(matches_the_gcra_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
