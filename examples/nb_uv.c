/* SPDX-License-Identifier: MIT */
/*
 * nb_uv.c - tollgate's non-blocking API on a libuv loop (see nb_uv.h).
 *
 * Everything the adapter does after an event is in sync(): hand answered
 * requests to their callbacks, then for each link do what tg_nb_wants asks
 * (connect, write, watch for replies and time them out). Entry points from
 * the caller (tg_uv_hit) only schedule a sync on the loop, so a callback
 * never runs inside tg_uv_hit.
 *
 * tg_uv submits single keys only, which never wait on the library's timer
 * (tg_nb_timeout: a policy whose Cluster slot is split). An adapter that
 * submits policies adds one uv_timer_t, started for tg_nb_timeout() ms
 * after each sync when that is not -1, whose callback calls tg_nb_tick and
 * syncs.
 */
#include "nb_uv.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LINKS_MAX 1024u /* tollgate's most nodes per client */

typedef struct ulink ulink;

/* One socket: freed once libuv has closed its poll handle. */
typedef struct conn {
  uv_poll_t poll;
  tg_uv *u;
  ulink *link; /* NULL once the link dropped it */
  int fd;
  bool connecting;
  int events; /* what poll watches */
} conn;

struct ulink {
  tg_uv *u;
  unsigned id;
  conn *c;               /* the current socket, or NULL */
  uv_getaddrinfo_t *gai; /* a name being resolved, or NULL */
  uv_timer_t timer;      /* a timeout, or the backoff while down */
  bool down;             /* the timer runs the backoff */
};

struct tg_uv {
  uv_loop_t *loop;
  tg_nb *nb;
  uint32_t timeout_ms, backoff_ms;
  ulink *links[LINKS_MAX];
  uv_timer_t kick; /* a sync on the next turn of the loop */
  size_t pending;
  bool syncing, again;
  bool closing;
  unsigned handles; /* open libuv handles: u goes once they are closed */
  void (*done)(void *arg);
  void *done_arg;
};

static void sync_links(tg_uv *u);
static void on_timer(uv_timer_t *t);

static tg_uv_req *req_of(tg_nb_req *r) {
  return (tg_uv_req *)(void *)((char *)r - offsetof(tg_uv_req, nb));
}

/* ---- handles' end ---- */

static void maybe_finish(tg_uv *u) {
  if (!u->closing || u->handles > 0)
    return;
  void (*done)(void *) = u->done;
  void *arg = u->done_arg;
  for (unsigned i = 0; i < LINKS_MAX; i++)
    free(u->links[i]);
  tg_nb_destroy(u->nb);
  free(u);
  if (done)
    done(arg);
}

static void on_timer_closed(uv_handle_t *h) {
  ulink *L = h->data;
  L->u->handles--;
  maybe_finish(L->u);
}

static void on_kick_closed(uv_handle_t *h) {
  tg_uv *u = h->data;
  u->handles--;
  maybe_finish(u);
}

static void on_conn_closed(uv_handle_t *h) {
  conn *c = (conn *)(void *)h;
  tg_uv *u = c->u;
  close(c->fd); /* only now: libuv polled it until the close */
  free(c);
  u->handles--;
  maybe_finish(u);
}

/* The link lets go of its socket (without telling tg_nb anything). */
static void drop(ulink *L) {
  if (L->c) {
    L->c->link = NULL;
    uv_close((uv_handle_t *)&L->c->poll, on_conn_closed);
    L->c = NULL;
  }
  if (L->gai) {
    uv_cancel((uv_req_t *)L->gai); /* its callback frees it */
    L->gai->data = NULL;
    L->gai = NULL;
  }
  uv_timer_stop(&L->timer);
}

/* The node cannot be reached now: tg_nb answers its calls with code until
 * the backoff has passed. */
static void link_down(ulink *L, int code) {
  drop(L);
  tg_nb_down(L->u->nb, L->id, code);
  L->down = true;
  if (!L->u->closing)
    uv_timer_start(&L->timer, on_timer, L->u->backoff_ms, 0);
}

/* The connection is gone (EOF, an error): what was not sent goes on the
 * next one. */
static void link_closed(ulink *L, int code) {
  drop(L);
  tg_nb_closed(L->u->nb, L->id, code);
}

/* ---- I/O ---- */

static void watch(ulink *L, int events);

/* Writes what the link has to send; false when the socket failed. */
static bool flush(ulink *L) {
  tg_nb *nb = L->u->nb;
  for (;;) {
    const void *p;
    size_t n;
    tg_nb_output(nb, L->id, &p, &n);
    if (n == 0)
      return true;
    ssize_t w = send(L->c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    tg_nb_written(nb, L->id, (size_t)w); /* exactly what the kernel took */
    if ((size_t)w < n)
      return true;
  }
}

static void restart_timeout(ulink *L) {
  if (L->u->timeout_ms)
    uv_timer_start(&L->timer, on_timer, L->u->timeout_ms, 0);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  conn *c = (conn *)(void *)h;
  ulink *L = c->link;
  if (!L)
    return;
  tg_uv *u = L->u;
  if (status < 0) {
    if (c->connecting)
      link_down(L, TG_ECONNECT);
    else
      link_closed(L, TG_ECONNECT);
    sync_links(u);
    return;
  }
  if (c->connecting) {
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
      err = errno;
    if (err != 0) {
      link_down(L, TG_ECONNECT);
    } else {
      c->connecting = false;
      uv_timer_stop(&L->timer);
      tg_nb_connected(u->nb, L->id);
    }
    sync_links(u);
    return;
  }
  if (events & UV_READABLE) {
    char buf[65536];
    for (;;) {
      ssize_t n = recv(c->fd, buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        link_closed(L, TG_ECONNECT);
        sync_links(u);
        return;
      }
      if (tg_nb_input(u->nb, L->id, buf, (size_t)n) != TG_OK) {
        /* not a reply, or the handshake refused: tg_nb has marked the
         * node down; the backoff decides when to try again */
        drop(L);
        L->down = true;
        uv_timer_start(&L->timer, on_timer, u->backoff_ms, 0);
        sync_links(u);
        return;
      }
      restart_timeout(L);
      if ((size_t)n < sizeof buf)
        break;
    }
  }
  if ((events & UV_WRITABLE) && !flush(L))
    link_closed(L, TG_ECONNECT);
  sync_links(u);
}

static void watch(ulink *L, int events) {
  if (L->c->events != events) {
    L->c->events = events;
    uv_poll_start(&L->c->poll, events, on_poll);
  }
}

/* A non-blocking connect to a resolved address, watched until done. */
static void dial(ulink *L, int family, const struct sockaddr *sa,
                 socklen_t len) {
  int fd = socket(family, SOCK_STREAM, 0);
  if (fd < 0) {
    link_down(L, TG_ECONNECT);
    return;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (family != AF_UNIX) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (connect(fd, sa, len) != 0 && errno != EINPROGRESS && errno != EAGAIN) {
    close(fd);
    link_down(L, TG_ECONNECT);
    return;
  }
  conn *c = calloc(1, sizeof *c);
  if (!c || uv_poll_init(L->u->loop, &c->poll, fd) != 0) {
    free(c);
    close(fd);
    link_down(L, TG_ECONNECT);
    return;
  }
  L->u->handles++;
  c->u = L->u;
  c->fd = fd;
  c->link = L;
  c->connecting = true;
  L->c = c;
  watch(L, UV_WRITABLE);
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res) {
  ulink *L = g->data;
  free(g);
  if (!L) { /* dropped meanwhile */
    uv_freeaddrinfo(res);
    return;
  }
  L->gai = NULL;
  if (status < 0 || !res)
    link_down(L, TG_ECONNECT);
  else
    dial(L, res->ai_family, res->ai_addr, res->ai_addrlen);
  uv_freeaddrinfo(res);
  sync_links(L->u);
}

static void connect_link(ulink *L) {
  const char *host;
  int port;
  tg_nb_address(L->u->nb, L->id, &host, &port);
  restart_timeout(L); /* the connect's timeout */
  if (port == 0) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", host);
    dial(L, AF_UNIX, (struct sockaddr *)&sa, sizeof sa);
    return;
  }
  char ps[8];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  L->gai = malloc(sizeof *L->gai);
  if (!L->gai) {
    link_down(L, TG_ECONNECT);
    return;
  }
  L->gai->data = L;
  if (uv_getaddrinfo(L->u->loop, L->gai, on_resolved, host, ps, &hints) != 0) {
    free(L->gai);
    L->gai = NULL;
    link_down(L, TG_ECONNECT);
  }
}

/* The link's timer: the backoff ended, or a timeout. */
static void on_timer(uv_timer_t *t) {
  ulink *L = t->data;
  tg_uv *u = L->u;
  if (L->down) {
    L->down = false;
    tg_nb_up(u->nb, L->id);
  } else if (L->gai || (L->c && L->c->connecting)) {
    link_down(L, TG_ETIMEDOUT); /* could not connect in time */
  } else if (L->c && (tg_nb_wants(u->nb, L->id) & TG_NB_READ)) {
    link_down(L, TG_ETIMEDOUT); /* replies due, none came */
  }
  sync_links(u);
}

static ulink *link_get(tg_uv *u, unsigned id) {
  if (id >= LINKS_MAX)
    return NULL;
  if (!u->links[id]) {
    ulink *L = calloc(1, sizeof *L);
    if (!L)
      return NULL;
    L->u = u;
    L->id = id;
    uv_timer_init(u->loop, &L->timer);
    L->timer.data = L;
    u->handles++;
    u->links[id] = L;
  }
  return u->links[id];
}

/* ---- what to do now ---- */

static void step(ulink *L) {
  tg_nb *nb = L->u->nb;
  if (L->down || L->gai)
    return;
  unsigned w = tg_nb_wants(nb, L->id);
  if (!L->c) {
    if (w & TG_NB_CONNECT)
      connect_link(L);
    return;
  }
  if (L->c->connecting)
    return;
  if ((w & TG_NB_WRITE) && !flush(L)) {
    link_closed(L, TG_ECONNECT);
    L->u->again = true;
    return;
  }
  w = tg_nb_wants(nb, L->id);
  watch(L, UV_READABLE | (w & TG_NB_WRITE ? UV_WRITABLE : 0));
  if (!(w & TG_NB_READ))
    uv_timer_stop(&L->timer);
  else if (!uv_is_active((uv_handle_t *)&L->timer))
    restart_timeout(L);
}

static void sync_links(tg_uv *u) {
  if (u->syncing) {
    u->again = true;
    return;
  }
  u->syncing = true;
  do {
    u->again = false;
    tg_nb_req *r;
    while ((r = tg_nb_done(u->nb)) != NULL) {
      tg_uv_req *req = req_of(r);
      u->pending--;
      req->cb(req); /* may submit: then again */
    }
    unsigned n = tg_nb_links(u->nb);
    for (unsigned i = 0; i < n; i++) {
      ulink *L = link_get(u, i);
      if (L)
        step(L);
    }
  } while (u->again);
  u->syncing = false;
}

static void on_kick(uv_timer_t *t) { sync_links(t->data); }

/* ---- the caller's side ---- */

int tg_uv_new(tg_uv **out, uv_loop_t *loop, const tg_config *cfg,
              uint32_t timeout_ms, uint32_t backoff_ms) {
  *out = NULL;
  tg_uv *u = calloc(1, sizeof *u);
  if (!u)
    return TG_ENOMEM;
  int rc = tg_nb_new(&u->nb, cfg);
  if (rc != TG_OK) {
    free(u);
    return rc;
  }
  u->loop = loop;
  u->timeout_ms = timeout_ms;
  u->backoff_ms = backoff_ms;
  uv_timer_init(loop, &u->kick);
  u->kick.data = u;
  u->handles = 1;
  *out = u;
  return TG_OK;
}

int tg_uv_hit(tg_uv *u, tg_uv_req *req, tg_uv_cb cb) {
  req->cb = cb;
  int rc = tg_nb_submit(u->nb, &req->nb);
  if (rc != TG_OK)
    return rc;
  u->pending++;
  if (u->closing)
    u->again = true; /* from a callback during tg_uv_close: answered there */
  else if (!uv_is_active((uv_handle_t *)&u->kick))
    uv_timer_start(&u->kick, on_kick, 0, 0);
  return TG_OK;
}

size_t tg_uv_pending(const tg_uv *u) { return u->pending; }

void tg_uv_close(tg_uv *u, void (*done)(void *arg), void *arg) {
  u->closing = true;
  u->done = done;
  u->done_arg = arg;
  /* every link down: calls sent are answered TG_ECONNECT, the others too,
   * and so is anything a callback submits now */
  unsigned n = tg_nb_links(u->nb);
  for (unsigned i = 0; i < n; i++) {
    ulink *L = link_get(u, i);
    if (L)
      link_down(L, TG_ECONNECT);
  }
  sync_links(u);
  for (unsigned i = 0; i < LINKS_MAX; i++)
    if (u->links[i])
      uv_close((uv_handle_t *)&u->links[i]->timer, on_timer_closed);
  uv_close((uv_handle_t *)&u->kick, on_kick_closed);
}
