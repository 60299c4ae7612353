/* SPDX-License-Identifier: MIT */
/*
 * quota.c - the checks every call passes before any store sees it: quota
 * validation, which operations each algorithm supports, and the algorithms'
 * names. The limiter and the Redis module both go through here, so input
 * that would divide by zero or overflow is refused in one place, with the
 * same code.
 */
#include "core.h"

/* TG_TOLERANCE_MAX_NS, the largest GCRA tolerance (burst * T): about 126
 * years. With now at most TG_NOW_MAX_US (9e18 ns) a stored TAT stays below
 * now + tau, and now + 2 tau still fits 64 bits, so the bucket steps need no
 * overflow checks of their own. */
#define TAU_MAX_NS TG_TOLERANCE_MAX_NS

int tg__quota_prepare(tg__quota *out, const tg_quota *q, tg_algorithm alg) {
  int rc = tg__quota_prepare_common(out, q);
  if (rc != TG_OK)
    return rc;
  if (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET) {
    uint64_t period_ns = q->period_ms * UINT64_C(1000000); /* <= 1e18 */
    if (q->limit > period_ns)
      return TG_EQUOTA; /* faster than one per ns: T would round to 0 */
    out->t_ns = tg__div_ceil(period_ns, q->limit);
    if (!tg__mul(out->burst, out->t_ns, &out->tau_ns) ||
        out->tau_ns > TAU_MAX_NS)
      return TG_EQUOTA;
  }
  return TG_OK;
}

int tg_quota_check(tg_algorithm alg, const tg_quota *q) {
  if (!q || (unsigned)alg >= TG_ALGORITHM_COUNT)
    return TG_EINVAL;
  tg__quota p;
  return tg__quota_prepare(&p, q, alg);
}

#define OP(o) (1u << (o))
#define OPS_ALL                                                                \
  (OP(TG__OP_HIT) | OP(TG__OP_GET) | OP(TG__OP_EXPIRES) | OP(TG__OP_CHECK) |   \
   OP(TG__OP_TAKE) | OP(TG__OP_UNDO))
const unsigned tg__ops_of[TG_ALGORITHM_COUNT] = {
    [TG_FIXED_WINDOW] = OPS_ALL | OP(TG__OP_INC) | OP(TG__OP_SET),
    [TG_FIXED_WINDOW_PER_KEY] = OPS_ALL | OP(TG__OP_INC) | OP(TG__OP_SET),
    [TG_SLIDING_WINDOW] = OPS_ALL,
    [TG_TOKEN_BUCKET] =
        OPS_ALL | OP(TG__OP_SET) | OP(TG__OP_RESERVE) | OP(TG__OP_CANCEL),
    [TG_LEAKY_BUCKET] =
        OPS_ALL | OP(TG__OP_SET) | OP(TG__OP_RESERVE) | OP(TG__OP_CANCEL),
};

const char *tg_algorithm_name(tg_algorithm alg) {
  switch (alg) {
  case TG_FIXED_WINDOW:
    return "fixed_window";
  case TG_FIXED_WINDOW_PER_KEY:
    return "fixed_window_per_key";
  case TG_SLIDING_WINDOW:
    return "sliding_window";
  case TG_TOKEN_BUCKET:
    return "token_bucket";
  case TG_LEAKY_BUCKET:
    return "leaky_bucket";
  }
  return "unknown";
}
