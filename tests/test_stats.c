/* SPDX-License-Identifier: MIT */
/*
 * test_stats.c - counters (tg_limiter_stats), shadow mode on one limiter
 * and the decision hook, from tollgate.h's "Shadow mode" and "Counters and
 * the decision hook": what is counted where, the hook's sampling and its
 * denials-only filter, and exact counts from 4 threads (run under TSan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "stats.h"
#include "tollgate.h"

#define T0 UINT64_C(1699999980000000)

typedef struct seen {
  unsigned calls, denied, shadow, in_rules;
  int last_status;
} seen;

static void hook(const tg_decision *d, void *ctx) {
  seen *s = ctx;
  s->calls++;
  s->denied += !d->result->allowed;
  s->shadow += d->result->shadow_denied;
  s->in_rules += d->in_rules;
  s->last_status = d->status;
  assert_true(d->key_len > 0 && d->q != NULL);
}

static tg_limiter *make(bool shadow, seen *s, uint32_t every, bool denied) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.clean_period_ms = 0;
  cfg.capacity = 4;
  cfg.shadow = shadow;
  if (s) {
    cfg.on_decision = hook;
    cfg.on_decision_ctx = s;
    cfg.on_decision_every = every;
    cfg.on_decision_denied_only = denied;
  }
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  return lim;
}

static void test_counts(void **state) {
  (void)state;
  seen s = {0};
  tg_limiter *lim = make(false, &s, 1, false);
  const tg_quota q = {2, 1000, 0}, bad = {0, 1000, 0};
  tg_result r;
  for (int i = 0; i < 5; i++)
    assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), 0);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &bad, 1, &r), TG_EQUOTA);
  /* no result to write: refused, and counted and hooked all the same */
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, NULL), TG_EINVAL);
  assert_int_equal(s.last_status, TG_EINVAL);
  /* a full table (capacity 4): TG_EFULL through the failure policy */
  char key[8];
  int full = 0;
  for (int i = 0; i < 6; i++) {
    key[0] = (char)('a' + i);
    full += tg_hit_at(lim, T0, key, 1, &q, 1, &r) == TG_EFULL;
  }
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0);
  assert_int_equal(st.allowed, 2 + (6 - full));
  assert_int_equal(st.denied, 3);
  assert_int_equal(st.errors[-TG_EQUOTA], 1);
  assert_int_equal(st.errors[-TG_EINVAL], 1);
  assert_int_equal(st.errors[-TG_EFULL], (uint64_t)full);
  assert_int_equal(st.table_full, (uint64_t)full);
  assert_int_equal(st.degraded, (uint64_t)full);
  assert_true(full > 0);
  assert_int_equal(s.calls, 5 + 1 + 1 + 6);
  assert_int_equal(s.denied, 3 + 2); /* EQUOTA, EINVAL answers not allowed */
  /* a short copy writes no more than asked */
  tg_stats part;
  memset(&part, 0xab, sizeof part);
  assert_int_equal(tg_limiter_stats(lim, &part, sizeof(uint64_t)), 0);
  assert_int_equal(part.allowed, st.allowed);
  assert_int_equal(part.denied, 0xababababababababu);
  assert_int_equal(tg_limiter_stats(lim, &part, 0), TG_EINVAL);
  assert_int_equal(tg_limiter_stats(NULL, &part, sizeof part), TG_EINVAL);
  tg_limiter_destroy(lim);
}

static void test_shadow(void **state) {
  (void)state;
  seen s = {0};
  tg_limiter *lim = make(true, &s, 1, false);
  const tg_quota q = {1, 1000, 0};
  tg_result r;
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), 0);
  assert_true(r.allowed);
  assert_false(r.shadow_denied);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), 0);
  assert_true(r.allowed);
  assert_true(r.shadow_denied);
  assert_int_equal(r.count, 2); /* recorded as usual: the window counted */
  assert_int_equal(r.retry_after_ms, 1000);
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0);
  assert_int_equal(st.allowed, 1);
  assert_int_equal(st.shadow_denied, 1);
  assert_int_equal(st.denied, 0);
  assert_int_equal(s.shadow, 1);
  /* batches too */
  tg_batch_item it = {"k", 1, &q, 1, 0, {0}};
  assert_int_equal(tg_hit_batch_at(lim, T0, &it, 1), 0);
  assert_true(it.result.allowed && it.result.shadow_denied);
  tg_limiter_destroy(lim);
}

/* A policy's rule with invalid input, on a shadow limiter: the error is
 * counted and the rule answers "not allowed, never" as it would anywhere
 * else; shadow mode turns real answers and store failures, not input the
 * call could never run with, into allowed. */
static void test_shadow_invalid_rule(void **state) {
  (void)state;
  seen s = {0};
  tg_limiter *lim = make(true, &s, 1, false);
  const tg_quota q = {1, 1000, 0}, bad = {0, 1000, 0};
  tg_rule r[2] = {{lim, "a", 1, &q, 1, 0, {0}}, {lim, "b", 1, &bad, 1, 0, {0}}};
  tg_rules_result out;
  assert_int_equal(tg_hit_rules_at(T0, r, 2, 0, &out), TG_EQUOTA);
  assert_int_equal(r[1].status, TG_EQUOTA);
  assert_false(r[1].result.allowed);
  assert_false(r[1].result.shadow_denied);
  assert_int_equal(r[1].result.retry_after_ms, TG_NEVER);
  assert_int_equal(out.denied_by, 1);
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0);
  assert_int_equal(st.errors[-TG_EQUOTA], 1);
  assert_int_equal(st.shadow_denied, 0);
  assert_int_equal(st.allowed + st.denied, 0);
  assert_int_equal(s.calls, 1);
  assert_int_equal(s.shadow, 0);
  tg_limiter_destroy(lim);
}

static void test_sampling(void **state) {
  (void)state;
  seen s = {0};
  tg_limiter *lim = make(false, &s, 10, false);
  const tg_quota q = {1000000, 1000, 0};
  tg_result r;
  for (int i = 0; i < 100; i++)
    assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), 0);
  assert_int_equal(s.calls, 10); /* the 1st, 11th, ... */
  tg_limiter_destroy(lim);
  seen d = {0};
  lim = make(false, &d, 2, true);
  const tg_quota one = {1, 1000, 0};
  for (int i = 0; i < 9; i++)
    assert_int_equal(tg_hit_at(lim, T0, "k", 1, &one, 1, &r), 0);
  assert_int_equal(d.calls, 4); /* 8 denials, one in two */
  assert_int_equal(d.denied, 4);
  tg_limiter_destroy(lim);
}

/* on_decision_every counts per thread: the first decision of each thread
 * is passed, also of a thread whose counter shard a thread that exited
 * used before it (threads one after another: each takes the shard the
 * last one gave back). */
typedef struct sampled {
  tg_limiter *lim;
  int decisions;
} sampled;

static void *sample_one(void *p) {
  sampled *x = p;
  const tg_quota q = {1000000, 1000, 0};
  tg_result r;
  for (int i = 0; i < x->decisions; i++)
    (void)tg_hit_at(x->lim, T0, "k", 1, &q, 1, &r);
  return NULL;
}

static void test_sampling_per_thread(void **state) {
  (void)state;
  seen s = {0};
  tg_limiter *lim = make(false, &s, 2, false);
  const int decisions[] = {1, 1, 3, 1, 2};
  unsigned want = 0;
  for (size_t i = 0; i < sizeof decisions / sizeof decisions[0]; i++) {
    pthread_t th;
    sampled x = {lim, decisions[i]};
    assert_int_equal(pthread_create(&th, NULL, sample_one, &x), 0);
    pthread_join(th, NULL);
    want += (unsigned)(decisions[i] + 1) / 2; /* the 1st, 3rd, ... */
    if (s.calls != want)
      fail_msg("after thread %zu: hook called %u times, expected %u", i,
               s.calls, want);
  }
  tg_limiter_destroy(lim);
}

/* Four threads, 20000 decisions each: the counts add up exactly. */
typedef struct worker {
  tg_limiter *lim;
  int id;
} worker;

static void *work(void *p) {
  worker *w = p;
  const tg_quota q = {10000, 1000, 0};
  char key[2] = {(char)('a' + w->id), 0};
  tg_result r;
  for (int i = 0; i < 20000; i++)
    tg_hit_at(w->lim, T0, key, 1, &q, 1, &r);
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  tg_limiter *lim = make(false, NULL, 1, false);
  pthread_t th[4];
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){lim, i};
    assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0); /* racing */
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0);
  assert_int_equal(st.allowed, 4 * 10000);
  assert_int_equal(st.denied, 4 * 10000);
  tg_limiter_destroy(lim);
}

/* Threads give their counter shard back as they exit: a program that
 * starts and ends threads all its life (300 here, far more than the 63
 * owned shards) keeps every thread on a shard of its own, where threads
 * numbered once and for all sent all but the first 63 to the shared
 * shard's atomic adds (two of them ran at half the speed of one). Counts
 * stay exact across the hand-overs. */
typedef struct churn {
  tg_limiter *lim;
  pthread_barrier_t *alive; /* NULL, or held until every thread counted */
  unsigned shard;           /* out: the shard the thread counted in */
} churn;

static void *churn_one(void *p) {
  churn *c = p;
  const tg_quota q = {1000000, 1000, 0};
  tg_result r;
  for (int i = 0; i < 10; i++)
    (void)tg_hit_at(c->lim, UINT64_C(1700000000000000) + (uint64_t)i, "k", 1,
                    &q, 1, &r);
  c->shard = tg__my_shard;
  if (c->alive)
    pthread_barrier_wait(c->alive);
  return NULL;
}

static void test_shards_recycled(void **state) {
  (void)state;
  tg_limiter *lim = make(false, NULL, 1, false);
  enum { SEQ = 300, PAR = 4 };
  for (int i = 0; i < SEQ; i++) {
    pthread_t th;
    churn c = {lim, NULL, 0};
    assert_int_equal(pthread_create(&th, NULL, churn_one, &c), 0);
    pthread_join(th, NULL);
    if (c.shard == 0)
      fail_msg("thread %d counted in the shared shard", i);
  }
  pthread_t th[PAR];
  churn c[PAR];
  pthread_barrier_t alive;
  pthread_barrier_init(&alive, NULL, PAR);
  for (int i = 0; i < PAR; i++) {
    c[i] = (churn){lim, &alive, 0};
    assert_int_equal(pthread_create(&th[i], NULL, churn_one, &c[i]), 0);
  }
  for (int i = 0; i < PAR; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&alive);
  for (int i = 0; i < PAR; i++) {
    assert_int_not_equal(c[i].shard, 0);
    for (int j = 0; j < i; j++)
      assert_int_not_equal(c[i].shard, c[j].shard); /* alive at once */
  }
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), 0);
  assert_int_equal(st.allowed + st.denied, (SEQ + PAR) * 10);
  tg_limiter_destroy(lim);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_counts),
                                     cmocka_unit_test(test_shadow),
                                     cmocka_unit_test(test_shadow_invalid_rule),
                                     cmocka_unit_test(test_sampling),
                                     cmocka_unit_test(test_sampling_per_thread),
                                     cmocka_unit_test(test_threads),
                                     cmocka_unit_test(test_shards_recycled)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
