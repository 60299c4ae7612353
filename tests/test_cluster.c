/* SPDX-License-Identifier: MIT */
/*
 * test_cluster.c - the Redis store and the non-blocking API on a real Redis
 * Cluster of three masters with a replica each, which
 * tests/redis/with_cluster.sh starts on loopback ports (and kills, however
 * this ends). Run through CTest (test_cluster, and test_cluster_module with
 * the module loaded in every node), after the acceptance suites have run on
 * the same cluster; the tests run in order and the last one kills a master.
 *
 *   - the slot the library computes for a key is the server's, for binary
 *     keys and braces, and a key lands on the node that serves its slot;
 *   - exact limits across the cluster from several processes and threads,
 *     single calls and batches spread over every node: admitted == limit per
 *     key, and every call counted exactly once;
 *   - a slot resharded while traffic runs: MOVED and ASK are followed (the
 *     client's counts equal the servers' own error statistics), and no
 *     decision is lost or counted twice;
 *   - the non-blocking API follows MOVED too, and is exact;
 *   - a migration's end told to the source first (MOVED both ways): calls
 *     pass, at the importing node after ASKING;
 *   - a master killed: its slots' decisions are degraded (the failure
 *     policy's answer) while the other masters' stay exact, until the
 *     replica is promoted; then the same limiter is exact again. The
 *     non-blocking client too, with calls on the dying master's link
 *     (written and unanswered, one cut part-way, others queued): each
 *     completes once, none runs on the promoted replica.
 * No sleep is an assertion: every wait polls for a state, with a generous
 * bound for a loaded two-core machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fds.h"
#include "nb_poll.h"
#include "store/redis_slots.h"
#include "tollgate.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int ports[6];
static bool dead[6];
static char seeds[128];

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void load_ports(void) {
  const char *s = getenv("TG_TEST_CLUSTER_PORTS");
  if (!s) {
    fprintf(stderr, "TG_TEST_CLUSTER_PORTS is not set: run this program "
                    "through tests/redis/with_cluster.sh (CTest does)\n");
    exit(1);
  }
  for (int i = 0; i < 6; i++) {
    ports[i] = atoi(s);
    s = strchr(s, ',');
    s = s ? s + 1 : "";
  }
  snprintf(seeds, sizeof seeds, "127.0.0.1:%d,127.0.0.1:%d", ports[0],
           ports[3]);
}

static redisContext *node(int port) {
  struct timeval tv = {5, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (!c || c->err) {
    if (c)
      redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  return c;
}

/* A command on node `port`; the reply is the caller's (NULL: no answer). */
static redisReply *on(int port, const char *fmt, ...) {
  redisContext *c = node(port);
  if (!c)
    return NULL;
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  redisFree(c);
  return r;
}

static bool ok_on(int port, const char *what, const char *arg1,
                  const char *arg2) {
  redisReply *r = on(port, what, arg1, arg2);
  bool ok = r && r->type != REDIS_REPLY_ERROR;
  if (r && !ok)
    print_error("node %d: %s\n", port, r->str);
  if (r)
    freeReplyObject(r);
  return ok;
}

static int live_port(void) {
  for (int i = 0; i < 6; i++)
    if (!dead[i])
      return ports[i];
  return 0;
}

/* The port of the master that serves `slot`, as node `ask` sees it. */
static int master_of(unsigned slot, int ask) {
  redisReply *r = on(ask, "CLUSTER SLOTS");
  int port = 0;
  for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements;
       i++) {
    redisReply *e = r->element[i];
    if ((unsigned)e->element[0]->integer <= slot &&
        slot <= (unsigned)e->element[1]->integer)
      port = (int)e->element[2]->element[1]->integer;
  }
  if (r)
    freeReplyObject(r);
  return port;
}

static unsigned keyslot(const char *name, size_t len) {
  redisReply *r = on(live_port(), "CLUSTER KEYSLOT %b", name, len);
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_INTEGER);
  unsigned s = (unsigned)r->integer;
  freeReplyObject(r);
  return s;
}

static void node_id(int port, char *out) {
  redisReply *r = on(port, "CLUSTER MYID");
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_STRING);
  snprintf(out, 64, "%s", r->str);
  freeReplyObject(r);
}

/* errorstat_NAME's count on node port (0 when absent). */
static long long errorstat(int port, const char *name) {
  redisReply *r = on(port, "INFO errorstats");
  long long n = 0;
  if (r && r->type == REDIS_REPLY_STRING) {
    char pat[64];
    snprintf(pat, sizeof pat, "errorstat_%s:count=", name);
    const char *p = strstr(r->str, pat);
    if (p)
      n = strtoll(p + strlen(pat), NULL, 10);
  }
  if (r)
    freeReplyObject(r);
  return n;
}

static long long errorstat_all(const char *name) {
  long long n = 0;
  for (int i = 0; i < 6; i++)
    if (!dead[i])
      n += errorstat(ports[i], name);
  return n;
}

static void resetstat_all(void) {
  for (int i = 0; i < 6; i++)
    if (!dead[i])
      assert_true(ok_on(ports[i], "CONFIG RESETSTAT", NULL, NULL));
}

static int index_of(int port) {
  for (int i = 0; i < 6; i++)
    if (ports[i] == port)
      return i;
  return -1;
}

static tg_limiter *limiter(tg_algorithm alg, const char *prefix,
                           tg_policy policy, uint32_t pool) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = policy;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.cluster_nodes = seeds;
  rc.key_prefix = prefix;
  rc.pool_size = pool;
  /* generous: two cores shared by six servers and the test */
  rc.connect_timeout_ms = 3000;
  rc.command_timeout_ms = 3000;
  rc.reconnect_backoff_ms = 100;
  cfg.redis = &rc;
  tg_limiter *lim = NULL;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  return lim;
}

static char *prefix_of(const char *what) {
  static char buf[16][48];
  static unsigned n;
  char *p = buf[n++ % 16];
  snprintf(p, 48, "cl%ld.%s", (long)getpid(), what);
  return p;
}

/* The key name the library uses, as the server must hash it. */
static size_t name_of(const char *prefix, const void *key, size_t len,
                      const char *alg, char *out) {
  size_t n = (size_t)snprintf(out, 64, "%s:{", prefix);
  memcpy(out + n, key, len);
  n += len;
  n += (size_t)snprintf(out + n, 16, "}:%s", alg);
  return n;
}

/* ---- a node that refuses connections ---------------------------------------
 */

/* A blocking call on a key whose master refuses new connections (at
 * maxclients, one client held open here) returns, by the failure policy,
 * instead of reconnecting to it without end; once the node takes clients
 * again, so does the limiter. Before, the refusal was taken for a user
 * without COMMAND and the close that follows it left the call queued: the
 * call spun reconnecting (a child, killed here after 20 s). */
static void refusing_node_fails_fast(void **state) {
  (void)state;
  const char *prefix = prefix_of("refuse");
  char name[64];
  size_t n = name_of(prefix, "r", 1, "fixed_window", name);
  int port = master_of(keyslot(name, n), live_port());
  assert_true(port > 0);
  redisContext *held = redisConnect("127.0.0.1", port);
  assert_non_null(held);
  assert_int_equal(held->err, 0);
  redisReply *r = redisCommand(held, "CONFIG SET maxclients 1");
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_STATUS);
  freeReplyObject(r);
  pid_t pid = fork();
  if (pid == 0) {
    tg_limiter *lim =
        limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_FAIL_CLOSED, 1);
    const tg_quota q = {.limit = 5, .period_ms = 60000};
    tg_result res;
    int rc = tg_hit(lim, "r", 1, &q, 1, &res);
    tg_limiter_destroy(lim);
    _exit(rc != TG_OK && res.degraded && !res.allowed ? 0 : 1);
  }
  assert_true(pid > 0);
  int status = -1;
  for (int i = 0; i < 2000 && waitpid(pid, &status, WNOHANG) == 0; i++)
    sleep_ms(10);
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    status = -1;
  }
  r = redisCommand(held, "CONFIG SET maxclients 10000");
  assert_non_null(r);
  freeReplyObject(r);
  redisFree(held);
  assert_true(status != -1 && WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  /* the node takes clients again: so does a limiter */
  tg_limiter *lim = limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_FAIL_CLOSED, 1);
  const tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result res;
  assert_int_equal(tg_hit(lim, "r", 1, &q, 1, &res), TG_OK);
  assert_true(res.allowed);
  tg_limiter_destroy(lim);
}

/* ---- slots ------------------------------------------------------------------
 */

static void slots_are_the_servers(void **state) {
  (void)state;
  uint64_t x = 0x9e3779b97f4a7c15u ^ (uint64_t)time(NULL);
  char name[600];
  for (int i = 0; i < 1500; i++) {
    unsigned char key[24];
    size_t len = 1 + (size_t)(i % 23);
    for (size_t j = 0; j < len; j++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      /* braces are common: they end or open hash tags */
      key[j] = (x & 7) == 0   ? '{'
               : (x & 7) == 1 ? '}'
                              : (unsigned char)(x >> 8);
    }
    size_t n = name_of("tg", key, len, "fw", name);
    assert_int_equal(tg__key_slot(name, n), keyslot(name, n));
  }
  /* and a key lands on the master that serves its slot */
  tg_limiter *lim = limiter(TG_FIXED_WINDOW, "land", TG_POLICY_ERROR, 1);
  tg_quota q = {.limit = 5, .period_ms = 60000};
  for (int i = 0; i < 30; i++) {
    char key[16];
    snprintf(key, sizeof key, "k{%d}", i);
    tg_result r;
    assert_int_equal(tg_hit(lim, key, strlen(key), &q, 1, &r), TG_OK);
    size_t n = name_of("land", key, strlen(key), "fw", name);
    int port = master_of(keyslot(name, n), live_port());
    redisReply *e = on(port, "EXISTS %b", name, n);
    assert_non_null(e);
    assert_int_equal(e->type, REDIS_REPLY_INTEGER); /* not MOVED */
    assert_int_equal(e->integer, 1);
    freeReplyObject(e);
  }
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), TG_OK);
  assert_int_equal(st.moved, 0); /* the map was right from the start */
  assert_int_equal(st.slot_refreshes, 1);
  tg_limiter_destroy(lim);
}

static void cluster_config_is_validated(void **state) {
  (void)state;
  tg_config cfg;
  tg_config_init(&cfg);
  tg_redis_config rc;
  tg_limiter *lim;
  cfg.redis = &rc;
  static const char *const bad[] = {"",         "h",         "h:1,", "h:0",
                                    "h:1,,h:2", "[::1:7000", "a b:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_redis_config_init(&rc);
    rc.cluster_nodes = bad[i];
    assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  }
  tg_redis_config_init(&rc);
  rc.cluster_nodes = seeds;
  rc.unix_path = "/tmp/x.sock"; /* nodes are addressed by the cluster */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.cluster_nodes = seeds;
  rc.db = 1; /* a Cluster has database 0 only */
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  tg_redis_config_init(&rc);
  rc.cluster_nodes = seeds;
  rc.pool_size = 0;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  /* seeds where nothing listens: a store failure, the policy's answer */
  tg_redis_config_init(&rc);
  rc.cluster_nodes = "127.0.0.1:1,127.0.0.1:2";
  rc.key_prefix = "nobody";
  cfg.on_failure = TG_POLICY_FAIL_CLOSED;
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_OK);
  tg_quota q = {.limit = 5, .period_ms = 60000};
  tg_result r;
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ECONNECT);
  assert_true(r.degraded && !r.allowed);
  assert_int_equal(tg_hit(lim, "k", 1, &q, 1, &r), TG_ECONNECT);
  tg_limiter_destroy(lim);
  /* a decision leaves tg_last_error as the last tg_limiter_new left it:
   * connecting, the handshake and the replies write nothing there; and the
   * connections it opens are not inherited across exec */
  int inheritable = inheritable_sockets();
  tg_limiter *live =
      limiter(TG_FIXED_WINDOW, prefix_of("why"), TG_POLICY_ERROR, 1);
  tg_redis_config_init(&rc);
  rc.cluster_nodes = "h:0";
  assert_int_equal(tg_limiter_new(&lim, &cfg), TG_EINVAL);
  char why[256];
  snprintf(why, sizeof why, "%s", tg_last_error());
  assert_true(why[0] != '\0');
  for (int i = 0; i < 3; i++) {
    assert_int_equal(tg_hit(live, "k", 1, &q, 1, &r), TG_OK);
    assert_string_equal(tg_last_error(), why);
  }
  assert_int_equal(inheritable_sockets(), inheritable);
  tg_limiter_destroy(live);
}

/* ---- exact across processes
 * ---------------------------------------------------- */

enum { XP = 3, XT = 2, XK = 48, XL = 25, XCALLS = 40 };

typedef struct xthread {
  tg_limiter *lim;
  int id;
  long admitted[XK];
  long ok[XK];
  long errors;
} xthread;

static char xkeys[XK][16];
static tg_quota xq = {.limit = XL, .period_ms = 3600000};

static void *xrun(void *arg) {
  xthread *t = arg;
  for (int round = 0; round < XCALLS; round++) {
    if ((round + t->id) % 2 == 0) {
      /* a batch over every key: split per node, pipelined */
      tg_batch_item it[XK];
      for (int k = 0; k < XK; k++)
        it[k] = (tg_batch_item){xkeys[k], strlen(xkeys[k]), &xq, 1, 0, {0}};
      if (tg_hit_batch(t->lim, it, XK) != TG_OK) {
        t->errors += XK;
        continue;
      }
      for (int k = 0; k < XK; k++) {
        if (it[k].status != TG_OK) {
          t->errors++;
          continue;
        }
        t->ok[k]++;
        t->admitted[k] += it[k].result.allowed;
      }
    } else {
      for (int k = 0; k < XK; k++) {
        tg_result r;
        if (tg_hit(t->lim, xkeys[k], strlen(xkeys[k]), &xq, 1, &r) != TG_OK) {
          t->errors++;
          continue;
        }
        t->ok[k]++;
        t->admitted[k] += r.allowed;
      }
    }
  }
  return NULL;
}

/* One process: XT threads on one limiter; totals into *out. */
static void xprocess(const char *prefix, xthread *out) {
  tg_limiter *lim =
      limiter(TG_FIXED_WINDOW_PER_KEY, prefix, TG_POLICY_ERROR, 2);
  xthread t[XT];
  pthread_t th[XT];
  for (int i = 0; i < XT; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].lim = lim;
    t[i].id = i;
    pthread_create(&th[i], NULL, xrun, &t[i]);
  }
  memset(out, 0, sizeof *out);
  for (int i = 0; i < XT; i++) {
    pthread_join(th[i], NULL);
    for (int k = 0; k < XK; k++) {
      out->admitted[k] += t[i].admitted[k];
      out->ok[k] += t[i].ok[k];
    }
    out->errors += t[i].errors;
  }
  tg_limiter_destroy(lim);
}

static void exact_across_processes(void **state) {
  (void)state;
  const char *prefix = prefix_of("exact");
  for (int k = 0; k < XK; k++)
    snprintf(xkeys[k], sizeof xkeys[k], "user:%d", k);
  int fds[XP][2];
  pid_t pid[XP];
  for (int p = 0; p < XP; p++) {
    assert_int_equal(pipe(fds[p]), 0);
    pid[p] = fork();
    assert_true(pid[p] >= 0);
    if (pid[p] == 0) {
      xthread sum;
      xprocess(prefix, &sum);
      ssize_t w = write(fds[p][1], &sum, sizeof sum);
      _exit(w == (ssize_t)sizeof sum ? 0 : 1);
    }
    close(fds[p][1]);
  }
  long admitted[XK] = {0}, ok[XK] = {0}, errors = 0;
  for (int p = 0; p < XP; p++) {
    xthread sum;
    size_t got = 0;
    while (got < sizeof sum) {
      ssize_t n = read(fds[p][0], (char *)&sum + got, sizeof sum - got);
      if (n <= 0)
        break;
      got += (size_t)n;
    }
    int status = 0;
    assert_int_equal(waitpid(pid[p], &status, 0), pid[p]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(got, sizeof sum);
    close(fds[p][0]);
    for (int k = 0; k < XK; k++) {
      admitted[k] += sum.admitted[k];
      ok[k] += sum.ok[k];
    }
    errors += sum.errors;
  }
  assert_int_equal(errors, 0);
  /* every key: exactly the limit admitted, every call counted once */
  tg_limiter *lim =
      limiter(TG_FIXED_WINDOW_PER_KEY, prefix, TG_POLICY_ERROR, 1);
  int nodes_used[6] = {0};
  for (int k = 0; k < XK; k++) {
    assert_int_equal(ok[k], XP * XT * XCALLS);
    assert_int_equal(admitted[k], XL);
    uint64_t count = 0;
    assert_int_equal(tg_get(lim, xkeys[k], strlen(xkeys[k]), &xq, &count),
                     TG_OK);
    assert_int_equal(count, (uint64_t)ok[k]);
    char name[96];
    size_t n = name_of(prefix, xkeys[k], strlen(xkeys[k]), "pk", name);
    nodes_used[index_of(master_of(keyslot(name, n), live_port()))] = 1;
  }
  assert_int_equal(nodes_used[0] + nodes_used[1] + nodes_used[2], 3);
  tg_limiter_destroy(lim);
}

/* ---- resharding under traffic
 * ------------------------------------------------- */

enum { RK = 16, RL = 40 };

typedef struct rshard {
  tg_limiter *lim;
  atomic_int *stop;
  char (*keys)[24];
  int nkeys;
  long ok[2 * RK], admitted[2 * RK], errors;
} rshard;

static tg_quota rq = {.limit = RL, .period_ms = 3600000};

static void *rtraffic(void *arg) {
  rshard *t = arg;
  for (unsigned i = 0; !atomic_load(t->stop); i++) {
    int k = (int)(i % (unsigned)t->nkeys);
    tg_result r;
    int rc = tg_hit(t->lim, t->keys[k], strlen(t->keys[k]), &rq, 1, &r);
    /* atomic: the main thread watches ok[] while this runs */
    if (rc != TG_OK) {
      __atomic_fetch_add(&t->errors, 1, __ATOMIC_RELAXED);
      continue;
    }
    __atomic_fetch_add(&t->ok[k], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&t->admitted[k], r.allowed, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* Keys whose tag ("rs", so one slot) puts them in slot `slot`. */
static void migrate_keys(int from, int to, unsigned slot) {
  for (;;) {
    redisReply *r = on(from, "CLUSTER GETKEYSINSLOT %u 1", slot);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    if (r->elements == 0) {
      freeReplyObject(r);
      return;
    }
    char key[128];
    snprintf(key, sizeof key, "%s", r->element[0]->str);
    size_t klen = r->element[0]->len;
    freeReplyObject(r);
    redisReply *m =
        on(from, "MIGRATE 127.0.0.1 %d %s 0 5000 KEYS %b", to, "", key, klen);
    assert_non_null(m);
    if (m->type == REDIS_REPLY_ERROR)
      print_error("MIGRATE: %s\n", m->str);
    assert_int_not_equal(m->type, REDIS_REPLY_ERROR);
    freeReplyObject(m);
    sleep_ms(30); /* let traffic meet the slot half moved: ASK */
  }
}

/* A slot's move between two live masters, by hand, as redis-cli --cluster
 * reshard makes it: move_pick names its source (the slot's master) and a
 * destination; move_begin marks the slot importing there and migrating at
 * the source; migrate_keys copies the keys; move_end gives the slot to the
 * destination, telling it first, then the source, then the third master
 * (the order that keeps every node's answer pointing one way;
 * source_told_first takes the other). */
typedef struct slot_move {
  unsigned slot;
  int from, to;
  char slot_s[8], from_id[64], to_id[64];
} slot_move;

static void move_pick(slot_move *m, unsigned slot) {
  m->slot = slot;
  m->from = master_of(slot, live_port());
  m->to = 0;
  for (int i = 0; i < 3 && !m->to; i++)
    if (ports[i] != m->from && !dead[i])
      m->to = ports[i];
  assert_true(m->from && m->to);
  node_id(m->from, m->from_id);
  node_id(m->to, m->to_id);
  snprintf(m->slot_s, sizeof m->slot_s, "%u", slot);
}

static void move_begin(const slot_move *m) {
  redisReply *r =
      on(m->to, "CLUSTER SETSLOT %s IMPORTING %s", m->slot_s, m->from_id);
  assert_true(r && r->type != REDIS_REPLY_ERROR);
  freeReplyObject(r);
  r = on(m->from, "CLUSTER SETSLOT %s MIGRATING %s", m->slot_s, m->to_id);
  assert_true(r && r->type != REDIS_REPLY_ERROR);
  freeReplyObject(r);
}

/* move_end's SETSLOTs, without an assertion (a helper thread calls it):
 * whether every node took its own. */
static bool give_slot(const slot_move *m) {
  int order[3] = {m->to, m->from, 0};
  for (int i = 0; i < 3; i++)
    if (ports[i] != m->to && ports[i] != m->from && !dead[i])
      order[2] = ports[i];
  bool ok = true;
  for (int i = 0; i < 3 && order[i]; i++)
    ok &= ok_on(order[i], "CLUSTER SETSLOT %s NODE %s", m->slot_s, m->to_id);
  return ok;
}

static void move_end(const slot_move *m) { assert_true(give_slot(m)); }

static bool wait_for(bool (*cond)(void *), void *ctx, int limit_ms) {
  uint64_t end = now_ms() + (uint64_t)limit_ms;
  while (!cond(ctx)) {
    if (now_ms() >= end)
      return false;
    sleep_ms(20);
  }
  return true;
}

static bool some_ask(void *ctx) {
  (void)ctx;
  return errorstat_all("ASK") > 0;
}

static bool some_moved(void *ctx) {
  (void)ctx;
  return errorstat_all("MOVED") > 0;
}

static void reshard_while_traffic_runs(void **state) {
  (void)state;
  const char *prefix = prefix_of("rs");
  /* keys "rs}N" all have the tag "rs": one slot. The first half exists
   * before the move; the second half is first hit during it (absent at the
   * source: created at the target through ASK). */
  static char keys[2 * RK][24];
  for (int k = 0; k < RK; k++) {
    snprintf(keys[k], sizeof keys[k], "rs}old%d", k);
    snprintf(keys[RK + k], sizeof keys[k], "rs}new%d", k);
  }
  char name[96];
  size_t nl = name_of(prefix, keys[0], strlen(keys[0]), "pk", name);
  slot_move mv;
  move_pick(&mv, keyslot(name, nl));
  tg_limiter *lim =
      limiter(TG_FIXED_WINDOW_PER_KEY, prefix, TG_POLICY_ERROR, 3);
  atomic_int stop = 0;
  enum { T = 3 };
  rshard t[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].lim = lim;
    t[i].stop = &stop;
    t[i].keys = keys;
    t[i].nkeys = RK; /* the old keys only, until the move starts */
  }
  /* the old keys exist (and the client knows the map) before the move */
  for (int k = 0; k < RK; k++) {
    tg_result r;
    assert_int_equal(tg_hit(lim, keys[k], strlen(keys[k]), &rq, 1, &r), TG_OK);
    t[0].ok[k]++;
    t[0].admitted[k] += r.allowed;
  }
  resetstat_all();
  for (int i = 0; i < T; i++) {
    t[i].nkeys = 2 * RK;
    pthread_create(&th[i], NULL, rtraffic, &t[i]);
  }
  /* the move, by hand: what redis-cli --cluster reshard does */
  move_begin(&mv);
  migrate_keys(mv.from, mv.to, mv.slot);
  /* the new keys met the half-moved slot (absent at the source) */
  assert_true(wait_for(some_ask, NULL, 20000));
  /* what was created meanwhile at the source */
  migrate_keys(mv.from, mv.to, mv.slot);
  move_end(&mv);
  /* the clients that still think "from" now hear MOVED */
  assert_true(wait_for(some_moved, NULL, 20000));
  long before = 0;
  for (int i = 0; i < T; i++)
    before += __atomic_load_n(&t[i].ok[0], __ATOMIC_RELAXED);
  for (;;) { /* a little more traffic on the new owner */
    long now = 0;
    for (int i = 0; i < T; i++)
      now += __atomic_load_n(&t[i].ok[0], __ATOMIC_RELAXED);
    if (now > before + 20)
      break;
    sleep_ms(20);
  }
  atomic_store(&stop, 1);
  long ok[2 * RK] = {0}, admitted[2 * RK] = {0}, errors = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    errors += t[i].errors;
  }
  for (int i = 0; i < T; i++)
    for (int k = 0; k < 2 * RK; k++) {
      ok[k] += t[i].ok[k];
      admitted[k] += t[i].admitted[k];
    }
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), TG_OK);
  long long server_ask = errorstat_all("ASK"),
            server_moved = errorstat_all("MOVED");
  print_message("slot %u moved from %d to %d: %lld ASK and %lld MOVED "
                "followed, %" PRIu64 " slot maps fetched\n",
                mv.slot, mv.from, mv.to, server_ask, server_moved,
                st.slot_refreshes);
  assert_int_equal(errors, 0);
  assert_true(st.ask > 0 && st.moved > 0);
  /* every redirection the servers sent, the client followed */
  assert_int_equal((long long)st.ask, server_ask);
  assert_int_equal((long long)st.moved, server_moved);
  /* nothing lost, nothing counted twice */
  for (int k = 0; k < 2 * RK; k++) {
    uint64_t count = 0;
    assert_int_equal(tg_get(lim, keys[k], strlen(keys[k]), &rq, &count), TG_OK);
    if ((long)count != ok[k] || admitted[k] != (ok[k] < RL ? ok[k] : RL)) {
      print_error("key %s: %ld calls answered, %ld admitted, server count "
                  "%" PRIu64 "\n",
                  keys[k], ok[k], admitted[k], count);
      fail();
    }
  }
  /* and the key lives where the slot now is */
  nl = name_of(prefix, keys[RK], strlen(keys[RK]), "pk", name);
  redisReply *e = on(mv.to, "EXISTS %b", name, nl);
  assert_true(e && e->type == REDIS_REPLY_INTEGER && e->integer == 1);
  freeReplyObject(e);
  tg_limiter_destroy(lim);
}

/* ---- the non-blocking API on the cluster
 * -------------------------------------- */

/* A non-blocking client of the cluster (from its seeds), names under
 * prefix. */
static tg_nb *nb_client_with(tg_algorithm alg, const char *prefix,
                             tg_policy policy) {
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = alg;
  cfg.on_failure = policy;
  tg_redis_config rc;
  tg_redis_config_init(&rc);
  rc.cluster_nodes = seeds;
  rc.key_prefix = prefix;
  cfg.redis = &rc;
  tg_nb *nb = NULL;
  assert_int_equal(tg_nb_new(&nb, &cfg), TG_OK);
  return nb;
}

static tg_nb *nb_client(tg_algorithm alg, const char *prefix) {
  return nb_client_with(alg, prefix, TG_POLICY_FAIL_OPEN);
}

static void nb_on_the_cluster(void **state) {
  (void)state;
  const char *prefix = prefix_of("nb");
  tg_nb *nb = nb_client(TG_FIXED_WINDOW_PER_KEY, prefix);
  nbp d;
  nbp_init(&d, nb);
  d.split = 7;
  enum { N = 1000, K = 50, L = 8 };
  static tg_nb_req req[N];
  static char keys[K][16];
  tg_quota q = {.limit = L, .period_ms = 3600000};
  for (int k = 0; k < K; k++)
    snprintf(keys[k], sizeof keys[k], "n%d", k);
  for (int i = 0; i < N; i++) {
    req[i] = (tg_nb_req){
        .key = keys[i % K], .key_len = strlen(keys[i % K]), .q = &q, .cost = 1};
    assert_int_equal(tg_nb_submit(nb, &req[i]), TG_OK);
  }
  assert_int_equal(nbp_run(&d, N, 30000, NULL, NULL), N);
  long admitted = 0;
  for (int i = 0; i < N; i++) {
    assert_int_equal(req[i].status, TG_OK);
    admitted += req[i].result.allowed;
    assert_int_equal(req[i].result.allowed, i < K * L);
  }
  assert_int_equal(admitted, K * L);
  /* the three masters, besides the two seeds (one of them a replica) */
  assert_true(tg_nb_links(nb) >= 3);
  /* a slot changes hands: the API follows MOVED */
  char name[96];
  size_t nl = name_of(prefix, "mv", 2, "pk", name);
  slot_move mv;
  move_pick(&mv, keyslot(name, nl));
  tg_nb_req one = {.key = "mv", .key_len = 2, .q = &q, .cost = 1};
  assert_int_equal(tg_nb_submit(nb, &one), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(one.status, TG_OK);
  /* its one key moves along, then every master learns the new owner */
  move_begin(&mv);
  migrate_keys(mv.from, mv.to, mv.slot);
  move_end(&mv);
  tg_stats before;
  tg_nb_stats(nb, &before, sizeof before);
  assert_int_equal(tg_nb_submit(nb, &one), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(one.status, TG_OK);
  assert_int_equal(one.result.count, 2); /* the key came along */
  tg_stats st;
  tg_nb_stats(nb, &st, sizeof st);
  assert_int_equal(st.moved, before.moved + 1);
  nbp_close_all(&d);
  tg_nb_destroy(nb);
}

/* A policy through the non-blocking API while its slot is half moved: one
 * of its two keys is on the importing node, the other still on the
 * migrating one, so Redis answers TRYAGAIN. The policy waits on the
 * library's timer (tg_nb_timeout, tg_nb_tick, driven by nb_poll.h) and
 * goes again; once the slot has moved it is decided, and counted once. A
 * slot that stays split through every wait is answered TG_ESTORE by the
 * failure policy, with nothing counted. */
static void nb_policy_waits_out_a_split_slot(void **state) {
  (void)state;
  const char *prefix = prefix_of("split");
  tg_nb *nb = nb_client(TG_FIXED_WINDOW, prefix);
  assert_int_equal(tg_nb_timeout(nb), -1); /* nothing waits */
  assert_int_equal(tg_nb_tick(nb), TG_OK);
  assert_int_equal(tg_nb_tick(NULL), TG_EINVAL);
  nbp d;
  nbp_init(&d, nb);
  tg_quota q = {.limit = 10, .period_ms = 3600000};
  tg_nb_rule ru[2] = {
      {.nb = nb, .key = "s}a", .key_len = 3, .q = &q, .cost = 1},
      {.nb = nb, .key = "s}b", .key_len = 3, .q = &q, .cost = 1}};
  tg_nb_req req = {0};
  assert_int_equal(tg_nb_submit_rules(nb, &req, ru, 2, 0), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(req.status, TG_OK);
  assert_true(req.result.allowed); /* both keys now exist, each at 1 */
  char na[96], nbn[96];
  size_t la = name_of(prefix, "s}a", 3, "fw", na);
  size_t lb = name_of(prefix, "s}b", 3, "fw", nbn);
  slot_move mv;
  move_pick(&mv, keyslot(na, la));
  assert_int_equal(keyslot(nbn, lb), mv.slot);
  move_begin(&mv);
  redisReply *r =
      on(mv.from, "MIGRATE 127.0.0.1 %d %s 0 5000 KEYS %b", mv.to, "", na, la);
  assert_true(r && r->type != REDIS_REPLY_ERROR);
  freeReplyObject(r);

  /* split for good: every wait meets TRYAGAIN, then the failure policy */
  tg_stats before, after;
  tg_nb_stats(nb, &before, sizeof before);
  uint64_t t0 = now_ms();
  assert_int_equal(tg_nb_submit_rules(nb, &req, ru, 2, 0), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 20000, NULL, NULL), 1);
  uint64_t took = now_ms() - t0;
  assert_int_equal(req.status, TG_ESTORE);
  assert_true(req.result.degraded);
  tg_nb_stats(nb, &after, sizeof after);
  /* 39 waits of 2 .. 50 ms (about 1.8 s), each after a TRYAGAIN */
  assert_true(after.ask - before.ask >= 39);
  assert_true(took >= 1700);
  assert_int_equal(tg_nb_timeout(nb), -1);

  /* split while the policy waits, then moved: it passes, counted once */
  tg_nb_stats(nb, &before, sizeof before);
  assert_int_equal(tg_nb_submit_rules(nb, &req, ru, 2, 0), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 60, NULL, NULL), 0); /* still waiting */
  assert_int_equal(tg_nb_pending(nb), 1);
  tg_nb_stats(nb, &after, sizeof after);
  assert_true(after.ask > before.ask);
  migrate_keys(mv.from, mv.to, mv.slot); /* the other key */
  move_end(&mv);                         /* the new owner first: see move_end */
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(req.status, TG_OK);
  assert_true(req.result.allowed);
  assert_int_equal(req.denied_by, TG_RULE_NONE);
  assert_int_equal(ru[0].result.count, 2); /* the failed try counted nothing */
  assert_int_equal(ru[1].result.count, 2);
  nbp_close_all(&d);
  tg_nb_destroy(nb);
}

/* A migration's end told to the source before the destination (not
 * move_end's order, but one a tool or an operator may take): the source
 * names the destination, which, still importing, names the source, so a
 * call meets MOVED both ways. The engine then resends after ASKING, which
 * the importing node serves: single calls through the blocking store and
 * the non-blocking API, and a non-blocking policy whose keys all moved,
 * pass at once, on the migrated state. A policy through the blocking store
 * (which sends no ASKING) pauses between its MOVEDs and passes once the
 * destination is told, a little later. */
typedef struct told_later {
  const slot_move *mv;
  tg_limiter *lim;
  uint64_t moved; /* told once lim's stats count this many MOVED */
  bool ok;        /* out: every node took it (checked by the test's thread) */
} told_later;

/* give_slot from another thread, once the policy has met MOVED twice: its
 * pauses have begun */
static void *tell_destination(void *arg) {
  told_later *t = arg;
  uint64_t end = now_ms() + 5000;
  tg_stats st;
  while (now_ms() < end && tg_limiter_stats(t->lim, &st, sizeof st) == TG_OK &&
         st.moved < t->moved)
    sleep_ms(1);
  t->ok = give_slot(t->mv);
  return NULL;
}

static void source_told_first(void **state) {
  (void)state;
  const char *prefix = prefix_of("first");
  tg_limiter *fw = limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_ERROR, 2);
  tg_nb *nb = nb_client(TG_FIXED_WINDOW, prefix);
  nbp d;
  nbp_init(&d, nb);
  tg_quota q = {.limit = 100, .period_ms = 3600000};
  tg_result res;
  assert_int_equal(tg_hit(fw, "f}k", 3, &q, 1, &res), TG_OK);
  assert_int_equal(res.count, 1);
  /* the policies' second key exists too: an importing node answers a
   * command on several keys, some of them missing, with TRYAGAIN (which a
   * policy waits out, see nb_policy_waits_out_a_split_slot) */
  assert_int_equal(tg_hit(fw, "f}j", 3, &q, 1, &res), TG_OK);
  char name[96];
  size_t nl = name_of(prefix, "f}k", 3, "fw", name);
  slot_move mv;
  move_pick(&mv, keyslot(name, nl));
  move_begin(&mv);
  /* what the engine counts on: a node does not give a slot away while it
   * holds keys of it, so once it has, they are at the destination */
  redisReply *r =
      on(mv.from, "CLUSTER SETSLOT %s NODE %s", mv.slot_s, mv.to_id);
  assert_true(r && r->type == REDIS_REPLY_ERROR);
  freeReplyObject(r);
  migrate_keys(mv.from, mv.to, mv.slot);
  assert_true(
      ok_on(mv.from, "CLUSTER SETSLOT %s NODE %s", mv.slot_s, mv.to_id));
  /* MOVED both ways: each names the other */
  int pair[2] = {mv.from, mv.to};
  for (int i = 0; i < 2; i++) {
    char other[16];
    snprintf(other, sizeof other, ":%d", pair[1 - i]);
    r = on(pair[i], "GET %b", name, nl);
    assert_true(r && r->type == REDIS_REPLY_ERROR);
    assert_true(strncmp(r->str, "MOVED", 5) == 0);
    assert_non_null(strstr(r->str, other));
    freeReplyObject(r);
  }
  tg_stats before, after;
  assert_int_equal(tg_limiter_stats(fw, &before, sizeof before), TG_OK);
  assert_int_equal(tg_hit(fw, "f}k", 3, &q, 1, &res), TG_OK);
  assert_false(res.degraded);
  assert_int_equal(res.count, 2); /* the migrated key, at the destination */
  assert_int_equal(tg_limiter_stats(fw, &after, sizeof after), TG_OK);
  assert_true(after.moved >= before.moved + 2); /* there and back */
  tg_nb_req one = {.key = "f}k", .key_len = 3, .q = &q, .cost = 1};
  assert_int_equal(tg_nb_submit(nb, &one), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(one.status, TG_OK);
  assert_int_equal(one.result.count, 3);
  tg_nb_rule ru[2] = {
      {.nb = nb, .key = "f}k", .key_len = 3, .q = &q, .cost = 1},
      {.nb = nb, .key = "f}j", .key_len = 3, .q = &q, .cost = 1}};
  tg_nb_req pol = {0};
  assert_int_equal(tg_nb_submit_rules(nb, &pol, ru, 2, 0), TG_OK);
  assert_int_equal(nbp_run(&d, 1, 10000, NULL, NULL), 1);
  assert_int_equal(pol.status, TG_OK);
  assert_true(pol.result.allowed);
  assert_int_equal(ru[0].result.count, 4);
  assert_int_equal(ru[1].result.count, 2);
  /* the blocking policy: the destination told once the policy has met
   * MOVED twice (then the source again and the third master, as move_end
   * does), during the pauses (some 100 ms still to go), it passes. Without the
   * pauses it may pass too, if the thread is quick: this checks the
   * promise (a policy rides out the disagreement), not how */
  tg_rule rr[2] = {{.lim = fw, .key = "f}k", .key_len = 3, .q = &q, .cost = 1},
                   {.lim = fw, .key = "f}j", .key_len = 3, .q = &q, .cost = 1}};
  assert_int_equal(tg_limiter_stats(fw, &before, sizeof before), TG_OK);
  told_later tl = {&mv, fw, before.moved + 2, false};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, tell_destination, &tl), 0);
  tg_rules_result out;
  int rc = tg_hit_rules(rr, 2, 0, &out);
  pthread_join(th, NULL); /* before any assertion can leave */
  assert_true(tl.ok);
  assert_int_equal(rc, TG_OK);
  assert_true(out.r.allowed);
  assert_int_equal(rr[0].result.count, 5);
  assert_int_equal(rr[1].result.count, 3);
  nbp_close_all(&d);
  tg_nb_destroy(nb);
  tg_limiter_destroy(fw);
}

/* ---- policies and reservations --------------------------------------------
 * tg_hit_rules and tg_reserve on the Cluster store, after the policy's slot
 * changed hands: the first call meets MOVED at the old master, reads again
 * at the new one, and counts once (the acceptance suites test_rules and
 * test_reserve run on the cluster too, through run_cluster_tests.sh). */

static void policy_follows_a_moved_slot(void **state) {
  (void)state;
  const char *prefix = prefix_of("pol");
  tg_limiter *fw = limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_ERROR, 2);
  tg_limiter *tb = limiter(TG_TOKEN_BUCKET, prefix, TG_POLICY_ERROR, 2);
  tg_quota qf = {.limit = 5, .period_ms = 3600000};
  tg_quota qt = {.limit = 3, .period_ms = 3600000, .burst = 3};
  tg_rule r[2] = {
      {.lim = fw, .key = "p}user", .key_len = 6, .q = &qf, .cost = 1},
      {.lim = tb, .key = "p}tenant", .key_len = 8, .q = &qt, .cost = 1}};
  tg_rules_result out;
  assert_int_equal(tg_hit_rules(r, 2, 0, &out), TG_OK);
  assert_true(out.r.allowed);
  /* names in two slots: refused, nothing decided */
  tg_rule x[2] = {r[0], r[1]};
  x[1].key = "q}tenant";
  assert_int_equal(tg_hit_rules(x, 2, 0, &out), TG_EINVAL);
  assert_int_equal(out.denied_by, 1);
  /* the slot moves to another master, keys and all */
  char name[96];
  size_t nl = name_of(prefix, "p}user", 6, "fw", name);
  slot_move mv;
  move_pick(&mv, keyslot(name, nl));
  move_begin(&mv);
  migrate_keys(mv.from, mv.to, mv.slot);
  move_end(&mv);
  tg_stats before, after;
  assert_int_equal(tg_limiter_stats(fw, &before, sizeof before), TG_OK);
  /* the token bucket (3) runs out first: 2 more pass, then denials that
   * consume nothing, so the window ends at exactly 3 */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(tg_hit_rules(r, 2, 0, &out), TG_OK);
    assert_int_equal(out.r.allowed, i < 2);
  }
  assert_int_equal(tg_limiter_stats(fw, &after, sizeof after), TG_OK);
  assert_true(after.moved >= before.moved + 1);
  uint64_t count = 0;
  assert_int_equal(tg_get(fw, "p}user", 6, &qf, &count), TG_OK);
  assert_int_equal(count, 3);
  /* a reservation on the moved slot: the bucket is empty, so it waits */
  tg_reservation res;
  assert_int_equal(tg_reserve(tb, "p}tenant", 8, &qt, 1, 3600000, &res), TG_OK);
  assert_true(res.ok);
  assert_true(res.delay_ms > 0);
  assert_int_equal(tg_cancel(tb, "p}tenant", 8, &qt, &res), TG_OK);
  tg_limiter_destroy(fw);
  tg_limiter_destroy(tb);
}

/* ---- a master dies
 * ------------------------------------------------------------- */

typedef struct ftraffic {
  tg_limiter *lim;
  atomic_int *stop;
  const char *key; /* on the dying master's slots, or elsewhere */
  long ok, degraded, bad;
} ftraffic;

static void *fdrive(void *arg) {
  ftraffic *t = arg;
  tg_quota q = {.limit = 1000000000, .period_ms = 3600000};
  while (!atomic_load(t->stop)) {
    tg_result r;
    int rc = tg_hit(t->lim, t->key, strlen(t->key), &q, 1, &r);
    /* atomic: the main thread watches these while this runs */
    if (rc == TG_OK && !r.degraded)
      __atomic_fetch_add(&t->ok, 1, __ATOMIC_RELAXED);
    else if (rc != TG_OK && r.degraded && !r.allowed &&
             (rc == TG_ECONNECT || rc == TG_ETIMEDOUT || rc == TG_ESTORE))
      __atomic_fetch_add(&t->degraded, 1, __ATOMIC_RELAXED);
    else
      __atomic_fetch_add(&t->bad, 1, __ATOMIC_RELAXED);
    sleep_ms(2);
  }
  return NULL;
}

static pid_t pid_of(int port) {
  char path[512];
  snprintf(path, sizeof path, "%s/node-%d.pid", getenv("TG_TEST_CLUSTER_DIR"),
           port);
  FILE *f = fopen(path, "r");
  long pid = 0;
  if (f) {
    if (fscanf(f, "%ld", &pid) != 1)
      pid = 0;
    fclose(f);
  }
  return (pid_t)pid;
}

typedef struct promo {
  tg_limiter *lim;
  const char *key;
} promo;

static bool answers_again(void *ctx) {
  promo *p = ctx;
  tg_quota q = {.limit = 1000000000, .period_ms = 3600000};
  tg_result r;
  return tg_hit(p->lim, p->key, strlen(p->key), &q, 0, &r) == TG_OK &&
         !r.degraded;
}

/* The failover has settled for these limiters: 20 answers in a row from
 * each, none degraded (a node that had not yet learnt of the promotion may
 * still hand out an old map for a moment after the first good answer). */
typedef struct settle_ctx {
  tg_limiter *lim[2];
  const char *key;
} settle_ctx;

static bool settled(void *ctx) {
  settle_ctx *sc = ctx;
  for (int i = 0; i < 20; i++)
    for (int l = 0; l < 2; l++) {
      promo p = {sc->lim[l], sc->key};
      if (!answers_again(&p))
        return false;
    }
  return true;
}

typedef struct hammer {
  tg_limiter *lim;
  char (*keys)[16];
  long admitted[10], ok[10], errors;
} hammer;

static tg_quota fq = {.limit = 20, .period_ms = 3600000};

static void *fexact(void *arg) {
  hammer *h = arg;
  for (int round = 0; round < 30; round++)
    for (int k = 0; k < 10; k++) {
      tg_result r;
      if (tg_hit(h->lim, h->keys[k], strlen(h->keys[k]), &fq, 1, &r) != TG_OK) {
        h->errors++;
        continue;
      }
      h->ok[k]++;
      h->admitted[k] += r.allowed;
    }
  return NULL;
}

/* The non-blocking client while the master dies: calls that sit on its
 * link when it goes (written in full and unanswered, one cut part-way
 * through its bytes, others still queued) each complete exactly once,
 * with the failure policy's answer, and none is sent again to the node
 * that takes the slot over; calls for the other masters stay exact. */
enum { NB_L = 3, NB_KEYS = 10, NB_PER_KEY = 20, NB_FLOOD = 250 };

typedef struct nb_dying {
  tg_nb *nb;
  nbp d;
  const char *prefix;
  int victim;
  unsigned vlink;
  tg_quota q;
  char vkeys[NB_KEYS][24], okeys[NB_KEYS][24];
  tg_nb_req v[NB_FLOOD], o[NB_KEYS * NB_PER_KEY];
  long done_v[NB_FLOOD], done_o[NB_KEYS * NB_PER_KEY], stray;
} nb_dying;

static void nb_dying_done(tg_nb_req *r, void *ctx) {
  nb_dying *x = ctx;
  if (r >= x->v && r < x->v + NB_FLOOD)
    x->done_v[r - x->v]++;
  else if (r >= x->o && r < x->o + NB_KEYS * NB_PER_KEY)
    x->done_o[r - x->o]++;
  else
    x->stray++;
}

/* Whether the node on `port` holds none of the flood's keys: no call of
 * the flood ever ran there. */
static bool flood_absent_on(const nb_dying *x, int port) {
  for (int k = 0; k < NB_KEYS; k++) {
    char name[96];
    size_t nl =
        name_of(x->prefix, x->vkeys[k], strlen(x->vkeys[k]), "fw", name);
    redisReply *r = on(port, "EXISTS %b", name, nl);
    bool absent = r && r->type == REDIS_REPLY_INTEGER && r->integer == 0;
    if (r)
      freeReplyObject(r);
    if (!absent)
      return false;
  }
  return true;
}

/* Before the kill: the victim stopped (SIGSTOP), so that what is written
 * to it stays unanswered; the other master's calls answered meanwhile. */
static void nb_dying_before(nb_dying *x, int victim, const char *other_key,
                            pid_t pid) {
  memset(x, 0, sizeof *x);
  x->prefix = prefix_of("fonb");
  x->victim = victim;
  x->q = (tg_quota){.limit = NB_L, .period_ms = 3600000};
  x->nb = nb_client_with(TG_FIXED_WINDOW, x->prefix, TG_POLICY_FAIL_CLOSED);
  nbp_init(&x->d, x->nb);
  for (int k = 0; k < NB_KEYS; k++) {
    /* "victim}..." hashes as "victim" (the name's braces close at the
     * first '}'): the victim's slot; the others other_key's */
    snprintf(x->vkeys[k], sizeof x->vkeys[k], "victim}nb%d", k);
    snprintf(x->okeys[k], sizeof x->okeys[k], "%s}nb%d", other_key, k);
  }
  /* links to both masters, by a call on each (keys outside the counts) */
  tg_quota big = {.limit = 1000000000, .period_ms = 3600000};
  char ow[24];
  snprintf(ow, sizeof ow, "%s}w", other_key);
  tg_nb_req warm[2] = {
      {.key = "victim}w", .key_len = 8, .q = &big, .cost = 1},
      {.key = ow, .key_len = strlen(ow), .q = &big, .cost = 1}};
  for (int i = 0; i < 2; i++)
    assert_int_equal(tg_nb_submit(x->nb, &warm[i]), TG_OK);
  assert_int_equal(nbp_run(&x->d, 2, 30000, NULL, NULL), 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(warm[i].status, TG_OK);
    assert_false(warm[i].result.degraded);
  }
  x->vlink = NBP_LINKS;
  for (unsigned l = 0; l < tg_nb_links(x->nb) && l < NBP_LINKS; l++) {
    const char *host;
    int port;
    tg_nb_address(x->nb, l, &host, &port);
    if (port == victim && x->d.fd[l] >= 0)
      x->vlink = l;
  }
  assert_true(x->vlink < NBP_LINKS);

  assert_int_equal(kill(pid, SIGSTOP), 0);
  /* most of the flood is written in full and never answered ... */
  int written = NB_FLOOD - 10;
  for (int i = 0; i < NB_FLOOD; i++)
    x->v[i] = (tg_nb_req){.key = x->vkeys[i % NB_KEYS],
                          .key_len = strlen(x->vkeys[i % NB_KEYS]),
                          .q = &x->q,
                          .cost = 1};
  for (int i = 0; i < written; i++)
    assert_int_equal(tg_nb_submit(x->nb, &x->v[i]), TG_OK);
  for (int i = 0; i < NB_KEYS * NB_PER_KEY; i++) {
    x->o[i] = (tg_nb_req){.key = x->okeys[i % NB_KEYS],
                          .key_len = strlen(x->okeys[i % NB_KEYS]),
                          .q = &x->q,
                          .cost = 1};
    assert_int_equal(tg_nb_submit(x->nb, &x->o[i]), TG_OK);
  }
  /* the other master answers its calls; the victim's stay pending */
  size_t got = nbp_run(&x->d, NB_KEYS * NB_PER_KEY, 30000, nb_dying_done, x);
  assert_int_equal(got, NB_KEYS * NB_PER_KEY);
  assert_true(x->d.fd[x->vlink] >= 0);
  assert_int_equal(tg_nb_wants(x->nb, x->vlink) & TG_NB_WRITE, 0);
  /* ... one is cut part-way through its bytes (the caller writes 7 and
   * says so), and the last ones stay queued behind it */
  for (int i = written; i < NB_FLOOD; i++)
    assert_int_equal(tg_nb_submit(x->nb, &x->v[i]), TG_OK);
  const void *p;
  size_t n;
  tg_nb_output(x->nb, x->vlink, &p, &n);
  assert_true(n > 7);
  assert_int_equal(send(x->d.fd[x->vlink], p, 7, MSG_NOSIGNAL), 7);
  tg_nb_written(x->nb, x->vlink, 7);
  for (int i = 0; i < NB_FLOOD; i++)
    assert_int_equal(x->done_v[i], 0);
  assert_int_equal(tg_nb_pending(x->nb), NB_FLOOD);
  /* the other master's calls: exact, nothing degraded */
  long admitted[NB_KEYS] = {0};
  for (int i = 0; i < NB_KEYS * NB_PER_KEY; i++) {
    assert_int_equal(x->done_o[i], 1);
    assert_int_equal(x->o[i].status, TG_OK);
    assert_false(x->o[i].result.degraded);
    admitted[i % NB_KEYS] += x->o[i].result.allowed;
  }
  for (int k = 0; k < NB_KEYS; k++)
    assert_int_equal(admitted[k], NB_L);
}

/* After the kill: every call of the flood completes once, refused by the
 * failure policy (fail closed), while nobody serves the slot. */
static void nb_dying_after_kill(nb_dying *x) {
  size_t got = nbp_run(&x->d, NB_FLOOD, 60000, nb_dying_done, x);
  assert_int_equal(got, NB_FLOOD);
  assert_int_equal(x->stray, 0);
  assert_int_equal(tg_nb_pending(x->nb), 0);
  long by[3] = {0, 0, 0};
  for (int i = 0; i < NB_FLOOD; i++) {
    const tg_nb_req *r = &x->v[i];
    by[r->status == TG_ECONNECT ? 0 : r->status == TG_ETIMEDOUT ? 1 : 2]++;
    assert_int_equal(x->done_v[i], 1);
    assert_true(r->status == TG_ECONNECT || r->status == TG_ETIMEDOUT ||
                r->status == TG_ESTORE);
    assert_true(r->result.degraded);
    assert_false(r->result.allowed);
  }
  print_message("nb: %d calls on the dying master's link completed once "
                "each: %ld TG_ECONNECT, %ld TG_ETIMEDOUT, %ld other\n",
                NB_FLOOD, by[0], by[1], by[2]);
}

/* Once the replica serves the slot: the same client, its dead link
 * brought up again as a caller's backoff would, decides there exactly,
 * and no call of the flood was ever sent there. */
static void nb_dying_recovered(nb_dying *x, int promoted) {
  tg_quota big = {.limit = 1000000000, .period_ms = 3600000};
  uint64_t end = now_ms() + 60000;
  bool back = false;
  while (!back && now_ms() < end) {
    for (unsigned l = 0; l < tg_nb_links(x->nb); l++)
      tg_nb_up(x->nb, l);
    tg_nb_req probe = {.key = "victim}p", .key_len = 8, .q = &big, .cost = 1};
    assert_int_equal(tg_nb_submit(x->nb, &probe), TG_OK);
    assert_int_equal(nbp_run(&x->d, 1, 30000, NULL, NULL), 1);
    back = probe.status == TG_OK && !probe.result.degraded;
    if (!back)
      sleep_ms(100);
  }
  assert_true(back);
  static char fresh[NB_KEYS][24];
  static tg_nb_req req[NB_KEYS * (NB_L + 2)];
  for (int k = 0; k < NB_KEYS; k++)
    snprintf(fresh[k], sizeof fresh[k], "victim}nbx%d", k);
  for (int i = 0; i < NB_KEYS * (NB_L + 2); i++) {
    req[i] = (tg_nb_req){.key = fresh[i % NB_KEYS],
                         .key_len = strlen(fresh[i % NB_KEYS]),
                         .q = &x->q,
                         .cost = 1};
    assert_int_equal(tg_nb_submit(x->nb, &req[i]), TG_OK);
  }
  assert_int_equal(nbp_run(&x->d, NB_KEYS * (NB_L + 2), 30000, NULL, NULL),
                   NB_KEYS * (NB_L + 2));
  for (int i = 0; i < NB_KEYS * (NB_L + 2); i++) {
    assert_int_equal(req[i].status, TG_OK);
    assert_false(req[i].result.degraded);
    assert_int_equal(req[i].result.allowed, i < NB_KEYS * NB_L);
  }
  assert_true(flood_absent_on(x, promoted));
  nbp_close_all(&x->d);
  tg_nb_destroy(x->nb);
}

static void master_killed_then_promoted(void **state) {
  (void)state;
  const char *prefix = prefix_of("fo");
  /* a key on some master, and one on another master */
  char name[96];
  size_t nl = name_of(prefix, "victim", 6, "fw", name);
  int victim = master_of(keyslot(name, nl), live_port());
  static char other_key[16];
  int other = 0;
  for (int i = 0; other == 0; i++) {
    snprintf(other_key, sizeof other_key, "o%d", i);
    nl = name_of(prefix, other_key, strlen(other_key), "fw", name);
    int m = master_of(keyslot(name, nl), live_port());
    if (m != victim)
      other = m;
  }
  tg_limiter *lim = limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_FAIL_CLOSED, 2);
  atomic_int stop = 0;
  ftraffic on_victim = {lim, &stop, "victim", 0, 0, 0},
           elsewhere = {lim, &stop, other_key, 0, 0, 0};
  pthread_t a, b;
  pthread_create(&a, NULL, fdrive, &on_victim);
  pthread_create(&b, NULL, fdrive, &elsewhere);
  while (__atomic_load_n(&on_victim.ok, __ATOMIC_RELAXED) < 20)
    sleep_ms(10);
  long other_ok_before = __atomic_load_n(&elsewhere.ok, __ATOMIC_RELAXED);
  pid_t pid = pid_of(victim);
  assert_true(pid > 0);
  static nb_dying nbd;
  nb_dying_before(&nbd, victim, other_key, pid); /* leaves it stopped */
  assert_int_equal(kill(pid, SIGKILL), 0);
  dead[index_of(victim)] = true;
  uint64_t t0 = now_ms();
  nb_dying_after_kill(&nbd);
  /* degraded while nobody serves the slot, until the replica takes over
   * and the client's map follows it: then exact again, same limiter */
  while (__atomic_load_n(&on_victim.degraded, __ATOMIC_RELAXED) == 0)
    sleep_ms(10);
  promo p = {lim, "victim"};
  bool back = wait_for(answers_again, &p, 60000);
  uint64_t outage = now_ms() - t0;
  atomic_store(&stop, 1);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  assert_true(back);
  nl = name_of(prefix, "victim", 6, "fw", name);
  int promoted = master_of(keyslot(name, nl), live_port());
  tg_stats st;
  assert_int_equal(tg_limiter_stats(lim, &st, sizeof st), TG_OK);
  print_message("master %d killed: %ld degraded answers for its slot over "
                "%" PRIu64 " ms, until %d took over; meanwhile %ld exact "
                "answers from master %d; %" PRIu64 " slot maps fetched\n",
                victim, on_victim.degraded, outage, promoted,
                elsewhere.ok - other_ok_before, other, st.slot_refreshes);
  assert_int_equal(on_victim.bad, 0);
  assert_int_equal(elsewhere.bad, 0);
  assert_int_equal(elsewhere.degraded, 0); /* the others were never down */
  assert_true(elsewhere.ok > other_ok_before);
  assert_true(promoted != 0 && promoted != victim);
  assert_true(st.slot_refreshes >= 2);
  /* exact again: fresh keys on the promoted master, several threads */
  static char keys[10][16];
  for (int k = 0; k < 10; k++)
    snprintf(keys[k], sizeof keys[k], "victim}%d", k);
  tg_limiter *fresh = limiter(TG_FIXED_WINDOW, prefix, TG_POLICY_ERROR, 2);
  settle_ctx sc = {{lim, fresh}, "victim"};
  assert_true(wait_for(settled, &sc, 60000));
  hammer h[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    memset(&h[i], 0, sizeof h[i]);
    h[i].lim = i == 0 ? fresh : lim; /* the old limiter and a new one */
    h[i].keys = keys;
    pthread_create(&th[i], NULL, fexact, &h[i]);
  }
  long admitted[10] = {0}, ok[10] = {0}, errors = 0;
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    errors += h[i].errors;
    for (int k = 0; k < 10; k++) {
      admitted[k] += h[i].admitted[k];
      ok[k] += h[i].ok[k];
    }
  }
  assert_int_equal(errors, 0);
  for (int k = 0; k < 10; k++) {
    assert_int_equal(ok[k], 90);
    assert_int_equal(admitted[k], (long)fq.limit);
  }
  nb_dying_recovered(&nbd, promoted);
  tg_limiter_destroy(fresh);
  tg_limiter_destroy(lim);
}

int main(void) {
  load_ports();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slots_are_the_servers),
      cmocka_unit_test(cluster_config_is_validated),
      cmocka_unit_test(exact_across_processes),
      cmocka_unit_test(reshard_while_traffic_runs),
      cmocka_unit_test(nb_on_the_cluster),
      cmocka_unit_test(nb_policy_waits_out_a_split_slot),
      cmocka_unit_test(policy_follows_a_moved_slot),
      cmocka_unit_test(source_told_first),
      cmocka_unit_test(refusing_node_fails_fast),
      cmocka_unit_test(master_killed_then_promoted), /* last: kills a node */
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
