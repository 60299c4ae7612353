/* SPDX-License-Identifier: MIT */
/*
 * module.c - tollgate as a Redis module (tollgate.so): the TG.* commands of
 * `tollgate serve`, run inside the server by src/core, the same compiled
 * arithmetic as the library, on state kept in the server's own keys.
 *
 * Keys. A command's key argument IS the Redis key: Cluster routes it (every
 * command declares key 1), and the module touches no other key. A key holds
 * one algorithm's state; a command naming another algorithm than the one
 * whose state the key holds answers TG_ECORRUPT and leaves it alone (a
 * client wanting two algorithms for one subject names two keys).
 *
 * Values. Plain strings in the encoding the library's Lua script writes
 * (src/store/redis_value.h), not a module data type: the library's script
 * and this module read each other's keys, so a server can load or unload
 * the module while limiters run; replicas, RDB and AOF hold ordinary
 * strings that a server without the module loads (and MEMORY USAGE, DEBUG
 * and GET work as for any string). A value that does not parse, or holds
 * numbers tollgate never writes, is TG_ECORRUPT and is never changed.
 *
 * Time is the server's clock, read once per command. Keys get a TTL until
 * their state is fresh: an absolute expiry at that moment, rounded up to the
 * ms (with a caller's now, see TG.STEP: the server's now plus the time
 * until fresh plus 1 s, the script's allowance).
 *
 * Replication. A decision reads the clock, so it is not replayable: the
 * module replicates what it wrote, never the command. A write goes to
 * replicas and the AOF as SET key value PXAT at_ms (or DEL key when a log
 * empties), so they hold the master's bytes and expiry exactly.
 *
 * Besides the public commands (src/command/command.h documents them), the
 * library's Redis store sends TG.STEP / TG.STEP_RO, which run one core step
 * as its script does and reply what the script replies (see the comment
 * above step_command), so the library computes every number it reports
 * itself and checks the module's transition against its own; TG.STEPS, a
 * policy's; and TG.PROTOCOL, which says this module takes their waits.
 */
#include "module_api.h"

#include "../src/command/command.h"
#include "../src/core/core.h"
#include "../src/store/redis_value.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define STR2(x) #x
#define STR(x) STR2(x)
#define VERSION_STRING                                                         \
  STR(TG_VERSION_MAJOR) "." STR(TG_VERSION_MINOR) "." STR(TG_VERSION_PATCH)
/* The two symbols Redis looks for: the only ones the module exports. */
#define MODULE_EXPORT __attribute__((visibility("default")))

/* The value of module argument SLIDING-MAX-ENTRIES when none is given (the
 * library's default). */
#define LOG_CAP_DEFAULT 1024u
#define LOG_CAP_MAX TG_SLIDING_ENTRIES_MAX

/* TG_MODULE_NO_WAITS: a test build (tollgate_nowait.so) that answers as a
 * module from before the waits: TG.STEP's eleventh argument and TG.STEPS's
 * eighth per rule are refused ("TGARG wrong number of arguments"), and
 * it has no TG.PROTOCOL, so the library's turns to the script can be
 * tested. */
#ifdef TG_MODULE_NO_WAITS
#define TAKES_WAITS 0
#else
#define TAKES_WAITS 1
#endif
/* ms a key outlives its state when the caller gave the now (the script's
 * allowance for a caller's clock running behind the server's). */
#define CALLER_NOW_SLACK_MS 1000

MODULE_EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx,
                                     RedisModuleString **argv, int argc);
MODULE_EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx);

/* sliding_max_entries for the public commands, from the load arguments. */
static uint32_t log_cap = LOG_CAP_DEFAULT;
/* "PXAT", made once at load: a replicated write's argument that is always
 * the same, passed by reference ('s') so that replicating a write builds
 * one string object fewer (RedisModule_Replicate allocates, then frees, an
 * object per argument it is given by value; it is the most expensive part
 * of a decision, see BENCHMARKS.md "Redis module"). */
static RedisModuleString *pxat_arg;

/* ---- small helpers ---- */

/* The server's clock in us: RedisModule_Microseconds (Redis 7.2 on), else
 * the same clock read here. TIME, which the script reads, is the server
 * process's gettimeofday(), so CLOCK_REALTIME is that clock; a module API
 * in ms (RedisModule_Milliseconds) would make every time the module
 * stores a whole ms, and its answers up to 1 ms apart from the script's. */
static uint64_t server_now_us(void) {
  if (RedisModule_Microseconds)
    return (uint64_t)RedisModule_Microseconds();
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0)
    return (uint64_t)RedisModule_Milliseconds() * 1000u;
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static tg__cmd_arg arg_of(RedisModuleString *s) {
  tg__cmd_arg a;
  a.ptr = RedisModule_StringPtrLen(s, &a.len);
  return a;
}

/* Not a library status: the call would write while the server is over
 * maxmemory (kcall.oom), and is refused as the server refuses a write. */
#define REFUSED_OOM (-1000)

/* A library status as an error reply: the code's name, then its message. */
static int reply_code(RedisModuleCtx *ctx, int rc, const char *detail) {
  if (rc == REFUSED_OOM)
    return RedisModule_ReplyWithError(
        ctx, "OOM command not allowed when used memory > 'maxmemory'.");
  char buf[256];
  (void)snprintf(buf, sizeof buf, "%s %s%s", tg_err_name(rc), tg_strerror(rc),
                 detail ? detail : "");
  return RedisModule_ReplyWithError(ctx, buf);
}

static int reply_u64_string(RedisModuleCtx *ctx, uint64_t v) {
  char buf[24];
  return RedisModule_ReplyWithStringBuffer(ctx, buf, tg__u64_dec(buf, v));
}

/* ---- one call on one key ----
 * A call reads the key, runs the core step on its state, and when the step
 * changed it (and the key may be written) stores the new state with its
 * expiry and replicates that write. */

typedef struct kcall {
  RedisModuleCtx *ctx;
  RedisModuleString *name; /* the key, as the client sent it */
  tg__call c;              /* now_us set */
  bool may_write;          /* the command may write and the call can */
  bool caller_now;         /* now came from the caller, not the clock */
  bool oom;                /* over maxmemory: a store is REFUSED_OOM */
  bool would_store;        /* the call (a write) stores a value, or would
                              have had it been allowed to write */
  uint64_t server_us;      /* the server's clock when the call began */
  const char *corrupt;     /* set when the value is refused: why */
} kcall;

/* Whether the server is over maxmemory now. The library's commands are
 * registered without deny-oom, so that, as the script does, they refuse
 * only a call that writes, and answer one that only reads (a bucket's
 * refusal, a denied policy) as usual. */
static bool over_maxmemory(RedisModuleCtx *ctx) {
  return RedisModule_GetContextFlags &&
         (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_OOM) != 0;
}

/* The absolute expiry, ms, of a state that stops mattering at expiry_us. */
static long long expire_at_ms(const kcall *k, uint64_t expiry_us) {
  /* at most about 1e13 ms either way (times below TG_NOW_MAX_US + the
   * longest period): no overflow, and it fits a long long */
  uint64_t at = k->caller_now ? k->server_us / 1000 +
                                    tg__ms_until(expiry_us, k->c.now_us) +
                                    CALLER_NOW_SLACK_MS
                              : tg__div_ceil(expiry_us, 1000);
  return (long long)at;
}

/* Stores value[0..len) under the open key, whose value has cur bytes
 * (SIZE_MAX: absent), with an expiry, and replicates it as SET key value
 * PXAT at. */
static int store_value(const kcall *k, RedisModuleKey *key, size_t cur,
                       const char *value, size_t len, long long at_ms) {
  if (k->oom)
    return REFUSED_OOM; /* nothing written */
  if (cur != len && RedisModule_StringTruncate(key, len) != REDISMODULE_OK)
    return TG_ESTORE;
  char *p = RedisModule_StringDMA(key, &cur, REDISMODULE_WRITE);
  if (!p || cur != len)
    return TG_ESTORE;
  memcpy(p, value, len);
  int rc;
  if (RedisModule_SetAbsExpire) {
    /* set every time, even when unchanged (a window's end): asking first
     * (RedisModule_GetAbsExpire) costs as many instructions as setting */
    rc = RedisModule_SetAbsExpire(key, at_ms);
  } else {
    long long rel = at_ms - RedisModule_Milliseconds();
    rc = RedisModule_SetExpire(key, rel > 0 ? rel : 1);
  }
  if (rc != REDISMODULE_OK)
    return TG_ESTORE;
  RedisModule_Replicate(k->ctx, "SET", "sbsl", k->name, value, len, pxat_arg,
                        at_ms);
  return TG_OK;
}

static void delete_value(const kcall *k, RedisModuleKey *key) {
  RedisModule_DeleteKey(key);
  RedisModule_Replicate(k->ctx, "DEL", "s", k->name);
}

/* The key's value, or why it is not a string (NULL value: absent). */
static bool read_value(kcall *k, RedisModuleKey *key, const char **value,
                       size_t *len) {
  int type = RedisModule_KeyType(key);
  *value = NULL;
  *len = 0;
  if (type == REDISMODULE_KEYTYPE_EMPTY)
    return true;
  if (type != REDISMODULE_KEYTYPE_STRING) {
    k->corrupt = " (the key holds another type)";
    return false;
  }
  *value = RedisModule_StringDMA(key, len, REDISMODULE_READ);
  return *value != NULL;
}

/* The detail of a corrupt value: whose state it is, when it is another
 * algorithm's (it parses as one), so that a client mixing algorithms on one
 * key learns why; nothing for a value that is no algorithm's. */
static const char *corrupt_detail(tg_algorithm alg, const char *v, size_t len) {
  static const char *const other[TG_ALGORITHM_COUNT] = {
      " (the key holds fixed_window state)",
      " (the key holds fixed_window_per_key state)",
      " (the key holds sliding_window state)",
      " (the key holds token_bucket state)",
      " (the key holds leaky_bucket state)"};
  if (len == 0 || v[0] < '0' || v[0] > '4' || v[0] == (char)('0' + alg))
    return "";
  tg_algorithm a = (tg_algorithm)(v[0] - '0');
  tg__state st;
  if (a != TG_SLIDING_WINDOW)
    return tg__rv_parse_state(a, v, len, &st) ? other[a] : "";
  /* a log: its shape, then its sum and first entry as numbers (enough to
   * tell state from text of the same length) */
  size_t n;
  if (!tg__rv_log_entries(v, len, &n))
    return "";
  tg__entry e[1];
  uint64_t sum;
  return tg__rv_parse_log(v, n < 1 ? n : 1, e, &sum) ? other[a] : "";
}

/* What a window or bucket call saw and did. */
typedef struct state_result {
  tg__outcome o;
  int rc;                     /* the step's status */
  bool wrote;                 /* the key was written */
  char old[TG__RV_STATE_MAX]; /* the value found, for TG.STEP */
  size_t old_len;             /* 0: absent */
} state_result;

/* Runs k's call on a window or bucket key. Returns TG_OK (the step's own
 * status is in sr->rc), TG_ECORRUPT (k->corrupt says why) or TG_ESTORE. */
static int run_state(kcall *k, state_result *sr) {
  tg_algorithm alg = k->c.alg;
  RedisModuleKey *key = RedisModule_OpenKey(
      k->ctx, k->name,
      REDISMODULE_READ | (k->may_write ? REDISMODULE_WRITE : 0));
  const char *v;
  size_t len;
  tg__state st = {0, 0};
  int rc = TG_OK;
  sr->wrote = false;
  sr->old_len = 0;
  if (!read_value(k, key, &v, &len)) {
    rc = TG_ECORRUPT;
  } else if (v) {
    if (!tg__rv_parse_state(alg, v, len, &st) ||
        !tg__state_plausible(alg, &st)) {
      k->corrupt = corrupt_detail(alg, v, len);
      rc = TG_ECORRUPT;
    } else {
      memcpy(sr->old, v, len); /* parsed: at most TG__RV_STATE_MAX bytes */
      sr->old_len = len;
    }
  }
  if (rc == TG_OK) {
    bool changed;
    sr->rc = tg__state_step(&k->c, &st, &sr->o, &changed);
    k->would_store =
        tg__call_writes(&k->c) &&
        tg__state_store_needed(alg, v == NULL, changed, &st, k->c.now_us);
    if (k->may_write && k->would_store) {
      char buf[TG__RV_STATE_MAX];
      size_t n = tg__rv_format_state(alg, &st, buf);
      rc = store_value(k, key, v ? len : SIZE_MAX, buf, n,
                       expire_at_ms(k, tg__state_expiry_us(alg, &st)));
      sr->wrote = rc == TG_OK;
    }
  }
  RedisModule_CloseKey(key);
  return rc;
}

/* What a sliding-log call saw and did. */
typedef struct log_result {
  tg__log_view v;
  uint64_t left; /* entries after the call */
  int rc;        /* the step's status */
} log_result;

/* Runs k's call on a sliding-log key whose log keeps at most cap entries.
 * Returns like run_state. */
static int run_log(kcall *k, uint32_t cap, log_result *lr) {
  RedisModuleKey *key = RedisModule_OpenKey(
      k->ctx, k->name,
      REDISMODULE_READ | (k->may_write ? REDISMODULE_WRITE : 0));
  const char *v;
  size_t len, n = 0;
  tg__entry *e = NULL;
  char *out = NULL;
  int rc = TG_OK;
  if (!read_value(k, key, &v, &len)) {
    rc = TG_ECORRUPT;
  } else if (v && (!tg__rv_log_entries(v, len, &n) || n > LOG_CAP_MAX)) {
    k->corrupt = corrupt_detail(TG_SLIDING_WINDOW, v, len);
    rc = TG_ECORRUPT;
  }
  /* The ring holds the stored entries and one more, never more than the
   * value itself could hold: a call's cap (up to 2^24) must not make a call
   * allocate its worth. */
  size_t ring = n + 1;
  if (rc == TG_OK) {
    e = RedisModule_Alloc(ring * sizeof *e);
    if (!e)
      rc = TG_ENOMEM;
  }
  tg__log lg = {e, 0, (uint32_t)n, (uint32_t)ring, 0};
  if (rc == TG_OK && v &&
      (!tg__rv_parse_log(v, n, e, &lg.sum) || !tg__log_plausible(&lg))) {
    k->corrupt = "";
    rc = TG_ECORRUPT;
  }
  if (rc == TG_OK) {
    /* Prune first, then give the step a ring whose size makes it do what
     * a cap of `cap` would: append into the one free slot while fewer than
     * cap entries are left, merge into the newest once cap or more are (a
     * log written under a larger cap keeps its extra entries until they
     * expire, as the script does). The step's own prune then finds none. */
    bool pruned = tg__log_prune(&lg, k->c.q.period_us, k->c.now_us) > 0;
    memmove(e, e + lg.head, lg.n * sizeof *e);
    lg.head = 0;
    lg.cap = lg.n >= cap ? lg.n : lg.n + 1;
    bool changed = false;
    if (k->c.op == TG__OP_CHECK) /* a policy's check: decide, write nothing */
      lr->rc = tg__log_check(&k->c, &lg, &lr->v);
    else
      lr->rc = tg__log_decide(&k->c, &lg, &lr->v, &changed);
    lr->left = lg.n;
    /* an emptied log is deleted: DEL is allowed over maxmemory */
    k->would_store = tg__call_writes(&k->c) && (changed || pruned) && lg.n > 0;
    if (k->may_write && (changed || pruned)) {
      if (lg.n == 0) {
        delete_value(k, key);
      } else {
        size_t olen = TG__RV_LOG_HEAD + (size_t)TG__RV_LOG_ENTRY * lg.n;
        out = RedisModule_Alloc(olen);
        if (!out) {
          rc = TG_ENOMEM;
        } else {
          tg__rv_format_log(&lg, out);
          rc = store_value(
              k, key, v ? len : SIZE_MAX, out, olen,
              expire_at_ms(k, tg__log_expiry_us(&lg, k->c.q.period_us)));
        }
      }
    }
  }
  RedisModule_CloseKey(key);
  if (e)
    RedisModule_Free(e);
  if (out)
    RedisModule_Free(out);
  return rc;
}

/* ---- the public commands ---- */

/* Replies for a public command whose call ran: its result or its code. */
static int reply_public(RedisModuleCtx *ctx, const tg__cmd *cmd, int rc,
                        const tg__outcome *o) {
  if (rc != TG_OK)
    return reply_code(ctx, rc, NULL);
  switch (cmd->id) {
  case TG__CMD_HIT: {
    int64_t v[6];
    tg__cmd_hit_reply(&o->r, v);
    RedisModule_ReplyWithArray(ctx, 6);
    for (int i = 0; i < 6; i++)
      RedisModule_ReplyWithLongLong(ctx, v[i]);
    return REDISMODULE_OK;
  }
  case TG__CMD_SET:
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
  case TG__CMD_INC:
  case TG__CMD_GET:
  case TG__CMD_EXPIRESAT:
    return RedisModule_ReplyWithLongLong(ctx, tg__cmd_int(o->value));
  case TG__CMD_RESET:
  case TG__CMD_COUNT_:
    break;
  }
  return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* TG.RESET key [algorithm]: deletes the key when it holds tollgate state
 * (of that algorithm, when one is named); a key holding another
 * algorithm's state is left alone (that algorithm's state is absent), a
 * value that is not tollgate's at all is TG_ECORRUPT. */
static int reset_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                         const tg__cmd *cmd) {
  kcall k = {.ctx = ctx, .name = argv[1]};
  RedisModuleKey *key =
      RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
  const char *v;
  size_t len, n;
  int rc = TG_OK;
  if (!read_value(&k, key, &v, &len)) {
    rc = TG_ECORRUPT;
  } else if (v) {
    tg__state st;
    int alg = len > 0 ? v[0] - '0' : -1;
    bool ours = alg >= 0 && alg < TG_ALGORITHM_COUNT &&
                (alg == TG_SLIDING_WINDOW
                     ? tg__rv_log_entries(v, len, &n)
                     : tg__rv_parse_state((tg_algorithm)alg, v, len, &st));
    if (!ours)
      rc = TG_ECORRUPT;
    else if (cmd->all_algorithms || (int)cmd->alg == alg)
      delete_value(&k, key);
  }
  RedisModule_CloseKey(key);
  if (rc != TG_OK)
    return reply_code(ctx, rc, k.corrupt);
  return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

static int public_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                          int argc, tg__cmd_id id) {
  /* the parser reads no argument before it has checked argc against the
   * command's most (at most 9), so av needs no more */
  tg__cmd_arg av[16];
  for (int i = 0; i < argc && i < 16; i++)
    av[i] = arg_of(argv[i]);
  tg__cmd cmd;
  tg__cmd_error err;
  if (tg__cmd_parse(id, av, (size_t)argc, &cmd, &err) != 0) {
    char text[256];
    tg__cmd_error_text(&err, text, sizeof text);
    return RedisModule_ReplyWithError(ctx, text);
  }
  if (id == TG__CMD_RESET)
    return reset_command(ctx, argv, &cmd);
  kcall k = {.ctx = ctx, .name = argv[1]};
  int rc = tg__call_check(cmd.alg, cmd.op, cmd.key_len, &cmd.q, &k.c.q);
  if (rc != TG_OK)
    return reply_code(ctx, rc, NULL);
  k.server_us = server_now_us();
  if (k.server_us > TG_NOW_MAX_US)
    return reply_code(ctx, TG_ETIME, NULL);
  k.c.op = cmd.op;
  k.c.alg = cmd.alg;
  k.c.key = cmd.key;
  k.c.key_len = cmd.key_len;
  k.c.arg = cmd.op == TG__OP_GET || cmd.op == TG__OP_EXPIRES ? 0 : cmd.arg;
  k.c.now_us = k.server_us;
  k.may_write = tg__cmd_specs[id].write && tg__call_writes(&k.c);
  tg__outcome o;
  if (cmd.alg == TG_SLIDING_WINDOW) {
    log_result lr;
    rc = run_log(&k, log_cap, &lr);
    if (rc == TG_OK)
      rc = lr.rc == TG_OK ? tg__log_report(&k.c, &lr.v, &o) : lr.rc;
  } else {
    state_result sr;
    rc = run_state(&k, &sr);
    if (rc == TG_OK) {
      rc = sr.rc;
      o = sr.o;
    }
  }
  if (rc == TG_ECORRUPT)
    return reply_code(ctx, rc, k.corrupt);
  return reply_public(ctx, &cmd, rc, &o);
}

static int hit_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc) {
  return public_command(ctx, argv, argc, TG__CMD_HIT);
}
static int inc_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc) {
  return public_command(ctx, argv, argc, TG__CMD_INC);
}
static int get_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc) {
  return public_command(ctx, argv, argc, TG__CMD_GET);
}
static int set_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc) {
  return public_command(ctx, argv, argc, TG__CMD_SET);
}
static int expiresat_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                             int argc) {
  return public_command(ctx, argv, argc, TG__CMD_EXPIRESAT);
}
static int reset_public(RedisModuleCtx *ctx, RedisModuleString **argv,
                        int argc) {
  return public_command(ctx, argv, argc, TG__CMD_RESET);
}

/* ---- TG.POLICY: several rules, one decision ----
 * Every rule is checked on its key (nothing written), and only when all
 * allow is each key written, as TG.HIT would: the command runs alone in
 * the server, so nothing can come between the two. Its keys are found by
 * parsing (getkeys-api): Cluster routes it, and refuses keys of several
 * slots (CROSSSLOT) before it runs. The same key twice is refused (a key
 * holds one state). */
static int policy_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                          int argc) {
  tg__cmd_arg av[256];
  size_t ac = (size_t)argc < 256 ? (size_t)argc : 256;
  for (size_t i = 0; i < ac; i++)
    av[i] = arg_of(argv[i]);
  tg__cmd cmds[TG_RULES_MAX];
  size_t n;
  tg__cmd_error err;
  int parsed = tg__cmd_parse_policy(av, ac, cmds, TG_RULES_MAX, &n, &err);
  /* the argument each rule's key is (every key is found: the parser's key
   * pointers point into av; zeroed for the analyser, which cannot see it) */
  int pos[TG_RULES_MAX] = {0};
  for (size_t r = 0; parsed == 0 && r < n; r++)
    for (size_t i = 1; i < ac; i++)
      if (av[i].ptr == cmds[r].key) {
        pos[r] = (int)i;
        break;
      }
  if (RedisModule_IsKeysPositionRequest(ctx)) {
    for (size_t r = 0; parsed == 0 && r < n; r++)
      RedisModule_KeyAtPos(ctx, pos[r]);
    return REDISMODULE_OK;
  }
  if ((size_t)argc > ac)
    return RedisModule_ReplyWithError(ctx, "ERR too many arguments");
  if (parsed != 0) {
    char text[256];
    tg__cmd_error_text(&err, text, sizeof text);
    return RedisModule_ReplyWithError(ctx, text);
  }
  uint64_t server_us = server_now_us();
  if (server_us > TG_NOW_MAX_US)
    return reply_code(ctx, TG_ETIME, NULL);
  kcall k[TG_RULES_MAX];
  tg__outcome o[TG_RULES_MAX];
  bool pass = true;
  for (size_t r = 0; r < n; r++) {
    const tg__cmd *cmd = &cmds[r];
    for (size_t j = 0; j < r; j++)
      if (cmds[j].key_len == cmd->key_len &&
          memcmp(cmds[j].key, cmd->key, cmd->key_len) == 0)
        return reply_code(ctx, TG_EINVAL, " (a key named twice)");
    k[r] = (kcall){.ctx = ctx, .name = argv[pos[r]]};
    int rc = tg__call_check(cmd->alg, TG__OP_CHECK, cmd->key_len, &cmd->q,
                            &k[r].c.q);
    if (rc != TG_OK)
      return reply_code(ctx, rc, NULL);
    k[r].server_us = server_us;
    k[r].c.op = TG__OP_CHECK;
    k[r].c.alg = cmd->alg;
    k[r].c.key = cmd->key;
    k[r].c.key_len = cmd->key_len;
    k[r].c.arg = cmd->arg;
    k[r].c.now_us = server_us;
    k[r].may_write = false;
    if (cmd->alg == TG_SLIDING_WINDOW) {
      log_result lr;
      rc = run_log(&k[r], log_cap, &lr);
      if (rc == TG_OK)
        rc = lr.rc == TG_OK ? tg__log_report(&k[r].c, &lr.v, &o[r]) : lr.rc;
    } else {
      state_result sr;
      rc = run_state(&k[r], &sr);
      if (rc == TG_OK) {
        rc = sr.rc;
        o[r] = sr.o;
      }
    }
    if (rc != TG_OK)
      return reply_code(ctx, rc, rc == TG_ECORRUPT ? k[r].corrupt : NULL);
    pass = pass && o[r].r.allowed;
  }
  for (size_t r = 0; pass && r < n; r++) {
    /* as TG.HIT: the checks said every rule allows, and nothing ran in
     * between, so each consumes */
    k[r].c.op = TG__OP_TAKE;
    k[r].may_write = tg__call_writes(&k[r].c);
    int rc;
    if (k[r].c.alg == TG_SLIDING_WINDOW) {
      log_result lr;
      rc = run_log(&k[r], log_cap, &lr);
      if (rc == TG_OK)
        rc = lr.rc;
    } else {
      state_result sr;
      rc = run_state(&k[r], &sr);
      if (rc == TG_OK)
        rc = sr.rc;
    }
    if (rc != TG_OK) /* a write the server refused: not reached in tests */
      return reply_code(ctx, rc, rc == TG_ECORRUPT ? k[r].corrupt : NULL);
  }
  int64_t v[7];
  tg__cmd_policy_reply(o, n, pass, v);
  RedisModule_ReplyWithArray(ctx, 7);
  for (int i = 0; i < 7; i++)
    RedisModule_ReplyWithLongLong(ctx, v[i]);
  return REDISMODULE_OK;
}

/* ---- TG.STEP: the library's command ----
 * TG.STEP key alg op now limit period_ms burst arg log_cap, all decimal:
 * alg a tg_algorithm, op a tg__op (0 hit, 1 inc, 2 get, 3 set, 4 expires;
 * 6 take, a one-rule policy's hit that counts only an admitted cost, on a
 * window: the non-blocking API's TG_NB_RULE; 7 reserve, on a bucket, with
 * an eleventh argument wait_ns, the most it may be admitted late:
 * TG_NB_RESERVE),
 * now in us or "" for the server's clock, the quota as the caller gave it
 * (full 64-bit range), arg the cost or value, log_cap the limiter's
 * sliding_max_entries. TG.STEP_RO takes the same for calls that cannot
 * write (tg__call_writes), so that replicas and a server out of memory
 * still answer them. The reply is the script's (src/store/redis.lua):
 *   windows, buckets  [now_us, the value found or "", 1 if written else 0]
 *   sliding           [now_us, live sum, allowed 1/0, entries left,
 *                      newest entry's time or "", time waited for or ""]
 * A step that refuses the call (TG_EOVERFLOW, TG_ERANGE) writes nothing
 * and replies the same: the client's own step finds the refusal. Errors:
 * "TGARG ..." for malformed arguments (a client bug), "TGCORRUPT ..." for a
 * value that is not a sound state. */

static bool num_arg(RedisModuleString *s, bool empty_ok, uint64_t *out) {
  tg__cmd_arg a = arg_of(s);
  const char *p = a.ptr;
  if (a.len == 0)
    return empty_ok;
  return tg__scan_u64(&p, a.ptr + a.len, out) && p == a.ptr + a.len;
}

static int step_command_any(RedisModuleCtx *ctx, RedisModuleString **argv,
                            int argc, bool writable) {
  if (argc != 10 && !(TAKES_WAITS && argc == 11))
    return RedisModule_ReplyWithError(ctx, "TGARG wrong number of arguments");
  uint64_t alg, op, now = 0, cap, wait = 0;
  tg_quota q;
  kcall k = {.ctx = ctx, .name = argv[1]};
  if (!num_arg(argv[2], false, &alg) || alg >= TG_ALGORITHM_COUNT ||
      !num_arg(argv[3], false, &op) || op >= TG__OP_COUNT_ ||
      !num_arg(argv[4], true, &now) || !num_arg(argv[5], false, &q.limit) ||
      !num_arg(argv[6], false, &q.period_ms) ||
      !num_arg(argv[7], false, &q.burst) ||
      !num_arg(argv[8], false, &k.c.arg) || !num_arg(argv[9], false, &cap) ||
      cap < 1 || cap > LOG_CAP_MAX ||
      (argc == 11 &&
       (op != TG__OP_RESERVE || !num_arg(argv[10], false, &wait) ||
        wait > TG__WAIT_MAX_NS)))
    return RedisModule_ReplyWithError(ctx, "TGARG malformed arguments");
  k.c.alg = (tg_algorithm)alg;
  k.c.op = (tg__op)op;
  k.c.wait_ns = wait;
  if (!tg__op_supported(k.c.alg, k.c.op))
    return reply_code(ctx, TG_ENOTSUP, NULL);
  int rc = tg__quota_prepare(&k.c.q, &q, k.c.alg);
  if (rc != TG_OK)
    return reply_code(ctx, rc, NULL);
  k.server_us = server_now_us();
  k.caller_now = arg_of(argv[4]).len > 0; /* "": the server's clock */
  k.c.now_us = k.caller_now ? now : k.server_us;
  if (k.c.now_us > TG_NOW_MAX_US)
    return reply_code(ctx, TG_ETIME, NULL);
  k.c.key = RedisModule_StringPtrLen(argv[1], &k.c.key_len);
  k.may_write = writable && tg__call_writes(&k.c);
  k.oom = k.may_write && over_maxmemory(ctx);
  char now_s[24];
  size_t now_len = tg__u64_dec(now_s, k.c.now_us);
  if (k.c.alg == TG_SLIDING_WINDOW) {
    log_result lr;
    rc = run_log(&k, (uint32_t)cap, &lr);
    if (rc == TG_ECORRUPT)
      return RedisModule_ReplyWithError(ctx, "TGCORRUPT sliding log");
    if (rc != TG_OK)
      return reply_code(ctx, rc, NULL);
    if (lr.rc != TG_OK) /* not reached: the op was checked above */
      return reply_code(ctx, lr.rc, NULL);
    RedisModule_ReplyWithArray(ctx, 6);
    RedisModule_ReplyWithStringBuffer(ctx, now_s, now_len);
    reply_u64_string(ctx, lr.v.sum);
    RedisModule_ReplyWithLongLong(ctx, tg__log_allows(&k.c, lr.v.sum));
    RedisModule_ReplyWithLongLong(ctx, (long long)lr.left);
    if (lr.v.has_newest)
      reply_u64_string(ctx, lr.v.newest_us);
    else
      RedisModule_ReplyWithStringBuffer(ctx, "", 0);
    if (lr.v.has_wait)
      reply_u64_string(ctx, lr.v.wait_us);
    else
      RedisModule_ReplyWithStringBuffer(ctx, "", 0);
    return REDISMODULE_OK;
  }
  state_result sr;
  rc = run_state(&k, &sr);
  if (rc == TG_ECORRUPT)
    return RedisModule_ReplyWithError(ctx, "TGCORRUPT state");
  if (rc != TG_OK)
    return reply_code(ctx, rc, NULL);
  RedisModule_ReplyWithArray(ctx, 3);
  RedisModule_ReplyWithStringBuffer(ctx, now_s, now_len);
  RedisModule_ReplyWithStringBuffer(ctx, sr.old, sr.old_len);
  RedisModule_ReplyWithLongLong(ctx, sr.wrote ? 1 : 0);
  return REDISMODULE_OK;
}

static int step_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                        int argc) {
  return step_command_any(ctx, argv, argc, true);
}

static int step_ro_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                           int argc) {
  return step_command_any(ctx, argv, argc, false);
}

/* ---- TG.STEPS: a policy's decision for the library ----
 * TG.STEPS n key_1 .. key_n now, then per rule: alg limit period_ms burst
 * cost log_cap shadow [wait_ns] (decimal; now in us or "" for the server's
 * clock, as TG.STEP; wait_ns on every rule or on none: how late a bucket
 * rule may be admitted, a policy of reservations, tg_reserve_rules; 0 for
 * the other algorithms). It decides as the library's policy does
 * (src/store/redis.c, decide_rules): CHECK every rule on its key, the policy
 * passes when every rule allows or is a shadow rule, and then every rule that
 * allowed TAKEs (a shadow rule that denied is left as it is); nothing is
 * written when it does not pass. All in one command, so one round trip and
 * nothing between the checks and the takes: the library's other way, a read and
 * a conditional write, takes two and retries when a key changed in between. The
 * reply is what the library needs to compute every number itself: [now_us, the
 * value found at each key or "", 1 passed / 0 not] and it checks that its own
 * decision on those values is the server's. Errors: "TGARG ..." (a client bug),
 * "TGCORRUPT rule I ..." for the first rule whose value is not a sound state (I
 * from 0; nothing written). A rule whose step fails with TG_EOVERFLOW makes the
 * reply "not passed" (nothing written): the library's own step names the rule.
 * Keys are found by parsing (getkeys-api): Cluster routes the command, and
 * refuses keys of several slots (CROSSSLOT) before it runs. */

#define STEPS_PER_RULE 7 /* 8 with the waits */

/* Runs k's call on its key, a window/bucket or a log whose log keeps at
 * most cap entries: TG_OK with the call's outcome in *o, or the code
 * run_state/run_log or the step returned (a TAKE's outcome on a log is
 * left zeroed: its caller needs only the status). */
static int run_rule(kcall *k, uint32_t cap, tg__outcome *o) {
  int rc;
  memset(o, 0, sizeof *o);
  if (k->c.alg == TG_SLIDING_WINDOW) {
    log_result lr;
    rc = run_log(k, cap, &lr);
    if (rc == TG_OK)
      rc = lr.rc == TG_OK && k->c.op == TG__OP_CHECK
               ? tg__log_report(&k->c, &lr.v, o)
               : lr.rc;
  } else {
    state_result sr;
    rc = run_state(k, &sr);
    if (rc == TG_OK) {
      rc = sr.rc;
      *o = sr.o;
    }
  }
  return rc;
}

static int steps_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                         int argc) {
  uint64_t n = 0;
  bool shaped =
      argc >= 2 && num_arg(argv[1], false, &n) && n >= 1 && n <= TG_RULES_MAX &&
      ((uint64_t)argc == 3 + n + STEPS_PER_RULE * n ||
       (TAKES_WAITS && (uint64_t)argc == 3 + n + (STEPS_PER_RULE + 1) * n));
  uint64_t per = (uint64_t)argc == 3 + n + STEPS_PER_RULE * n
                     ? STEPS_PER_RULE
                     : STEPS_PER_RULE + 1;
  if (RedisModule_IsKeysPositionRequest(ctx)) {
    for (uint64_t i = 0; shaped && i < n; i++)
      RedisModule_KeyAtPos(ctx, 2 + (int)i);
    return REDISMODULE_OK;
  }
  if (!shaped)
    return RedisModule_ReplyWithError(ctx, "TGARG wrong number of arguments");
  uint64_t now = 0;
  if (!num_arg(argv[2 + n], true, &now))
    return RedisModule_ReplyWithError(ctx, "TGARG malformed arguments");
  bool caller_now = arg_of(argv[2 + n]).len > 0; /* "": the server's clock */
  kcall k[TG_RULES_MAX];
  uint32_t cap[TG_RULES_MAX];
  bool shadow[TG_RULES_MAX];
  uint64_t server_us = server_now_us();
  for (uint64_t r = 0; r < n; r++) {
    RedisModuleString **a = argv + 3 + n + per * r;
    uint64_t alg, c, sh, wait = 0;
    tg_quota q;
    k[r] = (kcall){.ctx = ctx, .name = argv[2 + r]};
    if (!num_arg(a[0], false, &alg) || alg >= TG_ALGORITHM_COUNT ||
        !num_arg(a[1], false, &q.limit) ||
        !num_arg(a[2], false, &q.period_ms) ||
        !num_arg(a[3], false, &q.burst) || !num_arg(a[4], false, &k[r].c.arg) ||
        !num_arg(a[5], false, &c) || c < 1 || c > LOG_CAP_MAX ||
        !num_arg(a[6], false, &sh) || sh > 1 ||
        (per > STEPS_PER_RULE &&
         (!num_arg(a[7], false, &wait) || wait > TG__WAIT_MAX_NS ||
          (wait > 0 && alg != TG_TOKEN_BUCKET && alg != TG_LEAKY_BUCKET))))
      return RedisModule_ReplyWithError(ctx, "TGARG malformed arguments");
    k[r].c.alg = (tg_algorithm)alg;
    k[r].c.wait_ns = wait;
    k[r].c.op = TG__OP_CHECK;
    int rc = tg__quota_prepare(&k[r].c.q, &q, k[r].c.alg);
    if (rc != TG_OK)
      return reply_code(ctx, rc, NULL);
    k[r].server_us = server_us;
    k[r].caller_now = caller_now;
    k[r].c.now_us = k[r].caller_now ? now : server_us;
    if (k[r].c.now_us > TG_NOW_MAX_US)
      return reply_code(ctx, TG_ETIME, NULL);
    k[r].c.key = RedisModule_StringPtrLen(argv[2 + r], &k[r].c.key_len);
    for (uint64_t j = 0; j < r; j++)
      if (k[j].c.key_len == k[r].c.key_len &&
          memcmp(k[j].c.key, k[r].c.key, k[r].c.key_len) == 0)
        return RedisModule_ReplyWithError(ctx, "TGARG a key named twice");
    cap[r] = (uint32_t)c;
    shadow[r] = sh == 1;
  }
  /* the checks: nothing written; each value found is read again for the
   * reply below, from the key (the values are not copied: a log may be
   * 40 KB) */
  tg__outcome o[TG_RULES_MAX];
  bool pass = true;
  for (uint64_t r = 0; r < n; r++) {
    int rc = run_rule(&k[r], cap[r], &o[r]);
    if (rc == TG_ECORRUPT) {
      char text[64];
      (void)snprintf(text, sizeof text, "TGCORRUPT rule %u", (unsigned)r);
      return RedisModule_ReplyWithError(ctx, text);
    }
    if (rc == TG_EOVERFLOW) {
      /* the rule's step fails (a window's count past 2^64): the policy
       * does not pass and nothing is written; the library's decide_rules
       * finds the same failure on the same values and reports it for this
       * rule, as the memory store does (an error reply here named none) */
      pass = false;
      o[r].r.allowed = false;
      continue;
    }
    if (rc != TG_OK)
      return reply_code(ctx, rc, NULL);
    pass = pass && (o[r].r.allowed || shadow[r]);
  }
  /* over maxmemory, a policy that passes and would write is refused before
   * the reply starts (the takes below cannot fail then): each take is
   * tried first without writing */
  bool oom = pass && over_maxmemory(ctx);
  for (uint64_t r = 0; oom && r < n; r++) {
    if (!o[r].r.allowed)
      continue;
    k[r].c.op = TG__OP_TAKE;
    tg__outcome dry;
    (void)run_rule(&k[r], cap[r], &dry); /* may_write is still false */
    k[r].c.op = TG__OP_CHECK;
    if (k[r].would_store)
      return reply_code(ctx, REFUSED_OOM, NULL);
  }
  /* the reply's values are those the checks saw: read before any take */
  RedisModule_ReplyWithArray(ctx, (long)n + 2);
  char now_s[24];
  RedisModule_ReplyWithStringBuffer(ctx, now_s,
                                    tg__u64_dec(now_s, k[0].c.now_us));
  for (uint64_t r = 0; r < n; r++) {
    RedisModuleKey *key = RedisModule_OpenKey(ctx, k[r].name, REDISMODULE_READ);
    const char *v;
    size_t len;
    /* the check above parsed it: a string, or absent */
    if (!read_value(&k[r], key, &v, &len) || !v)
      RedisModule_ReplyWithStringBuffer(ctx, "", 0);
    else
      RedisModule_ReplyWithStringBuffer(ctx, v, len);
    RedisModule_CloseKey(key);
  }
  for (uint64_t r = 0; pass && r < n; r++) {
    if (!o[r].r.allowed)
      continue; /* a shadow rule that denied: left as it is */
    k[r].c.op = TG__OP_TAKE;
    k[r].may_write = tg__call_writes(&k[r].c);
    tg__outcome taken;
    /* the checks said it allows, and nothing ran in between: a refusal
     * here is a write the server refused (not reached in tests) */
    (void)run_rule(&k[r], cap[r], &taken);
  }
  return RedisModule_ReplyWithLongLong(ctx, pass ? 1 : 0);
}

/* TG.PROTOCOL: 2, the level of the library's TG.STEP / TG.STEPS protocol
 * this module speaks (2: with waits, a reservation's and a policy's). */
#if TAKES_WAITS
static int protocol_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                            int argc) {
  (void)argv;
  if (argc != 1)
    return RedisModule_ReplyWithError(ctx, "TGARG wrong number of arguments");
  return RedisModule_ReplyWithLongLong(ctx, 2);
}
#endif

/* ---- loading ---- */

/* Load arguments: [SLIDING-MAX-ENTRIES n]. */
static bool parse_load_args(RedisModuleString **argv, int argc) {
  for (int i = 0; i < argc; i += 2) {
    tg__cmd_arg name = arg_of(argv[i]);
    uint64_t v;
    if (i + 1 >= argc || name.len != 19 ||
        strncasecmp(name.ptr, "sliding-max-entries", 19) != 0 ||
        !num_arg(argv[i + 1], false, &v) || v < 1 || v > LOG_CAP_MAX)
      return false;
    log_cap = (uint32_t)v;
  }
  return true;
}

MODULE_EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx,
                                     RedisModuleString **argv, int argc) {
  const char *missing = api_init(ctx);
  if (missing)
    return REDISMODULE_ERR; /* too old a server: nothing to log with */
  if (RedisModule_IsModuleNameBusy && RedisModule_IsModuleNameBusy("tollgate"))
    return REDISMODULE_ERR;
  RedisModule_SetModuleAttribs(ctx, "tollgate", TG_VERSION_HEX,
                               REDISMODULE_APIVER_1);
  if (!parse_load_args(argv, argc)) {
    RedisModule_Log(ctx, "warning",
                    "tollgate: arguments are [SLIDING-MAX-ENTRIES 1..%u]",
                    LOG_CAP_MAX);
    return REDISMODULE_ERR;
  }
  static const RedisModuleCmdFunc fns[TG__CMD_COUNT_] = {
      [TG__CMD_HIT] = hit_command,
      [TG__CMD_INC] = inc_command,
      [TG__CMD_GET] = get_command,
      [TG__CMD_SET] = set_command,
      [TG__CMD_EXPIRESAT] = expiresat_command,
      [TG__CMD_RESET] = reset_public};
  for (int i = 0; i < TG__CMD_COUNT_; i++) {
    const tg__cmd_spec *s = &tg__cmd_specs[i];
    if (RedisModule_CreateCommand(ctx, s->name, fns[i],
                                  s->write ? "write deny-oom fast"
                                           : "readonly fast",
                                  1, 1, 1) != REDISMODULE_OK)
      return REDISMODULE_ERR;
  }
  if (RedisModule_CreateCommand(ctx, "tg.policy", policy_command,
                                "write deny-oom getkeys-api", 0, 0,
                                0) != REDISMODULE_OK)
    return REDISMODULE_ERR;
  /* the library's commands check maxmemory themselves, on a write only
   * (over_maxmemory), when the server can tell them */
  bool own_oom = RedisModule_GetContextFlags != NULL;
  if (RedisModule_CreateCommand(ctx, "tg.steps", steps_command,
                                own_oom ? "write getkeys-api"
                                        : "write deny-oom getkeys-api",
                                0, 0, 0) != REDISMODULE_OK)
    return REDISMODULE_ERR;
    /* TG.PROTOCOL: what the library's non-blocking client asks (COMMAND
     * INFO) to know this module takes waits; its answer, 2, is that level */
#if TAKES_WAITS
  if (RedisModule_CreateCommand(ctx, "tg.protocol", protocol_command,
                                "readonly fast", 0, 0, 0) != REDISMODULE_OK)
    return REDISMODULE_ERR;
#endif
  if (RedisModule_CreateCommand(ctx, "tg.step", step_command,
                                own_oom ? "write fast" : "write deny-oom fast",
                                1, 1, 1) != REDISMODULE_OK ||
      RedisModule_CreateCommand(ctx, "tg.step_ro", step_ro_command,
                                "readonly fast", 1, 1, 1) != REDISMODULE_OK)
    return REDISMODULE_ERR;
  /* last: a load that fails above leaves nothing to free */
  pxat_arg = RedisModule_CreateString(NULL, "PXAT", 4);
  if (!pxat_arg)
    return REDISMODULE_ERR;
  RedisModule_Log(ctx, "notice",
                  "tollgate %s: TG.* commands ready (sliding-max-entries %u)",
                  VERSION_STRING, log_cap);
  return REDISMODULE_OK;
}

/* The module keeps no state outside keys but the "PXAT" argument, and its
 * commands go with it. A replication buffer that still holds the argument
 * holds its own reference: freeing ours is safe. */
MODULE_EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx) {
  if (pxat_arg)
    RedisModule_FreeString(NULL, pxat_arg);
  pxat_arg = NULL;
  (void)ctx;
  return REDISMODULE_OK;
}
