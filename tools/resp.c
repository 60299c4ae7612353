/* SPDX-License-Identifier: MIT */
/*
 * resp.c - the RESP2 request parser (see resp.h for the contract).
 *
 * Stateless on purpose: a request that arrives in pieces is parsed again from
 * its first byte when the next piece comes. That costs nothing measurable,
 * because the bounds make every re-parse short: a multibulk header is walked
 * in O(arguments) (payloads are skipped by their declared length, never
 * scanned), and an inline line is one memchr over at most RESP_MAX_REQUEST
 * bytes.
 */
#include "resp.h"

#include <stdbool.h>
#include <string.h>

/* Reads the header line "<c>digits\r\n" at buf[pos..len) (buf[pos] is the
 * type byte, already checked) byte by byte, so that a line that can no
 * longer be valid is refused as soon as the byte that proves it arrives: a
 * byte that is neither a digit nor CR (a bare LF, a space, a sign other than
 * the '-' of "-1"), a CR not followed by LF, or a line longer than
 * RESP_MAX_HEADER. Waiting for more bytes is right only while they could
 * still complete a valid line. A count above `limit` is refused once the line
 * is whole (RESP_TOO_BIG: a bound, not garbage). "-1" (a null) gives -1.
 * On success stores the count and the position after the CRLF. Returns
 * RESP_OK, RESP_INCOMPLETE, or a negative status with req->error set. */
static resp_status header(const char *buf, size_t len, size_t pos, size_t limit,
                          long long *count, size_t *next, resp_request *req,
                          const char *bad, const char *big) {
  size_t v = 0, digits = 0;
  bool neg = false, over = false;
  size_t i = pos + 1;
  for (;; i++) {
    if (i - pos >= RESP_MAX_HEADER) {
      req->error = bad;
      return RESP_PROTOCOL;
    }
    if (i >= len)
      return RESP_INCOMPLETE;
    char ch = buf[i];
    if (ch == '\r')
      break;
    if (ch == '-' && i == pos + 1) {
      neg = true;
      continue;
    }
    if (ch == '\n') {
      req->error = "Protocol error: header line ends in LF without CR";
      return RESP_PROTOCOL;
    }
    if (ch < '0' || ch > '9' || (neg && (digits > 0 || ch != '1'))) {
      req->error = bad;
      return RESP_PROTOCOL;
    }
    digits++;
    if (!over) {
      v = v * 10u + (size_t)(ch - '0');
      over = v > limit;
    }
  }
  if (digits == 0) {
    req->error = bad;
    return RESP_PROTOCOL;
  }
  if (i + 1 >= len)
    return RESP_INCOMPLETE;
  if (buf[i + 1] != '\n') {
    req->error = bad;
    return RESP_PROTOCOL;
  }
  if (over) {
    req->error = big;
    return RESP_TOO_BIG;
  }
  *count = neg ? -1 : (long long)v;
  *next = i + 2;
  return RESP_OK;
}

static resp_status parse_multibulk(const char *buf, size_t len,
                                   resp_request *req) {
  long long n;
  size_t pos;
  resp_status st = header(buf, len, 0, RESP_MAX_ARGS, &n, &pos, req,
                          "Protocol error: invalid multibulk length",
                          "Protocol error: too many arguments");
  if (st != RESP_OK)
    return st;
  if (n <= 0) { /* "*0" and "*-1": nothing to run */
    req->used = pos;
    return RESP_OK;
  }
  for (long long i = 0; i < n; i++) {
    if (pos >= len)
      return RESP_INCOMPLETE;
    if (buf[pos] != '$') {
      req->error = "Protocol error: expected '$'";
      return RESP_PROTOCOL;
    }
    long long blen;
    size_t data;
    st = header(buf, len, pos, RESP_MAX_BULK, &blen, &data, req,
                "Protocol error: invalid bulk length",
                "Protocol error: argument too long");
    if (st != RESP_OK)
      return st;
    if (blen < 0) { /* "$-1": a null argument is not a request */
      req->error = "Protocol error: invalid bulk length";
      return RESP_PROTOCOL;
    }
    size_t end = data + (size_t)blen; /* where its CRLF must be */
    if (end + 2 > RESP_MAX_REQUEST) {
      req->error = "Protocol error: request too long";
      return RESP_TOO_BIG;
    }
    /* each byte of the CRLF is checked as soon as it is there */
    if ((end < len && buf[end] != '\r') ||
        (end + 1 < len && buf[end + 1] != '\n')) {
      req->error = "Protocol error: bulk not followed by CRLF";
      return RESP_PROTOCOL;
    }
    if (end + 2 > len)
      return RESP_INCOMPLETE;
    req->argv[req->argc].ptr = buf + data;
    req->argv[req->argc].len = (size_t)blen;
    req->argc++;
    pos = end + 2;
  }
  req->used = pos;
  return RESP_OK;
}

static resp_status parse_inline(const char *buf, size_t len,
                                resp_request *req) {
  size_t scan = len < RESP_MAX_REQUEST ? len : RESP_MAX_REQUEST;
  const char *nl = memchr(buf, '\n', scan);
  if (!nl) {
    if (len >= RESP_MAX_REQUEST) {
      req->error = "Protocol error: too big inline request";
      return RESP_TOO_BIG;
    }
    return RESP_INCOMPLETE;
  }
  size_t end = (size_t)(nl - buf);
  req->used = end + 1;
  if (end > 0 && buf[end - 1] == '\r')
    end--;
  size_t i = 0;
  while (i < end) {
    while (i < end && (buf[i] == ' ' || buf[i] == '\t'))
      i++;
    if (i == end)
      break;
    size_t start = i;
    while (i < end && buf[i] != ' ' && buf[i] != '\t')
      i++;
    if (req->argc == RESP_MAX_ARGS) {
      req->error = "Protocol error: too many arguments";
      return RESP_TOO_BIG;
    }
    if (i - start > RESP_MAX_BULK) {
      req->error = "Protocol error: argument too long";
      return RESP_TOO_BIG;
    }
    req->argv[req->argc].ptr = buf + start;
    req->argv[req->argc].len = i - start;
    req->argc++;
  }
  return RESP_OK;
}

resp_status resp_parse(const char *buf, size_t len, resp_request *req) {
  req->argc = 0;
  req->used = 0;
  req->error = NULL;
  if (len == 0)
    return RESP_INCOMPLETE;
  resp_status st = buf[0] == '*' ? parse_multibulk(buf, len, req)
                                 : parse_inline(buf, len, req);
  if (st == RESP_INCOMPLETE && len >= RESP_MAX_REQUEST) {
    /* RESP_MAX_REQUEST bytes and still no whole request (a header cut
     * inside its digits, say): it can only be longer. Said now, since
     * the connection cannot hold the byte that would prove it. */
    req->error = "Protocol error: request too long";
    st = RESP_TOO_BIG;
  }
  if (st != RESP_OK)
    req->argc = 0;
  return st;
}
