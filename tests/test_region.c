/* SPDX-License-Identifier: MIT */
/*
 * test_region.c - the table in memory the caller provides (tg_config.region,
 * tg_region_bytes), as nginx's shared zones use it.
 *
 *   1. sizes and validation: tg_region_bytes, too small, misaligned,
 *      combined with another store;
 *   2. initialise, attach, keep: a second limiter on the region sees the
 *      first's counts, and so does one created after every limiter was
 *      destroyed (what a server's reload does); the region is not unmapped;
 *   3. other parameters are TG_EMISMATCH and change nothing; a damaged
 *      header is TG_ECORRUPT; bytes that are not a table are initialised;
 *   4. a full region answers TG_EFULL through the failure policy;
 *   5. processes: a limiter made before fork() is used by four children on
 *      a MAP_SHARED anonymous region while the parent SIGKILLs one of them
 *      mid-traffic; no more than the limit is ever admitted, and afterwards
 *      every call succeeds (no lock left held) and a fresh key admits
 *      exactly the limit, for all five algorithms;
 *   6. tg_clock_latest: two processes whose clocks lag decide on one
 *      timeline (a bucket does not look fuller to the one behind).
 *
 * Children never assert (cmocka long-jumps): they write what they saw into
 * a MAP_SHARED area with __atomic operations and exit; the parent asserts.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/table.h"
#include "tollgate.h"

/* ThreadSanitizer models neither atomics nor locks between processes (see
 * test_shm.c): the concurrent multi-process part runs in the other builds. */
#if defined(__SANITIZE_THREAD__)
#define TG_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TG_TEST_TSAN 1
#endif
#endif

#define T0 UINT64_C(1700000000000000) /* us: a fixed instant */

static void *map_shared(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 // cppcheck-suppress invalidFunctionArg
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  return p;
}

/* A limiter on a fresh MAP_SHARED region of tg_region_bytes(cfg) bytes (its
 * size in *bytes, its address in cfg->region). */
static tg_limiter *new_on_region(tg_config *cfg, size_t *bytes) {
  *bytes = tg_region_bytes(cfg);
  cfg->region = map_shared(*bytes);
  cfg->region_bytes = *bytes;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, cfg), 0);
  return lim;
}

static void config(tg_config *cfg, tg_algorithm alg, uint64_t capacity) {
  tg_config_init(cfg);
  cfg->algorithm = alg;
  cfg->capacity = capacity;
  cfg->sliding_max_entries = 256;
  cfg->clean_period_ms = 0; /* no thread: fork() must not inherit one */
}

static void test_sizes_and_validation(void **state) {
  (void)state;
  tg_config cfg;
  config(&cfg, TG_FIXED_WINDOW, 1000);
  assert_int_equal(tg_region_bytes(NULL), 0);
  size_t bytes = tg_region_bytes(&cfg);
  assert_true(bytes >= 1000 * 48); /* a slot per key at least */
  cfg.capacity = 0;
  assert_int_equal(tg_region_bytes(&cfg), 0);
  cfg.capacity = 1000;
  cfg.long_keys = 2000;
  assert_int_equal(tg_region_bytes(&cfg), 0);
  cfg.long_keys = 0;
  cfg.algorithm = TG_SLIDING_WINDOW;
  assert_true(tg_region_bytes(&cfg) > bytes); /* the logs */
  cfg.algorithm = TG_FIXED_WINDOW;

  unsigned char *mem = map_shared(bytes + 64);
  tg_limiter *lim = NULL;
  cfg.region = mem;
  cfg.region_bytes = bytes - 1;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_null(lim);
  cfg.region = mem + 8;
  cfg.region_bytes = bytes;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.region = mem;
  cfg.shm_name = "/tg-test-region-never";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.shm_name = NULL;
  /* nothing was written by the refusals */
  for (size_t i = 0; i < bytes; i++)
    if (mem[i]) {
      fail_msg("byte %zu written by a refused tg_limiter_new", i);
    }
  /* a larger region is fine; the table uses tg_region_bytes of it */
  cfg.region_bytes = bytes + 64;
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  tg_limiter_destroy(lim);
  munmap(mem, bytes + 64);
}

static void test_attach_and_keep(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_config cfg;
    config(&cfg, (tg_algorithm)a, 500);
    size_t bytes = tg_region_bytes(&cfg);
    void *mem = map_shared(bytes);
    cfg.region = mem;
    cfg.region_bytes = bytes;
    tg_quota q = {.limit = 5, .period_ms = 60000, .burst = 5};
    tg_limiter *one, *two;
    tg_result r;
    assert_int_equal(tg_limiter_new(&one, &cfg), 0);
    for (int i = 0; i < 3; i++)
      assert_int_equal(tg_hit_at(one, T0, "k", 1, &q, 1, &r), 0);
    assert_int_equal(tg_limiter_new(&two, &cfg), 0);
    assert_int_equal(tg_hit_at(two, T0, "k", 1, &q, 1, &r), 0);
    assert_true(r.allowed);
    assert_int_equal(r.remaining, 1);
    assert_int_equal(tg_key_count(one), 1);
    tg_limiter_destroy(one);
    tg_limiter_destroy(two);
    /* every limiter gone, the region (still mapped: touching it would
     * fault otherwise) keeps the counts for the next */
    assert_int_equal(tg_limiter_new(&one, &cfg), 0);
    assert_int_equal(tg_hit_at(one, T0, "k", 1, &q, 1, &r), 0);
    assert_true(r.allowed);
    assert_int_equal(r.remaining, 0);
    assert_int_equal(tg_hit_at(one, T0, "k", 1, &q, 1, &r), 0);
    assert_false(r.allowed);
    tg_limiter_destroy(one);
    munmap(mem, bytes);
  }
}

static void test_mismatch_and_corrupt(void **state) {
  (void)state;
  tg_config cfg;
  config(&cfg, TG_TOKEN_BUCKET, 1000);
  size_t bytes = tg_region_bytes(&cfg);
  tg_config big = cfg;
  big.capacity = 4000;
  size_t room = tg_region_bytes(&big);
  unsigned char *mem = map_shared(room);
  /* bytes that are not a table are overwritten */
  memset(mem, 0xa5, room);
  cfg.region = mem;
  cfg.region_bytes = room;
  tg_limiter *lim, *other = NULL;
  tg_result r;
  tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 10};
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 4, &r), 0);
  assert_int_equal(r.remaining, 6);
  tg_limiter_destroy(lim);

  unsigned char *copy = malloc(bytes);
  assert_non_null(copy);
  memcpy(copy, mem, bytes);
  tg_config changed = cfg;
  changed.capacity = 4000;
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EMISMATCH);
  assert_null(other);
  changed = cfg;
  changed.algorithm = TG_LEAKY_BUCKET;
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EMISMATCH);
  changed = cfg;
  changed.capacity = 100000; /* would need more than the region has */
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EMISMATCH);
  changed = cfg;
  changed.long_keys = 10;
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EMISMATCH);
  /* parameters that need fewer bytes, given just those: still a mismatch
   * (the header is sound), not a corrupt table */
  changed = cfg;
  changed.capacity = 500;
  changed.region_bytes = tg_region_bytes(&changed);
  assert_true(changed.region_bytes < bytes);
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EMISMATCH);
  /* the same parameters with a region_bytes below the table's size */
  changed = cfg;
  changed.region_bytes = bytes - 64;
  assert_int_equal(tg_limiter_new(&other, &changed), TG_EINVAL);
  assert_non_null(strstr(tg_last_error(), "region_bytes"));
  assert_memory_equal(copy, mem, bytes); /* refusals change nothing */
  free(copy);

  /* the same parameters still attach, with the count */
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 0, &r), 0);
  assert_int_equal(r.remaining, 6);
  tg_limiter_destroy(lim);

  /* a damaged header (the magic intact) is refused, not reinitialised */
  tg__table_hdr *h = (tg__table_hdr *)mem;
  h->nslots += 1;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_ECORRUPT);
  h->nslots -= 1;
  h->total_bytes = room * 2; /* claims more than the region */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_ECORRUPT);
  munmap(mem, room);
}

static void test_full(void **state) {
  (void)state;
  tg_config cfg;
  config(&cfg, TG_FIXED_WINDOW, 8);
  size_t bytes;
  tg_limiter *lim = new_on_region(&cfg, &bytes);
  void *mem = cfg.region;
  tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result r;
  char key[16];
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "key%d", i);
    assert_int_equal(tg_hit_at(lim, T0, key, strlen(key), &q, 1, &r), 0);
  }
  assert_int_equal(tg_hit_at(lim, T0, "one more", 8, &q, 1, &r), TG_EFULL);
  assert_true(r.degraded);
  assert_true(r.allowed); /* the default policy, fail open */
  tg_limiter_destroy(lim);
  munmap(mem, bytes);
}

/* ---- processes ---- */

#define CHILDREN 4
#define PER_CHILD 150
#define LIMIT 200

typedef struct shared_counts {
  uint64_t admitted[CHILDREN + 1]; /* on "hot" (then "after") */
  uint64_t progress[CHILDREN + 1]; /* calls made */
  uint64_t errors[CHILDREN + 1];   /* calls that did not return 0 */
  int64_t first_error[CHILDREN + 1];
} shared_counts;

/* A child's traffic: the hot key, and a new key every few calls (a key's
 * creation takes the table lock, so a kill can land while it is held). */
static void traffic(tg_limiter *lim, const char *hot, int me, shared_counts *sc,
                    int per) {
  tg_quota q = {.limit = LIMIT, .period_ms = 86400000, .burst = LIMIT};
  tg_result r;
  char key[32];
  for (int i = 0; i < per; i++) {
    int rc = tg_hit_at(lim, T0, hot, strlen(hot), &q, 1, &r);
    if (rc == 0 && r.allowed)
      __atomic_add_fetch(&sc->admitted[me], 1, __ATOMIC_SEQ_CST);
    if (rc == 0 && i % 4 == 0) {
      snprintf(key, sizeof key, "%s-%d-%d-%d", hot, (int)getpid(), me, i);
      rc = tg_hit_at(lim, T0, key, strlen(key), &q, 1, &r);
    }
    if (rc != 0) {
      __atomic_add_fetch(&sc->errors[me], 1, __ATOMIC_SEQ_CST);
      __atomic_store_n(&sc->first_error[me], rc, __ATOMIC_SEQ_CST);
    }
    __atomic_add_fetch(&sc->progress[me], 1, __ATOMIC_SEQ_CST);
  }
}

static uint64_t sum(const uint64_t *v) {
  uint64_t s = 0;
  for (int i = 0; i <= CHILDREN; i++)
    s += __atomic_load_n(&v[i], __ATOMIC_SEQ_CST);
  return s;
}

static void test_processes_one_killed(void **state) {
  (void)state;
#ifdef TG_TEST_TSAN
  skip();
#endif
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_config cfg;
    config(&cfg, (tg_algorithm)a, 4096);
    size_t bytes;
    tg_limiter *lim = new_on_region(&cfg, &bytes);
    void *mem = cfg.region;
    shared_counts *sc = map_shared(sizeof *sc);

    pid_t pids[CHILDREN];
    for (int c = 0; c < CHILDREN; c++) {
      pids[c] = fork();
      assert_true(pids[c] >= 0);
      if (pids[c] == 0) {
        traffic(lim, "hot", c, sc, PER_CHILD);
        _exit(0);
      }
    }
    /* kill child 0 once it is well into its traffic */
    while (__atomic_load_n(&sc->progress[0], __ATOMIC_SEQ_CST) < 20)
      usleep(100);
    kill(pids[0], SIGKILL);
    for (int c = 0; c < CHILDREN; c++) {
      int st;
      assert_int_equal(waitpid(pids[c], &st, 0), pids[c]);
      if (c == 0)
        assert_true(WIFSIGNALED(st) || (WIFEXITED(st) && !WEXITSTATUS(st)));
      else
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    /* the victim may have died between its admission and counting it */
    uint64_t admitted = sum(sc->admitted);
    assert_true(admitted <= LIMIT);
    assert_true(admitted >= LIMIT - 1);
    assert_int_equal(sum(sc->errors), 0);

    /* afterwards: a new child and the parent on a fresh key, every call
     * answered (no lock left held), exactly the limit admitted */
    memset(sc, 0, sizeof *sc);
    pid_t late = fork();
    assert_true(late >= 0);
    if (late == 0) {
      traffic(lim, "after", 1, sc, PER_CHILD);
      _exit(0);
    }
    traffic(lim, "after", 0, sc, PER_CHILD);
    int st;
    assert_int_equal(waitpid(late, &st, 0), late);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (sum(sc->errors))
      fail_msg("%s: %llu calls failed, e.g. %s",
               tg_algorithm_name((tg_algorithm)a),
               (unsigned long long)sum(sc->errors),
               tg_err_name((int)(sc->first_error[0] ? sc->first_error[0]
                                                    : sc->first_error[1])));
    assert_int_equal(sum(sc->admitted), LIMIT);
    tg_limiter_destroy(lim);
    munmap(sc, sizeof *sc);
    munmap(mem, bytes);
  }
}

/* 6. One timeline for processes whose clocks lag (tg_clock_latest), as the
 * nginx module's workers each read the time their event-loop turn began:
 * each process's own time is its copy of own_time (after fork), made one
 * timeline by a word in shared memory. */
static uint64_t own_time;
static uint64_t latest_clock(void *word) {
  return tg_clock_latest(word, own_time);
}

typedef struct lag_seen {
  int a_allowed, a_late, b_control, b_allowed, errors;
  uint64_t b_time;
} lag_seen;

static void test_processes_share_one_timeline(void **state) {
  (void)state;
  uint64_t *word = map_shared(64);
  lag_seen *seen = map_shared(sizeof *seen);
  tg_config cfg;
  config(&cfg, TG_TOKEN_BUCKET, 64);
  cfg.clock = latest_clock;
  cfg.clock_ctx = word;
  size_t bytes;
  tg_limiter *lim = new_on_region(&cfg, &bytes);
  void *mem = cfg.region;
  /* 1000 per second (one per ms), burst 50 */
  tg_quota q = {1000, 1000, 50};
  tg_result r;

  /* process A, its turns at T0 and T0 + 100 ms: the burst, then one more */
  pid_t a = fork();
  assert_true(a >= 0);
  if (a == 0) {
    own_time = T0;
    for (int i = 0; i < 50; i++) {
      seen->errors += tg_hit(lim, "k", 1, &q, 1, &r) != 0;
      seen->a_allowed += r.allowed;
    }
    own_time = T0 + 100000;
    seen->errors += tg_hit(lim, "k", 1, &q, 1, &r) != 0;
    seen->a_late = r.allowed;
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(a, &st, 0), a);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* process B, whose turn began 82 ms before A's last: on its own time
   * the bucket (TAT T0 + 101 ms) is 83 ms ahead, beyond the burst's 50 ms,
   * and a call refused; on the shared timeline it decides at T0 + 100 ms,
   * where one more call fits */
  pid_t b = fork();
  assert_true(b >= 0);
  if (b == 0) {
    own_time = T0 + 18000;
    seen->errors += tg_hit_at(lim, own_time, "k", 1, &q, 1, &r) != 0;
    seen->b_control = r.allowed;
    seen->errors += tg_hit(lim, "k", 1, &q, 1, &r) != 0;
    seen->b_allowed = r.allowed;
    seen->b_time = tg_clock_latest(word, own_time);
    _exit(0);
  }
  assert_int_equal(waitpid(b, &st, 0), b);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(seen->errors, 0);
  assert_int_equal(seen->a_allowed, 50);
  assert_true(seen->a_late);
  assert_false(seen->b_control);
  assert_true(seen->b_allowed);
  assert_int_equal(seen->b_time, T0 + 100000);
  assert_int_equal(*word, T0 + 100000);

  /* in one process: never back; raised by a later time; a word beyond
   * TG_CLOCK_LEAD_MAX_US ahead is a clock that stepped back: reset */
  assert_int_equal(tg_clock_latest(word, T0), T0 + 100000);
  assert_int_equal(tg_clock_latest(word, T0 + 200000), T0 + 200000);
  uint64_t back = T0 + 200000 - TG_CLOCK_LEAD_MAX_US;
  assert_int_equal(tg_clock_latest(word, back), T0 + 200000);
  assert_int_equal(tg_clock_latest(word, back - 1), back - 1);
  assert_int_equal(*word, back - 1);
  assert_int_equal(tg_clock_latest(NULL, 7), 7);
  tg_limiter_destroy(lim);
  munmap(mem, bytes);
  munmap(seen, sizeof *seen);
  munmap(word, 64);
}

/* A limiter with a cleaning thread, made before fork(): the child has no
 * such thread, only a copy of its mutex, which the fork may have caught
 * held (the thread takes it as it starts, and around every wait). The
 * child uses the limiter and destroys it without waiting for that
 * thread: every child ends, and the parent's thread still stops. Forked
 * right after tg_limiter_new, the moment a server forks its workers, and
 * with a 1 ms period that keeps the thread busy. */
static void test_fork_with_a_cleaning_thread(void **state) {
  (void)state;
  for (int run = 0; run < 60; run++) {
    tg_config cfg;
    config(&cfg, TG_TOKEN_BUCKET, 100);
    cfg.clean_period_ms = run % 2 ? 1 : 60000;
    size_t bytes;
    tg_limiter *lim = new_on_region(&cfg, &bytes);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      tg_quota q = {.limit = 3, .period_ms = 1000};
      tg_result r;
      int rc = tg_hit_at(lim, T0, "k", 1, &q, 1, &r);
      tg_limiter_destroy(lim);
      _exit(rc == 0 && r.allowed ? 0 : 1);
    }
    /* a child stuck in tg_limiter_destroy never ends: 30 s is far more
     * than one hit and a free take */
    int status = 0;
    bool ended = false;
    for (int i = 0; i < 3000 && !ended; i++) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      assert_true(w >= 0);
      if (w == pid)
        ended = true;
      else
        usleep(10000);
    }
    if (!ended) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail_msg("run %d: the child hung in tg_limiter_destroy", run);
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    tg_limiter_destroy(lim);
    munmap(cfg.region, bytes);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_and_validation),
      cmocka_unit_test(test_attach_and_keep),
      cmocka_unit_test(test_mismatch_and_corrupt),
      cmocka_unit_test(test_full),
      cmocka_unit_test(test_processes_one_killed),
      cmocka_unit_test(test_processes_share_one_timeline),
      cmocka_unit_test(test_fork_with_a_cleaning_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
