/* SPDX-License-Identifier: MIT */
/*
 * limiter.h - the limiter's insides (tollgate.c) that the policy code
 * (rules.c), the reservations (reserve.c) and the non-blocking API (nb.c)
 * share: the handle itself, the validation every call goes through, the
 * deny cache, the failure policy's answer (the local fallback's included),
 * and the bookkeeping after a decision (counters, shadow mode, the hook).
 * The non-blocking API keeps only its connections for itself, so a decision
 * made through it is the one tg_hit would make.
 */
#ifndef TG_LIMITER_H
#define TG_LIMITER_H

#include "cleanup.h"
#include "core/core.h"
#include "deny_cache.h"
#include "stats.h"
#include "store/store.h"

struct tg_limiter {
  tg_config cfg;           /* copied at creation (cfg.redis and
                              cfg.custom_store are then NULL: the store
                              copied what it needs) */
  bool store_time;         /* the store reads its own clock (Redis TIME):
                              its TG__STORE_OWN_CLOCK, cached here */
  tg__store *store;        /* owned */
  tg__cleaner *cleaner;    /* owned; NULL when no thread runs */
  tg__clean_bridge bridge; /* before_clean as the cleaning pass calls it */
  tg__stats *stats;        /* owned: the counters */
  bool shadow;             /* cfg.shadow, and */
  bool hook;               /* cfg.on_decision != NULL, kept beside stats so
                              a decision reads one cache line of the handle */
  bool quiet;              /* neither: a decision's bookkeeping is one
                              counter (the one flag its fast path tests) */
  bool ident_ok;           /* the store can decide policies: */
  uint64_t group[2];       /* its ops->ident, asked once at creation */
  uint64_t space[2];
  bool plain_rules;     /* quiet, no deny cache, ident_ok, and a store that
                           runs the policy protocol through exec_policy
                           (the tables): what a policy of rules all on
                           this limiter needs to know, in one flag
                           (rules.c, two_quick) */
  tg__store *fallback;  /* TG_POLICY_FALLBACK: the local memory store
                           that decides while the store fails; owned */
  tg__deny_cache *deny; /* deny_cache_entries > 0; owned */
};

/* The last bucket quota the calling thread prepared, and its preparation:
 * a bucket's quota costs a division (the emission interval) to prepare,
 * and a program passes the same few quotas again and again. One entry per
 * thread, so nothing is shared; the zero entry names no bucket. */
typedef struct tg__quota_memo {
  tg_quota q;
  tg_algorithm alg;
  tg__quota p;
} tg__quota_memo;
extern _Thread_local tg__quota_memo tg__memo TG__TLS_FAST;

/* *d = *s, a word at a time: written as a struct copy, gcc 12 made it a
 * `rep movsl` inside a policy's per-rule loop (a quarter of hit_rules' time
 * on a two-rule policy, perf); plain moves cost a few cycles. */
static inline void tg__quota_copy(tg__quota *d, const tg__quota *s) {
  d->limit = s->limit;
  d->period_us = s->period_us;
  d->burst = s->burst;
  d->t_ns = s->t_ns;
  d->tau_ns = s->tau_ns;
}
_Static_assert(sizeof(tg__quota) == 5 * sizeof(uint64_t),
               "tg__quota_copy copies five fields");

/* tg__call_check with the memo: the same checks in the same order and the
 * same prepared quota, a bucket quota equal to the last one copied instead
 * of prepared again, any other one prepared inline. */
static inline int tg__limiter_check(tg_algorithm alg, tg__op op, size_t key_len,
                                    const tg_quota *q, tg__quota *prepared) {
  if (alg != TG_TOKEN_BUCKET && alg != TG_LEAKY_BUCKET) {
    int rc = tg__call_checks_key_op(alg, op, key_len);
    return rc != TG_OK ? rc : tg__quota_prepare_common(prepared, q);
  }
  int rc = tg__call_checks_key_op(alg, op, key_len);
  if (rc != TG_OK)
    return rc;
  tg__quota_memo *m = &tg__memo;
  if (m->alg == alg && m->q.limit == q->limit &&
      m->q.period_ms == q->period_ms && m->q.burst == q->burst) {
    tg__quota_copy(prepared, &m->p);
    return TG_OK;
  }
  rc = tg__quota_prepare(prepared, q, alg);
  if (rc == TG_OK) {
    m->q = *q;
    m->alg = alg;
    tg__quota_copy(&m->p, prepared);
  }
  return rc;
}

/* Everything every operation checks, in the order the header documents,
 * and the call built from it. now is NULL to read the limiter's clock
 * (once), or, for a store with its own clock, to let the store read it.
 * Inline: every decision, and every rule of a policy, runs it. */
static inline int tg__limiter_prepare(const tg_limiter *lim, tg__op op,
                                      const uint64_t *now, const void *key,
                                      size_t key_len, const tg_quota *q,
                                      uint64_t arg, tg__call *c) {
  if (!lim || !key || !q)
    return TG_EINVAL;
  int rc = tg__limiter_check(lim->cfg.algorithm, op, key_len, q, &c->q);
  if (rc != TG_OK)
    return rc;
  c->store_time = !now && lim->store_time;
  uint64_t now_us = 0;
  if (now)
    now_us = *now;
  else if (!c->store_time)
    now_us = lim->cfg.clock(lim->cfg.clock_ctx);
  if (now_us > TG_NOW_MAX_US)
    return TG_ETIME;
  c->op = op;
  c->alg = lim->cfg.algorithm;
  c->key = key;
  c->key_len = key_len;
  c->arg = arg;
  c->now_us = now_us;
  c->wait_ns = 0;
  c->tok = NULL;
  return TG_OK;
}

/* *r = (tg_reservation){0}, a field at a time: gcc 12 compiles the
 * struct assignment to a `rep stos`: with the token's (tg__token_start),
 * a quarter of a reservation's time (BENCHMARKS.md). */
static inline void tg__reservation_clear(tg_reservation *r) {
  r->ok = false;
  r->delay_ns = r->delay_ms = 0;
  r->result.allowed = r->result.degraded = r->result.shadow_denied = false;
  r->result.count = r->result.remaining = 0;
  r->result.retry_after_ms = r->result.reset_after_ms = 0;
  for (size_t i = 0; i < sizeof r->private_ / sizeof r->private_[0]; i++)
    r->private_[i] = 0;
}

/* Fills the private words of *out, tg_cancel's receipt, from what a
 * reservation (or a policy's TAKE) consumed: tok's record of it, when
 * something was consumed on an algorithm tg_cancel gives back (the
 * buckets); *out is left as it is otherwise (reserve.c). */
void tg__reservation_receipt(tg_reservation *out, tg_algorithm alg,
                             const tg__token *tok, uint64_t cost);

/* True for the codes a store fails with (the failure policy answers). */
bool tg__store_failure(int rc);

/* True for the codes of input a call could not run with (the caller's:
 * arguments, key, quota, time, an operation or value the algorithm does
 * not take), which shadow mode never answers allowed. */
static inline bool tg__input_error(int rc) {
  return rc == TG_EINVAL || rc == TG_EKEY || rc == TG_EQUOTA ||
         rc == TG_ENOTSUP || rc == TG_ERANGE || rc == TG_ETIME;
}

/* The result written when a call fails: the policy's answer for a store
 * failure, "not allowed, never" for invalid input. */
void tg__limiter_failure(const tg_limiter *lim, int rc, const tg_quota *q,
                         tg_result *out);

/* ---- for the non-blocking API (nb.c) ---- */

/* A policy refused before it was decided (rules.c), as tg_hit_rules
 * refuses one: every rule's result and the answer are rule at's failure
 * answer, counted on rule at's limiter when count is set (invalid input,
 * a misfit). Returns rc. */
int tg__rules_refuse(tg_rule *rules, size_t n, size_t at, int rc, bool count,
                     tg_rules_result *out);

/* A policy's answer (rules.c) from a store that decided it by itself
 * (exec_rules' outputs: rc, the failing rule, passed, each rule's CHECK
 * outcome): every rule's status and result, the policy's, the counters
 * and hooks, as tg_hit_rules gives them. Returns rc. A policy of
 * reservations (tg_reserve_rules) gives each rule's wait (wait_ms, else
 * NULL) and gets each rule's delay in delays[0..n) (0 unless it passed
 * late), then its answer from tg__rules_reserved with the largest. */
int tg__rules_answer(tg_rule *rules, size_t n, unsigned flags, int rc,
                     size_t failed, bool passed, const tg__outcome *o,
                     const uint64_t *wait_ms, uint64_t *delays,
                     tg_rules_result *out);

/* out (its rules set) completed as tg_reserve_rules answers: ok, the
 * call's delay (delay_ns, the largest rule's), shadow mode's. */
void tg__rules_reserved(unsigned flags, uint64_t delay_ns,
                        tg_rules_reservation *out);

/* A rule's wait, in ms (in ns when ns is set: TG_RULES_WAIT_NS),
 * validated as tg_reserve_rules validates max_wait_ms[i] (TG_EINVAL above
 * TG_PERIOD_MAX_MS, TG_ENOTSUP above 0 on an algorithm that does not
 * reserve), into c->wait_ns. */
int tg__rules_wait(const tg_limiter *lim, uint64_t wait, bool ns, tg__call *c);

/* A limiter without a store (its policy, fallback, deny cache and counters
 * only): what tg_limiter_new would check and build, but no connection.
 * Only the functions below may be used on it, and tg_limiter_destroy. */
int tg__limiter_shell_new(tg_limiter **out, const tg_config *cfg);

/* The moment a call is made, in the deny cache's timeline for it (this
 * host's monotonic clock for calls on the store's clock, else the call's
 * now); 0 without a cache. */
uint64_t tg__limiter_when(const tg_limiter *lim, const tg__call *c);

/* True when the deny cache answers hit c: *out is then its final answer
 * (counted, shadow mode and the hook applied, as tg_hit's). */
bool tg__limiter_cached(tg_limiter *lim, const tg__call *c, uint64_t when,
                        const tg_quota *q, tg_result *out);

/* The final answer to hit c (made at `when`) from the store's rc and
 * outcome: the outcome's result, remembered by the deny cache; or for a
 * failure the policy's answer (the fallback's decision included); then
 * counted, with shadow mode and the hook, as tg_hit's. Returns rc. */
int tg__limiter_answer(tg_limiter *lim, const tg__call *c, const tg_quota *q,
                       uint64_t when, int rc, const tg__outcome *o,
                       tg_result *out);

/* The final answer to a hit refused before it was built (invalid input
 * rc, key and q as given), as tg_hit's. */
void tg__limiter_invalid(tg_limiter *lim, int rc, const void *key,
                         size_t key_len, const tg_quota *q, uint64_t cost,
                         tg_result *out);

/* The limiter's counters: the shards', and its store's own (Redis). */
void tg__limiter_stats_read(const tg_limiter *lim, tg_stats *st);

/* What a decision reports to the bookkeeping. */
typedef struct tg__decided {
  const void *key;
  size_t key_len;
  const tg_quota *q;
  uint64_t cost;
  bool in_rules;
} tg__decided;

/* Calls the hook for a decision (not inlined: only when one is set). */
void tg__limiter_hook(tg_limiter *lim, tg__shard *sh, bool own, int rc,
                      const tg_result *r, bool real_allowed,
                      const tg__decided *d);

/* tg__limiter_done for everything but a plain answer without shadow mode
 * or hook (not inlined). */
void tg__limiter_done_slow(tg_limiter *lim, int rc, tg_result *r, bool shadow,
                           const tg__decided *d);

/* After a decision: counts its real answer *r (and rc), turns *r into
 * shadow mode's answer when the limiter is in shadow mode or the call asks
 * for it (`shadow`: a policy's TG_RULES_SHADOW), then calls the hook if one
 * is set. Shadow mode answers decisions, store failures and errors the
 * state caused (TG_EOVERFLOW), never invalid input (tg__input_error: that
 * answer stays "not allowed, never"). A result already marked
 * shadow_denied while allowed (a shadow reservation let go at once that
 * would have waited) counts, and is hooked, as a shadow denial. Inline, for its
 * common case: an answer (no failure), no shadow mode, no hook tests one flag
 * and costs one counter in the thread's own shard (the decision's description
 * is built only for the slow path). */
static inline void tg__limiter_done(tg_limiter *lim, int rc, tg_result *r,
                                    bool shadow, const void *key,
                                    size_t key_len, const tg_quota *q,
                                    uint64_t cost, bool in_rules) {
  if (__builtin_expect(rc == TG_OK && !shadow && lim->quiet, 1)) {
    tg__count_one(lim->stats, r->allowed ? TG__N_ALLOWED : TG__N_DENIED);
    return;
  }
  tg__decided d = {key, key_len, q, cost, in_rules};
  tg__limiter_done_slow(lim, rc, r, shadow || lim->shadow, &d);
}

/* The whole of it (see tg__limiter_done). */
static inline void tg__limiter_done_all(tg_limiter *lim, int rc, tg_result *r,
                                        bool shadow, const tg__decided *d) {
  bool own;
  tg__shard *sh = tg__shard_get(lim->stats, &own);
  bool real = r->allowed && !r->shadow_denied;
  if (tg__input_error(rc))
    shadow = false; /* invalid input is refused, in shadow mode too */
  if (rc == TG_OK) {
    tg__count(sh, own,
              real     ? TG__N_ALLOWED
              : shadow ? TG__N_SHADOW
                       : TG__N_DENIED);
  } else {
    tg__count(sh, own, TG__N_ERR0 + ((unsigned)-rc & 31u));
    if (r->degraded)
      tg__count(sh, own, TG__N_DEGRADED);
    if (rc == TG_EFULL)
      tg__count(sh, own, TG__N_FULL);
    if (shadow && !real)
      tg__count(sh, own, TG__N_SHADOW);
  }
  if (shadow && !real) {
    r->allowed = true;
    r->shadow_denied = true;
  }
  if (lim->cfg.on_decision)
    tg__limiter_hook(lim, sh, own, rc, r, real, d);
}

#endif /* TG_LIMITER_H */
