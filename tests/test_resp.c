/* SPDX-License-Identifier: MIT */
/*
 * test_resp.c - the RESP2 request parser of `tollgate serve` (tools/resp.c):
 * what it accepts, where a request ends, that every prefix of a request is
 * "incomplete" (so a request arriving byte by byte parses the same), and
 * which inputs are garbage framing or over a bound, each refused as soon as
 * the bytes that prove it have arrived. fuzz/fuzz_resp.c checks the same
 * properties on arbitrary input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

static resp_request req;

/* Parses the C string s (length len, may hold NULs). */
static resp_status parse(const char *s, size_t len) {
  return resp_parse(s, len, &req);
}
#define PARSE(lit) parse(lit, sizeof(lit) - 1)

static void assert_arg(size_t i, const char *want, size_t len) {
  assert_true(i < req.argc);
  assert_int_equal(req.argv[i].len, len);
  assert_memory_equal(req.argv[i].ptr, want, len);
}
#define ARG(i, lit) assert_arg(i, lit, sizeof(lit) - 1)

/* Every strict prefix of s[0..len) must be incomplete. */
static void assert_prefixes_incomplete(const char *s, size_t len) {
  for (size_t n = 0; n < len; n++) {
    resp_status st = parse(s, n);
    if (st != RESP_INCOMPLETE)
      fail_msg("prefix of %zu bytes of %zu: status %d", n, len, (int)st);
  }
}

static void multibulk(void **state) {
  (void)state;
  static const char r[] = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
  assert_int_equal(PARSE(r), RESP_OK);
  assert_int_equal(req.argc, 3);
  assert_int_equal(req.used, sizeof r - 1);
  ARG(0, "SET");
  ARG(1, "k");
  ARG(2, "hello");
  assert_prefixes_incomplete(r, sizeof r - 1);
}

static void binary_arguments(void **state) {
  (void)state;
  /* CR, LF and NUL inside a bulk are data: the length decides */
  static const char r[] = "*2\r\n$4\r\na\r\n\0\r\n$0\r\n\r\n";
  assert_int_equal(PARSE(r), RESP_OK);
  assert_int_equal(req.argc, 2);
  ARG(0, "a\r\n\0");
  ARG(1, "");
  assert_prefixes_incomplete(r, sizeof r - 1);
}

static void pipelined_requests_end_where_they_end(void **state) {
  (void)state;
  static const char r[] = "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"
                          "PING inline\r\n";
  size_t off = 0;
  assert_int_equal(parse(r + off, sizeof r - 1 - off), RESP_OK);
  assert_int_equal(req.used, 14);
  ARG(0, "PING");
  off += req.used;
  assert_int_equal(parse(r + off, sizeof r - 1 - off), RESP_OK);
  ARG(1, "hi");
  off += req.used;
  assert_int_equal(parse(r + off, sizeof r - 1 - off), RESP_OK);
  assert_int_equal(req.argc, 2);
  ARG(1, "inline");
  off += req.used;
  assert_int_equal(off, sizeof r - 1);
  assert_int_equal(parse(r + off, 0), RESP_INCOMPLETE);
}

static void inline_requests(void **state) {
  (void)state;
  assert_int_equal(PARSE("  TG.HIT\tk  fixed_window 3 1000  \r\n"), RESP_OK);
  assert_int_equal(req.argc, 5);
  ARG(0, "TG.HIT");
  ARG(1, "k");
  ARG(4, "1000");
  /* a bare LF ends a line too (telnet, nc) */
  assert_int_equal(PARSE("PING\n"), RESP_OK);
  assert_int_equal(req.argc, 1);
  assert_int_equal(req.used, 5);
  assert_prefixes_incomplete("PING\r\n", 6);
}

static void empty_requests_are_consumed(void **state) {
  (void)state;
  assert_int_equal(PARSE("\r\n"), RESP_OK);
  assert_int_equal(req.argc, 0);
  assert_int_equal(req.used, 2);
  assert_int_equal(PARSE(" \t \n"), RESP_OK);
  assert_int_equal(req.argc, 0);
  assert_int_equal(PARSE("*0\r\n"), RESP_OK);
  assert_int_equal(req.argc, 0);
  assert_int_equal(req.used, 4);
  assert_int_equal(PARSE("*-1\r\n"), RESP_OK);
  assert_int_equal(req.argc, 0);
  assert_int_equal(req.used, 5);
}

static void garbage_framing(void **state) {
  (void)state;
  static const char *const bad[] = {
      "*x\r\n",                 /* not a count */
      "*-2\r\n",                /* negative */
      "*+1\r\n",                /* signed */
      "* 1\r\n",                /* space */
      "*\r\n",                  /* empty */
      "*1\rX",                  /* CR without LF */
      "*1\r\n:5\r\n",           /* an integer where a bulk must be */
      "*1\r\n+PING\r\n",        /* a simple string */
      "*1\r\n$-1\r\n",          /* a null argument */
      "*1\r\n$x\r\n",           /* bad bulk length */
      "*1\r\n$4\r\nPINGxx",     /* payload not followed by CRLF */
      "*1\r\n$4\r\nPING\rx",    /* half a CRLF */
      "*2\r\n$1\r\na\r\n*1\r\n" /* a nested array */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    resp_status st = parse(bad[i], strlen(bad[i]));
    if (st != RESP_PROTOCOL)
      fail_msg("input %zu: status %d, want RESP_PROTOCOL", i, (int)st);
    assert_non_null(req.error);
    assert_int_equal(req.argc, 0);
  }
  /* a header line longer than any count is garbage once it is that long,
   * whatever it holds */
  char longhdr[64];
  memset(longhdr, '1', sizeof longhdr);
  longhdr[0] = '*';
  assert_int_equal(parse(longhdr, RESP_MAX_HEADER - 1), RESP_INCOMPLETE);
  assert_int_equal(parse(longhdr, sizeof longhdr), RESP_PROTOCOL);
  memset(longhdr, '0', sizeof longhdr);
  longhdr[0] = '$'; /* inline: an unknown command, for commands.c */
  assert_int_equal(parse(longhdr, sizeof longhdr), RESP_INCOMPLETE);
}

/* s[0..len) is refused (RESP_PROTOCOL) from its last byte on, and not
 * before: every shorter prefix waits for more. */
static void refused_at_last_byte(const char *s, size_t len) {
  assert_prefixes_incomplete(s, len - 1);
  resp_status st = parse(s, len);
  if (st != RESP_PROTOCOL)
    fail_msg("'%.*s': status %d, want RESP_PROTOCOL", (int)len, s, (int)st);
  assert_non_null(req.error);
  assert_memory_equal(req.error, "Protocol error: ", 16);
}
#define REFUSED_AT_LAST_BYTE(lit) refused_at_last_byte(lit, sizeof(lit) - 1)

static void invalid_frames_are_refused_at_once(void **state) {
  (void)state;
  /* bare LF framing: *1\n$4\nPING\n is refused at its first LF instead of
   * waiting for a CR that a client which sends LF never sends */
  REFUSED_AT_LAST_BYTE("*1\n");
  assert_string_equal(req.error,
                      "Protocol error: header line ends in LF without CR");
  assert_int_equal(PARSE("*1\n$4\nPING\n"), RESP_PROTOCOL);
  REFUSED_AT_LAST_BYTE("*1\r\n$4\n");
  REFUSED_AT_LAST_BYTE("*-\n");
  /* any byte a count cannot hold, before its line ends */
  REFUSED_AT_LAST_BYTE("*1x");
  REFUSED_AT_LAST_BYTE("* ");
  REFUSED_AT_LAST_BYTE("*-0");
  REFUSED_AT_LAST_BYTE("*-11");
  REFUSED_AT_LAST_BYTE("*1\r\n$1 ");
  REFUSED_AT_LAST_BYTE("*1\r\n$+");
  REFUSED_AT_LAST_BYTE("*1\r\n$4\r\nPINGx");
  REFUSED_AT_LAST_BYTE("*1\r\n$4\r\nPING\n");
  REFUSED_AT_LAST_BYTE("*1\r\n$4\r\nPING\r\r");
  /* while a frame can still be valid it waits */
  assert_int_equal(PARSE("*-"), RESP_INCOMPLETE);
  assert_int_equal(PARSE("*-1"), RESP_INCOMPLETE);
  assert_int_equal(PARSE("*1\r"), RESP_INCOMPLETE);
  assert_int_equal(PARSE("*1\r\n$4\r\nPING\r"), RESP_INCOMPLETE);
  /* inline requests still end at a bare LF */
  assert_int_equal(PARSE("PING\n"), RESP_OK);
}

static void bounds_are_enforced_before_the_bytes_arrive(void **state) {
  (void)state;
  char buf[64];
  /* one argument too many, refused from the header alone */
  snprintf(buf, sizeof buf, "*%d\r\n", RESP_MAX_ARGS + 1);
  assert_int_equal(parse(buf, strlen(buf)), RESP_TOO_BIG);
  snprintf(buf, sizeof buf, "*%d\r\n", RESP_MAX_ARGS);
  assert_int_equal(parse(buf, strlen(buf)), RESP_INCOMPLETE);
  /* an argument one byte too long, refused from its header */
  snprintf(buf, sizeof buf, "*1\r\n$%u\r\n", RESP_MAX_BULK + 1);
  assert_int_equal(parse(buf, strlen(buf)), RESP_TOO_BIG);
  snprintf(buf, sizeof buf, "*1\r\n$%u\r\n", RESP_MAX_BULK);
  assert_int_equal(parse(buf, strlen(buf)), RESP_INCOMPLETE);
  assert_int_equal(PARSE("*1\r\n$99999999999999999999999\r\n"), RESP_TOO_BIG);
}

static void a_request_longer_than_the_limit_is_refused(void **state) {
  (void)state;
  /* arguments each within bounds whose sum is not: refused at the header
   * of the argument that would cross RESP_MAX_REQUEST */
  size_t cap = 2 * RESP_MAX_REQUEST;
  char *buf = malloc(cap);
  assert_non_null(buf);
  size_t len = (size_t)snprintf(buf, cap, "*%d\r\n", RESP_MAX_ARGS);
  int args = 0;
  while (len + RESP_MAX_BULK + 32 < cap) {
    len += (size_t)snprintf(buf + len, cap - len, "$%u\r\n", RESP_MAX_BULK);
    memset(buf + len, 'x', RESP_MAX_BULK);
    len += RESP_MAX_BULK;
    memcpy(buf + len, "\r\n", 2);
    len += 2;
    args++;
    resp_status st = parse(buf, len);
    if (st == RESP_TOO_BIG)
      break;
    assert_int_equal(st, RESP_INCOMPLETE);
  }
  assert_int_equal(parse(buf, len), RESP_TOO_BIG);
  assert_true(args * (int)RESP_MAX_BULK <= (int)RESP_MAX_REQUEST + 16 * 1024);

  /* RESP_MAX_REQUEST bytes that end inside a bulk header's digits: the
   * request can only be longer, and is refused now (a server whose buffer
   * is full could not read the byte that proves it, and spun) */
  len = 0;
  len += (size_t)sprintf(buf, "*6\r\n");
  for (int i = 0; i < 3; i++) {
    len += (size_t)sprintf(buf + len, "$16384\r\n");
    memset(buf + len, 'a', 16384);
    len += 16384;
    memcpy(buf + len, "\r\n", 2);
    len += 2;
  }
  len += (size_t)sprintf(buf + len, "$16330\r\n");
  memset(buf + len, 'b', 16330);
  len += 16330;
  memcpy(buf + len, "\r\n$", 3);
  len += 3;
  assert_true(len < RESP_MAX_REQUEST);
  memset(buf + len, '1', RESP_MAX_REQUEST - len);
  assert_int_equal(parse(buf, RESP_MAX_REQUEST - 1), RESP_INCOMPLETE);
  assert_int_equal(parse(buf, RESP_MAX_REQUEST), RESP_TOO_BIG);

  /* an inline line with no end in sight */
  memset(buf, 'a', RESP_MAX_REQUEST);
  assert_int_equal(parse(buf, RESP_MAX_REQUEST - 1), RESP_INCOMPLETE);
  assert_int_equal(parse(buf, RESP_MAX_REQUEST), RESP_TOO_BIG);
  /* an inline argument over RESP_MAX_BULK */
  buf[RESP_MAX_BULK + 1] = '\n';
  assert_int_equal(parse(buf, RESP_MAX_BULK + 2), RESP_TOO_BIG);
  /* too many inline arguments */
  len = 0;
  for (int i = 0; i <= RESP_MAX_ARGS; i++) {
    buf[len++] = 'a';
    buf[len++] = ' ';
  }
  buf[len++] = '\n';
  assert_int_equal(parse(buf, len), RESP_TOO_BIG);
  free(buf);
}

static void the_largest_legal_request_parses(void **state) {
  (void)state;
  /* RESP_MAX_ARGS arguments: the most a request may have */
  char buf[1024];
  size_t len = (size_t)snprintf(buf, sizeof buf, "*%d\r\n", RESP_MAX_ARGS);
  for (int i = 0; i < RESP_MAX_ARGS; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "$1\r\n%c\r\n",
                            'a' + i % 26);
  assert_int_equal(parse(buf, len), RESP_OK);
  assert_int_equal(req.argc, RESP_MAX_ARGS);
  assert_int_equal(req.used, len);
  assert_prefixes_incomplete(buf, len);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multibulk),
      cmocka_unit_test(binary_arguments),
      cmocka_unit_test(pipelined_requests_end_where_they_end),
      cmocka_unit_test(inline_requests),
      cmocka_unit_test(empty_requests_are_consumed),
      cmocka_unit_test(garbage_framing),
      cmocka_unit_test(invalid_frames_are_refused_at_once),
      cmocka_unit_test(bounds_are_enforced_before_the_bytes_arrive),
      cmocka_unit_test(a_request_longer_than_the_limit_is_refused),
      cmocka_unit_test(the_largest_legal_request_parses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
