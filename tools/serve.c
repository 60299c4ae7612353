/*
 * serve.c - `tollgate serve`: its options, and the store behind it.
 *
 * The server holds one limiter per algorithm (a limiter has one algorithm;
 * each TG.* request names the one it wants), all created at start so a bad
 * store configuration fails at once rather than on the first request. They
 * live in the embedded memory store by default, or with --shm NAME in five
 * shared-memory segments NAME.fixed_window ... NAME.leaky_bucket, which any
 * other process on the host (another `tollgate serve`, a program linking
 * libtollgate with shm_name set) can attach to and share the limits of, or
 * with --redis in a Redis server, shared with every tollgate (library or
 * server) on any host that uses the same server and key prefix.
 */
#include "cli.h"
#include "commands.h"
#include "server.h"
#include "tollgate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PORT 6380

/* Where the limiters keep their state. */
typedef enum store_kind {
  STORE_MEMORY, /* the embedded table, private to this process */
  STORE_SHM,    /* named shared-memory segments, see the top of the file */
  STORE_REDIS   /* a Redis server (--redis HOST:PORT or --redis-unix PATH) */
} store_kind;

typedef struct serve_opts {
  server_config srv;
  store_kind store;
  const char *shm;       /* segment name prefix, "/name" */
  tg_redis_config redis; /* --redis*: host, port or socket, prefix, db; the
                            password comes from TOLLGATE_REDIS_PASSWORD */
  char redis_host[256];
  uint64_t capacity; /* keys per algorithm */
  tg_policy policy;
} serve_opts;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tollgate serve [options]\n"
      "\n"
      "Answers rate-limit decisions over the Redis protocol (RESP2): any "
      "Redis\n"
      "client, redis-cli or redis-benchmark can ask it. Commands:\n"
      "  TG.HIT key algorithm limit period_ms [BURST n] [COST n]\n"
      "      -> allowed, count, remaining, retry_after_ms (-1: never),\n"
      "         reset_after_ms, degraded\n"
      "  TG.INC key algorithm limit period_ms [COST n]         -> count\n"
      "  TG.GET key algorithm limit period_ms [BURST n]        -> value\n"
      "  TG.SET key algorithm limit period_ms value [BURST n]  -> OK\n"
      "  TG.EXPIRESAT key algorithm limit period_ms [BURST n]  -> ms or 0\n"
      "  TG.RESET key [algorithm]                              -> OK\n"
      "  PING, ECHO, INFO, DBSIZE, QUIT, HELLO 2, COMMAND, CLIENT, SELECT 0\n"
      "algorithm: fixed_window, fixed_window_per_key, sliding_window,\n"
      "  token_bucket, leaky_bucket\n"
      "\n"
      "options:\n"
      "  --port N                TCP port on the bind address (default %d;\n"
      "                          0: any free port, printed when ready)\n"
      "  --bind ADDR             numeric address to listen on (default "
      "127.0.0.1)\n"
      "  --unix PATH             also listen on a unix socket\n"
      "  --no-tcp                listen on the unix socket only\n"
      "  --shm NAME              keep the limits in shared memory segments\n"
      "                          NAME.<algorithm> (NAME like /myapp), shared\n"
      "                          with every process that opens them\n"
      "  --redis HOST:PORT       keep the limits in a Redis server (numeric\n"
      "                          or named host), shared by every tollgate "
      "that\n"
      "                          uses it; decisions use its clock (TIME), one\n"
      "                          round trip each. Password: environment\n"
      "                          variable TOLLGATE_REDIS_PASSWORD\n"
      "  --redis-unix PATH       the same over a unix socket\n"
      "  --redis-prefix P        Redis key prefix (default tg)\n"
      "  --redis-db N            SELECTed database (default 0)\n"
      "  --capacity N            keys per algorithm (default 65536)\n"
      "  --on-failure POLICY     open (default), closed or error: the answer\n"
      "                          when the store cannot decide (e.g. full)\n"
      "  --max-clients N         connections at once (default 10000)\n"
      "  --idle-timeout-ms MS    close idle connections (default 300000; 0: "
      "never)\n"
      "  --request-timeout-ms MS close a connection whose request stays\n"
      "                          incomplete this long (default 10000; 0: "
      "never)\n"
      "\n"
      "It prints 'tollgate serve: ready' once listening, and stops cleanly on\n"
      "SIGTERM or SIGINT (Ctrl-C).\n",
      DEFAULT_PORT);
}

/* Checks --shm's NAME: "/" then a name short enough for the suffixes. */
static int check_shm_name(const char *name) {
  size_t n = strlen(name);
  if (n < 2 || n > 200 || name[0] != '/' || strchr(name + 1, '/')) {
    fprintf(stderr,
            "tollgate serve: --shm wants a name like /myapp ('/' then 1..199 "
            "bytes without '/'), not '%s'\n",
            name);
    return -1;
  }
  return 0;
}

static int parse_args(int argc, char **argv, serve_opts *o) {
  uint64_t v;
  for (int i = 0; i < argc; i++) {
    const char *val = NULL;
    int r;
#define OPT(name) ((r = opt_value("serve", argc, argv, &i, name, &val)) != 0)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(argv[i], "--no-tcp") == 0) {
      o->srv.port = -1;
    } else if (OPT("--port")) {
      if (r < 0 || opt_u64("serve", "--port", val, 0, 65535, &v) != 0)
        return -1;
      o->srv.port = (int)v;
    } else if (OPT("--bind")) {
      if (r < 0)
        return -1;
      o->srv.bind_addr = val;
    } else if (OPT("--unix")) {
      if (r < 0)
        return -1;
      o->srv.unix_path = val;
    } else if (OPT("--shm")) {
      if (r < 0 || check_shm_name(val) != 0)
        return -1;
      o->store = STORE_SHM;
      o->shm = val;
    } else if (OPT("--redis")) {
      const char *colon = r < 0 ? NULL : strrchr(val, ':');
      if (!colon || colon == val ||
          (size_t)(colon - val) >= sizeof o->redis_host ||
          opt_u64("serve", "--redis port", colon + 1, 1, 65535, &v) != 0) {
        fprintf(stderr, "tollgate serve: --redis wants HOST:PORT\n");
        return -1;
      }
      memcpy(o->redis_host, val, (size_t)(colon - val));
      o->redis_host[colon - val] = '\0';
      o->redis.host = o->redis_host;
      o->redis.port = (int)v;
      o->redis.unix_path = NULL;
      o->store = STORE_REDIS;
    } else if (OPT("--redis-unix")) {
      if (r < 0)
        return -1;
      o->redis.unix_path = val;
      o->store = STORE_REDIS;
    } else if (OPT("--redis-prefix")) {
      if (r < 0)
        return -1;
      o->redis.key_prefix = val;
    } else if (OPT("--redis-db")) {
      if (r < 0 || opt_u64("serve", "--redis-db", val, 0, 1000000, &v) != 0)
        return -1;
      o->redis.db = (int)v;
    } else if (OPT("--capacity")) {
      if (r < 0 || opt_u64("serve", "--capacity", val, 1, UINT64_C(1) << 40,
                           &o->capacity) != 0)
        return -1;
    } else if (OPT("--on-failure")) {
      if (r < 0)
        return -1;
      if (strcmp(val, "open") == 0)
        o->policy = TG_POLICY_FAIL_OPEN;
      else if (strcmp(val, "closed") == 0)
        o->policy = TG_POLICY_FAIL_CLOSED;
      else if (strcmp(val, "error") == 0)
        o->policy = TG_POLICY_ERROR;
      else {
        fprintf(stderr,
                "tollgate serve: --on-failure wants open, closed or error\n");
        return -1;
      }
    } else if (OPT("--max-clients")) {
      if (r < 0 || opt_u64("serve", "--max-clients", val, 1, 1000000,
                           &o->srv.max_clients) != 0)
        return -1;
    } else if (OPT("--idle-timeout-ms")) {
      if (r < 0 || opt_u64("serve", "--idle-timeout-ms", val, 0,
                           UINT64_C(1) << 40, &o->srv.idle_timeout_ms) != 0)
        return -1;
    } else if (OPT("--request-timeout-ms")) {
      if (r < 0 || opt_u64("serve", "--request-timeout-ms", val, 0,
                           UINT64_C(1) << 40, &o->srv.request_timeout_ms) != 0)
        return -1;
    } else {
      fprintf(stderr, "tollgate serve: unknown option '%s'\n", argv[i]);
      return -1;
    }
#undef OPT
  }
  if (o->shm && (o->redis_host[0] || o->redis.unix_path)) {
    fprintf(stderr, "tollgate serve: --shm and --redis exclude each other\n");
    return -1;
  }
  if (o->store == STORE_REDIS && !tg_redis_available()) {
    fprintf(stderr, "tollgate serve: this build has no Redis store (rebuild "
                    "with hiredis: apt-get install libhiredis-dev)\n");
    return -1;
  }
  if (o->srv.port < 0 && !o->srv.unix_path) {
    fprintf(stderr, "tollgate serve: --no-tcp needs --unix PATH\n");
    return -1;
  }
  return 0;
}

/* Creates the five limiters; on failure destroys those made and returns
 * -1 after a message. */
static int make_limiters(const serve_opts *o, tg_limiter *lim[]) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = (tg_algorithm)a;
    cfg.capacity = o->capacity;
    cfg.on_failure = o->policy;
    char name[256];
    switch (o->store) {
    case STORE_MEMORY:
      break;
    case STORE_SHM:
      snprintf(name, sizeof name, "%s.%s", o->shm,
               tg_algorithm_name((tg_algorithm)a));
      cfg.shm_name = name;
      break;
    case STORE_REDIS:
      /* one connection per limiter: the server is one thread */
      cfg.redis = &o->redis;
      break;
    }
    int rc = tg_limiter_new(&lim[a], &cfg);
    if (rc != TG_OK) {
      fprintf(stderr, "tollgate serve: %s limiter: %s (%s)\n",
              tg_algorithm_name((tg_algorithm)a), tg_strerror(rc),
              tg_err_name(rc));
      for (int b = 0; b < a; b++)
        tg_limiter_destroy(lim[b]);
      return -1;
    }
  }
  return 0;
}

int cmd_serve(int argc, char **argv) {
  serve_opts o = {
      .srv = {.bind_addr = "127.0.0.1",
              .port = DEFAULT_PORT,
              .unix_path = NULL,
              .max_clients = 10000,
              .idle_timeout_ms = 300000,
              .request_timeout_ms = 10000,
              .shutdown_grace_ms = 2000},
      .store = STORE_MEMORY,
      .shm = NULL,
      .capacity = 65536,
      .policy = TG_POLICY_FAIL_OPEN,
  };
  tg_redis_config_init(&o.redis);
  o.redis.pool_size = 1; /* the server is one thread */
  o.redis.password = getenv("TOLLGATE_REDIS_PASSWORD");
  if (o.redis.password && !*o.redis.password)
    o.redis.password = NULL;
  if (parse_args(argc, argv, &o) != 0) {
    fprintf(stderr, "(tollgate serve --help lists the options)\n");
    return 2;
  }
  cmd_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.policy = o.policy;
  char store[512];
  if (o.store == STORE_SHM)
    snprintf(store, sizeof store, "shm:%s.<algorithm>", o.shm);
  else if (o.store == STORE_REDIS && o.redis.unix_path)
    snprintf(store, sizeof store, "redis:unix:%s db %d prefix %s",
             o.redis.unix_path, o.redis.db, o.redis.key_prefix);
  else if (o.store == STORE_REDIS)
    snprintf(store, sizeof store, "redis:%s:%d db %d prefix %s", o.redis.host,
             o.redis.port, o.redis.db, o.redis.key_prefix);
  else
    snprintf(store, sizeof store, "memory");
  ctx.store = store;
  ctx.store_time = o.store == STORE_REDIS;
  if (make_limiters(&o, ctx.lim) != 0)
    return 1;
  int rc = server_run(&o.srv, &ctx);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    tg_limiter_destroy(ctx.lim[a]);
  return rc;
}
