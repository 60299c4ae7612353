/* SPDX-License-Identifier: MIT */
/*
 * redis.c - the Redis store: every key's state lives in a Redis server and
 * changes in one server-side script, so limiters on many hosts share one
 * limit at the price of one round trip per decision.
 *
 * The script (redis.lua, embedded at build time as tg__redis_script) moves a
 * key's state forward atomically, with the server's clock, and returns the
 * state it found and the now it used. This file then runs the same pure step
 * as the memory store (src/core) on that state, so every number a caller
 * sees comes from the one C implementation; the script's transitions mirror
 * the steps and tests/test_redis.c checks them against the memory store.
 *
 * When the server has loaded the tollgate module (redis-module/), a call is
 * its TG.STEP command instead: the same step in compiled code inside the
 * server, with the same arguments' meaning and the script's reply shape, so
 * everything below the command's name is shared. Each connection asks once,
 * when it opens, which of the two the server has.
 *
 * Connections come from a pool of pool_size, each guarded by a mutex: a call
 * takes a free one (or waits for one), opens it if needed (AUTH, SELECT,
 * COMMAND INFO TG.STEP, else SCRIPT LOAD), sends the call and reads the
 * reply. A connection that fails is closed and reopened by the next call
 * that takes it.
 *
 * Health is the pool's, not each connection's: a server that does not answer
 * (a timeout) or cannot be connected to makes the whole pool "down" for
 * reconnect_backoff_ms. Meanwhile every call returns that failure's code at
 * once, without touching a socket; when the backoff has passed, one call (the
 * probe) tries the server while the others go on failing fast, and its
 * outcome decides: up again, or down for another backoff. A stopped server
 * therefore costs the whole process one timeout per backoff period, not one
 * per call (a single-threaded server would otherwise stall on every
 * request) nor one per connection. A connection the server merely closed
 * (EOF: a restart, CLIENT KILL, an idle timeout) does not make the pool down:
 * the next call reconnects, and only if that fails is the pool down.
 */
#include "redis_cmd.h"
#include "redis_script.h"
#include "redis_slots.h"
#include "redis_value.h"
#include "store.h"

#include "../atomic.h"
#include "../error.h"
#include "../mono.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 1024u
#define PREFIX_MAX TG__REDIS_PREFIX_MAX
#define BATCH_CHUNK 1024u /* most commands pipelined at once */
#define NAME_MAX_BYTES TG__REDIS_NAME_MAX

/* Short names in Redis key names, indexed by tg_algorithm. */
static const char SUFFIX[TG_ALGORITHM_COUNT][3] = {"fw", "pk", "sw", "tb",
                                                   "lb"};

typedef struct conn {
  pthread_mutex_t mu;  /* held by the one thread using the connection */
  redisContext *ctx;   /* NULL: closed (never opened, or failed) */
  pid_t pid;           /* the process that opened ctx: a child of fork()
                          must not share the parent's socket */
  bool module;         /* the server has the tollgate module: calls are
                          TG.STEP commands, not the script */
  char sha[41];        /* the script's SHA1, as SCRIPT LOAD answered it */
  uint32_t timeout_ms; /* command_timeout_ms: a reply's whole wait */
} conn;

typedef struct redis_store {
  tg__store base;
  tg_algorithm alg;
  uint32_t log_entries; /* sliding_max_entries, sent to the script */
  char *host, *unix_path, *username, *password, *prefix; /* owned copies */
  size_t prefix_len;
  int port, db;
  uint32_t connect_timeout_ms, command_timeout_ms, backoff_ms;
  uint64_t next; /* round-robin start for picking a connection (atomic) */
  /* The pool's health (see the top of the file), all atomic: */
  uint64_t down_until_ms; /* CLOCK_MONOTONIC ms; 0: up */
  uint64_t down_rc;       /* -(the code calls get while down) */
  uint64_t probing;       /* 1 while one call is trying a down server */
  bool cluster_node;      /* a Cluster store's way to one node (policies,
                             reservations): redirections are reported
                             (TG__EMOVED, TG__ETRYAGAIN), not TG_ESTORE */
  size_t nconns;
  conn conns[]; /* nconns of them */
} redis_store;

/* One command (EVALSHA or TG.STEP), see redis_cmd.h. */
typedef tg__redis_args args;

static struct timeval tv_ms(uint32_t ms) {
  struct timeval tv = {(time_t)(ms / 1000u), (suseconds_t)(ms % 1000u) * 1000};
  return tv;
}

static bool starts(const char *s, const char *prefix) {
  return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* ---- arguments ---- */

static void push(args *a, const char *s, size_t len) {
  a->v[a->n] = s;
  a->len[a->n] = len;
  a->n++;
}

static void push_u64(args *a, uint64_t v) {
  char *b = a->num[a->nnum++];
  push(a, b, tg__u64_dec(b, v));
}

/* The Redis key of a call: prefix ":{" key "}:" algorithm. */
static size_t make_name(const redis_store *s, char *out, const void *key,
                        size_t key_len) {
  size_t n = s->prefix_len;
  memcpy(out, s->prefix, n);
  out[n++] = ':';
  out[n++] = '{';
  memcpy(out + n, key, key_len);
  n += key_len;
  out[n++] = '}';
  out[n++] = ':';
  out[n++] = SUFFIX[s->alg][0];
  out[n++] = SUFFIX[s->alg][1];
  return n;
}

/* The script's op letter for a call (see redis.lua): only calls that may
 * change state are sent as writes, so refusals found by the C step (a set
 * above the burst, a cost above the burst) cost no write. A sliding log is
 * always 'h': the script prunes it on every call. */
static const char *op_letter(const tg__call *c) {
  if (c->alg == TG_SLIDING_WINDOW)
    return "h";
  if (!tg__call_writes(c))
    return "r";
  if (c->op == TG__OP_SET)
    return "s";
  bool window = c->alg == TG_FIXED_WINDOW || c->alg == TG_FIXED_WINDOW_PER_KEY;
  if (window && c->op == TG__OP_TAKE) /* tg_nb's TG_NB_RULE */
    return "p";
  return window ? "w" : "h"; /* a bucket's TAKE or RESERVE: a hit's step */
}

/* The module's command for a call (redis-module/module.c): TG.STEP_RO, which
 * a replica or a server out of memory still runs, for calls that cannot
 * change the state, else TG.STEP; the arguments are the call itself, and
 * the reply has the script's shape. */
static void build_module_args(const redis_store *s, const tg__call *c,
                              args *a) {
  static const char DIGIT[TG__OP_COUNT_][2] = {"0", "1", "2", "3", "4",
                                               "5", "6", "7", "8", "9"};
  bool writes = tg__call_writes(c);
  push(a, writes ? "TG.STEP" : "TG.STEP_RO", writes ? 7 : 10);
  push(a, a->name, make_name(s, a->name, c->key, c->key_len));
  push(a, DIGIT[c->alg], 1);
  push(a, DIGIT[c->op], 1);
  if (c->store_time)
    push(a, "", 0);
  else
    push_u64(a, c->now_us);
  push_u64(a, c->q.limit);
  push_u64(a, c->q.period_us / 1000);
  push_u64(a, c->q.burst);
  push_u64(a, c->arg);
  push_u64(a, s->log_entries);
  if (c->op == TG__OP_RESERVE) /* tg_nb's TG_NB_RESERVE */
    push_u64(a, c->wait_ns);
}

/* The command for call c on a connection with the module or without. */
static void build_args(const redis_store *s, const tg__call *c, bool module,
                       args *a) {
  static const char ALG[TG_ALGORITHM_COUNT][2] = {"0", "1", "2", "3", "4"};
  a->n = 0;
  a->nnum = 0;
  if (module) {
    build_module_args(s, c, a);
    return;
  }
  push(a, "EVALSHA", 7);
  push(a, "", 0); /* the SHA1, set per connection when sent */
  push(a, "1", 1);
  push(a, a->name, make_name(s, a->name, c->key, c->key_len));
  const char *op = op_letter(c);
  push(a, op, 1);
  push(a, ALG[c->alg], 1);
  if (c->store_time)
    push(a, "", 0);
  else
    push_u64(a, c->now_us);
  switch (c->alg) {
  case TG_FIXED_WINDOW:
  case TG_FIXED_WINDOW_PER_KEY:
    if (op[0] != 'r') {
      push_u64(a, c->arg);
      push_u64(a, c->q.period_us / 1000);
    }
    if (op[0] == 'p') /* counted only when count + cost <= limit */
      push_u64(a, c->q.limit);
    break;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET:
    /* cost, fill <= burst, so the products are <= tau: no overflow */
    if (op[0] == 'h') {
      /* a reservation (tg_nb's TG_NB_RESERVE) is a hit whose tolerance is
       * stretched by its wait (src/core/gcra.c): tau + wait < 2^64 */
      push_u64(a, c->arg * c->q.t_ns);
      push_u64(a, c->q.tau_ns +
                      (c->op == TG__OP_RESERVE ? c->wait_ns : UINT64_C(0)));
    } else if (op[0] == 's') {
      uint64_t fill = c->alg == TG_TOKEN_BUCKET ? c->q.burst - c->arg : c->arg;
      push_u64(a, fill * c->q.t_ns);
    }
    break;
  case TG_SLIDING_WINDOW:
    push_u64(a, c->op == TG__OP_HIT || c->op == TG__OP_TAKE ? c->arg : 0);
    push_u64(a, c->q.limit);
    push_u64(a, c->q.period_us);
    push_u64(a, s->log_entries);
    break;
  }
}

/* ---- replies ---- */

/* A u64 from a reply string of 1..20 digits and nothing else. */
static bool parse_u64(const redisReply *r, uint64_t *out) {
  const char *p = r->str;
  return r->type == REDIS_REPLY_STRING &&
         tg__scan_u64(&p, r->str + r->len, out) && p == r->str + r->len;
}

static bool is_empty(const redisReply *r) {
  return r->type == REDIS_REPLY_STRING && r->len == 0;
}

/* An error reply as a status code. NOSCRIPT never gets here. The module
 * names a library status by its code's name ("TG_ETIME ..."): that code,
 * when it is one a store may return. */
static int reply_error(const redisReply *r) {
  /* anywhere in the text: Redis versions before 7 prefix script errors */
  if (r->str && (strstr(r->str, "TGCORRUPT") || strstr(r->str, "WRONGTYPE")))
    return TG_ECORRUPT;
  static const int passed[] = {TG_ECORRUPT, TG_ETIME, TG_ENOMEM};
  for (size_t i = 0; r->str && i < sizeof passed / sizeof passed[0]; i++) {
    const char *name = tg_err_name(passed[i]);
    size_t n = strlen(name);
    if (strncmp(r->str, name, n) == 0 && (r->str[n] == ' ' || !r->str[n]))
      return passed[i];
  }
  return TG_ESTORE; /* OOM, BUSY, READONLY, LOADING, NOAUTH, TGARG... */
}

/* The call as the step sees it: at the script's now. */
static int call_at(const tg__call *c, const redisReply *now_r, tg__call *cc) {
  uint64_t now;
  if (!parse_u64(now_r, &now))
    return TG_ESTORE;
  *cc = *c;
  if (c->store_time) {
    if (now > TG_NOW_MAX_US)
      return TG_ETIME;
    cc->now_us = now;
    cc->store_time = false;
  } else if (now != c->now_us) {
    return TG_ESTORE;
  }
  return TG_OK;
}

static int outcome_state(const tg__call *c, const redisReply *r,
                         tg__outcome *o) {
  if (r->elements != 3 || r->element[1]->type != REDIS_REPLY_STRING ||
      r->element[2]->type != REDIS_REPLY_INTEGER)
    return TG_ESTORE;
  tg__call cc;
  int rc = call_at(c, r->element[0], &cc);
  if (rc != TG_OK)
    return rc;
  tg__state st = {0, 0};
  bool absent = is_empty(r->element[1]);
  if (!absent &&
      !tg__rv_parse_state(c->alg, r->element[1]->str, r->element[1]->len, &st))
    return TG_ECORRUPT; /* the script checked it: not reached */
  if (!tg__state_plausible(c->alg, &st))
    return TG_ECORRUPT;
  bool changed;
  rc = tg__state_step(&cc, &st, o, &changed);
  /* The script made the same transition (and, like the memory store, did
   * not create a key for a state that is fresh already). A disagreement is a
   * bug: report a store failure rather than an answer the server's state
   * does not back. */
  bool wrote = tg__state_store_needed(c->alg, absent, changed, &st, cc.now_us);
  if (wrote != (r->element[2]->integer == 1))
    return TG_ESTORE;
  return rc;
}

static int outcome_log(const tg__call *c, const redisReply *r, tg__outcome *o) {
  if (r->elements != 6 || r->element[2]->type != REDIS_REPLY_INTEGER ||
      r->element[3]->type != REDIS_REPLY_INTEGER)
    return TG_ESTORE;
  tg__call cc;
  int rc = call_at(c, r->element[0], &cc);
  if (rc != TG_OK)
    return rc;
  tg__log_view v = {0, r->element[3]->integer > 0, 0, !is_empty(r->element[5]),
                    0};
  if (!parse_u64(r->element[1], &v.sum) ||
      (v.has_newest && !parse_u64(r->element[4], &v.newest_us)) ||
      (v.has_wait && !parse_u64(r->element[5], &v.wait_us)))
    return TG_ESTORE;
  if (v.newest_us > TG_NOW_MAX_US || v.wait_us > TG_NOW_MAX_US)
    return TG_ECORRUPT;
  /* the script decided the same question; a disagreement is a bug */
  if (cc.op == TG__OP_HIT &&
      tg__log_allows(&cc, v.sum) != (r->element[2]->integer == 1))
    return TG_ESTORE;
  return tg__log_report(&cc, &v, o);
}

static int outcome(const tg__call *c, const redisReply *r, tg__outcome *o) {
  if (r->type == REDIS_REPLY_ERROR)
    return reply_error(r);
  if (r->type != REDIS_REPLY_ARRAY)
    return TG_ESTORE;
  return c->alg == TG_SLIDING_WINDOW ? outcome_log(c, r, o)
                                     : outcome_state(c, r, o);
}

/* ---- SIGPIPE ----
 * hiredis writes with write(2): on a connection the server has closed, that
 * raises SIGPIPE, whose default action kills the process. A library must not
 * do that to its caller, nor touch the process's signal handling, so this
 * store lets hiredis only format commands into its buffer and sends the
 * buffer itself with send(MSG_NOSIGNAL); hiredis then finds nothing left to
 * write and only reads. */

/* Sends ctx's buffered commands; 0, or the errno of a failure (then ctx is
 * marked failed, as hiredis would). */
static int flush(redisContext *ctx) {
  size_t len = sdslen(ctx->obuf), off = 0;
  while (off < len) {
    ssize_t n = send(ctx->fd, ctx->obuf + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ctx->err = REDIS_ERR_IO;
      (void)snprintf(ctx->errstr, sizeof ctx->errstr, "send failed (errno %d)",
                     err);
      return err;
    }
    off += (size_t)n;
  }
  sdsclear(ctx->obuf);
  return 0;
}

/* One reply from ctx, waited for at most timeout_ms in all (0: for
 * ever). hiredis's own blocking read starts the socket's timeout again
 * after every read a signal interrupts, so a process with a recurring
 * timer (SIGALRM, a profiler) waited out a whole outage there; this waits
 * with poll(2) against a deadline instead. REDIS_OK with *out set, or
 * REDIS_ERR with ctx marked failed (a timeout as REDIS_ERR_IO with errno
 * EAGAIN, as hiredis reports its own). */
static int get_reply(redisContext *ctx, uint32_t timeout_ms, void **out) {
  *out = NULL;
  if (redisGetReplyFromReader(ctx, out) != REDIS_OK)
    return REDIS_ERR;
  uint64_t deadline = timeout_ms ? tg__mono_ms() + timeout_ms : 0;
  while (*out == NULL) {
    int wait = -1;
    if (deadline) {
      uint64_t now = tg__mono_ms();
      wait = now < deadline ? (int)(deadline - now) : 0;
    }
    struct pollfd p = {.fd = ctx->fd, .events = POLLIN};
    int n = wait == 0 ? 0 : poll(&p, 1, wait);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0) {
      ctx->err = REDIS_ERR_IO;
      (void)snprintf(ctx->errstr, sizeof ctx->errstr, "no reply in time");
      errno = EAGAIN;
      return REDIS_ERR;
    }
    if (redisBufferRead(ctx) != REDIS_OK ||
        redisGetReplyFromReader(ctx, out) != REDIS_OK)
      return REDIS_ERR;
  }
  return REDIS_OK;
}

/* ---- connections ---- */

/* The code for a context hiredis marked failed; errno as it was then. */
static int ctx_error(const redisContext *ctx, int err) {
  switch (ctx->err) {
  case REDIS_ERR_IO:
    return err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT
               ? TG_ETIMEDOUT
               : TG_ECONNECT;
  case REDIS_ERR_EOF:
    return TG_ECONNECT;
  case REDIS_ERR_OOM:
    return TG_ENOMEM;
  default:
    return TG_ESTORE; /* a protocol error: the stream is lost */
  }
}

static void conn_close(conn *k) {
  if (k->ctx) {
    redisFree(k->ctx);
    k->ctx = NULL;
  }
}

/* One command and its reply on an open connection; an I/O failure closes
 * it (a timed-out connection has a reply still coming: it cannot be reused). */
static int command(conn *k, int argc, const char **argv, const size_t *len,
                   redisReply **out) {
  if (redisAppendCommandArgv(k->ctx, argc, argv, len) != REDIS_OK)
    return TG_ENOMEM;
  int err = flush(k->ctx);
  void *r = NULL;
  if (err == 0) {
    errno = 0;
    if (get_reply(k->ctx, k->timeout_ms, &r) != REDIS_OK || !r)
      err = errno ? errno : EIO;
  }
  if (err != 0) {
    int rc = ctx_error(k->ctx, err);
    conn_close(k);
    return rc;
  }
  *out = r;
  return TG_OK;
}

/* A command whose reply must not be an error (AUTH, SELECT, SCRIPT LOAD). */
static int command_ok(conn *k, int argc, const char **argv, const size_t *len,
                      redisReply **out) {
  redisReply *r = NULL;
  int rc = command(k, argc, argv, len, &r);
  if (rc != TG_OK)
    return rc;
  if (!r)
    return TG_ESTORE; /* not reached: command() answers OK with a reply */
  if (r->type == REDIS_REPLY_ERROR) {
    freeReplyObject(r);
    return TG_ESTORE;
  }
  if (out)
    *out = r;
  else
    freeReplyObject(r);
  return TG_OK;
}

static int load_script(conn *k) {
  const char *argv[] = {"SCRIPT", "LOAD", tg__redis_script};
  size_t len[] = {6, 4, tg__redis_script_len};
  redisReply *r;
  int rc = command_ok(k, 3, argv, len, &r);
  if (rc != TG_OK)
    return rc;
  if (r->type != REDIS_REPLY_STRING || r->len != 40) {
    freeReplyObject(r);
    return TG_ESTORE;
  }
  memcpy(k->sha, r->str, 40);
  k->sha[40] = '\0';
  freeReplyObject(r);
  return TG_OK;
}

/* Whether the server has the tollgate module, asked once per connection:
 * COMMAND INFO names a command the server does not know with a nil entry.
 * An error (a user whose ACL does not allow COMMAND) means the script. */
static int detect_module(conn *k) {
  const char *argv[] = {"COMMAND", "INFO", "TG.STEP"};
  size_t len[] = {7, 4, 7};
  redisReply *r = NULL;
  int rc = command(k, 3, argv, len, &r);
  if (rc != TG_OK)
    return rc;
  if (!r)
    return TG_ESTORE; /* not reached: command() answers OK with a reply */
  k->module = r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
              r->element[0]->type == REDIS_REPLY_ARRAY;
  freeReplyObject(r);
  return TG_OK;
}

/* Whether a reply says the command did not run and can be sent again once
 * the connection is fixed: the server lost the script (NOSCRIPT), or the
 * module was unloaded since the connection found it (then the connection
 * turns to the script for good). */
static bool not_run(const conn *k, const redisReply *r) {
  if (r->type != REDIS_REPLY_ERROR)
    return false;
  return k->module ? starts(r->str, "ERR unknown command")
                   : starts(r->str, "NOSCRIPT");
}

/* Makes the connection able to run a call again after not_run. */
static int fix_conn(conn *k) {
  k->module = false;
  return load_script(k);
}

/* What a fresh connection needs before its first call. */
static int handshake(const redis_store *s, conn *k) {
  k->timeout_ms = s->command_timeout_ms;
  if (s->command_timeout_ms > 0 &&
      redisSetTimeout(k->ctx, tv_ms(s->command_timeout_ms)) != REDIS_OK)
    return TG_ECONNECT;
  int rc = TG_OK;
  if (s->password) {
    const char *argv[3] = {"AUTH"};
    size_t len[3] = {4};
    int n = 1;
    if (s->username) {
      argv[n] = s->username;
      len[n++] = strlen(s->username);
    }
    argv[n] = s->password;
    len[n++] = strlen(s->password);
    rc = command_ok(k, n, argv, len, NULL);
  }
  if (rc == TG_OK && s->db != 0) {
    char db[16];
    int dn = snprintf(db, sizeof db, "%d", s->db);
    const char *argv[] = {"SELECT", db};
    size_t len[] = {6, (size_t)dn};
    rc = command_ok(k, 2, argv, len, NULL);
  }
  if (rc == TG_OK)
    rc = detect_module(k);
  if (rc == TG_OK && !k->module)
    rc = load_script(k);
  return rc;
}

/* Makes sure k is open; k->mu is held. */
static int conn_open(const redis_store *s, conn *k) {
  pid_t pid = getpid();
  if (k->ctx && k->pid != pid) {
    /* opened before a fork(): the socket is shared with the other process,
     * whose replies this one could read. Close our copy and open anew. */
    conn_close(k);
  }
  if (k->ctx)
    return TG_OK;
  redisContext *ctx;
  errno = 0;
  if (s->unix_path)
    ctx = s->connect_timeout_ms
              ? redisConnectUnixWithTimeout(s->unix_path,
                                            tv_ms(s->connect_timeout_ms))
              : redisConnectUnix(s->unix_path);
  else
    ctx = s->connect_timeout_ms
              ? redisConnectWithTimeout(s->host, s->port,
                                        tv_ms(s->connect_timeout_ms))
              : redisConnect(s->host, s->port);
  int rc;
  if (!ctx) {
    rc = TG_ENOMEM;
  } else if (ctx->err) {
    /* hiredis reports a connect timeout as an I/O error with ETIMEDOUT or
     * EINPROGRESS in errno */
    int err = errno;
    rc = ctx->err == REDIS_ERR_IO && (err == ETIMEDOUT || err == EINPROGRESS)
             ? TG_ETIMEDOUT
             : TG_ECONNECT;
    redisFree(ctx);
  } else {
    k->ctx = ctx;
    k->pid = pid;
    /* not inherited by a program the process execs (hiredis 0.14 opens
     * its sockets without SOCK_CLOEXEC) */
    rc = fcntl(ctx->fd, F_SETFD, FD_CLOEXEC) == 0 ? handshake(s, k)
                                                  : TG_ECONNECT;
  }
  if (rc != TG_OK)
    conn_close(k);
  return rc;
}

/* Takes a connection: the first free one from a rotating start, else
 * waits for the one at the start. Returns it locked. */
static conn *acquire(redis_store *s) {
  size_t start = (size_t)(tg__fetch_add(&s->next, 1) % s->nconns);
  for (size_t i = 0; i < s->nconns; i++) {
    conn *k = &s->conns[(start + i) % s->nconns];
    if (pthread_mutex_trylock(&k->mu) == 0)
      return k;
  }
  conn *k = &s->conns[start];
  pthread_mutex_lock(&k->mu);
  return k;
}

/* ---- the pool's health ---- */

/* Whether a call may use the server now. Returns TG_OK (and sets *probe when
 * this call is the one trying a down server), or the code of the failure
 * that made the pool down: the call must then touch no socket. */
static int gate(redis_store *s, bool *probe) {
  *probe = false;
  uint64_t until = tg__load_acquire(&s->down_until_ms);
  if (until == 0)
    return TG_OK;
  int down = -(int)tg__load_relaxed(&s->down_rc);
  if (tg__mono_ms() < until)
    return down;
  uint64_t idle = 0;
  if (!tg__cas64(&s->probing, &idle, 1))
    return down; /* another call is probing: do not pile up behind it */
  /* A probe that ended between the load above and the claim has set a new
   * backoff (settle() writes it before it lets go of `probing`): honour it. */
  until = tg__load_acquire(&s->down_until_ms);
  if (until != 0 && tg__mono_ms() < until) {
    tg__store_release(&s->probing, 0);
    return -(int)tg__load_relaxed(&s->down_rc);
  }
  *probe = true;
  return TG_OK;
}

/* Records how a call that used the server went. `open_failed`: the
 * connection could not be opened (refused, timed out, or its handshake
 * failed); a timeout anywhere means the server does not answer. Either makes
 * the pool down. An answer, even an error reply, means the server is there:
 * the pool is up. A connection the server closed (TG_ECONNECT from a command)
 * proves neither: the next call reconnects and finds out. */
static void settle(redis_store *s, int rc, bool open_failed, bool probe) {
  if (open_failed || rc == TG_ETIMEDOUT) {
    uint64_t until = tg__mono_ms() + s->backoff_ms;
    tg__store_relaxed(&s->down_rc, (uint64_t)-rc);
    tg__store_release(&s->down_until_ms, until ? until : 1);
  } else if (rc != TG_ECONNECT && tg__load_relaxed(&s->down_until_ms) != 0) {
    tg__store_release(&s->down_until_ms, 0);
  }
  if (probe)
    tg__store_release(&s->probing, 0);
}

/* Takes a connection for a call gate() let through. A call that waited for
 * it behind one that found the server down answers that failure at once,
 * as a call arriving then would (a probe goes on: it is the one trying).
 * Returns the connection locked, or NULL with the failure's code in *rc. */
static conn *take(redis_store *s, bool probe, int *rc) {
  conn *k = acquire(s);
  if (!probe) {
    uint64_t until = tg__load_acquire(&s->down_until_ms);
    if (until != 0 && tg__mono_ms() < until) {
      pthread_mutex_unlock(&k->mu);
      int down = -(int)tg__load_relaxed(&s->down_rc);
      *rc = down != TG_OK ? down : TG_ECONNECT;
      return NULL;
    }
  }
  *rc = TG_OK;
  return k;
}

/* Lets go of k after recording how the call went: the record first, so
 * that a call waiting for k sees the pool down when it takes it. */
static void give_back(redis_store *s, conn *k, int rc, bool open_failed,
                      bool probe) {
  settle(s, rc, open_failed, probe);
  pthread_mutex_unlock(&k->mu);
}

/* Sends call c and reads its reply; once more if it did not run (see
 * not_run). */
static int eval(const redis_store *s, conn *k, const tg__call *c,
                redisReply **out) {
  args a;
  for (int attempt = 0;; attempt++) {
    build_args(s, c, k->module, &a);
    if (!k->module) {
      a.v[1] = k->sha;
      a.len[1] = 40;
    }
    redisReply *r;
    int rc = command(k, a.n, a.v, a.len, &r);
    if (rc != TG_OK)
      return rc;
    if (attempt == 0 && not_run(k, r)) {
      freeReplyObject(r);
      rc = fix_conn(k);
      if (rc != TG_OK)
        return rc;
      continue;
    }
    *out = r;
    return TG_OK;
  }
}

/* ---- several keys: policies, reservations, cancels ----
 * These read the keys (the script's R op, with the server's TIME), run the
 * core on what they read, here, and write everything back with the C op,
 * which writes only if no key changed in between (then they read again).
 * All the arithmetic is the core's; the script only compares and stores. */

/* One key of such a call. */
typedef struct mkey {
  const redis_store *s;
  tg__call c; /* at the server's now once read */
  size_t name_len;
  char name[NAME_MAX_BYTES];
  char *old; /* the value read (owned), NULL: absent */
  size_t old_len;
  char *val; /* the value to write (owned) */
  size_t val_len;
  int action; /* 0 leave, 1 set val, 2 delete */
  uint64_t px;
  char px_text[24];
} mkey;

/* Keeps the value a read returned for m (replacing an older one): TG_OK,
 * TG_ESTORE for a reply that is no string, TG_ENOMEM. */
static int keep_read(mkey *m, const redisReply *v) {
  free(m->old);
  m->old = NULL;
  m->old_len = 0;
  if (v->type != REDIS_REPLY_STRING)
    return TG_ESTORE;
  if (v->len > 0) {
    m->old = malloc(v->len);
    if (!m->old)
      return TG_ENOMEM;
    memcpy(m->old, v->str, v->len);
    m->old_len = v->len;
  }
  return TG_OK;
}

static void mkey_free(mkey *m) {
  free(m->old);
  free(m->val);
  m->old = m->val = NULL;
}

/* Sends EVALSHA of the script with argv[0..argc) (argv[1], the SHA1, is
 * set here); loads the script first when the connection has none (one that
 * uses the module) or lost it (NOSCRIPT). */
static int eval_script(conn *k, int argc, const char **argv, const size_t *len,
                       redisReply **out) {
  if (!k->sha[0]) {
    int rc = load_script(k);
    if (rc != TG_OK)
      return rc;
  }
  for (int attempt = 0;; attempt++) {
    argv[1] = k->sha;
    int rc = command(k, argc, argv, len, out);
    if (rc != TG_OK)
      return rc;
    if (attempt == 0 && (*out)->type == REDIS_REPLY_ERROR &&
        starts((*out)->str, "NOSCRIPT")) {
      freeReplyObject(*out);
      if ((rc = load_script(k)) != TG_OK)
        return rc;
      continue;
    }
    return TG_OK;
  }
}

/* An error reply to R or C. On a Cluster's node, the replies that say the
 * script did not run there: MOVED (the slot is served elsewhere) and
 * CLUSTERDOWN ask the Cluster store for a new map, ASK and TRYAGAIN (the
 * slot is being migrated: its keys are on both nodes) for a short wait;
 * either way it reads again from the start, so nothing is counted twice. */
static int multi_error(const redis_store *s, const redisReply *r) {
  if (s->cluster_node && r->str) {
    if (starts(r->str, "MOVED ") || starts(r->str, "CLUSTERDOWN"))
      return TG__EMOVED;
    if (starts(r->str, "ASK ") || starts(r->str, "TRYAGAIN"))
      return TG__ETRYAGAIN;
  }
  return reply_error(r);
}

/* R: every key's value and the now. */
static int read_keys(conn *k, mkey *m, size_t n, bool store_time,
                     uint64_t now_in, uint64_t *now) {
  size_t argc = 5 + n;
  const char **argv = malloc(argc * sizeof *argv);
  size_t *len = malloc(argc * sizeof *len);
  char nbuf[24], num[24];
  int rc = TG_ENOMEM;
  redisReply *r = NULL;
  if (!argv || !len)
    goto out;
  argv[0] = "EVALSHA";
  len[0] = 7;
  len[1] = 40;
  argv[2] = nbuf;
  len[2] = tg__u64_dec(nbuf, n);
  for (size_t i = 0; i < n; i++) {
    argv[3 + i] = m[i].name;
    len[3 + i] = m[i].name_len;
  }
  argv[3 + n] = "R";
  len[3 + n] = 1;
  argv[4 + n] = num;
  len[4 + n] = store_time ? 0 : tg__u64_dec(num, now_in);
  rc = eval_script(k, (int)argc, argv, len, &r);
  if (rc != TG_OK)
    goto out;
  if (r->type == REDIS_REPLY_ERROR) {
    rc = multi_error(m[0].s, r);
    goto out;
  }
  rc = TG_ESTORE;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != n + 1 ||
      !parse_u64(r->element[0], now))
    goto out;
  rc = TG_OK;
  for (size_t i = 0; i < n && rc == TG_OK; i++) {
    const redisReply *v = r->element[i + 1];
    rc = keep_read(&m[i], v);
  }
out:
  if (r)
    freeReplyObject(r);
  free(argv);
  free(len);
  return rc;
}

/* C: writes every key's action if none changed; *written says whether it
 * did (false: one changed meanwhile, nothing was written). */
static int write_keys(conn *k, mkey *m, size_t n, bool *written) {
  size_t argc = 5 + n + 3 * n;
  const char **argv = malloc(argc * sizeof *argv);
  size_t *len = malloc(argc * sizeof *len);
  char nbuf[24];
  int rc = TG_ENOMEM;
  redisReply *r = NULL;
  if (!argv || !len)
    goto out;
  argv[0] = "EVALSHA";
  len[0] = 7;
  len[1] = 40;
  argv[2] = nbuf;
  len[2] = tg__u64_dec(nbuf, n);
  size_t a = 3;
  for (size_t i = 0; i < n; i++, a++) {
    argv[a] = m[i].name;
    len[a] = m[i].name_len;
  }
  argv[a] = "C";
  len[a++] = 1;
  argv[a] = "";
  len[a++] = 0;
  for (size_t i = 0; i < n; i++) {
    argv[a] = m[i].old ? m[i].old : "";
    len[a++] = m[i].old_len;
    argv[a] = m[i].action == 1 ? m[i].val : m[i].action == 2 ? "-" : "";
    len[a++] = m[i].action == 1 ? m[i].val_len : m[i].action == 2 ? 1 : 0;
    argv[a] = m[i].px_text;
    len[a++] = tg__u64_dec(m[i].px_text, m[i].px);
  }
  rc = eval_script(k, (int)argc, argv, len, &r);
  if (rc != TG_OK)
    goto out;
  if (r->type == REDIS_REPLY_ERROR)
    rc = multi_error(m[0].s, r);
  else if (r->type != REDIS_REPLY_INTEGER)
    rc = TG_ESTORE;
  else
    *written = r->integer == 1;
out:
  if (r)
    freeReplyObject(r);
  free(argv);
  free(len);
  return rc;
}

/* The PX a written state gets: until it is fresh, rounded down, plus the
 * script's slack (2 ms on the server's clock, 1 s on a caller's). */
static uint64_t px_for(const tg__call *orig, uint64_t expiry_us,
                       uint64_t now_us) {
  uint64_t ms = expiry_us > now_us ? (expiry_us - now_us) / 1000 : 0;
  return ms + (orig->store_time ? 2 : 1000);
}

/* Runs m->c (its op, at the now read) on the value read; when `write`,
 * sets what to store. Returns the step's status (TG_ECORRUPT for a value
 * that is not a sound state of the algorithm). */
static int step_key(mkey *m, const tg__call *orig, bool write, tg__outcome *o,
                    tg__token *tok) {
  const tg__call *c = &m->c;
  tg_algorithm alg = c->alg;
  m->action = 0;
  free(m->val);
  m->val = NULL;
  if (alg != TG_SLIDING_WINDOW) {
    tg__state st = {0, 0};
    if (m->old && (!tg__rv_parse_state(alg, m->old, m->old_len, &st) ||
                   !tg__state_plausible(alg, &st)))
      return TG_ECORRUPT;
    tg__state before = st;
    bool changed;
    int rc = tg__state_step(c, &st, o, &changed);
    if (tok && (c->op == TG__OP_RESERVE || c->op == TG__OP_TAKE)) {
      tok->taken = rc == TG_OK && changed;
      tok->before = before;
      tok->after = st;
      tok->now_us = c->now_us;
      tok->gen = 0;
    }
    if (rc != TG_OK || !write || !changed || c->op == TG__OP_CHECK)
      return rc;
    if (tg__state_fresh(alg, &st, c->now_us)) {
      m->action = m->old ? 2 : 0;
      return TG_OK;
    }
    m->val = malloc(TG__RV_STATE_MAX);
    if (!m->val)
      return TG_ENOMEM;
    m->val_len = tg__rv_format_state(alg, &st, m->val);
    m->px = px_for(orig, tg__state_expiry_us(alg, &st), c->now_us);
    m->action = 1;
    return TG_OK;
  }
  size_t n = 0;
  if (m->old && !tg__rv_log_entries(m->old, m->old_len, &n))
    return TG_ECORRUPT;
  tg__entry *e = malloc((n + 1) * sizeof *e);
  if (!e)
    return TG_ENOMEM;
  tg__log lg = {e, 0, (uint32_t)n, (uint32_t)(n + 1), 0};
  int rc = TG_OK;
  if (m->old &&
      (!tg__rv_parse_log(m->old, n, e, &lg.sum) || !tg__log_plausible(&lg)))
    rc = TG_ECORRUPT;
  if (rc == TG_OK && c->op == TG__OP_CHECK) {
    tg__log_view v;
    rc = tg__log_check(c, &lg, &v);
    if (rc == TG_OK)
      rc = tg__log_report(c, &v, o);
  } else if (rc == TG_OK) {
    /* as the module does: prune, then a ring whose size makes the step
     * append below the cap and merge at it */
    bool pruned = tg__log_prune(&lg, c->q.period_us, c->now_us) > 0;
    memmove(e, e + lg.head, lg.n * sizeof *e);
    lg.head = 0;
    lg.cap = lg.n >= m->s->log_entries ? lg.n : lg.n + 1;
    if (lg.cap == 0)
      lg.cap = 1;
    bool changed;
    rc = tg__log_step(c, &lg, o, &changed);
    if (rc == TG_OK && write && (changed || pruned)) {
      if (lg.n == 0) {
        m->action = m->old ? 2 : 0;
      } else {
        m->val_len = TG__RV_LOG_HEAD + (size_t)TG__RV_LOG_ENTRY * lg.n;
        m->val = malloc(m->val_len);
        if (!m->val) {
          rc = TG_ENOMEM;
        } else {
          tg__rv_format_log(&lg, m->val);
          m->px =
              px_for(orig, tg__log_expiry_us(&lg, c->q.period_us), c->now_us);
          m->action = 1;
        }
      }
    }
  }
  free(e);
  return rc;
}

/* Read, decide, write-if-unchanged, as often as the keys change under it
 * (at most MULTI_TRIES times, then TG_EBUSY), on one connection. decide()
 * runs the core on what was read and says whether to write. */
#define MULTI_TRIES 64

typedef int (*decide_fn)(mkey *m, size_t n, const tg__call *orig, void *ctx,
                         bool *write, size_t *failed);

/* The same decision in one command (see rules_native): the module's, or the
 * script's; *ran false: the module is gone and the connection has turned
 * to the script (multi then calls it again), or NULL (decide_one) for the
 * read and the conditional write. */
typedef int (*native_fn)(conn *k, mkey *m, size_t n, const tg__call *orig,
                         void *ctx, size_t *failed, bool *ran);

static int multi(redis_store *s, mkey *m, size_t n, const tg__call *orig,
                 decide_fn decide, native_fn native, void *ctx,
                 size_t *failed) {
  bool probe;
  int rc = gate(s, &probe);
  conn *k = rc == TG_OK ? take(s, probe, &rc) : NULL;
  if (!k)
    return rc;
  rc = conn_open(s, k);
  bool open_failed = rc != TG_OK;
  bool done = false;
  for (int t = 0; rc == TG_OK && native && !done && t < 2; t++)
    rc = native(k, m, n, orig, ctx, failed, &done);
  if (rc == TG_OK && native && !done)
    rc = TG_ESTORE; /* the script was not run after it was loaded again */
  for (int t = 0; rc == TG_OK && !done; t++) {
    if (t == MULTI_TRIES) {
      rc = TG_EBUSY; /* the keys kept changing under it */
      break;
    }
    uint64_t now = 0;
    rc = read_keys(k, m, n, orig->store_time, orig->now_us, &now);
    if (rc != TG_OK)
      break;
    if (orig->store_time && now > TG_NOW_MAX_US) {
      rc = TG_ETIME;
      break;
    }
    if (!orig->store_time && now != orig->now_us) {
      rc = TG_ESTORE;
      break;
    }
    for (size_t i = 0; i < n; i++) {
      m[i].c.now_us = now;
      m[i].c.store_time = false;
    }
    bool write = false;
    rc = decide(m, n, orig, ctx, &write, failed);
    if (rc != TG_OK || !write)
      break;
    bool written = false;
    rc = write_keys(k, m, n, &written);
    if (rc != TG_OK || written)
      break;
    /* another client wrote one of the keys in between: read again, after
     * a pause that grows (and differs between threads, so that two that
     * keep colliding part) */
    struct timespec ts = {0, (long)((20000u << (t < 6 ? t : 6)) +
                                    (uint64_t)(uintptr_t)k % 9973u)};
    nanosleep(&ts, NULL);
  }
  give_back(s, k, rc, open_failed, probe);
  return rc;
}

/* A policy's decision on what was read: CHECK every rule, and when the
 * call passes, TAKE every rule that allowed. */
typedef struct rules_ctx {
  const bool *shadow;
  tg__outcome *o;
  bool *passed;
} rules_ctx;

static int decide_rules(mkey *m, size_t n, const tg__call *orig, void *p,
                        bool *write, size_t *failed) {
  rules_ctx *x = p;
  bool pass = true;
  for (size_t i = 0; i < n; i++) {
    tg__call keep = m[i].c;
    m[i].c.op = TG__OP_CHECK;
    int rc = step_key(&m[i], orig, false, &x->o[i], NULL);
    m[i].c = keep;
    if (rc != TG_OK) {
      *failed = i;
      return rc;
    }
    if (!x->o[i].r.allowed && !x->shadow[i])
      pass = false;
  }
  *x->passed = pass;
  if (!pass)
    return TG_OK;
  for (size_t i = 0; i < n; i++) {
    if (!x->o[i].r.allowed) {
      m[i].action = 0; /* a shadow rule that denied: left as it is */
      continue;
    }
    tg__call keep = m[i].c;
    m[i].c.op = TG__OP_TAKE;
    tg__outcome o;
    /* a reservation's receipt (tg_reserve_rules) in the rule's token */
    int rc = step_key(&m[i], orig, true, &o, keep.tok);
    m[i].c = keep;
    if (rc != TG_OK) {
      *failed = i;
      return rc;
    }
  }
  *write = true;
  return TG_OK;
}

/* A policy in one round trip: with the module TG.STEPS (see
 * redis-module/module.c), without it the script's P (redis.lua) checks
 * every rule and takes them all when the policy passes, as decide_rules
 * does, and answers the values it found and whether it passed.
 * decide_rules then runs here on those values, so every number reported
 * comes from this process's core, and its verdict must be the server's (a
 * difference is a bug: TG_ESTORE). */
#define STEPS_PER_RULE 7

/* The script's arguments of rule c for P (redis.lua): algorithm, op, the
 * op's four numbers, shadow. A bucket rule that reserves
 * (tg_reserve_rules) is sent with its tolerance stretched by its wait, as
 * gcra.c's CHECK and TAKE decide it (tau + wait < 2^64); a bucket's cost
 * above the burst as that tolerance + 1 ns (denied all the same: cost * T
 * could pass 2^64). */
static void script_rule(const redis_store *s, const tg__call *c, bool shadow,
                        const char **argv, size_t *len, char (*num)[24]) {
  static const char ALG[TG_ALGORITHM_COUNT][2] = {"0", "1", "2", "3", "4"};
  uint64_t v[4] = {0, 0, 0, 0};
  switch (c->alg) {
  case TG_FIXED_WINDOW:
  case TG_FIXED_WINDOW_PER_KEY:
    v[0] = c->arg;
    v[1] = c->q.period_us / 1000;
    v[2] = c->q.limit;
    break;
  case TG_TOKEN_BUCKET:
  case TG_LEAKY_BUCKET: {
    uint64_t tau = c->q.tau_ns + c->wait_ns;
    v[0] = c->arg > c->q.burst ? tau + 1 : c->arg * c->q.t_ns;
    v[1] = tau;
    break;
  }
  case TG_SLIDING_WINDOW:
    v[0] = c->arg;
    v[1] = c->q.limit;
    v[2] = c->q.period_us;
    v[3] = s->log_entries;
    break;
  }
  argv[0] = ALG[c->alg];
  len[0] = 1;
  argv[1] = c->alg == TG_SLIDING_WINDOW ? "h" : "p";
  len[1] = 1;
  for (int j = 0; j < 4; j++) {
    argv[2 + j] = num[j];
    len[2 + j] = tg__u64_dec(num[j], v[j]);
  }
  argv[6] = shadow ? "1" : "0";
  len[6] = 1;
}

/* The policy command for rules m[0..n) (names made), into a: the module's
 * TG.STEPS (module) or the script's P (the SHA1 left for the caller). A
 * policy of which a rule reserves gives TG.STEPS each rule's wait as an
 * eighth argument (a module that predates it refuses the command: see
 * tg_reserve_rules); other policies are sent as before. */
static void rules_args(const mkey *m, size_t n, const tg__call *orig,
                       const bool *shadow, bool module,
                       tg__redis_rules_args *a) {
  size_t nn = 0;
  bool waits = false;
  for (size_t i = 0; i < n; i++)
    waits = waits || m[i].c.wait_ns > 0;
  a->n = 0;
#define ARG(s, l) (a->v[a->n] = (s), a->len[a->n++] = (l))
#define NUM(v) (ARG(a->num[nn], tg__u64_dec(a->num[nn], (v))), nn++)
  if (module) {
    ARG("TG.STEPS", 8);
  } else {
    ARG("EVALSHA", 7);
    ARG("", 40); /* the SHA1: the caller sets it */
  }
  NUM(n);
  for (size_t i = 0; i < n; i++)
    ARG(m[i].name, m[i].name_len);
  if (!module)
    ARG("P", 1);
  if (orig->store_time)
    ARG("", 0);
  else
    NUM(orig->now_us);
  for (size_t i = 0; i < n; i++) {
    const tg__call *c = &m[i].c;
    if (!module) {
      script_rule(m[i].s, c, shadow[i], &a->v[a->n], &a->len[a->n],
                  &a->num[nn]);
      a->n += STEPS_PER_RULE;
      nn += 4;
      continue;
    }
    NUM((uint64_t)c->alg);
    NUM(c->q.limit);
    NUM(c->q.period_us / 1000);
    NUM(c->q.burst);
    NUM(c->arg);
    NUM(m[i].s->log_entries);
    NUM(shadow[i] ? 1u : 0u);
    if (waits)
      NUM(c->wait_ns);
  }
#undef NUM
#undef ARG
}

/* The reply r to the policy command of m[0..n): the values read, decided
 * here (decide_rules), which must be the server's verdict. */
static int rules_reply(mkey *m, size_t n, const tg__call *orig, rules_ctx *x,
                       const redisReply *r, size_t *failed) {
  if (r->type == REDIS_REPLY_ERROR) {
    const char *tag = "TGCORRUPT rule ";
    const char *at = r->str ? strstr(r->str, tag) : NULL;
    uint64_t i;
    const char *q = at ? at + strlen(tag) : NULL;
    if (q && tg__scan_u64(&q, r->str + r->len, &i) && i < n) {
      *failed = (size_t)i;
      return TG_ECORRUPT;
    }
    return multi_error(m[0].s, r);
  }
  uint64_t now;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != n + 2 ||
      !parse_u64(r->element[0], &now) ||
      r->element[n + 1]->type != REDIS_REPLY_INTEGER)
    return TG_ESTORE;
  bool server_passed = r->element[n + 1]->integer == 1;
  if (orig->store_time && now > TG_NOW_MAX_US)
    return TG_ETIME;
  if (!orig->store_time && now != orig->now_us)
    return TG_ESTORE;
  int rc = TG_OK;
  for (size_t i = 0; i < n && rc == TG_OK; i++) {
    const redisReply *v = r->element[i + 1];
    m[i].c.now_us = now;
    m[i].c.store_time = false;
    rc = keep_read(&m[i], v);
  }
  bool write;
  if (rc == TG_OK)
    rc = decide_rules(m, n, orig, x, &write, failed);
  if (rc == TG_OK && *x->passed != server_passed)
    rc = TG_ESTORE;
  return rc;
}

/* Whether a rule of m[0..n) waits (a policy of reservations). */
static bool rules_wait(const mkey *m, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (m[i].c.wait_ns > 0)
      return true;
  return false;
}

/* Whether the module's reply r to a policy that carries waits says the
 * module predates them: it refuses the command's shape ("TGARG", which
 * for any other command means a client bug). The policy did not run; the
 * connection turns to the script, which needs no change for a wait (the
 * tolerance is stretched before it is sent). */
static bool old_module(const redisReply *r, bool waits) {
  return waits && r->type == REDIS_REPLY_ERROR && starts(r->str, "TGARG");
}

static int rules_native(conn *k, mkey *m, size_t n, const tg__call *orig,
                        void *p, size_t *failed, bool *ran) {
  rules_ctx *x = p;
  bool module = k->module;
  tg__redis_rules_args *a = malloc(sizeof *a);
  redisReply *r = NULL;
  int rc = TG_ENOMEM;
  *ran = false;
  if (!a)
    goto out;
  rules_args(m, n, orig, x->shadow, module, a);
  rc = module ? command(k, a->n, a->v, a->len, &r)
              : eval_script(k, a->n, a->v, a->len, &r);
  if (rc != TG_OK)
    goto out;
  if (module && not_run(k, r)) {
    rc = fix_conn(k); /* unloaded since this connection found it */
    goto out;
  }
  if (module && old_module(r, rules_wait(m, n))) {
    rc = fix_conn(k); /* a module from before the waits: the script */
    goto out;
  }
  *ran = true;
  rc = rules_reply(m, n, orig, x, r, failed);
out:
  if (r)
    freeReplyObject(r);
  free(a);
  return rc;
}

/* A policy through the engine (redis_cmd.h): its keys, encoded and
 * decoded as rules_native does. */
struct tg__redis_rules {
  size_t n;
  tg__call orig[TG_RULES_MAX]; /* as submitted */
  bool shadow[TG_RULES_MAX];
  mkey m[TG_RULES_MAX];
  tg__redis_rules_args a;
  tg__outcome o[TG_RULES_MAX];
  bool passed;
  size_t failed;
};

int tg__redis_rules_new(tg__redis_rules **out, const tg__store *const *codecs,
                        const tg__call *calls, size_t n, const bool *shadow) {
  *out = NULL;
  if (n == 0 || n > TG_RULES_MAX)
    return TG_EINVAL;
  tg__redis_rules *x = calloc(1, sizeof *x);
  if (!x)
    return TG_ENOMEM;
  x->n = n;
  for (size_t i = 0; i < n; i++) {
    x->orig[i] = calls[i];
    x->shadow[i] = shadow[i];
    x->m[i].s = (const redis_store *)codecs[i];
    x->m[i].c = calls[i];
    x->m[i].name_len =
        make_name(x->m[i].s, x->m[i].name, calls[i].key, calls[i].key_len);
  }
  *out = x;
  return TG_OK;
}

void tg__redis_rules_free(tg__redis_rules *x) {
  if (!x)
    return;
  for (size_t i = 0; i < x->n; i++)
    mkey_free(&x->m[i]);
  free(x);
}

unsigned tg__redis_rules_slot(const tg__redis_rules *x, size_t i) {
  return tg__key_slot(x->m[i].name, x->m[i].name_len);
}

bool tg__redis_rules_same_key(const tg__redis_rules *x, size_t i, size_t j) {
  return x->m[i].name_len == x->m[j].name_len &&
         memcmp(x->m[i].name, x->m[j].name, x->m[i].name_len) == 0;
}

bool tg__redis_rules_wait(const tg__redis_rules *x) {
  return rules_wait(x->m, x->n);
}

bool tg__redis_rules_long_value(const tg__redis_rules *x, size_t i) {
  return i < x->n && x->orig[i].alg == TG_SLIDING_WINDOW;
}

const tg__redis_rules_args *
tg__redis_rules_encode(tg__redis_rules *x, bool module, const char *sha) {
  for (size_t i = 0; i < x->n; i++)
    x->m[i].c = x->orig[i];
  rules_args(x->m, x->n, &x->orig[0], x->shadow, module, &x->a);
  if (!module) {
    x->a.v[1] = sha;
    x->a.len[1] = 40;
  }
  return &x->a;
}

int tg__redis_rules_decode(tg__redis_rules *x, const redisReply *r) {
  for (size_t i = 0; i < x->n; i++)
    x->m[i].c = x->orig[i];
  x->passed = false;
  x->failed = 0;
  rules_ctx c = {x->shadow, x->o, &x->passed};
  return rules_reply(x->m, x->n, &x->orig[0], &c, r, &x->failed);
}

const tg__outcome *tg__redis_rules_outcomes(const tg__redis_rules *x,
                                            bool *passed, size_t *failed) {
  *passed = x->passed;
  *failed = x->failed;
  return x->o;
}

static int redis_exec_rules(tg__store *const *stores, const tg__call *calls,
                            size_t n, const bool *shadow, tg__outcome *o,
                            bool *passed, size_t *failed) {
  *passed = false;
  mkey *m = calloc(n, sizeof *m);
  if (!m)
    return TG_ENOMEM;
  unsigned slot = 0;
  int rc = TG_OK;
  for (size_t i = 0; i < n; i++) {
    m[i].s = (const redis_store *)stores[i];
    m[i].c = calls[i];
    m[i].name_len =
        make_name(m[i].s, m[i].name, calls[i].key, calls[i].key_len);
    unsigned sl = tg__key_slot(m[i].name, m[i].name_len);
    if (i == 0) {
      slot = sl;
    } else if (sl != slot && rc == TG_OK) {
      rc = TG_EINVAL; /* not usable in Redis Cluster: see the header */
      *failed = i;
    }
  }
  if (rc == TG_OK) {
    rules_ctx x = {shadow, o, passed};
    rc = multi((redis_store *)stores[0], m, n, &calls[0], decide_rules,
               rules_native, &x, failed);
  }
  for (size_t i = 0; i < n; i++)
    mkey_free(&m[i]);
  free(m);
  return rc;
}

/* A reservation or a cancel on one key. */
typedef struct one_ctx {
  tg__outcome *o;
  tg__token *tok;
} one_ctx;

static int decide_one(mkey *m, size_t n, const tg__call *orig, void *p,
                      bool *write, size_t *failed) {
  one_ctx *x = p;
  (void)n;
  *failed = 0;
  int rc = step_key(m, orig, true, x->o, x->tok);
  *write = rc == TG_OK && m->action != 0;
  return rc;
}

/* ---- store operations ---- */

static int redis_exec(tg__store *base, const tg__call *c, tg__outcome *o) {
  redis_store *s = (redis_store *)base;
  if (c->op == TG__OP_RESERVE || c->op == TG__OP_CANCEL) {
    mkey m;
    memset(&m, 0, sizeof m);
    m.s = s;
    m.c = *c;
    m.name_len = make_name(s, m.name, c->key, c->key_len);
    one_ctx x = {o, c->tok};
    size_t failed;
    int rc = multi(s, &m, 1, c, decide_one, NULL, &x, &failed);
    mkey_free(&m);
    return rc;
  }
  if (c->op > TG__OP_EXPIRES)
    return TG_ENOTSUP; /* a policy's steps: redis_exec_rules decides them */
  bool probe;
  int rc = gate(s, &probe);
  conn *k = rc == TG_OK ? take(s, probe, &rc) : NULL;
  if (!k)
    return rc;
  redisReply *r = NULL;
  rc = conn_open(s, k);
  bool open_failed = rc != TG_OK;
  if (rc == TG_OK)
    rc = eval(s, k, c, &r);
  give_back(s, k, rc, open_failed, probe);
  if (rc == TG_OK) {
    rc = outcome(c, r, o);
    freeReplyObject(r);
  }
  return rc;
}

/* Sends the calls idx[0..n) pipelined on k and reads their replies into
 * replies[]; the index of a call that did not run (not_run) goes to *retry.
 * On an I/O failure the calls whose replies were not read get its code in
 * rcs[]. */
static int pipeline(const redis_store *s, conn *k, const tg__call *calls,
                    args *a, const size_t *idx, size_t n, redisReply **replies,
                    int *rcs, size_t *retry, size_t *nretry) {
  size_t sent = 0;
  for (; sent < n; sent++) {
    args *x = &a[idx[sent]];
    build_args(s, &calls[idx[sent]], k->module, x);
    if (!k->module) {
      x->v[1] = k->sha;
      x->len[1] = 40;
    }
    if (redisAppendCommandArgv(k->ctx, x->n, x->v, x->len) != REDIS_OK)
      break; /* out of memory: the rest is not sent */
  }
  int err = flush(k->ctx);
  if (err != 0) {
    int rc = ctx_error(k->ctx, err);
    conn_close(k);
    for (size_t i = 0; i < n; i++)
      rcs[idx[i]] = i < sent ? rc : TG_ENOMEM;
    return rc;
  }
  int failed = TG_OK;
  for (size_t i = 0; i < n; i++) {
    if (i >= sent) {
      rcs[idx[i]] = TG_ENOMEM;
      continue;
    }
    if (!k->ctx) {
      continue; /* rcs[] already holds the failure */
    }
    void *r = NULL;
    errno = 0;
    if (get_reply(k->ctx, k->timeout_ms, &r) != REDIS_OK || !r) {
      failed = ctx_error(k->ctx, errno);
      conn_close(k);
      for (size_t j = i; j < sent; j++)
        rcs[idx[j]] = failed;
      continue;
    }
    redisReply *rr = r;
    if (not_run(k, rr)) {
      freeReplyObject(rr);
      retry[(*nretry)++] = idx[i];
      continue;
    }
    replies[idx[i]] = rr;
  }
  return failed;
}

/* Up to BATCH_CHUNK calls in one pipelined round trip on one connection. */
static void batch_chunk(redis_store *s, const tg__call *calls, size_t m,
                        tg__outcome *o, int *rc) {
  args *a = malloc(m * sizeof *a);
  redisReply **replies = calloc(m, sizeof *replies);
  size_t *idx = malloc(m * sizeof *idx);
  size_t *retry = malloc(m * sizeof *retry);
  if (!a || !replies || !idx || !retry) {
    for (size_t i = 0; i < m; i++)
      rc[i] = TG_ENOMEM;
    goto out;
  }
  bool probe;
  int orc = gate(s, &probe);
  conn *k = orc == TG_OK ? take(s, probe, &orc) : NULL;
  if (!k) {
    for (size_t i = 0; i < m; i++)
      rc[i] = orc;
    goto out;
  }
  for (size_t i = 0; i < m; i++) {
    idx[i] = i;
    rc[i] = TG_OK;
  }
  orc = conn_open(s, k);
  bool open_failed = orc != TG_OK;
  int failed = orc; /* the connection's failure, if any: for settle() */
  if (orc != TG_OK) {
    for (size_t i = 0; i < m; i++)
      rc[i] = orc;
  } else {
    size_t nretry = 0;
    failed = pipeline(s, k, calls, a, idx, m, replies, rc, retry, &nretry);
    if (nretry > 0) {
      /* those calls did not run (NOSCRIPT, or the module is gone): fix the
       * connection and send them once more, after the rest (idx[] is free
       * now: it takes what fails again). If the connection failed
       * meanwhile, they get its code. */
      orc = k->ctx ? fix_conn(k) : failed;
      size_t again = 0;
      if (orc == TG_OK) {
        /* its failure (a timeout) marks the pool as the first's would */
        int f2 =
            pipeline(s, k, calls, a, retry, nretry, replies, rc, idx, &again);
        if (f2 != TG_OK)
          failed = f2;
        for (size_t i = 0; i < again; i++)
          rc[idx[i]] = TG_ESTORE;
      } else {
        for (size_t i = 0; i < nretry; i++)
          rc[retry[i]] = orc;
        failed = orc;
      }
    }
  }
  give_back(s, k, failed, open_failed, probe);
  for (size_t i = 0; i < m; i++) {
    if (replies[i]) {
      if (rc[i] == TG_OK)
        rc[i] = outcome(&calls[i], replies[i], &o[i]);
      freeReplyObject(replies[i]);
    } else if (rc[i] == TG_OK) {
      rc[i] = TG_ESTORE; /* no reply and no failure recorded */
    }
  }
out:
  free(a);
  free(replies);
  free(idx);
  free(retry);
}

static void redis_exec_batch(tg__store *base, const tg__call *calls, size_t n,
                             tg__outcome *o, int *rcs) {
  redis_store *s = (redis_store *)base;
  for (size_t off = 0; off < n; off += BATCH_CHUNK) {
    size_t m = n - off;
    if (m > BATCH_CHUNK)
      m = BATCH_CHUNK;
    batch_chunk(s, calls + off, m, o + off, rcs + off);
  }
}

static int redis_reset(tg__store *base, const void *key, size_t key_len) {
  redis_store *s = (redis_store *)base;
  bool probe;
  int rc = gate(s, &probe);
  conn *k = rc == TG_OK ? take(s, probe, &rc) : NULL;
  if (!k)
    return rc;
  char name[NAME_MAX_BYTES];
  size_t name_len = make_name(s, name, key, key_len);
  rc = conn_open(s, k);
  bool open_failed = rc != TG_OK;
  redisReply *r = NULL;
  if (rc == TG_OK) {
    const char *argv[] = {"DEL", name};
    size_t len[] = {3, name_len};
    rc = command(k, 2, argv, len, &r);
  }
  give_back(s, k, rc, open_failed, probe);
  if (rc == TG_OK) {
    if (r->type == REDIS_REPLY_ERROR)
      rc = reply_error(r);
    freeReplyObject(r);
  }
  return rc;
}

static size_t redis_zero(const tg__store *s) {
  (void)s;
  return 0;
}

static void redis_destroy(tg__store *base) {
  redis_store *s = (redis_store *)base;
  for (size_t i = 0; i < s->nconns; i++) {
    conn_close(&s->conns[i]);
    pthread_mutex_destroy(&s->conns[i].mu);
  }
  free(s->host);
  free(s->unix_path);
  free(s->username);
  free(s->password);
  free(s->prefix);
  free(s);
}

/* FNV-1a over a string and a separator, for the ids below. */
static uint64_t mix(uint64_t h, const char *s) {
  for (; s && *s; s++)
    h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
  return (h ^ 0xff) * UINT64_C(0x100000001b3);
}

/* Limiters on one server and database decide policies together; their
 * states are one space per key prefix and algorithm (the key name's). */
static void redis_ident(const tg__store *base, uint64_t group[2],
                        uint64_t space[2]) {
  const redis_store *s = (const redis_store *)base;
  char num[48];
  /* a unix socket is its path: host and port are unused then */
  (void)snprintf(num, sizeof num, "%d/%d", s->unix_path ? 0 : s->port, s->db);
  group[0] =
      mix(mix(mix(UINT64_C(0xcbf29ce484222325), s->unix_path ? NULL : s->host),
              s->unix_path),
          num);
  group[1] = 1;
  space[0] = mix(mix(group[0], s->prefix), SUFFIX[s->alg]);
  space[1] = 2;
}

static const tg__store_ops redis_ops = {
    .caps = TG__STORE_OWN_CLOCK | TG__STORE_RULES_WAIT,
    .exec = redis_exec,
    .reset = redis_reset,
    .key_count = redis_zero, /* keys live in the server */
    .bytes = redis_zero,     /* ... and so does their memory */
    .destroy = redis_destroy,
    .exec_batch = redis_exec_batch,
    .ident = redis_ident,
    .exec_rules = redis_exec_rules,
};

int tg__redis_built(void) { return 1; }

/* ---- shared with the connection engine (redis_cmd.h) ---- */

int tg__redis_codec_new(tg__store **out, const char *prefix, tg_algorithm alg,
                        uint32_t log_entries) {
  size_t n = prefix ? strlen(prefix) : 0;
  if (n < 1 || n > PREFIX_MAX || strpbrk(prefix, "{}"))
    return TG_EINVAL;
  redis_store *s = calloc(1, sizeof *s);
  if (!s)
    return TG_ENOMEM;
  s->base.ops = &redis_ops;
  s->alg = alg;
  s->log_entries = log_entries;
  s->prefix_len = n;
  s->prefix = strdup(prefix);
  if (!s->prefix) {
    free(s);
    return TG_ENOMEM;
  }
  *out = &s->base;
  return TG_OK;
}

void tg__redis_encode(const tg__store *redis, const tg__call *c, bool module,
                      const char *sha, tg__redis_args *a) {
  build_args((const redis_store *)redis, c, module, a);
  if (!module) {
    a->v[1] = sha;
    a->len[1] = 40;
  }
}

size_t tg__redis_key_name(const tg__store *redis, const tg__call *c,
                          char *name) {
  return make_name((const redis_store *)redis, name, c->key, c->key_len);
}

int tg__redis_decode(const tg__call *c, const redisReply *r, tg__outcome *o) {
  return outcome(c, r, o);
}

void tg__redis_stats(const tg__store *s, tg_stats *st) {
  if (s->ops != &redis_ops)
    tg__redis_cluster_stats(s, st);
}

int tg__redis_node_new(tg__store **out, const tg_redis_config *rc,
                       tg_algorithm alg, uint32_t log_entries) {
  int rc2 = tg__redis_store_new(out, rc, alg, log_entries);
  if (rc2 == TG_OK)
    ((redis_store *)*out)->cluster_node = true;
  return rc2;
}

int tg__redis_config_check(const tg_redis_config *rc, bool cluster) {
  const char *bad = NULL;
  size_t n = rc->key_prefix ? strlen(rc->key_prefix) : 0;
  if (n < 1 || n > PREFIX_MAX || strpbrk(rc->key_prefix, "{}"))
    bad = "key_prefix must be 1..128 bytes, without { or }";
  else if (rc->pool_size < 1 || rc->pool_size > POOL_MAX)
    bad = "pool_size outside 1..1024";
  else if (rc->username && !rc->password)
    bad = "a username without a password";
  else if (cluster && rc->db != 0)
    bad = "db must be 0 with cluster_nodes";
  else if (cluster && rc->unix_path)
    bad = "unix_path cannot be used with cluster_nodes";
  else if (rc->db < 0)
    bad = "db below 0";
  else if (!cluster && rc->unix_path && rc->unix_path[0] == '\0')
    bad = "unix_path is empty";
  else if (!cluster && rc->unix_path &&
           strlen(rc->unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
    bad = "unix_path longer than a socket address holds (107 bytes)";
  else if (!cluster && !rc->unix_path && (!rc->host || rc->host[0] == '\0'))
    bad = "host is empty";
  else if (!cluster && !rc->unix_path && (rc->port <= 0 || rc->port > 65535))
    bad = "port outside 1..65535";
  if (!bad)
    return TG_OK;
  tg__error_set("invalid tg_redis_config: %s", bad);
  return TG_EINVAL;
}

int tg__redis_store_new(tg__store **out, const tg_redis_config *rc,
                        tg_algorithm alg, uint32_t log_entries) {
  if (rc->cluster_nodes)
    return tg__redis_cluster_new(out, rc, alg, log_entries);
  int bad = tg__redis_config_check(rc, false);
  if (bad != TG_OK)
    return bad;
  redis_store *s =
      calloc(1, sizeof *s + (size_t)rc->pool_size * sizeof s->conns[0]);
  if (!s)
    return TG_ENOMEM;
  s->base.ops = &redis_ops;
  s->alg = alg;
  s->log_entries = log_entries;
  s->port = rc->port;
  s->db = rc->db;
  s->connect_timeout_ms = rc->connect_timeout_ms;
  s->command_timeout_ms = rc->command_timeout_ms;
  s->backoff_ms = rc->reconnect_backoff_ms;
  s->prefix_len = strlen(rc->key_prefix);
  s->host = dup_or_null(rc->unix_path ? NULL : rc->host);
  s->unix_path = dup_or_null(rc->unix_path);
  s->username = dup_or_null(rc->username);
  s->password = dup_or_null(rc->password);
  s->prefix = dup_or_null(rc->key_prefix);
  bool ok = s->prefix &&
            (rc->unix_path ? s->unix_path != NULL : s->host != NULL) &&
            (!rc->username || s->username) && (!rc->password || s->password);
  for (size_t i = 0; ok && i < rc->pool_size; i++) {
    if (pthread_mutex_init(&s->conns[i].mu, NULL) != 0)
      ok = false;
    else
      s->nconns = i + 1;
  }
  if (!ok) {
    redis_destroy(&s->base);
    return TG_ENOMEM;
  }
  *out = &s->base;
  return TG_OK;
}
