/*
 * health.h - whether the store behind `tollgate serve` is answering, and the
 * operator's log of it.
 *
 * The command layer notes the outcome of every call that reached the store
 * (health_note: a success, or a failure that made the answer the failure
 * policy's); the event loop prints what changed (health_log), at most one
 * line a second, on stderr. A store that fails and recovers a hundred times a
 * second therefore costs a line a second, and the log always ends up saying
 * the state the store is in: a transition that could not be printed at once
 * is printed at the next chance, with the count of those folded into it.
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

/* Shortest time between two log lines about the store, in ms. */
#define HEALTH_LINE_MS 1000u
/* Shortest time between two "table full" warnings for one algorithm, ms. */
#define HEALTH_FULL_MS 60000u

typedef struct store_health {
  bool degraded;        /* the last call that reached the store failed */
  int reason;           /* its code (TG_ECONNECT, TG_ETIMEDOUT, TG_ESTORE,
                           TG_EBUSY, TG_ENOMEM), while degraded */
  tg_algorithm alg;     /* the limiter that saw it */
  uint64_t since_ms;    /* monotonic ms: when the current state began */
  uint64_t failed;      /* calls that failed since the store became
                           degraded */
  uint64_t transitions; /* changes of state since start */

  /* what the log says, and when it last said it */
  bool logged_degraded;
  uint64_t logged_transitions;
  uint64_t last_line_ms;
  bool ever_logged;

  uint64_t full[TG_ALGORITHM_COUNT];        /* TG_EFULL answers, all time */
  uint64_t full_logged[TG_ALGORITHM_COUNT]; /* ... of which were reported */
  uint64_t full_line_ms[TG_ALGORITHM_COUNT];
} store_health;

/* Whether rc is a store failure that says the store is unavailable (rather
 * than about one key or one request). */
bool health_is_failure(int rc);

/* Starts degraded (the start-up check failed with code rc) or healthy. */
void health_init(store_health *h, int rc, uint64_t now_ms);

/* Records the outcome rc of a call on algorithm alg that reached the store:
 * TG_OK, a failure (health_is_failure), or TG_EFULL; other codes (bad
 * input, a corrupt key) say nothing about the store and are ignored. */
void health_note(store_health *h, int rc, tg_algorithm alg, uint64_t now_ms);

/* Prints to f what the log does not say yet, if a line is allowed now.
 * `store` names the store in the lines ("redis 127.0.0.1:6379"), `policy`
 * what degraded requests get ("open"). Cheap when there is nothing to say:
 * the event loop calls it every turn. */
void health_log(store_health *h, uint64_t now_ms, FILE *f, const char *store,
                const char *policy, uint64_t capacity);

#endif
