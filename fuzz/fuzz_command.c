/* SPDX-License-Identifier: MIT */
/*
 * fuzz_command.c - libFuzzer target: the TG.* protocol parser
 * (src/command/command.c) that `tollgate serve` and the Redis module share,
 * and the Redis value decoder the module and the library share
 * (src/store/redis_value.c), on bytes no client would send.
 *
 * The input: its first byte picks the command, the rest is its arguments,
 * separated by NUL bytes (the command's name is argv[0]). The same bytes,
 * whole, are also decoded as a stored value of every algorithm.
 *
 * Oracles, besides the sanitizers:
 *   - a refused request has a one-line "ERR ..." text;
 *   - an accepted one has its key inside the input, every number within
 *     0..2^63-1, an arity within the command's, and parses again to the
 *     same request from its canonical form; the library's checks then
 *     answer only TG_EKEY, TG_ENOTSUP or TG_EQUOTA, and a call they pass
 *     runs through the core step with a sane result (TG.HIT's reply
 *     integers in range);
 *   - a value that decodes writes back to bytes that decode to the same
 *     state (so the module never rewrites a state into another one).
 * A failed oracle aborts.
 */
#include "command/command.h"
#include "store/redis_value.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_command: check failed: %s (line %d)\n", #cond,     \
              __LINE__);                                                       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define MAX_ARGS 16
#define T0_US UINT64_C(1735689600000000) /* 2025-01-01 */

static bool same_cmd(const tg__cmd *a, const tg__cmd *b) {
  return a->id == b->id && a->op == b->op && a->alg == b->alg &&
         a->all_algorithms == b->all_algorithms && a->key_len == b->key_len &&
         memcmp(a->key, b->key, a->key_len) == 0 && a->q.limit == b->q.limit &&
         a->q.period_ms == b->q.period_ms && a->q.burst == b->q.burst &&
         a->arg == b->arg;
}

/* The request written back in one canonical form, as argv in buf. */
static size_t canonical(const tg__cmd *c, tg__cmd_arg *av, char num[][24]) {
  size_t n = 0, k = 0;
  av[n++] = (tg__cmd_arg){tg__cmd_specs[c->id].name,
                          strlen(tg__cmd_specs[c->id].name)};
  av[n++] = (tg__cmd_arg){c->key, c->key_len};
  if (c->id == TG__CMD_RESET) {
    if (!c->all_algorithms) {
      const char *name = tg_algorithm_name(c->alg);
      av[n++] = (tg__cmd_arg){name, strlen(name)};
    }
    return n;
  }
  const char *name = tg_algorithm_name(c->alg);
  av[n++] = (tg__cmd_arg){name, strlen(name)};
  uint64_t nums[3] = {c->q.limit, c->q.period_ms, c->arg};
  for (int i = 0; i < (c->id == TG__CMD_SET ? 3 : 2); i++) {
    int len = snprintf(num[k], 24, "%llu", (unsigned long long)nums[i]);
    av[n++] = (tg__cmd_arg){num[k++], (size_t)len};
  }
  if (c->id == TG__CMD_HIT || c->id == TG__CMD_INC) {
    int len = snprintf(num[k], 24, "%llu", (unsigned long long)c->arg);
    av[n++] = (tg__cmd_arg){"cost", 4};
    av[n++] = (tg__cmd_arg){num[k++], (size_t)len};
  }
  if (c->id != TG__CMD_INC) {
    int len = snprintf(num[k], 24, "%llu", (unsigned long long)c->q.burst);
    av[n++] = (tg__cmd_arg){"BURST", 5};
    av[n++] = (tg__cmd_arg){num[k++], (size_t)len};
  }
  return n;
}

/* Runs a checked call through the core on a fresh key, then once more. */
static void step(const tg__cmd *cmd, const tg__quota *q) {
  tg__call c = {
      cmd->op,
      cmd->alg,
      cmd->key,
      cmd->key_len,
      *q,
      cmd->op == TG__OP_GET || cmd->op == TG__OP_EXPIRES ? 0 : cmd->arg,
      T0_US,
      false,
      0,
      NULL};
  tg__outcome o;
  bool changed;
  for (int round = 0; round < 2; round++, c.now_us += 1000) {
    int rc;
    if (cmd->alg == TG_SLIDING_WINDOW) {
      static tg__entry e[8];
      static tg__log lg;
      if (round == 0)
        lg = (tg__log){e, 0, 0, 8, 0};
      rc = tg__log_step(&c, &lg, &o, &changed);
      CHECK(tg__log_plausible(&lg));
    } else {
      static tg__state st;
      if (round == 0)
        st = (tg__state){0, 0};
      rc = tg__state_step(&c, &st, &o, &changed);
      CHECK(tg__state_plausible(cmd->alg, &st));
    }
    CHECK(rc == TG_OK || rc == TG_EOVERFLOW || rc == TG_ERANGE);
    if (rc == TG_OK && cmd->op == TG__OP_HIT) {
      int64_t v[6];
      tg__cmd_hit_reply(&o.r, v);
      CHECK(v[0] == 0 || v[0] == 1);
      CHECK(v[1] >= 0 && v[2] >= 0 && v[3] >= -1 && v[4] >= 0);
      CHECK(v[5] == 0);
      CHECK((v[0] == 1) == (v[3] == 0));
    }
  }
}

static void fuzz_parser(const uint8_t *data, size_t size) {
  if (size == 0)
    return;
  tg__cmd_id id = (tg__cmd_id)(data[0] % TG__CMD_COUNT_);
  const char *p = (const char *)data + 1, *end = (const char *)data + size;
  tg__cmd_arg av[MAX_ARGS];
  size_t argc = 0;
  av[argc++] =
      (tg__cmd_arg){tg__cmd_specs[id].name, strlen(tg__cmd_specs[id].name)};
  while (p <= end && argc < MAX_ARGS) {
    const char *z = memchr(p, 0, (size_t)(end - p));
    const char *e = z ? z : end;
    av[argc++] = (tg__cmd_arg){p, (size_t)(e - p)};
    p = e + 1;
  }
  tg__cmd cmd;
  tg__cmd_error err;
  /* the same words as a TG.POLICY: rules within the bound, each a TG.HIT */
  tg__cmd rules[TG_RULES_MAX];
  size_t nr = 0;
  int prc = tg__cmd_parse_policy(av, argc, rules, TG_RULES_MAX, &nr, &err);
  CHECK(prc == 0 || prc == -1);
  CHECK(prc != 0 || (nr >= 1 && nr <= TG_RULES_MAX));
  for (size_t i = 0; prc == 0 && i < nr; i++)
    CHECK(rules[i].id == TG__CMD_HIT && rules[i].op == TG__OP_HIT &&
          (unsigned)rules[i].alg < TG_ALGORITHM_COUNT &&
          rules[i].arg <= INT64_MAX && rules[i].q.burst <= INT64_MAX);
  int rc = tg__cmd_parse(id, av, argc, &cmd, &err);
  CHECK(rc == 0 || rc == -1);
  if (rc != 0) {
    char text[512];
    size_t n = tg__cmd_error_text(&err, text, sizeof text);
    CHECK(n >= 5 && n < sizeof text && memcmp(text, "ERR ", 4) == 0);
    CHECK(!memchr(text, '\r', n) && !memchr(text, '\n', n));
    return;
  }
  const tg__cmd_spec *s = &tg__cmd_specs[id];
  CHECK(argc >= (size_t)-s->arity && argc <= s->max_args);
  CHECK(cmd.id == id && cmd.key == av[1].ptr && cmd.key_len == av[1].len);
  CHECK((unsigned)cmd.alg < TG_ALGORITHM_COUNT);
  CHECK(cmd.q.limit <= INT64_MAX && cmd.q.period_ms <= INT64_MAX &&
        cmd.q.burst <= INT64_MAX && cmd.arg <= INT64_MAX);
  tg__cmd_arg cv[MAX_ARGS];
  char num[4][24];
  size_t cn = canonical(&cmd, cv, num);
  tg__cmd again;
  CHECK(tg__cmd_parse(id, cv, cn, &again, &err) == 0);
  CHECK(same_cmd(&cmd, &again));
  if (id == TG__CMD_RESET)
    return;
  tg__quota q;
  rc = tg__call_check(cmd.alg, cmd.op, cmd.key_len, &cmd.q, &q);
  CHECK(rc == TG_OK || rc == TG_EKEY || rc == TG_ENOTSUP || rc == TG_EQUOTA);
  if (rc == TG_OK)
    step(&cmd, &q);
}

static void fuzz_values(const uint8_t *data, size_t size) {
  const char *v = (const char *)data;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg__state st;
    if (a == TG_SLIDING_WINDOW ||
        !tg__rv_parse_state((tg_algorithm)a, v, size, &st))
      continue;
    char buf[TG__RV_STATE_MAX];
    size_t n = tg__rv_format_state((tg_algorithm)a, &st, buf);
    CHECK(n <= TG__RV_STATE_MAX);
    tg__state st2;
    CHECK(tg__rv_parse_state((tg_algorithm)a, buf, n, &st2));
    CHECK(tg__state_word(&st, 0) == tg__state_word(&st2, 0) &&
          tg__state_word(&st, 1) == tg__state_word(&st2, 1));
    (void)tg__state_plausible((tg_algorithm)a, &st);
  }
  size_t n;
  if (!tg__rv_log_entries(v, size, &n) || n > 64)
    return;
  tg__entry e[64], e2[64];
  uint64_t sum, sum2;
  if (!tg__rv_parse_log(v, n, e, &sum))
    return;
  tg__log lg = {e, 0, (uint32_t)n, 64, sum};
  char out[TG__RV_LOG_HEAD + 64 * TG__RV_LOG_ENTRY];
  size_t len = tg__rv_format_log(&lg, out);
  CHECK(len == size);
  CHECK(tg__rv_parse_log(out, n, e2, &sum2) && sum2 == sum);
  CHECK(memcmp(e, e2, n * sizeof e[0]) == 0);
  (void)tg__log_plausible(&lg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_parser(data, size);
  fuzz_values(data, size);
  return 0;
}
