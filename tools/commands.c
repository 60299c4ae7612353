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
 *
 * and what clients expect of a Redis-speaking server: PING, ECHO, QUIT,
 * INFO, DBSIZE, SELECT 0, HELLO [2], COMMAND [COUNT|INFO|DOCS], CLIENT
 * SETNAME/GETNAME/SETINFO/ID, CONFIG GET (save and appendonly only).
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

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
  const resp_arg *argv;
  size_t argc;
  uint64_t now_us;
  uint64_t client_id;
  outbuf *out;
} call;

/* ---- the TG.* commands ---- */

/* What every TG.* command shares: key, limiter, quota, and the options. */
typedef struct tg_args {
  const void *key;
  size_t key_len;
  tg_limiter *lim;
  tg_quota q;
  uint64_t cost;  /* COST, default 1 */
  uint64_t value; /* TG.SET's value */
} tg_args;

/* Parses the request with the parser the Redis module shares
 * (src/command/command.h), then finds the limiter. On error writes the
 * reply and returns -1. */
static int parse_tg(const call *c, tg__cmd_id id, tg_args *t) {
  tg__cmd_arg av[RESP_MAX_ARGS];
  for (size_t i = 0; i < c->argc && i < RESP_MAX_ARGS; i++)
    av[i] = (tg__cmd_arg){c->argv[i].ptr, c->argv[i].len};
  tg__cmd cmd;
  tg__cmd_error err;
  if (tg__cmd_parse(id, av, c->argc, &cmd, &err) != 0) {
    out_error_quoted(c->out, "ERR", err.before, err.quoted, err.quoted_len,
                     err.after);
    return -1;
  }
  t->key = cmd.key;
  t->key_len = cmd.key_len;
  t->lim = c->ctx->lim[cmd.alg];
  t->q = cmd.q;
  t->cost = cmd.arg;
  t->value = cmd.arg;
  if (!t->lim) {
    out_error(c->out, "ERR", "this server holds no limiter for that algorithm");
    return -1;
  }
  return 0;
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
  tg_result r;
  int rc =
      c->ctx->store_time
          ? tg_hit(t.lim, t.key, t.key_len, &t.q, t.cost, &r)
          : tg_hit_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.cost, &r);
  hit_out(c->ctx, rc, &r, c->out);
}

static void cmd_inc(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_INC, &t) != 0)
    return;
  uint64_t count;
  int rc =
      c->ctx->store_time
          ? tg_inc(t.lim, t.key, t.key_len, &t.q, t.cost, &count)
          : tg_inc_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.cost, &count);
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
  if (rc != TG_OK)
    err_tg(c->out, rc);
  else
    out_uint(c->out, v);
}

static void cmd_set(const call *c) {
  tg_args t;
  if (parse_tg(c, TG__CMD_SET, &t) != 0)
    return;
  int rc = c->ctx->store_time
               ? tg_set(t.lim, t.key, t.key_len, &t.q, t.value)
               : tg_set_at(t.lim, c->now_us, t.key, t.key_len, &t.q, t.value);
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
    int rc = tg_reset(c->ctx->lim[a], cmd.key, cmd.key_len);
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
    out_uint(c->out, c->client_id);
  else
    out_error_quoted(c->out, "ERR", "unknown or unsupported subcommand '",
                     argv[1].ptr, argv[1].len, "'");
}

/* HELLO [protover [SETNAME name]]: RESP2 only. */
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
  for (; i < c->argc; i++) {
    if (arg_is(&argv[i], "setname") && i + 1 < c->argc) {
      i++; /* accepted and forgotten: names are not kept */
    } else {
      out_error_quoted(o, "ERR", "option '", argv[i].ptr, argv[i].len,
                       "' is not supported");
      return;
    }
  }
  out_array(o, 14);
  out_bulk_str(o, "server");
  out_bulk_str(o, "tollgate");
  out_bulk_str(o, "version");
  out_bulk_str(o, tg_version_string());
  out_bulk_str(o, "proto");
  out_int(o, 2);
  out_bulk_str(o, "id");
  out_uint(o, c->client_id);
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
    info_u64(&text, "decisions_allowed", s->allowed);
    info_u64(&text, "decisions_denied", s->denied);
    info_u64(&text, "decisions_degraded", s->degraded);
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
    {"ping", -1, 2, {"fast", NULL, NULL}, 0, 0, 0, cmd_ping, CMD_KEEP},
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

/* The TG.HIT request r as a batch item (its quota in *q), when it parses
 * and its algorithm has a limiter; else false (cmd_execute answers it). */
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
      !ctx->lim[cmd.alg])
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
    int rc = tg_hit_batch(ctx->lim[a], sub, m);
    for (size_t k = 0; k < m; k++) {
      it[at[k]] = sub[k];
      if (rc != TG_OK) /* not reached: the items are well-formed */
        it[at[k]].status = rc;
    }
  }
  for (size_t i = 0; i < n; i++) {
    size_t before = out->len;
    hit_out(ctx, it[i].status, &it[i].result, out);
    count(ctx, out, before);
  }
}

cmd_after cmd_execute_batch(cmd_ctx *ctx, const resp_request *reqs, size_t n,
                            uint64_t now_us, uint64_t client_id, outbuf *out) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    tg_batch_item it;
    tg_quota q;
    tg_algorithm alg;
    while (ctx->store_time && j < n && j - i < CMD_BATCH_MAX &&
           hit_item(ctx, &reqs[j], &q, &it, &alg))
      j++;
    if (j - i >= 2) {
      hit_batch(ctx, reqs + i, j - i, out);
      i = j;
      continue;
    }
    if (reqs[i].argc > 0 && cmd_execute(ctx, reqs[i].argv, reqs[i].argc, now_us,
                                        client_id, out) == CMD_CLOSE)
      return CMD_CLOSE;
    i++;
  }
  return CMD_KEEP;
}

cmd_after cmd_execute(cmd_ctx *ctx, const resp_arg *argv, size_t argc,
                      uint64_t now_us, uint64_t client_id, outbuf *out) {
  size_t before = out->len;
  cmd_after after = CMD_KEEP;
  const command *cmd = lookup(&argv[0]);
  if (!cmd) {
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
    const call c = {ctx, argv, argc, now_us, client_id, out};
    cmd->fn(&c);
    after = cmd->after;
  }
  count(ctx, out, before);
  return after;
}
