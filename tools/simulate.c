/* SPDX-License-Identifier: MIT */
/*
 * simulate.c - the traffic patterns and their replay (see simulate.h).
 *
 * "Worst admitted in any period-long interval" is the number that tells the
 * algorithms apart: a sliding log never lets it pass the limit, a fixed
 * window lets it reach twice the limit across a boundary, a bucket lets it
 * reach burst + limit. It is computed per key, from the admitted requests
 * only, with two pointers over each key's requests in time order.
 */
#include "simulate.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 2025-01-01 00:00:00 UTC in ms: the simulated clock starts at the first
 * multiple of the period from here on. */
#define SIM_BASE_MS UINT64_C(1735689600000)

static const char *const NAMES[SIM_PATTERN_COUNT] = {"steady", "bursty",
                                                     "boundary", "many_keys"};
static const char *const ABOUT[SIM_PATTERN_COUNT] = {
    "one key, requests evenly spaced at twice the allowed rate",
    "one key, every 2 periods a burst of 2 x limit requests within 1/10 of "
    "a period",
    "one key, every 2 periods limit requests just before a fixed-window "
    "boundary and limit just after it",
    "many keys, random arrivals at 1.5 x the allowed rate per key",
};

const char *sim_pattern_name(sim_pattern p) {
  return (unsigned)p < SIM_PATTERN_COUNT ? NAMES[p] : "unknown";
}

const char *sim_pattern_about(sim_pattern p) {
  return (unsigned)p < SIM_PATTERN_COUNT ? ABOUT[p] : "unknown";
}

int sim_parse_pattern(const char *name, sim_pattern *p) {
  for (int i = 0; i < SIM_PATTERN_COUNT; i++)
    if (strcmp(name, NAMES[i]) == 0) {
      *p = (sim_pattern)i;
      return 0;
    }
  return -1;
}

/* splitmix64: reproducible from the seed. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static int by_time(const void *a, const void *b) {
  const sim_event *x = a, *y = b;
  if (x->t_us != y->t_us)
    return x->t_us < y->t_us ? -1 : 1;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* Appends n requests for key 0 evenly spread over [start, start + span). */
static void spread(sim_event *ev, size_t *at, uint64_t n, uint64_t start,
                   uint64_t span) {
  for (uint64_t i = 0; i < n; i++) {
    /* span * i can pass 2^64 on a long run: multiply in 128 bits */
    __extension__ unsigned __int128 off = (unsigned __int128)span * i / n;
    ev[*at].t_us = start + (uint64_t)off;
    ev[*at].key = 0;
    (*at)++;
  }
}

/* How many requests the pattern sends, to size the array; false if the
 * count does not even fit 64 bits. */
static bool count_events(const sim_params *p, uint64_t limit, uint64_t *n) {
  uint64_t periods = p->periods, x, twice;
  if (__builtin_mul_overflow(limit, 2, &twice))
    return false;
  switch (p->pattern) {
  case SIM_STEADY:
    return !__builtin_mul_overflow(periods, twice, n);
  case SIM_BURSTY:
    return !__builtin_mul_overflow((periods + 1) / 2, twice, n);
  case SIM_BOUNDARY:
    return !__builtin_mul_overflow(periods / 2, twice, n);
  case SIM_MANY_KEYS:
    /* 1.5 x limit per period per key */
    return !__builtin_mul_overflow(periods, limit, &x) &&
           !__builtin_mul_overflow(x, (uint64_t)p->keys, &x) &&
           !__builtin_add_overflow(x, x / 2, n);
  }
  *n = 0;
  return true;
}

int sim_check(const sim_params *p, uint64_t *n_out, char *why, size_t cap) {
  const tg_quota *q = &p->quota;
  uint64_t n = 0;
  char scratch[8];
  if (!why || cap == 0) {
    why = scratch;
    cap = sizeof scratch;
  }
  why[0] = '\0';
  if (n_out)
    *n_out = 0;
  if (q->limit == 0 || q->period_ms == 0 || q->period_ms > TG_PERIOD_MAX_MS) {
    snprintf(why, cap,
             "the quota needs a limit >= 1 and a period of 1 to %" PRIu64 " ms",
             TG_PERIOD_MAX_MS);
    return TG_EQUOTA;
  }
  if ((unsigned)p->pattern >= SIM_PATTERN_COUNT) {
    snprintf(why, cap, "unknown pattern");
    return TG_EINVAL;
  }
  if (p->periods == 0 || (p->pattern == SIM_MANY_KEYS && p->keys == 0)) {
    snprintf(why, cap, "the traffic needs at least one period and one key");
    return TG_EINVAL;
  }
  if (p->pattern == SIM_BOUNDARY && p->periods < 2) {
    snprintf(why, cap,
             "the boundary pattern needs --periods 2 or more (it "
             "aims at the boundary between two windows)");
    return TG_EINVAL;
  }
  /* the simulated clock must stay below TG_NOW_MAX_US */
  uint64_t span_max_ms = (TG_NOW_MAX_US / 1000u - SIM_BASE_MS) / 4;
  if (q->period_ms > span_max_ms / p->periods) {
    snprintf(why, cap,
             "--period-ms %" PRIu64 " x --periods %" PRIu64
             " runs the simulated clock past what tollgate accepts: keep "
             "the product below %" PRIu64 " ms",
             q->period_ms, p->periods, span_max_ms);
    return TG_EINVAL;
  }
  if (!count_events(p, q->limit, &n) || n > SIM_MAX_EVENTS) {
    char count[32];
    if (n > SIM_MAX_EVENTS)
      snprintf(count, sizeof count, "%" PRIu64, n);
    else
      snprintf(count, sizeof count, "more than 2^64");
    snprintf(why, cap,
             "this traffic would send %s requests, and the most "
             "one simulation sends is %" PRIu64 " (SIM_MAX_EVENTS): lower "
             "--limit (%" PRIu64 "), --periods (%" PRIu64 ")%s",
             count, SIM_MAX_EVENTS, q->limit, p->periods,
             p->pattern == SIM_MANY_KEYS ? " or --keys" : "");
    return TG_EINVAL;
  }
  /* every algorithm must take the quota (a bucket's tolerance, burst x
   * its emission interval, has its own bound), before any run, so no
   * table is left half made */
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    int rc = tg_quota_check((tg_algorithm)a, q);
    if (rc == TG_EQUOTA) {
      /* the header's two bucket bounds: a rate above one per ns, else a
       * tolerance (burst x T) above about 126 years */
      bool rate = q->period_ms <= UINT64_MAX / 1000000u &&
                  q->limit > q->period_ms * 1000000u;
      snprintf(why, cap,
               "%s refuses this quota (--limit %" PRIu64 ", --period-ms "
               "%" PRIu64 ", --burst %" PRIu64 "): %s; %s",
               tg_algorithm_name((tg_algorithm)a), q->limit, q->period_ms,
               q->burst, tg_strerror(rc),
               rate ? "a bucket's rate must stay at or below one per "
                      "nanosecond (limit <= period_ms x 10^6)"
                    : "a bucket's burst x period_ms / limit must stay "
                      "within about 126 years");
      return TG_EQUOTA;
    }
  }
  if (n_out)
    *n_out = n;
  return TG_OK;
}

int sim_generate(const sim_params *p, sim_traffic *out) {
  memset(out, 0, sizeof *out);
  const tg_quota *q = &p->quota;
  uint64_t n;
  int rc = sim_check(p, &n, NULL, 0);
  if (rc != TG_OK)
    return rc;
  uint64_t keys = p->pattern == SIM_MANY_KEYS ? p->keys : 1;
  uint64_t period = q->period_ms * 1000u; /* us */
  uint64_t duration = period * p->periods;
  sim_event *ev = malloc((size_t)(n ? n : 1) * sizeof *ev);
  if (!ev)
    return TG_ENOMEM;
  size_t at = 0;
  switch (p->pattern) {
  case SIM_STEADY:
    spread(ev, &at, n, 0, duration);
    break;
  case SIM_BURSTY:
    for (uint64_t k = 0; k < p->periods; k += 2)
      spread(ev, &at, 2 * q->limit, k * period + period / 2, period / 10);
    break;
  case SIM_BOUNDARY:
    for (uint64_t k = 0; k + 1 < p->periods; k += 2) {
      uint64_t edge = (k + 1) * period; /* a fixed-window boundary */
      spread(ev, &at, q->limit, edge - period / 20, period / 20);
      spread(ev, &at, q->limit, edge, period / 20);
    }
    break;
  case SIM_MANY_KEYS: {
    /* n arrivals at uniformly random times (a Poisson process, given n) */
    uint64_t seed = p->seed;
    for (uint64_t i = 0; i < n; i++) {
      ev[at].t_us = rng_next(&seed) % duration;
      ev[at].key = (uint32_t)(rng_next(&seed) % keys);
      at++;
    }
    qsort(ev, at, sizeof *ev, by_time);
    break;
  }
  }
  out->ev = ev;
  out->n = at;
  out->duration_us = duration;
  out->keys = (uint32_t)keys;
  out->t0_us =
      ((SIM_BASE_MS + q->period_ms - 1) / q->period_ms) * q->period_ms * 1000u;
  return TG_OK;
}

void sim_traffic_free(sim_traffic *t) {
  free(t->ev);
  memset(t, 0, sizeof *t);
}

/* Fills r->worst, worst_key and worst_start_us from r->allowed. */
static int find_worst(const sim_params *p, const sim_traffic *t, sim_run *r) {
  /* the admitted requests grouped by key, each group in time order: a
   * counting sort by key keeps the time order within a key */
  size_t *start = calloc((size_t)t->keys + 1, sizeof *start);
  size_t *order =
      malloc((r->admitted ? (size_t)r->admitted : 1) * sizeof *order);
  if (!start || !order) {
    free(start);
    free(order);
    return TG_ENOMEM;
  }
  for (size_t i = 0; i < t->n; i++)
    if (r->allowed[i])
      start[t->ev[i].key + 1]++;
  for (uint32_t k = 0; k < t->keys; k++)
    start[k + 1] += start[k];
  size_t *fill = calloc((size_t)t->keys, sizeof *fill);
  if (!fill) {
    free(start);
    free(order);
    return TG_ENOMEM;
  }
  for (size_t i = 0; i < t->n; i++)
    if (r->allowed[i]) {
      uint32_t k = t->ev[i].key;
      order[start[k] + fill[k]++] = i;
    }
  uint64_t period = p->quota.period_ms * 1000u;
  r->worst = 0;
  r->worst_key = 0;
  r->worst_start_us = 0;
  for (uint32_t k = 0; k < t->keys; k++) {
    size_t lo = start[k];
    for (size_t hi = start[k]; hi < start[k + 1]; hi++) {
      uint64_t th = t->ev[order[hi]].t_us;
      while (th - t->ev[order[lo]].t_us >= period)
        lo++;
      uint64_t count = (uint64_t)(hi - lo + 1);
      if (count > r->worst) {
        r->worst = count;
        r->worst_key = k;
        r->worst_start_us = t->ev[order[lo]].t_us;
      }
    }
  }
  free(start);
  free(order);
  free(fill);
  return TG_OK;
}

int sim_replay(const sim_params *p, const sim_traffic *t, tg_algorithm alg,
               sim_run *out) {
  memset(out, 0, sizeof *out);
  out->alg = alg;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.clean_period_ms = 0; /* the replay is the only user: no thread */
  cfg.capacity = t->keys < 512 ? 1024 : (uint64_t)t->keys * 2;
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK)
    return rc;
  out->allowed = malloc(t->n ? t->n : 1);
  if (!out->allowed) {
    tg_limiter_destroy(lim);
    return TG_ENOMEM;
  }
  for (size_t i = 0; i < t->n; i++) {
    char key[16];
    int len = snprintf(key, sizeof key, "k%" PRIu32, t->ev[i].key);
    tg_result r;
    rc = tg_hit_at(lim, t->t0_us + t->ev[i].t_us, key, (size_t)len, &p->quota,
                   1, &r);
    if (rc != TG_OK) {
      tg_limiter_destroy(lim);
      sim_run_free(out);
      return rc;
    }
    out->allowed[i] = r.allowed ? 1 : 0;
    if (r.allowed)
      out->admitted++;
    else
      out->denied++;
    if (p->progress && (i & 0xffffu) == 0xffffu)
      p->progress(p->progress_ctx, alg, i + 1, t->n);
  }
  if (p->progress)
    p->progress(p->progress_ctx, alg, t->n, t->n);
  tg_limiter_destroy(lim);
  rc = find_worst(p, t, out);
  if (rc != TG_OK)
    sim_run_free(out);
  return rc;
}

void sim_run_free(sim_run *r) {
  free(r->allowed);
  r->allowed = NULL;
}
