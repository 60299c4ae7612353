/* SPDX-License-Identifier: MIT */
/*
 * test_shm_hostile.c - the shared-memory store against a segment that another
 * process (buggy, crashed half way, or hostile) has written garbage into.
 *
 * The segment is created through a limiter, then corrupted through the
 * test's own mapping (shm_open + mmap of the same name):
 *
 *   1. header: every field the attach checks (magic, version, sizes,
 *      offsets, counts, algorithm, shared flag, capacity/nslots), each bit
 *      of them, and the file's size: tg_limiter_new answers TG_ECORRUPT, or
 *      TG_EMISMATCH when the header is sound but of other parameters. Two
 *      states are not corrupt by design: a file of size 0 and a zero magic
 *      at the right size are what a creator that died part way leaves, and
 *      the next limiter initialises the segment again.
 *   2. body: ctrl words (status, key lengths up to 511, tags, generations),
 *      state words, key words, long-key chunk indices and contents, log
 *      block indices, a log ring's head, n, sum, last time, entry times,
 *      costs and period,
 *      free-list heads and links, the bump allocators, the live counter, the
 *      cursor, the horizon and its reach, the lock words (the table's, the
 *      cleaning pass's, each log's), the SipHash key, and seeded random
 *      storms over each region: every operation (hit, inc, get, set,
 *      expires_at, reset, clean, and inserts into a full table) of all five
 *      algorithms returns a status code or an answer; nothing crashes,
 *      hangs or touches memory out of bounds (CI runs this under
 *      ASan/UBSan), and no lock is left held by the process afterwards. A
 *      clean table gives only TG_OK (TG_EFULL when full, TG_ERANGE for a
 *      bucket value above the burst) and passes tg__table_validate.
 *   3. the header's geometry (nslots, nchunks, nlogs, log_entries,
 *      log_block_bytes, algorithm, shared) rewritten while a limiter is
 *      attached: attach checked it once, and nothing may trust it again.
 *
 * Each hostile case runs in a forked child with an alarm, so a crash or a
 * hang is reported as that case's failure instead of ending the run; the
 * child never calls cmocka (it reports on stderr and through its exit
 * status). The segment is recreated for every case with a fixed SipHash key,
 * so every case sees the same slots.
 *
 * Every byte may be corrupted, lock words included: they are tollgate's own
 * (src/store/lock.h), and a word that names no live process is taken over.
 * A word naming a live process is a held lock: operations wait for it at
 * most lock_timeout_ms (50 ms here) and answer TG_EBUSY, which only the
 * random storms may meet by chance (test_shm_lock covers held words).
 *
 * Environment: TG_HOSTILE_STORMS (random storms per algorithm, default 60),
 * TG_HOSTILE_ONLY (run only the cases whose description contains it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/lock.h"
#include "store/table.h"
#include "tollgate.h"
#include "util.h"

#define T0 UINT64_C(1700000000123456) /* us; deliberately not on a ms */
#define DAY_US UINT64_C(86400000000)
#define CAP 32u        /* keys; 37 slots */
#define LONG_KEYS 8u   /* long-key chunks */
#define LOG_ENTRIES 6u /* entries per sliding log */
#define NKEYS 8u       /* keys the segment is populated with */
#define CHILD_TIMEOUT_S 10
#define MAX_FAILURES 3 /* per test: a hang costs CHILD_TIMEOUT_S each */
#define HDR_CHECKED offsetof(tg__table_hdr, live) /* bytes attach checks */

static const tg_quota quota = {.limit = 10, .period_ms = 1000, .burst = 10};

/* ---- keys: lengths on both sides of the inline limit ---- */

static const size_t key_lens[] = {1, 7, 8, 31, 32, 33, 100, 256};

/* Key number idx (distinct for every idx < 65536) into buf; its length. */
static size_t key_bytes(unsigned idx, unsigned char *buf) {
  size_t len = key_lens[idx % (sizeof key_lens / sizeof key_lens[0])];
  for (size_t j = 0; j < len; j++)
    buf[j] = (unsigned char)(idx * 31u + j * 7u + 1u);
  buf[0] = (unsigned char)idx;
  if (len > 1)
    buf[1] = (unsigned char)(idx >> 8);
  return len;
}

static bool is_window(tg_algorithm alg) {
  return alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
}

static bool is_bucket(tg_algorithm alg) {
  return alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
}

/* ---- the segment ---- */

static char seg_name[64];

static tg_config seg_config(tg_algorithm alg) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = CAP;
  cfg.long_keys = LONG_KEYS;
  cfg.sliding_max_entries = LOG_ENTRIES;
  cfg.clean_period_ms = 0; /* no thread: fork-safe, and cleaning by hand */
  cfg.key_older_than_ms = 0;
  cfg.on_failure = TG_POLICY_ERROR;
  cfg.shm_name = seg_name;
  cfg.lock_timeout_ms = 50; /* a storm may write a live pid into a lock */
  return cfg;
}

static tg__table_params seg_params(tg_algorithm alg) {
  tg__table_params p = {alg, CAP, LONG_KEYS, LOG_ENTRIES, true, 50, false};
  return p;
}

/* The test's own mapping of the segment, and a table view over it. */
typedef struct seg {
  tg_algorithm alg;
  unsigned char *base;
  size_t size;
  tg__table t;
  tg__table_hdr pristine; /* the header as created */
} seg;

static tg__table_hdr *hdr(const seg *s) { return (tg__table_hdr *)s->base; }

static void seg_map(seg *s) {
  int fd = shm_open(seg_name, O_RDWR, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  s->size = (size_t)st.st_size;
  void *mem = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(mem != MAP_FAILED);
  s->base = mem;
}

static void seg_unmap(seg *s) {
  if (s->base)
    munmap(s->base, s->size);
  s->base = NULL;
}

/* Creates the segment through a limiter, gives it a fixed SipHash key while
 * it is still empty (so every recreation puts the keys in the same slots),
 * populates it with NKEYS keys (sliding logs of 1..NKEYS hits, the last one
 * beyond the entry cap) and maps it. */
static void seg_create(seg *s, tg_algorithm alg) {
  static unsigned serial;
  snprintf(seg_name, sizeof seg_name, "/tg-hostile-%ld-%u", (long)getpid(),
           serial++);
  tg_shm_unlink(seg_name);
  memset(s, 0, sizeof *s);
  s->alg = alg;
  tg_config cfg = seg_config(alg);
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  seg_map(s);
  hdr(s)->sip[0] = UINT64_C(0x0706050403020100);
  hdr(s)->sip[1] = UINT64_C(0x0f0e0d0c0b0a0908);
  for (unsigned k = 0; k < NKEYS; k++) {
    unsigned char key[TG_KEY_MAX];
    size_t len = key_bytes(k, key);
    for (unsigned j = 0; j <= k; j++) {
      tg_result r;
      assert_int_equal(
          tg_hit_at(lim, T0 + j * 1000u + k, key, len, &quota, 1, &r), TG_OK);
    }
  }
  tg_limiter_destroy(lim);
  tg__table_params p = seg_params(alg);
  assert_int_equal(tg__table_attach(&s->t, s->base, s->size, &p), TG_OK);
  s->pristine = *hdr(s);
}

static void seg_destroy(seg *s) {
  seg_unmap(s);
  tg_shm_unlink(seg_name);
}

/* Region offsets from the pristine header. */
static size_t ctrl_at(const seg *s, uint64_t i) {
  return (size_t)(s->pristine.ctrl_off + i * sizeof(tg__slot));
}
static size_t slot_at(const seg *s, uint64_t i) {
  return (size_t)(s->pristine.slot_off + i * sizeof(tg__slot));
}
static size_t chunk_at(const seg *s, uint64_t i) {
  return (size_t)(s->pristine.chunk_off + i * TG_KEY_MAX);
}
static size_t block_at(const seg *s, uint64_t i) {
  return (size_t)(s->pristine.log_off + i * s->pristine.log_block_bytes);
}

static uint64_t rd64(const seg *s, size_t off) {
  uint64_t v;
  memcpy(&v, s->base + off, 8);
  return v;
}

/* LIVE slots of the pristine table, in index order. */
static unsigned live_slots(const seg *s, uint64_t *out, unsigned max) {
  unsigned n = 0;
  for (uint64_t i = 0; i < s->pristine.nslots && n < max; i++)
    if ((rd64(s, ctrl_at(s, i)) & 3u) == 1u)
      out[n++] = i;
  return n;
}

/* ---- hostile cases ---- */

/* One write into the region: width 1, 4 or 8 bytes, stored or xor'ed. */
typedef struct edit {
  size_t off;
  unsigned width;
  uint64_t val;
  bool xor ;
} edit;

typedef struct hcase {
  char what[96];
  edit e[3];
  unsigned ne;
  uint32_t storm_seed; /* != 0: random xors over [storm_lo, storm_hi) */
  unsigned storm_n;
  size_t storm_lo, storm_hi;
  bool geometry; /* header geometry after attach: skip tg__table_validate */
  bool busy_ok;  /* random bytes may name a live process in a lock word */
} hcase;

typedef struct cases {
  hcase *c;
  size_t n, cap;
} cases;

static hcase *add(cases *cs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static hcase *add(cases *cs, const char *fmt, ...) {
  if (cs->n == cs->cap) {
    cs->cap = cs->cap ? 2 * cs->cap : 64;
    cs->c = realloc(cs->c, cs->cap * sizeof *cs->c);
    assert_non_null(cs->c);
  }
  hcase *h = &cs->c[cs->n++];
  memset(h, 0, sizeof *h);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->what, sizeof h->what, fmt, ap);
  va_end(ap);
  return h;
}

static void put(hcase *h, size_t off, unsigned width, uint64_t val) {
  assert_true(h->ne < 3);
  h->e[h->ne++] = (edit){off, width, val, false};
}

static void flip(hcase *h, size_t off, unsigned width, uint64_t val) {
  assert_true(h->ne < 3);
  h->e[h->ne++] = (edit){off, width, val, true};
}

static void apply_edit(unsigned char *base, const edit *e) {
  uint64_t v = 0;
  memcpy(&v, base + e->off, e->width);
  v = e->xor ? v ^ e->val : e->val;
  memcpy(base + e->off, &v, e->width); /* little-endian, like the region */
}

static void apply_case(const seg *s, const hcase *h) {
  for (unsigned i = 0; i < h->ne; i++)
    apply_edit(s->base, &h->e[i]);
  uint64_t x = h->storm_seed; /* util.h's generator */
  for (unsigned i = 0; h->storm_seed && i < h->storm_n; i++) {
    size_t off = h->storm_lo + (size_t)rng_below(&x, h->storm_hi - h->storm_lo);
    unsigned char b = (unsigned char)(rng_next(&x) | 1u);
    s->base[off] ^= b;
  }
}

/* ---- the battery a corrupted segment must survive ---- */

/* Codes a call on a corrupt segment may answer: an answer, TG_ECORRUPT,
 * TG_EFULL (the garbage fills the table), TG_EOVERFLOW (a count near 2^64),
 * TG_EBUSY where the case allows it, and `extra` where the call has one of
 * its own. Strict (clean table): only TG_OK, TG_EFULL and `extra`. */
static bool code_ok(int rc, int extra, bool strict, bool busy_ok) {
  if (rc == TG_OK || rc == TG_EFULL || (extra && rc == extra))
    return true;
  return !strict && (rc == TG_ECORRUPT || rc == TG_EOVERFLOW ||
                     (busy_ok && rc == TG_EBUSY));
}

#define CHECK(call, extra)                                                     \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (!code_ok(rc_, (extra), strict, busy_ok)) {                             \
      fprintf(stderr, "    key %u: %s -> %s\n", k, #call, tg_err_name(rc_));   \
      bad++;                                                                   \
    }                                                                          \
  } while (0)

/* Every operation on every key (populated and new, short and long), cleaning
 * passes, resets, and twice more new keys than the table holds (inserts into
 * a full table: pressure reclaim, then TG_EFULL). Returns the number of
 * unexpected codes. */
static unsigned battery(tg_limiter *lim, tg_algorithm alg, bool strict,
                        bool busy_ok) {
  unsigned bad = 0, k = 0;
  uint64_t now = T0 + 500000, v;
  size_t removed;
  tg_result r;
  unsigned char key[TG_KEY_MAX];
  size_t len;
  for (k = 0; k < NKEYS + 4; k++) {
    len = key_bytes(k, key);
    CHECK(tg_hit_at(lim, now, key, len, &quota, 0, &r), 0);
    CHECK(tg_hit_at(lim, now + 1, key, len, &quota, 1, &r), 0);
    CHECK(tg_hit_at(lim, now + 2, key, len, &quota, 1000, &r), 0);
    CHECK(tg_get_at(lim, now + 3, key, len, &quota, &v), 0);
    CHECK(tg_expires_at_at(lim, now + 4, key, len, &quota, &v), 0);
    if (is_window(alg))
      CHECK(tg_inc_at(lim, now + 5, key, len, &quota, 1, &v), 0);
    if (alg != TG_SLIDING_WINDOW) {
      CHECK(tg_set_at(lim, now + 6, key, len, &quota, 2), 0);
      CHECK(tg_set_at(lim, now + 7, key, len, &quota, 11),
            is_bucket(alg) ? TG_ERANGE : 0);
    }
    CHECK(tg_hit_at(lim, now + 8, key, len, &quota, 1, &r), 0);
  }
  k = 0;
  CHECK(tg_clean_at(lim, now, &removed), 0);
  for (k = 0; k < NKEYS + 4; k += 2) {
    len = key_bytes(k, key);
    CHECK(tg_reset(lim, key, len), 0);
  }
  k = 0;
  CHECK(tg_clean_at(lim, now + DAY_US, &removed), 0);
  for (k = 100; k < 100 + 2 * CAP; k++) {
    len = key_bytes(k, key);
    CHECK(tg_hit_at(lim, now + DAY_US, key, len, &quota, 1, &r), 0);
  }
  /* a day later all of those are fresh: inserts reclaim them under pressure */
  for (k = 200; k < 200 + 2 * CAP; k++) {
    len = key_bytes(k, key);
    CHECK(tg_hit_at(lim, now + 2 * DAY_US, key, len, &quota, 1, &r), 0);
  }
  for (k = 0; k < NKEYS + 4; k++) {
    len = key_bytes(k, key);
    CHECK(tg_get_at(lim, now + 2 * DAY_US, key, len, &quota, &v), 0);
    CHECK(tg_reset(lim, key, len), 0);
  }
  k = 0;
  CHECK(tg_clean_at(lim, now + 3 * DAY_US, &removed), 0);
  (void)tg_key_count(lim);
  return bad;
}

/* The fatal signals cmocka catches (to carry on with the next test) as they
 * were before it did: a child must die of them (or let ASan report them),
 * not carry on running the rest of the suite. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define NFATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction saved_fatal[NFATAL];

/* Lock words of the pristine layout that name this process: a lock some
 * path took and never released. */
static unsigned locks_left(const seg *s) {
  const tg__table_hdr *p = &s->pristine;
  uint64_t me = tg__lock_self();
  unsigned n = 0;
  n += rd64(s, offsetof(tg__table_hdr, lock)) == me;
  n += rd64(s, offsetof(tg__table_hdr, clean_lock)) == me;
  for (uint64_t b = 0; b < p->nlogs; b++)
    n += (rd64(s, block_at(s, b) + offsetof(tg__log_block, lock)) &
          ~TG__LOCK_WAITERS) == me;
  if (n)
    fprintf(stderr, "    %u lock(s) left held by this process\n", n);
  return n;
}

/* The child: attaches a limiter, corrupts, runs the battery, validates. */
static int child(const seg *s, const hcase *h, bool strict) {
  for (size_t i = 0; i < NFATAL; i++)
    sigaction(fatal_signals[i], &saved_fatal[i], NULL);
  alarm(CHILD_TIMEOUT_S);
  tg_config cfg = seg_config(s->alg);
  tg_limiter *lim = NULL;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    fprintf(stderr, "    attach: %s\n", tg_err_name(rc));
    return 1;
  }
  if (h)
    apply_case(s, h);
  unsigned bad = battery(lim, s->alg, strict, h && h->busy_ok);
  if (!h || !h->geometry) {
    tg__table_check chk;
    if (tg__table_validate(&s->t, &chk) != TG_OK) {
      fprintf(stderr, "    tg__table_validate failed\n");
      bad++;
    } else if (strict && chk.errors) {
      fprintf(stderr, "    invalid table: %s\n", chk.first_error);
      bad++;
    }
  }
  tg_limiter_destroy(lim);
  bad += locks_left(s);
  return bad ? 1 : 0;
}

/* Runs one case in a fresh segment in a child. Returns true if it passed. */
static bool run_case(tg_algorithm alg, const hcase *h, bool strict) {
  seg s;
  seg_create(&s, alg);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(child(&s, h, strict));
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  seg_destroy(&s);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return true;
  const char *what = h ? h->what : "no corruption";
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    print_error("%s / %s: HANG (killed after %d s)\n", tg_algorithm_name(alg),
                what, CHILD_TIMEOUT_S);
  else if (WIFSIGNALED(st))
    print_error("%s / %s: killed by signal %d (%s)\n", tg_algorithm_name(alg),
                what, WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    print_error("%s / %s: exit status %d (see above)\n", tg_algorithm_name(alg),
                what, WEXITSTATUS(st));
  return false;
}

typedef void (*case_gen)(const seg *s, cases *cs);

/* Generates the cases of one family from a pristine segment of each
 * algorithm and runs them all; fails after MAX_FAILURES of them. */
static void run_family(case_gen gen, unsigned alg_mask) {
  unsigned failures = 0, ran = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    if (!(alg_mask & (1u << a)))
      continue;
    seg s;
    seg_create(&s, (tg_algorithm)a);
    cases cs = {0};
    gen(&s, &cs);
    seg_destroy(&s);
    const char *only = getenv("TG_HOSTILE_ONLY");
    for (size_t i = 0; i < cs.n && failures < MAX_FAILURES; i++) {
      if (only && !strstr(cs.c[i].what, only))
        continue;
      ran++;
      if (!run_case((tg_algorithm)a, &cs.c[i], false))
        failures++;
    }
    free(cs.c);
  }
  if (failures)
    print_error("%u failing case(s) (stopped after %d) of %u run\n", failures,
                MAX_FAILURES, ran);
  assert_int_equal(failures, 0);
}

#define ALL_ALGS ((1u << TG_ALGORITHM_COUNT) - 1)

/* ---- 0. a clean segment ---- */

static void clean_segment_passes(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    assert_true(run_case((tg_algorithm)a, NULL, true));
}

/* ---- 1. the header, checked on attach ---- */

static int attach_rc(tg_algorithm alg) {
  tg_config cfg = seg_config(alg);
  tg_limiter *lim = NULL;
  int rc = tg_limiter_new(&lim, &cfg);
  tg_limiter_destroy(lim);
  return rc;
}

/* Named header fields set to values tollgate never writes. */
typedef struct hfield {
  const char *name;
  size_t off;
  unsigned width;
} hfield;

#define HF(f)                                                                  \
  { #f, offsetof(tg__table_hdr, f), sizeof(((tg__table_hdr *)0)->f) }
static const hfield checked_fields[] = {
    HF(magic),       HF(version),     HF(hdr_bytes),       HF(algorithm),
    HF(slot_bytes),  HF(log_entries), HF(log_block_bytes), HF(shared),
    HF(capacity),    HF(nslots),      HF(nchunks),         HF(nlogs),
    HF(ctrl_off),    HF(slot_off),    HF(chunk_off),       HF(log_off),
    HF(total_bytes), HF(pidns)};
#define NFIELDS (sizeof checked_fields / sizeof checked_fields[0])

static void set_field(seg *s, const hfield *f, uint64_t v) {
  memcpy(s->base + f->off, &v, f->width);
}

static uint64_t get_field(const seg *s, const hfield *f) {
  uint64_t v = 0;
  memcpy(&v, s->base + f->off, f->width);
  return v;
}

/* Expects attach to answer `want` with field f set to v; restores it. */
static void expect_attach(seg *s, const hfield *f, uint64_t v, int want,
                          unsigned *failures) {
  uint64_t old = get_field(s, f);
  set_field(s, f, v);
  int rc = attach_rc(s->alg);
  set_field(s, f, old);
  if (rc != want) {
    print_error("%s: %s = %" PRIu64 ": expected %s, got %s\n",
                tg_algorithm_name(s->alg), f->name, v, tg_err_name(want),
                tg_err_name(rc));
    (*failures)++;
  }
}

static void header_fields_refused(void **state) {
  (void)state;
  unsigned failures = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    seg s;
    seg_create(&s, (tg_algorithm)a);
    for (size_t f = 0; f < NFIELDS; f++) {
      const hfield *hf = &checked_fields[f];
      if (hf->off == offsetof(tg__table_hdr, algorithm))
        continue; /* below */
      uint64_t cur = get_field(&s, hf);
      uint64_t top = hf->width == 8 ? UINT64_MAX : UINT32_MAX;
      uint64_t vals[] = {cur + 1,  cur - 1, top, cur ^ (UINT64_C(1) << 31),
                         cur + 64, cur - 64};
      for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
        uint64_t val = vals[v] & top;
        if (val == cur || (hf->off == 0 && val == 0))
          continue;
        int want = TG_ECORRUPT;
        /* a sound table of another format version, or made in another PID
         * namespace: not ours to read, but not corrupt either */
        if (hf->off == offsetof(tg__table_hdr, version) ||
            hf->off == offsetof(tg__table_hdr, pidns))
          want = TG_EMISMATCH;
        /* entry counts that round up to the same block size: a sound
         * header of another sliding_max_entries */
        if (hf->off == offsetof(tg__table_hdr, log_entries) && val >= 1 &&
            val <= (1u << 24) &&
            ((sizeof(tg__log_block) + sizeof(tg__entry) * val + 63) &
             ~UINT64_C(63)) == s.pristine.log_block_bytes)
          want = TG_EMISMATCH;
        expect_attach(&s, hf, val, want, &failures);
      }
    }
    /* the algorithm: unknown values are corrupt; another one of the same
     * layout (no log arena on either side) is a sound header of other
     * parameters */
    const hfield *alg = &checked_fields[3];
    for (uint64_t b = 0; b < 8; b++) {
      if (b == (uint64_t)a)
        continue;
      bool same_layout = b < TG_ALGORITHM_COUNT && b != TG_SLIDING_WINDOW &&
                         a != TG_SLIDING_WINDOW;
      expect_attach(&s, alg, b, same_layout ? TG_EMISMATCH : TG_ECORRUPT,
                    &failures);
    }
    expect_attach(&s, &checked_fields[7], 0, TG_ECORRUPT, &failures);
    expect_attach(&s, &checked_fields[7], 2, TG_ECORRUPT, &failures);
    /* capacity and nslots moved together still disagree with the offsets */
    uint64_t old_cap = hdr(&s)->capacity, old_ns = hdr(&s)->nslots;
    hdr(&s)->capacity = CAP + 7;
    hdr(&s)->nslots = old_ns + 1;
    int rc = attach_rc(s.alg);
    hdr(&s)->capacity = old_cap;
    hdr(&s)->nslots = old_ns;
    if (rc != TG_ECORRUPT) {
      print_error("capacity+nslots: got %s\n", tg_err_name(rc));
      failures++;
    }
    assert_int_equal(attach_rc(s.alg), TG_OK); /* everything restored */
    seg_destroy(&s);
  }
  assert_int_equal(failures, 0);
}

/* Every single bit of every checked header byte. */
static void header_bitflips_refused(void **state) {
  (void)state;
  unsigned failures = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    seg s;
    seg_create(&s, (tg_algorithm)a);
    for (size_t off = 0; off < HDR_CHECKED; off++) {
      if ((off >= offsetof(tg__table_hdr, pad0) &&
           off < offsetof(tg__table_hdr, pad0) + 4) ||
          (off >= offsetof(tg__table_hdr, sip) &&
           off < offsetof(tg__table_hdr, sip) + 16))
        continue; /* not checked: padding, and the key (any value works) */
      for (unsigned bit = 0; bit < 8; bit++) {
        s.base[off] ^= (unsigned char)(1u << bit);
        int rc = attach_rc(s.alg);
        s.base[off] ^= (unsigned char)(1u << bit);
        if (rc != TG_ECORRUPT && rc != TG_EMISMATCH) {
          print_error("%s: header byte %zu bit %u: %s\n",
                      tg_algorithm_name(s.alg), off, bit, tg_err_name(rc));
          failures++;
        }
      }
    }
    seg_destroy(&s);
  }
  assert_int_equal(failures, 0);
}

/* Sets the segment file's size (the name is the current seg_name). */
static int resize(size_t size) {
  int fd = shm_open(seg_name, O_RDWR, 0);
  if (fd < 0)
    return -1;
  int rc = ftruncate(fd, (off_t)size);
  close(fd);
  return rc;
}

static void file_size_refused(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    seg s;
    seg_create(&s, (tg_algorithm)a);
    size_t sizes[] = {s.size - 1,
                      s.size - 64,
                      s.size / 2,
                      HDR_CHECKED,
                      sizeof(tg__table_hdr),
                      sizeof(tg__table_hdr) - 1,
                      8,
                      1,
                      s.size + 1,
                      s.size + 64,
                      s.size + 4096,
                      2 * s.size};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      assert_int_equal(resize(sizes[i]), 0);
      int rc = attach_rc(s.alg);
      if (rc != TG_ECORRUPT)
        print_error("%s: file of %zu bytes (table %zu): %s\n",
                    tg_algorithm_name(s.alg), sizes[i], s.size,
                    tg_err_name(rc));
      assert_int_equal(rc, TG_ECORRUPT);
      seg_destroy(&s); /* shrinking lost the tail: start again */
      seg_create(&s, (tg_algorithm)a);
    }
    /* size 0: what a creator that died before sizing it leaves: created
     * afresh */
    assert_int_equal(resize(0), 0);
    tg_config cfg = seg_config(s.alg);
    tg_limiter *lim = NULL;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    assert_int_equal(tg_key_count(lim), 0);
    tg_limiter_destroy(lim);
    seg_destroy(&s);
  }
}

static void magic_zero_reinitialises(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    seg s;
    seg_create(&s, (tg_algorithm)a);
    /* a zero magic at the right size is a creator that died before
     * publishing it: the next limiter initialises the segment again */
    hdr(&s)->magic = 0;
    tg_config cfg = seg_config(s.alg);
    tg_limiter *lim = NULL;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    assert_int_equal(tg_key_count(lim), 0);
    tg_limiter_destroy(lim);
    assert_int_equal(hdr(&s)->magic, TG__TABLE_MAGIC);
    /* at another size it is corrupt */
    hdr(&s)->magic = 0;
    assert_int_equal(resize(s.size + 64), 0);
    assert_int_equal(attach_rc(s.alg), TG_ECORRUPT);
    seg_destroy(&s);
  }
}

/* A sound segment opened with other creation parameters. */
static void other_parameters_mismatch(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    seg s;
    seg_create(&s, (tg_algorithm)a);
    tg_limiter *lim = NULL;
    tg_config cfg = seg_config(s.alg);
    cfg.algorithm = (tg_algorithm)((a + 1) % TG_ALGORITHM_COUNT);
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EMISMATCH);
    cfg = seg_config(s.alg);
    cfg.capacity = CAP + 1;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EMISMATCH);
    cfg = seg_config(s.alg);
    cfg.long_keys = LONG_KEYS - 1;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EMISMATCH);
    cfg = seg_config(s.alg);
    cfg.sliding_max_entries = LOG_ENTRIES + 100;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EMISMATCH);
    assert_null(lim);
    seg_destroy(&s);
  }
}

/* A consistent header claiming another algorithm of the same layout, opened
 * as that algorithm: every state is then read in the wrong encoding. */
static void reinterpreted_states(void **state) {
  (void)state;
  static const tg_algorithm same[] = {TG_FIXED_WINDOW, TG_FIXED_WINDOW_PER_KEY,
                                      TG_TOKEN_BUCKET, TG_LEAKY_BUCKET};
  unsigned failures = 0;
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++) {
      if (a == b)
        continue;
      seg s;
      seg_create(&s, same[a]);
      hdr(&s)->algorithm = (uint32_t)same[b];
      s.alg = same[b];
      tg__table_params p = seg_params(same[b]);
      assert_int_equal(tg__table_attach(&s.t, s.base, s.size, &p), TG_OK);
      fflush(stderr);
      pid_t pid = fork();
      assert_true(pid >= 0);
      if (pid == 0)
        _exit(child(&s, NULL, false));
      int st = 0;
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        print_error("%s read as %s: status %d\n", tg_algorithm_name(same[a]),
                    tg_algorithm_name(same[b]), st);
        failures++;
      }
      seg_destroy(&s);
    }
  assert_int_equal(failures, 0);
}

/* ---- 2. the body ---- */

#define CTRL_STATUS(c, s) (((c) & ~UINT64_C(3)) | (s))
#define CTRL_LEN(c, l) (((c) & ~(UINT64_C(0x1ff) << 2)) | ((uint64_t)(l) << 2))

static void gen_ctrl(const seg *s, cases *cs) {
  uint64_t live[64];
  unsigned n = live_slots(s, live, 64);
  for (unsigned j = 0; j < n; j++) {
    uint64_t i = live[j], c = rd64(s, ctrl_at(s, i));
    size_t o = ctrl_at(s, i);
    put(add(cs, "ctrl[%" PRIu64 "] EMPTY", i), o, 8, CTRL_STATUS(c, 0));
    put(add(cs, "ctrl[%" PRIu64 "] TOMB", i), o, 8, CTRL_STATUS(c, 2));
    put(add(cs, "ctrl[%" PRIu64 "] status 3", i), o, 8, CTRL_STATUS(c, 3));
    static const unsigned lens[] = {0, 1, 32, 33, 255, 256, 257, 300, 511};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
      put(add(cs, "ctrl[%" PRIu64 "] len %u", i, lens[l]), o, 8,
          CTRL_LEN(c, lens[l]));
    flip(add(cs, "ctrl[%" PRIu64 "] tag ^1", i), o, 8, UINT64_C(1) << 16);
    flip(add(cs, "ctrl[%" PRIu64 "] gen ^1", i), o, 8, UINT64_C(1) << 32);
    put(add(cs, "ctrl[%" PRIu64 "] gen max", i), o, 8,
        (c & UINT64_C(0xffffffff)) | (UINT64_C(0xffffffff) << 32));
    put(add(cs, "ctrl[%" PRIu64 "] all ones", i), o, 8, UINT64_MAX);
    /* a key that another slot holds: two LIVE slots, one key */
    if (j + 1 < n)
      put(add(cs, "ctrl[%" PRIu64 "] = ctrl[%" PRIu64 "]", i, live[j + 1]), o,
          8, rd64(s, ctrl_at(s, live[j + 1])));
  }
  /* EMPTY slots turned LIVE with garbage behind them */
  unsigned extra = 0;
  for (uint64_t i = 0; i < s->pristine.nslots && extra < 3; i++) {
    if ((rd64(s, ctrl_at(s, i)) & 3u) != 0)
      continue;
    extra++;
    put(add(cs, "empty ctrl[%" PRIu64 "] LIVE len 8", i), ctrl_at(s, i), 8,
        UINT64_C(1) | 8u << 2);
    put(add(cs, "empty ctrl[%" PRIu64 "] LIVE len 200", i), ctrl_at(s, i), 8,
        UINT64_C(1) | 200u << 2 | UINT64_C(0xabcd) << 16);
    hcase *h = add(cs, "empty ctrl[%" PRIu64 "] LIVE + garbage slot", i);
    put(h, ctrl_at(s, i), 8, UINT64_C(1) | 100u << 2);
    put(h, slot_at(s, i), 8, UINT64_MAX);
    put(h, slot_at(s, i) + 16, 8, UINT64_MAX);
  }
  /* every ctrl word LIVE with the longest length */
  for (uint64_t i = 0; i < s->pristine.nslots; i += 5)
    put(add(cs, "ctrl[%" PRIu64 "] = LIVE|511", i), ctrl_at(s, i), 8,
        UINT64_C(1) | 511u << 2);
}

static void gen_state(const seg *s, cases *cs) {
  uint64_t live[64];
  unsigned n = live_slots(s, live, 64);
  const uint64_t end_mask = (UINT64_C(1) << 54) - 1;
  for (unsigned j = 0; j < n; j++) {
    uint64_t i = live[j];
    size_t o = slot_at(s, i);
    uint64_t w0 = rd64(s, o), w1 = rd64(s, o + 8);
    put(add(cs, "slot[%" PRIu64 "].w0 = 0", i), o, 8, 0);
    put(add(cs, "slot[%" PRIu64 "].w0 = max", i), o, 8, UINT64_MAX);
    put(add(cs, "slot[%" PRIu64 "].w1 = 0", i), o + 8, 8, 0);
    put(add(cs, "slot[%" PRIu64 "].w1 = max", i), o + 8, 8, UINT64_MAX);
    put(add(cs, "slot[%" PRIu64 "].w1 + 1", i), o + 8, 8, w1 + 1);
    if (is_window(s->alg)) {
      uint64_t gen = w0 & ~end_mask;
      static const uint64_t ends[] = {
          1, T0 + 10 * DAY_US, TG_NOW_MAX_US + TG_PERIOD_MAX_MS * 1000,
          TG_NOW_MAX_US + TG_PERIOD_MAX_MS * 1000 + 1, (UINT64_C(1) << 54) - 1};
      for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++) {
        hcase *h = add(cs, "slot[%" PRIu64 "] window end %" PRIu64, i, ends[e]);
        put(h, o, 8, gen | ends[e]);
        put(h, o + 8, 8, UINT64_MAX - 1); /* and a count near 2^64 */
      }
      put(add(cs, "slot[%" PRIu64 "] count max", i), o + 8, 8, UINT64_MAX);
    } else if (is_bucket(s->alg)) {
      static const uint64_t tats[] = {
          1, (T0 + 10 * DAY_US) * 1000,
          TG_NOW_MAX_US * 1000 + TG_TOLERANCE_MAX_NS,
          TG_NOW_MAX_US * 1000 + TG_TOLERANCE_MAX_NS + 1, UINT64_MAX - 1};
      for (size_t e = 0; e < sizeof tats / sizeof tats[0]; e++)
        put(add(cs, "slot[%" PRIu64 "] TAT %" PRIu64, i, tats[e]), o, 8,
            tats[e]);
    } else {
      const tg__table_hdr *p = &s->pristine;
      uint64_t bis[] = {p->nlogs, p->nlogs + 1, UINT64_MAX, p->log_bump + 1,
                        w0 == 1 ? 2 : 1};
      for (size_t e = 0; e < sizeof bis / sizeof bis[0]; e++)
        put(add(cs, "slot[%" PRIu64 "] log block %" PRIu64, i, bis[e]), o, 8,
            bis[e]);
    }
  }
}

static void gen_keys(const seg *s, cases *cs) {
  uint64_t live[64];
  unsigned n = live_slots(s, live, 64);
  const tg__table_hdr *p = &s->pristine;
  uint64_t first_chunk = UINT64_MAX;
  for (unsigned j = 0; j < n; j++) {
    uint64_t i = live[j], c = rd64(s, ctrl_at(s, i));
    size_t o = slot_at(s, i) + 16, len = (size_t)((c >> 2) & 0x1ff);
    if (len <= 32) {
      flip(add(cs, "slot[%" PRIu64 "] key byte 0 ^1", i), o, 1, 1);
      put(add(cs, "slot[%" PRIu64 "] key word 3 = max", i), o + 24, 8,
          UINT64_MAX);
      continue;
    }
    uint64_t ci = rd64(s, o);
    if (first_chunk == UINT64_MAX)
      first_chunk = ci;
    else
      put(add(cs, "slot[%" PRIu64 "] chunk = another key's", i), o, 8,
          first_chunk);
    uint64_t cis[] = {p->nchunks - 1, p->nchunks, p->nchunks + 1, UINT64_MAX,
                      UINT64_C(1) << 58};
    for (size_t e = 0; e < sizeof cis / sizeof cis[0]; e++)
      put(add(cs, "slot[%" PRIu64 "] chunk %" PRIu64, i, cis[e]), o, 8, cis[e]);
    if (ci < p->nchunks) {
      size_t co = chunk_at(s, ci);
      flip(add(cs, "chunk %" PRIu64 " byte 0 ^1", ci), co, 1, 1);
      put(add(cs, "chunk %" PRIu64 " last word = max", ci), co + TG_KEY_MAX - 8,
          8, UINT64_MAX);
    }
  }
}

/* A dead process's lock identity: a child that exited and was reaped. */
static uint64_t dead_identity(void) {
  static uint64_t id;
  if (id)
    return id;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    uint64_t me = tg__lock_self();
    (void)!write(fds[1], &me, sizeof me);
    _exit(0);
  }
  assert_int_equal(read(fds[0], &id, sizeof id), (ssize_t)sizeof id);
  waitpid(pid, NULL, 0);
  close(fds[0]);
  close(fds[1]);
  return id;
}

/* Lock words that name no live process: each must be taken over. (Words
 * naming a live one are held locks, test_shm_lock's business.) */
static void gen_lock_words(cases *cs, size_t off, const char *what) {
  /* the cases run in a child: this (parent) process is alive there, so a
   * word with its pid and another start time is a recycled pid */
  uint64_t me = tg__lock_self(), pid = me & TG__LOCK_PID_MASK;
  const struct {
    const char *name;
    uint64_t v;
  } w[] = {
      {"all ones", UINT64_MAX},
      {"bit 31", UINT64_C(1) << 31 | pid},
      {"pid 0 with a start time", UINT64_C(12345) << 32},
      {"pid 0 waiters", TG__LOCK_WAITERS},
      {"pid beyond PID_MAX_LIMIT", UINT64_C(4194305)},
      {"pid max", TG__LOCK_PID_MASK},
      {"a dead process", dead_identity()},
      {"a dead process, waiters", dead_identity() | TG__LOCK_WAITERS},
      {"the parent's pid, another start", me ^ UINT64_C(1) << 32},
  };
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    put(add(cs, "%s = %s", what, w[i].name), off, 8, w[i].v);
}

static void gen_logs(const seg *s, cases *cs) {
  uint64_t live[64];
  unsigned n = live_slots(s, live, 64);
  const tg__table_hdr *p = &s->pristine;
  const size_t on = offsetof(tg__log_block, n),
               oh = offsetof(tg__log_block, head),
               os = offsetof(tg__log_block, sum),
               op = offsetof(tg__log_block, period_us),
               ok = offsetof(tg__log_block, lock),
               of = offsetof(tg__log_block, next_free),
               ol = offsetof(tg__log_block, last_us),
               oe = offsetof(tg__log_block, e);
  for (unsigned j = 0; j < n; j++) {
    uint64_t bi = rd64(s, slot_at(s, live[j]));
    if (bi == 0 || bi > p->nlogs)
      continue;
    size_t b = block_at(s, bi - 1);
    uint32_t len;
    memcpy(&len, s->base + b + on, 4);
    static const uint32_t ns[] = {0,    1,         LOG_ENTRIES, LOG_ENTRIES + 1,
                                  1000, UINT32_MAX};
    for (size_t e = 0; e < sizeof ns / sizeof ns[0]; e++)
      put(add(cs, "log %" PRIu64 " n = %u", bi - 1, ns[e]), b + on, 4, ns[e]);
    static const uint32_t heads[] = {1, LOG_ENTRIES - 1, LOG_ENTRIES,
                                     LOG_ENTRIES + 1, UINT32_MAX};
    for (size_t e = 0; e < sizeof heads / sizeof heads[0]; e++)
      put(add(cs, "log %" PRIu64 " head = %u", bi - 1, heads[e]), b + oh, 4,
          heads[e]);
    uint64_t sum = rd64(s, b + os);
    uint64_t sums[] = {0, sum - 1, sum + 1, UINT64_MAX};
    for (size_t e = 0; e < sizeof sums / sizeof sums[0]; e++)
      put(add(cs, "log %" PRIu64 " sum = %" PRIu64, bi - 1, sums[e]), b + os, 8,
          sums[e]);
    hcase *hs = add(cs, "log %" PRIu64 " head and n at the ring's end", bi - 1);
    put(hs, b + oh, 4, LOG_ENTRIES - 1);
    put(hs, b + on, 4, LOG_ENTRIES);
    gen_lock_words(cs, b + ok, "log lock");
    put(add(cs, "log %" PRIu64 " period 0", bi - 1), b + op, 8, 0);
    put(add(cs, "log %" PRIu64 " period max", bi - 1), b + op, 8, UINT64_MAX);
    put(add(cs, "log %" PRIu64 " last_us 0", bi - 1), b + ol, 8, 0);
    put(add(cs, "log %" PRIu64 " last_us max", bi - 1), b + ol, 8, UINT64_MAX);
    put(add(cs, "log %" PRIu64 " last_us past max", bi - 1), b + ol, 8,
        TG_NOW_MAX_US + 1);
    put(add(cs, "log %" PRIu64 " next_free max", bi - 1), b + of, 8,
        UINT64_MAX);
    put(add(cs, "log %" PRIu64 " next_free self", bi - 1), b + of, 8, bi);
    for (uint32_t k = 0; k < LOG_ENTRIES; k++) {
      size_t e = b + oe + k * sizeof(tg__entry);
      put(add(cs, "log %" PRIu64 " e[%u].t max", bi - 1, k), e, 8, UINT64_MAX);
      put(add(cs, "log %" PRIu64 " e[%u].t past max", bi - 1, k), e, 8,
          TG_NOW_MAX_US + 1);
      put(add(cs, "log %" PRIu64 " e[%u].t 0", bi - 1, k), e, 8, 0);
      put(add(cs, "log %" PRIu64 " e[%u].t future", bi - 1, k), e, 8,
          T0 + 10 * DAY_US + k);
      put(add(cs, "log %" PRIu64 " e[%u].cost max", bi - 1, k), e + 8, 8,
          UINT64_MAX);
      if (k + 1 < LOG_ENTRIES && k + 1 < len) {
        hcase *h =
            add(cs, "log %" PRIu64 " e[%u].t = e[%u].t", bi - 1, k + 1, k);
        put(h, e + sizeof(tg__entry), 8, rd64(s, e));
      }
    }
    hcase *h = add(cs, "log %" PRIu64 " full of max costs", bi - 1);
    put(h, b + on, 4, LOG_ENTRIES);
    for (uint32_t k = 0; k < 2; k++)
      put(h, b + oe + k * sizeof(tg__entry) + 8, 8, UINT64_MAX);
  }
  /* a block never handed out, and the one past the bump pointer */
  if (p->log_bump < p->nlogs) {
    size_t b = block_at(s, p->log_bump);
    hcase *h = add(cs, "unused block %" PRIu64 " garbage", p->log_bump);
    put(h, b + on, 4, UINT32_MAX);
    put(h, b + ok, 8, UINT64_MAX);
    put(h, b + of, 8, UINT64_MAX);
  }
}

static void gen_header_runtime(const seg *s, cases *cs) {
  const tg__table_hdr *p = &s->pristine;
#define HO(f) offsetof(tg__table_hdr, f)
  uint64_t counts[] = {0, 1, CAP - 1, CAP, CAP + 1, UINT64_MAX};
  for (size_t e = 0; e < sizeof counts / sizeof counts[0]; e++)
    put(add(cs, "live = %" PRIu64, counts[e]), HO(live), 8, counts[e]);
  uint64_t bumps[] = {0, p->nchunks - 1, p->nchunks, p->nchunks + 1,
                      UINT64_MAX};
  for (size_t e = 0; e < sizeof bumps / sizeof bumps[0]; e++)
    put(add(cs, "chunk_bump = %" PRIu64, bumps[e]), HO(chunk_bump), 8,
        bumps[e]);
  uint64_t heads[] = {1, p->nchunks, p->nchunks + 1, UINT64_MAX};
  for (size_t e = 0; e < sizeof heads / sizeof heads[0]; e++)
    put(add(cs, "chunk_free = %" PRIu64, heads[e]), HO(chunk_free), 8,
        heads[e]);
  /* free lists that loop, or lead out of range, through the link words */
  for (uint64_t c = 0; c < 2 && c < p->nchunks; c++) {
    hcase *h = add(cs, "chunk_free = %" PRIu64 " -> itself", c + 1);
    put(h, HO(chunk_free), 8, c + 1);
    put(h, chunk_at(s, c), 8, c + 1);
    h = add(cs, "chunk_free = %" PRIu64 " -> out of range", c + 1);
    put(h, HO(chunk_free), 8, c + 1);
    put(h, chunk_at(s, c), 8, UINT64_MAX);
  }
  uint64_t lbumps[] = {0, p->nlogs, p->nlogs + 1, UINT64_MAX};
  for (size_t e = 0; e < sizeof lbumps / sizeof lbumps[0]; e++)
    put(add(cs, "log_bump = %" PRIu64, lbumps[e]), HO(log_bump), 8, lbumps[e]);
  uint64_t lheads[] = {1, p->nlogs, p->nlogs + 1, UINT64_MAX};
  for (size_t e = 0; e < sizeof lheads / sizeof lheads[0]; e++)
    put(add(cs, "log_free = %" PRIu64, lheads[e]), HO(log_free), 8, lheads[e]);
  for (uint64_t b = 0; b < 2 && b < p->nlogs; b++) {
    size_t nf = block_at(s, b) + offsetof(tg__log_block, next_free);
    hcase *h = add(cs, "log_free = %" PRIu64 " -> itself", b + 1);
    put(h, HO(log_free), 8, b + 1);
    put(h, nf, 8, b + 1);
    h = add(cs, "log_free = %" PRIu64 " -> out of range", b + 1);
    put(h, HO(log_free), 8, b + 1);
    put(h, nf, 8, UINT64_MAX);
  }
  uint64_t cursors[] = {p->nslots, UINT64_MAX};
  for (size_t e = 0; e < sizeof cursors / sizeof cursors[0]; e++)
    put(add(cs, "cursor = %" PRIu64, cursors[e]), HO(cursor), 8, cursors[e]);
  flip(add(cs, "sip ^1"), HO(sip), 8, 1);
  put(add(cs, "pad0 = max"), HO(pad0), 4, UINT32_MAX);
  uint64_t reaches[] = {0, 1, TG_PERIOD_MAX_MS * 1000, UINT64_MAX};
  for (size_t e = 0; e < sizeof reaches / sizeof reaches[0]; e++)
    put(add(cs, "reach = %" PRIu64, reaches[e]), HO(reach_us), 8, reaches[e]);
  gen_lock_words(cs, HO(lock), "table lock");
  gen_lock_words(cs, HO(clean_lock), "cleaning lock");
#undef HO
}

/* The horizon: a call on an absent key is evaluated no earlier than it. */
static void gen_horizon(const seg *s, cases *cs) {
  (void)s;
  uint64_t hz[] = {T0 + DAY_US,       TG_NOW_MAX_US - 1, TG_NOW_MAX_US,
                   TG_NOW_MAX_US + 1, UINT64_MAX / 1000, UINT64_MAX};
  for (size_t e = 0; e < sizeof hz / sizeof hz[0]; e++)
    put(add(cs, "horizon = %" PRIu64, hz[e]),
        offsetof(tg__table_hdr, horizon_us), 8, hz[e]);
}

/* A horizon beyond now + TG_PERIOD_MAX_MS (or TG_NOW_MAX_US) is not one
 * tollgate writes: it is cleared, and the call on an absent key runs at its
 * own now (never at the horizon, which would run the steps outside the
 * range their arithmetic is sized for, or hold every new key years ahead). */
static void horizon_beyond_range_cleared(void **state) {
  (void)state;
  unsigned failures = 0;
  const uint64_t hz[] = {T0 + TG_PERIOD_MAX_MS * 1000 + 1, TG_NOW_MAX_US + 1,
                         UINT64_MAX / 1000, UINT64_MAX};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    for (size_t j = 0; j < sizeof hz / sizeof hz[0]; j++) {
      seg s;
      seg_create(&s, (tg_algorithm)a);
      tg_config cfg = seg_config(s.alg);
      tg_limiter *lim = NULL, *fresh = NULL;
      assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
      cfg.shm_name = NULL; /* a table of its own, never reclaimed */
      assert_int_equal(tg_limiter_new(&fresh, &cfg), TG_OK);
      hdr(&s)->horizon_us = hz[j];
      hdr(&s)->reach_us = TG_PERIOD_MAX_MS * 1000;
      unsigned char key[TG_KEY_MAX];
      size_t len = key_bytes(1000, key); /* absent */
      tg_result r, want;
      int rc = tg_hit_at(lim, T0, key, len, &quota, 1, &r);
      assert_int_equal(tg_hit_at(fresh, T0, key, len, &quota, 1, &want), TG_OK);
      if (rc != TG_OK || r.allowed != want.allowed || r.count != want.count ||
          r.reset_after_ms != want.reset_after_ms || hdr(&s)->horizon_us != 0) {
        print_error("%s: horizon %" PRIu64 ": hit on an absent key -> %s "
                    "(allowed %d, count %" PRIu64 ", reset_after_ms %" PRIu64
                    "; a fresh key: %" PRIu64 "), horizon now %" PRIu64 "\n",
                    tg_algorithm_name(s.alg), hz[j], tg_err_name(rc), r.allowed,
                    r.count, r.reset_after_ms, want.reset_after_ms,
                    hdr(&s)->horizon_us);
        failures++;
      }
      tg_limiter_destroy(fresh);
      tg_limiter_destroy(lim);
      seg_destroy(&s);
    }
  assert_int_equal(failures, 0);
}

/* The log of key k (sliding segment): its block's offset, or 0. Key k was
 * hit k + 1 times, first at T0 + k, so its oldest entry names it. */
static size_t log_of_key(const seg *s, unsigned k) {
  uint64_t live[64];
  unsigned n = live_slots(s, live, 64);
  for (unsigned j = 0; j < n; j++) {
    uint64_t bi = rd64(s, slot_at(s, live[j]));
    if (bi == 0 || bi > s->pristine.nlogs)
      continue;
    size_t b = block_at(s, bi - 1);
    uint32_t head;
    memcpy(&head, s->base + b + offsetof(tg__log_block, head), 4);
    if (head < LOG_ENTRIES && rd64(s, b + offsetof(tg__log_block, e) +
                                          head * sizeof(tg__entry)) == T0 + k)
      return b;
  }
  return 0;
}

/* A shared log is checked where a call reads it: a sum its entries cannot
 * account for, an expiring entry out of order or a newest entry past any
 * clock is TG_ECORRUPT; an entry further in is left to the call that
 * reaches it (include/tollgate.h, "Shared memory"). */
static void logs_checked_where_read(void **state) {
  (void)state;
  static const struct {
    const char *what;
    uint64_t now;   /* the call's time */
    int field;      /* 0: sum, 1: entry i's time = entry i-1's, 2: newest t */
    unsigned entry; /* for 1 */
    uint64_t value; /* for 0 and 2 */
    int want;
  } rows[] = {
      /* key 5: six entries of cost 1 at T0 + 5 + j ms */
      {"sum above the entries, nothing expires", T0 + 6000, 0, 0, 100,
       TG_ECORRUPT},
      {"sum above the entries, all expire", T0 + 10 * 1000000, 0, 0, 7,
       TG_ECORRUPT},
      {"sum below an expiring entry", T0 + 1000000 + 1500, 0, 0, 0,
       TG_ECORRUPT},
      {"an expiring entry out of order", T0 + 1000000 + 1500, 1, 1, 0,
       TG_ECORRUPT},
      {"newest past any clock", T0 + 6000, 2, 0, TG_NOW_MAX_US + 1,
       TG_ECORRUPT},
      {"an entry further in out of order: not read yet", T0 + 6000, 1, 3, 0,
       TG_OK},
      {"the same entry, read once it expires", T0 + 1000000 + 3500, 1, 3, 0,
       TG_ECORRUPT},
      {"untouched: the control", T0 + 6000, 0, 0, 6, TG_OK},
  };
  unsigned failures = 0;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    seg s;
    seg_create(&s, TG_SLIDING_WINDOW);
    size_t b = log_of_key(&s, 5);
    assert_true(b != 0);
    uint32_t head;
    memcpy(&head, s.base + b + offsetof(tg__log_block, head), 4);
    size_t e0 = b + offsetof(tg__log_block, e);
#define ENTRY(j) (e0 + ((head + (j)) % LOG_ENTRIES) * sizeof(tg__entry))
    uint64_t v = rows[i].value;
    if (rows[i].field == 0) {
      memcpy(s.base + b + offsetof(tg__log_block, sum), &v, 8);
    } else if (rows[i].field == 1) {
      v = rd64(&s, ENTRY(rows[i].entry - 1));
      memcpy(s.base + ENTRY(rows[i].entry), &v, 8);
    } else {
      memcpy(s.base + ENTRY(LOG_ENTRIES - 1), &v, 8);
    }
#undef ENTRY
    tg_config cfg = seg_config(s.alg);
    tg_limiter *lim = NULL;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    unsigned char key[TG_KEY_MAX];
    size_t len = key_bytes(5, key);
    tg_result r;
    int rc = tg_hit_at(lim, rows[i].now, key, len, &quota, 1, &r);
    if (rc != rows[i].want) {
      print_error("%s: %s, want %s\n", rows[i].what, tg_err_name(rc),
                  tg_err_name(rows[i].want));
      failures++;
    }
    tg_limiter_destroy(lim);
    seg_destroy(&s);
  }
  assert_int_equal(failures, 0);
}

static unsigned storms(void) {
  const char *e = getenv("TG_HOSTILE_STORMS");
  return e ? (unsigned)strtoul(e, NULL, 10) : 60u;
}

/* Seeded random xors over one region at a time. */
static void gen_storms(const seg *s, cases *cs) {
  const tg__table_hdr *p = &s->pristine;
  struct {
    const char *name;
    size_t lo, hi;
  } regions[] = {
      {"header counters", offsetof(tg__table_hdr, live), sizeof(tg__table_hdr)},
      /* the ctrl words live in the slots: "slots" storms reach them */
      {"slots", (size_t)p->slot_off,
       (size_t)(p->slot_off + p->nslots * sizeof(tg__slot))},
      {"chunks", (size_t)p->chunk_off, (size_t)p->log_off},
      {"logs", (size_t)p->log_off, (size_t)p->total_bytes},
      {"body", (size_t)p->slot_off, (size_t)p->total_bytes},
  };
  unsigned nreg = sizeof regions / sizeof regions[0], total = storms();
  for (unsigned k = 0; k < total; k++) {
    unsigned r = k % nreg;
    if (regions[r].hi <= regions[r].lo)
      continue;
    uint32_t seed = 0x9e3779b9u * (k + 1) ^ (uint32_t)s->alg;
    unsigned nx = 1u + k % 24u;
    hcase *h = add(cs, "storm %u: %u xors over %s (seed %" PRIu32 ")", k, nx,
                   regions[r].name, seed);
    h->busy_ok = true;
    h->storm_seed = seed ? seed : 1;
    h->storm_n = nx;
    h->storm_lo = regions[r].lo;
    h->storm_hi = regions[r].hi;
  }
}

static void body_ctrl_words(void **state) {
  (void)state;
  run_family(gen_ctrl, ALL_ALGS);
}
static void body_states(void **state) {
  (void)state;
  run_family(gen_state, ALL_ALGS);
}
static void body_keys_and_chunks(void **state) {
  (void)state;
  run_family(gen_keys, ALL_ALGS);
}
static void body_sliding_logs(void **state) {
  (void)state;
  run_family(gen_logs, 1u << TG_SLIDING_WINDOW);
}
static void body_header_counters(void **state) {
  (void)state;
  run_family(gen_header_runtime, ALL_ALGS);
}
static void body_horizon(void **state) {
  (void)state;
  run_family(gen_horizon, ALL_ALGS);
}
static void body_random_storms(void **state) {
  (void)state;
  run_family(gen_storms, ALL_ALGS);
}

/* ---- 3. the header's geometry, rewritten after attach ---- */

static void gen_geometry(const seg *s, cases *cs) {
  const tg__table_hdr *p = &s->pristine;
#define HO(f) offsetof(tg__table_hdr, f)
  struct {
    const char *name;
    size_t off;
    unsigned width;
    uint64_t val;
  } g[] = {
      {"nslots + 1", HO(nslots), 8, p->nslots + 1},
      {"nslots x 1000", HO(nslots), 8, p->nslots * 1000},
      {"nslots 0", HO(nslots), 8, 0},
      {"nchunks x 1000", HO(nchunks), 8, p->nchunks * 1000},
      {"nlogs x 1000", HO(nlogs), 8, p->nlogs * 1000 + 1000},
      {"log_entries max", HO(log_entries), 4, UINT32_MAX},
      {"log_block_bytes x 1000", HO(log_block_bytes), 4,
       (uint64_t)p->log_block_bytes * 1000},
      {"algorithm 7", HO(algorithm), 4, 7},
      {"shared 0", HO(shared), 4, 0},
      {"capacity max", HO(capacity), 8, UINT64_MAX},
  };
#undef HO
  for (size_t e = 0; e < sizeof g / sizeof g[0]; e++) {
    hcase *h = add(cs, "after attach: %s", g[e].name);
    put(h, g[e].off, g[e].width, g[e].val);
    h->geometry = true;
  }
}

static void header_geometry_after_attach(void **state) {
  (void)state;
  run_family(gen_geometry, ALL_ALGS);
}

int main(void) {
  for (size_t i = 0; i < NFATAL; i++)
    sigaction(fatal_signals[i], NULL, &saved_fatal[i]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(clean_segment_passes),
      cmocka_unit_test(header_fields_refused),
      cmocka_unit_test(header_bitflips_refused),
      cmocka_unit_test(file_size_refused),
      cmocka_unit_test(magic_zero_reinitialises),
      cmocka_unit_test(other_parameters_mismatch),
      cmocka_unit_test(reinterpreted_states),
      cmocka_unit_test(body_ctrl_words),
      cmocka_unit_test(body_states),
      cmocka_unit_test(body_keys_and_chunks),
      cmocka_unit_test(body_sliding_logs),
      cmocka_unit_test(body_header_counters),
      cmocka_unit_test(body_horizon),
      cmocka_unit_test(horizon_beyond_range_cleared),
      cmocka_unit_test(logs_checked_where_read),
      cmocka_unit_test(body_random_storms),
      cmocka_unit_test(header_geometry_after_attach),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
