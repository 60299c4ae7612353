/* SPDX-License-Identifier: MIT */
/*
 * server.h - the event loop of `tollgate serve`: sockets, connections,
 * buffers, timeouts and shutdown. What a request means is commands.c's
 * business; how its bytes are framed is resp.c's.
 */
#ifndef TG_TOOLS_SERVER_H
#define TG_TOOLS_SERVER_H

#include "commands.h"

#include <stdint.h>

/* Replies a connection may have waiting to be sent before the server stops
 * reading its requests (backpressure for a client that pipelines without
 * reading), in bytes. */
#define SERVER_OUT_HIGH (64u * 1024u)

typedef struct server_config {
  const char *bind_addr;       /* IPv4 or IPv6 address, or a host name whose
                                  addresses are all listened on, for TCP */
  int port;                    /* TCP port; 0: any free port (the ready line
                                  says which); -1: no TCP listener */
  const char *unix_path;       /* unix socket path, or NULL for none */
  unsigned unix_mode;          /* its permissions (0600: this user only) */
  uint64_t max_clients;        /* connections served at once; more are refused
                                  with "-ERR max number of clients reached" */
  uint64_t idle_timeout_ms;    /* close a connection that sent and received
                                  nothing for this long; 0: never */
  uint64_t request_timeout_ms; /* close a connection whose request has been
                                  incomplete for this long (slow loris);
                                  0: never */
  uint64_t shutdown_grace_ms;  /* on SIGTERM/SIGINT, how long to go on
                                  sending replies already computed */
  int metrics_port;            /* Prometheus text on plain HTTP, GET
                                  /metrics, on bind_addr's first address at
                                  this port (0: any free port); -1: none */
} server_config;

/* Listens as configured, prints "tollgate serve: ready" (after one
 * "listening on" line per listener) to stdout, and serves until SIGTERM or
 * SIGINT. Fills ctx->tcp_port with the port really bound. Returns 0 after a
 * graceful shutdown, or 1 if it could not start (reported on stderr): among
 * other reasons, when a server already answers on the unix socket. Logs the
 * store's health (ctx->health) on stderr as it changes; warns when a TCP
 * address is reachable from other hosts. */
int server_run(const server_config *cfg, cmd_ctx *ctx);

#endif
