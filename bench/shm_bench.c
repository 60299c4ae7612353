/* SPDX-License-Identifier: MIT */
/*
 * shm_bench.c - what a decision costs in the shared-memory store, beside the
 * memory store in the same run on the same keys, and how it scales across
 * processes. A separate binary that prints one plain line per result, each
 * with its baseline and the ratio to it (libuv's benchmark style).
 *
 *   1 process: ns per decision, shm vs memory, same config and keys, for the
 *     token bucket and the fixed window, on one hot key and on ~1M distinct
 *     keys (all created by an untimed pass first, then hit round-robin).
 *     Target: shm <= 1.3x memory.
 *   2 processes (fork; each attaches the segment by name, as unrelated
 *     processes do): decisions per second of both together vs one process
 *     alone doing the same per-process work, on one shared key and on
 *     disjoint halves of the keys. Target on distinct keys: >= 1.7x. Beside
 *     it, the same with a private memory-store table per process (nothing
 *     shared): how far the host itself scales that access pattern.
 *
 * Time is passed in (the _at calls, 1 us per decision) so clock reads do not
 * dilute the store's cost; quotas are generous enough that every decision is
 * allowed and therefore writes (the expensive path).
 *
 * Every figure is the median of --reps runs (bench_stats.h: the statistic
 * all the benchmarks here report), the fastest beside it in brackets. Each
 * line also gives the CPU share (CPU time / wall time, lowest of its
 * processes) of the median runs: near 1.00 the processes had their CPUs to
 * themselves; well below, another load took turns with them and the figure
 * measures the host, not the store.
 *
 * Usage: shm_bench [--keys N] [--ops N] [--reps N] [--verbose]
 *   --keys     distinct keys (default 1000000)
 *   --ops      timed decisions per process and run (default 4000000)
 *   --reps     runs per figure (default 5)
 *   --verbose  every run's figure and CPU share on stderr
 */
#include "bench_stats.h"
#include "tollgate.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEY_LEN 15 /* "user:0000000042" */
#define T0 UINT64_C(1700000000000000)
#define MAX_REPS 31

static size_t nkeys = 1000000, nops = 4000000;
static int reps = 5;
static bool verbose; /* --verbose: every run's figure on stderr */
static char (*keys)[KEY_LEN + 1];
static char shm_name[64];

/* Every decision allowed, every decision a write: a window that never
 * fills, and a bucket refilled (1 token per us) as fast as the bench
 * consumes it (1 per us of the passed-in time), with a deep burst. */
static const tg_quota window_quota = {UINT64_C(1000000000000000), 1000, 0};
static const tg_quota bucket_quota = {1000000, 1000, 1000000000};

static void die(const char *what, int rc) {
  fprintf(stderr, "shm_bench: %s: %s\n", what, tg_err_name(rc));
  exit(1);
}

static tg_config bench_config(tg_algorithm alg, bool shm) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = nkeys + nkeys / 8 + 16;
  cfg.long_keys = 16;      /* every key here is short */
  cfg.clean_period_ms = 0; /* no cleaning thread competing */
  cfg.shm_name = shm ? shm_name : NULL;
  return cfg;
}

/* `ops` decisions round-robin over keys[first, first + n), time starting at
 * *now (1 us per decision). Returns seconds. */
static double run_ops(tg_limiter *lim, const tg_quota *q, size_t first,
                      size_t n, size_t ops, uint64_t *now) {
  tg_result r;
  size_t j = 0;
  uint64_t t = *now;
  double start = bench_now_s();
  for (size_t i = 0; i < ops; i++) {
    int rc = tg_hit_at(lim, t++, keys[first + j], KEY_LEN, q, 1, &r);
    if (rc != TG_OK || !r.allowed)
      die(rc != TG_OK ? "tg_hit_at" : "a decision was denied", rc);
    if (++j == n)
      j = 0;
  }
  double el = bench_now_s() - start;
  *now = t;
  return el;
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A figure over reps runs: the median (the figure), the fastest, and the
 * CPU share of the run nearest the median. */
typedef struct figure {
  double median, best, share;
} figure;

/* v[i] measured with CPU share share[i]; `lower`: smaller is faster. */
static figure summarise(const double *v, const double *share, bool lower) {
  figure f = {0, v[0], share[0]};
  double sorted[MAX_REPS];
  for (int i = 0; i < reps; i++) {
    if (verbose)
      fprintf(stderr, " %.2f (cpu %.2f)", v[i], share[i]);
    if (lower ? v[i] < f.best : v[i] > f.best)
      f.best = v[i];
    sorted[i] = v[i];
  }
  if (verbose)
    fprintf(stderr, "\n");
  f.median = bench_median(sorted, reps);
  double gap = -1;
  for (int i = 0; i < reps; i++) {
    double d = v[i] > f.median ? v[i] - f.median : f.median - v[i];
    if (gap < 0 || d < gap) {
      gap = d;
      f.share = share[i];
    }
  }
  return f;
}

/* ns per decision in one process: a fresh limiter each run, every key
 * created by an untimed pass first. */
static figure single(tg_algorithm alg, bool shm, size_t n) {
  double v[MAX_REPS], share[MAX_REPS];
  for (int k = 0; k < reps; k++) {
    tg_shm_unlink(shm_name);
    tg_config cfg = bench_config(alg, shm);
    tg_limiter *lim;
    int rc = tg_limiter_new(&lim, &cfg);
    if (rc != TG_OK)
      die("tg_limiter_new", rc);
    const tg_quota *q = alg == TG_TOKEN_BUCKET ? &bucket_quota : &window_quota;
    uint64_t now = T0;
    run_ops(lim, q, 0, n, n, &now); /* create them */
    double cpu = cpu_s();
    double wall = run_ops(lim, q, 0, n, nops, &now);
    share[k] = (cpu_s() - cpu) / wall;
    v[k] = wall / (double)nops * 1e9;
    tg_limiter_destroy(lim);
  }
  tg_shm_unlink(shm_name);
  return summarise(v, share, true);
}

/* Decisions per second of `procs` (1 or 2) forked processes together, each
 * deciding nops times on keys[first_c, +n) where first_c = c * stride. With
 * `shared`, each attaches the segment; without, each builds its own
 * memory-store table (nothing shared: the host's own scaling on that access
 * pattern). Either way both halves' keys exist in every table whatever procs
 * is, so all the tables have the same shape and load. The
 * wall time runs from the first start to the last end (started together
 * through a pipe; each child sends its times back through another). */
static figure multi(tg_algorithm alg, int procs, size_t n, size_t stride,
                    bool shared) {
  double v[MAX_REPS], share[MAX_REPS];
  const tg_quota *q = alg == TG_TOKEN_BUCKET ? &bucket_quota : &window_quota;
  for (int k = 0; k < reps; k++) {
    tg_shm_unlink(shm_name);
    tg_config cfg = bench_config(alg, shared);
    uint64_t now = T0;
    if (shared) {
      tg_limiter *lim;
      int rc = tg_limiter_new(&lim, &cfg);
      if (rc != TG_OK)
        die("tg_limiter_new", rc);
      for (size_t c = 0; c < 2; c++)
        run_ops(lim, q, c * stride, n, n, &now); /* create them */
      tg_limiter_destroy(lim); /* the segment stays: it has a name */
    }
    int go[2], back[2];
    if (pipe(go) != 0 || pipe(back) != 0)
      die("pipe", TG_ESTORE);
    pid_t pid[2];
    for (int c = 0; c < procs; c++) {
      pid[c] = fork();
      if (pid[c] < 0)
        die("fork", TG_ESTORE);
      if (pid[c] == 0) {
        close(go[1]);
        close(back[0]);
        tg_limiter *mine;
        int e = tg_limiter_new(&mine, &cfg);
        if (e != TG_OK)
          die("tg_limiter_new (child)", e);
        if (!shared) { /* the same keys as the shared table: same shape */
          uint64_t t0 = now;
          for (size_t h = 0; h < 2; h++)
            run_ops(mine, q, h * stride, n, n, &t0);
        }
        char b;
        while (read(go[0], &b, 1) < 0 && errno == EINTR)
          ;
        uint64_t t = now;
        double se[3], cpu = cpu_s();
        se[0] = bench_now_s();
        run_ops(mine, q, (size_t)c * stride, n, nops, &t);
        se[1] = bench_now_s();
        se[2] = (cpu_s() - cpu) / (se[1] - se[0]);
        tg_limiter_destroy(mine);
        _exit(write(back[1], se, sizeof se) == (ssize_t)sizeof se ? 0 : 1);
      }
    }
    close(back[1]);
    struct timespec settle = {0, 100000000};
    nanosleep(&settle, NULL); /* let them attach */
    close(go[0]);
    close(go[1]); /* EOF: all start */
    double first = 0, last = 0;
    share[k] = 1;
    for (int c = 0; c < procs; c++) {
      double se[3];
      if (read(back[0], se, sizeof se) != (ssize_t)sizeof se)
        die("a child failed", TG_ESTORE);
      if (se[2] < share[k])
        share[k] = se[2];
      if (c == 0 || se[0] < first)
        first = se[0];
      if (c == 0 || se[1] > last)
        last = se[1];
    }
    close(back[0]);
    for (int c = 0; c < procs; c++) {
      int st;
      while (waitpid(pid[c], &st, 0) < 0 && errno == EINTR)
        ;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("a child failed", TG_ESTORE);
    }
    v[k] = (double)nops * procs / (last - first);
  }
  tg_shm_unlink(shm_name);
  return summarise(v, share, false);
}

static const char *verdict(bool met) { return met ? "met" : "MISSED"; }

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i += 2) {
    if (strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
      i--;
    } else if (i + 1 == argc) {
      fprintf(stderr, "shm_bench: %s needs a value\n", argv[i]);
      return 2;
    } else if (strcmp(argv[i], "--keys") == 0)
      nkeys = strtoul(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--ops") == 0)
      nops = strtoul(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--reps") == 0)
      reps = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: %s [--keys N] [--ops N] [--reps N] [--verbose]\n",
              argv[0]);
      return 2;
    }
  }
  if (nkeys < 2 || nkeys > UINT32_MAX || nops < 1 || reps < 1 ||
      reps > MAX_REPS) {
    fprintf(stderr, "shm_bench: --keys >= 2, --ops >= 1, 1 <= --reps <= %d\n",
            MAX_REPS);
    return 2;
  }
  keys = malloc(nkeys * sizeof *keys);
  if (!keys)
    die("malloc", TG_ENOMEM);
  for (size_t i = 0; i < nkeys; i++)
    snprintf(keys[i], sizeof keys[i], "user:%010u", (unsigned)i);
  snprintf(shm_name, sizeof shm_name, "/tg-shm-bench-%ld", (long)getpid());
  printf("# shm_bench: %zu distinct keys, %zu decisions per process and run, "
         "median of %d runs (fastest in brackets)\n",
         nkeys, nops, reps);
  fflush(stdout);

  static const tg_algorithm algs[] = {TG_TOKEN_BUCKET, TG_FIXED_WINDOW};
  for (size_t a = 0; a < 2; a++) {
    const char *an = tg_algorithm_name(algs[a]);
    for (int hot = 1; hot >= 0; hot--) {
      size_t n = hot ? 1 : nkeys;
      const char *kn = hot ? "hot_key" : "distinct_keys";
      figure mem = single(algs[a], false, n);
      figure shm = single(algs[a], true, n);
      double r = shm.median / mem.median;
      printf("%s %s 1proc shm: %.1f ns/decision (memory %.1f ns/decision, "
             "ratio %.2f, target <= 1.30: %s) [fastest %.1f / %.1f, ratio "
             "%.2f; cpu share %.2f / %.2f]\n",
             an, kn, shm.median, mem.median, r, verdict(r <= 1.30), shm.best,
             mem.best, shm.best / mem.best, shm.share, mem.share);
      fflush(stdout);
    }
    /* one process vs two on the same per-process work */
    for (int hot = 1; hot >= 0; hot--) {
      size_t n = hot ? 1 : nkeys / 2, stride = hot ? 0 : nkeys / 2;
      const char *kn = hot ? "one_key" : "distinct_keys";
      figure one = multi(algs[a], 1, n, stride, true);
      figure two = multi(algs[a], 2, n, stride, true);
      double r = two.median / one.median;
      char target[64];
      if (hot)
        snprintf(target, sizeof target, "no target: one key, one cache line");
      else
        snprintf(target, sizeof target, "target >= 1.70: %s",
                 verdict(r >= 1.70));
      printf("%s %s 2proc shm: %.2f M decisions/s (1proc %.2f M/s, ratio "
             "%.2f, %s) [fastest %.2f / %.2f, ratio %.2f; cpu share %.2f / "
             "%.2f]\n",
             an, kn, two.median / 1e6, one.median / 1e6, r, target,
             two.best / 1e6, one.best / 1e6, two.best / one.best, two.share,
             one.share);
      fflush(stdout);
    }
    /* the same without sharing: what the host itself allows */
    size_t half = nkeys / 2;
    figure one = multi(algs[a], 1, half, half, false);
    figure two = multi(algs[a], 2, half, half, false);
    printf("%s distinct_keys 2proc memory (a full table each, none shared): "
           "%.2f M decisions/s (1proc %.2f M/s, ratio %.2f: the host's own "
           "scaling) [fastest %.2f / %.2f, ratio %.2f; cpu share %.2f / "
           "%.2f]\n",
           an, two.median / 1e6, one.median / 1e6, two.median / one.median,
           two.best / 1e6, one.best / 1e6, two.best / one.best, two.share,
           one.share);
    fflush(stdout);
  }
  free(keys);
  return 0;
}
