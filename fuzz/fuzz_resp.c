/* SPDX-License-Identifier: MIT */
/*
 * fuzz_resp.c - libFuzzer target: what `tollgate serve` does with the bytes
 * a client sends, minus the socket. The input is the byte stream of one
 * connection: it is cut into requests with resp_parse, exactly as the
 * server does, and every whole request runs through cmd_execute twice:
 * against five small memory limiters (64 keys each, so full tables are
 * reached too), and against a second five behind every operator control
 * (a password, which the connection starts without; --max-period-ms;
 * a budget of new keys per client), so that AUTH and the refusals are
 * fuzzed as well.
 *
 * Oracles, besides the sanitizers:
 *   - the parser: a status from the enum; an OK request uses between 1 and
 *     the remaining bytes, has at most RESP_MAX_ARGS arguments each inside
 *     the request and at most RESP_MAX_BULK long; a refused one names an
 *     error; and every prefix of what it decided on (tried at a few cut
 *     points) is either "incomplete" or the same decision, so a request
 *     that arrives in pieces is parsed the same as one that arrives whole;
 *   - the commands: each request appends exactly one well-formed RESP2
 *     reply (a validator below walks it), never zero, never two, and an
 *     error reply never spans two lines.
 * A failed oracle aborts.
 *
 * The limiters live for the whole fuzzing process (creating five per input
 * would be most of the cost), so the state one input leaves is the next
 * one's start; the replay driver (replay.c) runs each input in a fresh
 * child, where every input starts from empty limiters.
 *
 * Build: -DTG_FUZZ=ON with clang (fuzz/CMakeLists.txt); seeds come from
 * fuzz/make_resp_seeds.py.
 */
#include "commands.h"
#include "resp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define T0_US UINT64_C(1735689600000000) /* 2025-01-01 */
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_resp: check failed: %s (line %d)\n", #cond,        \
              __LINE__);                                                       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static cmd_ctx plain, guarded;
static outbuf out;

static void make_ctx(cmd_ctx *ctx) {
  ctx->policy = TG_POLICY_FAIL_OPEN;
  ctx->store = "memory";
  ctx->tcp_port = 6380;
  ctx->max_clients = 1;
  ctx->capacity = 64;
  ctx->start_us = T0_US;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = (tg_algorithm)a;
    cfg.capacity = 64;
    cfg.sliding_max_entries = 16;
    cfg.clean_period_ms = 0;
    CHECK(tg_limiter_new(&ctx->lim[a], &cfg) == TG_OK);
  }
}

static void init(void) {
  static int done;
  if (done)
    return;
  done = 1;
  make_ctx(&plain);
  make_ctx(&guarded);
  CHECK(cmd_set_pass(&guarded, "pw", 2) == 0);
  guarded.max_period_ms = 100000;
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  cfg.capacity = 4;
  cfg.clean_period_ms = 0;
  cfg.on_failure = TG_POLICY_FAIL_CLOSED;
  CHECK(tg_limiter_new(&guarded.new_keys, &cfg) == TG_OK);
  guarded.new_keys_q = (tg_quota){.limit = 5, .period_ms = 1000};
}

/* Reads a decimal integer (optional '-') ending in CRLF at p[*i..n). */
static int read_int(const char *p, size_t n, size_t *i, long long *v) {
  size_t j = *i;
  int neg = 0;
  if (j < n && p[j] == '-') {
    neg = 1;
    j++;
  }
  size_t start = j;
  long long x = 0;
  while (j < n && p[j] >= '0' && p[j] <= '9' && j - start < 19)
    x = x * 10 + (p[j++] - '0');
  if (j == start || j + 1 >= n || p[j] != '\r' || p[j + 1] != '\n')
    return -1;
  *v = neg ? -x : x;
  *i = j + 2;
  return 0;
}

/* Walks one RESP2 value at p[*i..n); returns 0 and advances *i past it, or
 * -1 if it is not one. */
static int valid_reply(const char *p, size_t n, size_t *i, int depth) {
  if (*i >= n || depth > 8)
    return -1;
  char type = p[(*i)++];
  long long v;
  switch (type) {
  case '+':
  case '-':
    while (*i + 1 < n && p[*i] != '\r' && p[*i] != '\n')
      (*i)++;
    if (*i + 1 >= n || p[*i] != '\r' || p[*i + 1] != '\n')
      return -1;
    *i += 2;
    return 0;
  case ':':
    return read_int(p, n, i, &v);
  case '$':
    if (read_int(p, n, i, &v) != 0 || v < -1)
      return -1;
    if (v == -1)
      return 0;
    if ((size_t)v + 2 > n - *i || p[*i + (size_t)v] != '\r' ||
        p[*i + (size_t)v + 1] != '\n')
      return -1;
    *i += (size_t)v + 2;
    return 0;
  case '*':
    if (read_int(p, n, i, &v) != 0 || v < 0)
      return -1;
    for (long long k = 0; k < v; k++)
      if (valid_reply(p, n, i, depth + 1) != 0)
        return -1;
    return 0;
  default:
    return -1;
  }
}

/* Runs one request on ctx for session se; checks its one reply. Returns
 * what the connection does next. */
static cmd_after run(cmd_ctx *ctx, cmd_session *se, const resp_request *req,
                     uint64_t now) {
  out.len = 0;
  cmd_after after = cmd_execute(ctx, se, req->argv, req->argc, now, &out);
  CHECK(!out.failed);
  size_t at = 0;
  CHECK(valid_reply(out.data, out.len, &at, 0) == 0);
  CHECK(at == out.len); /* exactly one reply */
  return after;
}

/* A prefix of buf[0..len) must be incomplete or decided as the whole was. */
static void check_prefix(const char *buf, size_t n, resp_status whole) {
  resp_request r;
  resp_status st = resp_parse(buf, n, &r);
  CHECK(st == RESP_INCOMPLETE || st == whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init();
  cmd_session open_sess = {.id = 1, .authenticated = true};
  cmd_session guarded_sess = {
      .id = 2, .who = {'4', 127, 0, 0, 1}, .who_len = 5};
  const char *buf = (const char *)data;
  static resp_request req;
  size_t pos = 0;
  uint64_t now = T0_US;
  for (int n = 0; pos < size; n++) {
    size_t left = size - pos;
    resp_status st = resp_parse(buf + pos, left, &req);
    CHECK(st == RESP_OK || st == RESP_INCOMPLETE || st == RESP_PROTOCOL ||
          st == RESP_TOO_BIG);
    if (st == RESP_INCOMPLETE)
      break;
    if (st != RESP_OK) {
      CHECK(req.error != NULL && req.argc == 0);
      /* the decision is made from bytes already there: a prefix long
       * enough gives it too, a shorter one waits */
      check_prefix(buf + pos, left / 2, st);
      check_prefix(buf + pos, left - 1, st);
      break; /* the server closes the connection */
    }
    CHECK(req.used >= 1 && req.used <= left);
    CHECK(req.argc <= RESP_MAX_ARGS);
    for (size_t k = 0; k < req.argc; k++) {
      CHECK(req.argv[k].len <= RESP_MAX_BULK);
      CHECK(req.argv[k].ptr >= buf + pos);
      CHECK(req.argv[k].ptr + req.argv[k].len <= buf + pos + req.used);
    }
    size_t cuts[] = {0, 1, req.used / 3, req.used / 2, req.used - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++)
      if (cuts[k] < req.used)
        check_prefix(buf + pos, cuts[k], RESP_INCOMPLETE);
    if (req.argc > 0) {
      cmd_after a1 = run(&plain, &open_sess, &req, now);
      cmd_after a2 = run(&guarded, &guarded_sess, &req, now);
      CHECK(a1 == a2); /* only QUIT closes, with or without a password */
      if (a1 == CMD_CLOSE)
        break;
    }
    pos += req.used;
    now += 7919; /* us: windows and buckets move between requests */
  }
  return 0;
}
