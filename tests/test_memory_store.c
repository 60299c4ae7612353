/* SPDX-License-Identifier: MIT */
/*
 * test_memory_store.c - deterministic tests of what tollgate.h promises about
 * the built-in memory store: capacity and the failure policies, reclaiming
 * decayed keys before refusing, long keys and the long_keys arena, reset,
 * cleaning passes and before_clean, the background cleaning thread, the
 * reclaim horizon, the memory the table reserves, and that a denied bucket
 * decision writes nothing.
 *
 * Time is driven by hand (the "_at" calls, or an injected clock for the
 * background thread). The only waits are for the background thread, and they
 * assert nothing but "eventually, within a generous bound". test_model.c
 * covers the same rules with random operations.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/table.h"
#include "tollgate.h"
#include "util.h"

#define MS(x) ((uint64_t)(x)*UINT64_C(1000))
/* us since the epoch: a whole second, 800 s past a whole hour */
#define T0 UINT64_C(1700000000000000)

static const tg_algorithm all_algs[TG_ALGORITHM_COUNT] = {
    TG_FIXED_WINDOW, TG_FIXED_WINDOW_PER_KEY, TG_SLIDING_WINDOW,
    TG_TOKEN_BUCKET, TG_LEAKY_BUCKET};
static const tg_policy all_policies[3] = {
    TG_POLICY_FAIL_OPEN, TG_POLICY_FAIL_CLOSED, TG_POLICY_ERROR};

/* The algorithm a looping test is on, reported by the teardown if the test
 * fails (a test that completes clears it). */
static const char *current;
#define ON(alg) (current = tg_algorithm_name(alg))

static int report_current(void **state) {
  (void)state;
  if (current)
    print_error("(failed on %s)\n", current);
  current = NULL;
  return 0;
}

static bool is_window(tg_algorithm a) {
  return a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
}

/* A limiter for the tests: no background thread unless asked. */
typedef struct opts {
  tg_algorithm alg;
  uint64_t capacity, long_keys, older_ms, clean_period_ms;
  tg_policy policy;
  tg_before_clean_fn before_clean;
  void *before_clean_ctx;
  tg_clock_fn clock;
  void *clock_ctx;
} opts;

static tg_limiter *make(const opts *o) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = o->alg;
  if (o->capacity)
    cfg.capacity = o->capacity;
  cfg.long_keys = o->long_keys;
  cfg.on_failure = o->policy;
  cfg.clean_period_ms = o->clean_period_ms;
  cfg.key_older_than_ms = o->older_ms;
  cfg.before_clean = o->before_clean;
  cfg.before_clean_ctx = o->before_clean_ctx;
  if (o->clock) {
    cfg.clock = o->clock;
    cfg.clock_ctx = o->clock_ctx;
  }
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

/* tg_hit_at on (key, len) that must return rc. */
static tg_result hit_rc(tg_limiter *lim, uint64_t now, const void *key,
                        size_t len, const tg_quota *q, uint64_t cost, int rc) {
  tg_result r;
  memset(&r, 0x5a, sizeof r);
  assert_int_equal(tg_hit_at(lim, now, key, len, q, cost, &r), rc);
  return r;
}
static tg_result hit(tg_limiter *lim, uint64_t now, const void *key, size_t len,
                     const tg_quota *q, uint64_t cost) {
  tg_result r = hit_rc(lim, now, key, len, q, cost, TG_OK);
  assert_false(r.degraded);
  return r;
}
static uint64_t get(tg_limiter *lim, uint64_t now, const void *key, size_t len,
                    const tg_quota *q) {
  uint64_t v = 0x5a5a5a5a;
  assert_int_equal(tg_get_at(lim, now, key, len, q, &v), TG_OK);
  return v;
}
static uint64_t expires(tg_limiter *lim, uint64_t now, const void *key,
                        size_t len, const tg_quota *q) {
  uint64_t v = 0x5a5a5a5a;
  assert_int_equal(tg_expires_at_at(lim, now, key, len, q, &v), TG_OK);
  return v;
}
#define S(str) (str), (sizeof(str) - 1) /* a literal key and its length */

static void assert_same_result(const tg_result *a, const tg_result *b) {
  assert_int_equal(a->allowed, b->allowed);
  assert_int_equal(a->degraded, b->degraded);
  assert_int_equal(a->count, b->count);
  assert_int_equal(a->remaining, b->remaining);
  assert_int_equal(a->retry_after_ms, b->retry_after_ms);
  assert_int_equal(a->reset_after_ms, b->reset_after_ms);
}

/* What a fresh key reads as: windows and sliding 0, token bucket burst, leaky
 * bucket 0. */
static uint64_t fresh_value(tg_algorithm alg, const tg_quota *q) {
  if (alg == TG_TOKEN_BUCKET)
    return q->burst ? q->burst : q->limit;
  return 0;
}

/* ---- capacity and the failure policies ---- */

/* A full table of live keys refuses a new key with TG_EFULL, and a hit's
 * result is the policy's answer, marked degraded; set and inc on a new key
 * fail the same way. Existing keys, reads and peeks still work. */
static void full_table_policies(void **state) {
  (void)state;
  const tg_quota q = {.limit = 5, .period_ms = 60000, .burst = 5};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    for (int p = 0; p < 3; p++) {
      tg_algorithm alg = all_algs[a];
      ON(alg);
      opts o = {.alg = alg, .capacity = 4, .policy = all_policies[p]};
      tg_limiter *lim = make(&o);
      char key[8];
      for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_true(hit(lim, T0, key, 5, &q, 1).allowed);
      }
      assert_int_equal(tg_key_count(lim), 4);

      tg_result r = hit_rc(lim, T0 + MS(1), S("new"), &q, 1, TG_EFULL);
      assert_true(r.degraded);
      switch (all_policies[p]) {
      case TG_POLICY_FAIL_OPEN:
        assert_true(r.allowed);
        assert_int_equal(r.retry_after_ms, 0);
        break;
      case TG_POLICY_FAIL_CLOSED:
        assert_false(r.allowed);
        assert_int_equal(r.retry_after_ms, q.period_ms);
        break;
      case TG_POLICY_ERROR:
      case TG_POLICY_FALLBACK: /* not among all_policies */
        assert_false(r.allowed);
        assert_int_equal(r.retry_after_ms, TG_NEVER);
        break;
      }
      if (alg != TG_SLIDING_WINDOW)
        assert_int_equal(tg_set_at(lim, T0 + MS(1), S("new"), &q, 2), TG_EFULL);
      if (is_window(alg))
        assert_int_equal(tg_inc_at(lim, T0 + MS(1), S("new"), &q, 1, NULL),
                         TG_EFULL);
      /* the refused key has no state; reads and peeks need no slot */
      assert_int_equal(get(lim, T0 + MS(1), S("new"), &q),
                       fresh_value(alg, &q));
      assert_int_equal(expires(lim, T0 + MS(1), S("new"), &q), 0);
      tg_result peek = hit(lim, T0 + MS(1), S("new"), &q, 0);
      assert_true(peek.allowed);
      assert_int_equal(peek.remaining, 5);
      /* existing keys go on as before */
      tg_result again = hit(lim, T0 + MS(2), S("key-0"), &q, 1);
      assert_true(again.allowed);
      assert_int_equal(again.remaining, 3);
      assert_int_equal(tg_key_count(lim), 4);
      tg_limiter_destroy(lim);
    }
  }
  current = NULL;
}

static int calls_counted(tg_algorithm alg, const tg_expired *e, size_t n,
                         void *ctx) {
  (void)alg;
  (void)e;
  *(size_t *)ctx += n;
  return 0;
}

/* Keys whose state decayed make room for new ones when the table is full,
 * whatever key_older_than_ms says, without before_clean; keys still live
 * are never reclaimed for a new key. */
static void decayed_keys_make_room(void **state) {
  (void)state;
  const tg_quota shortq = {.limit = 5, .period_ms = 1000, .burst = 5};
  const tg_quota longq = {.limit = 5, .period_ms = 3600000, .burst = 5};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    ON(alg);
    size_t reported = 0;
    opts o = {.alg = alg,
              .capacity = 4,
              .older_ms = 86400000,
              .before_clean = calls_counted,
              .before_clean_ctx = &reported};
    tg_limiter *lim = make(&o);
    /* a full table of keys that have all decayed accepts 4 new keys */
    for (int i = 0; i < 4; i++) {
      char key[4] = {'s', (char)('0' + i), 0, 0};
      hit(lim, T0, key, 2, &shortq, 2);
    }
    assert_int_equal(tg_key_count(lim), 4);
    for (int i = 0; i < 4; i++) {
      char key[4] = {'n', (char)('0' + i), 0, 0};
      tg_result r = hit(lim, T0 + MS(2000), key, 2, &shortq, 2);
      assert_true(r.allowed);
      assert_int_equal(r.count, alg == TG_TOKEN_BUCKET ? 3 : 2);
    }
    assert_int_equal(tg_key_count(lim), 4);
    /* the old keys read as fresh */
    assert_int_equal(get(lim, T0 + MS(2000), S("s0"), &shortq),
                     fresh_value(alg, &shortq));

    assert_int_equal(reported, 0); /* pressure never calls before_clean */
    tg_limiter_destroy(lim);

    /* two live keys (one hour) and two decayed ones: exactly two new keys
     * fit, the third is refused, and the live keys keep their state */
    lim = make(&o);
    hit(lim, T0, S("l0"), &longq, 1);
    hit(lim, T0, S("l1"), &longq, 1);
    hit(lim, T0, S("s0"), &shortq, 1);
    hit(lim, T0, S("s1"), &shortq, 1);
    uint64_t t = T0 + MS(2000);
    assert_true(hit(lim, t, S("m0"), &shortq, 1).allowed);
    assert_true(hit(lim, t, S("m1"), &shortq, 1).allowed);
    assert_true(hit_rc(lim, t, S("m2"), &shortq, 1, TG_EFULL).degraded);
    assert_int_equal(tg_key_count(lim), 4);
    assert_int_equal(get(lim, t, S("l0"), &longq),
                     alg == TG_TOKEN_BUCKET ? 4 : 1);
    assert_int_equal(get(lim, t, S("l1"), &longq),
                     alg == TG_TOKEN_BUCKET ? 4 : 1);
    assert_int_equal(reported, 0); /* pressure never calls before_clean */
    tg_limiter_destroy(lim);
  }
  current = NULL;
}

/* ---- long keys ---- */

typedef struct keybuf {
  unsigned char b[TG_KEY_MAX];
  size_t len;
} keybuf;

/* Keys inline and chunked, of every length, NUL-filled, with embedded NULs,
 * and near-duplicates differing in their last byte: each keeps its own
 * state. */
static void long_and_binary_keys(void **state) {
  (void)state;
  static keybuf keys[800];
  size_t n = 0;
  for (size_t len = 1; len <= TG_KEY_MAX; len++) {
    memset(keys[n].b, 0, len); /* all NUL: differ only by length */
    keys[n++].len = len;
    memset(keys[n].b, 'k', len);
    keys[n++].len = len;
  }
  static const size_t dup_lens[] = {23, 24, 25, 31, 32, 33, 40, 64, 255, 256};
  for (size_t d = 0; d < sizeof dup_lens / sizeof dup_lens[0]; d++)
    for (unsigned v = 0; v < 20; v++) {
      size_t len = dup_lens[d];
      memset(keys[n].b, 'd', len);
      keys[n].b[len / 2] = 0; /* a NUL in the middle too */
      keys[n].b[len - 1] = (unsigned char)v;
      keys[n++].len = len;
    }
  memcpy(keys[n].b, "a\0b", 3);
  keys[n++].len = 3;
  memcpy(keys[n].b, "a\0c", 3);
  keys[n++].len = 3;
  memcpy(keys[n].b, "a", 1);
  keys[n++].len = 1;
  memcpy(keys[n].b, "a\0", 2);
  keys[n++].len = 2;
  assert_true(n <= sizeof keys / sizeof keys[0]);

  const tg_quota q = {.limit = 1000, .period_ms = 3600000};
  opts o = {.alg = TG_FIXED_WINDOW, .capacity = 1024};
  tg_limiter *lim = make(&o);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(hit(lim, T0, keys[i].b, keys[i].len, &q, i % 7 + 1).count,
                     i % 7 + 1);
  assert_int_equal(tg_key_count(lim), n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(get(lim, T0 + 1, keys[i].b, keys[i].len, &q), i % 7 + 1);
  /* resetting every other key leaves the rest alone; the reset ones stay,
   * fresh, until a pass reclaims them (and frees their chunks) */
  for (size_t i = 0; i < n; i += 2)
    assert_int_equal(tg_reset(lim, keys[i].b, keys[i].len), TG_OK);
  assert_int_equal(tg_key_count(lim), n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(get(lim, T0 + 2, keys[i].b, keys[i].len, &q),
                     i % 2 ? i % 7 + 1 : 0);
  size_t removed = 0;
  assert_int_equal(tg_clean_at(lim, T0 + 2, &removed), TG_OK);
  assert_int_equal(removed, n - n / 2);
  assert_int_equal(tg_key_count(lim), n / 2);
  /* and the freed chunks serve the same keys again */
  for (size_t i = 0; i < n; i += 2)
    assert_int_equal(hit(lim, T0 + 3, keys[i].b, keys[i].len, &q, 1).count, 1);
  assert_int_equal(tg_key_count(lim), n);
  tg_limiter_destroy(lim);
}

/* A table at its 7/8 load, full of keys that share everything but their
 * last two bytes, then looked up with as many absent near-duplicates: every
 * lookup walks a long probe chain of equal-length keys, so a comparison that
 * skipped a word of the key would let some of them alias (the 16-bit hash
 * tag matches one slot in 65536). Inline (24 bytes) and chunked (40, 256). */
static void near_duplicates_never_alias(void **state) {
  (void)state;
  static const size_t lens[] = {24, 40, 256};
  const tg_quota q = {.limit = 1000, .period_ms = 3600000};
  for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
    size_t len = lens[l];
    opts o = {.alg = TG_FIXED_WINDOW, .capacity = 4096};
    tg_limiter *lim = make(&o);
    unsigned char key[TG_KEY_MAX];
    memset(key, 'p', len);
    for (unsigned i = 0; i < 4096; i++) {
      key[len - 2] = (unsigned char)(i >> 8);
      key[len - 1] = (unsigned char)i;
      assert_int_equal(hit(lim, T0, key, len, &q, 1).count, 1);
    }
    assert_int_equal(tg_key_count(lim), 4096);
    unsigned aliased = 0;
    for (unsigned i = 4096; i < 65536; i++) {
      key[len - 2] = (unsigned char)(i >> 8);
      key[len - 1] = (unsigned char)i;
      aliased += get(lim, T0, key, len, &q) != 0;
    }
    assert_int_equal(aliased, 0);
    tg_limiter_destroy(lim);
  }
}

/* long_keys bounds the keys longer than 24 bytes held at once: one more is
 * TG_EFULL (with the policy's answer) while short keys still fit; a reset
 * long key gives its room back. */
static void long_keys_exhausted(void **state) {
  (void)state;
  const tg_quota q = {.limit = 5, .period_ms = 60000};
  unsigned char l1[25], l2[100], l3[256];
  memset(l1, 1, sizeof l1);
  memset(l2, 2, sizeof l2);
  memset(l3, 3, sizeof l3);
  opts o = {.alg = TG_TOKEN_BUCKET,
            .capacity = 8,
            .long_keys = 2,
            .policy = TG_POLICY_FAIL_CLOSED};
  tg_limiter *lim = make(&o);
  hit(lim, T0, l1, sizeof l1, &q, 1);
  hit(lim, T0, l2, sizeof l2, &q, 1);
  tg_result r = hit_rc(lim, T0, l3, sizeof l3, &q, 1, TG_EFULL);
  assert_true(r.degraded);
  assert_false(r.allowed);
  assert_int_equal(r.retry_after_ms, 60000);
  /* a 24-byte key is inline: it still fits, as do five more short keys */
  unsigned char s24[24];
  memset(s24, 3, sizeof s24);
  hit(lim, T0, s24, sizeof s24, &q, 1);
  for (int i = 0; i < 5; i++) {
    char k[2] = {(char)('a' + i), 0};
    hit(lim, T0, k, 1, &q, 1);
  }
  assert_int_equal(tg_key_count(lim), 8);
  /* full now: reset a long key and the third long key takes its place (the
   * reset key, fresh, is reclaimed when the chunk is needed) */
  assert_int_equal(tg_reset(lim, l1, sizeof l1), TG_OK);
  assert_int_equal(tg_key_count(lim), 8);
  assert_int_equal(hit(lim, T0, l3, sizeof l3, &q, 1).remaining, 4);
  assert_int_equal(hit_rc(lim, T0, l1, sizeof l1, &q, 1, TG_EFULL).degraded,
                   true);
  /* a cleaning pass frees the long keys that decayed */
  size_t removed = 0;
  assert_int_equal(tg_clean_at(lim, T0 + MS(86400000) + MS(60000), &removed),
                   TG_OK);
  assert_int_equal(removed, 8);
  hit(lim, T0 + MS(86500000), l1, sizeof l1, &q, 1);
  tg_limiter_destroy(lim);
}

/* The header: TG_EFULL means "the memory table is full even after
 * reclaiming decayed keys". When the long-key arena is used up by keys that
 * have all decayed, a new long key should reclaim one of them rather than be
 * refused until a cleaning pass (by default 24 h later) removes them. */
static void long_keys_reclaim_decayed(void **state) {
  (void)state;
  const tg_quota q = {.limit = 5, .period_ms = 1000};
  unsigned char l1[40], l2[40], l3[40];
  memset(l1, 1, sizeof l1);
  memset(l2, 2, sizeof l2);
  memset(l3, 3, sizeof l3);
  int refused = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    opts o = {.alg = all_algs[a], .capacity = 8, .long_keys = 2};
    tg_limiter *lim = make(&o);
    hit(lim, T0, l1, sizeof l1, &q, 1);
    hit(lim, T0, l2, sizeof l2, &q, 1);
    /* an hour later both have long decayed */
    tg_result r;
    int rc = tg_hit_at(lim, T0 + MS(3600000), l3, sizeof l3, &q, 1, &r);
    if (rc != TG_OK) {
      print_error("%s: a new long key, every long key decayed, %zu of 8 "
                  "keys held: %s\n",
                  tg_algorithm_name(all_algs[a]), tg_key_count(lim),
                  tg_err_name(rc));
      refused++;
    }
    tg_limiter_destroy(lim);
  }
  assert_int_equal(refused, 0);
  current = NULL;
}

/* ---- reset ---- */

/* Reset makes the key start over as new, at the caller's now; the key keeps
 * its slot, fresh, until reclaimed; resetting an unknown key is a no-op; a
 * reset makes room in a full table (the fresh key is reclaimed for a new
 * one). */
static void reset_frees_slot(void **state) {
  (void)state;
  const tg_quota q = {.limit = 2, .period_ms = 60000, .burst = 2};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    ON(alg);
    opts o = {.alg = alg, .capacity = 2};
    tg_limiter *lim = make(&o);
    hit(lim, T0, S("k"), &q, 1);
    hit(lim, T0, S("k"), &q, 1);
    assert_false(hit(lim, T0, S("k"), &q, 1).allowed);
    hit(lim, T0, S("other"), &q, 1);
    assert_int_equal(tg_key_count(lim), 2);
    hit_rc(lim, T0, S("third"), &q, 1, TG_EFULL);

    assert_int_equal(tg_reset(lim, S("unknown")), TG_OK);
    assert_int_equal(tg_key_count(lim), 2);
    assert_int_equal(tg_reset(lim, S("k")), TG_OK);
    assert_int_equal(tg_key_count(lim), 2);
    assert_int_equal(tg_reset(lim, S("k")), TG_OK);
    assert_int_equal(tg_key_count(lim), 2);
    assert_int_equal(get(lim, T0 + 1, S("k"), &q), fresh_value(alg, &q));
    assert_int_equal(expires(lim, T0 + 1, S("k"), &q), 0);

    /* the reset key answers exactly as a key never seen */
    tg_limiter *twin = make(&o);
    tg_result r1 = hit(lim, T0 + 1, S("k"), &q, 1);
    tg_result r2 = hit(twin, T0 + 1, S("k"), &q, 1);
    assert_same_result(&r1, &r2);
    assert_true(r1.allowed);
    assert_int_equal(r1.remaining, 1);
    assert_int_equal(tg_key_count(lim), 2);
    hit_rc(lim, T0 + 1, S("third"), &q, 1, TG_EFULL);
    /* reset again: now the new key takes its place */
    assert_int_equal(tg_reset(lim, S("k")), TG_OK);
    assert_true(hit(lim, T0 + 1, S("third"), &q, 1).allowed);
    assert_int_equal(tg_key_count(lim), 2);
    tg_limiter_destroy(twin);
    tg_limiter_destroy(lim);
  }
  current = NULL;
}

/* ---- cleaning passes and before_clean ---- */

typedef struct seen {
  size_t calls, n, max_batch;
  int ret;          /* what the callback returns */
  tg_algorithm alg; /* as passed */
  struct {
    unsigned char key[TG_KEY_MAX];
    size_t len;
    uint64_t value, expired_at_ms;
  } e[256];
} seen;

static int record(tg_algorithm alg, const tg_expired *entries, size_t n,
                  void *ctx) {
  seen *s = ctx;
  s->calls++;
  s->alg = alg;
  if (n > s->max_batch)
    s->max_batch = n;
  for (size_t i = 0; i < n && s->n < 256; i++, s->n++) {
    memcpy(s->e[s->n].key, entries[i].key, entries[i].key_len);
    s->e[s->n].len = entries[i].key_len;
    s->e[s->n].value = entries[i].value;
    s->e[s->n].expired_at_ms = entries[i].expired_at_ms;
  }
  return s->ret;
}

/* Per algorithm, a key A with value va (two calls), a key B that expires
 * later and a key C still live. With key_older_than_ms = 100, a pass removes
 * a key exactly when it has been fresh for 100 ms (not 1 us earlier), hands
 * it to before_clean with its bytes, value and expiry, and calls before_clean
 * only when something expired. */
static void clean_removes_exactly_the_old(void **state) {
  (void)state;
  /* T = 100 ms: expiries fall on whole ms */
  const tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 10};
  unsigned char long_a[200];
  memset(long_a, 'A', sizeof long_a);
  long_a[7] = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    ON(alg);
    for (int ret = 0; ret < 2; ret++) {
      seen *s = calloc(1, sizeof *s);
      assert_non_null(s);
      s->ret = ret ? -1 : 0; /* a failing callback never stops deletion */
      opts o = {.alg = alg,
                .capacity = 16,
                .older_ms = 100,
                .before_clean = record,
                .before_clean_ctx = s};
      tg_limiter *lim = make(&o);
      hit(lim, T0, long_a, sizeof long_a, &q, 3);
      hit(lim, T0 + MS(200), long_a, sizeof long_a, &q, 2);
      hit(lim, T0 + MS(1000), S("B"), &q, 1);
      hit(lim, T0 + MS(5000), S("C"), &q, 1);
      uint64_t ea = expires(lim, T0 + MS(200), long_a, sizeof long_a, &q);
      uint64_t eb = expires(lim, T0 + MS(1000), S("B"), &q);
      /* fixed/per-key window end T+1 s; sliding newest + 1 s; buckets
       * TAT = T + 5 x 100 ms */
      uint64_t want_ea = alg == TG_SLIDING_WINDOW ? T0 / 1000 + 1200
                         : is_window(alg)         ? T0 / 1000 + 1000
                                                  : T0 / 1000 + 500;
      assert_int_equal(ea, want_ea);
      uint64_t va = is_window(alg) || alg == TG_SLIDING_WINDOW ? 5 : 0;

      size_t removed = 99;
      assert_int_equal(tg_clean_at(lim, MS(ea + 100) - 1, &removed), TG_OK);
      assert_int_equal(removed, 0);
      assert_int_equal(s->calls, 0);
      assert_int_equal(tg_key_count(lim), 3);

      assert_int_equal(tg_clean_at(lim, MS(ea + 100), &removed), TG_OK);
      assert_int_equal(removed, 1);
      assert_int_equal(s->calls, 1);
      assert_int_equal(s->n, 1);
      assert_int_equal(s->alg, alg);
      assert_int_equal(s->e[0].len, sizeof long_a);
      assert_memory_equal(s->e[0].key, long_a, sizeof long_a);
      assert_int_equal(s->e[0].value, va);
      assert_int_equal(s->e[0].expired_at_ms, ea);
      assert_int_equal(tg_key_count(lim), 2);

      /* nothing more to do: no call */
      assert_int_equal(tg_clean_at(lim, MS(ea + 100), &removed), TG_OK);
      assert_int_equal(removed, 0);
      assert_int_equal(s->calls, 1);

      assert_int_equal(tg_clean_at(lim, MS(eb + 100) - 1, &removed), TG_OK);
      assert_int_equal(removed, 0);
      assert_int_equal(tg_clean_at(lim, MS(eb + 100), &removed), TG_OK);
      assert_int_equal(removed, 1);
      assert_int_equal(s->calls, 2);
      assert_int_equal(s->e[1].len, 1);
      assert_memory_equal(s->e[1].key, "B", 1);
      assert_int_equal(s->e[1].value,
                       is_window(alg) || alg == TG_SLIDING_WINDOW);
      assert_int_equal(s->e[1].expired_at_ms, eb);
      assert_int_equal(tg_key_count(lim), 1);
      /* C is still live and intact; A reads as fresh */
      assert_int_equal(get(lim, T0 + MS(5000), S("C"), &q),
                       alg == TG_TOKEN_BUCKET ? 9 : 1);
      assert_int_equal(get(lim, MS(eb + 100), long_a, sizeof long_a, &q),
                       fresh_value(alg, &q));
      tg_limiter_destroy(lim);
      free(s);
    }
  }
  current = NULL;
}

/* 150 expired keys: before_clean sees each once, in batches of at most 64,
 * and all are removed. */
static void clean_batches_of_64(void **state) {
  (void)state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ON(all_algs[a]);
    seen *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->ret = 1;
    opts o = {.alg = all_algs[a],
              .capacity = 256,
              .before_clean = record,
              .before_clean_ctx = s};
    tg_limiter *lim = make(&o);
    char key[16];
    for (int i = 0; i < 150; i++) {
      int len = snprintf(key, sizeof key, "key-%03d", i);
      hit(lim, T0, key, (size_t)len, &q, 1);
    }
    size_t removed = 0;
    assert_int_equal(tg_clean_at(lim, T0 + MS(1000) + MS(86400000), &removed),
                     TG_OK);
    assert_int_equal(removed, 150);
    assert_int_equal(tg_key_count(lim), 0);
    assert_int_equal(s->n, 150);
    assert_true(s->max_batch <= 64);
    assert_true(s->calls >= 3);
    bool got[150] = {false};
    for (size_t i = 0; i < s->n; i++) {
      assert_int_equal(s->e[i].len, 7);
      int k = atoi((const char *)s->e[i].key + 4);
      assert_true(k >= 0 && k < 150);
      assert_false(got[k]);
      got[k] = true;
    }
    tg_limiter_destroy(lim);
    free(s);
  }
  current = NULL;
}

/* A before_clean that calls back into the limiter: reads every entry, hits
 * one (which then survives: the cleaner deletes only the state it saw),
 * resets another, and starts a nested pass (which returns at once). No
 * deadlock; the counts add up. */
typedef struct reenter {
  tg_limiter *lim;
  const tg_quota *q;
  uint64_t now;
  int errors;
  size_t nested_removed;
  int calls;
} reenter;

static int reenter_cb(tg_algorithm alg, const tg_expired *e, size_t n,
                      void *ctx) {
  (void)alg;
  reenter *r = ctx;
  r->calls++;
  for (size_t i = 0; i < n; i++) {
    uint64_t v;
    if (tg_get_at(r->lim, r->now, e[i].key, e[i].key_len, r->q, &v) != TG_OK)
      r->errors++;
  }
  tg_result res;
  if (tg_hit_at(r->lim, r->now, S("k0"), r->q, 1, &res) != TG_OK ||
      !res.allowed)
    r->errors++;
  if (tg_reset(r->lim, S("k1")) != TG_OK)
    r->errors++;
  if (tg_clean_at(r->lim, r->now, &r->nested_removed) != TG_OK)
    r->errors++;
  return 0;
}

static void before_clean_reenters(void **state) {
  (void)state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ON(all_algs[a]);
    reenter r = {.q = &q, .now = T0 + MS(5000), .nested_removed = 77};
    opts o = {.alg = all_algs[a],
              .capacity = 16,
              .older_ms = 0,
              .before_clean = reenter_cb,
              .before_clean_ctx = &r};
    tg_limiter *lim = make(&o);
    r.lim = lim;
    hit(lim, T0, S("k0"), &q, 1);
    hit(lim, T0, S("k1"), &q, 1);
    hit(lim, T0, S("k2"), &q, 1);
    hit(lim, T0, S("k3"), &q, 1);
    size_t removed = 0;
    assert_int_equal(tg_clean_at(lim, r.now, &removed), TG_OK);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.errors, 0);
    assert_int_equal(r.nested_removed, 0);
    /* k2 and k3; k1 was reset meanwhile: a window or bucket then holds
     * another state than the one inspected and stays (fresh), a log is
     * judged again under its lock and, emptied, goes too */
    bool sliding = all_algs[a] == TG_SLIDING_WINDOW;
    assert_int_equal(removed, sliding ? 3 : 2);
    assert_int_equal(tg_key_count(lim), sliding ? 1 : 2);
    assert_int_equal(get(lim, r.now, S("k0"), &q),
                     all_algs[a] == TG_TOKEN_BUCKET ? 9 : 1);
    tg_limiter_destroy(lim);
  }
  current = NULL;
}

/* ---- the background thread ---- */

typedef struct shared_clock {
  uint64_t now_us; /* __atomic */
} shared_clock;

static uint64_t shared_clock_read(void *ctx) {
  return __atomic_load_n(&((shared_clock *)ctx)->now_us, __ATOMIC_ACQUIRE);
}

typedef struct bg_seen {
  pthread_mutex_t mu;
  size_t entries; /* every entry handed to before_clean */
  bool key_seen[20];
  int off_main; /* calls from a thread other than main */
  int on_main;
  pthread_t main;
} bg_seen;

static int bg_record(tg_algorithm alg, const tg_expired *e, size_t n,
                     void *ctx) {
  (void)alg;
  bg_seen *s = ctx;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < n; i++) {
    s->entries++;
    char name[8] = {0};
    memcpy(name, e[i].key, e[i].key_len < 7 ? e[i].key_len : 7);
    int k = atoi(name + 1);
    if (k >= 0 && k < 20)
      s->key_seen[k] = true;
  }
  if (pthread_equal(pthread_self(), s->main))
    s->on_main++;
  else
    s->off_main++;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

/* With clean_period_ms = 5 the thread removes expired keys by itself, and
 * only expired ones. */
static void background_thread_cleans(void **state) {
  (void)state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ON(all_algs[a]);
    shared_clock clk = {T0};
    bg_seen s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    s.main = pthread_self();
    opts o = {.alg = all_algs[a],
              .capacity = 64,
              .older_ms = 10,
              .clean_period_ms = 5,
              .clock = shared_clock_read,
              .clock_ctx = &clk,
              .before_clean = bg_record,
              .before_clean_ctx = &s};
    tg_limiter *lim = make(&o);
    char key[8];
    for (int i = 0; i < 20; i++) {
      int len = snprintf(key, sizeof key, "k%d", i);
      tg_result r;
      assert_int_equal(tg_hit(lim, key, (size_t)len, &q, 1, &r), TG_OK);
    }
    /* live keys survive any number of passes */
    sleep_ms(30);
    assert_int_equal(tg_key_count(lim), 20);
    /* half are hit again at T0 + 1.005 s (the thread still sees T0), then
     * the clock moves to T0 + 1.010 s: the other half have been fresh for
     * at least 10 ms (key_older_than_ms) and go */
    for (int i = 0; i < 10; i++) {
      int len = snprintf(key, sizeof key, "k%d", i);
      hit(lim, T0 + MS(1005), key, (size_t)len, &q, 1);
    }
    __atomic_store_n(&clk.now_us, T0 + MS(1010), __ATOMIC_RELEASE);
    double deadline = seconds_now() + 5.0;
    while (tg_key_count(lim) > 10 && seconds_now() < deadline)
      sleep_ms(1);
    assert_int_equal(tg_key_count(lim), 10);
    /* and then the rest */
    __atomic_store_n(&clk.now_us, T0 + MS(3000), __ATOMIC_RELEASE);
    deadline = seconds_now() + 5.0;
    while (tg_key_count(lim) > 0 && seconds_now() < deadline)
      sleep_ms(1);
    assert_int_equal(tg_key_count(lim), 0);
    tg_limiter_destroy(lim);
    assert_int_equal(s.entries, 20);
    for (int i = 0; i < 20; i++)
      assert_true(s.key_seen[i]);
    assert_int_equal(s.on_main, 0);
    assert_true(s.off_main >= 2);
    pthread_mutex_destroy(&s.mu);
  }
  current = NULL;
}

/* Destroying a limiter wakes its thread at once, even with an hour between
 * passes (a generous bound, not a timing measurement). */
static void destroy_stops_thread_promptly(void **state) {
  (void)state;
  opts o = {.alg = TG_TOKEN_BUCKET, .capacity = 16, .clean_period_ms = 3600000};
  for (int i = 0; i < 3; i++) {
    tg_limiter *lim = make(&o);
    if (i > 0)
      sleep_ms(10 * (unsigned)i); /* the thread is asleep in its wait by now */
    double t = seconds_now();
    tg_limiter_destroy(lim);
    assert_true(seconds_now() - t < 2.0);
  }
}

/* tg_limiter_destroy from before_clean on the cleaning thread (the thread
 * cannot join itself: this used to free the table under the pass, which
 * then crashed): it returns at once, the pass never calls before_clean
 * again, and the thread frees the limiter and ends (ASan's leak check
 * would see a limiter left behind). */
typedef struct self_destroy {
  tg_limiter *lim;
  int calls; /* __atomic */
} self_destroy;

static int destroy_in_hook(tg_algorithm alg, const tg_expired *e, size_t n,
                           void *ctx) {
  (void)alg;
  (void)e;
  (void)n;
  self_destroy *d = ctx;
  if (__atomic_fetch_add(&d->calls, 1, __ATOMIC_ACQ_REL) == 0)
    tg_limiter_destroy(d->lim);
  return 0;
}

static int threads_now(void) {
  DIR *dir = opendir("/proc/self/task");
  int n = 0;
  if (!dir)
    return -1;
  for (struct dirent *e; (e = readdir(dir)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

static void destroy_from_before_clean(void **state) {
  (void)state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  static shared_clock clk;
  static self_destroy d;
  __atomic_store_n(&clk.now_us, T0, __ATOMIC_RELEASE);
  d.calls = 0;
  int before = threads_now();
  opts o = {.alg = TG_FIXED_WINDOW_PER_KEY,
            .capacity = 512,
            .older_ms = 10,
            .clean_period_ms = 5,
            .clock = shared_clock_read,
            .clock_ctx = &clk,
            .before_clean = destroy_in_hook,
            .before_clean_ctx = &d};
  d.lim = make(&o);
  char key[8];
  /* 200 keys: four calls of before_clean in a pass, were it not stopped */
  for (int i = 0; i < 200; i++) {
    int len = snprintf(key, sizeof key, "k%d", i);
    hit(d.lim, T0, key, (size_t)len, &q, 1);
  }
  assert_int_equal(threads_now(), before + 1);
  __atomic_store_n(&clk.now_us, T0 + MS(3000), __ATOMIC_RELEASE);
  /* the limiter is the thread's now: wait for the thread to end */
  double deadline = seconds_now() + 10.0;
  while ((__atomic_load_n(&d.calls, __ATOMIC_ACQUIRE) == 0 ||
          threads_now() > before) &&
         seconds_now() < deadline)
    sleep_ms(1);
  assert_int_equal(threads_now(), before);
  assert_int_equal(__atomic_load_n(&d.calls, __ATOMIC_ACQUIRE), 1);
}

/* tg_limiter_destroy during a pass of the cleaning thread ends the pass:
 * it waits for the call of before_clean in progress, not for the 39 more a
 * whole pass would make. The first call holds the pass until the test is
 * about to destroy, then gives destroy 200 ms to raise its flag (the
 * verdict does not depend on it being quick: a late flag lets at most two
 * more calls in). Before, destroy waited for the whole pass: 40 calls. */
typedef struct slow_hook {
  int calls;      /* __atomic */
  int destroying; /* __atomic: set by the test just before destroy */
} slow_hook;

static int slow_cb(tg_algorithm alg, const tg_expired *e, size_t n, void *ctx) {
  (void)alg;
  (void)e;
  (void)n;
  slow_hook *h = ctx;
  if (__atomic_fetch_add(&h->calls, 1, __ATOMIC_ACQ_REL) == 0) {
    double deadline = seconds_now() + 10.0;
    while (!__atomic_load_n(&h->destroying, __ATOMIC_ACQUIRE) &&
           seconds_now() < deadline)
      sleep_ms(1);
    sleep_ms(200);
  }
  return 0;
}

static void destroy_ends_a_pass_in_progress(void **state) {
  (void)state;
  const tg_quota q = {.limit = 10, .period_ms = 1000};
  static shared_clock clk;
  static slow_hook h;
  __atomic_store_n(&clk.now_us, T0, __ATOMIC_RELEASE);
  h.calls = h.destroying = 0;
  opts o = {.alg = TG_FIXED_WINDOW_PER_KEY,
            .capacity = 4096,
            .older_ms = 10,
            .clean_period_ms = 5,
            .clock = shared_clock_read,
            .clock_ctx = &clk,
            .before_clean = slow_cb,
            .before_clean_ctx = &h};
  tg_limiter *lim = make(&o);
  char key[16];
  /* 2,560 keys: 40 calls of before_clean of 64 keys each in a pass */
  for (int i = 0; i < 2560; i++) {
    int len = snprintf(key, sizeof key, "k%d", i);
    hit(lim, T0, key, (size_t)len, &q, 1);
  }
  __atomic_store_n(&clk.now_us, T0 + MS(3000), __ATOMIC_RELEASE);
  double deadline = seconds_now() + 10.0;
  while (__atomic_load_n(&h.calls, __ATOMIC_ACQUIRE) == 0 &&
         seconds_now() < deadline)
    sleep_ms(1);
  assert_int_equal(__atomic_load_n(&h.calls, __ATOMIC_ACQUIRE), 1);
  __atomic_store_n(&h.destroying, 1, __ATOMIC_RELEASE);
  tg_limiter_destroy(lim);
  int calls = __atomic_load_n(&h.calls, __ATOMIC_ACQUIRE);
  assert_in_range(calls, 1, 3);
}

/* A cleaning pass racing with the creation of keys must not report them:
 * every key here is live (one hit of a one-hour quota, all at T0), so
 * before_clean has nothing to see and no pass may remove anything. A worker
 * creates new keys while this thread cleans in a loop at T0; it stops at the
 * first entry reported, or after CREATE_MAX keys / CREATE_SECONDS. */
#define CREATE_MAX 300000
#define CREATE_SECONDS 1.0

typedef struct creation {
  tg_limiter *lim;
  int stop;        /* __atomic: set by the cleaning thread */
  int done;        /* __atomic: set by the worker */
  unsigned errors; /* worker: failed or denied hits */
  unsigned created;
  size_t reported; /* cleaning thread (before_clean) */
  uint64_t first_value, first_at_ms;
  char first_key[16];
} creation;

static int creation_cb(tg_algorithm alg, const tg_expired *e, size_t n,
                       void *ctx) {
  (void)alg;
  creation *c = ctx;
  if (c->reported == 0 && n > 0) {
    c->first_value = e[0].value;
    c->first_at_ms = e[0].expired_at_ms;
    size_t len = e[0].key_len < 15 ? e[0].key_len : 15;
    memcpy(c->first_key, e[0].key, len);
    c->first_key[len] = 0;
  }
  c->reported += n;
  return 0;
}

static void *creator(void *arg) {
  creation *c = arg;
  const tg_quota q = {.limit = 100, .period_ms = 3600000};
  char key[16];
  double end = seconds_now() + CREATE_SECONDS;
  for (unsigned i = 0; i < CREATE_MAX; i++) {
    if (__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE) ||
        ((i & 1023) == 0 && seconds_now() > end))
      break;
    int len = snprintf(key, sizeof key, "key-%u", i);
    tg_result r;
    if (tg_hit_at(c->lim, T0, key, (size_t)len, &q, 1, &r) != TG_OK ||
        !r.allowed)
      c->errors++;
    c->created++;
  }
  __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void before_clean_never_sees_creation(void **state) {
  (void)state;
  size_t total_reported = 0, total_removed = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ON(all_algs[a]);
    creation *c = calloc(1, sizeof *c);
    assert_non_null(c);
    opts o = {.alg = all_algs[a],
              .capacity = CREATE_MAX,
              .older_ms = 0,
              .before_clean = creation_cb,
              .before_clean_ctx = c};
    c->lim = make(&o);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, creator, c), 0);
    size_t removed = 0;
    while (!__atomic_load_n(&c->done, __ATOMIC_ACQUIRE)) {
      size_t n = 0;
      assert_int_equal(tg_clean_at(c->lim, T0, &n), TG_OK);
      removed += n;
      if (c->reported)
        __atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
    }
    pthread_join(th, NULL);
    if (c->reported || removed)
      print_error("%s: %u live keys created during passes at T0; "
                  "before_clean got %zu (first: \"%s\", value %" PRIu64
                  ", expired_at_ms %" PRIu64 "), passes removed %zu\n",
                  tg_algorithm_name(all_algs[a]), c->created, c->reported,
                  c->first_key, c->first_value, c->first_at_ms, removed);
    assert_int_equal(c->errors, 0);
    assert_int_equal(tg_key_count(c->lim), c->created);
    total_reported += c->reported;
    total_removed += removed;
    tg_limiter_destroy(c->lim);
    free(c);
  }
  current = NULL;
  assert_int_equal(total_reported, 0);
  assert_int_equal(total_removed, 0);
}

/* ---- the reclaim horizon ---- */

/* After a pass reclaimed a key whose state expired at E, a call made with an
 * earlier now (as from a thread that read its clock before the pass) finds
 * the key absent and is evaluated at E: it gets exactly the answer the
 * unreclaimed key gives at E. Twin limiters with the same history: one
 * cleaned, one not. */
static void horizon_evaluates_at_expiry(void **state) {
  (void)state;
  const tg_quota q = {.limit = 2, .period_ms = 1000, .burst = 2};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    ON(alg);
    opts o = {.alg = alg, .capacity = 16, .older_ms = 0};
    tg_limiter *cleaned = make(&o), *kept = make(&o);
    uint64_t t1 = T0 + MS(100);
    hit(cleaned, t1, S("k"), &q, 2);
    hit(kept, t1, S("k"), &q, 2);
    uint64_t e = MS(expires(kept, t1, S("k"), &q)); /* whole ms here */
    size_t removed = 0;
    assert_int_equal(tg_clean_at(cleaned, e + MS(5000), &removed), TG_OK);
    assert_int_equal(removed, 1);

    uint64_t now1 = e - MS(300); /* t1 < now1 < E */
    assert_true(now1 > t1);
    tg_result late = hit(cleaned, now1, S("k"), &q, 1);
    tg_result at_e = hit(kept, e, S("k"), &q, 1);
    assert_same_result(&late, &at_e);
    assert_true(late.allowed);
    /* from then on both twins hold the same state (the key exists again,
     * so a later call at now1 is not moved to E: it reads that state at
     * now1, as the header describes for an earlier now) */
    assert_int_equal(get(cleaned, now1, S("k"), &q),
                     get(kept, now1, S("k"), &q));
    assert_int_equal(expires(cleaned, now1, S("k"), &q),
                     expires(kept, now1, S("k"), &q));
    tg_limiter_destroy(cleaned);
    tg_limiter_destroy(kept);
  }
  current = NULL;
}

/* What the implementation does beyond the header (which speaks of "a key the
 * memory store has reclaimed"): the horizon is one value for the whole table,
 * so after the pass above even a key never seen before, called at now1 < E,
 * is evaluated at E. This pins the current behaviour. */
static void horizon_is_table_wide(void **state) {
  (void)state;
  const tg_quota q = {.limit = 2, .period_ms = 1000, .burst = 2};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ON(all_algs[a]);
    opts o = {.alg = all_algs[a], .capacity = 16, .older_ms = 0};
    tg_limiter *cleaned = make(&o), *other = make(&o);
    uint64_t t1 = T0 + MS(100);
    hit(cleaned, t1, S("k"), &q, 2);
    uint64_t e = MS(expires(cleaned, t1, S("k"), &q));
    size_t removed = 0;
    assert_int_equal(tg_clean_at(cleaned, e + MS(5000), &removed), TG_OK);
    assert_int_equal(removed, 1);
    uint64_t now1 = e - MS(300);
    tg_result r = hit(cleaned, now1, S("new"), &q, 1);
    tg_result at_e = hit(other, e, S("new"), &q, 1);
    hit(other, now1, S("new2"), &q, 1);
    assert_same_result(&r, &at_e);
    /* its state is the one written at E, not at now1 */
    assert_int_equal(expires(cleaned, now1, S("new"), &q),
                     expires(other, now1, S("new"), &q));
    assert_true(expires(cleaned, now1, S("new"), &q) !=
                expires(other, now1, S("new2"), &q));
    tg_limiter_destroy(cleaned);
    tg_limiter_destroy(other);
  }
  current = NULL;
}

/* ---- memory ---- */

/* tg_store_bytes: what the table has reserved. A new table is its header
 * and slots (ctrl word + 48-byte slot, at 7/8 load): at most 64 bytes per
 * unit of capacity, whatever long_keys and sliding_max_entries allow. The
 * long-key chunks (256 B) and log blocks are mapped in extents as keys
 * need them (tg__table): after n keys that use them, at most twice their
 * bytes more, plus a first extent of 64 KiB. And every key keeps its own
 * chunk or block: each is decided again after later extents were added. */
static void store_bytes_follow_keys(void **state) {
  (void)state;
  const uint64_t cap = 65536, n = 3000;
  const tg_quota q = {.limit = 2, .period_ms = 60000, .burst = 2};
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    ON(alg);
    bool sliding = alg == TG_SLIDING_WINDOW;
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = alg;
    cfg.capacity = cap;
    cfg.clean_period_ms = 0;
    cfg.sliding_max_entries = 8;
    tg_limiter *lim = NULL;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
    size_t fresh = tg_store_bytes(lim);
    if (a == 0)
      printf("store_bytes: capacity %" PRIu64 ": %zu bytes new (%.2f per"
             " unit)",
             cap, fresh, (double)fresh / (double)cap);
    assert_true(fresh <= 64 * cap + 1024);
    /* a table of the same shape with room for no long key and a one-entry
     * log reserves the same: nothing is set aside for either up front */
    tg_config small = cfg;
    small.long_keys = 1;
    small.sliding_max_entries = 1;
    tg_limiter *lim1 = NULL;
    assert_int_equal(tg_limiter_new(&lim1, &small), TG_OK);
    assert_int_equal(tg_store_bytes(lim1), fresh);
    tg_limiter_destroy(lim1);
    /* n long keys: n chunks, and n blocks for a sliding window */
    char key[48];
    for (int round = 0; round < 2; round++)
      for (uint64_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "a-long-key-of-forty-bytes-%013" PRIu64, i);
        tg_result r = hit(lim, 1000, key, 40, &q, 1);
        assert_true(r.allowed);
        assert_int_equal(r.remaining, round == 0 ? 1 : 0);
      }
    assert_int_equal(tg_key_count(lim), n);
    /* a one-entry log (both rounds at one instant) takes a 64-byte block */
    uint64_t unit = TG_KEY_MAX + (sliding ? 64 : 0);
    size_t grown = tg_store_bytes(lim);
    if (a == 0)
      printf(", %zu after %" PRIu64 " long keys\n", grown, n);
    assert_true(grown >= fresh + n * unit);
    assert_true(grown <= fresh + 2 * n * unit + (sliding ? 2u : 1u) * 65536u);
    /* every key again: each kept its count (denied now) */
    for (uint64_t i = 0; i < n; i++) {
      snprintf(key, sizeof key, "a-long-key-of-forty-bytes-%013" PRIu64, i);
      tg_result r = hit(lim, 1000, key, 40, &q, 1);
      assert_false(r.allowed);
    }
    tg_limiter_destroy(lim);
  }
  current = NULL;
}

/* ---- what a decision writes ---- */

/* One call of op on a sliding table, which must succeed. */
static tg__outcome log_call(tg__table *t, tg__op op, const char *key,
                            const tg__quota *q, uint64_t arg, uint64_t now) {
  tg__call c = {.op = op,
                .alg = TG_SLIDING_WINDOW,
                .key = key,
                .key_len = strlen(key),
                .q = *q,
                .arg = arg,
                .now_us = now};
  tg__outcome o;
  assert_int_equal(tg__table_exec(t, &c, &o), TG_OK);
  return o;
}

/* The table validates with no broken invariant and nothing leaked; returns
 * its LIVE slots. */
static uint64_t table_sound(const tg__table *t) {
  tg__table_check r;
  assert_int_equal(tg__table_validate(t, &r), TG_OK);
  if (r.errors)
    print_error("validate: %s\n", r.first_error);
  assert_int_equal(r.errors, 0);
  assert_int_equal(r.leaked, 0);
  return r.live_slots;
}

/* The memory store's sliding logs start in a 64-byte block and move to one
 * twice as large each time a call that appends finds them full (table.h,
 * TG__LOG_CLASSES), up to a whole sliding_max_entries log. Driven on the
 * table itself: keys of every log length answer as the model does (limit
 * exactly, the log's sum), a one-entry key costs a 64-byte block and a
 * denied or free call does not move it, the table validates (every block
 * owned once, free lists sound, nothing leaked) after the logs grew and
 * after the cleaner reclaimed them, and when the keys come back (from the
 * free lists: no extent is added). */
static void sliding_logs_grow_by_class(void **state) {
  (void)state;
  const tg__table_params p = {.algorithm = TG_SLIDING_WINDOW,
                              .capacity = 256,
                              .long_keys = 16,
                              .log_entries = 100};
  size_t core = tg__table_core_bytes(&p);
  void *mem = mmap(NULL, core, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(mem != MAP_FAILED);
  tg__table t;
  assert_int_equal(tg__table_init_grow(&t, mem, &p), TG_OK);
  /* 64, 128, 256, 512, 1024 B (1, 5, 13, 29, 61 entries), then class 0 */
  assert_int_equal(t.nclass, 6);
  assert_int_equal(t.lcap[1], 1);
  assert_int_equal(t.lcap[5], 61);
  assert_int_equal(t.lcap[0], 100);
  const tg_quota uq = {.limit = 150, .period_ms = 1000};
  tg__quota q;
  assert_int_equal(tg__quota_prepare(&q, &uq, TG_SLIDING_WINDOW), TG_OK);
  /* a key of one entry takes a block of class 1 (64 bytes), and nothing
   * of any other class is handed out */
  (void)log_call(&t, TG__OP_HIT, "one", &q, 1, T0);
  assert_int_equal(t.lbump[1], 1);
  /* a call that is denied, or costs nothing, appends nothing: the full
   * one-entry ring does not move up for it */
  const tg_quota uq1 = {.limit = 1, .period_ms = 1000};
  tg__quota q1;
  assert_int_equal(tg__quota_prepare(&q1, &uq1, TG_SLIDING_WINDOW), TG_OK);
  assert_false(log_call(&t, TG__OP_HIT, "one", &q1, 1, T0 + 10).r.allowed);
  (void)log_call(&t, TG__OP_HIT, "one", &q1, 0, T0 + 20);
  for (unsigned c = 2; c < t.nclass; c++)
    assert_int_equal(t.lbump[c], 0);
  assert_int_equal(t.h->log_bump, 0);
  char key[16];
  /* key k gets k + 1 hits at distinct microseconds: logs of every class;
   * past 100 entries the newest merge, and still no more than the limit */
  for (uint64_t k = 0; k < 160; k++) {
    snprintf(key, sizeof key, "log%" PRIu64, k);
    for (uint64_t h = 0; h <= k; h++) {
      tg__outcome o = log_call(&t, TG__OP_HIT, key, &q, 1, T0 + h);
      assert_int_equal(o.r.allowed, h < 150);
      assert_int_equal(o.r.remaining, h < 150 ? 149 - h : 0);
    }
    assert_int_equal(log_call(&t, TG__OP_GET, key, &q, 0, T0 + k).value,
                     k < 150 ? k + 1 : 150);
  }
  assert_int_equal(table_sound(&t), 161);
  /* all decayed a period later: the cleaner frees every block */
  size_t removed = 0;
  assert_int_equal(
      tg__table_clean(&t, T0 + MS(5000), 0, NULL, NULL, NULL, &removed), TG_OK);
  assert_int_equal(removed, 161);
  (void)table_sound(&t);
  /* the same keys again: blocks come from the free lists, nothing new */
  uint64_t mapped = t.ext_bytes;
  for (uint64_t k = 0; k < 160; k++) {
    snprintf(key, sizeof key, "log%" PRIu64, k);
    for (uint64_t h = 0; h <= k % 20; h++)
      assert_true(
          log_call(&t, TG__OP_HIT, key, &q, 1, T0 + MS(10000) + h).r.allowed);
  }
  assert_int_equal(t.ext_bytes, mapped);
  (void)table_sound(&t);
  tg__table_unmap_extents(&t);
  munmap(mem, core);
}

/* README and table.c: a bucket's denied decision writes nothing at all, and
 * neither does a peek, a get or an expires_at on a bucket, nor any of them
 * on a key the table does not hold (the cache line stays shared between the
 * threads hammering a key). The limiter does not expose its mapping, so this
 * drives the table the way the memory store does (src/store/table.h): a
 * forked child makes the whole region read-only, then makes the calls; any
 * write faults, and the child's handler exits with WROTE. Two controls prove
 * the harness sees writes: a fixed window counts its denied calls, and an
 * allowed bucket call consumes. */
#define WROTE 99

static void exit_wrote(int sig) {
  (void)sig;
  _exit(WROTE);
}

typedef struct ro_call {
  tg__op op;
  const void *key;
  size_t len;
  uint64_t arg;
  bool allowed; /* hits: the expected decision */
} ro_call;

/* Runs calls[0..n) at now in a child over the table region made read-only.
 * Returns the child's exit status: 0 (no write, every answer as expected),
 * WROTE, 10 + i for a wrong answer to call i, or 200 + signal. */
static int run_read_only(tg__table *t, void *mem, size_t bytes,
                         tg_algorithm alg, const tg__quota *q, uint64_t now,
                         const ro_call *calls, size_t n) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_wrote;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0 ||
        sigaction(SIGBUS, &sa, NULL) != 0 ||
        mprotect(mem, bytes, PROT_READ) != 0)
      _exit(2);
    for (size_t i = 0; i < n; i++) {
      tg__call c = {.op = calls[i].op,
                    .alg = alg,
                    .key = calls[i].key,
                    .key_len = calls[i].len,
                    .q = *q,
                    .arg = calls[i].arg,
                    .now_us = now};
      tg__outcome o;
      if (tg__table_exec(t, &c, &o) != TG_OK ||
          (c.op == TG__OP_HIT && o.r.allowed != calls[i].allowed))
        _exit(10 + (int)i);
    }
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + WTERMSIG(st);
}

static void denied_bucket_decisions_write_nothing(void **state) {
  (void)state;
  unsigned char long_key[40];
  memset(long_key, 'L', sizeof long_key); /* a key in a long-key chunk */
  const tg_quota uq = {.limit = 5, .period_ms = 1000, .burst = 5};
  const tg_algorithm algs[] = {TG_FIXED_WINDOW, TG_TOKEN_BUCKET,
                               TG_LEAKY_BUCKET};
  for (size_t a = 0; a < sizeof algs / sizeof algs[0]; a++) {
    tg_algorithm alg = algs[a];
    ON(alg);
    const tg__table_params p = {
        .algorithm = alg, .capacity = 16, .long_keys = 16, .log_entries = 1};
    size_t bytes = tg__table_bytes(&p);
    assert_true(bytes > 0);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    tg__table t;
    assert_int_equal(tg__table_init(&t, mem, &p), TG_OK);
    tg__quota q;
    assert_int_equal(tg__quota_prepare(&q, &uq, alg), TG_OK);
    /* both keys use up their quota (5 of 5) */
    for (int k = 0; k < 2; k++) {
      tg__call c = {.op = TG__OP_HIT,
                    .alg = alg,
                    .key = k ? (const void *)long_key : "k",
                    .key_len = k ? sizeof long_key : 1,
                    .q = q,
                    .arg = 5,
                    .now_us = T0};
      tg__outcome o;
      assert_int_equal(tg__table_exec(&t, &c, &o), TG_OK);
      assert_true(o.r.allowed);
    }
    /* 1 ms later (a token takes 200 ms): everything below is denied or
     * reads only */
    const ro_call reads[] = {
        {TG__OP_HIT, "k", 1, 1, false},
        {TG__OP_HIT, long_key, sizeof long_key, 1, false},
        {TG__OP_HIT, "k", 1, 3, false},
        {TG__OP_HIT, "k", 1, 6, false}, /* above burst: TG_NEVER */
        {TG__OP_HIT, "k", 1, 0, true},  /* a peek */
        {TG__OP_GET, "k", 1, 0, false},
        {TG__OP_EXPIRES, "k", 1, 0, false},
        {TG__OP_HIT, "nobody", 6, 6, false},
        {TG__OP_HIT, "nobody", 6, 0, true},
        {TG__OP_GET, "nobody", 6, 0, false},
        {TG__OP_EXPIRES, "nobody", 6, 0, false},
    };
    int st = run_read_only(&t, mem, bytes, alg, &q, T0 + MS(1), reads,
                           sizeof reads / sizeof reads[0]);
    if (alg == TG_FIXED_WINDOW) {
      assert_int_equal(st, WROTE); /* control: the denied call is counted */
    } else {
      if (st != 0)
        print_error("%s: read-only child: status %d (%d: a write)\n",
                    tg_algorithm_name(alg), st, WROTE);
      assert_int_equal(st, 0);
      /* control: a second later a token is back, and taking it writes */
      const ro_call take[] = {{TG__OP_HIT, "k", 1, 1, true}};
      assert_int_equal(
          run_read_only(&t, mem, bytes, alg, &q, T0 + MS(1000), take, 1),
          WROTE);
    }
    munmap(mem, bytes);
  }
  current = NULL;
}

/* tg_hit_batch on the table: the keys of each group of 16 are hashed and
 * their slots fetched before the group is decided, and a batch of more
 * than 32 items allocates its arrays. Neither may change an answer: 100
 * items (groups of 16 and a partial one, past the stack's 32), with
 * repeats of one key inside a group and across groups, long keys, a new
 * key created inside a batch and met again later in it, and invalid items
 * in between, answer as the same calls one by one on a twin limiter, for
 * every algorithm, over several batches at advancing times. */
static void batch_answers_as_single_calls(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    opts o = {.alg = (tg_algorithm)a, .capacity = 512};
    tg_limiter *lb = make(&o), *ls = make(&o);
    const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 3};
    const tg_quota bad = {.limit = 0, .period_ms = 1000};
    static char keys[100][40];
    tg_batch_item it[100];
    uint64_t rng = 0x1234567u + (uint64_t)a;
    for (int round = 0; round < 20; round++) {
      uint64_t now = T0 + (uint64_t)round * MS(150);
      for (int i = 0; i < 100; i++) {
        rng = rng * 6364136223846793005u + 1442695040888963407u;
        unsigned k = (unsigned)(rng >> 33) % 40u; /* 40 keys: many repeats */
        size_t len = k % 3 == 0 ? 33 : 8;         /* every third key long */
        memset(keys[i], 'b', sizeof keys[i]);
        keys[i][0] = (char)('A' + k);
        it[i] = (tg_batch_item){keys[i], len, &q, 1 + (rng >> 60) % 2, -1, {0}};
        if (i % 23 == 7)
          it[i].q = &bad; /* invalid: TG_EQUOTA, decided by nobody */
        if (i % 31 == 11)
          it[i].key_len = 0; /* invalid: TG_EINVAL */
      }
      assert_int_equal(tg_hit_batch_at(lb, now, it, 100), TG_OK);
      for (int i = 0; i < 100; i++) {
        tg_result r;
        int rc = tg_hit_at(ls, now, it[i].key, it[i].key_len, it[i].q,
                           it[i].cost, &r);
        const tg_result *b = &it[i].result;
        bool same = r.allowed == b->allowed && r.degraded == b->degraded &&
                    r.shadow_denied == b->shadow_denied &&
                    r.count == b->count && r.remaining == b->remaining &&
                    r.retry_after_ms == b->retry_after_ms &&
                    r.reset_after_ms == b->reset_after_ms;
        if (rc != it[i].status || !same)
          print_error("%s round %d item %d: batch %d/%d/%" PRIu64
                      " single %d/%d/%" PRIu64 "\n",
                      tg_algorithm_name((tg_algorithm)a), round, i,
                      it[i].status, it[i].result.allowed,
                      it[i].result.remaining, rc, r.allowed, r.remaining);
        assert_int_equal(rc, it[i].status);
        assert_true(same);
      }
    }
    assert_int_equal(tg_key_count(lb), tg_key_count(ls));
    tg_limiter_destroy(lb);
    tg_limiter_destroy(ls);
  }
}

int main(void) {
  /* a deadlock (e.g. in before_clean) fails the run instead of hanging it */
  alarm(300);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(full_table_policies, report_current),
      cmocka_unit_test_teardown(decayed_keys_make_room, report_current),
      cmocka_unit_test_teardown(long_and_binary_keys, report_current),
      cmocka_unit_test_teardown(near_duplicates_never_alias, report_current),
      cmocka_unit_test_teardown(long_keys_exhausted, report_current),
      cmocka_unit_test(batch_answers_as_single_calls),
      cmocka_unit_test_teardown(long_keys_reclaim_decayed, report_current),
      cmocka_unit_test_teardown(reset_frees_slot, report_current),
      cmocka_unit_test_teardown(clean_removes_exactly_the_old, report_current),
      cmocka_unit_test_teardown(clean_batches_of_64, report_current),
      cmocka_unit_test_teardown(before_clean_reenters, report_current),
      cmocka_unit_test_teardown(background_thread_cleans, report_current),
      cmocka_unit_test_teardown(destroy_stops_thread_promptly, report_current),
      cmocka_unit_test_teardown(before_clean_never_sees_creation,
                                report_current),
      cmocka_unit_test_teardown(horizon_evaluates_at_expiry, report_current),
      cmocka_unit_test_teardown(horizon_is_table_wide, report_current),
      cmocka_unit_test_teardown(store_bytes_follow_keys, report_current),
      cmocka_unit_test(sliding_logs_grow_by_class),
      cmocka_unit_test(destroy_from_before_clean),
      cmocka_unit_test(destroy_ends_a_pass_in_progress),
      cmocka_unit_test_teardown(denied_bucket_decisions_write_nothing,
                                report_current),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
