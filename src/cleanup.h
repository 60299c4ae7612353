/* SPDX-License-Identifier: MIT */
/*
 * cleanup.h - the background cleaning thread and the bridge from the table's
 * cleaning pass to the public before_clean callback.
 */
#ifndef TG_CLEANUP_H
#define TG_CLEANUP_H

#include "store/store.h"

/* What a pass needs to call the user's before_clean. */
typedef struct tg__clean_bridge {
  tg_algorithm alg;
  tg_before_clean_fn fn; /* may be NULL */
  void *ctx;
} tg__clean_bridge;

/* A tg__clean_cb that converts table items into tg_expired entries and calls
 * bridge->fn (ctx is a tg__clean_bridge *). */
void tg__clean_bridge_cb(const tg__clean_item *items, size_t n, void *ctx);

typedef struct tg__cleaner tg__cleaner;

/* tg_clean(lim, NULL) as the cleaning thread runs it: the pass ends early,
 * with what it reclaimed so far, once *halt (read with a relaxed atomic
 * load) is not 0 (tollgate.c). */
int tg__clean_pass(tg_limiter *lim, const int *halt);

/* Starts a thread that runs a cleaning pass (tg__clean_pass) every
 * period_ms. release
 * frees the limiter (not the cleaner), for tg__cleaner_defer. */
int tg__cleaner_start(tg__cleaner **out, tg_limiter *lim, uint64_t period_ms,
                      void (*release)(tg_limiter *));

/* On the cleaning thread itself (tg_limiter_destroy from inside its pass's
 * before_clean): ends the pass in progress once that call returns (the
 * keys it was handed are still reclaimed) and the thread, which then frees
 * the limiter (release) and the cleaner itself; returns true, and the
 * caller must then free nothing. False on any other thread. */
bool tg__cleaner_defer(tg__cleaner *c);

/* Stops the thread: a pass in progress ends at its next key, or once the
 * call of before_clean it is in returns; NULL is a no-op. In a
 * child of the process that started it (fork), where the thread does not
 * run, only frees it. */
void tg__cleaner_stop(tg__cleaner *c);

#endif /* TG_CLEANUP_H */
