/* SPDX-License-Identifier: MIT */
/*
 * shm_tmpfs.c - the shared-memory store on a tmpfs too small for it: one
 * scenario per run, each meant to run where /dev/shm is a small private
 * tmpfs (test_shm_tmpfs.sh mounts one in a private mount namespace).
 *
 * A page a full tmpfs cannot supply used to be a SIGBUS at first touch.
 * Each scenario drives the store to that point and checks that the answer
 * is a status code: TG_ENOMEM (through the failure policy), never a signal.
 * It exits 0 when every expectation held, 1 otherwise (with a line on
 * stderr), and dies of the signal if there is one.
 *
 *   create SIZE_HINT  a table whose header, ctrl words and slots do not fit:
 *                     tg_limiter_new answers TG_ENOMEM and says why, leaves
 *                     no memory held, and a smaller table then fits;
 *   sliding           20000 new sliding-window keys (a page, 4 KiB, for
 *                     each one-entry log) on 64 MiB: about 15000 are
 *                     created (the server died at ~10500), the rest
 *                     answer TG_ENOMEM, old keys go on (but for a log whose
 *                     next entry needs a page of its own), and once logs
 *                     decay new keys reuse their memory;
 *   long              long keys (a 256-byte chunk each) on 2 MiB until
 *                     the tmpfs is full: TG_ENOMEM, short keys still
 *                     created;
 *   nearly-full       the tmpfs filled by a file after the limiter was
 *                     created: the very first new key answers TG_ENOMEM (it
 *                     used to die), another limiter still attaches, and the
 *                     key is created once the file is gone;
 *   hostile-log       on a full tmpfs, a log whose header claims entries in
 *                     pages nobody backed (bytes another process wrote):
 *                     its key answers TG_ENOMEM and a cleaning pass skips
 *                     it; nothing reads those pages;
 *   steady            a sliding key made before the tmpfs filled, then 300
 *                     seconds of bursts on it: it needs no new page (its
 *                     log keeps to its ring's start), so every call is
 *                     decided, exactly, with no TG_ENOMEM.
 */
#include "store/table.h"
#include "tollgate.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define T0 UINT64_C(1700000000000000) /* us */
#define NAME "/tg-tmpfs-test"

static int failures;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "shm_tmpfs: %s:%d: ", __func__, __LINE__);               \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static tg_config config(tg_algorithm alg, uint64_t capacity) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = capacity;
  cfg.shm_name = NAME;
  cfg.clean_period_ms = 0;
  cfg.on_failure = TG_POLICY_FAIL_OPEN;
  return cfg;
}

static unsigned long long shm_used_kib(void) {
  struct statvfs v;
  if (statvfs("/dev/shm", &v) != 0)
    return 0;
  return (unsigned long long)(v.f_blocks - v.f_bfree) * v.f_frsize / 1024;
}

/* Fills the tmpfs with a file, whose name it returns. */
static const char *fill_tmpfs(void) {
  const char *filler = "/dev/shm/tg-tmpfs-filler";
  int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0, "open %s: %s", filler, strerror(errno));
  static char buf[1 << 16];
  memset(buf, 1, sizeof buf);
  while (fd >= 0 && write(fd, buf, sizeof buf) > 0)
    ;
  while (fd >= 0 && write(fd, buf, 1) > 0)
    ;
  if (fd >= 0)
    close(fd);
  return filler;
}

/* Hits n new keys "PREFIXi" (i from first) at now; counts the codes. */
typedef struct tally {
  unsigned ok, enomem, other;
  int first_other;
  bool policy_ok; /* every TG_ENOMEM came with the policy's answer */
} tally;

static tally hit_new(tg_limiter *lim, const char *prefix, unsigned first,
                     unsigned n, uint64_t now, const tg_quota *q) {
  tally t = {0, 0, 0, 0, true};
  char key[300];
  for (unsigned i = first; i < first + n; i++) {
    int len = snprintf(key, sizeof key, "%s%u", prefix, i);
    tg_result r;
    int rc = tg_hit_at(lim, now, key, (size_t)len, q, 1, &r);
    if (rc == TG_OK) {
      t.ok++;
    } else if (rc == TG_ENOMEM) {
      t.enomem++;
      t.policy_ok = t.policy_ok && r.degraded && r.allowed;
    } else if (t.other++ == 0) {
      t.first_other = rc;
    }
  }
  return t;
}

static int scenario_create(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_FIXED_WINDOW, 1u << 20); /* ~64 MiB of slots */
  tg_limiter *lim = (tg_limiter *)&cfg;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_ENOMEM, "a table too big for the tmpfs: %s", tg_err_name(rc));
  CHECK(lim == NULL, "*out not NULL on failure");
  CHECK(strstr(tg_last_error(), "cannot reserve") != NULL,
        "tg_last_error: \"%s\"", tg_last_error());
  fprintf(stderr, "shm_tmpfs: create: %s (%s), /dev/shm holds %llu KiB\n",
          tg_err_name(rc), tg_last_error(), shm_used_kib());
  CHECK(shm_used_kib() < 512, "the failed table still holds %llu KiB",
        shm_used_kib());
  /* again: the name is left empty, not half made */
  rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_ENOMEM, "second try: %s", tg_err_name(rc));
  /* a table that fits is created in the same name */
  cfg.capacity = 1024;
  rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "a table that fits: %s (%s)", tg_err_name(rc),
        tg_last_error());
  if (rc == TG_OK) {
    const tg_quota q = {10, 1000, 0};
    tg_result r;
    rc = tg_hit_at(lim, T0, "k", 1, &q, 1, &r);
    CHECK(rc == TG_OK && r.allowed && !r.degraded, "a hit: %s",
          tg_err_name(rc));
    tg_limiter_destroy(lim);
  }
  tg_shm_unlink(NAME);
  return failures;
}

static int scenario_sliding(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_SLIDING_WINDOW, 65536); /* 1024 entries a log */
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "create: %s (%s)", tg_err_name(rc), tg_last_error());
  if (rc != TG_OK)
    return failures;
  const tg_quota q = {100, 1000, 0};
  tally t = hit_new(lim, "user:", 0, 20000, T0, &q);
  fprintf(stderr,
          "shm_tmpfs: sliding: 20000 new keys: %u created, %u TG_ENOMEM, %u "
          "other; /dev/shm holds %llu KiB\n",
          t.ok, t.enomem, t.other, shm_used_kib());
  CHECK(t.ok > 10000,
        "only %u keys created (a log's memory should follow "
        "its entries)",
        t.ok);
  CHECK(t.enomem > 0, "the tmpfs never ran out (is it 64 MiB?)");
  CHECK(t.other == 0, "%u other codes, first %s", t.other,
        tg_err_name(t.first_other));
  CHECK(t.policy_ok, "TG_ENOMEM without the fail-open answer");
  /* the keys that were created go on, but for the few whose second entry
   * needs a page of its own: on a full tmpfs that is TG_ENOMEM too */
  tally old = hit_new(lim, "user:", 0, t.ok, T0 + 1000, &q);
  fprintf(stderr,
          "shm_tmpfs: sliding: a second hit on each: %u answered, %u "
          "TG_ENOMEM\n",
          old.ok, old.enomem);
  CHECK(old.ok + old.enomem == t.ok && old.other == 0 && old.policy_ok,
        "old keys: %u answered, %u TG_ENOMEM, %u other", old.ok, old.enomem,
        old.other);
  CHECK(old.ok > t.ok / 10 * 9, "old keys: only %u of %u answered", old.ok,
        t.ok);
  /* two periods later every log has decayed: new keys reuse their memory */
  tally later = hit_new(lim, "later:", 0, 1000, T0 + 3000000, &q);
  CHECK(later.ok == 1000, "after decay: %u created, %u TG_ENOMEM, %u other",
        later.ok, later.enomem, later.other);
  tg_limiter_destroy(lim);
  tg_shm_unlink(NAME);
  return failures;
}

static int scenario_long(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_FIXED_WINDOW, 16384); /* 4 MiB of chunks */
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "create: %s (%s)", tg_err_name(rc), tg_last_error());
  if (rc != TG_OK)
    return failures;
  const tg_quota q = {100, 60000, 0};
  char prefix[120];
  memset(prefix, 'L', sizeof prefix - 1);
  prefix[sizeof prefix - 1] = '\0';
  tally t = hit_new(lim, prefix, 0, 12000, T0, &q);
  fprintf(stderr,
          "shm_tmpfs: long: 12000 new long keys: %u created, %u TG_ENOMEM, "
          "%u other; /dev/shm holds %llu KiB\n",
          t.ok, t.enomem, t.other, shm_used_kib());
  CHECK(t.ok > 1000 && t.enomem > 0 && t.other == 0,
        "%u created, %u TG_ENOMEM, %u other (first %s)", t.ok, t.enomem,
        t.other, tg_err_name(t.first_other));
  CHECK(t.policy_ok, "TG_ENOMEM without the fail-open answer");
  tally s = hit_new(lim, "s", 0, 1000, T0, &q); /* inline: no chunk */
  CHECK(s.ok == 1000, "short keys: %u of 1000 created", s.ok);
  tg_limiter_destroy(lim);
  tg_shm_unlink(NAME);
  return failures;
}

static int scenario_nearly_full(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_SLIDING_WINDOW, 1024);
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "create: %s (%s)", tg_err_name(rc), tg_last_error());
  if (rc != TG_OK)
    return failures;
  /* another user's file takes every page left */
  const char *filler = fill_tmpfs();
  fprintf(stderr, "shm_tmpfs: nearly-full: /dev/shm holds %llu KiB\n",
          shm_used_kib());
  const tg_quota q = {10, 1000, 0};
  tg_result r;
  rc = tg_hit_at(lim, T0, "first", 5, &q, 1, &r);
  CHECK(rc == TG_ENOMEM && r.degraded && r.allowed,
        "the first new key: %s (degraded %d, allowed %d)", tg_err_name(rc),
        r.degraded, r.allowed);
  /* attaching needs no new page */
  tg_limiter *other;
  rc = tg_limiter_new(&other, &cfg);
  CHECK(rc == TG_OK, "attach on a full tmpfs: %s (%s)", tg_err_name(rc),
        tg_last_error());
  if (rc == TG_OK)
    tg_limiter_destroy(other);
  unlink(filler);
  rc = tg_hit_at(lim, T0, "first", 5, &q, 1, &r);
  CHECK(rc == TG_OK && r.allowed && !r.degraded, "once there is room: %s",
        tg_err_name(rc));
  tg_limiter_destroy(lim);
  tg_shm_unlink(NAME);
  return failures;
}

static int scenario_steady(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_SLIDING_WINDOW, 16); /* 1024 entries a log */
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "create: %s (%s)", tg_err_name(rc), tg_last_error());
  if (rc != TG_OK)
    return failures;
  const tg_quota q = {3, 1000, 0};
  tg_result r;
  rc = tg_hit_at(lim, T0, "user", 4, &q, 1, &r);
  CHECK(rc == TG_OK && r.allowed, "the key: %s", tg_err_name(rc));
  const char *filler = fill_tmpfs();
  /* a burst of 10 calls a second for 300 s: 900 entries appended, so the
   * head would walk through the whole 16 KiB ring (four pages) */
  unsigned enomem = 0, over = 0, other = 0;
  for (uint64_t s = 1; s <= 300; s++) {
    unsigned allowed = 0;
    for (uint64_t i = 0; i < 10; i++) {
      rc = tg_hit_at(lim, T0 + s * 1000000u + i * 1000u, "user", 4, &q, 1, &r);
      enomem += rc == TG_ENOMEM;
      other += rc != TG_OK && rc != TG_ENOMEM;
      allowed += r.allowed;
    }
    over += allowed != 3;
  }
  fprintf(stderr,
          "shm_tmpfs: steady: 300 bursts on a full tmpfs: %u TG_ENOMEM, "
          "%u bursts not admitting exactly 3\n",
          enomem, over);
  CHECK(enomem == 0 && other == 0, "%u TG_ENOMEM, %u other codes", enomem,
        other);
  CHECK(over == 0, "%u bursts admitted other than 3", over);
  unlink(filler);
  tg_limiter_destroy(lim);
  tg_shm_unlink(NAME);
  return failures;
}

static int scenario_hostile_log(void) {
  tg_shm_unlink(NAME);
  tg_config cfg = config(TG_SLIDING_WINDOW, 16); /* 16 KiB logs */
  cfg.key_older_than_ms = 0;
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  CHECK(rc == TG_OK, "create: %s (%s)", tg_err_name(rc), tg_last_error());
  if (rc != TG_OK)
    return failures;
  const tg_quota q = {10, 1000, 0};
  tg_result r;
  rc = tg_hit_at(lim, T0, "k", 1, &q, 1, &r); /* one entry: one page */
  CHECK(rc == TG_OK, "the key: %s", tg_err_name(rc));
  const char *filler = fill_tmpfs();
  /* another process writes n = the ring's size into the log's header */
  int fd = shm_open(NAME, O_RDWR, 0);
  struct stat st;
  CHECK(fd >= 0 && fstat(fd, &st) == 0, "reopen");
  unsigned char *m =
      mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  CHECK(m != MAP_FAILED, "mmap");
  if (m == MAP_FAILED)
    return failures;
  const tg__table_hdr *h = (const tg__table_hdr *)(void *)m;
  tg__log_block *b = (tg__log_block *)(void *)(m + h->log_off);
  __atomic_store_n(&b->n, h->log_entries, __ATOMIC_RELEASE);
  rc = tg_hit_at(lim, T0 + 1000, "k", 1, &q, 1, &r);
  CHECK(rc == TG_ENOMEM && r.degraded, "hit on the log: %s", tg_err_name(rc));
  size_t removed = 9;
  rc = tg_clean_at(lim, T0 + 60000000, &removed);
  CHECK(rc == TG_OK && removed == 0, "a pass: %s, %zu removed", tg_err_name(rc),
        removed);
  munmap(m, (size_t)st.st_size);
  fprintf(stderr, "shm_tmpfs: hostile-log: hit %s, pass removed %zu\n",
          tg_err_name(TG_ENOMEM), removed);
  unlink(filler);
  /* with room again, the same log is backed, found implausible, and the
   * key answers as a corrupt one does */
  rc = tg_hit_at(lim, T0 + 2000, "k", 1, &q, 1, &r);
  CHECK(rc == TG_ECORRUPT || rc == TG_OK, "with room: %s", tg_err_name(rc));
  tg_limiter_destroy(lim);
  tg_shm_unlink(NAME);
  return failures;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr,
            "usage: shm_tmpfs create|sliding|long|nearly-full|hostile-log|"
            "steady\n");
    return 2;
  }
  const char *s = argv[1];
  if (strcmp(s, "create") == 0)
    return scenario_create() ? 1 : 0;
  if (strcmp(s, "sliding") == 0)
    return scenario_sliding() ? 1 : 0;
  if (strcmp(s, "long") == 0)
    return scenario_long() ? 1 : 0;
  if (strcmp(s, "nearly-full") == 0)
    return scenario_nearly_full() ? 1 : 0;
  if (strcmp(s, "hostile-log") == 0)
    return scenario_hostile_log() ? 1 : 0;
  if (strcmp(s, "steady") == 0)
    return scenario_steady() ? 1 : 0;
  fprintf(stderr, "shm_tmpfs: unknown scenario %s\n", s);
  return 2;
}
