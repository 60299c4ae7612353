/* SPDX-License-Identifier: MIT */
/*
 * health.c - the store's health as `tollgate serve` sees it, and its log
 * (see health.h).
 */
#include "health.h"

#include <inttypes.h>

bool health_is_failure(int rc) {
  return rc == TG_ECONNECT || rc == TG_ETIMEDOUT || rc == TG_ESTORE ||
         rc == TG_EBUSY || rc == TG_ENOMEM;
}

void health_init(store_health *h, int rc, uint64_t now_ms) {
  *h = (store_health){0};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    h->alg[a].since_ms = now_ms;
  if (health_is_failure(rc)) {
    h->start_failed = true;
    h->start_reason = rc;
  }
}

void health_note(store_health *h, int rc, tg_algorithm alg, uint64_t now_ms) {
  if ((unsigned)alg >= TG_ALGORITHM_COUNT)
    return;
  alg_health *a = &h->alg[alg];
  if (rc == TG_OK) {
    if (h->start_failed) {
      h->start_failed = false;
      h->start_recovered = true;
    }
    if (a->degraded && now_ms - a->last_failure_ms >= HEALTH_QUIET_MS) {
      a->degraded = false;
      a->since_ms = now_ms;
      a->transitions++;
    }
  } else if (health_is_failure(rc)) {
    if (!a->degraded) {
      a->degraded = true;
      a->since_ms = now_ms;
      a->failed = 0;
      a->transitions++;
    }
    a->reason = rc;
    a->last_failure_ms = now_ms;
    a->failed++;
    if (h->start_failed) { /* the start-up message said it already */
      a->logged_degraded = true;
      a->logged_transitions = a->transitions;
    }
  } else if (rc == TG_EFULL) {
    a->full++;
  }
}

bool health_degraded(const store_health *h, int *reason, unsigned *algs) {
  bool any = h->start_failed;
  uint64_t latest = 0;
  *reason = h->start_failed ? h->start_reason : TG_OK;
  if (algs)
    *algs = 0;
  for (int i = 0; i < TG_ALGORITHM_COUNT; i++) {
    const alg_health *a = &h->alg[i];
    if (!a->degraded)
      continue;
    if (!any || a->last_failure_ms >= latest) {
      latest = a->last_failure_ms;
      *reason = a->reason;
    }
    any = true;
    if (algs)
      *algs |= 1u << i;
  }
  return any;
}

static void log_full(alg_health *a, const char *name, uint64_t now_ms, FILE *f,
                     const char *policy, uint64_t capacity) {
  uint64_t n = a->full - a->full_logged;
  if (n == 0 ||
      (a->full_line_ms != 0 && now_ms - a->full_line_ms < HEALTH_FULL_MS))
    return;
  fprintf(f,
          "tollgate serve: warning: the %s table is full (%" PRIu64
          " keys): %" PRIu64
          " request(s) for new keys answered by --on-failure %s; raise "
          "--capacity, or bound what clients may create "
          "(--max-period-ms, --max-new-keys-per-client)\n",
          name, capacity, n, policy);
  a->full_logged = a->full;
  a->full_line_ms = now_ms;
}

static void log_state(alg_health *a, const char *name, uint64_t now_ms, FILE *f,
                      const char *store, const char *policy) {
  if (a->degraded == a->logged_degraded &&
      a->transitions == a->logged_transitions)
    return;
  if (a->ever_logged && now_ms - a->last_line_ms < HEALTH_QUIET_MS)
    return;
  /* changes folded into this line beyond the one it reports: a round trip
   * back to the state the log already says counts two */
  uint64_t folded = a->transitions - a->logged_transitions;
  folded -= a->degraded != a->logged_degraded ? 1 : 0;
  char extra[80] = "";
  if (folded > 0)
    snprintf(extra, sizeof extra,
             " (%" PRIu64 " more changes since the last line)", folded);
  if (a->degraded)
    fprintf(f,
            "tollgate serve: store %s degraded: %s (%s) on %s; requests "
            "that need it are answered by --on-failure %s%s\n",
            store, tg_err_name(a->reason), tg_strerror(a->reason), name, policy,
            extra);
  else
    fprintf(f,
            "tollgate serve: store %s healthy again on %s after %" PRIu64
            " failed request(s)%s\n",
            store, name, a->failed, extra);
  fflush(f);
  a->logged_degraded = a->degraded;
  a->logged_transitions = a->transitions;
  a->last_line_ms = now_ms;
  a->ever_logged = true;
}

void health_log(store_health *h, uint64_t now_ms, FILE *f, const char *store,
                const char *policy, uint64_t capacity) {
  if (h->start_recovered) {
    fprintf(f, "tollgate serve: store %s answers now\n", store);
    fflush(f);
    h->start_recovered = false;
  }
  for (int i = 0; i < TG_ALGORITHM_COUNT; i++) {
    alg_health *a = &h->alg[i];
    const char *name = tg_algorithm_name((tg_algorithm)i);
    if (a->full != a->full_logged)
      log_full(a, name, now_ms, f, policy, capacity);
    log_state(a, name, now_ms, f, store, policy);
  }
}
