/* SPDX-License-Identifier: MIT */
/*
 * redis_value.h - how a key's state is written as a Redis string value: the
 * encoding src/store/redis.lua writes and reads, parsed and written here in
 * C for the library (which parses what the script returns) and the Redis
 * module (which reads and writes the same values, so a server may switch
 * between the script and the module while limiters run).
 *
 *   windows  "0:END:COUNT" / "1:END:COUNT", END the window's end in us
 *   buckets  "3:US:NS" / "4:US:NS", the TAT US * 1000 + NS ns, NS 0..999
 *            in 1..3 digits
 *   sliding  "2" SUM, then per entry T COST, oldest first, every number 20
 *            digits zero-padded (fixed widths: an entry is found by offset)
 * Numbers are decimal u64 of 1..20 digits. Pure functions: no I/O, no
 * allocation.
 */
#ifndef TG_STORE_REDIS_VALUE_H
#define TG_STORE_REDIS_VALUE_H

#include "../core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest window or bucket value: "A:" 20 digits ":" 20 digits. */
#define TG__RV_STATE_MAX 43u
/* A log: a head of "2" and the sum, then entries of two numbers. */
#define TG__RV_LOG_HEAD 21u
#define TG__RV_LOG_ENTRY 40u

/* Parses a decimal u64 of 1..20 digits from [*p, end) up to a byte that is
 * not a digit; advances *p. False when there is no digit, more than 20, or
 * the value passes 2^64 - 1. */
bool tg__scan_u64(const char **p, const char *end, uint64_t *out);

/* Writes v in decimal, no padding, into out (20 bytes); returns the
 * length. What snprintf("%llu") would, at a fraction of its cost: every
 * call to Redis formats several. */
size_t tg__u64_dec(char *out, uint64_t v);

/* Parses a window or bucket value of algorithm alg. False when it is not
 * one (another algorithm's, malformed, out of 64 bits). It does not check
 * plausibility: see tg__state_plausible. */
bool tg__rv_parse_state(tg_algorithm alg, const char *s, size_t len,
                        tg__state *st);

/* Writes st as alg's value into out (TG__RV_STATE_MAX bytes); returns the
 * length. */
size_t tg__rv_format_state(tg_algorithm alg, const tg__state *st, char *out);

/* The number of entries of a log value from its length, after checking its
 * head byte: false when it is not a log. */
bool tg__rv_log_entries(const char *s, size_t len, size_t *n);

/* Parses a log value of n entries (from tg__rv_log_entries) into e[0..n)
 * and its stored sum into *sum. False when a field is not 20 digits of a
 * u64. */
bool tg__rv_parse_log(const char *s, size_t n, tg__entry *e, uint64_t *sum);

/* Writes log (its sum and entries, oldest first) into out, which holds
 * TG__RV_LOG_HEAD + TG__RV_LOG_ENTRY * log->n bytes; returns the length. */
size_t tg__rv_format_log(const tg__log *log, char *out);

#endif /* TG_STORE_REDIS_VALUE_H */
