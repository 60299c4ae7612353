/* SPDX-License-Identifier: MIT */
/*
 * test_shm_dead.c - processes that die holding a lock of a shared segment:
 * a worker killed holding a sliding log's lock (or the table's, or the
 * cleaning pass's) does not block the others and the log validates; a lost
 * wake-up; a log left mid-step; a block lost by a kill must not stop the
 * table from reclaiming.
 *
 * A child never asserts (cmocka long-jumps, and only the parent reports): it
 * writes what it saw into a MAP_SHARED | MAP_ANONYMOUS area mapped before
 * fork, with __atomic operations, and exits with a code; the parent asserts
 * after waitpid. Every segment name carries the pid, and the teardown of
 * every test unlinks the names it handed out, pass or fail.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, flock */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm_helpers.h"
#include "store/lock.h"
#include "store/table.h"
#include "tollgate.h"
#include "util.h"

/* ThreadSanitizer cannot check memory shared between processes: it emulates
 * 16-byte atomics with a lock private to each process (two processes' CASes
 * on one slot are then not atomic with respect to each other, and the
 * exactness tests fail for TSan's reason, not the table's), and it sees no
 * order between processes (a lock released in one and taken in another
 * orders nothing it knows of). So the tests that run processes
 * concurrently on one segment are skipped under TSan (SKIP_UNDER_TSAN,
 * shm_helpers.h); they run in the debug, clang and ASan builds. TSan checks
 * the table's threads in test_concurrency. */

/* =========================================================================
 * dead lock holders
 * ========================================================================= */

typedef struct log_area {
  const char *name;
  uint64_t iters; /* victim's calls so far (atomic) */
  int go_on;      /* others keep calling while set (atomic) */
  uint64_t calls, errors, busy, max_call_us;
  int first_error;
} log_area;

static const tg_quota q_log = {.limit = 400, .period_ms = 20, .burst = 0};

static int log_config_new(log_area *a, tg_limiter **lim) {
  tg_config cfg;
  shm_config(&cfg, a->name, TG_SLIDING_WINDOW, 16);
  cfg.sliding_max_entries = 512;
  int rc = tg_limiter_new(lim, &cfg);
  if (rc != TG_OK)
    note_error(&a->first_error, &a->errors, rc);
  return rc;
}

/* Hits the one key in a tight loop until killed. Its times are distinct
 * microseconds, so nearly every call appends and prunes. */
static int log_victim(unsigned idx, void *arg) {
  (void)idx;
  log_area *a = arg;
  tg_limiter *lim;
  if (log_config_new(a, &lim) != TG_OK)
    return 2;
  for (;;) {
    tg_result r;
    int rc = tg_hit_at(lim, realtime_us(), "log", 3, &q_log, 1, &r);
    if (rc != TG_OK)
      note_error(&a->first_error, &a->errors, rc);
    __atomic_fetch_add(&a->iters, 1, __ATOMIC_RELEASE);
  }
}

/* Another process on the same key: each call must come back, at once.
 * It calls for 10 ms and 100 calls at least, and while go_on is set (so
 * that, queued before the victim dies, it is still there after: a busy
 * host may run it to its end before the kill otherwise). */
static int log_other(unsigned idx, void *arg) {
  (void)idx;
  log_area *a = arg;
  tg_limiter *lim;
  if (log_config_new(a, &lim) != TG_OK)
    return 2;
  const uint64_t end = mono_us() + 10000u;
  for (int i = 0; i < 100 || mono_us() < end ||
                  __atomic_load_n(&a->go_on, __ATOMIC_ACQUIRE);
       i++) {
    uint64_t t0 = mono_us();
    tg_result r;
    int rc = tg_hit_at(lim, realtime_us(), "log", 3, &q_log, 1, &r);
    __atomic_fetch_add(&a->calls, 1, __ATOMIC_RELAXED);
    if (rc == TG_EBUSY) { /* a lost wake-up: see lost_wakeup */
      __atomic_fetch_add(&a->busy, 1, __ATOMIC_RELAXED);
      continue;
    }
    atomic_max(&a->max_call_us, mono_us() - t0);
    if (rc != TG_OK)
      note_error(&a->first_error, &a->errors, rc);
  }
  tg_limiter_destroy(lim);
  return 0;
}

/* The one LIVE key's log block. */
static tg__log_block *only_block(const seg *s) {
  for (uint64_t i = 0; i < s->t.h->nslots; i++)
    if ((s->t.slots[i].ctrl & 3u) == 1u) {
      uint64_t bi = s->t.slots[i].st.w[0];
      if (bi >= 1 && bi <= s->t.h->nlogs)
        return (tg__log_block *)(void *)(s->t.base + s->t.g.log_off +
                                         (bi - 1) * s->t.h->log_block_bytes);
    }
  return NULL;
}

static void dead_log_holder(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  log_area *a = shared_area(sizeof *a);
  a->name = name_new("log");
  tg_limiter *lim;
  assert_int_equal(log_config_new(a, &lim), TG_OK);
  tg_config cfg;
  shm_config(&cfg, a->name, TG_SLIDING_WINDOW, 16);
  cfg.sliding_max_entries = 512;
  tg_result r;
  assert_int_equal(tg_hit(lim, "log", 3, &q_log, 1, &r), TG_OK);
  seg s;
  assert_int_equal(seg_map(&s, a->name, &cfg), TG_OK);
  tg__log_block *b = only_block(&s);
  assert_non_null(b);

  uint64_t rng = seed_of(5);
  unsigned tries = 0, confirmed = 0, concurrent = 0, mid_step = 0;
  /* Even tries: the victim runs alone, so after the kill the futex word
   * tells whether it died holding the log's lock; then others come.
   * Odd tries: the others are already queued on the lock when it dies. */
  while (tries < 200 && (confirmed < 5 || concurrent < 5)) {
    bool together = tries++ % 2 == 1;
    __atomic_store_n(&a->iters, 0, __ATOMIC_RELAXED);
    pid_t victim = spawn(log_victim, 0, a);
    uint64_t deadline = mono_us() + 5000000u;
    while (__atomic_load_n(&a->iters, __ATOMIC_ACQUIRE) < 2000 &&
           mono_us() < deadline)
      sched_yield();
    pid_t others[2] = {0, 0};
    __atomic_store_n(&a->go_on, together, __ATOMIC_RELEASE);
    if (together)
      for (unsigned i = 0; i < 2; i++)
        others[i] = spawn(log_other, i, a);
    sleep_us(rng_next(&rng) % 3000u);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    if (together) {
      /* they outlive the victim, whatever the scheduler did */
      __atomic_store_n(&a->go_on, 0, __ATOMIC_RELEASE);
      concurrent++;
    } else {
      if (owner_died(&b->lock)) {
        confirmed++;
        tg__table_check c;
        assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
        mid_step += c.errors > 0; /* see dead_log_mid_step */
      }
      for (unsigned i = 0; i < 2; i++)
        others[i] = spawn(log_other, i, a);
    }
    unsigned blocked;
    assert_int_equal(reap_all(others, 2, mono_us() + 10000000u, &blocked), 0);
    assert_false(owner_died(&b->lock)); /* recovered and made consistent */
    tg__table_check c;
    assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
    if (c.errors)
      print_error("try %u: %s\n", tries, c.first_error);
    assert_int_equal(c.errors, 0);
    assert_int_equal(c.live_slots, 1);
    uint64_t v;
    assert_int_equal(tg_get(lim, "log", 3, &q_log, &v), TG_OK);
    assert_true(v <= q_log.limit);
  }
  print_message("dead log holder: %u tries, %u victims died holding the "
                "log's lock (%u of them mid-step, by the validator), %u "
                "killed with others queued; %" PRIu64
                " calls by the others, slowest %" PRIu64 " us, %" PRIu64
                " TG_EBUSY\n",
                tries, confirmed, mid_step, concurrent, a->calls,
                a->max_call_us, a->busy);
  if (a->errors)
    print_error("%" PRIu64 " errors, first %s\n", a->errors,
                tg_err_name(a->first_error));
  seg_unmap(&s);
  tg_limiter_destroy(lim);
  assert_int_equal(a->errors, 0);
  assert_true(confirmed >= 1);
  /* nobody waited for a lock until the 2 s timeout, but for the lost
   * wake-ups (TG_EBUSY after 2 s) that lost_wakeup pins down (1.5 s: room
   * for a slow build on a busy host) */
  assert_true(a->max_call_us < 1500000u);
  munmap(a, sizeof *a);
}

/* A lost wake-up. A SIGKILL can leave a lock free while a waiter sleeps
 * with nobody left to wake it: when the process that a release woke is
 * killed before it takes the lock, and a third process takes it on the
 * fast path, the sleeper's wake-up is gone (glibc's robust mutexes, which
 * tollgate used before its own lock, met this now and then in
 * dead_log_holder). Here the state is made on purpose: H holds the log's
 * lock, B waits for it, and H frees the lock word without a wake-up, then
 * exits. A waiter that looks at the lock again from time to time (a wait in
 * slices, within the same 2 s budget) takes it at once. */
typedef struct wake_job {
  const char *name;
  const tg_config *cfg;
  int holding, release; /* atomic flags */
  int rc;
  uint64_t took_us;
} wake_job;

static int lost_wake_holder(unsigned idx, void *arg) {
  (void)idx;
  wake_job *j = arg;
  seg s;
  if (seg_map(&s, j->name, j->cfg) != TG_OK)
    return 2;
  tg__log_block *b = only_block(&s);
  if (!b || take_lock(&b->lock) != TG_OK)
    return 3;
  __atomic_store_n(&j->holding, 1, __ATOMIC_RELEASE);
  uint64_t deadline = mono_us() + 10000000u;
  while (!__atomic_load_n(&j->release, __ATOMIC_ACQUIRE))
    if (mono_us() > deadline)
      return 4;
  /* free, and the sleeper's wake-up gone with a dead process */
  __atomic_store_n(&b->lock, 0, __ATOMIC_RELEASE);
  return 0;
}

static int lost_wake_waiter(unsigned idx, void *arg) {
  (void)idx;
  wake_job *j = arg;
  tg_limiter *lim;
  if (tg_limiter_new(&lim, j->cfg) != TG_OK)
    return 2;
  uint64_t t0 = mono_us();
  tg_result r;
  j->rc = tg_hit_at(lim, T0 + 1000u, "lw", 2, &q_log, 1, &r);
  j->took_us = mono_us() - t0;
  tg_limiter_destroy(lim);
  return 0;
}

static void lost_wakeup(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  const char *name = name_new("lost-wake");
  tg_config cfg;
  shm_config(&cfg, name, TG_SLIDING_WINDOW, 16);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_result r;
  assert_int_equal(tg_hit_at(lim, T0, "lw", 2, &q_log, 1, &r), TG_OK);
  wake_job *j = shared_area(sizeof *j);
  j->name = name;
  j->cfg = &cfg;
  pid_t pids[2];
  pids[0] = spawn(lost_wake_holder, 0, j);
  uint64_t deadline = mono_us() + 5000000u;
  while (!__atomic_load_n(&j->holding, __ATOMIC_ACQUIRE) &&
         mono_us() < deadline)
    sleep_us(1000);
  assert_true(__atomic_load_n(&j->holding, __ATOMIC_ACQUIRE));
  pids[1] = spawn(lost_wake_waiter, 1, j);
  sleep_us(100000); /* B is asleep on the lock by now */
  __atomic_store_n(&j->release, 1, __ATOMIC_RELEASE);
  unsigned blocked;
  assert_int_equal(reap_all(pids, 2, mono_us() + 10000000u, &blocked), 0);
  tg_limiter_destroy(lim);
  if (j->rc != TG_OK || j->took_us > 1500000u)
    print_error("waiter: %s after %" PRIu64 " us (the holder let go %u ms "
                "after it began to wait)\n",
                tg_err_name(j->rc), j->took_us, 100u);
  assert_int_equal(j->rc, TG_OK);
  /* well before the lock's 2 s timeout (it let go after 100 ms; 1.5 s:
   * room for a slow build on a busy host) */
  assert_true(j->took_us < 1500000u);
  assert_int_equal(validate(name, &cfg).errors, 0);
  munmap(j, sizeof *j);
}

/* A process that died in the middle of a log step, as a SIGKILL can leave
 * it: a prune at T0 + 100 ms had advanced head past the expired entry, then
 * the process died before storing n and sum. The next lock of the log
 * repairs it (the call that died never got an answer, so the log it
 * started from, pruned or not, is right). Until then the table is as sound
 * as the crash contract promises: the validator, meant for "after
 * crashes", should count such a log as repairable, like a half-done
 * reclaim ("pending"), not as a broken invariant. */
typedef struct mid_step_job {
  const char *name;
  const tg_config *cfg;
} mid_step_job;

static int die_mid_prune(unsigned idx, void *arg) {
  (void)idx;
  mid_step_job *j = arg;
  seg s;
  if (seg_map(&s, j->name, j->cfg) != TG_OK)
    return 2;
  tg__log_block *b = only_block(&s);
  if (!b || take_lock(&b->lock) != TG_OK)
    return 3;
  b->head = (b->head + 1) % s.t.h->log_entries; /* n and sum not yet */
  return 0; /* exits holding the log's lock */
}

static void dead_log_mid_step(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  const char *name = name_new("mid-step");
  tg_config cfg;
  shm_config(&cfg, name, TG_SLIDING_WINDOW, 16);
  cfg.sliding_max_entries = 8;
  const tg_quota q = {.limit = 10, .period_ms = 100, .burst = 0};
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_result r;
  for (uint64_t ms = 0; ms < 4; ms++)
    assert_int_equal(tg_hit_at(lim, T0 + ms * 1000u, "mid", 3, &q, 1, &r),
                     TG_OK);
  mid_step_job j = {name, &cfg};
  pid_t pid = spawn(die_mid_prune, 0, &j);
  unsigned blocked;
  assert_int_equal(reap_all(&pid, 1, mono_us() + 5000000u, &blocked), 0);

  seg s;
  assert_int_equal(seg_map(&s, name, &cfg), TG_OK);
  assert_true(owner_died(&only_block(&s)->lock));
  tg__table_check before, after;
  assert_int_equal(tg__table_validate(&s.t, &before), TG_OK);
  /* the next lock repairs: the entries of T0 + 1..3 ms are left */
  uint64_t v;
  assert_int_equal(tg_get_at(lim, T0 + 100000u, "mid", 3, &q, &v), TG_OK);
  assert_int_equal(v, 3);
  assert_false(owner_died(&only_block(&s)->lock));
  assert_int_equal(tg__table_validate(&s.t, &after), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0 + 100000u, "mid", 3, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 4);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
  assert_int_equal(after.errors, 0);
  if (before.errors)
    print_error("validate, dead writer not yet repaired: %" PRIu64
                " errors (%s), pending %" PRIu64 "\n",
                before.errors, before.first_error, before.pending);
  assert_int_equal(before.errors, 0);
}

/* A process killed between taking a log block from the arena and
 * publishing its key loses the block (tollgate.h, "Shared memory", says so).
 * What it must not do is stop the table from reclaiming: here the table holds
 * capacity - 1 keys, all decayed long ago, and a new key finds no free block;
 * the insert reclaims only when live == capacity, so it answers TG_EFULL
 * instead of reclaiming a decayed key. (The memory store does the same when its
 * long-key arena is exhausted with long_keys < capacity.) */
static int die_after_block_alloc(unsigned idx, void *arg) {
  (void)idx;
  mid_step_job *j = arg;
  seg s;
  if (seg_map(&s, j->name, j->cfg) != TG_OK)
    return 2;
  if (take_lock(&s.t.h->lock) != TG_OK)
    return 3;
  s.t.h->log_bump++; /* block_alloc_locked's bump, then SIGKILL */
  raise(SIGKILL);
  return 4;
}

static void leaked_block_blocks_reclaim(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  const char *name = name_new("leak");
  tg_config cfg;
  shm_config(&cfg, name, TG_SLIDING_WINDOW, 4);
  const tg_quota q = {.limit = 10, .period_ms = 100, .burst = 0};
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  mid_step_job j = {name, &cfg};
  pid_t pid = spawn(die_after_block_alloc, 0, &j);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  tg_result r;
  const char *keys[] = {"k1", "k2", "k3"};
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(tg_hit_at(lim, T0, keys[i], 2, &q, 1, &r), TG_OK);
  tg__table_check c = validate(name, &cfg);
  assert_int_equal(c.errors, 0);
  assert_int_equal(c.leaked, 1);
  assert_int_equal(c.live_slots, 3);
  /* a minute later every log is empty: any of the three can go */
  int rc = tg_hit_at(lim, T0 + 60000000u, "k4", 2, &q, 1, &r);
  tg_limiter_destroy(lim);
  if (rc != TG_OK)
    print_error("new key, 3 decayed keys, 1 block leaked: %s\n",
                tg_err_name(rc));
  assert_int_equal(rc, TG_OK);
}

/* A child that takes one of the table's locks directly and exits with it
 * held. */
typedef struct holder_job {
  const char *name;
  const tg_config *cfg;
  bool clean_lock;
} holder_job;

static int die_holding(unsigned idx, void *arg) {
  (void)idx;
  holder_job *j = arg;
  seg s;
  if (seg_map(&s, j->name, j->cfg) != TG_OK)
    return 2;
  uint64_t *m = j->clean_lock ? &s.t.h->clean_lock : &s.t.h->lock;
  if (take_lock(m) != TG_OK)
    return 3;
  return 0; /* exits holding m */
}

static void dead_table_holder(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  const char *name = name_new("table-holder");
  tg_config cfg;
  shm_config(&cfg, name, TG_FIXED_WINDOW, 16);
  cfg.key_older_than_ms = 0;
  const tg_quota q = {.limit = 5, .period_ms = 10, .burst = 0};
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_result r;
  assert_int_equal(tg_hit_at(lim, T0, "old", 3, &q, 1, &r), TG_OK);
  seg s;
  assert_int_equal(seg_map(&s, name, &cfg), TG_OK);

  /* the table lock: a new key needs it */
  holder_job j = {name, &cfg, false};
  pid_t pid = spawn(die_holding, 0, &j);
  unsigned blocked;
  assert_int_equal(reap_all(&pid, 1, mono_us() + 5000000u, &blocked), 0);
  assert_true(owner_died(&s.t.h->lock));
  uint64_t t0 = mono_us();
  assert_int_equal(tg_hit_at(lim, T0, "new", 3, &q, 1, &r), TG_OK);
  assert_true(mono_us() - t0 < 1500000u); /* no wait for the 2 s timeout */
  assert_true(r.allowed);
  assert_false(owner_died(&s.t.h->lock));
  tg__table_check c;
  assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
  assert_int_equal(c.errors, 0);
  assert_int_equal(c.live_slots, 2);
  assert_int_equal(c.live_counter, 2);

  /* the cleaning lock: a pass must still run, not report "busy" forever */
  j.clean_lock = true;
  pid = spawn(die_holding, 0, &j);
  assert_int_equal(reap_all(&pid, 1, mono_us() + 5000000u, &blocked), 0);
  assert_true(owner_died(&s.t.h->clean_lock));
  size_t removed = 0;
  assert_int_equal(tg_clean_at(lim, T0 + 60000000u, &removed), TG_OK);
  assert_int_equal(removed, 2);
  assert_false(owner_died(&s.t.h->clean_lock));
  assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
  assert_int_equal(c.errors, 0);
  assert_int_equal(c.live_slots, 0);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(dead_log_holder, unlink_names),
      cmocka_unit_test_teardown(lost_wakeup, unlink_names),
      cmocka_unit_test_teardown(dead_log_mid_step, unlink_names),
      cmocka_unit_test_teardown(dead_table_holder, unlink_names),
      cmocka_unit_test_teardown(leaked_block_blocks_reclaim, unlink_names),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, unlink_names));
}
