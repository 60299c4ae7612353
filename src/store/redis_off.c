/* SPDX-License-Identifier: MIT */
/*
 * redis_off.c - the Redis store in a build without hiredis: a limiter
 * configured for Redis is TG_ENOTSUP, and tg_redis_available() says 0, so a
 * program can tell before it tries.
 */
#include "store.h"

#include "../error.h"

int tg__redis_built(void) { return 0; }

int tg__redis_store_new(tg__store **out, const tg_redis_config *rc,
                        tg_algorithm alg, uint32_t log_entries) {
  (void)rc;
  (void)alg;
  (void)log_entries;
  *out = NULL;
  tg__error_set("this build of tollgate has no Redis store (it was built "
                "without hiredis)");
  return TG_ENOTSUP;
}

void tg__redis_stats(const tg__store *s, tg_stats *st) {
  (void)s;
  (void)st;
}
