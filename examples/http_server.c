/* SPDX-License-Identifier: MIT */
/*
 * http_server.c - a small HTTP/1.1 server on plain sockets that rate-limits
 * each client with a policy of two limits and answers 429 with the fields
 * clients read: Retry-After, and the RateLimit fields of the IETF draft
 * (or the older RateLimit-Limit/-Remaining/-Reset with --legacy).
 *
 *   http_server [--port N] [--max-requests N] [--legacy]
 *
 * The client is named by its X-Client header (else "anonymous"); its policy
 * is 5 per second (a token bucket: bursts of 5) and 20 per minute (a fixed
 * window), decided atomically by tg_hit_rules: a request the second limit
 * refuses is not counted by the minute, and the reverse. Every response
 * carries the fields; a refused one is 429. One connection at a time, one
 * request per connection (Connection: close), which is all an example
 * needs; a client that sends no full request head within 2 s is dropped,
 * so that an idle connection cannot hold the others up, and one that
 * leaves before its answer costs nothing (no SIGPIPE: MSG_NOSIGNAL). It prints
 * the port it listens on (--port 0, the default, lets the kernel pick one),
 * serves --max-requests requests (default: forever), then exits.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <tollgate.h>

static const tg_quota per_second = {.limit = 5, .period_ms = 1000};
static const tg_quota per_minute = {.limit = 20, .period_ms = 60000};

/* The value of header `name` in the request head, copied into out. */
static size_t header(const char *req, const char *name, char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *p = strstr(req, "\r\n"); p && p[2];
       p = strstr(p + 2, "\r\n")) {
    const char *line = p + 2;
    if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
      const char *v = line + n + 1;
      while (*v == ' ')
        v++;
      size_t len = strcspn(v, "\r\n");
      if (len >= cap)
        len = cap - 1;
      memcpy(out, v, len);
      out[len] = '\0';
      return len;
    }
  }
  return 0;
}

static void serve(int fd, tg_limiter *bucket, tg_limiter *window,
                  unsigned fields) {
  char req[4096];
  size_t got = 0;
  req[0] = '\0';
  while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
    ssize_t r = read(fd, req + got, sizeof req - 1 - got);
    if (r <= 0)
      return;
    got += (size_t)r;
    req[got] = '\0';
  }
  char client[128];
  if (header(req, "X-Client", client, sizeof client) == 0)
    strcpy(client, "anonymous");
  tg_rule rules[2] = {
      {.lim = bucket,
       .key = client,
       .key_len = strlen(client),
       .q = &per_second,
       .cost = 1},
      {.lim = window,
       .key = client,
       .key_len = strlen(client),
       .q = &per_minute,
       .cost = 1},
  };
  tg_rules_result out;
  int rc = tg_hit_rules(rules, 2, 0, &out);
  /* a store failure answers by the failure policy (fail open here) */
  bool ok = out.r.allowed;
  tg_http_limit limits[2] = {
      {"per-second", &per_second, &rules[0].result, NULL, 0},
      {"per-minute", &per_minute, &rules[1].result, NULL, 0},
  };
  char fields_buf[1024];
  size_t flen = 0;
  if (tg_http_headers(fields_buf, sizeof fields_buf, &flen, limits, 2,
                      fields | TG_HTTP_RETRY_AFTER) != 0)
    flen = 0, fields_buf[0] = '\0';
  const char *body = ok ? "hello\n" : "too many requests\n";
  char head[1536];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n%s\r\n",
                   ok ? "200 OK" : "429 Too Many Requests", strlen(body),
                   fields_buf);
  if (rc != TG_OK)
    fprintf(stderr, "http_server: %s\n", tg_strerror(rc));
  if (n > 0 && send(fd, head, (size_t)n, MSG_NOSIGNAL) == n)
    (void)!send(fd, body, strlen(body), MSG_NOSIGNAL);
}

int main(int argc, char **argv) {
  int port = 0;
  long max_requests = -1;
  unsigned fields = TG_HTTP_IETF;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
      port = atoi(argv[++i]);
    else if (strcmp(argv[i], "--max-requests") == 0 && i + 1 < argc)
      max_requests = atol(argv[++i]);
    else if (strcmp(argv[i], "--legacy") == 0)
      fields = TG_HTTP_LEGACY;
    else {
      fprintf(stderr, "usage: http_server [--port N] [--max-requests N] "
                      "[--legacy]\n");
      return 2;
    }
  }
  tg_config cfg;
  tg_config_init(&cfg);
  cfg.algorithm = TG_TOKEN_BUCKET;
  tg_limiter *bucket, *window;
  if (tg_limiter_new(&bucket, &cfg) != 0)
    return 1;
  cfg.algorithm = TG_FIXED_WINDOW;
  if (tg_limiter_new(&window, &cfg) != 0)
    return 1;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(s, 16) != 0 || getsockname(s, (struct sockaddr *)&a, &alen) != 0) {
    perror("http_server");
    return 1;
  }
  printf("%d\n", ntohs(a.sin_port));
  fflush(stdout);
  for (long served = 0; max_requests < 0 || served < max_requests; served++) {
    int c = accept(s, NULL, NULL);
    if (c < 0)
      continue;
    struct timeval idle = {.tv_sec = 2};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
    serve(c, bucket, window, fields);
    close(c);
  }
  close(s);
  tg_limiter_destroy(bucket);
  tg_limiter_destroy(window);
  return 0;
}
