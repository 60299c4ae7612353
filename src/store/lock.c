/* SPDX-License-Identifier: MIT */
/*
 * lock.c - the slow paths of tollgate's lock (lock.h): waiting, telling
 * whether an owner is gone, and this process's identity.
 *
 * Linux only (futexes, /proc), as the shared-memory store is.
 */
#include "lock.h"

#include "../mono.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18 /* Linux 4.14; older headers lack the name */
#endif

/* PID_MAX_LIMIT on 64-bit Linux: no pid is larger, whatever pid_max says. */
#define PID_LIMIT UINT64_C(4194304)
#define NS_PER_MS UINT64_C(1000000)

bool tg__wait_over(tg__wait *w) {
  uint64_t now = tg__mono_ns();
  if (!w->started) {
    w->started = true;
    w->deadline_ns = now + (uint64_t)w->timeout_ms * NS_PER_MS;
  }
  return now >= w->deadline_ns;
}

/* ---- /proc/<pid>/stat ---- */

typedef struct proc_stat {
  uint64_t pid;
  char state;       /* field 3 */
  uint64_t threads; /* field 20 */
  uint64_t start;   /* field 22, clock ticks since boot */
} proc_stat;

/* Reads and parses one stat file: 0, or an errno value (ENOENT: no such
 * process, or a /proc that does not show it). The command name (field 2)
 * may hold spaces and parentheses, so the fields are counted from the last
 * ')'. */
static int read_stat(const char *path, proc_stat *st) {
  memset(st, 0, sizeof *st);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno ? errno : EIO;
  char buf[1024];
  size_t len = 0;
  while (len < sizeof buf - 1) {
    ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += (size_t)n;
  }
  close(fd);
  buf[len] = '\0';
  const char *rp = strrchr(buf, ')');
  if (!rp || rp[1] != ' ' || rp[2] == '\0')
    return EINVAL;
  st->pid = strtoull(buf, NULL, 10);
  st->state = rp[2];
  unsigned field = 3;
  for (const char *p = rp + 2; *p && field < 22; p++) {
    if (*p != ' ')
      continue;
    field++;
    if (field == 20)
      st->threads = strtoull(p + 1, NULL, 10);
    else if (field == 22)
      st->start = strtoull(p + 1, NULL, 10);
  }
  return field == 22 ? 0 : EINVAL;
}

/* ---- this process ---- */

typedef struct self_info {
  uint64_t id;    /* the word this process writes into a lock it takes */
  uint32_t pid;   /* getpid() */
  uint32_t start; /* low 32 bits of its start time, 0 if unknown */
  bool proc_ok;   /* /proc shows this PID namespace's pids */
  uint64_t pidns; /* inode of /proc/self/ns/pid, 0 if unknown */
} self_info;

static void compute(self_info *s) {
  s->pid = (uint32_t)getpid();
  s->start = 0;
  s->proc_ok = false;
  proc_stat st;
  if (read_stat("/proc/self/stat", &st) == 0) {
    s->start = (uint32_t)st.start;
    /* a /proc mounted for another namespace shows other numbers: its
     * /proc/<pid> would then name other processes */
    s->proc_ok = st.pid == s->pid;
  }
  struct stat ns;
  s->pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
  s->id = s->pid | (uint64_t)s->start << 32;
}

/* The identity words: [0] id, [1] proc_ok, [2] pidns; [0] is stored last
 * and is never 0 once computed. In a page the kernel zeroes in a child
 * after fork, so a child can never use its parent's pid. */
uint64_t *tg__lock_me;
static pthread_once_t page_once = PTHREAD_ONCE_INIT;

static void page_init(void) {
  long ps = sysconf(_SC_PAGESIZE);
  size_t bytes = ps > 0 ? (size_t)ps : 4096u;
  /* fd -1 is what an anonymous mapping asks for (cppcheck thinks not) */
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 // cppcheck-suppress invalidFunctionArg
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return;
  if (madvise(p, bytes, MADV_WIPEONFORK) != 0) { /* before Linux 4.14 */
    munmap(p, bytes);
    return;
  }
  __atomic_store_n(&tg__lock_me, (uint64_t *)p, __ATOMIC_RELEASE);
}

/* Without such a page: the same words, trusted only while getpid() still
 * gives the pid they were computed for (a system call per use). */
static uint64_t fallback[3];
static uint64_t fallback_pid;

static void publish(uint64_t *w, const self_info *s) {
  __atomic_store_n(&w[1], (uint64_t)s->proc_ok, __ATOMIC_RELAXED);
  __atomic_store_n(&w[2], s->pidns, __ATOMIC_RELAXED);
  __atomic_store_n(&w[0], s->id, __ATOMIC_RELEASE);
}

static bool read_words(const uint64_t *w, self_info *s) {
  uint64_t id = __atomic_load_n(&w[0], __ATOMIC_ACQUIRE);
  if (id == 0)
    return false;
  s->id = id;
  s->pid = (uint32_t)(id & TG__LOCK_PID_MASK);
  s->start = (uint32_t)(id >> 32);
  s->proc_ok = __atomic_load_n(&w[1], __ATOMIC_RELAXED) != 0;
  s->pidns = __atomic_load_n(&w[2], __ATOMIC_RELAXED);
  return true;
}

static void self_get(self_info *s) {
  pthread_once(&page_once, page_init);
  uint64_t *w = __atomic_load_n(&tg__lock_me, __ATOMIC_ACQUIRE);
  if (w) {
    if (!read_words(w, s)) {
      compute(s); /* threads racing here store the same values */
      publish(w, s);
    }
    return;
  }
  uint64_t pid = (uint64_t)getpid();
  if (__atomic_load_n(&fallback_pid, __ATOMIC_ACQUIRE) == pid &&
      read_words(fallback, s))
    return;
  compute(s);
  publish(fallback, s);
  __atomic_store_n(&fallback_pid, pid, __ATOMIC_RELEASE);
}

uint64_t tg__lock_self_slow(void) {
  self_info s;
  self_get(&s);
  return s.id;
}

uint64_t tg__lock_pidns(void) {
  self_info s;
  self_get(&s);
  return s.pidns;
}

/* ---- owners ---- */

/* A word no process could have written. */
static bool garbage(uint64_t word) {
  uint64_t pid = word & TG__LOCK_PID_MASK;
  return (word & TG__LOCK_RESERVED) != 0 || pid == 0 || pid > PID_LIMIT;
}

bool tg__lock_owner_gone(uint64_t word) {
  if (word == 0)
    return false;
  if (garbage(word))
    return true;
  uint32_t pid = (uint32_t)(word & TG__LOCK_PID_MASK);
  uint32_t start = (uint32_t)(word >> 32);
  self_info me;
  self_get(&me);
  if (pid == me.pid) /* this process (another thread), or an earlier one */
    return start != me.start;
  if (me.proc_ok) {
    char path[40];
    (void)snprintf(path, sizeof path, "/proc/%u/stat", (unsigned)pid);
    proc_stat st;
    if (read_stat(path, &st) == 0) {
      /* a zombie whose other threads still run (the main thread called
       * pthread_exit) is alive: it counts more than one thread */
      if (st.state == 'X' || st.state == 'x' ||
          (st.state == 'Z' && st.threads <= 1))
        return true;
      return start != 0 && (uint32_t)st.start != start;
    }
    /* ENOENT may also be a /proc mounted with hidepid: ask the kernel */
  }
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* ---- futexes ---- */

/* The 32-bit half of the word that holds the pid and WAITERS. */
static uint32_t *futex_half(uint64_t *w) {
  uint32_t *h = (uint32_t *)(void *)w;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  h++;
#endif
  return h;
}

static int futex_op(bool shared, int op) {
  return shared ? op : op | FUTEX_PRIVATE_FLAG;
}

/* Sleeps while the half still holds `expected`, at most *rel (NULL: no
 * bound). Returns 0 or an errno value (ETIMEDOUT, EAGAIN, EINTR). */
static int futex_wait(uint64_t *w, uint32_t expected,
                      const struct timespec *rel, bool shared) {
  if (syscall(SYS_futex, futex_half(w), futex_op(shared, FUTEX_WAIT), expected,
              rel, NULL, 0) == 0)
    return 0;
  return errno;
}

void tg__lock_wake(uint64_t *w, bool shared) {
  (void)syscall(SYS_futex, futex_half(w), futex_op(shared, FUTEX_WAKE), 1, NULL,
                NULL, 0);
}

/* ---- taking ---- */

static bool cas(uint64_t *w, uint64_t *expected, uint64_t desired) {
  return __atomic_compare_exchange_n(w, expected, desired, false,
                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

int tg__lock_take_slow(uint64_t *w, bool shared, tg__wait *wt, bool *died) {
  const uint64_t self = shared ? tg__lock_self() : TG__LOCK_PRIVATE;
  /* a shared waiter looks at the owner before waiting when it may not wait
   * at all, then each time a slice expires */
  bool look = shared && wt->timeout_ms == 0;
  *died = false;
  for (;;) {
    uint64_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
    if (cur == 0) {
      /* with WAITERS: others may still sleep, and our release must wake */
      if (cas(w, &cur, self | TG__LOCK_WAITERS))
        return TG_OK;
      continue;
    }
    struct timespec slice;
    const struct timespec *rel = NULL;
    if (shared) {
      bool over = tg__wait_over(wt);
      if (garbage(cur) || ((look || over) && tg__lock_owner_gone(cur))) {
        if (cas(w, &cur, self | TG__LOCK_WAITERS)) {
          *died = true;
          return TG_OK;
        }
        continue; /* another waiter took it over first, or it changed */
      }
      if (over)
        return TG_EBUSY;
      look = false;
      uint64_t now = tg__mono_ns(), ns = TG__LOCK_SLICE_MS * NS_PER_MS;
      if (now >= wt->deadline_ns)
        ns = 0; /* passed since: the next round looks and gives up */
      else if (wt->deadline_ns - now < ns)
        ns = wt->deadline_ns - now;
      slice.tv_sec = (time_t)(ns / UINT64_C(1000000000));
      slice.tv_nsec = (long)(ns % UINT64_C(1000000000));
      rel = &slice;
    }
    if (!(cur & TG__LOCK_WAITERS)) {
      uint64_t want = cur | TG__LOCK_WAITERS;
      if (!__atomic_compare_exchange_n(w, &cur, want, false, __ATOMIC_RELAXED,
                                       __ATOMIC_RELAXED))
        continue;
      cur = want;
    }
    if (futex_wait(w, (uint32_t)cur, rel, shared) == ETIMEDOUT)
      look = true;
  }
}

int tg__lock_try(uint64_t *w, bool shared, bool *died) {
  const uint64_t self = shared ? tg__lock_self() : TG__LOCK_PRIVATE;
  *died = false;
  /* a few rounds: each lost race means another process moved the word */
  for (int round = 0; round < 4; round++) {
    uint64_t cur = 0;
    if (cas(w, &cur, self))
      return TG_OK;
    if (!shared || !tg__lock_owner_gone(cur))
      return TG_EBUSY;
    if (cas(w, &cur, self | TG__LOCK_WAITERS)) {
      *died = true;
      return TG_OK;
    }
  }
  return TG_EBUSY;
}
