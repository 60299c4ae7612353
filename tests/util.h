/* SPDX-License-Identifier: MIT */
/*
 * util.h - helpers the test programs share instead of each keeping a copy:
 * numbers from the environment, one seeded random generator, keys that are
 * hard for a store (NUL bytes, non-ASCII, the longest), time, and the
 * fork/kill helpers of the multi-process tests.
 *
 * Header-only (static inline: a program pays only for what it calls), and
 * after <cmocka.h>, whose assert_* and print_error the helpers use. Children
 * of fork never assert: they record into a shared area and exit with a code
 * (docs/DESIGN.md section 9), so spawn runs them with _exit.
 *
 * Seeds: a test that draws random numbers takes its seed from test_seed,
 * which reads the test's own variable (TG_MODEL_SEED...), else TG_TEST_SEED,
 * else the default, and remembers it; main returns through test_report,
 * which prints every seed used when a case failed, so a failure is repeated
 * by setting the variable it names.
 */
#ifndef TG_TESTS_UTIL_H
#define TG_TESTS_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tollgate.h"

/* ---- one cmocka case per algorithm ---- */

/* ALG_CASES(prefix, fn): five cases named prefix + the algorithm's short name
 * (threads_fixed_window...), each running fn with its algorithm as the
 * initial state, read back by alg_of. For scenarios that need a limiter
 * made for them, see ALL5 in accept_helpers.h. */
#define ALG_STATE(alg) ((void *)(uintptr_t)((unsigned)(alg) + 1u))
#define ALG_CASES(prefix, fn)                                                  \
  {prefix "fixed_window", fn, NULL, NULL, ALG_STATE(TG_FIXED_WINDOW)},         \
      {prefix "per_key_window", fn, NULL, NULL,                                \
       ALG_STATE(TG_FIXED_WINDOW_PER_KEY)},                                    \
      {prefix "sliding_window", fn, NULL, NULL, ALG_STATE(TG_SLIDING_WINDOW)}, \
      {prefix "token_bucket", fn, NULL, NULL, ALG_STATE(TG_TOKEN_BUCKET)}, {   \
    prefix "leaky_bucket", fn, NULL, NULL, ALG_STATE(TG_LEAKY_BUCKET)          \
  }

static inline tg_algorithm alg_of(void **state) {
  return (tg_algorithm)((uintptr_t)*state - 1u);
}

/* ---- the environment ---- */

/* The number in $name (decimal, 0x hex or 0 octal), else def; a value that
 * does not parse is reported and ignored rather than read as 0. */
static inline uint64_t env_u64(const char *name, uint64_t def) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0')
    return def;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0') {
    fprintf(stderr, "ignoring bad %s=%s\n", name, s);
    return def;
  }
  return (uint64_t)v;
}

/* True when $name is set to something other than "" or "0". */
static inline bool env_flag(const char *name) {
  const char *s = getenv(name);
  return s != NULL && *s != '\0' && strcmp(s, "0") != 0;
}

/* ---- random numbers: splitmix64 (small, fast, any seed is good) ---- */

static inline uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

/* Uniform-ish in [0, n); 0 when n == 0. */
static inline uint64_t rng_below(uint64_t *s, uint64_t n) {
  return n ? rng_next(s) % n : 0;
}

/* Uniform-ish in [lo, hi]; lo when hi <= lo. */
static inline uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi) {
  if (hi <= lo)
    return lo;
  if (hi - lo == UINT64_MAX)
    return rng_next(s);
  return lo + rng_below(s, hi - lo + 1);
}

/* True with probability pct / 100. */
static inline bool rng_chance(uint64_t *s, unsigned pct) {
  return rng_below(s, 100) < pct;
}

/* The seeds this program used, for test_report. */
#define TEST_SEEDS_MAX 16
static struct {
  const char *env;
  uint64_t seed;
} test_seeds[TEST_SEEDS_MAX];
static unsigned test_nseeds;

/* The seed named by $env, else by $TG_TEST_SEED, else def; remembered so
 * that test_report can print it. */
static inline uint64_t test_seed(const char *env, uint64_t def) {
  uint64_t seed = env_u64(env, env_u64("TG_TEST_SEED", def));
  for (unsigned i = 0; i < test_nseeds; i++)
    if (strcmp(test_seeds[i].env, env) == 0) {
      test_seeds[i].seed = seed;
      return seed;
    }
  if (test_nseeds < TEST_SEEDS_MAX) {
    test_seeds[test_nseeds].env = env;
    test_seeds[test_nseeds++].seed = seed;
  }
  return seed;
}

/* A seed that differs from run to run (time and pid), for tests whose
 * default is to explore: pass it as test_seed's default. */
static inline uint64_t test_fresh_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t s = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  return rng_next(&s) ^ (uint64_t)getpid() << 32;
}

/* main's return: the failed count, after printing the seeds that repeat the
 * run when there was a failure. */
static inline int test_report(int failed) {
  if (failed != 0)
    for (unsigned i = 0; i < test_nseeds; i++)
      fprintf(stderr, "to repeat: %s=0x%016" PRIx64 "\n", test_seeds[i].env,
              test_seeds[i].seed);
  return failed;
}

/* ---- keys a store can get wrong ---- */

/* Keys every store must keep apart: NUL bytes inside and alone, bytes above
 * 0x7f, Redis Cluster hash-tag braces, a prefix of another. The longest keys
 * are made with key_long. */
typedef struct test_key {
  const char *bytes;
  size_t len;
} test_key;

static const test_key test_edge_keys[] = {
    {"a", 1},       {"b", 1},  {"a\0b", 3},  {"a\0c", 3},     {"\0", 1},
    {"user:42", 7}, {"}{", 2}, {"b{x}c", 5}, {"\xff\xfe", 2}, {"\xff", 1},
};
#define TEST_EDGE_KEYS (sizeof test_edge_keys / sizeof test_edge_keys[0])

/* Fills buf with len bytes of fill, the last one `last` (two long keys that
 * differ only at the end). */
static inline void key_long(unsigned char *buf, size_t len, unsigned char fill,
                            unsigned char last) {
  memset(buf, fill, len);
  if (len > 0)
    buf[len - 1] = last;
}

/* Random bytes, about one in ten a NUL. */
static inline void key_random(uint64_t *s, unsigned char *buf, size_t len) {
  for (size_t i = 0; i < len; i++)
    buf[i] = rng_chance(s, 10) ? 0 : (unsigned char)rng_next(s);
}

/* ---- time ---- */

static inline uint64_t clock_us(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
static inline uint64_t mono_us(void) { return clock_us(CLOCK_MONOTONIC); }
static inline uint64_t realtime_us(void) { return clock_us(CLOCK_REALTIME); }

static inline double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleeps the whole time, signals or not. */
static inline void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static inline void sleep_ms(unsigned ms) { sleep_us((uint64_t)ms * 1000u); }

/* ---- processes: shared results, children, a barrier ---- */

#ifdef MAP_ANONYMOUS /* _DEFAULT_SOURCE */
/* Memory the children of a later fork share with the parent, zeroed. */
static inline void *shared_area(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  return p;
}
#endif

static inline void atomic_max(uint64_t *p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(
                        p, &cur, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

/* Keeps the first unexpected code a child saw, and counts them all. */
static inline void note_error(int *first, uint64_t *count, int rc) {
  int zero = 0;
  __atomic_compare_exchange_n(first, &zero, rc, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  __atomic_fetch_add(count, 1, __ATOMIC_RELAXED);
}

typedef int (*child_fn)(unsigned idx, void *arg);

/* Forks a child that runs fn and _exits with its return value (never back
 * into cmocka, never running the parent's atexit handlers). */
static inline pid_t spawn(child_fn fn, unsigned idx, void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0)
    _exit(fn(idx, arg));
  assert_true(pid > 0);
  return pid;
}

/* SIGKILLs a child and reaps it. */
static inline void kill_reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Reaps n children (at most 64), giving them until `deadline` (monotonic
 * us). Those still running then are SIGKILLed and counted in *blocked.
 * Returns how many did not exit with status 0 (blocked ones included). */
static inline unsigned reap_all(pid_t *pids, unsigned n, uint64_t deadline,
                                unsigned *blocked) {
  unsigned bad = 0, left = n;
  *blocked = 0;
  bool done[64] = {false};
  assert_true(n <= 64);
  while (left > 0) {
    for (unsigned i = 0; i < n; i++) {
      int st;
      if (done[i] || waitpid(pids[i], &st, WNOHANG) != pids[i])
        continue;
      done[i] = true;
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        bad++;
        print_error("child %ld: %s %d\n", (long)pids[i],
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      }
    }
    if (left > 0 && mono_us() > deadline) {
      for (unsigned i = 0; i < n; i++)
        if (!done[i]) {
          print_error("child %ld still running: killed\n", (long)pids[i]);
          kill_reap(pids[i]);
          (*blocked)++;
          bad++;
        }
      break;
    }
    if (left > 0)
      sleep_us(1000);
  }
  return bad;
}

/* A barrier between processes, in shared memory (n set before the fork). */
typedef struct pbarrier {
  unsigned n, count, gen;
} pbarrier;

/* False if the others did not all arrive within 10 s (a sibling died): the
 * caller gives up. */
static inline bool pbarrier_wait(pbarrier *b) {
  unsigned g = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->gen, g + 1, __ATOMIC_RELEASE);
    return true;
  }
  uint64_t deadline = mono_us() + 10000000u;
  for (unsigned spins = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == g;
       spins++) {
    sched_yield();
    if ((spins & 1023u) == 0 && mono_us() > deadline)
      return false;
  }
  return true;
}

#endif
