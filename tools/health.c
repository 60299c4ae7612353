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
  h->since_ms = now_ms;
  if (health_is_failure(rc)) {
    h->degraded = true;
    h->reason = rc;
    /* the start-up message said so already */
    h->logged_degraded = true;
    h->ever_logged = true;
    h->last_line_ms = now_ms;
  }
}

void health_note(store_health *h, int rc, tg_algorithm alg, uint64_t now_ms) {
  if (rc == TG_OK) {
    if (h->degraded) {
      h->degraded = false;
      h->since_ms = now_ms;
      h->transitions++;
    }
  } else if (health_is_failure(rc)) {
    if (!h->degraded) {
      h->degraded = true;
      h->since_ms = now_ms;
      h->failed = 0;
      h->transitions++;
    }
    h->reason = rc;
    h->alg = alg;
    h->failed++;
  } else if (rc == TG_EFULL && (unsigned)alg < TG_ALGORITHM_COUNT) {
    h->full[alg]++;
  }
}

static void log_full(store_health *h, uint64_t now_ms, FILE *f,
                     const char *policy, uint64_t capacity) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    uint64_t n = h->full[a] - h->full_logged[a];
    if (n == 0 || (h->full_line_ms[a] != 0 &&
                   now_ms - h->full_line_ms[a] < HEALTH_FULL_MS))
      continue;
    fprintf(f,
            "tollgate serve: warning: the %s table is full (%" PRIu64
            " keys): %" PRIu64
            " request(s) for new keys answered by --on-failure %s; raise "
            "--capacity, or bound what clients may create "
            "(--max-period-ms, --max-new-keys-per-client)\n",
            tg_algorithm_name((tg_algorithm)a), capacity, n, policy);
    h->full_logged[a] = h->full[a];
    h->full_line_ms[a] = now_ms;
  }
}

void health_log(store_health *h, uint64_t now_ms, FILE *f, const char *store,
                const char *policy, uint64_t capacity) {
  bool full = false;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    full |= h->full[a] != h->full_logged[a];
  if (full)
    log_full(h, now_ms, f, policy, capacity);
  if (h->degraded == h->logged_degraded &&
      h->transitions == h->logged_transitions)
    return;
  if (h->ever_logged && now_ms - h->last_line_ms < HEALTH_LINE_MS)
    return;
  /* transitions folded into this line beyond the one it reports: a round
   * trip back to the state the log already says counts two */
  uint64_t folded = h->transitions - h->logged_transitions;
  folded -= h->degraded != h->logged_degraded ? 1 : 0;
  char extra[96] = "";
  if (folded > 0)
    snprintf(extra, sizeof extra,
             " (%" PRIu64 " more changes since the last line)", folded);
  if (h->degraded)
    fprintf(f,
            "tollgate serve: store %s degraded: %s (%s) on %s; requests "
            "that need it are answered by --on-failure %s%s\n",
            store, tg_err_name(h->reason), tg_strerror(h->reason),
            tg_algorithm_name(h->alg), policy, extra);
  else
    fprintf(f,
            "tollgate serve: store %s healthy again (%" PRIu64
            " failed request(s) in the last degraded spell)%s\n",
            store, h->failed, extra);
  fflush(f);
  h->logged_degraded = h->degraded;
  h->logged_transitions = h->transitions;
  h->last_line_ms = now_ms;
  h->ever_logged = true;
}
