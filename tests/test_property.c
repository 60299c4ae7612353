/* SPDX-License-Identifier: MIT */
/*
 * test_property.c - randomized property tests: every algorithm is driven
 * through millions of random calls (random time steps, costs, keys, quotas
 * and operations) and every answer is compared with a brute-force reference
 * model written here from the contract (docs/DESIGN.md section 3 and
 * tollgate.h) without looking at src/core. The models are deliberately built
 * differently from GCRA: the windows replay a per-key event history, the
 * sliding log keeps every admitted call and searches for the retry, and the
 * buckets simulate a credit/water level in nanoseconds.
 *
 * Environment: TG_PROPERTY_SEED (base seed, printed on every run),
 * TG_PROPERTY_STEPS (steps per algorithm, default 1000000), TG_PROPERTY_QUICK
 * (default steps 100000, for sanitizer builds). On a mismatch the test prints
 * the seed, the step, the key's recent history and both answers, then fails.
 *
 * Backwards time. The header says "if now is earlier than what the key has
 * seen, the elapsed time is taken as 0", but a bucket keeps one word (its
 * theoretical arrival time) and no "last seen" time, so the exact answer for
 * an earlier now is not predictable from the header alone. The clock here
 * steps back by up to BACK_MAX_US, but a key only sees an earlier now in the
 * cases every reading of the header agrees on (backward_safe() below: same
 * fixed window; inside the opened part of an active per-key window; sliding
 * reads and denials when no entry expired in between; bucket reads on a fresh
 * bucket). Otherwise that call is made at the key's latest time instead.
 * (Observed, not asserted: the library keeps a fixed window's later window
 * and reports end - now, which can exceed the period; the buckets act as raw
 * GCRA, so an earlier now sees less credit and even a peek can be denied.)
 *
 * One quota in ten is extreme but valid (64-bit limits, TG_PERIOD_MAX_MS, a
 * 1 ns emission interval, bucket capacities up to 1e18 ns).
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

#include "tollgate.h"
#include "util.h"

#define DEFAULT_SEED UINT64_C(0x70116a7e5eed0001)
#define DEFAULT_STEPS UINT64_C(1000000)
#define QUICK_STEPS UINT64_C(100000)
#define BACK_MAX_US UINT64_C(3000) /* largest step back of the clock, us */
#define MAX_KEYS 6
#define MAX_QUOTAS 3
#define HIST 24 /* calls remembered per key for failure reports */

/* ---- random numbers and the environment: util.h ---- */

static uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

static uint64_t base_seed(void) {
  return test_seed("TG_PROPERTY_SEED", DEFAULT_SEED);
}

static uint64_t steps_per_algorithm(void) {
  uint64_t def = env_flag("TG_PROPERTY_QUICK") ? QUICK_STEPS : DEFAULT_STEPS;
  return env_u64("TG_PROPERTY_STEPS", def);
}

/* ---- keys: NUL bytes, near-duplicates, the longest legal key ---- */

typedef struct keydef {
  const unsigned char *p;
  size_t len;
} keydef;

static unsigned char long_k[TG_KEY_MAX + 16]; /* all 'k' */
static unsigned char long_j[TG_KEY_MAX];      /* 'k'... then 'j' */
static keydef key_pool[10];
#define KEY_POOL_N (sizeof key_pool / sizeof key_pool[0])

static void init_keys(void) {
  memset(long_k, 'k', sizeof long_k);
  memset(long_j, 'k', sizeof long_j);
  long_j[TG_KEY_MAX - 1] = 'j';
  keydef pool[KEY_POOL_N] = {
      {(const unsigned char *)"a", 1},
      {(const unsigned char *)"b", 1},
      {(const unsigned char *)"a\0b", 3},
      {(const unsigned char *)"a\0c", 3},
      {(const unsigned char *)"\0", 1},
      {(const unsigned char *)"user:42", 7},
      {long_k, TG_KEY_MAX},
      {long_j, TG_KEY_MAX},
      {long_k, TG_KEY_MAX - 1},
      {(const unsigned char *)"\xff\xfe", 2},
  };
  memcpy(key_pool, pool, sizeof pool);
}

/* ---- operations, answers and per-key reference state ---- */

enum { OP_HIT, OP_GET, OP_SET, OP_INC, OP_EXPIRES, OP_RESET };
static const char *const op_names[] = {"hit", "get",        "set",
                                       "inc", "expires_at", "reset"};

/* What one call returned (or should return). */
typedef struct answer {
  int rc;
  tg_result r;  /* OP_HIT */
  uint64_t val; /* OP_GET, OP_INC, OP_EXPIRES */
} answer;

/* One remembered call, for failure reports. */
typedef struct hrec {
  uint64_t step, clock_us, now_us, arg;
  int op;
  answer exp, act;
  bool null_count; /* inc called with count_out NULL: value not compared */
} hrec;

/* Window and sliding-log history: an event per counted call, in call order. */
enum { EV_ADD, EV_SET };
typedef struct event {
  uint64_t t_us; /* now of the call */
  uint64_t v;    /* cost added, or value set */
  int kind;
} event;

typedef struct ref_key {
  const unsigned char *k;
  size_t len;
  int qi;          /* index of the key's (only) quota */
  uint64_t max_us; /* latest now this key was called with (0 after reset) */
  /* windows and sliding log */
  event *ev;
  size_t nev, evcap;
  /* buckets: credit (token) or water level (leaky) in ns, as of b_last_ns,
   * the time of the last change; b_init false = a fresh bucket */
  bool b_init;
  uint64_t b_ns, b_last_ns;
  /* sliding capped test: every admitted call, (time, cost) */
  hrec hist[HIST];
  unsigned nhist;
} ref_key;

typedef struct run_ctx {
  tg_algorithm alg;
  tg_limiter *lim;
  tg_quota q[MAX_QUOTAS];
  int nq;
  ref_key keys[MAX_KEYS];
  int nkeys;
  uint64_t clock_us, clock_max_us; /* the shared clock and its maximum */
  uint64_t step;                   /* global step number in this test */
  uint64_t seed, rng;
  unsigned invalid_permille; /* share of calls made with invalid input */
  bool capped;               /* sliding safety test (no exact model) */
  /* coverage counters, printed at the end so a silent generator shows */
  uint64_t n_allowed, n_denied, n_never, n_back, n_clamped, n_err, n_op[6];
} run_ctx;

static bool supports(tg_algorithm alg, int op) {
  if (op == OP_INC)
    return alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
  if (op == OP_SET)
    return alg != TG_SLIDING_WINDOW;
  return true;
}

static bool is_bucket(tg_algorithm alg) {
  return alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
}

static void push_event(ref_key *k, uint64_t t, uint64_t v, int kind) {
  if (k->nev == k->evcap) {
    k->evcap = k->evcap ? 2 * k->evcap : 64;
    k->ev = realloc(k->ev, k->evcap * sizeof *k->ev);
    if (k->ev == NULL)
      abort();
  }
  k->ev[k->nev++] = (event){t, v, kind};
}

static void drop_events_before(ref_key *k, size_t i) {
  if (i == 0)
    return;
  memmove(k->ev, k->ev + i, (k->nev - i) * sizeof *k->ev);
  k->nev -= i;
}

static uint64_t period_us(const tg_quota *q) { return q->period_ms * 1000; }

/* ---- fixed window: replay the key's events of the current window ---- */

static uint64_t fw_index(uint64_t now_us, const tg_quota *q) {
  return now_us / 1000 / q->period_ms;
}

static uint64_t fw_count(const ref_key *k, const tg_quota *q, uint64_t now) {
  uint64_t w = fw_index(now, q), n = 0;
  for (size_t i = 0; i < k->nev; i++) {
    if (fw_index(k->ev[i].t_us, q) != w)
      continue;
    n = k->ev[i].kind == EV_SET ? k->ev[i].v : n + k->ev[i].v;
  }
  return n;
}

static void fw_prune(ref_key *k, const tg_quota *q, uint64_t now) {
  size_t i = 0;
  while (i < k->nev && fw_index(k->ev[i].t_us, q) < fw_index(now, q))
    i++;
  drop_events_before(k, i);
  if (k->nev && fw_index(k->ev[k->nev - 1].t_us, q) > fw_index(now, q)) {
    fprintf(stderr, "model invariant broken: fixed window went back\n");
    abort();
  }
}

/* ---- per-key window: replay from the event that opened the window ---- */

typedef struct pk_view {
  bool has;
  uint64_t start, end, cnt; /* us, us, count */
  size_t open;              /* index of the opening event */
} pk_view;

static pk_view pk_replay(const ref_key *k, const tg_quota *q) {
  pk_view w = {false, 0, 0, 0, 0};
  for (size_t i = 0; i < k->nev; i++) {
    const event *e = &k->ev[i];
    if (e->kind == EV_SET) {
      w = (pk_view){true, e->t_us, e->t_us + period_us(q), e->v, i};
      continue;
    }
    if (!w.has || w.end <= e->t_us)
      w = (pk_view){true, e->t_us, e->t_us + period_us(q), 0, i};
    w.cnt += e->v;
  }
  return w;
}

static bool pk_active(const pk_view *w, uint64_t now) {
  return w->has && w->end > now;
}

/* ---- sliding log: the admitted calls, live while t + period > now ---- */

static uint64_t sl_sum(const ref_key *k, const tg_quota *q, uint64_t now) {
  uint64_t s = 0;
  for (size_t i = 0; i < k->nev; i++)
    if (k->ev[i].t_us + period_us(q) > now)
      s += k->ev[i].v;
  return s;
}

static bool sl_newest(const ref_key *k, const tg_quota *q, uint64_t now,
                      uint64_t *t) {
  bool any = false;
  for (size_t i = 0; i < k->nev; i++) {
    if (k->ev[i].t_us + period_us(q) > now && (!any || k->ev[i].t_us > *t)) {
      *t = k->ev[i].t_us;
      any = true;
    }
  }
  return any;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Smallest wait (us) after which cost fits: the answer is one of the moments
 * an entry expires, so binary search those with the brute-force sum. Called
 * only for a denied cost <= limit, so some entry is live and the last
 * candidate (everything expired) fits. */
static uint64_t sl_wait_us(const ref_key *k, const tg_quota *q, uint64_t now,
                           uint64_t cost) {
  uint64_t *w = malloc((k->nev + 1) * sizeof *w);
  if (w == NULL)
    abort();
  size_t n = 0;
  for (size_t i = 0; i < k->nev; i++)
    if (k->ev[i].t_us + period_us(q) > now)
      w[n++] = k->ev[i].t_us + period_us(q) - now;
  if (n == 0) {
    fprintf(stderr, "model invariant broken: denied with an empty log\n");
    abort();
  }
  qsort(w, n, sizeof *w, cmp_u64);
  size_t lo = 0, hi = n - 1;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cost <= q->limit - sl_sum(k, q, now + w[mid]))
      hi = mid;
    else
      lo = mid + 1;
  }
  uint64_t r = w[lo];
  free(w);
  return r;
}

static void sl_prune(ref_key *k, const tg_quota *q) {
  size_t j = 0;
  for (size_t i = 0; i < k->nev; i++)
    if (k->ev[i].t_us + period_us(q) + BACK_MAX_US > k->max_us)
      k->ev[j++] = k->ev[i];
  k->nev = j;
}

/* ---- buckets: credit / level in ns, refilled / drained 1 ns per ns ---- */

static uint64_t bk_T(const tg_quota *q) {
  return ceil_div(q->period_ms * UINT64_C(1000000), q->limit);
}

static uint64_t bk_B(const tg_quota *q) {
  return q->burst ? q->burst : q->limit;
}

static uint64_t bk_cap(const tg_quota *q) { return bk_B(q) * bk_T(q); }

/* Credit (token) or level (leaky) at now_ns. */
static uint64_t bk_at(const run_ctx *c, const ref_key *k, const tg_quota *q,
                      uint64_t now_ns) {
  uint64_t cap = bk_cap(q);
  bool token = c->alg == TG_TOKEN_BUCKET;
  if (!k->b_init)
    return token ? cap : 0;
  uint64_t el = now_ns > k->b_last_ns ? now_ns - k->b_last_ns : 0;
  if (token)
    return cap - k->b_ns <= el ? cap : k->b_ns + el;
  return k->b_ns > el ? k->b_ns - el : 0;
}

/* When (ns) the bucket is fresh again: full (token) or empty (leaky). */
static uint64_t bk_fresh_at(const run_ctx *c, const ref_key *k,
                            const tg_quota *q) {
  if (!k->b_init)
    return 0;
  if (c->alg == TG_TOKEN_BUCKET)
    return k->b_last_ns + (bk_cap(q) - k->b_ns);
  return k->b_last_ns + k->b_ns;
}

static void bk_result(const run_ctx *c, const tg_quota *q, uint64_t v,
                      tg_result *r) {
  uint64_t T = bk_T(q), cap = bk_cap(q);
  if (c->alg == TG_TOKEN_BUCKET) {
    r->count = v / T;
    r->remaining = v / T;
    r->reset_after_ms = ceil_div(cap - v, 1000000);
  } else {
    r->count = ceil_div(v, T);
    r->remaining = (cap - v) / T;
    r->reset_after_ms = ceil_div(v, 1000000);
  }
}

/* ---- the reference: expected answer of one call, applying its effect ---- */

static void model_hit(run_ctx *c, ref_key *k, const tg_quota *q, uint64_t now,
                      uint64_t cost, answer *e) {
  tg_result *r = &e->r;
  uint64_t L = q->limit;
  switch (c->alg) {
  case TG_FIXED_WINDOW: {
    uint64_t n = fw_count(k, q, now);
    uint64_t end = (fw_index(now, q) + 1) * q->period_ms * 1000;
    if (cost > UINT64_MAX - n) {
      e->rc = TG_EOVERFLOW;
      return;
    }
    if (cost)
      push_event(k, now, cost, EV_ADD);
    n += cost;
    r->allowed = n <= L;
    r->count = n;
    r->remaining = n <= L ? L - n : 0;
    r->retry_after_ms = r->allowed ? 0
                        : cost > L ? TG_NEVER
                                   : ceil_div(end - now, 1000);
    r->reset_after_ms = n ? ceil_div(end - now, 1000) : 0;
    return;
  }
  case TG_FIXED_WINDOW_PER_KEY: {
    pk_view w = pk_replay(k, q);
    if (!pk_active(&w, now)) {
      if (cost == 0) { /* a peek opens nothing: the key is fresh */
        r->allowed = true;
        r->count = 0;
        r->remaining = L;
        return;
      }
      w = (pk_view){true, now, now + period_us(q), 0, 0};
    }
    if (cost > UINT64_MAX - w.cnt) {
      e->rc = TG_EOVERFLOW;
      return;
    }
    if (cost)
      push_event(k, now, cost, EV_ADD);
    uint64_t n = w.cnt + cost;
    r->allowed = n <= L;
    r->count = n;
    r->remaining = n <= L ? L - n : 0;
    r->retry_after_ms = r->allowed ? 0
                        : cost > L ? TG_NEVER
                                   : ceil_div(w.end - now, 1000);
    r->reset_after_ms = ceil_div(w.end - now, 1000);
    return;
  }
  case TG_SLIDING_WINDOW: {
    uint64_t s = sl_sum(k, q, now), t = 0;
    r->allowed = s <= L && cost <= L - s;
    if (r->allowed && cost)
      push_event(k, now, cost, EV_ADD);
    r->count = r->allowed ? s + cost : s;
    r->remaining = L - r->count;
    r->retry_after_ms = r->allowed ? 0
                        : cost > L
                            ? TG_NEVER
                            : ceil_div(sl_wait_us(k, q, now, cost), 1000);
    r->reset_after_ms =
        sl_newest(k, q, now, &t) ? ceil_div(t + period_us(q) - now, 1000) : 0;
    return;
  }
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET: {
    uint64_t now_ns = now * 1000, T = bk_T(q), cap = bk_cap(q);
    uint64_t v = bk_at(c, k, q, now_ns);
    bool token = c->alg == TG_TOKEN_BUCKET;
    if (cost > bk_B(q)) {
      r->allowed = false;
      r->retry_after_ms = TG_NEVER;
    } else {
      uint64_t need = cost * T;
      r->allowed = token ? v >= need : v + need <= cap;
      if (!r->allowed)
        r->retry_after_ms =
            ceil_div(token ? need - v : v + need - cap, 1000000);
      else if (cost) {
        v = token ? v - need : v + need;
        k->b_init = true;
        k->b_ns = v;
        k->b_last_ns = now_ns;
      }
    }
    bk_result(c, q, v, r);
    return;
  }
  }
}

static void model_op(run_ctx *c, ref_key *k, int op, uint64_t now, uint64_t arg,
                     answer *e) {
  const tg_quota *q = &c->q[k->qi];
  memset(e, 0, sizeof *e);
  if (!supports(c->alg, op)) {
    e->rc = TG_ENOTSUP;
    return;
  }
  if (op == OP_RESET) {
    k->nev = 0;
    k->b_init = false;
    return;
  }
  if (c->alg == TG_FIXED_WINDOW)
    fw_prune(k, q, now);
  if (op == OP_HIT) {
    model_hit(c, k, q, now, arg, e);
  } else if (c->alg == TG_FIXED_WINDOW) {
    uint64_t n = fw_count(k, q, now);
    uint64_t end_ms = (fw_index(now, q) + 1) * q->period_ms;
    if (op == OP_GET)
      e->val = n;
    else if (op == OP_EXPIRES)
      e->val = n ? end_ms : 0;
    else if (op == OP_SET)
      push_event(k, now, arg, EV_SET);
    else if (arg > UINT64_MAX - n)
      e->rc = TG_EOVERFLOW;
    else {
      if (arg)
        push_event(k, now, arg, EV_ADD);
      e->val = n + arg;
    }
  } else if (c->alg == TG_FIXED_WINDOW_PER_KEY) {
    pk_view w = pk_replay(k, q);
    bool act = pk_active(&w, now);
    if (op == OP_GET)
      e->val = act ? w.cnt : 0;
    else if (op == OP_EXPIRES)
      e->val = act ? ceil_div(w.end, 1000) : 0;
    else if (op == OP_SET)
      push_event(k, now, arg, EV_SET);
    else if (act && arg > UINT64_MAX - w.cnt)
      e->rc = TG_EOVERFLOW;
    else {
      push_event(k, now, arg, EV_ADD);
      e->val = (act ? w.cnt : 0) + arg;
    }
  } else if (c->alg == TG_SLIDING_WINDOW) {
    uint64_t t = 0;
    if (op == OP_GET)
      e->val = sl_sum(k, q, now);
    else if (op == OP_EXPIRES)
      e->val = sl_newest(k, q, now, &t) ? ceil_div(t + period_us(q), 1000) : 0;
  } else { /* buckets */
    uint64_t now_ns = now * 1000, T = bk_T(q), cap = bk_cap(q);
    uint64_t v = bk_at(c, k, q, now_ns);
    bool token = c->alg == TG_TOKEN_BUCKET;
    if (op == OP_GET)
      e->val = token ? v / T : ceil_div(v, T);
    else if (op == OP_EXPIRES) {
      uint64_t left = token ? cap - v : v;
      e->val = left ? ceil_div(now_ns + left, 1000000) : 0;
    } else if (op == OP_SET) {
      if (arg > bk_B(q)) {
        e->rc = TG_ERANGE;
      } else {
        k->b_init = true;
        k->b_ns = arg * T;
        k->b_last_ns = now_ns;
      }
    }
  }
  if (c->alg == TG_FIXED_WINDOW_PER_KEY) {
    pk_view w = pk_replay(k, q);
    drop_events_before(k, w.has ? w.open : k->nev);
  }
}

/* Would every reading of the header give the same answer for this call at
 * `now`, earlier than the key's latest time? (See the file comment.) */
static bool backward_safe(run_ctx *c, ref_key *k, int op, uint64_t now,
                          uint64_t arg) {
  const tg_quota *q = &c->q[k->qi];
  if (op == OP_RESET || !supports(c->alg, op))
    return true;
  switch (c->alg) {
  case TG_FIXED_WINDOW:
    return k->nev > 0 && fw_index(now, q) == fw_index(k->max_us, q);
  case TG_FIXED_WINDOW_PER_KEY: {
    pk_view w = pk_replay(k, q);
    bool read = op == OP_GET || op == OP_EXPIRES || (op == OP_HIT && arg == 0);
    if (pk_active(&w, k->max_us))
      return now >= w.start && op != OP_SET;
    return read && !pk_active(&w, now);
  }
  case TG_SLIDING_WINDOW:
    for (size_t i = 0; i < k->nev; i++) {
      uint64_t exp = k->ev[i].t_us + period_us(q);
      if (exp > now && exp <= k->max_us)
        return false; /* expired in between: pruned or not? */
    }
    if (op == OP_HIT && arg > 0) {
      uint64_t s = sl_sum(k, q, now);
      return !(s <= q->limit && arg <= q->limit - s); /* denials only */
    }
    return true;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET: {
    bool read = op == OP_GET || op == OP_EXPIRES ||
                (op == OP_HIT && (arg == 0 || arg > bk_B(q))) ||
                (op == OP_SET && arg > bk_B(q));
    return read && now * 1000 >= bk_fresh_at(c, k, q);
  }
  }
  return false;
}

/* ---- the implementation ---- */

static void call_impl(run_ctx *c, ref_key *k, int op, uint64_t now,
                      uint64_t arg, bool null_count, answer *a) {
  const tg_quota *q = &c->q[k->qi];
  memset(a, 0, sizeof *a);
  switch (op) {
  case OP_HIT:
    a->rc = tg_hit_at(c->lim, now, k->k, k->len, q, arg, &a->r);
    break;
  case OP_GET:
    a->rc = tg_get_at(c->lim, now, k->k, k->len, q, &a->val);
    break;
  case OP_SET:
    a->rc = tg_set_at(c->lim, now, k->k, k->len, q, arg);
    break;
  case OP_INC:
    a->rc = tg_inc_at(c->lim, now, k->k, k->len, q, arg,
                      null_count ? NULL : &a->val);
    break;
  case OP_EXPIRES:
    a->rc = tg_expires_at_at(c->lim, now, k->k, k->len, q, &a->val);
    break;
  case OP_RESET:
    a->rc = tg_reset(c->lim, k->k, k->len);
    break;
  }
}

static bool same_answer(int op, const answer *e, const answer *a,
                        bool null_count) {
  if (e->rc != a->rc)
    return false;
  if (e->rc != 0)
    return true;
  switch (op) {
  case OP_HIT:
    return e->r.allowed == a->r.allowed && !a->r.degraded &&
           e->r.count == a->r.count && e->r.remaining == a->r.remaining &&
           e->r.retry_after_ms == a->r.retry_after_ms &&
           e->r.reset_after_ms == a->r.reset_after_ms;
  case OP_GET:
  case OP_EXPIRES:
    return e->val == a->val;
  case OP_INC:
    return null_count || e->val == a->val;
  default:
    return true;
  }
}

/* ---- failure reports ---- */

static void print_u64(FILE *f, const char *name, uint64_t v) {
  if (v == TG_NEVER)
    fprintf(f, " %s=NEVER", name);
  else
    fprintf(f, " %s=%" PRIu64, name, v);
}

static void print_answer(FILE *f, int op, const answer *a) {
  fprintf(f, "rc=%d", a->rc);
  if (a->rc != 0)
    fprintf(f, "(%s)", tg_err_name(a->rc));
  else if (op == OP_HIT) {
    fprintf(f, " allowed=%d", a->r.allowed);
    if (a->r.degraded)
      fprintf(f, " DEGRADED");
    print_u64(f, "count", a->r.count);
    print_u64(f, "remaining", a->r.remaining);
    print_u64(f, "retry_ms", a->r.retry_after_ms);
    print_u64(f, "reset_ms", a->r.reset_after_ms);
  } else if (op == OP_GET || op == OP_INC || op == OP_EXPIRES)
    print_u64(f, "value", a->val);
}

static void print_key(FILE *f, const ref_key *k) {
  fputc('"', f);
  for (size_t i = 0; i < k->len && i < 12; i++) {
    unsigned char ch = k->k[i];
    if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
      fputc(ch, f);
    else
      fprintf(f, "\\x%02x", ch);
  }
  if (k->len > 12) {
    fprintf(f, "...");
    for (size_t i = k->len - 4; i < k->len; i++)
      fputc(k->k[i], f); /* the long keys differ only at the end */
  }
  fprintf(f, "\" (len %zu)", k->len);
}

static void print_call(FILE *f, const hrec *h) {
  if (h->op == OP_RESET) {
    fprintf(f, "  step %" PRIu64 ": reset() at now_us=%" PRIu64 "\n", h->step,
            h->now_us);
    return;
  }
  fprintf(f, "  step %" PRIu64 ": %s_at(now_us=%" PRIu64, h->step,
          op_names[h->op], h->now_us);
  if (h->null_count)
    fprintf(f, ", count_out=NULL");
  if (h->now_us != h->clock_us)
    fprintf(f, " [clock was %" PRIu64 "]", h->clock_us);
  if (h->op == OP_HIT || h->op == OP_INC)
    fprintf(f, ", cost=%" PRIu64, h->arg);
  else if (h->op == OP_SET)
    fprintf(f, ", value=%" PRIu64, h->arg);
  fprintf(f, ")\n    expected: ");
  print_answer(f, h->op, &h->exp);
  fprintf(f, "\n    actual:   ");
  print_answer(f, h->op, &h->act);
  fprintf(f, "\n");
}

static void report_mismatch(const run_ctx *c, const ref_key *k,
                            const hrec *now_call) {
  const tg_quota *q = &c->q[k->qi];
  FILE *f = stderr;
  fprintf(f,
          "\n=== test_property MISMATCH: algorithm %s, seed 0x%016" PRIx64
          " (TG_PROPERTY_SEED=0x%016" PRIx64 "), step %" PRIu64 " ===\n",
          tg_algorithm_name(c->alg), c->seed, base_seed(), c->step);
  fprintf(f, "key ");
  print_key(f, k);
  fprintf(f,
          ", quota {limit=%" PRIu64 ", period_ms=%" PRIu64 ", burst=%" PRIu64
          "}\n",
          q->limit, q->period_ms, q->burst);
  fprintf(f, "recent history of this key (oldest first):\n");
  unsigned n = k->nhist < HIST ? k->nhist : HIST;
  for (unsigned i = k->nhist - n; i < k->nhist; i++)
    print_call(f, &k->hist[i % HIST]);
  fprintf(f, "failing call:\n");
  print_call(f, now_call);
  if (is_bucket(c->alg))
    fprintf(f,
            "model: T=%" PRIu64 " ns, capacity=%" PRIu64 " ns, %s=%" PRIu64
            " ns at %" PRIu64 " ns (init %d)\n",
            bk_T(q), bk_cap(q), c->alg == TG_TOKEN_BUCKET ? "credit" : "level",
            k->b_ns, k->b_last_ns, k->b_init);
  else
    fprintf(f, "model: %zu event(s) kept for this key\n", k->nev);
}

static void record(ref_key *k, const hrec *h) {
  k->hist[k->nhist % HIST] = *h;
  k->nhist++;
}

/* ---- random calls ---- */

/* A value above cap (cap + 1 .. 2 cap + 2, saturating). */
static uint64_t above(uint64_t *s, uint64_t cap) {
  if (cap >= UINT64_MAX - 2)
    return UINT64_MAX;
  return rng_range(s, cap + 1,
                   cap > UINT64_MAX / 2 - 2 ? UINT64_MAX : 2 * cap + 2);
}

static uint64_t gen_cost(uint64_t *s, uint64_t cap, bool huge_ok) {
  uint64_t r = rng_below(s, 1000);
  if (r < 120)
    return 0;
  if (r < 470)
    return 1;
  if (r < 700)
    return rng_range(s, 2, 8);
  if (r < 830)
    return rng_range(s, 1, cap);
  if (r < 860)
    return cap;
  if (r < 998 || !huge_ok)
    return above(s, cap);
  return r < 999 ? UINT64_MAX - rng_below(s, 4)
                 : (UINT64_C(1) << 63) + rng_below(s, 1000);
}

/* A time worth landing on exactly (or 1 us around): a window end, an entry's
 * expiry, the moment a bucket holds one more token or is fresh again. */
static bool boundary(run_ctx *c, ref_key *k, uint64_t *t) {
  const tg_quota *q = &c->q[k->qi];
  uint64_t now = c->clock_us;
  switch (c->alg) {
  case TG_FIXED_WINDOW:
    *t = (fw_index(now, q) + 1) * q->period_ms * 1000;
    return true;
  case TG_FIXED_WINDOW_PER_KEY: {
    pk_view w = pk_replay(k, q);
    *t = w.end;
    return w.has;
  }
  case TG_SLIDING_WINDOW:
    if (k->nev == 0)
      return false;
    *t = k->ev[rng_below(&c->rng, k->nev)].t_us + period_us(q);
    return true;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET: {
    if (!k->b_init)
      return false;
    uint64_t T = bk_T(q), ns = bk_fresh_at(c, k, q);
    if (rng_below(&c->rng, 2)) { /* one token more / one unit less */
      uint64_t v = bk_at(c, k, q, now * 1000);
      if (c->alg == TG_TOKEN_BUCKET && v / T < bk_B(q))
        ns = now * 1000 + ((v / T + 1) * T - v);
      else if (c->alg == TG_LEAKY_BUCKET && v > 0)
        ns = now * 1000 + (v - (ceil_div(v, T) - 1) * T);
    }
    *t = rng_below(&c->rng, 2) ? ns / 1000 : ceil_div(ns, 1000);
    return true;
  }
  }
  return false;
}

static void advance_clock(run_ctx *c) {
  uint64_t *s = &c->rng;
  uint64_t P = period_us(&c->q[rng_below(s, (uint64_t)c->nq)]);
  if (P > UINT64_C(86400000000))
    P = UINT64_C(86400000000); /* longer periods: reached by boundary jumps */
  uint64_t r = rng_below(s, 100), t = c->clock_us;
  if (r < 22)
    ; /* same microsecond */
  else if (r < 45)
    t += rng_range(s, 1, 999);
  else if (r < 55)
    t += rng_range(s, 1000, 5000);
  else if (r < 70)
    t += rng_range(s, 1, P / 8 + 1);
  else if (r < 79)
    t += rng_range(s, 1, P);
  else if (r < 83)
    t += P * rng_range(s, 1, 4) + rng_below(s, P);
  else if (r < 93) {
    uint64_t b;
    if (boundary(c, &c->keys[rng_below(s, (uint64_t)c->nkeys)], &b)) {
      b += rng_below(s, 3);
      b = b > 0 ? b - 1 : 0;
      uint64_t floor =
          c->clock_max_us > BACK_MAX_US ? c->clock_max_us - BACK_MAX_US : 0;
      if (b >= floor)
        t = b;
    }
  } else {
    uint64_t d = rng_range(s, 1, BACK_MAX_US);
    uint64_t floor =
        c->clock_max_us > BACK_MAX_US ? c->clock_max_us - BACK_MAX_US : 0;
    t = t > d ? t - d : 0;
    if (t < floor)
      t = floor;
  }
  if (t > TG_NOW_MAX_US)
    t = TG_NOW_MAX_US;
  c->clock_us = t;
  if (t > c->clock_max_us)
    c->clock_max_us = t;
}

static void fail_now(void) {
  fail_msg("reference model and tollgate disagree (see above)");
}

/* One valid call on key k: pick it, run model and library, compare. */
static void valid_call(run_ctx *c, ref_key *k, int op, uint64_t arg) {
  uint64_t now = c->clock_us;
  if (now < k->max_us && !backward_safe(c, k, op, now, arg))
    now = k->max_us;
  const tg_quota *q = &c->q[k->qi];
  if (c->alg == TG_FIXED_WINDOW_PER_KEY && op == OP_INC && arg == 0) {
    pk_view w = pk_replay(k, q);
    if (!pk_active(&w, now)) /* does inc 0 reopen an ended window? unsaid */
      arg = 1;
  }
  bool null_count = op == OP_INC && rng_below(&c->rng, 5) == 0;
  c->n_op[op]++;
  if (c->clock_us < k->max_us)
    *(now == c->clock_us ? &c->n_back : &c->n_clamped) += 1;
  hrec h = {c->step, c->clock_us, now, arg, op, {0}, {0}, null_count};
  model_op(c, k, op, now, arg, &h.exp);
  call_impl(c, k, op, now, arg, null_count, &h.act);
  if (!same_answer(op, &h.exp, &h.act, null_count)) {
    report_mismatch(c, k, &h);
    fail_now();
  }
  record(k, &h);
  if (h.act.rc != 0)
    c->n_err++;
  else if (op == OP_HIT)
    *(h.act.r.allowed                      ? &c->n_allowed
      : h.act.r.retry_after_ms == TG_NEVER ? &c->n_never
                                           : &c->n_denied) += 1;
  k->max_us = op == OP_RESET ? 0 : (now > k->max_us ? now : k->max_us);
  if (c->alg == TG_SLIDING_WINDOW)
    sl_prune(k, q);
}

/* One call with exactly one invalid input: it must fail with the documented
 * code and change nothing (key count, and the key's answers afterwards). */
static void invalid_call(run_ctx *c, ref_key *k) {
  uint64_t *s = &c->rng;
  const tg_quota *kq = &c->q[k->qi];
  tg_quota bad = *kq;
  const tg_quota *q = &bad;
  const void *key = k->k;
  size_t len = k->len;
  tg_limiter *lim = c->lim;
  uint64_t now = c->clock_us > k->max_us ? c->clock_us : k->max_us;
  bool null_out = false;
  int op, expect;
  do
    op = (int)rng_below(s, 6);
  while (!supports(c->alg, op));
  unsigned nfault = is_bucket(c->alg) ? 10 : 9;
  unsigned f = (unsigned)rng_below(s, nfault);
  if (op == OP_RESET) { /* reset has no quota, time or output */
    static const unsigned key_faults[] = {3, 4, 6, 8};
    f = key_faults[rng_below(s, 4)];
  }
  if ((op == OP_SET || op == OP_INC) && f == 5)
    f = 4; /* inc's count_out may be NULL; set has none */
  switch (f) {
  case 0:
    bad.limit = 0;
    expect = TG_EQUOTA;
    break;
  case 1:
    bad.period_ms = 0;
    expect = TG_EQUOTA;
    break;
  case 2:
    bad.period_ms = TG_PERIOD_MAX_MS + rng_range(s, 1, 1000);
    expect = TG_EQUOTA;
    break;
  case 3:
    len = 0;
    expect = TG_EKEY;
    break;
  case 4:
    key = long_k;
    len = TG_KEY_MAX + rng_range(s, 1, 8);
    expect = TG_EKEY;
    break;
  case 5:
    null_out = true;
    expect = TG_EINVAL;
    break;
  case 6:
    if (rng_below(s, 2))
      key = NULL;
    else
      lim = NULL;
    expect = TG_EINVAL;
    break;
  case 7:
    now = TG_NOW_MAX_US + rng_range(s, 1, UINT64_C(1) << 40);
    expect = TG_ETIME;
    break;
  case 8:
    key = long_k;
    len = 0;
    expect = TG_EKEY;
    break;
  default: /* buckets: a rate above one per nanosecond */
    bad.limit = bad.period_ms * UINT64_C(1000000) + rng_range(s, 1, 100);
    expect = TG_EQUOTA;
    break;
  }
  uint64_t arg =
      op == OP_SET ? rng_below(s, bk_B(kq) + 1) : gen_cost(s, kq->limit, false);
  size_t before = tg_key_count(c->lim);
  tg_result r = {.allowed = true, .retry_after_ms = 0};
  uint64_t v = 0;
  int rc = 0;
  switch (op) {
  case OP_HIT:
    rc = tg_hit_at(lim, now, key, len, q, arg, null_out ? NULL : &r);
    break;
  case OP_GET:
    rc = tg_get_at(lim, now, key, len, q, null_out ? NULL : &v);
    break;
  case OP_SET:
    rc = tg_set_at(lim, now, key, len, q, arg);
    break;
  case OP_INC:
    rc = tg_inc_at(lim, now, key, len, q, arg, &v);
    break;
  case OP_EXPIRES:
    rc = tg_expires_at_at(lim, now, key, len, q, null_out ? NULL : &v);
    break;
  default:
    rc = tg_reset(lim, key, len);
    break;
  }
  bool ok = rc == expect && tg_key_count(c->lim) == before;
  if (ok && op == OP_HIT && !null_out)
    ok = !r.allowed && r.retry_after_ms == TG_NEVER;
  if (!ok) {
    fprintf(
        stderr,
        "\n=== test_property INVALID INPUT: algorithm %s, seed 0x%016" PRIx64
        ", step %" PRIu64
        " ===\n%s with fault #%u: rc=%d (%s), expected %d (%s);"
        " key count %zu -> %zu; result allowed=%d retry=%" PRIu64 "\n",
        tg_algorithm_name(c->alg), c->seed, c->step, op_names[op], f, rc,
        tg_err_name(rc), expect, tg_err_name(expect), before,
        tg_key_count(c->lim), op == OP_HIT ? r.allowed : 0,
        op == OP_HIT ? r.retry_after_ms : 0);
    fail_now();
  }
  /* The state is untouched: the key still answers as the model says. */
  if (!c->capped)
    valid_call(c, k, OP_GET, 0);
}

/* ---- runs ---- */

static const uint64_t periods_ms[] = {1,   2,   3,    7,    10,    33,
                                      100, 250, 1000, 1500, 60000, 3600000};
static const uint64_t limits[] = {1, 2, 3, 5, 7, 10, 16, 55, 100, 333, 1000};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Extreme but clearly valid quotas: 64-bit limits, the longest period, a
 * 1 ns emission interval, bursts of 10^9 and more. Bucket capacities stay
 * at or below 10^18 ns (about 31.7 years). */
static tg_quota gen_extreme_quota(run_ctx *c) {
  uint64_t *s = &c->rng;
  uint64_t r = rng_below(s, 4), p1 = periods_ms[rng_below(s, 6)];
  tg_quota q = {1, TG_PERIOD_MAX_MS, 0};
  if (c->alg == TG_SLIDING_WINDOW) { /* every call admitted: keep logs short */
    if (r < 2)
      q = (tg_quota){r ? UINT64_MAX : UINT64_C(1) << 40, p1, 0};
    else
      q.limit = limits[rng_below(s, 6)];
  } else if (!is_bucket(c->alg)) {
    q.limit = r == 0   ? UINT64_MAX
              : r == 1 ? (UINT64_C(1) << 63) + rng_below(s, 1000)
                       : limits[rng_below(s, NELEM(limits))];
    if (rng_below(s, 2))
      q.period_ms = periods_ms[rng_below(s, NELEM(periods_ms))];
  } else if (r == 0) { /* T = 1 ns */
    q.period_ms = p1;
    q.limit = p1 * UINT64_C(1000000);
    q.burst = rng_below(s, 2) ? 0 : rng_range(s, 1, UINT64_C(1000000000));
  } else if (r == 1) { /* the longest period, capacity <= 1e18 ns */
    q.limit = limits[rng_below(s, NELEM(limits))];
    q.burst = rng_below(s, q.limit + 1);
  } else { /* T = 1 ms, capacity up to 1e18 ns */
    q = (tg_quota){1000, 1000, rng_range(s, 1, UINT64_C(1000000000000))};
  }
  return q;
}

static tg_quota gen_quota(run_ctx *c) {
  uint64_t *s = &c->rng;
  tg_quota q;
  if (rng_below(s, 10) == 0)
    return gen_extreme_quota(c);
  q.period_ms = periods_ms[rng_below(s, NELEM(periods_ms))];
  size_t nl = NELEM(limits);
  if (c->alg == TG_SLIDING_WINDOW && rng_below(s, 4) != 0)
    nl -= 2; /* mostly small logs: the reference sums them on every call */
  q.limit = limits[rng_below(s, nl)];
  uint64_t r = rng_below(s, 10);
  if (!is_bucket(c->alg))
    q.burst = rng_below(s, 3) ? rng_below(s, 5000) : 0; /* ignored */
  else if (r < 3)
    q.burst = 0;
  else if (r < 5)
    q.burst = q.limit;
  else
    q.burst = rng_range(s, 1, 3 * q.limit + 2);
  return q;
}

static uint64_t gen_start(uint64_t *s) {
  uint64_t r = rng_below(s, 10);
  if (r < 4)
    return rng_range(s, UINT64_C(1600000000000000), UINT64_C(1800000000000000));
  if (r < 6)
    return rng_below(s, 10000000);
  if (r < 8)
    return rng_range(s, 1, 400000) * UINT64_C(3600000000);
  if (r < 9)
    return TG_NOW_MAX_US - rng_below(s, UINT64_C(1000000000000));
  return rng_below(s, UINT64_C(8000000000000000));
}

static void new_run(run_ctx *c, uint32_t max_entries) {
  uint64_t *s = &c->rng;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = c->alg;
  cfg.sliding_max_entries = max_entries;
  /* a run uses at most MAX_KEYS keys; the memory store reserves a log block
   * of sliding_max_entries entries per key of capacity, so keep it small */
  cfg.capacity = 2 * MAX_KEYS;
  assert_int_equal(tg_limiter_new(&c->lim, &cfg), 0);
  c->nq = (int)rng_range(s, 1, MAX_QUOTAS);
  for (int i = 0; i < c->nq; i++)
    c->q[i] = gen_quota(c);
  c->nkeys = (int)rng_range(s, 1, MAX_KEYS);
  size_t order[KEY_POOL_N];
  for (size_t i = 0; i < KEY_POOL_N; i++)
    order[i] = i;
  for (size_t i = KEY_POOL_N - 1; i > 0; i--) {
    size_t j = (size_t)rng_below(s, i + 1), tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  for (int i = 0; i < c->nkeys; i++) {
    ref_key *k = &c->keys[i];
    event *ev = k->ev;
    size_t evcap = k->evcap;
    memset(k, 0, sizeof *k);
    k->ev = ev;
    k->evcap = evcap;
    k->k = key_pool[order[i]].p;
    k->len = key_pool[order[i]].len;
    k->qi = i % c->nq;
  }
  c->clock_us = c->clock_max_us = gen_start(s);
}

static void free_keys(run_ctx *c) {
  for (int i = 0; i < MAX_KEYS; i++) {
    free(c->keys[i].ev);
    c->keys[i].ev = NULL;
    c->keys[i].evcap = 0;
  }
}

static void random_call(run_ctx *c) {
  uint64_t *s = &c->rng;
  advance_clock(c);
  ref_key *k = &c->keys[rng_below(s, (uint64_t)c->nkeys)];
  if (rng_below(s, 1000) < c->invalid_permille) {
    invalid_call(c, k);
    return;
  }
  const tg_quota *q = &c->q[k->qi];
  uint64_t cap = is_bucket(c->alg) ? bk_B(q) : q->limit;
  uint64_t r = rng_below(s, 1000), arg = 0;
  int op;
  if (r < 600) {
    op = OP_HIT;
    arg = gen_cost(s, cap, true);
  } else if (r < 720)
    op = OP_GET;
  else if (r < 800)
    op = OP_EXPIRES;
  else if (r < 870) {
    op = OP_SET;
    uint64_t rr = rng_below(s, 100);
    arg = rr < 80   ? rng_below(s, cap + 1)
          : rr < 99 ? above(s, cap)
                    : UINT64_MAX - rng_below(s, 1000);
  } else if (r < 980) {
    op = OP_INC;
    arg = gen_cost(s, cap, true);
  } else
    op = OP_RESET;
  valid_call(c, k, op, arg);
}

static void run_exact(tg_algorithm alg, uint64_t steps,
                      unsigned invalid_permille) {
  run_ctx c;
  memset(&c, 0, sizeof c);
  c.alg = alg;
  c.seed = base_seed() ^ (UINT64_C(0x9E3779B97F4A7C15) * ((uint64_t)alg + 1)) ^
           (invalid_permille > 100 ? UINT64_C(0x1abe11ed) : 0);
  c.rng = c.seed;
  c.invalid_permille = invalid_permille;
  double t0 = seconds_now();
  printf("[property] %-22s seed 0x%016" PRIx64
         " (TG_PROPERTY_SEED=0x%016" PRIx64 ") steps %" PRIu64 "%s\n",
         tg_algorithm_name(alg), c.seed, base_seed(), steps,
         invalid_permille > 100 ? " (invalid-input mix)" : "");
  fflush(stdout);
  uint64_t runs = 0;
  while (c.step < steps) {
    new_run(&c, UINT32_C(1) << 24);
    runs++;
    uint64_t n = rng_range(&c.rng, 500, 40000);
    for (uint64_t i = 0; i < n && c.step < steps; i++, c.step++)
      random_call(&c);
    tg_limiter_destroy(c.lim);
    c.lim = NULL;
  }
  free_keys(&c);
  printf("[property] %-22s ok: %" PRIu64 " steps in %" PRIu64
         " limiters, %.2f s\n"
         "           hits allowed %" PRIu64 ", denied %" PRIu64
         ", never %" PRIu64 "; get %" PRIu64 " set %" PRIu64 " inc %" PRIu64
         " expires_at %" PRIu64 " reset %" PRIu64 "; error answers %" PRIu64
         "; earlier-now calls %" PRIu64 " (moved to the key's time: %" PRIu64
         ")\n",
         tg_algorithm_name(alg), c.step, runs, seconds_now() - t0, c.n_allowed,
         c.n_denied, c.n_never, c.n_op[OP_GET], c.n_op[OP_SET], c.n_op[OP_INC],
         c.n_op[OP_EXPIRES], c.n_op[OP_RESET], c.n_err, c.n_back, c.n_clamped);
  fflush(stdout);
}

static void property_fixed_window(void **state) {
  (void)state;
  run_exact(TG_FIXED_WINDOW, steps_per_algorithm(), 5);
}

static void property_fixed_window_per_key(void **state) {
  (void)state;
  run_exact(TG_FIXED_WINDOW_PER_KEY, steps_per_algorithm(), 5);
}

static void property_sliding_window(void **state) {
  (void)state;
  run_exact(TG_SLIDING_WINDOW, steps_per_algorithm(), 5);
}

static void property_token_bucket(void **state) {
  (void)state;
  run_exact(TG_TOKEN_BUCKET, steps_per_algorithm(), 5);
}

static void property_leaky_bucket(void **state) {
  (void)state;
  run_exact(TG_LEAKY_BUCKET, steps_per_algorithm(), 5);
}

/* Invalid input in bulk: 30% of the calls carry exactly one bad argument;
 * each must return its error code and leave every answer unchanged. */
static void property_invalid_input_changes_nothing(void **state) {
  (void)state;
  uint64_t steps = steps_per_algorithm() / 20;
  if (steps < 1000)
    steps = 1000;
  for (int alg = 0; alg < TG_ALGORITHM_COUNT; alg++)
    run_exact((tg_algorithm)alg, steps, 300);
}

/* ---- sliding log with a small cap: safety only ---- */

/* With sliding_max_entries small the answers are allowed to be conservative,
 * so there is no exact model: check only that no interval of length period
 * ever admits more than limit, from the log of every admitted call. Each key
 * sees its own time move forward only. */
static void property_sliding_capped_never_over_limit(void **state) {
  (void)state;
  run_ctx c;
  memset(&c, 0, sizeof c);
  c.alg = TG_SLIDING_WINDOW;
  c.capped = true;
  c.seed = base_seed() ^ UINT64_C(0xca99ed5afe7ee000);
  c.rng = c.seed;
  c.invalid_permille = 0;
  uint64_t steps = steps_per_algorithm();
  double t0 = seconds_now();
  printf("[property] sliding (capped)         seed 0x%016" PRIx64
         " steps %" PRIu64 "\n",
         c.seed, steps);
  fflush(stdout);
  while (c.step < steps) {
    uint32_t cap = (uint32_t)rng_range(&c.rng, 1, 8);
    new_run(&c, cap);
    for (int i = 0; i < c.nq; i++) { /* logs much longer than the cap */
      c.q[i].limit = rng_range(&c.rng, 2, 60);
      c.q[i].period_ms = periods_ms[rng_below(&c.rng, 7)];
    }
    uint64_t n = rng_range(&c.rng, 500, 40000);
    for (uint64_t i = 0; i < n && c.step < steps; i++, c.step++) {
      advance_clock(&c);
      ref_key *k = &c.keys[rng_below(&c.rng, (uint64_t)c.nkeys)];
      const tg_quota *q = &c.q[k->qi];
      uint64_t now = c.clock_us > k->max_us ? c.clock_us : k->max_us;
      k->max_us = now;
      uint64_t r = rng_below(&c.rng, 100), v = 0;
      tg_result res;
      if (r < 2) {
        assert_int_equal(tg_reset(c.lim, k->k, k->len), 0);
        k->nev = 0;
        continue;
      }
      if (r < 10) {
        assert_int_equal(tg_get_at(c.lim, now, k->k, k->len, q, &v), 0);
        assert_true(v <= q->limit);
        continue;
      }
      uint64_t cost =
          rng_below(&c.rng, 4) ? 1 : gen_cost(&c.rng, q->limit, false);
      assert_int_equal(tg_hit_at(c.lim, now, k->k, k->len, q, cost, &res), 0);
      hrec h = {c.step, c.clock_us, now, cost, OP_HIT, {0}, {0, res, 0}, false};
      h.exp.r.allowed = res.allowed;
      record(k, &h);
      bool bad = res.count > q->limit ||
                 (res.allowed && res.retry_after_ms != 0) ||
                 (!res.allowed && res.retry_after_ms == 0);
      if (res.allowed && cost) {
        push_event(k, now, cost, EV_ADD);
        uint64_t sum = 0; /* every admitted cost in (now - period, now] */
        size_t j = 0;
        for (size_t e = 0; e < k->nev; e++) {
          if (k->ev[e].t_us + period_us(q) > now) {
            sum += k->ev[e].v;
            k->ev[j++] = k->ev[e];
          }
        }
        k->nev = j;
        bad = bad || sum > q->limit;
      }
      if (bad) {
        report_mismatch(&c, k, &h);
        fprintf(stderr, "(capped log, sliding_max_entries small: an interval of"
                        " length period admitted more than limit, or the result"
                        " is inconsistent; 'expected' shows allowed only)\n");
        fail_now();
      }
    }
    tg_limiter_destroy(c.lim);
    c.lim = NULL;
  }
  free_keys(&c);
  printf("[property] sliding (capped)         ok: %" PRIu64 " steps, %.2f s\n",
         c.step, seconds_now() - t0);
}

int main(void) {
  init_keys();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(property_fixed_window),
      cmocka_unit_test(property_fixed_window_per_key),
      cmocka_unit_test(property_sliding_window),
      cmocka_unit_test(property_token_bucket),
      cmocka_unit_test(property_leaky_bucket),
      cmocka_unit_test(property_sliding_capped_never_over_limit),
      cmocka_unit_test(property_invalid_input_changes_nothing),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, NULL));
}
