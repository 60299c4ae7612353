/* SPDX-License-Identifier: MIT */
/*
 * reply.c - RESP2 reply encoding into an outbuf (see reply.h).
 *
 * Integers are formatted by hand rather than with snprintf: a TG.HIT reply
 * holds six of them, and at a million decisions a second the formatting is a
 * visible share of the server's time.
 */
#include "reply.h"

#include <stdlib.h>
#include <string.h>

#define OUT_MIN_CAP 4096u

void out_free(outbuf *o) {
  free(o->data);
  *o = (outbuf){0};
}

bool out_reserve(outbuf *o, size_t n) {
  if (o->failed)
    return false;
  if (o->cap - o->len >= n)
    return true;
  size_t cap = o->cap ? o->cap : OUT_MIN_CAP;
  while (cap - o->len < n) {
    if (cap > SIZE_MAX / 2) {
      o->failed = true;
      return false;
    }
    cap *= 2;
  }
  char *d = realloc(o->data, cap);
  if (!d) {
    o->failed = true;
    return false;
  }
  o->data = d;
  o->cap = cap;
  return true;
}

void out_raw(outbuf *o, const void *p, size_t n) {
  if (!out_reserve(o, n))
    return;
  if (n)
    memcpy(o->data + o->len, p, n);
  o->len += n;
}

/* Writes the decimal digits of v at dst (at least 20 bytes); returns how
 * many. */
static size_t fmt_u64(char *dst, uint64_t v) {
  char tmp[20];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  for (size_t i = 0; i < n; i++)
    dst[i] = tmp[n - 1 - i];
  return n;
}

/* Appends <type><v>\r\n, e.g. ":42\r\n" or "*6\r\n". */
static void out_prefixed_u64(outbuf *o, char type, bool negative, uint64_t v) {
  if (!out_reserve(o, 24))
    return;
  char *p = o->data + o->len;
  size_t n = 0;
  p[n++] = type;
  if (negative)
    p[n++] = '-';
  n += fmt_u64(p + n, v);
  p[n++] = '\r';
  p[n++] = '\n';
  o->len += n;
}

void out_status(outbuf *o, const char *s) {
  size_t n = strlen(s);
  if (!out_reserve(o, n + 3))
    return;
  o->data[o->len++] = '+';
  memcpy(o->data + o->len, s, n);
  o->len += n;
  o->data[o->len++] = '\r';
  o->data[o->len++] = '\n';
}

/* Appends n bytes with CR and LF replaced by spaces. */
static void out_clean(outbuf *o, const char *p, size_t n) {
  if (!out_reserve(o, n))
    return;
  for (size_t i = 0; i < n; i++)
    o->data[o->len++] = (p[i] == '\r' || p[i] == '\n') ? ' ' : p[i];
}

void out_error_quoted(outbuf *o, const char *prefix, const char *before,
                      const char *quoted, size_t quoted_len,
                      const char *after) {
  out_raw(o, "-", 1);
  out_clean(o, prefix, strlen(prefix));
  out_raw(o, " ", 1);
  out_clean(o, before, strlen(before));
  if (quoted) {
    bool cut = quoted_len > 128;
    out_clean(o, quoted, cut ? 128 : quoted_len);
    if (cut)
      out_raw(o, "...", 3);
  }
  if (after)
    out_clean(o, after, strlen(after));
  out_raw(o, "\r\n", 2);
}

void out_error(outbuf *o, const char *prefix, const char *msg) {
  out_error_quoted(o, prefix, msg, NULL, 0, NULL);
}

void out_int(outbuf *o, int64_t v) {
  if (v < 0)
    out_prefixed_u64(o, ':', true, (uint64_t)(-(v + 1)) + 1u);
  else
    out_prefixed_u64(o, ':', false, (uint64_t)v);
}

void out_uint(outbuf *o, uint64_t v) {
  out_prefixed_u64(o, ':', false, v > INT64_MAX ? (uint64_t)INT64_MAX : v);
}

void out_bulk(outbuf *o, const void *p, size_t len) {
  out_prefixed_u64(o, '$', false, len);
  out_raw(o, p, len);
  out_raw(o, "\r\n", 2);
}

void out_bulk_str(outbuf *o, const char *s) { out_bulk(o, s, strlen(s)); }

void out_null(outbuf *o) { out_raw(o, "$-1\r\n", 5); }

void out_array(outbuf *o, size_t n) { out_prefixed_u64(o, '*', false, n); }
