/* SPDX-License-Identifier: MIT */
/*
 * tollgate.c - the limiter: validates input, prepares the quota, reads the
 * clock once, hands the call to the store, and turns store failures into the
 * answer the configured policy asks for.
 */
#include "tollgate.h"

#include "atomic.h"
#include "error.h"
#include "limiter.h"
#include "store/table.h" /* the parameters of a table store */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define STR2(x) #x
#define STR(x) STR2(x)

unsigned tg_version(void) { return TG_VERSION_HEX; }

const char *tg_version_string(void) {
  return STR(TG_VERSION_MAJOR) "." STR(TG_VERSION_MINOR) "." STR(
      TG_VERSION_PATCH);
}

#define SLIDING_MAX_DEFAULT 1024u
#define CAPACITY_DEFAULT 65536u
#define CLEAN_PERIOD_DEFAULT_MS 60000u
#define KEY_OLDER_THAN_DEFAULT_MS UINT64_C(86400000)
#define LOCK_TIMEOUT_DEFAULT_MS 2000u
#define LOCK_TIMEOUT_LIMIT_MS 3600000u
#define FALLBACK_SHARE_LIMIT 65536u
#define DENY_CACHE_LIMIT (UINT64_C(1) << 24)

void tg_config_init(tg_config *cfg) {
  if (!cfg)
    return;
  cfg->algorithm = TG_FIXED_WINDOW;
  cfg->clock = tg_clock_realtime;
  cfg->clock_ctx = NULL;
  cfg->on_failure = TG_POLICY_FAIL_OPEN;
  cfg->sliding_max_entries = SLIDING_MAX_DEFAULT;
  cfg->capacity = CAPACITY_DEFAULT;
  cfg->long_keys = 0;
  cfg->clean_period_ms = CLEAN_PERIOD_DEFAULT_MS;
  cfg->key_older_than_ms = KEY_OLDER_THAN_DEFAULT_MS;
  cfg->before_clean = NULL;
  cfg->before_clean_ctx = NULL;
  cfg->custom_store = NULL;
  cfg->shm_name = NULL;
  cfg->shm_mode = 0600;
  cfg->lock_timeout_ms = LOCK_TIMEOUT_DEFAULT_MS;
  cfg->on_full = TG_FULL_REFUSE;
  cfg->redis = NULL;
  cfg->shadow = false;
  cfg->on_decision = NULL;
  cfg->on_decision_ctx = NULL;
  cfg->on_decision_every = 1;
  cfg->on_decision_denied_only = false;
  cfg->region = NULL;
  cfg->region_bytes = 0;
  cfg->fallback_share = 1;
  cfg->deny_cache_entries = 0;
}

void tg_redis_config_init(tg_redis_config *rc) {
  if (!rc)
    return;
  rc->host = "127.0.0.1";
  rc->port = 6379;
  rc->unix_path = NULL;
  rc->username = NULL;
  rc->password = NULL;
  rc->db = 0;
  rc->connect_timeout_ms = 1000;
  rc->command_timeout_ms = 1000;
  rc->reconnect_backoff_ms = 100;
  rc->pool_size = 4;
  rc->key_prefix = "tg";
  rc->cluster_nodes = NULL;
}

_Thread_local tg__quota_memo tg__memo TG__TLS_FAST;

int tg_redis_available(void) { return tg__redis_built(); }

/* Checks *cfg; on failure says which field in tg_last_error. */
static bool config_valid(const tg_config *cfg) {
  const char *bad = NULL;
  if ((unsigned)cfg->algorithm >= TG_ALGORITHM_COUNT)
    bad = "algorithm is not a tg_algorithm";
  else if (cfg->on_failure != TG_POLICY_ERROR &&
           cfg->on_failure != TG_POLICY_FAIL_OPEN &&
           cfg->on_failure != TG_POLICY_FAIL_CLOSED &&
           cfg->on_failure != TG_POLICY_FALLBACK)
    bad = "on_failure is not a tg_policy";
  else if (cfg->fallback_share < 1 ||
           cfg->fallback_share > FALLBACK_SHARE_LIMIT)
    bad = "fallback_share outside 1..65536";
  else if (cfg->deny_cache_entries > DENY_CACHE_LIMIT)
    bad = "deny_cache_entries above 2^24";
  else if (cfg->on_full != TG_FULL_REFUSE && cfg->on_full != TG_FULL_EVICT)
    bad = "on_full is not a tg_full";
  else if ((cfg->custom_store != NULL) + (cfg->shm_name != NULL) +
               (cfg->redis != NULL) + (cfg->region != NULL) >
           1)
    bad = "more than one of custom_store, shm_name, redis and region";
  else if (cfg->shm_mode & ~0777u)
    bad = "shm_mode has bits beyond 0777";
  else if (cfg->lock_timeout_ms > LOCK_TIMEOUT_LIMIT_MS)
    bad = "lock_timeout_ms above 3600000 (one hour)";
  else if (cfg->custom_store &&
           (!cfg->custom_store->lock_and_get ||
            !cfg->custom_store->set_and_unlock || !cfg->custom_store->unlock))
    bad = "custom_store lacks one of its three callbacks";
  else if (cfg->clock == NULL)
    bad = "clock is NULL";
  else if (cfg->sliding_max_entries < 1 ||
           cfg->sliding_max_entries > TG_SLIDING_ENTRIES_MAX)
    bad = "sliding_max_entries outside 1..2^24";
  else if (cfg->capacity < 1 || cfg->capacity > TG_CAPACITY_MAX)
    bad = "capacity outside 1..2^40";
  else if (cfg->long_keys > cfg->capacity)
    bad = "long_keys above capacity";
  if (bad)
    tg__error_set("invalid tg_config: %s", bad);
  return bad == NULL;
}

/* A portable shm name: "/" then 1..254 bytes with no further "/" (glibc's
 * shm_unlink reports ENOENT for names it cannot form, so check here). */
static bool shm_name_ok(const char *name) {
  if (!name || name[0] != '/' || name[1] == '\0')
    return false;
  size_t n = strlen(name);
  return n <= 255 && strchr(name + 1, '/') == NULL;
}

/* The table a memory, shm or region store holds for *cfg. */
static tg__table_params table_params(const tg_config *cfg) {
  tg__table_params p = {cfg->algorithm,
                        cfg->capacity,
                        cfg->long_keys ? cfg->long_keys : cfg->capacity,
                        cfg->sliding_max_entries,
                        false,
                        cfg->lock_timeout_ms,
                        cfg->on_full == TG_FULL_EVICT};
  return p;
}

size_t tg_region_bytes(const tg_config *cfg) {
  if (!cfg || (unsigned)cfg->algorithm >= TG_ALGORITHM_COUNT ||
      cfg->capacity < 1 || cfg->capacity > TG_CAPACITY_MAX ||
      cfg->long_keys > cfg->capacity || cfg->sliding_max_entries < 1 ||
      cfg->sliding_max_entries > TG_SLIDING_ENTRIES_MAX)
    return 0;
  tg__table_params p = table_params(cfg);
  p.shared = true;
  return tg__table_bytes(&p);
}

static int store_new(tg_limiter *lim) {
  const tg_config *cfg = &lim->cfg;
  if (cfg->redis)
    return tg__redis_store_new(&lim->store, cfg->redis, cfg->algorithm,
                               cfg->sliding_max_entries);
  if (cfg->custom_store) /* the store keeps the one copy of the callbacks */
    return tg__custom_store_new(&lim->store, cfg->custom_store, cfg->algorithm,
                                cfg->sliding_max_entries);
  tg__table_params p = table_params(cfg);
  if (cfg->region)
    return tg__region_store_new(&lim->store, cfg->region, cfg->region_bytes,
                                &p);
  if (cfg->shm_name && !shm_name_ok(cfg->shm_name)) {
    tg__error_set("invalid tg_config: shm_name is not \"/\" then 1..254 "
                  "bytes without \"/\"");
    return TG_EINVAL;
  }
  if (cfg->shm_name)
    return tg__shm_store_new(&lim->store, cfg->shm_name, cfg->shm_mode, &p);
  return tg__memory_store_new(&lim->store, &p);
}

/* What a limiter has besides its store: the fallback's memory store and
 * the deny cache, each only when configured. */
static int extras_new(tg_limiter *lim) {
  const tg_config *cfg = &lim->cfg;
  int rc = TG_OK;
  if (cfg->on_failure == TG_POLICY_FALLBACK) {
    /* in this process's memory, whatever the limiter's own store */
    tg__table_params p = table_params(cfg);
    rc = tg__memory_store_new(&lim->fallback, &p);
  }
  if (rc == TG_OK && cfg->deny_cache_entries > 0)
    rc = tg__deny_cache_new(&lim->deny, cfg->deny_cache_entries);
  return rc;
}

static void limiter_free(tg_limiter *lim) {
  if (lim->store)
    lim->store->ops->destroy(lim->store);
  if (lim->fallback)
    lim->fallback->ops->destroy(lim->fallback);
  tg__deny_cache_free(lim->deny);
  tg__stats_free(lim->stats);
  free(lim);
}

/* tg_limiter_new, or without a store (`shell`) for the non-blocking API,
 * which keeps its connections itself. */
static int limiter_new(tg_limiter **out, const tg_config *cfg, bool shell) {
  tg__error_clear();
  if (!out) {
    tg__error_set("out is NULL");
    return TG_EINVAL;
  }
  *out = NULL;
  tg_config defaults;
  if (!cfg) {
    tg_config_init(&defaults);
    cfg = &defaults;
  }
  if (!config_valid(cfg))
    return TG_EINVAL;
  tg_limiter *lim = calloc(1, sizeof *lim);
  if (!lim) {
    tg__error_set("out of memory");
    return TG_ENOMEM;
  }
  lim->cfg = *cfg;
  lim->shadow = cfg->shadow;
  lim->hook = cfg->on_decision != NULL;
  lim->quiet = !lim->shadow && !lim->hook;
  lim->stats = tg__stats_new();
  if (!lim->stats) {
    free(lim);
    tg__error_set("out of memory");
    return TG_ENOMEM;
  }
  lim->bridge = (tg__clean_bridge){cfg->algorithm, cfg->before_clean,
                                   cfg->before_clean_ctx};
  int rc = TG_OK;
  if (shell) {
    lim->store_time = true; /* the non-blocking API decides on Redis's time */
  } else {
    rc = store_new(lim);
    if (rc == TG_OK)
      lim->store_time = (lim->store->ops->caps & TG__STORE_OWN_CLOCK) != 0;
  }
  lim->cfg.redis = NULL; /* the caller's structs may go away now */
  lim->cfg.custom_store = NULL;
  if (rc == TG_OK)
    rc = extras_new(lim);
  if (rc == TG_OK && lim->store && lim->store->ops->ident) {
    lim->store->ops->ident(lim->store, lim->group, lim->space);
    lim->ident_ok = true;
  }
  lim->plain_rules = rc == TG_OK && lim->quiet && !lim->deny && lim->ident_ok &&
                     lim->store && !lim->store->ops->exec_rules &&
                     lim->store->ops->exec_policy;
  if (rc == TG_OK && lim->store && lim->store->ops->clean &&
      cfg->clean_period_ms > 0)
    rc = tg__cleaner_start(&lim->cleaner, lim, cfg->clean_period_ms,
                           limiter_free);
  if (rc != TG_OK) {
    limiter_free(lim);
    if (!tg__error_isset()) /* the store had nothing more precise to say */
      tg__error_set("%s", tg_strerror(rc));
    return rc;
  }
  *out = lim;
  return TG_OK;
}

int tg_limiter_new(tg_limiter **out, const tg_config *cfg) {
  return limiter_new(out, cfg, false);
}

int tg__limiter_shell_new(tg_limiter **out, const tg_config *cfg) {
  return limiter_new(out, cfg, true);
}

void tg_limiter_destroy(tg_limiter *lim) {
  if (!lim)
    return;
  if (tg__cleaner_defer(lim->cleaner)) {
    /* from the cleaning thread's before_clean: the pass ends without
     * calling it again (its ctx may go as this returns), then the thread
     * frees the limiter */
    lim->bridge.fn = NULL;
    return;
  }
  tg__cleaner_stop(lim->cleaner);
  limiter_free(lim);
}

size_t tg_key_count(const tg_limiter *lim) {
  return lim ? lim->store->ops->key_count(lim->store) : 0;
}

size_t tg_store_bytes(const tg_limiter *lim) {
  return lim ? lim->store->ops->bytes(lim->store) : 0;
}

static int clean(tg_limiter *lim, const uint64_t *now, const int *halt,
                 size_t *removed) {
  size_t n = 0;
  if (removed)
    *removed = 0;
  if (!lim)
    return TG_EINVAL;
  if (!lim->store->ops->clean)
    return TG_ENOTSUP;
  uint64_t now_us = now ? *now : lim->cfg.clock(lim->cfg.clock_ctx);
  if (now_us > TG_NOW_MAX_US)
    return TG_ETIME;
  uint64_t older_us;
  if (!tg__mul(lim->cfg.key_older_than_ms, 1000, &older_us))
    older_us = UINT64_MAX;
  int rc = lim->store->ops->clean(lim->store, now_us, older_us,
                                  tg__clean_bridge_cb, &lim->bridge, halt, &n);
  if (removed)
    *removed = n;
  if (n > 0)
    __atomic_fetch_add(&lim->stats->shard[TG__SHARDS].n[TG__N_RECLAIMED], n,
                       __ATOMIC_RELAXED);
  return rc;
}

int tg_clean(tg_limiter *lim, size_t *removed) {
  return clean(lim, NULL, NULL, removed);
}

int tg_clean_at(tg_limiter *lim, uint64_t now_us, size_t *removed) {
  return clean(lim, &now_us, NULL, removed);
}

int tg__clean_pass(tg_limiter *lim, const int *halt) {
  return clean(lim, NULL, halt, NULL);
}

/* One operation: prepare, then the store call. */
static int run(tg_limiter *lim, tg__op op, const uint64_t *now, const void *key,
               size_t key_len, const tg_quota *q, uint64_t arg,
               tg__outcome *o) {
  tg__call c;
  int rc = tg__limiter_prepare(lim, op, now, key, key_len, q, arg, &c);
  if (rc != TG_OK)
    return rc;
  return lim->store->ops->exec(lim->store, &c, o);
}

bool tg__store_failure(int rc) {
  return rc == TG_ENOMEM || rc == TG_EFULL || rc == TG_ESTORE ||
         rc == TG_EBUSY || rc == TG_ECORRUPT || rc == TG_ECONNECT ||
         rc == TG_ETIMEDOUT;
}

static uint64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t tg__limiter_when(const tg_limiter *lim, const tg__call *c) {
  return lim->deny ? c->store_time ? mono_us() : c->now_us : 0;
}

bool tg__limiter_cached(tg_limiter *lim, const tg__call *c, uint64_t when,
                        const tg_quota *q, tg_result *out) {
  if (!lim->deny || !tg__deny_cache_get(lim->deny, c, c->store_time, when, out))
    return false;
  bool own;
  /* own is set by the call: not within one expression that reads it */
  tg__shard *sh = tg__shard_get(lim->stats, &own);
  tg__count(sh, own, TG__N_CACHE);
  tg__limiter_done(lim, TG_OK, out, lim->shadow, c->key, c->key_len, q, c->arg,
                   false);
  return true;
}

/* TG_POLICY_FALLBACK: call c decided by the local memory store, alone,
 * under 1/fallback_share of its quota q, on this host's clock when the
 * call was on the store's. False when the local store cannot decide. */
static bool fallback(const tg_limiter *lim, const tg__call *c,
                     const tg_quota *q, tg_result *out) {
  uint32_t share = lim->cfg.fallback_share;
  bool bucket = c->alg == TG_TOKEN_BUCKET || c->alg == TG_LEAKY_BUCKET;
  tg_quota lq = {q->limit / share, q->period_ms,
                 bucket ? c->q.burst / share : 0};
  tg__call lc = *c; /* a TAKE (tg_nb's TG_NB_RULE) has no token: the
                       table runs it as a plain step */
  if (lq.limit == 0 || (bucket && lq.burst == 0) ||
      tg__quota_prepare(&lc.q, &lq, c->alg) != TG_OK) {
    /* this host's share is below one call: it may admit nothing */
    *out = (tg_result){0};
    out->retry_after_ms = q->period_ms;
  } else {
    if (lc.store_time) {
      lc.now_us = lim->cfg.clock(lim->cfg.clock_ctx);
      lc.store_time = false;
      if (lc.now_us > TG_NOW_MAX_US)
        return false;
    }
    tg__outcome o;
    if (lim->fallback->ops->exec(lim->fallback, &lc, &o) != TG_OK)
      return false;
    *out = o.r;
  }
  out->degraded = true;
  bool own;
  tg__shard *sh = tg__shard_get(lim->stats, &own);
  tg__count(sh, own, TG__N_FALLBACK);
  return true;
}

/* The result written when a hit fails: the policy's answer for a store
 * failure (c, the call, may be NULL when it was never built: then
 * TG_POLICY_FALLBACK answers as TG_POLICY_FAIL_OPEN), "not allowed, never"
 * for invalid input. */
static void failure_result(const tg_limiter *lim, int rc, const tg__call *c,
                           const tg_quota *q, tg_result *out) {
  *out = (tg_result){0};
  out->retry_after_ms = TG_NEVER;
  if (!lim || !q || !tg__store_failure(rc))
    return;
  out->degraded = true;
  switch (lim->cfg.on_failure) {
  case TG_POLICY_FALLBACK:
    if (c && lim->fallback && fallback(lim, c, q, out))
      break;
    /* the local store could not decide either: as FAIL_OPEN */
    out->allowed = true;
    out->retry_after_ms = 0;
    break;
  case TG_POLICY_FAIL_OPEN:
    out->allowed = true;
    out->retry_after_ms = 0;
    break;
  case TG_POLICY_FAIL_CLOSED:
    out->retry_after_ms = q->period_ms;
    break;
  case TG_POLICY_ERROR:
    break;
  }
}

int tg__limiter_answer(tg_limiter *lim, const tg__call *c, const tg_quota *q,
                       uint64_t when, int rc, const tg__outcome *o,
                       tg_result *out) {
  if (rc == TG_OK) {
    *out = o->r;
    if (lim->deny) {
      if (c->op == TG__OP_TAKE && out->allowed)
        /* a one-rule policy's write (tg_nb's TG_NB_RULE on a window), which
         * reads no cache: maybe under another period, so the key's cached
         * denial may no longer hold, as after tg_hit_rules (rules.c) */
        tg__deny_cache_forget(lim->deny, c->key, c->key_len);
      else
        tg__deny_cache_put(lim->deny, c, c->store_time, when, out);
    }
  } else {
    failure_result(lim, rc, c, q, out);
  }
  tg__limiter_done(lim, rc, out, lim->shadow, c->key, c->key_len, q, c->arg,
                   false);
  return rc;
}

void tg__limiter_failure(const tg_limiter *lim, int rc, const tg_quota *q,
                         tg_result *out) {
  failure_result(lim, rc, NULL, q, out);
}

void tg__limiter_invalid(tg_limiter *lim, int rc, const void *key,
                         size_t key_len, const tg_quota *q, uint64_t cost,
                         tg_result *out) {
  failure_result(lim, rc, NULL, q, out);
  if (lim)
    tg__limiter_done(lim, rc, out, lim->shadow, key, key_len, q, cost, false);
}

static inline __attribute__((always_inline)) int
hit(tg_limiter *lim, const uint64_t *now, const void *key, size_t key_len,
    const tg_quota *q, uint64_t cost, tg_result *out) {
  if (__builtin_expect(!out, 0)) {
    /* refused, and counted and hooked as any refused input is (the hook
     * sees the failure policy's answer, which is not written anywhere) */
    tg_result none;
    tg__limiter_invalid(lim, TG_EINVAL, key, key_len, q, cost, &none);
    return TG_EINVAL;
  }
  tg__call c;
  int rc = tg__limiter_prepare(lim, TG__OP_HIT, now, key, key_len, q, cost, &c);
  if (rc != TG_OK) {
    tg__limiter_invalid(lim, rc, key, key_len, q, cost, out);
    return rc;
  }
  tg__outcome o;
  if (__builtin_expect(!lim->deny, 1)) {
    /* no deny cache: the store's answer as it is, counted inline */
    rc = lim->store->ops->exec(lim->store, &c, &o);
    if (__builtin_expect(rc == TG_OK, 1)) {
      *out = o.r;
      tg__limiter_done(lim, TG_OK, out, false, key, key_len, q, cost, false);
      return TG_OK;
    }
    return tg__limiter_answer(lim, &c, q, 0, rc, &o, out);
  }
  uint64_t when = tg__limiter_when(lim, &c);
  if (tg__limiter_cached(lim, &c, when, q, out))
    return TG_OK;
  rc = lim->store->ops->exec(lim->store, &c, &o);
  return tg__limiter_answer(lim, &c, q, when, rc, &o, out);
}

int tg_hit_at(tg_limiter *lim, uint64_t now_us, const void *key, size_t key_len,
              const tg_quota *q, uint64_t cost, tg_result *out) {
  return hit(lim, &now_us, key, key_len, q, cost, out);
}

int tg_hit(tg_limiter *lim, const void *key, size_t key_len, const tg_quota *q,
           uint64_t cost, tg_result *out) {
  return hit(lim, NULL, key, key_len, q, cost, out);
}

/* A batch: every item validated as tg_hit would, those the deny cache
 * answers answered, the others handed to the store together (in order),
 * each answer written like tg_hit's. */
/* Items a batch keeps on the stack (about 9 KB); a larger batch
 * allocates its arrays, so a store that pipelines still sees it whole. */
#define BATCH_STACK 32u

/* A deny cache answers a key from the denials stored before it: a batch
 * item must see those of the items before it, as tg_hit in a loop would,
 * and must not see an entry a pending item's denial will push out. A
 * denial only pushes out entries of its own set, so before an item whose
 * cache set a pending item shares (its own key's, always), the pending
 * ones are decided and their denials stored. Sets beyond 4096 are told
 * apart modulo 4096: two that fold together only send the group a little
 * early. */
typedef struct batch_seen {
  uint64_t bits[64];
} batch_seen;

/* The store's answers to the pending calls calls[0..m), each written like
 * tg_hit's into its item. */
static void batch_decide(tg_limiter *lim, tg_batch_item *items, tg__call *calls,
                         tg__outcome *outs, int *rcs, const size_t *pos,
                         const uint64_t *when, size_t m) {
  if (m == 0)
    return;
  lim->store->ops->exec_batch(lim->store, calls, m, outs, rcs);
  for (size_t j = 0; j < m; j++) {
    tg_batch_item *it = &items[pos[j]];
    it->status = tg__limiter_answer(lim, &calls[j], it->q, when[j], rcs[j],
                                    &outs[j], &it->result);
  }
}

static int hit_batch(tg_limiter *lim, const uint64_t *now, tg_batch_item *items,
                     size_t n) {
  if (!lim || (!items && n > 0))
    return TG_EINVAL;
  if (n == 0)
    return TG_OK;
  const tg__store_ops *ops = lim->store->ops;
  tg__call s_calls[BATCH_STACK];
  tg__outcome s_outs[BATCH_STACK];
  int s_rcs[BATCH_STACK];
  size_t s_pos[BATCH_STACK];
  uint64_t s_when[BATCH_STACK];
  tg__call *calls = s_calls;
  tg__outcome *outs = s_outs;
  int *rcs = s_rcs;
  size_t *pos = s_pos;
  uint64_t *when = s_when;
  bool heap = ops->exec_batch && n > BATCH_STACK;
  if (heap) {
    calls = malloc(n * sizeof *calls);
    outs = malloc(n * sizeof *outs);
    rcs = malloc(n * sizeof *rcs);
    pos = malloc(n * sizeof *pos);
    when = malloc(n * sizeof *when);
  }
  size_t m = 0;
  bool together = ops->exec_batch && calls && outs && rcs && pos && when;
  batch_seen seen;
  if (together && lim->deny)
    memset(&seen, 0, sizeof seen);
  for (size_t i = 0; i < n; i++) {
    tg_batch_item *it = &items[i];
    if (!together) {
      /* no batch path (or no memory for one): one call at a time */
      it->status =
          hit(lim, now, it->key, it->key_len, it->q, it->cost, &it->result);
      continue;
    }
    it->status = tg__limiter_prepare(lim, TG__OP_HIT, now, it->key, it->key_len,
                                     it->q, it->cost, &calls[m]);
    if (it->status != TG_OK) {
      tg__limiter_invalid(lim, it->status, it->key, it->key_len, it->q,
                          it->cost, &it->result);
      continue;
    }
    if (lim->deny) {
      size_t fp = tg__deny_cache_set(lim->deny, it->key, it->key_len) % 4096u;
      if (seen.bits[fp / 64] >> (fp % 64) & 1u) {
        /* a pending item's denial could change what the cache says of
         * this key: decide those first, then look in the cache they
         * filled */
        tg__call c = calls[m];
        batch_decide(lim, items, calls, outs, rcs, pos, when, m);
        memset(&seen, 0, sizeof seen);
        m = 0;
        calls[0] = c;
      }
      seen.bits[fp / 64] |= UINT64_C(1) << (fp % 64);
    }
    when[m] = tg__limiter_when(lim, &calls[m]);
    if (!tg__limiter_cached(lim, &calls[m], when[m], it->q, &it->result))
      pos[m++] = i;
  }
  if (together)
    batch_decide(lim, items, calls, outs, rcs, pos, when, m);
  if (heap) {
    free(calls);
    free(outs);
    free(rcs);
    free(pos);
    free(when);
  }
  return TG_OK;
}

int tg_hit_batch(tg_limiter *lim, tg_batch_item *items, size_t n) {
  return hit_batch(lim, NULL, items, n);
}

int tg_hit_batch_at(tg_limiter *lim, uint64_t now_us, tg_batch_item *items,
                    size_t n) {
  return hit_batch(lim, &now_us, items, n);
}

/* The operations that answer one number share this; value_out may be NULL
 * only where the header allows it (inc, set). */
static int run_value(tg_limiter *lim, tg__op op, const uint64_t *now,
                     const void *key, size_t key_len, const tg_quota *q,
                     uint64_t arg, uint64_t *value_out) {
  tg__outcome o;
  int rc = run(lim, op, now, key, key_len, q, arg, &o);
  if (rc == TG_OK && value_out)
    *value_out = o.value;
  return rc;
}

/* An inc, a set or a reset may make a key allow what a cached denial
 * refuses (an inc under another period opens a new window). */
static void forget(tg_limiter *lim, const void *key, size_t key_len) {
  if (lim && lim->deny && key && key_len >= 1 && key_len <= TG_KEY_MAX)
    tg__deny_cache_forget(lim->deny, key, key_len);
}

/* An inc or a set forgets the key's cached denial once it has run (invalid
 * input changes nothing, the cache included); after, not before, so that a
 * denial cached from the old state while it ran goes too. */
static int run_then_forget(tg_limiter *lim, tg__op op, const uint64_t *now,
                           const void *key, size_t key_len, const tg_quota *q,
                           uint64_t arg, uint64_t *value_out) {
  int rc = run_value(lim, op, now, key, key_len, q, arg, value_out);
  if (!tg__input_error(rc))
    forget(lim, key, key_len);
  return rc;
}

int tg_inc_at(tg_limiter *lim, uint64_t now_us, const void *key, size_t key_len,
              const tg_quota *q, uint64_t cost, uint64_t *count_out) {
  return run_then_forget(lim, TG__OP_INC, &now_us, key, key_len, q, cost,
                         count_out);
}

int tg_inc(tg_limiter *lim, const void *key, size_t key_len, const tg_quota *q,
           uint64_t cost, uint64_t *count_out) {
  return run_then_forget(lim, TG__OP_INC, NULL, key, key_len, q, cost,
                         count_out);
}

int tg_get_at(tg_limiter *lim, uint64_t now_us, const void *key, size_t key_len,
              const tg_quota *q, uint64_t *value_out) {
  if (!value_out)
    return TG_EINVAL;
  return run_value(lim, TG__OP_GET, &now_us, key, key_len, q, 0, value_out);
}

int tg_get(tg_limiter *lim, const void *key, size_t key_len, const tg_quota *q,
           uint64_t *value_out) {
  if (!value_out)
    return TG_EINVAL;
  return run_value(lim, TG__OP_GET, NULL, key, key_len, q, 0, value_out);
}

int tg_set_at(tg_limiter *lim, uint64_t now_us, const void *key, size_t key_len,
              const tg_quota *q, uint64_t value) {
  return run_then_forget(lim, TG__OP_SET, &now_us, key, key_len, q, value,
                         NULL);
}

int tg_set(tg_limiter *lim, const void *key, size_t key_len, const tg_quota *q,
           uint64_t value) {
  return run_then_forget(lim, TG__OP_SET, NULL, key, key_len, q, value, NULL);
}

int tg_expires_at_at(tg_limiter *lim, uint64_t now_us, const void *key,
                     size_t key_len, const tg_quota *q, uint64_t *at_ms) {
  if (!at_ms)
    return TG_EINVAL;
  return run_value(lim, TG__OP_EXPIRES, &now_us, key, key_len, q, 0, at_ms);
}

int tg_expires_at(tg_limiter *lim, const void *key, size_t key_len,
                  const tg_quota *q, uint64_t *at_ms) {
  if (!at_ms)
    return TG_EINVAL;
  return run_value(lim, TG__OP_EXPIRES, NULL, key, key_len, q, 0, at_ms);
}

int tg_shm_unlink(const char *name) {
  if (!shm_name_ok(name))
    return TG_EINVAL;
  if (shm_unlink(name) == 0 || errno == ENOENT)
    return TG_OK;
  return errno == EINVAL || errno == ENAMETOOLONG ? TG_EINVAL : TG_ESTORE;
}

int tg_reset(tg_limiter *lim, const void *key, size_t key_len) {
  if (!lim || !key)
    return TG_EINVAL;
  if (key_len == 0 || key_len > TG_KEY_MAX)
    return TG_EKEY;
  int rc = lim->store->ops->reset(lim->store, key, key_len);
  forget(lim, key, key_len); /* after, as a set does */
  return rc;
}

void tg__limiter_done_slow(tg_limiter *lim, int rc, tg_result *r, bool shadow,
                           const tg__decided *d) {
  tg__limiter_done_all(lim, rc, r, shadow, d);
}

void tg__limiter_hook(tg_limiter *lim, tg__shard *sh, bool own, int rc,
                      const tg_result *r, bool real_allowed,
                      const tg__decided *d) {
  const tg_config *cfg = &lim->cfg;
  if (cfg->on_decision_denied_only && rc == TG_OK && real_allowed)
    return;
  uint64_t seq;
  if (own) {
    /* counted per thread: a shard that passed to this thread from one
     * that exited starts the sequence again */
    if (tg__load_relaxed(&sh->n[TG__N_HOOK_THREAD]) != tg__my_number) {
      tg__store_relaxed(&sh->n[TG__N_HOOK_THREAD], tg__my_number);
      tg__store_relaxed(&sh->n[TG__N_HOOK], 0);
    }
    seq = tg__load_relaxed(&sh->n[TG__N_HOOK]);
    tg__store_relaxed(&sh->n[TG__N_HOOK], seq + 1);
  } else {
    seq = __atomic_fetch_add(&sh->n[TG__N_HOOK], 1, __ATOMIC_RELAXED);
  }
  if (cfg->on_decision_every > 1 && seq % cfg->on_decision_every != 0)
    return;
  tg_decision ev = {d->key, d->key_len, cfg->algorithm, d->q, d->cost,
                    rc,     r,          d->in_rules};
  cfg->on_decision(&ev, cfg->on_decision_ctx);
}

void tg__limiter_stats_read(const tg_limiter *lim, tg_stats *st) {
  tg__stats_read(lim->stats, st);
  if (lim->store && lim->store_time) /* a Redis store */
    tg__redis_stats(lim->store, st);
}

int tg_limiter_stats(const tg_limiter *lim, tg_stats *out, size_t size) {
  if (!lim || !out || size == 0)
    return TG_EINVAL;
  tg_stats all;
  tg__limiter_stats_read(lim, &all);
  memcpy(out, &all, size < sizeof all ? size : sizeof all);
  return TG_OK;
}
