/* SPDX-License-Identifier: MIT */
/*
 * nb_poll.h - a poll(2) loop around the non-blocking API (tg_nb_*), written
 * against the public header alone, as a caller's event loop would be: the
 * tests and the benchmark drive tg_nb through it. It owns one socket per
 * link, connects when a link asks (blocking: a test's servers are local),
 * writes what tg_nb_output gives, feeds what it reads to tg_nb_input, in
 * pieces of random size when asked (replies then arrive in every possible
 * split), and applies its own timeout: a link with replies due that hears
 * nothing for timeout_ms is closed with TG_ETIMEDOUT. Its one timer is the
 * library's: it polls no longer than tg_nb_timeout says, and calls
 * tg_nb_tick when that is due (a policy waiting out a slot's migration).
 *
 * Header-only (static functions) so each test executable includes it once.
 */
#ifndef TG_TEST_NB_POLL_H
#define TG_TEST_NB_POLL_H

#include "tollgate.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define NBP_LINKS 64

typedef struct nbp {
  tg_nb *nb;
  int fd[NBP_LINKS];
  uint64_t heard_ms[NBP_LINKS]; /* last bytes read or written, or the
                                   connection made */
  int timeout_ms;               /* 0: none */
  size_t split;                 /* >0: feed input in pieces of 1..split */
  uint64_t rng;                 /* for the pieces */
  bool down_on_timeout;         /* tg_nb_down rather than tg_nb_closed */
  long connects, timeouts;      /* what happened, for the tests */
} nbp;

static uint64_t nbp_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void nbp_init(nbp *d, tg_nb *nb) {
  memset(d, 0, sizeof *d);
  d->nb = nb;
  d->rng = 88172645463325252ull;
  for (int i = 0; i < NBP_LINKS; i++)
    d->fd[i] = -1;
}

static void nbp_close_all(nbp *d) {
  for (int i = 0; i < NBP_LINKS; i++) {
    if (d->fd[i] >= 0)
      close(d->fd[i]);
    d->fd[i] = -1;
  }
}

/* A connected non-blocking socket to host:port (port 0: a unix socket). */
static int nbp_dial(const char *host, int port) {
  int fd = -1;
  if (port == 0) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", host);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
      close(fd);
      fd = -1;
    }
  } else {
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, ps, &hints, &res) != 0)
      return -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  if (fd >= 0)
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void nbp_drop(nbp *d, unsigned l) {
  if (d->fd[l] >= 0)
    close(d->fd[l]);
  d->fd[l] = -1;
}

/* Writes what link l has to send; false when the socket failed. */
static bool nbp_write(nbp *d, unsigned l) {
  for (;;) {
    const void *p;
    size_t n;
    tg_nb_output(d->nb, l, &p, &n);
    if (n == 0)
      return true;
    ssize_t w = send(d->fd[l], p, n, MSG_NOSIGNAL);
    if (w < 0)
      return errno == EAGAIN || errno == EINTR;
    /* the timeout counts from the last bytes written or read: TG_NB_READ
     * is set as soon as bytes are queued, before they are written, so
     * "when it became set" would start the clock too early (a new or idle
     * link then timed out at once on a busy machine) */
    if (w > 0)
      d->heard_ms[l] = nbp_ms();
    tg_nb_written(d->nb, l, (size_t)w);
    if (!(tg_nb_wants(d->nb, l) & TG_NB_READ))
      continue;
    if ((size_t)w < n)
      return true;
  }
}

static uint64_t nbp_rand(nbp *d) {
  d->rng ^= d->rng << 13;
  d->rng ^= d->rng >> 7;
  d->rng ^= d->rng << 17;
  return d->rng;
}

/* Reads what link l sent and feeds it (in pieces when d->split). */
static void nbp_read(nbp *d, unsigned l) {
  char buf[65536];
  ssize_t n = recv(d->fd[l], buf, sizeof buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (n <= 0) {
    nbp_drop(d, l);
    tg_nb_closed(d->nb, l, TG_ECONNECT);
    return;
  }
  d->heard_ms[l] = nbp_ms();
  size_t off = 0;
  while (off < (size_t)n) {
    size_t k = (size_t)n - off;
    if (d->split) {
      size_t piece = 1 + (size_t)(nbp_rand(d) % d->split);
      if (piece < k)
        k = piece;
    }
    if (tg_nb_input(d->nb, l, buf + off, k) != TG_OK) {
      nbp_drop(d, l); /* the link is down already: the test says up */
      return;
    }
    off += k;
  }
}

/* One turn of the loop: the library's timer if due, connect, write, wait
 * up to wait_ms (less when the timer is due sooner), read. */
static void nbp_turn(nbp *d, int wait_ms) {
  long due = tg_nb_timeout(d->nb);
  if (due == 0) {
    tg_nb_tick(d->nb);
    due = tg_nb_timeout(d->nb);
  }
  if (due >= 0 && due < wait_ms)
    wait_ms = (int)due;
  struct pollfd pfd[NBP_LINKS];
  unsigned who[NBP_LINKS];
  nfds_t np = 0;
  unsigned links = tg_nb_links(d->nb);
  for (unsigned l = 0; l < links && l < NBP_LINKS; l++) {
    unsigned w = tg_nb_wants(d->nb, l);
    if (w & TG_NB_CONNECT) {
      const char *host;
      int port;
      tg_nb_address(d->nb, l, &host, &port);
      d->fd[l] = nbp_dial(host, port);
      d->connects++;
      if (d->fd[l] < 0) {
        tg_nb_down(d->nb, l, TG_ECONNECT);
        continue;
      }
      tg_nb_connected(d->nb, l);
      d->heard_ms[l] = nbp_ms();
      w = tg_nb_wants(d->nb, l);
    }
    if (d->fd[l] < 0)
      continue;
    if ((w & TG_NB_WRITE) && !nbp_write(d, l)) {
      nbp_drop(d, l);
      tg_nb_closed(d->nb, l, TG_ECONNECT);
      continue;
    }
    w = tg_nb_wants(d->nb, l);
    pfd[np].fd = d->fd[l];
    pfd[np].events = (short)(POLLIN | (w & TG_NB_WRITE ? POLLOUT : 0));
    pfd[np].revents = 0;
    who[np++] = l;
  }
  if (np == 0) {
    if (due > 0) { /* nothing to poll, but a timer: wait for it */
      struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    return;
  }
  poll(pfd, np, wait_ms);
  uint64_t now = nbp_ms();
  for (nfds_t j = 0; j < np; j++) {
    unsigned l = who[j];
    if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR))
      nbp_read(d, l);
    if (d->fd[l] >= 0 && (pfd[j].revents & POLLOUT) && !nbp_write(d, l)) {
      nbp_drop(d, l);
      tg_nb_closed(d->nb, l, TG_ECONNECT);
    }
    if (d->fd[l] >= 0 && d->timeout_ms &&
        (tg_nb_wants(d->nb, l) & TG_NB_READ) &&
        now >= d->heard_ms[l] + (uint64_t)d->timeout_ms) {
      nbp_drop(d, l);
      d->timeouts++;
      if (d->down_on_timeout)
        tg_nb_down(d->nb, l, TG_ETIMEDOUT);
      else
        tg_nb_closed(d->nb, l, TG_ETIMEDOUT);
    }
  }
}

/* Turns until `want` requests are done (each handed to done(req, ctx)) or
 * limit_ms pass; returns how many were done. */
static size_t nbp_run(nbp *d, size_t want, int limit_ms,
                      void (*done)(tg_nb_req *, void *), void *ctx) {
  size_t got = 0;
  uint64_t end = nbp_ms() + (uint64_t)limit_ms;
  for (;;) {
    tg_nb_req *r;
    while ((r = tg_nb_done(d->nb)) != NULL) {
      if (done)
        done(r, ctx);
      got++;
    }
    if (got >= want || nbp_ms() >= end)
      return got;
    nbp_turn(d, 10);
  }
}

#endif /* TG_TEST_NB_POLL_H */
