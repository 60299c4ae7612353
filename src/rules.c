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
 *      before it are given back (UNDO) in reverse order.
 *
 * Everything else (validation, grouping the stores, shadow mode, the
 * answer, the counters) is the same for every store.
 */
#include "limiter.h"

#include <string.h>

/* What a rule became in this decision. */
typedef struct rule_run {
  tg__call c;
  tg__token tok;
  tg__outcome o;
  bool shadow; /* its denial does not deny the call */
  bool taken;  /* consumed (and, until the end, maybe to give back) */
} rule_run;

/* Two rules of one policy name the same state: same space, same key. */
static bool same_state(const tg_rule *a, const tg_rule *b) {
  return a->lim->space[0] == b->lim->space[0] &&
         a->lim->space[1] == b->lim->space[1] && a->key_len == b->key_len &&
         memcmp(a->key, b->key, a->key_len) == 0;
}

/* The stores must be of one kind and one group (each limiter asked its
 * store once, at creation), and no two rules may name one state. */
static bool stores_fit(const tg_rule *rules, size_t n) {
  const tg_limiter *l0 = rules[0].lim;
  for (size_t i = 0; i < n; i++) {
    const tg_limiter *l = rules[i].lim;
    if (!l->ident_ok || l->store->ops != l0->store->ops ||
        l->group[0] != l0->group[0] || l->group[1] != l0->group[1])
      return false;
    for (size_t j = 0; j < i; j++)
      if (same_state(&rules[i], &rules[j]))
        return false;
  }
  return true;
}

/* Gives back rules [0..k) that were taken, in reverse order. The time to
 * give back at: for calls on a clock, the clock again (later calls on the
 * key may have read a later time, and a bucket's refund must not undercut
 * it, see gcra.c); for the _at function, the call's own now. Best effort: a
 * store that fails here leaves that consumption (the call is answered
 * denied all the same, which can only be stricter). */
static void give_back(tg_rule *rules, rule_run *rr, size_t k, bool at) {
  for (size_t j = k; j-- > 0;) {
    if (!rr[j].taken)
      continue;
    tg__call u = rr[j].c;
    u.op = TG__OP_UNDO;
    tg_limiter *lim = rules[j].lim;
    if (!at && !u.store_time) {
      uint64_t t = lim->cfg.clock(lim->cfg.clock_ctx);
      if (t > u.now_us && t <= TG_NOW_MAX_US)
        u.now_us = t;
    }
    tg__outcome o;
    (void)lim->store->ops->exec(lim->store, &u, &o);
    rr[j].taken = false;
  }
}

/* The optimistic protocol (see the top of the file) for stores without
 * exec_rules. Fills rr[i].o as CHECK would, then, when the call passed,
 * each taken rule's o.r with its TAKE's answer. */
static int optimistic(tg_rule *rules, rule_run *rr, size_t n, bool at,
                      bool *passed, size_t *failed) {
  *passed = false;
  for (size_t i = 0; i < n; i++) {
    tg__store *s = rules[i].lim->store;
    int rc = s->ops->exec(s, &rr[i].c, &rr[i].o);
    if (rc != TG_OK) {
      *failed = i;
      return rc;
    }
  }
  for (size_t i = 0; i < n; i++)
    if (!rr[i].shadow && !rr[i].o.r.allowed)
      return TG_OK; /* denied: nothing was written */
  for (size_t i = 0; i < n; i++) {
    if (!rr[i].o.r.allowed)
      continue;               /* a shadow rule that denied consumes nothing */
    rr[i].c.op = TG__OP_TAKE; /* the call stays as checked otherwise */
    tg__outcome o;
    tg__store *s = rules[i].lim->store;
    int rc = s->ops->exec(s, &rr[i].c, &o);
    if (rc != TG_OK) {
      give_back(rules, rr, i, at);
      *failed = i;
      return rc;
    }
    rr[i].taken = rr[i].tok.taken;
    if (rr[i].tok.reused)
      o.r = rr[i].o.r; /* published what the check computed */
    if (!o.r.allowed && !rr[i].shadow) {
      /* lost a race: the rule denies now. Give the others back; the call
       * is denied by this rule, as its TAKE saw it. */
      give_back(rules, rr, i, at);
      rr[i].o.r = o.r;
      rr[i].o.peek = o.r;
      return TG_OK;
    }
    /* a shadow rule that turned to deny consumed nothing: keep its CHECK
     * answer's verdict as what it says */
    if (o.r.allowed)
      rr[i].o.r = o.r;
    else
      rr[i].o.r.allowed = false;
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

/* The policy's answer from its rules' real answers. */
static void summarise(const tg_rule *rules, size_t n, bool passed,
                      tg_rules_result *out) {
  tg_result *r = &out->r;
  *r = (tg_result){0};
  r->allowed = passed;
  r->remaining = UINT64_MAX;
  out->denied_by = TG_RULE_NONE;
  out->tightest = 0;
  for (size_t i = 0; i < n; i++) {
    const tg_result *x = &rules[i].result;
    bool denied = !x->allowed || x->shadow_denied;
    if (denied) {
      if (out->denied_by == TG_RULE_NONE)
        out->denied_by = i;
      if (x->retry_after_ms > r->retry_after_ms)
        r->retry_after_ms = x->retry_after_ms;
    }
    if (x->remaining < r->remaining) {
      r->remaining = x->remaining;
      out->tightest = i;
    }
    if (x->reset_after_ms > r->reset_after_ms)
      r->reset_after_ms = x->reset_after_ms;
  }
  r->count = rules[out->tightest].result.count;
  if (out->denied_by != TG_RULE_NONE && passed)
    r->shadow_denied = true; /* only shadow rules denied */
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

static int hit_rules(const uint64_t *now, tg_rule *rules, size_t n,
                     unsigned flags, tg_rules_result *out) {
  if (!out)
    return TG_EINVAL;
  *out = (tg_rules_result){{0}, TG_RULE_NONE, 0};
  out->r.retry_after_ms = TG_NEVER;
  if (!rules || n == 0 || n > TG_RULES_MAX || (flags & ~TG_RULES_SHADOW))
    return TG_EINVAL;
  rule_run rr[TG_RULES_MAX];
  /* one now for every rule, read once (a store with its own clock reads
   * it: every rule then shares that store's, see stores_fit) */
  uint64_t t;
  const uint64_t *tp = now;
  if (!now && rules[0].lim && !rules[0].lim->store_time) {
    t = rules[0].lim->cfg.clock(rules[0].lim->cfg.clock_ctx);
    tp = &t;
  }
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    int rc = ru->lim
                 ? tg__limiter_prepare(ru->lim, TG__OP_CHECK, tp, ru->key,
                                       ru->key_len, ru->q, ru->cost, &rr[i].c)
                 : TG_EINVAL;
    if (rc == TG_OK && ru->lim->store_time != rules[0].lim->store_time)
      rc = TG_EINVAL;
    if (rc != TG_OK) {
      fail(rules, n, i, rc, out);
      if (ru->lim) {
        tg__limiter_done(ru->lim, rc, &ru->result, false, ru->key, ru->key_len,
                         ru->q, ru->cost, true);
      }
      return rc;
    }
    /* the flags only: the stores fill the rest before reading it (zeroing
     * the whole token cost a tenth of a two-rule decision) */
    tg__token *tk = &rr[i].tok;
    tk->seen_ok = tk->seen_absent = tk->taken = tk->next_ok = false;
    tk->reused = false;
    tk->gen = 0;
    tk->entry_us = 0;
    rr[i].c.tok = &rr[i].tok;
    rr[i].shadow = ru->lim->shadow;
    rr[i].taken = false;
  }
  if (!stores_fit(rules, n))
    return fail(rules, n, 0, TG_EINVAL, out);

  bool passed = false;
  size_t failed = 0;
  int rc;
  tg__store *s0 = rules[0].lim->store;
  if (s0->ops->exec_rules) {
    tg__store *stores[TG_RULES_MAX];
    tg__call calls[TG_RULES_MAX];
    tg__outcome outs[TG_RULES_MAX];
    bool shadow_calls[TG_RULES_MAX];
    for (size_t i = 0; i < n; i++) {
      stores[i] = rules[i].lim->store;
      calls[i] = rr[i].c;
      shadow_calls[i] = rr[i].shadow;
    }
    rc = s0->ops->exec_rules(stores, calls, n, shadow_calls, outs, &passed,
                             &failed);
    for (size_t i = 0; i < n && rc == TG_OK; i++)
      rr[i].o = outs[i];
  } else {
    rc = optimistic(rules, rr, n, now != NULL, &passed, &failed);
  }
  bool all_shadow = flags & TG_RULES_SHADOW;
  if (rc != TG_OK) {
    if (failed >= n)
      failed = 0;
    fail(rules, n, failed, rc, out);
    tg_rule *ru = &rules[failed];
    tg__limiter_done(ru->lim, rc, &ru->result, rr[failed].shadow || all_shadow,
                     ru->key, ru->key_len, ru->q, ru->cost, true);
    if (all_shadow && !out->r.allowed) {
      out->r.allowed = true;
      out->r.shadow_denied = true;
    }
    return rc;
  }
  /* every rule's own answer, its counters and hook */
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    ru->status = TG_OK;
    ru->result = passed ? rr[i].o.r : unpassed(&rr[i].o);
  }
  summarise(rules, n, passed, out);
  for (size_t i = 0; i < n; i++) {
    tg_rule *ru = &rules[i];
    bool allowed = ru->result.allowed;
    if (!allowed || passed) {
      tg__limiter_done(ru->lim, TG_OK, &ru->result, rr[i].shadow || all_shadow,
                       ru->key, ru->key_len, ru->q, ru->cost, true);
    }
  }
  if (all_shadow && !out->r.allowed) {
    out->r.allowed = true;
    out->r.shadow_denied = true;
  }
  return TG_OK;
}

int tg_hit_rules(tg_rule *rules, size_t n, unsigned flags,
                 tg_rules_result *out) {
  return hit_rules(NULL, rules, n, flags, out);
}

int tg_hit_rules_at(uint64_t now_us, tg_rule *rules, size_t n, unsigned flags,
                    tg_rules_result *out) {
  return hit_rules(&now_us, rules, n, flags, out);
}
