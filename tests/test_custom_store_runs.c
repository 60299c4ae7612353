/* SPDX-License-Identifier: MIT */
/*
 * test_custom_store_runs.c - the custom store (the example adapter,
 * examples/custom_store_map.c) over long runs and under threads:
 *
 *   1. differential: long random runs through the example store and the
 *      memory store give identical codes and answers (differential.h), the
 *      lock protocol holds at every step and a hit's TTL is its reset.
 *   2. threads: blocking locks admit exactly the limit; trylock contention
 *      turns into degraded answers and never into a lost count.
 *
 * Environment: TG_CUSTOM_SEED (base seed of the differential, printed, and
 * TG_TEST_SEED), TG_CUSTOM_STEPS (steps per algorithm, default 200000).
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
#include "differential.h"
#include "tollgate.h"
#include "util.h"

/* ==== 1. differential against the memory store ==== */

#define DKEYS 40

typedef struct dkey {
  unsigned char b[40];
  size_t len;
  tg_quota q;
} dkey;

/* A run: the algorithm, the log cap, and what the seed is mixed with (each
 * case draws its own sequence). */
typedef struct diff_case {
  const char *test; /* the cmocka case's name */
  tg_algorithm alg;
  uint32_t max_entries;
  uint64_t seed_mix;
} diff_case;

static const diff_case diff_cases[] = {
    {"differential_fixed_window", TG_FIXED_WINDOW, 1024, 1},
    {"differential_per_key_window", TG_FIXED_WINDOW_PER_KEY, 1024, 2},
    {"differential_sliding_window", TG_SLIDING_WINDOW, 1024, 3},
    /* merging at the cap */
    {"differential_sliding_window_small_cap", TG_SLIDING_WINDOW, 4, 4},
    {"differential_token_bucket", TG_TOKEN_BUCKET, 1024, 5},
    {"differential_leaky_bucket", TG_LEAKY_BUCKET, 1024, 6},
};

static void differential(void **state) {
  const diff_case *dc = *state;
  const tg_algorithm alg = dc->alg;
  const uint32_t max_entries = dc->max_entries;
  uint64_t seed =
      test_seed("TG_CUSTOM_SEED", UINT64_C(0x5eedc057)) ^ dc->seed_mix;
  uint64_t steps = env_u64("TG_CUSTOM_STEPS", 200000);
  const uint64_t seed0 = seed;
  fx f;
  fx_open(&f, alg, TG_POLICY_FAIL_OPEN, max_entries);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.sliding_max_entries = max_entries;
  cfg.capacity = 4096;
  cfg.clean_period_ms = 0;
  tg_limiter *mem;
  assert_int_equal(tg_limiter_new(&mem, &cfg), TG_OK);

  static const uint64_t limits[] = {1, 2, 3, 5, 10, 100, 1000};
  static const uint64_t periods[] = {1, 3, 10, 100, 1000, 2500, 60000};
  dkey *keys = calloc(DKEYS, sizeof *keys);
  assert_non_null(keys);
  for (int i = 0; i < DKEYS; i++) {
    dkey *k = &keys[i];
    k->len = 1 + (size_t)rng_below(&seed, sizeof k->b);
    for (size_t j = 0; j < k->len; j++)
      k->b[j] = (unsigned char)rng_next(&seed);
    k->b[0] = (unsigned char)i; /* distinct keys */
    k->q.limit = rng_below(&seed, 3) ? limits[rng_below(&seed, 7)]
                                     : 1 + rng_below(&seed, 50);
    k->q.period_ms = periods[rng_below(&seed, 7)];
    k->q.burst = rng_below(&seed, 2) ? 0 : 1 + rng_below(&seed, 2 * k->q.limit);
  }

  uint64_t now = T0, counts[DIFF_OPS] = {0}, ok = 0;
  for (uint64_t step = 0; step < steps; step++) {
    uint64_t r = rng_below(&seed, 100);
    now += r < 25   ? 0
           : r < 55 ? 1 + rng_below(&seed, 1000)
           : r < 80 ? 1 + rng_below(&seed, 100000)
           : r < 96 ? 1 + rng_below(&seed, 3000000)
                    : 1 + rng_below(&seed, 120000000);
    f.clock.now_us = now;
    const dkey *k = &keys[rng_below(&seed, DKEYS)];
    uint64_t lim = k->q.limit, burst = k->q.burst ? k->q.burst : lim;
    uint64_t arg;
    r = rng_below(&seed, 100);
    arg = r < 10   ? 0
          : r < 55 ? 1
          : r < 85 ? 1 + rng_below(&seed, lim + 2)
          : r < 92 ? burst
          : r < 98 ? lim + 1 + rng_below(&seed, 3)
          : r < 99 ? UINT64_MAX / 2
                   : UINT64_MAX;
    int op = (int)rng_below(&seed, 100);
    op = op < 45   ? DIFF_HIT
         : op < 57 ? DIFF_GET
         : op < 69 ? DIFF_SET
         : op < 81 ? DIFF_INC
         : op < 95 ? DIFF_EXPIRES
                   : DIFF_RESET;
    if (op == DIFF_SET && rng_below(&seed, 2))
      arg = rng_below(&seed, burst + 2); /* set: around the valid range */
    if (op == DIFF_INC && rng_below(&seed, 4))
      arg = rng_below(&seed, 4); /* inc: small, often 0 */
    counts[op]++;

    const diff_call c = {.op = (diff_op)op,
                         .now_us = now,
                         .key = k->b,
                         .key_len = k->len,
                         .q = &k->q,
                         .arg = arg};
    diff_answer a1, a2;
    diff_run(f.lim, &c, &a1);
    diff_run(mem, &c, &a2);
    bool same = diff_same(&c, &a1, &a2);
    /* the protocol held, and a hit that wrote gave its reset as the TTL */
    rec *rr = f.r;
    bool proto = !rr->held && rr->violations == 0 && rr->locks <= 1 &&
                 rr->sets + rr->unlocks == rr->locks;
    bool ttl = !(op == DIFF_HIT && a1.rc == TG_OK && rr->sets == 1) ||
               rr->set_ttl == a1.r.reset_after_ms;
    if (!same || !proto || !ttl) {
      print_error("differential %s (max entries %u): seed 0x%" PRIx64
                  ", step %" PRIu64 ", key %d\n",
                  tg_algorithm_name(alg), max_entries, seed0, step,
                  (int)k->b[0]);
      diff_report(&c, "custom", &a1, "memory", &a2);
      print_error("  store calls: %u/%u/%u held %d violations %u, ttl %" PRIu64
                  "\n",
                  rr->locks, rr->sets, rr->unlocks, rr->held, rr->violations,
                  rr->set_ttl);
      fail();
    }
    ok += a1.rc == TG_OK;
    rr->locks = rr->sets = rr->unlocks = 0;
  }
  print_message("differential %s (max entries %u): %" PRIu64 " steps (%" PRIu64
                " ok), seed 0x%" PRIx64 "; hit %" PRIu64 " get %" PRIu64
                " set %" PRIu64 " inc %" PRIu64 " expires %" PRIu64
                " reset %" PRIu64 "\n",
                tg_algorithm_name(alg), max_entries, steps, ok, seed0,
                counts[DIFF_HIT], counts[DIFF_GET], counts[DIFF_SET],
                counts[DIFF_INC], counts[DIFF_EXPIRES], counts[DIFF_RESET]);
  free(keys);
  tg_limiter_destroy(mem);
  fx_close(&f);
}

/* ==== 2. threads ==== */

#define THREADS 4
#define TKEYS 3

/* Counts calls across threads; a thread-local flag checks that the thread
 * that locked is the one that releases, once. */
typedef struct tally {
  tg_custom_store inner;
  unsigned locks, sets, unlocks, violations; /* atomic */
} tally;

static _Thread_local int tally_held;

static int tally_lock_and_get(void *ctx, const void *key, size_t key_len,
                              void *buf, size_t cap, size_t *len) {
  tally *t = ctx;
  __atomic_fetch_add(&t->locks, 1, __ATOMIC_RELAXED);
  int got = t->inner.lock_and_get(t->inner.ctx, key, key_len, buf, cap, len);
  if (got == TG_CUSTOM_OK || got == TG_CUSTOM_NOT_FOUND) {
    if (tally_held++ != 0)
      __atomic_fetch_add(&t->violations, 1, __ATOMIC_RELAXED);
  }
  return got;
}

static int tally_set_and_unlock(void *ctx, const void *key, size_t key_len,
                                const void *data, size_t len, uint64_t ttl) {
  tally *t = ctx;
  __atomic_fetch_add(&t->sets, 1, __ATOMIC_RELAXED);
  if (tally_held-- != 1)
    __atomic_fetch_add(&t->violations, 1, __ATOMIC_RELAXED);
  return t->inner.set_and_unlock(t->inner.ctx, key, key_len, data, len, ttl);
}

static void tally_unlock(void *ctx, const void *key, size_t key_len) {
  tally *t = ctx;
  __atomic_fetch_add(&t->unlocks, 1, __ATOMIC_RELAXED);
  if (tally_held-- != 1)
    __atomic_fetch_add(&t->violations, 1, __ATOMIC_RELAXED);
  t->inner.unlock(t->inner.ctx, key, key_len);
}

typedef struct worker {
  tg_limiter *lim;
  const tg_quota *q;
  unsigned hits;
  pthread_barrier_t *start;
  unsigned allowed[TKEYS];                 /* out */
  unsigned denied, busy, busy_bad, errors; /* out */
  int first_error;                         /* out */
} worker;

static const char *const tkeys[TKEYS] = {"alpha", "beta", "gamma"};

static void *worker_run(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  for (unsigned i = 0; i < w->hits; i++)
    for (int k = 0; k < TKEYS; k++) {
      tg_result r;
      int rc = tg_hit_at(w->lim, T0, tkeys[k], strlen(tkeys[k]), w->q, 1, &r);
      if (rc == TG_OK) {
        if (r.allowed)
          w->allowed[k]++;
        else
          w->denied++;
      } else if (rc == TG_EBUSY) {
        w->busy++;
        w->busy_bad +=
            !r.degraded || r.allowed || r.retry_after_ms != w->q->period_ms;
      } else if (w->errors++ == 0) {
        w->first_error = rc;
      }
    }
  return NULL;
}

/* THREADS workers x `hits` per key at one instant; sums into *sum. */
static void run_workers(tg_limiter *lim, const tg_quota *q, unsigned hits,
                        worker *sum) {
  pthread_t th[THREADS];
  worker w[THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.lim = lim, .q = q, .hits = hits, .start = &start};
    assert_int_equal(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
  }
  memset(sum, 0, sizeof *sum);
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    for (int k = 0; k < TKEYS; k++)
      sum->allowed[k] += w[i].allowed[k];
    sum->denied += w[i].denied;
    sum->busy += w[i].busy;
    sum->busy_bad += w[i].busy_bad;
    if (w[i].errors && !sum->errors)
      sum->first_error = w[i].first_error;
    sum->errors += w[i].errors;
  }
  pthread_barrier_destroy(&start);
}

static tg_limiter *threaded_limiter(tg_algorithm alg, int64_t wait_us,
                                    size_t stripes, tg_policy pol,
                                    map_store **m, tally *t, sim *clock) {
  map_store_options mo;
  map_store_options_init(&mo);
  mo.stripes = stripes;
  mo.lock_wait_us = wait_us;
  mo.clock = sim_read; /* never written while the workers run */
  mo.clock_ctx = clock;
  assert_int_equal(map_store_new(m, &mo), 0);
  memset(t, 0, sizeof *t);
  map_store_callbacks(*m, &t->inner);
  tg_custom_store cs = {tally_lock_and_get, tally_set_and_unlock, tally_unlock,
                        t};
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = pol;
  cfg.custom_store = &cs; /* copied */
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

/* Blocking locks on two stripes (so keys also wait for each other): every
 * key admits exactly the limit, and counts lose nothing. */
static void threads_exact(tg_algorithm alg) {
  sim clock = {T0};
  map_store *m;
  tally t;
  tg_limiter *lim = threaded_limiter(alg, MAP_STORE_WAIT_FOREVER, 2,
                                     TG_POLICY_ERROR, &m, &t, &clock);
  const tg_quota q = {.limit = 500, .period_ms = 60000, .burst = 0};
  const unsigned hits = 1500;
  worker sum;
  run_workers(lim, &q, hits, &sum);
  if (sum.errors)
    fail_msg("%u errors, first %s", sum.errors, tg_err_name(sum.first_error));
  assert_int_equal(sum.busy, 0);
  const uint64_t want_count[] = {THREADS * hits, THREADS * hits, 500, 0, 500};
  for (int k = 0; k < TKEYS; k++) {
    assert_int_equal(sum.allowed[k], 500);
    uint64_t v;
    ASSERT_RC(tg_get_at(lim, T0, tkeys[k], strlen(tkeys[k]), &q, &v), TG_OK);
    assert_int_equal(v, want_count[alg]);
  }
  assert_int_equal(t.violations, 0);
  assert_int_equal(t.locks, t.sets + t.unlocks);
  assert_int_equal(t.locks, THREADS * hits * TKEYS + TKEYS);
  tg_limiter_destroy(lim);
  map_store_free(m);
}

/* threads_<algorithm>: one case per algorithm (ALG_CASES). */
static void threads_case(void **state) { threads_exact(alg_of(state)); }

/* trylock on one stripe: contention becomes TG_EBUSY with the fail-closed
 * answer; every call that got through is counted, and the limit holds. */
static void threads_trylock_busy(void **state) {
  (void)state;
  sim clock = {T0};
  map_store *m;
  tally t;
  tg_limiter *lim = threaded_limiter(TG_FIXED_WINDOW, 0, 1,
                                     TG_POLICY_FAIL_CLOSED, &m, &t, &clock);
  const tg_quota q = {.limit = 500, .period_ms = 60000, .burst = 0};
  worker sum;
  run_workers(lim, &q, 2000, &sum);
  if (sum.errors)
    fail_msg("%u errors, first %s", sum.errors, tg_err_name(sum.first_error));
  assert_int_equal(sum.busy_bad, 0);
  uint64_t total = 0;
  for (int k = 0; k < TKEYS; k++) {
    uint64_t v;
    ASSERT_RC(tg_get_at(lim, T0, tkeys[k], strlen(tkeys[k]), &q, &v), TG_OK);
    assert_true(sum.allowed[k] == (v < 500 ? v : 500));
    total += v;
  }
  assert_int_equal(total, THREADS * 2000 * TKEYS - sum.busy);
  assert_int_equal(t.violations, 0);
  assert_int_equal(t.locks, t.sets + t.unlocks + sum.busy);
  print_message("trylock: %u of %u calls were busy\n", sum.busy,
                THREADS * 2000 * TKEYS);
  tg_limiter_destroy(lim);
  map_store_free(m);
}
#define DIFF(i)                                                                \
  {                                                                            \
    diff_cases[i].test, differential, NULL, NULL,                              \
        (void *)(uintptr_t)&diff_cases[i]                                      \
  }
_Static_assert(sizeof diff_cases / sizeof diff_cases[0] == 6,
               "main registers every row of diff_cases");

int main(void) {
  const struct CMUnitTest tests[] = {
      DIFF(0),
      DIFF(1),
      DIFF(2),
      DIFF(3),
      DIFF(4),
      DIFF(5),
      ALG_CASES("threads_", threads_case),
      cmocka_unit_test(threads_trylock_busy),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, NULL));
}
