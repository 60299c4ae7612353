/* SPDX-License-Identifier: MIT */
/*
 * stats.c - the counters' allocation, reading, and the threads' numbers
 * (see stats.h).
 */
#include "stats.h"

#include <stdlib.h>
#include <string.h>

_Thread_local uint64_t tg__my_number TG__TLS_FAST;
_Thread_local unsigned tg__my_shard TG__TLS_FAST;
static uint64_t numbers_taken; /* atomic */

uint64_t tg__thread_number_new(void) {
  uint64_t me = __atomic_add_fetch(&numbers_taken, 1, __ATOMIC_RELAXED);
  tg__my_number = me;
  if (me < TG__SHARDS)
    tg__my_shard = (unsigned)me;
  return me;
}

void tg__count_slow(tg__stats *st, unsigned i) {
  bool own;
  tg__shard *sh = tg__shard_get(st, &own);
  tg__count(sh, own, i);
}

tg__stats *tg__stats_new(void) {
  void *p = NULL;
  if (posix_memalign(&p, 64, sizeof(tg__stats)) != 0)
    return NULL;
  memset(p, 0, sizeof(tg__stats));
  return p;
}

void tg__stats_free(tg__stats *st) { free(st); }

void tg__stats_read(const tg__stats *st, tg_stats *out) {
  uint64_t sum[TG__N_COUNT_] = {0};
  for (unsigned s = 0; s <= TG__SHARDS; s++)
    for (unsigned i = 0; i < TG__N_COUNT_; i++)
      sum[i] += tg__load_relaxed(&st->shard[s].n[i]);
  memset(out, 0, sizeof *out);
  out->allowed = sum[TG__N_ALLOWED];
  out->denied = sum[TG__N_DENIED];
  out->shadow_denied = sum[TG__N_SHADOW];
  out->degraded = sum[TG__N_DEGRADED];
  out->table_full = sum[TG__N_FULL];
  out->reclaimed = sum[TG__N_RECLAIMED];
  for (unsigned e = 0; e < 32; e++)
    out->errors[e] = sum[TG__N_ERR0 + e];
  out->deny_cache_hits = sum[TG__N_CACHE];
  out->fallback_decisions = sum[TG__N_FALLBACK];
}
