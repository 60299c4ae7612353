/* SPDX-License-Identifier: MIT */
/*
 * test_core.c - the pure steps of src/core, table-driven, without a store:
 * quota preparation, the checks every call passes, the window and bucket
 * steps, the sliding log, and when a state stops mattering. Every expected
 * number is worked out here from the formulas of tollgate.h and core.h
 * (windows aligned to the epoch or to the first hit, GCRA with T = ceil(
 * period / limit) and tau = burst * T, retry and reset rounded up to the ms),
 * never read back from the code, and each table row is one case: the
 * edges (TG_NEVER, overflow, the period bounds, rounding up by one ns or
 * one us) sit beside the ordinary ones.
 *
 * The acceptance tests check the same through the API on every store; these
 * pin the arithmetic itself, so a change to a step shows here first, by row.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "tollgate.h"

#define ROWS(t) (sizeof(t) / sizeof((t)[0]))
#define P_MAX TG_PERIOD_MAX_MS

/* A call's instant, in no way aligned: 250 ms into a second. */
#define NOW UINT64_C(1700000000250000) /* us */
#define NOWN (NOW * 1000)              /* ns, for bucket states */
#define END UINT64_C(1700000001000000) /* the 1 s epoch window of NOW */

/* ---- quota preparation ---- */

typedef struct quota_row {
  tg_algorithm alg;
  tg_quota q;
  int rc;
  uint64_t limit, period_us, burst, t_ns, tau_ns;
} quota_row;

static const quota_row QUOTAS[] = {
    {TG_FIXED_WINDOW, {10, 1000, 0}, TG_OK, 10, 1000000, 10, 0, 0},
    {TG_FIXED_WINDOW, {0, 1000, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    {TG_FIXED_WINDOW, {1, 0, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    {TG_FIXED_WINDOW,
     {UINT64_MAX, 1, 0},
     TG_OK,
     UINT64_MAX,
     1000,
     UINT64_MAX,
     0,
     0},
    /* the period's bounds */
    {TG_SLIDING_WINDOW, {1, P_MAX, 0}, TG_OK, 1, P_MAX * 1000, 1, 0, 0},
    {TG_SLIDING_WINDOW, {1, P_MAX + 1, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    {TG_TOKEN_BUCKET, {1, P_MAX + 1, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    /* a window keeps a burst it does not use */
    {TG_FIXED_WINDOW_PER_KEY, {5, 1000, 7}, TG_OK, 5, 1000000, 7, 0, 0},
    /* T rounds up: 1e9 / 3 = 333333333.3 ns */
    {TG_TOKEN_BUCKET,
     {3, 1000, 0},
     TG_OK,
     3,
     1000000,
     3,
     333333334,
     1000000002},
    {TG_LEAKY_BUCKET,
     {10, 1000, 5},
     TG_OK,
     10,
     1000000,
     5,
     100000000,
     500000000},
    /* one per ns is the fastest rate; faster is refused */
    {TG_TOKEN_BUCKET,
     {1000000, 1, 0},
     TG_OK,
     1000000,
     1000,
     1000000,
     1,
     1000000},
    {TG_TOKEN_BUCKET, {1000001, 1, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    {TG_LEAKY_BUCKET, {UINT64_MAX, 1000, 0}, TG_EQUOTA, 0, 0, 0, 0, 0},
    /* tau up to TG_TOLERANCE_MAX_NS (4e18) exactly, not beyond */
    {TG_LEAKY_BUCKET,
     {1, P_MAX, 4},
     TG_OK,
     1,
     P_MAX * 1000,
     4,
     UINT64_C(1000000000000000000),
     UINT64_C(4000000000000000000)},
    {TG_LEAKY_BUCKET, {1, P_MAX, 5}, TG_EQUOTA, 0, 0, 0, 0, 0},
    {TG_TOKEN_BUCKET, {1, P_MAX, UINT64_MAX}, TG_EQUOTA, 0, 0, 0, 0, 0},
};

static void quota_prepare(void **state) {
  (void)state;
  for (size_t i = 0; i < ROWS(QUOTAS); i++) {
    const quota_row *r = &QUOTAS[i];
    tg__quota p;
    memset(&p, 0, sizeof p);
    int rc = tg__quota_prepare(&p, &r->q, r->alg);
    if (rc != r->rc ||
        (rc == TG_OK &&
         (p.limit != r->limit || p.period_us != r->period_us ||
          p.burst != r->burst || p.t_ns != r->t_ns || p.tau_ns != r->tau_ns))) {
      print_error("row %zu (%s {%" PRIu64 ", %" PRIu64 ", %" PRIu64 "}): %s "
                  "limit %" PRIu64 " period_us %" PRIu64 " burst %" PRIu64
                  " t_ns %" PRIu64 " tau_ns %" PRIu64 "\n",
                  i, tg_algorithm_name(r->alg), r->q.limit, r->q.period_ms,
                  r->q.burst, tg_err_name(rc), p.limit, p.period_us, p.burst,
                  p.t_ns, p.tau_ns);
      fail();
    }
  }
}

/* ---- which operations each algorithm has (tollgate.h's table) ---- */

static void operations_supported(void **state) {
  (void)state;
  /* columns: fixed, per key, sliding, token, leaky */
  static const struct {
    tg__op op;
    bool on[TG_ALGORITHM_COUNT];
  } ops[] = {
      {TG__OP_HIT, {1, 1, 1, 1, 1}},     {TG__OP_GET, {1, 1, 1, 1, 1}},
      {TG__OP_EXPIRES, {1, 1, 1, 1, 1}}, {TG__OP_INC, {1, 1, 0, 0, 0}},
      {TG__OP_SET, {1, 1, 0, 1, 1}},     {TG__OP_CHECK, {1, 1, 1, 1, 1}},
      {TG__OP_TAKE, {1, 1, 1, 1, 1}},    {TG__OP_UNDO, {1, 1, 1, 1, 1}},
      {TG__OP_RESERVE, {0, 0, 0, 1, 1}}, {TG__OP_CANCEL, {0, 0, 0, 1, 1}},
  };
  _Static_assert(sizeof ops / sizeof ops[0] == TG__OP_COUNT_,
                 "a row for every operation");
  for (size_t i = 0; i < ROWS(ops); i++)
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
      if (tg__op_supported((tg_algorithm)a, ops[i].op) != ops[i].on[a]) {
        print_error("op %d on %s: want %d\n", (int)ops[i].op,
                    tg_algorithm_name((tg_algorithm)a), ops[i].on[a]);
        fail();
      }
}

/* ---- the checks before a store: key, then operation, then quota ---- */

static void call_checks_in_order(void **state) {
  (void)state;
  static const struct {
    tg_algorithm alg;
    tg__op op;
    size_t key_len;
    tg_quota q;
    int rc;
  } rows[] = {
      {TG_FIXED_WINDOW, TG__OP_HIT, 0, {10, 1000, 0}, TG_EKEY},
      {TG_FIXED_WINDOW, TG__OP_HIT, TG_KEY_MAX + 1, {10, 1000, 0}, TG_EKEY},
      {TG_FIXED_WINDOW, TG__OP_HIT, TG_KEY_MAX, {10, 1000, 0}, TG_OK},
      {TG_FIXED_WINDOW, TG__OP_HIT, 1, {10, 1000, 0}, TG_OK},
      /* the key is checked before the operation and the quota */
      {TG_SLIDING_WINDOW, TG__OP_INC, 0, {0, 0, 0}, TG_EKEY},
      /* the operation before the quota */
      {TG_SLIDING_WINDOW, TG__OP_INC, 1, {0, 0, 0}, TG_ENOTSUP},
      {TG_SLIDING_WINDOW, TG__OP_HIT, 1, {0, 1000, 0}, TG_EQUOTA},
      {TG_TOKEN_BUCKET, TG__OP_SET, 1, {10, 1000, 0}, TG_OK},
      {TG_LEAKY_BUCKET, TG__OP_INC, 1, {10, 1000, 0}, TG_ENOTSUP},
  };
  for (size_t i = 0; i < ROWS(rows); i++) {
    tg__quota p;
    int rc = tg__call_check(rows[i].alg, rows[i].op, rows[i].key_len,
                            &rows[i].q, &p);
    if (rc != rows[i].rc) {
      print_error("row %zu: %s, want %s\n", i, tg_err_name(rc),
                  tg_err_name(rows[i].rc));
      fail();
    }
  }
}

/* ---- one step on a window or a bucket ---- */

/* A call (op, arg, now) on state `in` under quota q: the code, whether the
 * state changed and to what, and the answer (a result for a hit, a value
 * for the others). */
typedef struct step_row {
  const char *what;
  tg_algorithm alg;
  tg_quota q;
  tg__op op;
  uint64_t arg, now;
  tg__state in;
  int rc;
  bool changed;
  tg__state out; /* the state after (unchanged: `in`) */
  bool allowed;
  uint64_t count, remaining, retry_ms, reset_ms; /* hit */
  uint64_t value;                                /* get, inc, expires */
} step_row;

#define FW TG_FIXED_WINDOW
#define PK TG_FIXED_WINDOW_PER_KEY
#define TB TG_TOKEN_BUCKET
#define LB TG_LEAKY_BUCKET
#define Q10                                                                    \
  { 10, 1000, 0 }
#define NEVER TG_NEVER
/* rows: what, alg, q, op, arg, now, in, rc, changed, out, allowed, count,
 * remaining, retry, reset, value */
#define HITROW(what, alg, arg, now, in, changed, out, al, cnt, rem, retry,     \
               reset)                                                          \
  {                                                                            \
    what, alg, Q10, TG__OP_HIT, arg, now, in, TG_OK, changed, out, al, cnt,    \
        rem, retry, reset, 0                                                   \
  }
#define VALROW(what, alg, op, arg, now, in, rc, changed, out, value)           \
  {                                                                            \
    what, alg, Q10, op, arg, now, in, rc, changed, out, false, 0, 0, 0, 0,     \
        value                                                                  \
  }
/* a state as its two words (core.h: the window end or TAT, then the count
 * or 0) */
#define S(w0, w1)                                                              \
  { (w0), (w1) }
#define FRESH S(0, 0)

static const step_row WINDOW_STEPS[] = {
    /* the epoch window of NOW ends at END, 750 ms later */
    HITROW("first hit", FW, 1, NOW, FRESH, true, S(END, 1), 1, 1, 9, 0, 750),
    HITROW("peek on nothing stores nothing", FW, 0, NOW, FRESH, false, FRESH, 1,
           0, 10, 0, 0),
    HITROW("cost above the limit: never, and counted", FW, 11, NOW, FRESH, true,
           S(END, 11), 0, 11, 0, NEVER, 750),
    HITROW("full: wait for the window's end", FW, 1, NOW, S(END, 10), true,
           S(END, 11), 0, 11, 0, 750, 750),
    HITROW("749.999 ms wait rounds up", FW, 1, NOW + 1, S(END, 10), true,
           S(END, 11), 0, 11, 0, 750, 750),
    HITROW("the last us of the window", FW, 1, END - 1, S(END, 10), true,
           S(END, 11), 0, 11, 0, 1, 1),
    HITROW("the previous window is forgotten", FW, 1, NOW, S(END - 1000000, 9),
           true, S(END, 1), 1, 1, 9, 0, 750),
    HITROW("a later window (clock stepped back) is kept", FW, 1, NOW,
           S(END + 1000000, 3), true, S(END + 1000000, 4), 1, 4, 6, 0, 1750),
    VALROW("count overflow", FW, TG__OP_HIT, 1, NOW, S(END, UINT64_MAX),
           TG_EOVERFLOW, false, S(END, UINT64_MAX), 0),
    VALROW("inc 0 reads", FW, TG__OP_INC, 0, NOW, S(END, 4), TG_OK, false,
           S(END, 4), 4),
    VALROW("inc adds without a limit", FW, TG__OP_INC, 30, NOW, S(END, 4),
           TG_OK, true, S(END, 34), 34),
    VALROW("inc overflow", FW, TG__OP_INC, 1, NOW, S(END, UINT64_MAX),
           TG_EOVERFLOW, false, S(END, UINT64_MAX), 0),
    VALROW("get", FW, TG__OP_GET, 0, NOW, S(END, 4), TG_OK, false, S(END, 4),
           4),
    VALROW("get of the previous window", FW, TG__OP_GET, 0, NOW,
           S(END - 1000000, 4), TG_OK, false, S(END - 1000000, 4), 0),
    VALROW("set", FW, TG__OP_SET, 7, NOW, FRESH, TG_OK, true, S(END, 7), 0),
    VALROW("expires: the window's end in ms", FW, TG__OP_EXPIRES, 0, NOW,
           S(END, 4), TG_OK, false, S(END, 4), END / 1000),
    VALROW("expires of a count of 0", FW, TG__OP_EXPIRES, 0, NOW, S(END, 0),
           TG_OK, false, S(END, 0), 0),
    VALROW("no reservations", FW, TG__OP_RESERVE, 1, NOW, FRESH, TG_ENOTSUP,
           false, FRESH, 0),
    /* per key: the window opens at the first hit */
    HITROW("per key: first hit opens a period", PK, 1, NOW, FRESH, true,
           S(NOW + 1000000, 1), 1, 1, 9, 0, 1000),
    HITROW("per key: a window ending now has ended", PK, 1, NOW, S(NOW, 3),
           true, S(NOW + 1000000, 1), 1, 1, 9, 0, 1000),
    HITROW("per key: 1 us left is 1 ms", PK, 1, NOW, S(NOW + 1, 3), true,
           S(NOW + 1, 4), 1, 4, 6, 0, 1),
    HITROW("per key: peek at the limit", PK, 0, NOW, S(NOW + 500000, 10), false,
           S(NOW + 500000, 10), 1, 10, 0, 0, 500),
    VALROW("per key: set re-anchors", PK, TG__OP_SET, 2, NOW,
           S(NOW + 500000, 3), TG_OK, true, S(NOW + 1000000, 2), 0),
    VALROW("per key: a window at 0 still expires", PK, TG__OP_EXPIRES, 0, NOW,
           S(NOW + 500000, 0), TG_OK, false, S(NOW + 500000, 0),
           (NOW + 500000) / 1000),
};

/* T = 100 ms = 1e8 ns, tau = 1e9 ns (10 per second, burst 10). */
#define T_NS UINT64_C(100000000)
#define TAU_NS UINT64_C(1000000000)
static const step_row BUCKET_STEPS[] = {
    HITROW("token: first hit", TB, 1, NOW, FRESH, true, S(NOWN + T_NS, 0), 1, 9,
           9, 0, 100),
    HITROW("leaky: first hit", LB, 1, NOW, FRESH, true, S(NOWN + T_NS, 0), 1, 1,
           9, 0, 100),
    HITROW("token: the whole burst", TB, 10, NOW, FRESH, true,
           S(NOWN + TAU_NS, 0), 1, 0, 0, 0, 1000),
    HITROW("token: above the burst is never", TB, 11, NOW, FRESH, false, FRESH,
           0, 10, 10, NEVER, 0),
    HITROW("leaky: above the burst is never", LB, 11, NOW, FRESH, false, FRESH,
           0, 0, 10, NEVER, 0),
    HITROW("token: empty, wait one T", TB, 1, NOW, S(NOWN + TAU_NS, 0), false,
           S(NOWN + TAU_NS, 0), 0, 0, 0, 100, 1000),
    HITROW("token: 1 ns more is 1 ms more", TB, 1, NOW, S(NOWN + TAU_NS + 1, 0),
           false, S(NOWN + TAU_NS + 1, 0), 0, 0, 0, 101, 1001),
    HITROW("leaky: level capped at the burst", LB, 1, NOW,
           S(NOWN + TAU_NS + 1, 0), false, S(NOWN + TAU_NS + 1, 0), 0, 10, 0,
           101, 1001),
    HITROW("token: a 1 ns wait is 1 ms", TB, 1, NOW, S(NOWN + 9 * T_NS + 1, 0),
           false, S(NOWN + 9 * T_NS + 1, 0), 0, 0, 0, 1, 901),
    HITROW("token: a past TAT is a full bucket", TB, 1, NOW,
           S(NOWN - 5 * T_NS, 0), true, S(NOWN + T_NS, 0), 1, 9, 9, 0, 100),
    HITROW("leaky: peek", LB, 0, NOW, S(NOWN + 3 * T_NS, 0), false,
           S(NOWN + 3 * T_NS, 0), 1, 3, 7, 0, 300),
    VALROW("token: get, fresh", TB, TG__OP_GET, 0, NOW, FRESH, TG_OK, false,
           FRESH, 10),
    VALROW("leaky: get, fresh", LB, TG__OP_GET, 0, NOW, FRESH, TG_OK, false,
           FRESH, 0),
    VALROW("token: 7.5 tokens are 7", TB, TG__OP_GET, 0, NOW,
           S(NOWN + 25 * T_NS / 10, 0), TG_OK, false,
           S(NOWN + 25 * T_NS / 10, 0), 7),
    VALROW("leaky: a level of 2.5 is 3", LB, TG__OP_GET, 0, NOW,
           S(NOWN + 25 * T_NS / 10, 0), TG_OK, false,
           S(NOWN + 25 * T_NS / 10, 0), 3),
    VALROW("token: set 4 tokens", TB, TG__OP_SET, 4, NOW, FRESH, TG_OK, true,
           S(NOWN + 6 * T_NS, 0), 0),
    VALROW("leaky: set a level of 4", LB, TG__OP_SET, 4, NOW, FRESH, TG_OK,
           true, S(NOWN + 4 * T_NS, 0), 0),
    VALROW("token: set above the burst", TB, TG__OP_SET, 11, NOW, FRESH,
           TG_ERANGE, false, FRESH, 0),
    VALROW("token: expires, rounded up to the ms", TB, TG__OP_EXPIRES, 0, NOW,
           S(NOWN + 25 * T_NS / 10 + 1, 0), TG_OK, false,
           S(NOWN + 25 * T_NS / 10 + 1, 0), NOW / 1000 + 251),
    VALROW("leaky: expires of a fresh key", LB, TG__OP_EXPIRES, 0, NOW, FRESH,
           TG_OK, false, FRESH, 0),
    VALROW("no inc on a bucket", TB, TG__OP_INC, 1, NOW, FRESH, TG_ENOTSUP,
           false, FRESH, 0),
};

static void run_steps(const step_row *rows, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const step_row *r = &rows[i];
    tg__call c;
    memset(&c, 0, sizeof c);
    c.op = r->op;
    c.alg = r->alg;
    c.key = "k";
    c.key_len = 1;
    assert_int_equal(tg__quota_prepare(&c.q, &r->q, r->alg), TG_OK);
    c.arg = r->arg;
    c.now_us = r->now;
    tg__state st = r->in;
    tg__outcome o;
    memset(&o, 0, sizeof o);
    bool changed = !r->changed;
    int rc = tg__state_step(&c, &st, &o, &changed);
    bool hit = r->op == TG__OP_HIT && r->rc == TG_OK;
    bool ok = rc == r->rc && changed == r->changed &&
              tg__state_word(&st, 0) == tg__state_word(&r->out, 0) &&
              tg__state_word(&st, 1) == tg__state_word(&r->out, 1);
    if (hit)
      ok = ok && o.r.allowed == r->allowed && o.r.count == r->count &&
           o.r.remaining == r->remaining && o.r.retry_after_ms == r->retry_ms &&
           o.r.reset_after_ms == r->reset_ms && !o.r.degraded;
    else if (rc == TG_OK && r->op != TG__OP_SET)
      ok = ok && o.value == r->value;
    if (!ok) {
      print_error("%s (%s): %s changed %d state {%" PRIu64 ", %" PRIu64 "}",
                  r->what, tg_algorithm_name(r->alg), tg_err_name(rc), changed,
                  tg__state_word(&st, 0), tg__state_word(&st, 1));
      if (hit)
        print_error(" allowed %d count %" PRIu64 " remaining %" PRIu64
                    " retry %" PRIu64 " reset %" PRIu64,
                    o.r.allowed, o.r.count, o.r.remaining, o.r.retry_after_ms,
                    o.r.reset_after_ms);
      else
        print_error(" value %" PRIu64, o.value);
      print_error("\n");
      fail();
    }
  }
}

static void window_steps(void **state) {
  (void)state;
  run_steps(WINDOW_STEPS, ROWS(WINDOW_STEPS));
}

static void bucket_steps(void **state) {
  (void)state;
  run_steps(BUCKET_STEPS, ROWS(BUCKET_STEPS));
}

/* ---- the sliding log ---- */

/* A call on a log of up to 4 entries (ring cap `cap`), limit 3 a second:
 * the answer and the log after. */
typedef struct log_row {
  const char *what;
  uint32_t cap;
  tg__op op;
  uint64_t arg, now;
  uint32_t n_in;
  tg__entry in[4];
  int rc;
  bool changed;
  bool allowed;
  uint64_t count, remaining, retry_ms, reset_ms, value;
  uint32_t n_out;
  tg__entry out[4];
} log_row;

#define E(t, c)                                                                \
  { (t), (c) }
/* 900 and 500 ms old, costs 1 and 2: the log is full */
#define FULL2                                                                  \
  2, { E(NOW - 900000, 1), E(NOW - 500000, 2) }

static const log_row LOG_STEPS[] = {
    {"full: wait for the oldest entry", 4, TG__OP_HIT, 1, NOW, FULL2, TG_OK,
     false, false, 3, 0, 100, 500, 0, FULL2},
    {"a cost of 2 waits for the entries covering it", 4, TG__OP_HIT, 2, NOW,
     FULL2, TG_OK, false, false, 3, 0, 500, 500, 0, FULL2},
    {"above the limit is never", 4, TG__OP_HIT, 4, NOW, FULL2, TG_OK, false,
     false, 3, 0, TG_NEVER, 500, 0, FULL2},
    {"a peek at the limit", 4, TG__OP_HIT, 0, NOW, FULL2, TG_OK, false, true, 3,
     0, 0, 500, 0, FULL2},
    {"an entry expires exactly one period later",
     4,
     TG__OP_HIT,
     1,
     NOW + 100000,
     FULL2,
     TG_OK,
     true,
     true,
     3,
     0,
     0,
     1000,
     0,
     2,
     {E(NOW - 500000, 2), E(NOW + 100000, 1)}},
    {"1 us early it has not", 4, TG__OP_HIT, 1, NOW + 99999, FULL2, TG_OK,
     false, false, 3, 0, 1, 401, 0, FULL2},
    {"the same us merges",
     4,
     TG__OP_HIT,
     1,
     NOW,
     1,
     {E(NOW, 1)},
     TG_OK,
     true,
     true,
     2,
     1,
     0,
     1000,
     0,
     1,
     {E(NOW, 2)}},
    {"called at an older time: waits as of then", 4, TG__OP_HIT, 1,
     NOW - 500000, FULL2, TG_OK, false, false, 3, 0, 600, 1000, 0, FULL2},
    {"at the cap the newest entry takes it",
     2,
     TG__OP_HIT,
     1,
     NOW,
     2,
     {E(NOW - 2000, 1), E(NOW - 1000, 1)},
     TG_OK,
     true,
     true,
     3,
     0,
     0,
     1000,
     0,
     2,
     {E(NOW - 2000, 1), E(NOW, 2)}},
    {"get prunes and sums",
     4,
     TG__OP_GET,
     0,
     NOW + 100000,
     FULL2,
     TG_OK,
     true,
     false,
     0,
     0,
     0,
     0,
     2,
     1,
     {E(NOW - 500000, 2)}},
    {"expires: the newest entry plus a period", 4, TG__OP_EXPIRES, 0, NOW,
     FULL2, TG_OK, false, false, 0, 0, 0, 0, (NOW - 500000 + 1000000) / 1000,
     FULL2},
    {"no set on a log", 4, TG__OP_SET, 1, NOW, FULL2, TG_ENOTSUP, false, false,
     0, 0, 0, 0, 0, FULL2},
};

/* A step that dies before its header is written: its entries as it left
 * them, the header as it was. On a full ring whose oldest entry expired,
 * the new entry lands in that slot; repair must keep every live entry
 * (it kept the new one alone: the key then admitted its limit again). At
 * every ring position, and for a step that did not fill the ring. */
static void log_repair_after_a_half_step(void **state) {
  (void)state;
  const tg_quota q = {100, 1000, 0}; /* period 1 s */
  for (uint32_t cap = 2; cap <= 5; cap++)
    for (uint32_t head = 0; head < cap; head++)
      for (uint32_t n = 1; n <= cap; n++) {
        tg__entry ring[5];
        memset(ring, 0, sizeof ring);
        tg__log lg = {ring, head, 0, cap, 0};
        /* n entries of cost 10, 1 ms apart from T; the oldest expires at
         * the step's now (T + 1 s + 0.5 ms), the others do not */
        const uint64_t T = UINT64_C(1700000000000000);
        for (uint32_t i = 0; i < n; i++) {
          tg__entry *e = tg__log_at(&lg, i);
          e->t_us = T + 1000 * i;
          e->cost = 10;
          lg.n++;
          lg.sum += 10;
        }
        tg__log published = lg; /* the header in shared memory */
        tg__call c;
        memset(&c, 0, sizeof c);
        c.op = TG__OP_HIT;
        c.alg = TG_SLIDING_WINDOW;
        assert_int_equal(tg__quota_prepare(&c.q, &q, c.alg), TG_OK);
        c.arg = 10;
        c.now_us = T + 1000500;
        tg__outcome o;
        bool changed;
        assert_int_equal(tg__log_step(&c, &lg, &o, &changed), TG_OK);
        assert_true(o.r.allowed && changed);
        /* the process dies here: entries written, header not */
        tg__log_repair(&published);
        /* every entry alive at now is kept (live: n - 1 of them), so the
         * key's live sum is at least theirs */
        uint64_t live = 0;
        for (uint32_t i = 0; i < published.n; i++) {
          const tg__entry *e = tg__log_at(&published, i);
          if (i > 0)
            assert_true(e->t_us > tg__log_at(&published, i - 1)->t_us);
          if (c.now_us - e->t_us < 1000000 && e->t_us < c.now_us)
            live += e->cost;
        }
        assert_int_equal(live, 10 * (uint64_t)(n - 1));
        uint64_t sum = 0;
        for (uint32_t i = 0; i < published.n; i++)
          sum += tg__log_at(&published, i)->cost;
        assert_int_equal(published.sum, sum);
      }
}

/* A bucket step of op at now_us (ms), cost 1, through tok. */
static tg__outcome bucket_op(tg__op op, const tg_quota *q, uint64_t now_ms,
                             uint64_t wait_ms, tg__state *st, tg__token *tok) {
  tg__call c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.alg = TG_TOKEN_BUCKET;
  assert_int_equal(tg__quota_prepare(&c.q, q, c.alg), TG_OK);
  c.arg = 1;
  c.now_us = now_ms * 1000;
  c.wait_ns = wait_ms * 1000000;
  c.tok = tok;
  tg__state before = *st;
  tg__outcome o;
  memset(&o, 0, sizeof o);
  bool changed = false;
  assert_int_equal(tg__state_step(&c, st, &o, &changed), TG_OK);
  if (tok && (op == TG__OP_TAKE || op == TG__OP_RESERVE) && o.r.allowed) {
    /* the receipt a store writes for a consumption */
    tok->taken = true;
    tok->before = before;
    tok->after = *st;
    tok->now_us = c.now_us;
  }
  return o;
}

/* A plain policy's bucket rule given back (UNDO) after another caller's
 * reservation queued behind it: the reservation keeps its time, and the
 * next one is queued after it, not given the same slot (before, the full
 * refund put the queue's tail back under it: both got 100 ms). With only
 * plain hits behind it the refund stays whole: the bucket is then as if
 * the policy had never taken. */
static void undo_keeps_reservations_promised(void **state) {
  (void)state;
  const uint64_t now = UINT64_C(1700000000000); /* ms */
  const tg_quota q1 = {10, 1000, 1};            /* T = 100 ms, burst 1 */
  tg__state st = {0, 0};
  tg__token pol;
  tg__token_start(&pol);
  tg__token ra, rb;
  tg__token_start(&ra);
  tg__token_start(&rb);
  assert_true(bucket_op(TG__OP_TAKE, &q1, now, 0, &st, &pol).r.allowed);
  tg__outcome a = bucket_op(TG__OP_RESERVE, &q1, now, 1000, &st, &ra);
  assert_true(a.r.allowed);
  assert_int_equal(a.value, UINT64_C(100000000));
  bucket_op(TG__OP_UNDO, &q1, now, 0, &st, &pol); /* a later rule lost */
  tg__outcome b = bucket_op(TG__OP_RESERVE, &q1, now, 1000, &st, &rb);
  assert_true(b.r.allowed);
  assert_int_equal(b.value, UINT64_C(200000000));
  /* plain hits only: a burst of 2, the policy's take, another caller's
   * hit, the give-back: one unit left, as after the hit alone */
  const tg_quota q2 = {10, 1000, 2};
  tg__state s2 = {0, 0}, alone = {0, 0};
  tg__token_start(&pol);
  assert_true(bucket_op(TG__OP_TAKE, &q2, now, 0, &s2, &pol).r.allowed);
  assert_true(bucket_op(TG__OP_HIT, &q2, now, 0, &s2, NULL).r.allowed);
  bucket_op(TG__OP_UNDO, &q2, now, 0, &s2, &pol);
  assert_true(bucket_op(TG__OP_HIT, &q2, now, 0, &alone, NULL).r.allowed);
  assert_int_equal(s2.a, alone.a);
  assert_true(bucket_op(TG__OP_HIT, &q2, now, 0, &s2, NULL).r.allowed);
}

static void log_steps(void **state) {
  (void)state;
  const tg_quota q = {3, 1000, 0};
  for (size_t i = 0; i < ROWS(LOG_STEPS); i++) {
    const log_row *r = &LOG_STEPS[i];
    tg__entry ring[4];
    memcpy(ring, r->in, sizeof ring);
    tg__log lg = {ring, 0, r->n_in, r->cap, 0};
    for (uint32_t j = 0; j < r->n_in; j++)
      lg.sum += r->in[j].cost;
    tg__call c;
    memset(&c, 0, sizeof c);
    c.op = r->op;
    c.alg = TG_SLIDING_WINDOW;
    assert_int_equal(tg__quota_prepare(&c.q, &q, c.alg), TG_OK);
    c.arg = r->arg;
    c.now_us = r->now;
    tg__outcome o;
    memset(&o, 0, sizeof o);
    bool changed = !r->changed;
    int rc = tg__log_step(&c, &lg, &o, &changed);
    bool ok = rc == r->rc && changed == r->changed && lg.n == r->n_out;
    uint64_t sum = 0;
    for (uint32_t j = 0; ok && j < lg.n; j++) {
      const tg__entry *e = tg__log_at(&lg, j);
      ok = e->t_us == r->out[j].t_us && e->cost == r->out[j].cost;
      sum += r->out[j].cost;
    }
    ok = ok && lg.sum == sum && tg__log_plausible(&lg);
    if (rc == TG_OK && r->op == TG__OP_HIT)
      ok = ok && o.r.allowed == r->allowed && o.r.count == r->count &&
           o.r.remaining == r->remaining && o.r.retry_after_ms == r->retry_ms &&
           o.r.reset_after_ms == r->reset_ms;
    else if (rc == TG_OK)
      ok = ok && o.value == r->value;
    if (!ok) {
      print_error("%s: %s changed %d n %u sum %" PRIu64 " allowed %d count "
                  "%" PRIu64 " remaining %" PRIu64 " retry %" PRIu64
                  " reset %" PRIu64 " value %" PRIu64 "\n",
                  r->what, tg_err_name(rc), changed, lg.n, lg.sum, o.r.allowed,
                  o.r.count, o.r.remaining, o.r.retry_after_ms,
                  o.r.reset_after_ms, o.value);
      fail();
    }
  }
}

/* ---- when a state stops mattering ---- */

static void lifetimes(void **state) {
  (void)state;
  static const struct {
    const char *what;
    tg_algorithm alg;
    tg__state st;
    uint64_t now;
    bool fresh;
    uint64_t expiry_us, ttl_ms;
  } rows[] = {
      {"window with a count", FW, S(END, 3), NOW, false, END, 750},
      {"window at its end", FW, S(END, 3), END, true, END, 0},
      /* fresh already, but its end stays its expiry (a clock stepping
       * back finds it current) */
      {"epoch window at 0", FW, S(END, 0), NOW, true, END, 0},
      {"per-key window at 0 is live", PK, S(END, 0), NOW, false, END, 750},
      {"1 us left is 1 ms", PK, S(NOW + 1, 1), NOW, false, NOW + 1, 1},
      {"a TAT 1 ns ahead", TB, S(NOWN + 1, 0), NOW, false, NOW + 1, 1},
      {"a TAT at now", TB, S(NOWN, 0), NOW, true, NOW, 0},
      {"an empty leaky bucket in 1 s", LB, S(NOWN + TAU_NS, 0), NOW, false,
       NOW + 1000000, 1000},
  };
  for (size_t i = 0; i < ROWS(rows); i++) {
    bool fresh = tg__state_fresh(rows[i].alg, &rows[i].st, rows[i].now);
    uint64_t exp = tg__state_expiry_us(rows[i].alg, &rows[i].st);
    uint64_t ttl = tg__state_ttl_ms(rows[i].alg, &rows[i].st, rows[i].now);
    if (fresh != rows[i].fresh || exp != rows[i].expiry_us ||
        ttl != rows[i].ttl_ms) {
      print_error("%s: fresh %d expiry %" PRIu64 " ttl %" PRIu64 "\n",
                  rows[i].what, fresh, exp, ttl);
      fail();
    }
  }
  /* a log: its newest entry plus the period; an empty one is fresh */
  tg__entry ring[4] = {E(NOW - 900000, 1), E(NOW - 500000, 2)};
  tg__log lg = {ring, 0, 2, 4, 3};
  assert_int_equal(tg__log_expiry_us(&lg, 1000000), NOW + 500000);
  assert_int_equal(tg__log_ttl_ms(&lg, 1000000, NOW), 500);
  assert_int_equal(tg__log_ttl_ms(&lg, 1000000, NOW + 499999), 1);
  assert_int_equal(tg__log_ttl_ms(&lg, 1000000, NOW + 500000), 0);
  lg.n = 0;
  lg.sum = 0;
  assert_int_equal(tg__log_expiry_us(&lg, 1000000), 0);
  assert_int_equal(tg__log_ttl_ms(&lg, 1000000, NOW), 0);
}

/* ---- the arithmetic helpers every step rounds with ---- */

static void rounding_helpers(void **state) {
  (void)state;
  assert_int_equal(tg__ms_until(1000, 0), 1);
  assert_int_equal(tg__ms_until(1001, 0), 2);
  assert_int_equal(tg__ms_until(1, 0), 1);
  assert_int_equal(tg__ms_until(5, 5), 0);
  assert_int_equal(tg__ms_until(0, 5), 0);
  assert_int_equal(tg__ms_until(UINT64_MAX, 0), UINT64_MAX / 1000 + 1);
  assert_int_equal(tg__div_ceil(UINT64_MAX, 1), UINT64_MAX);
  assert_int_equal(tg__div_ceil(UINT64_MAX, 2), UINT64_C(1) << 63);
  assert_int_equal(tg__div_ceil(0, 7), 0);
  uint64_t out = 0;
  assert_false(tg__add(UINT64_MAX, 1, &out));
  assert_true(tg__add(UINT64_MAX - 1, 1, &out));
  assert_int_equal(out, UINT64_MAX);
  assert_false(tg__mul(UINT64_C(1) << 32, UINT64_C(1) << 32, &out));
  assert_true(tg__mul(UINT64_C(1) << 31, UINT64_C(1) << 32, &out));
  assert_int_equal(out, UINT64_C(1) << 63);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(quota_prepare),
      cmocka_unit_test(operations_supported),
      cmocka_unit_test(call_checks_in_order),
      cmocka_unit_test(window_steps),
      cmocka_unit_test(bucket_steps),
      cmocka_unit_test(log_steps),
      cmocka_unit_test(undo_keeps_reservations_promised),
      cmocka_unit_test(log_repair_after_a_half_step),
      cmocka_unit_test(lifetimes),
      cmocka_unit_test(rounding_helpers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
