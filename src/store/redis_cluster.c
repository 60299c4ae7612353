/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster.c - the Redis store on a Redis Cluster: the same script (or
 * module command), keys and answers as the one-server store, routed to the
 * node that holds each key's hash slot.
 *
 * The protocol is the engine's (redis_engine.c): slot routing, the
 * handshake, MOVED, ASK, NOSCRIPT, and which calls may be resent after a
 * lost connection. This file is its blocking driver: a pool of pool_size
 * engines, each used by one thread at a time and holding at most one
 * connection per node (so pool_size connections per node in all), driven
 * with non-blocking sockets and poll(2) until the thread's calls are
 * answered. A batch is submitted whole to one engine, which splits it per
 * node and pipelines each part; the nodes are served side by side.
 *
 * Shared by the pool: the slot map (one refresh serves every engine) and
 * each node's health, the one-server store's "Failing fast" per node: a
 * node that timed out or could not be connected to is down for
 * reconnect_backoff_ms, during which calls for its slots fail at once with
 * that code (the failure policy answers), then one call at a time probes
 * it. A node going down, a MOVED and a CLUSTERDOWN ask for a new slot map
 * (CLUSTER SLOTS from a node that is up), at most once per backoff period
 * unless calls are waiting for a map: so after a failover the map follows
 * the promoted replica, and calls are exact again without anyone's help.
 *
 * Policies and reservations read keys, decide here and write them back
 * only if unchanged: several commands on one connection, which the
 * one-server store does (redis.c). So they go to a one-server store per
 * node of the slot's master, made on first need and kept; the slot map is
 * this store's, and a MOVED (or CLUSTERDOWN) there refreshes it and starts
 * over (from the second MOVED on, after a pause, as the nodes may disagree
 * for a moment), an ASK or TRYAGAIN (a slot being migrated) waits a little
 * and starts over: nothing had run, so nothing is counted twice.
 */
#include "redis_engine.h"

#include "../atomic.h"
#include "../error.h"
#include "../mono.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 16384u
/* The shortest wait between two map refreshes no call is waiting for. */
#define REFRESH_GAP_MIN_MS 100u
/* Tries of a policy or reservation that meets a MOVED (or CLUSTERDOWN),
 * and one that meets a migrating slot (ASK, TRYAGAIN), then TG_ESTORE. */
#define MULTI_MOVED_MAX TG__REDIRECTS_MAX
#define MULTI_WAIT_MAX TG__TRYAGAIN_WAITS

/* One node's health, shared by the pool (all atomic). */
typedef struct health {
  uint64_t down_until_ms; /* CLOCK_MONOTONIC ms; 0: up */
  uint64_t down_rc;       /* -(the code calls get while down) */
  uint64_t probing;       /* 1 while one call is trying the node */
} health;

/* One pooled engine and its sockets. */
typedef struct pooled {
  pthread_mutex_t mu; /* held by the thread using it */
  tg__eng eng;
  pid_t pid;          /* the process that opened its sockets */
  int *fd;            /* per node id, -1: none (TG__NODES_MAX) */
  uint64_t *last_ms;  /* per node id: last sign of life (sent or read) */
  struct pollfd *pfd; /* poll(2)'s array, and whose each entry is */
  uint32_t *who;
} pooled;

typedef struct cluster_store {
  tg__store base;
  tg__store *codec;
  char *username, *password;
  uint32_t connect_timeout_ms, command_timeout_ms, backoff_ms;
  uint64_t next;          /* round-robin start for picking an engine */
  uint64_t refresh_after; /* CLOCK_MONOTONIC ms before which no refresh
                             starts unless calls wait for a map (atomic) */
  tg__eng_stats st;
  health *health; /* per node id (TG__NODES_MAX) */
  /* For the node stores: */
  tg_redis_config nrc; /* host and port set per node; strings owned */
  tg_algorithm alg;
  uint32_t log_entries;
  char *seeds, *prefix;
  tg__store **nodes; /* per node id, made on first need (atomic pointers) */
  size_t npool;
  pooled *pool;
  tg__slotmap map; /* last: the largest */
} cluster_store;

/* ---- nodes' health (as redis.c's pool, per node) ---- */

/* TG_OK (with *probe set when this call tries a down node), or the code
 * of the failure that made the node down. */
static int gate(cluster_store *s, uint32_t id, bool *probe) {
  health *h = &s->health[id];
  *probe = false;
  uint64_t until = tg__load_acquire(&h->down_until_ms);
  if (until == 0)
    return TG_OK;
  int down = -(int)tg__load_relaxed(&h->down_rc);
  if (tg__mono_ms() < until)
    return down;
  uint64_t idle = 0;
  if (!tg__cas64(&h->probing, &idle, 1))
    return down;
  until = tg__load_acquire(&h->down_until_ms);
  if (until != 0 && tg__mono_ms() < until) {
    tg__store_release(&h->probing, 0);
    return -(int)tg__load_relaxed(&h->down_rc);
  }
  *probe = true;
  return TG_OK;
}

static void node_down(cluster_store *s, uint32_t id, int rc) {
  health *h = &s->health[id];
  uint64_t until = tg__mono_ms() + s->backoff_ms;
  tg__store_relaxed(&h->down_rc, (uint64_t)-rc);
  tg__store_release(&h->down_until_ms, until ? until : 1);
}

static void node_up(cluster_store *s, uint32_t id) {
  health *h = &s->health[id];
  if (tg__load_relaxed(&h->down_until_ms) != 0)
    tg__store_release(&h->down_until_ms, 0);
}

static bool node_usable(cluster_store *s, uint32_t id) {
  uint64_t until = tg__load_acquire(&s->health[id].down_until_ms);
  return until == 0 || tg__mono_ms() >= until;
}

/* ---- sockets ---- */

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -1 : 0;
}

/* A connected non-blocking socket to node d within the connect timeout, or
 * -1 with *rc set (TG_ETIMEDOUT, TG_ECONNECT). */
static int dial(const cluster_store *s, const tg__node *d, int *rc) {
  char port[8];
  (void)snprintf(port, sizeof port, "%d", d->port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  *rc = TG_ECONNECT;
  if (getaddrinfo(d->host, port, &hints, &res) != 0)
    return -1;
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    int err = 0;
    if (set_nonblock(fd) != 0) {
      err = errno;
    } else if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n;
        int wait = s->connect_timeout_ms ? (int)s->connect_timeout_ms : -1;
        do
          n = poll(&p, 1, wait);
        while (n < 0 && errno == EINTR);
        socklen_t el = sizeof err;
        if (n == 0)
          err = ETIMEDOUT;
        else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
          err = errno;
      }
    }
    if (err != 0) {
      *rc = err == ETIMEDOUT ? TG_ETIMEDOUT : TG_ECONNECT;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *rc = TG_OK;
  }
  return fd;
}

static void drop(pooled *k, uint32_t id) {
  if (k->fd[id] >= 0) {
    close(k->fd[id]);
    k->fd[id] = -1;
  }
}

/* ---- the pool ---- */

static pooled *acquire(cluster_store *s) {
  size_t start = (size_t)(tg__fetch_add(&s->next, 1) % s->npool);
  pooled *k = NULL;
  for (size_t i = 0; i < s->npool && !k; i++)
    if (pthread_mutex_trylock(&s->pool[(start + i) % s->npool].mu) == 0)
      k = &s->pool[(start + i) % s->npool];
  if (!k) {
    k = &s->pool[start];
    pthread_mutex_lock(&k->mu);
  }
  pid_t pid = getpid();
  if (k->pid != pid) {
    /* opened before a fork(): those sockets are the parent's */
    for (uint32_t i = 0; i < TG__NODES_MAX; i++)
      drop(k, i);
    tg__eng_reset(&k->eng);
    k->pid = pid;
  }
  return k;
}

/* ---- driving an engine ---- */

/* Asks a node that is up for the slot map: one already connected if any,
 * else the first usable one from a rotating start. With none, calls that
 * wait for a map fail with the code of a down node. */
static void refresh(cluster_store *s, pooled *k, bool force) {
  tg__eng *e = &k->eng;
  uint64_t now = tg__mono_ms();
  if (!force && !tg__eng_parked(e)) {
    uint64_t after = tg__load_acquire(&s->refresh_after);
    uint64_t gap =
        s->backoff_ms > REFRESH_GAP_MIN_MS ? s->backoff_ms : REFRESH_GAP_MIN_MS;
    if (now < after || !tg__cas64(&s->refresh_after, &after, now + gap)) {
      e->want_refresh = false; /* another one is recent enough */
      return;
    }
  }
  uint32_t n = tg__eng_nodes(e), pick = TG__NO_NODE;
  for (uint32_t i = 0; i < n && pick == TG__NO_NODE; i++)
    if (k->fd[i] >= 0 && node_usable(s, i))
      pick = i;
  uint32_t start = n ? (uint32_t)(tg__load_relaxed(&s->next) % n) : 0;
  for (uint32_t j = 0; j < n && pick == TG__NO_NODE; j++)
    if (node_usable(s, (start + j) % n))
      pick = (start + j) % n;
  if (pick != TG__NO_NODE) {
    tg__eng_refresh(e, pick);
    return;
  }
  int code = TG_ECONNECT;
  for (uint32_t i = 0; i < n; i++)
    if (tg__load_acquire(&s->health[i].down_until_ms) != 0)
      code = -(int)tg__load_relaxed(&s->health[i].down_rc);
  tg__eng_fail_parked(e, code);
  e->want_refresh = false;
}

/* Node id cannot be reached (rc): its socket goes, the calls it holds are
 * answered (those written in full, and the queued ones, with rc), it is
 * down for the backoff, and the map may have changed. */
static void fail_node(cluster_store *s, pooled *k, uint32_t id, int rc) {
  drop(k, id);
  tg__eng_closed(&k->eng, id, rc);
  tg__eng_fail_queued(&k->eng, id, rc);
  node_down(s, id, rc);
  k->eng.want_refresh = true;
}

/* Sends what node id's link has to send; false if the socket failed. */
static bool pump_out(pooled *k, uint32_t id, uint64_t now) {
  for (;;) {
    const char *p;
    size_t len;
    tg__eng_output(&k->eng, id, &p, &len);
    if (len == 0)
      return true;
    ssize_t n = send(k->fd[id], p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK;
    tg__eng_written(&k->eng, id, (size_t)n);
    k->last_ms[id] = now;
    if ((size_t)n < len)
      return true; /* the socket is full: wait for POLLOUT */
  }
}

/* Reads what node id sent. 0: fine; else the code the link failed with
 * (*eof: the server closed it, which does not make the node down). */
static int pump_in(pooled *k, uint32_t id, uint64_t now, bool *answered,
                   bool *eof) {
  char buf[READ_CHUNK];
  for (;;) {
    ssize_t n = recv(k->fd[id], buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return TG_OK;
      *eof = true;
      return TG_ECONNECT;
    }
    if (n == 0) {
      *eof = true;
      return TG_ECONNECT;
    }
    k->last_ms[id] = now;
    *answered = true;
    /* a decision leaves tg_last_error as it was (only tg_limiter_new and
     * tg_nb_input write it) */
    int was = tg__error_mute(1);
    int rc = tg__eng_input(&k->eng, id, buf, (size_t)n);
    (void)tg__error_mute(was);
    if (rc != TG_OK)
      return rc; /* not RESP, or the handshake refused */
    if ((size_t)n < sizeof buf)
      return TG_OK;
  }
}

/* Runs engine k until `want` calls are answered (collected by the caller
 * through tg__eng_done as they come) and nothing it sent is unanswered. */
static void drive(cluster_store *s, pooled *k, size_t want,
                  void (*collect)(tg__ereq *, void *), void *ctx) {
  tg__eng *e = &k->eng;
  size_t got = 0;
  uint8_t gated[TG__NODES_MAX]; /* 0: not asked yet, 1 passed, 2 probing */
  memset(gated, 0, sizeof gated);
  struct pollfd *pfd = k->pfd;
  uint32_t *who = k->who;
  unsigned idle = 0; /* turns in a row with nothing to wait for */
  for (;;) {
    tg__ereq *d;
    while ((d = tg__eng_done(e)) != NULL) {
      collect(d, ctx);
      got++;
    }
    uint32_t n = tg__eng_nodes(e);
    bool busy = false;
    for (uint32_t i = 0; i < n && !busy; i++)
      busy = tg__eng_busy(e, i);
    if (got >= want && !busy && !tg__eng_parked(e))
      break;
    if (tg__eng_refresh_wanted(e))
      refresh(s, k, false);
    uint64_t now = tg__mono_ms();
    nfds_t np = 0;
    int timeout = -1;
    for (uint32_t i = 0; i < n; i++) {
      unsigned w = tg__eng_wants(e, i);
      if (w == 0)
        continue;
      if (!gated[i]) {
        bool probe;
        int rc = gate(s, i, &probe);
        if (rc != TG_OK) {
          tg__eng_fail_queued(e, i, rc); /* down: fail fast */
          continue;
        }
        gated[i] = probe ? 2 : 1;
      }
      if (w & TG__WANT_CONNECT) {
        int rc;
        int fd = dial(s, tg__slotmap_addr(&s->map, i), &rc);
        if (fd < 0 || tg__eng_connected(e, i) != TG_OK) {
          if (fd >= 0)
            close(fd);
          fail_node(s, k, i, fd < 0 ? rc : TG_ENOMEM);
          if (gated[i] == 2)
            tg__store_release(&s->health[i].probing, 0);
          gated[i] = 1;
          continue;
        }
        k->fd[i] = fd;
        k->last_ms[i] = now = tg__mono_ms();
        w = tg__eng_wants(e, i);
      }
      if ((w & TG__WANT_WRITE) && !pump_out(k, i, now)) {
        drop(k, i);
        tg__eng_closed(e, i, TG_ECONNECT);
        continue; /* what was not written goes on the next connection */
      }
      w = tg__eng_wants(e, i);
      if (!(w & (TG__WANT_WRITE | TG__WANT_READ)))
        continue;
      pfd[np].fd = k->fd[i];
      pfd[np].events = (short)(POLLIN | (w & TG__WANT_WRITE ? POLLOUT : 0));
      pfd[np].revents = 0;
      who[np++] = i;
      if (s->command_timeout_ms) {
        uint64_t due = k->last_ms[i] + s->command_timeout_ms;
        int left = due > now ? (int)(due - now) : 0;
        if (timeout < 0 || left < timeout)
          timeout = left;
      }
    }
    if (np == 0) {
      /* calls were answered or failed: look again. Every turn without a
       * socket to wait for answers or fails something, so this ends; the
       * bound only turns a bug into failed calls rather than a hang. */
      if (++idle > 10000) {
        for (uint32_t i = 0; i < n; i++) {
          tg__eng_closed(e, i, TG_ESTORE);
          tg__eng_fail_queued(e, i, TG_ESTORE);
        }
        tg__eng_fail_parked(e, TG_ESTORE);
      }
      continue;
    }
    idle = 0;
    (void)poll(pfd, np, timeout); /* EINTR: look again; timeouts below */
    now = tg__mono_ms();
    for (nfds_t j = 0; j < np; j++) {
      uint32_t i = who[j];
      if (k->fd[i] < 0)
        continue;
      if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR)) {
        bool answered = false, eof = false;
        int rc = pump_in(k, i, now, &answered, &eof);
        if (answered) {
          node_up(s, i);
          if (gated[i] == 2) {
            tg__store_release(&s->health[i].probing, 0);
            gated[i] = 1;
          }
        }
        if (rc != TG_OK && eof) {
          drop(k, i); /* the server closed it: reconnect for the rest */
          tg__eng_closed(e, i, rc);
        } else if (rc != TG_OK) {
          fail_node(s, k, i, rc); /* engine closed the link already */
        }
        if (rc != TG_OK)
          continue;
      }
      if ((pfd[j].revents & POLLOUT) && !pump_out(k, i, now)) {
        drop(k, i);
        tg__eng_closed(e, i, TG_ECONNECT);
        continue;
      }
      if (s->command_timeout_ms && (tg__eng_wants(e, i) & TG__WANT_READ) &&
          now >= k->last_ms[i] + s->command_timeout_ms) {
        fail_node(s, k, i, TG_ETIMEDOUT); /* no answer in time */
        if (gated[i] == 2) {
          tg__store_release(&s->health[i].probing, 0);
          gated[i] = 1;
        }
      }
    }
  }
  for (uint32_t i = 0; i < TG__NODES_MAX; i++)
    if (gated[i] == 2)
      tg__store_release(&s->health[i].probing, 0);
}

/* ---- store operations ---- */

static void collect_none(tg__ereq *r, void *ctx) {
  (void)r;
  (void)ctx;
}

static int exec_one(tg__store *base, const tg__call *c, tg__outcome *o) {
  cluster_store *s = (cluster_store *)base;
  pooled *k = acquire(s);
  tg__ereq r;
  memset(&r, 0, sizeof r);
  r.call = *c;
  tg__eng_submit(&k->eng, &r);
  drive(s, k, 1, collect_none, NULL);
  pthread_mutex_unlock(&k->mu);
  if (r.status == TG_OK)
    *o = r.out;
  return r.status;
}

static void cluster_exec_batch(tg__store *base, const tg__call *calls, size_t n,
                               tg__outcome *o, int *rcs) {
  cluster_store *s = (cluster_store *)base;
  tg__ereq *r = calloc(n, sizeof *r);
  if (!r) {
    for (size_t i = 0; i < n; i++)
      rcs[i] = TG_ENOMEM;
    return;
  }
  pooled *k = acquire(s);
  for (size_t i = 0; i < n; i++) {
    r[i].call = calls[i];
    tg__eng_submit(&k->eng, &r[i]);
  }
  drive(s, k, n, collect_none, NULL);
  pthread_mutex_unlock(&k->mu);
  for (size_t i = 0; i < n; i++) {
    rcs[i] = r[i].status;
    if (rcs[i] == TG_OK)
      o[i] = r[i].out;
  }
  free(r);
}

static int cluster_reset(tg__store *base, const void *key, size_t key_len) {
  cluster_store *s = (cluster_store *)base;
  pooled *k = acquire(s);
  tg__ereq r;
  memset(&r, 0, sizeof r);
  r.call.key = key;
  r.call.key_len = key_len;
  r.del = 1;
  tg__eng_submit(&k->eng, &r);
  drive(s, k, 1, collect_none, NULL);
  pthread_mutex_unlock(&k->mu);
  return r.status;
}

/* ---- policies and reservations, through a node's one-server store ---- */

/* Fetches a new slot map now (force: even if one was fetched lately), and
 * waits for it. */
static void refresh_now(cluster_store *s, bool force) {
  pooled *k = acquire(s);
  refresh(s, k, force);
  drive(s, k, 0, collect_none, NULL);
  pthread_mutex_unlock(&k->mu);
}

/* The one-server store of node id, made on first need. NULL: no memory. */
static tg__store *node_store(cluster_store *s, uint32_t id) {
  tg__store *ns = __atomic_load_n(&s->nodes[id], __ATOMIC_ACQUIRE);
  if (ns)
    return ns;
  const tg__node *d = tg__slotmap_addr(&s->map, id);
  tg_redis_config rc = s->nrc;
  rc.host = d->host;
  rc.port = d->port;
  if (tg__redis_node_new(&ns, &rc, s->alg, s->log_entries) != TG_OK)
    return NULL;
  tg__store *none = NULL;
  if (!__atomic_compare_exchange_n(&s->nodes[id], &none, ns, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    ns->ops->destroy(ns); /* another thread made it first */
    ns = none;
  }
  return ns;
}

/* The node of store s's map at address d, added if new. */
static uint32_t node_at(cluster_store *s, const tg__node *d) {
  return tg__slotmap_node(&s->map, d->host, strlen(d->host), d->port);
}

/* What a policy or a reservation runs on its node's stores. */
typedef struct multi_job {
  tg__store *const *stores; /* n Cluster stores (one per rule) */
  const tg__call *calls;
  size_t n;
  const bool *shadow; /* a policy's; NULL: a reservation or cancel */
  tg__outcome *o;
  bool *passed;
  size_t *failed;
} multi_job;

/* The blocking store's wait before try w of a call it tries again
 * (tg__tryagain_pause_ms). */
static void tryagain_pause(unsigned w) {
  struct timespec ts = {0, (long)tg__tryagain_pause_ms(w) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Runs a job on the master of the first call's slot, as long as the
 * Cluster says it did not run there (see the top of the file). */
static int multi_run(const multi_job *j) {
  cluster_store *s0 = (cluster_store *)j->stores[0];
  if (j->n == 0 || j->n > TG_RULES_MAX)
    return TG_EINVAL; /* the limiter never asks for that */
  char name[TG__REDIS_NAME_MAX];
  size_t len = tg__redis_key_name(s0->codec, &j->calls[0], name);
  unsigned slot = tg__key_slot(name, len);
  tg__store *fixed[TG_RULES_MAX];
  int moved = 0, waits = 0;
  for (;;) {
    uint32_t id = tg__slotmap_get(&s0->map, slot);
    if (id == TG__NO_NODE) {
      /* forced: another thread's refresh may be on its way, but this call
       * cannot wait for it (it waits for its own) */
      refresh_now(s0, true);
      id = tg__slotmap_get(&s0->map, slot);
      if (id == TG__NO_NODE)
        return TG_ECONNECT; /* no node could say where the slot is */
    }
    const tg__node *d = tg__slotmap_addr(&s0->map, id);
    int rc = TG_OK;
    for (size_t i = 0; i < j->n && rc == TG_OK; i++) {
      cluster_store *si = (cluster_store *)j->stores[i];
      uint32_t ii = si == s0 ? id : node_at(si, d);
      fixed[i] = ii == TG__NO_NODE ? NULL : node_store(si, ii);
      if (!fixed[i])
        rc = TG_ENOMEM;
    }
    if (rc == TG_OK && j->shadow)
      rc = fixed[0]->ops->exec_rules(fixed, j->calls, j->n, j->shadow, j->o,
                                     j->passed, j->failed);
    else if (rc == TG_OK)
      rc = fixed[0]->ops->exec(fixed[0], &j->calls[0], j->o);
    if (rc == TG__EMOVED && ++moved < MULTI_MOVED_MAX) {
      tg__fetch_add(&s0->st.moved, 1);
      if (moved > 1) {
        /* moved again (or CLUSTERDOWN again): the nodes may disagree for a
         * moment (a migration's end told to the source first, see
         * redis_engine.c), which this path, sending no ASKING, waits out
         * as a TRYAGAIN */
        tryagain_pause((unsigned)moved - 1);
      }
      refresh_now(s0, true);
      continue;
    }
    if (rc == TG__ETRYAGAIN && ++waits < MULTI_WAIT_MAX) {
      tg__fetch_add(&s0->st.ask, 1);
      tryagain_pause((unsigned)waits);
      continue;
    }
    if (rc == TG__EMOVED || rc == TG__ETRYAGAIN)
      return TG_ESTORE; /* the slot kept moving */
    if (rc == TG_ECONNECT || rc == TG_ETIMEDOUT)
      refresh_now(s0, false); /* the master may have failed over */
    return rc;
  }
}

static int cluster_exec_rules(tg__store *const *stores, const tg__call *calls,
                              size_t n, const bool *shadow, tg__outcome *o,
                              bool *passed, size_t *failed) {
  *passed = false;
  *failed = 0;
  multi_job j = {stores, calls, n, shadow, o, passed, failed};
  return multi_run(&j);
}

static int cluster_exec(tg__store *base, const tg__call *c, tg__outcome *o) {
  if (c->op == TG__OP_RESERVE || c->op == TG__OP_CANCEL) {
    tg__store *const stores[1] = {base};
    multi_job j = {stores, c, 1, NULL, o, NULL, NULL};
    return multi_run(&j);
  }
  if (c->op > TG__OP_EXPIRES)
    return TG_ENOTSUP; /* a policy's steps: cluster_exec_rules decides them */
  return exec_one(base, c, o);
}

/* FNV-1a over a string and a separator, for the ids below. */
static uint64_t mix(uint64_t h, const char *str) {
  for (; str && *str; str++)
    h = (h ^ (unsigned char)*str) * UINT64_C(0x100000001b3);
  return (h ^ 0xff) * UINT64_C(0x100000001b3);
}

/* Limiters on one Cluster (the same seed list) decide policies together;
 * their states are one space per key prefix and algorithm. */
static void cluster_ident(const tg__store *base, uint64_t group[2],
                          uint64_t space[2]) {
  static const char suffix[TG_ALGORITHM_COUNT][3] = {"fw", "pk", "sw", "tb",
                                                     "lb"};
  const cluster_store *s = (const cluster_store *)base;
  group[0] = mix(UINT64_C(0xcbf29ce484222325), s->seeds);
  group[1] = 3;
  space[0] = mix(mix(group[0], s->prefix), suffix[s->alg]);
  space[1] = 4;
}

static size_t cluster_zero(const tg__store *s) {
  (void)s;
  return 0;
}

void tg__redis_cluster_stats(const tg__store *base, tg_stats *st) {
  const cluster_store *s = (const cluster_store *)base;
  st->moved += tg__load_relaxed(&s->st.moved);
  st->ask += tg__load_relaxed(&s->st.ask);
  st->resent += tg__load_relaxed(&s->st.resent);
  st->slot_refreshes += tg__load_relaxed(&s->st.refreshes);
}

static void cluster_destroy(tg__store *base) {
  cluster_store *s = (cluster_store *)base;
  for (size_t i = 0; s->pool && i < s->npool; i++) {
    pooled *k = &s->pool[i];
    /* a child's copies of its parent's sockets are its own to close */
    for (uint32_t j = 0; k->fd && j < TG__NODES_MAX; j++)
      drop(k, j);
    tg__eng_free(&k->eng);
    free(k->fd);
    free(k->last_ms);
    free(k->pfd);
    free(k->who);
    pthread_mutex_destroy(&k->mu);
  }
  free(s->pool);
  free(s->health);
  for (uint32_t i = 0; s->nodes && i < TG__NODES_MAX; i++)
    if (s->nodes[i])
      s->nodes[i]->ops->destroy(s->nodes[i]);
  free(s->nodes);
  free(s->seeds);
  free(s->prefix);
  if (s->codec)
    s->codec->ops->destroy(s->codec);
  free(s->username);
  free(s->password);
  tg__slotmap_free(&s->map);
  free(s);
}

static const tg__store_ops cluster_ops = {
    .caps = TG__STORE_OWN_CLOCK | TG__STORE_RULES_WAIT,
    .exec = cluster_exec,
    .reset = cluster_reset,
    .key_count = cluster_zero, /* keys live in the cluster's nodes */
    .bytes = cluster_zero,
    .destroy = cluster_destroy,
    .exec_batch = cluster_exec_batch,
    .ident = cluster_ident,
    .exec_rules = cluster_exec_rules,
};

int tg__redis_cluster_new(tg__store **out, const tg_redis_config *rc,
                          tg_algorithm alg, uint32_t log_entries) {
  int bad = tg__redis_config_check(rc, true);
  if (bad != TG_OK)
    return bad;
  cluster_store *s = calloc(1, sizeof *s);
  if (!s)
    return TG_ENOMEM;
  if (tg__slotmap_init(&s->map) != TG_OK) {
    free(s);
    return TG_ENOMEM;
  }
  s->base.ops = &cluster_ops;
  s->connect_timeout_ms = rc->connect_timeout_ms;
  s->command_timeout_ms = rc->command_timeout_ms;
  s->backoff_ms = rc->reconnect_backoff_ms;
  int err = tg__cluster_seeds(&s->map, rc->cluster_nodes);
  if (err == TG_EINVAL)
    tg__error_set("invalid tg_redis_config: cluster_nodes must be 1..64 "
                  "comma-separated HOST:PORT");
  if (err == TG_OK)
    err = tg__redis_codec_new(&s->codec, rc->key_prefix, alg, log_entries);
  if (err == TG_OK &&
      ((rc->username && !(s->username = strdup(rc->username))) ||
       (rc->password && !(s->password = strdup(rc->password)))))
    err = TG_ENOMEM;
  if (err == TG_OK) {
    s->health = calloc(TG__NODES_MAX, sizeof *s->health);
    s->pool = calloc(rc->pool_size, sizeof *s->pool);
    s->nodes = calloc(TG__NODES_MAX, sizeof *s->nodes);
    s->seeds = strdup(rc->cluster_nodes);
    s->prefix = strdup(rc->key_prefix);
    if (!s->health || !s->pool || !s->nodes || !s->seeds || !s->prefix)
      err = TG_ENOMEM;
  }
  s->alg = alg;
  s->log_entries = log_entries;
  s->nrc = *rc;
  s->nrc.cluster_nodes = NULL;
  s->nrc.key_prefix = s->prefix;
  s->nrc.username = s->username;
  s->nrc.password = s->password;
  tg__eng_config ec = {s->codec, s->username, s->password, 0,
                       true,     &s->map,     &s->st};
  for (uint32_t i = 0; err == TG_OK && i < rc->pool_size; i++) {
    pooled *k = &s->pool[i];
    k->fd = malloc(TG__NODES_MAX * sizeof *k->fd);
    k->last_ms = calloc(TG__NODES_MAX, sizeof *k->last_ms);
    k->pfd = calloc(TG__NODES_MAX, sizeof *k->pfd);
    k->who = calloc(TG__NODES_MAX, sizeof *k->who);
    if (!k->fd || !k->last_ms || !k->pfd || !k->who ||
        pthread_mutex_init(&k->mu, NULL) != 0) {
      free(k->fd);
      free(k->last_ms);
      free(k->pfd);
      free(k->who);
      k->fd = NULL;
      k->last_ms = NULL;
      k->pfd = NULL;
      k->who = NULL;
      err = TG_ENOMEM;
      break;
    }
    for (uint32_t j = 0; j < TG__NODES_MAX; j++)
      k->fd[j] = -1;
    k->pid = getpid();
    s->npool = i + 1;
    err = tg__eng_init(&k->eng, &ec);
  }
  if (err != TG_OK) {
    cluster_destroy(&s->base);
    return err;
  }
  *out = &s->base;
  return TG_OK;
}
