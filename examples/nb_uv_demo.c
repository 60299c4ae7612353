/* SPDX-License-Identifier: MIT */
/*
 * nb_uv_demo.c - many rate-limit decisions in flight at once from one
 * thread, on a libuv loop, through tollgate's non-blocking API (the
 * adapter in nb_uv.c): 2,000 calls over 100 keys limited to 5 calls per
 * key per hour, all submitted before the loop runs, decided over one
 * pipelined connection.
 *
 *   nb_uv_demo [HOST:PORT]        (default 127.0.0.1:6379)
 *   nb_uv_demo --cluster HOST:PORT[,HOST:PORT...]
 */
#include "nb_uv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CALLS = 2000, KEYS = 100, LIMIT = 5 };

static long answered, allowed, failed;

static void decided(tg_uv_req *req) {
  answered++;
  if (req->nb.status != TG_OK)
    failed++;
  else if (req->nb.result.allowed)
    allowed++;
}

int main(int argc, char **argv) {
  static char host[256];
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.key_prefix = "nb_uv_demo";
  if (argc > 2 && strcmp(argv[1], "--cluster") == 0) {
    rc.cluster_nodes = argv[2];
  } else if (argc > 1) {
    const char *colon = strrchr(argv[1], ':');
    if (!colon || (size_t)(colon - argv[1]) >= sizeof host) {
      fprintf(stderr, "usage: nb_uv_demo [HOST:PORT | --cluster LIST]\n");
      return 2;
    }
    memcpy(host, argv[1], (size_t)(colon - argv[1]));
    rc.host = host;
    rc.port = atoi(colon + 1);
  }
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_FIXED_WINDOW_PER_KEY;
  cfg.redis = &rc;
  tg_uv *u;
  int err = tg_uv_new(&u, uv_default_loop(), &cfg, 1000, 100);
  if (err != TG_OK) {
    fprintf(stderr, "nb_uv_demo: %s\n", tg_strerror(err));
    return 1;
  }
  static tg_uv_req req[CALLS];
  static char keys[KEYS][32];
  tg_quota q = {.limit = LIMIT, .period_ms = 3600000};
  unsigned run = (unsigned)uv_hrtime();
  for (int k = 0; k < KEYS; k++)
    snprintf(keys[k], sizeof keys[k], "run%u:user%d", run, k);
  for (int i = 0; i < CALLS; i++) {
    req[i].nb = (tg_nb_req){.key = keys[i % KEYS],
                            .key_len = strlen(keys[i % KEYS]),
                            .q = &q,
                            .cost = 1};
    if (tg_uv_hit(u, &req[i], decided) != TG_OK)
      return 1;
  }
  printf("%d decisions in flight from one thread\n", CALLS);
  while (answered < CALLS)
    uv_run(uv_default_loop(), UV_RUN_ONCE);
  tg_uv_close(u, NULL, NULL);
  uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  printf("answered %ld: %ld allowed (%d keys x %d), %ld failed\n", answered,
         allowed, KEYS, LIMIT, failed);
  return failed == 0 && allowed == KEYS * LIMIT ? 0 : 1;
}
