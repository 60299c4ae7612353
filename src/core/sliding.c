/* SPDX-License-Identifier: MIT */
/*
 * sliding.c - the sliding-window log as pure steps on a caller-owned array.
 *
 * The log holds the allowed calls of the last period as (t_us, cost), oldest
 * first, times strictly increasing. An entry is live while t + period > now,
 * so a call is allowed iff (sum of live costs) + cost <= limit, which keeps
 * every half-open interval of length period at or below the limit. Denied
 * calls are not recorded (Hammer's Redis backend does the same).
 *
 * Bound: each allowed entry has cost >= 1 and live costs sum to <= limit, so
 * a log never has more than limit entries; tg__log.cap caps it further. Calls
 * in the same microsecond share one entry. At the cap a new entry is merged
 * into the newest, which takes the later time: cost is then kept a little
 * longer than its true age, so the limit still holds and answers can only
 * become more conservative.
 *
 * Everything the log's stores need lives here too: when a log stops
 * mattering (its TTL), and for logs read from outside (a custom store, a
 * shared segment a process died in), whether one is plausible and how to
 * repair one.
 */
#include "core.h"

uint32_t tg__log_prune(tg__log *log, uint64_t period_us, uint64_t now_us) {
  uint32_t k = 0;
  /* expired: t + period <= now, written so it cannot overflow */
  while (log->n > 0 && log->e[log->head].t_us <= now_us &&
         now_us - log->e[log->head].t_us >= period_us) {
    uint64_t cost = log->e[log->head].cost;
    log->sum = log->sum >= cost ? log->sum - cost : 0;
    log->head = log->head + 1 == log->cap ? 0 : log->head + 1;
    log->n--;
    k++;
  }
  return k;
}

/* Appends cost at now, never moving time backwards, merging as documented
 * above. */
static void append(tg__log *log, uint64_t now_us, uint64_t cost) {
  if (!tg__add(log->sum, cost, &log->sum))
    log->sum = UINT64_MAX; /* only a corrupt log gets here */
  if (log->n > 0) {
    tg__entry *last = tg__log_at(log, log->n - 1);
    if (last->t_us >= now_us || log->n >= log->cap) {
      if (now_us > last->t_us)
        last->t_us = now_us;
      last->cost += cost;
      return;
    }
  }
  tg__entry *e = tg__log_at(log, log->n);
  e->t_us = now_us;
  e->cost = cost;
  log->n++;
}

/* The time of the entry a denied call waits for: the oldest entries whose
 * costs add up to `need` (<= sum) must expire first. Usually a few entries:
 * need is what the call lacks. False only for a log whose sum is wrong. */
static bool wait_entry(const tg__log *log, uint64_t need, uint64_t *t_us) {
  uint64_t acc = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    const tg__entry *e = tg__log_at(log, i);
    acc += e->cost;
    if (acc >= need) {
      *t_us = e->t_us;
      return true;
    }
  }
  return false;
}

bool tg__log_allows(const tg__call *c, uint64_t sum) {
  return c->arg <= c->q.limit && sum <= c->q.limit - c->arg;
}

int tg__log_report(const tg__call *c, const tg__log_view *v, tg__outcome *o) {
  uint64_t now = c->now_us, period = c->q.period_us, limit = c->q.limit;
  switch (c->op) {
  case TG__OP_HIT:
  case TG__OP_TAKE:
  case TG__OP_CHECK: {
    uint64_t cost = c->arg;
    bool allowed = tg__log_allows(c, v->sum);
    uint64_t retry = 0;
    if (!allowed)
      retry = cost <= limit && v->has_wait
                  ? tg__ms_until(v->wait_us + period, now)
                  : TG_NEVER;
    uint64_t count = allowed ? v->sum + cost : v->sum;
    bool has_newest = v->has_newest;
    uint64_t newest = v->newest_us;
    if (c->op == TG__OP_CHECK) {
      /* the view is of the log before the call: report it as the peek,
       * and the result as if the cost had been appended (at now, or
       * merged into a newer entry) */
      uint64_t r0 = has_newest ? tg__ms_until(newest + period, now) : 0;
      tg__result_set(&o->peek, v->sum <= limit, v->sum,
                     v->sum < limit ? limit - v->sum : 0, 0, r0);
      if (allowed && cost > 0) {
        newest = has_newest && newest > now ? newest : now;
        has_newest = true;
      }
    }
    uint64_t reset = has_newest ? tg__ms_until(newest + period, now) : 0;
    tg__result_set(&o->r, allowed, count, count < limit ? limit - count : 0,
                   retry, reset);
    return TG_OK;
  }
  case TG__OP_GET:
    o->value = v->sum;
    return TG_OK;
  case TG__OP_EXPIRES:
    o->value = v->has_newest ? tg__div_ceil(v->newest_us + period, 1000) : 0;
    return TG_OK;
  case TG__OP_INC:
  case TG__OP_SET:
  case TG__OP_RESERVE:
  case TG__OP_UNDO:
  case TG__OP_CANCEL:
  case TG__OP_COUNT_:
    break;
  }
  return TG_ENOTSUP;
}

int tg__log_check(const tg__call *c, const tg__log *log, tg__log_view *v) {
  /* a copy of the ring's bookkeeping: pruning it moves head, n and sum of
   * the copy only, never an entry */
  tg__log lg = *log;
  tg__log_prune(&lg, c->q.period_us, c->now_us);
  *v = (tg__log_view){lg.sum, false, 0, false, 0};
  uint64_t cost = c->arg, limit = c->q.limit;
  if (!tg__log_allows(c, v->sum) && cost <= limit)
    v->has_wait = wait_entry(&lg, v->sum - (limit - cost), &v->wait_us);
  if (lg.n > 0) {
    v->has_newest = true;
    v->newest_us = tg__log_at(&lg, lg.n - 1)->t_us;
  }
  return TG_OK;
}

bool tg__log_undo(tg__log *log, uint64_t entry_us, uint64_t cost,
                  uint64_t period_us, uint64_t now_us) {
  /* the cost sits in the first entry at or after entry_us: a merge only
   * ever moves the newest entry's time forward, and entries after it were
   * appended later */
  uint32_t i = log->n;
  while (i > 0 && tg__log_at(log, i - 1)->t_us >= entry_us)
    i--;
  if (i == log->n || cost == 0)
    return false; /* expired and pruned: nothing counts it any more */
  tg__entry *e = tg__log_at(log, i);
  bool expired = now_us >= entry_us && now_us - entry_us >= period_us;
  if (e->t_us != entry_us && expired)
    return false; /* ours expired; this later entry may be another call's */
  uint64_t take = e->cost < cost ? e->cost : cost;
  e->cost -= take;
  log->sum = log->sum >= take ? log->sum - take : 0;
  if (e->cost == 0) {
    /* remove it: later entries move down one place (usually none) */
    for (uint32_t j = i; j + 1 < log->n; j++)
      *tg__log_at(log, j) = *tg__log_at(log, j + 1);
    log->n--;
  }
  return true;
}

int tg__log_decide(const tg__call *c, tg__log *log, tg__log_view *v,
                   bool *changed) {
  *changed = false;
  if (c->op != TG__OP_HIT && c->op != TG__OP_GET && c->op != TG__OP_EXPIRES &&
      c->op != TG__OP_TAKE)
    return TG_ENOTSUP;
  *changed = tg__log_prune(log, c->q.period_us, c->now_us) > 0;
  *v = (tg__log_view){log->sum, false, 0, false, 0};
  if (c->op == TG__OP_HIT || c->op == TG__OP_TAKE) {
    uint64_t cost = c->arg, limit = c->q.limit;
    if (tg__log_allows(c, v->sum)) {
      if (cost > 0) {
        append(log, c->now_us, cost);
        *changed = true;
      }
    } else if (cost <= limit) {
      v->has_wait = wait_entry(log, v->sum - (limit - cost), &v->wait_us);
    }
  }
  if (log->n > 0) {
    v->has_newest = true;
    v->newest_us = tg__log_at(log, log->n - 1)->t_us;
  }
  return TG_OK;
}

int tg__log_step(const tg__call *c, tg__log *log, tg__outcome *o,
                 bool *changed) {
  tg__log_view v;
  int rc = tg__log_decide(c, log, &v, changed);
  return rc != TG_OK ? rc : tg__log_report(c, &v, o);
}

uint64_t tg__log_expiry_us(const tg__log *log, uint64_t period_us) {
  return log->n ? tg__log_at(log, log->n - 1)->t_us + period_us : 0;
}

uint64_t tg__log_ttl_ms(const tg__log *log, uint64_t period_us,
                        uint64_t now_us) {
  return log->n ? tg__ms_until(tg__log_expiry_us(log, period_us), now_us) : 0;
}

/* ---- logs read from outside: plausibility and repair ---- */

/* Runs on every decision of a shared table's sliding key (its bytes may
 * have been written by anyone), so it is one pass over the ring's two
 * contiguous runs, without a branch per entry: "strictly increasing" is
 * "at least the previous time + 1", and an overflowing sum is one that
 * came out smaller than before. */
static bool run_plausible(const tg__entry *e, uint32_t len, uint64_t *lo,
                          uint64_t *sum) {
  bool bad = false;
  uint64_t l = *lo, s = *sum;
  for (uint32_t i = 0; i < len; i++) {
    uint64_t t = e[i].t_us, next = s + e[i].cost;
    bad |= (t < l) | (t > TG_NOW_MAX_US) | (next < s);
    s = next;
    l = t + 1; /* t <= TG_NOW_MAX_US when it counts: no wrap that matters */
  }
  *lo = l;
  *sum = s;
  return !bad;
}

bool tg__log_plausible(const tg__log *log) {
  if (log->cap == 0 || log->head >= log->cap || log->n > log->cap)
    return false;
  uint32_t first = log->cap - log->head;
  if (first > log->n)
    first = log->n;
  uint64_t lo = 0, sum = 0;
  bool ok = run_plausible(log->e + log->head, first, &lo, &sum);
  ok &= run_plausible(log->e, log->n - first, &lo, &sum);
  return ok && sum == log->sum;
}

bool tg__log_sound_where_read(const tg__log *log, uint64_t period_us,
                              uint64_t now_us) {
  if (log->cap == 0 || log->head >= log->cap || log->n > log->cap)
    return false;
  if (log->n == 0)
    return log->sum == 0;
  const tg__entry *newest = tg__log_at(log, log->n - 1);
  uint64_t last = newest->t_us;
  if (last > TG_NOW_MAX_US || newest->cost > log->sum)
    return false;
  /* from the oldest: every entry this call expires, then the first it
   * keeps, in strictly increasing time up to the newest, their costs
   * within the sum (the newest's too) */
  uint64_t lo = 0, acc = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    const tg__entry *e = tg__log_at(log, i);
    uint64_t t = e->t_us;
    if (t < lo || t > last || !tg__add(acc, e->cost, &acc) || acc > log->sum)
      return false;
    if (t > now_us || now_us - t < period_us) /* kept: the last one read */
      return i + 1 == log->n || acc <= log->sum - newest->cost;
    lo = t + 1;
  }
  return acc == log->sum; /* every entry expires: all of them were read */
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
  /* A step on a full ring that expired its oldest entry writes the new
   * one into that slot before the header that moves head past it: a death
   * in between leaves the newest entry at head, every live one after it.
   * Read from the slot after head, the ring is in order again (the newest
   * last; the expired entries go at the next prune): the filter below,
   * reading from head, would keep the newest alone and drop every live
   * entry (a key then admits its limit again within the period). */
  if (log->n == log->cap && log->n > 1 &&
      tg__log_at(log, 0)->t_us > tg__log_at(log, 1)->t_us) {
    tg__log from = *log;
    from.head = log->head + 1 == log->cap ? 0 : log->head + 1;
    bool ordered = true;
    for (uint32_t i = 1; i < from.n && ordered; i++)
      ordered = tg__log_at(&from, i)->t_us > tg__log_at(&from, i - 1)->t_us;
    if (ordered)
      log->head = from.head;
  }
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
