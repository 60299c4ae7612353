/* SPDX-License-Identifier: MIT */
/*
 * differential.h - one call run on two limiters, the answers compared: the
 * harness of the differential tests (test_custom_store_runs against the
 * memory store, test_redis against the memory store). Each test draws its
 * own sequence (keys, quotas, costs, times: what its store makes
 * interesting) and adds its own checks (the custom store's protocol, Redis
 * TTLs); what "the same answer" means is written once, here: the same code,
 * the same value, and every field of the result equal, bools compared as
 * bytes so that a result one limiter wrote and the other left alone differs
 * even when the bytes left would read as the right bool.
 *
 * Include after <cmocka.h> and tollgate.h.
 */
#ifndef TG_TESTS_DIFFERENTIAL_H
#define TG_TESTS_DIFFERENTIAL_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tollgate.h"

typedef enum diff_op {
  DIFF_HIT,
  DIFF_GET,
  DIFF_SET,
  DIFF_INC,
  DIFF_EXPIRES,
  DIFF_RESET,
  DIFF_BATCH,
  DIFF_OPS
} diff_op;

static const char *const diff_op_names[DIFF_OPS] = {
    "hit", "get", "set", "inc", "expires_at", "reset", "batch"};

#define DIFF_BATCH_MAX 8

/* One call: op on key at now under q with arg (a hit's or inc's cost, a
 * set's value); a batch is items[0..n), each with its own key, quota and
 * cost. */
typedef struct diff_call {
  diff_op op;
  uint64_t now_us;
  const void *key;
  size_t key_len;
  const tg_quota *q;
  uint64_t arg;
  tg_batch_item items[DIFF_BATCH_MAX];
  size_t n;
} diff_call;

/* What one limiter answered. Filled with the same bytes before the call, so
 * whatever a call leaves unwritten compares equal only if both left it. */
typedef struct diff_answer {
  int rc;
  uint64_t value;
  tg_result r;
  tg_batch_item items[DIFF_BATCH_MAX];
} diff_answer;

static inline void diff_run(tg_limiter *lim, const diff_call *c,
                            diff_answer *a) {
  memset(a, 0x5a, sizeof *a);
  switch (c->op) {
  case DIFF_HIT:
    a->rc = tg_hit_at(lim, c->now_us, c->key, c->key_len, c->q, c->arg, &a->r);
    break;
  case DIFF_GET:
    a->rc = tg_get_at(lim, c->now_us, c->key, c->key_len, c->q, &a->value);
    break;
  case DIFF_SET:
    a->rc = tg_set_at(lim, c->now_us, c->key, c->key_len, c->q, c->arg);
    break;
  case DIFF_INC:
    a->rc =
        tg_inc_at(lim, c->now_us, c->key, c->key_len, c->q, c->arg, &a->value);
    break;
  case DIFF_EXPIRES:
    a->rc =
        tg_expires_at_at(lim, c->now_us, c->key, c->key_len, c->q, &a->value);
    break;
  case DIFF_RESET:
    a->rc = tg_reset(lim, c->key, c->key_len);
    break;
  default:
    memcpy(a->items, c->items, c->n * sizeof c->items[0]);
    a->rc = tg_hit_batch_at(lim, c->now_us, a->items, c->n);
    break;
  }
}

static inline bool diff_same_result(const tg_result *x, const tg_result *y) {
  return memcmp(&x->allowed, &y->allowed, sizeof x->allowed) == 0 &&
         memcmp(&x->degraded, &y->degraded, sizeof x->degraded) == 0 &&
         x->count == y->count && x->remaining == y->remaining &&
         x->retry_after_ms == y->retry_after_ms &&
         x->reset_after_ms == y->reset_after_ms;
}

/* The same code, value and result; for a batch, every item's status and
 * result. */
static inline bool diff_same(const diff_call *c, const diff_answer *x,
                             const diff_answer *y) {
  if (x->rc != y->rc || x->value != y->value || !diff_same_result(&x->r, &y->r))
    return false;
  if (c->op == DIFF_BATCH)
    for (size_t i = 0; i < c->n; i++)
      if (x->items[i].status != y->items[i].status ||
          !diff_same_result(&x->items[i].result, &y->items[i].result))
        return false;
  return true;
}

static inline void diff_print_result(const char *who, int rc,
                                     const tg_result *r) {
  print_error("  %s: %s allowed=%d degraded=%d count=%" PRIu64
              " remaining=%" PRIu64 " retry=%" PRIu64 " reset=%" PRIu64 "\n",
              who, tg_err_name(rc), (int)*(const unsigned char *)&r->allowed,
              (int)*(const unsigned char *)&r->degraded, r->count, r->remaining,
              r->retry_after_ms, r->reset_after_ms);
}

/* Prints the call and both answers (names: the two limiters'). */
static inline void diff_report(const diff_call *c, const char *name_x,
                               const diff_answer *x, const char *name_y,
                               const diff_answer *y) {
  print_error("  %s(arg %" PRIu64 ") at %" PRIu64 " us on a key of %zu bytes, "
              "quota {%" PRIu64 ", %" PRIu64 " ms, %" PRIu64 "}\n",
              diff_op_names[c->op], c->arg, c->now_us, c->key_len,
              c->q ? c->q->limit : 0, c->q ? c->q->period_ms : 0,
              c->q ? c->q->burst : 0);
  diff_print_result(name_x, x->rc, &x->r);
  diff_print_result(name_y, y->rc, &y->r);
  print_error("  values: %s %" PRIu64 ", %s %" PRIu64 "\n", name_x, x->value,
              name_y, y->value);
  if (c->op == DIFF_BATCH)
    for (size_t i = 0; i < c->n; i++) {
      print_error("  item %zu:\n", i);
      diff_print_result(name_x, x->items[i].status, &x->items[i].result);
      diff_print_result(name_y, y->items[i].status, &y->items[i].result);
    }
}

#endif
