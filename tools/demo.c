/* SPDX-License-Identifier: MIT */
/*
 * demo.c - `tollgate demo`: it replays one realistic scenario
 * (photo uploads limited to 3 per minute per user; alice bursty, bob steady)
 * through each of the five algorithms and prints every decision, so a reader
 * can see side by side how they differ: what a cost of 2 and a peek do, what a
 * denial costs, and how a burst straddling a minute boundary gets 6 uploads
 * through a fixed window but only 3 through the sliding log. Time comes from a
 * simulated clock passed to tg_hit_at, so the output is the same on every run.
 * The program uses only the public API, as any other caller would (and the
 * server's algorithm-name parser, so names are read the same way as there).
 */
#include "cli.h"
#include "commands.h"
#include "tollgate.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The simulated clock starts at 2025-01-01 00:00:00 UTC, a minute boundary,
 * so the epoch-aligned fixed windows are [0, 60 s), [60 s, 120 s), ... */
#define DEMO_T0_US UINT64_C(1735689600000000)
#define PERIOD_MS UINT64_C(60000)

static const char *const USERS[] = {"alice", "bob"};
#define USER_COUNT 2

/* Which algorithms a note is true of: a note that explains one algorithm's
 * answer would mislead beside another's. */
#define ALL 0u
#define ONLY(alg) (1u << (alg))

/* One call of the scenario. */
typedef struct event {
  uint32_t t_ms;    /* ms since DEMO_T0_US */
  unsigned user;    /* index into USERS; the user name is the key */
  uint64_t cost;    /* photos uploaded by this call; 0 is a peek */
  const char *note; /* printed at the end of the line */
  unsigned where;   /* ALL, or the ONLY() algorithms the note applies to */
} event;

static const event EVENTS[] = {
    {0, 0, 2, "album of 2 photos (cost 2)", ALL},
    {1000, 0, 1, "", ALL},
    {2000, 0, 1, "4th photo in 2 s", ALL},
    {3000, 0, 0, "peek (cost 0): look, consume nothing", ALL},
    {5000, 1, 1, "bob: one photo every 20 s", ALL},
    {25000, 1, 1, "", ALL},
    {30000, 0, 1, "", ALL},
    {45000, 1, 1, "", ALL},
    {65000, 1, 1, "", ALL},
    {85000, 1, 1, "", ALL},
    {105000, 1, 1, "", ALL},
    {119000, 0, 1, "burst across the 120 s boundary", ALL},
    {119400, 0, 1, "", ALL},
    {119800, 0, 1, "", ALL},
    {120200, 0, 1, "new fixed window starts at 120 s", ONLY(TG_FIXED_WINDOW)},
    {120600, 0, 1, "", ALL},
    {121000, 0, 1, "", ALL},
    {125000, 1, 1, "", ALL},
};
#define EVENT_COUNT (sizeof EVENTS / sizeof EVENTS[0])

/* One line per algorithm, indexed by tg_algorithm. */
static const char *const EXPLAIN[TG_ALGORITHM_COUNT] = {
    "minutes aligned to the clock; count = uploads this minute; a denied "
    "call is still counted",
    "each user's minute starts at their first upload after the last one "
    "ended; denied calls are counted",
    "log of admitted uploads: never more than 3 in any 60 s; denied calls "
    "are not recorded",
    "3 tokens, one back every 20 s; count = tokens left; a denied call "
    "changes nothing",
    "holds 3, drains one every 20 s; count = level after the call; a denied "
    "call changes nothing",
};

/* What the summary table shows for one algorithm. */
typedef struct tally {
  unsigned admitted, denied;  /* calls with cost > 0; peeks are not counted */
  uint64_t max60[USER_COUNT]; /* most photos admitted in any 60 s interval */
} tally;

static void usage(FILE *f) {
  fprintf(f, "usage: tollgate demo [--algorithm NAME]\n"
             "algorithms (in any case):");
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    fprintf(f, " %s", tg_algorithm_name((tg_algorithm)a));
  fprintf(f, "\n");
}

static void fail(const char *what, int rc) {
  fprintf(stderr, "tollgate: %s: %s (%s)\n", what, tg_strerror(rc),
          tg_err_name(rc));
}

/* Most photos of `user` admitted within any half-open interval of one period,
 * over the admitted calls of one run. */
static uint64_t max_in_period(const bool *admitted, unsigned user) {
  uint64_t best = 0;
  for (size_t i = 0; i < EVENT_COUNT; i++) {
    if (!admitted[i] || EVENTS[i].user != user)
      continue;
    uint64_t sum = 0;
    for (size_t j = i; j < EVENT_COUNT; j++)
      if (admitted[j] && EVENTS[j].user == user &&
          EVENTS[j].t_ms - EVENTS[i].t_ms < PERIOD_MS)
        sum += EVENTS[j].cost;
    if (sum > best)
      best = sum;
  }
  return best;
}

/* Replays EVENTS through a fresh limiter of algorithm alg, printing each
 * decision. Returns 0 or the first TG_E* code (already reported). */
static int run_algorithm(tg_algorithm alg, tally *t) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    fail("tg_limiter_new", rc);
    return rc;
  }
  const tg_quota q = {.limit = 3, .period_ms = PERIOD_MS, .burst = 0};
  bool admitted[EVENT_COUNT] = {false};
  *t = (tally){0};

  printf("== %s: %s\n", tg_algorithm_name(alg), EXPLAIN[alg]);
  printf("%9s  %-5s  %4s  %-8s  %5s  %9s  %14s  %14s\n", "time s", "user",
         "cost", "decision", "count", "remaining", "retry_after_ms",
         "reset_after_ms");
  for (size_t i = 0; i < EVENT_COUNT; i++) {
    const event *e = &EVENTS[i];
    const char *user = USERS[e->user];
    tg_result r;
    rc = tg_hit_at(lim, DEMO_T0_US + (uint64_t)e->t_ms * 1000u, user,
                   strlen(user), &q, e->cost, &r);
    if (rc != TG_OK) {
      fail("tg_hit_at", rc);
      tg_limiter_destroy(lim);
      return rc;
    }
    const char *note = e->where == ALL || (e->where & ONLY(alg)) ? e->note : "";
    char retry[24];
    if (r.retry_after_ms == TG_NEVER)
      snprintf(retry, sizeof retry, "never");
    else
      snprintf(retry, sizeof retry, "%" PRIu64, r.retry_after_ms);
    printf("%5" PRIu32 ".%03" PRIu32 "  %-5s  %4" PRIu64 "  %-8s  %5" PRIu64
           "  %9" PRIu64 "  %14s  %14" PRIu64 "%s%s\n",
           e->t_ms / 1000, e->t_ms % 1000, user, e->cost,
           r.allowed ? "ALLOW" : "DENY", r.count, r.remaining, retry,
           r.reset_after_ms, *note ? "  " : "", note);
    if (e->cost == 0)
      continue;
    admitted[i] = r.allowed;
    if (r.allowed)
      t->admitted++;
    else
      t->denied++;
  }
  for (unsigned u = 0; u < USER_COUNT; u++)
    t->max60[u] = max_in_period(admitted, u);
  printf("\n");
  tg_limiter_destroy(lim);
  return TG_OK;
}

int cmd_demo(int argc, char **argv) {
  const char *only = NULL;
  for (int i = 0; i < argc; i++) {
    const char *bad = NULL;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strncmp(argv[i], "--algorithm=", 12) == 0)
      only = argv[i] + 12;
    else if (strcmp(argv[i], "--algorithm") != 0)
      bad = "unexpected argument";
    else if (i + 1 < argc)
      only = argv[++i];
    else
      bad = "missing NAME after";
    if (bad) {
      fprintf(stderr, "tollgate demo: %s '%s'\n", bad, argv[i]);
      usage(stderr);
      return 2;
    }
  }
  tg_algorithm chosen = TG_FIXED_WINDOW;
  if (only && cmd_parse_algorithm(only, strlen(only), &chosen) != 0) {
    fprintf(stderr, "tollgate demo: unknown algorithm '%s'\n", only);
    usage(stderr);
    return 2;
  }
  bool run[TG_ALGORITHM_COUNT];
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    run[a] = !only || (tg_algorithm)a == chosen;

  printf("tollgate %s demo: photo uploads, 3 per minute per user "
         "(quota limit 3, period_ms 60000, burst 0 = limit)\n"
         "simulated clock: time 0 = 2025-01-01 00:00:00 UTC, a minute "
         "boundary; alice is bursty, bob steady\n\n",
         tg_version_string());
  tally t[TG_ALGORITHM_COUNT];
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    if (run[a] && run_algorithm((tg_algorithm)a, &t[a]) != TG_OK)
      return 1;

  printf("== summary (calls with cost > 0; the peek is not counted)\n");
  printf("%-22s  %8s  %6s  %21s  %19s\n", "algorithm", "admitted", "denied",
         "alice max in any 60 s", "bob max in any 60 s");
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    if (run[a])
      printf("%-22s  %8u  %6u  %21" PRIu64 "  %19" PRIu64 "\n",
             tg_algorithm_name((tg_algorithm)a), t[a].admitted, t[a].denied,
             t[a].max60[0], t[a].max60[1]);
  return 0;
}
