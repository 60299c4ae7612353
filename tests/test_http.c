/* SPDX-License-Identifier: MIT */
/*
 * test_http.c - tg_http_headers, from tollgate.h's "HTTP headers" section
 * and the examples of draft-ietf-httpapi-ratelimit-headers-11 (sections
 * 3.2, 4.2 and appendix B) and of the older drafts' RateLimit-Limit /
 * -Remaining / -Reset form: the same numbers must give the same fields.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "tollgate.h"

static tg_result res(bool allowed, uint64_t remaining, uint64_t retry_ms,
                     uint64_t reset_ms) {
  tg_result r;
  memset(&r, 0, sizeof r);
  r.allowed = allowed;
  r.remaining = remaining;
  r.retry_after_ms = retry_ms;
  r.reset_after_ms = reset_ms;
  return r;
}

static void expect(const tg_http_limit *l, size_t n, unsigned flags,
                   const char *want) {
  char buf[512];
  size_t len = 0;
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, l, n, flags), 0);
  assert_string_equal(buf, want);
  assert_int_equal(len, strlen(want));
}

/* Draft 11, 3.2 and 4.2: one policy, with and without a partition key. */
static void test_draft_examples(void **state) {
  (void)state;
  tg_quota q = {100, 10000, 0};
  tg_result r = res(true, 50, 0, 30000);
  tg_http_limit l = {"default", &q, &r, NULL, 0};
  expect(&l, 1, TG_HTTP_IETF,
         "RateLimit-Policy: \"default\";q=100;w=10\r\n"
         "RateLimit: \"default\";r=50;t=30\r\n");
  /* 4.2: 300 MB in the next 60 seconds, pk "App-999" */
  tg_quota big = {300000000, 60000, 0};
  tg_result rb = res(true, 300000000, 0, 60000);
  tg_http_limit lb = {"default", &big, &rb, "App-999", 7};
  expect(&lb, 1, TG_HTTP_IETF,
         "RateLimit-Policy: \"default\";q=300000000;w=60;pk=:QXBwLTk5OQ==:\r\n"
         "RateLimit: \"default\";r=300000000;t=60;pk=:QXBwLTk5OQ==:\r\n");
  /* 3.2: two policies in one field (serialised with ", " as RFC 9651
   * does; the draft's example omits the space, which parsers accept) */
  tg_quota pm = {50, 60000, 0}, ph = {1000, 3600000, 0};
  tg_result r1 = res(true, 49, 0, 60000), r2 = res(true, 999, 0, 3600000);
  tg_http_limit two[2] = {{"permin", &pm, &r1, NULL, 0},
                          {"perhr", &ph, &r2, NULL, 0}};
  expect(two, 2, TG_HTTP_IETF,
         "RateLimit-Policy: \"permin\";q=50;w=60, \"perhr\";q=1000;w=3600\r\n"
         "RateLimit: \"permin\";r=49;t=60, \"perhr\";r=999;t=3600\r\n");
}

/* Numbers beyond a Structured Field Integer's 15 digits are written as
 * the largest one (a parser rejects a longer integer, and with it the
 * whole field); 999999999999999 itself is written as it is. */
static void test_huge_numbers(void **state) {
  (void)state;
  tg_quota q = {UINT64_C(1000000000000000000), 1000, 0};
  tg_result r = res(true, UINT64_MAX, 0, UINT64_MAX);
  tg_http_limit l = {"big", &q, &r, NULL, 0};
  expect(&l, 1, TG_HTTP_IETF | TG_HTTP_LEGACY,
         "RateLimit-Policy: \"big\";q=999999999999999;w=1\r\n"
         "RateLimit: \"big\";r=999999999999999;t=999999999999999\r\n"
         "RateLimit-Limit: 999999999999999\r\n"
         "RateLimit-Remaining: 999999999999999\r\n"
         "RateLimit-Reset: 999999999999999\r\n");
  tg_quota e = {UINT64_C(999999999999999), 1000, 0};
  tg_result re = res(true, UINT64_C(999999999999998), 0, 1000);
  tg_http_limit le = {"edge", &e, &re, NULL, 0};
  expect(&le, 1, TG_HTTP_IETF,
         "RateLimit-Policy: \"edge\";q=999999999999999;w=1\r\n"
         "RateLimit: \"edge\";r=999999999999998;t=1\r\n");
}

/* Appendix B.3: a 429 with Retry-After 20 and the policy's numbers; the
 * older form of the same numbers (drafts 00-06, section "Examples"). */
static void test_throttled(void **state) {
  (void)state;
  tg_quota q = {100, 60000, 0};
  tg_result r = res(false, 0, 20000, 40000);
  tg_http_limit l = {"dynamic", &q, &r, NULL, 0};
  expect(&l, 1, TG_HTTP_RETRY_AFTER | TG_HTTP_IETF,
         "Retry-After: 20\r\n"
         "RateLimit-Policy: \"dynamic\";q=100;w=60\r\n"
         "RateLimit: \"dynamic\";r=0;t=20\r\n");
  tg_result ok = res(true, 0, 0, 50000);
  tg_http_limit lo = {"default", &q, &ok, NULL, 0};
  expect(&lo, 1, TG_HTTP_LEGACY,
         "RateLimit-Limit: 100\r\nRateLimit-Remaining: 0\r\n"
         "RateLimit-Reset: 50\r\n");
  /* an allowed (or shadow) result adds no Retry-After */
  expect(&lo, 1, TG_HTTP_RETRY_AFTER, "");
  /* rounding up: 1 ms is a second; TG_NEVER writes no Retry-After */
  tg_result r1 = res(false, 0, 1, 1);
  tg_http_limit l1 = {"x", &q, &r1, NULL, 0};
  expect(&l1, 1, TG_HTTP_RETRY_AFTER, "Retry-After: 1\r\n");
  /* a denial with units left (a cost above them): t is the wait too, not
   * the reset, so that Retry-After does not come before t ends (draft 11,
   * section 6); a real token bucket of 100 holding 3 asked for 5 */
  tg_result r3 = res(false, 3, 2000, 97000);
  tg_http_limit l3 = {"bucket", &q, &r3, NULL, 0};
  expect(&l3, 1, TG_HTTP_RETRY_AFTER | TG_HTTP_IETF | TG_HTTP_LEGACY,
         "Retry-After: 2\r\n"
         "RateLimit-Policy: \"bucket\";q=100;w=60\r\n"
         "RateLimit: \"bucket\";r=3;t=2\r\n"
         "RateLimit-Limit: 100\r\nRateLimit-Remaining: 3\r\n"
         "RateLimit-Reset: 2\r\n");
  tg_result rn = res(false, 0, TG_NEVER, 0);
  tg_http_limit ln = {"x", &q, &rn, NULL, 0};
  expect(&ln, 1, TG_HTTP_RETRY_AFTER, "");
  /* nor beside a limit that would pass in 5 s: the call would still be
   * denied then (the policy's retry_after_ms is TG_NEVER too) */
  tg_result r5 = res(false, 0, 5000, 5000);
  tg_http_limit both[2] = {{"x", &q, &rn, NULL, 0}, {"y", &q, &r5, NULL, 0}};
  expect(both, 2, TG_HTTP_RETRY_AFTER, "");
  expect(&both[1], 1, TG_HTTP_RETRY_AFTER, "Retry-After: 5\r\n");
}

/* Appendix B.3.1: hourly 1000 and daily 5000, 4900 used: the day is the
 * limit with the fewest remaining, which the older form reports. */
static void test_multiple_windows(void **state) {
  (void)state;
  tg_quota hour = {1000, 3600000, 0}, day = {5000, 86400000, 0};
  tg_result rh = res(true, 900, 0, 1800000), rd = res(true, 100, 0, 36000000);
  tg_http_limit l[2] = {{"hour", &hour, &rh, NULL, 0},
                        {"day", &day, &rd, NULL, 0}};
  expect(l, 2, TG_HTTP_LEGACY,
         "RateLimit-Limit: 5000, 1000;w=3600, 5000;w=86400\r\n"
         "RateLimit-Remaining: 100\r\nRateLimit-Reset: 36000\r\n");
  expect(l, 2, TG_HTTP_IETF,
         "RateLimit-Policy: \"hour\";q=1000;w=3600, \"day\";q=5000;w=86400\r\n"
         "RateLimit: \"hour\";r=900;t=1800, \"day\";r=100;t=36000\r\n");
}

static void test_refusals(void **state) {
  (void)state;
  tg_quota q = {1, 1000, 0};
  tg_result r = res(true, 0, 0, 0);
  tg_http_limit l = {"ok", &q, &r, NULL, 0};
  char buf[256];
  size_t len;
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, &l, 1, 0), TG_EINVAL);
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, &l, 0, 1), TG_EINVAL);
  assert_int_equal(tg_http_headers(NULL, 9, &len, &l, 1, 1), TG_EINVAL);
  tg_http_limit bad = {"a\nb", &q, &r, NULL, 0};
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, &bad, 1, 1),
                   TG_EINVAL);
  bad.name = "";
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, &bad, 1, 1),
                   TG_EINVAL);
  /* a quote and a backslash are escaped */
  tg_http_limit esc = {"a\"b\\c", &q, &r, NULL, 0};
  assert_int_equal(tg_http_headers(buf, sizeof buf, &len, &esc, 1, 1), 0);
  assert_non_null(strstr(buf, "\"a\\\"b\\\\c\";q=1;w=1"));
  /* too small: TG_ERANGE and the size needed */
  assert_int_equal(tg_http_headers(buf, 10, &len, &l, 1, TG_HTTP_IETF),
                   TG_ERANGE);
  size_t need = len;
  assert_int_equal(tg_http_headers(buf, need, &len, &l, 1, TG_HTTP_IETF),
                   TG_ERANGE);
  assert_int_equal(tg_http_headers(buf, need + 1, &len, &l, 1, TG_HTTP_IETF),
                   0);
  assert_int_equal(len, need);
  /* cap 0 asks for the size only, buf NULL or not */
  len = 0;
  assert_int_equal(tg_http_headers(NULL, 0, &len, &l, 1, TG_HTTP_IETF),
                   TG_ERANGE);
  assert_int_equal(len, need);
  len = 0;
  assert_int_equal(tg_http_headers(buf, 0, &len, &l, 1, TG_HTTP_IETF),
                   TG_ERANGE);
  assert_int_equal(len, need);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_draft_examples),
      cmocka_unit_test(test_huge_numbers),
      cmocka_unit_test(test_throttled),
      cmocka_unit_test(test_multiple_windows),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
