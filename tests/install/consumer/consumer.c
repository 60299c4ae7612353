/* SPDX-License-Identifier: MIT */
/*
 * consumer.c - a program outside the project that uses an INSTALLED tollgate
 * the way a user would: <tollgate.h> from the install prefix and nothing from
 * src/. tests/install/run.sh builds it through find_package (shared and
 * static targets) and through pkg-config, runs it and compares the one line it
 * prints. CONSUMER_STATIC says which library the build meant to link, so the
 * checks below catch a package that hands out the wrong TG_STATIC setting.
 */
#include <tollgate.h>

#include <stdio.h>

#if defined(CONSUMER_STATIC) && !defined(TG_STATIC)
#error "users of the static library must get TG_STATIC from the package"
#endif
#if !defined(CONSUMER_STATIC) && defined(TG_STATIC)
#error "TG_STATIC leaked to users of the shared library"
#endif

int main(void) {
  if (tg_version() != TG_VERSION_HEX) {
    fprintf(stderr, "consumer: header is 0x%06x but the library is 0x%06x\n",
            (unsigned)TG_VERSION_HEX, tg_version());
    return 1;
  }
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  tg_limiter *lim = NULL;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    fprintf(stderr, "consumer: tg_limiter_new: %s\n", tg_strerror(rc));
    return 1;
  }
  /* A full bucket of 3 at one instant: three calls pass, the fourth waits. */
  const tg_quota q = {.limit = 3, .period_ms = 1000, .burst = 3};
  const uint64_t now_us = UINT64_C(1735689600000000);
  unsigned allowed = 0, denied = 0;
  for (int i = 0; i < 4; i++) {
    tg_result r;
    rc = tg_hit_at(lim, now_us, "user:42", 7, &q, 1, &r);
    if (rc != TG_OK) {
      fprintf(stderr, "consumer: tg_hit_at: %s\n", tg_strerror(rc));
      tg_limiter_destroy(lim);
      return 1;
    }
    if (r.allowed)
      allowed++;
    else
      denied++;
  }
  tg_limiter_destroy(lim);
  /* Says whether the library linked has the Redis store: a static link of
   * one that has it only succeeds if the package brought hiredis along. */
  printf("tollgate %s: %u allowed, %u denied, redis %s\n", tg_version_string(),
         allowed, denied, tg_redis_available() ? "yes" : "no");
  return 0;
}
