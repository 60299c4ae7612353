/* SPDX-License-Identifier: MIT */
/*
 * redis_slots.h - where a key lives in a Redis Cluster: the hash slot of a
 * key name (CRC16 of its hash tag, modulo 16384), the map from slot to node
 * that CLUSTER SLOTS and MOVED replies teach, and the parsing of MOVED and
 * ASK redirections.
 *
 * The map is shared by every thread of a limiter (and every connection
 * engine in its pool), so one refresh serves all: lookups are lock-free
 * (one atomic load per slot; a node's address never changes once
 * published), changes take a mutex. Nodes are named by a small id that stays
 * valid for the map's life: connection pools index their per-node state by
 * it. A node that leaves the cluster keeps its id (its slots point
 * elsewhere); a map holds at most TG__NODES_MAX distinct addresses over its
 * life.
 */
#ifndef TG_STORE_REDIS_SLOTS_H
#define TG_STORE_REDIS_SLOTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TG__SLOTS 16384u
#define TG__NODES_MAX 1024u
/* Longest host name accepted (a DNS name is at most 253 bytes). */
#define TG__HOST_MAX 255u
/* No node: a slot nobody serves, or that the map has not learnt yet. */
#define TG__NO_NODE UINT32_MAX

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), Redis Cluster's. */
uint16_t tg__crc16(const void *data, size_t len);

/* The slot of a key name by Redis's rules: when the name has a "{" followed
 * later by a "}" with at least one byte between, only the bytes between the
 * first such pair are hashed, else the whole name. */
unsigned tg__key_slot(const void *name, size_t len);

/* A node's address: a host (numeric or a name) and a TCP port, or, for a
 * single server, a unix socket path (port 0). */
typedef struct tg__node {
  char *host; /* owned, NUL-terminated */
  int port;   /* 1..65535; 0: host is a unix socket path */
} tg__node;

typedef struct tg__slotmap {
  pthread_mutex_t mu; /* held to add a node or change slots */
  uint64_t nnodes;    /* nodes[0..nnodes) published (release) */
  tg__node nodes[TG__NODES_MAX];
  uint64_t slot[TG__SLOTS]; /* node id + 1 per slot, 0: none (atomic) */
  uint64_t epoch;           /* complete refreshes so far (atomic) */
} tg__slotmap;

/* An empty map (no node, no slot). TG_ENOMEM if the mutex cannot be made. */
int tg__slotmap_init(tg__slotmap *m);
void tg__slotmap_free(tg__slotmap *m);

/* The node of an address, added if new (host of host_len bytes). Returns
 * its id, or TG__NO_NODE when the table is full or memory runs out. */
uint32_t tg__slotmap_node(tg__slotmap *m, const char *host, size_t host_len,
                          int port);

/* Nodes published so far (ids 0..n-1). */
uint32_t tg__slotmap_count(const tg__slotmap *m);

/* The address of node id (< tg__slotmap_count). */
const tg__node *tg__slotmap_addr(const tg__slotmap *m, uint32_t id);

/* The node serving a slot, or TG__NO_NODE. */
uint32_t tg__slotmap_get(const tg__slotmap *m, unsigned slot);

/* What a MOVED reply says: the slot lives at node id from now on. */
void tg__slotmap_set(tg__slotmap *m, unsigned slot, uint32_t id);

/* Replaces the whole map: slot s is served by node ids[s] (TG__NO_NODE for
 * none); one mutex hold, then epoch moves on. */
void tg__slotmap_replace(tg__slotmap *m, const uint32_t *ids);

/* A redirection parsed from an error reply. */
typedef struct tg__redirect {
  bool ask;         /* ASK (one call, after ASKING) rather than MOVED */
  unsigned slot;    /* < TG__SLOTS */
  const char *host; /* into the reply's text; host_len 0: the node that
                       sent it (Redis 7 says ":port" when it does not
                       know the address clients use) */
  size_t host_len;
  int port;
} tg__redirect;

/* Parses "MOVED slot host:port" or "ASK slot host:port" (the host may be an
 * IPv6 address: the port follows the last colon). False when the text is
 * neither. */
bool tg__parse_redirect(const char *s, size_t len, tg__redirect *out);

/* Parses "host:port" or "[v6]:port" at s[0..len) into host/host_len (the
 * brackets dropped) and *port 1..65535. False when malformed. */
bool tg__parse_hostport(const char *s, size_t len, const char **host,
                        size_t *host_len, int *port);

/* Most seed nodes in a configuration. */
#define TG__SEEDS_MAX 64u

/* Adds the seed nodes of a configuration's list ("host:port" or
 * "[v6]:port", comma-separated, 1..TG__SEEDS_MAX of them, no empty item) to
 * an empty map as nodes 0... TG_EINVAL when malformed, TG_ENOMEM. */
int tg__cluster_seeds(tg__slotmap *m, const char *list);

#endif /* TG_STORE_REDIS_SLOTS_H */
