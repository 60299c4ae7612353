/* SPDX-License-Identifier: MIT */
/*
 * test_evict.c - tg_config.on_full = TG_FULL_EVICT: a new key that finds
 * the table full, and no decayed key to reclaim in the bounded scan, evicts
 * the live key closest to fresh (earliest expiry) among those the scan
 * inspected, instead of being refused (tollgate.h, tg_full).
 *
 *   1. each algorithm, memory store and shared segment: the key that would
 *      decay first goes, the others keep their counts, the horizon does not
 *      move, and the evicted key's count is forgotten (it is admitted up to
 *      a full limit again); TG_FULL_REFUSE (the default) answers TG_EFULL;
 *   2. long keys: when the long-key arena is what is full, a long key goes,
 *      even if a short one would decay sooner;
 *   3. one segment, two limiters: each keeps its own choice;
 *   4. a model test, in test_model.c's style but on the table itself (so
 *      it can see which key went): random calls, resets, cleaning passes
 *      and time on a small full table, every answer checked against the
 *      core on the key's history since it last entered the table, and every
 *      eviction checked to be one of the keys closest to fresh;
 *   5. a thread stress (the point under ThreadSanitizer): evictions racing
 *      decisions on hot keys, in a private and a shared-mode table; no
 *      other code than TG_OK, a table that validates, a horizon that never
 *      moved.
 *
 * Environment: TG_EVICT_STEPS (model steps per algorithm, default 200000).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "store/table.h"
#include "tollgate.h"
#include "util.h"

#define T0 UINT64_C(1700000000000000) /* us */
#define S_US UINT64_C(1000000)

static char seg[64];

static int unlink_seg(void **state) {
  (void)state;
  if (seg[0])
    tg_shm_unlink(seg);
  seg[0] = '\0';
  return 0;
}

static tg_config config(tg_algorithm alg, uint64_t capacity, tg_full full,
                        bool shared) {
  static unsigned serial;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = capacity;
  cfg.on_full = full;
  cfg.clean_period_ms = 0;
  cfg.on_failure = TG_POLICY_ERROR;
  if (shared) {
    if (!seg[0])
      snprintf(seg, sizeof seg, "/tg-evict-%ld-%u", (long)getpid(), serial++);
    cfg.shm_name = seg;
  }
  return cfg;
}

static tg_result hit(tg_limiter *lim, uint64_t now, const char *key,
                     const tg_quota *q, uint64_t cost) {
  tg_result r;
  int rc = tg_hit_at(lim, now, key, strlen(key), q, cost, &r);
  if (rc != TG_OK)
    print_error("hit %s: %s\n", key, tg_err_name(rc));
  assert_int_equal(rc, TG_OK);
  return r;
}

static uint64_t get(tg_limiter *lim, uint64_t now, const char *key,
                    const tg_quota *q) {
  uint64_t v = 0;
  assert_int_equal(tg_get_at(lim, now, key, strlen(key), q, &v), TG_OK);
  return v;
}

/* What tg_get says of a key never seen. */
static uint64_t fresh_value(tg_algorithm alg, const tg_quota *q) {
  return alg == TG_TOKEN_BUCKET ? (q->burst ? q->burst : q->limit) : 0;
}

static uint64_t shm_horizon(void) {
  int fd = shm_open(seg, O_RDONLY, 0);
  assert_true(fd >= 0);
  tg__table_hdr h;
  assert_int_equal(pread(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
  close(fd);
  return h.horizon_us;
}

/* ---- 1. ---- */

static void evicts_the_key_closest_to_fresh(void **state) {
  (void)state;
  /* k0 has the shortest period, so its state decays first (and T0 is a
   * multiple of each period, so the fixed windows end apart too) */
  const tg_quota qs[4] = {
      {3, 10000, 3}, {3, 20000, 3}, {3, 40000, 3}, {3, 80000, 3}};
  const char *keys[4] = {"k0", "k1", "k2", "k3"};
  for (int shared = 0; shared < 2; shared++)
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      tg_algorithm alg = (tg_algorithm)a;
      tg_config refuse = config(alg, 4, TG_FULL_REFUSE, shared);
      tg_config evict = refuse;
      evict.on_full = TG_FULL_EVICT;
      evict.shm_name = NULL;
      tg_limiter *lim, *other;
      assert_int_equal(tg_limiter_new(&lim, shared ? &refuse : &evict), TG_OK);
      for (int k = 0; k < 4; k++)
        for (int i = 0; i < 3; i++)
          hit(lim, T0, keys[k], &qs[k], 1);
      assert_false(hit(lim, T0, "k0", &qs[0], 1).allowed);
      assert_int_equal(tg_key_count(lim), 4);
      if (shared) { /* the refusing limiter first, then one that evicts */
        tg_result r;
        assert_int_equal(tg_hit_at(lim, T0, "new", 3, &qs[3], 1, &r), TG_EFULL);
        evict.shm_name = seg;
        assert_int_equal(tg_limiter_new(&other, &evict), TG_OK);
        tg_limiter_destroy(lim);
        lim = other;
      }
      tg_result r = hit(lim, T0, "new", &qs[3], 1);
      assert_true(r.allowed);
      assert_false(r.degraded);
      assert_int_equal(tg_key_count(lim), 4);
      /* k0 went: it reads fresh; the others kept their counts */
      assert_int_equal(get(lim, T0, "k0", &qs[0]), fresh_value(alg, &qs[0]));
      for (int k = 1; k < 4; k++)
        assert_int_not_equal(get(lim, T0, keys[k], &qs[k]),
                             fresh_value(alg, &qs[k]));
      if (shared)
        assert_int_equal(shm_horizon(), 0); /* evictions never move it */
      /* exactness lost for the evicted key: a full limit again, at once
       * (each of these evicts another key in turn) */
      for (int i = 0; i < 3; i++)
        assert_true(hit(lim, T0, "k0", &qs[0], 1).allowed);
      if (shared)
        assert_int_equal(shm_horizon(), 0);
      tg_limiter_destroy(lim);
      unlink_seg(NULL);
    }
}

/* ---- 2. ---- */

static void long_keys_evict_a_long_key(void **state) {
  (void)state;
  const tg_quota soon = {5, 1000, 5}, later = {5, 60000, 5},
                 latest = {5, 300000, 5};
  char l1[48], l2[48], l3[48];
  memset(l1, '1', sizeof l1 - 1);
  memset(l2, '2', sizeof l2 - 1);
  memset(l3, '3', sizeof l3 - 1);
  l1[47] = l2[47] = l3[47] = '\0';
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = (tg_algorithm)a;
    tg_config cfg = config(alg, 8, TG_FULL_EVICT, false);
    cfg.long_keys = 2;
    tg_limiter *lim;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    hit(lim, T0, "short", &soon, 1); /* decays first of all */
    hit(lim, T0, l1, &later, 1);
    hit(lim, T0, l2, &latest, 1);
    hit(lim, T0, l3, &later, 1); /* no chunk left: l1 goes */
    assert_int_equal(tg_key_count(lim), 3);
    assert_int_not_equal(get(lim, T0, "short", &soon), fresh_value(alg, &soon));
    assert_int_equal(get(lim, T0, l1, &later), fresh_value(alg, &later));
    assert_int_not_equal(get(lim, T0, l2, &latest), fresh_value(alg, &latest));
    tg_limiter_destroy(lim);

    /* a full table (every slot and every chunk taken): one key goes for
     * the new long key, a long one (it frees a chunk and a slot), though
     * a short key is closer to fresh; before, the short key went for the
     * slot and then a long key for the chunk */
    cfg.capacity = 4;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    hit(lim, T0, "short", &soon, 1); /* decays first of all */
    hit(lim, T0, "other", &latest, 1);
    hit(lim, T0, l1, &later, 1);
    hit(lim, T0, l2, &latest, 1);
    assert_int_equal(tg_key_count(lim), 4);
    hit(lim, T0, l3, &later, 1);
    assert_int_equal(tg_key_count(lim), 4);
    assert_int_not_equal(get(lim, T0, "short", &soon), fresh_value(alg, &soon));
    assert_int_not_equal(get(lim, T0, "other", &latest),
                         fresh_value(alg, &latest));
    assert_int_equal(get(lim, T0, l1, &later), fresh_value(alg, &later));
    assert_int_not_equal(get(lim, T0, l2, &latest), fresh_value(alg, &latest));
    assert_int_not_equal(get(lim, T0, l3, &later), fresh_value(alg, &later));
    tg_limiter_destroy(lim);
  }
}

/* ---- 4. the model ---- */

#define CAP 16
#define NKEYS 48
#define LOG_MAX 8
#define ROOM 16 /* reference log entries: limit + 1 at most */

typedef struct mkey {
  unsigned char b[96];
  size_t len;
  tg_quota q;
  tg__quota pq;
  tg__state st;
  tg__entry e[ROOM];
  uint32_t n;
  uint64_t last_us;
  bool in;
} mkey;

typedef struct model {
  tg_algorithm alg;
  tg__table t;
  void *mem;
  uint64_t now, rng, step;
  mkey k[NKEYS];
  unsigned held;
  uint64_t evictions, reclaims, checks;
} model;

static bool is_window(tg_algorithm a) {
  return a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
}

/* When the key's state stops (or stopped) mattering, as the table sees it. */
static uint64_t expiry(const model *m, const mkey *k) {
  if (m->alg == TG_SLIDING_WINDOW)
    return k->n         ? k->e[k->n - 1].t_us + k->pq.period_us
           : k->last_us ? k->last_us + k->pq.period_us
                        : 0;
  if (is_window(m->alg))
    return tg__win_end(&k->st);
  return tg__div_ceil(tg__tat(&k->st), 1000);
}

static tg__call call_of(const model *m, const mkey *k, tg__op op,
                        uint64_t arg) {
  tg__call c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.alg = m->alg;
  c.key = k->b;
  c.key_len = k->len;
  c.q = k->pq;
  c.arg = arg;
  c.now_us = m->now;
  return c;
}

/* The core on a copy of the reference state; the new state is kept only
 * if keep. */
static int ref_step(model *m, mkey *k, const tg__call *c, tg__outcome *o,
                    bool keep, bool *changed) {
  if (m->alg == TG_SLIDING_WINDOW) {
    tg__entry ring[LOG_MAX];
    tg__log lg = {ring, 0, k->n, LOG_MAX, 0};
    for (uint32_t i = 0; i < k->n; i++) {
      ring[i] = k->e[i];
      lg.sum += k->e[i].cost;
    }
    int rc = tg__log_step(c, &lg, o, changed);
    if (keep && rc == TG_OK && *changed) {
      for (uint32_t i = 0; i < lg.n; i++)
        k->e[i] = *tg__log_at(&lg, i);
      k->n = lg.n;
      if (lg.n)
        k->last_us = k->e[lg.n - 1].t_us;
    }
    return rc;
  }
  tg__state st = k->st;
  bool blank = tg__state_word(&st, 0) == 0 && tg__state_word(&st, 1) == 0;
  int rc = tg__state_step(c, &st, o, changed);
  /* a reset key, like an absent one, takes no state that is fresh */
  if (keep && rc == TG_OK && *changed &&
      !(blank && tg__state_fresh(m->alg, &st, c->now_us)))
    k->st = st;
  return rc;
}

/* Would this call create the key (an absent state changed into one that is
 * not fresh)? */
static bool creates(model *m, mkey *k, const tg__call *c) {
  mkey blank;
  memset(&blank, 0, sizeof blank);
  blank.pq = k->pq;
  tg__outcome o;
  bool changed = false;
  int rc = ref_step(m, &blank, c, &o, true, &changed);
  if (rc != TG_OK || !changed)
    return false;
  if (m->alg == TG_SLIDING_WINDOW)
    return blank.n > 0;
  return !tg__state_fresh(m->alg, &blank.st, c->now_us);
}

static void forget(model *m, mkey *k) {
  k->in = false;
  k->n = 0;
  k->last_us = 0;
  k->st = (tg__state){0, 0};
  m->held--;
}

static void fail_at(const model *m, const mkey *k, const char *what) {
  print_error("test_evict model: %s: %s, step %" PRIu64 ", now T0%+" PRId64
              " us, key of %zu bytes, period %" PRIu64 " ms, in table %d\n",
              tg_algorithm_name(m->alg), what, m->step, (int64_t)(m->now - T0),
              k ? k->len : 0, k ? k->q.period_ms : 0, k ? k->in : 0);
  fail();
}

static void model_call(model *m, mkey *k, tg__op op, uint64_t arg) {
  tg__call c = call_of(m, k, op, arg);
  bool evicting = false;
  uint64_t min_exp = UINT64_MAX;
  if (!k->in && creates(m, k, &c)) {
    if (m->held == CAP) /* a full table reclaims what decayed */
      for (int i = 0; i < NKEYS; i++)
        if (m->k[i].in && expiry(m, &m->k[i]) <= m->now) {
          forget(m, &m->k[i]);
          m->reclaims++;
        }
    if (m->held == CAP) { /* then evicts one of the earliest to decay */
      evicting = true;
      for (int i = 0; i < NKEYS; i++)
        if (m->k[i].in && expiry(m, &m->k[i]) < min_exp)
          min_exp = expiry(m, &m->k[i]);
    }
  }
  tg__outcome want, got;
  bool changed;
  memset(&want, 0, sizeof want);
  memset(&got, 0x5a, sizeof got);
  int wrc = ref_step(m, k, &c, &want, true, &changed);
  int rc = tg__table_exec(&m->t, &c, &got);
  if (rc != wrc)
    fail_at(m, k, tg_err_name(rc));
  if (rc == TG_OK && op == TG__OP_HIT &&
      (got.r.allowed != want.r.allowed || got.r.count != want.r.count ||
       got.r.remaining != want.r.remaining ||
       got.r.retry_after_ms != want.r.retry_after_ms ||
       got.r.reset_after_ms != want.r.reset_after_ms))
    fail_at(m, k, "a hit's answer differs from the core's");
  if (rc == TG_OK && op != TG__OP_HIT && got.value != want.value)
    fail_at(m, k, "a value differs from the core's");
  m->checks++;
  if (!k->in && tg__table_holds(&m->t, k->b, k->len)) {
    k->in = true;
    m->held++;
  }
  if (evicting) {
    unsigned gone = 0;
    for (int i = 0; i < NKEYS; i++) {
      mkey *o = &m->k[i];
      if (o == k || !o->in || tg__table_holds(&m->t, o->b, o->len))
        continue;
      gone++;
      if (expiry(m, o) != min_exp)
        fail_at(m, o, "evicted a key that was not the closest to fresh");
      forget(m, o);
      m->evictions++;
    }
    if (gone != 1)
      fail_at(m, k, "a full table evicted other than one key");
  }
  if (tg__table_live(&m->t) != m->held)
    fail_at(m, k, "the table holds another number of keys");
}

static void model_run(tg_algorithm alg, uint64_t steps) {
  model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->alg = alg;
  m->rng = test_seed("TG_EVICT_SEED", UINT64_C(0xe71c7)) ^ (uint64_t)alg << 40;
  m->now = T0;
  tg__table_params p = {alg, CAP, CAP, LOG_MAX, false, 0, true};
  size_t bytes = (tg__table_bytes(&p) + 63) & ~(size_t)63;
  m->mem = aligned_alloc(64, bytes);
  assert_non_null(m->mem);
  memset(m->mem, 0, bytes);
  assert_int_equal(tg__table_init(&m->t, m->mem, &p), TG_OK);
  static const uint64_t periods[] = {5, 20, 50, 200, 1000};
  for (int i = 0; i < NKEYS; i++) {
    mkey *k = &m->k[i];
    k->len = i % 3 == 0 ? 40 + (size_t)i : 1 + (size_t)i % 30;
    memset(k->b, 'a' + i % 26, k->len);
    k->b[0] = (unsigned char)i;
    k->q.limit = 1 + rng_below(&m->rng, 8);
    k->q.period_ms = periods[rng_below(&m->rng, 5)];
    k->q.burst = rng_below(&m->rng, 10);
    assert_int_equal(tg__quota_prepare(&k->pq, &k->q, alg), TG_OK);
  }
  for (m->step = 0; m->step < steps; m->step++) {
    unsigned r = (unsigned)rng_below(&m->rng, 1000);
    if (r < 300)
      m->now += rng_below(&m->rng, 3000);
    mkey *k = &m->k[rng_below(&m->rng, NKEYS)];
    r = (unsigned)rng_below(&m->rng, 1000);
    if (r < 10) {
      size_t removed;
      uint64_t expect = 0;
      for (int i = 0; i < NKEYS; i++)
        if (m->k[i].in && expiry(m, &m->k[i]) <= m->now) {
          forget(m, &m->k[i]);
          expect++;
        }
      assert_int_equal(
          tg__table_clean(&m->t, m->now, 0, NULL, NULL, NULL, &removed), TG_OK);
      if (removed != expect)
        fail_at(m, NULL, "a cleaning pass removed another number");
    } else if (r < 40) {
      assert_int_equal(tg__table_reset(&m->t, k->b, k->len), TG_OK);
      k->n = 0;
      k->last_us = 0;
      k->st = (tg__state){0, 0};
    } else if (r < 200) {
      model_call(m, k, TG__OP_GET, 0);
    } else {
      model_call(m, k, TG__OP_HIT, rng_below(&m->rng, 4));
    }
  }
  tg__table_check chk;
  assert_int_equal(tg__table_validate(&m->t, &chk), TG_OK);
  assert_int_equal(chk.errors, 0);
  assert_int_equal(tg__load_relaxed(&m->t.h->horizon_us) <= m->now, true);
  print_message("test_evict model: %-20s %" PRIu64 " steps, %" PRIu64
                " evictions, %" PRIu64 " reclaims of decayed keys\n",
                tg_algorithm_name(alg), steps, m->evictions, m->reclaims);
  assert_true(m->evictions > steps / 100);
  free(m->mem);
  free(m);
}

static void model_with_eviction(void **state) {
  (void)state;
  uint64_t steps = env_u64("TG_EVICT_STEPS", 200000);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    model_run((tg_algorithm)a, steps);
}

/* ---- 5. threads ---- */

#define THREADS 4
#define CALLS 20000

typedef struct stress {
  tg__table t;
  tg_algorithm alg;
  int id;
  unsigned errors, ok;
  int first_error;
} stress;

static void *stress_thread(void *arg) {
  stress *s = arg;
  const tg_quota quota = {1000, 3600000, 1000}; /* nothing decays */
  tg__call c;
  memset(&c, 0, sizeof c);
  c.op = TG__OP_HIT;
  c.alg = s->alg;
  c.arg = 1;
  c.now_us = T0;
  if (tg__quota_prepare(&c.q, &quota, s->alg) != TG_OK)
    return NULL;
  char key[32];
  for (int i = 0; i < CALLS; i++) {
    /* half on 4 hot keys, half on ever new ones: every insert evicts */
    int n = i % 2 ? snprintf(key, sizeof key, "hot%d", i % 8 / 2)
                  : snprintf(key, sizeof key, "t%d-%d", s->id, i);
    c.key = key;
    c.key_len = (size_t)n;
    tg__outcome o;
    int rc = i % 97 == 0 ? tg__table_reset(&s->t, key, (size_t)n)
                         : tg__table_exec(&s->t, &c, &o);
    if (rc == TG_OK) {
      s->ok++;
    } else if (s->errors++ == 0) {
      s->first_error = rc;
    }
  }
  return NULL;
}

static void evictions_race_decisions(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++)
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      tg_algorithm alg = (tg_algorithm)a;
      tg__table_params p = {alg, 32, 32, 4, shared == 1, 2000, true};
      size_t bytes = (tg__table_bytes(&p) + 63) & ~(size_t)63;
      void *mem = aligned_alloc(64, bytes);
      assert_non_null(mem);
      memset(mem, 0, bytes);
      tg__table t;
      assert_int_equal(tg__table_init(&t, mem, &p), TG_OK);
      stress s[THREADS];
      pthread_t th[THREADS];
      for (int i = 0; i < THREADS; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].t = t;
        s[i].alg = alg;
        s[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, stress_thread, &s[i]), 0);
      }
      unsigned errors = 0;
      int first = 0;
      for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        if (s[i].errors && !errors)
          first = s[i].first_error;
        errors += s[i].errors;
      }
      if (errors)
        print_error("%s, %s: %u calls failed, first %s\n",
                    tg_algorithm_name(alg), shared ? "shared" : "private",
                    errors, tg_err_name(first));
      tg__table_check chk;
      assert_int_equal(tg__table_validate(&t, &chk), TG_OK);
      if (chk.errors)
        print_error("validate: %s\n", chk.first_error);
      assert_int_equal(chk.errors, 0);
      assert_int_equal(chk.live_slots, chk.live_counter);
      assert_true(chk.live_slots <= 32);
      assert_int_equal(t.h->horizon_us, 0); /* only evictions happened */
      assert_int_equal(t.h->lock, 0);
      free(mem);
      /* a racing decision can win over an eviction a few times in a row
       * (then TG_EFULL); nothing else is an acceptable answer */
      assert_true(errors <= THREADS * CALLS / 100);
      for (int i = 0; i < THREADS; i++)
        assert_true(s[i].errors == 0 || s[i].first_error == TG_EFULL);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(evicts_the_key_closest_to_fresh, unlink_seg),
      cmocka_unit_test_teardown(long_keys_evict_a_long_key, unlink_seg),
      cmocka_unit_test(model_with_eviction),
      cmocka_unit_test(evictions_race_decisions),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, unlink_seg));
}
