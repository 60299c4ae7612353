/* SPDX-License-Identifier: MIT */
/*
 * deny_cache.h - the local deny cache: once the store has denied a call
 * with "retry after t", further calls on that key that the store must deny
 * too are answered here, without a round trip, until shortly before t.
 *
 * Why a denial can be reused, per algorithm (the store's state can only
 * move towards "deny" between now and t: other callers only add cost, and
 * time only frees what the denial's retry time already counts on):
 *   - fixed windows (both kinds): the denied call was counted, so the
 *     window's count is above the limit until the window ends, which is
 *     when retry_after_ms ends: every call is denied until then, whatever
 *     its cost;
 *   - sliding window, token and leaky buckets: a call of the same or a
 *     greater cost is denied until the retry time, which is the earliest
 *     moment at which that cost fits if nothing else happens; a smaller
 *     cost may fit earlier, so it goes to the store.
 * The retry time is only known rounded up to the ms, so an entry denies
 * until 1 ms before it ((retry_after_ms - 1) ms after the denial): never
 * after the store would allow. Only calls under the same quota match (a
 * key's quota is part of its state's meaning), and only in the same
 * timeline: calls on the store's own clock use this host's monotonic clock
 * from the moment the denied call was sent (never later than the moment
 * the server decided), calls with a now of their own use that now.
 *
 * Bounded: a fixed number of entries (full keys, no hash-only matches),
 * grouped in sets of 4; a new denial replaces an expired entry of its set,
 * else the one that expires first. Thread-safe: striped mutexes.
 */
#ifndef TG_DENY_CACHE_H
#define TG_DENY_CACHE_H

#include "core/core.h"

typedef struct tg__deny_cache tg__deny_cache;

/* A cache of at least `entries` entries (rounded up to a power of two, at
 * least 4). TG_ENOMEM. */
int tg__deny_cache_new(tg__deny_cache **out, uint64_t entries);
void tg__deny_cache_free(tg__deny_cache *dc);

/* Bytes the cache holds. */
size_t tg__deny_cache_bytes(const tg__deny_cache *dc);

/* When call c (a hit) is covered by a remembered denial at time now_us of
 * timeline `mono` (see above), fills *out with the answer and returns true. */
bool tg__deny_cache_get(tg__deny_cache *dc, const tg__call *c, bool mono,
                        uint64_t now_us, tg_result *out);

/* Remembers the answer r to call c, made at time at_us of timeline `mono`,
 * when it is a denial that can be reused. */
void tg__deny_cache_put(tg__deny_cache *dc, const tg__call *c, bool mono,
                        uint64_t at_us, const tg_result *r);

/* The set a key's entries live in: a denial stored for one key can only
 * push out an entry of a key of the same set. */
size_t tg__deny_cache_set(const tg__deny_cache *dc, const void *key,
                          size_t key_len);

/* Forgets what the cache knows about a key (a reset or set on it). */
void tg__deny_cache_forget(tg__deny_cache *dc, const void *key, size_t key_len);

#endif /* TG_DENY_CACHE_H */
