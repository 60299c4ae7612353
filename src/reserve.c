/* SPDX-License-Identifier: MIT */
/*
 * reserve.c - reservations (tg_reserve, tg_cancel): a bucket's next slot
 * taken now and a delay answered, instead of a refusal.
 *
 * A reservation is a hit whose tolerance is stretched by max_wait: GCRA's
 * tat' = max(tat, now) + cost * T is accepted while tat' - now <= tau +
 * wait, and the delay is how far past tau it lands (src/core/gcra.c). The
 * receipt of what it consumed (the TAT before and after, the store's
 * incarnation of the key) travels in tg_reservation's private words, so
 * tg_cancel can give back exactly what is still safe to give.
 */
#include "limiter.h"

/* The private words of a tg_reservation. */
enum { P_TAKEN, P_GEN, P_BEFORE, P_AFTER, P_NOW, P_COST, P_COUNT_ };

void tg__reservation_receipt(tg_reservation *out, tg_algorithm alg,
                             const tg__token *tok, uint64_t cost) {
  if (!tok->taken || !tg__op_supported(alg, TG__OP_CANCEL))
    return;
  out->private_[P_TAKEN] = 1;
  out->private_[P_GEN] = tok->gen;
  out->private_[P_BEFORE] = tg__tat(&tok->before);
  out->private_[P_AFTER] = tg__tat(&tok->after);
  out->private_[P_NOW] = tok->now_us;
  out->private_[P_COST] = cost;
}

static int reserve(tg_limiter *lim, const uint64_t *now, const void *key,
                   size_t key_len, const tg_quota *q, uint64_t cost,
                   uint64_t max_wait_ms, tg_reservation *out) {
  if (!out)
    return TG_EINVAL;
  tg__reservation_clear(out);
  int rc = TG_EINVAL;
  tg__call c;
  tg__token tok;
  tg__token_start(&tok);
  tg__outcome o;
  if (lim) /* the call's input first, as tg_reserve_rules checks it */
    rc = tg__limiter_prepare(lim, TG__OP_RESERVE, now, key, key_len, q, cost,
                             &c);
  if (rc == TG_OK && max_wait_ms > TG_PERIOD_MAX_MS)
    rc = TG_EINVAL;
  if (rc == TG_OK) {
    c.wait_ns = max_wait_ms * UINT64_C(1000000);
    c.tok = &tok;
    rc = lim->store->ops->exec(lim->store, &c, &o);
  }
  if (rc == TG_OK) {
    out->result = o.r;
    out->delay_ns = o.r.allowed ? o.value : 0;
    out->delay_ms = tg__div_ceil(out->delay_ns, 1000000);
    tg__reservation_receipt(out, lim->cfg.algorithm, &tok, cost);
  } else {
    tg__limiter_failure(lim, rc, q, &out->result);
  }
  if (lim) {
    bool shadow = lim->shadow;
    if (shadow && out->delay_ns > 0) {
      /* let go at once, saying it would have waited: counted and hooked
       * as a shadow denial (tg__limiter_done) */
      out->result.shadow_denied = true;
      out->delay_ns = out->delay_ms = 0;
    }
    tg__limiter_done(lim, rc, &out->result, shadow, key, key_len, q, cost,
                     false);
  }
  out->ok = out->result.allowed;
  return rc;
}

int tg_reserve(tg_limiter *lim, const void *key, size_t key_len,
               const tg_quota *q, uint64_t cost, uint64_t max_wait_ms,
               tg_reservation *out) {
  return reserve(lim, NULL, key, key_len, q, cost, max_wait_ms, out);
}

int tg_reserve_at(tg_limiter *lim, uint64_t now_us, const void *key,
                  size_t key_len, const tg_quota *q, uint64_t cost,
                  uint64_t max_wait_ms, tg_reservation *out) {
  return reserve(lim, &now_us, key, key_len, q, cost, max_wait_ms, out);
}

static int cancel(tg_limiter *lim, const uint64_t *now, const void *key,
                  size_t key_len, const tg_quota *q, tg_reservation *res) {
  if (!lim || !res)
    return TG_EINVAL;
  tg__call c;
  int rc = tg__limiter_prepare(lim, TG__OP_CANCEL, now, key, key_len, q,
                               res->private_[P_COST], &c);
  if (rc != TG_OK || res->private_[P_TAKEN] != 1)
    return rc;
  tg__token tok = {0};
  tok.taken = true;
  tok.gen = res->private_[P_GEN];
  tok.before = tg__tat_state(res->private_[P_BEFORE]);
  tok.after = tg__tat_state(res->private_[P_AFTER]);
  tok.now_us = res->private_[P_NOW];
  c.tok = &tok;
  tg__outcome o;
  rc = lim->store->ops->exec(lim->store, &c, &o);
  if (rc == TG_OK) {
    res->private_[P_TAKEN] = 0;
    /* what was given back may admit a call a cached denial refuses */
    if (lim->deny)
      tg__deny_cache_forget(lim->deny, key, key_len);
  }
  return rc;
}

int tg_cancel(tg_limiter *lim, const void *key, size_t key_len,
              const tg_quota *q, tg_reservation *res) {
  return cancel(lim, NULL, key, key_len, q, res);
}

int tg_cancel_at(tg_limiter *lim, uint64_t now_us, const void *key,
                 size_t key_len, const tg_quota *q, tg_reservation *res) {
  return cancel(lim, &now_us, key, key_len, q, res);
}

/* A policy's receipts, in reverse order (as a denied policy gives back):
 * every rule that holds one, whatever fails; the first failure's code. */
static int cancel_rules(const uint64_t *now, tg_rule *rules, size_t n,
                        tg_reservation *res) {
  if (!rules || !res || n > TG_RULES_MAX)
    return TG_EINVAL;
  int first = TG_OK;
  for (size_t j = n; j-- > 0;) {
    if (res[j].private_[P_TAKEN] != 1)
      continue; /* nothing consumed there, or nothing a cancel gives back */
    const tg_rule *ru = &rules[j];
    int rc = cancel(ru->lim, now, ru->key, ru->key_len, ru->q, &res[j]);
    if (rc != TG_OK && first == TG_OK)
      first = rc;
  }
  return first;
}

int tg_cancel_rules(tg_rule *rules, size_t n, tg_reservation *res) {
  return cancel_rules(NULL, rules, n, res);
}

int tg_cancel_rules_at(uint64_t now_us, tg_rule *rules, size_t n,
                       tg_reservation *res) {
  return cancel_rules(&now_us, rules, n, res);
}
