/* SPDX-License-Identifier: MIT */
/*
 * test_redis.c - the Redis store against a real redis-server (started by
 * tests/redis/with_redis.sh on a loopback port, killed when the test ends).
 *
 * The acceptance tests (test_fixed_window, ..., test_buckets) also run on the
 * Redis store (CTest's *_redis entries); this file covers what is particular
 * to it:
 *   - the differential test: long random sequences of operations, keys,
 *     quotas, costs and time steps through the memory store and the Redis
 *     store side by side, requiring identical codes and results;
 *   - the server's clock (tg_hit without _at), TTLs, key names, batches;
 *   - failures: server killed and restarted, stopped (SIGSTOP: timeouts),
 *     OOM, a BUSY script, killed connections, NOSCRIPT, AUTH, corrupt values,
 *     each giving a status code plus the failure policy's answer marked
 *     degraded, and recovery without help;
 *   - failing fast: once a call has timed out, calls return at once and one
 *     at a time probes, counted by the commands that reach the stopped
 *     server (its INFO commandstats once it resumes), not by timing;
 *   - many threads on one key through the connection pool: exact admission.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/core.h"
#include "differential.h"
#include "fds.h"
#include "redis_server.h"
#include "store/redis_value.h"
#include "tollgate.h"
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MS(x) ((uint64_t)(x)*UINT64_C(1000))

static uint64_t real_us(void) { return tg_clock_realtime(NULL); }

/* A Redis limiter of one algorithm on the test server. */
static tg_limiter *redis_limiter_cfg(tg_algorithm alg, const char *prefix,
                                     tg_redis_config *rc, uint32_t log_max) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.sliding_max_entries = log_max;
  rc->port = rs_port();
  rc->key_prefix = prefix;
  cfg.redis = rc;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static tg_limiter *redis_limiter(tg_algorithm alg, const char *prefix) {
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  return redis_limiter_cfg(alg, prefix, &rc, 1024);
}

static redisContext *admin(void) {
  redisContext *c = rs_connect();
  assert_non_null(c);
  return c;
}

/* The server must be up (a failed test may have left it stopped). */
static int server_up(void **state) {
  (void)state;
  rs_resume();
  if (!rs_alive() && !rs_start())
    return -1;
  redisContext *c = rs_connect();
  if (!c)
    return -1;
  rs_ok(c, "CONFIG SET maxmemory 0");
  rs_ok(c, "CONFIG SET requirepass %s", "");
  redisFree(c);
  return 0;
}

/* ---- configuration ------------------------------------------------------ */

static void available(void **state) {
  (void)state;
  assert_int_equal(tg_redis_available(), 1);
}

static void config_is_validated(void **state) {
  (void)state;
  tg_config cfg;
  tg_redis_config rc;
  tg_limiter *lim = (tg_limiter *)&cfg; /* must be set to NULL on failure */
  tg_config_init(&cfg);
  tg_redis_config_init(&rc);
  cfg.redis = &rc;
  rc.pool_size = 0;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_null(lim);
  tg_redis_config_init(&rc);
  rc.pool_size = 1025;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.key_prefix = "a{b";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  rc.key_prefix = "";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  rc.key_prefix = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.port = 0;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  rc.port = 65536;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.host = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.username = "u"; /* a user without a password */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.db = -1;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  /* a unix socket path a socket address cannot hold: it would be cut, and
   * could name another socket (it was accepted) */
  char path[200];
  memset(path, 'p', sizeof path);
  path[0] = '/';
  path[108] = '\0';
  tg_redis_config_init(&rc);
  rc.unix_path = path;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  path[107] = '\0'; /* 107 bytes: fits */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_limiter_destroy(lim);
  tg_redis_config_init(&rc);
  cfg.shm_name = "/tg-test-redis-and-shm"; /* two stores at once */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.shm_name = NULL;
  /* a valid config needs no server: connecting waits for the first call */
  rc.port = 1; /* nothing listens there */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_quota q = {.limit = 1, .period_ms = 1000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ECONNECT);
  assert_true(r.degraded);
  assert_true(r.allowed); /* fail open, the default */
  assert_int_equal(tg_clean(lim, NULL), TG_ENOTSUP);
  assert_int_equal(tg_key_count(lim), 0);
  assert_int_equal(tg_store_bytes(lim), 0);
  tg_limiter_destroy(lim);
}

/* ---- the differential test ---------------------------------------------- */

/* util.h's generator: reproducible from the seed printed on failure. */
static uint64_t rng_state;
static uint64_t below(uint64_t n) { return rng_below(&rng_state, n); }

/* Quotas from ordinary to the edges of what tollgate accepts; those an
 * algorithm refuses must be refused identically by both stores. */
static const tg_quota QUOTAS[] = {
    {1, 1, 0},
    {3, 1000, 0},
    {10, 60000, 5},
    {55, 1000, 110},
    {1000, 1000, 10},
    {2, 3, 1000000},
    {7, 100, 0},
    {UINT64_C(1) << 40, 1000, 0},
    {UINT64_MAX, 1, 0},
    {UINT64_MAX - 1, 86400000, 3},
    {5, TG_PERIOD_MAX_MS, 0},
    {1000000, 1, 1000000}, /* one per ns: the fastest bucket */
    {1, 3600000, UINT64_C(1) << 20},
};
#define NQUOTAS (sizeof QUOTAS / sizeof QUOTAS[0])

typedef struct dkey {
  unsigned char b[TG_KEY_MAX];
  size_t len;
  const tg_quota *q;
  uint64_t last; /* simulated time of its last call */
  char *seen;    /* its Redis value when last looked at (NULL: absent) */
  size_t seen_len;
} dkey;

#define NKEYS 7

static void make_keys(dkey *k) {
  static const char *const fixed[] = {"a", "user:42", "}{", "b{x}c"};
  for (int i = 0; i < 4; i++) {
    k[i].len = strlen(fixed[i]);
    memcpy(k[i].b, fixed[i], k[i].len);
  }
  k[4].len = 3; /* NUL inside */
  memcpy(k[4].b, "a\0b", 3);
  k[5].len = TG_KEY_MAX; /* the longest key */
  memset(k[5].b, 'L', TG_KEY_MAX);
  k[6].len = 1;
  k[6].b[0] = 0xff;
  for (int i = 0; i < NKEYS; i++) {
    k[i].q = &QUOTAS[below(NQUOTAS)];
    k[i].last = 0;
    k[i].seen = NULL;
    k[i].seen_len = 0;
  }
}

static uint64_t draw_cost(const tg_quota *q) {
  uint64_t cap = q->burst ? q->burst : q->limit;
  switch (below(10)) {
  case 0:
    return 0;
  case 1:
  case 2:
  case 3:
  case 4:
    return 1;
  case 5:
  case 6:
    return 2 + below(4);
  case 7:
    return cap - below(2);
  case 8:
    return cap + below(2);
  default: {
    static const uint64_t huge[] = {UINT64_MAX, UINT64_C(1) << 63,
                                    UINT64_MAX / 3, UINT64_C(1) << 53};
    return huge[below(4)];
  }
  }
}

/* How far simulated time moves, us. */
static uint64_t draw_step(void) {
  switch (below(10)) {
  case 0:
  case 1:
    return 0;
  case 2:
  case 3:
    return 1 + below(999);
  case 4:
  case 5:
  case 6:
    return MS(1 + below(1000));
  case 7:
    return MS(1000 + below(60000));
  case 8:
    return MS(below(3600000));
  default:
    return below(3) == 0 ? MS(86400000) : MS(below(100));
  }
}

static size_t env_steps(size_t dflt) {
  return (size_t)env_u64("TG_TEST_REDIS_STEPS", dflt);
}

/* Simulated time must never fall behind the server's clock by more than it
 * did before (S - R never decreases), so a key the server expires by its TTL
 * (counted from the simulated now) is always fresh in simulated time too. */
static uint64_t advance(uint64_t sim, uint64_t *last_real, uint64_t step) {
  uint64_t r = real_us();
  uint64_t elapsed = r > *last_real ? r - *last_real : 0;
  *last_real = r;
  return sim + (step > elapsed ? step : elapsed);
}

/* The exception: a step back in time of up to 300 ms, allowed while the
 * simulated clock stays within 500 ms of the furthest ahead it has been
 * (relative to the real one), inside the 1 s a TTL has in hand when the
 * caller gives its now. Both stores must then keep what they stored. */
static uint64_t step_back(uint64_t sim, uint64_t last_real, uint64_t *lead_max,
                          uint64_t back) {
  uint64_t lead = sim - last_real;
  if (lead > *lead_max)
    *lead_max = lead;
  if (back > lead || lead - back + MS(500) < *lead_max)
    return sim;
  return sim - back;
}

/* ---- TTLs against the core ----
 * The script computes its TTLs in Lua (it cannot call C) and the module
 * calls the core; both must give a key the time until its state stops
 * mattering by the core's own functions, plus the documented allowance for
 * a caller's now: the key expires between 1 ms before and at
 * ms_until(expiry) + 1000 ms after the call (the script rounds down, the
 * module up). Measured after the call, PTTL may have lost what elapsed. */

static const char SUFFIX[TG_ALGORITHM_COUNT][3] = {"fw", "pk", "sw", "tb",
                                                   "lb"};

/* When the value of key k (of algorithm alg) stops mattering, us, or false
 * when it does not parse. period_us: the writing call's. */
static bool value_expiry(tg_algorithm alg, const char *v, size_t len,
                         uint64_t period_us, uint64_t *expiry) {
  if (alg != TG_SLIDING_WINDOW) {
    tg__state st;
    if (!tg__rv_parse_state(alg, v, len, &st))
      return false;
    *expiry = tg__state_expiry_us(alg, &st);
    return true;
  }
  size_t n;
  if (!tg__rv_log_entries(v, len, &n) || n == 0)
    return false;
  tg__entry *e = calloc(n, sizeof *e);
  uint64_t sum = 0;
  bool ok = e && tg__rv_parse_log(v, n, e, &sum);
  tg__log lg = {e, 0, (uint32_t)n, (uint32_t)n, sum};
  if (ok)
    *expiry = tg__log_expiry_us(&lg, period_us);
  free(e);
  return ok;
}

/* Looks at key k's value and TTL after a call at now that began at real
 * time t0_us; when the call changed the value, checks the TTL. Returns 1
 * when it checked. */
static int check_ttl(redisContext *c, const char *prefix, tg_algorithm alg,
                     dkey *k, uint64_t now, uint64_t t0_us) {
  char name[512];
  size_t n = (size_t)snprintf(name, sizeof name, "%s:{", prefix);
  memcpy(name + n, k->b, k->len);
  n += k->len;
  n += (size_t)snprintf(name + n, sizeof name - n, "}:%s", SUFFIX[alg]);
  redisAppendCommand(c, "GET %b", name, n);
  redisAppendCommand(c, "PTTL %b", name, n);
  redisReply *v = NULL, *t = NULL;
  assert_int_equal(redisGetReply(c, (void **)&v), REDIS_OK);
  assert_int_equal(redisGetReply(c, (void **)&t), REDIS_OK);
  uint64_t elapsed_ms = (real_us() - t0_us + 999) / 1000 + 1;
  int checked = 0;
  bool present = v->type == REDIS_REPLY_STRING;
  bool changed = present && (!k->seen || k->seen_len != v->len ||
                             memcmp(k->seen, v->str, v->len) != 0);
  if (changed) {
    uint64_t expiry;
    assert_true(
        value_expiry(alg, v->str, v->len, k->q->period_ms * 1000, &expiry));
    int64_t core = (int64_t)tg__ms_until(expiry, now);
    assert_int_equal(t->type, REDIS_REPLY_INTEGER);
    if (t->integer > core + 1000 ||
        t->integer + (int64_t)elapsed_ms + 1 < core + 1000) {
      print_error("TTL of %s is %lld ms; the core says %lld + 1000 ms "
                  "(%llu ms elapsed)\n",
                  v->str, t->integer, (long long)core,
                  (unsigned long long)elapsed_ms);
      fail();
    }
    checked = 1;
  }
  free(k->seen);
  k->seen = NULL;
  if (present) {
    k->seen = malloc(v->len ? v->len : 1);
    assert_non_null(k->seen);
    memcpy(k->seen, v->str, v->len);
    k->seen_len = v->len;
  }
  freeReplyObject(v);
  freeReplyObject(t);
  return checked;
}

static void differential(tg_algorithm alg, uint64_t seed, size_t steps,
                         uint32_t log_max, uint64_t ahead_us) {
  static unsigned runs;
  rng_state = seed;
  char prefix[64]; /* a fresh key space for each run */
  snprintf(prefix, sizeof prefix, "diff%ld.%u", (long)getpid(), runs++);
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.pool_size = 2;
  tg_limiter *red = redis_limiter_cfg(alg, prefix, &rc, log_max);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.sliding_max_entries = log_max;
  cfg.capacity = 64;
  cfg.clean_period_ms = 0;
  tg_limiter *mem = NULL;
  assert_int_equal(tg_limiter_new(&mem, &cfg), TG_OK);

  dkey keys[NKEYS];
  make_keys(keys);
  redisContext *look = admin(); /* for the TTL checks */
  size_t ttl_checks = 0;
  uint64_t last_real = real_us();
  uint64_t now = last_real + ahead_us, lead_max = ahead_us;
  size_t allowed = 0, denied = 0, errors = 0;
  for (size_t i = 0; i < steps; i++) {
    dkey *k = &keys[below(NKEYS)];
    uint64_t step = draw_step();
    if (below(8) == 0) {
      /* land on a boundary of this key's state: a period (+-1 us) after
       * its last call, where windows end and log entries expire */
      uint64_t p_us = k->q->period_ms * 1000,
               at = k->last + p_us - 1 + below(3);
      if (p_us < MS(3600000) && at > now)
        step = at - now;
    }
    now = advance(now, &last_real, step);
    if (below(25) == 0)
      now = step_back(now, last_real, &lead_max, 1 + below(MS(300)));
    if (now > TG_NOW_MAX_US - MS(86400000) * 400)
      break;
    k->last = now;
    if (below(50) == 0)
      k->q = &QUOTAS[below(NQUOTAS)]; /* a key's quota changes, rarely */
    unsigned op = (unsigned)below(100);
    uint64_t t0_us = real_us();
    diff_call c = {.now_us = now, .key = k->b, .key_len = k->len, .q = k->q};
    if (op < 50) {
      c.op = DIFF_HIT;
      c.arg = draw_cost(k->q);
    } else if (op < 58) {
      c.op = DIFF_BATCH;
      c.n = 1 + below(4);
      for (size_t j = 0; j < c.n; j++) {
        dkey *kj = &keys[below(NKEYS)];
        c.items[j] =
            (tg_batch_item){kj->b, kj->len, kj->q, draw_cost(kj->q), 0, {0}};
      }
    } else if (op < 68) {
      c.op = DIFF_GET;
    } else if (op < 76) {
      c.op = DIFF_EXPIRES;
    } else if (op < 86) {
      c.op = DIFF_SET;
      c.arg = draw_cost(k->q);
    } else if (op < 97) {
      c.op = DIFF_INC;
      c.arg = draw_cost(k->q);
    } else {
      c.op = DIFF_RESET;
    }
    diff_answer a, b;
    diff_run(mem, &c, &a);
    diff_run(red, &c, &b);
    if (c.op == DIFF_BATCH) {
      assert_int_equal(a.rc, TG_OK);
      assert_int_equal(b.rc, TG_OK);
    }
    if (!diff_same(&c, &a, &b)) {
      print_error("seed %" PRIu64 " step %zu: %s on key %zu differs\n", seed, i,
                  diff_op_names[c.op], (size_t)(k - keys));
      diff_report(&c, "memory", &a, "redis ", &b);
      fail();
    }
    if (c.op == DIFF_BATCH) {
      /* the batch wrote at its now, under each key's quota */
      for (int j = 0; j < NKEYS; j++)
        ttl_checks +=
            (size_t)check_ttl(look, prefix, alg, &keys[j], now, t0_us);
      continue;
    }
    if (a.rc != TG_OK)
      errors++;
    else if (c.op == DIFF_HIT && a.r.allowed)
      allowed++;
    else if (c.op == DIFF_HIT)
      denied++;
    ttl_checks += (size_t)check_ttl(look, prefix, alg, k, now, t0_us);
  }
  print_message("%s: %zu steps (seed %" PRIu64 "): %zu hits allowed, %zu "
                "denied, %zu calls refused with a code by both stores\n",
                tg_algorithm_name(alg), steps, seed, allowed, denied, errors);
  /* a sequence that never admitted or never denied tested little */
  assert_true(allowed > steps / 20);
  assert_true(denied > steps / 50);
  assert_true(errors > 0);
  print_message("  %zu TTLs checked against the core\n", ttl_checks);
  assert_true(ttl_checks > steps / 20);
  for (int j = 0; j < NKEYS; j++)
    free(keys[j].seen);
  redisFree(look);
  tg_limiter_destroy(mem);
  tg_limiter_destroy(red);
}

static void differential_all(void **state) {
  (void)state;
  size_t steps = env_steps(20000);
  /* TG_TEST_REDIS_SEED replays a failure: the seed printed for algorithm 0
   * (the others follow from it) */
  const char *fixed = getenv("TG_TEST_REDIS_SEED");
  uint64_t base = fixed
                      ? strtoull(fixed, NULL, 10) - UINT64_C(0x9e3779b97f4a7c15)
                      : (uint64_t)time(NULL);
  for (int alg = 0; alg < TG_ALGORITHM_COUNT; alg++) {
    uint64_t seed = UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(alg + 1) + base;
    /* a short log cap makes the merge-at-cap path common */
    differential((tg_algorithm)alg, seed, steps, alg == 2 ? 4 : 1024, 0);
    differential((tg_algorithm)alg, seed + 1, steps / 2, 1024, 0);
    /* after 2^52 us (the year 2112) the script does all its arithmetic on
     * limbs: the same answers are required there too */
    differential((tg_algorithm)alg, seed + 2, steps / 4, 8,
                 (UINT64_C(1) << 52) - real_us() + below(MS(86400000)));
  }
}

/* ---- which path: the module when the server has it, else the script ---- */

/* The calls of one command INFO commandstats counts (0 when none). */
static long long command_calls(redisContext *c, const char *cmd) {
  redisReply *r = rs_cmd(c, "INFO commandstats");
  assert_non_null(r);
  char pat[64];
  snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
  const char *p = strstr(r->str, pat);
  long long n = p ? strtoll(p + strlen(pat), NULL, 10) : 0;
  freeReplyObject(r);
  return n;
}

static void path_follows_the_server(void **state) {
  (void)state;
  const char *module = getenv("TG_TEST_REDIS_MODULE");
  bool loaded = module && *module;
  redisContext *c = admin();
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.pool_size = 1; /* one connection: it alone decides the path */
  tg_limiter *lim = redis_limiter_cfg(TG_TOKEN_BUCKET, "path", &rc, 1024);
  tg_quota q = {.limit = 10, .period_ms = 3600000}; /* no refill meanwhile */
  tg_result r;
  uint64_t v;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK); /* may write */
  assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_OK);    /* cannot */
  assert_int_equal(v, 9);
  assert_int_equal(command_calls(c, "tg.step"), loaded ? 1 : 0);
  assert_int_equal(command_calls(c, "tg.step_ro"), loaded ? 1 : 0);
  assert_int_equal(command_calls(c, "evalsha"), loaded ? 0 : 2);
  if (loaded) {
    /* the module goes away under an open connection: the calls turn to
     * the script, nothing is lost */
    assert_true(rs_ok(c, "MODULE UNLOAD tollgate"));
    /* first a batch: every call in the pipeline meets "unknown command",
     * and all are sent again through the script, in order */
    tg_batch_item it[3] = {{"k", 1, &q, 1, 0, {0}},
                           {"j", 1, &q, 1, 0, {0}},
                           {"k", 1, &q, 1, 0, {0}}};
    assert_int_equal(tg_hit_batch(lim, it, 3), TG_OK);
    for (int i = 0; i < 3; i++)
      assert_int_equal(it[i].status, TG_OK);
    assert_int_equal(it[0].result.count, 8);
    assert_int_equal(it[1].result.count, 9);
    assert_int_equal(it[2].result.count, 7);
    assert_int_equal(command_calls(c, "evalsha"), 3);
    assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
    assert_int_equal(r.count, 6);
    assert_true(rs_ok(c, "MODULE LOAD %s", module));
    assert_int_equal(tg_hit_batch(lim, it, 2), TG_OK); /* still the script */
    assert_int_equal(it[0].result.count, 5);
    assert_int_equal(command_calls(c, "evalsha"), 6);
    /* a new connection finds the module again */
    tg_limiter_destroy(lim);
    lim = redis_limiter_cfg(TG_TOKEN_BUCKET, "path", &rc, 1024);
    assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
    assert_int_equal(r.count, 4);
    /* (a reloaded module's commands count from zero) */
    assert_int_equal(command_calls(c, "tg.step"), 1);
  }
  tg_limiter_destroy(lim);
  redisFree(c);
}

/* A policy is one command with the module (TG.STEPS: one round trip, and
 * nothing between its checks and its takes) and a read plus a conditional
 * write through the script without it (EVALSHA R, then C when it passes):
 * counted by INFO commandstats, whichever way the server runs. */
static void policy_round_trips(void **state) {
  (void)state;
  const char *module = getenv("TG_TEST_REDIS_MODULE");
  bool loaded = module && *module;
  redisContext *c = admin();
  tg_redis_config rc[3];
  tg_limiter *lim[3];
  static const tg_algorithm alg[3] = {TG_TOKEN_BUCKET, TG_FIXED_WINDOW,
                                      TG_SLIDING_WINDOW};
  for (int i = 0; i < 3; i++) {
    tg_redis_config_init(&rc[i]);
    rc[i].pool_size = 1;
    lim[i] = redis_limiter_cfg(alg[i], "prt", &rc[i], 1024);
  }
  /* per user 5 an hour, per tenant 3 a day, a log of 4 an hour; one hash
   * tag, so one Cluster slot */
  tg_quota q5 = {.limit = 5, .period_ms = 3600000};
  tg_quota q3 = {.limit = 3, .period_ms = 86400000};
  tg_quota q4 = {.limit = 4, .period_ms = 3600000};
  char user[32], tenant[32], log[32];
  snprintf(user, sizeof user, "p%ld}user", (long)getpid());
  snprintf(tenant, sizeof tenant, "p%ld}tenant", (long)getpid());
  snprintf(log, sizeof log, "p%ld}log", (long)getpid());
  tg_rule rules[3] = {{lim[0], user, strlen(user), &q5, 1, 0, {0}},
                      {lim[1], tenant, strlen(tenant), &q3, 1, 0, {0}},
                      {lim[2], log, strlen(log), &q4, 1, 0, {0}}};
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  tg_rules_result out;
  uint64_t left[3] = {0, 0, 0};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(tg_hit_rules(rules, 3, 0, &out), TG_OK);
    assert_int_equal(out.r.allowed, i < 3);
    assert_int_equal(out.denied_by, i < 3 ? TG_RULE_NONE : 1);
    /* a denied call leaves every key as the last allowed one did */
    for (int j = 0; j < 3; j++) {
      if (i >= 3)
        assert_int_equal(rules[j].result.remaining, left[j]);
      left[j] = rules[j].result.remaining;
    }
  }
  assert_int_equal(left[0], 2); /* 5 - 3 */
  assert_int_equal(left[2], 1); /* 4 - 3 */
  /* 3 passed, 2 denied: one command each, the module's or the script's */
  assert_int_equal(command_calls(c, "tg.steps"), loaded ? 5 : 0);
  assert_int_equal(command_calls(c, "evalsha"), loaded ? 0 : 5);
  /* a value that is not a state: the rule it belongs to is named, and
   * nothing is written (the user's bucket keeps its 3) */
  char name[64];
  snprintf(name, sizeof name, "prt:{%s}:fw", tenant);
  assert_true(rs_ok(c, "SET %s garbage", name));
  assert_int_equal(tg_hit_rules(rules, 3, 0, &out), TG_ECORRUPT);
  assert_int_equal(out.denied_by, 1);
  assert_int_equal(rules[1].status, TG_ECORRUPT);
  assert_true(rs_ok(c, "DEL %s", name));
  assert_int_equal(tg_hit_rules(rules, 1, 0, &out), TG_OK);
  assert_int_equal(rules[0].result.remaining, 1);
  if (loaded) {
    /* the command's own refusals: malformed calls answer TGARG */
    redisReply *r = rs_cmd(c, "TG.STEPS 0 x");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "TGARG"));
    freeReplyObject(r);
    r = rs_cmd(c, "TG.STEPS 1 x %s 9 1 1000 1 1 1024 0", ""); /* alg 9 */
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "TGARG"));
    freeReplyObject(r);
    r = rs_cmd(c, "TG.STEPS 2 x x %s 3 1 1000 1 1 1024 0 3 1 1000 1 1 1024 0",
               ""); /* a key named twice */
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "TGARG"));
    freeReplyObject(r);
  }
  for (int i = 0; i < 3; i++)
    tg_limiter_destroy(lim[i]);
  redisFree(c);
}

/* Two answers alike, field by field. Not memcmp of the structs: a tg_result
 * has padding after its three bools, which nothing promises and which the
 * library leaves as its stack had it (results are built field by field in
 * structures it does not zero, then copied whole). Under ASan with
 * detect_stack_use_after_return (the asan preset's ASAN_OPTIONS) those
 * bytes differ between the memory store's path and the Redis store's: seed
 * 1795791485 stopped at step 61 on a rule whose every field was the same
 * and whose fourth byte was 0 in one answer, 1 in the other. The bools are
 * compared as bytes, as diff_same_result does, so a bool that is neither 0
 * nor 1 still shows. */
static bool same_result(const tg_result *x, const tg_result *y) {
  return diff_same_result(x, y) && memcmp(&x->shadow_denied, &y->shadow_denied,
                                          sizeof x->shadow_denied) == 0;
}

/* Whether the sliding log of one key, before a call under quota q at now,
 * is one the two stores may disagree on without either being wrong; it is
 * then reset in both.
 *
 * A log stops mattering a period after its newest entry, by the period of
 * the quota it was written under: the Redis store gives the key that TTL
 * (+ 1 s), and a table store, under pressure or by its cleaner, reclaims
 * it once so decayed. Neither knows the period of a later call, so once a
 * log has decayed under the quota that wrote it, either store may have
 * forgotten it when a quota of longer period would count its entries
 * again (tollgate.h: another quota on a key reinterprets its state). The
 * Redis key vanishes on the server's clock, so whether it is still there
 * depends on how fast the calls ran (the slower, the likelier); this
 * test's memory limiter (no cleaner, room for every key) never forgets.
 * Seen as a sliding rule whose Redis count lacked an entry written under a
 * quota of 1 ms, counted again under a longer period by the memory store,
 * once the key had gone a real second without a write. Such a log is reset
 * in both stores, but only once the server's clock may have reached the
 * key's expiry (gone: the real time before the write that set its TTL,
 * plus that TTL as the script computes it, 1 s of slack included; 20 ms
 * early, for the TTL's rounding to whole ms): the simulated clock runs
 * ahead of the real one, and until then the Redis store must still hold
 * the log, so the answers must agree. A log still live under the quota
 * that wrote it is never reset.
 *
 * The test knows the log without asking a store (a tg_get under another
 * quota prunes what that quota sees expired): newest, the time of its
 * newest entry (the now of its last write with a cost: times here never
 * go back, so an entry merged at the cap is moved to it), and shortest,
 * the quota of shortest period it may last have been written under (that
 * write, or a later call of cost 0 that pruned; NULL: not written since
 * new or reset). */
static bool forgettable(tg_limiter *mem, tg_limiter *red, const char *key,
                        const tg_quota *shortest, uint64_t newest,
                        uint64_t gone, const tg_quota *q, uint64_t now) {
  if (!shortest || newest + shortest->period_ms * 1000 > now ||
      newest + q->period_ms * 1000 <= now || real_us() + MS(20) < gone)
    return false;
  assert_int_equal(tg_reset(mem, key, strlen(key)), TG_OK);
  assert_int_equal(tg_reset(red, key, strlen(key)), TG_OK);
  return true;
}

/* Policies on Redis against the memory store: random policies of one to
 * four rules over every algorithm (a shadow limiter among them), costs
 * from 0 to far above the burst, quotas to the edges, shadow calls, time
 * moving (and, in the second run, past 2^52 us, where the script works on
 * limbs): every field of every rule's answer and of the policy's, and the
 * code, must be the memory store's (a sliding log that either store may
 * have forgotten is reset first, see forgettable()). Keys share one hash
 * tag (one Cluster slot, as a policy's must). Without the module this is
 * the script's P,
 * one EVALSHA per policy; with it, TG.STEPS. */
static void policy_differential_run(uint64_t seed, size_t steps,
                                    uint64_t ahead_us) {
  static unsigned runs;
  rng_state = seed;
  char prefix[64], prefix_s[72];
  snprintf(prefix, sizeof prefix, "pdiff%ld.%u", (long)getpid(), runs++);
  /* the shadow limiter's states are its own, as in its own memory table */
  snprintf(prefix_s, sizeof prefix_s, "%s.s", prefix);
  enum { NLIM = 6, NK = 4, SW = TG_SLIDING_WINDOW };
  tg_limiter *red[NLIM], *mem[NLIM];
  tg_redis_config rc[NLIM];
  for (int i = 0; i < NLIM; i++) {
    tg_algorithm alg = (tg_algorithm)(i % TG_ALGORITHM_COUNT);
    bool shadow = i == 5; /* a second fixed window, in shadow mode */
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = alg;
    cfg.sliding_max_entries = 8;
    cfg.shadow = shadow;
    tg_redis_config_init(&rc[i]);
    rc[i].pool_size = 1;
    rc[i].port = rs_port();
    rc[i].key_prefix = shadow ? prefix_s : prefix;
    cfg.redis = &rc[i];
    assert_int_equal(tg_limiter_new(&red[i], &cfg), TG_OK);
    cfg.redis = NULL;
    cfg.capacity = 64;
    cfg.clean_period_ms = 0;
    assert_int_equal(tg_limiter_new(&mem[i], &cfg), TG_OK);
  }
  char keys[NK][16];
  for (int k = 0; k < NK; k++)
    snprintf(keys[k], sizeof keys[k], "pd}%d", k);
  const tg_quota *q[NLIM][NK];
  for (int i = 0; i < NLIM; i++)
    for (int k = 0; k < NK; k++)
      q[i][k] = &QUOTAS[below(NQUOTAS)];
  /* each key's sliding log, as forgettable() sees it */
  const tg_quota *wrote[NK] = {NULL};
  uint64_t newest[NK] = {0}, gone[NK] = {0};
  uint64_t last_real = real_us();
  uint64_t now = last_real + ahead_us;
  size_t passed = 0, denied = 0, errors = 0;
  for (size_t st = 0; st < steps; st++) {
    now = advance(now, &last_real, draw_step());
    if (now > TG_NOW_MAX_US - MS(86400000) * 400)
      break;
    size_t n = 1 + below(4);
    tg_rule a[4], b[4];
    int li[4], ki[4];
    for (size_t j = 0; j < n; j++) {
      int i = (int)below(NLIM), k = (int)below(NK);
      li[j] = i;
      ki[j] = k;
      if (below(40) == 0)
        q[i][k] = &QUOTAS[below(NQUOTAS)]; /* a quota changes, rarely */
      if (i == SW && forgettable(mem[i], red[i], keys[k], wrote[k], newest[k],
                                 gone[k], q[i][k], now))
        wrote[k] = NULL;
      uint64_t cost = below(3) == 0 ? draw_cost(q[i][k]) : below(3);
      a[j] = (tg_rule){mem[i], keys[k], strlen(keys[k]), q[i][k], cost, 0, {0}};
      b[j] = a[j];
      b[j].lim = red[i];
    }
    unsigned flags = below(8) == 0 ? TG_RULES_SHADOW : 0;
    tg_rules_result oa, ob;
    memset(&oa, 0, sizeof oa);
    memset(&ob, 0, sizeof ob);
    uint64_t t0 = real_us(); /* before the server can set a TTL */
    int ra = tg_hit_rules_at(now, a, n, flags, &oa);
    int rb = tg_hit_rules_at(now, b, n, flags, &ob);
    bool same = ra == rb && oa.denied_by == ob.denied_by &&
                oa.tightest == ob.tightest && same_result(&oa.r, &ob.r);
    for (size_t j = 0; same && j < n; j++)
      same =
          a[j].status == b[j].status && same_result(&a[j].result, &b[j].result);
    if (!same) {
      print_error("seed %" PRIu64 " step %zu: rc %d / %d, allowed %d / %d, "
                  "denied_by %zu / %zu, tightest %zu / %zu, count %" PRIu64
                  " / %" PRIu64 ", remaining %" PRIu64 " / %" PRIu64
                  ", retry %" PRIu64 " / %" PRIu64 ", reset %" PRIu64
                  " / %" PRIu64 ", degraded %d / %d, shadow_denied %d / %d\n",
                  seed, st, ra, rb, oa.r.allowed, ob.r.allowed, oa.denied_by,
                  ob.denied_by, oa.tightest, ob.tightest, oa.r.count,
                  ob.r.count, oa.r.remaining, ob.r.remaining,
                  oa.r.retry_after_ms, ob.r.retry_after_ms, oa.r.reset_after_ms,
                  ob.r.reset_after_ms, oa.r.degraded, ob.r.degraded,
                  oa.r.shadow_denied, ob.r.shadow_denied);
      for (size_t j = 0; j < n; j++)
        print_error("  rule %zu: limiter %d cost %" PRIu64 " limit %" PRIu64
                    " burst %" PRIu64 ": status %d / %d allowed %d / %d "
                    "count %" PRIu64 " / %" PRIu64 " remaining %" PRIu64
                    " / %" PRIu64 " retry %" PRIu64 " / %" PRIu64
                    " reset %" PRIu64 " / %" PRIu64 " degraded %d / %d"
                    " shadow_denied %d / %d\n",
                    j, li[j], a[j].cost, a[j].q->limit, a[j].q->burst,
                    a[j].status, b[j].status, a[j].result.allowed,
                    b[j].result.allowed, a[j].result.count, b[j].result.count,
                    a[j].result.remaining, b[j].result.remaining,
                    a[j].result.retry_after_ms, b[j].result.retry_after_ms,
                    a[j].result.reset_after_ms, b[j].result.reset_after_ms,
                    a[j].result.degraded, b[j].result.degraded,
                    a[j].result.shadow_denied, b[j].result.shadow_denied);
      fail();
    }
    if (ra != TG_OK)
      errors++;
    else if (oa.r.allowed && !oa.r.shadow_denied)
      passed++;
    else
      denied++;
    /* a policy that passed (every rule allowed but the shadow limiter's)
     * wrote the logs of its sliding rules: with a cost, a newest entry at
     * now; with none, at most a pruning under its quota */
    bool went = ra == TG_OK;
    for (size_t j = 0; went && j < n; j++)
      went = li[j] == 5 || (a[j].result.allowed && !a[j].result.shadow_denied);
    for (size_t j = 0; went && j < n; j++) {
      int k = ki[j];
      if (li[j] != SW)
        continue;
      uint64_t p_us = a[j].q->period_ms * 1000;
      if (a[j].cost > 0) {
        wrote[k] = a[j].q;
        newest[k] = now;
        gone[k] = t0 + p_us + MS(1000);
      } else if (wrote[k] && a[j].q->period_ms < wrote[k]->period_ms) {
        /* a pruning under a shorter period: its TTL, if it wrote */
        wrote[k] = a[j].q;
        uint64_t left = newest[k] + p_us > now ? newest[k] + p_us - now : 0;
        if (t0 + left + MS(1000) < gone[k])
          gone[k] = t0 + left + MS(1000);
      }
    }
  }
  print_message("policies: %zu steps (seed %" PRIu64 "): %zu passed, %zu "
                "denied, %zu refused with a code by both stores\n",
                steps, seed, passed, denied, errors);
  assert_true(passed > steps / 20);
  assert_true(denied > steps / 20);
  for (int i = 0; i < NLIM; i++) {
    tg_limiter_destroy(red[i]);
    tg_limiter_destroy(mem[i]);
  }
}

static void policy_differential(void **state) {
  (void)state;
  size_t steps = env_steps(20000);
  const char *fixed = getenv("TG_TEST_REDIS_SEED");
  uint64_t seed = fixed ? strtoull(fixed, NULL, 10) : (uint64_t)time(NULL);
  policy_differential_run(seed, steps, 0);
  policy_differential_run(seed + 1, steps / 4,
                          (UINT64_C(1) << 52) - real_us() +
                              below(MS(86400000)));
}

/* ---- the server's clock, TTLs, names ------------------------------------ */

static void server_time_decides(void **state) {
  (void)state;
  tg_limiter *lim = redis_limiter(TG_FIXED_WINDOW, "srvtime");
  tg_quota q = {.limit = 3, .period_ms = 3600000};
  tg_result r;
  uint64_t before = real_us();
  char key[32];
  snprintf(key, sizeof key, "k%ld", (long)getpid());
  /* at most one hour-boundary can fall between these calls: retry once */
  for (int attempt = 0; attempt < 2; attempt++) {
    tg_reset(lim, key, strlen(key));
    int admitted = 0;
    for (int i = 0; i < 4; i++) {
      assert_int_equal(tg_hit(lim, key, strlen(key), &q, 1, &r), TG_OK);
      admitted += r.allowed;
    }
    if (admitted == 3)
      break;
  }
  assert_false(r.allowed);
  assert_true(r.retry_after_ms >= 1 && r.retry_after_ms <= 3600000);
  /* the window the server chose is the one of the real clock now */
  uint64_t at_ms;
  assert_int_equal(tg_expires_at(lim, key, strlen(key), &q, &at_ms), TG_OK);
  uint64_t after = real_us();
  assert_true(at_ms > before / 1000 && at_ms <= after / 1000 + 3600000);
  assert_int_equal(at_ms % 3600000, 0);
  tg_limiter_destroy(lim);
}

static void ttl_follows_freshness(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_limiter *lim = redis_limiter(TG_TOKEN_BUCKET, "ttl");
  tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 10}; /* T = 100 ms */
  tg_result r;
  uint64_t t0 = mono_us();
  assert_int_equal(tg_hit(lim, "t", 1, &q, 3, &r), TG_OK);
  assert_true(r.allowed);
  assert_int_equal(r.reset_after_ms, 300);
  redisReply *p = rs_cmd(c, "PTTL %s", "ttl:{t}:tb");
  long long gone = (long long)((mono_us() - t0) / 1000) + 1; /* ms, up */
  assert_non_null(p);
  assert_int_equal(p->type, REDIS_REPLY_INTEGER);
  /* the time to full (300 ms) and at most 2 ms more, less the time the
   * hit and the PTTL took (a sanitizer build on a busy host is slow) */
  assert_true(p->integer >= 300 - gone && p->integer <= 302);
  freeReplyObject(p);
  /* sliding log and windows too */
  tg_limiter *sl = redis_limiter(TG_SLIDING_WINDOW, "ttl");
  tg_quota q2 = {.limit = 5, .period_ms = 200};
  t0 = mono_us();
  assert_int_equal(tg_hit(sl, "s", 1, &q2, 1, &r), TG_OK);
  p = rs_cmd(c, "PTTL %s", "ttl:{s}:sw");
  gone = (long long)((mono_us() - t0) / 1000) + 1;
  assert_true(p->integer >= 200 - gone && p->integer <= 202);
  freeReplyObject(p);
  /* after it, the keys are gone by themselves */
  rs_sleep_ms(450);
  p = rs_cmd(c, "EXISTS %s %s", "ttl:{t}:tb", "ttl:{s}:sw");
  assert_int_equal(p->integer, 0);
  freeReplyObject(p);
  tg_limiter_destroy(sl);
  tg_limiter_destroy(lim);
  redisFree(c);
}

static void key_names_are_hash_tagged(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_limiter *lim = redis_limiter(TG_FIXED_WINDOW_PER_KEY, "names");
  tg_quota q = {.limit = 5, .period_ms = 60000};
  uint64_t n;
  /* binary keys, braces included, stay distinct */
  assert_int_equal(tg_inc(lim, "a\0b", 3, &q, 1, &n), TG_OK);
  assert_int_equal(tg_inc(lim, "a", 1, &q, 2, &n), TG_OK);
  assert_int_equal(tg_inc(lim, "a}b", 3, &q, 3, &n), TG_OK);
  assert_int_equal(tg_get(lim, "a\0b", 3, &q, &n), TG_OK);
  assert_int_equal(n, 1);
  assert_int_equal(tg_get(lim, "a", 1, &q, &n), TG_OK);
  assert_int_equal(n, 2);
  assert_int_equal(tg_get(lim, "a}b", 3, &q, &n), TG_OK);
  assert_int_equal(n, 3);
  redisReply *p = rs_cmd(c, "EXISTS %b", "names:{a\0b}:pk", (size_t)14);
  assert_int_equal(p->integer, 1);
  freeReplyObject(p);
  /* reset deletes exactly that key */
  assert_int_equal(tg_reset(lim, "a", 1), TG_OK);
  p = rs_cmd(c, "EXISTS %s", "names:{a}:pk");
  assert_int_equal(p->integer, 0);
  freeReplyObject(p);
  assert_int_equal(tg_get(lim, "a\0b", 3, &q, &n), TG_OK);
  assert_int_equal(n, 1);
  tg_limiter_destroy(lim);
  redisFree(c);
}

/* Values that are not tollgate's are TG_ECORRUPT, and are left alone. */
static void corrupt_values(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_limiter *lim = redis_limiter(TG_FIXED_WINDOW, "corrupt");
  tg_limiter *sl = redis_limiter(TG_SLIDING_WINDOW, "corrupt");
  tg_limiter *tb = redis_limiter(TG_TOKEN_BUCKET, "corrupt");
  tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result r;
  uint64_t v;
  static const char *const junk[] = {
      "garbage", "", "0:", "0:1", "0::1", "0:1:", "0:1:2:3", "0:-1:3",
      "0: 1795489881000000:3", "0:1795489881000000:3 ",
      /* a letter among the digits */
      "0:179548988100000x:3",
      /* another algorithm's state */
      "1:1795489881000000:3",
      /* a window end no clock can reach (> 1e16 us) */
      "0:10000000000000001:1",
      /* a window end tollgate would write, padded past 20 digits */
      "0:000000001795489881000000:3",
      /* a count past 2^64 - 1 */
      "0:1795489881000000:18446744073709551616"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    assert_true(rs_ok(c, "SET %s %s", "corrupt:{k}:fw", junk[i]));
    assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ECORRUPT);
    assert_true(r.degraded);
    assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_ECORRUPT);
    redisReply *p = rs_cmd(c, "GET %s", "corrupt:{k}:fw");
    assert_string_equal(p->str, junk[i]); /* untouched */
    freeReplyObject(p);
  }
  /* another type under the name */
  assert_true(rs_ok(c, "DEL %s", "corrupt:{k}:fw"));
  assert_true(rs_ok(c, "LPUSH %s x", "corrupt:{k}:fw"));
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ECORRUPT);
  /* logs of the wrong length, or with fields that are not plain digits
   * (Lua's tonumber would read " 1" and "1e01"), whatever the call's cost */
  static const char *const bad_logs[] = {
      "12000", "200000000000000000001e01",
      "2000000000000000000001"
      "0000000000000000000 1" /* an entry's time, space-padded */
      "00000000000000000001",
      "200000000000000000001" /* sum 1 */
      "00000000000000000001"
      "0000000000000000001 " /* cost, padded after */};
  for (size_t i = 0; i < sizeof bad_logs / sizeof bad_logs[0]; i++) {
    assert_true(rs_ok(c, "SET %s %s", "corrupt:{k}:sw", bad_logs[i]));
    assert_int_equal(tg_hit(sl, "k", 1, &q, 1, &r), TG_ECORRUPT);
    tg_quota huge = {.limit = UINT64_MAX, .period_ms = 60000};
    assert_int_equal(tg_hit(sl, "k", 1, &huge, UINT64_C(1) << 60, &r),
                     TG_ECORRUPT);
    redisReply *p = rs_cmd(c, "GET %s", "corrupt:{k}:sw");
    assert_string_equal(p->str, bad_logs[i]); /* untouched */
    freeReplyObject(p);
  }
  /* a bucket of the wrong algorithm */
  assert_true(rs_ok(c, "SET %s %s", "corrupt:{k}:tb", "4:1795489881000000:0"));
  assert_int_equal(tg_hit(tb, "k", 1, &q, 1, &r), TG_ECORRUPT);
  /* reset clears it, and the key works again */
  assert_int_equal(tg_reset(lim, "k", 1), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  tg_limiter_destroy(lim);
  tg_limiter_destroy(sl);
  tg_limiter_destroy(tb);
  redisFree(c);
}

static void batch_matches_single_calls(void **state) {
  (void)state;
  tg_limiter *lim = redis_limiter(TG_SLIDING_WINDOW, "batch");
  tg_quota q = {.limit = 3, .period_ms = 60000};
  tg_batch_item it[6];
  const char *keys[6] = {"x", "x", "y", "x", "x", ""};
  for (int i = 0; i < 6; i++)
    it[i] = (tg_batch_item){keys[i], strlen(keys[i]), &q, 1, 99, {0}};
  uint64_t now = real_us();
  assert_int_equal(tg_hit_batch_at(lim, now, it, 6), TG_OK);
  int expect_allowed[5] = {1, 1, 1, 1, 0};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(it[i].status, TG_OK);
    assert_int_equal(it[i].result.allowed, expect_allowed[i]);
  }
  assert_int_equal(it[3].result.count, 3);
  assert_int_equal(it[5].status, TG_EKEY); /* an empty key, alone */
  assert_int_equal(tg_hit_batch(lim, NULL, 1), TG_EINVAL);
  assert_int_equal(tg_hit_batch(NULL, it, 1), TG_EINVAL);
  assert_int_equal(tg_hit_batch(lim, NULL, 0), TG_OK);
  /* a batch larger than one pipeline chunk, on the server's clock */
  enum { BIG = 2500 };
  tg_batch_item *big = calloc(BIG, sizeof *big);
  tg_quota qb = {.limit = 1000, .period_ms = 3600000};
  for (int i = 0; i < BIG; i++)
    big[i] = (tg_batch_item){"big", 3, &qb, 1, 99, {0}};
  assert_int_equal(tg_hit_batch(lim, big, BIG), TG_OK);
  int admitted = 0;
  for (int i = 0; i < BIG; i++) {
    assert_int_equal(big[i].status, TG_OK);
    admitted += big[i].result.allowed;
  }
  assert_int_equal(admitted, 1000);
  free(big);
  tg_limiter_destroy(lim);
}

/* ---- failures ------------------------------------------------------------ */

/* A limiter with short timeouts and backoff, for the failure tests. */
/* A limiter on the test server with short timeouts (connect and command)
 * and backoff_ms between probes of a server found down. */
static tg_limiter *fragile_with(tg_algorithm alg, const char *prefix,
                                tg_policy policy, uint32_t pool,
                                uint32_t timeout_ms, uint32_t backoff_ms) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = policy;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = prefix;
  rc.connect_timeout_ms = timeout_ms;
  rc.command_timeout_ms = timeout_ms;
  rc.reconnect_backoff_ms = backoff_ms;
  rc.pool_size = pool;
  cfg.redis = &rc;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static tg_limiter *fragile(tg_algorithm alg, const char *prefix,
                           tg_policy policy, uint32_t pool) {
  return fragile_with(alg, prefix, policy, pool, 300, 50);
}

/* Calls until one succeeds (the limiter must recover by itself), at most
 * ~3 s. */
static int until_ok(tg_limiter *lim, const tg_quota *q, tg_result *r) {
  int rc = TG_ESTORE;
  for (int i = 0; i < 300 && rc != TG_OK; i++) {
    rc = tg_hit(lim, "k", 1, q, 1, r);
    if (rc != TG_OK)
      rs_sleep_ms(10);
  }
  return rc;
}

static void server_down_then_back(void **state) {
  (void)state;
  tg_quota q = {.limit = 2, .period_ms = 60000};
  tg_limiter *open = fragile(TG_FIXED_WINDOW, "down", TG_POLICY_FAIL_OPEN, 2);
  tg_limiter *closed =
      fragile(TG_FIXED_WINDOW, "down", TG_POLICY_FAIL_CLOSED, 2);
  tg_limiter *err = fragile(TG_FIXED_WINDOW, "down", TG_POLICY_ERROR, 2);
  tg_result r;
  assert_int_equal(tg_hit(open, "k", 1, &q, 1, &r), TG_OK);
  assert_false(r.degraded);
  assert_true(rs_stop());
  /* every limiter reports the failure; the policy decides the answer */
  for (int i = 0; i < 5; i++) {
    assert_int_equal(tg_hit(open, "k", 1, &q, 1, &r), TG_ECONNECT);
    assert_true(r.degraded && r.allowed);
    assert_int_equal(tg_hit(closed, "k", 1, &q, 1, &r), TG_ECONNECT);
    assert_true(r.degraded && !r.allowed);
    assert_int_equal(r.retry_after_ms, 60000);
    assert_int_equal(tg_hit(err, "k", 1, &q, 1, &r), TG_ECONNECT);
    assert_true(r.degraded && !r.allowed);
    assert_int_equal(r.retry_after_ms, TG_NEVER);
  }
  uint64_t v;
  assert_int_equal(tg_get(open, "k", 1, &q, &v), TG_ECONNECT);
  assert_int_equal(tg_reset(open, "k", 1), TG_ECONNECT);
  tg_batch_item it = {"k", 1, &q, 1, 0, {0}};
  assert_int_equal(tg_hit_batch(closed, &it, 1), TG_OK);
  assert_int_equal(it.status, TG_ECONNECT);
  assert_true(it.result.degraded && !it.result.allowed);
  /* the server comes back (empty): every limiter recovers by itself */
  assert_true(rs_start());
  assert_int_equal(until_ok(open, &q, &r), TG_OK);
  assert_false(r.degraded);
  assert_int_equal(r.count, 1);
  assert_int_equal(until_ok(closed, &q, &r), TG_OK);
  assert_int_equal(r.count, 2);
  assert_int_equal(until_ok(err, &q, &r), TG_OK);
  assert_int_equal(r.count, 3);
  assert_false(r.allowed);
  assert_false(r.degraded);
  tg_limiter_destroy(open);
  tg_limiter_destroy(closed);
  tg_limiter_destroy(err);
}

/* A restart in the middle of a stream of calls from several threads. */
typedef struct streamer {
  tg_limiter *lim;
  atomic_int *stop;
  long ok, failed, bad_code, not_degraded;
} streamer;

static void *stream(void *arg) {
  streamer *s = arg;
  tg_quota q = {.limit = 1000000, .period_ms = 1000};
  while (!atomic_load(s->stop)) {
    tg_result r;
    int rc = tg_hit(s->lim, "stream", 6, &q, 1, &r);
    if (rc == TG_OK) {
      s->ok++;
    } else {
      s->failed++;
      if (rc != TG_ECONNECT && rc != TG_ETIMEDOUT && rc != TG_ESTORE)
        s->bad_code++;
      if (!r.degraded || !r.allowed)
        s->not_degraded++;
    }
  }
  return NULL;
}

static void restart_mid_stream(void **state) {
  (void)state;
  tg_limiter *lim = fragile(TG_TOKEN_BUCKET, "stream", TG_POLICY_FAIL_OPEN, 2);
  atomic_int stop = 0;
  streamer s[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    s[i] = (streamer){lim, &stop, 0, 0, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, stream, &s[i]), 0);
  }
  rs_sleep_ms(200);
  assert_true(rs_stop());
  rs_sleep_ms(300);
  assert_true(rs_start());
  rs_sleep_ms(500);
  atomic_store(&stop, 1);
  long ok = 0, failed = 0;
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    ok += s[i].ok;
    failed += s[i].failed;
    assert_int_equal(s[i].bad_code, 0);
    assert_int_equal(s[i].not_degraded, 0);
  }
  assert_true(ok > 0 && failed > 0);
  /* and it works after the restart, without help */
  tg_result r;
  tg_quota q = {.limit = 10, .period_ms = 1000};
  assert_int_equal(until_ok(lim, &q, &r), TG_OK);
  tg_limiter_destroy(lim);
}

static void unresponsive_server_times_out(void **state) {
  (void)state;
  tg_limiter *lim =
      fragile(TG_SLIDING_WINDOW, "pause", TG_POLICY_FAIL_CLOSED, 1);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(rs_pause());
  int rc = tg_hit(lim, "k", 1, &q, 1, &r);
  assert_true(rs_resume());
  assert_int_equal(rc, TG_ETIMEDOUT);
  assert_true(r.degraded && !r.allowed);
  /* the timed-out connection is not reused (its reply is still coming) */
  assert_int_equal(until_ok(lim, &q, &r), TG_OK);
  assert_false(r.degraded);
  tg_limiter_destroy(lim);
}

/* The same with a timer signal every 50 ms (a profiler, an alarm) and no
 * SA_RESTART: a read the signal interrupts must not start the timeout
 * again. Before, hiredis's blocking read did, so the call waited for the
 * server to come back (the resume, 3 s later, made it TG_OK). */
static void on_tick(int sig) { (void)sig; }

static void *resume_later(void *arg) {
  (void)arg;
  rs_sleep_ms(3000);
  rs_resume();
  return NULL;
}

static void timeout_holds_under_signals(void **state) {
  (void)state;
  tg_limiter *lim = fragile(TG_FIXED_WINDOW, "ticks", TG_POLICY_FAIL_CLOSED, 1);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick; /* no SA_RESTART: reads fail with EINTR */
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
  struct itimerval every = {{0, 50000}, {0, 50000}}, off = {{0, 0}, {0, 0}};
  assert_true(rs_pause());
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, resume_later, NULL), 0);
  assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
  int rc = tg_hit(lim, "k", 1, &q, 1, &r);
  setitimer(ITIMER_REAL, &off, NULL);
  sigaction(SIGALRM, &old, NULL);
  pthread_join(th, NULL);
  assert_int_equal(rc, TG_ETIMEDOUT);
  assert_true(r.degraded && !r.allowed);
  assert_int_equal(until_ok(lim, &q, &r), TG_OK);
  tg_limiter_destroy(lim);
}

/* How many EVALSHA and SCRIPT LOAD commands the server has run since the
 * last CONFIG RESETSTAT (INFO commandstats): every call that reaches the
 * server sends one of them, so this counts the calls that waited on a
 * stopped server (their commands sat in its socket buffers and run once it
 * resumes, after the client has given up on them). */
static long sent_to_server(redisContext *c) {
  redisReply *r = rs_cmd(c, "INFO commandstats");
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_STRING);
  long n = 0;
  /* the script's commands, or with the module loaded its commands and the
   * question a connection asks when it opens */
  static const char *const names[] = {
      "cmdstat_evalsha:calls=", "cmdstat_script|load:calls=",
      "cmdstat_tg.step:calls=", "cmdstat_tg.step_ro:calls=",
      "cmdstat_command|info:calls="};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *p = strstr(r->str, names[i]);
    if (p)
      n += atol(p + strlen(names[i]));
  }
  freeReplyObject(r);
  return n;
}

/* After a resume, the commands stopped clients left in the server's buffers
 * have run once a fresh connection has been answered twice. */
static void settle_after_resume(void) {
  assert_true(rs_resume());
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 300 && !rs_alive(); j++)
      rs_sleep_ms(10);
    rs_sleep_ms(50);
  }
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Once a call has timed out, the pool is down: every call returns the
 * timeout's code at once, with the failure policy's answer, and none of them
 * reaches the server, until reconnect_backoff_ms has passed. */
static void unresponsive_server_fails_fast(void **state) {
  (void)state;
  redisContext *c = admin();
  /* a backoff of 10 minutes: no probe during the test */
  tg_limiter *lim = fragile_with(TG_TOKEN_BUCKET, "fast", TG_POLICY_FAIL_CLOSED,
                                 4, 300, 600000);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  for (int i = 0; i < 8; i++) /* every pooled connection opened */
    assert_int_equal(tg_hit(lim, "k", 1, &q, 0, &r), TG_OK);
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  assert_true(rs_pause());
  int first = tg_hit(lim, "k", 1, &q, 1, &r);
  bool first_degraded = r.degraded && !r.allowed;
  enum { N = 40 };
  int bad = 0, not_degraded = 0;
  for (int i = 0; i < N; i++) {
    int code = tg_hit(lim, "k", 1, &q, 1, &r);
    bad += code != TG_ETIMEDOUT;
    not_degraded += !(r.degraded && !r.allowed);
    uint64_t v;
    bad += tg_get(lim, "k", 1, &q, &v) != TG_ETIMEDOUT;
    bad += tg_reset(lim, "k", 1) != TG_ETIMEDOUT;
    tg_batch_item it[2] = {{"k", 1, &q, 1, 0, {0}}, {"j", 1, &q, 1, 0, {0}}};
    assert_int_equal(tg_hit_batch(lim, it, 2), TG_OK);
    bad += (it[0].status != TG_ETIMEDOUT) + (it[1].status != TG_ETIMEDOUT);
    not_degraded += !it[0].result.degraded + !it[1].result.degraded;
  }
  settle_after_resume();
  long sent = sent_to_server(c);
  tg_limiter_destroy(lim);
  redisFree(c);
  assert_int_equal(first, TG_ETIMEDOUT);
  assert_true(first_degraded);
  assert_int_equal(bad, 0);
  assert_int_equal(not_degraded, 0);
  /* only the first call reached the stopped server */
  assert_int_equal(sent, 1);
}

/* Calls queued for the one pooled connection while the first waits on a
 * stopped server: once it times out, the pool is down, and those already
 * waiting return at once as later ones do; none sends its command and
 * waits a timeout of its own. */
typedef struct queued {
  tg_limiter *lim;
  pthread_barrier_t *go;
  int rc;
} queued;

static void *queued_call(void *arg) {
  queued *x = arg;
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  pthread_barrier_wait(x->go);
  x->rc = tg_hit(x->lim, "k", 1, &q, 1, &r);
  return NULL;
}

static void queued_calls_fail_fast(void **state) {
  (void)state;
  redisContext *c = admin();
  enum { T = 4 };
  tg_limiter *lim = fragile_with(TG_TOKEN_BUCKET, "queue", TG_POLICY_FAIL_OPEN,
                                 1, 400, 600000);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 0, &r), TG_OK); /* connected */
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  assert_true(rs_pause());
  pthread_barrier_t go;
  assert_int_equal(pthread_barrier_init(&go, NULL, T), 0);
  queued x[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    x[i] = (queued){lim, &go, TG_OK};
    assert_int_equal(pthread_create(&th[i], NULL, queued_call, &x[i]), 0);
  }
  for (int i = 0; i < T; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&go);
  settle_after_resume();
  long sent = sent_to_server(c);
  tg_limiter_destroy(lim);
  redisFree(c);
  for (int i = 0; i < T; i++)
    assert_int_equal(x[i].rc, TG_ETIMEDOUT);
  assert_int_equal(sent, 1); /* the one that waited, and no other */
}

/* ---- a server that loses the script, then stops answering ----
 * A fake server: it answers the handshake as a Redis without the module,
 * refuses every EVALSHA before its second SCRIPT LOAD with NOSCRIPT, and
 * answers no EVALSHA after it. It counts the connections it accepted. */
typedef struct lost_script_srv {
  int lfd, port;
  atomic_int conns, loads, stop;
  pthread_t th;
} lost_script_srv;

/* The length of the first whole command in b (a RESP array of bulk
 * strings), 0 if it is not all there; its first two arguments, upper
 * case, joined by a space, in name. */
static size_t resp_command(const char *b, size_t n, char *name, size_t cap) {
  const char *end = b + n, *p = b;
  if (p >= end || *p != '*')
    return 0;
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  if (!nl)
    return 0;
  long argc = strtol(p + 1, NULL, 10);
  p = nl + 1;
  size_t used = 0;
  name[0] = '\0';
  for (long i = 0; i < argc; i++) {
    if (p >= end || *p != '$' || !(nl = memchr(p, '\n', (size_t)(end - p))))
      return 0;
    long len = strtol(p + 1, NULL, 10);
    p = nl + 1;
    if (len < 0 || end - p < len + 2)
      return 0;
    for (long j = 0; i < 2 && j < len && used + 2 < cap; j++)
      name[used++] = (char)toupper((unsigned char)p[j]);
    if (i == 0 && argc > 1 && used + 2 < cap)
      name[used++] = ' ';
    name[used] = '\0';
    p += len + 2;
  }
  return (size_t)(p - b);
}

static void lost_script_reply(lost_script_srv *f, int fd, const char *name) {
  static const char sha[] = "0123456789abcdef0123456789abcdef01234567";
  char out[128];
  int n = 0;
  if (strcmp(name, "COMMAND INFO") == 0) {
    n = snprintf(out, sizeof out, "*1\r\n*-1\r\n"); /* no such command */
  } else if (strcmp(name, "SCRIPT LOAD") == 0) {
    atomic_fetch_add(&f->loads, 1);
    n = snprintf(out, sizeof out, "$40\r\n%s\r\n", sha);
  } else if (strncmp(name, "EVALSHA", 7) == 0) {
    if (atomic_load(&f->loads) < 2)
      n = snprintf(out, sizeof out, "-NOSCRIPT No matching script.\r\n");
  } else {
    n = snprintf(out, sizeof out, "-ERR unknown command\r\n");
  }
  if (n > 0 && send(fd, out, (size_t)n, MSG_NOSIGNAL) != n)
    return; /* the client left */
}

static void *lost_script_main(void *arg) {
  lost_script_srv *f = arg;
  enum { MAXC = 4, BUF = 1 << 16 };
  struct pollfd pf[1 + MAXC];
  static char buf[MAXC][BUF];
  size_t have[MAXC] = {0};
  int nc = 0;
  pf[0] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
  while (!atomic_load(&f->stop)) {
    if (poll(pf, (nfds_t)(1 + nc), 20) <= 0)
      continue;
    for (int i = 0; i < nc; i++) {
      if (!(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      ssize_t got = recv(pf[1 + i].fd, buf[i] + have[i], BUF - have[i], 0);
      if (got <= 0) { /* closed: the last client takes its place */
        close(pf[1 + i].fd);
        pf[1 + i] = pf[nc];
        if (i != nc - 1)
          memcpy(buf[i], buf[nc - 1], have[nc - 1]);
        have[i] = have[nc - 1];
        nc--;
        i--;
        continue;
      }
      have[i] += (size_t)got;
      char name[64];
      size_t used;
      while ((used = resp_command(buf[i], have[i], name, sizeof name)) > 0) {
        lost_script_reply(f, pf[1 + i].fd, name);
        memmove(buf[i], buf[i] + used, have[i] - used);
        have[i] -= used;
      }
    }
    if ((pf[0].revents & POLLIN) && nc < MAXC) {
      int fd = accept(f->lfd, NULL, NULL);
      if (fd >= 0) {
        atomic_fetch_add(&f->conns, 1);
        pf[1 + nc] = (struct pollfd){.fd = fd, .events = POLLIN};
        have[nc++] = 0;
      }
    }
  }
  for (int i = 0; i < nc; i++)
    close(pf[1 + i].fd);
  return NULL;
}

static void lost_script_start(lost_script_srv *f) {
  memset(f, 0, sizeof *f);
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(f->lfd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(f->lfd, 8), 0);
  assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
  f->port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(&f->th, NULL, lost_script_main, f), 0);
}

static void lost_script_stop(lost_script_srv *f) {
  atomic_store(&f->stop, 1);
  pthread_join(f->th, NULL);
  close(f->lfd);
}

/* A batch whose calls came back NOSCRIPT is sent again once the script is
 * loaded; when that second round times out, the server does not answer:
 * the pool is down for its backoff, as after any timeout, and the next
 * call fails at once instead of connecting again (and waiting again). */
static void batch_retry_timeout_marks_down(void **state) {
  (void)state;
  lost_script_srv f;
  lost_script_start(&f);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = f.port;
  rc.key_prefix = "lost";
  rc.connect_timeout_ms = 300;
  rc.command_timeout_ms = 300;
  rc.reconnect_backoff_ms = 600000;
  rc.pool_size = 1;
  cfg.redis = &rc;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_batch_item it[2] = {{"a", 1, &q, 1, 0, {0}}, {"b", 1, &q, 1, 0, {0}}};
  assert_int_equal(tg_hit_batch(lim, it, 2), TG_OK);
  assert_int_equal(it[0].status, TG_ETIMEDOUT);
  assert_int_equal(it[1].status, TG_ETIMEDOUT);
  assert_int_equal(atomic_load(&f.loads), 2); /* handshake, then the fix */
  tg_result r;
  assert_int_equal(tg_hit(lim, "a", 1, &q, 1, &r), TG_ETIMEDOUT);
  assert_true(r.degraded);
  assert_int_equal(atomic_load(&f.conns), 1); /* no second connection */
  tg_limiter_destroy(lim);
  lost_script_stop(&f);
}

/* Threads calling while the server stays stopped: after the backoff, one
 * call at a time probes it (waits for its timeout) while the others return
 * at once. Probes are therefore at least backoff + timeout apart, which
 * bounds how many can have reached the server in the time the phase took;
 * a pool whose connections each retried on their own would send about
 * pool_size times that many. */
typedef struct prober {
  tg_limiter *lim;
  atomic_int *stop;
  long calls, bad_code, not_degraded;
} prober;

static void *probe_thread(void *arg) {
  prober *p = arg;
  tg_quota q = {.limit = 5, .period_ms = 1000};
  while (!atomic_load(p->stop)) {
    tg_result r;
    int rc = tg_hit(p->lim, "k", 1, &q, 1, &r);
    p->calls++;
    if (rc != TG_ETIMEDOUT && rc != TG_ECONNECT)
      p->bad_code++;
    if (!r.degraded || !r.allowed)
      p->not_degraded++;
  }
  return NULL;
}

static void one_probe_at_a_time(void **state) {
  (void)state;
  redisContext *c = admin();
  enum { T = 4, TIMEOUT = 200, BACKOFF = 100 };
  tg_limiter *lim = fragile_with(TG_FIXED_WINDOW, "probe", TG_POLICY_FAIL_OPEN,
                                 T, TIMEOUT, BACKOFF);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  for (int i = 0; i < 2 * T; i++)
    assert_int_equal(tg_hit(lim, "k", 1, &q, 0, &r), TG_OK);
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  assert_true(rs_pause());
  uint64_t t0 = mono_ms();
  int first = tg_hit(lim, "k", 1, &q, 1, &r); /* the pool goes down */
  atomic_int stop = 0;
  prober p[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    p[i] = (prober){lim, &stop, 0, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, probe_thread, &p[i]), 0);
  }
  rs_sleep_ms(1500);
  atomic_store(&stop, 1);
  long calls = 0, bad = 0, not_degraded = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    calls += p[i].calls;
    bad += p[i].bad_code;
    not_degraded += p[i].not_degraded;
  }
  uint64_t elapsed = mono_ms() - t0;
  settle_after_resume();
  long sent = sent_to_server(c);
  assert_int_equal(until_ok(lim, &q, &r), TG_OK); /* and it recovers */
  tg_limiter_destroy(lim);
  redisFree(c);
  assert_int_equal(first, TG_ETIMEDOUT);
  assert_int_equal(bad, 0);
  assert_int_equal(not_degraded, 0);
  long bound = 1 + (long)(elapsed / (TIMEOUT + BACKOFF)) + 1;
  print_message("%ld calls in %" PRIu64 " ms, %ld reached the server (at "
                "most %ld allowed)\n",
                calls, elapsed, sent, bound);
  assert_true(sent >= 2); /* the probes did happen */
  assert_true(sent <= bound);
  assert_true(calls > 4 * sent); /* most calls returned at once */
}

/* Over maxmemory the server refuses a write, not a call: a call that
 * writes nothing (a bucket's refusal, a sliding log's with no entry
 * expired, a denied policy, a read) is answered as usual; one that would
 * write is TG_ESTORE. The same with the script and the module. */
static void over_maxmemory_reads_answer(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_limiter *tb = redis_limiter(TG_TOKEN_BUCKET, "oomb");
  tg_limiter *sl = redis_limiter(TG_SLIDING_WINDOW, "ooms");
  const tg_quota q = {.limit = 1, .period_ms = 600000, .burst = 1};
  tg_result r;
  assert_int_equal(tg_hit(tb, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit(sl, "k", 1, &q, 1, &r), TG_OK);
  assert_true(rs_ok(c, "CONFIG SET maxmemory-policy noeviction"));
  assert_true(rs_ok(c, "CONFIG SET maxmemory 1"));
  int rc[7];
  tg_result res[7];
  rc[0] = tg_hit(tb, "k", 1, &q, 1, &res[0]);
  rc[1] = tg_hit(sl, "k", 1, &q, 1, &res[1]);
  tg_rule rules[2] = {{tb, "k", 1, &q, 1, 0, {0}}, {sl, "k", 1, &q, 1, 0, {0}}};
  tg_rules_result out;
  rc[2] = tg_hit_rules(rules, 2, 0, &out);
  res[2] = out.r;
  uint64_t v = 0;
  rc[3] = tg_get(tb, "k", 1, &q, &v);
  /* writes: a new key on each, and a policy that passes */
  rc[4] = tg_hit(tb, "new", 3, &q, 1, &res[4]);
  rc[5] = tg_hit(sl, "new", 3, &q, 1, &res[5]);
  tg_rule pass[2] = {{tb, "p", 1, &q, 1, 0, {0}}, {sl, "p", 1, &q, 1, 0, {0}}};
  rc[6] = tg_hit_rules(pass, 2, 0, &out);
  assert_true(rs_ok(c, "CONFIG SET maxmemory 0"));
  tg_limiter_destroy(tb);
  tg_limiter_destroy(sl);
  redisFree(c);
  for (int i = 0; i < 3; i++) {
    if (rc[i] != TG_OK)
      fail_msg("call %d: %s, expected a refusal read from the server", i,
               tg_err_name(rc[i]));
    assert_false(res[i].allowed);
  }
  assert_int_equal(rc[3], TG_OK);
  for (int i = 4; i < 7; i++)
    if (rc[i] != TG_ESTORE)
      fail_msg("call %d: %s, expected TG_ESTORE (a write refused)", i,
               tg_err_name(rc[i]));
}

static void error_replies(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_limiter *lim = fragile(TG_FIXED_WINDOW, "errs", TG_POLICY_FAIL_OPEN, 1);
  tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result r;
  uint64_t v;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  /* out of memory: writes are refused */
  assert_true(rs_ok(c, "CONFIG SET maxmemory-policy noeviction"));
  assert_true(rs_ok(c, "CONFIG SET maxmemory 1"));
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ESTORE);
  assert_true(r.degraded && r.allowed);
  assert_true(rs_ok(c, "CONFIG SET maxmemory 0"));
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 2);
  /* NOSCRIPT: the server lost the script; it is loaded again, silently */
  assert_true(rs_ok(c, "SCRIPT FLUSH"));
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 3);
  assert_true(rs_ok(c, "SCRIPT FLUSH"));
  tg_batch_item it[2] = {{"k", 1, &q, 1, 0, {0}}, {"j", 1, &q, 1, 0, {0}}};
  assert_int_equal(tg_hit_batch(lim, it, 2), TG_OK);
  assert_int_equal(it[0].status, TG_OK);
  assert_int_equal(it[0].result.count, 4);
  assert_int_equal(it[1].status, TG_OK);
  /* a connection the server killed: reported once, then reopened. A call
   * first, so that the pool's connection is open when the server kills
   * it; the kill must then have closed it (a count, not just "no error") */
  assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_OK);
  redisReply *kr = rs_cmd(c, "CLIENT KILL TYPE normal SKIPME yes");
  assert_non_null(kr);
  if (kr->type != REDIS_REPLY_INTEGER || kr->integer < 1)
    fail_msg("CLIENT KILL closed no connection (reply type %d, %lld)", kr->type,
             kr->integer);
  freeReplyObject(kr);
  rs_sleep_ms(20); /* let the close arrive */
  assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_ECONNECT);
  assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_OK);
  assert_int_equal(v, 4);
  /* a large batch on a connection the server has closed: however the kernel
   * reports it (ECONNRESET, or EPIPE, which raises SIGPIPE unless the send
   * says MSG_NOSIGNAL, and this process keeps SIGPIPE's default action:
   * terminate), the calls answer with codes and the limiter recovers */
  enum { BIG = 20000 };
  tg_batch_item *big = calloc(BIG, sizeof *big);
  assert_non_null(big);
  for (int i = 0; i < BIG; i++)
    big[i] = (tg_batch_item){"k", 1, &q, 1, 0, {0}};
  for (int round = 0; round < 3; round++) {
    assert_int_equal(tg_get(lim, "k", 1, &q, &v), TG_OK); /* open */
    assert_true(rs_ok(c, "CLIENT KILL TYPE normal SKIPME yes"));
    rs_sleep_ms(20); /* let the close arrive */
    assert_int_equal(tg_hit_batch(lim, big, BIG), TG_OK);
    /* the first pipeline (1024 calls) meets the dead connection; the next
     * ones open a new one */
    for (int i = 0; i < BIG; i++) {
      if (i < 1024)
        assert_int_equal(big[i].status, TG_ECONNECT);
      if (big[i].status == TG_ECONNECT)
        assert_true(big[i].result.degraded && big[i].result.allowed);
      else
        assert_true(big[i].status == TG_OK && !big[i].result.degraded);
    }
  }
  free(big);
  assert_int_equal(until_ok(lim, &q, &r), TG_OK);
  tg_limiter_destroy(lim);
  redisFree(c);
}

/* A script that will not end: the server answers BUSY to everyone else. */
static void *busy_script(void *arg) {
  (void)arg;
  redisContext *c = rs_connect();
  if (!c)
    return NULL;
  struct timeval tv = {10, 0};
  redisSetTimeout(c, tv);
  redisReply *r = rs_cmd(c, "EVAL %s 0", "while true do end");
  if (r)
    freeReplyObject(r);
  redisFree(c);
  return NULL;
}

static void busy_server(void **state) {
  (void)state;
  redisContext *c = admin();
  assert_true(rs_ok(c, "CONFIG SET busy-reply-threshold 50"));
  tg_limiter *lim = fragile(TG_LEAKY_BUCKET, "busy", TG_POLICY_ERROR, 1);
  tg_quota q = {.limit = 5, .period_ms = 1000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, busy_script, NULL), 0);
  int rc = TG_OK;
  for (int i = 0; i < 100 && rc == TG_OK; i++) {
    rs_sleep_ms(20);
    rc = tg_hit(lim, "k", 1, &q, 0, &r);
  }
  assert_int_equal(rc, TG_ESTORE); /* -BUSY */
  assert_true(r.degraded && !r.allowed);
  assert_int_equal(r.retry_after_ms, TG_NEVER);
  redisReply *k = NULL;
  for (int i = 0; i < 100; i++) {
    k = rs_cmd(c, "SCRIPT KILL");
    if (k && k->type != REDIS_REPLY_ERROR)
      break;
    if (k)
      freeReplyObject(k);
    k = NULL;
    rs_sleep_ms(20);
  }
  assert_non_null(k);
  freeReplyObject(k);
  pthread_join(th, NULL);
  assert_int_equal(until_ok(lim, &q, &r), TG_OK);
  tg_limiter_destroy(lim);
  assert_true(rs_ok(c, "CONFIG SET busy-reply-threshold 5000"));
  redisFree(c);
}

static void auth_and_database(void **state) {
  (void)state;
  redisContext *c = admin();
  tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result r;
  assert_true(rs_ok(c, "CONFIG SET requirepass %s", "s3cret"));
  tg_config cfg;
  tg_config_init(&cfg);
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = "auth";
  rc.reconnect_backoff_ms = 0;
  cfg.redis = &rc;
  tg_limiter *lim;
  /* no password, a wrong one: a store error, never a silent deny */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ESTORE);
  assert_true(r.degraded);
  tg_limiter_destroy(lim);
  rc.password = "wrong";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ESTORE);
  tg_limiter_destroy(lim);
  /* the right one, as the default user and as user "default" (ACL form),
   * over the unix socket, in database 5 */
  rc.password = "s3cret";
  rc.db = 5;
  rc.unix_path = rs_sock();
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_true(r.allowed);
  tg_limiter_destroy(lim);
  rc.username = "default";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 2);
  /* on a unix socket the port is unused: limiters that differ only in it
   * are one server, and decide a policy together (it was TG_EINVAL) */
  tg_limiter *other;
  rc.port = 7500;
  assert_int_equal(tg_limiter_new(&other, &cfg), TG_OK);
  tg_rule ru[2] = {{lim, "u}a", 3, &q, 1, 0, {0}},
                   {other, "u}b", 3, &q, 1, 0, {0}}}; /* one slot */
  tg_rules_result out;
  assert_int_equal(tg_hit_rules(ru, 2, 0, &out), TG_OK);
  assert_true(out.r.allowed);
  tg_limiter_destroy(other);
  tg_limiter_destroy(lim);
  redisFree(c);
  c = admin();
  assert_true(rs_ok(c, "AUTH %s", "s3cret"));
  assert_true(rs_ok(c, "SELECT 5"));
  redisReply *p = rs_cmd(c, "EXISTS %s", "auth:{k}:fw");
  assert_int_equal(p->integer, 1);
  freeReplyObject(p);
  assert_true(rs_ok(c, "SELECT 0"));
  p = rs_cmd(c, "EXISTS %s", "auth:{k}:fw");
  assert_int_equal(p->integer, 0);
  freeReplyObject(p);
  assert_true(rs_ok(c, "CONFIG SET requirepass %s", ""));
  redisFree(c);
}

/* A user whose ACL forbids COMMAND cannot ask whether the module is there:
 * the store then uses the script, as without the module. */
static void acl_without_command(void **state) {
  (void)state;
  redisContext *c = admin();
  assert_true(rs_ok(c, "ACL SETUSER tglimited on >pw ~* +@all -command"));
  tg_config cfg;
  tg_config_init(&cfg);
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = "acl";
  rc.username = "tglimited";
  rc.password = "pw";
  cfg.redis = &rc;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_quota q = {.limit = 2, .period_ms = 60000};
  tg_result r;
  for (int i = 1; i <= 3; i++) {
    assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_OK);
    assert_int_equal(r.allowed, i <= 2);
  }
  tg_limiter_destroy(lim);
  assert_true(rs_ok(c, "ACL DELUSER tglimited"));
  redisFree(c);
}

/* ---- threads ------------------------------------------------------------- */

typedef struct hammer {
  tg_limiter *lim;
  uint64_t now;
  int calls;
  long allowed, errors;
} hammer;

static void *hammer_one_key(void *arg) {
  hammer *h = arg;
  tg_quota q = {.limit = 100, .period_ms = 3600000, .burst = 100};
  for (int i = 0; i < h->calls; i++) {
    tg_result r;
    if (tg_hit_at(h->lim, h->now, "hot", 3, &q, 1, &r) != TG_OK)
      h->errors++;
    else if (r.allowed)
      h->allowed++;
  }
  return NULL;
}

static void threads_share_one_limit(void **state) {
  (void)state;
  static const tg_algorithm algs[] = {TG_FIXED_WINDOW, TG_TOKEN_BUCKET,
                                      TG_SLIDING_WINDOW};
  enum { T = 4, M = 150 };
  for (size_t a = 0; a < 3; a++) {
    tg_redis_config rc;
    tg_redis_config_init(&rc);
    rc.pool_size = 3; /* fewer connections than threads: some wait */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "thr%ld", (long)getpid());
    tg_limiter *lim = redis_limiter_cfg(algs[a], prefix, &rc, 1024);
    uint64_t now = real_us();
    hammer h[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
      h[i] = (hammer){lim, now, M, 0, 0};
      assert_int_equal(pthread_create(&th[i], NULL, hammer_one_key, &h[i]), 0);
    }
    long allowed = 0;
    for (int i = 0; i < T; i++) {
      pthread_join(th[i], NULL);
      assert_int_equal(h[i].errors, 0);
      allowed += h[i].allowed;
    }
    assert_int_equal(allowed, 100); /* exactly the limit, never more */
    if (algs[a] == TG_FIXED_WINDOW) {
      uint64_t count;
      tg_quota q = {.limit = 100, .period_ms = 3600000};
      assert_int_equal(tg_get_at(lim, now, "hot", 3, &q, &count), TG_OK);
      assert_int_equal(count, T * M); /* every hit counted */
    }
    tg_limiter_destroy(lim);
  }
}

/* A limiter used before fork(): the child must not share the parent's
 * socket (replies would cross), so it opens its own connection. */
static void fork_child_reconnects(void **state) {
  (void)state;
  char prefix[32];
  snprintf(prefix, sizeof prefix, "fork%ld", (long)getpid());
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.pool_size = 1;
  tg_limiter *lim = redis_limiter_cfg(TG_FIXED_WINDOW, prefix, &rc, 1024);
  tg_quota q = {.limit = 1000000, .period_ms = 3600000};
  uint64_t now = real_us();
  tg_result r;
  int inheritable = inheritable_sockets();
  assert_int_equal(tg_hit_at(lim, now, "f", 1, &q, 1, &r), TG_OK); /* open */
  /* the child may exec: the connection is not inherited then */
  assert_int_equal(inheritable_sockets(), inheritable);
  enum { N = 2000 };
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int bad = 0;
    for (int i = 0; i < N; i++) {
      uint64_t v = 0;
      if (tg_hit_at(lim, now, "f", 1, &q, 1, &r) != TG_OK || !r.allowed ||
          tg_get_at(lim, now, "f", 1, &q, &v) != TG_OK || v < 2)
        bad++;
    }
    _exit(bad > 100 ? 100 : bad);
  }
  int bad = 0;
  for (int i = 0; i < N; i++) {
    uint64_t v = 0;
    if (tg_hit_at(lim, now, "f", 1, &q, 1, &r) != TG_OK || !r.allowed ||
        tg_get_at(lim, now, "f", 1, &q, &v) != TG_OK || v < 2)
      bad++;
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(bad, 0);
  uint64_t count = 0;
  assert_int_equal(tg_get_at(lim, now, "f", 1, &q, &count), TG_OK);
  assert_int_equal(count, 1 + 2 * N); /* every hit of both, counted once */
  tg_limiter_destroy(lim);
}

/* The value encoding's decimal routines against the C library's: every
 * length of digits, the 19/20-digit edge where overflow becomes possible,
 * and what must be refused. */
static void decimal_round_trips(void **state) {
  (void)state;
  uint64_t vals[200];
  size_t nv = 0;
  for (uint64_t p = 1; nv < 40; p *= 10) {
    vals[nv++] = p - 1;
    vals[nv++] = p;
    if (p > UINT64_MAX / 10)
      break;
  }
  vals[nv++] = UINT64_MAX;
  vals[nv++] = UINT64_MAX - 1;
  uint64_t x = 88172645463325252u; /* xorshift64 */
  while (nv < 200) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    vals[nv++] = x >> (x % 64);
  }
  for (size_t i = 0; i < nv; i++) {
    char mine[24], ref[24];
    size_t n = tg__u64_dec(mine, vals[i]);
    int m = snprintf(ref, sizeof ref, "%" PRIu64, vals[i]);
    assert_int_equal(n, (size_t)m);
    assert_memory_equal(mine, ref, n);
    const char *p = ref;
    uint64_t back = 0;
    assert_true(tg__scan_u64(&p, ref + m, &back));
    assert_ptr_equal(p, ref + m);
    assert_true(back == vals[i]);
  }
  static const struct {
    const char *s;
    bool ok;
    uint64_t v;
    size_t used;
  } cases[] = {
      {"18446744073709551615", true, UINT64_MAX, 20},
      {"18446744073709551616", false, 0, 0},
      {"99999999999999999999", false, 0, 0},
      {"9999999999999999999", true, 9999999999999999999u, 19},
      {"000000000000000000001", false, 0, 0}, /* 21 digits */
      {"00000000000000000001", true, 1, 20},
      {"12:34", true, 12, 2},
      {"", false, 0, 0},
      {":1", false, 0, 0},
      {"-1", false, 0, 0},
      {"7\xc0", true, 7, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *s = cases[i].s, *p = s;
    uint64_t v = 0;
    bool ok = tg__scan_u64(&p, s + strlen(s), &v);
    assert_int_equal(ok, cases[i].ok);
    if (ok) {
      assert_true(v == cases[i].v);
      assert_ptr_equal(p, s + cases[i].used);
    } else {
      assert_ptr_equal(p, s);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(decimal_round_trips),
      cmocka_unit_test_setup(available, server_up),
      cmocka_unit_test_setup(config_is_validated, server_up),
      cmocka_unit_test_setup(path_follows_the_server, server_up),
      cmocka_unit_test_setup(policy_round_trips, server_up),
      cmocka_unit_test_setup(policy_differential, server_up),
      cmocka_unit_test_setup(differential_all, server_up),
      cmocka_unit_test_setup(server_time_decides, server_up),
      cmocka_unit_test_setup(ttl_follows_freshness, server_up),
      cmocka_unit_test_setup(key_names_are_hash_tagged, server_up),
      cmocka_unit_test_setup(corrupt_values, server_up),
      cmocka_unit_test_setup(batch_matches_single_calls, server_up),
      cmocka_unit_test_setup(server_down_then_back, server_up),
      cmocka_unit_test_setup(restart_mid_stream, server_up),
      cmocka_unit_test_setup(unresponsive_server_times_out, server_up),
      cmocka_unit_test_setup(timeout_holds_under_signals, server_up),
      cmocka_unit_test_setup(unresponsive_server_fails_fast, server_up),
      cmocka_unit_test_setup(queued_calls_fail_fast, server_up),
      cmocka_unit_test(batch_retry_timeout_marks_down),
      cmocka_unit_test_setup(one_probe_at_a_time, server_up),
      cmocka_unit_test_setup(over_maxmemory_reads_answer, server_up),
      cmocka_unit_test_setup(error_replies, server_up),
      cmocka_unit_test_setup(busy_server, server_up),
      cmocka_unit_test_setup(auth_and_database, server_up),
      cmocka_unit_test_setup(acl_without_command, server_up),
      cmocka_unit_test_setup(threads_share_one_limit, server_up),
      cmocka_unit_test_setup(fork_child_reconnects, server_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
