/* SPDX-License-Identifier: MIT */
/*
 * custom_store.c - a limiter whose state lives in the caller's store.
 *
 * tollgate does the arithmetic; the store (custom_store_map.c, an
 * in-process striped hash map) only locks keys and keeps bytes with a TTL.
 * The same three callbacks could front Redis, memcached or a database row.
 *
 * Run it: it prints a few token-bucket decisions, then holds a key's lock
 * itself to show what a busy key does under the default fail-open policy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "custom_store_map.h"
#include "tollgate.h"

static void show(const char *what, int rc, const tg_result *r) {
  printf("%-28s rc=%-10s allowed=%d degraded=%d remaining=%" PRIu64
         " retry_after_ms=%" PRIu64 "\n",
         what, tg_err_name(rc), r->allowed, r->degraded, r->remaining,
         r->retry_after_ms);
}

int main(void) {
  /* The store: 16 lock stripes; a held key makes lock_and_get answer BUSY
   * at once (lock_wait_us 0) so the demo below need not wait. */
  map_store_options mo;
  map_store_options_init(&mo);
  mo.stripes = 16;
  mo.lock_wait_us = 0;
  map_store *m;
  if (map_store_new(&m, &mo) != 0)
    return 1;
  tg_custom_store cs;
  map_store_callbacks(m, &cs);

  /* The limiter: a token bucket whose state goes to the store. cfg copies
   * cs; the map (cs.ctx) must outlive the limiter. */
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  cfg.custom_store = &cs;
  tg_limiter *lim;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    fprintf(stderr, "tg_limiter_new: %s\n", tg_strerror(rc));
    map_store_free(m);
    return 1;
  }

  /* 1 call per second, bursts of 3: the first three pass, the fourth waits. */
  const tg_quota q = {.limit = 1, .period_ms = 1000, .burst = 3};
  const char *key = "user:42";
  tg_result r;
  for (int i = 1; i <= 4; i++) {
    char what[32];
    snprintf(what, sizeof what, "hit %d on %s", i, key);
    rc = tg_hit(lim, key, strlen(key), &q, 1, &r);
    show(what, rc, &r);
  }

  /* Another client holds the key's lock (here: we do, by calling the
   * store ourselves). tollgate gets TG_CUSTOM_BUSY, returns TG_EBUSY, and the
   * policy (fail open) answers "allowed", marked degraded. */
  unsigned char buf[64];
  size_t len = 0;
  int got = cs.lock_and_get(cs.ctx, key, strlen(key), buf, sizeof buf, &len);
  rc = tg_hit(lim, key, strlen(key), &q, 1, &r);
  show("hit while the key is locked", rc, &r);
  if (got == TG_CUSTOM_OK || got == TG_CUSTOM_NOT_FOUND)
    cs.unlock(cs.ctx, key, strlen(key)); /* we took it: we release it */

  printf("keys in the store: %zu\n", map_store_live(m));
  tg_limiter_destroy(lim);
  map_store_free(m); /* after the limiter: it may still call the store */
  return 0;
}
