/* SPDX-License-Identifier: MIT */
/*
 * redis_resp.c - RESP2 commands and an incremental reply reader (see
 * redis_resp.h). One byte-driven state machine: a value's header is read a
 * byte at a time (it is short), a bulk string's payload in whole runs.
 */
#include "redis_resp.h"

#include <string.h>

enum {
  S_TYPE = 0, /* before a value's type byte */
  S_NUM,      /* in a header's integer (*, $, :), up to its CR */
  S_NUM_LF,   /* after that CR */
  S_TEXT,     /* in a status or error line, up to its CR */
  S_TEXT_LF,  /* after that CR */
  S_BULK,     /* in a bulk string's payload */
  S_BULK_CR,  /* after the payload: CR due */
  S_BULK_LF   /* LF due */
};

void tg__resp_reader_init(tg__resp_reader *rd) { memset(rd, 0, sizeof *rd); }

/* The header's integer: an optional "-" then 1..19 digits, within int64. */
static bool parse_num(const tg__resp_reader *rd, int64_t *out) {
  const char *p = rd->line, *end = rd->line + rd->line_len;
  bool neg = p < end && *p == '-';
  p += neg;
  if (p == end || end - p > 19)
    return false;
  uint64_t v = 0;
  for (; p < end; p++) {
    if (*p < '0' || *p > '9')
      return false;
    v = v * 10 + (uint64_t)(*p - '0'); /* 19 digits fit 64 bits */
  }
  if (v > (uint64_t)INT64_MAX)
    return false;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return true;
}

/* A value is complete: fill *v and move up the arrays it completes. */
static int emit(tg__resp_reader *rd, tg__resp_type type, int64_t n,
                tg__resp_value *v) {
  v->type = type;
  v->depth = rd->depth;
  v->n = n;
  v->str = rd->big ? rd->big : rd->str;
  v->len = rd->str_len;
  if (rd->big)
    rd->big[rd->str_len] = '\0';
  rd->big = NULL; /* the consumer's now */
  v->truncated = (type == TG__RESP_STATUS || type == TG__RESP_ERROR ||
                  type == TG__RESP_BULK) &&
                 (uint64_t)n > rd->str_len;
  rd->state = S_TYPE;
  if (type == TG__RESP_ARRAY && n > 0) {
    if (rd->depth == TG__RESP_DEPTH_MAX)
      return -1;
    rd->left[rd->depth++] = n;
    v->last = false;
    return 1;
  }
  while (rd->depth > 0) {
    if (--rd->left[rd->depth - 1] > 0)
      break;
    rd->depth--;
  }
  v->last = rd->depth == 0;
  return 1;
}

/* The value whose header integer just ended. */
static int header_done(tg__resp_reader *rd, tg__resp_value *v) {
  int64_t n;
  if (!parse_num(rd, &n))
    return -1;
  switch (rd->type) {
  case TG__RESP_INTEGER:
    rd->str_len = 0;
    return emit(rd, TG__RESP_INTEGER, n, v);
  case TG__RESP_ARRAY:
    if (n == -1) {
      rd->str_len = 0;
      return emit(rd, TG__RESP_NIL, 0, v);
    }
    if (n < 0 || n > TG__RESP_ARRAY_MAX)
      return -1;
    rd->str_len = 0;
    return emit(rd, TG__RESP_ARRAY, n, v);
  default: /* BULK */
    if (n == -1) {
      rd->str_len = 0;
      return emit(rd, TG__RESP_NIL, 0, v);
    }
    if (n < 0 || n > TG__RESP_BULK_MAX)
      return -1;
    rd->n = n;
    rd->bulk_left = n;
    rd->str_len = 0;
    rd->big = n > (int64_t)TG__RESP_STR_MAX && rd->room
                  ? rd->room(rd->room_ctx, rd->depth, n)
                  : NULL;
    rd->state = n > 0 ? S_BULK : S_BULK_CR;
    return 0;
  }
}

/* Keeps what fits of a string value's bytes. */
static void keep(tg__resp_reader *rd, const char *p, size_t n) {
  char *to = rd->big ? rd->big : rd->str;
  size_t room = (rd->big ? (size_t)rd->n : TG__RESP_STR_MAX) - rd->str_len;
  if (n > room)
    n = room;
  memcpy(to + rd->str_len, p, n);
  rd->str_len += n;
}

int tg__resp_read(tg__resp_reader *rd, const char *buf, size_t len,
                  size_t *used, tg__resp_value *v) {
  size_t i = 0;
  int rc = 0;
  while (i < len && rc == 0) {
    char ch = buf[i];
    switch (rd->state) {
    case S_TYPE:
      i++;
      rd->line_len = 0;
      rd->str_len = 0;
      rd->n = 0;
      switch (ch) {
      case '+':
        rd->type = TG__RESP_STATUS;
        rd->state = S_TEXT;
        break;
      case '-':
        rd->type = TG__RESP_ERROR;
        rd->state = S_TEXT;
        break;
      case ':':
        rd->type = TG__RESP_INTEGER;
        rd->state = S_NUM;
        break;
      case '$':
        rd->type = TG__RESP_BULK;
        rd->state = S_NUM;
        break;
      case '*':
        rd->type = TG__RESP_ARRAY;
        rd->state = S_NUM;
        break;
      default:
        rc = -1;
      }
      break;
    case S_NUM:
      i++;
      if (ch == '\r')
        rd->state = S_NUM_LF;
      else if (rd->line_len < sizeof rd->line)
        rd->line[rd->line_len++] = ch;
      else
        rc = -1; /* no integer is this long */
      break;
    case S_NUM_LF:
      i++;
      rc = ch == '\n' ? header_done(rd, v) : -1;
      break;
    case S_TEXT: {
      const char *cr = memchr(buf + i, '\r', len - i);
      size_t n = cr ? (size_t)(cr - (buf + i)) : len - i;
      const char *lf = memchr(buf + i, '\n', n);
      if (lf) {
        rc = -1; /* a bare LF inside a line */
        break;
      }
      keep(rd, buf + i, n);
      rd->n += (int64_t)n;
      i += n;
      if (cr) {
        i++;
        rd->state = S_TEXT_LF;
      }
      break;
    }
    case S_TEXT_LF:
      i++;
      rc = ch == '\n' ? emit(rd, rd->type, rd->n, v) : -1;
      break;
    case S_BULK: {
      size_t n = len - i;
      if ((uint64_t)n > (uint64_t)rd->bulk_left)
        n = (size_t)rd->bulk_left;
      keep(rd, buf + i, n);
      rd->bulk_left -= (int64_t)n;
      i += n;
      if (rd->bulk_left == 0)
        rd->state = S_BULK_CR;
      break;
    }
    case S_BULK_CR:
      i++;
      if (ch == '\r')
        rd->state = S_BULK_LF;
      else
        rc = -1;
      break;
    default: /* S_BULK_LF */
      i++;
      rc = ch == '\n' ? emit(rd, TG__RESP_BULK, rd->n, v) : -1;
      break;
    }
  }
  *used = i;
  return rc;
}

/* Decimal digits of n. */
static size_t digits(size_t n) {
  size_t d = 1;
  while (n >= 10) {
    n /= 10;
    d++;
  }
  return d;
}

size_t tg__resp_command_size(int argc, const char *const *argv,
                             const size_t *len) {
  (void)argv;
  size_t n = 1 + digits((size_t)argc) + 2;
  for (int i = 0; i < argc; i++)
    n += 1 + digits(len[i]) + 2 + len[i] + 2;
  return n;
}

/* "c" then n in decimal then CR LF; returns the bytes written. */
static size_t put_header(char *out, char c, size_t n) {
  char tmp[24];
  size_t k = 0;
  do {
    tmp[k++] = (char)('0' + n % 10);
    n /= 10;
  } while (n);
  size_t w = 0;
  out[w++] = c;
  while (k)
    out[w++] = tmp[--k];
  out[w++] = '\r';
  out[w++] = '\n';
  return w;
}

size_t tg__resp_command(char *out, int argc, const char *const *argv,
                        const size_t *len) {
  size_t w = put_header(out, '*', (size_t)argc);
  for (int i = 0; i < argc; i++) {
    w += put_header(out + w, '$', len[i]);
    if (len[i])
      memcpy(out + w, argv[i], len[i]);
    w += len[i];
    out[w++] = '\r';
    out[w++] = '\n';
  }
  return w;
}
