/* SPDX-License-Identifier: MIT */
/*
 * custom_helpers.h - the custom store's tests' fixture (test_custom_store,
 * test_custom_store_runs): the documented byte layout encoded here byte by
 * byte, a hand-driven clock, the recording store (the example map behind a
 * call log that checks the lock protocol) and a limiter on it.
 *
 * Include after <cmocka.h>, accept_helpers.h and the example map's header.
 */
#ifndef TG_TESTS_CUSTOM_HELPERS_H
#define TG_TESTS_CUSTOM_HELPERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/custom_store_map.h"
#include "accept_helpers.h"
#include "tollgate.h"

#define T0 UINT64_C(1700000000123456) /* us; deliberately not on a ms */
#define DAY_MS UINT64_C(86400000)
#define SCRATCH (8 + 16 * 4096) /* bytes: room for any state used here */

/* ---- the documented layout, encoded here byte by byte ---- */

static inline void le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* Writes the 8-byte head: version, algorithm, two zero bytes, u32 n. */
static inline size_t head(unsigned char *p, unsigned version, unsigned alg,
                          uint32_t n) {
  p[0] = (unsigned char)version;
  p[1] = (unsigned char)alg;
  p[2] = 0;
  p[3] = 0;
  p[4] = (unsigned char)n;
  p[5] = (unsigned char)(n >> 8);
  p[6] = (unsigned char)(n >> 16);
  p[7] = (unsigned char)(n >> 24);
  return 8;
}

/* A window or bucket state: head (n = 0) and two u64. */
static inline size_t pair(unsigned char *p, tg_algorithm alg, uint64_t a,
                          uint64_t b) {
  head(p, 1, (unsigned)alg, 0);
  le64(p + 8, a);
  le64(p + 16, b);
  return 24;
}

/* A sliding log of n (time, cost) entries. */
static inline size_t logbytes(unsigned char *p, uint32_t n, const uint64_t *t,
                              const uint64_t *cost) {
  head(p, 1, TG_SLIDING_WINDOW, n);
  for (uint32_t i = 0; i < n; i++) {
    le64(p + 8 + 16 * (size_t)i, t[i]);
    le64(p + 16 + 16 * (size_t)i, cost[i]);
  }
  return 8 + 16 * (size_t)n;
}

static inline void dump(const char *what, const unsigned char *p, size_t len) {
  print_error("%s (%zu bytes):", what, len);
  for (size_t i = 0; i < len && i < 96; i++)
    print_error(" %02x", p[i]);
  print_error("%s\n", len > 96 ? " ..." : "");
}

static inline void bytes_eq_(const unsigned char *got, size_t got_len,
                             const unsigned char *want, size_t want_len,
                             const char *file, int line) {
  if (got_len == want_len && memcmp(got, want, want_len) == 0)
    return;
  dump("actual", got, got_len);
  dump("expected", want, want_len);
  _fail(file, line);
}
#define BYTES_EQ(got, got_len, want, want_len)                                 \
  bytes_eq_((got), (got_len), (want), (want_len), __FILE__, __LINE__)

/* ---- a hand-driven clock shared by the limiter and the store ---- */

typedef struct sim {
  uint64_t now_us;
} sim;

static inline uint64_t sim_read(void *ctx) {
  return ((const sim *)ctx)->now_us;
}

/* ---- the recording store: the example map behind a call log ---- */

typedef struct rec {
  tg_custom_store inner; /* the map's callbacks */
  int force_get;         /* 0: pass through; else lock_and_get answers this
                            code without locking (BUSY, ERROR) */
  bool fail_set;         /* set_and_unlock releases without storing and
                            answers TG_CUSTOM_ERROR */
  unsigned locks, sets, unlocks; /* calls since the last CALLS() */
  unsigned violations; /* set/unlock without the lock, a second lock */
  int last_get;        /* what the last lock_and_get answered */
  size_t last_cap;     /* the cap tollgate offered */
  bool held;           /* a lock is held, on held_key */
  unsigned char held_key[TG_KEY_MAX];
  size_t held_len;
  unsigned char set_data[SCRATCH]; /* the last set_and_unlock */
  size_t set_len;
  uint64_t set_ttl;
} rec;

static inline int rec_lock_and_get(void *ctx, const void *key, size_t key_len,
                                   void *buf, size_t cap, size_t *len) {
  rec *r = ctx;
  r->locks++;
  r->last_cap = cap;
  if (r->held)
    r->violations++;
  int got = r->force_get ? r->force_get
                         : r->inner.lock_and_get(r->inner.ctx, key, key_len,
                                                 buf, cap, len);
  r->last_get = got;
  if (got == TG_CUSTOM_OK || got == TG_CUSTOM_NOT_FOUND) {
    r->held = true;
    memcpy(r->held_key, key, key_len);
    r->held_len = key_len;
  }
  return got;
}

/* True when the caller may release: a lock is held, on this key. */
static inline bool rec_release(rec *r, const void *key, size_t key_len) {
  if (!r->held || key_len != r->held_len ||
      memcmp(key, r->held_key, key_len) != 0) {
    r->violations++;
    return false;
  }
  r->held = false;
  return true;
}

static inline int rec_set_and_unlock(void *ctx, const void *key, size_t key_len,
                                     const void *data, size_t len,
                                     uint64_t ttl_ms) {
  rec *r = ctx;
  r->sets++;
  r->set_len = len;
  memcpy(r->set_data, data, len < SCRATCH ? len : SCRATCH);
  r->set_ttl = ttl_ms;
  if (!rec_release(r, key, key_len))
    return TG_CUSTOM_ERROR; /* nothing is held: touch nothing */
  if (r->fail_set) {
    r->inner.unlock(r->inner.ctx, key, key_len);
    return TG_CUSTOM_ERROR;
  }
  return r->inner.set_and_unlock(r->inner.ctx, key, key_len, data, len, ttl_ms);
}

static inline void rec_unlock(void *ctx, const void *key, size_t key_len) {
  rec *r = ctx;
  r->unlocks++;
  if (rec_release(r, key, key_len))
    r->inner.unlock(r->inner.ctx, key, key_len);
}

/* Fails at file:line unless exactly these calls happened since the last
 * check, every lock was released and nothing broke the protocol. */
static inline void calls_(rec *r, unsigned locks, unsigned sets,
                          unsigned unlocks, const char *file, int line) {
  if (r->locks != locks || r->sets != sets || r->unlocks != unlocks ||
      r->held || r->violations) {
    print_error("store calls: lock_and_get %u, set_and_unlock %u, unlock %u, "
                "still held %d, violations %u; expected %u, %u, %u\n",
                r->locks, r->sets, r->unlocks, r->held, r->violations, locks,
                sets, unlocks);
    _fail(file, line);
  }
  r->locks = r->sets = r->unlocks = 0;
}
#define CALLS(r, locks, sets, unlocks)                                         \
  calls_((r), (locks), (sets), (unlocks), __FILE__, __LINE__)

/* ---- fixture: a limiter on rec on the map, all on one sim clock ---- */

typedef struct fx {
  sim clock;
  map_store *map;
  rec *r;
  tg_custom_store cs;
  tg_limiter *lim;
} fx;

static inline void fx_open(fx *f, tg_algorithm alg, tg_policy pol,
                           uint32_t max_entries) {
  memset(f, 0, sizeof *f);
  f->clock.now_us = T0;
  map_store_options mo;
  map_store_options_init(&mo);
  mo.stripes = 4;
  mo.lock_wait_us = 0; /* a held key is BUSY at once */
  mo.clock = sim_read;
  mo.clock_ctx = &f->clock;
  assert_int_equal(map_store_new(&f->map, &mo), 0);
  f->r = calloc(1, sizeof *f->r);
  assert_non_null(f->r);
  map_store_callbacks(f->map, &f->r->inner);
  f->cs =
      (tg_custom_store){rec_lock_and_get, rec_set_and_unlock, rec_unlock, f->r};
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = pol;
  if (max_entries)
    cfg.sliding_max_entries = max_entries;
  cfg.clock = sim_read;
  cfg.clock_ctx = &f->clock;
  cfg.custom_store = &f->cs;
  assert_int_equal(tg_limiter_new(&f->lim, &cfg), TG_OK);
}

static inline void fx_close(fx *f) {
  tg_limiter_destroy(f->lim);
  map_store_free(f->map);
  free(f->r);
}

/* Stores bytes for key directly in the map (TTL a day), bypassing rec. */
static inline void plant(fx *f, const char *key, const void *data, size_t len) {
  static unsigned char scratch[SCRATCH];
  size_t l = 0;
  int got = f->r->inner.lock_and_get(f->r->inner.ctx, key, strlen(key), scratch,
                                     sizeof scratch, &l);
  assert_true(got == TG_CUSTOM_OK || got == TG_CUSTOM_NOT_FOUND);
  assert_int_equal(f->r->inner.set_and_unlock(f->r->inner.ctx, key, strlen(key),
                                              data, len, DAY_MS),
                   TG_CUSTOM_OK);
}

/* The bytes the map holds for key; SIZE_MAX when it holds none. */
static inline size_t stored(fx *f, const char *key, unsigned char *out,
                            size_t cap) {
  size_t len = 0;
  int got = f->r->inner.lock_and_get(f->r->inner.ctx, key, strlen(key), out,
                                     cap, &len);
  assert_true(got == TG_CUSTOM_OK || got == TG_CUSTOM_NOT_FOUND);
  f->r->inner.unlock(f->r->inner.ctx, key, strlen(key));
  return got == TG_CUSTOM_OK ? len : SIZE_MAX;
}

/* The last set_and_unlock wrote exactly want[0..n) with this TTL. */
static inline void wrote_(fx *f, const unsigned char *want, size_t n,
                          uint64_t ttl, const char *file, int line) {
  bytes_eq_(f->r->set_data, f->r->set_len, want, n, file, line);
  eq_(f->r->set_ttl, ttl, "ttl_ms", file, line);
}
#define WROTE(f, want, n, ttl)                                                 \
  wrote_((f), (want), (n), (ttl), __FILE__, __LINE__)

static inline tg_result hit(fx *f, const char *key, const tg_quota *q,
                            uint64_t cost, int want_rc) {
  tg_result r;
  memset(&r, 0x5a, sizeof r);
  assert_int_equal(tg_hit(f->lim, key, strlen(key), q, cost, &r), want_rc);
  return r;
}

static inline uint64_t get(fx *f, const char *key, const tg_quota *q) {
  uint64_t v = 0;
  assert_int_equal(tg_get(f->lim, key, strlen(key), q, &v), TG_OK);
  return v;
}

#endif
