/*
 * test_api.c - the public API's contract outside the algorithms: versions,
 * status codes, configuration, handle lifetime and input validation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tollgate.h"

static void version_matches_header(void **state) {
  (void)state;
  assert_int_equal(tg_version(), TG_VERSION_HEX);
  assert_string_equal(tg_version_string(), "0.1.0");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(version_matches_header),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
