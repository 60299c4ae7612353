/* SPDX-License-Identifier: MIT */
/*
 * http.c - the HTTP response fields a limited response carries
 * (tg_http_headers): Retry-After, the IETF draft's RateLimit-Policy and
 * RateLimit (draft-ietf-httpapi-ratelimit-headers-11), and the older
 * RateLimit-Limit / -Remaining / -Reset trio.
 *
 * Pure formatting into the caller's buffer: no allocation, no clock. The
 * writer keeps counting past the end of the buffer, so a short buffer
 * yields the exact size needed.
 */
#include "tollgate.h"

#include <string.h>

#define NAME_MAX_BYTES 64u
#define PK_MAX_BYTES 256u

typedef struct writer {
  char *buf;
  size_t cap; /* bytes usable for text (the NUL excluded) */
  size_t len; /* bytes written, or that would have been */
} writer;

static void put_bytes(writer *w, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++, w->len++)
    if (w->len < w->cap)
      w->buf[w->len] = p[i];
}

static void put(writer *w, const char *s) { put_bytes(w, s, strlen(s)); }

static void put_u64(writer *w, uint64_t v) {
  char tmp[20];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0)
    put_bytes(w, &tmp[--n], 1);
}

/* A Structured Field Integer (RFC 9651): at most 15 digits, so a larger
 * value (a limit of 10^18, a remaining count near 2^64) is written as the
 * largest one, 999999999999999, rather than as a field a parser rejects
 * whole. */
#define SF_INT_MAX UINT64_C(999999999999999)

static void put_sf_int(writer *w, uint64_t v) {
  put_u64(w, v > SF_INT_MAX ? SF_INT_MAX : v);
}

/* A Structured Field String: quoted, with \ before " and \. */
static void put_sf_string(writer *w, const char *s) {
  put(w, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      put(w, "\\");
    put_bytes(w, s, 1);
  }
  put(w, "\"");
}

/* A Structured Field Byte Sequence: base64 (with padding) between colons. */
static void put_sf_bytes(writer *w, const unsigned char *p, size_t n) {
  static const char B64[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  put(w, ":");
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n)
      v |= p[i + 2];
    put_bytes(w, &B64[v >> 18 & 63], 1);
    put_bytes(w, &B64[v >> 12 & 63], 1);
    put_bytes(w, i + 1 < n ? &B64[v >> 6 & 63] : "=", 1);
    put_bytes(w, i + 2 < n ? &B64[v & 63] : "=", 1);
  }
  put(w, ":");
}

static uint64_t secs_up(uint64_t ms) { return ms / 1000 + (ms % 1000 != 0); }

/* The draft's window w: the period in whole seconds, rounded up, at least
 * one (it must be non-zero). */
static uint64_t window_s(const tg_quota *q) {
  uint64_t s = secs_up(q->period_ms);
  return s ? s : 1;
}

/* The effective window t of one limit: until the key is fresh; for a
 * denial, until the call would pass (which the draft's section 6 asks of a
 * Retry-After beside it: never before t ends), units left or not (a cost
 * above them). */
static uint64_t effective_s(const tg_result *r) {
  if (!r->allowed && r->retry_after_ms != TG_NEVER)
    return secs_up(r->retry_after_ms);
  return secs_up(r->reset_after_ms);
}

static bool name_ok(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e ||
        n >= NAME_MAX_BYTES)
      return false;
  return n > 0;
}

static void put_pk(writer *w, const tg_http_limit *l) {
  if (l->pk) {
    put(w, ";pk=");
    put_sf_bytes(w, l->pk, l->pk_len);
  }
}

int tg_http_headers(char *buf, size_t cap, size_t *len,
                    const tg_http_limit *limits, size_t n, unsigned flags) {
  if ((!buf && cap > 0) || !len || !limits || n == 0 || n > TG_RULES_MAX ||
      (flags & (TG_HTTP_IETF | TG_HTTP_LEGACY | TG_HTTP_RETRY_AFTER)) == 0 ||
      (flags & ~(TG_HTTP_IETF | TG_HTTP_LEGACY | TG_HTTP_RETRY_AFTER)))
    return TG_EINVAL;
  size_t tight = 0;
  bool denied = false, never = false;
  uint64_t retry = 0;
  for (size_t i = 0; i < n; i++) {
    const tg_http_limit *l = &limits[i];
    if (!l->name || !l->q || !l->r || !name_ok(l->name) ||
        (l->pk && l->pk_len > PK_MAX_BYTES) || (!l->pk && l->pk_len))
      return TG_EINVAL;
    const tg_result *r = l->r, *t = limits[tight].r;
    if (r->remaining < t->remaining ||
        (r->remaining == t->remaining && effective_s(r) > effective_s(t)))
      tight = i;
    if (!r->allowed) {
      denied = true;
      never = never || r->retry_after_ms == TG_NEVER;
      if (r->retry_after_ms > retry)
        retry = r->retry_after_ms;
    }
  }
  /* cap 0 (buf may then be NULL) asks for the size only */
  writer w = {buf, cap > 0 ? cap - 1 : 0, 0};
  /* no Retry-After when a limit never passes: no wait would help */
  if ((flags & TG_HTTP_RETRY_AFTER) && denied && !never && retry > 0) {
    put(&w, "Retry-After: ");
    put_u64(&w, secs_up(retry));
    put(&w, "\r\n");
  }
  if (flags & TG_HTTP_IETF) {
    put(&w, "RateLimit-Policy: ");
    for (size_t i = 0; i < n; i++) {
      const tg_http_limit *l = &limits[i];
      if (i > 0)
        put(&w, ", ");
      put_sf_string(&w, l->name);
      put(&w, ";q=");
      put_sf_int(&w, l->q->limit);
      put(&w, ";w=");
      put_sf_int(&w, window_s(l->q));
      put_pk(&w, l);
    }
    put(&w, "\r\nRateLimit: ");
    for (size_t i = 0; i < n; i++) {
      const tg_http_limit *l = &limits[i];
      if (i > 0)
        put(&w, ", ");
      put_sf_string(&w, l->name);
      put(&w, ";r=");
      put_sf_int(&w, l->r->remaining);
      put(&w, ";t=");
      put_sf_int(&w, effective_s(l->r));
      put_pk(&w, l);
    }
    put(&w, "\r\n");
  }
  if (flags & TG_HTTP_LEGACY) {
    const tg_http_limit *l = &limits[tight];
    put(&w, "RateLimit-Limit: ");
    put_sf_int(&w, l->q->limit);
    for (size_t i = 0; n > 1 && i < n; i++) {
      put(&w, ", ");
      put_sf_int(&w, limits[i].q->limit);
      put(&w, ";w=");
      put_sf_int(&w, window_s(limits[i].q));
    }
    put(&w, "\r\nRateLimit-Remaining: ");
    put_sf_int(&w, l->r->remaining);
    put(&w, "\r\nRateLimit-Reset: ");
    put_sf_int(&w, effective_s(l->r));
    put(&w, "\r\n");
  }
  *len = w.len;
  if (cap == 0 || w.len > w.cap)
    return TG_ERANGE;
  buf[w.len] = '\0';
  return TG_OK;
}
