/* SPDX-License-Identifier: MIT */
/*
 * shm_helpers.h - what the shared-memory store's process tests (test_shm,
 * test_shm_kill, test_shm_dead) share beyond util.h: segment names handed
 * out per test and unlinked by its teardown, the TSan skip, and the test's
 * own view of a segment (mapped and attached as the store does, without a
 * limiter) with its lock words, log blocks, a dump and the validator.
 *
 * Include after <cmocka.h>, util.h and the store's internal headers.
 */
#ifndef TG_TESTS_SHM_HELPERS_H
#define TG_TESTS_SHM_HELPERS_H

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

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
 * concurrently on one segment are skipped under TSan; they run in the debug,
 * clang and ASan builds. TSan checks the table's threads in
 * test_concurrency. */
#if defined(__SANITIZE_THREAD__)
#define TG_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TG_TEST_TSAN 1
#endif
#endif
#ifdef TG_TEST_TSAN
#define SKIP_UNDER_TSAN() skip()
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

#define T0 UINT64_C(1700000000000000) /* us: a fixed instant */
/* ---- segment names ---- */

/* Names handed out by the running test; its teardown unlinks them. */
#define MAX_NAMES 64
static char names[MAX_NAMES][64];
static unsigned nnames;

static inline const char *name_new(const char *tag) {
  assert_true(nnames < MAX_NAMES);
  snprintf(names[nnames], sizeof names[0], "/tg-test-%ld-%u-%s", (long)getpid(),
           nnames, tag);
  return names[nnames++];
}

static inline int unlink_names(void **state) {
  (void)state;
  for (unsigned i = 0; i < nnames; i++)
    shm_unlink(names[i]); /* absent is fine */
  nnames = 0;
  return 0;
}

/* A value tg_limiter_new must overwrite (with NULL on failure). */
#define NOT_SET ((tg_limiter *)(void *)names)
/* ---- seeds ---- */

/* A generator's seed for the process asking: TG_SHM_SEED (or TG_TEST_SEED,
 * else a fresh one) mixed with x and the pid, since forked workers must not
 * all draw the same numbers. A kill run's schedule also depends on the
 * scheduler, so a seed narrows a failure down but cannot replay it. */
static uint64_t shm_seed_base;
static inline uint64_t seed_of(uint64_t x) {
  if (shm_seed_base == 0)
    shm_seed_base = test_seed("TG_SHM_SEED", test_fresh_seed());
  return shm_seed_base ^ (x * UINT64_C(0x9E3779B97F4A7C15)) ^
         (uint64_t)getpid() << 32;
}

/* ---- limiters and the segment seen from the test ---- */

static inline void shm_config(tg_config *cfg, const char *name,
                              tg_algorithm alg, uint64_t capacity) {
  tg_config_init(cfg);
  cfg->algorithm = alg;
  cfg->capacity = capacity;
  cfg->shm_name = name;
  cfg->clean_period_ms = 0; /* no thread: fork() must not inherit one */
  cfg->on_failure = TG_POLICY_ERROR;
}

static inline tg__table_params params_of(const tg_config *cfg) {
  tg__table_params p = {cfg->algorithm,
                        cfg->capacity,
                        cfg->long_keys ? cfg->long_keys : cfg->capacity,
                        cfg->sliding_max_entries,
                        true,
                        cfg->lock_timeout_ms,
                        false};
  return p;
}

/* The test's own view of a segment: shm_open + mmap + tg__table_attach with
 * the parameters of cfg, as the store does, without a limiter. */
typedef struct seg {
  void *mem;
  size_t size;
  tg__table t;
} seg;

static inline int seg_map(seg *s, const char *name, const tg_config *cfg) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0)
    return TG_ESTORE;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return TG_ESTORE;
  }
  s->size = (size_t)st.st_size;
  s->mem = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (s->mem == MAP_FAILED)
    return TG_ESTORE;
  tg__table_params p = params_of(cfg);
  int rc = tg__table_attach(&s->t, s->mem, s->size, &p);
  if (rc != TG_OK)
    munmap(s->mem, s->size);
  return rc;
}

static inline void seg_unmap(seg *s) { munmap(s->mem, s->size); }

/* A lock word (src/store/lock.h): 0 when free, else its holder's pid and
 * start time. */
static inline uint64_t lock_word(const uint64_t *w) {
  return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}

/* Whether a process died holding lock w and nobody has taken it since. Used
 * to report, and to confirm that a victim really died holding a lock. */
static inline bool owner_died(const uint64_t *w) {
  uint64_t v = lock_word(w);
  return v != 0 && tg__lock_owner_gone(v);
}

/* Nobody holds w, alive or dead. */
static inline bool lock_free(const uint64_t *w) { return lock_word(w) == 0; }

/* Takes lock w as any process attached to the table does. */
static inline int take_lock(uint64_t *w) {
  tg__wait wt = tg__wait_bound(10000);
  bool died;
  return tg__lock_take(w, true, &wt, &died);
}

static inline const tg__log_block *block_at(const seg *s, uint64_t b) {
  return (const tg__log_block *)(const void *)(s->t.base + s->t.g.log_off +
                                               b * s->t.h->log_block_bytes);
}

#define MAX_BLOCKS 256

/* Which log blocks' locks a dead owner left (died[b]); returns how many
 * blocks of LIVE keys (the logs the validator reads) someone holds, alive
 * or dead. A block a kill lost (leaked) may keep a dead owner for good. */
static inline unsigned block_locks(const seg *s, bool *died) {
  const tg__table_hdr *h = s->t.h;
  for (uint64_t b = 0; b < MAX_BLOCKS; b++)
    died[b] =
        b < h->log_bump && b < h->nlogs && owner_died(&block_at(s, b)->lock);
  unsigned held = 0;
  for (uint64_t i = 0; i < h->nslots; i++) {
    uint64_t w0 = s->t.slots[i].st.w[0];
    if ((s->t.slots[i].ctrl & 3u) == 1u && w0 >= 1 && w0 <= h->nlogs &&
        h->algorithm == TG_SLIDING_WINDOW)
      held += !lock_free(&block_at(s, w0 - 1)->lock);
  }
  return held;
}

/* What the table holds, for a failure report. */
static inline void dump_table(const seg *s, uint64_t now) {
  const tg__table_hdr *h = s->t.h;
  print_error("table: live %" PRIu64 " of %" PRIu64 ", nslots %" PRIu64
              ", horizon now%+" PRId64 " us, logs bump %" PRIu64
              " free %" PRIu64 " of %" PRIu64 ", chunks bump %" PRIu64
              " free %" PRIu64 "\n",
              h->live, h->capacity, h->nslots, (int64_t)(h->horizon_us - now),
              h->log_bump, h->log_free, h->nlogs, h->chunk_bump, h->chunk_free);
  for (uint64_t i = 0; i < h->nslots; i++) {
    uint64_t c = s->t.slots[i].ctrl;
    if ((c & 3u) != 1u)
      continue;
    uint64_t w0 = s->t.slots[i].st.w[0], w1 = s->t.slots[i].st.w[1];
    char extra[160] = "";
    if (h->algorithm == TG_SLIDING_WINDOW && w0 >= 1 && w0 <= h->nlogs) {
      const tg__log_block *b = block_at(s, w0 - 1);
      uint64_t newest = 0;
      if (b->n > 0 && b->n <= h->log_entries)
        newest = b->e[(b->head + b->n - 1) % h->log_entries].t_us;
      snprintf(extra, sizeof extra,
               " log n %u head %u sum %" PRIu64 " newest now%+" PRId64
               " period %" PRIu64 " lock %#" PRIx64,
               b->n, b->head, b->sum, (int64_t)(newest - now), b->period_us,
               lock_word(&b->lock));
    }
    print_error(
        "slot %" PRIu64 ": len %u gen %u w0 %#" PRIx64 " w1 %#" PRIx64 "%s\n",
        i, (unsigned)((c >> 2) & 0x1ffu), (unsigned)(c >> 32), w0, w1, extra);
  }
}

static inline tg__table_check validate(const char *name, const tg_config *cfg) {
  seg s;
  assert_int_equal(seg_map(&s, name, cfg), TG_OK);
  tg__table_check c;
  assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
  seg_unmap(&s);
  if (c.errors)
    print_error("%s: validate: %" PRIu64 " errors, first: %s\n", name, c.errors,
                c.first_error);
  return c;
}

static inline unsigned seg_mode(const char *name) {
  int fd = shm_open(name, O_RDONLY, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  close(fd);
  return (unsigned)st.st_mode & 07777u;
}

static inline uint64_t hit_count(tg_limiter *lim, uint64_t now, const char *key,
                                 const tg_quota *q) {
  uint64_t v = UINT64_MAX;
  assert_int_equal(tg_get_at(lim, now, key, strlen(key), q, &v), TG_OK);
  return v;
}

#endif
