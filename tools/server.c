/* SPDX-License-Identifier: MIT */
/*
 * server.c - the event loop of `tollgate serve` (see server.h).
 *
 * One thread, one epoll set, level-triggered, every socket non-blocking.
 * Each turn of the loop reads the clocks once (realtime for the limiters,
 * monotonic for timeouts), then for each ready connection reads what has
 * arrived, runs every whole request in it (pipelining) and sends all their
 * replies with one write.
 *
 * Memory is bounded per connection and idle connections hold none: bytes
 * are read into one shared buffer and replies written into one shared
 * buffer; a connection gets buffers of its own only for what is left over
 * (the first part of a request still arriving, replies the socket would not
 * take yet), and gives them back once they are empty. A request is at most
 * RESP_MAX_REQUEST bytes; once SERVER_OUT_HIGH bytes of replies are waiting
 * the server stops reading that connection until the client reads them.
 *
 * Misbehaviour costs only the misbehaving connection: a malformed request
 * (unknown command, bad argument) gets an error reply; garbage framing or an
 * oversized request gets a protocol error and the connection is closed; a
 * request that stays incomplete for request_timeout_ms (slow loris) and a
 * connection idle for idle_timeout_ms are closed by a sweep that runs a few
 * times a second. No client can make the loop wait: no socket blocks, and
 * the one wait left, for the store, is bounded and skipped once the store is
 * known to be stuck (see serve.c).
 *
 * Each connection carries what the commands need to know about it (its id,
 * whether it has authenticated, who it is for the per-client budget: the
 * peer address, or for the unix socket the peer's uid). The unix socket is
 * never taken from a live server, and removed on exit only while it is
 * still this server's own (by device and inode).
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define ACCEPTS_PER_TURN 256
#define IN_MIN_CAP 4096u
#define SWEEP_MAX_MS 1000u
#define MAX_TCP 8 /* addresses one --bind name may give */

enum { ITEM_LISTENER, ITEM_CONN, ITEM_SIGNAL };

/* What an epoll event points to: the first member of every watched thing. */
typedef struct item {
  int kind; /* ITEM_* */
  int fd;
} item;

typedef struct conn {
  item it;
  cmd_session cl;            /* id, authentication, identity */
  char *in;                  /* unparsed bytes, NULL when there are none */
  size_t in_len, in_cap;     /* bytes held / allocated */
  outbuf out;                /* replies not yet sent, from out_sent on */
  size_t out_sent;           /* bytes of out already sent */
  uint64_t last_active_ms;   /* monotonic: last byte read or written */
  uint64_t partial_since_ms; /* monotonic: when the incomplete request at
                                the front of `in` began; 0: none */
  bool closing;              /* read no more; close once out is sent */
  bool held;                 /* whole requests wait in `in`: replies hit
                                SERVER_OUT_HIGH before they could run */
  bool http;                 /* a metrics client: one HTTP request, one
                                response, then close */
  uint32_t events;           /* epoll interest registered now */
  struct conn *prev, *next;  /* every open connection */
} conn;

typedef struct server {
  const server_config *cfg;
  cmd_ctx *ctx;
  int ep;
  item tcp[MAX_TCP], unix_sock, sig, metrics;
  int ntcp;
  char tcp_addr[MAX_TCP][INET6_ADDRSTRLEN]; /* numeric, for the log */
  bool unix_ours; /* unix_path is the socket this server bound, whose */
  dev_t unix_dev; /* device and inode say so: only then is it removed */
  ino_t unix_ino;
  int sig_write_fd;
  int spare_fd; /* kept open to refuse a connection when out of fds */
  conn *conns;
  char *scratch; /* RESP_MAX_REQUEST bytes: where reads land first */
  outbuf sout;   /* where replies are written first */
  resp_request req[CMD_BATCH_MAX]; /* the whole requests of one batch */
  uint64_t now_us, now_ms; /* realtime us, monotonic ms: read once a turn */
  uint64_t next_id;
  bool shutting_down;
  uint64_t shutdown_deadline_ms;
} server;

/* ---- signals ---- */

/* Lock-free atomics, which a handler may use: a signal may land on any
 * thread (a limiter's cleaning thread too), so two handlers can run at
 * once, and teardown changes signal_fd while one may be running. */
static int signal_fd = -1;
static int last_signal;

static void on_signal(int sig) {
  int saved = errno;
  __atomic_store_n(&last_signal, sig, __ATOMIC_RELAXED);
  int fd = __atomic_load_n(&signal_fd, __ATOMIC_ACQUIRE);
  if (fd >= 0) {
    char b = 1;
    ssize_t r = write(fd, &b, 1);
    (void)r; /* a full pipe already says "wake up" */
  }
  errno = saved;
}

/* ---- small helpers ---- */

static const char *policy_name(tg_policy p) {
  return p == TG_POLICY_FAIL_CLOSED ? "closed"
         : p == TG_POLICY_ERROR     ? "error"
                                    : "open";
}

static uint64_t clock_us(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void read_clocks(server *s) {
  s->now_us = clock_us(CLOCK_REALTIME);
  s->now_ms = clock_us(CLOCK_MONOTONIC) / 1000u;
  s->ctx->mono_ms = s->now_ms;
}

static int set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -1;
  return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static int watch(server *s, item *it, uint32_t events, int op) {
  struct epoll_event ev = {.events = events, .data.ptr = it};
  return epoll_ctl(s->ep, op, it->fd, &ev);
}

static size_t pending_out(const conn *c) { return c->out.len - c->out_sent; }

/* ---- connections ---- */

static void conn_close(server *s, conn *c, bool dropped) {
  epoll_ctl(s->ep, EPOLL_CTL_DEL, c->it.fd, NULL);
  close(c->it.fd);
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  free(c->in);
  out_free(&c->out);
  free(c);
  s->ctx->stats.clients--;
  if (dropped)
    s->ctx->stats.connections_dropped++;
}

/* Registers the interest the connection's state calls for: input while it
 * may run more requests, output while replies wait or while it holds
 * requests back (writability is then the cue to run them). */
static void conn_interest(server *s, conn *c) {
  size_t pend = pending_out(c);
  uint32_t want = 0;
  if (!c->closing && !c->held && pend < SERVER_OUT_HIGH)
    want |= EPOLLIN;
  if (pend || (c->held && !c->closing))
    want |= EPOLLOUT;
  if (want != c->events) {
    watch(s, &c->it, want, EPOLL_CTL_MOD);
    c->events = want;
  }
}

/* Runs the whole requests at the front of buf[0..len), appending replies to
 * o (the shared buffer). Returns the bytes consumed. Stops at an incomplete
 * request, when the connection is to be closed, or once SERVER_OUT_HIGH
 * bytes of replies wait (c->held is then set). */
static size_t run_requests(server *s, conn *c, const char *buf, size_t len,
                           outbuf *o) {
  size_t pos = 0;
  bool partial = false;
  c->held = false;
  while (!c->closing && pos < len) {
    if (pending_out(c) + o->len >= SERVER_OUT_HIGH) {
      c->held = true;
      break;
    }
    /* the whole requests waiting, one at a time, or with a store on its
     * own clock (Redis) up to a batch, which then costs one round trip */
    size_t n = 0, used = 0, most = s->ctx->store_time ? CMD_BATCH_MAX : 1;
    resp_status st = RESP_OK;
    while (n < most && pos + used < len) {
      st = resp_parse(buf + pos + used, len - pos - used, &s->req[n]);
      if (st != RESP_OK)
        break;
      used += s->req[n++].used;
    }
    if (n > 0) {
      pos += used;
      if (cmd_execute_batch(s->ctx, &c->cl, s->req, n, s->now_us, o) ==
          CMD_CLOSE)
        c->closing = true;
      continue; /* what stopped the batch is looked at again */
    }
    if (st == RESP_INCOMPLETE) {
      partial = true;
      break;
    }
    out_error(o, "ERR", s->req[0].error);
    s->ctx->stats.error_replies++;
    s->ctx->stats.connections_dropped++;
    c->closing = true;
    return len;
  }
  /* the slow-loris clock: runs while the front request is incomplete, from
   * when it began (the moment the request before it ended) */
  if (!partial)
    c->partial_since_ms = 0;
  else if (pos > 0 || c->partial_since_ms == 0)
    c->partial_since_ms = s->now_ms;
  return pos;
}

/* Sends what the connection has waiting. Returns -1 if the connection is
 * gone (it is then closed), else 0. */
static int conn_flush(server *s, conn *c) {
  while (pending_out(c)) {
    ssize_t n = write(c->it.fd, c->out.data + c->out_sent, pending_out(c));
    if (n > 0) {
      c->out_sent += (size_t)n;
      c->last_active_ms = s->now_ms;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    conn_close(s, c, false); /* the peer is gone */
    return -1;
  }
  if (!pending_out(c)) {
    out_free(&c->out); /* an idle connection holds no buffer */
    c->out_sent = 0;
    if (c->closing) {
      conn_close(s, c, false);
      return -1;
    }
  }
  conn_interest(s, c);
  return 0;
}

/* Sends the shared reply buffer's content for c, keeping what the socket
 * would not take in c's own buffer, then whatever else c has waiting.
 * Returns -1 if c was closed. */
static int send_shared(server *s, conn *c) {
  outbuf *o = &s->sout;
  bool failed = o->failed;
  size_t len = o->len, off = 0;
  o->len = 0;
  o->failed = false;
  if (failed) { /* half a reply must never be sent */
    conn_close(s, c, true);
    return -1;
  }
  if (pending_out(c) == 0) {
    while (off < len) {
      ssize_t n = write(c->it.fd, o->data + off, len - off);
      if (n > 0) {
        off += (size_t)n;
        c->last_active_ms = s->now_ms;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        conn_close(s, c, false);
        return -1;
      }
    }
  }
  if (off < len) {
    out_raw(&c->out, o->data + off, len - off);
    if (c->out.failed) {
      conn_close(s, c, true);
      return -1;
    }
  }
  return conn_flush(s, c);
}

/* Keeps buf[0..len) (len > 0) as the connection's unparsed input. */
static int keep_input(conn *c, const char *buf, size_t len) {
  if (len > c->in_cap) {
    size_t cap = IN_MIN_CAP;
    while (cap < len)
      cap *= 2;
    char *p = malloc(cap);
    if (!p)
      return -1;
    memcpy(p, buf, len);
    free(c->in);
    c->in = p;
    c->in_cap = cap;
  } else {
    memmove(c->in, buf, len);
  }
  c->in_len = len;
  return 0;
}

/* Runs the requests in the connection's own input buffer, then sends the
 * replies. Returns -1 if c was closed. */
static int conn_process(server *s, conn *c) {
  size_t used = run_requests(s, c, c->in, c->in_len, &s->sout);
  c->in_len -= used;
  if (c->in_len == 0 || c->closing) {
    free(c->in);
    c->in = NULL;
    c->in_len = c->in_cap = 0;
  } else if (used > 0) {
    memmove(c->in, c->in + used, c->in_len);
  }
  return send_shared(s, c);
}

/* A metrics client's bytes: the request head is gathered in c->in (at
 * most HTTP_HEAD_MAX bytes), then answered by cmd_metrics and the
 * connection closed once the response is sent. The request timeout and
 * idle sweep apply as to any connection. */
#define HTTP_HEAD_MAX 8192u

static int http_readable(server *s, conn *c) {
  if (!c->in) {
    c->in = malloc(HTTP_HEAD_MAX + 1);
    if (!c->in) {
      conn_close(s, c, true);
      return -1;
    }
    c->in_cap = HTTP_HEAD_MAX;
  }
  ssize_t n = read(c->it.fd, c->in + c->in_len, c->in_cap - c->in_len);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return 0;
  if (n <= 0) {
    conn_close(s, c, false);
    return -1;
  }
  c->last_active_ms = s->now_ms;
  c->in_len += (size_t)n;
  c->in[c->in_len] = '\0';
  /* by length: a NUL in the head must not hide its end */
  bool whole = memmem(c->in, c->in_len, "\r\n\r\n", 4) ||
               memmem(c->in, c->in_len, "\n\n", 2);
  if (!whole && c->in_len < c->in_cap) {
    if (c->partial_since_ms == 0)
      c->partial_since_ms = s->now_ms;
    return 0;
  }
  cmd_metrics(s->ctx, c->in, c->in_len, whole, &c->out);
  c->closing = true;
  c->partial_since_ms = 0;
  return conn_flush(s, c);
}

/* Reads what has arrived and runs it. Returns -1 if c was closed. */
static int conn_readable(server *s, conn *c) {
  if (c->http)
    return http_readable(s, c);
  bool own = c->in_len > 0;
  char *dst = s->scratch;
  size_t room = RESP_MAX_REQUEST;
  if (own) {
    if (c->in_cap - c->in_len < IN_MIN_CAP && c->in_cap < RESP_MAX_REQUEST) {
      size_t cap =
          c->in_cap * 2 > RESP_MAX_REQUEST ? RESP_MAX_REQUEST : c->in_cap * 2;
      char *p = realloc(c->in, cap);
      if (!p) {
        conn_close(s, c, true);
        return -1;
      }
      c->in = p;
      c->in_cap = cap;
    }
    dst = c->in + c->in_len;
    room = c->in_cap - c->in_len;
    if (room == 0) { /* cannot happen: the parser refuses a full buffer
                        (resp_parse); were it to, not reading would spin */
      conn_close(s, c, false);
      return -1;
    }
  }
  ssize_t n = read(c->it.fd, dst, room);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return 0;
  if (n < 0) {
    conn_close(s, c, false);
    return -1;
  }
  if (n == 0) { /* the client is done sending: answer what it sent, close */
    c->closing = true;
    return conn_flush(s, c);
  }
  c->last_active_ms = s->now_ms;
  if (own) {
    c->in_len += (size_t)n;
    return conn_process(s, c);
  }
  size_t len = (size_t)n;
  size_t used = run_requests(s, c, s->scratch, len, &s->sout);
  if (used < len && !c->closing &&
      keep_input(c, s->scratch + used, len - used) != 0) {
    s->sout.len = 0;
    conn_close(s, c, true);
    return -1;
  }
  return send_shared(s, c);
}

static void conn_event(server *s, conn *c, uint32_t events) {
  /* EPOLLHUP: both directions are shut (a half-close is EPOLLIN + EOF), so
   * no reply can reach the client any more */
  if (events & (EPOLLHUP | EPOLLERR)) {
    conn_close(s, c, false);
    return;
  }
  if ((events & EPOLLIN) && !c->closing && !c->held) {
    if (conn_readable(s, c) != 0)
      return;
  }
  if (events & EPOLLOUT) {
    if (conn_flush(s, c) != 0)
      return;
    /* replies drained below the mark: run the requests held back */
    if (c->held && pending_out(c) < SERVER_OUT_HIGH)
      conn_process(s, c);
  }
}

/* ---- accepting ---- */

/* Turns a client away, in its listener's protocol: a RESP error, or for
 * a scrape an HTTP 503 (what a Prometheus server or curl can read). */
static void refuse(int fd, bool http) {
  static const char resp[] = "-ERR max number of clients reached\r\n";
  static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
                             "Content-Type: text/plain\r\n"
                             "Content-Length: 0\r\nConnection: close\r\n\r\n";
  ssize_t r = http ? write(fd, busy, sizeof busy - 1)
                   : write(fd, resp, sizeof resp - 1);
  (void)r; /* best effort: the connection is closed either way */
  close(fd);
}

/* Who the peer of fd is, for the new-key budget (see cmd_session.who). */
static void identify(conn *c, bool unix_sock) {
  cmd_session *cl = &c->cl;
  cl->who_len = 0;
  if (unix_sock) {
#ifndef SO_PEERCRED
#error "SO_PEERCRED is needed to tell unix-socket clients apart"
#endif
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(c->it.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      uint32_t uid = (uint32_t)cred.uid;
      cl->who[0] = 'u';
      memcpy(cl->who + 1, &uid, sizeof uid);
      cl->who_len = 1 + sizeof uid;
    }
    return;
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(c->it.fd, (struct sockaddr *)&ss, &len) != 0)
    return;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
    cl->who[0] = '4';
    memcpy(cl->who + 1, &in->sin_addr, 4);
    cl->who_len = 5;
  } else if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      cl->who[0] = '4';
      memcpy(cl->who + 1, in6->sin6_addr.s6_addr + 12, 4);
      cl->who_len = 5;
    } else {
      cl->who[0] = '6';
      memcpy(cl->who + 1, &in6->sin6_addr, 16);
      cl->who_len = 17;
    }
  }
}

static void on_accept(server *s, item *l) {
  for (int i = 0; i < ACCEPTS_PER_TURN; i++) {
    int fd = accept(l->fd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if ((errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
        /* out of descriptors: free the spare one to refuse this client
         * politely instead of leaving it in the backlog forever */
        close(s->spare_fd);
        fd = accept(l->fd, NULL, NULL);
        if (fd >= 0) {
          refuse(fd, l == &s->metrics);
          s->ctx->stats.connections_rejected++;
        }
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      }
      return; /* EAGAIN: the backlog is empty */
    }
    if (s->ctx->stats.clients >= s->cfg->max_clients || s->shutting_down) {
      refuse(fd, l == &s->metrics);
      s->ctx->stats.connections_rejected++;
      continue;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c || set_nonblocking(fd) != 0) {
      free(c);
      close(fd);
      s->ctx->stats.connections_rejected++;
      continue;
    }
    bool unix_sock = l == &s->unix_sock;
    if (!unix_sock) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    c->it.kind = ITEM_CONN;
    c->it.fd = fd;
    c->http = l == &s->metrics;
    c->cl.id = ++s->next_id;
    c->cl.authenticated = !s->ctx->pass_set;
    if (s->ctx->new_keys)
      identify(c, unix_sock);
    c->last_active_ms = s->now_ms;
    c->events = EPOLLIN;
    if (watch(s, &c->it, EPOLLIN, EPOLL_CTL_ADD) != 0) {
      free(c);
      close(fd);
      s->ctx->stats.connections_rejected++;
      continue;
    }
    c->next = s->conns;
    if (s->conns)
      s->conns->prev = c;
    s->conns = c;
    s->ctx->stats.clients++;
    s->ctx->stats.connections_received++;
  }
}

/* ---- timeouts and shutdown ---- */

static uint64_t sweep_interval_ms(const server_config *cfg) {
  uint64_t iv = SWEEP_MAX_MS;
  if (cfg->idle_timeout_ms && cfg->idle_timeout_ms / 4 < iv)
    iv = cfg->idle_timeout_ms / 4;
  if (cfg->request_timeout_ms && cfg->request_timeout_ms / 4 < iv)
    iv = cfg->request_timeout_ms / 4;
  return iv < 10 ? 10 : iv;
}

/* Closes connections past a timeout; recounts buffer memory for INFO. */
static void sweep(server *s) {
  const server_config *cfg = s->cfg;
  uint64_t bytes = s->sout.cap + RESP_MAX_REQUEST;
  conn *next;
  for (conn *c = s->conns; c; c = next) {
    next = c->next;
    bool slow = cfg->request_timeout_ms && c->partial_since_ms &&
                s->now_ms - c->partial_since_ms >= cfg->request_timeout_ms;
    bool idle = cfg->idle_timeout_ms &&
                s->now_ms - c->last_active_ms >= cfg->idle_timeout_ms;
    if (slow || idle)
      conn_close(s, c, true);
    else
      bytes += c->in_cap + c->out.cap;
  }
  s->ctx->stats.buffer_bytes = bytes;
}

static void close_listener(server *s, item *l) {
  if (l->fd < 0)
    return;
  epoll_ctl(s->ep, EPOLL_CTL_DEL, l->fd, NULL);
  close(l->fd);
  l->fd = -1;
}

/* Removes the unix socket's name if it is still the socket this server
 * bound: another server may have replaced a name it found stale, or an
 * operator moved ours away, and what is not ours is not ours to delete. */
static void unlink_own_socket(server *s) {
  struct stat st;
  if (s->unix_ours && lstat(s->cfg->unix_path, &st) == 0 &&
      S_ISSOCK(st.st_mode) && st.st_dev == s->unix_dev &&
      st.st_ino == s->unix_ino)
    unlink(s->cfg->unix_path);
  s->unix_ours = false;
}

static void close_listeners(server *s) {
  for (int i = 0; i < s->ntcp; i++)
    close_listener(s, &s->tcp[i]);
  close_listener(s, &s->unix_sock);
  close_listener(s, &s->metrics);
  unlink_own_socket(s);
}

/* Stops accepting and reading; replies already computed go on being sent
 * until they are or the grace period ends. */
static void begin_shutdown(server *s) {
  s->shutting_down = true;
  s->shutdown_deadline_ms = s->now_ms + s->cfg->shutdown_grace_ms;
  close_listeners(s);
  conn *next;
  for (conn *c = s->conns; c; c = next) {
    next = c->next;
    c->closing = true;
    conn_flush(s, c);
  }
}

/* ---- listening ---- */

/* Whether a socket address is on the loopback network (127.0.0.0/8, ::1, or
 * 127.x mapped into IPv6): only this host can reach it. */
static bool is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a =
        &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

static void set_port(struct sockaddr *sa, int port) {
  if (sa->sa_family == AF_INET)
    ((struct sockaddr_in *)(void *)sa)->sin_port = htons((uint16_t)port);
  else if (sa->sa_family == AF_INET6)
    ((struct sockaddr_in6 *)(void *)sa)->sin6_port = htons((uint16_t)port);
}

/* Listens on one address; returns the fd or -1 (errno set). */
static int listen_one(const struct addrinfo *ai, bool v6only) {
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd < 0)
    return -1;
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      (v6only && ai->ai_family == AF_INET6 &&
       setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
      bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
      listen(fd, SOMAXCONN) != 0 || set_nonblocking(fd) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

/* Listens on every address --bind gives: a numeric address is one, a host
 * name may resolve to several (localhost: 127.0.0.1 and ::1), all on one
 * port (with --port 0, the one the first got). An address of a family this
 * host lacks is skipped, unless none is left. */
static int listen_tcp(server *s) {
  const server_config *cfg = s->cfg;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int rc = getaddrinfo(cfg->bind_addr, port, &hints, &res);
  if (rc != 0) {
    fprintf(stderr,
            "tollgate serve: --bind '%s': %s; it wants an address "
            "(127.0.0.1, ::1, 0.0.0.0, ::) or a host name that resolves to "
            "one\n",
            cfg->bind_addr, gai_strerror(rc));
    return -1;
  }
  /* two addresses: each IPv6 socket keeps to IPv6, so "::" cannot take
   * the IPv4 port the other one wants */
  bool v6only = res->ai_next != NULL;
  int bound_port = cfg->port;
  bool exposed = false;
  for (struct addrinfo *ai = res; ai && s->ntcp < MAX_TCP; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN];
    if (getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof text, NULL, 0,
                    NI_NUMERICHOST) != 0)
      snprintf(text, sizeof text, "?");
    bool dup = false;
    for (int i = 0; i < s->ntcp; i++)
      dup |= strcmp(s->tcp_addr[i], text) == 0;
    if (dup)
      continue;
    set_port(ai->ai_addr, bound_port);
    int fd = listen_one(ai, v6only);
    if (fd < 0) {
      int err = errno;
      if ((err == EADDRNOTAVAIL || err == EAFNOSUPPORT) &&
          (ai->ai_next || s->ntcp > 0)) {
        fprintf(stderr, "tollgate serve: note: not listening on %s: %s\n", text,
                strerror(err));
        continue;
      }
      fprintf(stderr, "tollgate serve: cannot listen on %s port %d: %s\n", text,
              bound_port, strerror(err));
      freeaddrinfo(res);
      return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
      bound_port = ntohs(ss.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&ss)->sin6_port
                             : ((struct sockaddr_in *)&ss)->sin_port);
    exposed |= !is_loopback(ai->ai_addr);
    item *l = &s->tcp[s->ntcp];
    l->kind = ITEM_LISTENER;
    l->fd = fd;
    snprintf(s->tcp_addr[s->ntcp], sizeof s->tcp_addr[0], "%s", text);
    s->ntcp++;
    if (watch(s, l, EPOLLIN, EPOLL_CTL_ADD) != 0) {
      freeaddrinfo(res);
      return -1;
    }
  }
  freeaddrinfo(res);
  if (s->ntcp == 0) {
    fprintf(stderr, "tollgate serve: --bind '%s': no address to listen on\n",
            cfg->bind_addr);
    return -1;
  }
  s->ctx->tcp_port = bound_port;
  if (exposed)
    fprintf(stderr,
            "tollgate serve: warning: --bind %s is reachable from other "
            "hosts. %s\n",
            cfg->bind_addr,
            s->ctx->pass_set
                ? "Clients must AUTH, but the traffic, the password "
                  "included, is not encrypted: keep it on a network you "
                  "trust."
                : "Anyone who can connect can spend, change and reset every "
                  "limit: set a password (TOLLGATE_REQUIREPASS) and "
                  "firewall the port.");
  return 0;
}

/* The metrics listener: bind_addr's first address, at metrics_port. */
static int listen_metrics(server *s) {
  const server_config *cfg = s->cfg;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->metrics_port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int rc = getaddrinfo(cfg->bind_addr, port, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, "tollgate serve: metrics: --bind '%s': %s\n",
            cfg->bind_addr, gai_strerror(rc));
    return -1;
  }
  int fd = listen_one(res, false);
  char text[INET6_ADDRSTRLEN] = "?";
  getnameinfo(res->ai_addr, res->ai_addrlen, text, sizeof text, NULL, 0,
              NI_NUMERICHOST);
  freeaddrinfo(res);
  if (fd < 0) {
    fprintf(stderr,
            "tollgate serve: cannot listen for metrics on %s port %d: "
            "%s\n",
            text, cfg->metrics_port, strerror(errno));
    return -1;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int bound = cfg->metrics_port;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    bound =
        ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                       : ((struct sockaddr_in *)&ss)->sin_port);
  s->metrics.kind = ITEM_LISTENER;
  s->metrics.fd = fd;
  if (watch(s, &s->metrics, EPOLLIN, EPOLL_CTL_ADD) != 0)
    return -1;
  printf("tollgate serve: metrics on http://%s%s%s:%d/metrics\n",
         strchr(text, ':') ? "[" : "", text, strchr(text, ':') ? "]" : "",
         bound);
  return 0;
}

/* Whether a server answers on the unix socket at sa: 1 yes (or it is too
 * busy to take one more connection), 0 no (a stale socket), -1 cannot tell
 * (errno set). */
static int unix_live(const struct sockaddr_un *sa) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  int rc = connect(fd, (const struct sockaddr *)sa, sizeof *sa);
  int err = errno;
  close(fd);
  if (rc == 0 || err == EAGAIN)
    return 1;
  if (err == ECONNREFUSED || err == ENOENT)
    return 0;
  errno = err;
  return -1;
}

/* Listens on --unix PATH. A socket already there is probed first: if a
 * server answers, this one refuses to start ("address in use") rather than
 * take the name over; a socket nobody answers on is stale and replaced (only
 * if it is still the file probed). Anything else at PATH is left alone. The
 * socket is born with cfg->unix_mode exactly: the umask is set for the
 * bind() to give that mode, and put back, so neither the inherited umask nor
 * a chmod after the fact (a window in which the name could be swapped) is
 * involved. */
static int listen_unix(server *s) {
  const char *path = s->cfg->unix_path;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    fprintf(stderr, "tollgate serve: unix socket path too long: %s\n", path);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      fprintf(stderr,
              "tollgate serve: %s exists and is not a socket: not replacing "
              "it\n",
              path);
      return -1;
    }
    int live = unix_live(&sa);
    if (live != 0) {
      if (live > 0)
        fprintf(stderr,
                "tollgate serve: %s: address in use (a server answers "
                "there)\n",
                path);
      else
        fprintf(stderr,
                "tollgate serve: %s: cannot tell whether a server answers "
                "there (%s): not replacing it\n",
                path, strerror(errno));
      return -1;
    }
    struct stat again;
    if (lstat(path, &again) == 0 && again.st_dev == st.st_dev &&
        again.st_ino == st.st_ino)
      unlink(path); /* stale: left by a server that died */
  }
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) {
    fprintf(stderr, "tollgate serve: socket: %s\n", strerror(errno));
    return -1;
  }
  mode_t old = umask((mode_t)(0777u & ~s->cfg->unix_mode));
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  int err = errno;
  umask(old);
  if (rc != 0) {
    fprintf(stderr, "tollgate serve: cannot listen on %s: %s\n", path,
            err == EADDRINUSE ? "address in use" : strerror(err));
    close(fd);
    return -1;
  }
  if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
    s->unix_ours = true;
    s->unix_dev = st.st_dev;
    s->unix_ino = st.st_ino;
  }
  const char *why = NULL;
  if (!s->unix_ours)
    why = "the socket vanished";
  else if ((st.st_mode & 0777u) != s->cfg->unix_mode)
    why = "the socket did not get the mode --unix-mode asks for";
  else if (listen(fd, SOMAXCONN) != 0 || set_nonblocking(fd) != 0)
    why = strerror(errno);
  if (why) {
    fprintf(stderr, "tollgate serve: cannot listen on %s: %s\n", path, why);
    close(fd);
    unlink_own_socket(s);
    return -1;
  }
  s->unix_sock.kind = ITEM_LISTENER;
  s->unix_sock.fd = fd;
  return watch(s, &s->unix_sock, EPOLLIN, EPOLL_CTL_ADD);
}

/* Lets the process hold max_clients descriptors if the hard limit allows. */
static void raise_fd_limit(uint64_t max_clients) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return;
  rlim_t want = (rlim_t)max_clients + 64;
  if (rl.rlim_cur >= want)
    return;
  rl.rlim_cur =
      (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) ? rl.rlim_max : want;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want)
    fprintf(stderr,
            "tollgate serve: warning: the descriptor limit (%llu) is below "
            "max clients + 64; clients beyond it are refused\n",
            (unsigned long long)rl.rlim_cur);
}

static int setup(server *s) {
  s->ep = epoll_create1(EPOLL_CLOEXEC);
  s->scratch = malloc(RESP_MAX_REQUEST);
  if (s->ep < 0 || !s->scratch) {
    fprintf(stderr, "tollgate serve: %s\n", strerror(errno));
    return -1;
  }
  int p[2];
  if (pipe(p) != 0 || set_nonblocking(p[0]) != 0 ||
      set_nonblocking(p[1]) != 0) {
    fprintf(stderr, "tollgate serve: pipe: %s\n", strerror(errno));
    return -1;
  }
  s->sig.kind = ITEM_SIGNAL;
  s->sig.fd = p[0];
  s->sig_write_fd = p[1];
  if (watch(s, &s->sig, EPOLLIN, EPOLL_CTL_ADD) != 0)
    return -1;
  __atomic_store_n(&signal_fd, p[1], __ATOMIC_RELEASE);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, NULL);

  raise_fd_limit(s->cfg->max_clients);
  s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (s->cfg->port >= 0 && listen_tcp(s) != 0)
    return -1;
  if (s->cfg->unix_path && listen_unix(s) != 0)
    return -1;
  if (s->cfg->metrics_port >= 0 && listen_metrics(s) != 0)
    return -1;
  return 0;
}

static void teardown(server *s) {
  while (s->conns)
    conn_close(s, s->conns, false);
  close_listeners(s);
  __atomic_store_n(&signal_fd, -1, __ATOMIC_RELEASE);
  /* Shutting down already: another SIGTERM (a supervisor or script that
   * repeats it) must not turn a clean stop into death by signal, so it is
   * ignored until exit; a second Ctrl-C still stops at once, as a user who
   * presses it twice expects. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = SIG_DFL;
  sigaction(SIGINT, &sa, NULL);
  /* the self-pipe stays open: a signal taken just before SIG_IGN above
   * may still be in its handler, on any thread, writing to it (ThreadSanitizer
   * saw close race that write); the process exits after this */
  if (s->spare_fd >= 0)
    close(s->spare_fd);
  if (s->ep >= 0)
    close(s->ep);
  free(s->scratch);
  out_free(&s->sout);
}

int server_run(const server_config *cfg, cmd_ctx *ctx) {
  server s = {
      .cfg = cfg, .ctx = ctx, .ep = -1, .sig_write_fd = -1, .spare_fd = -1};
  for (int i = 0; i < MAX_TCP; i++)
    s.tcp[i].fd = -1;
  s.unix_sock.fd = s.sig.fd = s.metrics.fd = -1;
  ctx->tcp_port = -1;
  ctx->unix_path = cfg->unix_path;
  ctx->max_clients = cfg->max_clients;
  read_clocks(&s);
  ctx->start_us = s.now_us;
  if (setup(&s) != 0) {
    teardown(&s);
    return 1;
  }
  for (int i = 0; i < s.ntcp; i++)
    printf("tollgate serve: listening on %s port %d\n", s.tcp_addr[i],
           ctx->tcp_port);
  if (s.unix_sock.fd >= 0)
    printf("tollgate serve: listening on unix socket %s\n", cfg->unix_path);
  printf("tollgate serve: ready\n");
  fflush(stdout);

  uint64_t iv = sweep_interval_ms(cfg);
  uint64_t next_sweep = s.now_ms + iv;
  struct epoll_event events[MAX_EVENTS];
  while (!(s.shutting_down && !s.conns)) {
    int timeout = next_sweep > s.now_ms ? (int)(next_sweep - s.now_ms) : 0;
    int n = epoll_wait(s.ep, events, MAX_EVENTS, timeout);
    read_clocks(&s);
    if (n < 0 && errno != EINTR) {
      fprintf(stderr, "tollgate serve: epoll_wait: %s\n", strerror(errno));
      break;
    }
    bool signalled = false;
    for (int i = 0; i < n; i++) {
      item *it = events[i].data.ptr;
      if (it->kind == ITEM_CONN) {
        conn_event(&s, (conn *)it, events[i].events);
      } else if (it->kind == ITEM_LISTENER) {
        on_accept(&s, it);
      } else {
        char buf[64];
        while (read(it->fd, buf, sizeof buf) > 0)
          ;
        signalled = true;
      }
    }
    /* only now: shutting down closes connections that later events of this
     * batch may point to */
    if (signalled && s.shutting_down) { /* a second signal: stop now */
      while (s.conns)
        conn_close(&s, s.conns, false);
    } else if (signalled) {
      fprintf(stderr, "tollgate serve: signal %d, shutting down\n",
              __atomic_load_n(&last_signal, __ATOMIC_RELAXED));
      begin_shutdown(&s);
    }
    if (s.now_ms >= next_sweep) {
      sweep(&s);
      next_sweep = s.now_ms + iv;
    }
    health_log(&ctx->health, s.now_ms, stderr, ctx->store,
               policy_name(ctx->policy), ctx->capacity);
    if (s.shutting_down && s.now_ms >= s.shutdown_deadline_ms)
      while (s.conns)
        conn_close(&s, s.conns, false);
  }
  fprintf(stderr,
          "tollgate serve: stopped after %" PRIu64 " connections and %" PRIu64
          " commands\n",
          ctx->stats.connections_received, ctx->stats.commands);
  teardown(&s);
  return 0;
}
