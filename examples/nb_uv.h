/* SPDX-License-Identifier: MIT */
/*
 * nb_uv.h - tollgate's non-blocking Redis API on a libuv loop: decisions
 * with a callback, many in flight at once from the loop's thread, on one
 * Redis server or a Redis Cluster. An example to copy (it is not part of
 * the library), and what tests/test_nb_uv.c runs.
 *
 *   tg_uv *u;
 *   tg_uv_new(&u, uv_default_loop(), &cfg, 1000, 100);
 *   req->nb = (tg_nb_req){.key = "user:42", .key_len = 7, .q = &q, .cost = 1};
 *   tg_uv_hit(u, req, on_decided);   // on_decided(req) runs later, on the loop
 *   ...
 *   tg_uv_close(u, on_closed);       // every pending request is answered
 *
 * The adapter owns one socket per link, watched with uv_poll_t, and writes
 * with send(2) itself: tg_nb must be told exactly which bytes reached the
 * kernel (a call written in full may have run and is never resent), which
 * uv_write, whose partial progress is lost when a connection closes, cannot
 * say. Names are resolved with uv_getaddrinfo. Its policy for what the API
 * leaves to the caller:
 *   - a link with replies due that hears nothing for timeout_ms is closed
 *     and its node marked down (TG_ETIMEDOUT); a connection that cannot be
 *     made marks it down (TG_ECONNECT, or TG_ETIMEDOUT after timeout_ms);
 *     a down node's calls are answered at once with that code (the failure
 *     policy's answer), and after backoff_ms it is tried again;
 *   - a connection the server closes is opened again at once for the calls
 *     it had not sent.
 */
#ifndef TG_EXAMPLE_NB_UV_H
#define TG_EXAMPLE_NB_UV_H

#include <tollgate.h>
#include <uv.h>

typedef struct tg_uv tg_uv;
typedef struct tg_uv_req tg_uv_req;

/* Called on the loop's thread once req is decided: req->nb.status and
 * req->nb.result hold what tg_hit would have returned and written. */
typedef void (*tg_uv_cb)(tg_uv_req *req);

struct tg_uv_req {
  tg_nb_req nb; /* key, key_len, q, cost: set before tg_uv_hit */
  tg_uv_cb cb;  /* set by tg_uv_hit */
  void *data;   /* the caller's */
};

/* A client of cfg's Redis store (cfg->redis must be set) on loop. Timeouts
 * in ms, 0 for none (timeout) or an immediate retry (backoff). */
int tg_uv_new(tg_uv **out, uv_loop_t *loop, const tg_config *cfg,
              uint32_t timeout_ms, uint32_t backoff_ms);

/* Decides req->nb (its key must stay valid until cb). Returns 0, or the
 * code of invalid input (then req->nb holds tg_hit's answer to it and cb is
 * never called). */
int tg_uv_hit(tg_uv *u, tg_uv_req *req, tg_uv_cb cb);

/* Requests not answered yet. */
size_t tg_uv_pending(const tg_uv *u);

/* Closes every connection, answers every pending request (those already
 * sent with TG_ECONNECT, the others too: nothing is sent any more), and
 * once libuv has closed every handle, frees u and calls done (may be
 * NULL). The loop must run for that. */
void tg_uv_close(tg_uv *u, void (*done)(void *arg), void *arg);

#endif /* TG_EXAMPLE_NB_UV_H */
