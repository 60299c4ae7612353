/* SPDX-License-Identifier: MIT */
/*
 * test_shm.c - the shared-memory store's segment between real processes:
 * its life (create, attach, unlink, permissions, refusals), a creation race,
 * cleaning across processes and a full segment. Exactness and kill tests
 * are in test_shm_kill.c, dead lock holders in test_shm_dead.c.
 *
 * A child never asserts (cmocka long-jumps, and only the parent reports): it
 * writes what it saw into a MAP_SHARED | MAP_ANONYMOUS area mapped before
 * fork, with __atomic operations, and exits with a code; the parent asserts
 * after waitpid. Every segment name carries the pid, and the teardown of
 * every test unlinks the names it handed out, pass or fail.
 *
 *   1. create, attach, unlink: a second process sees the first's state;
 *      permissions (0600 by default, shm_mode whatever the umask);
 *      TG_EMISMATCH, TG_ECORRUPT, bad names, a creator that died holding
 *      the creation lock, limiters that outlive the name.
 *   2. creation race: P processes open one new name at once: one table.
 *   3. cleaning and a full table: any attached process may run a pass, two
 *      never run at once, before_clean sees what a pass reclaims; a full
 *      segment answers TG_EFULL with each limiter's own policy.
 *   4. a sliding log holding few entries stays in the first pages of its
 *      ring, however long it lives.
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
 * 1. create, attach, unlink
 * ========================================================================= */

typedef struct attach_job {
  const char *name;
  int rc_new, rc_hit;
  uint64_t seen, keys;
} attach_job;

static const tg_quota q_minute = {.limit = 100, .period_ms = 60000, .burst = 0};

static int attach_child(unsigned idx, void *arg) {
  (void)idx;
  attach_job *j = arg;
  tg_config cfg;
  shm_config(&cfg, j->name, TG_FIXED_WINDOW, 128);
  tg_limiter *lim;
  j->rc_new = tg_limiter_new(&lim, &cfg);
  if (j->rc_new != TG_OK)
    return 1;
  tg_get_at(lim, T0, "k", 1, &q_minute, &j->seen);
  j->keys = tg_key_count(lim);
  tg_result r;
  for (int i = 0; i < 2; i++)
    if ((j->rc_hit = tg_hit_at(lim, T0, "k", 1, &q_minute, 1, &r)) != TG_OK)
      return 2;
  tg_limiter_destroy(lim);
  return 0;
}

static void attach_sees_state(void **state) {
  (void)state;
  const char *name = name_new("attach");
  tg_config cfg;
  shm_config(&cfg, name, TG_FIXED_WINDOW, 128);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_result r;
  for (int i = 0; i < 3; i++)
    assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q_minute, 1, &r), TG_OK);
  assert_int_equal(r.count, 3);

  attach_job *j = shared_area(sizeof *j);
  j->name = name;
  pid_t pid = spawn(attach_child, 0, j);
  unsigned blocked;
  assert_int_equal(reap_all(&pid, 1, mono_us() + 10000000u, &blocked), 0);
  assert_int_equal(j->rc_new, TG_OK);
  assert_int_equal(j->seen, 3); /* the child saw the parent's hits */
  assert_int_equal(j->keys, 1);
  assert_int_equal(j->rc_hit, TG_OK);
  assert_int_equal(hit_count(lim, T0, "k", &q_minute), 5); /* and vice versa */
  assert_int_equal(tg_key_count(lim), 1);
  munmap(j, sizeof *j);
  tg_limiter_destroy(lim);
  assert_int_equal(validate(name, &cfg).errors, 0);
}

static void permissions(void **state) {
  (void)state;
  struct {
    unsigned mode; /* shm_mode, or 0 for the default */
    mode_t umask_; /* umask while creating */
    unsigned expect;
  } cases[] = {
      {0, 022, 0600},    /* default: only the same user */
      {0, 0, 0600},      /* default, even with a permissive umask */
      {0644, 077, 0644}, /* shm_mode wins over a strict umask */
      {0660, 022, 0660}, /* group write survives umask 022 */
      {0604, 0, 0604},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *name = name_new("mode");
    tg_config cfg;
    shm_config(&cfg, name, TG_TOKEN_BUCKET, 16);
    if (cases[i].mode)
      cfg.shm_mode = cases[i].mode;
    mode_t old = umask(cases[i].umask_);
    tg_limiter *lim;
    int rc = tg_limiter_new(&lim, &cfg);
    umask(old);
    assert_int_equal(rc, TG_OK);
    if (seg_mode(name) != cases[i].expect)
      print_error("case %zu: mode %o, expected %o\n", i, seg_mode(name),
                  cases[i].expect);
    assert_int_equal(seg_mode(name), cases[i].expect);
    /* attaching with another shm_mode changes nothing: it is for creation */
    tg_config other = cfg;
    other.shm_mode = 0666;
    tg_limiter *lim2;
    assert_int_equal(tg_limiter_new(&lim2, &other), TG_OK);
    assert_int_equal(seg_mode(name), cases[i].expect);
    tg_limiter_destroy(lim2);
    tg_limiter_destroy(lim);
  }
  /* bits beyond 0777 are refused */
  tg_config cfg;
  shm_config(&cfg, name_new("mode-bad"), TG_TOKEN_BUCKET, 16);
  tg_limiter *lim = NOT_SET;
  cfg.shm_mode = 01600;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_null(lim);
  cfg.shm_mode = 04600;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
}

static void mismatch(void **state) {
  (void)state;
  const char *name = name_new("mismatch");
  tg_config base;
  shm_config(&base, name, TG_SLIDING_WINDOW, 128);
  base.long_keys = 16;
  base.sliding_max_entries = 32;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &base), TG_OK);
  tg_result r;
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q_minute, 1, &r), TG_OK);

  for (int alg = 0; alg < TG_ALGORITHM_COUNT; alg++) {
    tg_config c = base;
    c.algorithm = (tg_algorithm)alg;
    tg_limiter *other = NOT_SET;
    assert_int_equal(tg_limiter_new(&other, &c),
                     alg == TG_SLIDING_WINDOW ? TG_OK : TG_EMISMATCH);
    if (alg != TG_SLIDING_WINDOW)
      assert_null(other);
    tg_limiter_destroy(other);
  }
  tg_config c = base;
  c.capacity = 256;
  tg_limiter *other = NULL;
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  c.capacity = 127;
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  c = base;
  c.long_keys = 8;
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  c.long_keys = 0; /* means "= capacity": 128, not 16 */
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  c = base;
  c.sliding_max_entries = 64;
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  /* what is not the table's may differ */
  c = base;
  c.on_failure = TG_POLICY_FAIL_OPEN;
  c.key_older_than_ms = 5;
  c.shm_mode = 0644;
  assert_int_equal(tg_limiter_new(&other, &c), TG_OK);
  assert_int_equal(hit_count(other, T0, "k", &q_minute), 1);
  tg_limiter_destroy(other);
  /* a mismatch touched nothing */
  assert_int_equal(hit_count(lim, T0, "k", &q_minute), 1);
  tg_limiter_destroy(lim);

  /* long_keys 0 and long_keys = capacity are the same table */
  const char *name2 = name_new("mismatch-lk");
  shm_config(&c, name2, TG_FIXED_WINDOW, 64);
  assert_int_equal(tg_limiter_new(&lim, &c), TG_OK);
  c.long_keys = 64;
  assert_int_equal(tg_limiter_new(&other, &c), TG_OK);
  tg_limiter_destroy(other);
  /* a fixed-window table still records sliding_max_entries */
  c.sliding_max_entries = 7;
  assert_int_equal(tg_limiter_new(&other, &c), TG_EMISMATCH);
  tg_limiter_destroy(lim);
}

/* Creates `name` holding `size` bytes: random ones, or zeros. */
static void plant(const char *name, size_t size, bool random_bytes,
                  uint64_t *sum) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  *sum = 0;
  if (size > 0) {
    unsigned char *p =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    uint64_t s = seed_of(size);
    for (size_t i = 0; i < size; i++) {
      p[i] = random_bytes ? (unsigned char)rng_next(&s) : 0;
      *sum = *sum * 31 + p[i];
    }
    munmap(p, size);
  }
  close(fd);
}

static uint64_t checksum(const char *name, size_t *size) {
  int fd = shm_open(name, O_RDONLY, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  *size = (size_t)st.st_size;
  uint64_t sum = 0;
  if (*size > 0) {
    unsigned char *p = mmap(NULL, *size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    for (size_t i = 0; i < *size; i++)
      sum = sum * 31 + p[i];
    munmap(p, *size);
  }
  close(fd);
  return sum;
}

static void corrupt(void **state) {
  (void)state;
  tg_config cfg;
  shm_config(&cfg, NULL, TG_FIXED_WINDOW, 256);
  tg__table_params p = params_of(&cfg);
  size_t bytes = tg__table_bytes(&p);
  assert_true(bytes > 4096);
  struct {
    size_t size;
    bool random_bytes;
    int expect;
  } cases[] = {
      {0, false, TG_OK},                  /* empty: a creator died at once */
      {bytes, false, TG_OK},              /* zeros of the right size: a creator
                                             died before publishing the magic */
      {16, true, TG_ECORRUPT},            /* shorter than a header */
      {4096, true, TG_ECORRUPT},          /* random, wrong size */
      {4096, false, TG_ECORRUPT},         /* zeros of the wrong size */
      {bytes, true, TG_ECORRUPT},         /* random bytes of the right size */
      {bytes + 4096, false, TG_ECORRUPT}, /* zeros, one page too many */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *name = name_new("corrupt");
    uint64_t sum;
    plant(name, cases[i].size, cases[i].random_bytes, &sum);
    cfg.shm_name = name;
    tg_limiter *lim = NOT_SET;
    int rc = tg_limiter_new(&lim, &cfg);
    if (rc != cases[i].expect)
      print_error("case %zu (%zu bytes): %s\n", i, cases[i].size,
                  tg_err_name(rc));
    assert_int_equal(rc, cases[i].expect);
    if (rc == TG_OK) {
      tg_result r;
      assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q_minute, 1, &r), TG_OK);
      assert_int_equal(r.count, 1);
      tg_limiter_destroy(lim);
      assert_int_equal(validate(name, &cfg).errors, 0);
    } else {
      assert_null(lim);
      size_t size;
      assert_int_equal(checksum(name, &size), sum); /* left untouched */
      assert_int_equal(size, cases[i].size);
    }
  }

  /* a sound table of another version is not ours to read either: not
   * corrupt, another format (TG_EMISMATCH, not TG_ECORRUPT since version 2 of
   * the format, which changed the locks) */
  const char *name = name_new("corrupt-version");
  cfg.shm_name = name;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_limiter_destroy(lim);
  seg s;
  assert_int_equal(seg_map(&s, name, &cfg), TG_OK);
  s.t.h->version = TG__TABLE_VERSION + 1;
  seg_unmap(&s);
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EMISMATCH);
  assert_non_null(strstr(tg_last_error(), "version"));
}

/* A creator killed while it holds the creation lock, after sizing the
 * segment and before publishing the magic. */
typedef struct creator_job {
  const char *name;
  size_t bytes;
  int holding; /* the creator holds the lock (atomic) */
  int rc_new, rc_hit;
  uint64_t count;
} creator_job;

static int dying_creator(unsigned idx, void *arg) {
  (void)idx;
  creator_job *j = arg;
  int fd = shm_open(j->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) != 0 || ftruncate(fd, (off_t)j->bytes) != 0)
    return 1;
  __atomic_store_n(&j->holding, 1, __ATOMIC_RELEASE);
  for (;;)
    pause(); /* until SIGKILL */
}

static int late_opener(unsigned idx, void *arg) {
  (void)idx;
  creator_job *j = arg;
  tg_config cfg;
  shm_config(&cfg, j->name, TG_FIXED_WINDOW, 256);
  tg_limiter *lim;
  j->rc_new = tg_limiter_new(&lim, &cfg); /* waits for the lock */
  if (j->rc_new != TG_OK)
    return 1;
  tg_result r;
  j->rc_hit = tg_hit_at(lim, T0, "k", 1, &q_minute, 1, &r);
  j->count = r.count;
  tg_limiter_destroy(lim);
  return 0;
}

static void creator_died(void **state) {
  (void)state;
  tg_config cfg;
  shm_config(&cfg, name_new("creator"), TG_FIXED_WINDOW, 256);
  tg__table_params p = params_of(&cfg);
  creator_job *j = shared_area(sizeof *j);
  j->name = cfg.shm_name;
  j->bytes = tg__table_bytes(&p);
  pid_t creator = spawn(dying_creator, 0, j);
  uint64_t deadline = mono_us() + 5000000u;
  while (!__atomic_load_n(&j->holding, __ATOMIC_ACQUIRE) &&
         mono_us() < deadline)
    sleep_us(1000);
  assert_true(__atomic_load_n(&j->holding, __ATOMIC_ACQUIRE));
  pid_t opener = spawn(late_opener, 0, j);
  sleep_us(50000); /* the opener is now waiting for the lock */
  assert_int_equal(waitpid(opener, NULL, WNOHANG), 0);
  kill(creator, SIGKILL);
  waitpid(creator, NULL, 0);
  unsigned blocked;
  assert_int_equal(reap_all(&opener, 1, mono_us() + 10000000u, &blocked), 0);
  assert_int_equal(j->rc_new, TG_OK);
  assert_int_equal(j->rc_hit, TG_OK);
  assert_int_equal(j->count, 1);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(hit_count(lim, T0, "k", &q_minute), 1);
  tg_limiter_destroy(lim);
  assert_int_equal(validate(cfg.shm_name, &cfg).errors, 0);
  munmap(j, sizeof *j);
}

static void unlink_and_names(void **state) {
  (void)state;
  /* removing an absent name is not an error */
  assert_int_equal(tg_shm_unlink(name_new("absent")), TG_OK);
  assert_int_equal(tg_shm_unlink(name_new("absent")), TG_OK);

  /* after unlink, attached limiters keep working and keep sharing */
  const char *name = name_new("unlink");
  tg_config cfg;
  shm_config(&cfg, name, TG_FIXED_WINDOW, 64);
  tg_limiter *a, *b, *c;
  assert_int_equal(tg_limiter_new(&a, &cfg), TG_OK);
  assert_int_equal(tg_limiter_new(&b, &cfg), TG_OK);
  tg_result r;
  assert_int_equal(tg_hit_at(a, T0, "k", 1, &q_minute, 1, &r), TG_OK);
  assert_int_equal(tg_shm_unlink(name), TG_OK);
  assert_true(shm_open(name, O_RDWR, 0) < 0 && errno == ENOENT);
  assert_int_equal(tg_hit_at(a, T0, "k", 1, &q_minute, 1, &r), TG_OK);
  assert_int_equal(r.count, 2);
  assert_int_equal(tg_hit_at(b, T0, "k", 1, &q_minute, 1, &r), TG_OK);
  assert_int_equal(r.count, 3);
  assert_int_equal(hit_count(a, T0, "k", &q_minute), 3);
  /* the name is free again: a new limiter gets a new, empty table */
  assert_int_equal(tg_limiter_new(&c, &cfg), TG_OK);
  assert_int_equal(hit_count(c, T0, "k", &q_minute), 0);
  assert_int_equal(tg_hit_at(c, T0, "k", 1, &q_minute, 1, &r), TG_OK);
  assert_int_equal(hit_count(a, T0, "k", &q_minute), 3);
  tg_limiter_destroy(a);
  assert_int_equal(hit_count(b, T0, "k", &q_minute), 3); /* b still maps it */
  tg_limiter_destroy(b);
  tg_limiter_destroy(c);
  assert_int_equal(tg_shm_unlink(name), TG_OK);
  assert_int_equal(tg_shm_unlink(name), TG_OK);
}

/* Malformed names are TG_EINVAL, for tg_limiter_new and (as the header
 * promises) for tg_shm_unlink. */
static void bad_names(void **state) {
  (void)state;
  char longname[400];
  memset(longname, 'x', sizeof longname - 1);
  longname[0] = '/';
  longname[sizeof longname - 1] = '\0';
  const char *bad[] = {"", "/", "//", "/a/b", "/tg-test/x", longname};
  unsigned wrong = 0;
  assert_int_equal(tg_shm_unlink(NULL), TG_EINVAL);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_config cfg;
    shm_config(&cfg, bad[i], TG_FIXED_WINDOW, 16);
    tg_limiter *lim = NOT_SET;
    int rc = tg_limiter_new(&lim, &cfg);
    if (rc != TG_EINVAL)
      print_error("tg_limiter_new(\"%.20s\"): %s\n", bad[i], tg_err_name(rc));
    assert_int_equal(rc, TG_EINVAL);
    assert_null(lim);
    /* glibc's shm_unlink says ENOENT for a name it cannot form (unlike
     * shm_open's EINVAL): "absent" must not hide "malformed" */
    rc = tg_shm_unlink(bad[i]);
    if (rc != TG_EINVAL && wrong++ < 8)
      print_error("tg_shm_unlink(\"%.20s\"): %s, want TG_EINVAL\n", bad[i],
                  tg_err_name(rc));
  }
  assert_int_equal(wrong, 0);
}

/* =========================================================================
 * 2. creation race
 * ========================================================================= */

#define RACE_PROCS 8
#define RACE_ROUNDS 16

typedef struct race_area {
  const char *name;
  int go;         /* atomic */
  unsigned ready; /* atomic */
  int rc_new[RACE_PROCS], rc_hit[RACE_PROCS];
  int allowed[RACE_PROCS];
} race_area;

static const tg_quota q_race = {
    .limit = RACE_PROCS * 10, .period_ms = 60000, .burst = 0};

static int race_child(unsigned idx, void *arg) {
  race_area *a = arg;
  tg_config cfg;
  shm_config(&cfg, a->name, TG_FIXED_WINDOW, 64);
  __atomic_add_fetch(&a->ready, 1, __ATOMIC_ACQ_REL);
  uint64_t deadline = mono_us() + 10000000u;
  while (!__atomic_load_n(&a->go, __ATOMIC_ACQUIRE))
    if (mono_us() > deadline)
      return 3;
  tg_limiter *lim;
  a->rc_new[idx] = tg_limiter_new(&lim, &cfg);
  if (a->rc_new[idx] != TG_OK)
    return 1;
  tg_result r;
  a->rc_hit[idx] = tg_hit_at(lim, T0, "k", 1, &q_race, 1, &r);
  a->allowed[idx] = r.allowed;
  tg_limiter_destroy(lim);
  return a->rc_hit[idx] == TG_OK ? 0 : 2;
}

static void creation_race(void **state) {
  SKIP_UNDER_TSAN();
  (void)state;
  race_area *a = shared_area(sizeof *a);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    memset(a, 0, sizeof *a);
    a->name = name_new("race");
    pid_t pids[RACE_PROCS];
    for (unsigned i = 0; i < RACE_PROCS; i++)
      pids[i] = spawn(race_child, i, a);
    while (__atomic_load_n(&a->ready, __ATOMIC_ACQUIRE) < RACE_PROCS)
      sched_yield();
    __atomic_store_n(&a->go, 1, __ATOMIC_RELEASE);
    unsigned blocked;
    assert_int_equal(
        reap_all(pids, RACE_PROCS, mono_us() + 20000000u, &blocked), 0);
    for (unsigned i = 0; i < RACE_PROCS; i++) {
      assert_int_equal(a->rc_new[i], TG_OK);
      assert_int_equal(a->rc_hit[i], TG_OK);
      assert_true(a->allowed[i]);
    }
    /* one table: every process's hit is in it */
    tg_config cfg;
    shm_config(&cfg, a->name, TG_FIXED_WINDOW, 64);
    tg_limiter *lim;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    assert_int_equal(hit_count(lim, T0, "k", &q_race), RACE_PROCS);
    tg_limiter_destroy(lim);
    assert_int_equal(validate(a->name, &cfg).errors, 0);
    assert_int_equal(tg_shm_unlink(a->name), TG_OK);
  }
  munmap(a, sizeof *a);
}

/* =========================================================================
 * 3. cleaning and a full table
 * ========================================================================= */

/* A pass in a child, through its own limiter with a before_clean that writes
 * what it saw into the shared job (and reports failure: deletion goes on). */
typedef struct clean_job {
  const tg_config *cfg; /* the parent's, copied by fork */
  uint64_t now;
  int rc_new, rc;
  size_t removed;
  unsigned calls, entries;
  uint64_t value_sum;   /* sum of the entries' values */
  uint64_t at_ms[4];    /* expired_at_ms of "k0".."k3" (0: not seen) */
  unsigned other_algos; /* calls with an algorithm not the segment's */
} clean_job;

static int clean_record(tg_algorithm alg, const tg_expired *e, size_t n,
                        void *ctx) {
  clean_job *j = ctx;
  j->calls++;
  j->other_algos += alg != j->cfg->algorithm;
  for (size_t i = 0; i < n; i++) {
    const unsigned char *k = e[i].key;
    j->entries++;
    j->value_sum += e[i].value;
    if (e[i].key_len == 2 && k[0] == 'k' && k[1] >= '0' && k[1] <= '3')
      j->at_ms[k[1] - '0'] = e[i].expired_at_ms;
  }
  return -1;
}

static int clean_child(unsigned idx, void *arg) {
  (void)idx;
  clean_job *j = arg;
  tg_config cfg = *j->cfg;
  cfg.before_clean = clean_record;
  cfg.before_clean_ctx = j;
  tg_limiter *lim;
  if ((j->rc_new = tg_limiter_new(&lim, &cfg)) != TG_OK)
    return 1;
  j->rc = tg_clean_at(lim, j->now, &j->removed);
  tg_limiter_destroy(lim);
  return 0;
}

static void clean_job_run(clean_job *j) {
  j->rc_new = j->rc = -100;
  j->removed = 99;
  j->calls = j->entries = j->other_algos = 0;
  j->value_sum = 0;
  memset(j->at_ms, 0, sizeof j->at_ms);
  pid_t pid = spawn(clean_child, 0, j);
  unsigned blocked;
  assert_int_equal(reap_all(&pid, 1, mono_us() + 10000000u, &blocked), 0);
  assert_int_equal(j->rc_new, TG_OK);
  assert_int_equal(j->rc, TG_OK);
}

/* The parent holds the segment's cleaning lock through its own mapping, as
 * a pass in progress in another process does: a child's pass returns at
 * once, removing and reporting nothing. Released, the child's pass reclaims
 * the four keys the parent made, hands each to before_clean with its count
 * and expiry, and the parent's limiter sees them gone. */
static void cleaning_across_processes(void **state) {
  (void)state;
  const char *name = name_new("clean");
  tg_config cfg;
  shm_config(&cfg, name, TG_FIXED_WINDOW, 8);
  cfg.key_older_than_ms = 0;
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  for (unsigned i = 0; i < 4; i++) {
    char key[3] = {'k', (char)('0' + i), 0};
    tg_result r;
    assert_int_equal(tg_hit_at(lim, T0, key, 2, &q, i + 1, &r), TG_OK);
    assert_true(r.allowed);
  }
  assert_int_equal(tg_key_count(lim), 4);
  clean_job *j = shared_area(sizeof *j);
  j->cfg = &cfg;
  j->now = T0 + 2000000u; /* the windows ended at T0 + 1 s */

  seg s;
  assert_int_equal(seg_map(&s, name, &cfg), TG_OK);
  assert_int_equal(take_lock(&s.t.h->clean_lock), TG_OK);
  clean_job_run(j);
  assert_int_equal(j->removed, 0);
  assert_int_equal(j->calls, 0);
  assert_int_equal(tg_key_count(lim), 4);
  tg__lock_release(&s.t.h->clean_lock, true);

  clean_job_run(j);
  assert_int_equal(j->removed, 4);
  assert_true(j->calls >= 1);
  assert_int_equal(j->other_algos, 0);
  assert_int_equal(j->entries, 4);
  assert_int_equal(j->value_sum, 1 + 2 + 3 + 4);
  for (unsigned i = 0; i < 4; i++)
    assert_int_equal(j->at_ms[i], T0 / 1000 + 1000);
  assert_int_equal(tg_key_count(lim), 0);
  uint64_t v = 7;
  assert_int_equal(tg_get_at(lim, T0 + 500000u, "k3", 2, &q, &v), TG_OK);
  assert_int_equal(v, 0);
  /* nothing left: the next pass calls nobody */
  clean_job_run(j);
  assert_int_equal(j->removed, 0);
  assert_int_equal(j->calls, 0);
  seg_unmap(&s);
  tg_limiter_destroy(lim);
  assert_int_equal(validate(name, &cfg).errors, 0);
  munmap(j, sizeof *j);
}

/* A limiter destroyed while its cleaning thread is in a pass ends the pass
 * once the call of before_clean in progress returns: the keys it was handed
 * are reclaimed, the rest stay in the segment, and another limiter's pass
 * then hands each of them to its own before_clean. So every one of the
 * 2,560 expired keys is reported exactly once, by one limiter or the other
 * (the thread's first call holds the pass until the test is about to
 * destroy, then gives destroy 200 ms to raise its flag). Before destroy
 * ended the pass, the thread reported all 2,560 (40 calls) and the other
 * limiter none. */
typedef struct halted_pass {
  uint64_t now;    /* __atomic: the thread's clock */
  int destroying;  /* __atomic: set by the test just before destroy */
  unsigned calls;  /* __atomic: the thread's calls of before_clean */
  unsigned thread; /* __atomic: entries the thread was handed */
  unsigned later;  /* entries the second pass was handed */
  unsigned char seen[2560];
} halted_pass;

static halted_pass hp;

static uint64_t hp_clock(void *ctx) {
  (void)ctx;
  return __atomic_load_n(&hp.now, __ATOMIC_ACQUIRE);
}

static void hp_record(const tg_expired *e, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char buf[8] = {0};
    if (e[i].key_len < sizeof buf)
      memcpy(buf, e[i].key, e[i].key_len);
    int k = atoi(buf + 1);
    if (k >= 0 && k < 2560)
      __atomic_fetch_add(&hp.seen[k], 1, __ATOMIC_RELAXED);
  }
}

static int hp_thread_cb(tg_algorithm alg, const tg_expired *e, size_t n,
                        void *ctx) {
  (void)alg;
  (void)ctx;
  hp_record(e, n);
  __atomic_fetch_add(&hp.thread, (unsigned)n, __ATOMIC_RELAXED);
  if (__atomic_fetch_add(&hp.calls, 1, __ATOMIC_ACQ_REL) == 0) {
    uint64_t deadline = mono_us() + 10000000u;
    while (!__atomic_load_n(&hp.destroying, __ATOMIC_ACQUIRE) &&
           mono_us() < deadline)
      usleep(1000);
    usleep(200000);
  }
  return 0;
}

static int hp_later_cb(tg_algorithm alg, const tg_expired *e, size_t n,
                       void *ctx) {
  (void)alg;
  (void)ctx;
  hp_record(e, n);
  hp.later += (unsigned)n;
  return 0;
}

static void destroy_leaves_the_rest_of_a_pass(void **state) {
  (void)state;
  const char *name = name_new("halt");
  memset(&hp, 0, sizeof hp);
  hp.now = T0;
  tg_config cfg;
  shm_config(&cfg, name, TG_FIXED_WINDOW, 4096);
  cfg.key_older_than_ms = 0;
  cfg.before_clean = hp_later_cb;
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 0};
  tg_limiter *b;
  assert_int_equal(tg_limiter_new(&b, &cfg), TG_OK);
  char key[8];
  for (int i = 0; i < 2560; i++) {
    int len = snprintf(key, sizeof key, "k%d", i);
    tg_result r;
    assert_int_equal(tg_hit_at(b, T0, key, (size_t)len, &q, 1, &r), TG_OK);
    assert_true(r.allowed);
  }
  tg_config ca = cfg;
  ca.clock = hp_clock;
  ca.clean_period_ms = 5;
  ca.before_clean = hp_thread_cb;
  tg_limiter *a;
  assert_int_equal(tg_limiter_new(&a, &ca), TG_OK);
  __atomic_store_n(&hp.now, T0 + 2000000u, __ATOMIC_RELEASE);
  uint64_t deadline = mono_us() + 10000000u;
  while (__atomic_load_n(&hp.calls, __ATOMIC_ACQUIRE) == 0 &&
         mono_us() < deadline)
    usleep(1000);
  assert_int_equal(__atomic_load_n(&hp.calls, __ATOMIC_ACQUIRE), 1);
  __atomic_store_n(&hp.destroying, 1, __ATOMIC_RELEASE);
  tg_limiter_destroy(a);
  unsigned thread = __atomic_load_n(&hp.thread, __ATOMIC_ACQUIRE);
  assert_in_range(thread, 1, 3 * 64);
  size_t removed = 0;
  assert_int_equal(tg_clean_at(b, T0 + 2000000u, &removed), TG_OK);
  assert_int_equal(removed, 2560 - thread);
  assert_int_equal(hp.later, 2560 - thread);
  for (int i = 0; i < 2560; i++)
    assert_int_equal(hp.seen[i], 1);
  assert_int_equal(tg_key_count(b), 0);
  tg_limiter_destroy(b);
  assert_int_equal(validate(name, &cfg).errors, 0);
}

/* Bounded memory in a segment: with every slot held by a live key, a new key
 * is TG_EFULL in every attached limiter, each answering with its own failure
 * policy (marked degraded); once those keys have decayed, a new key reclaims
 * room. */
static void full_segment_policy(void **state) {
  (void)state;
  const char *name = name_new("full");
  tg_config closed, open;
  shm_config(&closed, name, TG_TOKEN_BUCKET, 4);
  closed.on_failure = TG_POLICY_FAIL_CLOSED;
  open = closed;
  open.on_failure = TG_POLICY_FAIL_OPEN;
  const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 5};
  tg_limiter *a, *b;
  assert_int_equal(tg_limiter_new(&a, &closed), TG_OK);
  assert_int_equal(tg_limiter_new(&b, &open), TG_OK);
  tg_result r;
  for (unsigned i = 0; i < 4; i++) {
    char key[3] = {'k', (char)('0' + i), 0};
    assert_int_equal(tg_hit_at(i % 2 ? a : b, T0, key, 2, &q, 5, &r), TG_OK);
    assert_true(r.allowed);
  }
  assert_int_equal(tg_hit_at(a, T0, "new", 3, &q, 1, &r), TG_EFULL);
  assert_true(r.degraded);
  assert_false(r.allowed);
  assert_int_equal(r.retry_after_ms, 1000);
  assert_int_equal(tg_hit_at(b, T0, "new", 3, &q, 1, &r), TG_EFULL);
  assert_true(r.degraded);
  assert_true(r.allowed);
  assert_int_equal(r.retry_after_ms, 0);
  assert_int_equal(tg_key_count(a), 4);
  assert_int_equal(tg_key_count(b), 4);
  /* the buckets are full again 1 s later: "new" takes a reclaimed slot */
  assert_int_equal(tg_hit_at(a, T0 + 1000000u, "new", 3, &q, 1, &r), TG_OK);
  assert_false(r.degraded);
  assert_true(r.allowed);
  assert_int_equal(r.count, 4);
  uint64_t v = 0;
  assert_int_equal(tg_get_at(b, T0 + 1000000u, "new", 3, &q, &v), TG_OK);
  assert_int_equal(v, 4);
  tg_limiter_destroy(a);
  tg_limiter_destroy(b);
  tg__table_check c = validate(name, &closed);
  assert_int_equal(c.errors, 0);
  assert_true(c.live_slots >= 1 && c.live_slots <= 4);
}

/* A sliding log that never holds more than a few entries keeps to the
 * first page or two of its ring, however long it lives and however large
 * sliding_max_entries: pruning moves its head along the ring, and each page
 * the head reached used to stay backed (a key came to hold its whole ring,
 * 256 KiB at 16384 entries, and on a full file system answered TG_ENOMEM).
 * The answers are a memory store's, call for call. */
static void few_entries_few_pages(void **state) {
  (void)state;
  const char *name = name_new("pages");
  tg_config cfg, mem;
  shm_config(&cfg, name, TG_SLIDING_WINDOW, 64);
  cfg.sliding_max_entries = 16384;
  mem = cfg;
  mem.shm_name = NULL;
  tg_limiter *lim, *twin;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_int_equal(tg_limiter_new(&twin, &mem), TG_OK);
  char path[96];
  snprintf(path, sizeof path, "/dev/shm%s", name);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  long long before = (long long)st.st_blocks * 512;
  /* ten calls a second under 3 a second: at most 3 entries live, about
   * 6,000 appended per key (24 pages' worth of ring) */
  const tg_quota q = {.limit = 3, .period_ms = 1000};
  enum { KEYS = 10, CALLS = 20000 };
  long allowed = 0;
  for (int k = 0; k < KEYS; k++) {
    char key[8];
    int len = snprintf(key, sizeof key, "u%d", k);
    for (int i = 0; i < CALLS; i++) {
      uint64_t now = T0 + (uint64_t)i * 100000u;
      tg_result r, m;
      assert_int_equal(tg_hit_at(lim, now, key, (size_t)len, &q, 1, &r), TG_OK);
      assert_int_equal(tg_hit_at(twin, now, key, (size_t)len, &q, 1, &m),
                       TG_OK);
      assert_int_equal(r.allowed, m.allowed);
      assert_int_equal(r.count, m.count);
      assert_int_equal(r.remaining, m.remaining);
      assert_int_equal(r.retry_after_ms, m.retry_after_ms);
      assert_int_equal(r.reset_after_ms, m.reset_after_ms);
      allowed += r.allowed;
    }
  }
  assert_int_equal(allowed, (long)KEYS * CALLS / 10 * 3);
  assert_int_equal(stat(path, &st), 0);
  long long grew = (long long)st.st_blocks * 512 - before;
  print_message("%d sliding keys, %d calls each: the segment grew %lld KiB\n",
                KEYS, CALLS, grew / 1024);
  assert_true(grew <= (long long)KEYS * 3 * 4096);
  tg_limiter_destroy(twin);
  tg_limiter_destroy(lim);
  tg__table_check c = validate(name, &cfg);
  assert_int_equal(c.errors, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(attach_sees_state, unlink_names),
      cmocka_unit_test_teardown(permissions, unlink_names),
      cmocka_unit_test_teardown(mismatch, unlink_names),
      cmocka_unit_test_teardown(corrupt, unlink_names),
      cmocka_unit_test_teardown(creator_died, unlink_names),
      cmocka_unit_test_teardown(unlink_and_names, unlink_names),
      cmocka_unit_test_teardown(bad_names, unlink_names),
      cmocka_unit_test_teardown(creation_race, unlink_names),
      cmocka_unit_test_teardown(cleaning_across_processes, unlink_names),
      cmocka_unit_test_teardown(destroy_leaves_the_rest_of_a_pass,
                                unlink_names),
      cmocka_unit_test_teardown(full_segment_policy, unlink_names),
      cmocka_unit_test_teardown(few_entries_few_pages, unlink_names),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, unlink_names));
}
