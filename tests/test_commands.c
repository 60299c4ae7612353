/* SPDX-License-Identifier: MIT */
/*
 * test_commands.c - the command set of `tollgate serve` (tools/commands.c),
 * driven without a network: each request goes straight to cmd_execute with
 * a time the test chooses, so every field of every reply is checked
 * exactly, byte for byte where the bytes matter. What the server adds on top
 * (sockets, pipelining, hostile clients, real client libraries) is tested by
 * the scripts in tests/serve/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tollgate.h"

/* 2025-01-01 00:00:00 UTC, a multiple of every period used here (ms). */
#define T0_MS UINT64_C(1735689600000)
#define AT(ms) ((T0_MS + (ms)) * UINT64_C(1000))

static cmd_ctx ctx;
static cmd_session sess = {.id = 42, .authenticated = true};
static outbuf out;
static char reply[1 << 16];
static cmd_after after;

static void make_ctx(cmd_ctx *c, uint64_t capacity, tg_policy policy) {
  memset(c, 0, sizeof *c);
  c->policy = policy;
  c->store = "memory";
  c->tcp_port = 6380;
  c->max_clients = 10;
  c->start_us = AT(0);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = (tg_algorithm)a;
    cfg.capacity = capacity;
    cfg.clean_period_ms = 0;
    cfg.on_failure = policy;
    assert_int_equal(tg_limiter_new(&c->lim[a], &cfg), TG_OK);
  }
}

static void free_ctx(cmd_ctx *c) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter_destroy(c->lim[a]);
    tg_limiter_destroy(c->lim_nowait[a]);
  }
  tg_limiter_destroy(c->new_keys);
  memset(c, 0, sizeof *c);
}

static int setup(void **state) {
  (void)state;
  make_ctx(&ctx, 1024, TG_POLICY_FAIL_OPEN);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free_ctx(&ctx);
  out_free(&out);
  return 0;
}

/* The session requests run in (RUN_AS changes it). */
static cmd_session *who = &sess;

/* Runs argv[0..argc) on c at now_us; returns the reply as a C string. */
static const char *run_argv(cmd_ctx *c, uint64_t now_us, const resp_arg *argv,
                            size_t argc) {
  out.len = 0;
  after = cmd_execute(c, who, argv, argc, now_us, &out);
  assert_false(out.failed);
  assert_true(out.len < sizeof reply);
  memcpy(reply, out.data, out.len);
  reply[out.len] = '\0';
  return reply;
}

/* Runs a request written as one line of space-separated words. */
static const char *run_on(cmd_ctx *c, uint64_t now_us, const char *line) {
  static char copy[4096];
  resp_arg argv[RESP_MAX_ARGS];
  size_t argc = 0;
  snprintf(copy, sizeof copy, "%s", line);
  for (char *p = strtok(copy, " "); p && argc < RESP_MAX_ARGS;
       p = strtok(NULL, " ")) {
    argv[argc].ptr = p;
    argv[argc].len = strlen(p);
    argc++;
  }
  return run_argv(c, now_us, argv, argc);
}
#define RUN(now, line) run_on(&ctx, now, line)

/* Runs a request on c as session se. */
static const char *run_as(cmd_ctx *c, cmd_session *se, uint64_t now_us,
                          const char *line) {
  who = se;
  const char *r = run_on(c, now_us, line);
  who = &sess;
  return r;
}

/* Reads an array of integers ("*6\r\n:1\r\n...") into v; returns how many,
 * or fails the test if the reply is anything else. */
static size_t ints(const char *r, int64_t *v, size_t cap) {
  char *end;
  if (r[0] != '*')
    fail_msg("not an array: %s", r);
  size_t n = (size_t)strtoul(r + 1, &end, 10);
  assert_true(n <= cap);
  r = end + 2;
  for (size_t i = 0; i < n; i++) {
    if (r[0] != ':')
      fail_msg("element %zu is not an integer: %s", i, r);
    v[i] = strtoll(r + 1, &end, 10);
    assert_memory_equal(end, "\r\n", 2);
    r = end + 2;
  }
  assert_int_equal(*r, '\0');
  return n;
}

/* Checks a TG.HIT reply field by field. */
static void assert_hit(const char *r, int64_t allowed, int64_t count,
                       int64_t remaining, int64_t retry, int64_t reset,
                       int64_t degraded) {
  int64_t v[6];
  if (ints(r, v, 6) != 6)
    fail_msg("not 6 fields: %s", r);
  const int64_t want[6] = {allowed, count, remaining, retry, reset, degraded};
  static const char *const names[6] = {"allowed",        "count",
                                       "remaining",      "retry_after_ms",
                                       "reset_after_ms", "degraded"};
  for (int i = 0; i < 6; i++)
    if (v[i] != want[i])
      fail_msg("%s: got %" PRId64 ", want %" PRId64, names[i], v[i], want[i]);
}

static void assert_starts(const char *r, const char *prefix) {
  if (strncmp(r, prefix, strlen(prefix)) != 0)
    fail_msg("reply '%s' does not start with '%s'", r, prefix);
}

/* ---- TG.HIT ---- */

static void hit_answers_every_field(void **state) {
  (void)state;
  const char *h = "TG.HIT user:1 sliding_window 3 60000";
  assert_hit(RUN(AT(0), h), 1, 1, 2, 0, 60000, 0);
  assert_hit(RUN(AT(1000), h), 1, 2, 1, 0, 60000, 0);
  assert_hit(RUN(AT(2000), h), 1, 3, 0, 0, 60000, 0);
  /* denied: until the oldest entry leaves; fresh when the newest does */
  assert_hit(RUN(AT(3000), h), 0, 3, 0, 57000, 59000, 0);
  assert_hit(RUN(AT(60000), h), 1, 3, 0, 0, 60000, 0);
  assert_int_equal(after, CMD_KEEP);
}

static void hit_options_in_any_order_and_case(void **state) {
  (void)state;
  /* a full bucket of 20 tokens, a call of cost 2 */
  assert_hit(RUN(AT(0), "tg.hit tb TOKEN_BUCKET 10 1000 cost 2 BURST 20"), 1,
             18, 18, 0, 200, 0);
  assert_hit(RUN(AT(0), "TG.HIT tb token_bucket 10 1000 BURST 20 COST 18"), 1,
             0, 0, 0, 2000, 0);
  /* empty: one token back after 100 ms */
  assert_hit(RUN(AT(0), "Tg.Hit tb Token_Bucket 10 1000 BURST 20"), 0, 0, 0,
             100, 2000, 0);
  /* a peek changes nothing */
  assert_hit(RUN(AT(100), "TG.HIT tb token_bucket 10 1000 BURST 20 COST 0"), 1,
             1, 1, 0, 1900, 0);
}

/* Every algorithm's name, in any case, names it, and nothing near it
 * does (the parser picks a candidate by first letter and length before it
 * compares). */
static void algorithm_names_and_near_misses(void **state) {
  (void)state;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    const char *name = tg_algorithm_name((tg_algorithm)a);
    char up[32], mixed[32], line[96];
    size_t n = strlen(name);
    assert_true(n < sizeof up);
    for (size_t i = 0; i <= n; i++) {
      char c = name[i];
      up[i] = (char)(c >= 'a' && c <= 'z' ? c - 32 : c);
      mixed[i] = (char)(i % 2 ? up[i] : c);
    }
    const char *forms[] = {name, up, mixed};
    for (size_t f = 0; f < 3; f++) {
      snprintf(line, sizeof line, "TG.HIT k%d %s 5 1000", a, forms[f]);
      const char *r = RUN(AT(0), line);
      assert_true(strncmp(r, "*6\r\n:1\r\n", 8) == 0);
    }
  }
  static const char *const near[] = {
      "f",           "fixed_windox",        "fixed_window_",
      "fixed_windo", "fixed_window_per_ke", "fixed_window_per_kez",
      "s",           "sliding_windowx",     "token_buckex",
      "token",       "leaky_buckets",       "xeaky_bucket",
      "fixed window"};
  for (size_t i = 0; i < sizeof near / sizeof near[0]; i++) {
    resp_arg argv[5] = {{"TG.HIT", 6},
                        {"k", 1},
                        {near[i], strlen(near[i])},
                        {"5", 1},
                        {"1000", 4}};
    const char *r = run_argv(&ctx, AT(0), argv, 5);
    assert_non_null(strstr(r, "unknown algorithm"));
  }
}

static void never_is_minus_one(void **state) {
  (void)state;
  /* cost above the limit can never pass: retry_after_ms is TG_NEVER */
  int64_t v[6];
  ints(RUN(AT(0), "TG.HIT big fixed_window 3 60000 COST 5"), v, 6);
  assert_int_equal(v[0], 0);
  assert_int_equal(v[3], -1);
  ints(RUN(AT(0), "TG.HIT big token_bucket 3 60000 COST 5"), v, 6);
  assert_int_equal(v[3], -1);
}

static void fixed_window_counts_denied_calls(void **state) {
  (void)state;
  const char *h = "TG.HIT fw fixed_window 2 60000";
  assert_hit(RUN(AT(10000), h), 1, 1, 1, 0, 50000, 0);
  assert_hit(RUN(AT(10000), h), 1, 2, 0, 0, 50000, 0);
  assert_hit(RUN(AT(20000), h), 0, 3, 0, 40000, 40000, 0);
  assert_hit(RUN(AT(60000), h), 1, 1, 1, 0, 60000, 0); /* next window */
}

static void arguments_are_checked(void **state) {
  (void)state;
  static const struct {
    const char *line, *reply; /* reply: a prefix of the expected reply */
  } cases[] = {
      {"TG.HIT k nope 3 1000", "-ERR unknown algorithm 'nope'"},
      {"TG.HIT k fixed_window x 1000",
       "-ERR value is not an integer or out of range\r\n"},
      {"TG.HIT k fixed_window -1 1000", "-ERR value is not an integer"},
      {"TG.HIT k fixed_window +1 1000", "-ERR value is not an integer"},
      {"TG.HIT k fixed_window 9223372036854775808 1000",
       "-ERR value is not an integer"},
      {"TG.HIT k fixed_window 3 1000 COST 99999999999999999999",
       "-ERR value is not an integer"},
      {"TG.HIT k fixed_window 3",
       "-ERR wrong number of arguments for 'tg.hit' command\r\n"},
      {"TG.HIT k fixed_window 3 1000 COST 1 BURST 1 COST",
       "-ERR wrong number of arguments for 'tg.hit' command\r\n"},
      {"TG.HIT k fixed_window 3 1000 BURST", "-ERR syntax error\r\n"},
      {"TG.HIT k fixed_window 3 1000 FOO 1", "-ERR syntax error\r\n"},
      {"TG.INC k fixed_window 3 1000 BURST 1", "-ERR syntax error\r\n"},
      {"TG.GET k fixed_window 3 1000 COST 1", "-ERR syntax error\r\n"},
      {"TG.SET k token_bucket 3 1000",
       "-ERR wrong number of arguments for 'tg.set' command\r\n"},
      {"TG.SET k token_bucket 3 1000 x", "-ERR value is not an integer"},
      {"TG.RESET k nope", "-ERR unknown algorithm 'nope'"},
      {"TG.RESET", "-ERR wrong number of arguments for 'tg.reset' command"},
      /* statuses of the library, named by tg_err_name */
      {"TG.HIT k fixed_window 0 1000",
       "-TG_EQUOTA invalid quota (limit 0, period 0 or out of range)\r\n"},
      {"TG.HIT k fixed_window 3 0", "-TG_EQUOTA "},
      {"TG.HIT k fixed_window 3 1000000000001", "-TG_EQUOTA "},
      {"TG.INC k sliding_window 3 1000",
       "-TG_ENOTSUP operation not supported by this algorithm, store or "
       "build\r\n"},
      {"TG.SET k sliding_window 3 1000 1", "-TG_ENOTSUP "},
      {"TG.SET k token_bucket 3 1000 4", "-TG_ERANGE "},
      {"NOPE", "-ERR unknown command 'NOPE'\r\n"},
      {"PING a b", "-ERR wrong number of arguments for 'ping' command\r\n"},
      {"ECHO", "-ERR wrong number of arguments for 'echo' command\r\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t errors = ctx.stats.error_replies;
    const char *r = RUN(AT(0), cases[i].line);
    if (strncmp(r, cases[i].reply, strlen(cases[i].reply)) != 0)
      fail_msg("'%s': got '%s', want '%s...'", cases[i].line, r,
               cases[i].reply);
    assert_int_equal(ctx.stats.error_replies, errors + 1);
  }
  /* the largest value accepted */
  assert_starts(RUN(AT(0), "TG.HIT k fixed_window 9223372036854775807 1000"),
                "*6\r\n:1\r\n");
}

static void keys_are_bytes(void **state) {
  (void)state;
  char longkey[TG_KEY_MAX + 1];
  memset(longkey, 'k', sizeof longkey);
  resp_arg argv[] = {{"TG.HIT", 6},
                     {longkey, TG_KEY_MAX + 1},
                     {"fixed_window", 12},
                     {"1", 1},
                     {"60000", 5}};
  assert_starts(run_argv(&ctx, AT(0), argv, 5), "-TG_EKEY ");
  argv[1].len = 0;
  assert_starts(run_argv(&ctx, AT(0), argv, 5), "-TG_EKEY ");
  argv[1].len = TG_KEY_MAX;
  assert_hit(run_argv(&ctx, AT(0), argv, 5), 1, 1, 0, 0, 60000, 0);
  /* NUL, CR and LF are key bytes like any other */
  argv[1] = (resp_arg){"b\0\r\n", 4};
  assert_hit(run_argv(&ctx, AT(0), argv, 5), 1, 1, 0, 0, 60000, 0);
  argv[1] = (resp_arg){"b", 1};
  assert_hit(run_argv(&ctx, AT(0), argv, 5), 1, 1, 0, 0, 60000, 0);
  assert_hit(run_argv(&ctx, AT(0), argv, 5), 0, 2, 0, 60000, 60000, 0);
}

/* ---- the other operations ---- */

static void inc_get_set_expiresat_reset(void **state) {
  (void)state;
  assert_string_equal(RUN(AT(0), "TG.INC c fixed_window 10 60000 COST 4"),
                      ":4\r\n");
  assert_string_equal(RUN(AT(0), "TG.INC c fixed_window 10 60000"), ":5\r\n");
  assert_string_equal(RUN(AT(1), "TG.GET c fixed_window 10 60000"), ":5\r\n");
  assert_string_equal(RUN(AT(1), "TG.SET c fixed_window 10 60000 7"),
                      "+OK\r\n");
  assert_string_equal(RUN(AT(2), "TG.GET c fixed_window 10 60000"), ":7\r\n");
  assert_string_equal(RUN(AT(2), "TG.EXPIRESAT c fixed_window 10 60000"),
                      ":1735689660000\r\n");
  assert_string_equal(RUN(AT(2), "TG.RESET c fixed_window"), "+OK\r\n");
  assert_string_equal(RUN(AT(2), "TG.GET c fixed_window 10 60000"), ":0\r\n");
  assert_string_equal(RUN(AT(2), "TG.EXPIRESAT c fixed_window 10 60000"),
                      ":0\r\n");

  /* buckets: an unknown token bucket is full; refill is continuous */
  const char *get = "TG.GET b token_bucket 10 1000 BURST 20";
  assert_string_equal(RUN(AT(0), get), ":20\r\n");
  assert_string_equal(RUN(AT(0), "TG.SET b token_bucket 10 1000 5 BURST 20"),
                      "+OK\r\n");
  assert_string_equal(RUN(AT(0), get), ":5\r\n");
  assert_string_equal(RUN(AT(500), get), ":10\r\n");
  assert_string_equal(
      RUN(AT(500), "TG.EXPIRESAT b token_bucket 10 1000 BURST 20"),
      ":1735689601500\r\n");

  /* TG.RESET without an algorithm forgets the key everywhere */
  RUN(AT(0), "TG.HIT both fixed_window 10 60000");
  RUN(AT(0), "TG.HIT both leaky_bucket 10 60000");
  assert_string_equal(RUN(AT(0), "TG.GET both leaky_bucket 10 60000"),
                      ":1\r\n");
  assert_string_equal(RUN(AT(0), "TG.RESET both"), "+OK\r\n");
  assert_string_equal(RUN(AT(0), "TG.GET both fixed_window 10 60000"),
                      ":0\r\n");
  assert_string_equal(RUN(AT(0), "TG.GET both leaky_bucket 10 60000"),
                      ":0\r\n");
}

static void algorithms_keep_separate_state(void **state) {
  (void)state;
  RUN(AT(0), "TG.HIT same fixed_window 1 60000");
  assert_hit(RUN(AT(0), "TG.HIT same fixed_window_per_key 1 60000"), 1, 1, 0, 0,
             60000, 0);
  assert_hit(RUN(AT(0), "TG.HIT same fixed_window 1 60000"), 0, 2, 0, 60000,
             60000, 0);
}

/* ---- store failures ---- */

static void a_full_store_answers_by_the_policy(void **state) {
  (void)state;
  static const tg_policy policies[] = {TG_POLICY_FAIL_OPEN,
                                       TG_POLICY_FAIL_CLOSED, TG_POLICY_ERROR};
  for (size_t p = 0; p < 3; p++) {
    cmd_ctx small;
    make_ctx(&small, 4, policies[p]);
    const char *r = NULL;
    char line[64];
    int i;
    /* live keys fill the table; a new one then cannot be stored */
    for (i = 0; i < 100000; i++) {
      snprintf(line, sizeof line, "TG.HIT k%d fixed_window 5 60000", i);
      r = run_on(&small, AT(0), line);
      if (r[0] == '-' || strcmp(r + strlen(r) - 4, ":1\r\n") == 0)
        break; /* an error, or degraded = 1 */
    }
    assert_true(i < 100000);
    if (policies[p] == TG_POLICY_ERROR) {
      assert_string_equal(r, "-TG_EFULL store is full\r\n");
      assert_int_equal(small.stats.degraded, 0);
    } else if (policies[p] == TG_POLICY_FAIL_OPEN) {
      assert_hit(r, 1, 0, 0, 0, 0, 1);
      assert_int_equal(small.stats.degraded, 1);
    } else {
      int64_t v[6];
      ints(r, v, 6);
      assert_int_equal(v[0], 0);     /* closed */
      assert_int_equal(v[3], 60000); /* retry after one period */
      assert_int_equal(v[5], 1);
      assert_int_equal(small.stats.degraded, 1);
    }
    free_ctx(&small);
  }
}

/* ---- what clients expect of a Redis server ---- */

static void connection_commands(void **state) {
  (void)state;
  assert_string_equal(RUN(AT(0), "PING"), "+PONG\r\n");
  assert_string_equal(RUN(AT(0), "ping hello"), "$5\r\nhello\r\n");
  assert_string_equal(RUN(AT(0), "ECHO hi"), "$2\r\nhi\r\n");
  assert_string_equal(RUN(AT(0), "SELECT 0"), "+OK\r\n");
  assert_starts(RUN(AT(0), "SELECT 1"), "-ERR DB index is out of range");
  assert_string_equal(RUN(AT(0), "CLIENT ID"), ":42\r\n");
  assert_string_equal(RUN(AT(0), "CLIENT SETNAME app"), "+OK\r\n");
  assert_string_equal(RUN(AT(0), "CLIENT SETINFO LIB-NAME x"), "+OK\r\n");
  assert_string_equal(RUN(AT(0), "CLIENT GETNAME"), "$-1\r\n");
  assert_starts(RUN(AT(0), "CLIENT KILL x"), "-ERR ");
  assert_string_equal(RUN(AT(0), "CONFIG GET save"),
                      "*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
  assert_string_equal(RUN(AT(0), "CONFIG GET appendonly"),
                      "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
  assert_string_equal(RUN(AT(0), "CONFIG GET maxmemory"), "*0\r\n");
  assert_starts(RUN(AT(0), "CONFIG SET save x"), "-ERR ");
  assert_int_equal(after, CMD_KEEP);
  assert_string_equal(RUN(AT(0), "QUIT"), "+OK\r\n");
  assert_int_equal(after, CMD_CLOSE);
}

static void hello_speaks_resp2_only(void **state) {
  (void)state;
  const char *r = RUN(AT(0), "HELLO");
  assert_starts(r, "*14\r\n$6\r\nserver\r\n$8\r\ntollgate\r\n");
  assert_non_null(strstr(r, "$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:42\r\n"));
  assert_starts(RUN(AT(0), "HELLO 2 SETNAME app"), "*14\r\n");
  assert_string_equal(RUN(AT(0), "HELLO 3"),
                      "-NOPROTO this protocol version is not supported\r\n");
  assert_starts(RUN(AT(0), "HELLO x"), "-ERR ");
  /* no password is set: only the default user exists, and takes any */
  assert_starts(RUN(AT(0), "HELLO 2 AUTH a b"), "-WRONGPASS ");
  assert_starts(RUN(AT(0), "HELLO 2 AUTH default b"), "*14\r\n");
  assert_starts(RUN(AT(0), "HELLO 2 AUTH default"), "-ERR option 'AUTH'");
}

/* ---- operator controls ---- */

static const char *info_field(const char *r, const char *name) {
  static char v[64];
  const char *p = strstr(r, name);
  if (!p)
    fail_msg("no %s in INFO: %s", name, r);
  p += strlen(name);
  size_t n = strcspn(p, "\r");
  snprintf(v, sizeof v, "%.*s", (int)n, p);
  return v;
}

static void a_password_guards_everything_but_auth(void **state) {
  (void)state;
  cmd_ctx c;
  make_ctx(&c, 64, TG_POLICY_FAIL_OPEN);
  assert_int_equal(cmd_set_pass(&c, "s3cret", 6), 0);
  cmd_session se = {.id = 7};
  static const char *const guarded[] = {
      "PING",       "TG.HIT k fixed_window 1 1000",
      "INFO",       "DBSIZE",
      "TG.RESET k", "NOPE",
      "CLIENT ID",  "COMMAND"};
  for (size_t i = 0; i < sizeof guarded / sizeof guarded[0]; i++)
    assert_string_equal(run_as(&c, &se, AT(0), guarded[i]),
                        "-NOAUTH Authentication required.\r\n");
  /* nothing reached the store */
  assert_int_equal(tg_key_count(c.lim[TG_FIXED_WINDOW]), 0);
  assert_starts(run_as(&c, &se, AT(0), "HELLO 2"), "-NOAUTH HELLO must be");
  /* wrong passwords: shorter, longer, one byte off, another user */
  static const char *const wrong[] = {"AUTH s3cre",      "AUTH s3cret!",
                                      "AUTH s3creT",     "AUTH x",
                                      "AUTH bob s3cret", "AUTH default s3cre"};
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
    assert_string_equal(run_as(&c, &se, AT(0), wrong[i]),
                        "-WRONGPASS invalid username-password pair or user "
                        "is disabled.\r\n");
  assert_false(se.authenticated);
  assert_starts(run_as(&c, &se, AT(0), "HELLO 2 AUTH default nope"),
                "-WRONGPASS ");
  assert_string_equal(run_as(&c, &se, AT(0), "AUTH s3cret"), "+OK\r\n");
  assert_true(se.authenticated);
  assert_string_equal(run_as(&c, &se, AT(0), "PING"), "+PONG\r\n");
  assert_string_equal(
      info_field(run_as(&c, &se, AT(0), "INFO stats"), "auth_failures:"), "7");
  /* the ACL form, and HELLO with AUTH, on fresh connections */
  cmd_session se2 = {.id = 8};
  assert_string_equal(run_as(&c, &se2, AT(0), "AUTH default s3cret"),
                      "+OK\r\n");
  assert_true(se2.authenticated);
  cmd_session se3 = {.id = 9};
  assert_starts(run_as(&c, &se3, AT(0), "HELLO 2 AUTH default s3cret"),
                "*14\r\n");
  assert_true(se3.authenticated);
  /* a wrong AUTH later does not log an authenticated client out (Redis) */
  assert_starts(run_as(&c, &se3, AT(0), "AUTH x"), "-WRONGPASS");
  assert_true(se3.authenticated);
  /* QUIT needs no password */
  cmd_session se4 = {.id = 10};
  assert_string_equal(run_as(&c, &se4, AT(0), "QUIT"), "+OK\r\n");
  assert_int_equal(after, CMD_CLOSE);
  /* without a password, AUTH alone is an error, as in Redis */
  assert_starts(RUN(AT(0), "AUTH x"),
                "-ERR AUTH <password> called without any password");
  assert_string_equal(RUN(AT(0), "AUTH default x"), "+OK\r\n");
  assert_int_equal(cmd_set_pass(&c, "", 0), -1);
  char big[CMD_PASS_MAX + 1];
  memset(big, 'p', sizeof big);
  assert_int_equal(cmd_set_pass(&c, big, sizeof big), -1);
  assert_int_equal(cmd_set_pass(&c, big, CMD_PASS_MAX), 0);
  free_ctx(&c);
}

static void max_period_refuses_longer_periods(void **state) {
  (void)state;
  cmd_ctx c;
  make_ctx(&c, 64, TG_POLICY_FAIL_OPEN);
  c.max_period_ms = 3600000;
  assert_hit(run_on(&c, AT(0), "TG.HIT k fixed_window 1 3600000"), 1, 1, 0, 0,
             3600000, 0);
  static const char *const over[] = {
      "TG.HIT k2 fixed_window 1 3600001",
      "TG.HIT k2 token_bucket 1 1000000000000 BURST 5",
      "TG.INC k2 fixed_window 1 3600001",
      "TG.GET k2 sliding_window 1 3600001",
      "TG.SET k2 token_bucket 1 3600001 0",
      "TG.EXPIRESAT k2 leaky_bucket 1 3600001"};
  for (size_t i = 0; i < sizeof over / sizeof over[0]; i++) {
    const char *r = run_on(&c, AT(0), over[i]);
    assert_starts(r, "-ERR period_ms ");
    assert_non_null(
        strstr(r, " is above this server's limit of 3600000 (--max-period-ms)"
                  "\r\n"));
  }
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    assert_int_equal(tg_key_count(c.lim[a]), a == TG_FIXED_WINDOW ? 1 : 0);
  /* a bucket whose burst takes longer than that to refill: the same */
  assert_starts(run_on(&c, AT(0), "TG.HIT b token_bucket 10 60000 BURST 100"),
                "*6\r\n"); /* 600 s */
  assert_starts(run_on(&c, AT(0), "TG.HIT b leaky_bucket 1 3600000"),
                "*6\r\n"); /* burst = limit: an hour */
  assert_string_equal(
      run_on(&c, AT(0), "TG.HIT b2 token_bucket 1 3600000 BURST 2"),
      "-ERR period_ms 3600000 x burst / limit (the time a bucket takes to "
      "refill) is above this server's limit of 3600000 (--max-period-ms)\r\n");
  assert_starts(
      run_on(&c, AT(0),
             "TG.HIT b2 leaky_bucket 1 1000 BURST 9223372036854775807"),
      "-ERR period_ms 1000 x burst"); /* no overflow */
  assert_starts(
      run_on(&c, AT(0), "TG.HIT b2 sliding_window 1 3600000 BURST 1000"),
      "*6\r\n"); /* windows ignore the burst */
  /* a policy names the rule */
  assert_string_equal(
      run_on(&c, AT(0),
             "TG.POLICY p fixed_window 1 1000 p2 fixed_window 1 3600001"),
      "-ERR period_ms 3600001 (rule 1) is above this server's limit of "
      "3600000 (--max-period-ms)\r\n");
  assert_string_equal(
      info_field(run_on(&c, AT(0), "INFO stats"), "requests_over_max_period:"),
      "9");
  free_ctx(&c);
}

/* A server context whose clients may each create `limit` new keys per
 * period_ms (--max-new-keys-per-client), as serve.c builds the budget. */
static void make_budget_ctx(cmd_ctx *c, uint64_t limit, uint64_t period_ms) {
  make_ctx(c, 1024, TG_POLICY_FAIL_OPEN);
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  cfg.clean_period_ms = 0;
  cfg.on_failure = TG_POLICY_FAIL_CLOSED;
  assert_int_equal(tg_limiter_new(&c->new_keys, &cfg), TG_OK);
  c->new_keys_q = (tg_quota){.limit = limit, .period_ms = period_ms};
}

static void each_client_has_a_budget_of_new_keys(void **state) {
  (void)state;
  cmd_ctx c;
  make_budget_ctx(&c, 3, 3000); /* 1 a second */
  cmd_session a = {.id = 1, .who = {'4', 10, 0, 0, 1}, .who_len = 5};
  cmd_session b = {.id = 2, .who = {'4', 10, 0, 0, 2}, .who_len = 5};
  /* three new keys, each algorithm and command counts */
  assert_hit(run_as(&c, &a, AT(0), "TG.HIT a1 fixed_window 5 60000"), 1, 1, 4,
             0, 60000, 0);
  assert_string_equal(run_as(&c, &a, AT(0), "TG.INC a2 fixed_window 5 60000"),
                      ":1\r\n");
  assert_string_equal(run_as(&c, &a, AT(0), "TG.SET a3 token_bucket 5 60000 2"),
                      "+OK\r\n");
  /* the fourth is refused, with the wait until a token is back */
  assert_string_equal(run_as(&c, &a, AT(0), "TG.HIT a4 sliding_window 5 60000"),
                      "-NEWKEYS this client may create 3 new keys per 3000 "
                      "ms (--max-new-keys-per-client); retry in 1000 ms\r\n");
  assert_int_equal(tg_key_count(c.lim[TG_SLIDING_WINDOW]), 0);
  /* keys it holds cost nothing; nor do reads and peeks of new ones */
  for (int i = 0; i < 5; i++)
    assert_starts(run_as(&c, &a, AT(0), "TG.HIT a1 fixed_window 5 60000"),
                  "*6\r\n");
  assert_string_equal(run_as(&c, &a, AT(0), "TG.GET a9 fixed_window 5 60000"),
                      ":0\r\n");
  assert_starts(run_as(&c, &a, AT(0), "TG.HIT a9 fixed_window 5 60000 COST 0"),
                "*6\r\n");
  /* another client has its own budget */
  assert_starts(run_as(&c, &b, AT(0), "TG.HIT b1 sliding_window 5 60000"),
                "*6\r\n");
  /* a second later, one more */
  assert_starts(run_as(&c, &a, AT(1000), "TG.HIT a4 sliding_window 5 60000"),
                "*6\r\n");
  assert_starts(run_as(&c, &a, AT(1000), "TG.HIT a5 sliding_window 5 60000"),
                "-NEWKEYS ");
  /* a key whose state has decayed is new again */
  assert_starts(run_as(&c, &a, AT(61000), "TG.HIT a1 fixed_window 5 60000"),
                "*6\r\n"); /* the token of 2 s */
  assert_starts(run_as(&c, &a, AT(61000), "TG.HIT a2 fixed_window 5 60000"),
                "*6\r\n"); /* and of 3 s: the bucket holds 3 at most */
  assert_starts(run_as(&c, &a, AT(61000), "TG.HIT a6 fixed_window 5 60000"),
                "*6\r\n");
  assert_starts(run_as(&c, &a, AT(61000), "TG.HIT a7 fixed_window 5 60000"),
                "-NEWKEYS ");
  assert_string_equal(info_field(run_as(&c, &a, AT(61000), "INFO stats"),
                                 "requests_over_new_key_budget:"),
                      "3");
  free_ctx(&c);
}

/* Requests the library refuses as input create no key, so they spend none
 * of the client's budget: an operation the algorithm does not have (TG.INC
 * on a bucket, TG.SET on a sliding log), a value above the burst, a policy
 * naming one key twice or with a rule the library refuses. Before, each
 * spent a token (the policy one per rule), and the client's valid requests
 * then met -NEWKEYS. */
static void refused_input_spends_no_new_key(void **state) {
  (void)state;
  cmd_ctx c;
  make_budget_ctx(&c, 2, 600000);
  cmd_session a = {.id = 1, .who = {'4', 10, 0, 0, 1}, .who_len = 5};
  assert_starts(run_as(&c, &a, AT(0), "TG.INC n1 token_bucket 5 100000"),
                "-TG_ENOTSUP ");
  assert_starts(run_as(&c, &a, AT(0), "TG.SET n2 sliding_window 5 100000 1"),
                "-TG_ENOTSUP ");
  assert_starts(run_as(&c, &a, AT(0), "TG.SET n3 token_bucket 5 100000 99"),
                "-TG_ERANGE ");
  assert_starts(run_as(&c, &a, AT(0),
                       "TG.POLICY d fixed_window 5 100000 d fixed_window 5 "
                       "100000"),
                "-TG_EINVAL ");
  for (int i = 0; i < TG_ALGORITHM_COUNT; i++)
    assert_int_equal(tg_key_count(c.lim[i]), 0);
  /* the whole budget is left: two new keys, then -NEWKEYS */
  assert_starts(run_as(&c, &a, AT(0), "TG.HIT e1 fixed_window 5 100000"),
                "*6\r\n");
  assert_starts(run_as(&c, &a, AT(0), "TG.HIT e2 fixed_window 5 100000"),
                "*6\r\n");
  assert_starts(run_as(&c, &a, AT(0), "TG.HIT e3 fixed_window 5 100000"),
                "-NEWKEYS ");
  free_ctx(&c);
}

/* An HTTP request sent to the RESP port (a web page's POST to a loopback
 * server): the request line or its Host header closes the connection with
 * no reply, so that nothing after it (a POST's body) runs. */
static void http_on_the_resp_port_closes(void **state) {
  (void)state;
  static const char *const lines[] = {"POST / HTTP/1.1", "post /x HTTP/1.0",
                                      "Host: 127.0.0.1:6380", "HOST: x"};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    assert_string_equal(RUN(AT(0), lines[i]), "");
    assert_int_equal(after, CMD_CLOSE);
  }
  /* a key of either name is still a key */
  assert_starts(RUN(AT(0), "TG.HIT post fixed_window 5 1000"), "*6\r\n");
  assert_int_equal(after, CMD_KEEP);
  assert_string_equal(
      info_field(RUN(AT(0), "INFO stats"), "http_requests_refused:"), "4");
}

/* A custom store standing in for a shared segment whose lock a stuck
 * process holds: every call is TG_EBUSY. Counts the calls that reach it. */
static int busy_lock(void *counter, const void *key, size_t key_len, void *buf,
                     size_t cap, size_t *len) {
  (void)key, (void)key_len, (void)buf, (void)cap, (void)len;
  (*(int *)counter)++;
  return TG_CUSTOM_BUSY;
}
static int busy_set(void *counter, const void *key, size_t key_len,
                    const void *data, size_t len, uint64_t ttl_ms) {
  (void)counter, (void)key, (void)key_len, (void)data, (void)len, (void)ttl_ms;
  return TG_CUSTOM_ERROR;
}
static void busy_unlock(void *counter, const void *key, size_t key_len) {
  (void)counter, (void)key, (void)key_len;
}

static tg_limiter *busy_limiter(int *calls) {
  static tg_custom_store cs[2];
  static int n;
  tg_custom_store *s = &cs[n++ % 2];
  *s = (tg_custom_store){busy_lock, busy_set, busy_unlock, calls};
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_FIXED_WINDOW;
  cfg.custom_store = s;
  tg_limiter *lim;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static void a_stuck_lock_is_waited_for_once_per_backoff(void **state) {
  (void)state;
  cmd_ctx c;
  make_ctx(&c, 64, TG_POLICY_FAIL_OPEN);
  int waited = 0, fast = 0;
  tg_limiter_destroy(c.lim[TG_FIXED_WINDOW]);
  c.lim[TG_FIXED_WINDOW] = busy_limiter(&waited);
  c.lim_nowait[TG_FIXED_WINDOW] = busy_limiter(&fast);
  c.backoff_ms = 1000;
  c.mono_ms = 5000;
  const char *h = "TG.HIT k fixed_window 5 60000";
  /* the first call waits (here: reaches the patient limiter), the next go
   * to the twin that does not wait, until the backoff has passed */
  assert_hit(run_on(&c, AT(0), h), 1, 0, 0, 0, 0, 1);
  assert_int_equal(waited, 1);
  for (int i = 0; i < 10; i++)
    assert_hit(run_on(&c, AT(0), h), 1, 0, 0, 0, 0, 1);
  assert_string_equal(run_on(&c, AT(0), "TG.RESET k fixed_window"),
                      "-TG_EBUSY a lock is held by another caller\r\n");
  assert_int_equal(waited, 1);
  assert_int_equal(fast, 11);
  c.mono_ms = 5999;
  run_on(&c, AT(0), h);
  assert_int_equal(waited, 1);
  c.mono_ms = 6000; /* one call tries the lock again, and waits again */
  run_on(&c, AT(0), h);
  run_on(&c, AT(0), h);
  assert_int_equal(waited, 2);
  assert_int_equal(fast, 13);
  const char *info = run_on(&c, AT(0), "INFO");
  assert_string_equal(info_field(info, "store_lock_waits:"), "2");
  assert_string_equal(info_field(info, "store_status:"), "degraded");
  assert_string_equal(info_field(info, "store_last_error:"), "TG_EBUSY");
  /* another algorithm is not held back, nor counted as degraded */
  assert_starts(run_on(&c, AT(0), "TG.HIT k sliding_window 5 60000"), "*6\r\n");
  assert_string_equal(
      info_field(run_on(&c, AT(0), "INFO"), "store_degraded_algorithms:"),
      "fixed_window");
  free_ctx(&c);
}

/* The log of the store's health: one line per change and algorithm, at
 * most one a second each, healthy again only after a second without
 * failures, and it always ends up saying the state each is in. */
static void health_is_logged_once_per_change(void **state) {
  (void)state;
  store_health h;
  health_init(&h, TG_OK, 0);
  static char buf[8192];
  FILE *f = fmemopen(buf, sizeof buf, "w");
  assert_non_null(f);
  health_log(&h, 0, f, "redis:x", "open", 10);
  for (int i = 0; i < 100; i++) /* a hundred failures: one line */
    health_note(&h, TG_ETIMEDOUT, TG_TOKEN_BUCKET, 10);
  health_log(&h, 10, f, "redis:x", "open", 10);
  health_log(&h, 20, f, "redis:x", "open", 10);
  health_note(&h, TG_EKEY, TG_TOKEN_BUCKET, 30); /* says nothing: ignored */
  health_note(&h, TG_OK, TG_TOKEN_BUCKET, 500);  /* too soon: still failing */
  health_note(&h, TG_OK, TG_LEAKY_BUCKET, 500);  /* another: unaffected */
  health_log(&h, 500, f, "redis:x", "open", 10);
  int reason;
  unsigned algs;
  assert_true(health_degraded(&h, &reason, &algs));
  assert_int_equal(reason, TG_ETIMEDOUT);
  assert_int_equal(algs, 1u << TG_TOKEN_BUCKET);
  health_note(&h, TG_OK, TG_TOKEN_BUCKET, 1010); /* a quiet second: healthy */
  health_log(&h, 1010, f, "redis:x", "open", 10);
  assert_false(health_degraded(&h, &reason, &algs));
  /* failing and answering by turns: degraded for as long as it goes on */
  for (uint64_t t = 1100; t < 5000; t += 100) {
    health_note(&h, TG_EBUSY, TG_SLIDING_WINDOW, t);
    health_note(&h, TG_OK, TG_SLIDING_WINDOW, t + 50);
    health_log(&h, t + 50, f, "shm:/x.<algorithm>", "closed", 10);
  }
  /* changes no line could report: folded into the next */
  health_note(&h, TG_ECONNECT, TG_TOKEN_BUCKET, 5000);
  health_note(&h, TG_OK, TG_TOKEN_BUCKET, 6100);
  health_note(&h, TG_ECONNECT, TG_TOKEN_BUCKET, 6200);
  health_log(&h, 6200, f, "redis:x", "open", 10);
  health_note(&h, TG_EFULL, TG_FIXED_WINDOW, 6300);
  health_note(&h, TG_EFULL, TG_FIXED_WINDOW, 6300);
  health_log(&h, 6300, f, "redis:x", "open", 10);
  health_note(&h, TG_EFULL, TG_FIXED_WINDOW, 6400);
  health_log(&h, 6400, f, "redis:x", "open", 10); /* a minute apart */
  fclose(f);
  const char *want =
      "tollgate serve: store redis:x degraded: TG_ETIMEDOUT (the store did "
      "not answer in time) on token_bucket; requests that need it are "
      "answered by --on-failure open\n"
      "tollgate serve: store redis:x healthy again on token_bucket after 100 "
      "failed request(s)\n"
      "tollgate serve: store shm:/x.<algorithm> degraded: TG_EBUSY (a lock "
      "is held by another caller) on sliding_window; requests that need it "
      "are answered by --on-failure closed\n"
      "tollgate serve: store redis:x degraded: TG_ECONNECT (cannot reach the "
      "store: connection refused or lost) on token_bucket; requests that "
      "need it are answered by --on-failure open (2 more changes since the "
      "last line)\n"
      "tollgate serve: warning: the fixed_window table is full (10 keys): "
      "2 request(s) for new keys answered by --on-failure open; raise "
      "--capacity, or bound what clients may create (--max-period-ms, "
      "--max-new-keys-per-client)\n";
  assert_string_equal(buf, want);

  /* degraded from the start: the start-up message said it already, and
   * failures then add nothing; the first answer is news */
  health_init(&h, TG_ECONNECT, 0);
  assert_true(health_degraded(&h, &reason, &algs));
  assert_int_equal(reason, TG_ECONNECT);
  assert_int_equal(algs, 0);
  health_note(&h, TG_ECONNECT, TG_FIXED_WINDOW, 100);
  buf[0] = '\0';
  f = fmemopen(buf, sizeof buf, "w");
  health_log(&h, 5000, f, "redis:x", "open", 10);
  health_note(&h, TG_OK, TG_FIXED_WINDOW, 6000);
  health_log(&h, 6000, f, "redis:x", "open", 10);
  fclose(f);
  assert_string_equal(buf, "tollgate serve: store redis:x answers now\n"
                           "tollgate serve: store redis:x healthy again on "
                           "fixed_window after 1 failed request(s)\n");
}

static void command_describes_the_commands(void **state) {
  (void)state;
  const char *r = RUN(AT(0), "COMMAND COUNT");
  long n = strtol(r + 1, NULL, 10);
  assert_true(n >= 16);
  char head[16];
  snprintf(head, sizeof head, "*%ld\r\n*10\r\n", n);
  assert_starts(RUN(AT(0), "COMMAND"), head);
  r = RUN(AT(0), "COMMAND INFO tg.hit nope");
  assert_starts(r, "*2\r\n*10\r\n$6\r\ntg.hit\r\n:-5\r\n*2\r\n+write\r\n"
                   "+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n");
  assert_string_equal(r + strlen(r) - 5, "$-1\r\n");
  assert_string_equal(RUN(AT(0), "COMMAND DOCS"), "*0\r\n");
}

static void info_reports_counters(void **state) {
  (void)state;
  cmd_ctx c;
  make_ctx(&c, 1024, TG_POLICY_FAIL_OPEN);
  run_on(&c, AT(0), "TG.HIT a sliding_window 1 60000");
  run_on(&c, AT(0), "TG.HIT a sliding_window 1 60000");
  run_on(&c, AT(0), "TG.HIT b token_bucket 1 60000");
  run_on(&c, AT(0), "TG.HIT a nope 1 60000");
  c.stats.clients = 3;
  const char *r = run_on(&c, AT(5000), "INFO");
  assert_starts(r, "$");
  static const char *const want[] = {"# Server\r\n",
                                     "store:memory\r\n",
                                     "tcp_port:6380\r\n",
                                     "uptime_in_seconds:5\r\n",
                                     "connected_clients:3\r\n",
                                     "maxclients:10\r\n",
                                     "store_bytes:",
                                     "total_commands_processed:4\r\n",
                                     "total_error_replies:1\r\n",
                                     "decisions_allowed:2\r\n",
                                     "decisions_denied:1\r\n",
                                     "decisions_degraded:0\r\n",
                                     "keys:2\r\n",
                                     "keys_sliding_window:1\r\n",
                                     "keys_token_bucket:1\r\n",
                                     "keys_fixed_window:0\r\n"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(r, want[i]))
      fail_msg("INFO lacks '%s':\n%s", want[i], r);
  /* the bulk's length is right */
  char *end;
  long len = strtol(r + 1, &end, 10);
  assert_int_equal((size_t)len, strlen(end + 2) - 2);
  /* sections */
  r = run_on(&c, AT(5000), "INFO stats");
  assert_non_null(strstr(r, "# Stats\r\n"));
  assert_null(strstr(r, "# Server"));
  assert_string_equal(run_on(&c, AT(5000), "INFO nosuch"), "$0\r\n\r\n");
  assert_string_equal(run_on(&c, AT(5000), "DBSIZE"), ":2\r\n");
  free_ctx(&c);
}

static void error_replies_stay_one_line(void **state) {
  (void)state;
  /* a command name carrying CR LF must not split the reply in two */
  resp_arg argv[] = {{"A\r\n+OK", 6}};
  const char *r = run_argv(&ctx, AT(0), argv, 1);
  assert_string_equal(r, "-ERR unknown command 'A  +OK'\r\n");
  /* long client bytes are cut */
  char name[300];
  memset(name, 'x', sizeof name);
  argv[0] = (resp_arg){name, sizeof name};
  r = run_argv(&ctx, AT(0), argv, 1);
  assert_true(strlen(r) < 200);
  assert_non_null(strstr(r, "...'\r\n"));
}

static void integers_saturate(void **state) {
  (void)state;
  outbuf o = {0};
  out_uint(&o, UINT64_MAX);
  out_int(&o, INT64_MIN);
  out_int(&o, -1);
  out_uint(&o, 0);
  out_array(&o, 3);
  out_null(&o);
  out_raw(&o, "", 1);
  assert_string_equal(o.data, ":9223372036854775807\r\n:-9223372036854775808"
                              "\r\n:-1\r\n:0\r\n*3\r\n$-1\r\n");
  out_free(&o);
}

/* TG.POLICY (src/command's parser, tg_hit_rules): 5 per second and 6 per
 * minute over 20 requests 100 ms apart admit 6 and charge the minute 6;
 * the reply is TG.HIT's six and the denying rule's index. */
static void policy_decides_all_rules(void **state) {
  (void)state;
  int64_t v[7];
  int64_t admitted = 0;
  for (unsigned i = 0; i < 20; i++) {
    const char *r = RUN(AT(60000 + 100 * i), "TG.POLICY s:u fixed_window 5 "
                                             "1000 m:u fixed_window 6 60000");
    assert_int_equal(ints(r, v, 7), 7);
    admitted += v[0];
    assert_int_equal(v[6], v[0] ? -1 : i < 10 ? 0 : 1);
  }
  assert_int_equal(admitted, 6);
  assert_string_equal(RUN(AT(61900), "TG.GET m:u fixed_window 6 60000"),
                      ":6\r\n");
  /* options after any rule; "burst" and "cost" may be keys */
  const char *r = RUN(AT(0), "TG.POLICY burst token_bucket 10 1000 BURST 20 "
                             "COST 3 cost sliding_window 10 1000 cost 2");
  assert_int_equal(ints(r, v, 7), 7);
  assert_int_equal(v[0], 1);
  assert_int_equal(v[2], 8); /* the log's 10 - 2; the bucket has 17 */
  assert_int_equal(v[6], -1);
  assert_non_null(strstr(RUN(AT(0), "TG.POLICY a fixed_window 1"),
                         "wrong number of arguments"));
  assert_non_null(strstr(RUN(AT(0), "TG.POLICY a fixed_window 1 1000 b"),
                         "wrong number of arguments"));
  assert_non_null(
      strstr(RUN(AT(0), "TG.POLICY a nope 1 1000"), "unknown algorithm"));
  assert_non_null(strstr(RUN(AT(0), "TG.POLICY a fixed_window 1 1000 "
                                    "a fixed_window 2 1000"),
                         "TG_EINVAL"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hit_answers_every_field),
      cmocka_unit_test(policy_decides_all_rules),
      cmocka_unit_test(hit_options_in_any_order_and_case),
      cmocka_unit_test(algorithm_names_and_near_misses),
      cmocka_unit_test(never_is_minus_one),
      cmocka_unit_test(fixed_window_counts_denied_calls),
      cmocka_unit_test(arguments_are_checked),
      cmocka_unit_test(keys_are_bytes),
      cmocka_unit_test(inc_get_set_expiresat_reset),
      cmocka_unit_test(algorithms_keep_separate_state),
      cmocka_unit_test(a_full_store_answers_by_the_policy),
      cmocka_unit_test(connection_commands),
      cmocka_unit_test(hello_speaks_resp2_only),
      cmocka_unit_test(a_password_guards_everything_but_auth),
      cmocka_unit_test(max_period_refuses_longer_periods),
      cmocka_unit_test(each_client_has_a_budget_of_new_keys),
      cmocka_unit_test(refused_input_spends_no_new_key),
      cmocka_unit_test(http_on_the_resp_port_closes),
      cmocka_unit_test(a_stuck_lock_is_waited_for_once_per_backoff),
      cmocka_unit_test(health_is_logged_once_per_change),
      cmocka_unit_test(command_describes_the_commands),
      cmocka_unit_test(info_reports_counters),
      cmocka_unit_test(error_replies_stay_one_line),
      cmocka_unit_test(integers_saturate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
