/* SPDX-License-Identifier: MIT */
/*
 * rules.c - policies: one decision on several rules (tg_hit_rules).
 *
 * A decision checks every rule, then consumes in all of them or in none.
 * How that is made atomic is the store's business when it can lock what it
 * holds (a custom store locks every key; Redis runs one script): its
 * exec_rules does the whole decision. The table stores (memory, shm) are
 * lock-free and must stay so (a process dying in a policy must not leave a
 * lock behind), so for them this file runs an optimistic protocol on the
 * store's own operations (docs/DESIGN.md, "Policies"):
 *
 *   1. CHECK every rule: what it would answer, nothing written, and the
 *      state seen recorded in the rule's token;
 *   2. if a rule that is not in shadow mode denies: the answer is denied,
 *      nothing was written;
 *   3. else TAKE each rule in order (a compare-and-swap from the state the
 *      check saw; a changed state is checked again, by the store, on the
 *      spot); a rule that now denies makes the call denied: the rules taken
 *      are given back (UNDO) in reverse order.
 *
 * A store may take the last rule at once instead of checking it when the
 * others allowed (the table does: one step instead of two); a CHECK may
 * leave the key's numbers for a denied answer (the peek) to be computed
 * here, when the call is denied (store.h, exec_policy).
 *
 * Everything else (validation, grouping the stores, shadow mode, the
 * answer, the counters) is the same for every store.
 */
#include "limiter.h"

#include <string.h>

/* What the rules became in this decision, as arrays, so that a store can
 * run the protocol in one call (exec_policy). */
typedef struct policy_run {
  tg__store *stores[TG_RULES_MAX];
  tg__call c[TG_RULES_MAX];
  tg__token tok[TG_RULES_MAX];
  tg__outcome o[TG_RULES_MAX];    /* CHECK's answers, then each rule's */
  tg__outcome took[TG_RULES_MAX]; /* TAKE's, when it stepped again */
  uint32_t shadow; /* bit i: rule i's denial does not deny the call */
  uint32_t taken;  /* bit i: consumed (and, until the end, maybe to give
                      back) */
  bool reserves;   /* a policy of reservations (tg_reserve_rules) */
} policy_run;

/* Two rules' keys are the same bytes. Keys of one policy in one table
 * usually share a prefix and differ in an id at the end ("user:42",
 * "user:43"), so the last word is compared first, inline. */
static inline bool same_key(const tg_rule *a, const tg_rule *b) {
  size_t n = a->key_len;
  if (n != b->key_len)
    return false;
  if (n >= 8) {
    uint64_t x, y;
    memcpy(&x, (const char *)a->key + n - 8, 8);
    memcpy(&y, (const char *)b->key + n - 8, 8);
    if (x != y)
      return false;
  }
  return memcmp(a->key, b->key, n) == 0;
}

/* Rule i may be decided with rules[0..i): its store is of rules[0]'s kind
 * and group (each limiter asked its store once, at creation), and it names
 * no state an earlier rule names (same space, same key). */
static inline bool store_fits(const tg_rule *rules, size_t i) {
  const tg_limiter *l = rules[i].lim, *l0 = rules[0].lim;
  if (!l->ident_ok ||
      (l != l0 && (l->store->ops != l0->store->ops ||
                   l->group[0] != l0->group[0] || l->group[1] != l0->group[1])))
    return false;
  for (size_t j = 0; j < i; j++) {
    const tg_limiter *lj = rules[j].lim;
    if ((lj == l ||
         (lj->space[0] == l->space[0] && lj->space[1] == l->space[1])) &&
        same_key(&rules[i], &rules[j]))
      return false;
  }
  return true;
}

/* Gives back the rules that were taken, in reverse order. The time to
 * give back at: for calls on a clock, the clock again (later calls on the
 * key may have read a later time, and a bucket's refund must not undercut
 * it, see gcra.c); for the _at function, the call's own now. A policy of
 * reservations gives its buckets back as tg_cancel does (CANCEL): other
 * callers' reservations queued behind one since were promised their
 * times, and the full refund of an UNDO would hand their slots out again;
 * a CANCEL gives back only what none of them is scheduled behind. Best
 * effort: a store that fails here leaves that consumption (the call is
 * answered denied all the same, which can only be stricter). */
static void give_back(tg_rule *rules, policy_run *pr, size_t n, bool at) {
  for (size_t j = n; j-- > 0;) {
    if (!(pr->taken >> j & 1u))
      continue;
    tg__call u = pr->c[j];
    u.op = pr->reserves && tg__op_supported(u.alg, TG__OP_CANCEL)
               ? TG__OP_CANCEL
               : TG__OP_UNDO;
    tg_limiter *lim = rules[j].lim;
    if (!at && !u.store_time) {
      uint64_t t = lim->cfg.clock(lim->cfg.clock_ctx);
      if (t > u.now_us && t <= TG_NOW_MAX_US)
        u.now_us = t;
    }
    tg__outcome o;
    (void)lim->store->ops->exec(lim->store, &u, &o);
    pr->taken &= ~(1u << j);
  }
}

/* exec_policy (see store.h) for a store without it, over exec (every rule
 * checked, none taken at once). */
static int exec_policy(policy_run *pr, size_t n, tg__policy_marks *pm) {
  const tg__store_ops *ops = pr->stores[0]->ops;
  uint32_t ok = 0;
  int rc;
  for (size_t i = 0; i < n; i++) {
    rc = ops->exec(pr->stores[i], &pr->c[i], &pr->o[i]);
    if (rc != TG_OK) {
      pm->at = i;
      return rc;
    }
    ok |= (uint32_t)pr->o[i].r.allowed << i;
  }
  pm->allowed = ok;
  pm->at = n;
  if ((uint32_t)((UINT64_C(1) << n) - 1) & ~ok & ~pr->shadow)
    return TG_OK;
  for (size_t i = 0; i < n; i++) {
    if (!(ok >> i & 1u))
      continue;
    pr->c[i].op = TG__OP_TAKE;
    rc = ops->exec(pr->stores[i], &pr->c[i], &pr->took[i]);
    pm->taken |= (uint32_t)pr->tok[i].taken << i;
    bool reused = pr->tok[i].reused;
    if (!reused)
      pm->stepped |= 1u << i;
    if (rc != TG_OK ||
        (!reused && !(pr->shadow >> i & 1u) && !pr->took[i].r.allowed)) {
      pm->at = i;
      return rc;
    }
  }
  return TG_OK;
}

/* The optimistic protocol (see the top of the file) for stores without
 * exec_rules. Fills pr->o[i] as CHECK would, then, when the call passed,
 * each taken rule's o[i].r with its TAKE's answer. */
static inline __attribute__((always_inline)) int
optimistic(tg_rule *rules, policy_run *pr, size_t n, bool at, bool *passed,
           size_t *failed) {
  tg__policy_marks pm = {0, 0, 0, 0};
  int (*each)(tg__store *const *, tg__call *, size_t, uint32_t, tg__outcome *,
              tg__outcome *, tg__policy_marks *) =
      pr->stores[0]->ops->exec_policy;
  int rc = each ? each(pr->stores, pr->c, n, pr->shadow, pr->o, pr->took, &pm)
                : exec_policy(pr, n, &pm);
  *passed = false;
  size_t k = pm.at;
  if (rc == TG_OK &&
      ((uint32_t)((UINT64_C(1) << n) - 1) & ~pm.allowed & ~pr->shadow))
    return TG_OK; /* a rule not in shadow mode denied: nothing was written */
  pr->taken = pm.taken;
  /* a rule whose TAKE stepped again answers with it (but rule k, where the
   * store stopped: see below); a shadow rule that turned to deny consumed
   * nothing: it keeps its CHECK answer's verdict as what it says */
  for (uint32_t m = pm.stepped & ~(k < n ? 1u << k : 0u); m; m &= m - 1) {
    size_t i = (size_t)__builtin_ctz(m);
    if (pr->took[i].r.allowed) {
      pr->o[i].r = pr->took[i].r;
      pr->o[i].value = pr->took[i].value; /* a reservation's delay */
    } else
      pr->o[i].r.allowed = false;
  }
  if (rc != TG_OK) {
    give_back(rules, pr, n, at);
    *failed = k;
    return rc;
  }
  if (k < n) {
    /* lost a race: rule k denies now (consuming nothing). Give the others
     * back; the call is denied by this rule, as its TAKE saw it. */
    give_back(rules, pr, n, at);
    pr->o[k].r = pr->took[k].r;
    pr->o[k].peek = pr->took[k].r;
    pr->tok[k].peek_owed = false;
    return TG_OK;
  }
  *passed = true;
  return TG_OK;
}

/* The answer of a rule in a call that did not pass: its own verdict and
 * wait, the key's numbers as the call left them. */
static tg_result unpassed(const tg__outcome *o) {
  tg_result r = o->peek;
  r.allowed = o->r.allowed;
  r.retry_after_ms = o->r.allowed ? 0 : o->r.retry_after_ms;
  r.degraded = false;
  r.shadow_denied = false;
  return r;
}

/* The policy's answer from its rules' real answers, a rule at a time (each
 * added before its bookkeeping may turn it into shadow mode's answer). */
static void summary_start(tg_rules_result *out, bool passed) {
  /* field by field: gcc 12 compiles `= (tg_result){0}` to a `rep stos`,
   * whose start-up cost was 5 % of a two-rule policy (about 6 ns, an
   * interleaved A/B, BENCHMARKS.md) */
  tg_result *r = &out->r;
  r->allowed = passed;
  r->degraded = false;
  r->shadow_denied = false;
  r->count = 0;
  r->remaining = UINT64_MAX;
  r->retry_after_ms = 0;
  r->reset_after_ms = 0;
  out->denied_by = TG_RULE_NONE;
  out->tightest = 0;
}

static inline void summary_add(tg_rules_result *out, size_t i,
                               const tg_result *x) {
  tg_result *r = &out->r;
  bool denied = !x->allowed || x->shadow_denied;
  if (denied) {
    if (out->denied_by == TG_RULE_NONE)
      out->denied_by = i;
    if (x->retry_after_ms > r->retry_after_ms)
      r->retry_after_ms = x->retry_after_ms;
  }
  if (i == 0 || x->remaining < r->remaining) {
    r->remaining = x->remaining;
    r->count = x->count;
    out->tightest = i;
  }
  if (x->reset_after_ms > r->reset_after_ms)
    r->reset_after_ms = x->reset_after_ms;
}

static void summary_end(tg_rules_result *out, bool passed) {
  if (out->denied_by != TG_RULE_NONE && passed)
    out->r.shadow_denied = true; /* only shadow rules denied */
}

/* Invalid input or a failure: every rule's result, and the answer, is the
 * failing rule's (the failure policy's for a store failure). */
static int fail(tg_rule *rules, size_t n, size_t at, int rc,
                tg_rules_result *out) {
  const tg_rule *f = &rules[at];
  tg__limiter_failure(f->lim, rc, f->q, &out->r);
  out->denied_by = at;
  out->tightest = at;
  for (size_t i = 0; i < n; i++) {
    rules[i].status = i == at ? rc : TG_OK;
    rules[i].result = out->r;
  }
  return rc;
}

/* A call in shadow mode (TG_RULES_SHADOW) is answered allowed, saying it
 * would have been denied. */
static inline void shadow_call(tg_rules_result *out, bool all_shadow) {
  if (all_shadow && !out->r.allowed) {
    out->r.allowed = true;
    out->r.shadow_denied = true;
  }
}

/* A store failure at rule `at` (or input a store refused, such as names
 * in two Cluster slots): answered by fail(), counted and hooked on that
 * rule. A store failure in shadow mode (the call's, or that rule's
 * limiter's) is then answered as shadow mode answers one: the answer, and
 * every rule's result, which is the answer, allowed, shadow_denied when
 * the failure policy denied. Refused input (tg__input_error) stays
 * refused. Returns rc. */
static int store_failed(tg_rule *rules, size_t n, size_t at, int rc,
                        bool all_shadow, tg_rules_result *out) {
  fail(rules, n, at, rc, out);
  tg_rule *ru = &rules[at];
  tg__limiter_done(ru->lim, rc, &ru->result, all_shadow, ru->key, ru->key_len,
                   ru->q, ru->cost, true);
  if (!tg__input_error(rc) && (all_shadow || ru->lim->shadow) &&
      !out->r.allowed) {
    shadow_call(out, true);
    for (size_t i = 0; i < n; i++)
      rules[i].result = out->r;
  }
  return rc;
}

int tg__rules_refuse(tg_rule *rules, size_t n, size_t at, int rc, bool count,
                     tg_rules_result *out) {
  fail(rules, n, at, rc, out);
  tg_rule *ru = &rules[at];
  if (count && ru->lim) {
    /* counted, and never turned into shadow mode's answer: input the
     * call could not run with is not a decision */
    tg__decided d = {ru->key, ru->key_len, ru->q, ru->cost, true};
    tg__limiter_done_slow(ru->lim, rc, &ru->result, false, &d);
  }
  return rc;
}

/* Rule i's answer (set) added to the policy's, and counted and hooked
 * when it is a decision of its own: the call passed, or it denied. */
static inline void rule_settled(tg_rules_result *out, size_t i, tg_rule *ru,
                                bool passed, bool all_shadow) {
  summary_add(out, i, &ru->result);
  /* a policy that passed wrote without reading the deny cache, maybe under
   * another quota (a window opened under a shorter period): a denial the
   * cache holds for the key may no longer be the store's */
  if (passed && ru->lim->deny)
    tg__deny_cache_forget(ru->lim->deny, ru->key, ru->key_len);
  if (passed || !ru->result.allowed)
    tg__limiter_done(ru->lim, TG_OK, &ru->result, all_shadow, ru->key,
                     ru->key_len, ru->q, ru->cost, true);
}

/* A passed rule's own delay: its outcome's value when it waits (a
 * reservation accepted late), 0 for a rule in shadow mode, whose result
 * then says shadow_denied (as tg_reserve's does). */
static inline uint64_t rule_delay(tg_rule *ru, uint64_t wait_ms, uint64_t value,
                                  bool shadow) {
  uint64_t delay = wait_ms > 0 && ru->result.allowed ? value : 0;
  if (delay > 0 && shadow) {
    ru->result.shadow_denied = true;
    delay = 0;
  }
  return delay;
}

int tg__rules_answer(tg_rule *rules, size_t n, unsigned flags, int rc,
                     size_t failed, bool passed, const tg__outcome *o,
                     const uint64_t *wait_ms, uint64_t *delays,
                     tg_rules_result *out) {
  bool all_shadow = flags & TG_RULES_SHADOW;
  if (delays)
    for (size_t i = 0; i < n; i++)
      delays[i] = 0;
  if (rc != TG_OK)
    return store_failed(rules, n, failed < n ? failed : 0, rc, all_shadow, out);
  summary_start(out, passed);
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    ru->status = TG_OK;
    ru->result = passed ? o[i].r : unpassed(&o[i]);
    if (wait_ms && delays && passed)
      delays[i] = rule_delay(ru, wait_ms[i], o[i].value, ru->lim->shadow);
    rule_settled(out, i, ru, passed, all_shadow);
  }
  summary_end(out, passed);
  shadow_call(out, all_shadow);
  return TG_OK;
}

void tg__rules_reserved(unsigned flags, uint64_t delay_ns,
                        tg_rules_reservation *out) {
  out->ok = out->rules.r.allowed;
  out->delay_ns = out->ok ? delay_ns : 0;
  if ((flags & TG_RULES_SHADOW) && out->delay_ns > 0) {
    /* shadow mode lets it go at once, saying it would have waited */
    out->rules.r.shadow_denied = true;
    out->delay_ns = 0;
  }
  out->delay_ms = tg__div_ceil(out->delay_ns, 1000000);
}

/* What a policy of reservations (tg_reserve_rules) adds to a decision:
 * NULL for tg_hit_rules, whose code then folds every use of it away. */
typedef struct reserving {
  const uint64_t *wait_ms; /* per rule, in ms (in ns with TG_RULES_WAIT_NS);
                              NULL: 0 for all */
  tg_reservation *res;     /* per rule receipts; NULL: none wanted */
  uint64_t delay_ns;       /* out: the largest rule's delay */
  uint32_t consumed;       /* out: bit i: rule i consumed (the call really
                              passed and the rule allowed it) */
} reserving;

int tg__rules_wait(const tg_limiter *lim, uint64_t wait, bool ns, tg__call *c) {
  if (wait > (ns ? TG__WAIT_MAX_NS : TG_PERIOD_MAX_MS))
    return TG_EINVAL;
  if (wait > 0 && !tg__op_supported(lim->cfg.algorithm, TG__OP_RESERVE))
    return TG_ENOTSUP;
  c->wait_ns = ns ? wait : wait * UINT64_C(1000000);
  return TG_OK;
}

/* A passed rule's reservation: its delay (a rule in shadow mode delays
 * nothing: its result says shadow_denied, as tg_reserve's does), and its
 * receipt. */
static uint64_t rule_reserved(const policy_run *pr, size_t i, tg_rule *ru,
                              reserving *rv) {
  uint64_t delay = rule_delay(ru, rv->wait_ms ? rv->wait_ms[i] : 0,
                              pr->o[i].value, pr->shadow >> i & 1u);
  if (rv->res) {
    tg_reservation *x = &rv->res[i];
    tg__reservation_receipt(x, ru->lim->cfg.algorithm, &pr->tok[i], ru->cost);
    x->delay_ns = delay;
    x->delay_ms = tg__div_ceil(delay, 1000000);
  }
  return delay;
}

/* The flags a policy takes: a policy of reservations its waits' unit
 * too. */
static inline unsigned flags_known(bool reserves) {
  return TG_RULES_SHADOW | (reserves ? TG_RULES_WAIT_NS : 0u);
}

/* A call is refused as a whole (its rules left as they were) unless its
 * rules, their count and its flags can be used. */
static inline bool call_usable(const tg_rule *rules, size_t n, unsigned flags,
                               bool reserves) {
  return rules && n > 0 && n <= TG_RULES_MAX &&
         !(flags & ~flags_known(reserves));
}

static inline __attribute__((always_inline)) int
hit_rules(const uint64_t *now, tg_rule *rules, size_t n, unsigned flags,
          tg_rules_result *out, reserving *rv) {
  if (!out)
    return TG_EINVAL;
  if (!call_usable(rules, n, flags, rv != NULL)) {
    *out = (tg_rules_result){{0}, TG_RULE_NONE, 0};
    out->r.retry_after_ms = TG_NEVER;
    return TG_EINVAL;
  }
  policy_run pr; /* not zeroed: filled as each part is needed */
  pr.shadow = pr.taken = 0;
  pr.reserves = rv != NULL;
  /* one now for every rule, read once (a store with its own clock reads
   * it: every rule then shares that store's, see store_fits) */
  uint64_t t;
  const uint64_t *tp = now;
  if (!now && rules[0].lim && !rules[0].lim->store_time) {
    t = rules[0].lim->cfg.clock(rules[0].lim->cfg.clock_ctx);
    tp = &t;
  }
  /* one pass: each rule validated as tg_hit would, then whether its store
   * fits the others' (an invalid rule is reported before any misfit, as
   * the header says: input first, then the stores' compatibility, the
   * first rule that does not fit named) */
  size_t misfit = n;
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    int rc = ru->lim
                 ? tg__limiter_prepare(ru->lim, TG__OP_CHECK, tp, ru->key,
                                       ru->key_len, ru->q, ru->cost, &pr.c[i])
                 : TG_EINVAL;
    if (rv && rv->wait_ms && rc == TG_OK)
      rc = tg__rules_wait(ru->lim, rv->wait_ms[i], flags & TG_RULES_WAIT_NS,
                          &pr.c[i]);
    if (rc != TG_OK)
      return tg__rules_refuse(rules, n, i, rc, true, out);
    if (misfit == n &&
        !(i == 0 ? ru->lim->ident_ok
                 : ru->lim->store_time == rules[0].lim->store_time &&
                       store_fits(rules, i)))
      misfit = i;
    tg__token *tk = &pr.tok[i];
    tg__token_start(tk);
    pr.c[i].tok = tk;
    pr.stores[i] = ru->lim->store;
    pr.shadow |= (uint32_t)ru->lim->shadow << i;
  }
  if (misfit < n)
    return tg__rules_refuse(rules, n, misfit, TG_EINVAL, true, out);
  /* a store that decides a policy by itself must say it honours waits */
  if (rv && rules[0].lim->store->ops->exec_rules &&
      !(rules[0].lim->store->ops->caps & TG__STORE_RULES_WAIT))
    return fail(rules, n, 0, TG_ENOTSUP, out);

  bool passed = false;
  size_t failed = 0;
  int rc;
  tg__store *s0 = pr.stores[0];
  if (s0->ops->exec_rules) {
    bool shadow_calls[TG_RULES_MAX];
    for (size_t i = 0; i < n; i++)
      shadow_calls[i] = pr.shadow >> i & 1u;
    rc = s0->ops->exec_rules(pr.stores, pr.c, n, shadow_calls, pr.o, &passed,
                             &failed);
  } else {
    rc = optimistic(rules, &pr, n, now != NULL, &passed, &failed);
  }
  bool all_shadow = flags & TG_RULES_SHADOW;
  if (rc != TG_OK)
    return store_failed(rules, n, failed < n ? failed : 0, rc, all_shadow, out);
  /* every rule's own answer, the policy's, the rules' counters and hooks */
  summary_start(out, passed);
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    ru->status = TG_OK;
    if (passed) {
      ru->result = pr.o[i].r;
    } else {
      /* the key's numbers as the call left them: a check may have left
       * them to be computed now, from the state it saw */
      if (pr.tok[i].peek_owed)
        tg__state_peek(&pr.c[i], &pr.tok[i].peek_from, &pr.o[i].peek);
      ru->result = unpassed(&pr.o[i]);
    }
    if (rv && passed) {
      /* its real verdict, before shadow mode may turn it */
      rv->consumed |= (uint32_t)pr.o[i].r.allowed << i;
      uint64_t d = rule_reserved(&pr, i, ru, rv);
      if (d > rv->delay_ns)
        rv->delay_ns = d;
    }
    rule_settled(out, i, ru, passed, all_shadow);
  }
  summary_end(out, passed);
  shadow_call(out, all_shadow);
  return TG_OK;
}

/* Whether a policy of this one rule is decided in one step of its store
 * (hit_one): on a store that runs the protocol here (the tables), with none
 * of what a plain step would answer differently (a deny cache, a shadow
 * limiter) and valid flags. */
static inline bool one_step(const tg_rule *ru, unsigned flags) {
  const tg_limiter *l = ru->lim;
  return l && !l->shadow && !l->deny && l->ident_ok &&
         !l->store->ops->exec_rules && !(flags & ~TG_RULES_SHADOW);
}

/* A policy of one rule that one_step admits: checking and then taking is
 * one step of the store. A bucket's is the one tg_hit makes (a denied hit
 * writes nothing there); a window's and a sliding log's a TAKE without its
 * CHECK, which counts only an admitted cost and, denied, writes nothing (a
 * sliding log not even the entries its period has expired: a later quota
 * of a longer period counts them, as Redis's policy does). Either way its
 * answer (allowed or denied, every number) and written state are the
 * rule's: denied, the step's numbers are those of the key as it is, which
 * a CHECK's peek would give (test_rules.c, like_hit and one_step_like_two,
 * holds them to the two-phase decision on every store). The policy's
 * answer and bookkeeping as hit_rules gives them. False, with nothing
 * done, for input tg__limiter_prepare refuses: hit_rules then reports it. */
static inline __attribute__((always_inline)) bool
hit_one(const uint64_t *now, tg_rule *ru, unsigned flags, tg_rules_result *out,
        int *rc_out) {
  tg_limiter *lim = ru->lim;
  tg_algorithm alg = lim->cfg.algorithm;
  bool bucket = alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
  tg__call c;
  if (tg__limiter_prepare(lim, bucket ? TG__OP_HIT : TG__OP_TAKE, now, ru->key,
                          ru->key_len, ru->q, ru->cost, &c) != TG_OK)
    return false;
  /* no token: the table takes a TAKE without one as a plain step (no
   * receipt, nothing checked before it) */
  tg__outcome o;
  int rc = lim->store->ops->exec(lim->store, &c, &o);
  bool all_shadow = flags & TG_RULES_SHADOW;
  *rc_out = rc;
  if (rc != TG_OK) {
    store_failed(ru, 1, 0, rc, all_shadow, out);
    return true;
  }
  bool passed = o.r.allowed;
  ru->status = TG_OK;
  ru->result = o.r;
  /* the policy's answer is the rule's (what summary_start, _add and _end
   * make of one rule: a store's answer has no shadow_denied, and no
   * retry_after_ms when it allows) */
  out->r = o.r;
  out->r.degraded = false;
  out->r.shadow_denied = false;
  out->denied_by = passed ? TG_RULE_NONE : 0;
  out->tightest = 0;
  tg__limiter_done(lim, TG_OK, &ru->result, all_shadow, ru->key, ru->key_len,
                   ru->q, ru->cost, true);
  shadow_call(out, all_shadow);
  return true;
}

/* Whether a policy of two rules is decided by hit_two: both rules on one
 * limiter whose store runs the protocol here through exec_policy (the
 * tables), with none of what hit_rules would answer differently: no shadow
 * mode (the limiter's or the call's), no hook, no deny cache, flags 0. */
static inline bool two_quick(const tg_rule *rules, unsigned flags) {
  const tg_limiter *l = rules[0].lim;
  return l && l == rules[1].lim && !flags && l->plain_rules;
}

/* hit_rules for a policy two_quick admits, with what that leaves known
 * folded away: the same validation in the same order (rule 0, rule 1,
 * then rule 1's key against rule 0's: the only misfit left), the same
 * protocol (optimistic), the same answers and counters. */
static inline __attribute__((always_inline)) int
hit_two(const uint64_t *now, tg_rule *rules, tg_rules_result *out) {
  tg_limiter *lim = rules[0].lim;
  policy_run pr; /* not zeroed: filled as each part is needed */
  pr.shadow = pr.taken = 0;
  pr.reserves = false;
  uint64_t t;
  const uint64_t *tp = now;
  if (!now && !lim->store_time) {
    t = lim->cfg.clock(lim->cfg.clock_ctx);
    tp = &t;
  }
  _Pragma("GCC unroll 2") for (size_t i = 0; i < 2; i++) {
    tg_rule *ru = &rules[i];
    int rc = tg__limiter_prepare(lim, TG__OP_CHECK, tp, ru->key, ru->key_len,
                                 ru->q, ru->cost, &pr.c[i]);
    if (rc != TG_OK)
      return tg__rules_refuse(rules, 2, i, rc, true, out);
    tg__token_start(&pr.tok[i]);
    pr.c[i].tok = &pr.tok[i];
    pr.stores[i] = lim->store;
  }
  if (same_key(&rules[1], &rules[0]))
    return tg__rules_refuse(rules, 2, 1, TG_EINVAL, true, out);
  bool passed = false;
  size_t failed = 0;
  int rc = optimistic(rules, &pr, 2, now != NULL, &passed, &failed);
  if (rc != TG_OK)
    return store_failed(rules, 2, failed < 2 ? failed : 0, rc, false, out);
  /* the answer is built apart and copied once: out's fields, written
   * between the rules' results (the same type), would be read back after
   * each */
  tg_rules_result sum;
  summary_start(&sum, passed);
  _Pragma("GCC unroll 2") for (size_t i = 0; i < 2; i++) {
    tg_rule *ru = &rules[i];
    ru->status = TG_OK;
    if (passed) {
      ru->result = pr.o[i].r;
    } else {
      if (pr.tok[i].peek_owed)
        tg__state_peek(&pr.c[i], &pr.tok[i].peek_from, &pr.o[i].peek);
      ru->result = unpassed(&pr.o[i]);
    }
    summary_add(&sum, i, &ru->result);
    /* tg__limiter_done of a quiet limiter */
    if (passed || !ru->result.allowed)
      tg__count_one(lim->stats,
                    ru->result.allowed ? TG__N_ALLOWED : TG__N_DENIED);
  }
  summary_end(&sum, passed);
  *out = sum;
  return TG_OK;
}

/* Policies of one rule (an nginx location with one limit) and of two are
 * compiled apart: with n known, the loops fold away. */
static inline __attribute__((always_inline)) int
hit_rules_by_count(const uint64_t *now, tg_rule *rules, size_t n,
                   unsigned flags, tg_rules_result *out) {
  int rc;
  if (n == 1 && out && rules && one_step(rules, flags) &&
      hit_one(now, rules, flags, out, &rc))
    return rc;
  if (n == 1)
    return hit_rules(now, rules, 1, flags, out, NULL);
  if (n == 2 && out && rules && two_quick(rules, flags))
    return hit_two(now, rules, out);
  if (n == 2)
    return hit_rules(now, rules, 2, flags, out, NULL);
  return hit_rules(now, rules, n, flags, out, NULL);
}

int tg_hit_rules(tg_rule *rules, size_t n, unsigned flags,
                 tg_rules_result *out) {
  return hit_rules_by_count(NULL, rules, n, flags, out);
}

int tg_hit_rules_at(uint64_t now_us, tg_rule *rules, size_t n, unsigned flags,
                    tg_rules_result *out) {
  return hit_rules_by_count(&now_us, rules, n, flags, out);
}

/* tg_reserve_rules: the same decision, each rule's CHECK and TAKE admitting
 * its wait (gcra.c), then the policy's delay and the receipts. */
static int reserve_rules(const uint64_t *now, tg_rule *rules, size_t n,
                         const uint64_t *max_wait_ms, unsigned flags,
                         tg_rules_reservation *out, tg_reservation *res) {
  if (res && n <= TG_RULES_MAX)
    for (size_t i = 0; i < n; i++)
      tg__reservation_clear(&res[i]);
  if (!out)
    return TG_EINVAL;
  reserving rv = {max_wait_ms, res, 0, 0};
  int rc = hit_rules(now, rules, n, flags, &out->rules, &rv);
  tg__rules_reserved(flags, rv.delay_ns, out);
  /* a call refused as a whole leaves the rules as they were (their Out
   * fields need no initial value) and its receipts zero */
  if (res && call_usable(rules, n, flags, true))
    for (size_t i = 0; i < n; i++) {
      /* each rule's answer as the call left it (shadow mode's included);
       * ok only where the rule consumed: in shadow mode a call answered
       * ok may have consumed nothing */
      res[i].result = rules[i].result;
      res[i].ok = rv.consumed >> i & 1u;
      if (!res[i].ok)
        res[i].delay_ns = res[i].delay_ms = 0;
    }
  return rc;
}

int tg_reserve_rules(tg_rule *rules, size_t n, const uint64_t *max_wait_ms,
                     unsigned flags, tg_rules_reservation *out,
                     tg_reservation *res) {
  return reserve_rules(NULL, rules, n, max_wait_ms, flags, out, res);
}

int tg_reserve_rules_at(uint64_t now_us, tg_rule *rules, size_t n,
                        const uint64_t *max_wait_ms, unsigned flags,
                        tg_rules_reservation *out, tg_reservation *res) {
  return reserve_rules(&now_us, rules, n, max_wait_ms, flags, out, res);
}
