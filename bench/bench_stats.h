/* SPDX-License-Identifier: MIT */
/*
 * bench_stats.h - the timing and the one statistic every benchmark program
 * here reports (tollgate_bench, shm_bench, redis_bench), so their figures
 * mean the same thing and can be read side by side.
 *
 * Time is CLOCK_MONOTONIC wall time: what a caller waits, immune to clock
 * steps. A figure is the MEDIAN of its repetitions: unlike the mean, one run
 * disturbed by another load on a shared host barely moves it, and unlike the
 * fastest run, it does not reward the one lucky repetition. With an even
 * number of repetitions it is the mean of the two middle ones. The fastest
 * run is printed beside it where a program shows a spread.
 *
 * Header-only: each benchmark is one program built from one file plus this.
 */
#ifndef TG_BENCH_STATS_H
#define TG_BENCH_STATS_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns. */
static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in seconds. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v[0..n) ascending. */
static inline void bench_sort(double *v, size_t n) {
  qsort(v, n, sizeof *v, bench_cmp_double);
}

/* The median of v[0..n), n >= 1; sorts v in place (v[0] is then the
 * smallest, v[n - 1] the largest). */
static inline double bench_median(double *v, int n) {
  bench_sort(v, (size_t)n);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif /* TG_BENCH_STATS_H */
