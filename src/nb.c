/* SPDX-License-Identifier: MIT */
/*
 * nb.c - the non-blocking (sans-IO) Redis API: the caller's event loop owns
 * the sockets and the time, the engine (store/redis_engine.c) owns the
 * protocol, and a store-less limiter (limiter.h) owns validation, the deny
 * cache and the failure policy, so a decision made here is the one tg_hit
 * would make, answered the way tg_hit would answer it.
 *
 * The caller's side of a link's life: tg_nb_wants says CONNECT, the caller
 * connects and says tg_nb_connected (or tg_nb_down when it cannot); WRITE:
 * it writes tg_nb_output's bytes and says how many with tg_nb_written;
 * READ: it feeds what it reads to tg_nb_input; on EOF, an error or its own
 * timeout it says tg_nb_closed (or tg_nb_down, to refuse the node's calls
 * until tg_nb_up). This file adds to the engine only what depends on
 * those words: which nodes are down, failing their calls at once, and
 * choosing where to ask for a Cluster's slot map; and the one thing that
 * needs time: a policy told TRYAGAIN (its slot is being migrated) waits,
 * for the caller's timer (tg_nb_timeout, tg_nb_tick), before it is sent
 * again.
 */
#include "tollgate.h"

#include "error.h"
#include "limiter.h"
#include "mono.h"
#include "store/redis_cmd.h"
#include "store/redis_engine.h"

#include <stdlib.h>
#include <string.h>

/* A request's private words: the engine's call, the quota's copy (the
 * policy's answer needs it) and when it was made (the deny cache's
 * timeline). */
typedef struct nbpol nbpol;

typedef struct nbpriv {
  tg__ereq er;
  tg_quota q;
  uint64_t when;
  nbpol *pol;          /* a policy (tg_nb_submit_rules), or NULL */
  struct nbpriv *next; /* on the local done list */
} nbpriv;

/* A policy's own block: its encoding and what its answer needs. */
struct nbpol {
  nbpol *prev, *next; /* the client's, freed by tg_nb_destroy if pending */
  tg__redis_rules *x;
  tg_nb_rule *rules;
  size_t n;
  unsigned flags;
  tg_quota q[TG_RULES_MAX];
  uint64_t wait[TG_RULES_MAX]; /* each rule's max_wait_ms */
  unsigned tries;              /* TRYAGAIN answers so far */
  uint64_t due_ns;             /* when waiting: the monotonic time to resend */
};

_Static_assert(sizeof(nbpriv) <= sizeof(((tg_nb_req *)0)->private_),
               "TG_NB_PRIVATE_WORDS is too small");

struct tg_nb {
  tg_limiter *lim;  /* validation, policy, fallback, deny cache */
  tg__store *codec; /* names and encoding */
  tg__eng eng;
  tg__eng_stats st;
  char *username, *password;
  int down[TG__NODES_MAX];         /* 0, or the code a down node's calls get */
  int last_down;                   /* the code of the node that went down last
                                      (0: none yet) */
  nbpriv *local_head, *local_tail; /* answered without the engine */
  nbpriv *waiting;                 /* policies told TRYAGAIN, to resend */
  nbpol *pols;                     /* policies pending */
  size_t pending;                  /* submitted, not yet returned */
  tg__slotmap map;                 /* last: the largest */
};

static nbpriv *priv(tg_nb_req *req) { return (nbpriv *)(void *)req->private_; }

static bool store_code(int code) {
  return code == TG_ECONNECT || code == TG_ETIMEDOUT || code == TG_ESTORE ||
         code == TG_ENOMEM;
}

/* Seeds (or the one server) as nodes 0.. of the map. */
static int add_nodes(tg_nb *nb, const tg_redis_config *rc) {
  if (!rc->cluster_nodes) {
    /* the address was checked (tg__redis_config_check) */
    const char *h = rc->unix_path ? rc->unix_path : rc->host;
    if (tg__slotmap_node(&nb->map, h, strlen(h),
                         rc->unix_path ? 0 : rc->port) != TG__NO_NODE)
      return TG_OK;
    tg__error_set("out of memory"); /* the first node: the map is empty */
    return TG_ENOMEM;
  }
  int err = tg__cluster_seeds(&nb->map, rc->cluster_nodes);
  if (err == TG_EINVAL)
    tg__error_set("invalid tg_redis_config: cluster_nodes must be 1..64 "
                  "comma-separated HOST:PORT");
  return err;
}

void tg_nb_destroy(tg_nb *nb) {
  if (!nb)
    return;
  while (nb->pols) {
    nbpol *pol = nb->pols;
    nb->pols = pol->next;
    tg__redis_rules_free(pol->x);
    free(pol);
  }
  tg__eng_free(&nb->eng);
  tg__slotmap_free(&nb->map);
  if (nb->codec)
    nb->codec->ops->destroy(nb->codec);
  tg_limiter_destroy(nb->lim);
  free(nb->username);
  free(nb->password);
  free(nb);
}

int tg_nb_new(tg_nb **out, const tg_config *cfg) {
  if (!out)
    return TG_EINVAL;
  *out = NULL;
  tg__error_clear();
  if (!cfg || !cfg->redis) {
    tg__error_set("tg_nb_new needs a tg_config whose redis is set");
    return TG_EINVAL;
  }
  const tg_redis_config *rc = cfg->redis;
  /* what tg_limiter_new checks, but the pool: the caller owns the
   * connections */
  tg_redis_config checked = *rc;
  checked.pool_size = 1;
  int bad = tg__redis_config_check(&checked, rc->cluster_nodes != NULL);
  if (bad != TG_OK)
    return bad;
  tg_nb *nb = calloc(1, sizeof *nb);
  if (!nb)
    return TG_ENOMEM;
  int rc2 = tg__slotmap_init(&nb->map);
  if (rc2 != TG_OK) {
    free(nb);
    return rc2;
  }
  rc2 = tg__limiter_shell_new(&nb->lim, cfg);
  if (rc2 == TG_OK)
    rc2 = tg__redis_codec_new(&nb->codec, rc->key_prefix, cfg->algorithm,
                              cfg->sliding_max_entries);
  if (rc2 == TG_OK)
    rc2 = add_nodes(nb, rc);
  if (rc2 == TG_OK &&
      ((rc->username && !(nb->username = strdup(rc->username))) ||
       (rc->password && !(nb->password = strdup(rc->password)))))
    rc2 = TG_ENOMEM;
  if (rc2 == TG_OK) {
    tg__eng_config ec = {nb->codec,
                         nb->username,
                         nb->password,
                         rc->cluster_nodes ? 0 : rc->db,
                         rc->cluster_nodes != NULL,
                         &nb->map,
                         &nb->st};
    rc2 = tg__eng_init(&nb->eng, &ec);
  }
  if (rc2 != TG_OK) {
    tg_nb_destroy(nb);
    return rc2;
  }
  *out = nb;
  return TG_OK;
}

/* What the caller's words imply: a down node's calls are answered at once,
 * and a wanted slot map is asked of a node that is not down (preferably one
 * already connected); with none, the calls waiting for a map get the code
 * of the last node that went down. */
static void settle(tg_nb *nb) {
  tg__eng *e = &nb->eng;
  uint32_t n = tg__eng_nodes(e);
  for (uint32_t i = 0; i < n; i++)
    if (nb->down[i])
      tg__eng_fail_queued(e, i, nb->down[i]);
  if (!tg__eng_refresh_wanted(e))
    return;
  uint32_t pick = TG__NO_NODE;
  for (uint32_t i = 0; i < n && pick == TG__NO_NODE; i++)
    if (!nb->down[i] && tg__eng_open(e, i))
      pick = i;
  for (uint32_t i = 0; i < n && pick == TG__NO_NODE; i++)
    if (!nb->down[i])
      pick = i;
  if (pick != TG__NO_NODE)
    tg__eng_refresh(e, pick);
  else
    tg__eng_fail_parked(e, nb->last_down ? nb->last_down : TG_ECONNECT);
}

static int submit(tg_nb *nb, const uint64_t *now, tg_nb_req *req) {
  if (!nb || !req)
    return TG_EINVAL;
  nbpriv *p = priv(req);
  tg__call *c = &p->er.call;
  /* TG_NB_RULE: a window's TAKE, which counts only an admitted cost; the
   * other algorithms' HIT already consumes nothing when it refuses */
  tg_algorithm alg = nb->lim->cfg.algorithm;
  bool take = (req->flags & TG_NB_RULE) &&
              (alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY);
  bool reserve = req->flags & TG_NB_RESERVE;
  tg__op op = reserve ? TG__OP_RESERVE : take ? TG__OP_TAKE : TG__OP_HIT;
  req->delay_ns = req->delay_ms = 0;
  req->denied_by = TG_RULE_NONE;
  req->tightest = 0;
  bool ns = req->flags & TG_NB_WAIT_NS;
  int rc = (req->flags & ~(TG_NB_RULE | TG_NB_RESERVE | TG_NB_WAIT_NS)) != 0
               ? TG_EINVAL
               : tg__limiter_prepare(nb->lim, op, now, req->key, req->key_len,
                                     req->q, req->cost, c);
  /* the call's input, then its wait (bounded and converted to ns as a
   * policy's rule's), as tg_reserve checks them */
  if (rc == TG_OK && reserve)
    rc = tg__rules_wait(nb->lim, req->max_wait_ms, ns, c);
  if (rc != TG_OK) {
    tg__limiter_invalid(nb->lim, rc, req->key, req->key_len, req->q, req->cost,
                        &req->result);
    req->status = rc;
    return rc;
  }
  p->q = *req->q;
  p->when = tg__limiter_when(nb->lim, c);
  p->pol = NULL;
  p->er.owner = req;
  p->er.del = 0;
  p->er.rules = NULL;
  nb->pending++;
  if (tg__limiter_cached(nb->lim, c, p->when, &p->q, &req->result)) {
    req->status = TG_OK;
    p->next = NULL;
    if (nb->local_tail)
      nb->local_tail->next = p;
    else
      nb->local_head = p;
    nb->local_tail = p;
    return TG_OK;
  }
  tg__eng_submit(&nb->eng, &p->er);
  settle(nb);
  return TG_OK;
}

int tg_nb_submit(tg_nb *nb, tg_nb_req *req) { return submit(nb, NULL, req); }

int tg_nb_submit_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req) {
  return submit(nb, &now_us, req);
}

/* Whether two clients send to the same server or Cluster: the same
 * first address (the server, or the first seed), db and kind. */
static bool same_server(const tg_nb *a, const tg_nb *b) {
  if (a == b)
    return true;
  const tg__node *x = tg__slotmap_addr(&a->map, 0),
                 *y = tg__slotmap_addr(&b->map, 0);
  return a->eng.cfg.cluster == b->eng.cfg.cluster &&
         a->eng.cfg.db == b->eng.cfg.db && x->port == y->port &&
         strcmp(x->host, y->host) == 0;
}

/* rules[0..n) as tg_rules, for rules.c's answers (pol: its quota copies,
 * else the caller's). */
static void as_rules(const tg_nb_rule *rules, size_t n, const nbpol *pol,
                     tg_rule *tr) {
  for (size_t i = 0; i < n; i++) {
    const tg_nb_rule *ru = &rules[i];
    tr[i] = (tg_rule){ru->nb ? ru->nb->lim : NULL,
                      ru->key,
                      ru->key_len,
                      pol ? &pol->q[i] : ru->q,
                      ru->cost,
                      0,
                      {0}};
  }
}

/* The policy's answer in req and its rules, from rules.c's (a policy of
 * reservations: each rule's delay, else NULL). */
static int policy_answered(tg_nb_req *req, tg_nb_rule *rules, size_t n,
                           const tg_rule *tr, const tg_rules_result *rr,
                           const uint64_t *delays, int rc) {
  for (size_t i = 0; i < n; i++) {
    rules[i].status = tr[i].status;
    rules[i].result = tr[i].result;
    rules[i].delay_ns = delays ? delays[i] : 0;
  }
  req->status = rc;
  req->result = rr->r;
  req->denied_by = rr->denied_by;
  req->tightest = rr->tightest;
  return rc;
}

/* A policy refused before it is sent, as tg_hit_rules refuses it (see
 * tg__rules_refuse). */
static int policy_refused(tg_nb_req *req, tg_nb_rule *rules, size_t n,
                          size_t at, int rc, bool count) {
  tg_rule tr[TG_RULES_MAX];
  tg_rules_result rr;
  as_rules(rules, n, NULL, tr);
  tg__rules_refuse(tr, n, at, rc, count, &rr);
  return policy_answered(req, rules, n, tr, &rr, NULL, rc);
}

/* A policy answered by the store's rc at rule `at` before it is sent (no
 * memory for it, names in two slots), as the blocking store's failure is
 * (tg__rules_answer). */
static int policy_failed(tg_nb_req *req, tg_nb_rule *rules, size_t n,
                         unsigned flags, size_t at, int rc) {
  tg_rule tr[TG_RULES_MAX];
  tg_rules_result rr;
  as_rules(rules, n, NULL, tr);
  tg__rules_answer(tr, n, flags, rc, at, false, NULL, NULL, NULL, &rr);
  return policy_answered(req, rules, n, tr, &rr, NULL, rc);
}

static int submit_rules(tg_nb *nb, const uint64_t *now, tg_nb_req *req,
                        tg_nb_rule *rules, size_t n, unsigned flags) {
  if (!nb || !req)
    return TG_EINVAL;
  req->delay_ns = req->delay_ms = 0;
  req->denied_by = TG_RULE_NONE;
  req->tightest = 0;
  if (!rules || n == 0 || n > TG_RULES_MAX ||
      (flags & ~(TG_RULES_SHADOW | TG_RULES_WAIT_NS))) {
    req->status = TG_EINVAL;
    req->result = (tg_result){0};
    req->result.retry_after_ms = TG_NEVER;
    return TG_EINVAL;
  }
  /* each rule's input first (counted on its client), then whether the
   * rules fit together, as tg_hit_rules checks them; the policy's now is
   * the server's, or now_us for every rule */
  /* zeroed: gcc 12 -O3 cannot see that the loop fills the first n or
   * returns (-Wmaybe-uninitialized, an error in the release build) */
  tg__call calls[TG_RULES_MAX] = {0};
  const tg__store *codecs[TG_RULES_MAX] = {0};
  bool shadow[TG_RULES_MAX] = {0};
  size_t misfit = n; /* the first rule not on this client's server */
  for (size_t i = 0; i < n; i++) {
    const tg_nb_rule *ru = &rules[i];
    const tg_limiter *lim = ru->nb ? ru->nb->lim : NULL;
    int rc = lim ? tg__limiter_prepare(lim, TG__OP_CHECK, now, ru->key,
                                       ru->key_len, ru->q, ru->cost, &calls[i])
                 : TG_EINVAL;
    if (rc == TG_OK) /* a rule that reserves: its CHECK and TAKE wait */
      rc = tg__rules_wait(lim, ru->max_wait_ms, flags & TG_RULES_WAIT_NS,
                          &calls[i]);
    if (rc != TG_OK)
      return policy_refused(req, rules, n, i, rc, true);
    if (misfit == n && !same_server(nb, ru->nb))
      misfit = i;
    codecs[i] = ru->nb->codec;
    shadow[i] = lim->shadow;
  }
  nbpol *pol = malloc(sizeof *pol);
  int rc =
      pol ? tg__redis_rules_new(&pol->x, codecs, calls, n, shadow) : TG_ENOMEM;
  if (rc != TG_OK) {
    free(pol);
    if (misfit < n) /* refused input comes first */
      return policy_refused(req, rules, n, misfit, TG_EINVAL, true);
    return policy_failed(req, rules, n, flags, 0, rc);
  }
  /* distinct names (a misfit: the first rule on another server or naming
   * an earlier rule's key, as tg_hit_rules names the first rule that does
   * not fit), in one slot, on one server too (as the blocking store
   * decides it: a policy that works there works on a Cluster; the rule out
   * of place is answered as a store failure) */
  size_t bad = n;
  for (size_t i = 1; i < misfit; i++)
    for (size_t j = 0; j < i && misfit > i; j++)
      if (tg__redis_rules_same_key(pol->x, i, j))
        misfit = i;
  for (size_t i = 1; i < n && bad == n; i++)
    if (tg__redis_rules_slot(pol->x, i) != tg__redis_rules_slot(pol->x, 0))
      bad = i;
  if (misfit < n || bad < n) {
    tg__redis_rules_free(pol->x);
    free(pol);
    return misfit < n ? policy_refused(req, rules, n, misfit, TG_EINVAL, true)
                      : policy_failed(req, rules, n, flags, bad, TG_EINVAL);
  }
  for (size_t i = 0; i < n; i++) {
    pol->q[i] = *rules[i].q;
    pol->wait[i] = rules[i].max_wait_ms;
  }
  pol->rules = rules;
  pol->n = n;
  pol->flags = flags;
  pol->prev = NULL;
  pol->next = nb->pols;
  if (nb->pols)
    nb->pols->prev = pol;
  nb->pols = pol;
  nbpriv *p = priv(req);
  pol->tries = 0;
  p->pol = pol;
  p->er.call = calls[0];
  p->er.owner = req;
  p->er.del = 0;
  p->er.rules = pol->x;
  nb->pending++;
  tg__eng_submit(&nb->eng, &p->er);
  settle(nb);
  return TG_OK;
}

int tg_nb_submit_rules(tg_nb *nb, tg_nb_req *req, tg_nb_rule *rules, size_t n,
                       unsigned flags) {
  return submit_rules(nb, NULL, req, rules, n, flags);
}

int tg_nb_submit_rules_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req,
                          tg_nb_rule *rules, size_t n, unsigned flags) {
  return submit_rules(nb, &now_us, req, rules, n, flags);
}

/* A policy's answer, as tg_hit_rules gives it on the blocking store
 * (rules.c), from the engine's status and the outcomes decoded. */
static void policy_done(tg_nb *nb, tg_nb_req *req, nbpriv *p, int status) {
  nbpol *pol = p->pol;
  if (pol->prev)
    pol->prev->next = pol->next;
  else
    nb->pols = pol->next;
  if (pol->next)
    pol->next->prev = pol->prev;
  tg_rule tr[TG_RULES_MAX];
  as_rules(pol->rules, pol->n, pol, tr);
  bool passed = false;
  size_t failed = 0;
  const tg__outcome *o = tg__redis_rules_outcomes(pol->x, &passed, &failed);
  /* as tg_reserve_rules answers (tg_hit_rules's answer when no rule
   * waits): the rules' delays, and the call's, the largest */
  tg_rules_reservation out;
  uint64_t delays[TG_RULES_MAX], delay = 0;
  int rc = tg__rules_answer(tr, pol->n, pol->flags, status, failed, passed, o,
                            pol->wait, delays, &out.rules);
  for (size_t i = 0; i < pol->n; i++)
    delay = delays[i] > delay ? delays[i] : delay;
  tg__rules_reserved(pol->flags, delay, &out);
  policy_answered(req, pol->rules, pol->n, tr, &out.rules, delays, rc);
  req->delay_ns = out.delay_ns;
  req->delay_ms = out.delay_ms;
  tg__redis_rules_free(pol->x);
  free(pol);
  p->pol = NULL;
}

/* A reservation's answer, as tg_reserve makes it (reserve.c): the
 * outcome and its delay, or the failure policy's answer (no fallback
 * decision); in shadow mode a delay answered 0; then counted. */
static int reserved(tg_limiter *lim, const tg__call *c, const tg_quota *q,
                    int rc, const tg__outcome *o, tg_nb_req *req) {
  req->delay_ns = 0;
  if (rc == TG_OK) {
    req->result = o->r;
    req->delay_ns = o->r.allowed ? o->value : 0;
  } else {
    tg__limiter_failure(lim, rc, q, &req->result);
  }
  if (lim->shadow && req->delay_ns > 0) {
    /* let go at once, counted and hooked as a shadow denial */
    req->result.shadow_denied = true;
    req->delay_ns = 0;
  }
  tg__limiter_done(lim, rc, &req->result, lim->shadow, c->key, c->key_len, q,
                   c->arg, false);
  req->delay_ms = tg__div_ceil(req->delay_ns, 1000000);
  return rc;
}

/* Whether the policy told TRYAGAIN may wait and go again: it then joins
 * the waiting list, due after the blocking store's pause for that try. */
static bool policy_waits(tg_nb *nb, nbpriv *p) {
  nbpol *pol = p->pol;
  if (++pol->tries >= TG__TRYAGAIN_WAITS)
    return false;
  pol->due_ns = tg__mono_ns() +
                (uint64_t)tg__tryagain_pause_ms(pol->tries) * UINT64_C(1000000);
  p->next = nb->waiting;
  nb->waiting = p;
  return true;
}

long tg_nb_timeout(const tg_nb *nb) {
  if (!nb || !nb->waiting)
    return -1;
  uint64_t now = tg__mono_ns(), first = UINT64_MAX;
  for (const nbpriv *p = nb->waiting; p; p = p->next)
    first = p->pol->due_ns < first ? p->pol->due_ns : first;
  return first <= now ? 0 : (long)tg__div_ceil(first - now, 1000000);
}

int tg_nb_tick(tg_nb *nb) {
  if (!nb)
    return TG_EINVAL;
  if (!nb->waiting)
    return TG_OK;
  uint64_t now = tg__mono_ns();
  nbpriv **pp = &nb->waiting;
  bool sent = false;
  while (*pp) {
    nbpriv *p = *pp;
    if (p->pol->due_ns > now) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    p->next = NULL;
    tg__eng_submit(&nb->eng, &p->er); /* from the start: the map's node */
    sent = true;
  }
  if (sent)
    settle(nb);
  return TG_OK;
}

tg_nb_req *tg_nb_done(tg_nb *nb) {
  if (!nb)
    return NULL;
  if (nb->local_head) {
    nbpriv *p = nb->local_head;
    nb->local_head = p->next;
    if (!nb->local_head)
      nb->local_tail = NULL;
    nb->pending--;
    return p->er.owner;
  }
  tg__ereq *r;
  tg_nb_req *req;
  nbpriv *p;
  do {
    if (!(r = tg__eng_done(&nb->eng)))
      return NULL;
    req = r->owner;
    p = priv(req);
  } while (r->status == TG__ETRYAGAIN && p->pol && policy_waits(nb, p));
  if (r->status == TG__ETRYAGAIN)
    r->status = TG_ESTORE; /* the slot stayed split for every try */
  if (p->pol)
    policy_done(nb, req, p, r->status);
  else if (r->call.op == TG__OP_RESERVE)
    req->status = reserved(nb->lim, &r->call, &p->q, r->status, &r->out, req);
  else
    req->status = tg__limiter_answer(nb->lim, &r->call, &p->q, p->when,
                                     r->status, &r->out, &req->result);
  nb->pending--;
  return req;
}

size_t tg_nb_pending(const tg_nb *nb) { return nb ? nb->pending : 0; }

unsigned tg_nb_links(const tg_nb *nb) {
  return nb ? (unsigned)tg__eng_nodes(&nb->eng) : 0;
}

static bool link_ok(const tg_nb *nb, unsigned link) {
  return nb && link < tg__eng_nodes(&nb->eng);
}

unsigned tg_nb_wants(const tg_nb *nb, unsigned link) {
  if (!link_ok(nb, link) || nb->down[link])
    return 0;
  unsigned w = tg__eng_wants(&nb->eng, link), out = 0;
  if (w & TG__WANT_CONNECT)
    out |= TG_NB_CONNECT;
  if (w & TG__WANT_WRITE)
    out |= TG_NB_WRITE;
  if (w & TG__WANT_READ)
    out |= TG_NB_READ;
  return out;
}

int tg_nb_address(const tg_nb *nb, unsigned link, const char **host,
                  int *port) {
  if (!link_ok(nb, link) || !host || !port)
    return TG_EINVAL;
  const tg__node *d = tg__slotmap_addr(&nb->map, link);
  *host = d->host;
  *port = d->port;
  return TG_OK;
}

int tg_nb_connected(tg_nb *nb, unsigned link) {
  if (!link_ok(nb, link) || nb->down[link] || tg__eng_open(&nb->eng, link))
    return TG_EINVAL;
  int rc = tg__eng_connected(&nb->eng, link);
  settle(nb);
  return rc;
}

int tg_nb_output(tg_nb *nb, unsigned link, const void **data, size_t *len) {
  if (!link_ok(nb, link) || !data || !len)
    return TG_EINVAL;
  const char *p;
  tg__eng_output(&nb->eng, link, &p, len);
  *data = p;
  return TG_OK;
}

int tg_nb_written(tg_nb *nb, unsigned link, size_t n) {
  if (!link_ok(nb, link))
    return TG_EINVAL;
  tg__eng_written(&nb->eng, link, n);
  return TG_OK;
}

/* Node `link` is down with `code`: its connection is dropped, its calls
 * and any new ones answered at once, and a Cluster asks for a new map. */
static void mark_down(tg_nb *nb, unsigned link, int code) {
  tg__eng_closed(&nb->eng, link, code);
  nb->down[link] = code;
  nb->last_down = code;
  nb->eng.want_refresh = nb->eng.cfg.cluster;
  settle(nb);
}

int tg_nb_input(tg_nb *nb, unsigned link, const void *data, size_t len) {
  if (!link_ok(nb, link) || (!data && len > 0))
    return TG_EINVAL;
  int rc = tg__eng_input(&nb->eng, link, data, len);
  if (rc == TG_EINVAL)
    return rc; /* not connected: nothing read, nothing changed */
  if (rc != TG_OK)
    mark_down(nb, link, rc);
  else
    settle(nb);
  return rc;
}

int tg_nb_closed(tg_nb *nb, unsigned link, int code) {
  if (!link_ok(nb, link) || !store_code(code))
    return TG_EINVAL;
  tg__eng_closed(&nb->eng, link, code);
  settle(nb);
  return TG_OK;
}

int tg_nb_down(tg_nb *nb, unsigned link, int code) {
  if (!link_ok(nb, link) || !store_code(code))
    return TG_EINVAL;
  mark_down(nb, link, code);
  return TG_OK;
}

int tg_nb_up(tg_nb *nb, unsigned link) {
  if (!link_ok(nb, link))
    return TG_EINVAL;
  nb->down[link] = 0;
  settle(nb);
  return TG_OK;
}

int tg_nb_stats(const tg_nb *nb, tg_stats *out, size_t size) {
  if (!nb || !out || size == 0)
    return TG_EINVAL;
  tg_stats st;
  tg__limiter_stats_read(nb->lim, &st);
  st.moved = nb->st.moved;
  st.ask = nb->st.ask;
  st.resent = nb->st.resent;
  st.slot_refreshes = nb->st.refreshes;
  memcpy(out, &st, size < sizeof st ? size : sizeof st);
  return TG_OK;
}
