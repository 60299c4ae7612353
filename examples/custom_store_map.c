/* SPDX-License-Identifier: MIT */
/*
 * custom_store_map.c - the example custom store: a chained hash map split
 * into lock stripes, each stripe a small map of its own guarded by one
 * pthread mutex. See custom_store_map.h for the contract it implements.
 *
 * A key's lock is its stripe's mutex. lock_and_get returns with it held
 * (OK, NOT_FOUND), and the matching set_and_unlock or unlock releases it;
 * in between, the thread that holds it may change the stripe freely. With
 * options.recursive the mutex is recursive, so one thread may hold several
 * keys of a stripe, as a policy does.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "custom_store_map.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STRIPES_DEFAULT 64u
#define LOCK_WAIT_DEFAULT_US 1000
#define POLL_NS 20000L     /* sleep between trylocks in a bounded wait */
#define BUCKETS_INITIAL 8u /* per stripe; a power of two */
#define NEVER UINT64_MAX   /* expires_us of an entry without TTL */

/* One key: its bytes follow the struct; the state is a separate buffer
 * because a sliding log grows and shrinks. */
typedef struct entry {
  struct entry *next; /* chain in its bucket */
  uint64_t hash;
  uint64_t expires_us; /* store clock; the entry is gone from then on */
  unsigned char *val;  /* the serialised state (tollgate's bytes) */
  size_t len;          /* bytes in val */
  size_t cap;          /* bytes allocated for val */
  size_t key_len;
  unsigned char key[]; /* key_len bytes */
} entry;

typedef struct stripe {
  pthread_mutex_t lock; /* the lock of every key in this stripe */
  entry **buckets;      /* nbuckets chains */
  size_t nbuckets;      /* a power of two */
  size_t n;             /* entries, expired ones included */
} stripe;

struct map_store {
  stripe *stripes;
  size_t nstripes;
  int64_t lock_wait_us;
  tg_clock_fn clock; /* NULL: CLOCK_MONOTONIC */
  void *clock_ctx;
};

static uint64_t monotonic_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_us(const map_store *m) {
  return m->clock ? m->clock(m->clock_ctx) : monotonic_us();
}

/* FNV-1a with a murmur finaliser. Keys that come from untrusted clients
 * deserve a keyed hash (SipHash) instead, against hash flooding. */
static uint64_t hash_key(const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * UINT64_C(0x100000001b3);
  h ^= h >> 33;
  h *= UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 33;
  return h;
}

static stripe *stripe_of(const map_store *m, uint64_t h) {
  return &m->stripes[h % m->nstripes];
}

static size_t bucket_of(const map_store *m, const stripe *s, uint64_t h) {
  return (size_t)(h / m->nstripes) & (s->nbuckets - 1);
}

/* The link that points at the key's entry, or at the NULL ending its
 * chain. Caller holds the stripe's lock. */
static entry **find(const map_store *m, stripe *s, uint64_t h, const void *key,
                    size_t key_len) {
  entry **pp = &s->buckets[bucket_of(m, s, h)];
  while (*pp && !((*pp)->hash == h && (*pp)->key_len == key_len &&
                  memcmp((*pp)->key, key, key_len) == 0))
    pp = &(*pp)->next;
  return pp;
}

static void unlink_free(stripe *s, entry **pp) {
  entry *e = *pp;
  *pp = e->next;
  free(e->val);
  free(e);
  s->n--;
}

/* Makes room for one more entry: drops expired ones first, and doubles the
 * bucket array only if the stripe is still loaded. A failed doubling is
 * harmless (chains just get longer). Caller holds the stripe's lock. */
static void make_room(const map_store *m, stripe *s, uint64_t now) {
  if (s->n < s->nbuckets)
    return;
  for (size_t b = 0; b < s->nbuckets; b++)
    for (entry **pp = &s->buckets[b]; *pp;)
      if ((*pp)->expires_us <= now)
        unlink_free(s, pp);
      else
        pp = &(*pp)->next;
  if (s->n < s->nbuckets / 2)
    return;
  size_t nb = s->nbuckets * 2;
  entry **nbk = calloc(nb, sizeof *nbk);
  if (!nbk)
    return;
  size_t old_nb = s->nbuckets;
  s->nbuckets = nb;
  for (size_t b = 0; b < old_nb; b++)
    for (entry *e = s->buckets[b], *next; e; e = next) {
      next = e->next;
      size_t i = bucket_of(m, s, e->hash);
      e->next = nbk[i];
      nbk[i] = e;
    }
  free(s->buckets);
  s->buckets = nbk;
}

/* Takes the stripe's lock as lock_wait_us says. 0 when held, EBUSY when the
 * wait ran out, another errno value on failure. */
static int lock_stripe(const map_store *m, stripe *s) {
  if (m->lock_wait_us < 0)
    return pthread_mutex_lock(&s->lock);
  int rc = pthread_mutex_trylock(&s->lock);
  if (rc != EBUSY || m->lock_wait_us == 0)
    return rc;
  uint64_t deadline = monotonic_us() + (uint64_t)m->lock_wait_us;
  const struct timespec nap = {0, POLL_NS};
  do {
    nanosleep(&nap, NULL);
    rc = pthread_mutex_trylock(&s->lock);
  } while (rc == EBUSY && monotonic_us() < deadline);
  return rc;
}

/* tg_custom_store.lock_and_get. On OK and NOT_FOUND the stripe stays locked
 * until tollgate's set_and_unlock or unlock. A state longer than cap is
 * copied short and reported with its true length: tollgate then sees that
 * it cannot be its own (TG_ECORRUPT) and releases the lock. */
static int map_lock_and_get(void *ctx, const void *key, size_t key_len,
                            void *buf, size_t cap, size_t *len) {
  map_store *m = ctx;
  uint64_t h = hash_key(key, key_len);
  stripe *s = stripe_of(m, h);
  int rc = lock_stripe(m, s);
  if (rc == EBUSY)
    return TG_CUSTOM_BUSY; /* nothing held */
  if (rc != 0)
    return TG_CUSTOM_ERROR; /* nothing held */
  entry **pp = find(m, s, h, key, key_len);
  if (!*pp)
    return TG_CUSTOM_NOT_FOUND; /* lock held */
  if ((*pp)->expires_us <= now_us(m)) {
    unlink_free(s, pp);         /* expired: the state no longer matters */
    return TG_CUSTOM_NOT_FOUND; /* lock held */
  }
  size_t n = (*pp)->len < cap ? (*pp)->len : cap;
  if (n > 0) /* val may be NULL for an empty state */
    memcpy(buf, (*pp)->val, n);
  *len = (*pp)->len;
  return TG_CUSTOM_OK; /* lock held */
}

/* Stores the state with its TTL (0: deletes it), then unlocks. Fails only
 * for lack of memory, and unlocks then too, as the contract requires. */
static int map_set_and_unlock(void *ctx, const void *key, size_t key_len,
                              const void *data, size_t len, uint64_t ttl_ms) {
  map_store *m = ctx;
  uint64_t h = hash_key(key, key_len);
  stripe *s = stripe_of(m, h);
  int rc = TG_CUSTOM_OK;
  entry **pp = find(m, s, h, key, key_len);
  if (ttl_ms == 0) {
    if (*pp)
      unlink_free(s, pp);
    goto out;
  }
  uint64_t now = now_us(m), expires = NEVER;
  if (ttl_ms < (NEVER - now) / 1000)
    expires = now + ttl_ms * 1000;
  entry *e = *pp;
  if (!e) {
    make_room(m, s, now);
    e = calloc(1, sizeof *e + key_len);
    if (!e) {
      rc = TG_CUSTOM_ERROR;
      goto out;
    }
    e->hash = h;
    e->key_len = key_len;
    memcpy(e->key, key, key_len);
    size_t b = bucket_of(m, s, h);
    e->next = s->buckets[b];
    s->buckets[b] = e;
    s->n++;
  }
  if (len > e->cap) {
    unsigned char *v = realloc(e->val, len);
    if (!v) {
      rc = TG_CUSTOM_ERROR; /* the entry keeps its old state */
      goto out;
    }
    e->val = v;
    e->cap = len;
  }
  if (len > 0)
    memcpy(e->val, data, len);
  e->len = len;
  e->expires_us = expires;
out:
  pthread_mutex_unlock(&s->lock);
  return rc;
}

/* Releases the lock lock_and_get took, changing nothing. */
static void map_unlock(void *ctx, const void *key, size_t key_len) {
  map_store *m = ctx;
  pthread_mutex_unlock(&stripe_of(m, hash_key(key, key_len))->lock);
}

void map_store_options_init(map_store_options *o) {
  o->stripes = STRIPES_DEFAULT;
  o->lock_wait_us = LOCK_WAIT_DEFAULT_US;
  o->clock = NULL;
  o->recursive = 0;
  o->clock_ctx = NULL;
}

/* A stripe's lock, recursive on request: a policy (tg_hit_rules) holds
 * every key of its rules at once, and two of them may share a stripe. */
static int stripe_lock_init(pthread_mutex_t *m, int recursive) {
  pthread_mutexattr_t a;
  if (pthread_mutexattr_init(&a) != 0)
    return -1;
  int rc =
      recursive ? pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE) : 0;
  if (rc == 0)
    rc = pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
  return rc;
}

int map_store_new(map_store **out, const map_store_options *o) {
  map_store_options defaults;
  if (!o) {
    map_store_options_init(&defaults);
    o = &defaults;
  }
  *out = NULL;
  if (o->stripes == 0)
    return -1;
  map_store *m = calloc(1, sizeof *m);
  if (!m)
    return -1;
  m->lock_wait_us = o->lock_wait_us;
  m->clock = o->clock;
  m->clock_ctx = o->clock_ctx;
  m->stripes = calloc(o->stripes, sizeof *m->stripes);
  if (!m->stripes) {
    free(m);
    return -1;
  }
  for (; m->nstripes < o->stripes; m->nstripes++) {
    stripe *s = &m->stripes[m->nstripes];
    s->nbuckets = BUCKETS_INITIAL;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (!s->buckets || stripe_lock_init(&s->lock, o->recursive) != 0) {
      free(s->buckets);
      map_store_free(m); /* frees the stripes set up so far */
      return -1;
    }
  }
  *out = m;
  return 0;
}

void map_store_free(map_store *m) {
  if (!m)
    return;
  for (size_t i = 0; i < m->nstripes; i++) {
    stripe *s = &m->stripes[i];
    for (size_t b = 0; b < s->nbuckets; b++)
      while (s->buckets[b])
        unlink_free(s, &s->buckets[b]);
    free(s->buckets);
    pthread_mutex_destroy(&s->lock);
  }
  free(m->stripes);
  free(m);
}

void map_store_callbacks(map_store *m, tg_custom_store *cs) {
  cs->lock_and_get = map_lock_and_get;
  cs->set_and_unlock = map_set_and_unlock;
  cs->unlock = map_unlock;
  cs->ctx = m;
}

size_t map_store_live(map_store *m) {
  size_t live = 0;
  for (size_t i = 0; i < m->nstripes; i++) {
    stripe *s = &m->stripes[i];
    pthread_mutex_lock(&s->lock);
    uint64_t now = now_us(m);
    for (size_t b = 0; b < s->nbuckets; b++)
      for (const entry *e = s->buckets[b]; e; e = e->next)
        live += e->expires_us > now;
    pthread_mutex_unlock(&s->lock);
  }
  return live;
}
