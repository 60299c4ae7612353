/* SPDX-License-Identifier: MIT */
/*
 * redis_server.h - control of the private redis-server that
 * tests/redis/with_redis.sh starts for a test (or benchmark): where it
 * listens, a raw hiredis connection for setting it up and looking at keys,
 * and stopping, restarting, pausing and resuming it to inject failures.
 *
 * Header-only (static functions) so each test executable includes it once.
 */
#ifndef TG_TEST_REDIS_SERVER_H
#define TG_TEST_REDIS_SERVER_H

#include <hiredis/hiredis.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

static inline const char *rs_env(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) {
    fprintf(stderr,
            "%s is not set: run this program through "
            "tests/redis/with_redis.sh (CTest does)\n",
            name);
    exit(1);
  }
  return v;
}

static inline int rs_port(void) { return atoi(rs_env("TG_TEST_REDIS_PORT")); }
static inline const char *rs_sock(void) { return rs_env("TG_TEST_REDIS_SOCK"); }

static inline void rs_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* A new raw connection, or NULL when the server does not answer. */
static inline redisContext *rs_connect(void) {
  struct timeval tv = {2, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", rs_port(), tv);
  if (!c || c->err) {
    if (c)
      redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  return c;
}

/* A command on a raw connection; the reply is the caller's to free (NULL
 * on a connection failure). */
static inline redisReply *rs_cmd(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  void *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  return r;
}

/* Runs a command and returns whether its reply was not an error. */
static inline int rs_ok(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  int ok = r && r->type != REDIS_REPLY_ERROR;
  if (r)
    freeReplyObject(r);
  return ok;
}

/* True when a fresh connection gets PONG. */
static inline int rs_alive(void) {
  redisContext *c = rs_connect();
  if (!c)
    return 0;
  redisReply *r = rs_cmd(c, "PING");
  int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
  if (r)
    freeReplyObject(r);
  redisFree(c);
  return ok;
}

static inline pid_t rs_pid(void) {
  FILE *f = fopen(rs_env("TG_TEST_REDIS_PIDFILE"), "r");
  long pid = 0;
  if (f) {
    if (fscanf(f, "%ld", &pid) != 1)
      pid = 0;
    fclose(f);
  }
  return (pid_t)pid;
}

/* Kills the server and waits until its port refuses connections. */
static inline int rs_stop(void) {
  pid_t pid = rs_pid();
  if (pid <= 0 || kill(pid, SIGKILL) != 0)
    return 0;
  for (int i = 0; i < 200; i++) {
    if (!rs_alive())
      return 1;
    rs_sleep_ms(10);
  }
  return 0;
}

/* Starts the server again with its config (same port, socket, empty data)
 * and waits for PONG. */
static inline int rs_start(void) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "redis-server '%s'", rs_env("TG_TEST_REDIS_CONF"));
  if (system(cmd) != 0)
    return 0;
  for (int i = 0; i < 200; i++) {
    if (rs_alive())
      return 1;
    rs_sleep_ms(10);
  }
  return 0;
}

/* SIGSTOP / SIGCONT: a server that accepts connections but never answers. */
static inline int rs_pause(void) {
  pid_t pid = rs_pid();
  return pid > 0 && kill(pid, SIGSTOP) == 0;
}

static inline int rs_resume(void) {
  pid_t pid = rs_pid();
  return pid > 0 && kill(pid, SIGCONT) == 0;
}

#endif /* TG_TEST_REDIS_SERVER_H */
