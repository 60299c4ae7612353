/* SPDX-License-Identifier: MIT */
/*
 * redis_engine.h - the Redis protocol as a state machine without I/O: calls
 * in, bytes out, bytes in, answers out. One engine speaks to every node of a
 * server or a Cluster over one logical connection per node (a "link"); it
 * never touches a socket, a clock or a thread. Whoever drives it owns the
 * sockets and the time: the public non-blocking API (src/nb.c, for event
 * loops) and the Cluster store's blocking pool (redis_cluster.c, poll(2))
 * are its two drivers.
 *
 * What it does for them:
 *   - routes each call to its node: one server, or in a Cluster the node
 *     of the call's hash slot in a shared slot map (redis_slots.h); calls
 *     for a slot the map does not know wait ("parked") for a refresh;
 *   - opens each link with the handshake (AUTH, SELECT, COMMAND INFO
 *     TG.STEP to find the module, SCRIPT LOAD), then pipelines calls, in
 *     order, into the link's output buffer as room allows;
 *   - reads replies in any split and matches them, in order, to what was
 *     sent; answers calls with the same decoding as the blocking store;
 *   - follows what says a call did not run: NOSCRIPT and a vanished
 *     module (reload, resend), MOVED (the slot moved: update the map, resend
 *     there), ASK (resend once to the named node after ASKING), each call at
 *     most TG__REDIRECTS_MAX times; a MOVED back to the node whose MOVED
 *     sent the call away (a migration's end told the source before the
 *     destination, which, still importing, names the source) is resent
 *     there after ASKING, which the importing one of the two serves; a
 *     policy told TRYAGAIN (its keys split by a migration) is answered
 *     TG__ETRYAGAIN, for its driver to wait and submit it again (nb.c
 *     does; the blocking pool sends no policy);
 *   - on a lost connection, tells calls apart by whether all of their bytes
 *     were written: a call written in full may have run and is answered
 *     with the loss's code, never resent; any other call did not reach the
 *     server and waits for the next connection.
 * What it leaves to the driver: connecting (and when to give up), timeouts,
 * when a node counts as down and for how long, and when to refresh the map.
 *
 * Memory: an engine allocates its links (once per node it meets, with an
 * output buffer allocated at the link's first connect and kept) and, for a
 * Cluster, a 64 KiB scratch map for refreshes at init. A call allocates
 * nothing: its tg__ereq is the driver's, and replies are decoded in the
 * link's fixed storage.
 */
#ifndef TG_STORE_REDIS_ENGINE_H
#define TG_STORE_REDIS_ENGINE_H

#include "redis_cmd.h"
#include "redis_resp.h"
#include "redis_slots.h"

/* Redirections (MOVED, ASK) and resends after "did not run" one call may
 * follow before it is answered TG_ESTORE: enough for a slot that moves
 * while the call chases it, not a loop. */
#define TG__REDIRECTS_MAX 8

/* What a link asks of its driver (tg__eng_wants). */
enum {
  TG__WANT_CONNECT = 1, /* no connection, and something to send */
  TG__WANT_WRITE = 2,   /* bytes to write (tg__eng_output) */
  TG__WANT_READ = 4     /* replies due (feed them to tg__eng_input) */
};

/* Kinds of what a link sends, in its send order. */
enum {
  TG__EK_CALL = 0,
  TG__EK_AUTH,
  TG__EK_SELECT,
  TG__EK_INFO,
  TG__EK_LOAD,
  TG__EK_RELOAD,
  TG__EK_SLOTS
};

/* One element of a link's send order. */
typedef struct tg__eitem {
  struct tg__eitem *next;
  uint64_t end; /* stream offset just past its last byte, once encoded */
  int kind;     /* TG__EK_* */
} tg__eitem;

/* One call through the engine: the driver's memory, untouched by the
 * engine between tg__eng_submit and the moment tg__eng_done returns it. */
typedef struct tg__ereq {
  tg__eitem it; /* first member: the engine links calls through it */
  tg__call call;
  uint32_t node;     /* the node it is queued on, or was sent to */
  uint16_t slot;     /* its hash slot (Cluster) */
  uint32_t moved_by; /* the node whose MOVED last sent it away, or
                        TG__NO_NODE */
  uint8_t asking;    /* an ASK sent it here: ASKING goes first */
  uint8_t asked;     /* ASKING's reply is due before the call's own */
  uint64_t ask_end;  /* with asked: stream offset just past ASKING (its
                        reply is due once that much is written) */
  uint8_t redirects;
  uint8_t parked; /* waiting for the slot map */
  uint8_t cut;    /* a connection was lost while it was being written: it
                     counts in resent when it is sent again */
  uint8_t del;    /* not the call's command but DEL of its key (a reset):
                     status TG_OK, out unused */
  uint8_t module; /* last sent as the module's command (else the script's):
                     what its error replies mean */
  tg__redis_rules *rules; /* not NULL: not the call's command but this
                             policy's (call: its first rule, for routing);
                             out unused, the outcomes are the policy's */
  int status;             /* once done: TG_OK or a TG_E* code */
  tg__outcome out;
  void *owner; /* the driver's */
} tg__ereq;

/* Counters the engine adds to (atomically: a pool's engines share them). */
typedef struct tg__eng_stats {
  uint64_t moved;     /* MOVED replies followed */
  uint64_t ask;       /* ASK replies followed */
  uint64_t resent;    /* calls sent again because they did not run
                         (NOSCRIPT, the module gone, a connection lost
                         before the call was written in full) */
  uint64_t refreshes; /* slot maps received (CLUSTER SLOTS) */
} tg__eng_stats;

typedef struct tg__eng_config {
  const tg__store *codec; /* names and encoding (redis_cmd.h) */
  const char *username;   /* AUTH user, or NULL */
  const char *password;   /* AUTH password, or NULL: no AUTH */
  int db;                 /* SELECTed when not 0 (never in a Cluster) */
  bool cluster;           /* route by slot, follow MOVED and ASK */
  tg__slotmap *map;       /* a Cluster's map (may be shared), or for one
                             server a map whose node 0 is the server */
  tg__eng_stats *stats;   /* where to count */
} tg__eng_config;

typedef struct tg__elink tg__elink;

typedef struct tg__eng {
  tg__eng_config cfg;
  tg__elink **links; /* per node id, NULL until the node is used */
  tg__eitem *done_head, *done_tail;
  tg__ereq *parked_head, *parked_tail; /* linked through it.next */
  uint32_t *ids;         /* a refresh's map being read (Cluster) */
  uint32_t refresh_node; /* the node a refresh was sent to, or NO_NODE */
  bool want_refresh;     /* something suggests the map is stale */
  size_t pending;        /* calls submitted and not yet returned done */
} tg__eng;

int tg__eng_init(tg__eng *e, const tg__eng_config *cfg);
void tg__eng_free(tg__eng *e);

/* Routes call r (its call filled; the rest is the engine's) and queues it.
 * It comes back through tg__eng_done, possibly at once. */
void tg__eng_submit(tg__eng *e, tg__ereq *r);

/* The next call answered (status and out set), or NULL. */
tg__ereq *tg__eng_done(tg__eng *e);

/* Node ids in use: links 0..n-1 may exist (the map's node count). */
uint32_t tg__eng_nodes(const tg__eng *e);

/* TG__WANT_* bits for node id's link. */
unsigned tg__eng_wants(const tg__eng *e, uint32_t id);

/* The driver connected node id's socket: the handshake is queued.
 * TG_ENOMEM if its output buffer cannot be had (then it stays closed). */
int tg__eng_connected(tg__eng *e, uint32_t id);

/* The bytes to write next on node id's socket (*len 0: none). */
void tg__eng_output(tg__eng *e, uint32_t id, const char **data, size_t *len);

/* n of those bytes were written (handed to the kernel). */
void tg__eng_written(tg__eng *e, uint32_t id, size_t n);

/* Bytes read from node id's socket. TG_OK; TG_EINVAL, nothing done, when
 * the link has no open connection; or TG_ESTORE when they are not a
 * valid reply to what was sent, or the handshake was refused (AUTH, SELECT,
 * SCRIPT LOAD): the engine has then closed the link as tg__eng_closed
 * would (calls written in full answered TG_ESTORE), and the driver must
 * close the socket. */
int tg__eng_input(tg__eng *e, uint32_t id, const char *data, size_t len);

/* Node id's connection is gone (EOF, error, the driver's timeout): calls
 * written in full are answered `code`; the others, and the engine's own
 * commands, wait for the next connection. */
void tg__eng_closed(tg__eng *e, uint32_t id, int code);

/* Answers `code` to every call waiting to be sent to node id (the driver
 * decided the node cannot be reached now). A map refresh queued there is
 * dropped. */
void tg__eng_fail_queued(tg__eng *e, uint32_t id, int code);

/* Answers `code` to every parked call (no node can be asked for a map). */
void tg__eng_fail_parked(tg__eng *e, int code);

/* Whether a map refresh is wanted and none is in flight. */
bool tg__eng_refresh_wanted(const tg__eng *e);

/* Queues CLUSTER SLOTS on node id's link (connecting it if needed). False
 * when a refresh is already in flight or id is not a node. */
bool tg__eng_refresh(tg__eng *e, uint32_t id);

/* The node a refresh is in flight on, or TG__NO_NODE. */
uint32_t tg__eng_refreshing(const tg__eng *e);

/* Calls parked, waiting for a map. */
bool tg__eng_parked(const tg__eng *e);

/* Whether node id's link has a connection (handshake or ready). */
bool tg__eng_open(const tg__eng *e, uint32_t id);

/* Whether node id's link has anything sent and unanswered or not yet sent
 * (the driver waits for it before it lets the engine go). */
bool tg__eng_busy(const tg__eng *e, uint32_t id);

/* Forgets every connection without answering anything (after fork(): the
 * sockets belong to the parent). Only when no call is pending. */
void tg__eng_reset(tg__eng *e);

#endif /* TG_STORE_REDIS_ENGINE_H */
