/* SPDX-License-Identifier: MIT */
/*
 * test_nb_uv.c - the libuv adapter of the non-blocking API
 * (examples/nb_uv.c) on a real redis-server (tests/redis/with_redis.sh):
 *   - 1,000 decisions in flight at once from the loop's one thread: every
 *     one answered, exact per key, in submission order per key;
 *   - an unresponsive server (SIGSTOP): the adapter's timeout answers the
 *     calls (degraded), the node is down for the backoff (calls answered at
 *     once, without a round trip), then exact again once it answers; the
 *     timed-out calls ran once on the server, never twice;
 *   - a server killed and restarted; closing with requests pending (each
 *     answered, every handle closed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "nb_uv.h"
#include "redis_server.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int server_up(void **state) {
  (void)state;
  rs_resume();
  if (!rs_alive() && !rs_start())
    return -1;
  return 0;
}

static tg_uv *make(uv_loop_t *loop, const char *what, tg_policy policy,
                   uint32_t timeout_ms, uint32_t backoff_ms) {
  static char prefix[16][48];
  static unsigned n;
  char *p = prefix[n++ % 16];
  snprintf(p, 48, "uv%ld.%s.%u", (long)getpid(), what, n);
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.port = rs_port();
  rc.key_prefix = p;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_FIXED_WINDOW_PER_KEY;
  cfg.on_failure = policy;
  cfg.redis = &rc;
  tg_uv *u = NULL;
  assert_int_equal(tg_uv_new(&u, loop, &cfg, timeout_ms, backoff_ms), TG_OK);
  return u;
}

static long decided;

static void count_cb(tg_uv_req *req) {
  (void)req;
  decided++;
}

/* Runs the loop until `want` callbacks have run (or limit turns). */
static void run_until(uv_loop_t *loop, long want) {
  for (int i = 0; i < 200000 && decided < want; i++)
    uv_run(loop, UV_RUN_ONCE);
}

static bool closed;
static void on_closed(void *arg) {
  (void)arg;
  closed = true;
}

static void close_all(uv_loop_t *loop, tg_uv *u) {
  closed = false;
  tg_uv_close(u, on_closed, NULL);
  uv_run(loop, UV_RUN_DEFAULT); /* returns once every handle is closed */
  assert_true(closed);
}

static long long decisions_run(void) {
  redisContext *c = rs_connect();
  assert_non_null(c);
  redisReply *r = rs_cmd(c, "INFO commandstats");
  long long n = 0;
  static const char *const names[] = {"cmdstat_evalsha:calls=",
                                      "cmdstat_tg.step:calls="};
  for (size_t i = 0; i < 2; i++) {
    const char *p = strstr(r->str, names[i]);
    if (p)
      n += strtoll(p + strlen(names[i]), NULL, 10);
  }
  freeReplyObject(r);
  redisFree(c);
  return n;
}

static void reset_stats(void) {
  redisContext *c = rs_connect();
  assert_non_null(c);
  assert_true(rs_ok(c, "CONFIG RESETSTAT"));
  redisFree(c);
}

static void thousand_in_flight(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tg_uv *u = make(&loop, "many", TG_POLICY_ERROR, 2000, 100);
  enum { N = 1000, K = 40, L = 7 };
  static tg_uv_req req[N];
  static char keys[K][16];
  tg_quota q = {.limit = L, .period_ms = 3600000};
  for (int k = 0; k < K; k++)
    snprintf(keys[k], sizeof keys[k], "k%d", k);
  decided = 0;
  for (int i = 0; i < N; i++) {
    req[i].nb = (tg_nb_req){
        .key = keys[i % K], .key_len = strlen(keys[i % K]), .q = &q, .cost = 1};
    assert_int_equal(tg_uv_hit(u, &req[i], count_cb), TG_OK);
  }
  assert_int_equal(decided, 0); /* never a callback inside tg_uv_hit */
  assert_int_equal(tg_uv_pending(u), N);
  run_until(&loop, N);
  assert_int_equal(decided, N);
  assert_int_equal(tg_uv_pending(u), 0);
  long allowed = 0;
  for (int i = 0; i < N; i++) {
    assert_int_equal(req[i].nb.status, TG_OK);
    assert_false(req[i].nb.result.degraded);
    /* per key in submission order: counts 1, 2, 3... the first L allowed */
    assert_int_equal(req[i].nb.result.count, (uint64_t)(i / K + 1));
    assert_int_equal(req[i].nb.result.allowed, i < K * L);
    allowed += req[i].nb.result.allowed;
  }
  assert_int_equal(allowed, K * L);
  /* invalid input: refused at once, no callback */
  tg_uv_req bad = {.nb = {.key = "", .key_len = 0, .q = &q, .cost = 1}};
  assert_int_equal(tg_uv_hit(u, &bad, count_cb), TG_EKEY);
  close_all(&loop, u);
  assert_int_equal(decided, N);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void unresponsive_then_back(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  /* a long backoff: the test sees the node down before it ends */
  tg_uv *u = make(&loop, "stop", TG_POLICY_FAIL_CLOSED, 300, 1500);
  tg_quota q = {.limit = 100, .period_ms = 3600000};
  tg_uv_req r[10];
  decided = 0;
  r[0].nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
  assert_int_equal(tg_uv_hit(u, &r[0], count_cb), TG_OK);
  run_until(&loop, 1);
  assert_int_equal(r[0].nb.status, TG_OK); /* connected, handshake done */
  reset_stats();
  assert_true(rs_pause());
  for (int i = 0; i < 5; i++) {
    r[i].nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
    assert_int_equal(tg_uv_hit(u, &r[i], count_cb), TG_OK);
  }
  run_until(&loop, 6);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(r[i].nb.status, TG_ETIMEDOUT);
    assert_true(r[i].nb.result.degraded && !r[i].nb.result.allowed);
  }
  /* down: answered on the next turn, no connection, no round trip */
  r[5].nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
  assert_int_equal(tg_uv_hit(u, &r[5], count_cb), TG_OK);
  run_until(&loop, 7);
  assert_int_equal(r[5].nb.status, TG_ETIMEDOUT);
  assert_true(rs_resume());
  /* after the backoff the node is tried again, and answers */
  for (int tries = 0; tries < 100; tries++) {
    r[6].nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
    long want = decided + 1;
    assert_int_equal(tg_uv_hit(u, &r[6], count_cb), TG_OK);
    run_until(&loop, want);
    if (r[6].nb.status == TG_OK)
      break;
    rs_sleep_ms(50);
  }
  assert_int_equal(r[6].nb.status, TG_OK);
  /* the five timed-out calls reached the server and ran once each (when it
   * resumed); none was sent again: 1 + 5 + 1 */
  assert_int_equal(r[6].nb.result.count, 7);
  assert_int_equal(decisions_run(), 6);
  close_all(&loop, u);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void killed_then_restarted(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tg_uv *u = make(&loop, "kill", TG_POLICY_FAIL_OPEN, 1000, 50);
  tg_quota q = {.limit = 100, .period_ms = 3600000};
  tg_uv_req r;
  decided = 0;
  r.nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
  assert_int_equal(tg_uv_hit(u, &r, count_cb), TG_OK);
  run_until(&loop, 1);
  assert_int_equal(r.nb.status, TG_OK);
  assert_true(rs_stop());
  r.nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
  assert_int_equal(tg_uv_hit(u, &r, count_cb), TG_OK);
  run_until(&loop, 2);
  assert_int_equal(r.nb.status, TG_ECONNECT);
  assert_true(r.nb.result.degraded && r.nb.result.allowed);
  assert_true(rs_start());
  for (int tries = 0; tries < 100; tries++) {
    r.nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
    long want = decided + 1;
    assert_int_equal(tg_uv_hit(u, &r, count_cb), TG_OK);
    run_until(&loop, want);
    if (r.nb.status == TG_OK)
      break;
    rs_sleep_ms(20);
  }
  assert_int_equal(r.nb.status, TG_OK);
  assert_int_equal(r.nb.result.count, 1); /* a new, empty server */
  close_all(&loop, u);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void close_answers_pending(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tg_uv *u = make(&loop, "close", TG_POLICY_ERROR, 1000, 100);
  tg_quota q = {.limit = 100, .period_ms = 3600000};
  static tg_uv_req r[50];
  decided = 0;
  for (int i = 0; i < 50; i++) {
    r[i].nb = (tg_nb_req){.key = "k", .key_len = 1, .q = &q, .cost = 1};
    assert_int_equal(tg_uv_hit(u, &r[i], count_cb), TG_OK);
  }
  uv_run(&loop, UV_RUN_NOWAIT); /* some may be on their way */
  close_all(&loop, u);
  assert_int_equal(decided, 50); /* every one answered */
  for (int i = 0; i < 50; i++)
    assert_true(r[i].nb.status == TG_OK || r[i].nb.status == TG_ECONNECT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(thousand_in_flight, server_up),
      cmocka_unit_test_setup(unresponsive_then_back, server_up),
      cmocka_unit_test_setup(killed_then_restarted, server_up),
      cmocka_unit_test_setup(close_answers_pending, server_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
