/* SPDX-License-Identifier: MIT */
/*
 * health.h - whether the store behind `tollgate serve` is answering, and the
 * operator's log of it.
 *
 * The command layer notes the outcome of every call that reached the store
 * (health_note: a success, or a failure that made the answer the failure
 * policy's); the event loop prints what changed (health_log) on stderr.
 *
 * Health is kept per algorithm: each has its own limiter, and with --shm its
 * own segment, so a lock stuck in one leaves the others healthy (with
 * --redis they fail together, a line each). An algorithm becomes degraded
 * at its first failure, and healthy again only at a success that follows a
 * second without failures: a store that fails for some keys and not others
 * (one stuck sliding-log lock) stays degraded while the failures go on,
 * instead of flapping with every request. Lines are at most one a second per
 * algorithm, and the log always ends up saying the state each is in: a
 * change that could not be printed at once is printed at the next chance,
 * with the count of those folded into it.
 *
 * A full table (TG_EFULL) is not a health matter - existing keys are served,
 * new ones get the failure policy - but it is what an operator most needs to
 * hear about, so it gets its own warning, at most one a minute per
 * algorithm, counting the refused keys.
 */
#ifndef TG_TOOLS_HEALTH_H
#define TG_TOOLS_HEALTH_H

#include "tollgate.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Shortest time between two log lines about one algorithm, in ms; also how
 * long an algorithm must go without a failure to be healthy again. */
#define HEALTH_QUIET_MS 1000u
/* Shortest time between two "table full" warnings for one algorithm, ms. */
#define HEALTH_FULL_MS 60000u

typedef struct alg_health {
  bool degraded;            /* failing, and not a second without failure */
  int reason;               /* the last failure's code */
  uint64_t since_ms;        /* monotonic ms: when the current state began */
  uint64_t last_failure_ms; /* monotonic ms */
  uint64_t failed;          /* failures in the current (or last) spell */
  uint64_t transitions;     /* changes of state since start */
  /* what the log says, and when it last said it */
  bool logged_degraded;
  uint64_t logged_transitions;
  uint64_t last_line_ms;
  bool ever_logged;
  uint64_t full;        /* TG_EFULL answers, all time */
  uint64_t full_logged; /* ... of which were reported */
  uint64_t full_line_ms;
} alg_health;

typedef struct store_health {
  alg_health alg[TG_ALGORITHM_COUNT];
  bool start_failed;    /* the start-up check failed and no call has succeeded
                           since (the start-up message said so) */
  bool start_recovered; /* ... and then one did: not logged yet */
  int start_reason;
} store_health;

/* Whether rc is a store failure that says the store is unavailable (rather
 * than something about one key or one request). */
bool health_is_failure(int rc);

/* Starts degraded (the start-up check failed with code rc) or healthy. */
void health_init(store_health *h, int rc, uint64_t now_ms);

/* Records the outcome rc of a call on algorithm alg that reached the store:
 * TG_OK, a failure (health_is_failure), or TG_EFULL; other codes (bad
 * input, a corrupt key) say nothing about the store and are ignored. */
void health_note(store_health *h, int rc, tg_algorithm alg, uint64_t now_ms);

/* Whether anything is degraded; if so, *reason gets the most recent
 * failure's code and *algs (if not NULL) the degraded algorithms, one bit
 * each (1 << alg; none for a failed start-up check). */
bool health_degraded(const store_health *h, int *reason, unsigned *algs);

/* Prints to f what the log does not say yet, where a line is allowed now.
 * `store` names the store in the lines ("redis:127.0.0.1:6379 ..."),
 * `policy` what degraded requests get ("open"), `capacity` the keys of a
 * table. Cheap when there is nothing to say: the event loop calls it every
 * turn. */
void health_log(store_health *h, uint64_t now_ms, FILE *f, const char *store,
                const char *policy, uint64_t capacity);

#endif
