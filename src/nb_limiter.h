/*
 * nb_limiter.h - the parts of the limiter (tollgate.c) that the non-blocking
 * API (nb.c) shares, so a decision made through it is validated, answered
 * from the deny cache, and given the failure policy's answer exactly as
 * tg_hit would: the API keeps only the connections for itself.
 */
#ifndef TG_NB_LIMITER_H
#define TG_NB_LIMITER_H

#include "core/core.h"

/* A limiter without a store (its policy, fallback and deny cache only):
 * what tg_limiter_new would check and build, but no connection. Only the
 * functions below may be used on it, and tg_limiter_destroy. */
int tg__limiter_shell_new(tg_limiter **out, const tg_config *cfg);

/* Validates a hit as tg_hit would and builds its call (now NULL: the
 * store's clock). */
int tg__limiter_prepare_hit(const tg_limiter *lim, const uint64_t *now,
                            const void *key, size_t key_len, const tg_quota *q,
                            uint64_t cost, tg__call *c);

/* The moment a call is made, in the deny cache's timeline for it (this
 * host's monotonic clock for calls on the store's clock, else the call's
 * now); 0 without a cache. */
uint64_t tg__limiter_when(const tg_limiter *lim, const tg__call *c);

/* True with *out filled when the deny cache answers call c. */
bool tg__limiter_cached(tg_limiter *lim, const tg__call *c, uint64_t when,
                        tg_result *out);

/* The answer to call c (made at `when`) from the store's rc and outcome:
 * the outcome's result, remembered by the deny cache; or for a failure the
 * policy's answer (the fallback's decision included). Returns rc. */
int tg__limiter_answer(tg_limiter *lim, const tg__call *c, const tg_quota *q,
                       uint64_t when, int rc, const tg__outcome *o,
                       tg_result *out);

/* The result of a call refused before it was built (invalid input). */
void tg__limiter_invalid(tg_limiter *lim, int rc, const tg_quota *q,
                         tg_result *out);

/* The limiter's counters, its store's included. */
void tg__limiter_store_stats(const tg_limiter *lim, tg_store_stats *st);

#endif /* TG_NB_LIMITER_H */
