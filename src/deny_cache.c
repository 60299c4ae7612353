/* SPDX-License-Identifier: MIT */
/*
 * deny_cache.c - the local deny cache (see deny_cache.h for why a denial
 * may be reused, and for how long).
 */
#include "deny_cache.h"

#include "siphash.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define WAYS 4
#define LOCKS_MAX 256u

typedef struct entry {
  uint64_t hash;                    /* 0: empty */
  uint64_t until_us;                /* denies calls before this moment */
  uint64_t at_us;                   /* when the denial was made */
  uint64_t min_cost;                /* denies calls of at least this cost */
  uint64_t limit, period_us, burst; /* the quota of the denial */
  tg_result r;                      /* the denial */
  bool mono;                        /* timeline, see deny_cache.h */
  uint16_t key_len;
  unsigned char key[TG_KEY_MAX];
} entry;

typedef struct lock {
  pthread_mutex_t mu;
} lock;

struct tg__deny_cache {
  uint64_t sip[2];
  size_t nsets; /* a power of two */
  size_t nlocks;
  lock *locks; /* set i is guarded by locks[i % nlocks] */
  entry *e;    /* nsets * WAYS */
};

int tg__deny_cache_new(tg__deny_cache **out, uint64_t entries) {
  *out = NULL;
  size_t nsets = 1;
  while ((uint64_t)nsets * WAYS < entries)
    nsets <<= 1;
  tg__deny_cache *dc = calloc(1, sizeof *dc);
  if (!dc)
    return TG_ENOMEM;
  dc->nsets = nsets;
  dc->nlocks = nsets < LOCKS_MAX ? nsets : LOCKS_MAX;
  dc->e = calloc(nsets * WAYS, sizeof *dc->e);
  dc->locks = calloc(dc->nlocks, sizeof *dc->locks);
  size_t made = 0;
  int rc = dc->e && dc->locks && tg__siphash_random_key(dc->sip) == 0
               ? TG_OK
               : TG_ENOMEM;
  for (; rc == TG_OK && made < dc->nlocks; made++)
    if (pthread_mutex_init(&dc->locks[made].mu, NULL) != 0)
      rc = TG_ENOMEM;
  if (rc != TG_OK) {
    dc->nlocks = made;
    tg__deny_cache_free(dc);
    return rc;
  }
  *out = dc;
  return TG_OK;
}

void tg__deny_cache_free(tg__deny_cache *dc) {
  if (!dc)
    return;
  for (size_t i = 0; dc->locks && i < dc->nlocks; i++)
    pthread_mutex_destroy(&dc->locks[i].mu);
  free(dc->locks);
  free(dc->e);
  free(dc);
}

size_t tg__deny_cache_bytes(const tg__deny_cache *dc) {
  return sizeof *dc + dc->nsets * WAYS * sizeof *dc->e +
         dc->nlocks * sizeof *dc->locks;
}

static uint64_t hash_of(const tg__deny_cache *dc, const void *key, size_t n) {
  return tg__siphash(dc->sip, key, n) | 1; /* never 0: 0 marks empty */
}

static size_t set_of(const tg__deny_cache *dc, uint64_t h) {
  return (size_t)(h >> 16) & (dc->nsets - 1);
}

size_t tg__deny_cache_set(const tg__deny_cache *dc, const void *key,
                          size_t key_len) {
  return set_of(dc, hash_of(dc, key, key_len));
}

/* The set of hash h, locked. */
static entry *lock_set(tg__deny_cache *dc, uint64_t h, pthread_mutex_t **mu) {
  size_t set = set_of(dc, h);
  *mu = &dc->locks[set % dc->nlocks].mu;
  pthread_mutex_lock(*mu);
  return &dc->e[set * WAYS];
}

static bool same_key(const entry *x, uint64_t h, const void *key, size_t n) {
  return x->hash == h && x->key_len == n && memcmp(x->key, key, n) == 0;
}

static bool is_window(tg_algorithm alg) {
  return alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
}

bool tg__deny_cache_get(tg__deny_cache *dc, const tg__call *c, bool mono,
                        uint64_t now_us, tg_result *out) {
  if (c->op != TG__OP_HIT)
    return false;
  uint64_t h = hash_of(dc, c->key, c->key_len);
  pthread_mutex_t *mu;
  entry *set = lock_set(dc, h, &mu);
  bool hit = false;
  for (int w = 0; w < WAYS; w++) {
    entry *x = &set[w];
    if (!same_key(x, h, c->key, c->key_len))
      continue;
    if (x->mono != mono || x->limit != c->q.limit ||
        x->period_us != c->q.period_us || x->burst != c->q.burst) {
      /* another timeline or quota: the store decides, and under another
       * quota it may change the state this denial was true of (a sliding
       * log pruned under a shorter period), so the denial goes */
      x->hash = 0;
      break;
    }
    if (now_us >= x->until_us) {
      x->hash = 0; /* the store may allow by now */
      break;
    }
    if (c->arg < x->min_cost)
      break;
    *out = x->r;
    /* the wait left, never more than the store's (see deny_cache.h); a
     * cost above the limit (the burst for the buckets) never passes */
    bool bucket = c->alg == TG_TOKEN_BUCKET || c->alg == TG_LEAKY_BUCKET;
    if (c->arg > (bucket ? c->q.burst : c->q.limit))
      out->retry_after_ms = TG_NEVER;
    else
      out->retry_after_ms = tg__ms_until(x->until_us, now_us);
    uint64_t elapsed = now_us > x->at_us ? now_us - x->at_us : 0;
    uint64_t reset_us = x->r.reset_after_ms * 1000;
    out->reset_after_ms =
        reset_us > elapsed ? tg__div_ceil(reset_us - elapsed, 1000) : 0;
    if (out->reset_after_ms < out->retry_after_ms &&
        out->retry_after_ms != TG_NEVER)
      out->reset_after_ms = out->retry_after_ms;
    hit = true;
    break;
  }
  pthread_mutex_unlock(mu);
  return hit;
}

void tg__deny_cache_put(tg__deny_cache *dc, const tg__call *c, bool mono,
                        uint64_t at_us, const tg_result *r) {
  if (c->op != TG__OP_HIT || r->allowed || r->degraded ||
      r->retry_after_ms == TG_NEVER || r->retry_after_ms < 2 ||
      r->retry_after_ms > TG_PERIOD_MAX_MS)
    return;
  uint64_t until = at_us + (r->retry_after_ms - 1) * 1000;
  uint64_t h = hash_of(dc, c->key, c->key_len);
  pthread_mutex_t *mu;
  entry *set = lock_set(dc, h, &mu);
  entry *x = NULL;
  for (int w = 0; w < WAYS && !x; w++)
    if (same_key(&set[w], h, c->key, c->key_len))
      x = &set[w];
  for (int w = 0; w < WAYS && !x; w++)
    if (set[w].hash == 0)
      x = &set[w];
  if (!x) {
    /* the entry that stops denying first (in its own timeline: entries
     * of the other one are compared loosely, which only affects which
     * one goes) */
    x = &set[0];
    for (int w = 1; w < WAYS; w++)
      if (set[w].until_us < x->until_us)
        x = &set[w];
  }
  x->hash = h;
  x->until_us = until;
  x->at_us = at_us;
  x->min_cost = is_window(c->alg) ? 0 : c->arg;
  x->limit = c->q.limit;
  x->period_us = c->q.period_us;
  x->burst = c->q.burst;
  x->r = *r;
  x->mono = mono;
  x->key_len = (uint16_t)c->key_len;
  memcpy(x->key, c->key, c->key_len);
  pthread_mutex_unlock(mu);
}

void tg__deny_cache_forget(tg__deny_cache *dc, const void *key,
                           size_t key_len) {
  uint64_t h = hash_of(dc, key, key_len);
  pthread_mutex_t *mu;
  entry *set = lock_set(dc, h, &mu);
  for (int w = 0; w < WAYS; w++)
    if (same_key(&set[w], h, key, key_len))
      set[w].hash = 0;
  pthread_mutex_unlock(mu);
}
