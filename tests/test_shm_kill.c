/* SPDX-License-Identifier: MIT */
/*
 * test_shm_kill.c - the shared-memory store between real processes that
 * race and get killed:
 *
 * A child never asserts (cmocka long-jumps, and only the parent reports): it
 * writes what it saw into a MAP_SHARED | MAP_ANONYMOUS area mapped before
 * fork, with __atomic operations, and exits with a code; the parent asserts
 * after waitpid. Every segment name carries the pid, and the teardown of
 * every test unlinks the names it handed out, pass or fail.
 *
 *   1. exactness across processes: P x M hits on one key at one instant
 *      admit exactly the limit, for all five algorithms (exact_cases).
 *   2. kill tests: workers hammer shared keys while the parent SIGKILLs and
 *      replaces them at random; nobody blocks, the table validates at each
 *      kill (the living frozen) and at the end, and no window or interval
 *      admitted more than its limit (kill_variants).
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
 * 1. exactness across processes
 * ========================================================================= */

#define EXACT_PROCS 4
#define EXACT_ROUNDS 10

typedef struct exact_area {
  const char *name;
  tg_algorithm alg;
  tg_quota q;
  unsigned hits; /* per process per round */
  unsigned rounds;
  uint64_t step_us; /* time between rounds */
  pbarrier bar;
  unsigned allowed[EXACT_ROUNDS][EXACT_PROCS];
  uint64_t value[EXACT_ROUNDS];  /* tg_get after the round */
  uint64_t end_ms[EXACT_ROUNDS]; /* tg_expires_at after the round */
  int first_error;
  uint64_t errors;
} exact_area;

static int exact_child(unsigned idx, void *arg) {
  exact_area *a = arg;
  tg_config cfg;
  shm_config(&cfg, a->name, a->alg, 64);
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    note_error(&a->first_error, &a->errors, rc);
    return 1;
  }
  for (unsigned round = 0; round < a->rounds; round++) {
    uint64_t t = T0 + round * a->step_us;
    if (!pbarrier_wait(&a->bar))
      return 3;
    for (unsigned i = 0; i < a->hits; i++) {
      tg_result r;
      rc = tg_hit_at(lim, t, "hot", 3, &a->q, 1, &r);
      if (rc != TG_OK)
        note_error(&a->first_error, &a->errors, rc);
      else if (r.allowed)
        a->allowed[round][idx]++;
    }
    if (!pbarrier_wait(&a->bar))
      return 3;
    if (idx == 0) {
      if ((rc = tg_get_at(lim, t, "hot", 3, &a->q, &a->value[round])) != 0 ||
          (rc = tg_expires_at_at(lim, t, "hot", 3, &a->q, &a->end_ms[round])) !=
              0)
        note_error(&a->first_error, &a->errors, rc);
    }
  }
  tg_limiter_destroy(lim);
  return 0;
}

/* Runs EXACT_PROCS processes x hits per round on one key; checks each
 * round admitted `allowed` in all, and that tg_get then says `value`. */
static exact_area *exact_run(tg_algorithm alg, tg_quota q, unsigned hits,
                             unsigned rounds, uint64_t step_us,
                             unsigned allowed, uint64_t value) {
  exact_area *a = shared_area(sizeof *a);
  a->name = name_new(tg_algorithm_name(alg));
  a->alg = alg;
  a->q = q;
  a->hits = hits;
  a->rounds = rounds;
  a->step_us = step_us;
  a->bar.n = EXACT_PROCS;
  pid_t pids[EXACT_PROCS];
  for (unsigned i = 0; i < EXACT_PROCS; i++)
    pids[i] = spawn(exact_child, i, a);
  unsigned blocked;
  unsigned bad = reap_all(pids, EXACT_PROCS, mono_us() + 30000000u, &blocked);
  if (a->errors)
    print_error("%s: %" PRIu64 " errors, first %s\n", tg_algorithm_name(alg),
                a->errors, tg_err_name(a->first_error));
  assert_int_equal(bad, 0);
  assert_int_equal(a->errors, 0);
  for (unsigned round = 0; round < rounds; round++) {
    unsigned sum = 0;
    for (unsigned i = 0; i < EXACT_PROCS; i++)
      sum += a->allowed[round][i];
    if (sum != allowed || a->value[round] != value)
      print_error("%s round %u: admitted %u (want %u), value %" PRIu64
                  " (want %" PRIu64 ")\n",
                  tg_algorithm_name(alg), round, sum, allowed, a->value[round],
                  value);
    assert_int_equal(sum, allowed);
    assert_int_equal(a->value[round], value);
  }
  tg_config cfg;
  shm_config(&cfg, a->name, alg, 64);
  tg__table_check c = validate(a->name, &cfg);
  assert_int_equal(c.errors, 0);
  assert_int_equal(c.live_slots, 1);
  assert_int_equal(c.live_counter, 1);
  return a;
}

/* One exactness case: P processes x `hits` a round, `rounds` rounds
 * `step_us` apart, on one key at one instant each round. */
typedef struct exact_case {
  const char *test; /* the cmocka case's name */
  tg_algorithm alg;
  tg_quota q;
  unsigned hits, rounds;
  uint64_t step_us;
  unsigned allowed; /* admitted per round, by all the processes together */
  uint64_t value;   /* tg_get after each round */
  bool window_ends; /* tg_expires_at is the round's start + the period */
} exact_case;

static const exact_case exact_cases[] = {
    /* denied calls are counted: the count is every hit */
    {"exact_fixed_window",
     TG_FIXED_WINDOW,
     {1000, 60000, 0},
     1500,
     1,
     0,
     1000,
     EXACT_PROCS * 1500,
     false},
    /* one token per 11.5 days, time standing still: nothing refills */
    {"exact_token_bucket",
     TG_TOKEN_BUCKET,
     {1, 1000000000, 777},
     1000,
     1,
     0,
     777,
     0,
     false},
    {"exact_sliding_window",
     TG_SLIDING_WINDOW,
     {1000, 60000, 0},
     1500,
     1,
     0,
     1000,
     1000,
     false},
    {"exact_leaky_bucket",
     TG_LEAKY_BUCKET,
     {1000, 60000, 0},
     1500,
     1,
     0,
     1000,
     1000,
     false},
    /* every round starts exactly when the previous window ended: all the
     * processes find it ended at once and must open one window together */
    {"exact_per_key_window",
     TG_FIXED_WINDOW_PER_KEY,
     {100, 1000, 0},
     250,
     EXACT_ROUNDS,
     1000000u,
     100,
     EXACT_PROCS * 250,
     true},
};

static void exact(void **state) {
  SKIP_UNDER_TSAN();
  const exact_case *e = *state;
  exact_area *a = exact_run(e->alg, e->q, e->hits, e->rounds, e->step_us,
                            e->allowed, e->value);
  if (e->window_ends)
    for (unsigned round = 0; round < e->rounds; round++)
      assert_int_equal(a->end_ms[round],
                       (T0 + round * e->step_us) / 1000 + e->q.period_ms);
  munmap(a, sizeof *a);
}

/* =========================================================================
 * 2. kill tests
 *
 * P workers hammer a few shared keys with tg_hit_at at times read from
 * CLOCK_REALTIME; every 20-80 ms the parent SIGKILLs one at random and forks
 * a replacement, for KILL_PHASE_US; then the survivors run to a common stop
 * time and exit 0. Workers run no cleaner (clean_period_ms = 0): the only
 * reclaims are those of a full table (the churn variants), at the time of
 * the worker that needs the room.
 *
 * What an allowed hit is recorded under must be the window (or time) the
 * library used, which is not always the worker's: a worker preempted between
 * reading the clock and its call finds a later window or a later log entry
 * already there ("state never moves backwards"), and a call on an absent key
 * is evaluated no earlier than the table's reclaim horizon. So the workers
 * pass whole milliseconds, which makes reset_after_ms exact, and derive:
 *   fixed window: window end = now + reset_after_ms (the window counted in);
 *   sliding log:  entry time = now + reset_after_ms - period (the newest
 *                 entry, which this hit created or merged into);
 *   token bucket: the worker's now (a bucket evaluates at the caller's now).
 * A hit taken when the horizon may have been above the worker's now is not
 * recorded (counted as "uncertain"). Dropping records can only under-count,
 * as can a worker killed between an allowed decision and its record: the
 * checks are upper bounds, so both are sound.
 * ========================================================================= */

#define KILL_PROCS 4
#define KILL_PHASE_US 2500000u
#define KILL_TAIL_US 200000u
#define KILL_MAX_REC (1u << 21)
#define REC_TOP (UINT64_C(1) << 63)

typedef struct kill_variant {
  const char *test; /* the cmocka case's name */
  const char *label;
  tg_algorithm alg;
  tg_quota q;
  unsigned keys;  /* hot: keys in all; churn: keys per window */
  bool churn;     /* key names carry the window of the worker's time: many
                     short-lived keys, a table kept full, so inserts and
                     reclaims (the table lock paths) run all the time */
  unsigned noise; /* if > 0, one call in `noise` is on a new random key whose
                     state decays within 1 ms: the table stays full of
                     reclaimable keys, so such calls insert and reclaim
                     under the table lock most of the time (not checked) */
  uint64_t capacity;
  uint32_t log_entries;
} kill_variant;

static const tg_quota q_noise = {.limit = 1, .period_ms = 1, .burst = 0};

typedef struct kill_area {
  const kill_variant *v;
  const char *name;
  uint64_t base_us; /* realtime start; records are relative to it */
  uint64_t stop_us; /* workers stop once CLOCK_REALTIME passes it */
  uint64_t calls, allowed, uncertain, efull, busy, errors, odd, attached;
  int first_error;
  uint64_t max_call_us; /* slowest single call */
  uint64_t nrec;
  uint64_t rec[KILL_MAX_REC]; /* REC_TOP | key id << 32 | value; 0: a hole
                                 left by a worker killed while recording */
} kill_area;

static void variant_config(tg_config *cfg, const kill_variant *v,
                           const char *name) {
  shm_config(cfg, name, v->alg, v->capacity);
  if (v->log_entries)
    cfg->sliding_max_entries = v->log_entries;
}

static int kill_worker(unsigned idx, void *arg) {
  kill_area *a = arg;
  const kill_variant *v = a->v;
  tg_config cfg;
  variant_config(&cfg, v, a->name);
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    note_error(&a->first_error, &a->errors, rc);
    return 2;
  }
  seg s; /* to read the reclaim horizon */
  if ((rc = seg_map(&s, a->name, &cfg)) != TG_OK) {
    note_error(&a->first_error, &a->errors, rc);
    return 3;
  }
  __atomic_fetch_add(&a->attached, 1, __ATOMIC_RELAXED);
  uint64_t rng = seed_of(idx);
  const uint64_t period = v->q.period_ms * 1000u;
  const uint64_t w_base = a->base_us / period;
  char key[80];
  for (;;) {
    uint64_t now = realtime_us();
    if (now >= a->stop_us)
      break;
    if (v->alg != TG_TOKEN_BUCKET)
      now -= now % 1000u; /* whole ms, see above */
    uint64_t x = rng_next(&rng);
    unsigned k = (unsigned)(x % v->keys);
    uint64_t key_id = k;
    int n;
    tg_result r;
    if (v->noise && (x >> 32) % v->noise == 0) {
      uint32_t id = (uint32_t)(x >> 8);
      n = snprintf(key, sizeof key,
                   id % 2 ? "noise-%08" PRIx32 "-a-key-longer-than-32-bytes"
                          : "n-%08" PRIx32,
                   id);
      rc = tg_hit_at(lim, now, key, (size_t)n, &q_noise, 1, &r);
      __atomic_fetch_add(&a->calls, 1, __ATOMIC_RELAXED);
      if (rc == TG_EFULL)
        __atomic_fetch_add(&a->efull, 1, __ATOMIC_RELAXED);
      else if (rc == TG_EBUSY)
        __atomic_fetch_add(&a->busy, 1, __ATOMIC_RELAXED);
      else if (rc != TG_OK)
        note_error(&a->first_error, &a->errors, rc);
      continue;
    }
    if (v->churn) {
      uint64_t wl = now / period - w_base; /* the worker's window */
      key_id |= wl << 8;
      /* odd keys are long (> 32 bytes): a chunk is allocated and freed
       * with each of them, under the table lock */
      n = snprintf(key, sizeof key,
                   k % 2 ? "churn-%" PRIu64 "-%u-a-key-longer-than-32-bytes"
                         : "c-%" PRIu64 "-%u",
                   wl, k);
    } else {
      n = snprintf(key, sizeof key, "hot-%u", k);
    }
    uint64_t t0 = mono_us();
    rc = tg_hit_at(lim, now, key, (size_t)n, &v->q, 1, &r);
    atomic_max(&a->max_call_us, mono_us() - t0);
    __atomic_fetch_add(&a->calls, 1, __ATOMIC_RELAXED);
    if (rc == TG_EFULL) { /* a full table of live keys: a fair answer */
      __atomic_fetch_add(&a->efull, 1, __ATOMIC_RELAXED);
      continue;
    }
    if (rc == TG_EBUSY) { /* 2 s without the lock: see lost_wakeup */
      __atomic_fetch_add(&a->busy, 1, __ATOMIC_RELAXED);
      continue;
    }
    if (rc != TG_OK) {
      note_error(&a->first_error, &a->errors, rc);
      continue;
    }
    if (!r.allowed)
      continue;
    __atomic_fetch_add(&a->allowed, 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&s.t.h->horizon_us, __ATOMIC_ACQUIRE) > now) {
      __atomic_fetch_add(&a->uncertain, 1, __ATOMIC_RELAXED);
      continue;
    }
    uint64_t val;
    if (v->alg == TG_FIXED_WINDOW) {
      uint64_t end = now + r.reset_after_ms * 1000u;
      if (end <= now || end % period != 0) {
        __atomic_fetch_add(&a->odd, 1, __ATOMIC_RELAXED);
        continue;
      }
      val = end / period - 1 - w_base;
    } else if (v->alg == TG_SLIDING_WINDOW) {
      uint64_t entry = now + r.reset_after_ms * 1000u - period;
      if (entry < now) { /* an entry is never older than its call */
        __atomic_fetch_add(&a->odd, 1, __ATOMIC_RELAXED);
        continue;
      }
      val = entry - a->base_us;
    } else {
      val = now - a->base_us;
    }
    uint64_t i = __atomic_fetch_add(&a->nrec, 1, __ATOMIC_RELAXED);
    if (i < KILL_MAX_REC)
      __atomic_store_n(&a->rec[i], REC_TOP | key_id << 32 | (val & 0xffffffffu),
                       __ATOMIC_RELAXED);
  }
  seg_unmap(&s);
  tg_limiter_destroy(lim);
  return 0;
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* The records, holes dropped, sorted: by key, then window or time. */
static uint64_t *sorted_records(const kill_area *a, size_t *n) {
  size_t total = a->nrec < KILL_MAX_REC ? (size_t)a->nrec : KILL_MAX_REC;
  uint64_t *r = malloc((total + 1) * sizeof *r);
  assert_non_null(r);
  *n = 0;
  for (size_t i = 0; i < total; i++)
    if (a->rec[i])
      r[(*n)++] = a->rec[i] & ~REC_TOP;
  qsort(r, *n, sizeof *r, cmp_u64);
  return r;
}

#define REC_KEY(x) ((x) >> 32)
#define REC_VAL(x) ((x)&0xffffffffu)

/* Fixed window: no (key, window) admitted more than the limit. *full counts
 * those that admitted exactly the limit (the test had teeth). */
static unsigned check_windows(const uint64_t *r, size_t n, uint64_t limit,
                              unsigned *full) {
  unsigned bad = 0;
  *full = 0;
  for (size_t i = 0, j; i < n; i = j) {
    for (j = i; j < n && r[j] == r[i]; j++)
      ;
    if (j - i == limit)
      (*full)++;
    if (j - i > limit && bad++ < 5)
      print_error("key %" PRIu64 " window +%" PRIu64
                  ": %zu admitted, limit %" PRIu64 "\n",
                  REC_KEY(r[i]), REC_VAL(r[i]), j - i, limit);
  }
  return bad;
}

/* Sliding log: no interval of length period holds more than limit entries:
 * the (i + limit)-th admitted time after the i-th is at least period later.
 * *full counts the times limit entries fell within one period. */
static unsigned check_sliding(const uint64_t *r, size_t n, uint64_t limit,
                              uint64_t period_us, unsigned *full) {
  unsigned bad = 0;
  *full = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = i + (size_t)limit - 1;
    if (j < n && REC_KEY(r[j]) == REC_KEY(r[i]) &&
        REC_VAL(r[j]) - REC_VAL(r[i]) < period_us)
      (*full)++;
    j++;
    if (j < n && REC_KEY(r[j]) == REC_KEY(r[i]) &&
        REC_VAL(r[j]) - REC_VAL(r[i]) < period_us && bad++ < 5)
      print_error("key %" PRIu64 ": %" PRIu64 " admitted in [%" PRIu64
                  ", %" PRIu64 "] us, limit %" PRIu64 " per %" PRIu64 " us\n",
                  REC_KEY(r[i]), limit + 1, REC_VAL(r[i]), REC_VAL(r[j]), limit,
                  period_us);
  }
  return bad;
}

/* Token bucket (GCRA, emission interval T ns, tolerance burst * T): each
 * allowed call moves the TAT on by at least T from max(TAT, now), and is
 * allowed only if TAT - now <= burst * T, so any k calls allowed at times in
 * [a, b] satisfy k * T <= (b - a) + burst * T. Checked for every pair of
 * admitted times of a key (a running maximum makes it linear). */
static unsigned check_bucket(const uint64_t *r, size_t n, const tg_quota *q,
                             unsigned *full) {
  const int64_t t_ns =
      (int64_t)((q->period_ms * 1000000u + q->limit - 1) / q->limit);
  const int64_t tau = (int64_t)q->burst * t_ns;
  unsigned bad = 0;
  *full = 0;
  int64_t best = 0; /* max over i <= j of 1000 * t_i - T * i */
  size_t first = 0;
  for (size_t j = 0; j < n; j++) {
    if (j == 0 || REC_KEY(r[j]) != REC_KEY(r[j - 1]))
      first = j;
    int64_t idx = (int64_t)(j - first), t = (int64_t)REC_VAL(r[j]) * 1000;
    int64_t cand = t - t_ns * idx;
    if (j == first || cand > best)
      best = cand;
    /* worst k * T - (b - a) over a = t_i, b = t_j */
    int64_t excess = t_ns * (idx + 1) - t + best;
    if (excess > tau - t_ns)
      (*full)++; /* within one emission of the bound */
    if (excess > tau && bad++ < 5)
      print_error("key %" PRIu64 ": admitted %" PRId64
                  " ns of emission beyond burst by +%" PRIu64 " us\n",
                  REC_KEY(r[j]), excess - tau, REC_VAL(r[j]));
  }
  return bad;
}

static void kill_run(const kill_variant *v) {
  kill_area *a = shared_area(sizeof *a);
  a->v = v;
  a->name = name_new(v->label);
  tg_config cfg;
  variant_config(&cfg, v, a->name);
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  uint64_t start = realtime_us();
  const uint64_t phase_end = mono_us() + KILL_PHASE_US;
  /* a whole ms, a second back: no worker's whole-ms time precedes it */
  a->base_us = (start / 1000u - 1000u) * 1000u;
  a->stop_us = start + KILL_PHASE_US + KILL_TAIL_US;
  uint64_t rng = seed_of(0);

  /* The map the parent reads lock words through: to count the kills that
   * landed inside a lock, the other workers are stopped (SIGSTOP, waited
   * for) around each kill, so no one takes the dead holder's lock before
   * the parent has looked. */
  seg s;
  assert_int_equal(seg_map(&s, a->name, &cfg), TG_OK);
  pid_t pids[KILL_PROCS];
  for (unsigned i = 0; i < KILL_PROCS; i++)
    pids[i] = spawn(kill_worker, i, a);
  assert_true(s.t.h->nlogs <= MAX_BLOCKS);
  unsigned kills = 0, early = 0, in_table = 0, in_log = 0;
  /* validations at the instant of each kill (see below) */
  unsigned checks = 0, check_errors = 0, counter_off = 0;
  uint64_t max_pending = 0, max_leaked = 0;
  char first_check_error[128] = "";
  for (;;) {
    sleep_us(20000u + rng_next(&rng) % 60000u);
    if (mono_us() >= phase_end)
      break; /* kill only while no worker may have reached stop_us */
    unsigned victim = (unsigned)(rng_next(&rng) % KILL_PROCS);
    bool gone[KILL_PROCS] = {false};
    bool table_before = false, blocks_before[MAX_BLOCKS],
         blocks_after[MAX_BLOCKS];
    for (unsigned n = 0; n < KILL_PROCS; n++) {
      if (n == KILL_PROCS - 1) { /* all but the victim stopped: look */
        table_before = owner_died(&s.t.h->lock);
        block_locks(&s, blocks_before);
      }
      unsigned i = (victim + 1 + n) % KILL_PROCS; /* the victim last */
      int st;
      kill(pids[i], i == victim ? SIGKILL : SIGSTOP);
      if (waitpid(pids[i], &st, WUNTRACED) != pids[i] || WIFSTOPPED(st))
        continue;
      gone[i] = true;
      if (i == victim && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        kills++;
        continue;
      }
      early++; /* it had exited on its own: it failed */
      print_error("worker %ld ended early: %s %d\n", (long)pids[i],
                  WIFEXITED(st) ? "exit" : "signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    /* a lock the dead left that was not left before */
    in_table += !table_before && owner_died(&s.t.h->lock);
    unsigned held = block_locks(&s, blocks_after);
    for (unsigned b = 0; b < MAX_BLOCKS; b++)
      in_log += blocks_after[b] && !blocks_before[b];
    /* The table as the dead left it, with the living frozen wherever they
     * were (some inside the table lock): every invariant a lock-free
     * reader relies on must hold. A log whose lock someone holds may be
     * mid-step, which the validator cannot tell: skip those instants. */
    if (held == 0) {
      tg__table_check c;
      assert_int_equal(tg__table_validate(&s.t, &c), TG_OK);
      checks++;
      if (c.errors && check_errors++ == 0)
        snprintf(first_check_error, sizeof first_check_error, "%s",
                 c.first_error);
      counter_off += c.live_counter != c.live_slots;
      max_pending = c.pending > max_pending ? c.pending : max_pending;
      max_leaked = c.leaked > max_leaked ? c.leaked : max_leaked;
    }
    for (unsigned i = 0; i < KILL_PROCS; i++)
      if (gone[i])
        pids[i] = spawn(kill_worker, i, a);
      else
        kill(pids[i], SIGCONT);
  }
  unsigned blocked;
  unsigned bad = reap_all(pids, KILL_PROCS,
                          phase_end + KILL_TAIL_US + 20000000u, &blocked);

  /* the table after the massacre, before anyone takes its lock again */
  bool died = owner_died(&s.t.h->lock), blocks_died[MAX_BLOCKS];
  unsigned dead_logs = 0;
  unsigned held_end = block_locks(&s, blocks_died);
  for (unsigned b = 0; b < MAX_BLOCKS; b++)
    dead_logs += blocks_died[b];
  tg__table_check c1, c2;
  assert_int_equal(tg__table_validate(&s.t, &c1), TG_OK);
  /* one operation that takes the table lock (repairing what a dead holder
   * left): a new key; and a cleaning pass that locks every log (repairing
   * those) but reclaims nothing (key_older_than_ms is a day); then again */
  tg_result rr;
  int rc_repair = tg_hit_at(lim, realtime_us(), "repair", 6, &v->q, 1, &rr);
  assert_true(rc_repair == TG_OK || rc_repair == TG_EFULL);
  size_t removed = 1;
  assert_int_equal(tg_clean(lim, &removed), TG_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(tg__table_validate(&s.t, &c2), TG_OK);
  bool died_after = owner_died(&s.t.h->lock);
  unsigned held_after = block_locks(&s, blocks_died);
  /* still serving: a new key, once every state has decayed (a full table
   * reclaims room for it) */
  tg_result r;
  uint64_t later = realtime_us() + 10000000u;
  int rc_after = tg_hit_at(lim, later, "after", 5, &v->q, 1, &r);
  /* a block or chunk lost by a kill must not stop that: the insert
   * reclaims decayed keys when an arena is used up, as it does when the
   * table is (leaked_block_blocks_reclaim) */
  if (rc_after != TG_OK)
    dump_table(&s, later);
  seg_unmap(&s);

  size_t n;
  uint64_t *rec = sorted_records(a, &n);
  unsigned full = 0, over;
  if (v->alg == TG_FIXED_WINDOW)
    over = check_windows(rec, n, v->q.limit, &full);
  else if (v->alg == TG_SLIDING_WINDOW)
    over = check_sliding(rec, n, v->q.limit, v->q.period_ms * 1000u, &full);
  else
    over = check_bucket(rec, n, &v->q, &full);
  free(rec);

  print_message("%s: %u kills, %u of them inside the table lock, %u inside "
                "a log's lock\n",
                v->label, kills, in_table, in_log);
  print_message("%s: %" PRIu64 " calls, %" PRIu64
                " allowed (%zu checked, %" PRIu64
                " uncertain, %u at the limit), %" PRIu64 " TG_EFULL, %" PRIu64
                " TG_EBUSY, slowest call %" PRIu64 " us\n",
                v->label, a->calls, a->allowed, n, a->uncertain, full, a->efull,
                a->busy, a->max_call_us);
  print_message("%s: validated at %u of the kills: %u with errors%s%s, max "
                "pending %" PRIu64 ", max leaked %" PRIu64
                ", live counter off %u times\n",
                v->label, checks, check_errors, check_errors ? ": " : "",
                first_check_error, max_pending, max_leaked, counter_off);
  print_message("%s: validate after kills: live %" PRIu64 " (counter %" PRIu64
                "), pending %" PRIu64 ", leaked %" PRIu64 ", errors %" PRIu64
                "; table lock %s\n",
                v->label, c1.live_slots, c1.live_counter, c1.pending, c1.leaked,
                c1.errors,
                died ? "left by a dead owner" : "not held by the dead");
  if (dead_logs)
    print_message("%s: %u logs' locks left by a dead owner, %u of them "
                  "of live keys\n",
                  v->label, dead_logs, held_end);
  print_message("%s: after one locked op: live %" PRIu64 " (counter %" PRIu64
                "), pending %" PRIu64 ", leaked %" PRIu64 ", errors %" PRIu64
                "\n",
                v->label, c2.live_slots, c2.live_counter, c2.pending, c2.leaked,
                c2.errors);
  if (c1.errors || c2.errors)
    print_error("%s: first error: %s / %s\n", v->label, c1.first_error,
                c2.first_error);
  if (a->errors)
    print_error("%s: %" PRIu64 " errors, first %s\n", v->label, a->errors,
                tg_err_name(a->first_error));
  if (rc_after != TG_OK)
    print_error("%s: a new key after the run: %s with %" PRIu64
                " live of %" PRIu64 " and %" PRIu64 " leaked\n",
                v->label, tg_err_name(rc_after), c2.live_slots, v->capacity,
                c2.leaked);
  tg_limiter_destroy(lim);

  assert_int_equal(rc_after, TG_OK);
  assert_true(r.allowed);
  assert_int_equal(early, 0);
  assert_int_equal(blocked, 0); /* (a) nobody blocked */
  assert_int_equal(bad, 0);
  assert_true(kills >= 10);
  assert_int_equal(a->errors, 0);
  assert_int_equal(a->odd, 0);
  assert_int_equal(check_errors, 0); /* (b), at each kill */
  /* and at the end; a log left mid-step by a dead holder is repaired at its
   * next lock, which the validator cannot tell from damage (see
   * dead_log_mid_step), so only then may c1 report it */
  if (held_end == 0)
    assert_int_equal(c1.errors, 0);
  assert_int_equal(c2.errors, 0);
  assert_false(died_after);
  assert_int_equal(held_after, 0);
  /* pending reclaims exist only while a dead holder's lock is unrepaired */
  if (!died)
    assert_int_equal(c1.pending, 0);
  assert_int_equal(c2.pending, 0);
  assert_int_equal(c2.live_counter, c2.live_slots);
  assert_int_equal(over, 0); /* (c) */
  assert_true(full > 0);     /* the workers did press against the limit */
  munmap(a, sizeof *a);
}

static const kill_variant kill_variants[] = {
    {.test = "kill_fixed_window",
     .label = "fw",
     .alg = TG_FIXED_WINDOW,
     .q = {40, 50, 0},
     .keys = 4,
     .capacity = 64},
    {.test = "kill_token_bucket",
     .label = "tb",
     .alg = TG_TOKEN_BUCKET,
     .q = {20, 50, 10},
     .keys = 4,
     .capacity = 64},
    /* 16 entries for a limit of 40: merges at the cap happen too */
    {.test = "kill_sliding_window",
     .label = "sw",
     .alg = TG_SLIDING_WINDOW,
     .q = {40, 50, 0},
     .keys = 4,
     .capacity = 64,
     .log_entries = 16},
    /* 1024 entries for a limit of 8: a log keeps going back to the start
     * of its ring (table_impl.h, log_ready), and is killed doing it too */
    {.test = "kill_sliding_window_home",
     .label = "sw-home",
     .alg = TG_SLIDING_WINDOW,
     .q = {8, 20, 0},
     .keys = 4,
     .capacity = 64,
     .log_entries = 1024},
    /* 24 new keys per 20 ms window, and noise, in a table of 64: inserts,
     * pressure reclaims and long-key chunks all the time, under the table
     * lock */
    {.test = "kill_fixed_window_churn",
     .label = "fw-churn",
     .alg = TG_FIXED_WINDOW,
     .q = {3, 20, 0},
     .keys = 24,
     .churn = true,
     .noise = 4,
     .capacity = 64},
    /* the same with logs: blocks handed out and freed under the table lock
     * (a log expires one period after its last entry: room for ~2.5
     * windows) */
    {.test = "kill_sliding_window_churn",
     .label = "sw-churn",
     .alg = TG_SLIDING_WINDOW,
     .q = {3, 20, 0},
     .keys = 24,
     .churn = true,
     .noise = 4,
     .capacity = 96,
     .log_entries = 2},
};

static void kill_case(void **state) {
  SKIP_UNDER_TSAN();
  kill_run(*state);
}

/* A case of a table: its name, the function, the row as initial state. */
#define CASE(fn, row)                                                          \
  { (row).test, (fn), NULL, unlink_names, (void *)(uintptr_t) & (row) }
#define ROWS(table) (sizeof(table) / sizeof((table)[0]))
_Static_assert(ROWS(exact_cases) == 5 && ROWS(kill_variants) == 6,
               "main registers every row of the tables");

int main(void) {
  const struct CMUnitTest tests[] = {
      CASE(exact, exact_cases[0]),       CASE(exact, exact_cases[1]),
      CASE(exact, exact_cases[2]),       CASE(exact, exact_cases[3]),
      CASE(exact, exact_cases[4]),       CASE(kill_case, kill_variants[0]),
      CASE(kill_case, kill_variants[1]), CASE(kill_case, kill_variants[2]),
      CASE(kill_case, kill_variants[3]), CASE(kill_case, kill_variants[4]),
      CASE(kill_case, kill_variants[5]),
  };
  return test_report(cmocka_run_group_tests(tests, NULL, unlink_names));
}
