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
 * a log never has more than limit entries; tg__log.max caps it further. Calls
 * in the same microsecond share one entry. At the cap a new entry is merged
 * into the newest, which takes the later time: cost is then kept a little
 * longer than its true age, so the limit still holds and answers can only
 * become more conservative.
 */
#include "core.h"

#include <string.h>

uint32_t tg__log_prune(tg__log *log, uint64_t period_us, uint64_t now_us) {
  uint32_t k = 0;
  /* t + period <= now, written so it cannot overflow */
  while (k < log->n && log->e[k].t_us <= now_us &&
         now_us - log->e[k].t_us >= period_us)
    k++;
  if (k > 0) {
    memmove(log->e, log->e + k, (size_t)(log->n - k) * sizeof *log->e);
    log->n -= k;
  }
  return k;
}

/* Appends cost at now, never moving time backwards, merging as documented
 * above. The caller guarantees room >= min(n + 1, max). */
static void append(tg__log *log, uint64_t now_us, uint64_t cost) {
  if (log->n > 0) {
    tg__entry *last = &log->e[log->n - 1];
    if (last->t_us >= now_us || log->n >= log->max) {
      if (now_us > last->t_us)
        last->t_us = now_us;
      last->cost += cost;
      return;
    }
  }
  log->e[log->n].t_us = now_us;
  log->e[log->n].cost = cost;
  log->n++;
}

/* Sum of the live costs, saturating (it is at most the largest limit ever
 * used with the key, so saturation only guards against corrupt input). */
static uint64_t live_sum(const tg__log *log) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < log->n; i++)
    if (!tg__add(sum, log->e[i].cost, &sum))
      return UINT64_MAX;
  return sum;
}

/* ms until the newest entry expires: the log is then empty. */
static uint64_t reset_ms(const tg__log *log, uint64_t period_us,
                         uint64_t now_us) {
  if (log->n == 0)
    return 0;
  return tg__ms_until(log->e[log->n - 1].t_us + period_us, now_us);
}

/* ms until enough of the oldest cost has expired that `need` units are
 * gone. need <= live sum. */
static uint64_t wait_ms(const tg__log *log, uint64_t need, uint64_t period_us,
                        uint64_t now_us) {
  uint64_t acc = 0;
  for (uint32_t i = 0; i < log->n; i++) {
    acc += log->e[i].cost;
    if (acc >= need)
      return tg__ms_until(log->e[i].t_us + period_us, now_us);
  }
  return TG_NEVER; /* unreachable when need <= live sum */
}

int tg__log_step(const tg__call *c, tg__log *log, tg__outcome *o,
                 bool *changed) {
  uint64_t now = c->now_us, period = c->q.period_us, limit = c->q.limit;
  *changed = tg__log_prune(log, period, now) > 0;
  uint64_t sum = live_sum(log);
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
    o->value = log->n > 0 ? tg__div_ceil(log->e[log->n - 1].t_us + period, 1000)
                          : 0;
    return TG_OK;
  case TG__OP_INC:
  case TG__OP_SET:
  case TG__OP_COUNT_:
    break;
  }
  return TG_ENOTSUP;
}
