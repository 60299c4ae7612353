/* SPDX-License-Identifier: MIT */
/*
 * simulate.h - traffic patterns replayed through the algorithms on a
 * simulated clock: the engine behind `tollgate simulate`, kept apart from
 * its command line and its drawing so tests can check its numbers
 * (tests/test_simulate.c).
 *
 * A pattern generates a list of requests (time, key; each costs 1). Every
 * algorithm then answers the same list through its own fresh limiter with
 * tg_hit_at, so the only difference between two runs is the algorithm. The
 * simulated clock starts on a boundary of the epoch-aligned fixed windows,
 * which is where the window-boundary attack aims.
 */
#ifndef TG_TOOLS_SIMULATE_H
#define TG_TOOLS_SIMULATE_H

#include "tollgate.h"

#include <stddef.h>
#include <stdint.h>

typedef enum sim_pattern {
  SIM_STEADY,   /* one key, evenly spaced requests at twice the rate */
  SIM_BURSTY,   /* one key, every 2 periods a burst of 2 x limit requests
                   within a tenth of a period, mid-window */
  SIM_BOUNDARY, /* one key, every 2 periods limit requests in the last
                   twentieth of a fixed window and limit more in the first
                   twentieth of the next: the window-boundary attack */
  SIM_MANY_KEYS /* `keys` keys, random arrivals at 1.5 times the rate each,
                   each request for a key drawn uniformly */
} sim_pattern;
#define SIM_PATTERN_COUNT 4

/* Most requests one simulation may generate. */
#define SIM_MAX_EVENTS (UINT64_C(20000000))

/* "steady", "bursty", "boundary", "many_keys"; "unknown" otherwise. */
const char *sim_pattern_name(sim_pattern p);
/* One line saying what the pattern sends. */
const char *sim_pattern_about(sim_pattern p);
/* Parses a pattern name; 0 and *p set, or -1. */
int sim_parse_pattern(const char *name, sim_pattern *p);

/* Told how far a replay has got: `done` of `total` requests answered by
 * algorithm alg (every 65536 requests, and once at the end). */
typedef void (*sim_progress_fn)(void *ctx, tg_algorithm alg, size_t done,
                                size_t total);

typedef struct sim_params {
  sim_pattern pattern;
  tg_quota quota;   /* the quota every request is checked against */
  uint64_t periods; /* how long the traffic lasts, in periods (>= 1) */
  uint32_t keys;    /* SIM_MANY_KEYS: distinct keys (>= 1); others use 1 */
  uint64_t seed;    /* SIM_MANY_KEYS: random arrivals, reproducible */
  sim_progress_fn progress; /* NULL: none */
  void *progress_ctx;
} sim_params;

/* Checks that p can be laid out and counts its requests into *n (may be
 * NULL). Returns what sim_generate would (TG_OK, TG_EQUOTA, TG_EINVAL) and,
 * on an error, writes into why (cap bytes; may be NULL) a sentence naming
 * the option and the limit at fault, with their values. */
int sim_check(const sim_params *p, uint64_t *n, char *why, size_t cap);

typedef struct sim_event {
  uint64_t t_us; /* since the start of the simulation */
  uint32_t key;  /* 0..keys-1 */
} sim_event;

typedef struct sim_traffic {
  sim_event *ev; /* sorted by time */
  size_t n;
  uint64_t duration_us; /* periods x period */
  uint32_t keys;        /* distinct keys the events use */
  uint64_t t0_us;       /* realtime of simulated time 0: a multiple of the
                           period, in 2025 or just after */
} sim_traffic;

/* Generates the pattern's requests. Returns TG_OK, TG_EQUOTA for a quota
 * the pattern cannot be laid out with (a period shorter than the pattern's
 * spacing allows is still fine: requests then share a microsecond),
 * TG_EINVAL for more than SIM_MAX_EVENTS requests or bad params, TG_ENOMEM. */
int sim_generate(const sim_params *p, sim_traffic *out);
void sim_traffic_free(sim_traffic *t);

/* One algorithm's answers to a traffic. */
typedef struct sim_run {
  tg_algorithm alg;
  unsigned char *allowed; /* per event: 1 admitted, 0 denied */
  uint64_t admitted, denied;
  uint64_t worst;          /* most requests admitted for one key within any
                              half-open interval one period long */
  uint32_t worst_key;      /* the key (the lowest, among equals) */
  uint64_t worst_start_us; /* where its interval starts (its first admit) */
} sim_run;

/* Replays t through a fresh limiter of algorithm alg with p->quota.
 * Returns TG_OK, or the library's code (a limiter that cannot be created,
 * an answer that is an error). */
int sim_replay(const sim_params *p, const sim_traffic *t, tg_algorithm alg,
               sim_run *out);
void sim_run_free(sim_run *r);

#endif
