/* SPDX-License-Identifier: MIT */
/*
 * redis_bench.c - what a decision costs on the Redis store, beside plain
 * INCR against the same server in the same run.
 *
 * Run it through bench/redis_bench.sh, which starts a private redis-server
 * (tests/redis/with_redis.sh) and passes its port. One line per result:
 *
 *   baselines  INCR from this program's own hiredis connection (the same
 *              client library and call pattern a decision uses), and
 *              redis-benchmark INCR with the same client count and pipeline
 *              depth as the figure it is compared with;
 *   hit        tg_hit (the server's clock, one EVALSHA) per algorithm, on one
 *              hot key and on 100,000 distinct keys, 1 and 2 threads;
 *   batch      tg_hit_batch of 16 decisions: one pipelined round trip.
 *
 * Each figure is the median of --reps repetitions of --time seconds, the
 * tollgate figure and its baseline measured alternately so drift hits both.
 * Nothing here is asserted: the CTest entry only checks that --quick runs.
 */
#include "bench_stats.h"
#include "tollgate.h"

#include <hiredis/hiredis.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int port;
static int reps = 5;
static double rep_s = 0.5;
static const char *filter = "";
static const char *placement = "default"; /* "cpu0" when --pinned */

#define NKEYS 100000
static char keys[NKEYS][16];

/* ---- workloads: each runs for rep_s and returns operations done ---- */

typedef struct work {
  int kind; /* 0 INCR via hiredis, 1 tg_hit, 2 tg_hit_batch of 16,
               3 tg_hit_rules of two rules: lim and lim2 on the same key */
  tg_limiter *lim, *lim2;
  int distinct;  /* 1: cycle over NKEYS keys */
  int thread_no; /* offsets the key sequence per thread */
  double secs;
  long ops;     /* out: decisions (or INCRs) done */
  long errors;  /* out: calls that did not return 0 */
  double *lat;  /* per-op latency samples, us (kind 1, may be NULL) */
  long lat_cap; /* size of lat */
} work;

static void *run_work(void *arg) {
  work *w = arg;
  static const tg_quota q = {
      .limit = 1000000000, .period_ms = 1000, .burst = 1000000000};
  redisContext *c = NULL;
  if (w->kind == 0) {
    c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
      fprintf(stderr, "redis_bench: cannot connect to port %d\n", port);
      exit(1);
    }
  }
  long i = (long)w->thread_no * 7919;
  double end = bench_now_s() + w->secs;
  w->ops = 0;
  while (bench_now_s() < end) {
    for (int j = 0; j < 64; j++, i++) {
      const char *k = w->distinct ? keys[i % NKEYS] : keys[w->thread_no];
      if (w->kind == 0) {
        redisReply *r = redisCommand(c, "INCR %s", k);
        if (!r || r->type != REDIS_REPLY_INTEGER)
          w->errors++;
        if (r)
          freeReplyObject(r);
        w->ops++;
      } else if (w->kind == 1) {
        tg_result res;
        double t0 = w->lat ? bench_now_s() : 0;
        if (tg_hit(w->lim, k, strlen(k), &q, 1, &res) != TG_OK)
          w->errors++;
        if (w->lat && w->ops < w->lat_cap)
          w->lat[w->ops] = (bench_now_s() - t0) * 1e6;
        w->ops++;
      } else if (w->kind == 3) {
        size_t kl = strlen(k);
        tg_rule ru[2] = {{w->lim, k, kl, &q, 1, 0, {0}},
                         {w->lim2, k, kl, &q, 1, 0, {0}}};
        tg_rules_result out;
        if (tg_hit_rules(ru, 2, 0, &out) != TG_OK || !out.r.allowed)
          w->errors++;
        w->ops++;
      } else {
        tg_batch_item it[16];
        for (int b = 0; b < 16; b++) {
          const char *kb = w->distinct ? keys[(i * 16 + b) % NKEYS] : k;
          it[b] = (tg_batch_item){kb, strlen(kb), &q, 1, 0, {0}};
        }
        if (tg_hit_batch(w->lim, it, 16) != TG_OK)
          w->errors += 16;
        for (int b = 0; b < 16; b++)
          if (it[b].status != TG_OK)
            w->errors++;
        w->ops += 16;
      }
    }
  }
  if (c)
    redisFree(c);
  return NULL;
}

/* Ops per second of `threads` copies of a workload, one repetition. */
static tg_limiter *second; /* kind 3's second rule's limiter */

static double measure(int kind, tg_limiter *lim, int distinct, int threads,
                      double *lat, long lat_cap, long *lat_n) {
  work w[2];
  pthread_t th[2];
  for (int t = 0; t < threads; t++) {
    w[t] = (work){
        kind,   lim, second, distinct, t, rep_s, 0, 0, t == 0 ? lat : NULL,
        lat_cap};
    pthread_create(&th[t], NULL, run_work, &w[t]);
  }
  long ops = 0, errors = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(th[t], NULL);
    ops += w[t].ops;
    errors += w[t].errors;
  }
  if (errors) {
    fprintf(stderr, "redis_bench: %ld calls failed\n", errors);
    exit(1);
  }
  if (lat_n)
    *lat_n = w[0].ops < lat_cap ? w[0].ops : lat_cap;
  return (double)ops / rep_s;
}

/* redis-benchmark INCR with c clients and pipeline p: requests per second. */
static double redis_benchmark(int clients, int pipeline) {
  char cmd[256];
  long n = (long)(rep_s * (pipeline > 1 ? 400000 : 40000) * clients);
  snprintf(cmd, sizeof cmd,
           "redis-benchmark -h 127.0.0.1 -p %d -t incr -n %ld -c %d -P %d -q "
           "2>/dev/null",
           port, n, clients, pipeline);
  FILE *f = popen(cmd, "r");
  if (!f)
    return 0;
  /* -q prints progress lines ended by \r, then the result:
   * "INCR: 41322.31 requests per second, p50=0.023 msec" */
  static char out[1 << 16];
  size_t n_read = fread(out, 1, sizeof out - 1, f);
  out[n_read] = '\0';
  pclose(f);
  char *end = strstr(out, " requests per second");
  if (!end)
    return 0;
  char *start = end;
  while (start > out && start[-1] != ' ')
    start--;
  return strtod(start, NULL);
}

static tg_limiter *limiter(tg_algorithm alg, uint32_t pool) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = port;
  rc.pool_size = pool;
  rc.key_prefix = "bench";
  cfg.redis = &rc;
  tg_limiter *lim = NULL;
  if (tg_limiter_new(&lim, &cfg) != TG_OK) {
    fprintf(stderr, "redis_bench: tg_limiter_new failed\n");
    exit(1);
  }
  return lim;
}

static int wanted(const char *label) { return strstr(label, filter) != NULL; }

/* The sequential figure: tg_hit against this program's own INCR. */
static void sequential(tg_algorithm alg, int distinct) {
  char label[128];
  snprintf(label, sizeof label, "name=hit alg=%s keys=%s threads=1",
           tg_algorithm_name(alg), distinct ? "100000" : "1");
  if (!wanted(label))
    return;
  tg_limiter *lim = limiter(alg, 1);
  double hit[16], incr[16];
  static double lat[1 << 20];
  double p50 = 0, p99 = 0;
  for (int r = 0; r < reps; r++) {
    long n = 0;
    hit[r] = measure(1, lim, distinct, 1, lat, 1 << 20, &n);
    incr[r] = measure(0, NULL, distinct, 1, NULL, 0, NULL);
    if (r == reps / 2 && n > 0) {
      bench_sort(lat, (size_t)n);
      p50 = lat[n / 2];
      p99 = lat[n * 99 / 100];
    }
  }
  double h = bench_median(hit, reps), b = bench_median(incr, reps);
  printf("%s ns_per_op=%.0f ops_per_s=%.0f p50_us=%.1f p99_us=%.1f "
         "baseline=incr(hiredis,same_keys) baseline_ns=%.0f ratio=%.2f "
         "target=ratio<=1.3 met=%s reps=%d stat=median\n",
         label, 1e9 / h, h, p50, p99, 1e9 / b, b / h,
         b / h <= 1.3 ? "yes" : "no", reps);
  tg_limiter_destroy(lim);
}

static void two_threads(tg_algorithm alg) {
  char label[128];
  snprintf(label, sizeof label, "name=hit alg=%s keys=100000 threads=2",
           tg_algorithm_name(alg));
  if (!wanted(label))
    return;
  tg_limiter *lim = limiter(alg, 2);
  double hit[16], rb[16], one[16];
  for (int r = 0; r < reps; r++) {
    hit[r] = measure(1, lim, 1, 2, NULL, 0, NULL);
    one[r] = measure(1, lim, 1, 1, NULL, 0, NULL);
    rb[r] = redis_benchmark(2, 1);
  }
  double h = bench_median(hit, reps), b = bench_median(rb, reps),
         o = bench_median(one, reps);
  printf("%s decisions_per_s=%.0f ns_per_op=%.0f throughput_x=%.2f "
         "baseline=redis_benchmark_incr(c=2,P=1) baseline_ops_per_s=%.0f "
         "ratio=%.2f reps=%d stat=median\n",
         label, h, 1e9 / h, h / o, b, h / b, reps);
  tg_limiter_destroy(lim);
}

static void batch(tg_algorithm alg) {
  char label[128];
  snprintf(label, sizeof label, "name=batch16 alg=%s keys=100000 threads=1",
           tg_algorithm_name(alg));
  if (!wanted(label))
    return;
  tg_limiter *lim = limiter(alg, 1);
  double hit[16], rb[16];
  for (int r = 0; r < reps; r++) {
    hit[r] = measure(2, lim, 1, 1, NULL, 0, NULL);
    rb[r] = redis_benchmark(1, 16);
  }
  double h = bench_median(hit, reps), b = bench_median(rb, reps);
  printf("%s decisions_per_s=%.0f ns_per_decision=%.0f "
         "baseline=redis_benchmark_incr(c=1,P=16) baseline_ops_per_s=%.0f "
         "ratio=%.2f target=ratio>=0.5 met=%s reps=%d stat=median\n",
         label, h, 1e9 / h, b, h / b, h / b >= 0.5 ? "yes" : "no", reps);
  tg_limiter_destroy(lim);
}

/* A policy of two rules (a token bucket and a fixed window on the same key
 * bytes, so their names share a Cluster slot) beside one tg_hit on the
 * token bucket, the same keys, rounds interleaved. With the module a
 * policy is one command (TG.STEPS), without it a read and a conditional
 * write of the script: the ratio says what the second rule and the second
 * round trip cost. */
static void policy(void) {
  const char *label =
      "name=policy2 alg=token_bucket+fixed_window keys=100000 threads=1";
  if (!wanted(label))
    return;
  tg_limiter *lim = limiter(TG_TOKEN_BUCKET, 1);
  second = limiter(TG_FIXED_WINDOW, 1);
  double pol[16], one[16];
  for (int r = 0; r < reps; r++) {
    pol[r] = measure(3, lim, 1, 1, NULL, 0, NULL);
    one[r] = measure(1, lim, 1, 1, NULL, 0, NULL);
  }
  double p = bench_median(pol, reps), o = bench_median(one, reps);
  printf("%s decisions_per_s=%.0f ns_per_decision=%.0f baseline=tg_hit "
         "baseline_ns=%.0f cost_x=%.2f reps=%d stat=median\n",
         label, p, 1e9 / p, 1e9 / o, o / p, reps);
  tg_limiter_destroy(second);
  second = NULL;
  tg_limiter_destroy(lim);
}

int main(int argc, char **argv) {
  const char *p = getenv("TG_TEST_REDIS_PORT");
  port = p ? atoi(p) : 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      reps = 1;
      rep_s = 0.05;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) {
      rep_s = atof(argv[++i]);
    } else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
    } else if (strcmp(argv[i], "--pinned") == 0) {
      placement = "cpu0"; /* redis_bench.sh --pin: everything on CPU 0 */
    } else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
      port = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: redis_bench [--port N] [--quick] [--reps N] "
                      "[--time S] [--filter TEXT]\n");
      return 2;
    }
  }
  if (port <= 0 || reps < 1 || reps > 15 || rep_s <= 0) {
    fprintf(stderr, "redis_bench: need a port (--port or TG_TEST_REDIS_PORT)"
                    " and 1 <= reps <= 15\n");
    return 2;
  }
  for (int i = 0; i < NKEYS; i++)
    snprintf(keys[i], sizeof keys[i], "user:%09d", i);
  printf("# tollgate %s redis bench: port %d, median of %d reps of %.2f s, "
         "placement=%s\n",
         tg_version_string(), port, reps, rep_s, placement);
  double rb1[16];
  for (int r = 0; r < reps; r++)
    rb1[r] = redis_benchmark(1, 1);
  double b1 = bench_median(rb1, reps);
  printf("name=baseline_redis_benchmark_incr clients=1 pipeline=1 "
         "ops_per_s=%.0f ns_per_op=%.0f\n",
         b1, 1e9 / b1);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    sequential((tg_algorithm)a, 0);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    sequential((tg_algorithm)a, 1);
  two_threads(TG_FIXED_WINDOW);
  two_threads(TG_TOKEN_BUCKET);
  batch(TG_FIXED_WINDOW);
  batch(TG_TOKEN_BUCKET);
  batch(TG_SLIDING_WINDOW);
  policy();
  return 0;
}
