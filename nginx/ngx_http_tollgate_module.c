/* SPDX-License-Identifier: MIT */
/*
 * ngx_http_tollgate_module.c - tollgate inside nginx: rate limits on any
 * key, with tollgate's five algorithms, costs per request, several limits
 * decided as one atomic policy, limit_req's burst/delay queue (tollgate's
 * reservations), a dry run, and the RateLimit / Retry-After fields; zones
 * in nginx's shared memory, or in Redis, shared by several nginx hosts.
 *
 *   tollgate_zone KEY zone=NAME:SIZE algorithm=ALG rate=RATE [burst=N];
 *   tollgate_zone KEY zone=NAME algorithm=ALG rate=RATE [burst=N]
 *                 store=redis://HOST[:PORT][/DB] | store=redis+unix:PATH
 *                 | store=redis-cluster://HOST:PORT[,HOST:PORT...]
 *                 [password=P] [timeout=100ms] [on_error=allow|deny];
 *   tollgate zone=NAME [cost=N|cost=$var] [burst=N] [nodelay|delay=N];
 *   tollgate_status CODE;  tollgate_dry_run on|off;
 *   tollgate_log_level info|notice|warn|error;
 *   tollgate_headers off|on|legacy;
 *   $tollgate_status  $tollgate_remaining  $tollgate_retry_after
 *
 * Every zone is one tollgate limiter, created by the master while it reads
 * the configuration, before it forks the workers, which inherit it; its
 * table is in memory every worker shares, so all workers decide on one
 * state. The decision runs in the preaccess phase, as limit_req's does; a
 * delayed request waits on an nginx timer and then runs the phases again,
 * which find it decided. The request's context is also kept as a cleanup
 * of its pool, where an internal redirect (which clears module contexts)
 * does not lose it: a request is decided once, whichever locations it goes
 * through.
 *
 * A Redis zone (see "Redis zones" below) is decided by each worker's
 * client of the non-blocking API, on connections nginx's event loop
 * drives (one to the server, or one per node of a Redis Cluster): the
 * request is parked until the reply comes, then decided as a
 * shared-memory zone's would be. One line is one call (which may delay:
 * limit_req's queue, one reservation; a delayed request whose client
 * leaves keeps its slot, as limit_req's does); several lines are one
 * policy in one command (tg_nb_submit_rules), on zones that share a
 * store= and a key slot; lines that queue make it a policy of
 * reservations, whose delay the request waits (as on shared memory).
 */
#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_md5.h>

#include "tollgate.h"

/* How a `tollgate` line decides. */
typedef enum {
  TG_NGX_HIT = 0, /* allow or reject at once */
  TG_NGX_RESERVE  /* limit_req's queue: wait up to max_wait_ns, or reject */
} tg_ngx_mode;

/* One tollgate_zone. */
typedef struct {
  ngx_str_t name;               /* also NUL-terminated, for the headers */
  ngx_http_complex_value_t key; /* the key, e.g. $binary_remote_addr */
  ngx_int_t key_var; /* the key is one variable: its index (read directly,
                        without the script engine's copy); else -1 */
  tg_algorithm algorithm;
  tg_quota q;           /* rate and burst as the zone line says (burst 0:
                           tollgate's default, = limit) */
  size_t size;          /* bytes of shared memory asked for */
  uint64_t capacity;    /* most keys: what fits in the zone */
  uint32_t log_entries; /* sliding_window: entries per key's log */
  void *region;         /* the table, in the zone (nginx's shared memory) */
  size_t region_bytes;
  struct tg_ngx_main_conf *mcf; /* its clock (tg_ngx_clock) */
  tg_limiter *lim;              /* made by the master in init_zone */
  ngx_shm_zone_t *shm_zone;
  ngx_str_t file; /* where it was defined, for messages */
  ngx_uint_t line;
  /* store=redis (see "Redis zones" below): the zone's state is in Redis,
   * decided through the non-blocking API, one client per worker */
  unsigned redis : 1;
  unsigned cluster : 1; /* store=redis-cluster://...: a Redis Cluster */
  ngx_str_t store;      /* the store= value, for messages */
  ngx_addr_t addr;      /* one server: resolved once, at configuration */
  char *host;           /* for the client: "host" and port, or a path */
  int port;             /* 0: host is a unix socket path */
  int db;               /* SELECTed database (redis://HOST:PORT/DB) */
  char *seeds;          /* a Cluster's: "HOST:PORT,HOST:PORT..." */
  char *password;       /* password=: AUTH */
  char *prefix;         /* key names: "tg:ngx:" and the zone's name */
  ngx_msec_t timeout;   /* timeout=: connect, and replies */
  tg_policy on_error;   /* on_error=allow|deny */
  /* per worker, from init_process to exit_process */
  tg_nb *nb;
  struct tg_ngx_link **links; /* per link of the client (a Cluster's
                                 nodes), made when the client first wants
                                 it */
  ngx_uint_t nlinks, links_cap;
  ngx_event_t retry_ev; /* a link's state could not be allocated: its
                           node is down until this fires */
  ngx_event_t tick_ev;  /* the client's timer (tg_nb_timeout): a policy
                           waiting out a Cluster slot's migration */
  unsigned pumping : 1;
  unsigned pump_again : 1;
  ngx_queue_t pending; /* of tg_ngx_pending: submitted, not done */
} tg_ngx_zone;

/* One connection of a Redis zone's client in a worker: to its server, or
 * to one node of its Cluster (link id of the tg_nb). */
typedef struct tg_ngx_link {
  tg_ngx_zone *zone;
  unsigned id;
  ngx_str_t name;   /* "host:port" or the store= value, for messages */
  ngx_addr_t *addr; /* NULL until resolved (a Cluster's nodes) */
  ngx_connection_t *conn;
  unsigned connecting : 1; /* connect() in progress */
  unsigned heard : 1;      /* a decision was answered on the connection */
  ngx_msec_t backoff;      /* the last wait before trying a down node */
  ngx_event_t backoff_ev;  /* then tg_nb_up */
} tg_ngx_link;

/* One `tollgate` line. */
typedef struct {
  ngx_str_t zone_name;
  tg_ngx_zone *zone;                 /* found when the block is merged */
  uint64_t cost;                     /* when cost_cv is NULL */
  ngx_http_complex_value_t *cost_cv; /* cost=$var */
  ngx_int_t burst;                   /* -1: not given */
  ngx_int_t delay;                   /* -1: not given */
  ngx_flag_t nodelay;
  tg_quota q; /* the quota this line decides with */
  tg_ngx_mode mode;
  uint64_t max_wait_ns; /* TG_NGX_RESERVE: exactly (B - D) * T */
  ngx_str_t file;
  ngx_uint_t line;
  unsigned resolved : 1;
} tg_ngx_limit;

#define TG_NGX_HEADERS_OFF 0
#define TG_NGX_HEADERS_ON 1
#define TG_NGX_HEADERS_LEGACY 2

typedef struct {
  ngx_array_t *limits; /* of tg_ngx_limit; NULL: none here */
  ngx_flag_t queues;   /* a line is TG_NGX_RESERVE (set when merged) */
  ngx_uint_t status;
  ngx_flag_t dry_run;
  ngx_uint_t log_level;
  ngx_uint_t delay_log_level;
  ngx_uint_t headers;
} tg_ngx_loc_conf;

typedef struct tg_ngx_main_conf {
  ngx_array_t zones; /* of tg_ngx_zone * */
  /* The time of every shared-memory zone (tg_ngx_clock): a word in a small
   * shared-memory zone of its own, made with the first such zone; NULL
   * until that zone is initialised. */
  ngx_shm_zone_t *clock_zone;
  uint64_t *clock;
} tg_ngx_main_conf;

typedef struct tg_ngx_pending tg_ngx_pending;

/* What became of a request: $tollgate_status. */
typedef enum {
  TG_NGX_UNDECIDED = 0,
  TG_NGX_PASSED,
  TG_NGX_DELAYED,
  TG_NGX_REJECTED,
  TG_NGX_DELAYED_DRY_RUN,
  TG_NGX_REJECTED_DRY_RUN,
  TG_NGX_FAILED /* the store failed; the failure policy answered */
} tg_ngx_state;

static ngx_str_t state_names[] = {
    ngx_null_string,
    ngx_string("PASSED"),
    ngx_string("DELAYED"),
    ngx_string("REJECTED"),
    ngx_string("DELAYED_DRY_RUN"),
    ngx_string("REJECTED_DRY_RUN"),
    ngx_string("FAILED"),
};

/* The request's decision, kept until its pool is destroyed. */
typedef struct {
  tg_ngx_state state;
  ngx_uint_t headers; /* the deciding location's tollgate_headers */
  ngx_uint_t n;       /* rules decided */
  tg_rule *rules;     /* n of them: keys, quotas, each rule's result */
  tg_ngx_limit **limits;
  tg_rules_result rr;      /* the policy's answer (rr.r) */
  tg_reservation *res;     /* a location with a TG_NGX_RESERVE line: the
                              receipt of each rule */
  ngx_uint_t delayed_by;   /* the rule whose delay the request waits */
  unsigned waiting : 1;    /* delayed and not yet resumed: cancel if the
                              request ends first */
  tg_ngx_pending *pending; /* a Redis zone's decision not yet answered */
  unsigned resume : 1;     /* answered: resume_rc is the handler's return,
                              once, when the phases run again */
  ngx_int_t resume_rc;
} tg_ngx_ctx;

/* A Redis zone's decision in flight: the worker's memory (not the
 * request's pool), so the request may end first; it then only detaches
 * (ctx NULL), and the answer, when it comes, is dropped. */
struct tg_ngx_pending {
  tg_nb_req req;
  ngx_queue_t queue; /* in the zone's pending */
  ngx_http_request_t *r;
  tg_ngx_loc_conf *lcf;
  tg_ngx_ctx *ctx;     /* NULL: the request ended */
  unsigned parked : 1; /* the handler returned NGX_AGAIN: resume it */
  ngx_uint_t n;        /* > 1: a policy of n rules (nr, keys after it) */
  tg_nb_rule *nr;
  u_char key[TG_KEY_MAX];
};

static ngx_int_t tg_ngx_preconfiguration(ngx_conf_t *cf);
static ngx_int_t tg_ngx_postconfiguration(ngx_conf_t *cf);
static void *tg_ngx_create_main_conf(ngx_conf_t *cf);
static void *tg_ngx_create_loc_conf(ngx_conf_t *cf);
static char *tg_ngx_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child);
static char *tg_ngx_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
                                   void *conf);
static char *tg_ngx_limit_directive(ngx_conf_t *cf, ngx_command_t *cmd,
                                    void *conf);
static ngx_int_t tg_ngx_init_process(ngx_cycle_t *cycle);
static void tg_ngx_exit_process(ngx_cycle_t *cycle);
static char *tg_ngx_set_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *tg_ngx_set_enum(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

static ngx_conf_enum_t tg_ngx_log_levels[] = {
    {ngx_string("info"), NGX_LOG_INFO},
    {ngx_string("notice"), NGX_LOG_NOTICE},
    {ngx_string("warn"), NGX_LOG_WARN},
    {ngx_string("error"), NGX_LOG_ERR},
    {ngx_null_string, 0}};

static ngx_conf_enum_t tg_ngx_header_modes[] = {
    {ngx_string("off"), TG_NGX_HEADERS_OFF},
    {ngx_string("on"), TG_NGX_HEADERS_ON},
    {ngx_string("legacy"), TG_NGX_HEADERS_LEGACY},
    {ngx_null_string, 0}};

static ngx_command_t tg_ngx_commands[] = {
    {ngx_string("tollgate_zone"), NGX_HTTP_MAIN_CONF | NGX_CONF_2MORE,
     tg_ngx_zone_directive, 0, 0, NULL},
    {ngx_string("tollgate"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_1MORE,
     tg_ngx_limit_directive, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL},
    {ngx_string("tollgate_status"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     tg_ngx_set_status, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(tg_ngx_loc_conf, status), NULL},
    {ngx_string("tollgate_dry_run"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_FLAG,
     ngx_conf_set_flag_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(tg_ngx_loc_conf, dry_run), NULL},
    {ngx_string("tollgate_log_level"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     tg_ngx_set_enum, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(tg_ngx_loc_conf, log_level), &tg_ngx_log_levels},
    {ngx_string("tollgate_headers"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     tg_ngx_set_enum, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(tg_ngx_loc_conf, headers), &tg_ngx_header_modes},
    ngx_null_command};

static ngx_http_module_t tg_ngx_module_ctx = {
    tg_ngx_preconfiguration,  /* preconfiguration */
    tg_ngx_postconfiguration, /* postconfiguration */
    tg_ngx_create_main_conf,  /* create main configuration */
    NULL,                     /* init main configuration */
    NULL,                     /* create server configuration */
    NULL,                     /* merge server configuration */
    tg_ngx_create_loc_conf,   /* create location configuration */
    tg_ngx_merge_loc_conf     /* merge location configuration */
};

ngx_module_t ngx_http_tollgate_module = {NGX_MODULE_V1,
                                         &tg_ngx_module_ctx,
                                         tg_ngx_commands,
                                         NGX_HTTP_MODULE,
                                         NULL,
                                         NULL,
                                         tg_ngx_init_process,
                                         NULL,
                                         NULL,
                                         tg_ngx_exit_process,
                                         NULL,
                                         NGX_MODULE_V1_PADDING};

static ngx_http_output_header_filter_pt next_header_filter;

/* ---- configuration --------------------------------------------------- */

/* Zone names become the RateLimit fields' policy names: keep them to
 * characters any header parser takes. */
static ngx_int_t zone_name_ok(ngx_str_t *name) {
  if (name->len == 0 || name->len > 64)
    return 0;
  for (size_t i = 0; i < name->len; i++) {
    u_char c = name->data[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return 0;
  }
  return 1;
}

/* "10r/s", "600r/m", "5r/h", "100r/d", or "N/TIME" with TIME in nginx's
 * time syntax ("100/30s", "1000/1h", "5/1500ms"): limit and period_ms. */
static ngx_int_t parse_rate(ngx_str_t *v, tg_quota *q) {
  u_char *slash = ngx_strlchr(v->data, v->data + v->len, '/');
  if (slash == NULL || slash == v->data)
    return NGX_ERROR;
  size_t nlen = (size_t)(slash - v->data);
  ngx_int_t per_r = v->data[nlen - 1] == 'r';
  if (per_r)
    nlen--;
  off_t n = ngx_atoof(v->data, nlen);
  if (n <= 0)
    return NGX_ERROR;
  ngx_str_t unit = {v->len - (size_t)(slash + 1 - v->data), slash + 1};
  uint64_t period_ms;
  if (unit.len == 1 && unit.data[0] == 's')
    period_ms = 1000;
  else if (unit.len == 1 && unit.data[0] == 'm')
    period_ms = 60000;
  else if (unit.len == 1 && unit.data[0] == 'h')
    period_ms = 3600000;
  else if (unit.len == 1 && unit.data[0] == 'd')
    period_ms = 86400000;
  else if (per_r)
    return NGX_ERROR;
  else {
    ngx_int_t ms = ngx_parse_time(&unit, 0);
    if (ms == NGX_ERROR || ms <= 0)
      return NGX_ERROR;
    period_ms = (uint64_t)ms;
  }
  q->limit = (uint64_t)n;
  q->period_ms = period_ms;
  return NGX_OK;
}

static ngx_int_t parse_algorithm(ngx_str_t *v, tg_algorithm *alg) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    const char *name = tg_algorithm_name((tg_algorithm)a);
    if (ngx_strlen(name) == v->len && ngx_strncmp(name, v->data, v->len) == 0) {
      *alg = (tg_algorithm)a;
      return NGX_OK;
    }
  }
  return NGX_ERROR;
}

static ngx_int_t is_bucket(tg_algorithm alg) {
  return alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET;
}

static ngx_int_t tg_ngx_init_zone(ngx_shm_zone_t *shm_zone, void *data);

/* The shared-memory zones' clock: nginx's cached time (the moment the
 * worker's event-loop turn began, to the millisecond, as limit_req reads
 * it: no system call per request), made one timeline for all the workers
 * and all the zones by tg_clock_latest, with one word for every zone (a
 * location's lines are one policy, decided at one time: a word per zone
 * would leave a zone's state written at another zone's later time): a
 * worker whose turn began before another's decides at the other's time,
 * never on a state written "later" than its own time (which would make a
 * bucket look fuller to it). */
static uint64_t tg_ngx_clock(void *conf) {
  const tg_ngx_main_conf *mcf = conf;
  ngx_time_t *tp = ngx_timeofday();
  return tg_clock_latest(mcf->clock, (uint64_t)tp->sec * 1000000u +
                                         (uint64_t)tp->msec * 1000u);
}

/* The clock's zone: its word, kept across a reload. */
static ngx_int_t tg_ngx_init_clock(ngx_shm_zone_t *shm_zone, void *data) {
  tg_ngx_main_conf *mcf = shm_zone->data;
  tg_ngx_main_conf *old = data;
  ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)shm_zone->shm.addr;
  if (old) {
    mcf->clock = old->clock;
  } else if (shm_zone->shm.exists) {
    mcf->clock = shpool->data; /* Windows: mapped again, already made */
  } else {
    mcf->clock = ngx_slab_calloc(shpool, 64);
    if (mcf->clock == NULL)
      return NGX_ERROR;
    shpool->data = mcf->clock;
  }
  return NGX_OK;
}

static void zone_config(const tg_ngx_zone *z, tg_config *cfg) {
  tg_config_init(cfg);
  cfg->clock = tg_ngx_clock;
  cfg->clock_ctx = z->mcf;
  cfg->algorithm = z->algorithm;
  cfg->capacity = z->capacity;
  /* keys of more than 24 bytes take a 256-byte chunk each, counted in the
   * zone's size: a quarter of the keys may be that long ($binary_remote_addr
   * never is) */
  cfg->long_keys = z->capacity / 4 ? z->capacity / 4 : 1;
  cfg->sliding_max_entries = z->log_entries;
  /* no thread: the master forks the workers; worker 0 cleans on a timer */
  cfg->clean_period_ms = 0;
}

/* How many keys the zone holds (about 128 bytes each): the most whose
 * table fits in what nginx's
 * slab pool leaves of the zone (its header and a page descriptor per page,
 * counted generously), in whole pages. A sliding log keeps up to `limit`
 * entries (at most 1024): enough that entries never merge, so the window is
 * exact. */
static ngx_int_t size_zone(ngx_conf_t *cf, tg_ngx_zone *z) {
  size_t pages = z->size / ngx_pagesize;
  size_t overhead = 8 * ngx_pagesize + pages * 2 * sizeof(ngx_slab_page_t);
  size_t usable = z->size > overhead ? z->size - overhead : 0;
  usable -= usable % ngx_pagesize;
  z->log_entries = z->algorithm == TG_SLIDING_WINDOW && z->q.limit < 1024
                       ? (uint32_t)z->q.limit
                       : 1024;
  tg_config cfg;
  uint64_t lo = 0, hi = usable / 48 + 1; /* a key needs a 48-byte slot */
  while (lo + 1 < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    z->capacity = mid;
    zone_config(z, &cfg);
    size_t need = tg_region_bytes(&cfg);
    if (need != 0 && need <= usable)
      lo = mid;
    else
      hi = mid;
  }
  if (lo < 16) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: zone \"%V\" is too small for %s: it "
                       "would hold %uL keys",
                       &z->name, tg_algorithm_name(z->algorithm), lo);
    return NGX_ERROR;
  }
  z->capacity = lo;
  zone_config(z, &cfg);
  z->region_bytes = tg_region_bytes(&cfg);
  return NGX_OK;
}

static void tg_ngx_zone_cleanup(void *data) {
  tg_ngx_zone *z = data;
  tg_limiter_destroy(z->lim);
  z->lim = NULL;
}

/* A Redis zone's client configuration (rc is filled too: cfg points to
 * it). The client is one worker's, driven by nginx's events: no thread. */
static void redis_config(const tg_ngx_zone *z, tg_config *cfg,
                         tg_redis_config *rc) {
  tg_config_init(cfg);
  cfg->algorithm = z->algorithm;
  cfg->sliding_max_entries = z->log_entries;
  cfg->on_failure = z->on_error;
  cfg->clean_period_ms = 0;
  tg_redis_config_init(rc);
  if (z->cluster) {
    rc->cluster_nodes = z->seeds;
  } else if (z->port == 0) {
    rc->unix_path = z->host;
  } else {
    rc->host = z->host;
    rc->port = z->port;
  }
  rc->db = z->db;
  rc->password = z->password;
  rc->key_prefix = z->prefix;
  cfg->redis = rc;
}

static char *conf_cstr(ngx_conf_t *cf, u_char *p, size_t len) {
  char *c = ngx_pnalloc(cf->pool, len + 1);
  if (c) {
    ngx_memcpy(c, p, len);
    c[len] = '\0';
  }
  return c;
}

/* store=redis-cluster://HOST:PORT[,HOST:PORT...]: the seeds, each
 * resolved now so that a bad one fails the configuration (the client
 * resolves them again, and the nodes the Cluster names, when it first
 * connects to each). */
static ngx_int_t parse_cluster(ngx_conf_t *cf, tg_ngx_zone *z, ngx_str_t *v) {
  u_char *p = v->data + 16, *end = v->data + v->len;
  while (p <= end) {
    u_char *comma = ngx_strlchr(p, end, ',');
    u_char *e = comma ? comma : end;
    ngx_url_t u;
    ngx_memzero(&u, sizeof(u));
    u.url.data = p;
    u.url.len = (size_t)(e - p);
    if (u.url.len == 0 || ngx_parse_url(cf->pool, &u) != NGX_OK ||
        u.naddrs == 0 || u.family == AF_UNIX || u.port == 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: invalid seed \"%*s\" in \"store=%V\""
                         " (redis-cluster://HOST:PORT[,HOST:PORT...]): %s",
                         u.url.len, p, v,
                         u.url.len == 0        ? "empty"
                         : u.err               ? u.err
                         : u.family == AF_UNIX ? "a Cluster is reached by TCP"
                         : u.port == 0 && u.naddrs ? "a port is needed"
                                                   : "no address");
      return NGX_ERROR;
    }
    p = e + 1;
  }
  z->seeds = conf_cstr(cf, v->data + 16, v->len - 16);
  z->store = *v;
  z->redis = 1;
  z->cluster = 1;
  return z->seeds ? NGX_OK : NGX_ERROR;
}

/* store=redis://HOST[:PORT][/DB] or store=redis+unix:PATH: the address,
 * resolved now (as upstream servers are), and the client's settings. */
static ngx_int_t parse_store(ngx_conf_t *cf, tg_ngx_zone *z, ngx_str_t *v) {
  ngx_url_t u;
  ngx_memzero(&u, sizeof(u));
  u.default_port = 6379;
  if (v->len > 16 && ngx_strncmp(v->data, "redis-cluster://", 16) == 0)
    return parse_cluster(cf, z, v);
  if (v->len > 8 && ngx_strncmp(v->data, "redis://", 8) == 0) {
    u_char *p = v->data + 8, *end = v->data + v->len;
    u_char *slash = ngx_strlchr(p, end, '/');
    if (slash) {
      ngx_int_t db = ngx_atoi(slash + 1, (size_t)(end - slash - 1));
      if (db == NGX_ERROR || db > 1000000) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid database in \"store=%V\" "
                           "(redis://HOST:PORT/DB, DB a number)",
                           v);
        return NGX_ERROR;
      }
      z->db = (int)db;
      end = slash;
    }
    u.url.data = p;
    u.url.len = (size_t)(end - p);
  } else if (v->len > 11 && ngx_strncmp(v->data, "redis+unix:", 11) == 0) {
    /* nginx's own spelling of a socket: "unix:PATH" */
    u.url.len = v->len - 11 + 5;
    u.url.data = ngx_pnalloc(cf->pool, u.url.len);
    if (u.url.data == NULL)
      return NGX_ERROR;
    ngx_memcpy(ngx_cpymem(u.url.data, "unix:", 5), v->data + 11, v->len - 11);
  } else {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: invalid \"store=%V\" (redis://HOST:"
                       "PORT[/DB], redis+unix:PATH or redis-cluster://HOST:"
                       "PORT[,HOST:PORT...])",
                       v);
    return NGX_ERROR;
  }
  if (u.url.len == 0 || ngx_parse_url(cf->pool, &u) != NGX_OK ||
      u.naddrs == 0) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: invalid \"store=%V\": %s", v,
                       u.err ? u.err : "no address");
    return NGX_ERROR;
  }
  z->addr = u.addrs[0];
  if (u.family == AF_UNIX) {
    z->host = conf_cstr(cf, v->data + 11, v->len - 11);
    z->port = 0;
  } else {
    z->host = conf_cstr(cf, u.host.data, u.host.len);
    z->port = u.port ? u.port : 6379;
  }
  z->store = *v;
  z->redis = 1;
  return z->host ? NGX_OK : NGX_ERROR;
}

/* The index of the variable a key made of exactly one variable names
 * ("$name" or "${name}"; not a regex capture such as "$1"), or -1 when the
 * key is anything else. Such a key is read with ngx_http_get_flushed_variable
 * (what the script engine does, without its length pass and copy). */
static ngx_int_t one_variable(ngx_conf_t *cf, ngx_str_t *v) {
  if (v->len < 2 || v->data[0] != '$')
    return -1;
  ngx_str_t name = {v->len - 1, v->data + 1};
  if (name.data[0] == '{') {
    if (name.len < 3 || name.data[name.len - 1] != '}')
      return -1;
    name.data++;
    name.len -= 2;
  }
  if (name.data[0] >= '0' && name.data[0] <= '9')
    return -1;
  for (size_t i = 0; i < name.len; i++) {
    u_char ch = name.data[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch >= '0' && ch <= '9') || ch == '_'))
      return -1;
  }
  ngx_int_t index = ngx_http_get_variable_index(cf, &name);
  return index == NGX_ERROR ? -1 : index;
}

/* The name of parameter v: up to its "=" included, or the whole word. */
static size_t param_name_len(const ngx_str_t *v) {
  u_char *eq = ngx_strlchr(v->data, v->data + v->len, '=');
  return eq ? (size_t)(eq - v->data) + 1 : v->len;
}

/* Refuses value[i] when a parameter of the same name came before it, from
 * value[from] on: the second would silently replace the first. */
static ngx_int_t given_twice(ngx_conf_t *cf, const char *directive,
                             const ngx_str_t *value, ngx_uint_t from,
                             ngx_uint_t i) {
  size_t n = param_name_len(&value[i]);
  for (ngx_uint_t j = from; j < i; j++)
    if (param_name_len(&value[j]) == n &&
        ngx_strncmp(value[j].data, value[i].data, n) == 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%s: \"%*s\" is given twice",
                         directive, n, value[i].data);
      return NGX_ERROR;
    }
  return NGX_OK;
}

/* tollgate_zone KEY zone=NAME:SIZE algorithm=ALG rate=RATE [burst=N]
 *   [store=redis://HOST:PORT[/DB] | store=redis+unix:PATH |
 *    store=redis-cluster://HOST:PORT[,HOST:PORT...]] [password=P]
 *   [timeout=TIME] [on_error=allow|deny] */
static char *tg_ngx_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
                                   void *conf) {
  tg_ngx_main_conf *mcf =
      ngx_http_conf_get_module_main_conf(cf, ngx_http_tollgate_module);
  ngx_str_t *value = cf->args->elts;
  tg_ngx_zone *z = ngx_pcalloc(cf->pool, sizeof(*z));
  if (z == NULL)
    return NGX_CONF_ERROR;
  z->mcf = mcf;
  z->algorithm = TG_FIXED_WINDOW;
  z->timeout = 100;
  z->on_error = TG_POLICY_FAIL_OPEN;
  ngx_str_t zone_arg = ngx_null_string;
  /* what only a Redis zone takes, as written (refused below on a
   * shared-memory zone, whatever the value) */
  bool redis_opt = false;
  ssize_t size = 0; /* checked once store= is known: a Redis zone ignores it */
  z->file = cf->conf_file->file.name;
  z->line = cf->conf_file->line;

  /* the KEY comes first: a parameter in its place (the key forgotten, or
   * written after the parameters) would be one constant key, one limit
   * for every client, under the default algorithm */
  static const char *const params[] = {
      "zone=",  "rate=",    "algorithm=", "burst=",
      "store=", "timeout=", "password=",  "on_error="};
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    size_t n = ngx_strlen(params[i]);
    if (value[1].len >= n && ngx_strncmp(value[1].data, params[i], n) == 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: the first parameter is the key, "
                         "and \"%V\" is a parameter (tollgate_zone KEY "
                         "zone=NAME:SIZE rate=R ...)",
                         &value[1]);
      return NGX_CONF_ERROR;
    }
  }
  ngx_http_compile_complex_value_t ccv;
  ngx_memzero(&ccv, sizeof(ccv));
  ccv.cf = cf;
  ccv.value = &value[1];
  ccv.complex_value = &z->key;
  if (ngx_http_compile_complex_value(&ccv) != NGX_OK)
    return NGX_CONF_ERROR;
  z->key_var = one_variable(cf, &value[1]);

  for (ngx_uint_t i = 2; i < cf->args->nelts; i++) {
    ngx_str_t *v = &value[i];
    if (given_twice(cf, "tollgate_zone", value, 2, i) != NGX_OK)
      return NGX_CONF_ERROR;
    if (ngx_strncmp(v->data, "zone=", 5) == 0) {
      u_char *colon = ngx_strlchr(v->data + 5, v->data + v->len, ':');
      z->name.data = v->data + 5;
      z->name.len = (size_t)((colon ? colon : v->data + v->len) - z->name.data);
      if (!zone_name_ok(&z->name)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid zone name \"%V\" (1-64 "
                           "letters, digits, \"_\", \"-\" or \".\")",
                           &z->name);
        return NGX_CONF_ERROR;
      }
      zone_arg = *v; /* named in a size error below */
      if (colon == NULL)
        continue; /* a Redis zone needs no size: checked below */
      ngx_str_t s = {(size_t)(v->data + v->len - colon - 1), colon + 1};
      size = s.len ? ngx_parse_size(&s) : NGX_ERROR;
      if (size == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid zone size in \"%V\" "
                           "(zone=NAME:SIZE, e.g. zone=api:10m)",
                           v);
        return NGX_CONF_ERROR;
      }
    } else if (ngx_strncmp(v->data, "algorithm=", 10) == 0) {
      ngx_str_t a = {v->len - 10, v->data + 10};
      if (parse_algorithm(&a, &z->algorithm) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: unknown algorithm \"%V\" (one of "
                           "fixed_window, fixed_window_per_key, "
                           "sliding_window, token_bucket, leaky_bucket)",
                           &a);
        return NGX_CONF_ERROR;
      }
    } else if (ngx_strncmp(v->data, "rate=", 5) == 0) {
      ngx_str_t r = {v->len - 5, v->data + 5};
      if (parse_rate(&r, &z->q) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid rate \"%V\" (e.g. 10r/s, "
                           "600r/m, or N/TIME as 100/30s)",
                           &r);
        return NGX_CONF_ERROR;
      }
    } else if (ngx_strncmp(v->data, "burst=", 6) == 0) {
      off_t b = ngx_atoof(v->data + 6, v->len - 6);
      if (b <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid burst \"%V\"", v);
        return NGX_CONF_ERROR;
      }
      z->q.burst = (uint64_t)b;
    } else if (ngx_strncmp(v->data, "store=", 6) == 0) {
      ngx_str_t st = {v->len - 6, v->data + 6};
      if (parse_store(cf, z, &st) != NGX_OK)
        return NGX_CONF_ERROR;
    } else if (ngx_strncmp(v->data, "password=", 9) == 0 && v->len > 9) {
      z->password = conf_cstr(cf, v->data + 9, v->len - 9);
      if (z->password == NULL)
        return NGX_CONF_ERROR;
      redis_opt = true;
    } else if (ngx_strncmp(v->data, "timeout=", 8) == 0) {
      ngx_str_t t = {v->len - 8, v->data + 8};
      ngx_int_t ms = ngx_parse_time(&t, 0);
      if (ms == NGX_ERROR || ms <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate_zone: invalid timeout \"%V\" (e.g. "
                           "timeout=100ms)",
                           &t);
        return NGX_CONF_ERROR;
      }
      z->timeout = (ngx_msec_t)ms;
      redis_opt = true;
    } else if (v->len == 14 &&
               ngx_strncmp(v->data, "on_error=allow", 14) == 0) {
      z->on_error = TG_POLICY_FAIL_OPEN;
      redis_opt = true;
    } else if (v->len == 13 && ngx_strncmp(v->data, "on_error=deny", 13) == 0) {
      z->on_error = TG_POLICY_FAIL_CLOSED;
      redis_opt = true;
    } else if (ngx_strncmp(v->data, "on_error=", 9) == 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: invalid \"%V\" (on_error=allow or "
                         "on_error=deny)",
                         v);
      return NGX_CONF_ERROR;
    } else {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: invalid parameter \"%V\"", v);
      return NGX_CONF_ERROR;
    }
  }
  if (!z->redis && size > 0 && size < (ssize_t)(16 * ngx_pagesize)) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: zone \"%V\" is too small: at "
                       "least %uzk",
                       &z->name, (size_t)(16 * ngx_pagesize) / 1024);
    return NGX_CONF_ERROR;
  }
  if (!z->redis)
    z->size = (size_t)size;
  if (z->name.len && z->size == 0 && !z->redis) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: invalid zone size in \"%V\" "
                       "(zone=NAME:SIZE, e.g. zone=api:10m, or a zone with "
                       "store=redis://...)",
                       &zone_arg);
    return NGX_CONF_ERROR;
  }
  if (z->name.len == 0) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: \"zone=NAME:SIZE\" is required");
    return NGX_CONF_ERROR;
  }
  if (!z->redis && redis_opt) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: \"password=\", \"timeout=\" and "
                       "\"on_error=\" are for a zone with \"store=redis://"
                       "...\"");
    return NGX_CONF_ERROR;
  }
  if (z->q.limit == 0) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: \"rate=\" is required");
    return NGX_CONF_ERROR;
  }
  if (z->q.burst && !is_bucket(z->algorithm)) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: \"burst=\" needs algorithm="
                       "token_bucket or leaky_bucket");
    return NGX_CONF_ERROR;
  }
  int qrc = tg_quota_check(z->algorithm, &z->q);
  if (qrc != 0) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "tollgate_zone: zone \"%V\": %s",
                       &z->name, tg_strerror(qrc));
    return NGX_CONF_ERROR;
  }

  tg_ngx_zone **zp = mcf->zones.elts;
  for (ngx_uint_t i = 0; i < mcf->zones.nelts; i++) {
    if (zp[i]->name.len == z->name.len &&
        ngx_strncmp(zp[i]->name.data, z->name.data, z->name.len) == 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: zone \"%V\" is already defined in "
                         "%V:%ui",
                         &z->name, &zp[i]->file, zp[i]->line);
      return NGX_CONF_ERROR;
    }
  }
  if (!z->redis && size_zone(cf, z) != NGX_OK)
    return NGX_CONF_ERROR;

  /* NUL-terminated copy: the headers want a C string */
  u_char *name = ngx_pnalloc(cf->pool, z->name.len + 1);
  if (name == NULL)
    return NGX_CONF_ERROR;
  ngx_memcpy(name, z->name.data, z->name.len);
  name[z->name.len] = '\0';
  z->name.data = name;

  if (z->redis) {
    /* no shared memory: every worker (of every host) has a client */
    z->log_entries = z->algorithm == TG_SLIDING_WINDOW && z->q.limit < 1024
                         ? (uint32_t)z->q.limit
                         : 1024;
    z->prefix = ngx_pnalloc(cf->pool, 7 + z->name.len + 1);
    if (z->prefix == NULL)
      return NGX_CONF_ERROR;
    *ngx_cpymem(ngx_cpymem(z->prefix, "tg:ngx:", 7), z->name.data,
                z->name.len) = '\0';
    tg_config cfg;
    tg_redis_config rc;
    redis_config(z, &cfg, &rc);
    tg_nb *nb;
    int err = tg_nb_new(&nb, &cfg);
    if (err == TG_ENOTSUP) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: zone \"%V\": this module was built "
                         "without hiredis, so without Redis zones",
                         &z->name);
      return NGX_CONF_ERROR;
    }
    if (err != 0) {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate_zone: zone \"%V\": \"store=%V\": %s",
                         &z->name, &z->store, tg_strerror(err));
      return NGX_CONF_ERROR;
    }
    tg_nb_destroy(nb);
    tg_ngx_zone **slot = ngx_array_push(&mcf->zones);
    if (slot == NULL)
      return NGX_CONF_ERROR;
    *slot = z;
    return NGX_CONF_OK;
  }

  if (mcf->clock_zone == NULL) {
    /* a name no zone directive can give (NAME:SIZE) */
    ngx_str_t name = ngx_string("tollgate:clock");
    mcf->clock_zone = ngx_shared_memory_add(cf, &name, 8 * ngx_pagesize,
                                            &ngx_http_tollgate_module);
    if (mcf->clock_zone == NULL)
      return NGX_CONF_ERROR;
    mcf->clock_zone->init = tg_ngx_init_clock;
    mcf->clock_zone->data = mcf;
  }
  z->shm_zone =
      ngx_shared_memory_add(cf, &z->name, z->size, &ngx_http_tollgate_module);
  if (z->shm_zone == NULL)
    return NGX_CONF_ERROR;
  if (z->shm_zone->data) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_zone: shared memory zone \"%V\" is already "
                       "used by another tollgate_zone",
                       &z->name);
    return NGX_CONF_ERROR;
  }
  z->shm_zone->init = tg_ngx_init_zone;
  z->shm_zone->data = z;
  ngx_pool_cleanup_t *cln = ngx_pool_cleanup_add(cf->pool, 0);
  if (cln == NULL)
    return NGX_CONF_ERROR;
  cln->handler = tg_ngx_zone_cleanup;
  cln->data = z;

  tg_ngx_zone **slot = ngx_array_push(&mcf->zones);
  if (slot == NULL)
    return NGX_CONF_ERROR;
  *slot = z;
  return NGX_CONF_OK;
}

/* tollgate zone=NAME [cost=N|cost=$var] [burst=N] [nodelay|delay=N] */
static char *tg_ngx_limit_directive(ngx_conf_t *cf, ngx_command_t *cmd,
                                    void *conf) {
  tg_ngx_loc_conf *lcf = conf;
  ngx_str_t *value = cf->args->elts;
  if (lcf->limits == NULL) {
    lcf->limits = ngx_array_create(cf->pool, 2, sizeof(tg_ngx_limit));
    if (lcf->limits == NULL)
      return NGX_CONF_ERROR;
  }
  if (lcf->limits->nelts >= TG_RULES_MAX) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate: at most %d tollgate lines per location",
                       TG_RULES_MAX);
    return NGX_CONF_ERROR;
  }
  tg_ngx_limit *l = ngx_array_push(lcf->limits);
  if (l == NULL)
    return NGX_CONF_ERROR;
  ngx_memzero(l, sizeof(*l));
  l->cost = 1;
  l->burst = -1;
  l->delay = -1;
  l->file = cf->conf_file->file.name;
  l->line = cf->conf_file->line;

  for (ngx_uint_t i = 1; i < cf->args->nelts; i++) {
    ngx_str_t *v = &value[i];
    if (given_twice(cf, "tollgate", value, 1, i) != NGX_OK)
      return NGX_CONF_ERROR;
    if (ngx_strncmp(v->data, "zone=", 5) == 0) {
      l->zone_name.data = v->data + 5;
      l->zone_name.len = v->len - 5;
    } else if (ngx_strncmp(v->data, "cost=", 5) == 0) {
      ngx_str_t c = {v->len - 5, v->data + 5};
      if (ngx_http_script_variables_count(&c)) {
        l->cost_cv = ngx_palloc(cf->pool, sizeof(*l->cost_cv));
        if (l->cost_cv == NULL)
          return NGX_CONF_ERROR;
        ngx_http_compile_complex_value_t ccv;
        ngx_memzero(&ccv, sizeof(ccv));
        ccv.cf = cf;
        ccv.value = &c;
        ccv.complex_value = l->cost_cv;
        if (ngx_http_compile_complex_value(&ccv) != NGX_OK)
          return NGX_CONF_ERROR;
      } else {
        off_t n = ngx_atoof(c.data, c.len);
        if (n == NGX_ERROR) {
          ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                             "tollgate: invalid cost \"%V\" (a whole number "
                             "or a variable)",
                             &c);
          return NGX_CONF_ERROR;
        }
        l->cost = (uint64_t)n;
      }
    } else if (ngx_strncmp(v->data, "burst=", 6) == 0) {
      l->burst = ngx_atoi(v->data + 6, v->len - 6);
      if (l->burst == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate: invalid burst \"%V\"", v);
        return NGX_CONF_ERROR;
      }
    } else if (ngx_strncmp(v->data, "delay=", 6) == 0) {
      l->delay = ngx_atoi(v->data + 6, v->len - 6);
      if (l->delay == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "tollgate: invalid delay \"%V\"", v);
        return NGX_CONF_ERROR;
      }
    } else if (v->len == 7 && ngx_strncmp(v->data, "nodelay", 7) == 0) {
      l->nodelay = 1;
    } else {
      ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                         "tollgate: invalid parameter \"%V\"", v);
      return NGX_CONF_ERROR;
    }
  }
  if (l->zone_name.len == 0) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate: \"zone=NAME\" is required");
    return NGX_CONF_ERROR;
  }
  if (l->nodelay && l->delay != -1) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate: \"nodelay\" and \"delay=\" exclude each "
                       "other");
    return NGX_CONF_ERROR;
  }
  return NGX_CONF_OK;
}

/* nginx's own slots do not name the directive in every message: these do. */
static char *tg_ngx_set_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_uint_t *field = (ngx_uint_t *)((char *)conf + cmd->offset);
  ngx_str_t *value = cf->args->elts;
  if (*field != NGX_CONF_UNSET_UINT)
    return "is duplicate";
  ngx_int_t code = ngx_atoi(value[1].data, value[1].len);
  if (code < 400 || code > 599) {
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "tollgate_status: invalid status \"%V\" (400 to 599)",
                       &value[1]);
    return NGX_CONF_ERROR;
  }
  *field = (ngx_uint_t)code;
  return NGX_CONF_OK;
}

static char *tg_ngx_set_enum(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_uint_t *field = (ngx_uint_t *)((char *)conf + cmd->offset);
  ngx_str_t *value = cf->args->elts;
  if (*field != NGX_CONF_UNSET_UINT)
    return "is duplicate";
  for (ngx_conf_enum_t *e = cmd->post; e->name.len; e++)
    if (e->name.len == value[1].len &&
        ngx_strncmp(e->name.data, value[1].data, value[1].len) == 0) {
      *field = e->value;
      return NGX_CONF_OK;
    }
  u_char choices[128], *p = choices;
  for (ngx_conf_enum_t *e = cmd->post; e->name.len; e++)
    p = ngx_slprintf(p, choices + sizeof(choices), "%s%V",
                     p == choices ? "" : ", ", &e->name);
  ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%V: invalid value \"%V\" (%*s)",
                     &cmd->name, &value[1], (size_t)(p - choices), choices);
  return NGX_CONF_ERROR;
}

/* A fixed cost= the line can never let through (above its limit, or a
 * bucket's burst: for a queue, its immediate bucket D + 1) fails nginx -t
 * with the line named, rather than refusing every request. */
static char *cost_fits(ngx_conf_t *cf, tg_ngx_limit *l) {
  uint64_t cap = l->q.limit;
  if (is_bucket(l->zone->algorithm))
    cap = l->q.burst ? l->q.burst : l->q.limit;
  if (l->cost_cv || l->cost <= cap)
    return NGX_CONF_OK;
  ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                "tollgate: \"cost=%uL\" on zone \"%V\" is above the %uL this "
                "line ever lets through at once, so every request would be "
                "refused, in %V:%ui",
                l->cost, &l->zone_name, cap, &l->file, l->line);
  return NGX_CONF_ERROR;
}

/* Finds the line's zone and works out how it decides: with its zone's
 * quota, or with limit_req's burst/delay meaning (see README, "nginx"). */
static char *resolve_limit(ngx_conf_t *cf, tg_ngx_main_conf *mcf,
                           tg_ngx_limit *l) {
  tg_ngx_zone **zp = mcf->zones.elts;
  for (ngx_uint_t i = 0; i < mcf->zones.nelts; i++)
    if (zp[i]->name.len == l->zone_name.len &&
        ngx_strncmp(zp[i]->name.data, l->zone_name.data, l->zone_name.len) == 0)
      l->zone = zp[i];
  if (l->zone == NULL) {
    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "tollgate: unknown zone \"%V\" (no tollgate_zone defines "
                  "it) in %V:%ui",
                  &l->zone_name, &l->file, l->line);
    return NGX_CONF_ERROR;
  }
  l->q = l->zone->q;
  l->mode = TG_NGX_HIT;
  if (l->burst == -1 && l->delay == -1 && !l->nodelay) {
    l->resolved = 1;
    return cost_fits(cf, l);
  }
  if (!is_bucket(l->zone->algorithm)) {
    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "tollgate: \"burst=\", \"delay=\" and \"nodelay\" need a "
                  "zone with "
                  "algorithm=token_bucket or leaky_bucket, and zone \"%V\" "
                  "is %s in %V:%ui",
                  &l->zone_name, tg_algorithm_name(l->zone->algorithm),
                  &l->file, l->line);
    return NGX_CONF_ERROR;
  }
  /* no burst= on the line: the zone's bucket (its burst, default the
   * limit), as for a line without parameters; nodelay or delay= alone
   * then change only when the excess goes (before, B was 0: a bucket of
   * one request) */
  uint64_t zb = l->zone->q.burst ? l->zone->q.burst : l->zone->q.limit;
  uint64_t b = l->burst == -1 ? zb - 1 : (uint64_t)l->burst;
  if (l->nodelay || (l->delay != -1 && (uint64_t)l->delay >= b)) {
    /* every excess request within the burst passes at once */
    l->q.burst = b + 1;
  } else {
    uint64_t d = l->delay == -1 ? 0 : (uint64_t)l->delay;
    /* T, the emission interval, in ns, as the library rounds it (up) */
    uint64_t t_ns = (l->q.period_ms * 1000000 + l->q.limit - 1) / l->q.limit;
    l->q.burst = d + 1;
    l->mode = TG_NGX_RESERVE;
    /* the queue's longest wait, (B - D) * T, refused when the library
     * would refuse it (TG_PERIOD_MAX_MS), not wrapped around 2^64 */
    uint64_t n = b - d;
    if (n > (TG_PERIOD_MAX_MS * UINT64_C(1000000)) / t_ns) {
      ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                    "tollgate: \"burst=%O\" on zone \"%V\" queues requests "
                    "for longer than %uL ms, the longest wait there is, "
                    "in %V:%ui",
                    (off_t)b, &l->zone_name, (uint64_t)TG_PERIOD_MAX_MS,
                    &l->file, l->line);
      return NGX_CONF_ERROR;
    }
    l->max_wait_ns = n * t_ns; /* exact: TG_RULES_WAIT_NS */
  }
  /* the line's own quota (burst + 1 or delay + 1) must be one the library
   * takes, as the zone's was: else every request would be refused */
  int rc = tg_quota_check(l->zone->algorithm, &l->q);
  if (rc != 0) {
    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "tollgate: zone \"%V\" with this line's \"burst=\" or "
                  "\"delay=\": %s, in %V:%ui",
                  &l->zone_name, tg_strerror(rc), &l->file, l->line);
    return NGX_CONF_ERROR;
  }
  l->resolved = 1;
  return cost_fits(cf, l);
}

static void *tg_ngx_create_main_conf(ngx_conf_t *cf) {
  tg_ngx_main_conf *mcf = ngx_pcalloc(cf->pool, sizeof(*mcf));
  if (mcf == NULL)
    return NULL;
  if (ngx_array_init(&mcf->zones, cf->pool, 4, sizeof(tg_ngx_zone *)) != NGX_OK)
    return NULL;
  return mcf;
}

static void *tg_ngx_create_loc_conf(ngx_conf_t *cf) {
  tg_ngx_loc_conf *lcf = ngx_pcalloc(cf->pool, sizeof(*lcf));
  if (lcf == NULL)
    return NULL;
  lcf->status = NGX_CONF_UNSET_UINT;
  lcf->dry_run = NGX_CONF_UNSET;
  lcf->log_level = NGX_CONF_UNSET_UINT;
  lcf->headers = NGX_CONF_UNSET_UINT;
  return lcf;
}

/* The tag of a zone key's configured text: the literal bytes before its
 * first "}", when no variable comes before it (else an empty tag). */
static ngx_str_t key_tag(const ngx_str_t *k) {
  ngx_str_t t = ngx_null_string;
  u_char *brace = ngx_strlchr(k->data, k->data + k->len, '}');
  if (brace && ngx_strlchr(k->data, brace, '$') == NULL) {
    t.data = k->data;
    t.len = (size_t)(brace - k->data);
  }
  return t;
}

/* Whether two zone keys name one Redis Cluster slot for every request:
 * the same text, or the same literal tag ("acct}$a" and "acct}$b"). */
static ngx_int_t same_slot_keys(const ngx_str_t *a, const ngx_str_t *b) {
  if (a->len == b->len && ngx_strncmp(a->data, b->data, a->len) == 0)
    return 1;
  ngx_str_t x = key_tag(a), y = key_tag(b);
  return x.len > 0 && x.len == y.len && ngx_strncmp(x.data, y.data, x.len) == 0;
}

static char *tg_ngx_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child) {
  tg_ngx_loc_conf *prev = parent;
  tg_ngx_loc_conf *conf = child;
  tg_ngx_main_conf *mcf =
      ngx_http_conf_get_module_main_conf(cf, ngx_http_tollgate_module);
  if (conf->limits == NULL)
    conf->limits = prev->limits;
  if (conf->limits) {
    tg_ngx_limit *l = conf->limits->elts;
    for (ngx_uint_t i = 0; i < conf->limits->nelts; i++) {
      if (!l[i].resolved && resolve_limit(cf, mcf, &l[i]) != NGX_CONF_OK)
        return NGX_CONF_ERROR;
      conf->queues |= l[i].mode == TG_NGX_RESERVE;
      for (ngx_uint_t j = 0; j < i; j++)
        if (l[j].zone == l[i].zone) {
          /* one state cannot be two rules of a policy */
          ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                        "tollgate: zone \"%V\" is used twice in one place "
                        "(one request, one key, one state), in %V:%ui",
                        &l[i].zone_name, &l[i].file, l[i].line);
          return NGX_CONF_ERROR;
        }
    }
    /* several lines on Redis zones are one policy in one command
     * (tg_nb_submit_rules, lines that queue included: a policy of
     * reservations): every zone on the same store, keys in one slot */
    for (ngx_uint_t i = 0; conf->limits->nelts > 1 && i < conf->limits->nelts;
         i++) {
      const char *why = NULL;
      if (l[i].zone->redis != l[0].zone->redis)
        why = "lines on a Redis zone and on a shared-memory zone cannot be "
              "one policy";
      else if (!l[i].zone->redis)
        continue;
      else if (l[i].zone->store.len != l[0].zone->store.len ||
               ngx_strncmp(l[i].zone->store.data, l[0].zone->store.data,
                           l[0].zone->store.len) != 0)
        why = "the Redis zones of one location must have the same store=";
      else if (!same_slot_keys(&l[i].zone->key.value, &l[0].zone->key.value))
        why = "the keys of Redis zones in one location must fall in one "
              "Redis Cluster slot: the same key, or keys that begin with "
              "the same literal tag ended by \"}\" (e.g. "
              "\"acme}$arg_user\")";
      if (why) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "tollgate: zone \"%V\": %s, in %V:%ui", &l[i].zone_name,
                      why, &l[i].file, l[i].line);
        return NGX_CONF_ERROR;
      }
    }
  }
  ngx_conf_merge_uint_value(conf->status, prev->status, 429);
  ngx_conf_merge_value(conf->dry_run, prev->dry_run, 0);
  ngx_conf_merge_uint_value(conf->log_level, prev->log_level, NGX_LOG_ERR);
  conf->delay_log_level =
      conf->log_level == NGX_LOG_INFO ? NGX_LOG_INFO : conf->log_level + 1;
  ngx_conf_merge_uint_value(conf->headers, prev->headers, TG_NGX_HEADERS_ON);
  return NGX_CONF_OK;
}

/* ---- zones ------------------------------------------------------------ */

/* Runs in the master (and in `nginx -t`) once the zone's shared memory is
 * mapped, before the workers are forked. On a reload, nginx hands a zone of
 * the same name and size the old one's memory and context (data): the new
 * limiter attaches to the same table, so the counts go on. */
static ngx_int_t tg_ngx_init_zone(ngx_shm_zone_t *shm_zone, void *data) {
  tg_ngx_zone *z = shm_zone->data;
  tg_ngx_zone *old = data;
  if (old) {
    if (old->key.value.len != z->key.value.len ||
        ngx_strncmp(old->key.value.data, z->key.value.data, z->key.value.len) !=
            0) {
      ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                    "tollgate_zone \"%V\" uses the key \"%V\" while "
                    "previously it used \"%V\": give the zone another name "
                    "or restart nginx",
                    &z->name, &z->key.value, &old->key.value);
      return NGX_ERROR;
    }
    if (old->algorithm != z->algorithm || old->capacity != z->capacity ||
        old->log_entries != z->log_entries) {
      ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                    "tollgate_zone \"%V\" changed: it holds a table of %uL "
                    "keys for %s (%uD log entries), the new configuration "
                    "wants %uL keys for %s (%uD): a zone keeps its counts "
                    "across a reload only with the same algorithm and, for "
                    "sliding_window, the same limit; give the zone another "
                    "name or restart nginx",
                    &z->name, old->capacity, tg_algorithm_name(old->algorithm),
                    old->log_entries, z->capacity,
                    tg_algorithm_name(z->algorithm), z->log_entries);
      return NGX_ERROR;
    }
    z->region = old->region;
    z->region_bytes = old->region_bytes;
  } else {
    ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)shm_zone->shm.addr;
    if (shm_zone->shm.exists) {
      z->region = shpool->data; /* Windows: mapped again, already made */
    } else {
      z->region = ngx_slab_alloc(shpool, z->region_bytes);
      if (z->region == NULL) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "tollgate_zone \"%V\": %uz bytes for %uL keys do not "
                      "fit in the zone of %uz bytes",
                      &z->name, z->region_bytes, z->capacity, z->size);
        return NGX_ERROR;
      }
      shpool->data = z->region;
    }
  }
  tg_config cfg;
  zone_config(z, &cfg);
  cfg.region = z->region;
  cfg.region_bytes = z->region_bytes;
  int rc = tg_limiter_new(&z->lim, &cfg);
  if (rc != 0) {
    ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                  "tollgate_zone \"%V\": cannot use its table: %s (%s: %s)",
                  &z->name, tg_strerror(rc), tg_err_name(rc), tg_last_error());
    return NGX_ERROR;
  }
  ngx_log_error(NGX_LOG_INFO, shm_zone->shm.log, 0,
                "tollgate_zone \"%V\": %s, room for %uL keys%s", &z->name,
                tg_algorithm_name(z->algorithm), z->capacity,
                old ? " (kept from the previous configuration)" : "");
  return NGX_OK;
}

/* Worker 0 reclaims keys whose state has decayed, every minute. */
static ngx_event_t tg_ngx_clean_ev;

static void tg_ngx_clean(ngx_event_t *ev) {
  ngx_cycle_t *cycle = ev->data;
  tg_ngx_main_conf *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_tollgate_module);
  tg_ngx_zone **zp = mcf->zones.elts;
  for (ngx_uint_t i = 0; i < mcf->zones.nelts; i++)
    if (zp[i]->lim)
      (void)tg_clean(zp[i]->lim, NULL);
  if (!ngx_exiting)
    ngx_add_timer(ev, 60000);
}

/* ---- Redis zones ---------------------------------------------------------
 * A zone with store=redis://... has no shared memory: its state is in
 * Redis, under "tg:ngx:NAME:", where every worker of every nginx that has
 * the zone decides on it. Each worker has one client per Redis zone (a
 * tg_nb: the non-blocking API, which never touches a socket) and one nginx
 * connection per link the client wants: one to the server, or with
 * store=redis-cluster://... one to each node of the Cluster it needs (a
 * key's slot's master; the client reads the slot map, follows MOVED and
 * ASK, and names the nodes), each made with ngx_event_connect_peer
 * (non-blocking connect). A request submits its decision and returns
 * NGX_AGAIN; the connections' events feed the replies to the client, and
 * each decision done is applied as a memory zone's would be, then the
 * request's write event is posted and runs the phases again, which find
 * it decided.
 *
 * A server or node that does not answer (connect or replies) within the
 * zone's timeout, or refuses the connection, is marked down: the decisions
 * it owed and every new one for it are answered at once by the zone's
 * on_error policy (allow by default), and after a backoff (100 ms,
 * doubling to 1 s while it stays down, back to 100 ms once it answers) the
 * next decision tries it again; a Cluster's client meanwhile asks another
 * node for the slot map, so a promoted replica takes over. A connection
 * that ends (the server restarted) is made again on demand; a decision
 * already sent on it is answered by the policy (it may have been counted),
 * one not yet sent is sent on the next. */

#define TG_NGX_BACKOFF_MIN 100
#define TG_NGX_BACKOFF_MAX 1000

static void redis_pump(tg_ngx_zone *z);
static void redis_complete(tg_ngx_zone *z, tg_nb_req *req);
static ngx_int_t redis_policy_answer(ngx_http_request_t *r,
                                     tg_ngx_loc_conf *lcf, tg_ngx_ctx *ctx,
                                     tg_ngx_pending *p);
static ngx_int_t redis_answer(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                              tg_ngx_ctx *ctx, int rc, const tg_result *res,
                              uint64_t delay_ms);

static void redis_close(tg_ngx_link *L) {
  if (L->conn) {
    ngx_close_connection(L->conn); /* and its timers and events */
    L->conn = NULL;
  }
  L->connecting = 0;
}

/* The connection failed. down: the node is not to be asked until the
 * backoff has passed (code 0: the client has marked it down already);
 * else closed only: written decisions are answered by the policy, the
 * others go on the next connection. */
static void redis_fail(tg_ngx_link *L, int code, ngx_uint_t down) {
  tg_ngx_zone *z = L->zone;
  redis_close(L);
  if (z->pumping) /* the client may now want another link (a map) */
    z->pump_again = 1;
  if (!down) {
    (void)tg_nb_closed(z->nb, L->id, code);
    return;
  }
  if (code != 0)
    (void)tg_nb_down(z->nb, L->id, code);
  L->backoff = L->backoff ? ngx_min(L->backoff * 2, TG_NGX_BACKOFF_MAX)
                          : TG_NGX_BACKOFF_MIN;
  if (!L->backoff_ev.timer_set)
    ngx_add_timer(&L->backoff_ev, L->backoff);
}

static void redis_backoff_done(ngx_event_t *ev) {
  tg_ngx_link *L = ev->data;
  (void)tg_nb_up(L->zone->nb, L->id);
  redis_pump(L->zone); /* connects when a decision waits */
}

/* Links whose state could not be allocated were marked down: let the
 * client try them again. */
static void redis_retry(ngx_event_t *ev) {
  tg_ngx_zone *z = ev->data;
  unsigned n = tg_nb_links(z->nb);
  for (unsigned id = 0; id < n; id++)
    if (id >= z->nlinks || z->links[id] == NULL)
      (void)tg_nb_up(z->nb, id);
  redis_pump(z);
}

/* A policy told TRYAGAIN is due to go again. */
static void redis_tick(ngx_event_t *ev) {
  tg_ngx_zone *z = ev->data;
  (void)tg_nb_tick(z->nb);
  redis_pump(z);
}

/* Link id's state, made on first need (NULL: no memory). */
static tg_ngx_link *redis_link(tg_ngx_zone *z, unsigned id) {
  if (id < z->nlinks && z->links[id])
    return z->links[id];
  if (id >= z->links_cap) {
    ngx_uint_t cap = ngx_max(id + 1, z->links_cap * 2);
    tg_ngx_link **a = ngx_alloc(cap * sizeof(*a), ngx_cycle->log);
    if (a == NULL)
      return NULL;
    if (z->nlinks)
      ngx_memcpy(a, z->links, z->nlinks * sizeof(*a));
    ngx_free(z->links);
    z->links = a;
    z->links_cap = cap;
  }
  while (z->nlinks <= id)
    z->links[z->nlinks++] = NULL;
  tg_ngx_link *L = ngx_calloc(sizeof(*L), ngx_cycle->log);
  if (L == NULL)
    return NULL;
  L->zone = z;
  L->id = id;
  L->backoff_ev.handler = redis_backoff_done;
  L->backoff_ev.data = L;
  L->backoff_ev.log = ngx_cycle->log;
  L->backoff_ev.cancelable = 1;
  if (!z->cluster) {
    L->addr = &z->addr; /* resolved with the configuration */
    L->name = z->store;
  }
  z->links[id] = L;
  return L;
}

/* A Cluster node's address, as the client names it: resolved once, when
 * first connected to (a name blocks the worker while it resolves: Redis
 * names its nodes by IP address unless configured otherwise). */
static ngx_int_t redis_resolve(tg_ngx_link *L) {
  tg_ngx_zone *z = L->zone;
  if (L->name.data == NULL) {
    const char *host;
    int port;
    if (tg_nb_address(z->nb, L->id, &host, &port) != 0)
      return NGX_ERROR;
    size_t hl = ngx_strlen(host);
    u_char *s = ngx_alloc(hl + 2 + NGX_INT_T_LEN + 1, ngx_cycle->log);
    if (s == NULL)
      return NGX_ERROR;
    /* an IPv6 address in brackets, as ngx_parse_url wants it */
    ngx_uint_t v6 =
        ngx_strlchr((u_char *)host, (u_char *)host + hl, ':') != NULL;
    u_char *e = v6 ? ngx_sprintf(s, "[%s]:%d", host, port)
                   : ngx_sprintf(s, "%s:%d", host, port);
    L->name.data = s;
    L->name.len = (size_t)(e - s);
  }
  ngx_pool_t *pool = ngx_create_pool(1024, ngx_cycle->log);
  if (pool == NULL)
    return NGX_ERROR;
  ngx_url_t u;
  ngx_memzero(&u, sizeof(u));
  u.url = L->name;
  ngx_int_t rc = NGX_ERROR;
  if (ngx_parse_url(pool, &u) != NGX_OK || u.naddrs == 0) {
    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "tollgate: zone \"%V\": Cluster node %V: %s", &z->name,
                  &L->name, u.err ? u.err : "no address");
  } else {
    /* the address and its socket address, in the link's own memory */
    ngx_addr_t *a = ngx_alloc(sizeof(*a) + u.addrs[0].socklen, ngx_cycle->log);
    if (a != NULL) {
      a->sockaddr = (struct sockaddr *)(a + 1);
      ngx_memcpy(a->sockaddr, u.addrs[0].sockaddr, u.addrs[0].socklen);
      a->socklen = u.addrs[0].socklen;
      a->name = L->name;
      L->addr = a;
      rc = NGX_OK;
    }
  }
  ngx_destroy_pool(pool);
  return rc;
}

static void redis_connected(tg_ngx_link *L) {
  L->connecting = 0;
  L->heard = 0;
  if (L->conn->write->timer_set)
    ngx_del_timer(L->conn->write);
  if (tg_nb_connected(L->zone->nb, L->id) != 0)
    redis_fail(L, TG_ECONNECT, 1);
}

static void redis_event(ngx_event_t *ev);

static void redis_connect(tg_ngx_link *L) {
  if (L->addr == NULL && redis_resolve(L) != NGX_OK) {
    redis_fail(L, TG_ECONNECT, 1);
    return;
  }
  ngx_peer_connection_t pc;
  ngx_memzero(&pc, sizeof(pc));
  pc.sockaddr = L->addr->sockaddr;
  pc.socklen = L->addr->socklen;
  pc.name = &L->addr->name;
  pc.get = ngx_event_get_peer;
  pc.log = ngx_cycle->log;
  pc.log_error = NGX_ERROR_ERR;
  ngx_int_t rc = ngx_event_connect_peer(&pc);
  if (rc != NGX_OK && rc != NGX_AGAIN) {
    if (pc.connection)
      ngx_close_connection(pc.connection);
    redis_fail(L, TG_ECONNECT, 1);
    return;
  }
  ngx_connection_t *c = pc.connection;
  c->data = L;
  c->read->handler = redis_event;
  c->write->handler = redis_event;
  L->conn = c;
  if (rc == NGX_AGAIN) {
    L->connecting = 1;
    ngx_add_timer(c->write, L->zone->timeout);
    return;
  }
  redis_connected(L);
}

/* Everything the socket takes of what the client has to send. */
static void redis_write(tg_ngx_link *L) {
  ngx_connection_t *c = L->conn;
  for (;;) {
    const void *data;
    size_t len;
    if (tg_nb_output(L->zone->nb, L->id, &data, &len) != 0 || len == 0)
      return;
    ssize_t n = c->send(c, (u_char *)data, len);
    if (n == NGX_AGAIN) {
      if (ngx_handle_write_event(c->write, 0) != NGX_OK)
        redis_fail(L, TG_ECONNECT, 1);
      return;
    }
    if (n == NGX_ERROR) {
      redis_fail(L, TG_ECONNECT, 1);
      return;
    }
    (void)tg_nb_written(L->zone->nb, L->id, (size_t)n);
  }
}

/* Hands out the decisions done; those the node answered (not by the
 * failure policy) show the link makes progress. */
static void redis_drain(tg_ngx_zone *z, tg_ngx_link *L) {
  tg_nb_req *req;
  while ((req = tg_nb_done(z->nb)) != NULL) {
    if (L && req->status == TG_OK && !req->result.degraded) {
      L->backoff = 0; /* it answers decisions */
      L->heard = 1;
    }
    redis_complete(z, req);
  }
}

/* Everything the socket has, to the client. */
static void redis_read(tg_ngx_link *L) {
  tg_ngx_zone *z = L->zone;
  ngx_connection_t *c = L->conn;
  u_char buf[16384];
  for (;;) {
    ssize_t n = c->recv(c, buf, sizeof(buf));
    if (n == NGX_AGAIN)
      break;
    if (n == 0 || n == NGX_ERROR) {
      /* a node that ends the connection while it owes something (a
       * reply, or decisions waiting to be sent to it), before it has
       * answered a decision on it, is down: making the connection again
       * at once would loop (a reply to the handshake alone is not
       * progress); owing nothing, it only closed an idle one */
      ngx_uint_t down = !L->heard && tg_nb_wants(z->nb, L->id) != 0;
      ngx_uint_t level = down ? NGX_LOG_ERR : NGX_LOG_INFO;
      ngx_log_error(level, c->log, 0,
                    "tollgate: zone \"%V\": the connection to %V ended%s",
                    &z->name, &L->name,
                    down ? " before answering a decision" : "");
      redis_fail(L, TG_ECONNECT, down);
      return;
    }
    if (c->read->timer_set) /* heard: redis_pump sets it again */
      ngx_del_timer(c->read);
    int rc = tg_nb_input(z->nb, L->id, buf, (size_t)n);
    if (rc < 0) {
      ngx_log_error(NGX_LOG_ERR, c->log, 0,
                    "tollgate: zone \"%V\": %V: %s (%s)", &z->name, &L->name,
                    tg_strerror(rc), tg_last_error());
      redis_fail(L, 0, 1);
      return;
    }
    redis_drain(z, L);
  }
  if (ngx_handle_read_event(c->read, 0) != NGX_OK)
    redis_fail(L, TG_ECONNECT, 1);
}

static void redis_event(ngx_event_t *ev) {
  ngx_connection_t *c = ev->data;
  tg_ngx_link *L = c->data;
  tg_ngx_zone *z = L->zone;
  if (ev->timedout) {
    ngx_log_error(NGX_LOG_ERR, c->log, 0,
                  "tollgate: zone \"%V\": %V did not answer within %M ms",
                  &z->name, &L->name, z->timeout);
    redis_fail(L, TG_ETIMEDOUT, 1);
    redis_pump(z);
    return;
  }
  if (L->connecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *)&err, &len) == -1)
      err = ngx_socket_errno;
    if (err) {
      ngx_log_error(NGX_LOG_ERR, c->log, err,
                    "tollgate: zone \"%V\": connect() to %V failed", &z->name,
                    &L->name);
      redis_fail(L, TG_ECONNECT, 1);
      redis_pump(z);
      return;
    }
    if (!ev->write)
      return; /* not connected yet */
    redis_connected(L);
  }
  if (L->conn && c->read->ready)
    redis_read(L);
  redis_pump(z);
}

/* The client said a decision is done: apply it to its request, if that
 * still exists, and have the request's phases run again. */
static void tg_ngx_redis_resume(ngx_http_request_t *r) {
  r->read_event_handler = ngx_http_block_reading;
  r->write_event_handler = ngx_http_core_run_phases;
  ngx_http_core_run_phases(r);
}

static void redis_complete(tg_ngx_zone *z, tg_nb_req *req) {
  tg_ngx_pending *p = req->data;
  ngx_queue_remove(&p->queue);
  tg_ngx_ctx *ctx = p->ctx;
  if (ctx == NULL)
    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "tollgate: zone \"%V\": an answer for a request that "
                  "has ended is dropped",
                  &z->name);
  if (ctx) {
    ctx->pending = NULL;
    ctx->resume_rc = p->n > 1 ? redis_policy_answer(p->r, p->lcf, ctx, p)
                              : redis_answer(p->r, p->lcf, ctx, req->status,
                                             &req->result, req->delay_ms);
    /* a delayed request is on its timer, which runs the phases again and
     * finds it decided */
    ctx->resume = ctx->resume_rc != NGX_AGAIN;
    if (p->parked && ctx->resume) {
      p->r->write_event_handler = tg_ngx_redis_resume;
      ngx_post_event(p->r->connection->write, &ngx_posted_events);
    }
  }
  ngx_free(p);
}

/* After anything happened to a zone's client: connect and write every
 * link that wants it, hand out the decisions done, and keep a timer on
 * the replies each link is due. */
static void redis_pump(tg_ngx_zone *z) {
  if (z->nb == NULL)
    return;
  if (z->pumping) {
    z->pump_again = 1;
    return;
  }
  z->pumping = 1;
  ngx_uint_t rounds = 0;
  do {
    z->pump_again = 0;
    unsigned n = tg_nb_links(z->nb);
    for (unsigned id = 0; id < n; id++) {
      unsigned w = tg_nb_wants(z->nb, id);
      tg_ngx_link *L = id < z->nlinks ? z->links[id] : NULL;
      if (L == NULL && w == 0)
        continue; /* nothing for a node not yet met */
      if (L == NULL && (L = redis_link(z, id)) == NULL) {
        /* its calls answered by on_error, until the retry */
        (void)tg_nb_down(z->nb, id, TG_ENOMEM);
        if (!z->retry_ev.timer_set)
          ngx_add_timer(&z->retry_ev, TG_NGX_BACKOFF_MAX);
        continue;
      }
      if ((w & TG_NB_CONNECT) && L->conn == NULL)
        redis_connect(L);
      if (L->conn && !L->connecting)
        redis_write(L);
    }
    redis_drain(z, NULL);
  } while (z->pump_again && ++rounds < 8);
  for (ngx_uint_t id = 0; id < z->nlinks; id++) {
    tg_ngx_link *L = z->links[id];
    ngx_connection_t *c = L ? L->conn : NULL;
    if (c == NULL || L->connecting)
      continue;
    if (tg_nb_wants(z->nb, (unsigned)id) & TG_NB_READ) {
      if (!c->read->timer_set)
        ngx_add_timer(c->read, z->timeout);
    } else if (c->read->timer_set) {
      ngx_del_timer(c->read);
    }
  }
  /* set afresh: ngx_add_timer keeps a timer within 300 ms of the new
   * time, which could hold a 2 ms wait behind a 50 ms one */
  long due = tg_nb_timeout(z->nb);
  if (z->tick_ev.timer_set)
    ngx_del_timer(&z->tick_ev);
  if (due >= 0)
    ngx_add_timer(&z->tick_ev, (ngx_msec_t)due);
  z->pumping = 0;
}

static void redis_start(ngx_cycle_t *cycle, tg_ngx_zone *z) {
  ngx_queue_init(&z->pending);
  z->links = NULL;
  z->nlinks = z->links_cap = 0;
  ngx_memzero(&z->retry_ev, sizeof(z->retry_ev));
  z->retry_ev.handler = redis_retry;
  z->retry_ev.data = z;
  z->retry_ev.log = cycle->log;
  z->retry_ev.cancelable = 1;
  ngx_memzero(&z->tick_ev, sizeof(z->tick_ev));
  z->tick_ev.handler = redis_tick;
  z->tick_ev.data = z;
  z->tick_ev.log = cycle->log;
  /* not cancelable: a request waits on it (a graceful shutdown waits for
   * it, about 1.8 s at most), where the others only retry a link */
  tg_config cfg;
  tg_redis_config rc;
  redis_config(z, &cfg, &rc);
  int err = tg_nb_new(&z->nb, &cfg);
  if (err != 0)
    ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                  "tollgate: zone \"%V\": no Redis client: %s; its "
                  "decisions are answered by on_error",
                  &z->name, tg_strerror(err));
}

static void redis_stop(tg_ngx_zone *z) {
  for (ngx_uint_t id = 0; id < z->nlinks; id++) {
    tg_ngx_link *L = z->links[id];
    if (L == NULL)
      continue;
    redis_close(L);
    if (L->backoff_ev.timer_set)
      ngx_del_timer(&L->backoff_ev);
    if (z->cluster) {
      ngx_free(L->name.data);
      if (L->addr)
        ngx_free(L->addr);
    }
    ngx_free(L);
  }
  if (z->retry_ev.timer_set)
    ngx_del_timer(&z->retry_ev);
  if (z->tick_ev.timer_set)
    ngx_del_timer(&z->tick_ev);
  ngx_free(z->links);
  z->links = NULL;
  z->nlinks = z->links_cap = 0;
  while (z->nb && !ngx_queue_empty(&z->pending)) {
    ngx_queue_t *q = ngx_queue_head(&z->pending);
    tg_ngx_pending *p = ngx_queue_data(q, tg_ngx_pending, queue);
    ngx_queue_remove(q);
    if (p->ctx)
      p->ctx->pending = NULL;
    ngx_free(p);
  }
  tg_nb_destroy(z->nb);
  z->nb = NULL;
}

static void tg_ngx_exit_process(ngx_cycle_t *cycle) {
  tg_ngx_main_conf *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_tollgate_module);
  if (mcf == NULL)
    return;
  tg_ngx_zone **zp = mcf->zones.elts;
  for (ngx_uint_t i = 0; i < mcf->zones.nelts; i++)
    if (zp[i]->redis)
      redis_stop(zp[i]);
}

static ngx_int_t tg_ngx_init_process(ngx_cycle_t *cycle) {
  if (ngx_process != NGX_PROCESS_WORKER && ngx_process != NGX_PROCESS_SINGLE)
    return NGX_OK;
  tg_ngx_main_conf *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_tollgate_module);
  if (mcf == NULL || mcf->zones.nelts == 0)
    return NGX_OK;
  tg_ngx_zone **zp = mcf->zones.elts;
  ngx_uint_t shm = 0;
  for (ngx_uint_t i = 0; i < mcf->zones.nelts; i++) {
    if (zp[i]->redis)
      redis_start(cycle, zp[i]);
    else
      shm++;
  }
  if (ngx_process != NGX_PROCESS_WORKER || ngx_worker != 0 || shm == 0)
    return NGX_OK;
  tg_ngx_clean_ev.handler = tg_ngx_clean;
  tg_ngx_clean_ev.data = cycle;
  tg_ngx_clean_ev.log = cycle->log;
  tg_ngx_clean_ev.cancelable = 1;
  ngx_add_timer(&tg_ngx_clean_ev, 60000);
  return NGX_OK;
}

/* ---- requests --------------------------------------------------------- */

static void tg_ngx_ctx_cleanup(void *data) {
  tg_ngx_ctx *ctx = data;
  if (ctx->pending) {
    /* the request ended while Redis decided: the answer will be dropped */
    ctx->pending->ctx = NULL;
    ctx->pending = NULL;
  }
  if (ctx->waiting && ctx->res) {
    /* the request ended while it waited: give its slots back (a Redis
     * zone's reservation has no receipt: it is kept, as limit_req's) */
    (void)tg_cancel_rules(ctx->rules, ctx->n, ctx->res);
    ctx->waiting = 0;
  }
}

/* The request's context: the module's, or the one an internal redirect
 * left behind in the pool's cleanups. */
static tg_ngx_ctx *get_ctx(ngx_http_request_t *r) {
  tg_ngx_ctx *ctx = ngx_http_get_module_ctx(r, ngx_http_tollgate_module);
  if (ctx)
    return ctx;
  for (ngx_pool_cleanup_t *c = r->pool->cleanup; c; c = c->next)
    if (c->handler == tg_ngx_ctx_cleanup) {
      ngx_http_set_ctx(r, c->data, ngx_http_tollgate_module);
      return c->data;
    }
  return NULL;
}

/* Keys longer than tollgate takes are limited by their MD5 digest, behind
 * a byte no short key of that length is likely to start with. A Redis
 * zone's key keeps its tag (the bytes up to its first "}", within the
 * first 65) in front, so that a long key stays in its Cluster slot, and
 * in its policy's. */
static ngx_int_t shorten_key(ngx_http_request_t *r, ngx_str_t *key,
                             ngx_uint_t keep_tag) {
  size_t tag = 0;
  if (keep_tag) {
    u_char *end = key->data + (key->len < 65 ? key->len : 65);
    u_char *b = ngx_strlchr(key->data, end, '}');
    if (b)
      tag = (size_t)(b - key->data) + 1;
  }
  u_char *k = ngx_pnalloc(r->pool, tag + 17);
  if (k == NULL)
    return NGX_ERROR;
  ngx_memcpy(k, key->data, tag);
  ngx_md5_t md5;
  ngx_md5_init(&md5);
  ngx_md5_update(&md5, key->data, key->len);
  k[tag] = 0xff;
  ngx_md5_final(k + tag + 1, &md5);
  key->data = k;
  key->len = tag + 17;
  return NGX_OK;
}

static void tg_ngx_delay_done(ngx_http_request_t *r) {
  ngx_event_t *wev = r->connection->write;
  if (wev->delayed) {
    /* woken by the socket, not the timer: keep waiting */
    if (ngx_handle_write_event(wev, 0) != NGX_OK)
      ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    return;
  }
  tg_ngx_ctx *ctx = get_ctx(r);
  if (ctx)
    ctx->waiting = 0;
  if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
    ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    return;
  }
  r->read_event_handler = ngx_http_block_reading;
  r->write_event_handler = ngx_http_core_run_phases;
  ngx_http_core_run_phases(r);
}

/* The request's context, kept as a cleanup of its pool (see get_ctx),
 * with its n rules and n lines after it: one allocation (every request of
 * a limited location makes one). */
static tg_ngx_ctx *new_ctx(ngx_http_request_t *r, tg_ngx_loc_conf *lcf) {
  _Static_assert(sizeof(tg_ngx_ctx) % _Alignof(tg_rule) == 0 &&
                     sizeof(tg_rule) % _Alignof(tg_ngx_limit *) == 0,
                 "the rules and lines follow the context aligned");
  _Static_assert(sizeof(ngx_pool_cleanup_t) % _Alignof(tg_ngx_ctx) == 0,
                 "the context follows its cleanup aligned");
  ngx_uint_t n = lcf->limits->nelts;
  size_t size =
      sizeof(tg_ngx_ctx) + n * (sizeof(tg_rule) + sizeof(tg_ngx_limit *));
  /* the cleanup and the context in one allocation, linked as
   * ngx_pool_cleanup_add links one (which would make two) */
  ngx_pool_cleanup_t *cln = ngx_palloc(r->pool, sizeof(*cln) + size);
  if (cln == NULL)
    return NULL;
  tg_ngx_ctx *ctx = (tg_ngx_ctx *)(cln + 1);
  ngx_memzero(ctx, size);
  cln->handler = tg_ngx_ctx_cleanup;
  cln->data = ctx;
  cln->next = r->pool->cleanup;
  r->pool->cleanup = cln;
  ngx_http_set_ctx(r, ctx, ngx_http_tollgate_module);
  ctx->headers = lcf->headers;
  ctx->rules = (tg_rule *)(ctx + 1);
  ctx->limits = (tg_ngx_limit **)(ctx->rules + n);
  return ctx;
}

/* A cost=$var value: digits only. A cost above the quota's limit and
 * burst is refused with "never" whatever it is, so it is taken as that
 * bound + 1 (q's are at most 2^63 - 1, as ngx_atoof read them): a number
 * beyond 64 bits is such a cost, not the server's 500, and a window that
 * has counted cannot overflow adding it (TG_EOVERFLOW, a failure). */
static ngx_int_t parse_cost(const ngx_str_t *c, const tg_quota *q,
                            uint64_t *cost) {
  uint64_t top = q->limit > q->burst ? q->limit : q->burst;
  uint64_t v = 0;
  for (size_t i = 0; i < c->len; i++) {
    if (c->data[i] < '0' || c->data[i] > '9')
      return NGX_ERROR;
    uint64_t d = (uint64_t)(c->data[i] - '0');
    v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
  }
  *cost = v > top && top < UINT64_MAX ? top + 1 : v;
  return NGX_OK;
}

/* One rule per line whose key is not empty: key and cost evaluated. */
static ngx_int_t collect_rules(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                               tg_ngx_ctx *ctx) {
  tg_ngx_limit *lines = lcf->limits->elts;
  for (ngx_uint_t i = 0; i < lcf->limits->nelts; i++) {
    tg_ngx_limit *l = &lines[i];
    ngx_str_t key;
    if (l->zone->key_var >= 0 && !lcf->queues) {
      /* as the script engine reads it (an error or a variable not found:
       * empty), not copied: the handler is done with it before it returns.
       * In a location that queues, every line's slot may be given back
       * when the request ends (tg_cancel_rules): its key is the copy the
       * script engine makes in the request's pool. */
      ngx_http_variable_value_t *vv =
          ngx_http_get_flushed_variable(r, (ngx_uint_t)l->zone->key_var);
      key.len = vv && !vv->not_found ? vv->len : 0;
      key.data = key.len ? vv->data : NULL;
    } else if (ngx_http_complex_value(r, &l->zone->key, &key) != NGX_OK)
      return NGX_ERROR;
    if (key.len == 0)
      continue; /* as limit_req: an empty key is not limited */
    if (key.len > TG_KEY_MAX && shorten_key(r, &key, l->zone->redis) != NGX_OK)
      return NGX_ERROR;
    uint64_t cost = l->cost;
    ngx_str_t c = ngx_null_string;
    if (l->cost_cv) {
      if (ngx_http_complex_value(r, l->cost_cv, &c) != NGX_OK)
        return NGX_ERROR;
    }
    if (l->cost_cv && c.len > 0 && /* empty: the default cost, 1 */
        parse_cost(&c, &l->q, &cost) != NGX_OK) {
      ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                    "tollgate: zone \"%V\": cost \"%V\" is not a whole "
                    "number",
                    &l->zone->name, &c);
      return NGX_ERROR;
    }
    tg_rule *rule = &ctx->rules[ctx->n];
    rule->lim = l->zone->lim;
    rule->key = key.data;
    rule->key_len = key.len;
    rule->q = &l->q;
    rule->cost = cost;
    ctx->limits[ctx->n++] = l;
  }
  return NGX_OK;
}

/* Whether one of the request's lines delays (limit_req's queue). */
static ngx_int_t reserving(const tg_ngx_ctx *ctx) {
  for (ngx_uint_t i = 0; i < ctx->n; i++)
    if (ctx->limits[i]->mode == TG_NGX_RESERVE)
      return 1;
  return 0;
}

/* A policy of reservations answered (rc, ok, each line's delay): the line
 * whose delay the request waits, and a dry run's answer (decided and
 * recorded, let through now, as shadow mode does). */
static void reservation_answered(tg_ngx_loc_conf *lcf, tg_ngx_ctx *ctx, int rc,
                                 bool ok, const uint64_t *delay_ns,
                                 uint64_t *delay_ms) {
  for (ngx_uint_t i = 0; i < ctx->n; i++)
    if (delay_ns[i] > delay_ns[ctx->delayed_by])
      ctx->delayed_by = i;
  if (rc == 0 && lcf->dry_run && (!ok || *delay_ms)) {
    ctx->rr.r.shadow_denied = 1;
    ctx->rr.r.allowed = 1;
    for (ngx_uint_t i = 0; i < ctx->n; i++) {
      tg_result *res = &ctx->rules[i].result;
      if (!res->allowed || delay_ns[i]) {
        res->shadow_denied = 1;
        res->allowed = 1; /* no Retry-After in a dry run */
      }
    }
    ctx->state = ok ? TG_NGX_DELAYED_DRY_RUN : TG_NGX_REJECTED_DRY_RUN;
    *delay_ms = 0;
  } else if (rc != 0 && lcf->dry_run && ctx->rr.r.degraded &&
             !ctx->rr.r.allowed) {
    /* a store failure the failure policy denied: let through, as
     * TG_RULES_SHADOW lets a plain policy's through (tg_hit_rules);
     * refused input (not degraded) stays refused */
    ctx->rr.r.shadow_denied = 1;
    ctx->rr.r.allowed = 1;
    for (ngx_uint_t i = 0; i < ctx->n; i++) {
      ctx->rules[i].result.shadow_denied = 1;
      ctx->rules[i].result.allowed = 1;
    }
    *delay_ms = 0;
  }
}

/* Lines of which one or more delay: one policy of reservations, as
 * limit_req decides several lines (every line checked; one that rejects
 * rejects the request and charges no line; else every line is charged and
 * the request waits the longest of their delays). *delay_ms: how long. */
static int reserve(ngx_http_request_t *r, tg_ngx_loc_conf *lcf, tg_ngx_ctx *ctx,
                   uint64_t *delay_ms) {
  uint64_t wait[TG_RULES_MAX];
  for (ngx_uint_t i = 0; i < ctx->n; i++)
    wait[i] = ctx->limits[i]->mode == TG_NGX_RESERVE
                  ? ctx->limits[i]->max_wait_ns
                  : 0; /* a nodelay line: a plain hit */
  ctx->res = ngx_palloc(r->pool, ctx->n * sizeof(tg_reservation));
  if (ctx->res == NULL)
    return TG_ENOMEM;
  tg_rules_reservation out;
  int rc = tg_reserve_rules(ctx->rules, ctx->n, wait, TG_RULES_WAIT_NS, &out,
                            ctx->res);
  ctx->rr = out.rules;
  *delay_ms = out.ok ? out.delay_ms : 0;
  uint64_t delay_ns[TG_RULES_MAX];
  for (ngx_uint_t i = 0; i < ctx->n; i++)
    delay_ns[i] = ctx->res[i].delay_ns;
  reservation_answered(lcf, ctx, rc, out.ok, delay_ns, delay_ms);
  return rc;
}

/* Parks the request on a timer; tg_ngx_delay_done runs the phases again. */
static ngx_int_t delay(ngx_http_request_t *r, tg_ngx_ctx *ctx,
                       uint64_t delay_ms) {
  ctx->state = TG_NGX_DELAYED;
  ctx->waiting = 1;
  if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK)
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  r->read_event_handler = ngx_http_test_reading;
  r->write_event_handler = tg_ngx_delay_done;
  r->connection->write->delayed = 1;
  ngx_add_timer(r->connection->write, (ngx_msec_t)delay_ms);
  return NGX_AGAIN;
}

static ngx_int_t decided_slow(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                              tg_ngx_ctx *ctx, int rc, uint64_t delay_ms);

/* The answer (ctx->rr, rc), as the request's fate: pass, refuse or wait.
 * Inline, the common case: the answer lets the request go on at once with
 * nothing to log; decided_slow() is the rest. */
static ngx_inline ngx_int_t decided(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                                    tg_ngx_ctx *ctx, int rc,
                                    uint64_t delay_ms) {
  if (rc == 0 && ctx->rr.r.allowed && !ctx->rr.r.shadow_denied &&
      delay_ms == 0 && ctx->state == TG_NGX_UNDECIDED) {
    ctx->state = TG_NGX_PASSED;
    return NGX_DECLINED;
  }
  return decided_slow(r, lcf, ctx, rc, delay_ms);
}

/* A Redis zone's answer (the only line of its location), as a memory
 * zone's would be applied, with its delay when the line reserves; a dry
 * run lets a denial or a delay through, as shadow mode does (a failure
 * policy's denial too). */
static ngx_int_t redis_answer(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                              tg_ngx_ctx *ctx, int rc, const tg_result *res,
                              uint64_t delay_ms) {
  tg_rule *rule = &ctx->rules[0];
  rule->status = rc;
  rule->result = *res;
  if (lcf->dry_run && (!rule->result.allowed || delay_ms > 0)) {
    if (rc == 0 && delay_ms > 0)
      ctx->state = TG_NGX_DELAYED_DRY_RUN;
    rule->result.allowed = 1;
    rule->result.shadow_denied = 1;
    delay_ms = 0;
  }
  ctx->rr.r = rule->result;
  ctx->rr.tightest = 0;
  ctx->rr.denied_by = res->allowed ? TG_RULE_NONE : 0;
  return decided(r, lcf, ctx, rc, delay_ms);
}

/* A Redis policy's answer (several lines), as tg_hit_rules's (or, with a
 * line that queues, tg_reserve_rules's) on shared-memory zones is
 * applied: every rule's result, the policy's, its delay. */
static ngx_int_t redis_policy_answer(ngx_http_request_t *r,
                                     tg_ngx_loc_conf *lcf, tg_ngx_ctx *ctx,
                                     tg_ngx_pending *p) {
  uint64_t delay_ns[TG_RULES_MAX];
  for (ngx_uint_t i = 0; i < ctx->n; i++) {
    ctx->rules[i].status = p->nr[i].status;
    ctx->rules[i].result = p->nr[i].result;
    delay_ns[i] = p->nr[i].delay_ns;
  }
  ctx->rr.r = p->req.result;
  ctx->rr.denied_by = p->req.denied_by;
  ctx->rr.tightest = p->req.tightest;
  uint64_t delay_ms = p->req.result.allowed ? p->req.delay_ms : 0;
  if (reserving(ctx))
    reservation_answered(lcf, ctx, p->req.status, p->req.result.allowed,
                         delay_ns, &delay_ms);
  return decided(r, lcf, ctx, p->req.status, delay_ms);
}

/* The answer when a line's zone has no client in this worker (logged at
 * its start): that zone's on_error, for every rule. */
static ngx_int_t redis_no_client(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                                 tg_ngx_ctx *ctx, ngx_uint_t at) {
  tg_result res;
  ngx_memzero(&res, sizeof(res));
  res.allowed = ctx->limits[at]->zone->on_error == TG_POLICY_FAIL_OPEN;
  res.degraded = 1;
  res.retry_after_ms = res.allowed ? 0 : ctx->rules[at].q->period_ms;
  if (ctx->n == 1)
    return redis_answer(r, lcf, ctx, TG_ENOMEM, &res, 0);
  for (ngx_uint_t i = 0; i < ctx->n; i++) {
    ctx->rules[i].status = i == at ? TG_ENOMEM : 0;
    ctx->rules[i].result = res;
  }
  ctx->rr.r = res;
  ctx->rr.denied_by = at;
  ctx->rr.tightest = at;
  return decided(r, lcf, ctx, TG_ENOMEM, 0);
}

/* A Redis zone: submit the decision (several lines: one policy, through
 * the first line's client), and wait for it unless the client answered at
 * once (a server marked down, invalid input). */
static ngx_int_t redis_decide(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                              tg_ngx_ctx *ctx) {
  tg_ngx_zone *z = ctx->limits[0]->zone;
  tg_rule *rule = &ctx->rules[0];
  for (ngx_uint_t i = 0; i < ctx->n; i++)
    if (ctx->limits[i]->zone->nb == NULL)
      return redis_no_client(r, lcf, ctx, i);
  ngx_uint_t n = ctx->n;
  size_t extra = n > 1 ? n * (sizeof(tg_nb_rule) + TG_KEY_MAX) : 0;
  tg_ngx_pending *p = ngx_alloc(sizeof(*p) + extra, r->connection->log);
  if (p == NULL)
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  ngx_memzero(&p->req, sizeof(p->req));
  p->n = n;
  p->nr = NULL;
  p->req.data = p;
  p->r = r;
  p->lcf = lcf;
  p->ctx = ctx;
  p->parked = 0;
  int rc;
  if (n > 1) {
    /* the keys copied: the request's pool may go first */
    _Static_assert(sizeof(tg_ngx_pending) % _Alignof(tg_nb_rule) == 0,
                   "the rules follow the pending aligned");
    p->nr = (tg_nb_rule *)(p + 1);
    u_char *keys = (u_char *)(p->nr + n);
    for (ngx_uint_t i = 0; i < n; i++) {
      tg_rule *ru = &ctx->rules[i];
      ngx_memcpy(keys + i * TG_KEY_MAX, ru->key, ru->key_len);
      tg_ngx_limit *l = ctx->limits[i];
      p->nr[i] = (tg_nb_rule){l->zone->nb,
                              keys + i * TG_KEY_MAX,
                              ru->key_len,
                              ru->q,
                              ru->cost,
                              l->mode == TG_NGX_RESERVE ? l->max_wait_ns : 0,
                              0,
                              {0},
                              0};
    }
    /* a dry run of lines that queue is applied to the answer, as on
     * shared-memory zones (reservation_answered) */
    rc = tg_nb_submit_rules(
        z->nb, &p->req, p->nr, n,
        TG_RULES_WAIT_NS |
            (lcf->dry_run && !reserving(ctx) ? TG_RULES_SHADOW : 0u));
    if (rc == TG_EINVAL) /* keys in two slots (the rest nginx -t saw) */
      ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                    "tollgate: zone \"%V\": the location's Redis lines "
                    "cannot be one policy for this request: their "
                    "keys must be in one Redis Cluster slot, see the "
                    "README",
                    &ctx->limits[p->req.denied_by < n ? p->req.denied_by : 0]
                         ->zone->name);
    if (rc != 0) { /* refused: answered, not pending */
      ngx_int_t out = redis_policy_answer(r, lcf, ctx, p);
      ngx_free(p);
      return out;
    }
  } else {
    ngx_memcpy(p->key, rule->key, rule->key_len); /* the pool may go first */
    p->req.key = p->key;
    p->req.key_len = rule->key_len;
    p->req.q = rule->q;
    p->req.cost = rule->cost;
    /* decided as a shared-memory zone's one line is (a one-rule policy): a
     * refused cost is not counted in a fixed window; limit_req's queue is
     * a reservation */
    p->req.flags = TG_NB_RULE;
    if (ctx->limits[0]->mode == TG_NGX_RESERVE) {
      p->req.flags |= TG_NB_RESERVE | TG_NB_WAIT_NS;
      p->req.max_wait_ms = ctx->limits[0]->max_wait_ns; /* in ns */
    }
    rc = tg_nb_submit(z->nb, &p->req);
    if (rc != 0) { /* refused input: answered, not pending */
      tg_result res = p->req.result;
      ngx_free(p);
      return redis_answer(r, lcf, ctx, rc, &res, 0);
    }
  }
  ngx_queue_insert_tail(&z->pending, &p->queue);
  ctx->pending = p;
  redis_pump(z);
  if (ctx->pending == NULL) { /* done already */
    ctx->resume = 0;
    return ctx->resume_rc;
  }
  p->parked = 1;
  if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
    /* finalised with an error, maybe not freed yet (post_action): the
     * answer must not run its phases again */
    p->ctx = NULL;
    ctx->pending = NULL;
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  r->read_event_handler = ngx_http_test_reading;
  r->write_event_handler = ngx_http_request_empty_handler;
  return NGX_AGAIN;
}

/* The preaccess handler: decide once, then pass, refuse or wait. */
static ngx_int_t tg_ngx_handler(ngx_http_request_t *r) {
  tg_ngx_loc_conf *lcf =
      ngx_http_get_module_loc_conf(r, ngx_http_tollgate_module);
  if (r != r->main)
    return NGX_DECLINED;
  tg_ngx_ctx *ctx = ngx_http_get_module_ctx(r, ngx_http_tollgate_module);
  if (ctx && ctx->pending)
    return NGX_AGAIN;       /* Redis has not answered yet */
  if (ctx && ctx->resume) { /* Redis answered: decided as then */
    ctx->resume = 0;
    return ctx->resume_rc;
  }
  if (lcf->limits == NULL)
    return NGX_DECLINED; /* not limited */
  /* decided already (before an internal redirect)? Only a decision with a
   * rule counts: a location whose keys were all empty, or whose cost was
   * not a number, decided nothing, and the location a redirect leads to
   * still limits the request, as limit_req's does */
  ctx = get_ctx(r);
  if (ctx != NULL && ctx->n > 0)
    return NGX_DECLINED;
  ctx = new_ctx(r, lcf);
  if (ctx == NULL)
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  if (collect_rules(r, lcf, ctx) != NGX_OK) {
    ctx->n = 0; /* nothing was decided */
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  if (ctx->n == 0) {
    ctx->state = TG_NGX_PASSED;
    return NGX_DECLINED;
  }
  if (ctx->limits[0]->zone->redis)
    return redis_decide(r, lcf, ctx);
  uint64_t delay_ms = 0;
  int rc = reserving(ctx)
               ? reserve(r, lcf, ctx, &delay_ms)
               : tg_hit_rules(ctx->rules, ctx->n,
                              lcf->dry_run ? TG_RULES_SHADOW : 0, &ctx->rr);
  return decided(r, lcf, ctx, rc, delay_ms);
}

/* decided()'s other cases: a failure, a dry run's would-be refusal or
 * delay, a refusal, a delay. */
static ngx_int_t decided_slow(ngx_http_request_t *r, tg_ngx_loc_conf *lcf,
                              tg_ngx_ctx *ctx, int rc, uint64_t delay_ms) {
  const tg_result *res = &ctx->rr.r;
  size_t blame =
      ctx->rr.denied_by == TG_RULE_NONE ? ctx->delayed_by : ctx->rr.denied_by;
  ngx_str_t *zname = &ctx->limits[blame]->zone->name;
  ngx_log_t *log = r->connection->log;

  if (rc != 0) {
    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "tollgate: zone \"%V\": %s (%s); the request is %s", zname,
                  tg_strerror(rc), tg_err_name(rc),
                  res->allowed ? "let through" : "rejected");
    ctx->state = TG_NGX_FAILED;
    return res->allowed ? NGX_DECLINED : (ngx_int_t)lcf->status;
  }
  if (ctx->state == TG_NGX_UNDECIDED && res->shadow_denied)
    ctx->state = TG_NGX_REJECTED_DRY_RUN;
  if (ctx->state != TG_NGX_UNDECIDED) { /* a dry run's would-be refusal */
    ngx_log_error(lcf->log_level, log, 0,
                  "tollgate: dry run: would %s request by zone \"%V\"",
                  ctx->state == TG_NGX_DELAYED_DRY_RUN ? "delay" : "reject",
                  zname);
    return NGX_DECLINED;
  }
  if (!res->allowed) {
    ctx->state = TG_NGX_REJECTED;
    if (res->retry_after_ms == TG_NEVER) { /* a cost no wait lets through */
      ngx_log_error(lcf->log_level, log, 0,
                    "tollgate: rejecting request by zone \"%V\", which "
                    "never lets it through",
                    zname);
    } else {
      ngx_log_error(lcf->log_level, log, 0,
                    "tollgate: rejecting request by zone \"%V\", retry after "
                    "%uL ms",
                    zname, res->retry_after_ms);
    }
    return (ngx_int_t)lcf->status;
  }
  if (delay_ms == 0) {
    ctx->state = TG_NGX_PASSED;
    return NGX_DECLINED;
  }
  ngx_log_error(lcf->delay_log_level, log, 0,
                "tollgate: delaying request by zone \"%V\" for %uL ms", zname,
                delay_ms);
  return delay(r, ctx, delay_ms);
}

/* ---- response header fields ---------------------------------------------- */

/* Adds the "Name: value\r\n" lines tg_http_headers wrote. */
static ngx_int_t add_fields(ngx_http_request_t *r, u_char *p, u_char *end) {
  while (p < end) {
    u_char *colon = ngx_strlchr(p, end, ':');
    u_char *eol = ngx_strlchr(p, end, '\r');
    if (colon == NULL || eol == NULL || colon > eol || eol + 2 > end)
      return NGX_ERROR;
    ngx_table_elt_t *h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL)
      return NGX_ERROR;
    h->hash = 1;
    h->key.data = p;
    h->key.len = (size_t)(colon - p);
    h->value.data = colon + 2;
    h->value.len = (size_t)(eol - colon - 2);
    h->lowcase_key = NULL;
    p = eol + 2;
  }
  return NGX_OK;
}

static ngx_int_t tg_ngx_header_filter(ngx_http_request_t *r) {
  if (r != r->main)
    return next_header_filter(r);
  tg_ngx_ctx *ctx = get_ctx(r);
  /* nothing decided (a cost that could not be read answers 500 before
   * any line is decided), or the store failed: no numbers to give */
  if (ctx == NULL || ctx->n == 0 || ctx->headers == TG_NGX_HEADERS_OFF ||
      ctx->state == TG_NGX_UNDECIDED || ctx->state == TG_NGX_FAILED)
    return next_header_filter(r);
  tg_http_limit limits[TG_RULES_MAX];
  for (ngx_uint_t i = 0; i < ctx->n; i++) {
    limits[i].name = (const char *)ctx->limits[i]->zone->name.data;
    limits[i].q = ctx->rules[i].q;
    limits[i].r = &ctx->rules[i].result;
    limits[i].pk = NULL;
    limits[i].pk_len = 0;
  }
  unsigned flags =
      TG_HTTP_RETRY_AFTER |
      (ctx->headers == TG_NGX_HEADERS_LEGACY ? TG_HTTP_LEGACY : TG_HTTP_IETF);
  size_t len = 0, cap = 512;
  for (int attempt = 0; attempt < 2; attempt++) {
    u_char *buf = ngx_pnalloc(r->pool, cap);
    if (buf == NULL)
      return NGX_ERROR;
    int rc = tg_http_headers((char *)buf, cap, &len, limits, ctx->n, flags);
    if (rc == 0) {
      if (add_fields(r, buf, buf + len) != NGX_OK)
        return NGX_ERROR;
      break;
    }
    if (rc != TG_ERANGE) {
      ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                    "tollgate: header fields: %s", tg_strerror(rc));
      break;
    }
    cap = len + 1;
  }
  return next_header_filter(r);
}

/* ---- variables ---------------------------------------------------------- */

static ngx_int_t var_number(ngx_http_request_t *r, ngx_http_variable_value_t *v,
                            uint64_t n) {
  u_char *p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
  if (p == NULL)
    return NGX_ERROR;
  v->len = (unsigned)(ngx_sprintf(p, "%uL", n) - p);
  v->data = p;
  v->valid = 1;
  v->no_cacheable = 1;
  v->not_found = 0;
  return NGX_OK;
}

/* data: 0 $tollgate_status, 1 $tollgate_remaining, 2 $tollgate_retry_after */
static ngx_int_t tg_ngx_variable(ngx_http_request_t *r,
                                 ngx_http_variable_value_t *v, uintptr_t data) {
  tg_ngx_ctx *ctx = get_ctx(r->main);
  if (ctx == NULL || ctx->state == TG_NGX_UNDECIDED ||
      (data != 0 && ctx->n == 0)) {
    v->not_found = 1;
    return NGX_OK;
  }
  if (data == 0) {
    v->len = (unsigned)state_names[ctx->state].len;
    v->data = state_names[ctx->state].data;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    return NGX_OK;
  }
  if (data == 1)
    return var_number(r, v, ctx->rr.r.remaining);
  uint64_t ms = ctx->rr.r.retry_after_ms;
  if (ms == TG_NEVER) {
    v->len = 5;
    v->data = (u_char *)"never";
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    return NGX_OK;
  }
  return var_number(r, v, (ms + 999) / 1000);
}

static ngx_http_variable_t tg_ngx_vars[] = {
    {ngx_string("tollgate_status"), NULL, tg_ngx_variable, 0,
     NGX_HTTP_VAR_NOCACHEABLE, 0},
    {ngx_string("tollgate_remaining"), NULL, tg_ngx_variable, 1,
     NGX_HTTP_VAR_NOCACHEABLE, 0},
    {ngx_string("tollgate_retry_after"), NULL, tg_ngx_variable, 2,
     NGX_HTTP_VAR_NOCACHEABLE, 0},
    ngx_http_null_variable};

static ngx_int_t tg_ngx_preconfiguration(ngx_conf_t *cf) {
  for (ngx_http_variable_t *v = tg_ngx_vars; v->name.len; v++) {
    ngx_http_variable_t *var = ngx_http_add_variable(cf, &v->name, v->flags);
    if (var == NULL)
      return NGX_ERROR;
    var->get_handler = v->get_handler;
    var->data = v->data;
  }
  return NGX_OK;
}

static ngx_int_t tg_ngx_postconfiguration(ngx_conf_t *cf) {
  ngx_http_core_main_conf_t *cmcf =
      ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
  ngx_http_handler_pt *h =
      ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
  if (h == NULL)
    return NGX_ERROR;
  *h = tg_ngx_handler;
  next_header_filter = ngx_http_top_header_filter;
  ngx_http_top_header_filter = tg_ngx_header_filter;
  return NGX_OK;
}
