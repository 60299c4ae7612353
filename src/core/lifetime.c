/* SPDX-License-Identifier: MIT */
/*
 * lifetime.c - what a stored state means over time, and whether a call may
 * change it: the facts every store needs to reclaim keys, give them TTLs
 * and decide how to open them, written once so no store re-derives them.
 *
 * Windows keep their end in us, buckets their TAT in ns (core.h). A state is
 * "fresh" when it is equivalent to absent: every call would answer the same
 * if the key had no state at all. Its expiry is the moment from which it is
 * fresh at any now; a fixed window whose count is 0 is fresh earlier
 * already, but keeps its end as expiry, because a clock stepping back could
 * still find it current.
 */
#include "core.h"

bool tg__state_fresh(tg_algorithm alg, const tg__state *st, uint64_t now_us) {
  switch (alg) {
  case TG_FIXED_WINDOW:
    return tg__win_count(st) == 0 || tg__win_end(st) <= now_us;
  case TG_FIXED_WINDOW_PER_KEY:
    return tg__win_end(st) <= now_us;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET:
    return tg__tat(st) <= now_us * 1000;
  case TG_SLIDING_WINDOW:
    break;
  }
  return false;
}

uint64_t tg__state_expiry_us(tg_algorithm alg, const tg__state *st) {
  if (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET)
    return tg__div_ceil(tg__tat(st), 1000); /* ns -> us, never early */
  return tg__win_end(st);
}

uint64_t tg__state_ttl_ms(tg_algorithm alg, const tg__state *st,
                          uint64_t now_us) {
  if (tg__state_fresh(alg, st, now_us))
    return 0;
  return tg__ms_until(tg__state_expiry_us(alg, st), now_us);
}

bool tg__call_writes(const tg__call *c) {
  uint64_t arg = c->arg;
  if (c->op == TG__OP_CHECK)
    return false;
  if (c->op == TG__OP_UNDO || c->op == TG__OP_CANCEL)
    return arg > 0 && tg__op_supported(c->alg, c->op);
  switch (c->alg) {
  case TG_FIXED_WINDOW:
  case TG_FIXED_WINDOW_PER_KEY:
    /* a count of 0 added changes nothing; a set always re-stores */
    return c->op == TG__OP_SET ||
           ((c->op == TG__OP_HIT || c->op == TG__OP_INC ||
             c->op == TG__OP_TAKE) &&
            arg > 0);
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET:
    /* a cost or a value above the burst is refused before any change */
    return (c->op == TG__OP_SET && arg <= c->q.burst) ||
           ((c->op == TG__OP_HIT || c->op == TG__OP_TAKE ||
             c->op == TG__OP_RESERVE) &&
            arg > 0 && arg <= c->q.burst);
  case TG_SLIDING_WINDOW:
    /* every call drops the entries that expired under its period; that is
     * a change of state, since a later call with a longer period (a key
     * whose quota changed) would still count them */
    return tg__op_supported(c->alg, c->op);
  }
  return false;
}

bool tg__state_store_needed(tg_algorithm alg, bool was_absent, bool changed,
                            const tg__state *st, uint64_t now_us) {
  return changed && !(was_absent && tg__state_fresh(alg, st, now_us));
}
