/* SPDX-License-Identifier: MIT */
/*
 * cleanup.c - background expiry: one thread per limiter that runs a cleaning
 * pass every clean_period_ms and sleeps on a condition variable in between,
 * so that destroying the limiter wakes and joins it at once.
 */
#include "cleanup.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

void tg__clean_bridge_cb(const tg__clean_item *items, size_t n, void *ctx) {
  const tg__clean_bridge *b = ctx;
  if (!b->fn)
    return;
  tg_expired e[64];
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    e[k].key = items[i].key;
    e[k].key_len = items[i].key_len;
    e[k].value = items[i].value;
    e[k].expired_at_ms = items[i].expired_at_ms;
    if (++k == 64 || i + 1 == n) {
      if (!b->fn)
        return; /* the limiter was destroyed from the hook: no more calls */
      (void)b->fn(b->alg, e, k, b->ctx); /* failure never stops deletion */
      k = 0;
    }
  }
}

struct tg__cleaner {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled on stop; waits use CLOCK_MONOTONIC */
  bool stop;         /* guarded by mu */
  int halt;          /* __atomic, read by a pass without mu: set with stop,
                        it ends the pass in progress at its next key */
  bool orphan;       /* the limiter was destroyed from this thread (its
                        before_clean): the thread frees it, and itself,
                        when the pass ends (guarded by mu) */
  uint64_t period_ms;
  tg_limiter *lim;
  void (*release)(tg_limiter *); /* frees the limiter, not the cleaner */
  pid_t pid;                     /* the process the thread runs in */
};

static void deadline_after(struct timespec *ts, uint64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  uint64_t ns = (uint64_t)ts->tv_nsec + (ms % 1000) * 1000000u;
  ts->tv_sec += (time_t)(ms / 1000 + ns / 1000000000u);
  ts->tv_nsec = (long)(ns % 1000000000u);
}

/* The cleaner whose thread this is (NULL on every other thread). */
static __thread tg__cleaner *this_cleaner;

static void *run(void *arg) {
  tg__cleaner *c = arg;
  this_cleaner = c;
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    struct timespec ts;
    deadline_after(&ts, c->period_ms);
    int rc = 0;
    while (!c->stop && rc != ETIMEDOUT)
      rc = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    if (c->stop)
      break;
    pthread_mutex_unlock(&c->mu);
    (void)tg__clean_pass(c->lim, &c->halt);
    pthread_mutex_lock(&c->mu);
  }
  bool orphan = c->orphan;
  pthread_mutex_unlock(&c->mu);
  if (orphan) {
    /* nobody joins this thread: it ends the limiter's life itself */
    pthread_detach(pthread_self());
    c->release(c->lim);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
  }
  return NULL;
}

int tg__cleaner_start(tg__cleaner **out, tg_limiter *lim, uint64_t period_ms,
                      void (*release)(tg_limiter *)) {
  tg__cleaner *c = calloc(1, sizeof *c);
  if (!c)
    return TG_ENOMEM;
  c->period_ms = period_ms;
  c->lim = lim;
  c->release = release;
  c->pid = getpid();
  pthread_condattr_t ca;
  int ok = pthread_condattr_init(&ca) == 0;
  ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
  ok = ok && pthread_cond_init(&c->cv, &ca) == 0;
  pthread_condattr_destroy(&ca);
  if (!ok) {
    free(c);
    return TG_ESTORE;
  }
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    pthread_cond_destroy(&c->cv);
    free(c);
    return TG_ESTORE;
  }
  if (pthread_create(&c->thread, NULL, run, c) != 0) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    return TG_ESTORE;
  }
  *out = c;
  return TG_OK;
}

bool tg__cleaner_defer(tg__cleaner *c) {
  if (!c || this_cleaner != c)
    return false;
  __atomic_store_n(&c->halt, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  c->orphan = true;
  pthread_mutex_unlock(&c->mu);
  return true;
}

void tg__cleaner_stop(tg__cleaner *c) {
  if (!c)
    return;
  if (getpid() != c->pid) {
    /* a child of fork(): the thread is its parent's, and the mutex may
     * have been copied locked (a fork while the thread held it): nothing
     * here to stop, wake or join */
    free(c);
    return;
  }
  __atomic_store_n(&c->halt, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}
