/* SPDX-License-Identifier: MIT */
/*
 * store.h - the internal interface between the limiter and where key state
 * lives.
 *
 * The limiter validates input and prepares the quota; a store executes the
 * call. Stores that hold state locally run the pure steps of src/core on it
 * (so the arithmetic is written once); a remote store may run the same
 * arithmetic elsewhere, as long as the answers are identical.
 */
#ifndef TG_STORE_H
#define TG_STORE_H

#include "../core/core.h"

/* The table store's types, defined by its implementation (table.h): the
 * interface names them without depending on it. */
typedef struct tg__table tg__table;
typedef struct tg__table_params tg__table_params;

/* One entry handed to a cleaning callback: a key whose state decayed, as
 * the store saw it (slot, ctrl and the state words let a table store reclaim
 * it only if nothing changed since; other stores may leave them 0). */
typedef struct tg__clean_item {
  uint64_t slot;   /* where it was */
  uint64_t ctrl;   /* ctrl word observed */
  uint64_t w0, w1; /* state observed */
  uint64_t value;  /* what the entry reports as its value */
  uint64_t expired_at_ms;
  size_t key_len;
  unsigned char key[TG_KEY_MAX];
} tg__clean_item;

typedef void (*tg__clean_cb)(const tg__clean_item *items, size_t n, void *ctx);

typedef struct tg__store tg__store;

/* exec_policy: the optimistic protocol of a policy (rules.c) up to its
 * give-backs, in one store call. calls[i] are CHECKs on stores[i], all of
 * one kind; no rule's denial counts for the call when bit i of `shadow`
 * is set. The store
 *
 *   1. checks every rule in order, as exec would one by one, filling o[i]
 *      (a CHECK may leave o[i].peek to the limiter: tok->peek_owed), and
 *      stops at the first that fails. The last rule, when every other one
 *      allowed (or is in shadow mode), may be taken at once instead of
 *      checked (a TAKE, its answer in o[i], its peek owed, and nothing
 *      written when it denies), which saves it a second pass;
 *   2. once every rule was checked, sets `allowed`; if a rule outside
 *      `shadow` denied, stops: nothing was written;
 *   3. else takes each rule that allowed and was not taken yet, in order
 *      (calls[i].op becomes TG__OP_TAKE), until one fails or, outside
 *      `shadow`, denies (it lost a race). A TAKE that publishes what its
 *      CHECK computed sets tok->reused: its answer is the CHECK's. One that
 *      steps again sets bit i of `stepped`, its answer in took[i].
 *
 * It returns the failure's code or 0, with the marks below (zeroed by the
 * caller) filled as far as it went; the caller gives back what `taken`
 * says when the call is denied after all. */
typedef struct tg__policy_marks {
  uint32_t allowed; /* bit i: rule i allowed (set once all were checked) */
  uint32_t stepped; /* bit i: rule i's TAKE stepped again: see took[i] */
  uint32_t taken;   /* bit i: rule i consumed something */
  size_t at;        /* the rule it stopped at; n when none */
} tg__policy_marks;

/* What a store does differently, in tg__store_ops.caps. */
#define TG__STORE_OWN_CLOCK                                                    \
  1u /* decides on its own clock (Redis's TIME)                                \
        when the caller gives no now: the limiter                              \
        then reads none */
#define TG__STORE_RULES_WAIT                                                   \
  2u /* its exec_rules honours calls[i].wait_ns                                \
        (a rule's CHECK and TAKE admit that late,                              \
        o[i].value the delay) and fills the TAKEs'                             \
        tokens' receipts: tg_reserve_rules may use                             \
        it (without: TG_ENOTSUP) */

typedef struct tg__store_ops {
  unsigned caps; /* TG__STORE_* */
  /* Executes one validated call (op supported, quota prepared, now in
   * range). Returns 0 or a TG_E* code; on 0, *o holds the answer. */
  int (*exec)(tg__store *s, const tg__call *c, tg__outcome *o);
  /* Makes the key fresh; absent keys are not an error. */
  int (*reset)(tg__store *s, const void *key, size_t key_len);
  /* Keys currently holding state (0 when the store cannot tell). */
  size_t (*key_count)(const tg__store *s);
  /* One cleaning pass (NULL when the store expires keys by itself). It
   * ends early, with what it reclaimed so far, once halt (NULL: never) is
   * not 0: checked before each key and after each call of cb. */
  int (*clean)(tg__store *s, uint64_t now_us, uint64_t older_than_us,
               tg__clean_cb cb, void *ctx, const int *halt, size_t *removed);
  /* Bytes of memory reserved for state (0 when not in this process). */
  size_t (*bytes)(const tg__store *s);
  /* Frees everything. */
  void (*destroy)(tg__store *s);
  /* Executes n validated calls in order, as exec would one by one, filling
   * o[i] and rcs[i] (NULL: the limiter loops over exec). For stores where
   * doing them together saves round trips, or (the table) overlaps the
   * keys' cache misses. */
  void (*exec_batch)(tg__store *s, const tg__call *calls, size_t n,
                     tg__outcome *o, int *rcs);
  /* Which stores may decide a policy together, and which share state
   * (tg_hit_rules): stores of the same ops whose group ids are equal decide
   * rules together; two rules with equal keys on stores whose space ids are
   * equal name the same state. */
  void (*ident)(const tg__store *s, uint64_t group[2], uint64_t space[2]);
  /* Decides a policy at once (NULL: the limiter runs its optimistic
   * protocol over exec_policy, or exec's CHECK, TAKE and UNDO). calls[i] (CHECK
   * ops, each on stores[i], all of this kind and group) are checked together,
   * under whatever makes them atomic; the policy passes when every rule that is
   * not shadow[i] allows; then each rule that allowed consumes (as TAKE
   * would), and nothing is written otherwise. Fills o[i] as CHECK would
   * (r and peek) and *passed. On a failure returns its code with *failed
   * the rule's index, having written nothing. */
  int (*exec_rules)(tg__store *const *stores, const tg__call *calls, size_t n,
                    const bool *shadow, tg__outcome *o, bool *passed,
                    size_t *failed);
  /* The limiter's optimistic protocol up to its give-backs, in one call
   * (NULL: the limiter runs it over exec; see tg__policy_marks). */
  int (*exec_policy)(tg__store *const *stores, tg__call *calls, size_t n,
                     uint32_t shadow, tg__outcome *o, tg__outcome *took,
                     tg__policy_marks *pm);
} tg__store_ops;

/* Every store starts with this, so a tg__store * can point at any of them. */
struct tg__store {
  const tg__store_ops *ops;
};

/* The embedded memory store: the concurrent table in anonymous memory. */
int tg__memory_store_new(tg__store **out, const tg__table_params *p);

/* A store over table *t, whose region of `bytes` is mapped; the store takes
 * over the mapping and t->bk (both go when it is destroyed). */
int tg__table_store_wrap(tg__store **out, const tg__table *t, size_t bytes);

/* The shared-memory store: creates the named segment with *p, or attaches
 * to it (then *p must match what it was created with: TG_EMISMATCH). A
 * segment not owned by this user, not a regular file, or open beyond `mode`
 * is refused (TG_EPERM); tg_last_error says why any failure happened. */
int tg__shm_store_new(tg__store **out, const char *name, unsigned mode,
                      const tg__table_params *p);

/* The table in the caller's region of `size` bytes (tg_config.region):
 * initialised if it holds no table, attached if it holds one made with *p
 * (TG_EMISMATCH, TG_ECORRUPT otherwise, the region untouched). Destroying
 * the store leaves the region mapped and as it is. */
int tg__region_store_new(tg__store **out, void *mem, size_t size,
                         const tg__table_params *p);

/* The caller's store (glimit's Store): locking and bytes are theirs, the
 * arithmetic ours. */
int tg__custom_store_new(tg__store **out, const tg_custom_store *cs,
                         tg_algorithm alg, uint32_t log_entries);

/* The Redis store (redis.c, or redis_off.c when built without hiredis:
 * TG_ENOTSUP): one server, or with rc->cluster_nodes a Redis Cluster
 * (tg__redis_cluster_new). */
int tg__redis_store_new(tg__store **out, const tg_redis_config *rc,
                        tg_algorithm alg, uint32_t log_entries);

/* The Redis Cluster store (redis_cluster.c). */
int tg__redis_cluster_new(tg__store **out, const tg_redis_config *rc,
                          tg_algorithm alg, uint32_t log_entries);

/* Adds a Redis store's counters (MOVED, ASK...) to *st; nothing for the
 * one-server store, which keeps none. */
void tg__redis_stats(const tg__store *s, tg_stats *st);
void tg__redis_cluster_stats(const tg__store *s, tg_stats *st);

/* 1 when the Redis store is built in. */
int tg__redis_built(void);

#endif /* TG_STORE_H */
