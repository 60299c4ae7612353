/* SPDX-License-Identifier: MIT */
/*
 * test_api.c - the public API's contract outside the algorithms: versions,
 * status codes, configuration, handle lifetime, the clock, and input
 * validation (every bad input is an error code, never a crash, and never
 * changes any state). Written from include/tollgate.h, for all algorithms.
 */
#include "accept_helpers.h"

#include <limits.h>
#include <stdio.h>
#include <time.h>

#define T0 MS(UINT64_C(1700000000777))

static const tg_quota q5 = {.limit = 5, .period_ms = 1000, .burst = 0};

static const tg_algorithm all_algs[TG_ALGORITHM_COUNT] = {
    TG_FIXED_WINDOW, TG_FIXED_WINDOW_PER_KEY, TG_SLIDING_WINDOW,
    TG_TOKEN_BUCKET, TG_LEAKY_BUCKET};

static bool supports_inc(tg_algorithm a) {
  return a == TG_FIXED_WINDOW || a == TG_FIXED_WINDOW_PER_KEY;
}
static bool supports_set(tg_algorithm a) { return a != TG_SLIDING_WINDOW; }
static bool is_bucket(tg_algorithm a) {
  return a == TG_TOKEN_BUCKET || a == TG_LEAKY_BUCKET;
}

static tg_limiter *new_lim(tg_algorithm a) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = a;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), 0);
  assert_non_null(lim);
  return lim;
}

/* ---- version, codes, names --------------------------------------------------
 */

static void version_matches_header(void **state) {
  (void)state;
  char want[32];
  assert_int_equal(tg_version(), TG_VERSION_HEX);
  snprintf(want, sizeof want, "%d.%d.%d", TG_VERSION_MAJOR, TG_VERSION_MINOR,
           TG_VERSION_PATCH);
  assert_string_equal(tg_version_string(), want);
  assert_string_equal(tg_version_string(), "0.1.0");
}

static void every_code_has_its_message_and_name(void **state) {
  (void)state;
  int n = 0;
#define XX(name, val, msg)                                                     \
  assert_int_equal(TG_##name, val);                                            \
  assert_true(TG_##name < 0);                                                  \
  assert_string_equal(tg_strerror(TG_##name), msg);                            \
  assert_string_equal(tg_err_name(TG_##name), "TG_" #name);                    \
  n++;
  TG_ERRNO_MAP(XX)
#undef XX
  assert_int_equal(n, 16);
  assert_string_equal(tg_err_name(TG_OK), "TG_OK");
  assert_non_null(tg_strerror(TG_OK));
  assert_string_not_equal(tg_strerror(TG_OK), "unknown error");
}

static void unknown_codes(void **state) {
  (void)state;
  const int bad[] = {1, 2, -17, -18, -100, 100, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_string_equal(tg_strerror(bad[i]), "unknown error");
    assert_string_equal(tg_err_name(bad[i]), "TG_UNKNOWN");
  }
}

static void algorithm_names(void **state) {
  (void)state;
  assert_string_equal(tg_algorithm_name(TG_FIXED_WINDOW), "fixed_window");
  assert_string_equal(tg_algorithm_name(TG_FIXED_WINDOW_PER_KEY),
                      "fixed_window_per_key");
  assert_string_equal(tg_algorithm_name(TG_SLIDING_WINDOW), "sliding_window");
  assert_string_equal(tg_algorithm_name(TG_TOKEN_BUCKET), "token_bucket");
  assert_string_equal(tg_algorithm_name(TG_LEAKY_BUCKET), "leaky_bucket");
  assert_string_equal(tg_algorithm_name((tg_algorithm)TG_ALGORITHM_COUNT),
                      "unknown");
  assert_string_equal(tg_algorithm_name((tg_algorithm)100), "unknown");
  assert_string_equal(tg_algorithm_name((tg_algorithm)-1), "unknown");
}

/* ---- configuration and lifetime ---------------------------------------------
 */

static void config_init_sets_the_documented_defaults(void **state) {
  (void)state;
  tg_config cfg;
  memset(&cfg, 0x5a, sizeof cfg);
  tg_config_init(&cfg);
  assert_int_equal(cfg.algorithm, TG_FIXED_WINDOW);
  assert_true(cfg.clock == tg_clock_realtime);
  assert_null(cfg.clock_ctx);
  assert_int_equal(cfg.on_failure, TG_POLICY_FAIL_OPEN);
  assert_int_equal(cfg.sliding_max_entries, 1024);
  assert_int_equal(cfg.capacity, 65536);
  assert_int_equal(cfg.long_keys, 0);
  assert_int_equal(cfg.clean_period_ms, 60000);
  assert_int_equal(cfg.key_older_than_ms, 86400000);
  assert_null(cfg.before_clean);
  assert_null(cfg.before_clean_ctx);
  assert_null(cfg.custom_store);
  assert_null(cfg.shm_name);
  assert_int_equal(cfg.shm_mode, 0600);
  assert_int_equal(cfg.lock_timeout_ms, 2000);
  assert_int_equal(cfg.on_full, TG_FULL_REFUSE);
  assert_int_equal(cfg.fallback_share, 1);
  assert_int_equal(cfg.deny_cache_entries, 0);
  assert_null(cfg.redis);
}

static void redis_config_init_sets_the_documented_defaults(void **state) {
  (void)state;
  tg_redis_config rc;
  memset(&rc, 0x5a, sizeof rc);
  tg_redis_config_init(&rc);
  assert_string_equal(rc.host, "127.0.0.1");
  assert_int_equal(rc.port, 6379);
  assert_null(rc.unix_path);
  assert_null(rc.username);
  assert_null(rc.password);
  assert_int_equal(rc.db, 0);
  assert_int_equal(rc.connect_timeout_ms, 1000);
  assert_int_equal(rc.command_timeout_ms, 1000);
  assert_int_equal(rc.reconnect_backoff_ms, 100);
  assert_int_equal(rc.pool_size, 4);
  assert_string_equal(rc.key_prefix, "tg");
  assert_null(rc.cluster_nodes);
  tg_redis_config_init(NULL); /* harmless */
  /* without hiredis in the build, a Redis limiter is TG_ENOTSUP, and so is
   * the non-blocking API */
  if (!tg_redis_available()) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.redis = &rc;
    tg_limiter *lim = (tg_limiter *)&cfg;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_ENOTSUP);
    assert_null(lim);
    tg_nb *nb = (tg_nb *)&cfg;
    assert_int_equal(tg_nb_new(&nb, &cfg), TG_ENOTSUP);
    assert_null(nb);
    assert_int_equal(tg_nb_timeout(NULL), -1);
    assert_int_equal(tg_nb_tick(NULL), TG_EINVAL);
    rc.cluster_nodes = "127.0.0.1:7000";
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_ENOTSUP);
    /* and says why, in words */
    assert_non_null(strstr(tg_last_error(), "without hiredis"));
    /* what the header calls invalid stays TG_EINVAL in this build too */
    assert_int_equal(tg_nb_new(&nb, NULL), TG_EINVAL);
    tg_config plain;
    tg_config_init(&plain);
    assert_int_equal(tg_nb_new(&nb, &plain), TG_EINVAL);
    assert_int_equal(tg_nb_new(NULL, &cfg), TG_EINVAL);
  }
}

/* A bad tg_redis_config is TG_EINVAL, and tg_last_error names the field
 * (checked before any connection is tried: no server is needed). */
static void redis_config_errors_name_the_field(void **state) {
  (void)state;
  if (!tg_redis_available())
    skip();
  static const struct {
    const char *why;
    int pool, port, db;
    const char *prefix, *user, *unix_path, *host, *nodes;
  } bad[] = {
      {"pool_size", 0, 6379, 0, "tg", NULL, NULL, "h", NULL},
      {"pool_size", 1025, 6379, 0, "tg", NULL, NULL, "h", NULL},
      {"port", 4, 0, 0, "tg", NULL, NULL, "h", NULL},
      {"port", 4, 65536, 0, "tg", NULL, NULL, "h", NULL},
      {"db", 4, 6379, -1, "tg", NULL, NULL, "h", NULL},
      {"key_prefix", 4, 6379, 0, "a{b", NULL, NULL, "h", NULL},
      {"key_prefix", 4, 6379, 0, "", NULL, NULL, "h", NULL},
      {"username", 4, 6379, 0, "tg", "u", NULL, "h", NULL},
      {"host", 4, 6379, 0, "tg", NULL, NULL, "", NULL},
      {"unix_path", 4, 6379, 0, "tg", NULL, "", "h", NULL},
      {"cluster_nodes", 4, 6379, 0, "tg", NULL, NULL, "h", "x"},
      {"db", 4, 6379, 1, "tg", NULL, NULL, "h", "h:7000"},
      {"unix_path", 4, 6379, 0, "tg", NULL, "/tmp/s", "h", "h:7000"},
      {"pool_size", 0, 6379, 0, "tg", NULL, NULL, "h", "h:7000"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_redis_config rc;
    tg_redis_config_init(&rc);
    rc.pool_size = (uint32_t)bad[i].pool;
    rc.port = bad[i].port;
    rc.db = bad[i].db;
    rc.key_prefix = bad[i].prefix;
    rc.username = bad[i].user;
    rc.unix_path = bad[i].unix_path;
    rc.host = bad[i].host;
    rc.cluster_nodes = bad[i].nodes;
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.redis = &rc;
    tg_limiter *lim = (tg_limiter *)&cfg;
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
    assert_null(lim);
    if (!strstr(tg_last_error(), bad[i].why) ||
        !strstr(tg_last_error(), "tg_redis_config"))
      fail_msg("case %zu: tg_last_error \"%s\" does not name %s", i,
               tg_last_error(), bad[i].why);
  }
}

static void limiter_new_rejects_a_bad_config(void **state) {
  (void)state;
  tg_config cfg;
  tg_limiter *lim;

  tg_config_init(&cfg);
  cfg.algorithm = (tg_algorithm)TG_ALGORITHM_COUNT;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.algorithm = (tg_algorithm)-1;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);

  tg_config_init(&cfg);
  cfg.on_failure = (tg_policy)4; /* one past TG_POLICY_FALLBACK */
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.on_failure = (tg_policy)-1;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);

  tg_config_init(&cfg);
  cfg.on_full = (tg_full)2;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_non_null(strstr(tg_last_error(), "on_full"));

  /* a lock wait of more than an hour is a mistake, not a bound */
  tg_config_init(&cfg);
  cfg.lock_timeout_ms = 3600001;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.lock_timeout_ms = UINT32_MAX;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.lock_timeout_ms = 0; /* try once: valid */
  cfg.clean_period_ms = 0;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_limiter_destroy(lim);
  cfg.lock_timeout_ms = 3600000;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_limiter_destroy(lim);

  tg_config_init(&cfg);
  cfg.algorithm = TG_SLIDING_WINDOW;
  cfg.sliding_max_entries = 0;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.sliding_max_entries = TG_SLIDING_ENTRIES_MAX + 1;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.sliding_max_entries = UINT32_MAX;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);

  /* the bounds themselves are fine (with a capacity whose log reservation,
   * 16 bytes per entry per key, fits any address space: sanitizers have
   * smaller ones than plain Linux) */
  cfg.capacity = 16;
  const uint32_t good[] = {1, TG_SLIDING_ENTRIES_MAX};
  assert_int_equal(TG_SLIDING_ENTRIES_MAX, UINT32_C(1) << 24);
  for (size_t i = 0; i < 2; i++) {
    cfg.sliding_max_entries = good[i];
    lim = NULL;
    ASSERT_RC(tg_limiter_new(&lim, &cfg), 0);
    assert_non_null(lim);
    tg_limiter_destroy(lim);
  }

  /* the capacity's bound */
  tg_config_init(&cfg);
  cfg.clean_period_ms = 0;
  cfg.capacity = TG_CAPACITY_MAX + 1;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  cfg.capacity = 0;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  assert_int_equal(TG_CAPACITY_MAX, UINT64_C(1) << 40);

  /* no place to put the handle */
  tg_config_init(&cfg);
  ASSERT_RC(tg_limiter_new(NULL, &cfg), TG_EINVAL);
}

static void limiter_new_accepts_every_algorithm_and_policy(void **state) {
  (void)state;
  const tg_policy policies[] = {TG_POLICY_ERROR, TG_POLICY_FAIL_OPEN,
                                TG_POLICY_FAIL_CLOSED};
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++)
    for (size_t p = 0; p < 3; p++) {
      tg_config cfg;
      tg_config_init(&cfg);
      cfg.algorithm = all_algs[a];
      cfg.on_failure = policies[p];
      tg_limiter *lim = NULL;
      ASSERT_RC(tg_limiter_new(&lim, &cfg), 0);
      assert_non_null(lim);
      assert_int_equal(tg_key_count(lim), 0);
      tg_limiter_destroy(lim);
    }
}

/* cfg NULL means all defaults: a fixed window on the real-time clock. */
static void limiter_new_with_null_config_uses_defaults(void **state) {
  (void)state;
  tg_limiter *lim = NULL;
  ASSERT_RC(tg_limiter_new(&lim, NULL), 0);
  assert_non_null(lim);
  const tg_quota q = {.limit = 1, .period_ms = 86400000};
  tg_result r;
  uint64_t before = tg_clock_realtime(NULL) / 1000;
  ASSERT_RC(tg_hit(lim, "k", 1, &q, 1, &r), 0);
  assert_true(r.allowed);
  /* epoch-aligned day: the reset is the end of the current UTC day */
  uint64_t at = 0;
  ASSERT_RC(tg_expires_at(lim, "k", 1, &q, &at), 0);
  assert_true(at % 86400000 == 0);
  assert_true(at > before && at <= before + 86400000 + 1000);
  ASSERT_RC(tg_hit(lim, "k", 1, &q, 1, &r), 0);
  assert_false(r.allowed);
  tg_limiter_destroy(lim);
}

static void destroy_null_is_a_no_op(void **state) {
  (void)state;
  tg_limiter_destroy(NULL);
}

/* ---- clocks
 * ------------------------------------------------------------------- */

static void system_clocks_read_the_epoch_in_microseconds(void **state) {
  (void)state;
  uint64_t wall = (uint64_t)time(NULL) * 1000000;
  uint64_t rt = tg_clock_realtime(NULL);
  uint64_t coarse = tg_clock_coarse(NULL);
  assert_in_range(rt, wall - 5000000, wall + 5000000);
  assert_in_range(coarse, wall - 5000000, wall + 5000000);
  assert_true(tg_clock_realtime(NULL) >= rt);
}

/* The functions without _at read the injected clock, once at most, and give
 * the answers their _at twins give at that time. */
static void operations_read_the_injected_clock(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    manual_clock clk = {.now_us = T0, .reads = 0};
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = alg;
    cfg.clock = manual_clock_read;
    cfg.clock_ctx = &clk;
    tg_limiter *lim = NULL, *twin = new_lim(alg);
    ASSERT_RC(tg_limiter_new(&lim, &cfg), 0);

    const uint64_t times[] = {T0,           T0 + MS(1),    T0 + MS(150) + 7,
                              T0 + MS(999), T0 + MS(1000), T0 + MS(1400) + 1,
                              T0 + MS(5000)};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
      uint64_t v1 = 11, v2 = 22;
      unsigned before;
      tg_result r1, r2;
      clk.now_us = times[i];

      before = clk.reads;
      ASSERT_RC(tg_hit(lim, "k", 1, &q5, 2, &r1), 0);
      assert_in_range(clk.reads - before, 1, 1);
      ASSERT_RC(tg_hit_at(twin, times[i], "k", 1, &q5, 2, &r2), 0);
      assert_int_equal(r1.allowed, r2.allowed);
      assert_int_equal(r1.count, r2.count);
      assert_int_equal(r1.remaining, r2.remaining);
      assert_int_equal(r1.retry_after_ms, r2.retry_after_ms);
      assert_int_equal(r1.reset_after_ms, r2.reset_after_ms);

      before = clk.reads;
      ASSERT_RC(tg_get(lim, "k", 1, &q5, &v1), 0);
      assert_in_range(clk.reads - before, 0, 1);
      ASSERT_RC(tg_get_at(twin, times[i], "k", 1, &q5, &v2), 0);
      assert_int_equal(v1, v2);

      before = clk.reads;
      ASSERT_RC(tg_expires_at(lim, "k", 1, &q5, &v1), 0);
      assert_in_range(clk.reads - before, 0, 1);
      ASSERT_RC(tg_expires_at_at(twin, times[i], "k", 1, &q5, &v2), 0);
      assert_int_equal(v1, v2);

      if (supports_inc(alg) && i % 2 == 0) {
        before = clk.reads;
        ASSERT_RC(tg_inc(lim, "j", 1, &q5, 1, &v1), 0);
        assert_in_range(clk.reads - before, 0, 1);
        ASSERT_RC(tg_inc_at(twin, times[i], "j", 1, &q5, 1, &v2), 0);
        assert_int_equal(v1, v2);
      }
      if (supports_set(alg) && i == 3) {
        before = clk.reads;
        ASSERT_RC(tg_set(lim, "s", 1, &q5, 3), 0);
        assert_in_range(clk.reads - before, 0, 1);
        ASSERT_RC(tg_set_at(twin, times[i], "s", 1, &q5, 3), 0);
      }
      ASSERT_RC(tg_get(lim, "j", 1, &q5, &v1), 0);
      ASSERT_RC(tg_get_at(twin, times[i], "j", 1, &q5, &v2), 0);
      assert_int_equal(v1, v2);
      ASSERT_RC(tg_expires_at(lim, "s", 1, &q5, &v1), 0);
      ASSERT_RC(tg_expires_at_at(twin, times[i], "s", 1, &q5, &v2), 0);
      assert_int_equal(v1, v2);
    }
    tg_limiter_destroy(lim);
    tg_limiter_destroy(twin);
  }
}

/* Driving the injected clock changes the answers: it is really used. */
static void advancing_the_injected_clock_admits_again(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    manual_clock clk = {.now_us = T0, .reads = 0};
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = all_algs[a];
    cfg.clock = manual_clock_read;
    cfg.clock_ctx = &clk;
    tg_limiter *lim = NULL;
    ASSERT_RC(tg_limiter_new(&lim, &cfg), 0);
    tg_result r;
    ASSERT_RC(tg_hit(lim, "k", 1, &q5, 5, &r), 0);
    assert_true(r.allowed);
    ASSERT_RC(tg_hit(lim, "k", 1, &q5, 1, &r), 0);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms >= 1 && r.retry_after_ms <= 1000);
    clk.now_us += MS(r.retry_after_ms);
    ASSERT_RC(tg_hit(lim, "k", 1, &q5, 1, &r), 0);
    assert_true(r.allowed);
    clk.now_us += MS(10000);
    uint64_t at = 1;
    ASSERT_RC(tg_expires_at(lim, "k", 1, &q5, &at), 0);
    assert_int_equal(at, 0);
    /* a clock beyond TG_NOW_MAX_US is a time error */
    clk.now_us = TG_NOW_MAX_US + 1;
    r.allowed = true;
    ASSERT_RC(tg_hit(lim, "k", 1, &q5, 1, &r), TG_ETIME);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms == TG_NEVER);
    ASSERT_RC(tg_get(lim, "k", 1, &q5, &at), TG_ETIME);
    ASSERT_RC(tg_expires_at(lim, "k", 1, &q5, &at), TG_ETIME);
    tg_limiter_destroy(lim);
  }
}

/* The coarse clock is a drop-in clock. */
static void coarse_clock_can_drive_a_limiter(void **state) {
  (void)state;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  cfg.clock = tg_clock_coarse;
  tg_limiter *lim = NULL;
  ASSERT_RC(tg_limiter_new(&lim, &cfg), 0);
  tg_result r;
  ASSERT_RC(tg_hit(lim, "k", 1, &q5, 5, &r), 0);
  assert_true(r.allowed);
  ASSERT_RC(tg_hit(lim, "k", 1, &q5, 5, &r), 0);
  assert_false(r.allowed);
  tg_limiter_destroy(lim);
}

/* ---- input validation -------------------------------------------------------
 */

/* Calls every operation that takes (now, key, quota) on lim and asserts each
 * returns `want`; inc and set only where supported. */
static void all_ops_fail_(tg_limiter *lim, tg_algorithm alg, uint64_t now,
                          const void *key, size_t len, const tg_quota *q,
                          int want, const char *file, int line) {
  tg_result r;
  uint64_t v;
  memset(&r, 0, sizeof r);
  r.allowed = true;
  rc_(tg_hit_at(lim, now, key, len, q, 1, &r), want, "tg_hit_at", file, line);
  eq_(r.allowed, 0, "allowed after an error", file, line);
  eq_(r.retry_after_ms, TG_NEVER, "retry after an error", file, line);
  rc_(tg_hit_at(lim, now, key, len, q, 0, &r), want, "tg_hit_at peek", file,
      line);
  rc_(tg_get_at(lim, now, key, len, q, &v), want, "tg_get_at", file, line);
  rc_(tg_expires_at_at(lim, now, key, len, q, &v), want, "tg_expires_at_at",
      file, line);
  if (supports_inc(alg))
    rc_(tg_inc_at(lim, now, key, len, q, 1, &v), want, "tg_inc_at", file, line);
  if (supports_set(alg))
    rc_(tg_set_at(lim, now, key, len, q, 1), want, "tg_set_at", file, line);
}
#define ALL_OPS_FAIL(lim, alg, now, key, len, q, want)                         \
  all_ops_fail_((lim), (alg), (now), (key), (len), (q), (want), __FILE__,      \
                __LINE__)

/* What a key looks like from outside: value, expiry and a peek's result. */
typedef struct snapshot {
  uint64_t value, expires;
  tg_result peek;
  size_t keys;
} snapshot;

static snapshot snap(tg_limiter *lim, const char *key, uint64_t now) {
  snapshot s;
  memset(&s, 0, sizeof s);
  assert_int_equal(tg_get_at(lim, now, key, strlen(key), &q5, &s.value), 0);
  assert_int_equal(
      tg_expires_at_at(lim, now, key, strlen(key), &q5, &s.expires), 0);
  assert_int_equal(tg_hit_at(lim, now, key, strlen(key), &q5, 0, &s.peek), 0);
  s.keys = tg_key_count(lim);
  return s;
}

static void assert_same_(snapshot a, snapshot b, const char *file, int line) {
  eq_(b.value, a.value, "value", file, line);
  eq_(b.expires, a.expires, "expires_at", file, line);
  eq_(b.peek.allowed, a.peek.allowed, "peek allowed", file, line);
  eq_(b.peek.count, a.peek.count, "peek count", file, line);
  eq_(b.peek.remaining, a.peek.remaining, "peek remaining", file, line);
  eq_(b.peek.retry_after_ms, a.peek.retry_after_ms, "peek retry", file, line);
  eq_(b.peek.reset_after_ms, a.peek.reset_after_ms, "peek reset", file, line);
  eq_(b.keys, a.keys, "key count", file, line);
}
#define ASSERT_UNCHANGED(a, b) assert_same_((a), (b), __FILE__, __LINE__)

static void null_pointers_are_einval(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    tg_result r;
    uint64_t v;
    ALLOW(lim, T0, "k", &q5, 1);
    snapshot before = snap(lim, "k", T0);

    memset(&r, 0, sizeof r);
    r.allowed = true;
    ASSERT_RC(tg_hit_at(NULL, T0, "k", 1, &q5, 1, &r), TG_EINVAL);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms == TG_NEVER);
    r.allowed = true;
    ASSERT_RC(tg_hit_at(lim, T0, NULL, 1, &q5, 1, &r), TG_EINVAL);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms == TG_NEVER);
    r.allowed = true;
    ASSERT_RC(tg_hit_at(lim, T0, "k", 1, NULL, 1, &r), TG_EINVAL);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms == TG_NEVER);
    ASSERT_RC(tg_hit_at(lim, T0, "k", 1, &q5, 1, NULL), TG_EINVAL);
    ASSERT_RC(tg_hit(NULL, "k", 1, &q5, 1, &r), TG_EINVAL);
    ASSERT_RC(tg_hit(lim, NULL, 1, &q5, 1, &r), TG_EINVAL);
    ASSERT_RC(tg_hit(lim, "k", 1, NULL, 1, &r), TG_EINVAL);
    ASSERT_RC(tg_hit(lim, "k", 1, &q5, 1, NULL), TG_EINVAL);

    ASSERT_RC(tg_get_at(NULL, T0, "k", 1, &q5, &v), TG_EINVAL);
    ASSERT_RC(tg_get_at(lim, T0, NULL, 1, &q5, &v), TG_EINVAL);
    ASSERT_RC(tg_get_at(lim, T0, "k", 1, NULL, &v), TG_EINVAL);
    ASSERT_RC(tg_get_at(lim, T0, "k", 1, &q5, NULL), TG_EINVAL);
    ASSERT_RC(tg_get(lim, "k", 1, &q5, NULL), TG_EINVAL);

    ASSERT_RC(tg_expires_at_at(NULL, T0, "k", 1, &q5, &v), TG_EINVAL);
    ASSERT_RC(tg_expires_at_at(lim, T0, NULL, 1, &q5, &v), TG_EINVAL);
    ASSERT_RC(tg_expires_at_at(lim, T0, "k", 1, NULL, &v), TG_EINVAL);
    ASSERT_RC(tg_expires_at_at(lim, T0, "k", 1, &q5, NULL), TG_EINVAL);
    ASSERT_RC(tg_expires_at(lim, "k", 1, &q5, NULL), TG_EINVAL);

    if (supports_inc(alg)) {
      ASSERT_RC(tg_inc_at(NULL, T0, "k", 1, &q5, 1, &v), TG_EINVAL);
      ASSERT_RC(tg_inc_at(lim, T0, NULL, 1, &q5, 1, &v), TG_EINVAL);
      ASSERT_RC(tg_inc_at(lim, T0, "k", 1, NULL, 1, &v), TG_EINVAL);
      ASSERT_RC(tg_inc(lim, NULL, 1, &q5, 1, &v), TG_EINVAL);
    }
    if (supports_set(alg)) {
      ASSERT_RC(tg_set_at(NULL, T0, "k", 1, &q5, 1), TG_EINVAL);
      ASSERT_RC(tg_set_at(lim, T0, NULL, 1, &q5, 1), TG_EINVAL);
      ASSERT_RC(tg_set_at(lim, T0, "k", 1, NULL, 1), TG_EINVAL);
      ASSERT_RC(tg_set(lim, "k", 1, NULL, 1), TG_EINVAL);
    }
    ASSERT_RC(tg_reset(NULL, "k", 1), TG_EINVAL);
    ASSERT_RC(tg_reset(lim, NULL, 1), TG_EINVAL);

    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    tg_limiter_destroy(lim);
  }
}

static void key_length_is_checked(void **state) {
  (void)state;
  char big[TG_KEY_MAX + 2];
  memset(big, 'x', sizeof big);
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q5, 1);
    snapshot before = snap(lim, "k", T0);
    ALL_OPS_FAIL(lim, alg, T0, "k", 0, &q5, TG_EKEY);
    ALL_OPS_FAIL(lim, alg, T0, big, TG_KEY_MAX + 1, &q5, TG_EKEY);
    ALL_OPS_FAIL(lim, alg, T0, big, SIZE_MAX, &q5, TG_EKEY);
    ASSERT_RC(tg_reset(lim, "k", 0), TG_EKEY);
    ASSERT_RC(tg_reset(lim, big, TG_KEY_MAX + 1), TG_EKEY);
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));

    /* TG_KEY_MAX bytes work, and keys that differ in the last byte differ */
    tg_result r;
    ASSERT_RC(tg_hit_at(lim, T0, big, TG_KEY_MAX, &q5, 5, &r), 0);
    assert_true(r.allowed);
    ASSERT_RC(tg_hit_at(lim, T0, big, TG_KEY_MAX, &q5, 1, &r), 0);
    assert_false(r.allowed);
    big[TG_KEY_MAX - 1] = 'y';
    ASSERT_RC(tg_hit_at(lim, T0, big, TG_KEY_MAX, &q5, 5, &r), 0);
    assert_true(r.allowed);
    ASSERT_RC(tg_hit_at(lim, T0, big, TG_KEY_MAX - 1, &q5, 5, &r), 0);
    assert_true(r.allowed);
    ASSERT_RC(tg_reset(lim, big, TG_KEY_MAX), 0);
    big[TG_KEY_MAX - 1] = 'x';
    tg_limiter_destroy(lim);
  }
}

/* Keys are byte strings: NUL bytes are part of them. */
static void keys_may_contain_nul_bytes(void **state) {
  (void)state;
  static const char k1[] = {'a', '\0', 'b'};
  static const char k2[] = {'a', '\0', 'c'};
  static const char k3[] = {'a', '\0'};
  static const char k4[] = {'\0'};
  static const char k5[] = {'\0', '\0'};
  const struct {
    const char *p;
    size_t n;
  } keys[] = {{k1, 3}, {k2, 3}, {k3, 2}, {"a", 1}, {k4, 1}, {k5, 2}};
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter *lim = new_lim(all_algs[a]);
    tg_result r;
    /* each key takes the whole quota; none shares state with another */
    for (size_t i = 0; i < 6; i++) {
      ASSERT_RC(tg_hit_at(lim, T0, keys[i].p, keys[i].n, &q5, 5, &r), 0);
      assert_true(r.allowed);
    }
    for (size_t i = 0; i < 6; i++) {
      ASSERT_RC(tg_hit_at(lim, T0, keys[i].p, keys[i].n, &q5, 1, &r), 0);
      assert_false(r.allowed);
    }
    assert_int_equal(tg_key_count(lim), 6);
    ASSERT_RC(tg_reset(lim, k1, 3), 0);
    ASSERT_RC(tg_hit_at(lim, T0, k1, 3, &q5, 5, &r), 0);
    assert_true(r.allowed);
    ASSERT_RC(tg_hit_at(lim, T0, k2, 3, &q5, 1, &r), 0);
    assert_false(r.allowed);
    tg_limiter_destroy(lim);
  }
}

static void quota_is_checked(void **state) {
  (void)state;
  const tg_quota bad[] = {
      {.limit = 0, .period_ms = 1000},
      {.limit = 5, .period_ms = 0},
      {.limit = 0, .period_ms = 0},
      {.limit = 5, .period_ms = TG_PERIOD_MAX_MS + 1},
      {.limit = 5, .period_ms = UINT64_MAX},
  };
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q5, 1);
    snapshot before = snap(lim, "k", T0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      ALL_OPS_FAIL(lim, alg, T0, "k", 1, &bad[i], TG_EQUOTA);
      ALL_OPS_FAIL(lim, alg, T0, "new", 3, &bad[i], TG_EQUOTA);
    }
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    assert_int_equal(tg_key_count(lim), 1);

    /* the longest period is fine */
    const tg_quota longest = {.limit = 1, .period_ms = TG_PERIOD_MAX_MS};
    EXPECT_HIT(lim, T0, "long", &longest, 1, 1, ANY, 0, 0, ANY);
    DENY(lim, T0 + MS(1000), "long", &longest, 1);
    tg_limiter_destroy(lim);
  }
}

/* Buckets: a rate above one per nanosecond is TG_EQUOTA; exactly one per
 * nanosecond (T = 1 ns) is fine. */
static void bucket_rate_above_one_per_ns_is_equota(void **state) {
  (void)state;
  const tg_quota too_fast[] = {
      {.limit = 1000001, .period_ms = 1},
      {.limit = 2000001, .period_ms = 2, .burst = 1},
      {.limit = UINT64_MAX, .period_ms = 1000},
  };
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    if (!is_bucket(alg))
      continue;
    tg_limiter *lim = new_lim(alg);
    for (size_t i = 0; i < sizeof too_fast / sizeof too_fast[0]; i++)
      ALL_OPS_FAIL(lim, alg, T0, "k", 1, &too_fast[i], TG_EQUOTA);
    assert_int_equal(tg_key_count(lim), 0);

    const tg_quota fastest = {.limit = 1000000, .period_ms = 1, .burst = 1};
    ALLOW(lim, T0, "k", &fastest, 1);
    /* 1 ns per token: the next one is 1 ns away, a whole ms rounded up */
    EXPECT_HIT(lim, T0, "k", &fastest, 1, 0, ANY, 0, 1, 1);
    ALLOW(lim, T0 + 1, "k", &fastest, 1);
    tg_limiter_destroy(lim);
  }
}

/* tg_quota_check answers what a call with the quota answers (TG_OK or
 * TG_EQUOTA), for every algorithm, on a grid of limits, periods and bursts
 * around every bound; TG_EINVAL for no quota or no algorithm. */
static void quota_check_answers_as_a_call(void **state) {
  (void)state;
  const uint64_t limits[] = {0,         1, 7, 1000000, 1000001, UINT64_MAX / 2,
                             UINT64_MAX};
  const uint64_t periods[] = {
      0, 1, 2, 1000, TG_PERIOD_MAX_MS, TG_PERIOD_MAX_MS + 1, UINT64_MAX};
  const uint64_t bursts[] = {0, 1, 3, 1000, 4000000, 4000001, UINT64_MAX};
  uint64_t equota = 0, ok = 0;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
      for (size_t j = 0; j < sizeof periods / sizeof periods[0]; j++)
        for (size_t k = 0; k < sizeof bursts / sizeof bursts[0]; k++) {
          const tg_quota q = {limits[i], periods[j], bursts[k]};
          uint64_t v;
          int call = tg_get_at(lim, T0, "k", 1, &q, &v);
          assert_true(call == TG_OK || call == TG_EQUOTA);
          assert_int_equal(tg_quota_check(alg, &q), call);
          if (call == TG_OK)
            ok++;
          else
            equota++;
        }
    tg_limiter_destroy(lim);
  }
  /* the grid reaches both answers, on buckets through the tolerance too */
  assert_true(ok > 0 && equota > 0);
  const tg_quota slow = {.limit = 1, .period_ms = 1000, .burst = 4000000001};
  assert_int_equal(tg_quota_check(TG_FIXED_WINDOW, &slow), TG_OK);
  assert_int_equal(tg_quota_check(TG_TOKEN_BUCKET, &slow), TG_EQUOTA);
  assert_int_equal(tg_quota_check(TG_LEAKY_BUCKET, &slow), TG_EQUOTA);
  assert_int_equal(tg_quota_check(TG_TOKEN_BUCKET, NULL), TG_EINVAL);
  assert_int_equal(tg_quota_check((tg_algorithm)TG_ALGORITHM_COUNT, &q5),
                   TG_EINVAL);
  assert_int_equal(tg_quota_check((tg_algorithm)-1, &q5), TG_EINVAL);
}

/* now beyond TG_NOW_MAX_US is TG_ETIME; TG_NOW_MAX_US itself is accepted. */
static void time_is_checked(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q5, 1);
    snapshot before = snap(lim, "k", T0);
    ALL_OPS_FAIL(lim, alg, TG_NOW_MAX_US + 1, "k", 1, &q5, TG_ETIME);
    ALL_OPS_FAIL(lim, alg, UINT64_MAX, "k", 1, &q5, TG_ETIME);
    ALL_OPS_FAIL(lim, alg, TG_NOW_MAX_US + 1, "new", 3, &q5, TG_ETIME);
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));

    EXPECT_HIT(lim, TG_NOW_MAX_US, "late", &q5, 1, 1, ANY, 4, 0, ANY);
    const tg_quota longest = {.limit = 1, .period_ms = TG_PERIOD_MAX_MS};
    ALLOW(lim, TG_NOW_MAX_US, "late-long", &longest, 1);
    DENY(lim, TG_NOW_MAX_US, "late-long", &longest, 1);
    uint64_t at = 0;
    ASSERT_RC(
        tg_expires_at_at(lim, TG_NOW_MAX_US, "late-long", 9, &longest, &at), 0);
    assert_true(at > TG_NOW_MAX_US / 1000);
    tg_limiter_destroy(lim);
  }
}

/* Windows: a count that would pass 2^64 - 1 is TG_EOVERFLOW (tg_inc says so;
 * docs/DESIGN.md section 3 lists such arithmetic among invalid input, so a hit
 * too). */
static void count_overflow_is_eoverflow(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    if (!supports_inc(alg))
      continue;
    tg_limiter *lim = new_lim(alg);
    uint64_t v = 0;
    SET(lim, T0, "k", &q5, UINT64_MAX - 3);
    snapshot before = snap(lim, "k", T0);
    ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q5, 4, &v), TG_EOVERFLOW);
    ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q5, UINT64_MAX, &v), TG_EOVERFLOW);
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    /* a hit counts its cost, so the same overflow is an error there too */
    tg_result r;
    r.allowed = true;
    ASSERT_RC(tg_hit_at(lim, T0, "k", 1, &q5, 4, &r), TG_EOVERFLOW);
    assert_false(r.allowed);
    assert_true(r.retry_after_ms == TG_NEVER);
    ASSERT_RC(tg_hit_at(lim, T0, "k", 1, &q5, UINT64_MAX, &r), TG_EOVERFLOW);
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    EXPECT_INC(lim, T0, "k", &q5, 3, UINT64_MAX);
    ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q5, 1, NULL), TG_EOVERFLOW);
    EXPECT_GET(lim, T0, "k", &q5, UINT64_MAX);
    tg_limiter_destroy(lim);
  }
}

/* Buckets: a full bucket of 10 tokens of 10^18 ns each, drained at
 * TG_NOW_MAX_US, needs a time past 2^64 ns. The exact answer is "allowed";
 * an implementation that cannot represent it must answer with an error code
 * (TG_EOVERFLOW, or TG_EQUOTA for a quota it deems out of range) and change
 * nothing: never deny wrongly or wrap around. */
static void bucket_arithmetic_never_wraps(void **state) {
  (void)state;
  const tg_quota q = {.limit = 1, .period_ms = TG_PERIOD_MAX_MS, .burst = 10};
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    if (!is_bucket(alg))
      continue;
    tg_limiter *lim = new_lim(alg);
    tg_result r;
    int rc = tg_hit_at(lim, TG_NOW_MAX_US, "k", 1, &q, 10, &r);
    if (rc == 0) {
      assert_true(r.allowed);
      rc = tg_hit_at(lim, TG_NOW_MAX_US, "k", 1, &q, 1, &r);
      assert_true(rc == 0 || rc == TG_EOVERFLOW);
      assert_false(r.allowed);
    } else {
      assert_true(rc == TG_EOVERFLOW || rc == TG_EQUOTA);
      assert_false(r.allowed);
      assert_int_equal(tg_key_count(lim), 0);
    }
    tg_limiter_destroy(lim);
  }
}

/* Operations outside the support matrix are TG_ENOTSUP and change nothing. */
static void unsupported_operations_are_enotsup(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q5, 2);
    snapshot before = snap(lim, "k", T0);
    uint64_t v = 9;
    if (!supports_inc(alg)) {
      ASSERT_RC(tg_inc_at(lim, T0, "k", 1, &q5, 1, &v), TG_ENOTSUP);
      ASSERT_RC(tg_inc(lim, "k", 1, &q5, 1, &v), TG_ENOTSUP);
      ASSERT_RC(tg_inc_at(lim, T0, "new", 3, &q5, 1, NULL), TG_ENOTSUP);
    }
    if (!supports_set(alg)) {
      ASSERT_RC(tg_set_at(lim, T0, "k", 1, &q5, 0), TG_ENOTSUP);
      ASSERT_RC(tg_set(lim, "k", 1, &q5, 0), TG_ENOTSUP);
      ASSERT_RC(tg_set_at(lim, T0, "new", 3, &q5, 1), TG_ENOTSUP);
    }
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    tg_limiter_destroy(lim);
  }
}

/* Buckets: set above burst is TG_ERANGE and changes nothing. */
static void bucket_set_above_burst_is_erange(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    if (!is_bucket(alg))
      continue;
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q5, 2);
    snapshot before = snap(lim, "k", T0);
    ASSERT_RC(tg_set_at(lim, T0, "k", 1, &q5, 6), TG_ERANGE);
    ASSERT_RC(tg_set_at(lim, T0, "k", 1, &q5, UINT64_MAX), TG_ERANGE);
    ASSERT_RC(tg_set_at(lim, T0, "new", 3, &q5, 6), TG_ERANGE);
    ASSERT_UNCHANGED(before, snap(lim, "k", T0));
    const tg_quota q = {.limit = 5, .period_ms = 1000, .burst = 8};
    ASSERT_RC(tg_set_at(lim, T0, "b", 1, &q, 8), 0);
    ASSERT_RC(tg_set_at(lim, T0, "b", 1, &q, 9), TG_ERANGE);
    tg_limiter_destroy(lim);
  }
}

/* The window algorithms ignore burst, whatever its value. */
static void windows_ignore_burst(void **state) {
  (void)state;
  const tg_quota q = {.limit = 2, .period_ms = 1000, .burst = UINT64_MAX};
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_algorithm alg = all_algs[a];
    if (is_bucket(alg))
      continue;
    tg_limiter *lim = new_lim(alg);
    ALLOW(lim, T0, "k", &q, 2);
    DENY(lim, T0, "k", &q, 1);
    /* counted by the fixed windows, not recorded by the log */
    EXPECT_HIT(lim, T0, "j", &q, 3, 0, alg == TG_SLIDING_WINDOW ? 0 : 3,
               alg == TG_SLIDING_WINDOW ? 2 : 0, TG_NEVER, ANY);
    tg_limiter_destroy(lim);
  }
}

/* Read-only calls create no state: get, expires_at and peeks of unknown
 * keys leave the key count at 0; hits and reset move it. */
static void key_count_tracks_keys(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter *lim = new_lim(all_algs[a]);
    uint64_t v;
    tg_result r;
    ASSERT_RC(tg_get_at(lim, T0, "a", 1, &q5, &v), 0);
    ASSERT_RC(tg_expires_at_at(lim, T0, "a", 1, &q5, &v), 0);
    ASSERT_RC(tg_hit_at(lim, T0, "a", 1, &q5, 0, &r), 0);
    ASSERT_RC(tg_reset(lim, "a", 1), 0);
    assert_int_equal(tg_key_count(lim), 0);
    ALLOW(lim, T0, "a", &q5, 1);
    ALLOW(lim, T0, "b", &q5, 1);
    ALLOW(lim, T0, "c", &q5, 1);
    ALLOW(lim, T0, "a", &q5, 1);
    assert_int_equal(tg_key_count(lim), 3);
    /* a reset key stays, fresh, until a pass reclaims it (tg_reset) */
    RESET(lim, "b");
    assert_int_equal(tg_key_count(lim), 3);
    RESET(lim, "b");
    assert_int_equal(tg_key_count(lim), 3);
    size_t removed = 0;
    ASSERT_RC(tg_clean_at(lim, T0, &removed), 0);
    assert_int_equal(removed, 1);
    assert_int_equal(tg_key_count(lim), 2);
    tg_limiter_destroy(lim);
  }
}

/* Two limiters of algorithm alg with a deny cache of `entries`: one for
 * calls made one by one, one for the same calls in batches. */
static void deny_cache_pair(tg_algorithm alg, uint64_t entries,
                            tg_limiter *lim[2]) {
  for (int v = 0; v < 2; v++) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = alg;
    cfg.clean_period_ms = 0;
    cfg.deny_cache_entries = entries;
    assert_int_equal(tg_limiter_new(&lim[v], &cfg), 0);
  }
}

/* Fixed-window limiters: lim[0] with a deny cache, lim[1] without. */
static void deny_cache_entries_pair(tg_limiter *lim[2]) {
  for (int v = 0; v < 2; v++) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = TG_FIXED_WINDOW;
    cfg.clean_period_ms = 0;
    cfg.deny_cache_entries = v == 0 ? 64 : 0;
    assert_int_equal(tg_limiter_new(&lim[v], &cfg), 0);
  }
}

/* A batch item decided as tg_hit decided the same call (answer x). */
static bool same_as_serial(const tg_batch_item *it, const tg_result *x) {
  const tg_result *y = &it->result;
  return it->status == 0 && x->allowed == y->allowed && x->count == y->count &&
         x->remaining == y->remaining &&
         x->retry_after_ms == y->retry_after_ms &&
         x->reset_after_ms == y->reset_after_ms;
}

/* A tg_set refused for its input leaves the key's cached denial (invalid
 * input changes nothing); one that runs forgets it. A fixed window's
 * refused set has a quota of limit 0 (TG_EQUOTA), a sliding log's is
 * TG_ENOTSUP. */
static void refused_set_keeps_the_deny_cache(void **state) {
  (void)state;
  const tg_quota q = {1, 10000, 0}, zero = {0, 10000, 0};
  const uint64_t now = UINT64_C(1700000000000000);
  const tg_algorithm algs[] = {TG_FIXED_WINDOW, TG_SLIDING_WINDOW};
  for (size_t a = 0; a < 2; a++) {
    tg_limiter *lim[2];
    deny_cache_pair(algs[a], 64, lim);
    tg_limiter_destroy(lim[1]);
    tg_result r;
    assert_int_equal(tg_hit_at(lim[0], now, "k", 1, &q, 1, &r), 0);
    assert_true(r.allowed);
    assert_int_equal(tg_hit_at(lim[0], now, "k", 1, &q, 1, &r), 0);
    assert_false(r.allowed); /* cached */
    bool window = algs[a] == TG_FIXED_WINDOW;
    assert_int_equal(tg_set_at(lim[0], now, "k", 1, window ? &zero : &q, 0),
                     window ? TG_EQUOTA : TG_ENOTSUP);
    tg_stats st;
    assert_int_equal(tg_limiter_stats(lim[0], &st, sizeof st), 0);
    uint64_t before = st.deny_cache_hits;
    assert_int_equal(tg_hit_at(lim[0], now, "k", 1, &q, 1, &r), 0);
    assert_false(r.allowed);
    assert_int_equal(tg_limiter_stats(lim[0], &st, sizeof st), 0);
    assert_int_equal(st.deny_cache_hits, before + 1);
    if (window) {
      uint64_t v;
      assert_int_equal(tg_get_at(lim[0], now, "k", 1, &q, &v), 0);
      assert_int_equal(v, 2); /* the cached denial was not counted */
      assert_int_equal(tg_set_at(lim[0], now, "k", 1, &q, 0), 0);
      assert_int_equal(tg_hit_at(lim[0], now, "k", 1, &q, 1, &r), 0);
      assert_true(r.allowed); /* a set that ran forgot the denial */
    }
    tg_limiter_destroy(lim[0]);
  }
}

/* A policy that passed, or a tg_inc, writes without reading the deny cache,
 * and under another period opens a window of its own: the key's cached
 * denial no longer holds, and goes. A limiter with a deny cache answers as
 * one without (the audit's case: denied under 3 a second, then one call of
 * a 300 ms quota opens a window that ends later, and the next call fits). */
static void policy_and_inc_drop_the_deny_cache(void **state) {
  (void)state;
  const tg_quota sec = {3, 1000, 0}, fast = {10, 300, 0};
  /* a whole second, and a multiple of 300 ms */
  const uint64_t t0 = UINT64_C(1700000001000000);
  for (int how = 0; how < 2; how++) {
    tg_limiter *lim[2];
    deny_cache_entries_pair(lim);
    tg_result r[2];
    for (int v = 0; v < 2; v++) {
      assert_int_equal(tg_hit_at(lim[v], t0 + 100000, "k", 1, &sec, 2, &r[v]),
                       0);
      assert_true(r[v].allowed);
      assert_int_equal(tg_hit_at(lim[v], t0 + 100000, "k", 1, &sec, 2, &r[v]),
                       0);
      assert_false(r[v].allowed); /* lim[0] caches it */
      if (how == 0) {
        tg_rule ru = {
            .lim = lim[v], .key = "k", .key_len = 1, .q = &fast, .cost = 1};
        tg_rules_result out;
        assert_int_equal(tg_hit_rules_at(t0 + 950000, &ru, 1, 0, &out), 0);
        assert_true(out.r.allowed);
      } else {
        uint64_t c;
        assert_int_equal(tg_inc_at(lim[v], t0 + 950000, "k", 1, &fast, 1, &c),
                         0);
        assert_int_equal(c, 1); /* a window of its own, [900, 1200) ms */
      }
      assert_int_equal(tg_hit_at(lim[v], t0 + 960000, "k", 1, &sec, 1, &r[v]),
                       0);
    }
    assert_true(r[1].allowed); /* the store, without a cache */
    assert_true(r[0].allowed);
    assert_int_equal(r[0].count, r[1].count);
    tg_limiter_destroy(lim[0]);
    tg_limiter_destroy(lim[1]);
  }
}

/* A batch answers as tg_hit on each item in order, with a deny cache too:
 * an item sees the denials the items before it stored (a batch used to
 * send every item to the store first, so a later item on a denied key was
 * decided, and for a window counted, where tg_hit would have answered it
 * from the cache). */
static void batch_with_deny_cache_is_serial(void **state) {
  (void)state;
  const tg_quota q = {1, 10000, 0};
  const char *keys[] = {"k", "j", "k", "k", "j", "i", "k"};
  enum { N = sizeof keys / sizeof keys[0] };
  const uint64_t now = UINT64_C(1700000000000000);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter *lim[2];
    deny_cache_pair((tg_algorithm)a, 64, lim);
    tg_result serial[N];
    tg_batch_item it[N];
    for (size_t i = 0; i < N; i++) {
      assert_int_equal(tg_hit_at(lim[0], now, keys[i], 1, &q, 1, &serial[i]),
                       0);
      it[i] = (tg_batch_item){keys[i], 1, &q, 1, 0, {0}};
    }
    assert_int_equal(tg_hit_batch_at(lim[1], now, it, N), 0);
    for (size_t i = 0; i < N; i++) {
      const tg_result *x = &serial[i], *y = &it[i].result;
      if (!same_as_serial(&it[i], x))
        fail_msg("%s item %zu (%s): tg_hit allowed %d count %" PRIu64
                 " retry %" PRIu64 ", batch allowed %d count %" PRIu64
                 " retry %" PRIu64,
                 tg_algorithm_name((tg_algorithm)a), i, keys[i], x->allowed,
                 x->count, x->retry_after_ms, y->allowed, y->count,
                 y->retry_after_ms);
    }
    tg_stats st[2];
    uint64_t v[2];
    for (int l = 0; l < 2; l++) {
      assert_int_equal(tg_limiter_stats(lim[l], &st[l], sizeof st[l]), 0);
      assert_int_equal(tg_get_at(lim[l], now, "k", 1, &q, &v[l]), 0);
    }
    assert_int_equal(st[0].deny_cache_hits, st[1].deny_cache_hits);
    assert_true(st[1].deny_cache_hits > 0);
    assert_int_equal(v[0], v[1]);
    tg_limiter_destroy(lim[0]);
    tg_limiter_destroy(lim[1]);
  }
}

/* A deny cache of one set (four entries) shared by six keys: a denial of
 * one key pushes another's out, so a batch item must not be answered from
 * an entry a pending item's denial would have replaced. Random batches on
 * every algorithm against the same calls made one by one: every answer,
 * every key's count and the cache's hits agree. */
static void batch_with_a_crowded_deny_cache_is_serial(void **state) {
  (void)state;
  const char *keys[] = {"alpha", "beta", "gamma", "delta", "omega", "sigma"};
  const tg_quota q = {2, 1000, 0};
  uint64_t seed = 0x9e3779b97f4a7c15u, hits = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter *lim[2];
    deny_cache_pair((tg_algorithm)a, 4, lim);
    uint64_t now = UINT64_C(1700000000000000);
    for (int round = 0; round < 400; round++) {
      enum { N = 8 };
      tg_batch_item it[N];
      tg_result serial[N];
      for (size_t i = 0; i < N; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        const char *k = keys[(seed >> 33) % 6];
        uint64_t cost = 1 + (seed >> 60) % 2;
        it[i] = (tg_batch_item){k, strlen(k), &q, cost, 0, {0}};
        assert_int_equal(
            tg_hit_at(lim[0], now, k, strlen(k), &q, cost, &serial[i]), 0);
      }
      assert_int_equal(tg_hit_batch_at(lim[1], now, it, N), 0);
      for (size_t i = 0; i < N; i++) {
        const tg_result *x = &serial[i], *y = &it[i].result;
        if (!same_as_serial(&it[i], x))
          fail_msg("%s round %d item %zu (%s): tg_hit allowed %d count %" PRIu64
                   ", batch allowed %d count %" PRIu64,
                   tg_algorithm_name((tg_algorithm)a), round, i,
                   (const char *)it[i].key, x->allowed, x->count, y->allowed,
                   y->count);
      }
      for (size_t k = 0; k < 6; k++) {
        uint64_t v[2];
        for (int l = 0; l < 2; l++)
          assert_int_equal(
              tg_get_at(lim[l], now, keys[k], strlen(keys[k]), &q, &v[l]), 0);
        assert_int_equal(v[0], v[1]);
      }
      now += 50000; /* 50 ms: some denials expire, others not */
    }
    tg_stats st[2];
    for (int l = 0; l < 2; l++)
      assert_int_equal(tg_limiter_stats(lim[l], &st[l], sizeof st[l]), 0);
    assert_int_equal(st[0].deny_cache_hits, st[1].deny_cache_hits);
    assert_int_equal(st[0].allowed, st[1].allowed);
    assert_int_equal(st[0].denied, st[1].denied);
    hits += st[1].deny_cache_hits;
    tg_limiter_destroy(lim[0]);
    tg_limiter_destroy(lim[1]);
  }
  assert_true(hits > 0); /* the cache answered */
}

static void many_keys(void **state) {
  (void)state;
  for (size_t a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter *lim = new_lim(all_algs[a]);
    char key[32];
    for (unsigned i = 0; i < 5000; i++) {
      snprintf(key, sizeof key, "user:%u", i);
      ALLOW(lim, T0, key, &q5, 1 + i % 5);
    }
    assert_int_equal(tg_key_count(lim), 5000);
    for (unsigned i = 0; i < 5000; i++) {
      snprintf(key, sizeof key, "user:%u", i);
      /* 5 in all for even i, 6 for odd i */
      tg_result r = HIT(lim, T0, key, &q5, 4 - i % 5 + i % 2);
      assert_int_equal(r.allowed, i % 2 == 0);
    }
    tg_limiter_destroy(lim);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(version_matches_header),
      cmocka_unit_test(every_code_has_its_message_and_name),
      cmocka_unit_test(unknown_codes),
      cmocka_unit_test(algorithm_names),
      cmocka_unit_test(config_init_sets_the_documented_defaults),
      cmocka_unit_test(redis_config_init_sets_the_documented_defaults),
      cmocka_unit_test(redis_config_errors_name_the_field),
      cmocka_unit_test(limiter_new_rejects_a_bad_config),
      cmocka_unit_test(limiter_new_accepts_every_algorithm_and_policy),
      cmocka_unit_test(limiter_new_with_null_config_uses_defaults),
      cmocka_unit_test(destroy_null_is_a_no_op),
      cmocka_unit_test(system_clocks_read_the_epoch_in_microseconds),
      cmocka_unit_test(operations_read_the_injected_clock),
      cmocka_unit_test(advancing_the_injected_clock_admits_again),
      cmocka_unit_test(coarse_clock_can_drive_a_limiter),
      cmocka_unit_test(null_pointers_are_einval),
      cmocka_unit_test(key_length_is_checked),
      cmocka_unit_test(keys_may_contain_nul_bytes),
      cmocka_unit_test(quota_is_checked),
      cmocka_unit_test(bucket_rate_above_one_per_ns_is_equota),
      cmocka_unit_test(quota_check_answers_as_a_call),
      cmocka_unit_test(time_is_checked),
      cmocka_unit_test(count_overflow_is_eoverflow),
      cmocka_unit_test(bucket_arithmetic_never_wraps),
      cmocka_unit_test(unsupported_operations_are_enotsup),
      cmocka_unit_test(bucket_set_above_burst_is_erange),
      cmocka_unit_test(windows_ignore_burst),
      cmocka_unit_test(key_count_tracks_keys),
      cmocka_unit_test(many_keys),
      cmocka_unit_test(refused_set_keeps_the_deny_cache),
      cmocka_unit_test(policy_and_inc_drop_the_deny_cache),
      cmocka_unit_test(batch_with_deny_cache_is_serial),
      cmocka_unit_test(batch_with_a_crowded_deny_cache_is_serial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
