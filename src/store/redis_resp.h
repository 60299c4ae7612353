/* SPDX-License-Identifier: MIT */
/*
 * redis_resp.h - RESP2, the Redis protocol, as pure functions: commands
 * written into a caller's buffer, and replies read incrementally from bytes
 * that arrive in any split, one value at a time, without allocating.
 *
 * This is what the sans-IO engine (redis_engine.c) speaks; the blocking
 * single-server store keeps hiredis. The reader is a pull parser: each call
 * consumes bytes and returns at most one value (a scalar, or an array's
 * header), with its depth and whether it completes the top-level reply, so
 * a consumer builds exactly what it needs (a decision's few fields, a slot
 * map) and nothing else. Its state is a fixed-size struct: a reply's size is
 * not bounded by memory, only by the limits below, and a value's string is
 * kept up to TG__RESP_STR_MAX bytes (the rest is counted, not stored),
 * unless the consumer gives it room for a longer one (a policy's sliding
 * log).
 *
 * Strict: a header line is a type byte, an integer of at most 19 digits
 * (with "-" only where RESP allows it) and CR LF; a bulk string is followed
 * by CR LF; anything else is a protocol error, after which the connection
 * cannot be trusted and must be closed.
 */
#ifndef TG_STORE_REDIS_RESP_H
#define TG_STORE_REDIS_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of a string value kept; longer ones are cut (truncated is set). */
#define TG__RESP_STR_MAX 512u
/* Deepest nesting accepted. The replies read here nest at most 6 deep
 * (COMMAND INFO's key specs); deeper is a protocol error. */
#define TG__RESP_DEPTH_MAX 16
/* Largest array, in elements, and largest bulk string, in bytes (Redis's
 * own default proto-max-bulk-len). */
#define TG__RESP_ARRAY_MAX (INT64_C(1) << 24)
#define TG__RESP_BULK_MAX (INT64_C(512) << 20)

typedef enum tg__resp_type {
  TG__RESP_STATUS = 1, /* +OK */
  TG__RESP_ERROR,      /* -ERR ... */
  TG__RESP_INTEGER,    /* :123 */
  TG__RESP_BULK,       /* $3 abc */
  TG__RESP_NIL,        /* $-1 or *-1 */
  TG__RESP_ARRAY       /* *N: its N elements follow as their own values */
} tg__resp_type;

/* One value as the reader returns it. */
typedef struct tg__resp_value {
  tg__resp_type type;
  int depth;       /* 0 for the top-level value, 1 for its elements... */
  int64_t n;       /* INTEGER: the value; ARRAY: elements; STATUS, ERROR,
                      BULK: the full length in bytes */
  const char *str; /* STATUS, ERROR, BULK: the first min(n, STR_MAX) bytes
                      (valid until the next call on the reader) */
  size_t len;      /* bytes at str */
  bool truncated;  /* n > len */
  bool last;       /* this value completes the top-level reply */
} tg__resp_value;

/* The reader's state: zero it (or tg__resp_reader_init) to start. */
typedef struct tg__resp_reader {
  int state;                        /* where in a value we are */
  int depth;                        /* arrays open */
  int64_t left[TG__RESP_DEPTH_MAX]; /* elements still due per array */
  char line[24];                    /* a header's integer, so far */
  size_t line_len;                  /* its bytes, sign included */
  tg__resp_type type;               /* of the value being read */
  int64_t bulk_left;                /* payload bytes still due */
  int64_t n;                        /* the value's length or count */
  char str[TG__RESP_STR_MAX];       /* the value's string, so far */
  size_t str_len;
  /* Optional, set by the consumer after init: where a bulk string longer than
   * TG__RESP_STR_MAX is kept whole. room(room_ctx, depth, n) is asked when
   * such a string's header is read (depth as the value's will be); it
   * returns n + 1 bytes that the consumer owns (the value's str then points
   * there, untruncated, and the reader writes a NUL after it), or NULL to
   * have the string cut as usual. The reader itself still allocates
   * nothing. */
  char *(*room)(void *room_ctx, int depth, int64_t n);
  void *room_ctx;
  char *big; /* room's answer for the string being read, else NULL */
} tg__resp_reader;

/* Starts a stream: every field zeroed (room too). */
void tg__resp_reader_init(tg__resp_reader *rd);

/* Reads from buf[0..len) until one value is complete or the bytes run out.
 * Sets *used to the bytes consumed. Returns 1 with *v filled (more values
 * may follow in the rest of buf), 0 when every byte was consumed without
 * completing a value (feed more later), or -1 on a protocol error (the
 * reader is then useless: the connection must be dropped). */
int tg__resp_read(tg__resp_reader *rd, const char *buf, size_t len,
                  size_t *used, tg__resp_value *v);

/* Bytes a command of argc arguments takes on the wire (*N, then $len and
 * the bytes of each argument). */
size_t tg__resp_command_size(int argc, const char *const *argv,
                             const size_t *len);

/* Writes that command into out (tg__resp_command_size bytes); returns the
 * bytes written. */
size_t tg__resp_command(char *out, int argc, const char *const *argv,
                        const size_t *len);

#endif /* TG_STORE_REDIS_RESP_H */
