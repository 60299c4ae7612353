/* SPDX-License-Identifier: MIT */
/*
 * simulate_cmd.c - `tollgate simulate`: the command line around the
 * simulation engine (simulate.c) and its drawing (timeline.c). It runs one
 * pattern through all five algorithms, prints the summary table and writes
 * the SVG timeline.
 */
#include "cli.h"
#include "simulate.h"
#include "timeline.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Below this many requests a run takes well under a second: no progress. */
#define PROGRESS_MIN_EVENTS 1000000u

static void usage(FILE *f) {
  fprintf(f,
          "usage: tollgate simulate [options]\n"
          "\n"
          "Replays a traffic pattern through every algorithm on a simulated\n"
          "clock, prints how many requests each admitted and the most it\n"
          "admitted within any one period, and draws an SVG timeline.\n"
          "\n"
          "options:\n"
          "  --pattern NAME   traffic to replay (default boundary):\n");
  for (int i = 0; i < SIM_PATTERN_COUNT; i++)
    fprintf(f, "                     %-10s %s\n",
            sim_pattern_name((sim_pattern)i),
            sim_pattern_about((sim_pattern)i));
  fprintf(f,
          "  --limit N        quota: N requests per period (default 10)\n"
          "  --period-ms MS   quota period (default 1000)\n"
          "  --burst N        bucket capacity (default 0: = limit)\n"
          "  --periods N      how long the traffic lasts (default 10)\n"
          "  --keys N         many_keys: distinct keys (default 1000)\n"
          "  --seed N         many_keys: random seed (default 1)\n"
          "  --svg FILE       where to write the timeline (default\n"
          "                   simulate-PATTERN.svg; '-' for stdout, in which\n"
          "                   case the table goes to stderr)\n"
          "  --no-svg         do not draw\n"
          "  --progress       report progress on stderr (the default when\n"
          "                   stderr is a terminal and the run is long)\n"
          "  --no-progress    never report progress\n"
          "\n"
          "One simulation sends at most %" PRIu64 " requests.\n",
          SIM_MAX_EVENTS);
}

/* --progress / --no-progress / neither */
typedef enum progress_mode {
  PROGRESS_AUTO,
  PROGRESS_ON,
  PROGRESS_OFF
} progress_mode;

static int parse_args(int argc, char **argv, sim_params *p, const char **svg,
                      bool *draw, progress_mode *progress) {
  uint64_t v;
  for (int i = 0; i < argc; i++) {
    const char *val = NULL;
    int r;
#define OPT(name) ((r = opt_value("simulate", argc, argv, &i, name, &val)) != 0)
#define NUM(name, min, max, dst)                                               \
  if (r < 0 || opt_u64("simulate", name, val, min, max, &v) != 0)              \
    return -1;                                                                 \
  dst = v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 1;
    } else if (strcmp(argv[i], "--no-svg") == 0) {
      *draw = false;
    } else if (strcmp(argv[i], "--progress") == 0) {
      *progress = PROGRESS_ON;
    } else if (strcmp(argv[i], "--no-progress") == 0) {
      *progress = PROGRESS_OFF;
    } else if (OPT("--pattern")) {
      if (r < 0)
        return -1;
      if (sim_parse_pattern(val, &p->pattern) != 0) {
        fprintf(stderr, "tollgate simulate: unknown pattern '%s'\n", val);
        return -1;
      }
    } else if (OPT("--limit")) {
      NUM("--limit", 1, SIM_MAX_EVENTS, p->quota.limit)
    } else if (OPT("--period-ms")) {
      NUM("--period-ms", 1, TG_PERIOD_MAX_MS, p->quota.period_ms)
    } else if (OPT("--burst")) {
      NUM("--burst", 0, SIM_MAX_EVENTS, p->quota.burst)
    } else if (OPT("--periods")) {
      NUM("--periods", 1, 100000, p->periods)
    } else if (OPT("--keys")) {
      NUM("--keys", 1, 1000000, uint64_t keys)
      p->keys = (uint32_t)keys;
    } else if (OPT("--seed")) {
      NUM("--seed", 0, UINT64_MAX, p->seed)
    } else if (OPT("--svg")) {
      if (r < 0)
        return -1;
      *svg = val;
    } else {
      fprintf(stderr, "tollgate simulate: unknown option '%s'\n", argv[i]);
      return -1;
    }
#undef OPT
#undef NUM
  }
  return 0;
}

static void fail(const char *what, int rc) {
  fprintf(stderr, "tollgate simulate: %s: %s (%s)\n", what, tg_strerror(rc),
          tg_err_name(rc));
}

static int draw_svg(const char *path, const sim_params *p, const sim_traffic *t,
                    const sim_run *runs) {
  bool to_stdout = strcmp(path, "-") == 0;
  FILE *f = to_stdout ? stdout : fopen(path, "w");
  if (!f) {
    fprintf(stderr, "tollgate simulate: cannot write %s: %s\n", path,
            strerror(errno));
    return -1;
  }
  int rc = timeline_write(f, p, t, runs, TG_ALGORITHM_COUNT);
  if (!to_stdout && fclose(f) != 0)
    rc = -1;
  if (rc != 0)
    fprintf(stderr, "tollgate simulate: writing %s failed\n", path);
  return rc;
}

/* Progress on stderr. On a terminal one line rewritten in place; elsewhere
 * (asked for with --progress, e.g. into a log) a line per algorithm
 * every 25%, so a log is not flooded. */
typedef struct progress {
  bool tty;
  int last; /* last percentage shown for the current algorithm, -1: none */
  tg_algorithm alg;
} progress;

static void show_progress(void *ctx, tg_algorithm alg, size_t done,
                          size_t total) {
  progress *pr = ctx;
  if (alg != pr->alg) {
    pr->alg = alg;
    pr->last = -1;
  }
  int pct = total ? (int)((double)done * 100.0 / (double)total) : 100;
  int step = pr->tty ? 1 : 25;
  if (pct / step == pr->last / step && pct != 100)
    return;
  if (pct == pr->last)
    return;
  pr->last = pct;
  if (pr->tty)
    fprintf(stderr, "\rtollgate simulate: %d/%d %-20s %3d%%", (int)alg + 1,
            TG_ALGORITHM_COUNT, tg_algorithm_name(alg), pct);
  else
    fprintf(stderr, "tollgate simulate: %d/%d %s %d%% (%zu of %zu requests)\n",
            (int)alg + 1, TG_ALGORITHM_COUNT, tg_algorithm_name(alg), pct, done,
            total);
  if (pr->tty && pct == 100 && (int)alg + 1 == TG_ALGORITHM_COUNT)
    fprintf(stderr, "\r\033[K"); /* done: leave the terminal clean */
  fflush(stderr);
}

int cmd_simulate(int argc, char **argv) {
  sim_params p = {.pattern = SIM_BOUNDARY,
                  .quota = {.limit = 10, .period_ms = 1000, .burst = 0},
                  .periods = 10,
                  .keys = 1000,
                  .seed = 1};
  const char *svg = NULL;
  bool draw = true;
  progress_mode pmode = PROGRESS_AUTO;
  int a = parse_args(argc, argv, &p, &svg, &draw, &pmode);
  if (a != 0)
    return a > 0 ? 0 : 2;
  char svg_default[64];
  if (!svg) {
    snprintf(svg_default, sizeof svg_default, "simulate-%s.svg",
             sim_pattern_name(p.pattern));
    svg = svg_default;
  }
  FILE *out = draw && strcmp(svg, "-") == 0 ? stderr : stdout;

  char why[256];
  uint64_t n_events = 0;
  int rc = sim_check(&p, &n_events, why, sizeof why);
  if (rc != TG_OK) {
    fprintf(stderr, "tollgate simulate: %s\n", why);
    return 2;
  }
  bool tty = isatty(STDERR_FILENO) == 1;
  progress pr = {.tty = tty, .last = -1, .alg = TG_FIXED_WINDOW};
  if (pmode == PROGRESS_ON ||
      (pmode == PROGRESS_AUTO && tty && n_events >= PROGRESS_MIN_EVENTS)) {
    p.progress = show_progress;
    p.progress_ctx = &pr;
  }
  sim_traffic t;
  rc = sim_generate(&p, &t);
  if (rc != TG_OK) {
    fail("cannot lay out this pattern", rc);
    return rc == TG_ENOMEM ? 1 : 2;
  }
  sim_run runs[TG_ALGORITHM_COUNT];
  memset(runs, 0, sizeof runs);
  int status = 0;
  for (int k = 0; k < TG_ALGORITHM_COUNT && status == 0; k++) {
    rc = sim_replay(&p, &t, (tg_algorithm)k, &runs[k]);
    if (rc != TG_OK) {
      fail(tg_algorithm_name((tg_algorithm)k), rc);
      status = 1;
    }
  }
  if (status == 0) {
    uint64_t burst = p.quota.burst ? p.quota.burst : p.quota.limit;
    fprintf(out,
            "tollgate simulate: %s: %s\n"
            "quota: %" PRIu64 " per %" PRIu64 " ms (burst %" PRIu64
            "); %zu requests over %" PRIu64 " periods%s\n\n",
            sim_pattern_name(p.pattern), sim_pattern_about(p.pattern),
            p.quota.limit, p.quota.period_ms, burst, t.n, p.periods,
            t.keys > 1 ? " (worst = the busiest key's)" : "");
    fprintf(out, "%-22s  %9s  %9s  %22s  %8s\n", "algorithm", "admitted",
            "denied", "worst in any period", "x limit");
    for (int k = 0; k < TG_ALGORITHM_COUNT; k++)
      fprintf(out, "%-22s  %9" PRIu64 "  %9" PRIu64 "  %22" PRIu64 "  %8.2f\n",
              tg_algorithm_name((tg_algorithm)k), runs[k].admitted,
              runs[k].denied, runs[k].worst,
              (double)runs[k].worst / (double)p.quota.limit);
    if (draw) {
      if (draw_svg(svg, &p, &t, runs) != 0)
        status = 1;
      else if (strcmp(svg, "-") != 0)
        fprintf(out, "\ntimeline: %s (open it in a browser)\n", svg);
    }
  }
  for (int k = 0; k < TG_ALGORITHM_COUNT; k++)
    sim_run_free(&runs[k]);
  sim_traffic_free(&t);
  return status;
}
