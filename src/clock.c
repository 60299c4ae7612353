/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the built-in clocks: microseconds since the Unix epoch.
 *
 * A clock read costs several times a decision, so callers on a hot path can
 * pass their own now (the *_at operations) or choose the coarse clock.
 */
#include "tollgate.h"

#include "atomic.h"

#include <time.h>

static uint64_t read_us(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts) != 0 || ts.tv_sec < 0)
    return 0; /* cannot happen on Linux for these clocks; 0 is "1970" */
  return (uint64_t)ts.tv_sec * UINT64_C(1000000) + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t tg_clock_realtime(void *ctx) {
  (void)ctx;
  return read_us(CLOCK_REALTIME);
}

uint64_t tg_clock_coarse(void *ctx) {
  (void)ctx;
  return read_us(CLOCK_REALTIME_COARSE);
}

uint64_t tg_clock_latest(uint64_t *latest, uint64_t now_us) {
  if (latest == NULL)
    return now_us;
  uint64_t seen = tg__load_relaxed(latest);
  for (;;) {
    bool stepped_back = seen > now_us && seen - now_us > TG_CLOCK_LEAD_MAX_US;
    if (seen >= now_us && !stepped_back)
      return seen;
    /* now_us is ahead of the word, or the word is a clock that stepped back
     * (or damaged): start again from now. seen is reloaded when another
     * caller moved the word first. */
    if (tg__cas64(latest, &seen, now_us))
      return now_us;
  }
}
