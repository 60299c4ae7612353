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

/* ms until the newest entry expires: the log is then empty. */
static uint64_t reset_ms(const tg__log *log, uint64_t period_us,
                         uint64_t now_us) {
  if (log->n == 0)
    return 0;
  return tg__ms_until(tg__log_at(log, log->n - 1)->t_us + period_us, now_us);
}

/* ms until enough of the oldest cost has expired that `need` units are
 * gone; need <= sum. Usually a few entries: need is what the call lacks. */
static uint64_t wait_ms(const tg__log *log, uint64_t need, uint64_t period_us,
                        uint64_t now_us) {
  uint64_t acc = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    const tg__entry *e = tg__log_at(log, i);
    acc += e->cost;
    if (acc >= need)
      return tg__ms_until(e->t_us + period_us, now_us);
  }
  return TG_NEVER; /* unreachable when need <= sum */
}

int tg__log_step(const tg__call *c, tg__log *log, tg__outcome *o,
                 bool *changed) {
  uint64_t now = c->now_us, period = c->q.period_us, limit = c->q.limit;
  *changed = tg__log_prune(log, period, now) > 0;
  uint64_t sum = log->sum;
  switch (c->op) {
  case TG__OP_HIT: {
    uint64_t cost = c->arg;
    bool allowed = cost <= limit && sum <= limit - cost;
    uint64_t retry = 0;
    if (allowed && cost > 0) {
      append(log, now, cost);
      *changed = true;
    } else if (!allowed) {
      retry = cost > limit ? TG_NEVER
                           : wait_ms(log, sum - (limit - cost), period, now);
    }
    uint64_t count = allowed ? sum + cost : sum;
    tg__result_set(&o->r, allowed, count, count < limit ? limit - count : 0,
                   retry, reset_ms(log, period, now));
    return TG_OK;
  }
  case TG__OP_GET:
    o->value = sum;
    return TG_OK;
  case TG__OP_EXPIRES:
    o->value =
        log->n > 0
            ? tg__div_ceil(tg__log_at(log, log->n - 1)->t_us + period, 1000)
            : 0;
    return TG_OK;
  case TG__OP_INC:
  case TG__OP_SET:
  case TG__OP_COUNT_:
    break;
  }
  return TG_ENOTSUP;
}
