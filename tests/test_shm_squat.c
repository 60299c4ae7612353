/* SPDX-License-Identifier: MIT */
/*
 * test_shm_squat.c - which existing segments a limiter agrees to use, and
 * what it says when it refuses one (tg_last_error).
 *
 * Another local user can create a segment's name before we do: /dev/shm is
 * world-writable. A limiter that built its table in that file would let its
 * owner rewrite the limits. So a segment must be a regular file owned by
 * the effective user, with no mode bits beyond shm_mode; anything else is
 * TG_EPERM, with the reason in tg_last_error(), and is left untouched:
 *
 *   1. owned by another user (made with fchown: needs root, skipped
 *      otherwise), whether empty or holding a valid table;
 *   2. mode bits beyond shm_mode: group or other access, setuid, setgid,
 *      sticky; a narrower mode is fine;
 *   3. not a regular file: a FIFO, a directory, a symbolic link (in
 *      /dev/shm, where glibc keeps the names);
 *   4. a table created in another PID namespace (lock owners are pids):
 *      TG_EMISMATCH (root: unshare(CLONE_NEWPID));
 *   5. tg_last_error: "" after a success, the reason after a failure, one
 *      per thread.
 */
#define _GNU_SOURCE /* unshare, CLONE_NEWPID */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tollgate.h"

#define T0 UINT64_C(1700000000000000) /* us */
#define NOBODY 65534                  /* a uid that is not ours */

static const tg_quota q = {.limit = 5, .period_ms = 60000, .burst = 0};
static char name[64];

static int unlink_name(void **state) {
  (void)state;
  if (name[0]) {
    char path[80];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    tg_shm_unlink(name);
    unlink(path); /* a FIFO or a link */
    rmdir(path);
  }
  name[0] = '\0';
  return 0;
}

static tg_config config(unsigned mode) {
  static unsigned serial;
  snprintf(name, sizeof name, "/tg-squat-%ld-%u", (long)getpid(), serial++);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.shm_name = name;
  cfg.shm_mode = mode;
  cfg.capacity = 64;
  cfg.clean_period_ms = 0;
  return cfg;
}

/* Creates the name as someone else would: size bytes (a table if
 * with_table), then mode and owner. */
static void plant(const tg_config *cfg, bool with_table, unsigned mode,
                  uid_t uid) {
  if (with_table) {
    tg_limiter *lim;
    assert_int_equal(tg_limiter_new(&lim, cfg), TG_OK);
    tg_result r;
    assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), TG_OK);
    tg_limiter_destroy(lim);
  }
  int fd = shm_open(cfg->shm_name, O_RDWR | O_CREAT, 0600);
  assert_true(fd >= 0);
  assert_int_equal(fchmod(fd, (mode_t)mode), 0);
  if (uid != geteuid())
    assert_int_equal(fchown(fd, uid, (gid_t)-1), 0);
  close(fd);
}

static struct stat stat_of(const char *shm_name) {
  char path[80];
  snprintf(path, sizeof path, "/dev/shm%s", shm_name);
  struct stat st;
  memset(&st, 0, sizeof st);
  assert_int_equal(lstat(path, &st), 0);
  return st;
}

/* tg_limiter_new must refuse with TG_EPERM, say `why`, and leave the file
 * as it was. */
static void expect_refused(const tg_config *cfg, const char *why) {
  struct stat before = stat_of(cfg->shm_name);
  tg_limiter *lim = (tg_limiter *)(void *)name;
  int rc = tg_limiter_new(&lim, cfg);
  if (rc != TG_EPERM || !strstr(tg_last_error(), why))
    print_error("%s: %s, \"%s\" (expected TG_EPERM, \"...%s...\")\n",
                cfg->shm_name, tg_err_name(rc), tg_last_error(), why);
  assert_int_equal(rc, TG_EPERM);
  assert_null(lim);
  assert_non_null(strstr(tg_last_error(), why));
  assert_non_null(strstr(tg_last_error(), cfg->shm_name));
  struct stat after = stat_of(cfg->shm_name);
  assert_int_equal(after.st_size, before.st_size);
  assert_int_equal(after.st_mode, before.st_mode);
  assert_int_equal(after.st_uid, before.st_uid);
  assert_int_equal(after.st_mtime, before.st_mtime);
}

/* ---- 1. another owner ---- */

static void other_owner_refused(void **state) {
  (void)state;
  if (geteuid() != 0)
    skip(); /* only root can give a file away */
  for (int with_table = 0; with_table < 2; with_table++) {
    tg_config cfg = config(0600);
    plant(&cfg, with_table == 1, 0600, NOBODY);
    expect_refused(&cfg, "owned by uid 65534");
    unlink_name(NULL);
  }
}

/* ---- 2. mode ---- */

static void wider_mode_refused(void **state) {
  (void)state;
  static const struct {
    unsigned have, shm_mode;
    bool ok;
  } cases[] = {
      {0666, 0600, false},  {0640, 0600, false},  {0604, 0600, false},
      {0660, 0640, false},  {04600, 0600, false}, {02600, 0600, false},
      {01600, 0600, false}, {0600, 0600, true},   {0600, 0660, true},
      {0640, 0660, true},   {0666, 0666, true},   {0400, 0600, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int with_table = 0; with_table < 2; with_table++) {
      tg_config cfg = config(cases[i].shm_mode);
      plant(&cfg, with_table == 1, cases[i].have, geteuid());
      if (!cases[i].ok) {
        expect_refused(&cfg, "allows more than shm_mode");
      } else if (cases[i].have & 0200 || geteuid() == 0) {
        tg_limiter *lim;
        int rc = tg_limiter_new(&lim, &cfg);
        if (rc != TG_OK)
          print_error("mode %04o, shm_mode %04o: %s (%s)\n", cases[i].have,
                      cases[i].shm_mode, tg_err_name(rc), tg_last_error());
        assert_int_equal(rc, TG_OK);
        assert_string_equal(tg_last_error(), "");
        tg_limiter_destroy(lim);
      }
      unlink_name(NULL);
    }
  }
}

/* ---- 3. not a regular file ---- */

static void not_a_file_refused(void **state) {
  (void)state;
  struct stat st;
  if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode))
    skip(); /* not glibc's layout */
  char path[80];
  /* a FIFO */
  tg_config cfg = config(0600);
  snprintf(path, sizeof path, "/dev/shm%s", name);
  assert_int_equal(mkfifo(path, 0600), 0);
  expect_refused(&cfg, "not a regular file");
  unlink_name(NULL);
  /* a directory */
  cfg = config(0600);
  snprintf(path, sizeof path, "/dev/shm%s", name);
  assert_int_equal(mkdir(path, 0700), 0);
  expect_refused(&cfg, "not a regular file");
  unlink_name(NULL);
  /* a symbolic link to a file of ours */
  cfg = config(0600);
  snprintf(path, sizeof path, "/dev/shm%s", name);
  char target[96];
  snprintf(target, sizeof target, "/dev/shm%s-target", name);
  int fd = open(target, O_RDWR | O_CREAT, 0600);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(symlink(target, path), 0);
  expect_refused(&cfg, "not a regular file");
  unlink(target);
  unlink_name(NULL);
}

/* ---- 4. another PID namespace ---- */

static void other_pid_namespace_mismatch(void **state) {
  (void)state;
  tg_config cfg = config(0600);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  int *rc = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  assert_true(rc != MAP_FAILED);
  char *why = (char *)(rc + 2);
  rc[0] = rc[1] = -100;
  fflush(stdout);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWPID) != 0)
      _exit(77);          /* not permitted here */
    pid_t inner = fork(); /* the first process of the new namespace */
    if (inner == 0) {
      tg_limiter *l = NULL;
      rc[0] = tg_limiter_new(&l, &cfg);
      snprintf(why, 256, "%s", tg_last_error());
      tg_limiter_destroy(l);
      _exit(0);
    }
    int st;
    waitpid(inner, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    tg_limiter_destroy(lim);
    munmap(rc, 4096);
    skip();
  }
  assert_int_equal(WEXITSTATUS(st), 0);
  print_message("from another PID namespace: %s (%s)\n", tg_err_name(rc[0]),
                why);
  assert_int_equal(rc[0], TG_EMISMATCH);
  assert_non_null(strstr(why, "PID namespace"));
  /* and the table is untouched: this namespace still uses it */
  tg_result r;
  assert_int_equal(tg_hit_at(lim, T0, "k", 1, &q, 1, &r), TG_OK);
  assert_int_equal(r.count, 1);
  tg_limiter_destroy(lim);
  munmap(rc, 4096);
}

/* ---- 5. tg_last_error ---- */

typedef struct thread_err {
  tg_config cfg;
  int rc;
  char seen[256];
} thread_err;

static void *new_in_thread(void *arg) {
  thread_err *t = arg;
  tg_limiter *lim = NULL;
  t->rc = tg_limiter_new(&lim, &t->cfg);
  snprintf(t->seen, sizeof t->seen, "%s", tg_last_error());
  tg_limiter_destroy(lim);
  return NULL;
}

static void last_error_says_why(void **state) {
  (void)state;
  tg_config cfg = config(0600);
  tg_limiter *lim;
  assert_string_equal(tg_last_error(), tg_last_error()); /* never NULL */
  cfg.capacity = 0;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_non_null(strstr(tg_last_error(), "capacity"));
  cfg.capacity = 64;
  cfg.shm_name = "no-slash";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_non_null(strstr(tg_last_error(), "shm_name"));
  cfg.shm_name = name;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  assert_string_equal(tg_last_error(), ""); /* cleared by a success */
  /* a sound table of other parameters */
  tg_config other = cfg;
  other.capacity = 128;
  tg_limiter *l2 = NULL;
  assert_int_equal(tg_limiter_new(&l2, &other), TG_EMISMATCH);
  assert_non_null(strstr(tg_last_error(), "capacity"));
  /* one detail per thread: a failure in one leaves the other's alone */
  thread_err a = {other, 0, ""}, b = {cfg, 0, ""};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, new_in_thread, &a), 0);
  pthread_join(ta, NULL);
  assert_int_equal(pthread_create(&tb, NULL, new_in_thread, &b), 0);
  pthread_join(tb, NULL);
  assert_int_equal(a.rc, TG_EMISMATCH);
  assert_non_null(strstr(a.seen, "capacity"));
  assert_int_equal(b.rc, TG_OK);
  assert_string_equal(b.seen, "");
  assert_non_null(strstr(tg_last_error(), "capacity")); /* still ours */
  tg_limiter_destroy(lim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(other_owner_refused, unlink_name),
      cmocka_unit_test_teardown(wider_mode_refused, unlink_name),
      cmocka_unit_test_teardown(not_a_file_refused, unlink_name),
      cmocka_unit_test_teardown(other_pid_namespace_mismatch, unlink_name),
      cmocka_unit_test_teardown(last_error_says_why, unlink_name),
  };
  return cmocka_run_group_tests(tests, NULL, unlink_name);
}
