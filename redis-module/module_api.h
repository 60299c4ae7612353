/* SPDX-License-Identifier: MIT */
/*
 * module_api.h - the part of the Redis modules API that the tollgate module
 * uses, declared from the API reference (not copied from redismodule.h).
 *
 * Redis hands a module its API as a table of functions it looks up by name:
 * the first word of the context passed to RedisModule_OnLoad is a pointer
 * to RedisModule_GetApi(name, &fnptr). api_init fills the pointers below
 * with it, once, at load. A function the server does not have is left NULL:
 * the optional ones (marked) are checked before each use, the others make
 * the load fail with a message.
 *
 * Header-only (static pointers), included by module.c alone.
 */
#ifndef TG_MODULE_API_H
#define TG_MODULE_API_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Status codes of the API. */
#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
/* The API version a module registers with. */
#define REDISMODULE_APIVER_1 1

/* OpenKey modes. */
#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

/* KeyType answers (the two this module tells apart from the rest). */
#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1

/* Opaque handles the server owns. */
typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;

/* A command's implementation: argv[0] is its name. */
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv,
                                  int argc);

/* ---- the functions (API reference names) ---- */
static int (*RedisModule_GetApi)(const char *name, void *fnptr);
static void (*RedisModule_SetModuleAttribs)(RedisModuleCtx *ctx,
                                            const char *name, int ver,
                                            int apiver);
static int (*RedisModule_IsModuleNameBusy)(const char *name); /* optional */
static int (*RedisModule_CreateCommand)(RedisModuleCtx *ctx, const char *name,
                                        RedisModuleCmdFunc fn,
                                        const char *strflags, int firstkey,
                                        int lastkey, int keystep);
static void (*RedisModule_Log)(RedisModuleCtx *ctx, const char *level,
                               const char *fmt, ...);
static const char *(*RedisModule_StringPtrLen)(const RedisModuleString *s,
                                               size_t *len);
static void *(*RedisModule_OpenKey)(RedisModuleCtx *ctx,
                                    RedisModuleString *name, int mode);
static void (*RedisModule_CloseKey)(RedisModuleKey *key);
static int (*RedisModule_KeyType)(RedisModuleKey *key);
/* Direct access to a string value: READ, or WRITE to change it in place. */
static char *(*RedisModule_StringDMA)(RedisModuleKey *key, size_t *len,
                                      int mode);
/* Resizes a string value (creating it on an empty key), keeping its TTL. */
static int (*RedisModule_StringTruncate)(RedisModuleKey *key, size_t len);
static int (*RedisModule_DeleteKey)(RedisModuleKey *key);
/* TTL relative to now, ms. */
static int (*RedisModule_SetExpire)(RedisModuleKey *key, long long ms);
/* Expiry at an absolute time, ms since the epoch (Redis 6.2.2+; optional). */
static int (*RedisModule_SetAbsExpire)(RedisModuleKey *key, long long at_ms);
static int (*RedisModule_ReplyWithError)(RedisModuleCtx *ctx, const char *err);
static int (*RedisModule_ReplyWithSimpleString)(RedisModuleCtx *ctx,
                                                const char *msg);
static int (*RedisModule_ReplyWithLongLong)(RedisModuleCtx *ctx, long long v);
static int (*RedisModule_ReplyWithArray)(RedisModuleCtx *ctx, long len);
static int (*RedisModule_ReplyWithStringBuffer)(RedisModuleCtx *ctx,
                                                const char *buf, size_t len);
/* Sends a command to the replicas and the AOF in place of the one being
 * run. fmt: one letter per argument: s RedisModuleString *, b a buffer and
 * its length, c a C string, l a long long. */
static int (*RedisModule_Replicate)(RedisModuleCtx *ctx, const char *cmd,
                                    const char *fmt, ...);
static long long (*RedisModule_Milliseconds)(void);
/* The server's clock in us (Redis 7.0+; optional: ms * 1000 without it). */
static long long (*RedisModule_Microseconds)(void);
/* The context's flags (optional: the library's commands then leave the
 * out-of-memory check to the server, before they run). */
static int (*RedisModule_GetContextFlags)(RedisModuleCtx *ctx);
/* ... of which: the server is over maxmemory. */
#define REDISMODULE_CTX_FLAGS_OOM (1 << 10)
/* A string the module owns; with a NULL ctx it lives until FreeString. */
static RedisModuleString *(*RedisModule_CreateString)(RedisModuleCtx *ctx,
                                                      const char *ptr,
                                                      size_t len);
static void (*RedisModule_FreeString)(RedisModuleCtx *ctx,
                                      RedisModuleString *str);
static void *(*RedisModule_Alloc)(size_t bytes);
static void (*RedisModule_Free)(void *ptr);
/* A command registered with "getkeys-api" is called with this true when
 * Redis asks where its keys are; it answers with KeyAtPos, one per key. */
static int (*RedisModule_IsKeysPositionRequest)(RedisModuleCtx *ctx);
static void (*RedisModule_KeyAtPos)(RedisModuleCtx *ctx, int pos);

/* Looks one function up; false when the server does not have it. */
#define API_GET(name)                                                          \
  (RedisModule_GetApi("RedisModule_" #name, &RedisModule_##name) ==            \
   REDISMODULE_OK)

/* Fills every pointer from ctx; returns the name of a required function
 * the server lacks, or NULL when all are there. */
static const char *api_init(RedisModuleCtx *ctx) {
  /* the context's first word is the GetApi function; a data pointer and a
   * function pointer share a representation on every platform Redis runs */
  void *getapi = ((void **)ctx)[0];
  memcpy(&RedisModule_GetApi, &getapi, sizeof getapi);
  (void)API_GET(IsModuleNameBusy);
  (void)API_GET(SetAbsExpire);
  (void)API_GET(Microseconds);
  (void)API_GET(GetContextFlags);
#define REQUIRE(name)                                                          \
  if (!API_GET(name))                                                          \
    return "RedisModule_" #name;
  REQUIRE(SetModuleAttribs)
  REQUIRE(CreateCommand)
  REQUIRE(Log)
  REQUIRE(StringPtrLen)
  REQUIRE(OpenKey)
  REQUIRE(CloseKey)
  REQUIRE(KeyType)
  REQUIRE(StringDMA)
  REQUIRE(StringTruncate)
  REQUIRE(DeleteKey)
  REQUIRE(SetExpire)
  REQUIRE(ReplyWithError)
  REQUIRE(ReplyWithSimpleString)
  REQUIRE(ReplyWithLongLong)
  REQUIRE(ReplyWithArray)
  REQUIRE(ReplyWithStringBuffer)
  REQUIRE(Replicate)
  REQUIRE(Milliseconds)
  REQUIRE(CreateString)
  REQUIRE(FreeString)
  REQUIRE(Alloc)
  REQUIRE(Free)
  REQUIRE(IsKeysPositionRequest)
  REQUIRE(KeyAtPos)
#undef REQUIRE
  return NULL;
}

#endif /* TG_MODULE_API_H */
