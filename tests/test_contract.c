/* SPDX-License-Identifier: MIT */
/*
 * test_contract.c - the promises of tollgate.h that hold for every
 * algorithm, each scenario written once and run for all five (ALL5,
 * accept_helpers.h), on the memory store and, under TG_TEST_STORE=redis, on
 * Redis. What differs between algorithms (a fresh key's count, a bucket's
 * reset) is a row of a table indexed by the algorithm, with exact numbers;
 * what each algorithm does beyond the contract is in its own acceptance
 * test (test_fixed_window.c, test_per_key_window.c, test_sliding_window.c,
 * test_buckets.c).
 *
 *   - an unknown key is fresh: tg_get answers the fresh value, tg_expires_at
 *     0, nothing is stored, and the first hit is the fresh answer;
 *   - a peek (cost 0) on an unknown key stores nothing;
 *   - keys are independent, binary and NUL-carrying keys included;
 *   - tg_reset makes a key fresh and leaves the others alone; an unknown
 *     key's reset is not an error;
 *   - a denied call's retry_after_ms is exact: 1 ms earlier the same call is
 *     still denied, at retry_after_ms it is allowed;
 *   - a call with a cost no state could ever admit answers TG_NEVER and
 *     writes nothing.
 */
#include "accept_helpers.h"

#include "util.h"

/* Not aligned to any period: nothing lines up by accident. The fixed window
 * is given a window start (see FRESH). */
#define T0 MS(UINT64_C(1700000000777))
#define T0_ALIGNED MS(UINT64_C(1700000040000))

/* Per algorithm: when its first call is made (so that the numbers below are
 * exact), a quota, and a fresh key's answers. */
typedef struct fresh_row {
  uint64_t now;
  tg_quota q;
  uint64_t value;                                     /* tg_get */
  uint64_t count, remaining, retry_ms, reset_ms;      /* a first hit of 1 */
  uint64_t peek_count, peek_remaining, peek_reset_ms; /* a first peek */
} fresh_row;

static const fresh_row FRESH[TG_ALGORITHM_COUNT] = {
    [TG_FIXED_WINDOW] = {T0_ALIGNED, {10, 1000, 0}, 0, 1, 9, 0, 1000, 0, 10, 0},
    [TG_FIXED_WINDOW_PER_KEY] = {T0, {5, 1000, 0}, 0, 1, 4, 0, 1000, 0, 5, 0},
    [TG_SLIDING_WINDOW] = {T0, {5, 1000, 0}, 0, 1, 4, 0, 1000, 0, 5, 0},
    /* a token bucket starts full, a leaky one empty; T = 100 ms */
    [TG_TOKEN_BUCKET] = {T0, {10, 1000, 0}, 10, 9, 9, 0, 100, 10, 10, 0},
    [TG_LEAKY_BUCKET] = {T0, {10, 1000, 0}, 0, 1, 9, 0, 100, 0, 10, 0},
};

static void unknown_keys_are_fresh(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  EXPECT_GET(lim, f->now, "nobody", &f->q, f->value);
  EXPECT_EXPIRES(lim, f->now, "nobody", &f->q, 0);
  ASSERT_KEYS(lim, 0);
  EXPECT_HIT(lim, f->now, "nobody", &f->q, 1, 1, f->count, f->remaining,
             f->retry_ms, f->reset_ms);
}

static void a_peek_stores_nothing(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  EXPECT_HIT(lim, f->now, "k", &f->q, 0, 1, f->peek_count, f->peek_remaining, 0,
             f->peek_reset_ms);
  EXPECT_HIT(lim, f->now + MS(1), "k", &f->q, 0, 1, f->peek_count,
             f->peek_remaining, 0, f->peek_reset_ms);
  EXPECT_EXPIRES(lim, f->now, "k", &f->q, 0);
  ASSERT_KEYS(lim, 0);
  /* and the first real hit is still a fresh key's */
  EXPECT_HIT(lim, f->now, "k", &f->q, 1, 1, f->count, f->remaining, f->retry_ms,
             f->reset_ms);
}

/* Keys that differ only after a NUL, only in their last byte, in bytes above
 * 0x7f, or are a prefix of one another: each is its own key. */
static void keys_are_independent(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  unsigned char long_a[TG_KEY_MAX], long_b[TG_KEY_MAX];
  key_long(long_a, sizeof long_a, 'k', 'a');
  key_long(long_b, sizeof long_b, 'k', 'b');
  test_key keys[TEST_EDGE_KEYS + 3];
  memcpy(keys, test_edge_keys, sizeof test_edge_keys);
  keys[TEST_EDGE_KEYS] = (test_key){(const char *)long_a, sizeof long_a};
  keys[TEST_EDGE_KEYS + 1] = (test_key){(const char *)long_b, sizeof long_b};
  keys[TEST_EDGE_KEYS + 2] = (test_key){(const char *)long_a, TG_KEY_MAX - 1};
  const size_t n = sizeof keys / sizeof keys[0];
  /* key i takes i + 1 calls of 1 (up to the limit) */
  for (size_t i = 0; i < n; i++)
    for (size_t c = 0; c <= i && c < f->q.limit; c++) {
      tg_result r;
      assert_int_equal(
          tg_hit_at(lim, f->now, keys[i].bytes, keys[i].len, &f->q, 1, &r),
          TG_OK);
      assert_true(r.allowed);
    }
  for (size_t i = 0; i < n; i++) {
    uint64_t took = i + 1 < f->q.limit ? i + 1 : f->q.limit, v = ANY;
    assert_int_equal(
        tg_get_at(lim, f->now, keys[i].bytes, keys[i].len, &f->q, &v), TG_OK);
    /* a token bucket counts what is left, the others what was taken */
    uint64_t want = contract_alg == TG_TOKEN_BUCKET ? f->q.limit - took : took;
    if (v != want)
      print_error("key %zu (%zu bytes): %" PRIu64 ", want %" PRIu64 "\n", i,
                  keys[i].len, v, want);
    assert_int_equal(v, want);
  }
  ASSERT_KEYS(lim, n);
}

static void reset_makes_a_key_fresh(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  ALLOW(lim, f->now, "k", &f->q, f->q.limit);
  ALLOW(lim, f->now, "other", &f->q, 1);
  DENY(lim, f->now, "k", &f->q, 1);
  RESET(lim, "k");
  EXPECT_GET(lim, f->now, "k", &f->q, f->value);
  EXPECT_EXPIRES(lim, f->now, "k", &f->q, 0);
  EXPECT_HIT(lim, f->now, "k", &f->q, 1, 1, f->count, f->remaining, f->retry_ms,
             f->reset_ms);
  /* the other key kept its call */
  EXPECT_GET(lim, f->now, "other", &f->q,
             contract_alg == TG_TOKEN_BUCKET ? f->q.limit - 1 : 1);
  RESET(lim, "never-seen");
  RESET(lim, "never-seen");
}

/* Denied at several phases of a key's life: each wait is exact. */
static void retry_after_is_exact(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  uint64_t now = f->now;
  for (int round = 0; round < 3; round++) {
    ALLOW(lim, now, "k", &f->q, f->q.limit);
    DENY_RETRY_EXACT(lim, now, "k", &f->q, 1);
    now += MS(f->q.period_ms) * 3 + MS(37) * (uint64_t)round;
  }
}

/* Above the limit (burst 0) no state can admit the cost: TG_NEVER. The
 * buckets and the sliding log store nothing for it; the windows count it
 * (denied calls are counted), which their own tests check. */
static void impossible_cost_is_never(void **state) {
  tg_limiter *lim = *state;
  const fresh_row *f = &FRESH[contract_alg];
  const bool window = contract_alg == TG_FIXED_WINDOW ||
                      contract_alg == TG_FIXED_WINDOW_PER_KEY;
  const uint64_t costs[] = {f->q.limit + 1, f->q.limit + 2, UINT64_C(1) << 40};
  const char *const keys[] = {"fresh0", "fresh1", "fresh2"};
  for (size_t i = 0; i < sizeof costs / sizeof costs[0]; i++) {
    tg_result r = HIT(lim, f->now, keys[i], &f->q, costs[i]);
    assert_false(r.allowed);
    assert_int_equal(r.retry_after_ms, TG_NEVER);
    if (!window)
      EXPECT_EXPIRES(lim, f->now, keys[i], &f->q, 0);
  }
  if (!window)
    ASSERT_KEYS(lim, 0);
  /* the whole limit at once is possible */
  ALLOW(lim, f->now, "whole", &f->q, f->q.limit);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ALL5(unknown_keys_are_fresh), ALL5(a_peek_stores_nothing),
      ALL5(keys_are_independent),   ALL5(reset_makes_a_key_fresh),
      ALL5(retry_after_is_exact),   ALL5(impossible_cost_is_never),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
