/* SPDX-License-Identifier: MIT */
/*
 * serve.c - `tollgate serve`: its options, the store behind it, and the
 * checks it makes before it says "ready".
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
 *
 * The server is one thread, so no request may wait long for a store that
 * does not answer: a shared-memory lock held by a stopped process is waited
 * for --lock-timeout-ms, a Redis server --redis-timeout-ms, and after one
 * such wait the store is tried again only once --backoff-ms has passed;
 * meanwhile requests that need it fail fast (the failure policy answers).
 * The library does this for Redis (its pool goes down for the backoff);
 * for shared memory the server keeps a second attachment of each segment
 * that never waits for a lock and uses it during the backoff (commands.h).
 * One thread was kept, rather than handing store calls to workers, because
 * a decision in memory costs less than a hand-off between threads, and the
 * bound this gives is explicit: at most one wait of the timeout per
 * algorithm per backoff period.
 */
#include "cli.h"
#include "commands.h"
#include "redis_check.h"
#include "server.h"
#include "tollgate.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_PORT 6380
#define DEFAULT_LOCK_TIMEOUT_MS 20
#define DEFAULT_REDIS_TIMEOUT_MS 100
#define DEFAULT_BACKOFF_MS 1000
/* The probe key of the start-up check: read, never written. */
#define PROBE_KEY "tollgate-serve:start-up-check"

/* Where the limiters keep their state. */
typedef enum store_kind {
  STORE_MEMORY, /* the embedded table, private to this process */
  STORE_SHM,    /* named shared-memory segments, see the top of the file */
  STORE_REDIS   /* a Redis server (--redis HOST:PORT or --redis-unix PATH)
                   or a Redis Cluster (--redis-cluster HOST:PORT,...) */
} store_kind;

typedef struct serve_opts {
  server_config srv;
  store_kind store;
  const char *shm;       /* segment name prefix, "/name" */
  tg_redis_config redis; /* --redis*: host, port or socket, prefix, db; the
                            password comes from TOLLGATE_REDIS_PASSWORD */
  char redis_host[256];
  uint64_t capacity;            /* keys per algorithm */
  uint64_t sliding_max_entries; /* per sliding-window key */
  tg_policy policy;
  tg_full on_full;          /* a new key in a full table */
  uint64_t lock_timeout_ms; /* --shm: longest wait for another's lock */
  uint64_t backoff_ms;      /* after a wait that timed out */
  bool require_store;       /* refuse to start unless the store answers */
  uint64_t max_period_ms;   /* 0: none beyond the library's */
  uint64_t new_keys;        /* --max-new-keys-per-client N/MS: N (0: off) */
  uint64_t new_keys_ms;     /* ... and MS */
  const char *pass;         /* --requirepass or TOLLGATE_REQUIREPASS */
} serve_opts;

static void usage(FILE *f) {
  fprintf(f,
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
          "  TG.POLICY key algorithm limit period_ms [BURST n] [COST n] "
          "key ...\n"
          "      -> TG.HIT's six for all the rules at once, then the index of\n"
          "         the rule that denied (-1: none)\n"
          "  AUTH, PING, ECHO, INFO, DBSIZE, QUIT, HELLO 2, COMMAND, CLIENT,\n"
          "  SELECT 0\n"
          "algorithm: fixed_window, fixed_window_per_key, sliding_window,\n"
          "  token_bucket, leaky_bucket\n"
          "\n");
  fprintf(
      f,
      "listening:\n"
      "  --port N                TCP port (default %d; 0: any free port,\n"
      "                          printed when ready)\n"
      "  --bind ADDR             address or host name to listen on (default\n"
      "                          127.0.0.1; a name: every address it resolves\n"
      "                          to). Anything but loopback is reachable from\n"
      "                          other hosts: a warning says so\n"
      "  --unix PATH             also listen on a unix socket; refuses to "
      "start\n"
      "                          if a server answers there, replaces a stale\n"
      "                          socket, removes only its own on exit\n"
      "  --unix-mode MODE        its permissions, octal (default 0600: this\n"
      "                          user only; 0660: the group too)\n"
      "  --no-tcp                listen on the unix socket only\n"
      "  --metrics-port N        also serve Prometheus metrics over plain\n"
      "                          HTTP, GET /metrics, on --bind's first "
      "address\n"
      "                          (0: any free port, printed when ready)\n"
      "  --requirepass PASSWORD  clients must AUTH PASSWORD (or AUTH default\n"
      "                          PASSWORD) first, as with Redis. Better from\n"
      "                          the environment: TOLLGATE_REQUIREPASS (a\n"
      "                          command line is visible in ps)\n"
      "  --max-clients N         connections at once (default 10000)\n"
      "  --idle-timeout-ms MS    close idle connections (default 300000; 0: "
      "never)\n"
      "  --request-timeout-ms MS close a connection whose request stays\n"
      "                          incomplete this long (default 10000; 0: "
      "never)\n"
      "\n",
      DEFAULT_PORT);
  fprintf(
      f,
      "the store:\n"
      "  --capacity N            keys per algorithm (default 65536). Each of\n"
      "                          the 5 tables reserves 55 bytes a key (17.1\n"
      "                          MiB in all at the default), plus, as keys\n"
      "                          come, 256 bytes for each over 24 bytes and,\n"
      "                          sliding_window, a log per key from 64 bytes\n"
      "                          up to 64 + 16 x sliding-max-entries as it\n"
      "                          fills (--shm: all up front, whole logs, as\n"
      "                          address space). Backed only as used\n"
      "  --sliding-max-entries N most entries one sliding_window key keeps\n"
      "                          (default 1024; later ones merge into the\n"
      "                          newest: answers stay on the safe side)\n"
      "  --on-failure POLICY     open (default), closed or error: the answer\n"
      "                          when the store cannot decide (full, busy,\n"
      "                          unreachable); marked degraded in the reply\n"
      "  --on-full refuse|evict  a new key when the table is full and no key\n"
      "                          has decayed: refused (default; --on-failure\n"
      "                          answers) or given the slot of the live key\n"
      "                          closest to fresh\n"
      "  --shm NAME              keep the limits in shared memory segments\n"
      "                          NAME.<algorithm> (NAME like /myapp), shared\n"
      "                          with every process that opens them\n"
      "  --lock-timeout-ms MS    --shm: longest wait for a lock another\n"
      "                          process holds (default %d; 0: never wait)\n"
      "  --redis HOST:PORT       keep the limits in a Redis server (numeric\n"
      "                          or named host), shared by every tollgate "
      "that\n"
      "                          uses it; decisions use its clock (TIME), one\n"
      "                          round trip each. Password: environment\n"
      "                          variable TOLLGATE_REDIS_PASSWORD\n"
      "  --redis-unix PATH       the same over a unix socket\n"
      "  --redis-cluster LIST    the same in a Redis Cluster found from seed\n"
      "                          nodes HOST:PORT,HOST:PORT... (keys routed\n"
      "                          by hash slot, redirections followed)\n"
      "  --redis-prefix P        Redis key prefix (default tg)\n"
      "  --redis-db N            SELECTed database (default 0)\n"
      "  --redis-timeout-ms MS   connect and command timeout (default %d)\n"
      "  --backoff-ms MS         after a lock wait or a Redis call timed out "
      "(or\n"
      "                          a connect failed), requests that need the\n"
      "                          store fail fast this long, then one tries it\n"
      "                          again (default %d). So a stuck store delays\n"
      "                          other clients by at most one timeout per\n"
      "                          algorithm per backoff\n"
      "  --require-store         refuse to start unless the store answers\n"
      "                          (default: start degraded and say so)\n"
      "\n",
      DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_REDIS_TIMEOUT_MS, DEFAULT_BACKOFF_MS);
  fprintf(
      f,
      "what one client may do:\n"
      "  --max-period-ms MS      refuse TG.* requests whose period_ms (for a\n"
      "                          bucket: period_ms x burst / limit, its "
      "refill\n"
      "                          time) is longer: every key is fresh again at\n"
      "                          most MS after its last write (default: none)\n"
      "  --max-new-keys-per-client N/MS\n"
      "                          a client (TCP: its address; unix socket: its\n"
      "                          uid) may create at most N new keys per MS ms\n"
      "                          (a token bucket); beyond, -NEWKEYS replies.\n"
      "                          It bounds how fast a client fills the table,\n"
      "                          not what it keeps. Costs one extra store "
      "read\n"
      "                          per write request\n"
      "\n"
      "It prints 'tollgate serve: ready' once listening, logs the store's\n"
      "health on stderr when it changes, and stops cleanly on SIGTERM or\n"
      "SIGINT (Ctrl-C).\n");
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

/* Parses "N/MS" (both whole numbers, at least 1). */
static int parse_rate(const char *val, uint64_t *n, uint64_t *ms) {
  const char *slash = strchr(val, '/');
  char num[32];
  if (!slash || (size_t)(slash - val) >= sizeof num) {
    fprintf(stderr, "tollgate serve: --max-new-keys-per-client wants N/MS "
                    "(e.g. 1000/60000: 1000 new keys a minute)\n");
    return -1;
  }
  memcpy(num, val, (size_t)(slash - val));
  num[slash - val] = '\0';
  if (opt_u64("serve", "--max-new-keys-per-client N", num, 1, TG_CAPACITY_MAX,
              n) != 0 ||
      opt_u64("serve", "--max-new-keys-per-client MS", slash + 1, 1,
              TG_PERIOD_MAX_MS, ms) != 0)
    return -1;
  return 0;
}

/* --requirepass's value: kept, then blotted out of argv so that ps(1)
 * shows it only for the moment before (TOLLGATE_REQUIREPASS avoids even
 * that). */
static const char *take_secret(char *arg) {
  static char copy[CMD_PASS_MAX + 2];
  snprintf(copy, sizeof copy, "%s", arg);
  memset(arg, 'x', strlen(arg));
  return copy;
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
    } else if (strcmp(argv[i], "--require-store") == 0) {
      o->require_store = true;
    } else if (OPT("--port")) {
      if (r < 0 || opt_u64("serve", "--port", val, 0, 65535, &v) != 0)
        return -1;
      o->srv.port = (int)v;
    } else if (OPT("--metrics-port")) {
      if (r < 0 || opt_u64("serve", "--metrics-port", val, 0, 65535, &v) != 0)
        return -1;
      o->srv.metrics_port = (int)v;
    } else if (OPT("--bind")) {
      if (r < 0)
        return -1;
      o->srv.bind_addr = val;
    } else if (OPT("--unix-mode")) {
      char *end = NULL;
      unsigned long m = r < 0 ? 0 : strtoul(val, &end, 8);
      if (r < 0 || !*val || *end || m > 0777 || (m & 0600) != 0600) {
        fprintf(stderr, "tollgate serve: --unix-mode wants an octal mode "
                        "from 0600 to 0777 (the owner must keep rw)\n");
        return -1;
      }
      o->srv.unix_mode = (unsigned)m;
    } else if (OPT("--unix")) {
      if (r < 0)
        return -1;
      o->srv.unix_path = val;
    } else if (OPT("--requirepass")) {
      if (r < 0)
        return -1;
      /* the value, in place: argv[i] itself, or what follows "=" in it
       * (--requirepass=VALUE), which alone is blotted out */
      o->pass = take_secret(argv[i] + (val - argv[i]));
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
    } else if (OPT("--redis-cluster")) {
      if (r < 0)
        return -1;
      o->redis.cluster_nodes = val; /* checked by tg_limiter_new */
      o->store = STORE_REDIS;
    } else if (OPT("--redis-prefix")) {
      if (r < 0)
        return -1;
      o->redis.key_prefix = val;
    } else if (OPT("--redis-db")) {
      if (r < 0 || opt_u64("serve", "--redis-db", val, 0, 1000000, &v) != 0)
        return -1;
      o->redis.db = (int)v;
    } else if (OPT("--redis-timeout-ms")) {
      if (r < 0 ||
          opt_u64("serve", "--redis-timeout-ms", val, 1, 3600000, &v) != 0)
        return -1;
      o->redis.connect_timeout_ms = o->redis.command_timeout_ms = (uint32_t)v;
    } else if (OPT("--lock-timeout-ms")) {
      if (r < 0 || opt_u64("serve", "--lock-timeout-ms", val, 0, 3600000,
                           &o->lock_timeout_ms) != 0)
        return -1;
    } else if (OPT("--backoff-ms")) {
      if (r < 0 || opt_u64("serve", "--backoff-ms", val, 0, 3600000,
                           &o->backoff_ms) != 0)
        return -1;
    } else if (OPT("--capacity")) {
      if (r < 0 || opt_u64("serve", "--capacity", val, 1, TG_CAPACITY_MAX,
                           &o->capacity) != 0)
        return -1;
    } else if (OPT("--sliding-max-entries")) {
      if (r < 0 ||
          opt_u64("serve", "--sliding-max-entries", val, 1,
                  TG_SLIDING_ENTRIES_MAX, &o->sliding_max_entries) != 0)
        return -1;
    } else if (OPT("--max-period-ms")) {
      if (r < 0 || opt_u64("serve", "--max-period-ms", val, 1, TG_PERIOD_MAX_MS,
                           &o->max_period_ms) != 0)
        return -1;
    } else if (OPT("--max-new-keys-per-client")) {
      if (r < 0 || parse_rate(val, &o->new_keys, &o->new_keys_ms) != 0)
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
    } else if (OPT("--on-full")) {
      if (r < 0)
        return -1;
      if (strcmp(val, "refuse") == 0)
        o->on_full = TG_FULL_REFUSE;
      else if (strcmp(val, "evict") == 0)
        o->on_full = TG_FULL_EVICT;
      else {
        fprintf(stderr, "tollgate serve: --on-full wants refuse or evict\n");
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
  if (o->shm &&
      (o->redis_host[0] || o->redis.unix_path || o->redis.cluster_nodes)) {
    fprintf(stderr, "tollgate serve: --shm and --redis exclude each other\n");
    return -1;
  }
  if (o->redis.cluster_nodes && (o->redis_host[0] || o->redis.unix_path)) {
    fprintf(stderr, "tollgate serve: --redis-cluster excludes --redis and "
                    "--redis-unix\n");
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
  if (o->pass && (!*o->pass || strlen(o->pass) > CMD_PASS_MAX)) {
    fprintf(stderr,
            "tollgate serve: the password (--requirepass or "
            "TOLLGATE_REQUIREPASS) must have 1 to %d bytes\n",
            CMD_PASS_MAX);
    return -1;
  }
  return 0;
}

/* Creates one limiter of algorithm a on the configured store; lock_timeout
 * (shm) as given; `cleaner`: whether it runs the cleaning thread. Prints
 * why on failure and returns NULL. */
static tg_limiter *make_limiter(const serve_opts *o, tg_algorithm a,
                                uint64_t lock_timeout, bool cleaner) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = a;
  cfg.capacity = o->capacity;
  cfg.sliding_max_entries = (uint32_t)o->sliding_max_entries;
  cfg.on_failure = o->policy;
  cfg.on_full = o->on_full;
  cfg.lock_timeout_ms = (uint32_t)lock_timeout;
  if (!cleaner)
    cfg.clean_period_ms = 0;
  char name[256];
  switch (o->store) {
  case STORE_MEMORY:
    break;
  case STORE_SHM:
    snprintf(name, sizeof name, "%s.%s", o->shm, tg_algorithm_name(a));
    cfg.shm_name = name;
    break;
  case STORE_REDIS:
    /* one connection per limiter: the server is one thread */
    cfg.redis = &o->redis;
    break;
  }
  tg_limiter *lim = NULL;
  int rc = tg_limiter_new(&lim, &cfg);
  if (rc != TG_OK) {
    const char *why = tg_last_error();
    fprintf(stderr, "tollgate serve: %s limiter%s%s: %s (%s)%s%s\n",
            tg_algorithm_name(a), o->store == STORE_SHM ? " on segment " : "",
            o->store == STORE_SHM ? name : "", tg_strerror(rc), tg_err_name(rc),
            *why ? ": " : "", why);
    return NULL;
  }
  return lim;
}

static void destroy_limiters(cmd_ctx *ctx) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    tg_limiter_destroy(ctx->lim[a]);
    tg_limiter_destroy(ctx->lim_nowait[a]);
    ctx->lim[a] = ctx->lim_nowait[a] = NULL;
  }
  tg_limiter_destroy(ctx->new_keys);
  ctx->new_keys = NULL;
}

/* Creates the five limiters, with --shm their twins that never wait for a
 * lock, and the new-key budget's. Returns -1 after a message. */
static int make_limiters(const serve_opts *o, cmd_ctx *ctx) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    ctx->lim[a] = make_limiter(o, (tg_algorithm)a, o->lock_timeout_ms, true);
    if (!ctx->lim[a])
      goto fail;
    if (o->store == STORE_SHM && o->lock_timeout_ms > 0) {
      ctx->lim_nowait[a] = make_limiter(o, (tg_algorithm)a, 0, false);
      if (!ctx->lim_nowait[a])
        goto fail;
    }
  }
  if (o->new_keys) {
    /* private to this server, whatever the store: one client's budget is
     * this server's business. Fail closed: a client whose budget cannot be
     * read creates nothing. Capacity: one state per client address still
     * refilling; full buckets are reclaimed first when it runs short. */
    tg_config cfg;
    tg_config_init(&cfg);
    cfg.algorithm = TG_TOKEN_BUCKET;
    cfg.on_failure = TG_POLICY_FAIL_CLOSED;
    cfg.capacity =
        o->srv.max_clients * 2 < 4096 ? 4096 : o->srv.max_clients * 2;
    cfg.key_older_than_ms = 0;
    cfg.clean_period_ms = 10000;
    int rc = tg_limiter_new(&ctx->new_keys, &cfg);
    if (rc != TG_OK) {
      fprintf(stderr, "tollgate serve: the new-key budget: %s\n",
              tg_strerror(rc));
      goto fail;
    }
    ctx->new_keys_q =
        (tg_quota){.limit = o->new_keys, .period_ms = o->new_keys_ms};
  }
  return 0;
fail:
  destroy_limiters(ctx);
  return -1;
}

/* Before "ready": does the store answer? With --redis, a plain connection
 * first (its failure in Redis's words), then one read through every limiter
 * (the library's own path: connection pool, AUTH, SELECT, the script). A
 * failure is fatal with --require-store; otherwise the server starts
 * degraded and says so. Returns the code that starts the health state (0:
 * healthy), or 1 (in *fatal) to stop. */
static int check_store(const serve_opts *o, cmd_ctx *ctx, bool *fatal) {
  *fatal = false;
  int rc = TG_OK;
  char why[512] = "";
  if (o->store == STORE_REDIS && !o->redis.cluster_nodes)
    rc = redis_check(&o->redis, why, sizeof why); /* a Cluster: the reads */
  for (int a = 0; a < TG_ALGORITHM_COUNT && rc == TG_OK; a++) {
    tg_quota q = {.limit = 1, .period_ms = 1000};
    uint64_t at;
    rc = tg_expires_at(ctx->lim[a], PROBE_KEY, sizeof PROBE_KEY - 1, &q, &at);
    if (rc != TG_OK)
      snprintf(why, sizeof why, "a read through the %s limiter: %s (%s)",
               tg_algorithm_name((tg_algorithm)a), tg_strerror(rc),
               tg_err_name(rc));
  }
  if (rc == TG_OK)
    return TG_OK;
  fprintf(stderr, "tollgate serve: store %s: %s\n", ctx->store, why);
  if (o->require_store) {
    fprintf(stderr, "tollgate serve: not starting (--require-store)\n");
    *fatal = true;
    return rc;
  }
  fprintf(stderr,
          "tollgate serve: warning: starting degraded: requests that need "
          "the store are answered by --on-failure %s until it answers\n",
          o->policy == TG_POLICY_FAIL_CLOSED ? "closed"
          : o->policy == TG_POLICY_ERROR     ? "error"
                                             : "open");
  return health_is_failure(rc) ? rc : TG_ESTORE;
}

/* What the store reserves, said once at start: the figure behind
 * --capacity and --sliding-max-entries. */
static void print_memory(const serve_opts *o, const cmd_ctx *ctx) {
  if (o->store == STORE_REDIS)
    return;
  uint64_t bytes = 0;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    bytes += tg_store_bytes(ctx->lim[a]);
  printf("tollgate serve: store %s: 5 tables of %" PRIu64 " keys, %.1f MiB "
         "reserved %s\n",
         ctx->store, o->capacity, (double)bytes / (1024.0 * 1024.0),
         o->store == STORE_MEMORY
             ? "(the slots; long keys and sliding logs add to it as keys "
               "use them)"
             : "(mostly address space, backed as keys are used)");
}

int cmd_serve(int argc, char **argv) {
  serve_opts o = {
      .srv = {.bind_addr = "127.0.0.1",
              .port = DEFAULT_PORT,
              .unix_path = NULL,
              .unix_mode = 0600,
              .max_clients = 10000,
              .idle_timeout_ms = 300000,
              .request_timeout_ms = 10000,
              .shutdown_grace_ms = 2000,
              .metrics_port = -1},
      .store = STORE_MEMORY,
      .shm = NULL,
      .capacity = 65536,
      .sliding_max_entries = 1024,
      .policy = TG_POLICY_FAIL_OPEN,
      .lock_timeout_ms = DEFAULT_LOCK_TIMEOUT_MS,
      .backoff_ms = DEFAULT_BACKOFF_MS,
  };
  tg_redis_config_init(&o.redis);
  o.redis.pool_size = 1; /* the server is one thread */
  o.redis.connect_timeout_ms = DEFAULT_REDIS_TIMEOUT_MS;
  o.redis.command_timeout_ms = DEFAULT_REDIS_TIMEOUT_MS;
  o.redis.password = getenv("TOLLGATE_REDIS_PASSWORD");
  if (o.redis.password && !*o.redis.password)
    o.redis.password = NULL;
  o.pass = getenv("TOLLGATE_REQUIREPASS");
  if (o.pass && !*o.pass)
    o.pass = NULL;
  if (parse_args(argc, argv, &o) != 0) {
    fprintf(stderr, "(tollgate serve --help lists the options)\n");
    return 2;
  }
  o.redis.reconnect_backoff_ms = (uint32_t)o.backoff_ms;
  static cmd_ctx ctx; /* large (the password buffer): not on the stack */
  memset(&ctx, 0, sizeof ctx);
  ctx.policy = o.policy;
  ctx.capacity = o.capacity;
  ctx.backoff_ms = o.backoff_ms;
  ctx.max_period_ms = o.max_period_ms;
  if (o.pass && cmd_set_pass(&ctx, o.pass, strlen(o.pass)) != 0)
    return 2; /* not reached: parse_args checked the length */
  char store[512];
  if (o.store == STORE_SHM)
    snprintf(store, sizeof store, "shm:%s.<algorithm>", o.shm);
  else if (o.store == STORE_REDIS && o.redis.cluster_nodes)
    snprintf(store, sizeof store, "redis-cluster:%s prefix %s",
             o.redis.cluster_nodes, o.redis.key_prefix);
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
  if (make_limiters(&o, &ctx) != 0)
    return 1;
  bool fatal;
  int health = check_store(&o, &ctx, &fatal);
  if (fatal) {
    destroy_limiters(&ctx);
    return 1;
  }
  health_init(&ctx.health, health, cli_mono_ms());
  print_memory(&o, &ctx);
  int rc = server_run(&o.srv, &ctx);
  destroy_limiters(&ctx);
  memset(ctx.pass, 0, sizeof ctx.pass);
  return rc;
}
