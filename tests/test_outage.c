/* SPDX-License-Identifier: MIT */
/*
 * test_outage.c - surviving a store outage, against a real redis-server
 * (tests/redis/with_redis.sh):
 *   - TG_POLICY_FALLBACK: Redis killed while several hosts (one limiter
 *     each) hammer a key: each host then admits exactly limit /
 *     fallback_share on its own, marked degraded; Redis restarted: exact
 *     store decisions again, without help. Rounding, buckets, a full local
 *     table, and what it does not cover (non-hit operations);
 *   - the deny cache: a differential test of every algorithm against the
 *     memory store without a cache, on random sequences (it may never deny
 *     what the store would allow, and its retry_after_ms is the store's or
 *     1 ms less), and the round trips it saves under an abusive client (one
 *     key at 100 times its limit), counted by the server's statistics;
 *     resets, sets, another quota and the server's clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "redis_server.h"
#include "tollgate.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MS(x) ((uint64_t)(x)*UINT64_C(1000))

static uint64_t real_us(void) { return tg_clock_realtime(NULL); }

static int server_up(void **state) {
  (void)state;
  rs_resume();
  if (!rs_alive() && !rs_start())
    return -1;
  return 0;
}

static char *prefix_of(const char *what) {
  static char buf[16][48];
  static unsigned n;
  char *p = buf[n++ % 16];
  snprintf(p, 48, "out%ld.%s.%u", (long)getpid(), what, n);
  return p;
}

static tg_limiter *make(tg_algorithm alg, const char *prefix, tg_policy policy,
                        uint32_t share, uint64_t deny_entries) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = policy;
  cfg.fallback_share = share;
  cfg.deny_cache_entries = deny_entries;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = prefix;
  rc.connect_timeout_ms = 500;
  rc.command_timeout_ms = 500;
  rc.reconnect_backoff_ms = 50;
  rc.pool_size = 2;
  cfg.redis = &rc;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static long long decisions_run(redisContext *c) {
  redisReply *r = rs_cmd(c, "INFO commandstats");
  assert_non_null(r);
  long long n = 0;
  static const char *const names[] = {
      "cmdstat_evalsha:calls=", "cmdstat_tg.step:calls=",
      "cmdstat_tg.step_ro:calls="};
  for (size_t i = 0; i < 3; i++) {
    const char *p = strstr(r->str, names[i]);
    if (p)
      n += strtoll(p + strlen(names[i]), NULL, 10);
  }
  freeReplyObject(r);
  return n;
}

/* ---- configuration --------------------------------------------------------
 */

static void config_is_validated(void **state) {
  (void)state;
  tg_config cfg;
  tg_limiter *lim = NULL;
  tg_config_init(&cfg);
  assert_int_equal(cfg.fallback_share, 1);
  assert_int_equal(cfg.deny_cache_entries, 0);
  cfg.fallback_share = 0;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.fallback_share = 65537;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_config_init(&cfg);
  cfg.deny_cache_entries = (UINT64_C(1) << 24) + 1;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_config_init(&cfg);
  cfg.on_failure = TG_POLICY_FALLBACK;
  cfg.fallback_share = 65536;
  cfg.deny_cache_entries = UINT64_C(1) << 24;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_limiter_destroy(lim);
  tg_stats st;
  assert_int_equal(tg_limiter_stats(NULL, &st, sizeof st), TG_EINVAL);
}

/* ---- the fallback -----------------------------------------------------------
 */

enum { HOSTS = 3, FL = 30 };
enum { BEFORE = 0, DOWN = 1, AFTER = 2 };

typedef struct host {
  tg_limiter *lim;
  atomic_int *phase, *stop;
  /* admitted by the store in its first life, and after its restart; by
   * the fallback; degraded answers; anything unexpected */
  long first, again, local, degraded, bad;
} host;

static void *host_run(void *arg) {
  host *h = arg;
  tg_quota q = {.limit = FL, .period_ms = 3600000};
  while (!atomic_load(h->stop)) {
    tg_result r;
    int phase = atomic_load(h->phase);
    int rc = tg_hit(h->lim, "hot", 3, &q, 1, &r);
    long add = r.allowed ? 1 : 0;
    if (rc == TG_OK && !r.degraded) {
      if (phase == AFTER)
        __atomic_fetch_add(&h->again, add, __ATOMIC_RELAXED);
      else
        __atomic_fetch_add(&h->first, add, __ATOMIC_RELAXED);
    } else if ((rc == TG_ECONNECT || rc == TG_ETIMEDOUT) && r.degraded) {
      __atomic_fetch_add(&h->degraded, 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&h->local, add, __ATOMIC_RELAXED);
    } else {
      __atomic_fetch_add(&h->bad, 1, __ATOMIC_RELAXED);
    }
    rs_sleep_ms(1);
  }
  return NULL;
}

static long total(const host *h, int field) {
  long s = 0;
  for (int i = 0; i < HOSTS; i++) {
    const long *f = field == 0   ? &h[i].first
                    : field == 1 ? &h[i].again
                    : field == 2 ? &h[i].degraded
                                 : &h[i].local;
    s += __atomic_load_n(f, __ATOMIC_RELAXED);
  }
  return s;
}

static void fallback_shares_the_limit_while_down(void **state) {
  (void)state;
  const char *prefix = prefix_of("fb");
  host h[HOSTS];
  pthread_t th[HOSTS];
  atomic_int phase = BEFORE, stop = 0;
  for (int i = 0; i < HOSTS; i++) {
    memset(&h[i], 0, sizeof h[i]);
    /* one limiter per host: each has its own local store */
    h[i].lim =
        make(TG_FIXED_WINDOW_PER_KEY, prefix, TG_POLICY_FALLBACK, HOSTS, 0);
    h[i].phase = &phase;
    h[i].stop = &stop;
    pthread_create(&th[i], NULL, host_run, &h[i]);
  }
  /* the store decides: FL admitted in all, then denials */
  while (total(h, 0) < FL)
    rs_sleep_ms(5);
  rs_sleep_ms(100);
  atomic_store(&phase, DOWN);
  assert_true(rs_stop());
  /* every host decides alone, under FL / HOSTS; wait until each has been
   * refused locally too */
  for (int i = 0; i < HOSTS; i++)
    while (__atomic_load_n(&h[i].degraded, __ATOMIC_RELAXED) < 3 * FL / HOSTS)
      rs_sleep_ms(5);
  atomic_store(&phase, AFTER);
  assert_true(rs_start()); /* empty: the store starts counting again */
  while (total(h, 1) < FL)
    rs_sleep_ms(5);
  rs_sleep_ms(100);
  atomic_store(&stop, 1);
  for (int i = 0; i < HOSTS; i++)
    pthread_join(th[i], NULL);
  long degraded = 0;
  for (int i = 0; i < HOSTS; i++) {
    print_message("host %d: %ld admitted by the store, %ld by its fallback "
                  "(of %ld degraded answers), %ld after the restart\n",
                  i, h[i].first, h[i].local, h[i].degraded, h[i].again);
    assert_int_equal(h[i].bad, 0);
    assert_int_equal(h[i].local, FL / HOSTS); /* at most, and exactly */
    degraded += h[i].degraded;
    tg_stats st;
    assert_int_equal(tg_limiter_stats(h[i].lim, &st, sizeof st), TG_OK);
    assert_int_equal(st.fallback_decisions, (uint64_t)h[i].degraded);
  }
  assert_true(degraded > 0);
  assert_int_equal(total(h, 0), FL); /* exact before */
  assert_int_equal(total(h, 1), FL); /* and exact again after */
  for (int i = 0; i < HOSTS; i++)
    tg_limiter_destroy(h[i].lim);
}

static void fallback_rounding_and_buckets(void **state) {
  (void)state;
  assert_true(rs_stop());
  tg_result r;
  /* a share below one call: this host may admit nothing */
  tg_limiter *lim =
      make(TG_FIXED_WINDOW, prefix_of("fr"), TG_POLICY_FALLBACK, 3, 0);
  tg_quota q2 = {.limit = 2, .period_ms = 60000};
  assert_int_equal(tg_hit(lim, "k", 1, &q2, 1, &r), TG_ECONNECT);
  assert_true(r.degraded && !r.allowed);
  assert_int_equal(r.retry_after_ms, 60000);
  /* 10 / 3: 3 calls */
  tg_quota q10 = {.limit = 10, .period_ms = 60000};
  int admitted = 0;
  for (int i = 0; i < 10; i++) {
    assert_int_equal(tg_hit(lim, "j", 1, &q10, 1, &r), TG_ECONNECT);
    admitted += r.allowed;
  }
  assert_int_equal(admitted, 3);
  /* other operations are not decisions: their code, no fallback */
  uint64_t v;
  assert_int_equal(tg_get(lim, "j", 1, &q10, &v), TG_ECONNECT);
  tg_limiter_destroy(lim);
  /* a token bucket: rate and burst are shared (4 / 4 per hour, 12 / 4) */
  lim = make(TG_TOKEN_BUCKET, prefix_of("fr"), TG_POLICY_FALLBACK, 4, 0);
  tg_quota qb = {.limit = 4, .period_ms = 3600000, .burst = 12};
  admitted = 0;
  for (int i = 0; i < 10; i++) {
    assert_int_equal(tg_hit(lim, "b", 1, &qb, 1, &r), TG_ECONNECT);
    assert_true(r.degraded);
    admitted += r.allowed;
  }
  assert_int_equal(admitted, 3);
  tg_limiter_destroy(lim);
  /* the local table full: the fallback cannot decide, and answers as
   * TG_POLICY_FAIL_OPEN */
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.on_failure = TG_POLICY_FALLBACK;
  cfg.capacity = 2;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = prefix_of("fr");
  cfg.redis = &rc;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_quota q1 = {.limit = 1, .period_ms = 3600000};
  for (int i = 0; i < 2; i++) {
    char key[4] = {'a', (char)('0' + i), 0, 0};
    assert_int_equal(tg_hit(lim, key, 2, &q1, 1, &r), TG_ECONNECT);
    assert_true(r.allowed);
    assert_int_equal(tg_hit(lim, key, 2, &q1, 1, &r), TG_ECONNECT);
    assert_false(r.allowed); /* decided locally */
  }
  assert_int_equal(tg_hit(lim, "z", 1, &q1, 1, &r), TG_ECONNECT);
  assert_true(r.degraded && r.allowed);
  assert_int_equal(tg_hit(lim, "z", 1, &q1, 1, &r), TG_ECONNECT);
  assert_true(r.degraded && r.allowed); /* not limited: no room */
  /* batches take the same path */
  tg_batch_item it[3] = {{"a0", 2, &q1, 1, 0, {0}},
                         {"a1", 2, &q1, 1, 0, {0}},
                         {"y", 1, &q1, 1, 0, {0}}};
  assert_int_equal(tg_hit_batch(lim, it, 3), TG_OK);
  assert_int_equal(it[0].status, TG_ECONNECT);
  assert_false(it[0].result.allowed);
  assert_true(it[0].result.degraded);
  tg_limiter_destroy(lim);
  assert_true(rs_start());
}

/* ---- the deny cache
 * ---------------------------------------------------------- */

static uint64_t rng;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * UINT64_C(2685821657736338717);
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

static const tg_quota DQ[] = {{3, 1000, 0}, {10, 60000, 5}, {5, 250, 8},
                              {2, 100, 0},  {7, 3000, 2},   {100, 1000, 0}};
#define NDQ (sizeof DQ / sizeof DQ[0])

/* The cache against the memory store (no cache: the model) on one
 * algorithm. Every answer's allowed must agree; an answer from the store
 * must agree in full (for the windows the cache's denials were not counted
 * in the store, so count is left out there); an answer from the cache has
 * the model's retry time or 1 ms less. */
static void deny_differential(tg_algorithm alg, uint64_t seed, size_t steps) {
  rng = seed;
  tg_limiter *red = make(alg, prefix_of("dd"), TG_POLICY_ERROR, 1, 16);
  tg_config mc;
  tg_config_init(&mc);
  mc.algorithm = alg;
  mc.clean_period_ms = 0;
  tg_limiter *mem = NULL;
  assert_int_equal(tg_limiter_new(&mem, &mc), TG_OK);
  bool windows = alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
  static const char *const keys[] = {"a", "b", "c", "d", "e"};
  const tg_quota *kq[5];
  bool admitted_since[5] = {false}; /* since the key's last store denial */
  uint64_t denied_cost[5] = {0};    /* that denial's cost */
  /* the latest time the cache answered the key at, while the store has
   * not decided it at that time or later since (0: none) */
  uint64_t cached_at[5] = {0};
  /* the keys start on distinct quotas: the windows keep them, and five
   * keys all on the loosest one left the cache 142 calls to answer (seed
   * 1810001908); on distinct quotas the least of 80 runs was 561 */
  size_t q0 = (size_t)below(NDQ);
  for (size_t k = 0; k < 5; k++)
    kq[k] = &DQ[(q0 + k) % NDQ];
  uint64_t now = real_us();
  size_t cached = 0, from_store = 0, denied = 0, allowed = 0;
  for (size_t i = 0; i < steps; i++) {
    int k = (int)below(5);
    /* a key's quota changes now and then; not for the windows, whose
     * denials answered by the cache are not added to the stored count:
     * invisible under the key's quota, visible under another. Nor for a
     * sliding log the cache answered later than the store last saw it:
     * the store's refusal would have dropped the entries the call's period
     * expired, the cache's writes nothing, and under a longer period those
     * entries still count (stricter; documented at the deny cache) */
    if (!windows && (alg != TG_SLIDING_WINDOW || !cached_at[k]) &&
        below(100) == 0)
      kq[k] = &DQ[below(NDQ)];
    uint64_t cap = kq[k]->burst ? kq[k]->burst : kq[k]->limit;
    uint64_t cost = below(5) == 0 ? 1 + below(cap + 1) : 1;
    if (below(30) == 0)
      cost = 0;
    tg_stats before, after;
    tg_limiter_stats(red, &before, sizeof before);
    tg_result a, b;
    int rm = tg_hit_at(mem, now, keys[k], 1, kq[k], cost, &a);
    int rr = tg_hit_at(red, now, keys[k], 1, kq[k], cost, &b);
    tg_limiter_stats(red, &after, sizeof after);
    bool from_cache = after.deny_cache_hits != before.deny_cache_hits;
    bool ok = rm == rr && a.allowed == b.allowed && a.degraded == b.degraded;
    if (ok && from_cache) {
      /* a lower bound of the store's wait (the key may have admitted
       * smaller costs since, or the cost is larger than the denial's) */
      ok = !b.allowed && b.retry_after_ms >= 1 &&
           b.retry_after_ms <= a.retry_after_ms &&
           (b.retry_after_ms == TG_NEVER) == (a.retry_after_ms == TG_NEVER);
      /* the same cost as the denial it copies, nothing admitted since: the
       * store's wait, or 1 ms less */
      if (ok && !admitted_since[k] && cost == denied_cost[k] &&
          a.retry_after_ms != TG_NEVER)
        ok = b.retry_after_ms + 1 >= a.retry_after_ms;
    } else if (ok) {
      ok = a.remaining == b.remaining && a.retry_after_ms == b.retry_after_ms &&
           (windows ||
            (a.count == b.count && a.reset_after_ms == b.reset_after_ms));
    }
    if (!ok) {
      print_error("seed %" PRIu64 " step %zu (%s, key %s, quota {%" PRIu64
                  ", %" PRIu64 ", %" PRIu64 "}, cost %" PRIu64 ", %s):\n"
                  "  model %s allowed=%d degraded=%d count=%" PRIu64
                  " remaining=%" PRIu64 " retry=%" PRIu64 "\n  cache %s "
                  "allowed=%d degraded=%d count=%" PRIu64 " remaining=%" PRIu64
                  " retry=%" PRIu64 "\n",
                  seed, i, tg_algorithm_name(alg), keys[k], kq[k]->limit,
                  kq[k]->period_ms, kq[k]->burst, cost,
                  from_cache ? "from the cache" : "from the store",
                  tg_err_name(rm), a.allowed, a.degraded, a.count, a.remaining,
                  a.retry_after_ms, tg_err_name(rr), b.allowed, b.degraded,
                  b.count, b.remaining, b.retry_after_ms);
      fail();
    }
    if (from_cache)
      cached++;
    else
      from_store++;
    if (from_cache && now > cached_at[k])
      cached_at[k] = now;
    else if (!from_cache && now >= cached_at[k])
      cached_at[k] = 0;
    if (rr == TG_OK && b.allowed)
      admitted_since[k] = true;
    else if (rr == TG_OK && !from_cache) {
      admitted_since[k] = false;
      denied_cost[k] = cost;
    }
    if (rm == TG_OK)
      a.allowed ? allowed++ : denied++;
    /* small steps, so denials are met again before they expire; now and
     * then a jump past them, or a step back (time never moves state
     * backwards: a cached denial still holds) */
    uint64_t step = below(10) == 0 ? MS(below(3000)) : below(MS(20));
    now += step;
    if (below(50) == 0)
      now -= below(MS(5));
  }
  print_message("%s (seed %" PRIu64 "): %zu calls, %zu answered by the "
                "cache, %zu by the store (%zu allowed, %zu denied)\n",
                tg_algorithm_name(alg), seed, steps, cached, from_store,
                allowed, denied);
  assert_true(cached > steps / 25);
  assert_true(allowed > steps / 20);
  tg_limiter_destroy(red);
  tg_limiter_destroy(mem);
}

static void deny_cache_never_denies_what_the_store_allows(void **state) {
  (void)state;
  uint64_t seed = (uint64_t)time(NULL);
  const char *fixed = getenv("TG_TEST_OUTAGE_SEED");
  if (fixed)
    seed = strtoull(fixed, NULL, 10);
  for (int alg = 0; alg < TG_ALGORITHM_COUNT; alg++)
    deny_differential((tg_algorithm)alg, seed + (uint64_t)alg, 4000);
}

static void deny_cache_forgets_and_matches_quota(void **state) {
  (void)state;
  redisContext *c = rs_connect();
  assert_non_null(c);
  tg_limiter *lim =
      make(TG_FIXED_WINDOW_PER_KEY, prefix_of("df"), TG_POLICY_ERROR, 1, 8);
  tg_quota q = {.limit = 2, .period_ms = 3600000};
  tg_result r;
  for (int i = 0; i < 3; i++)
    assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.allowed);
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK); /* cached */
  assert_false(r.allowed);
  assert_int_equal(decisions_run(c), 0);
  /* another quota is another question: the store answers */
  tg_quota q5 = {.limit = 5, .period_ms = 3600000};
  assert_int_equal(tg_hit(lim, "k", 1, &q5, 1, &r), TG_OK);
  assert_int_equal(decisions_run(c), 1);
  /* a reset or a set on this limiter forgets the key */
  assert_int_equal(tg_reset(lim, "k", 1), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.allowed); /* denied again: cached */
  assert_int_equal(tg_set(lim, "k", 1, &q, 0), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  /* a batch: the denied keys are answered locally, the rest go out */
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.allowed);
  long long before = decisions_run(c);
  tg_batch_item it[3] = {{"k", 1, &q, 1, 0, {0}},
                         {"fresh", 5, &q, 1, 0, {0}},
                         {"k", 1, &q, 1, 0, {0}}};
  assert_int_equal(tg_hit_batch(lim, it, 3), TG_OK);
  assert_false(it[0].result.allowed);
  assert_true(it[1].result.allowed);
  assert_false(it[2].result.allowed);
  assert_int_equal(decisions_run(c) - before, 1);
  tg_limiter_destroy(lim);
  redisFree(c);
}

/* One key hammered at 100 times its limit: how many decisions reach the
 * server with the cache and without. Simulated time (the _at calls): the
 * count is a property of the sequence, not of the machine's speed. */
static long long abusive_client(uint64_t deny_entries, long long *calls) {
  redisContext *c = rs_connect();
  assert_non_null(c);
  tg_limiter *lim =
      make(TG_FIXED_WINDOW, prefix_of("ab"), TG_POLICY_ERROR, 1, deny_entries);
  tg_quota q = {.limit = 10, .period_ms = 1000}; /* 10 per second */
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  uint64_t t0 = (real_us() / MS(1000) + 1) * MS(1000); /* a window's start */
  long long n = 0, admitted = 0;
  for (int s = 0; s < 20; s++) {     /* 20 s */
    for (int i = 0; i < 1000; i++) { /* 1000 per second: 100 times */
      tg_result r;
      assert_int_equal(
          tg_hit_at(lim, t0 + MS(s * 1000 + i), "abuser", 6, &q, 1, &r), TG_OK);
      admitted += r.allowed;
      n++;
    }
  }
  assert_int_equal(admitted, 20 * 10); /* the same decisions either way */
  long long sent = decisions_run(c);
  *calls = n;
  tg_limiter_destroy(lim);
  redisFree(c);
  return sent;
}

static void deny_cache_saves_round_trips(void **state) {
  (void)state;
  long long calls = 0;
  long long without = abusive_client(0, &calls);
  long long with = abusive_client(1024, &calls);
  print_message("one key at 100x its limit: %lld decisions; %lld reached "
                "the server without the deny cache, %lld with it (%.1f%% of "
                "the round trips saved)\n",
                calls, without, with,
                100.0 * (double)(without - with) / (double)without);
  assert_int_equal(without, calls);
  /* per 1 s window: 10 allowed + the first denial reach the server, and
   * the calls of the window's last ms (the cache stops 1 ms early) */
  assert_int_equal(with, 20 * (10 + 1 + 1));
}

/* On the server's clock the cache counts on this host's monotonic clock,
 * from when the denied call was sent. */
static void deny_cache_on_the_servers_clock(void **state) {
  (void)state;
  redisContext *c = rs_connect();
  assert_non_null(c);
  tg_limiter *lim =
      make(TG_TOKEN_BUCKET, prefix_of("dc"), TG_POLICY_ERROR, 1, 8);
  /* one token per 2 s: a denial holds for up to 1,999 ms, room for the
   * calls below on a slow sanitizer build on a busy host */
  tg_quota q = {.limit = 1, .period_ms = 2000, .burst = 1};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.allowed);
  uint64_t retry = r.retry_after_ms;
  assert_true(retry > 1 && retry <= 2000);
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  /* a smaller cost may pass earlier: not covered by the denial (here it
   * is a peek, so the store answers) */
  assert_int_equal(tg_hit(lim, "k", 1, &q, 0, &r), TG_OK);
  assert_int_equal(decisions_run(c), 1);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.allowed);
  assert_int_equal(decisions_run(c), 1); /* cached */
  /* once the retry time has passed, the store decides, and allows */
  rs_sleep_ms((long)retry + 5);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  assert_int_equal(decisions_run(c), 2);
  tg_limiter_destroy(lim);
  redisFree(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(config_is_validated, server_up),
      cmocka_unit_test_setup(fallback_shares_the_limit_while_down, server_up),
      cmocka_unit_test_setup(fallback_rounding_and_buckets, server_up),
      cmocka_unit_test_setup(deny_cache_never_denies_what_the_store_allows,
                             server_up),
      cmocka_unit_test_setup(deny_cache_forgets_and_matches_quota, server_up),
      cmocka_unit_test_setup(deny_cache_saves_round_trips, server_up),
      cmocka_unit_test_setup(deny_cache_on_the_servers_clock, server_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
