/* SPDX-License-Identifier: MIT */
/*
 * test_model.c - a single-threaded model test of the memory store: millions
 * of random operations (hit, get, set, inc, expires_at, reset, tg_clean_at,
 * time jumps) on a small table filled to capacity, checked against a
 * reference map.
 *
 * What is under test is the storage layer, not the arithmetic (the
 * acceptance and property tests cover that): the reference keeps each key's
 * state and runs the pure core on it (src/core: tg__state_step, tg__log_step,
 * tg__state_fresh), so every answer must be exactly the core's answer on the
 * key's whole history, however often the table reclaimed, re-created, reset
 * or refused the key. The reference also tracks which keys the table holds,
 * following the contract of tollgate.h and table.c:
 *
 *   - a key enters the table when a call on it, evaluated on an absent
 *     state, changes that state into a non-fresh one (a peek, a get or a
 *     denied bucket call never creates a key);
 *   - it stays until a pass reclaims it (a reset leaves it in place with the
 *     all-zero state, E = 0 below): a key is reclaimable at now when its
 *     state stopped mattering at E <= now (window end, bucket TAT, newest log
 *     entry + period); tg_clean_at reclaims those with now - E >=
 *     key_older_than_ms (and hands those with E > 0 to before_clean), a
 *     new key that finds the table full reclaims them all whatever their age
 *     (with fewer than RECLAIM_SCAN = 4096 slots the scan covers the whole
 *     table) without calling before_clean;
 *   - so a new key gets TG_EFULL iff, after that, capacity keys remain; the
 *     reference is then unchanged and a hit's result is the failure policy's
 *     answer with degraded = true.
 * tg_key_count must equal the number of keys the reference says the table
 * holds after every call, never exceed capacity, and never be below the
 * number of keys whose state is not fresh.
 *
 * Time only moves forward here (by 0, sub-ms, ms or several-period jumps),
 * so the table's reclaim horizon never delays an evaluation; test_memory_store
 * covers the horizon.
 *
 * Environment: TG_MODEL_SEED (base seed, printed on every run),
 * TG_MODEL_STEPS (steps per algorithm across all configurations, default
 * 1000000), TG_MODEL_QUICK (default 200000, also the default under ASan or
 * TSan). On a mismatch the test prints the seed, the configuration, the step
 * and the key's recent history, then fails.
 */
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

#include "core/core.h"
#include "tollgate.h"
#include "util.h"

#define DEFAULT_SEED UINT64_C(0x70116a7e3ab1e001)
#define DEFAULT_STEPS UINT64_C(1000000)
#define QUICK_STEPS UINT64_C(200000)
#define T0 UINT64_C(1700000000000000) /* us: where every run starts */
#define HIST 12                       /* calls remembered per key */
#define SWEEP_EVERY 4096              /* steps between full read sweeps */
#define MAX_ROOM 64                   /* sliding: reference log entries */
#define MAX_LOG_MAX 1024              /* sliding: largest log_max used */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* ---- random numbers and the environment: util.h ---- */

static uint64_t steps_per_algorithm(void) {
  bool q = SANITIZED || env_flag("TG_MODEL_QUICK");
  return env_u64("TG_MODEL_STEPS", q ? QUICK_STEPS : DEFAULT_STEPS);
}

/* ---- configurations ---- */

/* One table setup; every algorithm runs all of them, the steps split
 * evenly. Capacities stay far below 4096 slots (see the top comment). */
typedef struct mconfig {
  uint64_t capacity;
  uint64_t long_keys; /* 0: "= capacity" */
  uint64_t older_ms;  /* key_older_than_ms */
  tg_policy policy;
  uint32_t log_max;       /* sliding_max_entries */
  unsigned keys_per_slot; /* keys in the universe = capacity * this */
  unsigned pace;          /* 0: slow clock (tables stay full), 1: faster */
} mconfig;

static const mconfig configs[] = {
    {16, 16, 0, TG_POLICY_FAIL_OPEN, 1024, 3, 0},
    {16, 0, 3, TG_POLICY_FAIL_CLOSED, 2, 3, 1},
    {37, 37, 1, TG_POLICY_ERROR, 1024, 3, 0},
    {64, 64, 10, TG_POLICY_FAIL_OPEN, 3, 3, 0},
    {23, 23, 0, TG_POLICY_FAIL_CLOSED, 1024, 4, 1},
    {50, 0, 5, TG_POLICY_ERROR, 1024, 3, 1},
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

/* ---- the reference map ---- */

enum { OP_HIT, OP_INC, OP_GET, OP_SET, OP_EXPIRES, OP_RESET, OP_CLEAN };
static const char *const op_names[] = {"hit",     "inc",   "get",  "set",
                                       "expires", "reset", "clean"};

typedef struct hist {
  uint64_t step, now_us, arg;
  int op, rc;
  bool in_table; /* before the call */
} hist;

typedef struct mkey {
  unsigned char bytes[TG_KEY_MAX];
  size_t len;
  tg_quota q;   /* fixed per key */
  tg__quota pq; /* prepared */
  tg__state st; /* windows and buckets: the whole history's state */
  tg__entry *e; /* sliding: the log, room entries */
  uint32_t n, room;
  uint64_t last_us; /* sliding: newest entry the table's log has kept since
                       the key entered it (an emptied log reports it) */
  bool in_table;    /* the table holds it (per the rules above) */
  hist h[HIST];
  unsigned nh;
} mkey;

typedef struct cb_item {
  unsigned char key[TG_KEY_MAX];
  size_t len;
  uint64_t value, expired_at_ms;
} cb_item;

typedef struct model {
  tg_algorithm alg;
  const mconfig *cfg;
  unsigned cfg_index;
  uint64_t seed, rng;
  uint64_t step;
  uint64_t now_us;
  tg_limiter *lim;
  mkey *keys;
  size_t nkeys;
  size_t held; /* keys with in_table */
  /* before_clean, as observed */
  bool cleaning;
  size_t cb_calls, cb_n, cb_cap;
  cb_item *cb;
  char cb_err[200];
  /* stats */
  uint64_t efull, pressure_reclaimed, cleaned, inserts, resets, full_steps;
} model;

static bool is_window(tg_algorithm a) {
  return a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
}
static bool is_bucket(tg_algorithm a) {
  return a == TG_TOKEN_BUCKET || a == TG_LEAKY_BUCKET;
}

/* When the key's state stopped mattering, us (0: never mattered). This is
 * what the table compares with now and key_older_than_ms. */
static uint64_t expiry_us(const model *m, const mkey *k) {
  if (m->alg == TG_SLIDING_WINDOW)
    return k->n         ? k->e[k->n - 1].t_us + k->pq.period_us
           : k->last_us ? k->last_us + k->pq.period_us
                        : 0;
  if (is_window(m->alg))
    return tg__win_end(&k->st);
  return tg__div_ceil(tg__tat(&k->st), 1000);
}

static bool reclaimable(const model *m, const mkey *k, uint64_t older_us) {
  uint64_t e = expiry_us(m, k);
  return e <= m->now_us && m->now_us - e >= older_us;
}

/* Fresh in the contract's sense: equivalent to an absent key at now. */
static bool fresh(const model *m, const mkey *k) {
  if (m->alg == TG_SLIDING_WINDOW)
    return expiry_us(m, k) <= m->now_us;
  return tg__state_fresh(m->alg, &k->st, m->now_us);
}

static tg__call make_call(const model *m, const mkey *k, tg__op op,
                          uint64_t arg) {
  tg__call c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.alg = m->alg;
  c.key = k->bytes;
  c.key_len = k->len;
  c.q = k->pq;
  c.arg = arg;
  c.now_us = m->now_us;
  return c;
}

/* The core's answer on a copy of the key's state; *changed says whether the
 * state changed. The copy is returned in *st_out / *e_out, *n_out. */
static int ref_step(const model *m, const mkey *k, const tg__call *c,
                    tg__outcome *o, bool *changed, tg__state *st_out,
                    tg__entry *e_out, uint32_t *n_out) {
  if (m->alg == TG_SLIDING_WINDOW) {
    /* the core keeps a ring of log_max entries with its cost sum: run the
     * step on one, then hand the entries back oldest first */
    static tg__entry ring[MAX_LOG_MAX];
    assert_true(m->cfg->log_max <= MAX_LOG_MAX);
    tg__log lg = {ring, 0, k->n, m->cfg->log_max, 0};
    for (uint32_t i = 0; i < k->n; i++) {
      ring[i] = k->e[i];
      lg.sum += k->e[i].cost;
    }
    int rc = tg__log_step(c, &lg, o, changed);
    for (uint32_t i = 0; i < lg.n; i++)
      e_out[i] = *tg__log_at(&lg, i);
    *n_out = lg.n;
    return rc;
  }
  *st_out = k->st;
  return tg__state_step(c, st_out, o, changed);
}

/* Would the table create the key for this call? (The same step on an absent
 * state changes it into something not fresh.) */
static bool creates_key(const model *m, const tg__call *c) {
  tg__outcome o;
  bool changed = false;
  if (m->alg == TG_SLIDING_WINDOW) {
    tg__entry one[1];
    tg__log lg = {one, 0, 0, 1, 0};
    return tg__log_step(c, &lg, &o, &changed) == TG_OK && changed;
  }
  tg__state st = {0, 0};
  return tg__state_step(c, &st, &o, &changed) == TG_OK && changed &&
         !tg__state_fresh(m->alg, &st, c->now_us);
}

static void remember(mkey *k, const model *m, int op, uint64_t arg, int rc,
                     bool in_table) {
  hist *h = &k->h[k->nh++ % HIST];
  h->step = m->step;
  h->now_us = m->now_us;
  h->arg = arg;
  h->op = op;
  h->rc = rc;
  h->in_table = in_table;
}

static void print_key(const mkey *k) {
  print_error("  key (%zu bytes):", k->len);
  for (size_t i = 0; i < k->len && i < 40; i++)
    print_error(" %02x", k->bytes[i]);
  print_error("%s\n", k->len > 40 ? " ..." : "");
  print_error("  quota limit %" PRIu64 " period %" PRIu64 " ms burst %" PRIu64
              "; in table %d; ref state %" PRIu64 ", %" PRIu64 " log n=%u\n",
              k->q.limit, k->q.period_ms, k->q.burst, k->in_table,
              tg__state_word(&k->st, 0), tg__state_word(&k->st, 1), k->n);
  for (uint32_t i = 0; i < k->n; i++)
    print_error("    log[%u] t=%" PRIu64 " cost=%" PRIu64 "\n", i, k->e[i].t_us,
                k->e[i].cost);
  unsigned first = k->nh > HIST ? k->nh - HIST : 0;
  for (unsigned i = first; i < k->nh; i++) {
    const hist *h = &k->h[i % HIST];
    print_error("    step %" PRIu64 " now %" PRIu64 " (T0%+" PRId64
                " us) %s(%" PRIu64 ") -> %s, in table before: %d\n",
                h->step, h->now_us, (int64_t)(h->now_us - T0), op_names[h->op],
                h->arg, tg_err_name(h->rc), h->in_table);
  }
}

static uint64_t base_seed(void);
static void mismatch(const model *m, const mkey *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void mismatch(const model *m, const mkey *k, const char *fmt, ...) {
  va_list ap;
  char msg[400];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  print_error("\n=== test_model MISMATCH: %s, config %u (capacity %" PRIu64
              ", key_older_than_ms %" PRIu64 "), seed 0x%016" PRIx64
              ", step %" PRIu64 ", now T0%+" PRId64 " us\n  %s\n"
              "  table holds %zu keys per the reference, tg_key_count %zu\n",
              tg_algorithm_name(m->alg), m->cfg_index, m->cfg->capacity,
              m->cfg->older_ms, m->seed, m->step, (int64_t)(m->now_us - T0),
              msg, m->held, tg_key_count(m->lim));
  if (k)
    print_key(k);
  print_error("  reproduce: TG_MODEL_SEED=0x%016" PRIx64
              " TG_MODEL_STEPS=%" PRIu64 " test_model\n",
              base_seed(), steps_per_algorithm());
  fail();
}

/* ---- before_clean ---- */

static int on_clean(tg_algorithm alg, const tg_expired *entries, size_t n,
                    void *ctx) {
  model *m = ctx;
  if (!m->cleaning && !m->cb_err[0])
    snprintf(m->cb_err, sizeof m->cb_err,
             "before_clean called outside tg_clean_at (%zu entries)", n);
  if (alg != m->alg && !m->cb_err[0])
    snprintf(m->cb_err, sizeof m->cb_err, "before_clean got algorithm %d",
             (int)alg);
  if ((n == 0 || n > 64) && !m->cb_err[0])
    snprintf(m->cb_err, sizeof m->cb_err, "before_clean batch of %zu", n);
  m->cb_calls++;
  for (size_t i = 0; i < n; i++) {
    if (m->cb_n == m->cb_cap) {
      if (!m->cb_err[0])
        snprintf(m->cb_err, sizeof m->cb_err,
                 "before_clean got more entries than keys");
      break;
    }
    cb_item *it = &m->cb[m->cb_n++];
    it->len = entries[i].key_len;
    if (it->len == 0 || it->len > TG_KEY_MAX) {
      snprintf(m->cb_err, sizeof m->cb_err, "before_clean key_len %zu",
               it->len);
      it->len = 0;
      continue;
    }
    memcpy(it->key, entries[i].key, it->len);
    it->value = entries[i].value;
    it->expired_at_ms = entries[i].expired_at_ms;
  }
  return (int)(m->cb_calls % 3) - 1; /* failures must not stop deletion */
}

/* ---- setup ---- */

static void make_keys(model *m) {
  const mconfig *cf = m->cfg;
  m->nkeys = (size_t)(cf->capacity * cf->keys_per_slot);
  m->keys = calloc(m->nkeys, sizeof *m->keys);
  assert_non_null(m->keys);
  uint64_t *r = &m->rng;
  for (size_t i = 0; i < m->nkeys; i++) {
    mkey *k = &m->keys[i];
    for (;;) {
      /* lengths: short inline, up to the inline limit, the 32/33 border,
       * chunked, the longest; some keys are near-duplicates of the last */
      unsigned pick = (unsigned)rng_below(r, 100);
      if (i > 0 && pick < 15) {
        const mkey *p = &m->keys[i - 1];
        memcpy(k->bytes, p->bytes, p->len);
        k->len = p->len;
        switch (rng_below(r, 3)) {
        case 0: /* last byte differs */
          k->bytes[k->len - 1] ^= (unsigned char)rng_range(r, 1, 255);
          break;
        case 1: /* one NUL more */
          if (k->len < TG_KEY_MAX)
            k->bytes[k->len++] = 0;
          break;
        default: /* one byte less */
          if (k->len > 1)
            k->len--;
          break;
        }
      } else {
        if (pick < 35)
          k->len = (size_t)rng_range(r, 1, 8);
        else if (pick < 50)
          k->len = (size_t)rng_range(r, 9, 31);
        else if (pick < 60)
          k->len = (size_t)rng_range(r, 32, 33);
        else if (pick < 95)
          k->len = (size_t)rng_range(r, 34, TG_KEY_MAX - 1);
        else
          k->len = TG_KEY_MAX;
        key_random(r, k->bytes, k->len);
      }
      bool dup = false;
      for (size_t j = 0; j < i && !dup; j++)
        dup = m->keys[j].len == k->len &&
              memcmp(m->keys[j].bytes, k->bytes, k->len) == 0;
      if (!dup)
        break;
    }
    static const uint64_t periods[] = {1, 2, 3, 10, 25, 100, 400};
    k->q.limit = rng_chance(r, 10) ? rng_range(r, 13, 60) : rng_range(r, 1, 12);
    k->q.period_ms = periods[rng_below(r, sizeof periods / sizeof periods[0])];
    k->q.burst = rng_chance(r, 40) ? 0 : rng_range(r, 1, 2 * k->q.limit);
    assert_int_equal(tg__quota_prepare(&k->pq, &k->q, m->alg), TG_OK);
    if (m->alg == TG_SLIDING_WINDOW) {
      /* live costs never pass the limit and each is >= 1, so a pruned log
       * holds at most limit entries and the step appends at most one */
      uint64_t room = k->q.limit + 1;
      if (room > cf->log_max)
        room = cf->log_max;
      assert_true(room <= MAX_ROOM);
      k->room = (uint32_t)room;
      k->e = calloc(room, sizeof *k->e);
      assert_non_null(k->e);
    }
  }
  m->cb_cap = m->nkeys;
  m->cb = calloc(m->cb_cap, sizeof *m->cb);
  assert_non_null(m->cb);
}

static void model_init(model *m, tg_algorithm alg, unsigned ci,
                       uint64_t base_seed) {
  memset(m, 0, sizeof *m);
  m->alg = alg;
  m->cfg = &configs[ci];
  m->cfg_index = ci;
  m->seed = base_seed ^ ((uint64_t)alg << 56) ^ ((uint64_t)ci << 48);
  m->rng = m->seed;
  m->now_us = T0 + rng_below(&m->rng, 1000000);
  make_keys(m);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = m->cfg->capacity;
  cfg.long_keys = m->cfg->long_keys;
  cfg.on_failure = m->cfg->policy;
  cfg.sliding_max_entries = m->cfg->log_max;
  cfg.clean_period_ms = 0; /* passes only when the model asks */
  cfg.key_older_than_ms = m->cfg->older_ms;
  cfg.before_clean = on_clean;
  cfg.before_clean_ctx = m;
  assert_int_equal(tg_limiter_new(&m->lim, &cfg), TG_OK);
}

static void model_free(model *m) {
  tg_limiter_destroy(m->lim);
  for (size_t i = 0; i < m->nkeys; i++)
    free(m->keys[i].e);
  free(m->keys);
  free(m->cb);
}

/* ---- one operation of each kind ---- */

static void check_result(const model *m, const mkey *k, const char *what,
                         const tg_result *exp, const tg_result *got) {
  if (exp->allowed == got->allowed && exp->degraded == got->degraded &&
      exp->count == got->count && exp->remaining == got->remaining &&
      exp->retry_after_ms == got->retry_after_ms &&
      exp->reset_after_ms == got->reset_after_ms)
    return;
  mismatch(m, k,
           "%s: expected {allowed %d degraded %d count %" PRIu64
           " remaining %" PRIu64 " retry %" PRIu64 " reset %" PRIu64
           "}, got {allowed %d degraded %d count %" PRIu64 " remaining %" PRIu64
           " retry %" PRIu64 " reset %" PRIu64 "}",
           what, exp->allowed, exp->degraded, exp->count, exp->remaining,
           exp->retry_after_ms, exp->reset_after_ms, got->allowed,
           got->degraded, got->count, got->remaining, got->retry_after_ms,
           got->reset_after_ms);
}

/* What a hit answers when the table is full: the policy's answer. */
static tg_result policy_result(const model *m, const mkey *k) {
  tg_result r;
  memset(&r, 0, sizeof r);
  r.degraded = true;
  switch (m->cfg->policy) {
  case TG_POLICY_FAIL_OPEN:
    r.allowed = true;
    break;
  case TG_POLICY_FAIL_CLOSED:
    r.retry_after_ms = k->q.period_ms;
    break;
  case TG_POLICY_ERROR:
  case TG_POLICY_FALLBACK: /* not configured by the model */
    r.retry_after_ms = TG_NEVER;
    break;
  }
  return r;
}

/* A new key found the table full: every reclaimable key goes, whatever its
 * age, without before_clean. */
static void pressure(model *m) {
  for (size_t i = 0; i < m->nkeys; i++) {
    mkey *o = &m->keys[i];
    if (o->in_table && reclaimable(m, o, 0)) {
      o->in_table = false;
      o->last_us = 0;
      m->held--;
      m->pressure_reclaimed++;
    }
  }
}

/* hit, inc, get, set, expires_at: the table against the core. */
static void do_call(model *m, mkey *k, int op, uint64_t arg) {
  static const tg__op core_op[] = {TG__OP_HIT, TG__OP_INC, TG__OP_GET,
                                   TG__OP_SET, TG__OP_EXPIRES};
  tg__call c = make_call(m, k, core_op[op], arg);
  tg__outcome exp;
  memset(&exp, 0, sizeof exp);
  bool changed = false;
  tg__state st;
  tg__entry e[MAX_ROOM];
  uint32_t n = 0;
  int exp_rc = ref_step(m, k, &c, &exp, &changed, &st, e, &n);

  bool was_in = k->in_table;
  if (!was_in && !fresh(m, k))
    mismatch(m, k, "reference: a key outside the table is not fresh");
  bool full = false;
  if (!k->in_table && creates_key(m, &c)) {
    if (m->held >= m->cfg->capacity) {
      m->full_steps++;
      pressure(m);
    }
    if (m->held >= m->cfg->capacity) {
      full = true;
      m->efull++;
    } else {
      k->in_table = true;
      m->held++;
      m->inserts++;
    }
  }
  if (full)
    exp_rc = TG_EFULL;

  int rc;
  tg_result r;
  uint64_t v = UINT64_C(0x5a5a5a5a5a5a5a5a);
  switch (op) {
  case OP_HIT:
    memset(&r, 0x5a, sizeof r);
    rc = tg_hit_at(m->lim, m->now_us, k->bytes, k->len, &k->q, arg, &r);
    break;
  case OP_INC:
    rc = tg_inc_at(m->lim, m->now_us, k->bytes, k->len, &k->q, arg, &v);
    break;
  case OP_GET:
    rc = tg_get_at(m->lim, m->now_us, k->bytes, k->len, &k->q, &v);
    break;
  case OP_SET:
    rc = tg_set_at(m->lim, m->now_us, k->bytes, k->len, &k->q, arg);
    break;
  default:
    rc = tg_expires_at_at(m->lim, m->now_us, k->bytes, k->len, &k->q, &v);
    break;
  }
  remember(k, m, op, arg, rc, was_in);

  if (rc != exp_rc)
    mismatch(m, k, "%s(%" PRIu64 "): expected %s, got %s", op_names[op], arg,
             tg_err_name(exp_rc), tg_err_name(rc));
  if (op == OP_HIT) {
    tg_result want = full ? policy_result(m, k) : exp.r;
    if (rc == TG_OK || full)
      check_result(m, k, "hit", &want, &r);
  } else if (rc == TG_OK && op != OP_SET && v != exp.value) {
    mismatch(m, k, "%s(%" PRIu64 "): expected %" PRIu64 ", got %" PRIu64,
             op_names[op], arg, exp.value, v);
  }
  if (!full && exp_rc == TG_OK && changed) {
    if (m->alg == TG_SLIDING_WINDOW) {
      memcpy(k->e, e, (size_t)n * sizeof *e);
      k->n = n;
      if (n > 0)
        k->last_us = e[n - 1].t_us;
    } else if (!(k->in_table && tg__state_word(&k->st, 0) == 0 &&
                 tg__state_word(&k->st, 1) == 0 &&
                 tg__state_fresh(m->alg, &st, m->now_us))) {
      k->st = st; /* (a reset key, like an absent one, takes no fresh
                     state: see exec_state) */
    }
  }
}

/* A reset key keeps its slot with a fresh state until reclaimed. */
static void do_reset(model *m, mkey *k) {
  int rc = tg_reset(m->lim, k->bytes, k->len);
  remember(k, m, OP_RESET, 0, rc, k->in_table);
  if (rc != TG_OK)
    mismatch(m, k, "reset: %s", tg_err_name(rc));
  k->last_us = 0;
  k->st = (tg__state){0, 0};
  k->n = 0;
  m->resets++;
}

static mkey *find_key(model *m, const unsigned char *key, size_t len) {
  for (size_t i = 0; i < m->nkeys; i++)
    if (m->keys[i].len == len && memcmp(m->keys[i].bytes, key, len) == 0)
      return &m->keys[i];
  return NULL;
}

/* What before_clean reports as the value of an expired key. */
static uint64_t clean_value(const model *m, const mkey *k) {
  if (m->alg == TG_SLIDING_WINDOW) {
    uint64_t sum = 0;
    for (uint32_t i = 0; i < k->n; i++)
      sum += k->e[i].cost;
    return sum;
  }
  return is_window(m->alg) ? tg__win_count(&k->st) : 0;
}

static void do_clean(model *m) {
  uint64_t older_us = m->cfg->older_ms * 1000;
  size_t expect = 0, expect_cb = 0; /* reclaimed, and reported */
  for (size_t i = 0; i < m->nkeys; i++)
    if (m->keys[i].in_table && reclaimable(m, &m->keys[i], older_us)) {
      expect++;
      expect_cb += expiry_us(m, &m->keys[i]) != 0;
    }
  m->cleaning = true;
  m->cb_n = 0;
  m->cb_calls = 0;
  size_t removed = 12345;
  int rc = tg_clean_at(m->lim, m->now_us, &removed);
  m->cleaning = false;
  if (m->cb_err[0])
    mismatch(m, NULL, "%s", m->cb_err);
  if (rc != TG_OK || removed != expect)
    mismatch(m, NULL, "tg_clean_at: %s, removed %zu, expected %zu",
             tg_err_name(rc), removed, expect);
  /* batches of 64 inspected keys, each reported without its reset keys */
  if (m->cb_n != expect_cb || (expect_cb == 0) != (m->cb_calls == 0) ||
      m->cb_calls < (expect_cb + 63) / 64 || m->cb_calls > (expect + 63) / 64)
    mismatch(m, NULL,
             "before_clean: %zu entries in %zu calls, expected %zu entries",
             m->cb_n, m->cb_calls, expect_cb);
  for (size_t i = 0; i < m->cb_n; i++) {
    const cb_item *it = &m->cb[i];
    mkey *k = find_key(m, it->key, it->len);
    if (!k)
      mismatch(m, NULL, "before_clean got an unknown key of %zu bytes",
               it->len);
    if (!k->in_table || !reclaimable(m, k, older_us) || expiry_us(m, k) == 0)
      mismatch(m, k, "before_clean got a key that is not expired, or reset");
    uint64_t want_at = tg__div_ceil(expiry_us(m, k), 1000);
    if (it->value != clean_value(m, k) || it->expired_at_ms != want_at)
      mismatch(m, k,
               "before_clean entry: value %" PRIu64 " expired_at_ms %" PRIu64
               ", expected %" PRIu64 " and %" PRIu64,
               it->value, it->expired_at_ms, clean_value(m, k), want_at);
    remember(k, m, OP_CLEAN, 0, TG_OK, true);
    k->in_table = false; /* also catches a key reported twice */
    k->last_us = 0;
    m->held--;
    m->cleaned++;
  }
  for (size_t i = 0; i < m->nkeys; i++) { /* the reset ones, unreported */
    mkey *k = &m->keys[i];
    if (k->in_table && reclaimable(m, k, older_us)) {
      k->in_table = false;
      m->held--;
      m->cleaned++;
    }
  }
}

/* Every key read back: values and expiries equal the reference's, and the
 * key count lies between the non-fresh keys and the capacity. */
static void sweep(model *m) {
  size_t live = 0;
  for (size_t i = 0; i < m->nkeys; i++) {
    mkey *k = &m->keys[i];
    live += !fresh(m, k);
    do_call(m, k, OP_GET, 0);
    do_call(m, k, OP_EXPIRES, 0);
  }
  size_t n = tg_key_count(m->lim);
  if (n < live || n > m->cfg->capacity)
    mismatch(m, NULL, "tg_key_count %zu outside [%zu non-fresh, %" PRIu64 "]",
             n, live, m->cfg->capacity);
}

/* ---- the run ---- */

/* Time moves forward: often not at all, by sub-ms amounts, by ms, and now
 * and then by up to several periods of the longest quota (400 ms). */
static void advance(model *m) {
  uint64_t *r = &m->rng;
  unsigned p = (unsigned)rng_below(r, 1000);
  unsigned slow = m->cfg->pace == 0 ? 4 : 1; /* slow: jumps 4x rarer */
  if (p < 450)
    return;
  if (p < 750)
    m->now_us += rng_range(r, 1, 999);
  else if (p < 750 + 200 / slow)
    m->now_us += rng_range(r, 1000, 5000);
  else if (p < 750 + 240 / slow)
    m->now_us += rng_range(r, 5000, 60000);
  else if (p < 750 + 248 / slow)
    m->now_us += rng_range(r, 60000, 500000);
  else if (p < 750 + 250 / slow)
    m->now_us += rng_range(r, 500000, 2000000);
}

static uint64_t pick_cost(model *m, const mkey *k) {
  uint64_t *r = &m->rng;
  unsigned p = (unsigned)rng_below(r, 100);
  uint64_t cap = is_bucket(m->alg) ? k->pq.burst : k->q.limit;
  if (p < 10)
    return 0;
  if (p < 65)
    return 1;
  if (p < 90)
    return rng_range(r, 2, 4);
  return rng_range(r, 1, cap + 2);
}

static void run_model(model *m, uint64_t steps) {
  uint64_t *r = &m->rng;
  for (m->step = 0; m->step < steps; m->step++) {
    advance(m);
    mkey *k = &m->keys[rng_below(r, m->nkeys)];
    unsigned p = (unsigned)rng_below(r, 1000);
    if (p < 15) {
      do_clean(m);
    } else if (p < 45) {
      do_reset(m, k);
    } else if (p < 125) {
      do_call(m, k, OP_GET, 0);
    } else if (p < 175) {
      do_call(m, k, OP_EXPIRES, 0);
    } else if (p < 275 && m->alg != TG_SLIDING_WINDOW) {
      uint64_t cap = is_bucket(m->alg) ? k->pq.burst : k->q.limit;
      uint64_t v = rng_chance(r, 5) ? cap + 1 : rng_range(r, 0, cap);
      if (p < 185)
        v = is_bucket(m->alg) && m->alg == TG_TOKEN_BUCKET ? cap : 0;
      do_call(m, k, OP_SET, v);
    } else if (p < 375 && is_window(m->alg)) {
      do_call(m, k, OP_INC, rng_range(r, 0, 3));
    } else {
      do_call(m, k, OP_HIT, pick_cost(m, k));
    }
    size_t n = tg_key_count(m->lim);
    if (n != m->held || n > m->cfg->capacity)
      mismatch(m, k, "tg_key_count %zu, expected %zu (capacity %" PRIu64 ")", n,
               m->held, m->cfg->capacity);
    if (m->step % SWEEP_EVERY == SWEEP_EVERY - 1)
      sweep(m);
  }
  sweep(m);
}

static uint64_t base_seed(void) {
  return test_seed("TG_MODEL_SEED", DEFAULT_SEED);
}

static void model_algorithm(tg_algorithm alg) {
  uint64_t total = steps_per_algorithm(), seed = base_seed();
  double t0 = seconds_now();
  uint64_t efull = 0, pressure_n = 0, cleaned = 0, inserts = 0, full = 0;
  for (unsigned ci = 0; ci < NCONFIGS; ci++) {
    uint64_t steps = total / NCONFIGS + (ci < total % NCONFIGS);
    model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    model_init(m, alg, ci, seed);
    run_model(m, steps);
    efull += m->efull;
    pressure_n += m->pressure_reclaimed;
    cleaned += m->cleaned;
    inserts += m->inserts;
    full += m->full_steps;
    model_free(m);
    free(m);
  }
  printf("test_model: %-20s %" PRIu64 " steps in %.2f s: %" PRIu64
         " inserts, %" PRIu64 " full-table inserts, %" PRIu64
         " TG_EFULL, %" PRIu64 " pressure reclaims, %" PRIu64 " cleaned\n",
         tg_algorithm_name(alg), total, seconds_now() - t0, inserts, full,
         efull, pressure_n, cleaned);
  /* the run must have exercised what it claims to (not for tiny runs) */
  if (total >= 50000) {
    assert_true(efull > 0);
    assert_true(pressure_n > 0);
    assert_true(cleaned > 0);
  }
}

static void model_fixed_window(void **state) {
  (void)state;
  model_algorithm(TG_FIXED_WINDOW);
}
static void model_per_key_window(void **state) {
  (void)state;
  model_algorithm(TG_FIXED_WINDOW_PER_KEY);
}
static void model_sliding_window(void **state) {
  (void)state;
  model_algorithm(TG_SLIDING_WINDOW);
}
static void model_token_bucket(void **state) {
  (void)state;
  model_algorithm(TG_TOKEN_BUCKET);
}
static void model_leaky_bucket(void **state) {
  (void)state;
  model_algorithm(TG_LEAKY_BUCKET);
}

int main(void) {
  printf("test_model: seed 0x%016" PRIx64 " (TG_MODEL_SEED), %" PRIu64
         " steps per algorithm (TG_MODEL_STEPS, TG_MODEL_QUICK)\n",
         base_seed(), steps_per_algorithm());
  fflush(stdout);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(model_fixed_window),
      cmocka_unit_test(model_per_key_window),
      cmocka_unit_test(model_sliding_window),
      cmocka_unit_test(model_token_bucket),
      cmocka_unit_test(model_leaky_bucket),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, NULL));
}
