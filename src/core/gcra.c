/* SPDX-License-Identifier: MIT */
/*
 * gcra.c - token bucket and leaky bucket as one GCRA word per key.
 *
 * State is the theoretical arrival time (TAT) in ns. With emission interval T
 * and tolerance tau = burst * T, a call of cost c at now computes
 * tat' = max(tat, now) + c * T and is allowed iff tat' - now <= tau. The debt
 * d = max(tat, now) - now is the bucket's fill in ns: the leaky bucket's level
 * is d / T, the token bucket's tokens are (tau - d) / T. Both buckets admit
 * exactly the same calls; they differ only in what they report and in their
 * names for a fresh key (full of tokens, empty of water).
 *
 * Ranges (from tg__quota_prepare and TG_NOW_MAX_US): now <= 9e18 ns,
 * tau <= 4e18 ns, a stored TAT <= its write time + tau, so d + c * T with
 * c <= burst stays below 2^64 even when the clock has stepped back.
 */
#include "core.h"

#define NS_PER_MS UINT64_C(1000000)

/* Whole tokens left for debt d (0 when the debt exceeds tau, which only a
 * clock stepping back can cause). */
static uint64_t tokens(const tg__quota *q, uint64_t d) {
  return d <= q->tau_ns ? (q->tau_ns - d) / q->t_ns : 0;
}

/* Leaky level for debt d, rounded up, never above burst. */
static uint64_t level(const tg__quota *q, uint64_t d) {
  uint64_t lv = tg__div_ceil(d, q->t_ns);
  return lv < q->burst ? lv : q->burst;
}

static uint64_t report(const tg__call *c, uint64_t d) {
  return c->alg == TG_TOKEN_BUCKET ? tokens(&c->q, d) : level(&c->q, d);
}

/* UNDO and CANCEL: takes the consumption c->tok records (TAT0 -> TAT1 at
 * now1) back out of the current TAT, as far as that is safe.
 *
 * A bucket keeps one number, so what later calls did is not known. Removing
 * the consumption from the history can lower the final TAT by at most
 * TAT1 - max(TAT0, N), where N is the latest now of any call since (the
 * bucket would have refilled up to N anyway): that is the refund, with N =
 * max(now1, the undo's now). A TAKE given back (a policy that was denied)
 * takes that. A reservation cancelled also must not move reservations made
 * after it, which were promised their times: it gives back only the part of
 * its own span cost * T that none of them was scheduled behind, cur - TAT1
 * being what they consumed (nothing when cur < TAT1: the key was set,
 * reset or given back meanwhile, and what is safe is unknown). So does a
 * TAKE given back while reservations are queued on the key: its debt at N
 * is then above tau, which no plain hit leaves (a hit is admitted only up
 * to tau) but a reservation promised a time after N does; the full refund
 * would put the queue's tail back under it, and the next reservation would
 * get a slot already promised. With only hits behind it (debt <= tau) the
 * refund stays whole, and the accounting exact. */
static void give_back(const tg__call *c, tg__state *st, bool *changed) {
  const tg__token *k = c->tok;
  if (!k || !k->taken || c->arg == 0)
    return;
  uint64_t tat0 = tg__tat(&k->before), tat1 = tg__tat(&k->after);
  uint64_t cur = tg__tat(st);
  uint64_t now1 = k->now_us * 1000;
  uint64_t n = c->now_us * 1000 > now1 ? c->now_us * 1000 : now1;
  uint64_t floor_n = tat0 > n ? tat0 : n;
  if (tat1 <= floor_n)
    return; /* the bucket has refilled past it: nothing left to give */
  uint64_t give = tat1 - floor_n;
  if (c->op == TG__OP_CANCEL || (cur > n && cur - n > c->q.tau_ns)) {
    uint64_t span = tat1 - (tat0 > now1 ? tat0 : now1); /* cost * T */
    if (cur < tat1 || cur - tat1 >= span)
      return;
    uint64_t free_part = span - (cur - tat1);
    if (give > free_part)
      give = free_part;
  }
  uint64_t next = cur > give ? cur - give : 0;
  if (next == cur)
    return;
  *st = tg__tat_state(next);
  *changed = true;
}

/* A CHECK's peek: the numbers of the bucket at debt d, left as it is. */
static void peek(const tg__call *c, uint64_t d, tg_result *p) {
  const tg__quota *q = &c->q;
  tg__result_set(p, d <= q->tau_ns, report(c, d), tokens(q, d), 0,
                 tg__div_ceil(d, NS_PER_MS));
}

/* The debt at the call's now: how far the TAT is ahead of it, ns. */
static uint64_t debt(const tg__call *c, const tg__state *st) {
  uint64_t now = c->now_us * 1000;
  return st->a > now ? st->a - now : 0;
}

/* CHECK, TAKE, RESERVE: a hit (a CHECK reports the consumed state without
 * it being published, and its peek when `with_peek`) accepted up to
 * c->wait_ns late (<= TG__WAIT_MAX_NS: with tau and the TAT bounds every
 * sum stays below 2^64), its delay in o->value. wait_ns is 0 but for a
 * reservation: tg_reserve's RESERVE, or a policy's CHECK and TAKE of a
 * rule that reserves (tg_reserve_rules), which decide alike. d is the debt
 * at now. */
static inline int take(const tg__call *c, tg__state *st, uint64_t d,
                       tg__outcome *o, bool *changed, bool with_peek) {
  const tg__quota *q = &c->q;
  uint64_t now = c->now_us * 1000;
  uint64_t cost = c->arg;
  uint64_t late = c->wait_ns;
  if (with_peek)
    peek(c, d, &o->peek);
  o->value = 0;
  if (cost > q->burst) {
    tg__result_set(&o->r, false, report(c, d), tokens(q, d), TG_NEVER,
                   tg__div_ceil(d, NS_PER_MS));
    return TG_OK;
  }
  uint64_t d2 = d + cost * q->t_ns;
  bool allowed = d2 <= q->tau_ns + late;
  if (allowed && cost > 0) {
    *st = tg__tat_state(now + d2);
    *changed = true;
  }
  if (allowed && d2 > q->tau_ns)
    o->value = d2 - q->tau_ns;
  uint64_t after = allowed ? d2 : d;
  tg__result_set(&o->r, allowed, report(c, after), tokens(q, after),
                 allowed ? 0 : tg__div_ceil(d2 - q->tau_ns - late, NS_PER_MS),
                 tg__div_ceil(after, NS_PER_MS));
  return TG_OK;
}

int tg__gcra_step(const tg__call *c, tg__state *st, tg__outcome *o,
                  bool *changed) {
  const tg__quota *q = &c->q;
  uint64_t now = c->now_us * 1000;
  uint64_t base = tg__tat(st) > now ? tg__tat(st) : now;
  uint64_t d = base - now;
  *changed = false;
  switch (c->op) {
  case TG__OP_HIT: {
    /* kept apart from the policy operations below: a plain decision runs
     * exactly this */
    uint64_t cost = c->arg;
    if (cost > q->burst) {
      tg__result_set(&o->r, false, report(c, d), tokens(q, d), TG_NEVER,
                     tg__div_ceil(d, NS_PER_MS));
      return TG_OK;
    }
    uint64_t d2 = d + cost * q->t_ns;
    bool allowed = d2 <= q->tau_ns;
    if (allowed && cost > 0) {
      *st = tg__tat_state(now + d2);
      *changed = true;
    }
    uint64_t after = allowed ? d2 : d;
    tg__result_set(&o->r, allowed, report(c, after), tokens(q, after),
                   allowed ? 0 : tg__div_ceil(d2 - q->tau_ns, NS_PER_MS),
                   tg__div_ceil(after, NS_PER_MS));
    return TG_OK;
  }
  case TG__OP_CHECK:
  case TG__OP_TAKE:
  case TG__OP_RESERVE:
    return take(c, st, d, o, changed, c->op == TG__OP_CHECK);
  case TG__OP_UNDO:
  case TG__OP_CANCEL:
    give_back(c, st, changed);
    return TG_OK;
  case TG__OP_GET:
    o->value = report(c, d);
    return TG_OK;
  case TG__OP_SET: {
    if (c->arg > q->burst)
      return TG_ERANGE;
    uint64_t fill = c->alg == TG_TOKEN_BUCKET ? q->burst - c->arg : c->arg;
    *st = tg__tat_state(now + fill * q->t_ns);
    *changed = true;
    return TG_OK;
  }
  case TG__OP_EXPIRES:
    o->value = d > 0 ? tg__div_ceil(base, NS_PER_MS) : 0;
    return TG_OK;
  case TG__OP_INC:
  case TG__OP_COUNT_:
    break;
  }
  return TG_ENOTSUP;
}

int tg__gcra_check(const tg__call *c, tg__state *st, tg__outcome *o,
                   bool *changed) {
  *changed = false;
  return take(c, st, debt(c, st), o, changed, false);
}

void tg__gcra_peek(const tg__call *c, const tg__state *st, tg_result *p) {
  peek(c, debt(c, st), p);
}
