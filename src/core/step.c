/*
 * step.c - dispatch of a call on fixed-size state to its algorithm family,
 * and the "is this state equivalent to absent" test stores use to reclaim
 * keys.
 */
#include "core.h"

int tg__state_step(const tg__call *c, tg__state *st, tg__outcome *o,
                   bool *changed) {
  *changed = false;
  if (!tg__op_supported(c->alg, c->op))
    return TG_ENOTSUP;
  switch (c->alg) {
  case TG_FIXED_WINDOW:
  case TG_FIXED_WINDOW_PER_KEY:
    return tg__window_step(c, st, o, changed);
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET:
    return tg__gcra_step(c, st, o, changed);
  case TG_SLIDING_WINDOW:
    break;
  }
  return TG_EINVAL;
}

bool tg__state_plausible(tg_algorithm alg, const tg__state *st) {
  if (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET)
    return st->a <= TG_NOW_MAX_US * 1000 + TG_TOLERANCE_MAX_NS && st->b == 0;
  return st->a <= TG_NOW_MAX_US + TG_PERIOD_MAX_MS * 1000;
}

bool tg__log_plausible(const tg__log *log) {
  if (log->cap == 0 || log->head >= log->cap || log->n > log->cap)
    return false;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    const tg__entry *e = tg__log_at(log, i);
    if (e->t_us > TG_NOW_MAX_US ||
        (i > 0 && e->t_us <= tg__log_at(log, i - 1)->t_us) ||
        !tg__add(sum, e->cost, &sum))
      return false;
  }
  return sum == log->sum;
}

void tg__log_repair(tg__log *log) {
  if (log->cap == 0) {
    log->head = log->n = 0;
    log->sum = 0;
    return;
  }
  if (log->head >= log->cap)
    log->head = 0;
  if (log->n > log->cap)
    log->n = log->cap;
  uint32_t k = 0;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    tg__entry e = *tg__log_at(log, i); /* k <= i: reads stay ahead */
    if (k == 0 || e.t_us > tg__log_at(log, k - 1)->t_us) {
      *tg__log_at(log, k++) = e;
      if (!tg__add(sum, e.cost, &sum))
        sum = UINT64_MAX;
    }
  }
  log->n = k;
  log->sum = sum;
}

bool tg__state_fresh(tg_algorithm alg, const tg__state *st, uint64_t now_us) {
  switch (alg) {
  case TG_FIXED_WINDOW:
    return st->b == 0 || st->a <= now_us;
  case TG_FIXED_WINDOW_PER_KEY:
    return st->a <= now_us;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET:
    return st->a <= now_us * 1000;
  case TG_SLIDING_WINDOW:
    break;
  }
  return false;
}
