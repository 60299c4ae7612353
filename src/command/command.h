/* SPDX-License-Identifier: MIT */
/*
 * command.h - the TG.* commands as a protocol, apart from any transport:
 * their table (names, arities, flags), the parsing of their arguments, and
 * the values of their replies. `tollgate serve` (tools/commands.c) and the
 * Redis module (redis-module/module.c) both use it, so a client gets the
 * same answers, the same refusals and the same error texts from either.
 *
 *   TG.HIT key algorithm limit period_ms [BURST n] [COST n]
 *       -> allowed, count, remaining, retry_after_ms (-1: never),
 *          reset_after_ms, degraded
 *   TG.INC key algorithm limit period_ms [COST n]            -> count
 *   TG.GET key algorithm limit period_ms [BURST n]           -> value
 *   TG.SET key algorithm limit period_ms value [BURST n]     -> OK
 *   TG.EXPIRESAT key algorithm limit period_ms [BURST n]     -> ms or 0
 *   TG.RESET key [algorithm]                                 -> OK
 *   TG.POLICY key algorithm limit period_ms [BURST n] [COST n] key ...
 *       -> TG.HIT's six, then the denying rule's index (-1: none)
 *
 * Integers in requests are decimal, 0..2^63-1 (RESP integers are signed);
 * replies saturate at 2^63-1. A malformed request is an "ERR ..." error; a
 * well-formed one the library refuses is the code's name and message, e.g.
 * "TG_EQUOTA invalid quota (limit 0, period 0 or out of range)".
 *
 * Pure: no I/O, no allocation, no clock.
 */
#ifndef TG_COMMAND_H
#define TG_COMMAND_H

#include "../core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One argument: bytes as the client sent them. */
typedef struct tg__cmd_arg {
  const char *ptr;
  size_t len;
} tg__cmd_arg;

typedef enum tg__cmd_id {
  TG__CMD_HIT = 0,
  TG__CMD_INC,
  TG__CMD_GET,
  TG__CMD_SET,
  TG__CMD_EXPIRESAT,
  TG__CMD_RESET,
  TG__CMD_COUNT_
} tg__cmd_id;

/* A command's entry in COMMAND's table. */
typedef struct tg__cmd_spec {
  const char *name; /* lowercase, e.g. "tg.hit" */
  size_t max_args;  /* most arguments accepted, the name included */
  int arity;        /* Redis's convention: N exactly, -N at least N, the
                       name included */
  bool write;       /* "write" (may change state), else "readonly" */
} tg__cmd_spec;

/* Indexed by tg__cmd_id. Every command has its key at argument 1. */
extern const tg__cmd_spec tg__cmd_specs[TG__CMD_COUNT_];

/* A parsed request. */
typedef struct tg__cmd {
  tg__cmd_id id;
  tg__op op;           /* the library operation (not for TG.RESET) */
  tg_algorithm alg;    /* for TG.RESET, valid only when !all_algorithms */
  bool all_algorithms; /* TG.RESET without an algorithm */
  const char *key;     /* into the request's bytes */
  size_t key_len;
  tg_quota q;
  uint64_t arg; /* COST (default 1) for hit and inc; the value for set */
} tg__cmd;

/* Why a request was refused before it reached the library: the reply is
 * "ERR " before, then the quoted client bytes (cut to 128 bytes, then
 * "..."), then after. */
typedef struct tg__cmd_error {
  const char *before;
  const char *quoted; /* NULL: nothing quoted */
  size_t quoted_len;
  const char *after; /* NULL: nothing */
} tg__cmd_error;

/* The command an argv[0] names, in any case; -1 if none. */
int tg__cmd_lookup(const char *name, size_t len);

/* Parses an algorithm name as tg_algorithm_name spells it, in any case.
 * Returns 0 and sets *alg, or -1. */
int tg__cmd_parse_algorithm(const char *p, size_t len, tg_algorithm *alg);

/* Parses argv[0..argc) (argv[0] is the command's name) as command id.
 * Returns 0 and fills *cmd, or -1 and fills *err (arity first, then the
 * algorithm, the numbers, the options, in the order they appear). */
int tg__cmd_parse(tg__cmd_id id, const tg__cmd_arg *argv, size_t argc,
                  tg__cmd *cmd, tg__cmd_error *err);

/* TG.POLICY key algorithm limit period_ms [BURST n] [COST n] key ...: one
 * decision on several rules (tg_hit_rules), each parsed as TG.HIT's
 * arguments into rules[0..*n) (at most cap, TG_RULES_MAX by the library's
 * bound). A rule ends where the next word is not BURST or COST followed by
 * an integer (an algorithm name is never an integer, so a key named
 * "burst" or "cost" is still a key). Reply: TG.HIT's six integers for the
 * whole policy, then the index of the first rule that denied, or -1.
 * Returns 0 or -1 with *err filled. */
int tg__cmd_parse_policy(const tg__cmd_arg *argv, size_t argc, tg__cmd *rules,
                         size_t cap, size_t *n, tg__cmd_error *err);

/* TG.POLICY's seven reply integers from each rule's CHECK outcome (r as
 * if consumed, peek as left), for a policy that passed (every rule
 * consumed) or not: the answer tg_hit_rules gives, for the module, which
 * decides on the core alone. */
void tg__cmd_policy_reply(const tg__outcome *checks, size_t n, bool passed,
                          int64_t out[7]);

/* Writes the error's reply text ("ERR ...", no CR or LF: they become
 * spaces) into buf, at most cap - 1 bytes and a NUL; returns the length. */
size_t tg__cmd_error_text(const tg__cmd_error *err, char *buf, size_t cap);

/* A u64 as a RESP integer: saturated at INT64_MAX. */
int64_t tg__cmd_int(uint64_t v);

/* TG.HIT's six reply integers for result r. */
void tg__cmd_hit_reply(const tg_result *r, int64_t out[6]);

#endif /* TG_COMMAND_H */
