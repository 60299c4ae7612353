/* SPDX-License-Identifier: MIT */
/*
 * command.c - the TG.* protocol (see command.h): one parser and one reply
 * shape for every server that speaks it.
 */
#include "command.h"

#include <string.h>

const tg__cmd_spec tg__cmd_specs[TG__CMD_COUNT_] = {
    [TG__CMD_HIT] = {"tg.hit", 9, -5, true},
    [TG__CMD_INC] = {"tg.inc", 7, -5, true},
    [TG__CMD_GET] = {"tg.get", 7, -5, false},
    [TG__CMD_SET] = {"tg.set", 8, -6, true},
    [TG__CMD_EXPIRESAT] = {"tg.expiresat", 7, -5, false},
    [TG__CMD_RESET] = {"tg.reset", 3, -2, true},
};

/* ASCII lower case, on bytes (a signed char's arithmetic is what narrows). */
static unsigned char lower(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? (unsigned char)(c | 0x20u) : c;
}

/* Case-insensitive comparison of len bytes with a lowercase word. */
static bool is_word(const char *p, size_t len, const char *word) {
  size_t n = strlen(word);
  if (len != n)
    return false;
  if (memcmp(p, word, n) == 0) /* most clients send the lowercase word */
    return true;
  for (size_t i = 0; i < n; i++)
    if (lower((unsigned char)p[i]) != (unsigned char)word[i])
      return false;
  return true;
}

/* A decimal integer 0..INT64_MAX, digits only. */
static bool parse_u63(const tg__cmd_arg *a, uint64_t *out) {
  if (a->len == 0 || a->len > 19)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < a->len; i++) {
    char c = a->ptr[i];
    if (c < '0' || c > '9')
      return false;
    v = v * 10u + (uint64_t)(c - '0');
  }
  if (v > (uint64_t)INT64_MAX)
    return false;
  *out = v;
  return true;
}

int tg__cmd_lookup(const char *name, size_t len) {
  for (int i = 0; i < TG__CMD_COUNT_; i++)
    if (is_word(name, len, tg__cmd_specs[i].name))
      return i;
  return -1;
}

int tg__cmd_parse_algorithm(const char *p, size_t len, tg_algorithm *alg) {
  /* the names differ in their first letter, or (the two fixed windows) in
   * length: the candidate is known before any comparison, and one
   * comparison with its name decides */
  int a = -1;
  switch (len ? lower((unsigned char)p[0]) : 0) {
  case 'f':
    a = len == 12 ? TG_FIXED_WINDOW : TG_FIXED_WINDOW_PER_KEY;
    break;
  case 's':
    a = TG_SLIDING_WINDOW;
    break;
  case 't':
    a = TG_TOKEN_BUCKET;
    break;
  case 'l':
    a = TG_LEAKY_BUCKET;
    break;
  default:
    break;
  }
  if (a < 0 || !is_word(p, len, tg_algorithm_name((tg_algorithm)a)))
    return -1;
  *alg = (tg_algorithm)a;
  return 0;
}

static int fail(tg__cmd_error *err, const char *msg) {
  *err = (tg__cmd_error){msg, NULL, 0, NULL};
  return -1;
}

static int fail_int(tg__cmd_error *err) {
  return fail(err, "value is not an integer or out of range");
}

static int fail_algorithm(tg__cmd_error *err, const tg__cmd_arg *a,
                          const char *after) {
  *err = (tg__cmd_error){"unknown algorithm '", a->ptr, a->len, after};
  return -1;
}

/* Options a command takes after its positional arguments. */
enum { OPT_BURST = 1, OPT_COST = 2 };

static const tg__op OPS[TG__CMD_COUNT_] = {
    [TG__CMD_HIT] = TG__OP_HIT,           [TG__CMD_INC] = TG__OP_INC,
    [TG__CMD_GET] = TG__OP_GET,           [TG__CMD_SET] = TG__OP_SET,
    [TG__CMD_EXPIRESAT] = TG__OP_EXPIRES, [TG__CMD_RESET] = TG__OP_GET,
};

static const unsigned OPTIONS[TG__CMD_COUNT_] = {
    [TG__CMD_HIT] = OPT_BURST | OPT_COST,
    [TG__CMD_INC] = OPT_COST,
    [TG__CMD_GET] = OPT_BURST,
    [TG__CMD_SET] = OPT_BURST,
    [TG__CMD_EXPIRESAT] = OPT_BURST,
    [TG__CMD_RESET] = 0,
};

int tg__cmd_parse(tg__cmd_id id, const tg__cmd_arg *argv, size_t argc,
                  tg__cmd *cmd, tg__cmd_error *err) {
  const tg__cmd_spec *spec = &tg__cmd_specs[id];
  if (argc < (size_t)-spec->arity || argc > spec->max_args) {
    *err = (tg__cmd_error){"wrong number of arguments for '", spec->name,
                           strlen(spec->name), "' command"};
    return -1;
  }
  *cmd = (tg__cmd){.id = id,
                   .op = OPS[id],
                   .key = argv[1].ptr,
                   .key_len = argv[1].len,
                   .arg = 1};
  if (id == TG__CMD_RESET) {
    cmd->all_algorithms = argc == 2;
    if (argc == 3 &&
        tg__cmd_parse_algorithm(argv[2].ptr, argv[2].len, &cmd->alg) != 0)
      return fail_algorithm(err, &argv[2], "'");
    return 0;
  }
  if (tg__cmd_parse_algorithm(argv[2].ptr, argv[2].len, &cmd->alg) != 0)
    return fail_algorithm(err, &argv[2],
                          "' (fixed_window, fixed_window_per_key, "
                          "sliding_window, token_bucket, leaky_bucket)");
  if (!parse_u63(&argv[3], &cmd->q.limit) ||
      !parse_u63(&argv[4], &cmd->q.period_ms))
    return fail_int(err);
  size_t i = 5;
  if (id == TG__CMD_SET) {
    if (!parse_u63(&argv[5], &cmd->arg))
      return fail_int(err);
    i = 6;
  }
  unsigned allowed = OPTIONS[id];
  for (; i < argc; i += 2) {
    uint64_t *dst;
    if ((allowed & OPT_BURST) && is_word(argv[i].ptr, argv[i].len, "burst"))
      dst = &cmd->q.burst;
    else if ((allowed & OPT_COST) && is_word(argv[i].ptr, argv[i].len, "cost"))
      dst = &cmd->arg;
    else
      return fail(err, "syntax error");
    if (i + 1 >= argc)
      return fail(err, "syntax error");
    if (!parse_u63(&argv[i + 1], dst))
      return fail_int(err);
  }
  return 0;
}

int tg__cmd_parse_policy(const tg__cmd_arg *argv, size_t argc, tg__cmd *rules,
                         size_t cap, size_t *n, tg__cmd_error *err) {
  static const char name[] = "tg.policy";
  *n = 0;
  size_t i = 1;
  if (argc < 5) {
    *err = (tg__cmd_error){"wrong number of arguments for '", name,
                           sizeof name - 1, "' command"};
    return -1;
  }
  while (i < argc) {
    if (*n == cap)
      return fail(err, "too many rules in one policy");
    if (argc - i < 4) {
      *err = (tg__cmd_error){"wrong number of arguments for '", name,
                             sizeof name - 1, "' command"};
      return -1;
    }
    tg__cmd *c = &rules[(*n)++];
    *c = (tg__cmd){.id = TG__CMD_HIT,
                   .op = TG__OP_HIT,
                   .key = argv[i].ptr,
                   .key_len = argv[i].len,
                   .arg = 1};
    if (tg__cmd_parse_algorithm(argv[i + 1].ptr, argv[i + 1].len, &c->alg) != 0)
      return fail_algorithm(err, &argv[i + 1],
                            "' (fixed_window, fixed_window_per_key, "
                            "sliding_window, token_bucket, leaky_bucket)");
    if (!parse_u63(&argv[i + 2], &c->q.limit) ||
        !parse_u63(&argv[i + 3], &c->q.period_ms))
      return fail_int(err);
    i += 4;
    /* options while the word is one followed by an integer */
    uint64_t v;
    while (i + 1 < argc && parse_u63(&argv[i + 1], &v) &&
           (is_word(argv[i].ptr, argv[i].len, "burst") ||
            is_word(argv[i].ptr, argv[i].len, "cost"))) {
      if (is_word(argv[i].ptr, argv[i].len, "burst"))
        c->q.burst = v;
      else
        c->arg = v;
      i += 2;
    }
  }
  return 0;
}

/* Appends n bytes of p to buf[*len..cap - 1), CR and LF as spaces. */
static void put(char *buf, size_t cap, size_t *len, const char *p, size_t n) {
  for (size_t i = 0; i < n && *len + 1 < cap; i++) {
    char c = p[i];
    if (c == '\r' || c == '\n')
      c = ' ';
    buf[(*len)++] = c;
  }
}

size_t tg__cmd_error_text(const tg__cmd_error *err, char *buf, size_t cap) {
  size_t len = 0;
  if (cap == 0)
    return 0;
  put(buf, cap, &len, "ERR ", 4);
  put(buf, cap, &len, err->before, strlen(err->before));
  if (err->quoted) {
    bool cut = err->quoted_len > 128;
    put(buf, cap, &len, err->quoted, cut ? 128 : err->quoted_len);
    if (cut)
      put(buf, cap, &len, "...", 3);
  }
  if (err->after)
    put(buf, cap, &len, err->after, strlen(err->after));
  buf[len] = '\0';
  return len;
}

int64_t tg__cmd_int(uint64_t v) {
  return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

void tg__cmd_hit_reply(const tg_result *r, int64_t out[6]) {
  out[0] = r->allowed ? 1 : 0;
  out[1] = tg__cmd_int(r->count);
  out[2] = tg__cmd_int(r->remaining);
  out[3] = r->retry_after_ms == TG_NEVER ? -1 : tg__cmd_int(r->retry_after_ms);
  out[4] = tg__cmd_int(r->reset_after_ms);
  out[5] = r->degraded ? 1 : 0;
}

void tg__cmd_policy_reply(const tg__outcome *checks, size_t n, bool passed,
                          int64_t out[7]) {
  tg_result r = {0};
  r.allowed = passed;
  r.remaining = UINT64_MAX;
  size_t denied_by = n, tightest = 0;
  for (size_t i = 0; i < n; i++) {
    /* a rule's answer: as consumed when the call passed, else its verdict
     * and wait with the key's numbers left as they were */
    tg_result x = checks[i].r;
    if (!passed) {
      x = checks[i].peek;
      x.allowed = checks[i].r.allowed;
      x.retry_after_ms = x.allowed ? 0 : checks[i].r.retry_after_ms;
    }
    if (!x.allowed) {
      if (denied_by == n)
        denied_by = i;
      if (x.retry_after_ms > r.retry_after_ms)
        r.retry_after_ms = x.retry_after_ms;
    }
    if (x.remaining < r.remaining) {
      r.remaining = x.remaining;
      tightest = i;
      r.count = x.count;
    }
    if (x.reset_after_ms > r.reset_after_ms)
      r.reset_after_ms = x.reset_after_ms;
  }
  (void)tightest;
  tg__cmd_hit_reply(&r, out);
  out[6] = denied_by < n ? (int64_t)denied_by : -1;
}
