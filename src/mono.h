/* SPDX-License-Identifier: MIT */
/*
 * mono.h - CLOCK_MONOTONIC in nanoseconds and milliseconds: the clock of
 * every internal deadline (lock waits, a Redis node's backoff, a policy
 * waiting out a Cluster migration), never of a decision (those read the
 * limiter's clock).
 */
#ifndef TG_MONO_H
#define TG_MONO_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tg__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tg__mono_ms(void) { return tg__mono_ns() / 1000000u; }

#endif /* TG_MONO_H */
