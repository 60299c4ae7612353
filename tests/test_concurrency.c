/* SPDX-License-Identifier: MIT */
/*
 * test_concurrency.c - stress tests of the memory store under many threads,
 * meant to run under ThreadSanitizer (the tsan preset) as well as normally.
 *
 * Every claim is checked after pthread_join: worker threads only record what
 * they saw (cmocka's asserts long-jump and must not run off the main thread).
 *
 *   a. T threads x M hits on one key, fixed window (and sliding log, leaky
 *      bucket) of limit L at one instant: exactly L allowed, and the window's
 *      count equals every hit (denied ones included).
 *   b. token bucket with no refill and capacity C: exactly C allowed.
 *   c. per-key window: N threads that all find the window ended open exactly
 *      one new window, and every hit is counted in it.
 *   d. the cleaner (a 1 ms background thread and a thread cleaning in a loop)
 *      racing with hits, round after round, on all five algorithms: every
 *      key admits exactly L per period, never more (no live state dropped)
 *      and never less (no update lost).
 *   e. T threads creating and hitting the same 3,000 long keys in different
 *      orders (fixed window) or sliding keys (their logs), so that the
 *      arenas grow by extents while other threads look keys up in them:
 *      every key admits exactly its limit.
 *   f. T threads on one sliding key after another, each call at its own
 *      microsecond, so that each log moves up through the block sizes
 *      (64 B on) while the others wait on its lock: exactly the limit
 *      admitted, and all of it still in the log.
 *   g. tg_clock_latest from threads whose clocks lag one another: each sees
 *      one timeline that never goes back, and the word ends at the latest.
 *   h. a reclaim racing the creation of the key it reclaims: threads whose
 *      clocks lag a cleaning thread's by half a period create and hit new
 *      fixed-window keys in a tiny table, the cleaner reclaims each full
 *      window as soon as it exists: a key then lives at most once in its
 *      first window and once in the next (the horizon sends a lagging call
 *      to the next), so it admits at most twice its limit a round. A call
 *      that had found the key absent before a reclaim must not publish the
 *      window it made then (its count restarting at 1).
 *   i. policies of reservations whose other rule loses its race: T
 *      threads at one instant, each step, reserve on one token bucket
 *      behind a fixed window of limit 1 on a key of that step, so all but
 *      one are refused by the window, some after their bucket rule was
 *      taken: the ones given back must not hand out a slot already
 *      promised (every accepted delay is a distinct multiple of T).
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tollgate.h"

#define THREADS 4
#define T0 UINT64_C(1700000000000000) /* us: a fixed instant */

static tg_limiter *make(tg_algorithm alg, uint64_t clean_period_ms,
                        uint64_t older_than_ms, tg_clock_fn clock,
                        void *clock_ctx) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = 1024;
  cfg.clean_period_ms = clean_period_ms;
  cfg.key_older_than_ms = older_than_ms;
  if (clock) {
    cfg.clock = clock;
    cfg.clock_ctx = clock_ctx;
  }
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

/* ---- a, b: one key, one instant ---- */

typedef struct hammer {
  tg_limiter *lim;
  const tg_quota *q;
  uint64_t now_us;
  const char *key;
  unsigned hits;
  pthread_barrier_t *start;
  unsigned allowed; /* out */
  unsigned errors;  /* out: non-zero return codes */
} hammer;

static void *hammer_run(void *arg) {
  hammer *h = arg;
  pthread_barrier_wait(h->start);
  for (unsigned i = 0; i < h->hits; i++) {
    tg_result r;
    int rc = tg_hit_at(h->lim, h->now_us, h->key, strlen(h->key), h->q, 1, &r);
    if (rc != TG_OK)
      h->errors++;
    else if (r.allowed)
      h->allowed++;
  }
  return NULL;
}

/* Runs THREADS hammers of `hits` each; returns the total allowed. */
static unsigned hammer_all(tg_limiter *lim, const tg_quota *q, uint64_t now_us,
                           const char *key, unsigned hits) {
  pthread_t th[THREADS];
  hammer h[THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  for (int i = 0; i < THREADS; i++) {
    h[i] = (hammer){lim, q, now_us, key, hits, &start, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, hammer_run, &h[i]), 0);
  }
  unsigned allowed = 0, errors = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    allowed += h[i].allowed;
    errors += h[i].errors;
  }
  pthread_barrier_destroy(&start);
  assert_int_equal(errors, 0);
  return allowed;
}

static void exactly_limit_one_key(tg_algorithm alg, uint64_t expect_count) {
  tg_limiter *lim = make(alg, 0, 0, NULL, NULL);
  const tg_quota q = {.limit = 1000, .period_ms = 60000, .burst = 0};
  const unsigned hits = 5000;
  unsigned allowed = hammer_all(lim, &q, T0, "hot", hits);
  assert_int_equal(allowed, 1000);
  uint64_t v;
  assert_int_equal(tg_get_at(lim, T0, "hot", 3, &q, &v), TG_OK);
  assert_int_equal(v, expect_count ? expect_count : 1000);
  tg_limiter_destroy(lim);
}

static void a_fixed_window_exact(void **state) {
  (void)state;
  /* denied calls are counted: the count is every hit */
  exactly_limit_one_key(TG_FIXED_WINDOW, (uint64_t)THREADS * 5000);
}

static void a_per_key_window_exact(void **state) {
  (void)state;
  exactly_limit_one_key(TG_FIXED_WINDOW_PER_KEY, (uint64_t)THREADS * 5000);
}

static void a_sliding_window_exact(void **state) {
  (void)state;
  exactly_limit_one_key(TG_SLIDING_WINDOW, 0);
}

static void a_leaky_bucket_exact(void **state) {
  (void)state;
  exactly_limit_one_key(TG_LEAKY_BUCKET, 0); /* level = burst */
}

static void b_token_bucket_no_refill(void **state) {
  (void)state;
  tg_limiter *lim = make(TG_TOKEN_BUCKET, 0, 0, NULL, NULL);
  /* one token per 11.5 days, time standing still: nothing refills */
  const tg_quota q = {.limit = 1, .period_ms = 1000000000, .burst = 777};
  unsigned allowed = hammer_all(lim, &q, T0, "bucket", 3000);
  assert_int_equal(allowed, 777);
  uint64_t v;
  assert_int_equal(tg_get_at(lim, T0, "bucket", 6, &q, &v), TG_OK);
  assert_int_equal(v, 0);
  tg_limiter_destroy(lim);
}

/* ---- c: per-key window opened once ---- */

static void c_per_key_window_opened_once(void **state) {
  (void)state;
  tg_limiter *lim = make(TG_FIXED_WINDOW_PER_KEY, 0, 0, NULL, NULL);
  const tg_quota q = {.limit = 100, .period_ms = 1000, .burst = 0};
  for (int round = 0; round < 20; round++) {
    /* every round starts when the previous window has just ended */
    uint64_t t = T0 + (uint64_t)round * 1000000u;
    unsigned allowed = hammer_all(lim, &q, t, "pk", 250);
    assert_int_equal(allowed, 100);
    uint64_t count, end_ms;
    assert_int_equal(tg_get_at(lim, t, "pk", 2, &q, &count), TG_OK);
    assert_int_equal(count, (uint64_t)THREADS * 250);
    assert_int_equal(tg_expires_at_at(lim, t, "pk", 2, &q, &end_ms), TG_OK);
    assert_int_equal(end_ms, t / 1000 + 1000); /* one window, opened at t */
  }
  tg_limiter_destroy(lim);
}

/* ---- d: cleaner racing with hits ---- */

#define KEYS 8
#define ROUNDS 600
#define LIMIT 40
#define PER_THREAD 16 /* hits per key per round per thread: 64 >= LIMIT + 1 */
#define PERIOD_MS 10

typedef struct race {
  tg_limiter *lim;
  uint64_t round_now; /* us; the instant of the current round (atomic) */
  int done;           /* atomic */
  pthread_barrier_t *rounds;
  unsigned errors; /* cleaner thread's failed passes */
  size_t cleaned;  /* cleaner thread: keys it reclaimed */
} race;

static uint64_t race_clock(void *ctx) {
  race *r = ctx;
  return __atomic_load_n(&r->round_now, __ATOMIC_ACQUIRE);
}

typedef struct worker {
  race *r;
  unsigned allowed[ROUNDS][KEYS];
  unsigned errors;
  int first_error; /* the first non-zero return code, for the report */
} worker;

static const tg_quota race_q = {
    .limit = LIMIT, .period_ms = PERIOD_MS, .burst = 0};

static void *race_worker(void *arg) {
  worker *w = arg;
  race *r = w->r;
  char key[16];
  for (int round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(r->rounds); /* round_now is set */
    uint64_t now = race_clock(r);
    for (int j = 0; j < PER_THREAD; j++)
      for (int k = 0; k < KEYS; k++) {
        int n = snprintf(key, sizeof key, "key-%d", k);
        tg_result res;
        int rc = tg_hit_at(r->lim, now, key, (size_t)n, &race_q, 1, &res);
        if (rc != TG_OK) {
          if (w->errors++ == 0)
            w->first_error = rc;
        } else if (res.allowed) {
          w->allowed[round][k]++;
        }
      }
    pthread_barrier_wait(r->rounds); /* round over */
  }
  return NULL;
}

static void *race_cleaner(void *arg) {
  race *r = arg;
  while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
    size_t n = 0;
    if (tg_clean_at(r->lim, race_clock(r), &n) != TG_OK)
      r->errors++;
    r->cleaned += n;
  }
  return NULL;
}

static int expired_seen;
static int count_expired(tg_algorithm alg, const tg_expired *e, size_t n,
                         void *ctx) {
  (void)alg;
  (void)e;
  (void)ctx;
  __atomic_fetch_add(&expired_seen, (int)n, __ATOMIC_RELAXED);
  return -1; /* report failure: deletion must go on regardless */
}

static void cleaner_race(tg_algorithm alg) {
  race *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->round_now = T0;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = 64;
  cfg.clean_period_ms = 1; /* the background thread, every ms */
  cfg.key_older_than_ms = 0;
  cfg.clock = race_clock;
  cfg.clock_ctx = r;
  cfg.before_clean = count_expired;
  assert_int_equal(tg_limiter_new(&r->lim, &cfg), TG_OK);
  expired_seen = 0;

  pthread_barrier_t rounds;
  pthread_barrier_init(&rounds, NULL, THREADS + 1);
  r->rounds = &rounds;
  worker *w = calloc(THREADS, sizeof *w);
  assert_non_null(w);
  pthread_t th[THREADS], cl;
  for (int i = 0; i < THREADS; i++) {
    w[i].r = r;
    assert_int_equal(pthread_create(&th[i], NULL, race_worker, &w[i]), 0);
  }
  assert_int_equal(pthread_create(&cl, NULL, race_cleaner, r), 0);
  for (int round = 0; round < ROUNDS; round++) {
    /* Every key's state from the last round is exactly fresh now: the
     * cleaners race to reclaim it while the workers hit it again. */
    __atomic_store_n(&r->round_now, T0 + (uint64_t)round * PERIOD_MS * 1000u,
                     __ATOMIC_RELEASE);
    pthread_barrier_wait(&rounds);
    pthread_barrier_wait(&rounds);
  }
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  pthread_join(cl, NULL);

  unsigned errors = r->errors, wrong = 0;
  for (int i = 0; i < THREADS; i++) {
    errors += w[i].errors;
    if (w[i].errors)
      print_error("%s: worker %d: %u errors, first %s\n",
                  tg_algorithm_name(alg), i, w[i].errors,
                  tg_err_name(w[i].first_error));
  }
  for (int round = 0; round < ROUNDS; round++)
    for (int k = 0; k < KEYS; k++) {
      unsigned sum = 0;
      for (int i = 0; i < THREADS; i++)
        sum += w[i].allowed[round][k];
      if (sum != LIMIT && wrong++ < 5)
        print_error("%s: round %d key %d admitted %u, limit %d\n",
                    tg_algorithm_name(alg), round, k, sum, LIMIT);
    }
  size_t cleaned = r->cleaned;
  tg_limiter_destroy(r->lim);
  pthread_barrier_destroy(&rounds);
  free(w);
  free(r);
  assert_int_equal(errors, 0);
  assert_int_equal(wrong, 0);
  /* the race really happened: the cleaners found expired keys between
   * rounds. Either cleaner may have done all of it (the loop thread counts
   * what it reclaimed, both report to before_clean), so check the total. */
  int seen = __atomic_load_n(&expired_seen, __ATOMIC_RELAXED);
  print_message("%s: cleaning loop reclaimed %zu, before_clean saw %d\n",
                tg_algorithm_name(alg), cleaned, seen);
  assert_true(cleaned + (size_t)seen > 0);
}

static void d_cleaner_fixed_window(void **state) {
  (void)state;
  cleaner_race(TG_FIXED_WINDOW);
}
static void d_cleaner_per_key_window(void **state) {
  (void)state;
  cleaner_race(TG_FIXED_WINDOW_PER_KEY);
}
static void d_cleaner_sliding_window(void **state) {
  (void)state;
  cleaner_race(TG_SLIDING_WINDOW);
}
static void d_cleaner_token_bucket(void **state) {
  (void)state;
  cleaner_race(TG_TOKEN_BUCKET);
}
static void d_cleaner_leaky_bucket(void **state) {
  (void)state;
  cleaner_race(TG_LEAKY_BUCKET);
}

/* ---- e: the arenas grow under lookups ---- */

#define E_KEYS 3000u

typedef struct grower {
  tg_limiter *lim;
  const tg_quota *q;
  unsigned first; /* where this thread starts in the keys */
  bool long_keys;
  pthread_barrier_t *start;
  unsigned allowed[E_KEYS]; /* out */
  unsigned errors;          /* out */
} grower;

static size_t e_key(char *buf, unsigned k, bool long_key) {
  return (size_t)snprintf(buf, 48,
                          long_key ? "a-long-key-of-40-bytes-%016u" : "s%u", k);
}

static void *grower_run(void *arg) {
  grower *g = arg;
  char key[48];
  pthread_barrier_wait(g->start);
  for (unsigned i = 0; i < E_KEYS; i++) {
    unsigned k = (g->first + i) % E_KEYS;
    size_t len = e_key(key, k, g->long_keys);
    tg_result r;
    if (tg_hit_at(g->lim, T0, key, len, g->q, 1, &r) != TG_OK)
      g->errors++;
    else if (r.allowed)
      g->allowed[k]++;
  }
  return NULL;
}

static void arenas_grow(tg_algorithm alg, bool long_keys) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = 4096;
  cfg.clean_period_ms = 0;
  cfg.sliding_max_entries = 8;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  size_t fresh = tg_store_bytes(lim);
  const tg_quota q = {.limit = 3, .period_ms = 60000, .burst = 3};
  grower *g = calloc(THREADS, sizeof *g);
  assert_non_null(g);
  pthread_t th[THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  for (unsigned i = 0; i < THREADS; i++) {
    g[i].lim = lim;
    g[i].q = &q;
    g[i].first = i * (E_KEYS / THREADS) / 2; /* overlapping starts */
    g[i].long_keys = long_keys;
    g[i].start = &start;
    assert_int_equal(pthread_create(&th[i], NULL, grower_run, &g[i]), 0);
  }
  unsigned errors = 0, wrong = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    errors += g[i].errors;
  }
  for (unsigned k = 0; k < E_KEYS; k++) {
    unsigned sum = 0;
    for (int i = 0; i < THREADS; i++)
      sum += g[i].allowed[k];
    if (sum != 3 && wrong++ < 5)
      print_error("%s: key %u admitted %u of %d hits, limit 3\n",
                  tg_algorithm_name(alg), k, sum, THREADS);
  }
  size_t grown = tg_store_bytes(lim);
  size_t held = tg_key_count(lim);
  pthread_barrier_destroy(&start);
  free(g);
  tg_limiter_destroy(lim);
  assert_int_equal(errors, 0);
  assert_int_equal(wrong, 0);
  assert_int_equal(held, E_KEYS);
  assert_true(grown > fresh); /* the arena did grow under the threads */
}

static void e_long_keys_grow_their_arena(void **state) {
  (void)state;
  arenas_grow(TG_FIXED_WINDOW, true);
}

static void e_sliding_logs_grow_their_arena(void **state) {
  (void)state;
  arenas_grow(TG_SLIDING_WINDOW, false);
}

/* ---- f: logs grow under contention ---- */

#define F_KEYS 100u
#define F_HITS 60u   /* per thread and key */
#define F_LIMIT 150u /* < THREADS * F_HITS: every key is refused some */

typedef struct climber {
  tg_limiter *lim;
  const tg_quota *q;
  uint64_t *clock; /* shared: every call takes the next microsecond */
  pthread_barrier_t *step;
  unsigned allowed[F_KEYS], errors; /* out */
} climber;

static void *climber_run(void *arg) {
  climber *cl = arg;
  char key[16];
  for (unsigned k = 0; k < F_KEYS; k++) {
    int len = snprintf(key, sizeof key, "climb%u", k);
    pthread_barrier_wait(cl->step); /* all threads on the key at once */
    for (unsigned i = 0; i < F_HITS; i++) {
      uint64_t now = T0 + __atomic_fetch_add(cl->clock, 1, __ATOMIC_RELAXED);
      tg_result r;
      if (tg_hit_at(cl->lim, now, key, (size_t)len, cl->q, 1, &r) != TG_OK)
        cl->errors++;
      else if (r.allowed)
        cl->allowed[k]++;
    }
  }
  return NULL;
}

static void f_sliding_logs_grow_under_contention(void **state) {
  (void)state;
  tg_limiter *lim = make(TG_SLIDING_WINDOW, 0, 0, NULL, NULL);
  const tg_quota q = {.limit = F_LIMIT, .period_ms = 60000, .burst = 0};
  uint64_t clock = 0;
  pthread_barrier_t step;
  pthread_barrier_init(&step, NULL, THREADS);
  climber *cl = calloc(THREADS, sizeof *cl);
  assert_non_null(cl);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    cl[i].lim = lim;
    cl[i].q = &q;
    cl[i].clock = &clock;
    cl[i].step = &step;
    assert_int_equal(pthread_create(&th[i], NULL, climber_run, &cl[i]), 0);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&step);
  unsigned errors = 0, wrong = 0, wrong_sum = 0;
  char key[16];
  for (unsigned k = 0; k < F_KEYS; k++) {
    unsigned sum = 0;
    for (int i = 0; i < THREADS; i++)
      sum += cl[i].allowed[k];
    int len = snprintf(key, sizeof key, "climb%u", k);
    uint64_t v = 0;
    int rc = tg_get_at(lim, T0 + clock, key, (size_t)len, &q, &v);
    if (sum != F_LIMIT && wrong++ < 5)
      print_error("key %u admitted %u, limit %u\n", k, sum, F_LIMIT);
    if ((rc != TG_OK || v != F_LIMIT) && wrong_sum++ < 5)
      print_error("key %u: its log holds %" PRIu64 " (rc %d)\n", k, v, rc);
  }
  for (int i = 0; i < THREADS; i++)
    errors += cl[i].errors;
  free(cl);
  tg_limiter_destroy(lim);
  assert_int_equal(errors, 0);
  assert_int_equal(wrong, 0);
  assert_int_equal(wrong_sum, 0);
}

/* g: tg_clock_latest from THREADS threads whose clocks lag one another by
 * up to 3 ms: every thread sees its times never go back and never below its
 * own clock, and the word ends at the latest time any thread passed. */
#define G_CALLS 200000

typedef struct latest_caller {
  uint64_t *word;
  uint64_t lag_us, last_own, back, below;
} latest_caller;

static void *latest_run(void *arg) {
  latest_caller *c = arg;
  uint64_t prev = 0;
  for (uint64_t i = 0; i < G_CALLS; i++) {
    uint64_t own = T0 + i * 7 - c->lag_us; /* its clock, behind by lag_us */
    uint64_t t = tg_clock_latest(c->word, own);
    c->back += t < prev;
    c->below += t < own;
    prev = t;
    c->last_own = own;
  }
  return NULL;
}

static void g_clock_latest_one_timeline(void **state) {
  (void)state;
  uint64_t word = 0;
  latest_caller c[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    c[i] = (latest_caller){&word, (uint64_t)i * 1000, 0, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, latest_run, &c[i]), 0);
  }
  uint64_t latest = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(c[i].back, 0);
    assert_int_equal(c[i].below, 0);
    if (c[i].last_own > latest)
      latest = c[i].last_own;
  }
  assert_int_equal(word, latest);
}

/* h: see the top of the file. Rounds of H_KEYS new keys, every call's now
 * in the round's first window [B, B + P), the cleaner at B + 1.5 P. */
#define H_ROUNDS 8000
#define H_KEYS 4
#define H_LIMIT 2
#define H_HITS 24 /* per thread per round */
#define H_P_US UINT64_C(1000000)

typedef struct reclaim_race {
  tg_limiter *lim;
  pthread_barrier_t *bar;
  uint64_t *base;        /* the round's B, written by the main thread */
  unsigned *allowed;     /* [H_ROUNDS][H_KEYS], this thread's */
  unsigned errors, seed; /* errors: calls that did not return TG_OK */
} reclaim_race;

static unsigned h_stop;

static void *h_hitter(void *arg) {
  reclaim_race *w = arg;
  uint64_t s = w->seed * UINT64_C(0x9e3779b97f4a7c15) + 1;
  for (int r = 0; r < H_ROUNDS; r++) {
    pthread_barrier_wait(w->bar);
    uint64_t b = __atomic_load_n(w->base, __ATOMIC_ACQUIRE);
    for (int j = 0; j < H_HITS; j++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      int k = (int)(s % H_KEYS);
      uint64_t now = b + (s >> 8) % H_P_US;
      char key[32];
      int n = snprintf(key, sizeof key, "r%d-k%d", r, k);
      const tg_quota q = {.limit = H_LIMIT, .period_ms = 1000};
      tg_result res;
      if (tg_hit_at(w->lim, now, key, (size_t)n, &q, 1, &res) != TG_OK)
        w->errors++;
      else
        w->allowed[r * H_KEYS + k] += res.allowed;
    }
    pthread_barrier_wait(w->bar);
  }
  return NULL;
}

static void *h_cleaner(void *arg) {
  reclaim_race *w = arg;
  while (!__atomic_load_n(&h_stop, __ATOMIC_ACQUIRE)) {
    uint64_t b = __atomic_load_n(w->base, __ATOMIC_ACQUIRE);
    (void)tg_clean_at(w->lim, b + H_P_US + H_P_US / 2, NULL);
  }
  return NULL;
}

static void h_reclaim_races_creation(void **state) {
  (void)state;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_FIXED_WINDOW;
  cfg.capacity = 8;
  cfg.clean_period_ms = 0;
  cfg.key_older_than_ms = 0;
  cfg.on_failure = TG_POLICY_ERROR;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, THREADS + 1);
  uint64_t base = T0;
  reclaim_race w[THREADS];
  pthread_t th[THREADS], cl;
  for (int i = 0; i < THREADS; i++) {
    w[i] = (reclaim_race){lim, &bar, &base, NULL, 0, (unsigned)i + 1};
    w[i].allowed = calloc(H_ROUNDS * H_KEYS, sizeof *w[i].allowed);
    assert_non_null(w[i].allowed);
    assert_int_equal(pthread_create(&th[i], NULL, h_hitter, &w[i]), 0);
  }
  __atomic_store_n(&h_stop, 0, __ATOMIC_RELEASE);
  assert_int_equal(pthread_create(&cl, NULL, h_cleaner, &w[0]), 0);
  for (int r = 0; r < H_ROUNDS; r++) {
    __atomic_store_n(&base, T0 + (uint64_t)r * 2 * H_P_US, __ATOMIC_RELEASE);
    pthread_barrier_wait(&bar); /* the round starts */
    pthread_barrier_wait(&bar); /* and ends */
  }
  __atomic_store_n(&h_stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  pthread_join(cl, NULL);
  pthread_barrier_destroy(&bar);
  unsigned over = 0, errors = 0, total = 0;
  for (int r = 0; r < H_ROUNDS; r++)
    for (int k = 0; k < H_KEYS; k++) {
      unsigned sum = 0;
      for (int i = 0; i < THREADS; i++)
        sum += w[i].allowed[r * H_KEYS + k];
      total += sum;
      if (sum > 2 * H_LIMIT && over++ < 5)
        print_error("round %d key %d admitted %u, at most %d\n", r, k, sum,
                    2 * H_LIMIT);
    }
  for (int i = 0; i < THREADS; i++) {
    errors += w[i].errors;
    free(w[i].allowed);
  }
  tg_limiter_destroy(lim);
  assert_int_equal(errors, 0);
  assert_int_equal(over, 0);
  /* and the keys did admit: most rounds reach a key's first limit */
  assert_true(total >= (unsigned)H_ROUNDS * H_KEYS * H_LIMIT / 2);
}

/* ---- i. reservations given back under a race ---- */

#define I_STEPS 6000               /* new window keys, in a table of 8192 */
#define I_T_NS UINT64_C(100000000) /* 10 a second: T = 100 ms */

typedef struct i_shared {
  tg_limiter *fw, *tb;
  pthread_barrier_t bar;
  uint64_t delays[THREADS * I_STEPS];
  unsigned n, errors; /* __atomic */
} i_shared;

typedef struct i_worker {
  i_shared *sh;
  int order; /* 0: the window first; 1: the bucket first */
} i_worker;

static void *i_run(void *arg) {
  i_worker *w = arg;
  i_shared *sh = w->sh;
  static const tg_quota qf = {1, 60000, 0}, qb = {10, 1000, 1};
  for (int step = 0; step < I_STEPS; step++) {
    char fk[24];
    int len = snprintf(fk, sizeof fk, "fw:%d", step);
    tg_rule fw = {
        .lim = sh->fw, .key = fk, .key_len = (size_t)len, .q = &qf, .cost = 1};
    tg_rule tb = {.lim = sh->tb, .key = "q", .key_len = 1, .q = &qb, .cost = 1};
    tg_rule r[2];
    uint64_t wait[2];
    r[w->order] = fw;
    wait[w->order] = 0;
    r[1 - w->order] = tb;
    wait[1 - w->order] = 3600000; /* an hour: room for every step */
    tg_rules_reservation out;
    tg_reservation res[2];
    pthread_barrier_wait(&sh->bar);
    if (tg_reserve_rules_at(T0, r, 2, wait, 0, &out, res) != TG_OK) {
      __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
    } else if (out.ok) {
      unsigned j = __atomic_fetch_add(&sh->n, 1, __ATOMIC_RELAXED);
      if (j < THREADS * I_STEPS)
        sh->delays[j] = res[1 - w->order].delay_ns;
    }
  }
  return NULL;
}

static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void i_reservations_given_back(void **state) {
  (void)state;
  for (int order = 0; order < 2; order++) {
    static i_shared sh;
    memset(&sh, 0, sizeof sh);
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.capacity = 8192;
    cfg.clean_period_ms = 0;
    assert_int_equal(tg_limiter_new(&sh.fw, &cfg), TG_OK);
    sh.tb = make(TG_TOKEN_BUCKET, 0, 0, NULL, NULL);
    pthread_barrier_init(&sh.bar, NULL, THREADS);
    pthread_t th[THREADS];
    i_worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
      w[i] = (i_worker){&sh, order};
      pthread_create(&th[i], NULL, i_run, &w[i]);
    }
    for (int i = 0; i < THREADS; i++)
      pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sh.bar);
    assert_int_equal(sh.errors, 0);
    assert_int_equal(sh.n, I_STEPS); /* one a step: the window's */
    qsort(sh.delays, sh.n, sizeof sh.delays[0], u64_cmp);
    unsigned twice = 0, off = 0;
    for (unsigned i = 0; i < sh.n; i++) {
      off += sh.delays[i] % I_T_NS != 0;
      twice += i > 0 && sh.delays[i] == sh.delays[i - 1];
    }
    print_message("order %d: %u reservations, last at %" PRIu64
                  " T, %u slots promised twice\n",
                  order, sh.n, sh.delays[sh.n - 1] / I_T_NS, twice);
    assert_int_equal(off, 0);
    assert_int_equal(twice, 0);
    tg_limiter_destroy(sh.fw);
    tg_limiter_destroy(sh.tb);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_fixed_window_exact),
      cmocka_unit_test(a_per_key_window_exact),
      cmocka_unit_test(a_sliding_window_exact),
      cmocka_unit_test(a_leaky_bucket_exact),
      cmocka_unit_test(b_token_bucket_no_refill),
      cmocka_unit_test(c_per_key_window_opened_once),
      cmocka_unit_test(d_cleaner_fixed_window),
      cmocka_unit_test(d_cleaner_per_key_window),
      cmocka_unit_test(d_cleaner_sliding_window),
      cmocka_unit_test(d_cleaner_token_bucket),
      cmocka_unit_test(d_cleaner_leaky_bucket),
      cmocka_unit_test(e_long_keys_grow_their_arena),
      cmocka_unit_test(e_sliding_logs_grow_their_arena),
      cmocka_unit_test(f_sliding_logs_grow_under_contention),
      cmocka_unit_test(g_clock_latest_one_timeline),
      cmocka_unit_test(h_reclaim_races_creation),
      cmocka_unit_test(i_reservations_given_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
