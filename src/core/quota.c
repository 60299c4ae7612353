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
  if (q->limit == 0 || q->period_ms == 0 || q->period_ms > TG_PERIOD_MAX_MS)
    return TG_EQUOTA;
  out->limit = q->limit;
  out->period_us = q->period_ms * 1000u;
  out->burst = q->burst != 0 ? q->burst : q->limit;
  out->t_ns = 0;
  out->tau_ns = 0;
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

bool tg__op_supported(tg_algorithm alg, tg__op op) {
  if (op == TG__OP_HIT) /* every decision asks: first, alone */
    return true;
  switch (op) {
  case TG__OP_HIT:
  case TG__OP_GET:
  case TG__OP_EXPIRES:
  case TG__OP_CHECK:
  case TG__OP_TAKE:
  case TG__OP_UNDO:
    return true;
  case TG__OP_RESERVE:
  case TG__OP_CANCEL:
    return alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
  case TG__OP_INC:
    return alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
  case TG__OP_SET:
    return alg != TG_SLIDING_WINDOW;
  case TG__OP_COUNT_:
    break;
  }
  return false;
}

int tg__call_check(tg_algorithm alg, tg__op op, size_t key_len,
                   const tg_quota *q, tg__quota *prepared) {
  if (key_len == 0 || key_len > TG_KEY_MAX)
    return TG_EKEY;
  if (!tg__op_supported(alg, op))
    return TG_ENOTSUP;
  return tg__quota_prepare(prepared, q, alg);
}

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
