/* SPDX-License-Identifier: MIT */
/*
 * redis_check.c - connect, AUTH, SELECT and PING with a plain blocking
 * socket (see redis_check.h). Deliberately small: four commands whose
 * replies are one line each, so no RESP reader is needed beyond "read up to
 * CRLF", and no dependency on hiredis, which the server itself never uses
 * directly.
 */
#include "redis_check.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* A reply line, CRLF excluded, is cut to this many bytes. */
#define LINE_MAX_BYTES 256

static void set_timeouts(int fd, uint32_t ms) {
  if (ms == 0)
    return;
  struct timeval tv = {(time_t)(ms / 1000u), (suseconds_t)(ms % 1000u) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* connect(2) within timeout_ms (0: the system's own). 0 or an errno. */
static int connect_within(int fd, const struct sockaddr *sa, socklen_t len,
                          uint32_t timeout_ms) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return errno;
  int err = 0;
  if (connect(fd, sa, len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int n;
      do
        n = poll(&p, 1, timeout_ms ? (int)timeout_ms : -1);
      while (n < 0 && errno == EINTR);
      socklen_t el = sizeof err;
      if (n == 0)
        err = ETIMEDOUT;
      else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
        err = errno;
    }
  }
  if (err == 0 && fcntl(fd, F_SETFL, fl) < 0)
    err = errno;
  return err;
}

/* A connected socket to the server, or -1 with the reason in why. */
static int open_socket(const tg_redis_config *rc, char *why, size_t n,
                       int *code) {
  *code = TG_ECONNECT;
  if (rc->unix_path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(rc->unix_path) >= sizeof sa.sun_path) {
      snprintf(why, n, "unix socket path too long: %s", rc->unix_path);
      return -1;
    }
    memcpy(sa.sun_path, rc->unix_path, strlen(rc->unix_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int err = fd < 0 ? errno
                     : connect_within(fd, (struct sockaddr *)&sa, sizeof sa,
                                      rc->connect_timeout_ms);
    if (err == 0)
      return fd;
    if (fd >= 0)
      close(fd);
    if (err == ETIMEDOUT)
      *code = TG_ETIMEDOUT;
    snprintf(why, n, "connect to %s: %s", rc->unix_path, strerror(err));
    return -1;
  }
  char port[16];
  snprintf(port, sizeof port, "%d", rc->port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int g = getaddrinfo(rc->host, port, &hints, &res);
  if (g != 0) {
    snprintf(why, n, "%s: %s", rc->host, gai_strerror(g));
    return -1;
  }
  int err = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    err = fd < 0 ? errno
                 : connect_within(fd, ai->ai_addr, ai->ai_addrlen,
                                  rc->connect_timeout_ms);
    if (err == 0) {
      freeaddrinfo(res);
      return fd;
    }
    if (fd >= 0)
      close(fd);
  }
  freeaddrinfo(res);
  if (err == ETIMEDOUT)
    *code = TG_ETIMEDOUT;
  snprintf(why, n, "connect to %s port %d: %s", rc->host, rc->port,
           strerror(err));
  return -1;
}

/* Waits until fd is readable before deadline_ms (0: no deadline): false
 * when the time is up. */
static bool readable_by(int fd, uint64_t deadline_ms) {
  if (deadline_ms == 0)
    return true;
  for (;;) {
    uint64_t now = cli_mono_ms();
    if (now >= deadline_ms)
      return false;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int k = poll(&p, 1, (int)(deadline_ms - now));
    if (k > 0)
      return true;
    if (k == 0)
      return false;
    if (errno != EINTR)
      return true; /* recv reports it */
  }
}

/* Sends one command (argv as C strings) and reads its one-line reply, the
 * whole of it within timeout_ms (0: none; a server that drips its reply a
 * byte at a time does not stretch it). Returns TG_OK when the reply is not
 * an error, else a code with why set (naming the command, never its
 * arguments: AUTH's are secret). */
static int command(int fd, int argc, const char *const *argv,
                   uint32_t timeout_ms, char *why, size_t n) {
  uint64_t deadline = timeout_ms ? cli_mono_ms() + timeout_ms : 0;
  char buf[2048];
  size_t len = (size_t)snprintf(buf, sizeof buf, "*%d\r\n", argc);
  for (int i = 0; i < argc && len < sizeof buf; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "$%zu\r\n%s\r\n",
                            strlen(argv[i]), argv[i]);
  if (len >= sizeof buf) {
    snprintf(why, n, "%s: arguments too long", argv[0]);
    return TG_ESTORE;
  }
  for (size_t off = 0; off < len;) {
    ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int err = errno;
      snprintf(why, n, "%s: %s", argv[0], strerror(err));
      return err == EAGAIN || err == EWOULDBLOCK ? TG_ETIMEDOUT : TG_ECONNECT;
    }
    off += (size_t)w;
  }
  char line[LINE_MAX_BYTES + 1];
  size_t got = 0;
  bool cr = false;
  for (;;) {
    char ch;
    if (!readable_by(fd, deadline)) {
      snprintf(why, n, "%s: no answer in time", argv[0]);
      return TG_ETIMEDOUT;
    }
    ssize_t r = recv(fd, &ch, 1, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      int err = r == 0 ? ECONNRESET : errno;
      bool slow = r < 0 && (err == EAGAIN || err == EWOULDBLOCK);
      snprintf(why, n, "%s: %s", argv[0],
               slow ? "no answer in time" : "the server closed the connection");
      return slow ? TG_ETIMEDOUT : TG_ECONNECT;
    }
    if (cr && ch == '\n')
      break;
    cr = ch == '\r';
    if (!cr && got < LINE_MAX_BYTES)
      line[got++] = ch;
  }
  line[got] = '\0';
  if (line[0] == '-') {
    snprintf(why, n, "%s: %s", argv[0], line + 1);
    return TG_ESTORE;
  }
  return TG_OK;
}

int redis_check(const tg_redis_config *rc, char *why, size_t n) {
  int status;
  int fd = open_socket(rc, why, n, &status);
  if (fd < 0)
    return status;
  set_timeouts(fd, rc->command_timeout_ms);
  status = TG_OK;
  if (rc->password && rc->username) {
    const char *argv[] = {"AUTH", rc->username, rc->password};
    status = command(fd, 3, argv, rc->command_timeout_ms, why, n);
  } else if (rc->password) {
    const char *argv[] = {"AUTH", rc->password};
    status = command(fd, 2, argv, rc->command_timeout_ms, why, n);
  }
  if (status == TG_OK && rc->db != 0) {
    char db[16];
    snprintf(db, sizeof db, "%d", rc->db);
    const char *argv[] = {"SELECT", db};
    status = command(fd, 2, argv, rc->command_timeout_ms, why, n);
  }
  if (status == TG_OK) {
    const char *argv[] = {"PING"};
    status = command(fd, 1, argv, rc->command_timeout_ms, why, n);
  }
  close(fd);
  return status;
}
