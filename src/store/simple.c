/*
 * simple.c - the single-threaded in-process store: a chained hash table of
 * keys, hashed with keyed SipHash, that grows by doubling.
 *
 * It exists so the limiter works end to end with one thread; the concurrent
 * fixed-capacity table replaces it as the default later. It keeps memory
 * proportional to live keys: a key whose state is equivalent to absent after
 * a call is deleted at once, and before the table doubles it first sweeps out
 * every key that has decayed to absent.
 */
#include "store.h"

#include "../siphash.h"

#include <stdlib.h>
#include <string.h>

typedef struct node {
  struct node *next; /* chain in one bucket */
  uint64_t hash;     /* SipHash of the key, kept to skip memcmp and rehash */
  tg__state st;      /* windows and buckets */
  tg__log log;       /* sliding window; log.e is malloc'd, NULL until used */
  size_t key_len;
  unsigned char key[]; /* key_len bytes, copied from the caller */
} node;

typedef struct simple {
  tg__store base;
  node **buckets;       /* mask + 1 chains */
  size_t mask;          /* bucket count - 1 (a power of two) */
  size_t count;         /* keys held */
  uint64_t sip[2];      /* random per-table SipHash key */
  uint32_t sliding_max; /* cap for each sliding log */
} simple;

#define INITIAL_BUCKETS 16

static node **find(simple *s, uint64_t h, const void *key, size_t len) {
  node **pp = &s->buckets[h & s->mask];
  for (; *pp; pp = &(*pp)->next) {
    node *n = *pp;
    if (n->hash == h && n->key_len == len && memcmp(n->key, key, len) == 0)
      return pp;
  }
  return pp; /* where a new node would be linked */
}

static void unlink_free(simple *s, node **pp) {
  node *n = *pp;
  *pp = n->next;
  free(n->log.e);
  free(n);
  s->count--;
}

/* True when the node's state is equivalent to absent at now. */
static bool node_fresh(tg_algorithm alg, node *n, const tg__quota *q,
                       uint64_t now_us) {
  if (alg == TG_SLIDING_WINDOW) {
    tg__log_prune(&n->log, q->period_us, now_us);
    return n->log.n == 0;
  }
  return tg__state_fresh(alg, &n->st, now_us);
}

/* Before doubling, drop every key that has decayed to absent; double only if
 * the table is still over its load factor (1 key per bucket). The sweep uses
 * the current call's quota for sliding logs, which is the quota the keys are
 * documented to share. */
static int make_room(simple *s, const tg__call *c) {
  if (s->count < s->mask + 1)
    return TG_OK;
  for (size_t i = 0; i <= s->mask; i++) {
    node **pp = &s->buckets[i];
    while (*pp) {
      if (node_fresh(c->alg, *pp, &c->q, c->now_us))
        unlink_free(s, pp);
      else
        pp = &(*pp)->next;
    }
  }
  if (s->count < (s->mask + 1) / 2 + 1)
    return TG_OK;
  size_t nb = (s->mask + 1) * 2;
  node **b = calloc(nb, sizeof *b);
  if (!b)
    return TG_ENOMEM;
  for (size_t i = 0; i <= s->mask; i++) {
    node *n = s->buckets[i];
    while (n) {
      node *next = n->next;
      n->next = b[n->hash & (nb - 1)];
      b[n->hash & (nb - 1)] = n;
      n = next;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->mask = nb - 1;
  return TG_OK;
}

static int insert(simple *s, const tg__call *c, uint64_t h, node ***pp) {
  int rc = make_room(s, c);
  if (rc != TG_OK)
    return rc;
  *pp = find(s, h, c->key, c->key_len); /* the table may have changed */
  node *n = calloc(1, sizeof *n + c->key_len);
  if (!n)
    return TG_ENOMEM;
  n->hash = h;
  n->key_len = c->key_len;
  memcpy(n->key, c->key, c->key_len);
  n->log.max = s->sliding_max;
  **pp = n;
  s->count++;
  return TG_OK;
}

/* Sliding log: make room for one more entry, growing by doubling up to max. */
static int log_reserve(tg__log *log) {
  uint32_t want = log->n + 1 <= log->max ? log->n + 1 : log->max;
  if (log->room >= want)
    return TG_OK;
  uint32_t room = log->room ? log->room : 4;
  while (room < want)
    room = room > log->max / 2 ? log->max : room * 2;
  tg__entry *e = realloc(log->e, (size_t)room * sizeof *e);
  if (!e)
    return TG_ENOMEM;
  log->e = e;
  log->room = room;
  return TG_OK;
}

static int exec_log(simple *s, const tg__call *c, uint64_t h, node **pp,
                    tg__outcome *o) {
  bool changed;
  if (!*pp) {
    /* Only a hit with a cost creates a log; everything else reads an empty
     * one. */
    if (c->op != TG__OP_HIT || c->arg == 0) {
      tg__log empty = {NULL, 0, 0, s->sliding_max};
      return tg__log_step(c, &empty, o, &changed);
    }
    int rc = insert(s, c, h, &pp);
    if (rc != TG_OK)
      return rc;
  }
  node *n = *pp;
  if (c->op == TG__OP_HIT && c->arg > 0) {
    int rc = log_reserve(&n->log);
    if (rc != TG_OK)
      return rc;
  }
  int rc = tg__log_step(c, &n->log, o, &changed);
  if (n->log.n == 0)
    unlink_free(s, pp);
  return rc;
}

static int simple_exec(tg__store *base, const tg__call *c, tg__outcome *o) {
  simple *s = (simple *)base;
  uint64_t h = tg__siphash(s->sip, c->key, c->key_len);
  node **pp = find(s, h, c->key, c->key_len);
  if (c->alg == TG_SLIDING_WINDOW)
    return exec_log(s, c, h, pp, o);

  tg__state st = *pp ? (*pp)->st : (tg__state){0, 0};
  bool changed;
  int rc = tg__state_step(c, &st, o, &changed);
  if (rc != TG_OK || !changed)
    return rc;
  if (tg__state_fresh(c->alg, &st, c->now_us)) {
    if (*pp)
      unlink_free(s, pp);
    return TG_OK;
  }
  if (!*pp) {
    rc = insert(s, c, h, &pp);
    if (rc != TG_OK)
      return rc;
  }
  (*pp)->st = st;
  return TG_OK;
}

static int simple_reset(tg__store *base, const void *key, size_t key_len) {
  simple *s = (simple *)base;
  node **pp = find(s, tg__siphash(s->sip, key, key_len), key, key_len);
  if (*pp)
    unlink_free(s, pp);
  return TG_OK;
}

static size_t simple_key_count(const tg__store *base) {
  return ((const simple *)base)->count;
}

static void simple_destroy(tg__store *base) {
  simple *s = (simple *)base;
  for (size_t i = 0; i <= s->mask; i++)
    while (s->buckets[i])
      unlink_free(s, &s->buckets[i]);
  free(s->buckets);
  free(s);
}

static const tg__store_ops simple_ops = {simple_exec, simple_reset,
                                         simple_key_count, simple_destroy};

int tg__simple_store_new(tg__store **out, uint32_t sliding_max) {
  simple *s = calloc(1, sizeof *s);
  if (!s)
    return TG_ENOMEM;
  s->buckets = calloc(INITIAL_BUCKETS, sizeof *s->buckets);
  if (!s->buckets) {
    free(s);
    return TG_ENOMEM;
  }
  if (tg__siphash_random_key(s->sip) != 0) {
    free(s->buckets);
    free(s);
    return TG_ESTORE;
  }
  s->base.ops = &simple_ops;
  s->mask = INITIAL_BUCKETS - 1;
  s->sliding_max = sliding_max;
  *out = &s->base;
  return TG_OK;
}
