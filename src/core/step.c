/* SPDX-License-Identifier: MIT */
/*
 * step.c - dispatch of a call on fixed-size state to its algorithm family,
 * and the check that a state read from outside holds numbers tollgate could
 * have written. What a state means over time (fresh, expiry, TTL) is in
 * lifetime.c; everything about the sliding log is in sliding.c.
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

int tg__state_check(const tg__call *c, tg__state *st, tg__outcome *o,
                    bool *changed) {
  if (c->alg == TG_TOKEN_BUCKET || c->alg == TG_LEAKY_BUCKET)
    return tg__gcra_check(c, st, o, changed);
  if (c->alg == TG_FIXED_WINDOW || c->alg == TG_FIXED_WINDOW_PER_KEY)
    return tg__window_check(c, st, o, changed);
  *changed = false;
  return TG_ENOTSUP;
}

void tg__state_peek(const tg__call *c, const tg__state *st, tg_result *peek) {
  if (c->alg == TG_TOKEN_BUCKET || c->alg == TG_LEAKY_BUCKET)
    tg__gcra_peek(c, st, peek);
  else if (c->alg == TG_FIXED_WINDOW || c->alg == TG_FIXED_WINDOW_PER_KEY)
    tg__window_peek(c, st, peek);
}

bool tg__state_plausible(tg_algorithm alg, const tg__state *st) {
  if (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET)
    return tg__tat(st) <=
               TG_NOW_MAX_US * 1000 + TG_TOLERANCE_MAX_NS + TG__WAIT_MAX_NS &&
           tg__state_word(st, 1) == 0;
  return tg__win_end(st) <= TG_NOW_MAX_US + TG_PERIOD_MAX_MS * 1000;
}
