/* SPDX-License-Identifier: MIT */
/*
 * redis_cmd.h - one call as a Redis command, and a reply as the call's
 * answer: the per-command encoding that lives in redis.c, shared with the
 * connection engine (redis_engine.c) behind the non-blocking API and the
 * Cluster store, so every path sends the same bytes and computes every
 * number it reports with the same code.
 */
#ifndef TG_STORE_REDIS_CMD_H
#define TG_STORE_REDIS_CMD_H

#include "store.h"

#include <hiredis/hiredis.h>

#define TG__REDIS_PREFIX_MAX 128u
/* prefix ":{" key "}:" suffix */
#define TG__REDIS_NAME_MAX (TG__REDIS_PREFIX_MAX + 2 + TG_KEY_MAX + 2 + 2)
#define TG__REDIS_ARGS_MAX 12
#define TG__REDIS_NUMS_MAX 8

/* One command (EVALSHA or TG.STEP): argv with its own storage for the key
 * name and numbers. */
typedef struct tg__redis_args {
  int n;
  const char *v[TG__REDIS_ARGS_MAX];
  size_t len[TG__REDIS_ARGS_MAX];
  char name[TG__REDIS_NAME_MAX];
  char num[TG__REDIS_NUMS_MAX][24];
  int nnum;
} tg__redis_args;

/* Checks a tg_redis_config as tg_limiter_new takes it, for one server or
 * (cluster) for cluster_nodes: TG_EINVAL with tg_last_error naming the
 * field (cluster_nodes itself is parsed by tg__cluster_seeds), else
 * TG_OK. */
int tg__redis_config_check(const tg_redis_config *rc, bool cluster);

/* A Redis store used only for its key names and command encoding: it holds
 * no connection and must never execute a call. TG_EINVAL for a bad prefix
 * (1..128 bytes, no "{" or "}"), TG_ENOMEM. Destroy it with its ops. */
int tg__redis_codec_new(tg__store **out, const char *prefix, tg_algorithm alg,
                        uint32_t log_entries);

/* The command for call c on a connection with the module (TG.STEP) or
 * without (EVALSHA of sha, the script's 40-character SHA1). The arguments
 * point into *a and c->key: both must outlive their use. */
void tg__redis_encode(const tg__store *redis, const tg__call *c, bool module,
                      const char *sha, tg__redis_args *a);

/* The key name of call c (into name, TG__REDIS_NAME_MAX bytes); returns
 * its length: what a Cluster client hashes to route the call. */
size_t tg__redis_key_name(const tg__store *redis, const tg__call *c,
                          char *name);

/* The answer to call c from its reply: TG_OK with *o filled, or the code of
 * an error reply (TG_ECORRUPT, TG_ESTORE...), or TG_ESTORE for a reply that
 * is not the script's or the module's. The reply is only read: a view of a
 * reply (redisReply's fields) built by any reader will do. */
int tg__redis_decode(const tg__call *c, const redisReply *r, tg__outcome *o);

/* ---- a policy in one command (the non-blocking API's) ---- */

/* The policy command's arguments: EVALSHA sha numkeys keys... P now, then
 * 7 per rule, or TG.STEPS numkeys keys... now, then 7 per rule (8 when a
 * rule reserves). */
#define TG__REDIS_RULES_ARGC (5 + 9 * TG_RULES_MAX)

typedef struct tg__redis_rules_args {
  int n;
  const char *v[TG__REDIS_RULES_ARGC];
  size_t len[TG__REDIS_RULES_ARGC];
  char num[2 + 8 * TG_RULES_MAX][24];
} tg__redis_rules_args;

typedef struct tg__redis_rules tg__redis_rules;

/* A policy of calls[0..n) (CHECKs, n <= TG_RULES_MAX; calls[0]'s now and
 * store_time are the policy's), rule i named and sized by codecs[i] (a
 * tg__redis_codec_new store), shadow[i]: rule i's denial does not deny.
 * Copies everything but the keys' bytes (read until freed). TG_EINVAL,
 * TG_ENOMEM. */
int tg__redis_rules_new(tg__redis_rules **out, const tg__store *const *codecs,
                        const tg__call *calls, size_t n, const bool *shadow);
void tg__redis_rules_free(tg__redis_rules *x);

/* The hash slot of rule i's key name. */
unsigned tg__redis_rules_slot(const tg__redis_rules *x, size_t i);

/* Whether rules i and j name the same Redis key. */
bool tg__redis_rules_same_key(const tg__redis_rules *x, size_t i, size_t j);
/* Whether a rule waits (a policy of reservations: TG.STEPS then carries
 * the waits). */
bool tg__redis_rules_wait(const tg__redis_rules *x);

/* Whether rule i's value may be longer than a RESP reader keeps by default
 * (a sliding log: any length a client's sliding_max_entries allows). */
bool tg__redis_rules_long_value(const tg__redis_rules *x, size_t i);

/* The command, valid until the next call on x: the module's TG.STEPS, or
 * the script's P run by its SHA1 (sha). */
const tg__redis_rules_args *
tg__redis_rules_encode(tg__redis_rules *x, bool module, const char *sha);

/* Decides on the command's reply r as the blocking store does (every
 * number from this process's core, the server's verdict checked): TG_OK
 * with the outcomes (tg__redis_rules_outcomes) or a code (TG_ECORRUPT: at
 * rule *failed). */
int tg__redis_rules_decode(tg__redis_rules *x, const redisReply *r);
const tg__outcome *tg__redis_rules_outcomes(const tg__redis_rules *x,
                                            bool *passed, size_t *failed);

/* Internal codes of a Cluster node's store (tg__redis_node_new), never
 * returned to a caller: the Cluster store acts on them. */
#define TG__EMOVED                                                             \
  (-100) /* MOVED or CLUSTERDOWN: nothing ran; refresh                         \
            the slot map and try again */
#define TG__ETRYAGAIN                                                          \
  (-101) /* ASK or TRYAGAIN: the slot is migrating;                            \
            nothing ran, try again shortly */

/* How often a policy whose slot is being migrated (its keys split between
 * two nodes: TRYAGAIN) is tried again before it is answered TG_ESTORE, and
 * the pause before try w (from 1): 2^w ms up to 32, then 50 ms, about 1.8 s
 * in all, which covers a MIGRATE of the slot's remaining keys. Both Cluster
 * drivers use it: the blocking store sleeps, the non-blocking API asks its
 * caller for a timer (tg_nb_timeout). */
#define TG__TRYAGAIN_WAITS 40
static inline unsigned tg__tryagain_pause_ms(unsigned w) {
  return w < 6 ? 1u << w : 50u;
}

/* A one-server store (rc->cluster_nodes must be NULL) for one node of a
 * Cluster: the policies and reservations (several commands on one
 * connection) of the Cluster store go through it. Errors as
 * tg__redis_store_new. */
int tg__redis_node_new(tg__store **out, const tg_redis_config *rc,
                       tg_algorithm alg, uint32_t log_entries);

#endif /* TG_STORE_REDIS_CMD_H */
