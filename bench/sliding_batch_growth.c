/* SPDX-License-Identifier: MIT */
/*
 * sliding_batch_growth.c - tg_hit_batch of 16 over 1M sliding-window keys
 * (8-entry logs), with the logs at their cap or still growing: what a log
 * that moves up to a larger block costs (see BENCHMARKS.md, "Memory that
 * follows the keys").
 *
 *   cc -O2 -DTG_STATIC -Iinclude bench/sliding_batch_growth.c \
 *      build/release/libtollgate.a -lhiredis -lpthread -o /tmp/sbg
 *   /tmp/sbg FILL
 *
 * FILL hits every key that many times first, a microsecond apart: 10 fills
 * every log to its cap of 8 (no log moves while measuring), 1 leaves one
 * entry each, so the measured calls keep moving logs up. Prints the median
 * and fastest of 5 repetitions of 400,000 items, in ns per item.
 */
#include "tollgate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KEYS (1u << 20)
#define KEY_LEN 24

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = UINT64_C(88172645463325252);
static uint64_t xorshift(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

int main(int argc, char **argv) {
  int fill = argc > 1 ? atoi(argv[1]) : 10;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_SLIDING_WINDOW;
  cfg.capacity = KEYS + KEYS / 16;
  cfg.sliding_max_entries = 8;
  cfg.clean_period_ms = 0;
  tg_limiter *lim = NULL;
  char *keys = malloc((size_t)KEYS * KEY_LEN);
  if (!keys || tg_limiter_new(&lim, &cfg) != 0)
    return 1;
  for (uint32_t i = 0; i < KEYS; i++)
    snprintf(keys + (size_t)i * KEY_LEN, KEY_LEN, "key-%019u", i);
  const tg_quota q = {.limit = 1000000, .period_ms = 3600000};
  uint64_t t = 1000000;
  tg_result r;
  for (int f = 0; f < fill; f++)
    for (uint32_t i = 0; i < KEYS; i++)
      (void)tg_hit_at(lim, t++, keys + (size_t)i * KEY_LEN, KEY_LEN, &q, 1, &r);
  tg_batch_item items[16];
  double ns[5];
  const uint32_t ops = 400000;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now_ns();
    for (uint32_t o = 0; o < ops; o += 16) {
      for (int j = 0; j < 16; j++) {
        uint32_t k = (uint32_t)(xorshift() % KEYS);
        items[j] =
            (tg_batch_item){keys + (size_t)k * KEY_LEN, KEY_LEN, &q, 1, 0, {0}};
      }
      (void)tg_hit_batch_at(lim, t++, items, 16);
    }
    ns[rep] = (now_ns() - t0) / ops;
  }
  for (int a = 0; a < 5; a++)
    for (int b = a + 1; b < 5; b++)
      if (ns[b] < ns[a]) {
        double x = ns[a];
        ns[a] = ns[b];
        ns[b] = x;
      }
  printf("fill=%d batch16 ns_per_item median=%.1f min=%.1f\n", fill, ns[2],
         ns[0]);
  tg_limiter_destroy(lim);
  free(keys);
  return 0;
}
