/* SPDX-License-Identifier: MIT */
/*
 * reply.h - writing RESP2 replies into a growable byte buffer.
 *
 * The server writes every reply of a batch of pipelined requests into one
 * buffer and sends it with one write(2). Allocation failure does not abort:
 * it sets `failed`, later writes are dropped, and the server closes that
 * connection (a client must never get half a reply followed by the next).
 */
#ifndef TG_TOOLS_REPLY_H
#define TG_TOOLS_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct outbuf {
  char *data;  /* NULL until the first write */
  size_t len;  /* bytes written */
  size_t cap;  /* bytes allocated */
  bool failed; /* an allocation failed: the content is incomplete */
} outbuf;

/* Frees the buffer's memory and makes it empty again. */
void out_free(outbuf *o);
/* Makes room for n more bytes; false (and failed set) if it cannot. */
bool out_reserve(outbuf *o, size_t n);
/* Appends raw bytes (already RESP-encoded). */
void out_raw(outbuf *o, const void *p, size_t n);

/* "+s\r\n". s must not contain CR or LF. */
void out_status(outbuf *o, const char *s);
/* "-prefix message\r\n", e.g. out_error(o, "ERR", "syntax error"). CR and
 * LF in the message (which may quote client bytes) are written as spaces,
 * so a reply can never be split into two. */
void out_error(outbuf *o, const char *prefix, const char *msg);
/* Like out_error, with `quoted` (client bytes, cut to 128 bytes) between
 * before and after: "-ERR unknown command 'FOO'". */
void out_error_quoted(outbuf *o, const char *prefix, const char *before,
                      const char *quoted, size_t quoted_len, const char *after);
/* ":v\r\n" */
void out_int(outbuf *o, int64_t v);
/* ":v\r\n" for an unsigned value, saturated at INT64_MAX (RESP integers are
 * signed 64-bit). */
void out_uint(outbuf *o, uint64_t v);
/* "$len\r\nbytes\r\n" */
void out_bulk(outbuf *o, const void *p, size_t len);
/* out_bulk of a NUL-terminated string */
void out_bulk_str(outbuf *o, const char *s);
/* "$-1\r\n" */
void out_null(outbuf *o);
/* "*n\r\n": the n elements follow */
void out_array(outbuf *o, size_t n);

#endif
