/* SPDX-License-Identifier: MIT */
/*
 * test_shm_bounded.c - every operation on a shared segment honours the
 * limiter's lock_timeout_ms while another process holds a lock and is
 * stopped (SIGSTOP: alive, so its lock must not be taken over, and never
 * released).
 *
 * A holder child maps the segment, takes a lock through the internal API
 * (src/store/lock.h) as tollgate would, and stops itself. Then:
 *
 *   1. the table lock: creating a key (hit, inc, set; into a full table
 *      too) and a cleaning pass with work to do answer TG_EBUSY; decisions
 *      on existing keys, reads of absent keys and resets take no table lock
 *      and answer at once; so does a sliding log's decision;
 *   2. a key left half reclaimed: settling it needs the table lock, so hit
 *      and reset answer TG_EBUSY;
 *   3. a sliding log's lock: hit, get, expires_at and reset of that key
 *      answer TG_EBUSY; other keys, new keys, a cleaning pass and a full
 *      table's reclaim go on, leaving that key alone;
 *   4. while a reset waits for that log, another process creates keys: the
 *      reset must not hold the table lock meanwhile (it used to, for 64
 *      waits), so every creation succeeds;
 *   5. the cleaning pass's lock: a pass returns at once, removing nothing;
 *   6. the segment's creation lock (flock): tg_limiter_new answers TG_EBUSY.
 *
 * Only the codes are asserted, never how long a call took (the host may be
 * loaded); how long each took is printed. The holder dies with the test
 * (PR_SET_PDEATHSIG) and is killed at the end of each case.
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/lock.h"
#include "store/table.h"
#include "tollgate.h"
#include "util.h"

#if defined(__SANITIZE_THREAD__)
#define TG_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TG_TEST_TSAN 1
#endif
#endif

#define T0 UINT64_C(1700000000000000) /* us */
#define MIN_US UINT64_C(60000000)
#define BOUND_MS 200u /* lock_timeout_ms of the limiters under test */

static const tg_quota q = {.limit = 5, .period_ms = 60000, .burst = 5};

static char seg_name[64];

static int unlink_seg(void **state) {
  (void)state;
  if (seg_name[0])
    tg_shm_unlink(seg_name);
  seg_name[0] = '\0';
  return 0;
}

static tg_config config(tg_algorithm alg, uint64_t capacity) {
  static unsigned serial;
  if (!seg_name[0])
    snprintf(seg_name, sizeof seg_name, "/tg-bounded-%ld-%u", (long)getpid(),
             serial++);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = capacity;
  cfg.shm_name = seg_name;
  cfg.clean_period_ms = 0;
  cfg.key_older_than_ms = 0;
  cfg.on_failure = TG_POLICY_ERROR;
  cfg.lock_timeout_ms = BOUND_MS;
  return cfg;
}

/* The test's own view of the segment, as the store maps it. */
typedef struct seg {
  void *mem;
  size_t size;
  tg__table t;
} seg;

static void seg_map(seg *s, const tg_config *cfg) {
  int fd = shm_open(cfg->shm_name, O_RDWR, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  s->size = (size_t)st.st_size;
  s->mem = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(s->mem != MAP_FAILED);
  tg__table_params p = {
      cfg->algorithm, cfg->capacity, cfg->capacity, cfg->sliding_max_entries,
      true,           BOUND_MS,      false};
  assert_int_equal(tg__table_attach(&s->t, s->mem, s->size, &p), TG_OK);
}

static void seg_unmap(seg *s) { munmap(s->mem, s->size); }

/* The slot holding key, by looking for it. */
static uint64_t slot_of(const seg *s, const char *key) {
  for (uint64_t i = 0; i < s->t.g.nslots; i++) {
    uint64_t c = s->t.slots[i].ctrl;
    if ((c & 3u) == 1u && ((c >> 2) & 0x1ffu) == strlen(key) &&
        memcmp(s->t.slots[i].key, key, strlen(key)) == 0)
      return i;
  }
  fail_msg("key %s not in the table", key);
  return 0;
}

static uint64_t *log_lock_of(const seg *s, const char *key) {
  uint64_t bi = s->t.slots[slot_of(s, key)].st.w[0];
  assert_true(bi >= 1 && bi <= s->t.g.nlogs);
  tg__log_block *b =
      (tg__log_block *)(void *)(s->t.base + s->t.g.log_off +
                                (bi - 1) * s->t.g.log_block_bytes);
  return &b->lock;
}

/* Forks a child that takes *w (an address in the segment, mapped before
 * the fork) and stops; returns once it is stopped. If half_reclaim, it also
 * moves that slot's state to the next generation first, as a reclaimer
 * stopped half way through would leave it. */
static pid_t hold_and_stop(uint64_t *w, tg__pair *half_reclaim) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    tg__wait wt = tg__wait_bound(10000);
    bool died;
    if (tg__lock_take(w, true, &wt, &died) != TG_OK)
      _exit(3);
    if (half_reclaim)
      __atomic_add_fetch(&half_reclaim->w[1], 1, __ATOMIC_RELEASE);
    raise(SIGSTOP);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
  assert_true(WIFSTOPPED(st));
  return pid;
}

static void release_holder(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* One call's code, with how long it took printed beside it. */
#define EXPECT(call, want)                                                     \
  do {                                                                         \
    uint64_t t0_ = mono_us();                                                  \
    int rc_ = (call);                                                          \
    uint64_t us_ = mono_us() - t0_;                                            \
    print_message("  %-58s %-10s %7.1f ms\n", #call, tg_err_name(rc_),         \
                  (double)us_ / 1000.0);                                       \
    assert_int_equal(rc_, (want));                                             \
  } while (0)

static tg_result r;
static uint64_t v;
static size_t removed;

/* ---- 1. the table lock ---- */

static void table_lock_held(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = (tg_algorithm)a;
    bool win = alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
    tg_config cfg = config(alg, 4);
    tg_limiter *lim;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    assert_int_equal(tg_hit_at(lim, T0, "old", 3, &q, 1, &r), TG_OK);
    assert_int_equal(tg_hit_at(lim, T0, "gone", 4, &q, 1, &r), TG_OK);
    seg s;
    seg_map(&s, &cfg);
    pid_t holder = hold_and_stop(&s.t.h->lock, NULL);
    print_message("%s, table lock held by a stopped process:\n",
                  tg_algorithm_name(alg));
    /* key creation waits, then gives up */
    EXPECT(tg_hit_at(lim, T0, "new", 3, &q, 1, &r), TG_EBUSY);
    assert_true(r.degraded);
    if (win)
      EXPECT(tg_inc_at(lim, T0, "new", 3, &q, 1, &v), TG_EBUSY);
    if (alg != TG_SLIDING_WINDOW)
      EXPECT(tg_set_at(lim, T0, "new", 3, &q, 1), TG_EBUSY);
    /* a cleaning pass with a decayed key to reclaim */
    EXPECT(tg_clean_at(lim, T0 + MIN_US, &removed), TG_EBUSY);
    assert_int_equal(removed, 0);
    /* nothing else needs it */
    EXPECT(tg_hit_at(lim, T0, "old", 3, &q, 1, &r), TG_OK);
    assert_true(r.allowed);
    EXPECT(tg_get_at(lim, T0, "old", 3, &q, &v), TG_OK);
    EXPECT(tg_expires_at_at(lim, T0, "old", 3, &q, &v), TG_OK);
    EXPECT(tg_get_at(lim, T0, "absent", 6, &q, &v), TG_OK);
    EXPECT(tg_hit_at(lim, T0, "absent", 6, &q, 0, &r), TG_OK); /* a peek */
    EXPECT(tg_reset(lim, "gone", 4), TG_OK);
    EXPECT(tg_reset(lim, "absent", 6), TG_OK);
    release_holder(holder);
    /* the holder is dead now: the next creation takes the lock over */
    EXPECT(tg_hit_at(lim, T0, "new", 3, &q, 1, &r), TG_OK);
    seg_unmap(&s);
    tg_limiter_destroy(lim);
    unlink_seg(NULL);
  }
}

/* A full table: the new key would reclaim a decayed one, under the lock. */
static void table_lock_held_full_table(void **state) {
  (void)state;
  tg_config cfg = config(TG_TOKEN_BUCKET, 2);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "a", 1, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "b", 1, &q, 1, &r), TG_OK);
  seg s;
  seg_map(&s, &cfg);
  pid_t holder = hold_and_stop(&s.t.h->lock, NULL);
  print_message("full table, table lock held by a stopped process:\n");
  EXPECT(tg_hit_at(lim, T0 + MIN_US, "c", 1, &q, 1, &r), TG_EBUSY);
  release_holder(holder);
  EXPECT(tg_hit_at(lim, T0 + MIN_US, "c", 1, &q, 1, &r), TG_OK);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

/* ---- 2. a half-done reclaim ---- */

static void half_reclaimed_key(void **state) {
  (void)state;
  tg_config cfg = config(TG_TOKEN_BUCKET, 4);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "half", 4, &q, 1, &r), TG_OK);
  seg s;
  seg_map(&s, &cfg);
  tg__pair *p = &s.t.slots[slot_of(&s, "half")].st;
  pid_t holder = hold_and_stop(&s.t.h->lock, p);
  print_message("a reclaim stopped half way, holding the table lock:\n");
  EXPECT(tg_hit_at(lim, T0, "half", 4, &q, 1, &r), TG_EBUSY);
  EXPECT(tg_reset(lim, "half", 4), TG_EBUSY);
  release_holder(holder);
  /* taken over: the reclaim is finished, the key starts afresh */
  EXPECT(tg_hit_at(lim, T0, "half", 4, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 4);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

/* ---- 3. a sliding log's lock ---- */

static void log_lock_held(void **state) {
  (void)state;
  tg_config cfg = config(TG_SLIDING_WINDOW, 3);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "held", 4, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "other", 5, &q, 1, &r), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "old", 3, &q, 1, &r), TG_OK);
  seg s;
  seg_map(&s, &cfg);
  pid_t holder = hold_and_stop(log_lock_of(&s, "held"), NULL);
  print_message("a sliding log's lock held by a stopped process:\n");
  EXPECT(tg_hit_at(lim, T0, "held", 4, &q, 1, &r), TG_EBUSY);
  EXPECT(tg_get_at(lim, T0, "held", 4, &q, &v), TG_EBUSY);
  EXPECT(tg_expires_at_at(lim, T0, "held", 4, &q, &v), TG_EBUSY);
  EXPECT(tg_reset(lim, "held", 4), TG_EBUSY);
  EXPECT(tg_hit_at(lim, T0, "other", 5, &q, 1, &r), TG_OK);
  /* a minute later every log has decayed: the pass reclaims the others,
   * the full table makes room for a new key, "held" stays */
  EXPECT(tg_clean_at(lim, T0 + 2 * MIN_US, &removed), TG_OK);
  assert_int_equal(removed, 2);
  EXPECT(tg_hit_at(lim, T0 + 2 * MIN_US, "new1", 4, &q, 1, &r), TG_OK);
  EXPECT(tg_hit_at(lim, T0 + 2 * MIN_US, "new2", 4, &q, 1, &r), TG_OK);
  assert_int_equal(tg_key_count(lim), 3);
  EXPECT(tg_hit_at(lim, T0 + 3 * MIN_US, "new3", 4, &q, 1, &r), TG_OK);
  assert_true(tg__table_holds(&s.t, "held", 4));
  release_holder(holder);
  EXPECT(tg_get_at(lim, T0 + 3 * MIN_US, "held", 4, &q, &v), TG_OK);
  assert_int_equal(v, 0);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

/* ---- 4. a reset waiting for a log blocks nobody else ---- */

typedef struct creators {
  int reset_rc;
  unsigned created, refused, other;
  int first_other;
} creators;

static void reset_waits_alone(void **state) {
  (void)state;
#ifdef TG_TEST_TSAN
  skip(); /* two processes at once on one segment: see shm_helpers.h */
#endif
  tg_config cfg = config(TG_SLIDING_WINDOW, 256);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "held", 4, &q, 1, &r), TG_OK);
  seg s;
  seg_map(&s, &cfg);
  pid_t holder = hold_and_stop(log_lock_of(&s, "held"), NULL);
  creators *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(c != MAP_FAILED);
  memset(c, 0, sizeof *c);
  fflush(stdout);
  pid_t resetter = fork();
  assert_true(resetter >= 0);
  if (resetter == 0) { /* waits up to 3 s for the log */
    tg_config rc = cfg;
    rc.lock_timeout_ms = 3000;
    tg_limiter *l;
    if (tg_limiter_new(&l, &rc) != TG_OK)
      _exit(2);
    c->reset_rc = tg_reset(l, "held", 4);
    tg_limiter_destroy(l);
    _exit(0);
  }
  sleep_ms(100); /* the reset is waiting by now */
  pid_t creator = fork();
  assert_true(creator >= 0);
  if (creator == 0) { /* 100 new keys, each allowed BOUND_MS of waiting */
    tg_limiter *l;
    if (tg_limiter_new(&l, &cfg) != TG_OK)
      _exit(2);
    for (unsigned i = 0; i < 100; i++) {
      char key[16];
      int n = snprintf(key, sizeof key, "k%u", i);
      int rc = tg_hit_at(l, T0, key, (size_t)n, &q, 1, &r);
      if (rc == TG_OK)
        c->created++;
      else if (rc == TG_EBUSY)
        c->refused++;
      else if (c->other++ == 0)
        c->first_other = rc;
    }
    tg_limiter_destroy(l);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(creator, &st, 0), creator);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(waitpid(resetter, &st, 0), resetter);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  release_holder(holder);
  print_message("while a reset waited for a stopped holder's log: %u keys "
                "created, %u TG_EBUSY, %u other (%s); the reset: %s\n",
                c->created, c->refused, c->other, tg_err_name(c->first_other),
                tg_err_name(c->reset_rc));
  assert_int_equal(c->created, 100);
  assert_int_equal(c->reset_rc, TG_EBUSY);
  munmap(c, sizeof *c);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

/* ---- 5. the cleaning pass's lock ---- */

static void clean_lock_held(void **state) {
  (void)state;
  tg_config cfg = config(TG_FIXED_WINDOW, 4);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), TG_OK);
  seg s;
  seg_map(&s, &cfg);
  pid_t holder = hold_and_stop(&s.t.h->clean_lock, NULL);
  print_message("the cleaning lock held by a stopped process:\n");
  removed = 9;
  EXPECT(tg_clean_at(lim, T0 + 2 * MIN_US, &removed), TG_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(tg_key_count(lim), 1);
  release_holder(holder);
  EXPECT(tg_clean_at(lim, T0 + 2 * MIN_US, &removed), TG_OK);
  assert_int_equal(removed, 1);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
}

/* ---- 6. the creation lock ---- */

static void creation_lock_held(void **state) {
  (void)state;
  tg_config cfg = config(TG_FIXED_WINDOW, 4);
  fflush(stdout);
  pid_t holder = fork();
  assert_true(holder >= 0);
  if (holder == 0) { /* creates the name, takes its flock, stops */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = shm_open(cfg.shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0)
      _exit(3);
    raise(SIGSTOP);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(holder, &st, WUNTRACED), holder);
  assert_true(WIFSTOPPED(st));
  print_message("the creation lock held by a stopped process:\n");
  tg_limiter *lim = (tg_limiter *)&cfg;
  EXPECT(tg_limiter_new(&lim, &cfg), TG_EBUSY);
  assert_null(lim);
  assert_non_null(strstr(tg_last_error(), "creating"));
  release_holder(holder);
  /* its creator died before sizing it: the next one creates the table */
  EXPECT(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), TG_OK);
  tg_limiter_destroy(lim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(table_lock_held, unlink_seg),
      cmocka_unit_test_teardown(table_lock_held_full_table, unlink_seg),
      cmocka_unit_test_teardown(half_reclaimed_key, unlink_seg),
      cmocka_unit_test_teardown(log_lock_held, unlink_seg),
      cmocka_unit_test_teardown(reset_waits_alone, unlink_seg),
      cmocka_unit_test_teardown(clean_lock_held, unlink_seg),
      cmocka_unit_test_teardown(creation_lock_held, unlink_seg),
  };
  return cmocka_run_group_tests(tests, NULL, unlink_seg);
}
