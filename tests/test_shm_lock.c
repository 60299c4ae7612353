/* SPDX-License-Identifier: MIT */
/*
 * test_shm_lock.c - tollgate's own lock (src/store/lock.h), on its own:
 * every kind of word a shared segment can hold, owners that are gone in
 * every way a process can be, one deadline per operation, fork, and threads
 * under ThreadSanitizer.
 *
 *   1. identity: pid and start time (/proc/self/stat field 22); a fork's
 *      child has its own at once, though the parent computed its own first
 *      (the page the identity lives in is wiped in the child).
 *   2. words no live process holds are taken over, and the taker is told
 *      (so it repairs): garbage (pid 0, bit 31, beyond PID_MAX_LIMIT), a
 *      reaped process, a zombie, a recycled pid (live pid, other start
 *      time), this very pid with another start time.
 *   3. words a live process holds are waited for, then TG_EBUSY, and left
 *      as they were: a running or stopped process, a process whose main
 *      thread exited while another runs (a zombie leader), a live pid with
 *      an unknown (0) start time.
 *   4. one operation, one deadline: a second lock after the first one's
 *      wait gave up is only looked at, never waited for.
 *   5. one taker: of many processes waiting for a dead holder's lock,
 *      exactly one is told the holder died.
 *   6. wake-ups: a release wakes a sleeping waiter (shared and private);
 *      random words never crash anything.
 *   7. a thread stress (the point under ThreadSanitizer): a counter
 *      incremented under the lock, in both modes, is exact and race-free.
 *
 * Children never call cmocka: they report through a pipe or a shared area
 * and exit; the parent asserts after waitpid. No timing is asserted.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/lock.h"
#include "tollgate.h"
#include "util.h"

/* ---- helpers ---- */

/* Field 22 of a /proc/<pid>/stat file (the start time), or 0. */
static uint64_t start_time_of(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  if (!p)
    return 0;
  unsigned field = 2;
  for (; *p; p++)
    if (*p == ' ' && ++field == 22)
      return strtoull(p + 1, NULL, 10);
  return 0;
}

static uint64_t identity_of(pid_t pid) {
  return (uint64_t)pid | (start_time_of(pid) & 0xffffffffu) << 32;
}

/* A child that dies with the test, whatever happens to the test. */
static pid_t fork_child(void) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
  return pid;
}

/* The identity of a process that has exited and been reaped. */
static uint64_t dead_identity(void) {
  uint64_t *id = shared_area(sizeof *id);
  pid_t pid = fork_child();
  if (pid == 0) {
    *id = tg__lock_self();
    _exit(0);
  }
  assert_int_equal(waitpid(pid, NULL, 0), pid);
  uint64_t v = *id;
  munmap(id, sizeof *id);
  assert_int_equal(v & TG__LOCK_PID_MASK, (uint64_t)pid);
  return v;
}

/* A child that pauses until killed; *id receives its identity. */
static pid_t live_child(uint64_t *id) {
  uint64_t *area = shared_area(sizeof *area);
  pid_t pid = fork_child();
  if (pid == 0) {
    __atomic_store_n(area, tg__lock_self(), __ATOMIC_RELEASE);
    for (;;)
      pause();
  }
  while (__atomic_load_n(area, __ATOMIC_ACQUIRE) == 0)
    sleep_ms(1);
  *id = *area;
  munmap(area, sizeof *area);
  return pid;
}

/* Takes w with a bound of ms, as one operation would. */
static int take(uint64_t *w, uint32_t ms, bool *died) {
  tg__wait wt = tg__wait_bound(ms);
  return tg__lock_take(w, true, &wt, died);
}

/* ---- 1. identity ---- */

static void identity_is_pid_and_start_time(void **state) {
  (void)state;
  uint64_t me = tg__lock_self();
  assert_int_equal(me, identity_of(getpid()));
  assert_int_equal(me & (TG__LOCK_WAITERS | TG__LOCK_RESERVED), 0);
  assert_int_equal(tg__lock_self(), me); /* cached, and stable */
  struct stat ns;
  assert_int_equal(stat("/proc/self/ns/pid", &ns), 0);
  assert_int_equal(tg__lock_pidns(), (uint64_t)ns.st_ino);
  assert_false(tg__lock_owner_gone(me)); /* this process: alive */
  assert_false(tg__lock_owner_gone(0));  /* free */
}

/* The parent has computed (and cached) its identity: a child, and its own
 * child, must still see theirs, with no atfork handler. */
static void identity_after_fork(void **state) {
  (void)state;
  uint64_t parent = tg__lock_self();
  uint64_t *got = shared_area(4 * sizeof *got);
  pid_t pid = fork_child();
  if (pid == 0) {
    got[0] = tg__lock_self();
    got[1] = identity_of(getpid());
    pid_t gpid = fork();
    if (gpid == 0) {
      got[2] = tg__lock_self();
      got[3] = identity_of(getpid());
      _exit(0);
    }
    waitpid(gpid, NULL, 0);
    _exit(0);
  }
  assert_int_equal(waitpid(pid, NULL, 0), pid);
  assert_int_not_equal(got[0], parent);
  assert_int_equal(got[0], got[1]);
  assert_int_equal(got[0] & TG__LOCK_PID_MASK, (uint64_t)pid);
  assert_int_not_equal(got[2], got[0]);
  assert_int_equal(got[2], got[3]);
  munmap(got, 4 * sizeof *got);
}

/* ---- 2. gone owners ---- */

/* Every way of taking a word whose owner is gone: it is taken, the taker
 * is told, and the word then names the taker. */
static void expect_taken_over(uint64_t word, const char *what) {
  static const uint32_t bounds[] = {0, 50};
  for (size_t b = 0; b < 2; b++) {
    uint64_t w = word;
    bool died = false;
    int rc = take(&w, bounds[b], &died);
    if (rc != TG_OK || !died)
      print_error("%s (%#" PRIx64 "), bound %u ms: %s, died %d\n", what, word,
                  bounds[b], tg_err_name(rc), died);
    assert_int_equal(rc, TG_OK);
    assert_true(died);
    assert_int_equal(w & ~TG__LOCK_WAITERS, tg__lock_self());
    tg__lock_release(&w, true);
    assert_int_equal(w, 0);
  }
  uint64_t w = word;
  bool died = false;
  assert_int_equal(tg__lock_try(&w, true, &died), TG_OK);
  assert_true(died);
  tg__lock_release(&w, true);
  assert_true(tg__lock_owner_gone(word));
}

static void garbage_words_taken_over(void **state) {
  (void)state;
  uint64_t me = tg__lock_self(), pid = me & TG__LOCK_PID_MASK;
  const struct {
    const char *what;
    uint64_t w;
  } cases[] = {
      {"all ones", UINT64_MAX},
      {"bit 31 set", TG__LOCK_RESERVED | pid | (me >> 32 << 32)},
      {"pid 0, a start time", UINT64_C(77) << 32},
      {"pid 0, waiters", TG__LOCK_WAITERS},
      {"pid 0, waiters and bit 31", TG__LOCK_WAITERS | TG__LOCK_RESERVED},
      {"pid PID_MAX_LIMIT + 1", UINT64_C(4194305)},
      {"pid 2^30 - 1", TG__LOCK_PID_MASK | UINT64_C(5) << 32},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_taken_over(cases[i].w, cases[i].what);
}

static void gone_owners_taken_over(void **state) {
  (void)state;
  uint64_t me = tg__lock_self();
  /* reaped */
  uint64_t dead = dead_identity();
  expect_taken_over(dead, "a reaped process");
  expect_taken_over(dead | TG__LOCK_WAITERS, "a reaped process, waiters");
  /* exited, not reaped: a zombie */
  uint64_t *id = shared_area(sizeof *id);
  pid_t z = fork_child();
  if (z == 0) {
    *id = tg__lock_self();
    _exit(0);
  }
  siginfo_t si;
  assert_int_equal(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT), 0);
  expect_taken_over(*id, "a zombie");
  waitpid(z, NULL, 0);
  munmap(id, sizeof *id);
  /* a live process with another start time: the pid was recycled */
  uint64_t live;
  pid_t l = live_child(&live);
  expect_taken_over(live ^ UINT64_C(1) << 32, "a recycled pid");
  expect_taken_over((live & TG__LOCK_PID_MASK) | UINT64_C(0xffffffff) << 32,
                    "a recycled pid, start 2^32 - 1");
  kill_reap(l);
  /* this very pid, another start: an earlier process with our pid */
  expect_taken_over(me ^ UINT64_C(1) << 40, "this pid, another start");
}

/* ---- 3. live owners ---- */

static void expect_held(uint64_t word, const char *what) {
  uint64_t w = word;
  bool died = true;
  int rc = take(&w, 30, &died);
  if (rc != TG_EBUSY)
    print_error("%s (%#" PRIx64 "): %s\n", what, word, tg_err_name(rc));
  assert_int_equal(rc, TG_EBUSY);
  assert_false(died);
  /* left as it was, but for the WAITERS bit the waiter set */
  assert_int_equal(w & ~TG__LOCK_WAITERS, word & ~TG__LOCK_WAITERS);
  w = word;
  assert_int_equal(tg__lock_try(&w, true, &died), TG_EBUSY);
  assert_int_equal(w, word);
  w = word;
  assert_int_equal(take(&w, 0, &died), TG_EBUSY);
  assert_false(tg__lock_owner_gone(word));
}

static void *thread_lives(void *arg) {
  (void)arg;
  for (;;)
    pause();
  return NULL;
}

static void live_owners_waited_for(void **state) {
  (void)state;
  uint64_t live;
  pid_t l = live_child(&live);
  expect_held(live, "a live process");
  expect_held(live | TG__LOCK_WAITERS, "a live process, waiters");
  /* an unknown start time: the pid alone decides, and it is alive */
  expect_held(live & TG__LOCK_PID_MASK, "a live pid, start unknown");
  /* stopped: still alive */
  kill(l, SIGSTOP);
  int st;
  waitpid(l, &st, WUNTRACED);
  assert_true(WIFSTOPPED(st));
  expect_held(live, "a stopped process");
  kill_reap(l);
  expect_taken_over(live, "the same process, killed");
  /* another thread of this process */
  expect_held(tg__lock_self(), "this process");

  /* a process whose main thread exited while another thread runs: the
   * kernel shows it as a zombie, but it is alive */
  uint64_t *id = shared_area(sizeof *id);
  pid_t z = fork_child();
  if (z == 0) {
    pthread_t t;
    *id = tg__lock_self();
    pthread_create(&t, NULL, thread_lives, NULL);
    pthread_exit(NULL);
  }
  while (__atomic_load_n(id, __ATOMIC_ACQUIRE) == 0)
    sleep_ms(1);
  sleep_ms(50); /* the main thread has exited by now */
  expect_held(*id, "a zombie leader with a live thread");
  kill_reap(z);
  munmap(id, sizeof *id);
}

/* ---- 4. one deadline ---- */

static void one_deadline_per_operation(void **state) {
  (void)state;
  uint64_t live;
  pid_t l = live_child(&live);
  uint64_t a = live, b = live;
  tg__wait wt = tg__wait_bound(40);
  bool died;
  assert_false(wt.started); /* an uncontended operation never reads it */
  assert_int_equal(tg__lock_take(&a, true, &wt, &died), TG_EBUSY);
  assert_true(wt.started);
  assert_true(tg__wait_over(&wt));
  /* the second lock of the same operation: looked at, not waited for */
  assert_int_equal(tg__lock_take(&b, true, &wt, &died), TG_EBUSY);
  /* and a free one is still taken */
  uint64_t c = 0;
  assert_int_equal(tg__lock_take(&c, true, &wt, &died), TG_OK);
  tg__lock_release(&c, true);
  /* a gone owner found after the deadline is still taken over */
  kill_reap(l);
  assert_int_equal(tg__lock_take(&b, true, &wt, &died), TG_OK);
  assert_true(died);
  tg__lock_release(&b, true);
}

/* ---- 5. one taker ---- */

#define TAKERS 6

typedef struct takers {
  uint64_t lock;
  unsigned ready, go;
  int rc[TAKERS];
  unsigned died[TAKERS];
  uint64_t inside, max_inside; /* processes inside at once */
} takers;

static void one_taker_told(void **state) {
  (void)state;
  takers *t = shared_area(sizeof *t);
  t->lock = dead_identity();
  pid_t pids[TAKERS];
  for (unsigned i = 0; i < TAKERS; i++) {
    pids[i] = fork_child();
    if (pids[i] == 0) {
      __atomic_add_fetch(&t->ready, 1, __ATOMIC_ACQ_REL);
      while (!__atomic_load_n(&t->go, __ATOMIC_ACQUIRE))
        ;
      bool died;
      t->rc[i] = take(&t->lock, 10000, &died);
      t->died[i] = died;
      if (t->rc[i] == TG_OK) {
        uint64_t n = __atomic_add_fetch(&t->inside, 1, __ATOMIC_RELAXED);
        if (n > __atomic_load_n(&t->max_inside, __ATOMIC_RELAXED))
          __atomic_store_n(&t->max_inside, n, __ATOMIC_RELAXED);
        sleep_ms(2);
        __atomic_sub_fetch(&t->inside, 1, __ATOMIC_RELAXED);
        tg__lock_release(&t->lock, true);
      }
      _exit(0);
    }
  }
  while (__atomic_load_n(&t->ready, __ATOMIC_ACQUIRE) < TAKERS)
    sleep_ms(1);
  __atomic_store_n(&t->go, 1, __ATOMIC_RELEASE);
  unsigned told = 0;
  for (unsigned i = 0; i < TAKERS; i++) {
    int st;
    assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(t->rc[i], TG_OK);
    told += t->died[i];
  }
  assert_int_equal(told, 1);
  assert_int_equal(t->max_inside, 1);
  assert_int_equal(t->lock, 0);
  munmap(t, sizeof *t);
}

/* ---- 6. wake-ups, random words ---- */

typedef struct waker {
  uint64_t lock;
  bool shared;
  int rc;
  bool died;
} waker;

static void *waiter_thread(void *arg) {
  waker *k = arg;
  tg__wait wt = tg__wait_bound(10000);
  k->rc = tg__lock_take(&k->lock, k->shared, &wt, &k->died);
  if (k->rc == TG_OK)
    tg__lock_release(&k->lock, k->shared);
  return NULL;
}

static void release_wakes_a_waiter(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++) {
    waker k = {0, shared == 1, -1, true};
    bool died;
    tg__wait wt = tg__wait_bound(0);
    assert_int_equal(tg__lock_take(&k.lock, k.shared, &wt, &died), TG_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter_thread, &k), 0);
    /* the waiter marks the word before it sleeps */
    while (!(__atomic_load_n(&k.lock, __ATOMIC_ACQUIRE) & TG__LOCK_WAITERS))
      sleep_ms(1);
    tg__lock_release(&k.lock, k.shared);
    pthread_join(t, NULL);
    assert_int_equal(k.rc, TG_OK);
    assert_false(k.died);
    assert_int_equal(k.lock, 0);
  }
}

/* Random words: each is taken over (told), or held by a live process
 * (TG_EBUSY, untouched); never anything else. Low pids are favoured so
 * that many words name real processes. */
static void random_words(void **state) {
  (void)state;
  uint64_t s = UINT64_C(0x9e3779b97f4a7c15);
  unsigned taken = 0, held = 0;
  for (int i = 0; i < 20000; i++) {
    uint64_t w = rng_next(&s);
    if (i % 2)
      w = (w & ~TG__LOCK_PID_MASK) | (w & 0x3ff);
    if (i % 7 == 0)
      w &= TG__LOCK_PID_MASK | TG__LOCK_WAITERS;
    if (w == 0)
      continue;
    uint64_t v = w;
    bool died = false;
    int rc = tg__lock_try(&v, true, &died);
    if (rc == TG_OK) {
      assert_true(died);
      tg__lock_release(&v, true);
      taken++;
    } else {
      assert_int_equal(rc, TG_EBUSY);
      assert_int_equal(v, w);
      held++;
    }
  }
  print_message("random words: %u taken over, %u held by live processes\n",
                taken, held);
  assert_true(taken > 0 && held > 0);
}

/* ---- 7. threads ---- */

#define THREADS 4
#define ROUNDS 20000

typedef struct stress {
  uint64_t lock;
  bool shared;
  uint64_t counter; /* plain: only the lock orders it */
  uint64_t taken;   /* atomic: how many times the lock was taken */
  int errors;
} stress;

static void *stress_thread(void *arg) {
  stress *s = arg;
  for (int i = 0; i < ROUNDS; i++) {
    tg__wait wt = tg__wait_bound(60000);
    bool died;
    int rc = i % 3 == 0 ? tg__lock_try(&s->lock, s->shared, &died)
                        : tg__lock_take(&s->lock, s->shared, &wt, &died);
    if (rc == TG_EBUSY && i % 3 == 0)
      continue;
    if (rc != TG_OK || died) {
      __atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
      continue;
    }
    s->counter++;
    __atomic_add_fetch(&s->taken, 1, __ATOMIC_RELAXED);
    tg__lock_release(&s->lock, s->shared);
  }
  return NULL;
}

static void threads_stress(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++) {
    stress s = {0, shared == 1, 0, 0, 0};
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
      assert_int_equal(pthread_create(&t[i], NULL, stress_thread, &s), 0);
    for (int i = 0; i < THREADS; i++)
      pthread_join(t[i], NULL);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.lock, 0);
    /* no increment lost: each was made alone */
    assert_int_equal(s.counter, s.taken);
    assert_true(s.taken >= (uint64_t)THREADS * ROUNDS * 2 / 3);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(identity_is_pid_and_start_time),
      cmocka_unit_test(identity_after_fork),
      cmocka_unit_test(garbage_words_taken_over),
      cmocka_unit_test(gone_owners_taken_over),
      cmocka_unit_test(live_owners_waited_for),
      cmocka_unit_test(one_deadline_per_operation),
      cmocka_unit_test(one_taker_told),
      cmocka_unit_test(release_wakes_a_waiter),
      cmocka_unit_test(random_words),
      cmocka_unit_test(threads_stress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
