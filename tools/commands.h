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
 */
#ifndef TG_TOOLS_COMMANDS_H
#define TG_TOOLS_COMMANDS_H

#include "reply.h"
#include "resp.h"
#include "tollgate.h"

#include <stdbool.h>

#include <stdint.h>

/* Counters INFO reports. The command layer keeps the first block; the server
 * keeps the second (cmd_execute only reads it). */
typedef struct serve_stats {
  uint64_t commands;      /* requests executed (empty ones excluded) */
  uint64_t error_replies; /* replies that were errors */
  uint64_t allowed;       /* TG.HIT answers with allowed = 1 */
  uint64_t denied;        /* TG.HIT answers with allowed = 0 */
  uint64_t degraded;      /* TG.HIT answers the failure policy gave */

  uint64_t clients;              /* connections open now */
  uint64_t connections_received; /* accepted since start */
  uint64_t connections_rejected; /* refused: max_clients reached */
  uint64_t connections_dropped;  /* closed by the server: protocol errors,
                                    oversized requests, timeouts */
  uint64_t buffer_bytes;         /* bytes of buffers for clients (the shared
                                    ones included), as of the last timeout
                                    sweep: at most a second old */
} serve_stats;

/* Everything the commands need. The caller creates the limiters and owns
 * them; a NULL limiter makes its algorithm's commands answer an error. */
typedef struct cmd_ctx {
  tg_limiter *lim[TG_ALGORITHM_COUNT];
  tg_policy policy;      /* the limiters' on_failure: under TG_POLICY_ERROR a
                            store failure is an error reply, otherwise the
                            policy's answer with degraded = 1 */
  const char *store;     /* for INFO, e.g. "memory" or "shm:/name" */
  bool store_time;       /* decide on the store's clock (the Redis store:
                            the Redis server's TIME), not the loop turn's */
  int tcp_port;          /* for INFO; -1 when not listening on TCP */
  const char *unix_path; /* for INFO; NULL when none */
  uint64_t max_clients;  /* for INFO */
  uint64_t start_us;     /* when the server started (realtime), for INFO */
  serve_stats stats;
} cmd_ctx;

/* What the connection does after the reply. */
typedef enum cmd_after {
  CMD_KEEP = 0, /* read the next request */
  CMD_CLOSE = 1 /* send the reply, then close (QUIT) */
} cmd_after;

/* Runs the request argv[0..argc) (argc >= 1) at time now_us (realtime, us
 * since the epoch) for the client numbered client_id, appending exactly one
 * reply to out. */
cmd_after cmd_execute(cmd_ctx *ctx, const resp_arg *argv, size_t argc,
                      uint64_t now_us, uint64_t client_id, outbuf *out);

/* Most requests cmd_execute_batch takes at once. */
#define CMD_BATCH_MAX 64

/* Runs the requests reqs[0..n) (n <= CMD_BATCH_MAX; empty ones answer
 * nothing) as cmd_execute would one by one, appending their replies in
 * order. When the limiters decide on the store's clock (store_time: the
 * Redis store), consecutive TG.HIT requests go to their limiter as one
 * tg_hit_batch, one pipelined round trip instead of one each. Stops after a
 * request that closes the connection (QUIT) and returns CMD_CLOSE. */
cmd_after cmd_execute_batch(cmd_ctx *ctx, const resp_request *reqs, size_t n,
                            uint64_t now_us, uint64_t client_id, outbuf *out);

/* Parses an algorithm name as tg_algorithm_name spells it, in any case.
 * Returns 0 and sets *alg, or -1. */
int cmd_parse_algorithm(const char *p, size_t len, tg_algorithm *alg);

#endif
