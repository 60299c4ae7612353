/* SPDX-License-Identifier: MIT */
/*
 * commands.c - the command set of `tollgate serve` (see commands.h).
 *
 * Rate-limiting commands (one per library operation; README.md documents
 * them for users):
 *
 *   TG.HIT key algorithm limit period_ms [BURST n] [COST n]
 *       -> *6 allowed, count, remaining, retry_after_ms, reset_after_ms,
 *             degraded           (retry_after_ms -1 means "never")
 *   TG.INC key algorithm limit period_ms [COST n]            -> count
 *   TG.GET key algorithm limit period_ms [BURST n]           -> value
 *   TG.SET key algorithm limit period_ms value [BURST n]     -> OK
 *   TG.EXPIRESAT key algorithm limit period_ms [BURST n]     -> ms or 0
 *   TG.RESET key [algorithm]                                 -> OK
 *   TG.POLICY key algorithm limit period_ms [BURST n] [COST n] key ...
 *       -> *7 TG.HIT's six for the policy, then the index of the first
 *             rule that denied (-1: none): tg_hit_rules, all or nothing
 *
 * and what clients expect of a Redis-speaking server: AUTH, PING, ECHO,
 * QUIT, INFO, DBSIZE, SELECT 0, HELLO [2 [AUTH user pass] [SETNAME n]],
 * COMMAND [COUNT|INFO|DOCS], CLIENT SETNAME/GETNAME/SETINFO/ID, CONFIG GET
 * (save and appendonly only). With a password set, everything but AUTH,
 * HELLO and QUIT answers -NOAUTH until the client has authenticated, with
 * Redis's words, so client libraries react as they do to Redis.
 *
 * The TG.* commands' arguments are parsed, and TG.HIT's reply shaped, by
 * src/command/command.c, which the Redis module uses too: both servers
 * speak one protocol. A library status becomes an error reply whose first
 * word is the code's name: "-TG_EQUOTA invalid quota (limit 0, period 0 or
 * out of range)".
 * Integers in requests are decimal, 0..2^63-1 (RESP integers are signed);
 * replies saturate at 2^63-1, which only a window count can reach.
 */
#include "commands.h"

#include "command/command.h"

#include <ctype.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A request can carry the longest policy: TG_RULES_MAX rules of 8 */
_Static_assert(RESP_MAX_ARGS >= 1 + 8 * TG_RULES_MAX,
               "RESP_MAX_ARGS too small for TG.POLICY");

/* ---- small helpers ---- */

static char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* Case-insensitive comparison of an argument with a lowercase word. */
static bool arg_is(const resp_arg *a, const char *word) {
  size_t n = strlen(word);
  if (a->len != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (lower(a->ptr[i]) != word[i])
      return false;
  return true;
}

/* Parses a decimal integer 0..INT64_MAX (digits only). Returns 0 or -1. */
static int parse_u63(const resp_arg *a, uint64_t *out) {
  if (a->len == 0 || a->len > 19)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < a->len; i++) {
    char c = a->ptr[i];
    if (c < '0' || c > '9')
      return -1;
    v = v * 10u + (uint64_t)(c - '0');
  }
  if (v > (uint64_t)INT64_MAX)
    return -1;
  *out = v;
  return 0;
}

int cmd_parse_algorithm(const char *p, size_t len, tg_algorithm *alg) {
  return tg__cmd_parse_algorithm(p, len, alg);
}

static void err_tg(outbuf *o, int rc) {
  out_error(o, tg_err_name(rc), tg_strerror(rc));
}

/* One request being run: what every handler gets. */
typedef struct call {
  cmd_ctx *ctx;
  cmd_session *cl;
  const resp_arg *argv;
  size_t argc;
  uint64_t now_us;
  outbuf *out;
} call;

/* ---- the store: which limiter, and what its answer says ---- */

/* The limiter for a call on algorithm a: lim[a], or while a shared-memory
 * lock is known to be held by a stuck process, its twin that does not wait
 * (see cmd_ctx.lim_nowait). *patient says which. */
static tg_limiter *pick(const cmd_ctx *ctx, tg_algorithm a, bool *patient) {
  *patient = true;
  if (ctx->lim_nowait[a] && ctx->mono_ms < ctx->busy_until_ms[a]) {
    *patient = false;
    return ctx->lim_nowait[a];
  }
  return ctx->lim[a];
}

/* Algorithm a's counters: its limiter's, plus those of the twin that
 * answers while a lock is stuck (pick), field by field. False when a is
 * not served. INFO and /metrics both read them here. */
static bool algorithm_stats(const cmd_ctx *ctx, int a, tg_stats *st) {
  if (!ctx->lim[a] || tg_limiter_stats(ctx->lim[a], st, sizeof *st) != 0)
    return false;
  tg_stats tw;
  if (ctx->lim_nowait[a] &&
      tg_limiter_stats(ctx->lim_nowait[a], &tw, sizeof tw) == 0) {
    _Static_assert(sizeof(tg_stats) % sizeof(uint64_t) == 0,
                   "tg_stats holds 64-bit counters only");
    for (size_t off = 0; off < sizeof tw; off += sizeof(uint64_t)) {
      uint64_t x, y;
      memcpy(&x, (const char *)st + off, sizeof x);
      memcpy(&y, (const char *)&tw + off, sizeof y);
      x += y;
      memcpy((char *)st + off, &x, sizeof x);
    }
  }
  return true;
}

/* Records what a call that went to the store answered: the lock backoff
 * (TG_EBUSY from the waiting limiter means it waited the whole timeout) and
 * the store's health. */
static void store_done(cmd_ctx *ctx, tg_algorithm a, bool patient, int rc) {
  if (rc == TG_EBUSY && patient && ctx->lim_nowait[a]) {
    ctx->busy_until_ms[a] = ctx->mono_ms + ctx->backoff_ms;
    ctx->stats.lock_waits++;
  }
  health_note(&ctx->health, rc, a, ctx->mono_ms);
}

/* ---- the TG.* commands ---- */

/* What every TG.* command shares: key, limiter, quota, and the options. */
typedef struct tg_args {
  const void *key;
  size_t key_len;
  tg_algorithm alg;
  tg_limiter *lim;
  bool patient; /* lim is lim[alg], not its twin that does not wait */
  tg_quota q;
  uint64_t cost;  /* COST, default 1 */
  uint64_t value; /* TG.SET's value */
} tg_args;

__extension__ typedef unsigned __int128 u128;

/* --max-period-ms: whether a key under quota q is fresh again (its slot
 * reclaimable) at most max_ms after its last write. A window or log is
 * after period_ms; a bucket after it refills (token) or drains (leaky) a
 * whole burst, period_ms x burst / limit, longer than period_ms when burst
 * exceeds limit. Compared in 128 bits: both products may pass 2^64. */
static bool within_max_period(uint64_t max_ms, tg_algorithm alg,
                              const tg_quota *q) {
  if (q->period_ms > max_ms)
    return false;
  if (alg != TG_TOKEN_BUCKET && alg != TG_LEAKY_BUCKET)
    return true;
  uint64_t burst = q->burst ? q->burst : q->limit;
  return q->limit == 0 || /* TG_EQUOTA follows */
         (u128)q->period_ms * burst <= (u128)max_ms * q->limit;
}

/* Whether q's period is within --max-period-ms; if not, writes the
 * -ERR reply (naming the rule of a policy, when rule is not NULL) and
 * counts it. */
static bool period_ok(const call *c, tg_algorithm alg, const tg_quota *q,
                      const size_t *rule) {
  cmd_ctx *ctx = c->ctx;
  if (!ctx->max_period_ms || within_max_period(ctx->max_period_ms, alg, q))
    return true;
  char which[48] = "";
  if (rule)
    snprintf(which, sizeof which, " (rule %zu)", *rule);
  char msg[240];
  snprintf(msg, sizeof msg,
           "period_ms %" PRIu64 "%s%s is above this server's limit of %" PRIu64
           " (--max-period-ms)",
           q->period_ms,
           q->period_ms <= ctx->max_period_ms
               ? " x burst / limit (the time a bucket takes to refill)"
               : "",
           which, ctx->max_period_ms);
  out_error(c->out, "ERR", msg);
  ctx->stats.period_refused++;
  return false;
}

/* Parses the request with the parser the Redis module shares
 * (src/command/command.h), then checks what this server adds (a limiter
 * for the algorithm, --max-period-ms) and picks the limiter. On error
 * writes the reply and returns -1. */
static int parse_tg(const call *c, tg__cmd_id id, tg_args *t) {
  outbuf *o = c->out;
  tg__cmd_arg av[RESP_MAX_ARGS];
  for (size_t i = 0; i < c->argc && i < RESP_MAX_ARGS; i++)
    av[i] = (tg__cmd_arg){c->argv[i].ptr, c->argv[i].len};
  tg__cmd cmd;
  tg__cmd_error err;
  if (tg__cmd_parse(id, av, c->argc, &cmd, &err) != 0) {
    out_error_quoted(o, "ERR", err.before, err.quoted, err.quoted_len,
                     err.after);
    return -1;
  }
  tg_algorithm alg = cmd.alg;
  t->key = cmd.key;
  t->key_len = cmd.key_len;
  t->alg = alg;
  t->lim = c->ctx->lim[alg];
  t->q = cmd.q;
  t->cost = cmd.arg;
  t->value = cmd.arg;
  if (!t->lim) {
    out_error(o, "ERR", "this server holds no limiter for that algorithm");
    return -1;
  }
  const cmd_ctx *ctx = c->ctx;
  if (!period_ok(c, alg, &t->q, NULL))
    return -1;
  t->lim = pick(ctx, alg, &t->patient);
  return 0;
}

/* --max-new-keys-per-client: a request that would create the key (its
 * state is fresh now: absent, or decayed) spends one token of the client's
 * budget; without one it is refused with -NEWKEYS and a wait, before it
 * reaches the limiter. Returns false after writing that reply. A store that
 * cannot say whether the key is fresh lets the request through: the request
 * itself then meets the same failure and answers by the failure policy. */
/* Whether the write t would create its key (the key's state is fresh).
 * A key that cannot be read is not counted: the request goes on to meet
 * the failure (and, if this call waited for a stuck lock, must not wait
 * again). */
static bool creates(const call *c, tg_args *t) {
  cmd_ctx *ctx = c->ctx;
  uint64_t at;
  int rc =
      ctx->store_time
          ? tg_expires_at(t->lim, t->key, t->key_len, &t->q, &at)
          : tg_expires_at_at(t->lim, c->now_us, t->key, t->key_len, &t->q, &at);
  if (rc != TG_OK) {
    store_done(ctx, t->alg, t->patient, rc);
    t->lim = pick(ctx, t->alg, &t->patient);
    return false;
  }
  return at == 0;
}

/* The new-key tokens a request spent: a reservation on the client's
 * budget (a token bucket), so that they can be given back. */
typedef struct key_spend {
  uint64_t keys;
  tg_reservation res;
} key_spend;

static const unsigned char unknown_client[1] = {'?'};

static const void *client_name(const cmd_session *cl, size_t *len) {
  *len = cl->who_len ? cl->who_len : 1;
  return cl->who_len ? (const void *)cl->who : unknown_client;
}

/* Spends `keys` new-key tokens of the client's budget at once (all or
 * none) into *sp; false, with the NEWKEYS error written, when it has not
 * that many. */
static bool spend_new_keys(const call *c, uint64_t keys, key_spend *sp) {
  cmd_ctx *ctx = c->ctx;
  sp->keys = 0;
  if (keys == 0)
    return true;
  size_t wl;
  const void *who = client_name(c->cl, &wl);
  int rc = tg_reserve_at(ctx->new_keys, c->now_us, who, wl, &ctx->new_keys_q,
                         keys, 0, &sp->res);
  const tg_result *r = &sp->res.result;
  if (sp->res.ok) { /* TG_OK, or a failure the budget's policy let through */
    sp->keys = rc == TG_OK ? keys : 0;
    return true;
  }
  ctx->stats.new_keys_refused++;
  char msg[200];
  if (rc == TG_OK && r->retry_after_ms == TG_NEVER)
    snprintf(msg, sizeof msg,
             "this client may create %" PRIu64 " new keys per %" PRIu64
             " ms (--max-new-keys-per-client), and this request would "
             "create %" PRIu64,
             ctx->new_keys_q.limit, ctx->new_keys_q.period_ms, keys);
  else
    snprintf(msg, sizeof msg,
             "this client may create %" PRIu64 " new keys per %" PRIu64
             " ms (--max-new-keys-per-client); retry in %" PRIu64 " ms",
             ctx->new_keys_q.limit, ctx->new_keys_q.period_ms,
             rc == TG_OK ? r->retry_after_ms : ctx->new_keys_q.period_ms);
  out_error(c->out, "NEWKEYS", msg);
  return false;
}

/* The library refused the request's input (an operation the algorithm
 * does not have, a value above the burst, a policy naming a key twice):
 * nothing was written, so the tokens it spent go back to the client. */
static void refund_new_keys(const call *c, key_spend *sp, int rc) {
  if (sp->keys == 0 || !(rc == TG_EINVAL || rc == TG_EQUOTA || rc == TG_EKEY ||
                         rc == TG_ENOTSUP || rc == TG_ERANGE))
    return;
  size_t wl;
  const void *who = client_name(c->cl, &wl);
  (void)tg_cancel_at(c->ctx->new_keys, c->now_us, who, wl, &c->ctx->new_keys_q,
                     &sp->res);
  sp->keys = 0;
}

/* A write on t spends a new-key token when it creates the key. */
static bool may_create(const call *c, tg_args *t, key_spend *sp) {
  sp->keys = 0;
  if (!c->ctx->new_keys)
    return true;
  return spend_new_keys(c, creates(c, t) ? 1 : 0, sp);
}

/* TG.HIT's reply for what tg_hit returned, counted in the stats. */
static void hit_out(cmd_ctx *ctx, int rc, const tg_result *r, outbuf *out) {
  if (rc != TG_OK && !(r->degraded && ctx->policy != TG_POLICY_ERROR)) {
    err_tg(out, rc);
    return;
  }
  serve_stats *s = &ctx->stats;
  if (r->allowed)
    s->allowed++;
  else
    s->denied++;
  if (r->degraded)
    s->degraded++;
  int64_t v[6];
  tg__cmd_hit_reply(r, v);
  out_array(out, 6);
  for (int i = 0; i < 6; i++)
    out_int(out, v[i]);
}

static void cmd_hit(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_HIT, &t) != 0)
    return;
  key_spend sp = {0};
  if (t.cost > 0 && !may_create(c, &t, &sp))
    return;
  tg_result r;
  int rc =
      c->ctx->store_time
          ? tg_hit(t.lim, t.key, t.key_len, &t.q, t.cost, &r)
          : tg_hit_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.cost, &r);
  refund_new_keys(c, &sp, rc);
  store_done(c->ctx, t.alg, t.patient, rc);
  hit_out(c->ctx, rc, &r, c->out);
}

/* TG.POLICY: the rules parsed by src/command, each checked as TG.HIT's
 * arguments are (a limiter for its algorithm, --max-period-ms, the
 * new-key budget), then one tg_hit_rules. */
static void cmd_policy(const call *c) {
  cmd_ctx *ctx = c->ctx;
  tg__cmd_arg av[RESP_MAX_ARGS];
  for (size_t i = 0; i < c->argc && i < RESP_MAX_ARGS; i++)
    av[i] = (tg__cmd_arg){c->argv[i].ptr, c->argv[i].len};
  tg__cmd cmds[TG_RULES_MAX];
  size_t n;
  tg__cmd_error err;
  if (tg__cmd_parse_policy(av, c->argc, cmds, TG_RULES_MAX, &n, &err) != 0) {
    out_error_quoted(c->out, "ERR", err.before, err.quoted, err.quoted_len,
                     err.after);
    return;
  }
  tg_rule rules[TG_RULES_MAX];
  tg_args t[TG_RULES_MAX];
  for (size_t i = 0; i < n; i++) {
    const tg__cmd *cmd = &cmds[i];
    t[i] = (tg_args){cmd->key, cmd->key_len, cmd->alg, ctx->lim[cmd->alg],
                     true,     cmd->q,       cmd->arg, 0};
    if (!t[i].lim) {
      out_error(c->out, "ERR",
                "this server holds no limiter for that algorithm");
      return;
    }
    if (!period_ok(c, cmd->alg, &cmd->q, &i))
      return;
    t[i].lim = pick(ctx, cmd->alg, &t[i].patient);
  }
  /* the keys it would create are paid for at once, all or none: a
   * refused policy spends nothing (each rule paying in turn spent the
   * tokens of the rules before the one refused) */
  uint64_t fresh = 0;
  for (size_t i = 0; i < n; i++) {
    if (ctx->new_keys && t[i].cost > 0 && creates(c, &t[i]))
      fresh++;
    rules[i] =
        (tg_rule){t[i].lim, t[i].key, t[i].key_len, &t[i].q, t[i].cost, 0, {0}};
  }
  key_spend sp;
  if (!spend_new_keys(c, fresh, &sp))
    return;
  tg_rules_result out;
  int rc = ctx->store_time ? tg_hit_rules(rules, n, 0, &out)
                           : tg_hit_rules_at(c->now_us, rules, n, 0, &out);
  refund_new_keys(c, &sp, rc);
  if (rc != TG_OK && out.denied_by < n)
    store_done(ctx, t[out.denied_by].alg, t[out.denied_by].patient, rc);
  else
    for (size_t i = 0; i < n; i++)
      store_done(ctx, t[i].alg, t[i].patient, TG_OK);
  if (rc != TG_OK && !(out.r.degraded && ctx->policy != TG_POLICY_ERROR)) {
    err_tg(c->out, rc);
    return;
  }
  serve_stats *s = &ctx->stats;
  if (out.r.allowed)
    s->allowed++;
  else
    s->denied++;
  if (out.r.degraded)
    s->degraded++;
  int64_t v[6];
  tg__cmd_hit_reply(&out.r, v);
  out_array(c->out, 7);
  for (int i = 0; i < 6; i++)
    out_int(c->out, v[i]);
  out_int(c->out, out.denied_by < n ? (int64_t)out.denied_by : -1);
}

static void cmd_inc(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_INC, &t) != 0)
    return;
  key_spend sp = {0};
  if (t.cost > 0 && !may_create(c, &t, &sp))
    return;
  uint64_t count;
  int rc =
      c->ctx->store_time
          ? tg_inc(t.lim, t.key, t.key_len, &t.q, t.cost, &count)
          : tg_inc_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.cost, &count);
  refund_new_keys(c, &sp, rc);
  store_done(c->ctx, t.alg, t.patient, rc);
  if (rc != TG_OK)
    err_tg(c->out, rc);
  else
    out_uint(c->out, count);
}

static void cmd_get(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_GET, &t) != 0)
    return;
  uint64_t v;
  int rc = c->ctx->store_time
               ? tg_get(t.lim, t.key, t.key_len, &t.q, &v)
               : tg_get_at(t.lim, c->now_us, t.key, t.key_len, &t.q, &v);
  store_done(c->ctx, t.alg, t.patient, rc);
  if (rc != TG_OK)
    err_tg(c->out, rc);
  else
    out_uint(c->out, v);
}

static void cmd_set(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_SET, &t) != 0)
    return;
  key_spend sp;
  if (!may_create(c, &t, &sp))
    return;
  int rc = c->ctx->store_time
               ? tg_set(t.lim, t.key, t.key_len, &t.q, t.value)
               : tg_set_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.value);
  refund_new_keys(c, &sp, rc);
  store_done(c->ctx, t.alg, t.patient, rc);
  if (rc != TG_OK)
    err_tg(c->out, rc);
  else
    out_status(c->out, "OK");
}

static void cmd_expiresat(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_EXPIRESAT, &t) != 0)
    return;
  uint64_t at;
  int rc =
      c->ctx->store_time
          ? tg_expires_at(t.lim, t.key, t.key_len, &t.q, &at)
          : tg_expires_at_at(t.lim, c->now_us, t.key, t.key_len, &t.q, &at);
  store_done(c->ctx, t.alg, t.patient, rc);
  if (rc != TG_OK)
    err_tg(c->out, rc);
  else
    out_uint(c->out, at);
}

static void cmd_reset(const call *c) {
  tg__cmd_arg av[3];
  for (size_t i = 0; i < c->argc && i < 3; i++)
    av[i] = (tg__cmd_arg){c->argv[i].ptr, c->argv[i].len};
  tg__cmd cmd;
  tg__cmd_error err;
  if (tg__cmd_parse(TG__CMD_RESET, av, c->argc, &cmd, &err) != 0) {
    out_error_quoted(c->out, "ERR", err.before, err.quoted, err.quoted_len,
                     err.after);
    return;
  }
  int first = cmd.all_algorithms ? 0 : (int)cmd.alg;
  int last = cmd.all_algorithms ? TG_ALGORITHM_COUNT - 1 : (int)cmd.alg;
  for (int a = first; a <= last; a++) {
    if (!c->ctx->lim[a])
      continue;
    bool patient;
    tg_limiter *lim = pick(c->ctx, (tg_algorithm)a, &patient);
    int rc = tg_reset(lim, c->argv[1].ptr, c->argv[1].len);
    store_done(c->ctx, (tg_algorithm)a, patient, rc);
    if (rc != TG_OK) {
      err_tg(c->out, rc);
      return;
    }
  }
  out_status(c->out, "OK");
}

/* ---- what Redis clients expect ---- */

static void cmd_ping(const call *c) {
  if (c->argc == 1)
    out_status(c->out, "PONG");
  else
    out_bulk(c->out, c->argv[1].ptr, c->argv[1].len);
}

static void cmd_echo(const call *c) {
  out_bulk(c->out, c->argv[1].ptr, c->argv[1].len);
}

static void cmd_quit(const call *c) { out_status(c->out, "OK"); }

static void cmd_select(const call *c) {
  if (c->argv[1].len == 1 && c->argv[1].ptr[0] == '0')
    out_status(c->out, "OK");
  else
    out_error(c->out, "ERR", "DB index is out of range");
}

static uint64_t total_keys(const cmd_ctx *ctx) {
  uint64_t n = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    if (ctx->lim[a])
      n += tg_key_count(ctx->lim[a]);
  return n;
}

static void cmd_dbsize(const call *c) { out_uint(c->out, total_keys(c->ctx)); }

/* CONFIG GET name: the two parameters redis-benchmark asks for at start,
 * answered truthfully (nothing is persisted); every other name matches
 * nothing, the empty answer Redis gives for an unknown one. */
static void cmd_config(const call *c) {
  if (!arg_is(&c->argv[1], "get") || c->argc != 3) {
    out_error(c->out, "ERR", "only CONFIG GET parameter is supported");
    return;
  }
  static const char *const params[][2] = {{"save", ""}, {"appendonly", "no"}};
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
    if (arg_is(&c->argv[2], params[i][0])) {
      out_array(c->out, 2);
      out_bulk_str(c->out, params[i][0]);
      out_bulk_str(c->out, params[i][1]);
      return;
    }
  out_array(c->out, 0);
}

/* CLIENT SETNAME/SETINFO (accepted, not kept), GETNAME (always null), ID. */
static void cmd_client(const call *c) {
  const resp_arg *argv = c->argv;
  if ((arg_is(&argv[1], "setname") && c->argc == 3) ||
      (arg_is(&argv[1], "setinfo") && c->argc == 4))
    out_status(c->out, "OK");
  else if (arg_is(&argv[1], "getname") && c->argc == 2)
    out_null(c->out);
  else if (arg_is(&argv[1], "id") && c->argc == 2)
    out_uint(c->out, c->cl->id);
  else
    out_error_quoted(c->out, "ERR", "unknown or unsupported subcommand '",
                     argv[1].ptr, argv[1].len, "'");
}

/* ---- authentication ---- */

int cmd_set_pass(cmd_ctx *ctx, const char *p, size_t len) {
  if (len == 0 || len > CMD_PASS_MAX)
    return -1;
  memset(ctx->pass, 0, sizeof ctx->pass);
  memcpy(ctx->pass, p, len);
  ctx->pass_len = len;
  ctx->pass_set = true;
  return 0;
}

/* Whether a client's attempt is the password, in a time that depends on
 * neither (only on CMD_PASS_MAX): both are compared as zero-padded
 * CMD_PASS_MAX-byte blocks without an early exit, so a client cannot find
 * the password byte by byte, or its length, by timing its attempts. */
static bool pass_matches(const cmd_ctx *ctx, const resp_arg *a) {
  unsigned char attempt[CMD_PASS_MAX];
  memset(attempt, 0, sizeof attempt);
  memcpy(attempt, a->ptr, a->len < sizeof attempt ? a->len : sizeof attempt);
  volatile unsigned char diff = (unsigned char)(a->len != ctx->pass_len);
  for (size_t i = 0; i < CMD_PASS_MAX; i++)
    diff |= (unsigned char)(attempt[i] ^ (unsigned char)ctx->pass[i]);
  return diff == 0;
}

/* Checks "user pass" (user may be NULL: AUTH pass). Only the default user
 * exists. With no password set, Redis's default user takes any password
 * when it is named, and AUTH pass alone is an error (the caller says so). */
static bool credentials_ok(const call *c, const resp_arg *user,
                           const resp_arg *pass) {
  bool ok = (!user || arg_is(user, "default")) &&
            (!c->ctx->pass_set || pass_matches(c->ctx, pass));
  if (ok)
    c->cl->authenticated = true;
  else
    c->ctx->stats.auth_failures++;
  return ok;
}

static void err_wrongpass(outbuf *o) {
  out_error(o, "WRONGPASS",
            "invalid username-password pair or user is disabled.");
}

/* AUTH [username] password */
static void cmd_auth(const call *c) {
  if (c->argc == 2 && !c->ctx->pass_set) {
    out_error(c->out, "ERR",
              "AUTH <password> called without any password configured for "
              "the default user. Are you sure your configuration is "
              "correct?");
    return;
  }
  const resp_arg *user = c->argc == 3 ? &c->argv[1] : NULL;
  if (credentials_ok(c, user, &c->argv[c->argc - 1]))
    out_status(c->out, "OK");
  else
    err_wrongpass(c->out);
}

/* HELLO [protover [AUTH username password] [SETNAME name]]: RESP2 only. */
static void cmd_hello(const call *c) {
  const resp_arg *argv = c->argv;
  outbuf *o = c->out;
  size_t i = 1;
  if (c->argc > 1) {
    uint64_t ver;
    if (parse_u63(&argv[1], &ver) != 0) {
      out_error(o, "ERR", "Protocol version is not an integer or out of range");
      return;
    }
    if (ver != 2) {
      out_error(o, "NOPROTO", "this protocol version is not supported");
      return;
    }
    i = 2;
  }
  const resp_arg *user = NULL, *pass = NULL;
  for (; i < c->argc; i++) {
    if (arg_is(&argv[i], "setname") && i + 1 < c->argc) {
      i++; /* accepted and forgotten: names are not kept */
    } else if (arg_is(&argv[i], "auth") && i + 2 < c->argc) {
      user = &argv[i + 1];
      pass = &argv[i + 2];
      i += 2;
    } else {
      out_error_quoted(o, "ERR", "option '", argv[i].ptr, argv[i].len,
                       "' is not supported");
      return;
    }
  }
  if (user && !credentials_ok(c, user, pass)) {
    err_wrongpass(o);
    return;
  }
  if (c->ctx->pass_set && !c->cl->authenticated) {
    out_error(o, "NOAUTH",
              "HELLO must be called with the client already authenticated, "
              "otherwise the HELLO <proto> AUTH <user> <pass> option can be "
              "used to authenticate the client and select the RESP protocol "
              "version at the same time");
    return;
  }
  out_array(o, 14);
  out_bulk_str(o, "server");
  out_bulk_str(o, "tollgate");
  out_bulk_str(o, "version");
  out_bulk_str(o, tg_version_string());
  out_bulk_str(o, "proto");
  out_int(o, 2);
  out_bulk_str(o, "id");
  out_uint(o, c->cl->id);
  out_bulk_str(o, "mode");
  out_bulk_str(o, "standalone");
  out_bulk_str(o, "role");
  out_bulk_str(o, "master");
  out_bulk_str(o, "modules");
  out_array(o, 0);
}

/* Resident memory of this process in bytes (Linux /proc), or 0. */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f)
    return 0;
  unsigned long long size = 0, resident = 0;
  int n = fscanf(f, "%llu %llu", &size, &resident);
  fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  if (n != 2 || page <= 0)
    return 0;
  return (uint64_t)resident * (uint64_t)page;
}

/* Appends a "name:value\r\n" line to the INFO text being built. */
static void info_line(outbuf *text, const char *name, const char *value) {
  out_raw(text, name, strlen(name));
  out_raw(text, ":", 1);
  out_raw(text, value, strlen(value));
  out_raw(text, "\r\n", 2);
}

static void info_u64(outbuf *text, const char *name, uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  info_line(text, name, buf);
}

/* Whether INFO's arguments ask for section `name` (no arguments, "all",
 * "everything" and "default" ask for all of them). */
static bool wants(const call *c, const char *name) {
  if (c->argc == 1)
    return true;
  for (size_t i = 1; i < c->argc; i++)
    if (arg_is(&c->argv[i], name) || arg_is(&c->argv[i], "all") ||
        arg_is(&c->argv[i], "everything") || arg_is(&c->argv[i], "default"))
      return true;
  return false;
}

static void cmd_info(const call *c) {
  const cmd_ctx *ctx = c->ctx;
  const serve_stats *s = &ctx->stats;
  outbuf text = {0};
  if (wants(c, "server")) {
    out_raw(&text, "# Server\r\n", 10);
    info_line(&text, "tollgate_version", tg_version_string());
    info_u64(&text, "process_id", (uint64_t)getpid());
    info_line(&text, "store", ctx->store ? ctx->store : "memory");
    int reason;
    unsigned algs;
    bool degraded = health_degraded(&ctx->health, &reason, &algs);
    info_line(&text, "store_status", degraded ? "degraded" : "ok");
    if (degraded) {
      info_line(&text, "store_last_error", tg_err_name(reason));
      char list[128] = "";
      size_t n = 0;
      for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
        if (algs & (1u << a))
          n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? "," : "",
                                tg_algorithm_name((tg_algorithm)a));
      info_line(&text, "store_degraded_algorithms", n ? list : "all");
    }
    if (ctx->tcp_port >= 0)
      info_u64(&text, "tcp_port", (uint64_t)ctx->tcp_port);
    if (ctx->unix_path)
      info_line(&text, "unix_socket", ctx->unix_path);
    info_u64(&text, "uptime_in_seconds",
             c->now_us > ctx->start_us ? (c->now_us - ctx->start_us) / 1000000u
                                       : 0);
    out_raw(&text, "\r\n", 2);
  }
  if (wants(c, "clients")) {
    out_raw(&text, "# Clients\r\n", 11);
    info_u64(&text, "connected_clients", s->clients);
    info_u64(&text, "maxclients", ctx->max_clients);
    out_raw(&text, "\r\n", 2);
  }
  if (wants(c, "memory")) {
    uint64_t store = 0;
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
      if (ctx->lim[a])
        store += tg_store_bytes(ctx->lim[a]);
    out_raw(&text, "# Memory\r\n", 10);
    info_u64(&text, "used_memory_rss", rss_bytes());
    info_u64(&text, "store_bytes", store);
    info_u64(&text, "client_buffer_bytes", s->buffer_bytes);
    out_raw(&text, "\r\n", 2);
  }
  if (wants(c, "stats")) {
    out_raw(&text, "# Stats\r\n", 9);
    info_u64(&text, "total_connections_received", s->connections_received);
    info_u64(&text, "rejected_connections", s->connections_rejected);
    info_u64(&text, "dropped_connections", s->connections_dropped);
    info_u64(&text, "total_commands_processed", s->commands);
    info_u64(&text, "total_error_replies", s->error_replies);
    /* each limiter's own counters (tg_limiter_stats), by algorithm */
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      tg_stats ls;
      if (!algorithm_stats(ctx, a, &ls))
        continue;
      char k[64];
      const char *an = tg_algorithm_name((tg_algorithm)a);
      uint64_t errors = 0;
      for (int e = 1; e < 32; e++)
        errors += ls.errors[e];
      const struct {
        const char *what;
        uint64_t v;
      } rows[] = {{"allowed", ls.allowed},
                  {"denied", ls.denied},
                  {"shadow_denied", ls.shadow_denied},
                  {"degraded", ls.degraded},
                  {"table_full", ls.table_full},
                  {"reclaimed", ls.reclaimed},
                  {"errors", errors}};
      for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        snprintf(k, sizeof k, "limiter_%s_%s", an, rows[r].what);
        info_u64(&text, k, rows[r].v);
      }
    }
    info_u64(&text, "decisions_allowed", s->allowed);
    info_u64(&text, "decisions_denied", s->denied);
    info_u64(&text, "decisions_degraded", s->degraded);
    info_u64(&text, "store_lock_waits", s->lock_waits);
    info_u64(&text, "requests_over_max_period", s->period_refused);
    info_u64(&text, "requests_over_new_key_budget", s->new_keys_refused);
    info_u64(&text, "auth_failures", s->auth_failures);
    info_u64(&text, "http_requests_refused", s->http_refused);
    out_raw(&text, "\r\n", 2);
  }
  if (wants(c, "keyspace")) {
    out_raw(&text, "# Keyspace\r\n", 12);
    info_u64(&text, "keys", total_keys(ctx));
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      if (!ctx->lim[a])
        continue;
      char name[48];
      snprintf(name, sizeof name, "keys_%s",
               tg_algorithm_name((tg_algorithm)a));
      info_u64(&text, name, tg_key_count(ctx->lim[a]));
    }
    out_raw(&text, "\r\n", 2);
  }
  if (text.failed)
    out_error(c->out, "ERR", "out of memory");
  else
    out_bulk(c->out, text.data ? text.data : "", text.len);
  out_free(&text);
}

static void cmd_command(const call *c);

/* ---- the table ---- */

/* One command. arity follows Redis's COMMAND convention: N means exactly N
 * arguments (the name included), -N at least N. */
typedef struct command {
  const char *name; /* lowercase */
  int arity;
  size_t max_args; /* most arguments accepted (the name included) */
  const char *flags[3];
  int first_key, last_key, step;
  void (*fn)(const call *c);
  cmd_after after; /* CMD_CLOSE for QUIT */
} command;

#define ANY RESP_MAX_ARGS
/* Hot commands first: lookup is a linear scan. */
static const command COMMANDS[] = {
    {"tg.hit", -5, 9, {"write", "fast", NULL}, 1, 1, 1, cmd_hit, CMD_KEEP},
    {"tg.inc", -5, 7, {"write", "fast", NULL}, 1, 1, 1, cmd_inc, CMD_KEEP},
    {"tg.get", -5, 7, {"readonly", "fast", NULL}, 1, 1, 1, cmd_get, CMD_KEEP},
    {"tg.set", -6, 8, {"write", "fast", NULL}, 1, 1, 1, cmd_set, CMD_KEEP},
    {"tg.expiresat",
     -5,
     7,
     {"readonly", "fast", NULL},
     1,
     1,
     1,
     cmd_expiresat,
     CMD_KEEP},
    {"tg.reset", -2, 3, {"write", "fast", NULL}, 1, 1, 1, cmd_reset, CMD_KEEP},
    /* keys: 1, then one every 4 words plus options; COMMAND cannot say
     * that, so it names the first (as for TG.HIT) */
    {"tg.policy",
     -5,
     ANY,
     {"write", NULL, NULL},
     1,
     1,
     1,
     cmd_policy,
     CMD_KEEP},
    {"ping", -1, 2, {"fast", NULL, NULL}, 0, 0, 0, cmd_ping, CMD_KEEP},
    {"auth",
     -2,
     3,
     {"noscript", "loading", "fast"},
     0,
     0,
     0,
     cmd_auth,
     CMD_KEEP},
    {"echo", 2, 2, {"fast", NULL, NULL}, 0, 0, 0, cmd_echo, CMD_KEEP},
    {"quit", -1, ANY, {"fast", NULL, NULL}, 0, 0, 0, cmd_quit, CMD_CLOSE},
    {"info", -1, ANY, {"loading", NULL, NULL}, 0, 0, 0, cmd_info, CMD_KEEP},
    {"dbsize", 1, 1, {"readonly", "fast", NULL}, 0, 0, 0, cmd_dbsize, CMD_KEEP},
    {"select", 2, 2, {"fast", NULL, NULL}, 0, 0, 0, cmd_select, CMD_KEEP},
    {"hello", -1, ANY, {"fast", NULL, NULL}, 0, 0, 0, cmd_hello, CMD_KEEP},
    {"command",
     -1,
     ANY,
     {"loading", NULL, NULL},
     0,
     0,
     0,
     cmd_command,
     CMD_KEEP},
    {"client", -2, ANY, {"loading", NULL, NULL}, 0, 0, 0, cmd_client, CMD_KEEP},
    {"config", -2, ANY, {"loading", NULL, NULL}, 0, 0, 0, cmd_config, CMD_KEEP},
};
#define COMMAND_COUNT (sizeof COMMANDS / sizeof COMMANDS[0])

static const command *lookup(const resp_arg *name) {
  for (size_t i = 0; i < COMMAND_COUNT; i++)
    if (arg_is(name, COMMANDS[i].name))
      return &COMMANDS[i];
  return NULL;
}

/* One COMMAND entry, shaped as Redis 7 does: name, arity, flags, first key,
 * last key, step, ACL categories, tips, key specs, subcommands. */
static void command_entry(const command *cmd, outbuf *o) {
  out_array(o, 10);
  out_bulk_str(o, cmd->name);
  out_int(o, cmd->arity);
  size_t nflags = 0;
  while (nflags < 3 && cmd->flags[nflags])
    nflags++;
  out_array(o, nflags);
  for (size_t i = 0; i < nflags; i++)
    out_status(o, cmd->flags[i]);
  out_int(o, cmd->first_key);
  out_int(o, cmd->last_key);
  out_int(o, cmd->step);
  for (int i = 0; i < 4; i++)
    out_array(o, 0);
}

static void cmd_command(const call *c) {
  const resp_arg *argv = c->argv;
  outbuf *o = c->out;
  if (c->argc == 1) {
    out_array(o, COMMAND_COUNT);
    for (size_t i = 0; i < COMMAND_COUNT; i++)
      command_entry(&COMMANDS[i], o);
  } else if (arg_is(&argv[1], "count") && c->argc == 2) {
    out_uint(o, COMMAND_COUNT);
  } else if (arg_is(&argv[1], "info")) {
    out_array(o, c->argc - 2);
    for (size_t i = 2; i < c->argc; i++) {
      const command *cmd = lookup(&argv[i]);
      if (cmd)
        command_entry(cmd, o);
      else
        out_null(o);
    }
  } else if (arg_is(&argv[1], "docs")) {
    out_array(o, 0); /* no documentation to give: redis-cli copes */
  } else {
    out_error_quoted(o, "ERR", "unknown subcommand '", argv[1].ptr, argv[1].len,
                     "'");
  }
}

/* Counts a request done, once its reply is out (so INFO does not count
 * itself, as in Redis). */
static void count(cmd_ctx *ctx, const outbuf *out, size_t before) {
  ctx->stats.commands++;
  if (out->len > before && out->data[before] == '-')
    ctx->stats.error_replies++;
}

/* The TG.HIT request r as a batch item (its quota in *q) that this server
 * would run as it is: it parses, its algorithm has a limiter, its quota is
 * within --max-period-ms. Else false: cmd_execute answers it. */
static bool hit_item(const cmd_ctx *ctx, const resp_request *r, tg_quota *q,
                     tg_batch_item *it, tg_algorithm *alg) {
  tg__cmd_arg av[9];
  if (r->argc < 5 || r->argc > 9 ||
      tg__cmd_lookup(r->argv[0].ptr, r->argv[0].len) != TG__CMD_HIT)
    return false;
  for (size_t i = 0; i < r->argc; i++)
    av[i] = (tg__cmd_arg){r->argv[i].ptr, r->argv[i].len};
  tg__cmd cmd;
  tg__cmd_error err;
  if (tg__cmd_parse(TG__CMD_HIT, av, r->argc, &cmd, &err) != 0 ||
      !ctx->lim[cmd.alg] ||
      (ctx->max_period_ms &&
       !within_max_period(ctx->max_period_ms, cmd.alg, &cmd.q)))
    return false;
  *q = cmd.q;
  *it = (tg_batch_item){cmd.key, cmd.key_len, q, cmd.arg, 0, {0}};
  *alg = cmd.alg;
  return true;
}

/* Runs the TG.HIT requests r[0..n) (all hit_item) with one tg_hit_batch
 * per limiter, then replies in order. Different limiters hold different
 * keys, so running each one's calls together, in order, decides as the
 * requests one by one would. */
static void hit_batch(cmd_ctx *ctx, const resp_request *r, size_t n,
                      outbuf *out) {
  tg_batch_item it[CMD_BATCH_MAX], sub[CMD_BATCH_MAX];
  tg_quota q[CMD_BATCH_MAX];
  tg_algorithm alg[CMD_BATCH_MAX];
  size_t at[CMD_BATCH_MAX];
  for (size_t i = 0; i < n; i++)
    (void)hit_item(ctx, &r[i], &q[i], &it[i], &alg[i]);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (alg[i] == (tg_algorithm)a) {
        at[m] = i;
        sub[m++] = it[i];
      }
    if (m == 0)
      continue;
    bool patient;
    int rc = tg_hit_batch(pick(ctx, (tg_algorithm)a, &patient), sub, m);
    for (size_t k = 0; k < m; k++) {
      it[at[k]] = sub[k];
      if (rc != TG_OK) /* not reached: the items are well-formed */
        it[at[k]].status = rc;
      store_done(ctx, (tg_algorithm)a, patient, it[at[k]].status);
    }
  }
  for (size_t i = 0; i < n; i++) {
    size_t before = out->len;
    hit_out(ctx, it[i].status, &it[i].result, out);
    count(ctx, out, before);
  }
}

cmd_after cmd_execute_batch(cmd_ctx *ctx, cmd_session *cl,
                            const resp_request *reqs, size_t n, uint64_t now_us,
                            outbuf *out) {
  /* a new-key budget checks each request with a call of its own, and a
   * client that has not authenticated gets NOAUTH: one at a time then */
  bool batch = ctx->store_time && !ctx->new_keys &&
               !(ctx->pass_set && !cl->authenticated);
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    tg_batch_item it;
    tg_quota q;
    tg_algorithm alg;
    while (batch && j < n && j - i < CMD_BATCH_MAX &&
           hit_item(ctx, &reqs[j], &q, &it, &alg))
      j++;
    if (j - i >= 2) {
      hit_batch(ctx, reqs + i, j - i, out);
      i = j;
      continue;
    }
    if (reqs[i].argc > 0) {
      cmd_after after =
          cmd_execute(ctx, cl, reqs[i].argv, reqs[i].argc, now_us, out);
      if (after == CMD_CLOSE)
        return CMD_CLOSE;
      /* AUTH may have let the client in: the rest may batch */
      batch = ctx->store_time && !ctx->new_keys &&
              !(ctx->pass_set && !cl->authenticated);
    }
    i++;
  }
  return CMD_KEEP;
}

/* The first word of an HTTP request ("POST") or of its Host header line. */
static bool http_line(const resp_arg *a) {
  return (a->len == 4 && strncasecmp(a->ptr, "post", 4) == 0) ||
         (a->len == 5 && strncasecmp(a->ptr, "host:", 5) == 0);
}

cmd_after cmd_execute(cmd_ctx *ctx, cmd_session *cl, const resp_arg *argv,
                      size_t argc, uint64_t now_us, outbuf *out) {
  size_t before = out->len;
  cmd_after after = CMD_KEEP;
  if (http_line(&argv[0])) {
    /* an HTTP request on the RESP port, as a web page can send one to a
     * loopback server (a POST's body would run as commands): nothing of
     * this connection runs, as Redis does for the same reason */
    fprintf(stderr,
            "tollgate serve: an HTTP request (\"%s\") on the RESP port, "
            "maybe a cross-protocol attack from a web page; connection "
            "closed\n",
            argv[0].len == 4 ? "POST" : "Host:");
    ctx->stats.http_refused++;
    return CMD_CLOSE;
  }
  const command *cmd = lookup(&argv[0]);
  if (ctx->pass_set && !cl->authenticated &&
      !(cmd &&
        (cmd->fn == cmd_auth || cmd->fn == cmd_hello || cmd->fn == cmd_quit))) {
    /* unknown commands too (Redis names them first): a client without the
     * password learns nothing of what this server answers */
    out_error(out, "NOAUTH", "Authentication required.");
  } else if (!cmd) {
    out_error_quoted(out, "ERR", "unknown command '", argv[0].ptr, argv[0].len,
                     "'");
  } else if ((cmd->arity > 0 && argc != (size_t)cmd->arity) ||
             (cmd->arity < 0 && argc < (size_t)-cmd->arity) ||
             argc > cmd->max_args) {
    char msg[64];
    snprintf(msg, sizeof msg, "wrong number of arguments for '%s' command",
             cmd->name);
    out_error(out, "ERR", msg);
  } else {
    const call c = {ctx, cl, argv, argc, now_us, out};
    cmd->fn(&c);
    after = cmd->after;
  }
  count(ctx, out, before);
  return after;
}

/* ---- the metrics endpoint (--metrics-port) ---- */

static void metric(outbuf *o, const char *name, const char *alg,
                   const char *extra, uint64_t v) {
  char line[256];
  int n;
  if (alg)
    n = snprintf(line, sizeof line, "%s{algorithm=\"%s\"%s} %" PRIu64 "\n",
                 name, alg, extra ? extra : "", v);
  else
    n = snprintf(line, sizeof line, "%s %" PRIu64 "\n", name, v);
  if (n > 0)
    out_raw(o, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void help(outbuf *o, const char *name, const char *type,
                 const char *text) {
  char line[256];
  int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name,
                   text, name, type);
  if (n > 0)
    out_raw(o, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* The body: one family at a time, a sample per algorithm served. */
static void metrics_body(const cmd_ctx *ctx, outbuf *o) {
  tg_stats st[TG_ALGORITHM_COUNT];
  bool have[TG_ALGORITHM_COUNT];
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    have[a] = algorithm_stats(ctx, a, &st[a]);
  static const struct {
    const char *name, *text;
    size_t off;
  } fam[] = {
      {"tollgate_allowed_total", "Decisions the limit allowed.",
       offsetof(tg_stats, allowed)},
      {"tollgate_denied_total", "Decisions the limit denied.",
       offsetof(tg_stats, denied)},
      {"tollgate_shadow_denied_total",
       "Shadow mode: let through, the limit would have denied.",
       offsetof(tg_stats, shadow_denied)},
      {"tollgate_degraded_total", "Answers the failure policy gave.",
       offsetof(tg_stats, degraded)},
      {"tollgate_table_full_total", "Decisions that found the table full.",
       offsetof(tg_stats, table_full)},
      {"tollgate_reclaimed_keys_total", "Keys cleaning passes reclaimed.",
       offsetof(tg_stats, reclaimed)},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
    help(o, fam[f].name, "counter", fam[f].text);
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      uint64_t v;
      if (!have[a])
        continue;
      memcpy(&v, (const char *)&st[a] + fam[f].off, sizeof v);
      metric(o, fam[f].name, tg_algorithm_name((tg_algorithm)a), NULL, v);
    }
  }
  help(o, "tollgate_errors_total", "counter",
       "Decision calls that returned a status code, by code.");
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    for (int e = 1; have[a] && e < 32; e++)
      if (st[a].errors[e]) {
        char extra[48];
        snprintf(extra, sizeof extra, ",code=\"%s\"", tg_err_name(-e));
        metric(o, "tollgate_errors_total", tg_algorithm_name((tg_algorithm)a),
               extra, st[a].errors[e]);
      }
  help(o, "tollgate_keys", "gauge", "Keys the store holds now.");
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    if (ctx->lim[a])
      metric(o, "tollgate_keys", tg_algorithm_name((tg_algorithm)a), NULL,
             tg_key_count(ctx->lim[a]));
  const serve_stats *s = &ctx->stats;
  help(o, "tollgate_commands_total", "counter", "Requests executed.");
  metric(o, "tollgate_commands_total", NULL, NULL, s->commands);
  help(o, "tollgate_connected_clients", "gauge", "Connections open now.");
  metric(o, "tollgate_connected_clients", NULL, NULL, s->clients);
  help(o, "tollgate_connections_received_total", "counter",
       "Connections accepted.");
  metric(o, "tollgate_connections_received_total", NULL, NULL,
         s->connections_received);
}

/* extra: header lines, each ending in CRLF, or "" */
static void http_reply(outbuf *o, const char *status, const char *type,
                       const char *extra, const outbuf *body, bool head) {
  char h[256];
  int n = snprintf(h, sizeof h,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\n%s"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, type, extra, body ? body->len : 0);
  if (n > 0)
    out_raw(o, h, (size_t)n);
  if (body && !head)
    out_raw(o, body->data, body->len);
}

/* Whether req starts with a request line RFC 9112 allows: a method
 * (token characters), one space, a target (no space or control), one
 * space, "HTTP/1." and a digit, CRLF (or a bare LF). */
static bool request_line_ok(const char *req) {
  static const char tchar[] = "!#$%&'*+-.^_`|~";
  const char *p = req;
  while (*p && (isalnum((unsigned char)*p) || strchr(tchar, *p)))
    p++;
  if (p == req || *p++ != ' ')
    return false;
  const char *t = p;
  while ((unsigned char)*p > ' ' && *p != 0x7f)
    p++;
  if (p == t || *p++ != ' ' || strncmp(p, "HTTP/1.", 7) != 0 ||
      !isdigit((unsigned char)p[7]))
    return false;
  p += 8;
  return (p[0] == '\r' && p[1] == '\n') || p[0] == '\n';
}

void cmd_metrics(const cmd_ctx *ctx, const char *req, size_t len, bool whole,
                 outbuf *out) {
  bool get = strncmp(req, "GET ", 4) == 0, head = strncmp(req, "HEAD ", 5) == 0;
  const char *path = get ? req + 4 : head ? req + 5 : NULL;
  /* a NUL is in no valid request head (RFC 9112 field values exclude it) */
  if (!whole || !request_line_ok(req) || memchr(req, '\0', len)) {
    http_reply(out, "400 Bad Request", "text/plain", "", NULL, false);
    return;
  }
  if (!path) {
    http_reply(out, "405 Method Not Allowed", "text/plain",
               "Allow: GET, HEAD\r\n", NULL, false);
    return;
  }
  size_t plen = strcspn(path, " ?\r\n");
  if (plen != 8 || strncmp(path, "/metrics", 8) != 0) {
    http_reply(out, "404 Not Found", "text/plain", "", NULL, head);
    return;
  }
  outbuf body = {0};
  metrics_body(ctx, &body);
  if (body.failed)
    http_reply(out, "500 Internal Server Error", "text/plain", "", NULL, head);
  else
    http_reply(out, "200 OK", "text/plain; version=0.0.4; charset=utf-8", "",
               &body, head);
  out_free(&body);
}
