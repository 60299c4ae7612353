/* SPDX-License-Identifier: MIT */
/*
 * custom.c - the caller's store: the caller locks and keeps
 * bytes, tollgate runs the same pure steps as every other store on them.
 *
 * Serialised form (documented in tollgate.h, version 1, little-endian):
 *   [version=1][algorithm][0][0][u32 n] then windows/buckets: 2 x u64,
 *   sliding: n x (u64 t_us, u64 cost).
 */
#include "store.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FORMAT_VERSION 1u
#define HEAD_BYTES 8u
/* A policy whose keys' locks answer BUSY takes them all again this many
 * times, 50 us apart and doubling up to 800 us, before TG_EBUSY. */
#define BUSY_RETRIES 6u

typedef struct custom {
  tg__store base;
  tg_custom_store cs;   /* the caller's callbacks, copied */
  tg_algorithm alg;     /* the limiter's algorithm (reset writes its form) */
  uint32_t log_entries; /* sliding_max_entries */
} custom;

static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void put_head(unsigned char *p, tg_algorithm alg, uint32_t n) {
  p[0] = FORMAT_VERSION;
  p[1] = (unsigned char)alg;
  p[2] = p[3] = 0;
  for (int i = 0; i < 4; i++)
    p[4 + i] = (unsigned char)(n >> (8 * i));
}

/* Parses the head; returns the entry count or -1 if it is not ours. */
static long parse_head(const unsigned char *p, size_t len, tg_algorithm alg) {
  if (len < HEAD_BYTES || p[0] != FORMAT_VERSION || p[1] != (unsigned)alg ||
      p[2] != 0 || p[3] != 0)
    return -1;
  uint32_t n = 0;
  for (int i = 3; i >= 0; i--)
    n = n << 8 | p[4 + i];
  return (long)n;
}

static int exec_state(custom *s, const tg__call *c, tg__outcome *o) {
  unsigned char buf[HEAD_BYTES + 16];
  size_t len = 0;
  int got =
      s->cs.lock_and_get(s->cs.ctx, c->key, c->key_len, buf, sizeof buf, &len);
  if (got == TG_CUSTOM_BUSY)
    return TG_EBUSY;
  if (got != TG_CUSTOM_OK && got != TG_CUSTOM_NOT_FOUND)
    return TG_ESTORE;
  tg__state st = {0, 0};
  if (got == TG_CUSTOM_OK) {
    if (len != sizeof buf || parse_head(buf, len, c->alg) != 0) {
      s->cs.unlock(s->cs.ctx, c->key, c->key_len);
      return TG_ECORRUPT;
    }
    st = tg__state_of_words(get64(buf + HEAD_BYTES),
                            get64(buf + HEAD_BYTES + 8));
    if (!tg__state_plausible(c->alg, &st)) {
      s->cs.unlock(s->cs.ctx, c->key, c->key_len);
      return TG_ECORRUPT;
    }
  }
  bool changed;
  tg__state before = st;
  int rc = tg__state_step(c, &st, o, &changed);
  /* a fresh state where the key was absent is not written, as no store
   * creates a key for a state equivalent to none (a later call with an
   * earlier now would count it where the others see nothing) */
  changed = tg__state_store_needed(c->alg, got == TG_CUSTOM_NOT_FOUND, changed,
                                   &st, c->now_us);
  if (c->tok && (c->op == TG__OP_TAKE || c->op == TG__OP_RESERVE)) {
    /* the receipt tg_cancel (or a policy's undo) gives back from */
    c->tok->taken = rc == TG_OK && changed;
    c->tok->before = before;
    c->tok->after = st;
    c->tok->now_us = c->now_us;
  }
  if (rc != TG_OK || !changed) {
    s->cs.unlock(s->cs.ctx, c->key, c->key_len);
    return rc;
  }
  put_head(buf, c->alg, 0);
  put64(buf + HEAD_BYTES, tg__state_word(&st, 0));
  put64(buf + HEAD_BYTES + 8, tg__state_word(&st, 1));
  if (s->cs.set_and_unlock(s->cs.ctx, c->key, c->key_len, buf, sizeof buf,
                           tg__state_ttl_ms(c->alg, &st, c->now_us)) !=
      TG_CUSTOM_OK)
    return TG_ESTORE;
  return TG_OK;
}

static int exec_log(custom *s, const tg__call *c, tg__outcome *o) {
  size_t cap = HEAD_BYTES + (size_t)s->log_entries * 16;
  unsigned char *buf = malloc(cap);
  tg__entry *e = malloc((size_t)s->log_entries * sizeof *e);
  int rc = TG_ENOMEM;
  if (!buf || !e)
    goto out;
  size_t len = 0;
  int got = s->cs.lock_and_get(s->cs.ctx, c->key, c->key_len, buf, cap, &len);
  rc = got == TG_CUSTOM_BUSY ? TG_EBUSY : TG_ESTORE;
  if (got != TG_CUSTOM_OK && got != TG_CUSTOM_NOT_FOUND)
    goto out;
  tg__log lg = {e, 0, 0, s->log_entries, 0};
  if (got == TG_CUSTOM_OK) {
    long n = parse_head(buf, len, c->alg);
    bool ok = n >= 0 && (uint64_t)n <= s->log_entries &&
              len == HEAD_BYTES + (size_t)n * 16;
    for (long i = 0; ok && i < n; i++) {
      e[i].t_us = get64(buf + HEAD_BYTES + 16 * (size_t)i);
      e[i].cost = get64(buf + HEAD_BYTES + 16 * (size_t)i + 8);
    }
    lg.n = ok ? (uint32_t)n : 0;
    for (uint32_t i = 0; i < lg.n; i++)
      if (!tg__add(lg.sum, e[i].cost, &lg.sum))
        ok = false;
    if (!ok || !tg__log_plausible(&lg)) { /* the steps rely on sorted times */
      s->cs.unlock(s->cs.ctx, c->key, c->key_len);
      rc = TG_ECORRUPT;
      goto out;
    }
  }
  bool changed;
  rc = tg__log_step(c, &lg, o, &changed);
  if (rc != TG_OK || !changed) {
    s->cs.unlock(s->cs.ctx, c->key, c->key_len);
    goto out;
  }
  put_head(buf, c->alg, lg.n);
  for (uint32_t i = 0; i < lg.n; i++) {
    const tg__entry *en = tg__log_at(&lg, i);
    put64(buf + HEAD_BYTES + 16 * (size_t)i, en->t_us);
    put64(buf + HEAD_BYTES + 16 * (size_t)i + 8, en->cost);
  }
  uint64_t ttl = tg__log_ttl_ms(&lg, c->q.period_us, c->now_us);
  if (s->cs.set_and_unlock(s->cs.ctx, c->key, c->key_len, buf,
                           HEAD_BYTES + (size_t)lg.n * 16, ttl) != TG_CUSTOM_OK)
    rc = TG_ESTORE;
out:
  free(buf);
  free(e);
  return rc;
}

static int custom_exec(tg__store *base, const tg__call *c, tg__outcome *o) {
  custom *s = (custom *)base;
  return c->alg == TG_SLIDING_WINDOW ? exec_log(s, c, o) : exec_state(s, c, o);
}

/* Reset stores a fresh state (an empty log, or the all-zero pair) with TTL 0
 * under the key's lock, replacing whatever the store holds at that moment. */
static int custom_reset(tg__store *base, const void *key, size_t key_len) {
  custom *s = (custom *)base;
  unsigned char fixed[HEAD_BYTES + 16];
  size_t cap = s->alg == TG_SLIDING_WINDOW
                   ? HEAD_BYTES + (size_t)s->log_entries * 16
                   : sizeof fixed,
         len = 0;
  unsigned char *buf = s->alg == TG_SLIDING_WINDOW ? malloc(cap) : fixed;
  if (!buf)
    return TG_ENOMEM;
  int rc = TG_OK;
  int got = s->cs.lock_and_get(s->cs.ctx, key, key_len, buf, cap, &len);
  if (got == TG_CUSTOM_NOT_FOUND) {
    s->cs.unlock(s->cs.ctx, key, key_len);
  } else if (got == TG_CUSTOM_OK) {
    size_t n = s->alg == TG_SLIDING_WINDOW ? HEAD_BYTES : HEAD_BYTES + 16;
    memset(buf, 0, n);
    put_head(buf, s->alg, 0);
    if (s->cs.set_and_unlock(s->cs.ctx, key, key_len, buf, n, 0) !=
        TG_CUSTOM_OK)
      rc = TG_ESTORE;
  } else {
    rc = got == TG_CUSTOM_BUSY ? TG_EBUSY : TG_ESTORE;
  }
  if (buf != fixed)
    free(buf);
  return rc;
}

/* ---- policies: every key locked, in one order ---- */

/* One rule's key while a policy holds it. */
typedef struct held {
  custom *s;
  const tg__call *c;
  bool locked;
  bool absent;        /* the store held no state for the key */
  tg__state st;       /* windows, buckets */
  tg__log lg;         /* sliding: over e */
  tg__entry *e;       /* sliding: log_entries entries */
  unsigned char *buf; /* the serialised state */
  size_t cap;
} held;

/* Locks the key and parses its state. On failure nothing stays locked. */
static int hold(held *h) {
  custom *s = h->s;
  const tg__call *c = h->c;
  bool log = c->alg == TG_SLIDING_WINDOW;
  h->cap = HEAD_BYTES + (log ? (size_t)s->log_entries * 16 : 16);
  if (!h->buf) /* kept across attempts (see custom_exec_rules) */
    h->buf = malloc(h->cap);
  if (log && !h->e)
    h->e = malloc((size_t)s->log_entries * sizeof *h->e);
  if (!h->buf || (log && !h->e))
    return TG_ENOMEM;
  size_t len = 0;
  int got =
      s->cs.lock_and_get(s->cs.ctx, c->key, c->key_len, h->buf, h->cap, &len);
  if (got == TG_CUSTOM_BUSY)
    return TG_EBUSY;
  if (got != TG_CUSTOM_OK && got != TG_CUSTOM_NOT_FOUND)
    return TG_ESTORE;
  h->locked = true;
  h->absent = got == TG_CUSTOM_NOT_FOUND;
  h->st = (tg__state){0, 0};
  h->lg = (tg__log){h->e, 0, 0, s->log_entries, 0};
  if (got == TG_CUSTOM_NOT_FOUND)
    return TG_OK;
  long n = parse_head(h->buf, len, c->alg);
  bool ok;
  if (!log) {
    ok = n == 0 && len == HEAD_BYTES + 16;
    if (ok) {
      h->st = tg__state_of_words(get64(h->buf + HEAD_BYTES),
                                 get64(h->buf + HEAD_BYTES + 8));
      ok = tg__state_plausible(c->alg, &h->st);
    }
  } else {
    ok = n >= 0 && (uint64_t)n <= s->log_entries &&
         len == HEAD_BYTES + (size_t)n * 16;
    for (long i = 0; ok && i < n; i++) {
      h->e[i].t_us = get64(h->buf + HEAD_BYTES + 16 * (size_t)i);
      h->e[i].cost = get64(h->buf + HEAD_BYTES + 16 * (size_t)i + 8);
      ok = tg__add(h->lg.sum, h->e[i].cost, &h->lg.sum);
    }
    h->lg.n = ok ? (uint32_t)n : 0;
    ok = ok && tg__log_plausible(&h->lg);
  }
  if (!ok) {
    s->cs.unlock(s->cs.ctx, c->key, c->key_len);
    h->locked = false;
    return TG_ECORRUPT;
  }
  return TG_OK;
}

/* Consumes the rule's cost (a TAKE) and stores the state, or just unlocks. */
static int release(held *h, bool take) {
  custom *s = h->s;
  const tg__call *c = h->c;
  if (!h->locked)
    return TG_OK;
  h->locked = false;
  bool changed = false;
  tg__call t = *c;
  t.op = TG__OP_TAKE;
  tg__outcome o;
  uint64_t ttl = 0;
  size_t len = 0;
  if (take && c->alg == TG_SLIDING_WINDOW) {
    if (tg__log_step(&t, &h->lg, &o, &changed) == TG_OK && changed) {
      put_head(h->buf, c->alg, h->lg.n);
      for (uint32_t i = 0; i < h->lg.n; i++) {
        const tg__entry *en = tg__log_at(&h->lg, i);
        put64(h->buf + HEAD_BYTES + 16 * (size_t)i, en->t_us);
        put64(h->buf + HEAD_BYTES + 16 * (size_t)i + 8, en->cost);
      }
      len = HEAD_BYTES + (size_t)h->lg.n * 16;
      ttl = tg__log_ttl_ms(&h->lg, c->q.period_us, c->now_us);
    }
  } else if (take) {
    tg__state before = h->st;
    int rc = tg__state_step(&t, &h->st, &o, &changed);
    changed = tg__state_store_needed(c->alg, h->absent, changed, &h->st,
                                     c->now_us); /* as exec_state */
    if (c->tok) {
      /* the receipt tg_cancel_rules gives back from (tg_reserve_rules) */
      c->tok->taken = rc == TG_OK && changed;
      c->tok->before = before;
      c->tok->after = h->st;
      c->tok->now_us = c->now_us;
    }
    if (rc == TG_OK && changed) {
      put_head(h->buf, c->alg, 0);
      put64(h->buf + HEAD_BYTES, tg__state_word(&h->st, 0));
      put64(h->buf + HEAD_BYTES + 8, tg__state_word(&h->st, 1));
      len = HEAD_BYTES + 16;
      ttl = tg__state_ttl_ms(c->alg, &h->st, c->now_us);
    }
  }
  if (!changed) {
    s->cs.unlock(s->cs.ctx, c->key, c->key_len);
    return TG_OK;
  }
  return s->cs.set_and_unlock(s->cs.ctx, c->key, c->key_len, h->buf, len,
                              ttl) == TG_CUSTOM_OK
             ? TG_OK
             : TG_ESTORE;
}

/* Key order: bytes, then length (a prefix first). */
static int key_cmp(const tg__call *a, const tg__call *b) {
  size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
  int d = memcmp(a->key, b->key, n);
  if (d != 0)
    return d;
  return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

/* The whole policy under the keys' locks, taken in key order so that two
 * policies sharing keys cannot deadlock; decided on what the locks hold,
 * then every key stored or unlocked: nothing is written unless the call
 * passes, and nothing has to be given back. */
static int custom_exec_rules(tg__store *const *stores, const tg__call *calls,
                             size_t n, const bool *shadow, tg__outcome *o,
                             bool *passed, size_t *failed) {
  held h[TG_RULES_MAX];
  size_t order[TG_RULES_MAX];
  *passed = false;
  for (size_t i = 0; i < n; i++) {
    h[i] = (held){(custom *)stores[i], &calls[i], false, false, {0, 0},
                  {NULL, 0, 0, 0, 0},  NULL,      NULL,  0};
    size_t j = i;
    for (; j > 0 && key_cmp(&calls[order[j - 1]], &calls[i]) > 0; j--)
      order[j] = order[j - 1];
    order[j] = i;
  }
  /* Key order prevents deadlock only between stores that lock each key
   * on its own; a store whose keys share locks (stripes) can still meet
   * another policy holding them the other way round. Such a store answers
   * BUSY after its wait: then everything is let go and the locks are
   * taken again, a few times, before the policy answers TG_EBUSY. */
  int rc = TG_OK;
  for (unsigned attempt = 0;; attempt++) {
    size_t k = 0;
    rc = TG_OK;
    for (; k < n && rc == TG_OK; k++)
      rc = hold(&h[order[k]]);
    if (rc == TG_OK)
      break;
    *failed = order[k - 1];
    for (size_t j = k - 1; j-- > 0;)
      release(&h[order[j]], false);
    if (rc != TG_EBUSY || attempt == BUSY_RETRIES)
      break;
    struct timespec ts = {0, (long)(50000u << (attempt < 4 ? attempt : 4))};
    nanosleep(&ts, NULL);
  }
  if (rc == TG_OK) {
    bool pass = true;
    for (size_t i = 0; i < n && rc == TG_OK; i++) {
      tg__call chk = calls[i];
      chk.op = TG__OP_CHECK;
      if (chk.alg == TG_SLIDING_WINDOW) {
        tg__log_view v;
        rc = tg__log_check(&chk, &h[i].lg, &v);
        if (rc == TG_OK)
          rc = tg__log_report(&chk, &v, &o[i]);
      } else {
        tg__state copy = h[i].st;
        bool changed;
        rc = tg__state_step(&chk, &copy, &o[i], &changed);
      }
      if (rc != TG_OK)
        *failed = i;
      else if (!o[i].r.allowed && !shadow[i])
        pass = false;
    }
    *passed = pass && rc == TG_OK;
  }
  /* store or unlock, in reverse key order */
  for (size_t j = n; j-- > 0;) {
    size_t i = order[j];
    int rr = release(&h[i], *passed && o[i].r.allowed);
    if (rr != TG_OK && rc == TG_OK) {
      rc = rr;
      *failed = i;
    }
  }
  for (size_t i = 0; i < n; i++) {
    free(h[i].buf);
    free(h[i].e);
  }
  return rc;
}

/* Rules on one custom store (the same callbacks and ctx) decide together;
 * its keys are one space whatever the algorithm (the callbacks see only
 * key bytes). */
static void custom_ident(const tg__store *base, uint64_t group[2],
                         uint64_t space[2]) {
  const custom *s = (const custom *)base;
  group[0] = (uint64_t)(uintptr_t)s->cs.ctx;
  group[1] = (uint64_t)(uintptr_t)s->cs.lock_and_get ^
             (uint64_t)(uintptr_t)s->cs.set_and_unlock * 31u ^
             (uint64_t)(uintptr_t)s->cs.unlock * 961u;
  space[0] = group[0];
  space[1] = group[1];
}

static size_t custom_zero(const tg__store *s) {
  (void)s;
  return 0;
}

static void custom_destroy(tg__store *s) { free(s); }

static const tg__store_ops custom_ops = {
    .caps = TG__STORE_RULES_WAIT, /* the core's steps, under the locks */
    .exec = custom_exec,
    .reset = custom_reset,
    .key_count = custom_zero, /* the caller's store keeps its own count */
    .bytes = custom_zero,     /* ... and its own memory */
    .destroy = custom_destroy,
    .ident = custom_ident,
    .exec_rules = custom_exec_rules,
};

int tg__custom_store_new(tg__store **out, const tg_custom_store *cs,
                         tg_algorithm alg, uint32_t log_entries) {
  if (!cs->lock_and_get || !cs->set_and_unlock || !cs->unlock)
    return TG_EINVAL;
  custom *s = calloc(1, sizeof *s);
  if (!s)
    return TG_ENOMEM;
  s->base.ops = &custom_ops;
  s->cs = *cs;
  s->alg = alg;
  s->log_entries = log_entries;
  *out = &s->base;
  return TG_OK;
}
