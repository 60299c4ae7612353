/* SPDX-License-Identifier: MIT */
/*
 * insn_decision.c - N decisions on one hot key, for counting instructions
 * per decision with callgrind (bench/insn_ab.sh): instruction counts do not
 * move with the load of a shared machine, wall-clock times do.
 *
 *   insn_decision ALGORITHM N [SHM]
 *
 * ALGORITHM is the tg_algorithm's number, N the decisions, SHM 1 for a
 * shared-memory limiter (a private segment, removed at the end). The quota
 * admits every call (a billion per hour), so every decision writes, and
 * the time advances a microsecond a call, so a sliding log fills.
 * Only the public API is used, so any version of the library links it.
 */
#include <tollgate.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: insn_decision ALGORITHM N [SHM]\n");
    return 2;
  }
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = (tg_algorithm)atoi(argv[1]);
  cfg.capacity = 4096;
  cfg.clean_period_ms = 0;
  long n = atol(argv[2]);
  char name[64];
  if (argc > 3 && atoi(argv[3])) {
    snprintf(name, sizeof name, "/tg-insn-%ld", (long)getpid());
    cfg.shm_name = name;
  }
  tg_limiter *lim;
  if (tg_limiter_new(&lim, &cfg) != TG_OK) {
    fprintf(stderr, "insn_decision: no limiter\n");
    return 1;
  }
  const tg_quota q = {1000000000, 3600000, 1000000000};
  unsigned long allowed = 0;
  for (long i = 0; i < n; i++) {
    tg_result r;
    tg_hit_at(lim, UINT64_C(1700000000000000) + (uint64_t)i, "hotkey", 6, &q, 1,
              &r);
    allowed += r.allowed;
  }
  tg_limiter_destroy(lim);
  if (cfg.shm_name)
    tg_shm_unlink(cfg.shm_name);
  printf("%lu\n", allowed);
  return allowed == (unsigned long)n ? 0 : 1;
}
