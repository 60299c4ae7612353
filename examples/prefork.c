/* SPDX-License-Identifier: MIT */
/*
 * prefork.c - worker processes sharing one limit through a named
 * shared-memory segment, the way the workers of a pre-fork server would.
 *
 * The parent creates nothing before it forks: each worker opens the zone by
 * name (the first one to get there creates it, the others attach), then
 * serves requests from a few clients as fast as it likes for half a second.
 * The limit, 10 per second per client, is one limit for all the workers
 * together: the total admitted is 10 per client whatever the number of
 * workers. The parent collects each worker's count through a pipe, prints
 * them, and removes the zone's name at the end.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tollgate.h>

#define WORKERS 4
#define CLIENTS 3
#define RUN_MS 500

/* 10 per second per client, over any one-second interval */
static const tg_quota per_client = {.limit = 10, .period_ms = 1000};

/* What a worker reports to the parent: one write, shorter than PIPE_BUF, so
 * the workers' reports never interleave. */
typedef struct report {
  int worker;
  int failed;
  unsigned admitted[CLIENTS];
} report;

static long elapsed_ms(const struct timespec *since) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - since->tv_sec) * 1000 +
         (now.tv_nsec - since->tv_nsec) / 1000000;
}

static void worker(const char *zone, int id, int out) {
  report rep = {.worker = id};
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_SLIDING_WINDOW;
  cfg.capacity = 4096; /* clients at once, across all workers */
  cfg.shm_name = zone; /* created by the first worker, attached by the rest */
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    fprintf(stderr, "worker %d: %s\n", id, tg_strerror(rc));
    rep.failed = 1;
  } else {
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (elapsed_ms(&start) < RUN_MS && !rep.failed) {
      for (int c = 0; c < CLIENTS; c++) { /* a request from each client */
        char key[32];
        int n = snprintf(key, sizeof key, "client-%d", c);
        tg_result r;
        rc = tg_hit(lim, key, (size_t)n, &per_client, 1, &r);
        if (rc != TG_OK) {
          fprintf(stderr, "worker %d: %s\n", id, tg_strerror(rc));
          rep.failed = 1;
        } else if (r.allowed) {
          rep.admitted[c]++;
        }
      }
      struct timespec gap = {0, 1000000}; /* 1 ms between rounds */
      nanosleep(&gap, NULL);
    }
    tg_limiter_destroy(lim); /* unmaps; the zone lives on */
  }
  if (write(out, &rep, sizeof rep) != (ssize_t)sizeof rep)
    rep.failed = 1;
  _exit(rep.failed);
}

int main(void) {
  /* one zone per run, so that two runs never share a limit */
  char zone[64];
  snprintf(zone, sizeof zone, "/tollgate-prefork-%ld", (long)getpid());
  int fds[2];
  if (pipe(fds) != 0) {
    perror("pipe");
    return 1;
  }
  fflush(stdout);
  for (int i = 0; i < WORKERS; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      close(fds[0]);
      worker(zone, i, fds[1]);
    }
  }
  close(fds[1]);

  unsigned total = 0, per[CLIENTS] = {0};
  int failed = 0, reports = 0;
  report rep;
  while (read(fds[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
    unsigned sum = 0;
    for (int c = 0; c < CLIENTS; c++) {
      sum += rep.admitted[c];
      per[c] += rep.admitted[c];
    }
    printf("worker %d admitted %u\n", rep.worker, sum);
    total += sum;
    failed |= rep.failed;
    reports++;
  }
  close(fds[0]);
  for (int i = 0; i < WORKERS; i++) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      failed = 1;
  }
  tg_shm_unlink(zone); /* the memory goes with the last process mapping it */

  for (int c = 0; c < CLIENTS; c++)
    printf("client-%d: %u admitted\n", c, per[c]);
  printf("total admitted: %u by %d workers (limit %u per client per "
         "second, %d clients)\n",
         total, WORKERS, (unsigned)per_client.limit, CLIENTS);
  return failed || reports != WORKERS;
}
