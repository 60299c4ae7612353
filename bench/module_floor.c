/* SPDX-License-Identifier: MIT */
/*
 * module_floor.c - a bench-only Redis module (tollgate_floor.so, never
 * installed): what any module command that does what TG.HIT must do costs
 * the server, with none of tollgate's own work. bench/module_bench.sh loads
 * it beside tollgate.so and measures it in the same rounds as INCR and
 * TG.HIT, so the gap between TG.HIT and INCR splits into the part the
 * module API imposes (this floor) and the part tollgate's code adds.
 *
 *   FLOOR.NOOP key   replies 1: the dispatch of a module command
 *   FLOOR.HIT key    opens the key for writing, writes a 20-byte value in
 *                    place (creating it when absent), sets an absolute
 *                    expiry, replicates SET key value PXAT at as TG.HIT
 *                    does, and replies an array of six integers as TG.HIT
 *                    does
 */
#include "../redis-module/module_api.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                              int argc);
EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx);

static RedisModuleString *pxat;

static int noop_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                        int argc) {
  (void)argv;
  (void)argc;
  return RedisModule_ReplyWithLongLong(ctx, 1);
}

static int hit_command(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc) {
  if (argc != 2)
    return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
  static const char value[20] = "0:1234567890123456:";
  RedisModuleKey *key =
      RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
  int type = RedisModule_KeyType(key);
  size_t len = 0;
  if (type != REDISMODULE_KEYTYPE_EMPTY && type != REDISMODULE_KEYTYPE_STRING) {
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithError(ctx, "WRONGTYPE");
  }
  if (type == REDISMODULE_KEYTYPE_EMPTY)
    (void)RedisModule_StringTruncate(key, sizeof value);
  char *p = RedisModule_StringDMA(key, &len, REDISMODULE_WRITE);
  if (p && len == sizeof value)
    memcpy(p, value, sizeof value);
  /* an hour ahead, as the benchmark's fixed window keeps its keys */
  long long at = RedisModule_Milliseconds() + 3600000;
  (void)RedisModule_SetAbsExpire(key, at);
  RedisModule_CloseKey(key);
  RedisModule_Replicate(ctx, "SET", "sbsl", argv[1], value, sizeof value, pxat,
                        at);
  /* the magnitudes of a TG.HIT reply: most are above Redis's shared
   * integers (0..9999), so each is formatted */
  static const long long reply[6] = {1, 1000000000, 999999999, 0, 3599999, 0};
  RedisModule_ReplyWithArray(ctx, 6);
  for (int i = 0; i < 6; i++)
    RedisModule_ReplyWithLongLong(ctx, reply[i]);
  return REDISMODULE_OK;
}

EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                              int argc) {
  (void)argv;
  (void)argc;
  if (api_init(ctx) || !RedisModule_SetAbsExpire)
    return REDISMODULE_ERR;
  RedisModule_SetModuleAttribs(ctx, "tollgate_floor", 1, REDISMODULE_APIVER_1);
  if (RedisModule_CreateCommand(ctx, "floor.noop", noop_command,
                                "readonly fast", 1, 1, 1) != REDISMODULE_OK ||
      RedisModule_CreateCommand(ctx, "floor.hit", hit_command,
                                "write deny-oom fast", 1, 1,
                                1) != REDISMODULE_OK)
    return REDISMODULE_ERR;
  pxat = RedisModule_CreateString(NULL, "PXAT", 4);
  return pxat ? REDISMODULE_OK : REDISMODULE_ERR;
}

EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx) {
  (void)ctx;
  if (pxat)
    RedisModule_FreeString(NULL, pxat);
  pxat = NULL;
  return REDISMODULE_OK;
}
