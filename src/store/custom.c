/*
 * custom.c - the caller's store (glimit's Store): the caller locks and keeps
 * bytes, tollgate runs the same pure steps as every other store on them.
 *
 * Serialised form (documented in tollgate.h, version 1, little-endian):
 *   [version=1][algorithm][0][0][u32 n] then windows/buckets: 2 x u64,
 *   sliding: n x (u64 t_us, u64 cost).
 */
#include "store.h"

#include <stdlib.h>
#include <string.h>

#define FORMAT_VERSION 1u
#define HEAD_BYTES 8u

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
    st.a = get64(buf + HEAD_BYTES);
    st.b = get64(buf + HEAD_BYTES + 8);
    if (!tg__state_plausible(c->alg, &st)) {
      s->cs.unlock(s->cs.ctx, c->key, c->key_len);
      return TG_ECORRUPT;
    }
  }
  bool changed;
  int rc = tg__state_step(c, &st, o, &changed);
  if (rc != TG_OK || !changed) {
    s->cs.unlock(s->cs.ctx, c->key, c->key_len);
    return rc;
  }
  put_head(buf, c->alg, 0);
  put64(buf + HEAD_BYTES, st.a);
  put64(buf + HEAD_BYTES + 8, st.b);
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

static size_t custom_zero(const tg__store *s) {
  (void)s;
  return 0;
}

static void custom_destroy(tg__store *s) { free(s); }

static const tg__store_ops custom_ops = {
    custom_exec, custom_reset,   custom_zero, NULL,
    custom_zero, custom_destroy, NULL};

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
