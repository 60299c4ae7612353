/* SPDX-License-Identifier: MIT */
/*
 * stats.h - a limiter's counters (tg_stats), cheap enough to be always on.
 *
 * A decision must not write a cache line other threads write, or counting
 * would cost more than deciding on a hot key. So the counters live in
 * shards of their own cache lines, one per thread: a thread takes a free
 * shard (1 .. TG__SHARDS - 1) at its first decision and gives it back when
 * it exits, so only one live thread ever writes a shard and counts there
 * with plain relaxed loads and stores (no locked instruction, no ownership
 * to check); the release as it exits and the acquire of the next owner
 * order their increments. Threads beyond TG__SHARDS - 1 alive at once count
 * in one shared shard with atomic adds: correct and only slower. Reading
 * adds every shard up with relaxed loads: each counter is exact, the set is
 * not one snapshot.
 */
#ifndef TG_STATS_H
#define TG_STATS_H

#include "atomic.h"
#include "tollgate.h"

#include <stddef.h>

/* Shards threads own, by number; one more (the last) is shared. */
#define TG__SHARDS 64u

/* What a shard counts: tg_stats's fields, in its order, up to those the
 * store keeps itself (tg__redis_stats), then the hook's sampling
 * sequence and whose it is. */
enum {
  TG__N_ALLOWED = 0,
  TG__N_DENIED,
  TG__N_SHADOW,
  TG__N_DEGRADED,
  TG__N_FULL,
  TG__N_RECLAIMED,
  TG__N_ERR0,                    /* errors[0..32) follow */
  TG__N_CACHE = TG__N_ERR0 + 32, /* deny_cache_hits */
  TG__N_FALLBACK,                /* fallback_decisions */
  TG__N_HOOK,                    /* decisions the hook considered */
  TG__N_HOOK_THREAD, /* the thread number TG__N_HOOK counts for (a shard
                        passes to a new thread when its owner exits) */
  TG__N_COUNT_
};

typedef struct tg__shard {
  uint64_t n[TG__N_COUNT_];
} __attribute__((aligned(64))) tg__shard;

typedef struct tg__stats {
  tg__shard shard[TG__SHARDS + 1]; /* the last one is shared */
} tg__stats;

/* The initial-exec TLS model keeps the thread-local a plain fs-relative
 * load, not a call into the dynamic linker: it is read on every decision. */
#if defined(__GNUC__)
#define TG__TLS_FAST __attribute__((tls_model("initial-exec")))
#else
#define TG__TLS_FAST
#endif

/* The calling thread's number once it has one, else 0. */
extern _Thread_local uint64_t tg__my_number TG__TLS_FAST;

/* The shard the calling thread owns, or 0 until it has a number, when no
 * owned shard was free then, and after it gave its shard back (exiting):
 * the one test on a decision's counting path (tg__count_one). */
extern _Thread_local unsigned tg__my_shard TG__TLS_FAST;

/* Gives the calling thread its number (>= 1, never reused) and a free
 * owned shard if there is one (given back when the thread exits). */
uint64_t tg__thread_number_new(void);

/* The shard the calling thread counts in; *own: it is the thread's own
 * (else the shared one). */
static inline tg__shard *tg__shard_get(tg__stats *st, bool *own) {
  if (__builtin_expect(tg__my_number == 0, 0))
    (void)tg__thread_number_new();
  unsigned s = tg__my_shard;
  *own = s != 0;
  return &st->shard[*own ? s : TG__SHARDS];
}

/* Adds 1 to counter i of shard sh. */
static inline void tg__count(tg__shard *sh, bool own, unsigned i) {
  if (own)
    tg__store_relaxed(&sh->n[i], tg__load_relaxed(&sh->n[i]) + 1);
  else
    __atomic_fetch_add(&sh->n[i], 1, __ATOMIC_RELAXED);
}

/* tg__count_one's other case: numbers the thread, or counts in the shared
 * shard (not inlined: it happens once per thread, or to threads beyond the
 * owned shards). */
void tg__count_slow(tg__stats *st, unsigned i);

/* Adds 1 to counter i of the calling thread's shard: in the common case one
 * thread-local load, one predictable branch and one plain increment of a
 * line no other thread writes. */
static inline void tg__count_one(tg__stats *st, unsigned i) {
  unsigned s = tg__my_shard;
  if (__builtin_expect(s != 0, 1)) {
    uint64_t *p = &st->shard[s].n[i];
    tg__store_relaxed(p, tg__load_relaxed(p) + 1);
  } else {
    tg__count_slow(st, i);
  }
}

/* Allocates zeroed, cache-line aligned counters (NULL: no memory). */
tg__stats *tg__stats_new(void);
void tg__stats_free(tg__stats *st);

/* Adds every shard up into *out (all of tg_stats but the store's own
 * counters, left 0). */
void tg__stats_read(const tg__stats *st, tg_stats *out);

#endif /* TG_STATS_H */
