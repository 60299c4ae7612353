/* SPDX-License-Identifier: MIT */
/*
 * custom_store_map.h - an in-process key/value store that plugs into
 * tollgate as a custom store (tg_config.custom_store). Copy it and replace
 * the hash map with your own storage: the locking and TTL rules it follows
 * are the part that matters.
 *
 * The contract tollgate expects (tollgate.h, "Custom store"), and how this
 * store keeps it:
 *
 *   lock_and_get  takes the key's lock, then copies its state. Returns
 *                 TG_CUSTOM_OK or TG_CUSTOM_NOT_FOUND WITH THE LOCK HELD;
 *                 TG_CUSTOM_BUSY or TG_CUSTOM_ERROR with nothing held. A
 *                 state longer than cap is copied short and reported with
 *                 its true length, one of the two answers tollgate.h
 *                 allows: tollgate then answers TG_ECORRUPT instead of
 *                 reading a prefix.
 *   set_and_unlock / unlock
 *                 after every OK or NOT_FOUND tollgate calls exactly one of
 *                 them, for the same key, within the same tollgate call and
 *                 so on the same thread (pthread mutexes need that). Both
 *                 always release the lock, even when set_and_unlock fails.
 *
 * Locks are striped: a key's lock is one of `stripes` pthread mutexes chosen
 * by its hash, and that mutex also guards the stripe's part of the map, so
 * keys sharing a stripe wait for each other but no global lock exists.
 *
 * TTLs: set_and_unlock gets ttl_ms, the time after which the state is
 * "fresh" (equivalent to absent). An entry past its expiry reads as
 * NOT_FOUND and is deleted then, or when its stripe grows; ttl_ms 0 deletes
 * the entry at once. The TTL runs on the store's clock: a program that feeds
 * tollgate its own times (tg_hit_at) slower than real time must give the
 * store the same clock, or entries vanish before tollgate's time says so.
 *
 * Thread safety: every callback may be called from any thread; map_store_new
 * and map_store_free must not race with anything. A thread that holds a
 * key's lock (having called lock_and_get itself) and then asks tollgate about
 * a key of the same stripe waits for itself: with MAP_STORE_WAIT_FOREVER
 * that is a deadlock, otherwise BUSY; unless `recursive` is set, which a
 * store used by policies (tg_hit_rules) needs.
 */
#ifndef CUSTOM_STORE_MAP_H
#define CUSTOM_STORE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "tollgate.h"

/* Passed as lock_wait_us: lock_and_get blocks until the lock is free and so
 * never answers TG_CUSTOM_BUSY. */
#define MAP_STORE_WAIT_FOREVER (-1)

typedef struct map_store_options {
  size_t stripes;       /* number of lock stripes (default 64), >= 1 */
  int64_t lock_wait_us; /* how long lock_and_get waits for a held key:
                           MAP_STORE_WAIT_FOREVER blocks
                           (pthread_mutex_lock); 0 tries once
                           (pthread_mutex_trylock) and answers BUSY at once;
                           > 0 retries trylock, sleeping 20 us between tries,
                           until that many us have passed on CLOCK_MONOTONIC,
                           then answers BUSY. Default 1000 (1 ms). */
  tg_clock_fn clock;    /* the store's clock for TTLs, in us; only its
                           differences matter. NULL (default): CLOCK_MONOTONIC.
                           Tests that drive tollgate's time by hand give the
                           store the same hand clock. */
  void *clock_ctx;      /* passed to clock */
  int recursive;        /* 0 (default): a thread that holds a stripe and
                           asks for another key of it waits for itself
                           (BUSY after lock_wait_us). 1: the stripes'
                           mutexes are recursive, as policies need
                           (tg_hit_rules holds all its keys at once, and
                           two may share a stripe). */
} map_store_options;

typedef struct map_store map_store;

/* Fills *o with the defaults documented beside each field. */
void map_store_options_init(map_store_options *o);

/* Creates an empty store (o NULL: defaults). Returns 0, or -1 when memory
 * or a mutex cannot be had or o->stripes is 0. */
int map_store_new(map_store **out, const map_store_options *o);

/* Frees every entry and the store. No callback may be running. NULL is a
 * no-op. */
void map_store_free(map_store *m);

/* Fills *cs with the three callbacks and ctx = m, ready for
 * tg_config.custom_store. m must outlive every limiter that uses it. */
void map_store_callbacks(map_store *m, tg_custom_store *cs);

/* Entries not yet expired (takes each stripe's lock in turn, so it is only a
 * snapshot under concurrent use). */
size_t map_store_live(map_store *m);

#endif /* CUSTOM_STORE_MAP_H */
