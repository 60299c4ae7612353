/* SPDX-License-Identifier: MIT */
/*
 * redis_value.c - the Redis value encoding (see redis_value.h).
 */
#include "redis_value.h"

#include <string.h>

bool tg__scan_u64(const char **p, const char *end, uint64_t *out) {
  const char *q = *p;
  /* up to 19 digits cannot pass 2^64 - 1: no overflow check for them */
  const char *fast = end - q > 19 ? q + 19 : end;
  uint64_t v = 0;
  while (q < fast && (unsigned char)(*q - '0') <= 9)
    v = v * 10u + (uint64_t)(*q++ - '0');
  if (q == *p)
    return false;
  if (q < end && (unsigned char)(*q - '0') <= 9) {
    /* a 20th digit: checked; a 21st is too many */
    if (!tg__mul(v, 10, &v) || !tg__add(v, (uint64_t)(*q++ - '0'), &v) ||
        (q < end && (unsigned char)(*q - '0') <= 9))
      return false;
  }
  *p = q;
  *out = v;
  return true;
}

static bool is_bucket(tg_algorithm alg) {
  return alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
}

bool tg__rv_parse_state(tg_algorithm alg, const char *s, size_t len,
                        tg__state *st) {
  const char *p = s, *end = s + len;
  uint64_t x, y;
  if (alg == TG_SLIDING_WINDOW || len < 5 || p[0] != (char)('0' + alg) ||
      p[1] != ':')
    return false;
  p += 2;
  if (!tg__scan_u64(&p, end, &x) || p == end || *p++ != ':')
    return false;
  const char *ys = p;
  if (!tg__scan_u64(&p, end, &y) || p != end)
    return false;
  if (is_bucket(alg)) {
    /* the ns remainder: 0..999 in at most 3 digits, as the script writes */
    uint64_t tat;
    if (p - ys > 3 || !tg__mul(x, 1000, &tat) || !tg__add(tat, y, &tat))
      return false;
    *st = tg__tat_state(tat);
    return true;
  }
  *st = tg__win_state(x, y);
  return true;
}

/* "00" .. "99": two digits per division. */
static const char DIGIT_PAIRS[201] = "00010203040506070809"
                                     "10111213141516171819"
                                     "20212223242526272829"
                                     "30313233343536373839"
                                     "40414243444546474849"
                                     "50515253545556575859"
                                     "60616263646566676869"
                                     "70717273747576777879"
                                     "80818283848586878889"
                                     "90919293949596979899";

/* 10^i for i in 1..19: a value's digit count by comparisons. */
static const uint64_t POW10[20] = {0,
                                   UINT64_C(10),
                                   UINT64_C(100),
                                   UINT64_C(1000),
                                   UINT64_C(10000),
                                   UINT64_C(100000),
                                   UINT64_C(1000000),
                                   UINT64_C(10000000),
                                   UINT64_C(100000000),
                                   UINT64_C(1000000000),
                                   UINT64_C(10000000000),
                                   UINT64_C(100000000000),
                                   UINT64_C(1000000000000),
                                   UINT64_C(10000000000000),
                                   UINT64_C(100000000000000),
                                   UINT64_C(1000000000000000),
                                   UINT64_C(10000000000000000),
                                   UINT64_C(100000000000000000),
                                   UINT64_C(1000000000000000000),
                                   UINT64_C(10000000000000000000)};

size_t tg__u64_dec(char *out, uint64_t v) {
  size_t n = 1;
  while (n < 20 && v >= POW10[n])
    n++;
  char *p = out + n;
  while (v >= 100) {
    unsigned d = (unsigned)(v % 100) * 2;
    v /= 100;
    *--p = DIGIT_PAIRS[d + 1];
    *--p = DIGIT_PAIRS[d];
  }
  if (v >= 10) {
    *--p = DIGIT_PAIRS[v * 2 + 1];
    *--p = DIGIT_PAIRS[v * 2];
  } else {
    *--p = (char)('0' + v);
  }
  return n;
}

/* v as exactly 20 digits, zero-padded. */
static void put_u64_20(char *out, uint64_t v) {
  for (int i = 19; i >= 0; i--) {
    out[i] = (char)('0' + v % 10);
    v /= 10;
  }
}

size_t tg__rv_format_state(tg_algorithm alg, const tg__state *st, char *out) {
  size_t n = 0;
  out[n++] = (char)('0' + alg);
  out[n++] = ':';
  if (is_bucket(alg)) {
    n += tg__u64_dec(out + n, tg__tat(st) / 1000);
    out[n++] = ':';
    n += tg__u64_dec(out + n, tg__tat(st) % 1000);
  } else {
    n += tg__u64_dec(out + n, tg__win_end(st));
    out[n++] = ':';
    n += tg__u64_dec(out + n, tg__win_count(st));
  }
  return n;
}

bool tg__rv_log_entries(const char *s, size_t len, size_t *n) {
  if (len < TG__RV_LOG_HEAD || s[0] != '2' ||
      (len - TG__RV_LOG_HEAD) % TG__RV_LOG_ENTRY != 0)
    return false;
  *n = (len - TG__RV_LOG_HEAD) / TG__RV_LOG_ENTRY;
  return true;
}

/* A 20-digit field: digits only (no sign, no blank), a u64. */
static bool field(const char *p, uint64_t *out) {
  const char *q = p;
  return tg__scan_u64(&q, p + 20, out) && q == p + 20;
}

bool tg__rv_parse_log(const char *s, size_t n, tg__entry *e, uint64_t *sum) {
  if (!field(s + 1, sum))
    return false;
  for (size_t i = 0; i < n; i++) {
    const char *p = s + TG__RV_LOG_HEAD + TG__RV_LOG_ENTRY * i;
    if (!field(p, &e[i].t_us) || !field(p + 20, &e[i].cost))
      return false;
  }
  return true;
}

size_t tg__rv_format_log(const tg__log *log, char *out) {
  out[0] = '2';
  put_u64_20(out + 1, log->sum);
  char *p = out + TG__RV_LOG_HEAD;
  for (uint32_t i = 0; i < log->n; i++, p += TG__RV_LOG_ENTRY) {
    const tg__entry *e = tg__log_at(log, i);
    put_u64_20(p, e->t_us);
    put_u64_20(p + 20, e->cost);
  }
  return (size_t)(p - out);
}
