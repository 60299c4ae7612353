/* SPDX-License-Identifier: MIT */
/*
 * window.c - the two fixed-window algorithms as pure steps on (end_us, count).
 *
 * Both keep the end of the window the key's count belongs to, in us, and the
 * count (denied calls included, as Hammer and the Redis INCR pattern do).
 * TG_FIXED_WINDOW aligns windows to the epoch: the window of now ends at
 * (floor(now_ms / period_ms) + 1) * period_ms. TG_FIXED_WINDOW_PER_KEY opens a
 * window at the first hit and ends it period later; it is active while
 * end > now (strict).
 */
#include "core.h"

/* The window a call at now falls into: the stored one if it is still current
 * (or ahead of now because the clock stepped back: state never moves
 * backwards), else a fresh one with count 0 that a write would open. */
static tg__state live_window(const tg__call *c, const tg__state *st) {
  if (c->alg == TG_FIXED_WINDOW) {
    /* (floor(now_ms / period_ms) + 1) * period_ms, in us: floor(floor(x /
     * 1000) / p) is floor(x / (1000 p)), so one division does */
    uint64_t period_us = c->q.period_us;
    uint64_t end_us = (c->now_us / period_us + 1) * period_us;
    if (tg__win_end(st) >= end_us)
      return *st;
    return tg__win_state(end_us, 0);
  }
  if (tg__win_end(st) > c->now_us)
    return *st;
  return tg__win_state(c->now_us + c->q.period_us, 0);
}

/* When a call refused in window w (live_window's) may pass: at w's end; but
 * an epoch window kept from a longer period (the quota changed under the
 * key) stops being the call's a period sooner, once the call's own window
 * ends after it, which it does from the start of the call's period that
 * holds w's end: live_window then opens a fresh one. That start is after
 * now whenever w was kept, and is w's end when the periods agree. */
static uint64_t window_wait_end(const tg__call *c, const tg__state *w) {
  uint64_t end = tg__win_end(w);
  if (c->alg == TG_FIXED_WINDOW) {
    uint64_t start = end / c->q.period_us * c->q.period_us;
    if (start > c->now_us)
      return start;
  }
  return end;
}

/* True while the stored window is not equivalent to absent: an epoch window
 * with a count, or an active per-key window (even at count 0, after set(0),
 * since its end is fixed). A stored epoch window that ends after now is
 * always the current one: window ends are multiples of the period. */
static bool window_live(const tg__call *c, const tg__state *st) {
  if (tg__win_end(st) <= c->now_us)
    return false;
  return c->alg == TG_FIXED_WINDOW_PER_KEY || tg__win_count(st) > 0;
}

/* CHECK and TAKE, a policy's rule: counts only when allowed. A CHECK
 * reports the consumed state too, without it being published (the store
 * may publish it on the TAKE that follows), and, when `with_peek`, the
 * key's numbers as they are, which a denied policy reports: nothing
 * consumed, so the count before the call and the reset of the stored
 * state. */
static inline __attribute__((always_inline)) int
policy_step_inline(const tg__call *c, tg__state *st, tg__outcome *o,
                   bool *changed, bool with_peek) {
  tg__state w = live_window(c, st);
  uint64_t limit = c->q.limit;
  uint64_t cost = c->arg, count = 0;
  /* a count that would pass 2^64 - 1 passes any limit: denied, and a
   * denied rule counts nothing (tg_hit's HIT, which counts denials, is
   * TG_EOVERFLOW there) */
  bool allowed = tg__add(tg__win_count(&w), cost, &count) && count <= limit;
  /* the stored state, before *st takes the consumed one */
  bool live_as_is = with_peek && window_live(c, st);
  uint64_t end_as_is = tg__win_end(st);
  tg__state after = w;
  if (allowed && cost > 0) {
    tg__win_set_count(&after, count);
    *st = after;
    *changed = true;
  }
  const tg__state *left = allowed && cost > 0 ? &after : st;
  uint64_t shown = allowed ? count : tg__win_count(&w);
  /* the wait only when denied (tg__result_set drops it otherwise): an
   * epoch window's is a division */
  uint64_t retry = allowed ? 0
                   : cost > limit
                       ? TG_NEVER
                       : tg__ms_until(window_wait_end(c, &w), c->now_us);
  uint64_t reset =
      window_live(c, left) ? tg__ms_until(tg__win_end(left), c->now_us) : 0;
  tg__result_set(&o->r, allowed, shown, shown <= limit ? limit - shown : 0,
                 retry, reset);
  if (with_peek) {
    /* the key as it is: 0 unless its state is live; then the result's
     * reset when the state the call leaves ends with it (it is then live
     * too), which it does unless the quota's period changed under it */
    uint64_t seen = tg__win_count(&w);
    uint64_t as_is = !live_as_is ? 0
                     : end_as_is == tg__win_end(left)
                         ? reset
                         : tg__ms_until(end_as_is, c->now_us);
    tg__result_set(&o->peek, seen <= limit, seen,
                   seen <= limit ? limit - seen : 0, 0, as_is);
  }
  return TG_OK;
}

/* The same out of line, for tg__window_step: its HIT does not pay for
 * this one's frame. */
static __attribute__((noinline)) int policy_step(const tg__call *c,
                                                 tg__state *st, tg__outcome *o,
                                                 bool *changed,
                                                 bool with_peek) {
  return policy_step_inline(c, st, o, changed, with_peek);
}

int tg__window_step(const tg__call *c, tg__state *st, tg__outcome *o,
                    bool *changed) {
  tg__state w = live_window(c, st);
  uint64_t limit = c->q.limit;
  *changed = false;
  switch (c->op) {
  case TG__OP_HIT: {
    uint64_t cost = c->arg, count;
    if (!tg__add(tg__win_count(&w), cost, &count))
      return TG_EOVERFLOW;
    if (cost > 0) {
      tg__win_set_count(&w, count);
      *st = w;
      *changed = true;
    }
    bool allowed = count <= limit;
    /* the wait only when denied (tg__result_set drops it otherwise): an
     * epoch window's is a division */
    uint64_t retry = allowed ? 0
                     : cost > limit
                         ? TG_NEVER
                         : tg__ms_until(window_wait_end(c, &w), c->now_us);
    uint64_t reset =
        window_live(c, st) ? tg__ms_until(tg__win_end(st), c->now_us) : 0;
    tg__result_set(&o->r, allowed, count, allowed ? limit - count : 0, retry,
                   reset);
    return TG_OK;
  }
  case TG__OP_CHECK:
  case TG__OP_TAKE:
    return policy_step(c, st, o, changed, c->op == TG__OP_CHECK);
  case TG__OP_UNDO: {
    /* only from the window the cost went into, and never below 0 */
    const tg__token *k = c->tok;
    uint64_t count = tg__win_count(st);
    if (!k || !k->taken || tg__win_end(st) != tg__win_end(&k->after) ||
        count == 0 || c->arg == 0)
      return TG_OK;
    uint64_t left = count > c->arg ? count - c->arg : 0;
    if (left == 0 && tg__win_end(&k->before) != tg__win_end(&k->after))
      *st = k->before; /* the take opened this window, and nothing else
                          counts in it: the key as the take found it */
    else
      tg__win_set_count(st, left);
    *changed = true;
    return TG_OK;
  }
  case TG__OP_INC: {
    uint64_t count;
    if (!tg__add(tg__win_count(&w), c->arg, &count))
      return TG_EOVERFLOW;
    if (c->arg > 0) {
      tg__win_set_count(&w, count);
      *st = w;
      *changed = true;
    }
    o->value = count;
    return TG_OK;
  }
  case TG__OP_GET:
    o->value = tg__win_count(&w);
    return TG_OK;
  case TG__OP_SET:
    if (c->alg == TG_FIXED_WINDOW_PER_KEY)
      /* set re-anchors the window */
      tg__win_set_end(&w, c->now_us + c->q.period_us);
    tg__win_set_count(&w, c->arg);
    *st = w;
    *changed = true;
    return TG_OK;
  case TG__OP_EXPIRES:
    o->value = window_live(c, st) ? tg__div_ceil(tg__win_end(st), 1000) : 0;
    return TG_OK;
  case TG__OP_RESERVE:
  case TG__OP_CANCEL:
  case TG__OP_COUNT_:
    break;
  }
  return TG_ENOTSUP;
}

int tg__window_check(const tg__call *c, tg__state *st, tg__outcome *o,
                     bool *changed) {
  /* no peek: the table asks tg__window_peek for it when a policy is
   * denied (tg__state_check) */
  *changed = false;
  return policy_step_inline(c, st, o, changed, false);
}

void tg__window_peek(const tg__call *c, const tg__state *st, tg_result *p) {
  /* policy_step's peek without the rest of its step: the window's count
   * before the call, and the reset of the state as stored */
  tg__state w = live_window(c, st);
  uint64_t limit = c->q.limit, seen = tg__win_count(&w);
  uint64_t reset =
      window_live(c, st) ? tg__ms_until(tg__win_end(st), c->now_us) : 0;
  tg__result_set(p, seen <= limit, seen, seen <= limit ? limit - seen : 0, 0,
                 reset);
}
