/* SPDX-License-Identifier: MIT */
/*
 * cluster_bench.c - decisions per second on one Redis server and on a
 * Redis Cluster of three masters, side by side in the same run; the
 * non-blocking API with 1,000 decisions in flight from one thread beside
 * the blocking pool; exactness under that load; and the round trips the
 * deny cache saves under an abusive client.
 *
 * Run it through bench/cluster_bench.sh, which starts both (a private
 * cluster, tests/redis/with_cluster.sh, and a private server,
 * tests/redis/with_redis.sh) and says what the machine was doing. One line
 * per result; each figure is the median of --rounds rounds, the cases
 * measured in turn within each round so that the machine's drift hits all
 * of them alike:
 *
 *   hit      --threads threads calling tg_hit (the server's clock), each on
 *            its own keys among 100,000, a pool of as many connections (per
 *            node on the cluster): all cores busy;
 *   batch64  the same threads calling tg_hit_batch of 64 keys (the cluster
 *            splits each batch per node and pipelines the parts);
 *   nb1000   one thread driving the non-blocking API (nb_poll.h's loop)
 *            with 1,000 decisions always in flight;
 *   nb1000_policy2  the same with policies of two rules (a per-key window
 *            and a token bucket on one key, tg_nb_submit_rules): one
 *            command each, the server reading and writing two keys;
 *   exact    the hit workload on 2,000 keys limited to 20 per hour: every
 *            key must admit exactly 20, and count every call once;
 *   deny     one thread on one key at 100 times its limit (10,000 calls
 *            per second, 100 allowed, a fixed window), without and with
 *            the deny cache: round trips per decision and this process's
 *            CPU per decision.
 * The quotas of hit, batch64 and nb1000(_policy2) admit every call (1e9 per
 * hour, per-key windows), so every decision writes. Nothing is asserted.
 */
#include "bench_stats.h"
#include "nb_poll.h"
#include "tollgate.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define NKEYS 100000
#define BATCH 64
#define INFLIGHT 1000

static char keys[NKEYS][16];
static int single_port;
static const char *seeds;
static int rounds = 5, threads = 8;
static double secs = 2.0;
static unsigned run_id;

/* ---- limiters ---- */

static void redis_cfg(tg_config *cfg, tg_redis_config *rc, bool cluster,
                      const char *prefix, uint32_t pool) {
  tg_config_init(cfg);
  cfg->algorithm = TG_FIXED_WINDOW_PER_KEY;
  cfg->on_failure = TG_POLICY_ERROR;
  tg_redis_config_init(rc);
  rc->key_prefix = prefix;
  rc->pool_size = pool;
  rc->connect_timeout_ms = rc->command_timeout_ms = 5000;
  if (cluster)
    rc->cluster_nodes = seeds;
  else
    rc->port = single_port;
  cfg->redis = rc;
}

static tg_limiter *limiter(bool cluster, const char *prefix, uint32_t pool,
                           uint64_t deny) {
  tg_config cfg;
  tg_redis_config rc;
  redis_cfg(&cfg, &rc, cluster, prefix, pool);
  cfg.deny_cache_entries = deny;
  tg_limiter *lim = NULL;
  if (tg_limiter_new(&lim, &cfg) != TG_OK) {
    fprintf(stderr, "cluster_bench: cannot make a limiter\n");
    exit(1);
  }
  return lim;
}

/* ---- the machine ---- */

/* Busy and total jiffies of every CPU, from /proc/stat. */
static void cpu_ticks(uint64_t *busy, uint64_t *total) {
  *busy = *total = 0;
  FILE *f = fopen("/proc/stat", "r");
  if (!f)
    return;
  uint64_t v[10] = {0};
  if (fscanf(f,
             "cpu %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
             " %" SCNu64 " %" SCNu64 " %" SCNu64,
             &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
    for (int i = 0; i < 8; i++)
      *total += v[i];
    *busy = *total - v[3] - v[4]; /* all but idle and iowait */
  }
  fclose(f);
}

/* ---- workloads: each returns decisions per second ---- */

typedef struct worker {
  tg_limiter *lim;
  int id;
  int kind; /* 0 hit, 1 batch64, 2 exact */
  double secs;
  long ops, errors;
  long admitted[2000];
  long calls[2000];
} worker;

static const tg_quota all = {.limit = 1000000000, .period_ms = 3600000};
static const tg_quota twenty = {.limit = 20, .period_ms = 3600000};

static void *work(void *arg) {
  worker *w = arg;
  long i = (long)w->id * (NKEYS / 64);
  double end = bench_now_s() + w->secs;
  if (w->kind == 2) { /* exact: round robin over 2,000 keys, fixed calls */
    for (long n = 0; n < 2000L * 60 / threads; n++) {
      int k = (int)((n + w->id * 997) % 2000);
      tg_result r;
      if (tg_hit(w->lim, keys[k], strlen(keys[k]), &twenty, 1, &r) != TG_OK) {
        w->errors++;
        continue;
      }
      w->calls[k]++;
      w->admitted[k] += r.allowed;
      w->ops++;
    }
    return NULL;
  }
  while (bench_now_s() < end) {
    if (w->kind == 0) {
      for (int j = 0; j < 16; j++, i++) {
        const char *k = keys[i % NKEYS];
        tg_result r;
        if (tg_hit(w->lim, k, strlen(k), &all, 1, &r) != TG_OK)
          w->errors++;
        w->ops++;
      }
    } else {
      tg_batch_item it[BATCH];
      for (int j = 0; j < BATCH; j++, i++) {
        const char *k = keys[i % NKEYS];
        it[j] = (tg_batch_item){k, strlen(k), &all, 1, 0, {0}};
      }
      tg_hit_batch(w->lim, it, BATCH);
      for (int j = 0; j < BATCH; j++)
        w->errors += it[j].status != TG_OK;
      w->ops += BATCH;
    }
  }
  return NULL;
}

/* Runs `threads` workers of one kind; decisions/s, and the machine's CPU
 * use meanwhile in cores (*cores). */
static double blocking(tg_limiter *lim, int kind, double *cores, long *errs) {
  worker *w = calloc((size_t)threads, sizeof *w);
  pthread_t *th = calloc((size_t)threads, sizeof *th);
  if (!w || !th)
    exit(1);
  uint64_t b0, t0, b1, t1;
  cpu_ticks(&b0, &t0);
  double start = bench_now_s();
  for (int i = 0; i < threads; i++) {
    w[i].lim = lim;
    w[i].id = i;
    w[i].kind = kind;
    w[i].secs = secs;
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  long ops = 0;
  *errs = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    ops += w[i].ops;
    *errs += w[i].errors;
  }
  double el = bench_now_s() - start;
  cpu_ticks(&b1, &t1);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  *cores = t1 > t0 ? (double)(b1 - b0) / (double)(t1 - t0) * (double)ncpu : 0;
  free(w);
  free(th);
  return (double)ops / el;
}

/* The request r (of req[]) submitted again on key i: a decision, or with
 * `policy` a policy of two rules on that key (nb's per-key window and
 * nb2's token bucket: two names in one slot). */
static tg_nb_rule pol_rules[INFLIGHT][2];

static void nb_again(tg_nb *nb, tg_nb *nb2, tg_nb_req *req, tg_nb_req *r,
                     long i, bool policy) {
  const char *k = keys[i % NKEYS];
  size_t kl = strlen(k);
  if (!policy) {
    *r = (tg_nb_req){.key = k, .key_len = kl, .q = &all, .cost = 1};
    tg_nb_submit(nb, r);
    return;
  }
  tg_nb_rule *ru = pol_rules[r - req];
  ru[0] = (tg_nb_rule){nb, k, kl, &all, 1, 0, 0, {0}, 0};
  ru[1] = (tg_nb_rule){nb2, k, kl, &all, 1, 0, 0, {0}, 0};
  *r = (tg_nb_req){0};
  tg_nb_submit_rules(nb, r, ru, 2, 0);
}

/* One thread, the non-blocking API, INFLIGHT decisions (or policies of two
 * rules, tg_nb_submit_rules) always pending. */
static double nonblocking(bool cluster, const char *prefix, bool policy,
                          double *cores, long *errs) {
  tg_config cfg;
  tg_redis_config rc;
  redis_cfg(&cfg, &rc, cluster, prefix, 1);
  tg_nb *nb = NULL, *nb2 = NULL;
  if (tg_nb_new(&nb, &cfg) != TG_OK)
    exit(1);
  cfg.algorithm = TG_TOKEN_BUCKET;
  if (tg_nb_new(&nb2, &cfg) != TG_OK)
    exit(1);
  static tg_nb_req req[INFLIGHT];
  nbp d;
  nbp_init(&d, nb);
  long i = 0, done = 0;
  *errs = 0;
  for (int j = 0; j < INFLIGHT; j++, i++)
    nb_again(nb, nb2, req, &req[j], i, policy);
  uint64_t b0, t0, b1, t1;
  cpu_ticks(&b0, &t0);
  double start = bench_now_s(), end = start + secs;
  while (bench_now_s() < end) {
    nbp_turn(&d, 10);
    tg_nb_req *r;
    while ((r = tg_nb_done(nb)) != NULL) {
      done++;
      *errs += r->status != TG_OK || !r->result.allowed;
      nb_again(nb, nb2, req, r, i++, policy); /* and it goes again */
    }
  }
  double el = bench_now_s() - start;
  cpu_ticks(&b1, &t1);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  *cores = t1 > t0 ? (double)(b1 - b0) / (double)(t1 - t0) * (double)ncpu : 0;
  nbp_run(&d, INFLIGHT, 10000, NULL, NULL); /* drain */
  nbp_close_all(&d);
  tg_nb_destroy(nb);
  tg_nb_destroy(nb2);
  return (double)done / el;
}

/* Exactness under the hit load: admitted == limit per key, every call
 * counted once. */
static bool exact(bool cluster, unsigned round, long *calls_out) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cb%u.exact.%s.%u", run_id,
           cluster ? "c" : "s", round);
  tg_limiter *lim = limiter(cluster, prefix, (uint32_t)threads, 0);
  worker *w = calloc((size_t)threads, sizeof *w);
  pthread_t *th = calloc((size_t)threads, sizeof *th);
  for (int i = 0; i < threads; i++) {
    w[i].lim = lim;
    w[i].id = i;
    w[i].kind = 2;
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  long errors = 0, calls = 0;
  static long admitted[2000], count[2000];
  memset(admitted, 0, sizeof admitted);
  memset(count, 0, sizeof count);
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    errors += w[i].errors;
    for (int k = 0; k < 2000; k++) {
      admitted[k] += w[i].admitted[k];
      count[k] += w[i].calls[k];
    }
  }
  bool ok = errors == 0;
  for (int k = 0; k < 2000 && ok; k++) {
    uint64_t v = 0;
    ok = admitted[k] == 20 &&
         tg_get(lim, keys[k], strlen(keys[k]), &twenty, &v) == TG_OK &&
         v == (uint64_t)count[k];
    calls += count[k];
  }
  *calls_out = calls;
  free(w);
  free(th);
  tg_limiter_destroy(lim);
  return ok;
}

/* One thread on one key at 100 times its limit for secs: 100 per second
 * allowed, 10 calls every ms made (10,000/s, well within what one thread
 * can do without the cache, so both runs make the same calls). Returns the
 * decisions that reached the server per decision made; *cpu_us the CPU
 * this process spent per decision. */
static double abusive(bool cluster, uint64_t deny, unsigned round,
                      double *cpu_us) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cb%u.deny%d.%u", run_id, deny > 0, round);
  tg_limiter *lim = limiter(cluster, prefix, 1, deny);
  tg_quota q = {.limit = 100, .period_ms = 1000};
  long n = 0;
  struct rusage a, b;
  getrusage(RUSAGE_SELF, &a);
  uint64_t t0 = bench_now_ns(), ms = 0;
  while ((double)ms < secs * 1000) {
    for (int j = 0; j < 10; j++, n++) {
      tg_result r;
      tg_hit(lim, "abuser", 6, &q, 1, &r);
    }
    ms++;
    uint64_t due = t0 + ms * 1000000u, now = bench_now_ns();
    if (due > now) {
      struct timespec ts = {0, (long)(due - now)};
      nanosleep(&ts, NULL);
    }
  }
  getrusage(RUSAGE_SELF, &b);
  double cpu = (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec) +
               (double)(b.ru_stime.tv_sec - a.ru_stime.tv_sec) +
               (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec) * 1e-6 +
               (double)(b.ru_stime.tv_usec - a.ru_stime.tv_usec) * 1e-6;
  *cpu_us = cpu * 1e6 / (double)n;
  tg_stats st;
  tg_limiter_stats(lim, &st, sizeof st);
  tg_limiter_destroy(lim);
  return (double)(n - (long)st.deny_cache_hits) / (double)n;
}

/* ---- rounds ---- */

enum {
  C_HIT_S,
  C_HIT_C,
  C_B_S,
  C_B_C,
  C_NB_S,
  C_NB_C,
  C_NBP_S,
  C_NBP_C,
  C_NCASES
};
static const char *const case_name[C_NCASES] = {
    "hit",    "hit",    "batch64",        "batch64",
    "nb1000", "nb1000", "nb1000_policy2", "nb1000_policy2"};

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--single") == 0 && i + 1 < argc)
      single_port = atoi(argv[++i]);
    else if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc)
      seeds = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc)
      secs = atof(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quick") == 0) {
      rounds = 1;
      secs = 0.2;
    } else {
      fprintf(stderr, "usage: cluster_bench --single PORT --cluster SEEDS "
                      "[--rounds N] [--time S] [--threads T] [--quick]\n");
      return 2;
    }
  }
  if (!single_port || !seeds || rounds < 1 || threads < 1 || threads > 256) {
    fprintf(stderr, "cluster_bench: --single and --cluster are needed\n");
    return 2;
  }
  run_id = (unsigned)bench_now_ns();
  for (int k = 0; k < NKEYS; k++)
    snprintf(keys[k], sizeof keys[k], "u%d", k);
  printf("cluster_bench: %d threads, %d rounds of %.1f s per case, %ld CPUs\n",
         threads, rounds, secs, sysconf(_SC_NPROCESSORS_ONLN));
  double dps[C_NCASES][64], cores[C_NCASES][64];
  long errors[C_NCASES] = {0};
  double dn[2][64], dc[2][64], tn[2][64], tc[2][64];
  bool exact_ok[2] = {true, true};
  long exact_calls[2] = {0, 0};
  if (rounds > 64)
    rounds = 64;
  char prefix[64];
  for (int r = 0; r < rounds; r++) {
    for (int c = 0; c < C_NCASES; c++) {
      bool cluster = c % 2 == 1;
      snprintf(prefix, sizeof prefix, "cb%u.%s.%d", run_id, case_name[c], r);
      long errs = 0;
      if (c >= C_NB_S) {
        dps[c][r] =
            nonblocking(cluster, prefix, c >= C_NBP_S, &cores[c][r], &errs);
      } else {
        tg_limiter *lim = limiter(cluster, prefix, (uint32_t)threads, 0);
        dps[c][r] = blocking(lim, c >= C_B_S ? 1 : 0, &cores[c][r], &errs);
        tg_limiter_destroy(lim);
      }
      errors[c] += errs;
    }
    for (int s = 0; s < 2; s++) {
      long calls;
      exact_ok[s] = exact(s == 1, (unsigned)r, &calls) && exact_ok[s];
      exact_calls[s] += calls;
      tn[s][r] = abusive(s == 1, 0, (unsigned)r, &dn[s][r]);
      tc[s][r] = abusive(s == 1, 4096, (unsigned)r, &dc[s][r]);
    }
    fprintf(stderr, "cluster_bench: round %d of %d done\n", r + 1, rounds);
  }
  double med[C_NCASES], medc[C_NCASES];
  for (int c = 0; c < C_NCASES; c++) {
    med[c] = bench_median(dps[c], rounds);
    medc[c] = bench_median(cores[c], rounds);
  }
  for (int c = 0; c < C_NCASES; c += 2)
    for (int s = 0; s < 2; s++)
      printf("name=%s store=%s threads=%d decisions_per_s=%.0f cpu_cores=%.2f "
             "errors=%ld reps=%d stat=median%s%.2f\n",
             case_name[c + s], s ? "cluster3" : "single",
             c >= C_NB_S ? 1 : threads, med[c + s], medc[c + s], errors[c + s],
             rounds, s ? " ratio_to_single=" : " ratio_to_single=",
             med[c + s] / med[c]);
  for (int s = 0; s < 2; s++)
    printf("name=nb1000_vs_blocking store=%s ratio=%.2f (one thread, 1000 in "
           "flight, against %d threads of tg_hit)\n",
           s ? "cluster3" : "single", med[C_NB_S + s] / med[C_HIT_S + s],
           threads);
  for (int s = 0; s < 2; s++)
    printf("name=nb1000_policy2_vs_nb1000 store=%s ratio=%.2f (policies of "
           "two rules per second against single decisions, each one "
           "command)\n",
           s ? "cluster3" : "single", med[C_NBP_S + s] / med[C_NB_S + s]);
  for (int s = 0; s < 2; s++)
    printf("name=exact store=%s threads=%d keys=2000 limit=20 calls=%ld "
           "exact=%s\n",
           s ? "cluster3" : "single", threads, exact_calls[s],
           exact_ok[s] ? "yes" : "NO");
  for (int s = 0; s < 2; s++) {
    double ca = bench_median(dn[s], rounds), cb = bench_median(dc[s], rounds);
    double ta = bench_median(tn[s], rounds), tb = bench_median(tc[s], rounds);
    printf("name=deny_abusive store=%s calls_per_s=10000 limit_per_s=100 "
           "round_trips_per_decision_without=%.3f with=%.4f saved=%.1f%% "
           "client_cpu_us_per_decision_without=%.2f with=%.2f\n",
           s ? "cluster3" : "single", ta, tb, 100.0 * (1.0 - tb / ta), ca, cb);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("cluster_bench: this process used %.1f s of CPU\n",
         (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec);
  return 0;
}
