/* SPDX-License-Identifier: MIT */
/*
 * stats.c - the counters' allocation, reading, and the threads' numbers
 * (see stats.h).
 */
#include "stats.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

_Thread_local uint64_t tg__my_number TG__TLS_FAST;
_Thread_local unsigned tg__my_shard TG__TLS_FAST;
static uint64_t numbers_taken; /* atomic */

/* Bit s: owned shard s is some live thread's (bit 0: never, it means "no
 * shard"). A thread gives its shard back as it exits (a thread-specific
 * key's destructor), so a program that starts and ends threads all its
 * life keeps counting in owned shards: numbering threads once and for all
 * sent every thread after the 63rd to the shared shard's atomic adds, and
 * two such threads on one line ran at half the speed of one. */
static uint64_t shards_taken = 1; /* atomic */
static pthread_key_t shard_key;
static bool shard_key_ok;
static pthread_once_t shard_once = PTHREAD_ONCE_INIT;

static void shard_release(void *p) {
  unsigned s = (unsigned)(uintptr_t)p;
  /* anything this thread still decides (another key's destructor) counts
   * in the shared shard from now on: the shard may be another's already */
  tg__my_shard = 0;
  tg__my_number = UINT64_MAX;
  /* release: the new owner's plain increments come after ours */
  __atomic_fetch_and(&shards_taken, ~(UINT64_C(1) << s), __ATOMIC_RELEASE);
}

static void shard_key_make(void) {
  shard_key_ok = pthread_key_create(&shard_key, shard_release) == 0;
}

uint64_t tg__thread_number_new(void) {
  uint64_t me = __atomic_add_fetch(&numbers_taken, 1, __ATOMIC_RELAXED);
  tg__my_number = me;
  (void)pthread_once(&shard_once, shard_key_make);
  if (!shard_key_ok)
    return me; /* no way to give a shard back: count in the shared one */
  uint64_t m = tg__load_acquire(&shards_taken);
  for (;;) {
    uint64_t free_shards = ~m;
    /* other threads change shards_taken: cppcheck takes it for its
     * initial value */
    // cppcheck-suppress knownConditionTrueFalse
    if (free_shards == 0)
      break;
    unsigned s = (unsigned)__builtin_ctzll(free_shards);
    if (__atomic_compare_exchange_n(&shards_taken, &m, m | UINT64_C(1) << s,
                                    false, __ATOMIC_ACQUIRE,
                                    __ATOMIC_ACQUIRE)) {
      if (pthread_setspecific(shard_key, (void *)(uintptr_t)s) != 0) {
        __atomic_fetch_and(&shards_taken, ~(UINT64_C(1) << s),
                           __ATOMIC_RELEASE);
        return me;
      }
      tg__my_shard = s;
      return me;
    }
  }
  return me; /* every owned shard is a live thread's */
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
