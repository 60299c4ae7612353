/* SPDX-License-Identifier: MIT */
/*
 * commands.h - the commands `tollgate serve` answers, independent of sockets.
 *
 * cmd_execute takes one parsed request and appends its reply to an outbuf.
 * It reads no clock and touches no socket: the server passes the time it
 * read once for the event-loop turn, and tests pass whatever time they like
 * (tests/test_commands.c drives the commands this way, without a network).
 *
 * The limiters: a tollgate limiter has one algorithm, and a TG.* request
 * names its algorithm, so the server holds one limiter per algorithm and
 * routes each request to the one it names. The same key under two
 * algorithms is two independent states.
 *
 * What an operator bounds (all off by default): the period a request may
 * name (max_period_ms), how many new keys one client may create per period
 * (new_keys), who may ask anything at all (a password, as Redis's
 * requirepass), and how long a request may wait for a shared-memory lock
 * another process holds (the nowait limiters below).
 */
#ifndef TG_TOOLS_COMMANDS_H
#define TG_TOOLS_COMMANDS_H

#include "health.h"
#include "reply.h"
#include "resp.h"
#include "tollgate.h"

#include <stdbool.h>

#include <stdint.h>

/* Counters INFO reports. The command layer keeps the first block; the server
 * keeps the second (cmd_execute only reads it). */
typedef struct serve_stats {
  uint64_t commands;         /* requests executed (empty ones excluded) */
  uint64_t error_replies;    /* replies that were errors */
  uint64_t allowed;          /* TG.HIT answers with allowed = 1 */
  uint64_t denied;           /* TG.HIT answers with allowed = 0 */
  uint64_t degraded;         /* TG.HIT answers the failure policy gave */
  uint64_t lock_waits;       /* calls that waited the whole lock timeout for a
                                shared-memory lock (then failed fast) */
  uint64_t period_refused;   /* requests over max_period_ms */
  uint64_t new_keys_refused; /* requests over a client's new-key budget */
  uint64_t auth_failures;    /* wrong passwords (AUTH, HELLO ... AUTH) */
  uint64_t http_refused;     /* connections closed on an HTTP request line
                                (POST, Host:) on the RESP port */

  uint64_t clients;              /* connections open now */
  uint64_t connections_received; /* accepted since start */
  uint64_t connections_rejected; /* refused: max_clients reached */
  uint64_t connections_dropped;  /* closed by the server: protocol errors,
                                    oversized requests, timeouts */
  uint64_t buffer_bytes;         /* bytes of buffers for clients (the shared
                                    ones included), as of the last timeout
                                    sweep: at most a second old */
} serve_stats;

/* Longest password --requirepass accepts, in bytes. */
#define CMD_PASS_MAX 512

/* Longest client identity (the budget's key): a type byte and an IPv6
 * address. */
#define CMD_WHO_MAX 17

/* One connection, as the commands see it. */
typedef struct cmd_session {
  uint64_t id;        /* CLIENT ID / HELLO's id */
  bool authenticated; /* AUTH succeeded, or no password is required */
  /* Who the client is for new_keys: 'u' + the peer's uid (unix socket,
   * SO_PEERCRED), '4' + an IPv4 or '6' + an IPv6 address (TCP; an
   * IPv4-mapped IPv6 address counts as the IPv4 one). All connections from
   * one address share one budget. Empty: unknown (they share one too). */
  unsigned char who[CMD_WHO_MAX];
  size_t who_len;
} cmd_session;

/* Everything the commands need. The caller creates the limiters and owns
 * them; a NULL limiter makes its algorithm's commands answer an error. */
typedef struct cmd_ctx {
  tg_limiter *lim[TG_ALGORITHM_COUNT];
  /* --shm only (else NULL): the same segments attached again with a lock
   * timeout of 0. Once a call on lim[a] has waited the whole lock timeout
   * (a lock held by a stuck process), calls on algorithm a go here until
   * backoff_ms has passed: they try each lock once and answer TG_EBUSY at
   * once, so one stuck process costs the single-threaded server one lock
   * timeout per backoff, not one per request. Then lim[a] is tried again. */
  tg_limiter *lim_nowait[TG_ALGORITHM_COUNT];
  uint64_t busy_until_ms[TG_ALGORITHM_COUNT]; /* monotonic ms */
  uint64_t backoff_ms;
  uint64_t mono_ms; /* monotonic ms of this loop turn (the server sets it) */

  uint64_t max_period_ms; /* 0: the library's bound (TG_PERIOD_MAX_MS) */
  tg_limiter *new_keys;   /* NULL: no budget. Else a token bucket keyed by
                             the client's `who`: a request that would create
                             a key (its state is fresh) costs one token of
                             new_keys_q; without one it is refused */
  tg_quota new_keys_q;
  char pass[CMD_PASS_MAX]; /* the password, zero-padded (see cmd_set_pass) */
  size_t pass_len;
  bool pass_set; /* clients must AUTH first */

  store_health health;
  tg_policy policy;      /* the limiters' on_failure: under TG_POLICY_ERROR a
                            store failure is an error reply, otherwise the
                            policy's answer with degraded = 1 */
  const char *store;     /* for INFO, e.g. "memory" or "shm:/name" */
  bool store_time;       /* decide on the store's clock (the Redis store:
                            the Redis server's TIME), not the loop turn's */
  int tcp_port;          /* for INFO; -1 when not listening on TCP */
  const char *unix_path; /* for INFO; NULL when none */
  uint64_t max_clients;  /* for INFO */
  uint64_t capacity;     /* keys per limiter, for the "table full" log */
  uint64_t start_us;     /* when the server started (realtime), for INFO */
  serve_stats stats;
} cmd_ctx;

/* What the connection does after the reply. */
typedef enum cmd_after {
  CMD_KEEP = 0, /* read the next request */
  CMD_CLOSE = 1 /* send the reply, then close (QUIT) */
} cmd_after;

/* Runs the request argv[0..argc) (argc >= 1) at time now_us (realtime, us
 * since the epoch) for client cl (whose authentication it may change),
 * appending exactly one reply to out. */
cmd_after cmd_execute(cmd_ctx *ctx, cmd_session *cl, const resp_arg *argv,
                      size_t argc, uint64_t now_us, outbuf *out);

/* Requires clients to AUTH with password p (1..CMD_PASS_MAX bytes) before
 * anything but AUTH, HELLO and QUIT. Returns 0, or -1 if p is empty or too
 * long. */
int cmd_set_pass(cmd_ctx *ctx, const char *p, size_t len);

/* Most requests cmd_execute_batch takes at once. */
#define CMD_BATCH_MAX 64

/* Runs the requests reqs[0..n) (n <= CMD_BATCH_MAX; empty ones answer
 * nothing) of client cl as cmd_execute would one by one, appending their
 * replies in order. When the limiters decide on the store's clock
 * (store_time: the Redis store), consecutive TG.HIT requests go to their
 * limiter as one tg_hit_batch, one pipelined round trip instead of one each
 * (not while a new-key budget is set, whose check is a call of its own, nor
 * for a client yet to authenticate). Stops after a request that closes the
 * connection (QUIT) and returns CMD_CLOSE. */
cmd_after cmd_execute_batch(cmd_ctx *ctx, cmd_session *cl,
                            const resp_request *reqs, size_t n, uint64_t now_us,
                            outbuf *out);

/* Answers one HTTP request head req[0..len) (NUL-terminated; whole: its
 * blank line arrived) of the metrics endpoint: GET or HEAD /metrics gets
 * every limiter's counters (tg_limiter_stats) and the server's in the
 * Prometheus text format (version 0.0.4); anything else 400, 404 or 405.
 * Appends the whole response (Connection: close) to out. */
void cmd_metrics(const cmd_ctx *ctx, const char *req, size_t len, bool whole,
                 outbuf *out);

/* Parses an algorithm name as tg_algorithm_name spells it, in any case.
 * Returns 0 and sets *alg, or -1. */
int cmd_parse_algorithm(const char *p, size_t len, tg_algorithm *alg);

#endif
