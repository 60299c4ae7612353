/* SPDX-License-Identifier: MIT */
/*
 * test_horizon.c - the reclaim horizon, bounded (tollgate.h, "Operations"):
 * a key the table does not hold is evaluated no earlier than the latest
 * expiry of a reclaimed state, but never further past the call's now than
 * the longest reach (a period, or a bucket's burst * T) of any key the table
 * has held; a horizon beyond now + TG_PERIOD_MAX_MS is cleared; and a reset
 * key is evaluated at the caller's own now, exactly as a key never seen in
 * a fresh table.
 *
 *   1. the clock jumps 10 years forward, a cleaning pass reclaims keys
 *      there, the clock comes back: a new key answers as in a fresh table,
 *      and is never told to wait longer than its period;
 *   2. 8 bytes written into a segment's horizon (5 years ahead) do not hold
 *      new keys in the future, nor after a restart;
 *   3. a key whose window lies 10 years ahead (it was written then) is
 *      fresh again after tg_reset; and a reset key is an absent key even
 *      for a clock stepping back: a write that leaves it fresh creates
 *      nothing an earlier call could see (the Redis store's differential
 *      test found the difference);
 *   4. within its reach the horizon still does its job: a clock stepping
 *      back 30 s does not revive a reclaimed window's count; 2 minutes back
 *      (beyond the 1-minute period) the call runs at its own time;
 *   5. a bucket's reach is its tolerance, not its period;
 *   6. and a reservation's state reaches its wait further;
 *   7. a sliding log whose entries are at now 0 is live, not a log that
 *      never kept one: a cleaning pass keeps it (tollgate.h, "Cleanup":
 *      reclaiming changes no answer).
 * Each runs on the memory store and on a shared segment.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/table.h"
#include "tollgate.h"

#define T0 UINT64_C(1700000000000000) /* us */
#define S_US UINT64_C(1000000)
#define YEAR_US (UINT64_C(365) * 86400 * S_US)

static const tg_quota q = {.limit = 3, .period_ms = 60000, .burst = 3};

static char seg[64];

static int unlink_seg(void **state) {
  (void)state;
  if (seg[0])
    tg_shm_unlink(seg);
  seg[0] = '\0';
  return 0;
}

/* A limiter that runs no cleaning thread; shared: in a new segment. */
static tg_limiter *make(tg_algorithm alg, bool shared) {
  static unsigned serial;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.capacity = 64;
  cfg.clean_period_ms = 0;
  cfg.key_older_than_ms = 0;
  if (shared) {
    if (!seg[0])
      snprintf(seg, sizeof seg, "/tg-horizon-%ld-%u", (long)getpid(), serial++);
    cfg.shm_name = seg;
  }
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static tg_result hit(tg_limiter *lim, uint64_t now, const char *key,
                     const tg_quota *qq, uint64_t cost) {
  tg_result r;
  assert_int_equal(tg_hit_at(lim, now, key, strlen(key), qq, cost, &r), TG_OK);
  return r;
}

static void same(const tg_result *a, const tg_result *b, const char *what) {
  if (a->allowed != b->allowed || a->count != b->count ||
      a->remaining != b->remaining || a->retry_after_ms != b->retry_after_ms ||
      a->reset_after_ms != b->reset_after_ms)
    print_error("%s: got {allowed %d count %" PRIu64 " remaining %" PRIu64
                " retry %" PRIu64 " reset %" PRIu64 "}, a fresh table says "
                "{%d %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "}\n",
                what, a->allowed, a->count, a->remaining, a->retry_after_ms,
                a->reset_after_ms, b->allowed, b->count, b->remaining,
                b->retry_after_ms, b->reset_after_ms);
  assert_int_equal(a->allowed, b->allowed);
  assert_int_equal(a->count, b->count);
  assert_int_equal(a->remaining, b->remaining);
  assert_int_equal(a->retry_after_ms, b->retry_after_ms);
  assert_int_equal(a->reset_after_ms, b->reset_after_ms);
}

/* Hits key at now until denied (at most limit + 1 times): the wait it is
 * told must never exceed one period. */
static void never_held_in_the_future(tg_limiter *lim, uint64_t now,
                                     const char *key, const char *what) {
  for (uint64_t i = 0; i <= q.limit; i++) {
    tg_result r = hit(lim, now, key, &q, 1);
    if (r.retry_after_ms > q.period_ms || r.reset_after_ms > q.period_ms)
      print_error("%s: hit %" PRIu64 " of %s: retry_after_ms %" PRIu64
                  ", reset_after_ms %" PRIu64 " (period %" PRIu64 " ms)\n",
                  what, i + 1, key, r.retry_after_ms, r.reset_after_ms,
                  q.period_ms);
    assert_true(r.retry_after_ms <= q.period_ms);
    assert_true(r.reset_after_ms <= q.period_ms);
    if (!r.allowed)
      return;
  }
}

/* Keys hit 10 years ahead, then reclaimed there by a cleaning pass: the
 * horizon is then ~10 years ahead of the real time. */
static void jump_forward_and_clean(tg_limiter *lim) {
  const uint64_t j = T0 + 10 * YEAR_US;
  for (int i = 0; i < 8; i++) {
    char key[8];
    snprintf(key, sizeof key, "x%d", i);
    hit(lim, j, key, &q, 2);
  }
  size_t removed = 0;
  assert_int_equal(tg_clean_at(lim, j + 120 * S_US, &removed), TG_OK);
  assert_true(removed >= 8); /* and any key left at the real time */
}

/* ---- 1. ---- */

static void clock_jump_forward_and_back(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++)
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      tg_algorithm alg = (tg_algorithm)a;
      tg_limiter *lim = make(alg, shared), *fresh = make(alg, false);
      hit(lim, T0, "here", &q, 1);
      jump_forward_and_clean(lim);
      /* back to the real time */
      const uint64_t now = T0 + S_US;
      tg_result got = hit(lim, now, "new", &q, 1);
      tg_result want = hit(fresh, now, "new", &q, 1);
      same(&got, &want, tg_algorithm_name(alg));
      never_held_in_the_future(lim, now, "new", tg_algorithm_name(alg));
      never_held_in_the_future(lim, now, "another", tg_algorithm_name(alg));
      tg_limiter_destroy(fresh);
      tg_limiter_destroy(lim);
      unlink_seg(NULL);
    }
}

/* ---- 2. ---- */

static uint64_t *map_horizon(void **mem, size_t *size) {
  int fd = shm_open(seg, O_RDWR, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  *size = (size_t)st.st_size;
  *mem = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(*mem != MAP_FAILED);
  return &((tg__table_hdr *)*mem)->horizon_us;
}

static void hostile_horizon_bytes(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = (tg_algorithm)a;
    tg_limiter *lim = make(alg, true), *fresh = make(alg, false);
    hit(lim, T0, "here", &q, 1);
    void *mem;
    size_t size;
    uint64_t *hz = map_horizon(&mem, &size);
    const uint64_t ahead = T0 + 5 * YEAR_US;
    memcpy(hz, &ahead, sizeof ahead); /* 8 bytes, from another process */
    tg_result got = hit(lim, T0, "new", &q, 1);
    tg_result want = hit(fresh, T0, "new", &q, 1);
    same(&got, &want, tg_algorithm_name(alg));
    never_held_in_the_future(lim, T0, "new", tg_algorithm_name(alg));
    /* a restart: the segment keeps the bytes, and they still do nothing */
    tg_limiter_destroy(lim);
    lim = make(alg, true);
    never_held_in_the_future(lim, T0, "after-restart", tg_algorithm_name(alg));
    munmap(mem, size);
    tg_limiter_destroy(fresh);
    tg_limiter_destroy(lim);
    unlink_seg(NULL);
  }
}

/* ---- 3. ---- */

static void reset_makes_a_key_fresh_now(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++)
    for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
      tg_algorithm alg = (tg_algorithm)a;
      tg_limiter *lim = make(alg, shared), *fresh = make(alg, false);
      jump_forward_and_clean(lim);
      hit(lim, T0 + 10 * YEAR_US + 180 * S_US, "k", &q, 3); /* written then */
      /* state never moves backwards: "k" is still ahead of the real time */
      const uint64_t now = T0 + S_US;
      assert_int_equal(tg_reset(lim, "k", 1), TG_OK);
      tg_result got = hit(lim, now, "k", &q, 1);
      tg_result want = hit(fresh, now, "k", &q, 1);
      same(&got, &want, tg_algorithm_name(alg));
      never_held_in_the_future(lim, now, "k", tg_algorithm_name(alg));
      tg_limiter_destroy(fresh);
      tg_limiter_destroy(lim);
      unlink_seg(NULL);
    }
}

/* The same calls on a reset key and on a key never seen: tg_set to a value
 * that leaves the state fresh at X, then a hit 30 ms before X. */
static void reset_key_is_absent_stepping_back(void **state) {
  (void)state;
  const tg_algorithm algs[] = {TG_FIXED_WINDOW, TG_TOKEN_BUCKET,
                               TG_LEAKY_BUCKET};
  for (int shared = 0; shared < 2; shared++)
    for (size_t a = 0; a < sizeof algs / sizeof algs[0]; a++) {
      tg_algorithm alg = algs[a];
      tg_limiter *lim = make(alg, shared), *fresh = make(alg, false);
      const uint64_t x = T0 + 10 * S_US;
      /* the value a key never seen has: setting it changes nothing */
      const uint64_t v = alg == TG_TOKEN_BUCKET ? q.burst : 0;
      hit(lim, T0, "k", &q, 2);
      assert_int_equal(tg_reset(lim, "k", 1), TG_OK);
      tg_limiter *both[2] = {lim, fresh};
      tg_result r[2];
      uint64_t got[2];
      for (int i = 0; i < 2; i++) {
        assert_int_equal(tg_set_at(both[i], x, "k", 1, &q, v), TG_OK);
        r[i] = hit(both[i], x - 30000, "k", &q, 1);
        assert_int_equal(tg_get_at(both[i], x - 30000, "k", 1, &q, &got[i]),
                         TG_OK);
      }
      same(&r[0], &r[1], tg_algorithm_name(alg));
      assert_int_equal(got[0], got[1]);
      tg_limiter_destroy(fresh);
      tg_limiter_destroy(lim);
      unlink_seg(NULL);
    }
}

/* ---- 4. ---- */

static void within_reach_still_applies(void **state) {
  (void)state;
  for (int shared = 0; shared < 2; shared++) {
    tg_limiter *lim = make(TG_FIXED_WINDOW, shared);
    /* the window [w, e) where T0 lies */
    const uint64_t p = q.period_ms * 1000, e = (T0 / p + 1) * p;
    for (int i = 0; i < 3; i++)
      assert_true(hit(lim, T0, "a", &q, 1).allowed);
    assert_false(hit(lim, T0, "a", &q, 1).allowed);
    size_t removed = 0;
    assert_int_equal(tg_clean_at(lim, e + 1000, &removed), TG_OK);
    assert_int_equal(removed, 1); /* the horizon is e */
    /* 30 s before e: the count of [w, e) is not revived as fresh there;
     * the call is evaluated at e, in the next window */
    uint64_t at = 0;
    assert_true(hit(lim, e - 30 * S_US, "a", &q, 1).allowed);
    assert_int_equal(tg_expires_at_at(lim, e - 30 * S_US, "a", 1, &q, &at),
                     TG_OK);
    assert_int_equal(at, (e + p) / 1000);
    /* 2 minutes before e, more than any period here: its own time */
    assert_true(hit(lim, e - 120 * S_US, "b", &q, 1).allowed);
    assert_int_equal(tg_expires_at_at(lim, e - 120 * S_US, "b", 1, &q, &at),
                     TG_OK);
    assert_int_equal(at, (e - p) / 1000);
    tg_limiter_destroy(lim);
    unlink_seg(NULL);
  }
}

/* ---- 5. ---- */

static void bucket_reach_is_its_tolerance(void **state) {
  (void)state;
  /* one token per 1000 s, 10 deep: a drained bucket is full again
   * 10000 s later, so its state reaches 10000 s past the call */
  const tg_quota slow = {.limit = 1, .period_ms = 1000000, .burst = 10};
  const uint64_t full = T0 + 10000 * S_US;
  for (int shared = 0; shared < 2; shared++) {
    tg_limiter *lim = make(TG_TOKEN_BUCKET, shared);
    assert_true(hit(lim, T0, "b", &slow, 10).allowed);
    size_t removed = 0;
    assert_int_equal(tg_clean_at(lim, full + S_US, &removed), TG_OK);
    assert_int_equal(removed, 1); /* the horizon is `full` */
    /* 5000 s before it, within reach: evaluated there, a full bucket */
    tg_result r = hit(lim, full - 5000 * S_US, "c", &slow, 10);
    assert_true(r.allowed);
    /* 20000 s before it: beyond any state's reach, its own time */
    r = hit(lim, full - 20000 * S_US, "d", &slow, 10);
    assert_true(r.allowed);
    uint64_t at = 0;
    assert_int_equal(
        tg_expires_at_at(lim, full - 20000 * S_US, "d", 1, &slow, &at), TG_OK);
    assert_int_equal(at, (full - 10000 * S_US) / 1000);
    assert_int_equal(
        tg_expires_at_at(lim, full - 5000 * S_US, "c", 1, &slow, &at), TG_OK);
    assert_int_equal(at, (full + 10000 * S_US) / 1000);
    tg_limiter_destroy(lim);
    unlink_seg(NULL);
  }
}

/* ---- 6. ---- */

static void reservation_reach_is_its_wait(void **state) {
  (void)state;
  /* one a second, burst 1: a hit, then four reservations (one at a time,
   * or as one-rule policies) queue the key 4 s ahead, its state fresh
   * again only at T0 + 5 s, though a bucket's tolerance (the reach of
   * every key the table created) is 1 s. The hit creates the key, so the
   * reach must come from the reservations themselves. */
  const tg_quota one = {.limit = 1, .period_ms = 1000, .burst = 1};
  for (int shared = 0; shared < 2; shared++)
    for (int policy = 0; policy < 2; policy++) {
      tg_limiter *lim = make(TG_TOKEN_BUCKET, shared);
      assert_true(hit(lim, T0, "r", &one, 1).allowed);
      for (int i = 1; i <= 4; i++) {
        if (policy) {
          tg_rule rule = {lim, "r", 1, &one, 1, 0, {0}};
          tg_rules_reservation res;
          const uint64_t wait = 10000;
          assert_int_equal(
              tg_reserve_rules_at(T0, &rule, 1, &wait, 0, &res, NULL), TG_OK);
          assert_true(res.ok);
          assert_int_equal(res.delay_ms, (uint64_t)i * 1000);
        } else {
          tg_reservation res;
          assert_int_equal(tg_reserve_at(lim, T0, "r", 1, &one, 1, 10000, &res),
                           TG_OK);
          assert_true(res.ok);
          assert_int_equal(res.delay_ms, (uint64_t)i * 1000);
        }
      }
      size_t removed = 0;
      assert_int_equal(tg_clean_at(lim, T0 + 6 * S_US, &removed), TG_OK);
      assert_int_equal(removed, 1); /* the horizon is T0 + 5 s */
      /* the clock steps back to T0 + 2 s: the queue's slots are not given
       * out again. The first call is evaluated at the horizon (a full
       * bucket there), the rest find that state; the key held would allow
       * none */
      int allowed = 0;
      for (uint64_t t = T0 + 2 * S_US; t < T0 + 5 * S_US; t += 10000)
        allowed += hit(lim, t, "r", &one, 1).allowed;
      assert_int_equal(allowed, 1);
      tg_limiter_destroy(lim);
      unlink_seg(NULL);
    }
}

/* ---- 7. ---- */

static void sliding_entries_at_zero_are_live(void **state) {
  (void)state;
  const tg_quota week = {.limit = 3, .period_ms = 7 * 86400000ull};
  for (int shared = 0; shared < 2; shared++) {
    tg_limiter *lim = make(TG_SLIDING_WINDOW, shared);
    for (int i = 0; i < 3; i++)
      assert_true(hit(lim, 0, "z", &week, 1).allowed);
    size_t removed = 9;
    assert_int_equal(tg_clean_at(lim, 2 * 86400 * S_US, &removed), TG_OK);
    assert_int_equal(removed, 0); /* live for 5 more days */
    tg_result r = hit(lim, 2 * 86400 * S_US, "z", &week, 1);
    assert_false(r.allowed);
    assert_int_equal(r.count, 3);
    assert_int_equal(r.retry_after_ms, 5 * 86400000ull);
    tg_limiter_destroy(lim);
    unlink_seg(NULL);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(clock_jump_forward_and_back, unlink_seg),
      cmocka_unit_test_teardown(hostile_horizon_bytes, unlink_seg),
      cmocka_unit_test_teardown(reset_makes_a_key_fresh_now, unlink_seg),
      cmocka_unit_test_teardown(reset_key_is_absent_stepping_back, unlink_seg),
      cmocka_unit_test_teardown(within_reach_still_applies, unlink_seg),
      cmocka_unit_test_teardown(bucket_reach_is_its_tolerance, unlink_seg),
      cmocka_unit_test_teardown(reservation_reach_is_its_wait, unlink_seg),
      cmocka_unit_test_teardown(sliding_entries_at_zero_are_live, unlink_seg),
  };
  return cmocka_run_group_tests(tests, NULL, unlink_seg);
}
