/* SPDX-License-Identifier: MIT */
/*
 * lock.h - tollgate's own lock: one 64-bit word in the table's region, which
 * any process mapping the region may take, which outlives a holder that
 * dies, and whose every bit pattern is handled.
 *
 * It replaces process-shared robust pthread mutexes, whose bytes are glibc's
 * private state (owner TID, kind, robust-list links): a few bytes written
 * into one made glibc abort on an assertion, and nothing can validate them
 * before use. This word holds only what tollgate can check:
 *
 *   bits  0..29  the owner's pid (1 in a table private to one process)
 *   bit   30     WAITERS: someone may sleep on the word; release wakes one
 *   bit   31     always 0
 *   bits 32..63  the low 32 bits of the owner's start time (field 22 of
 *                /proc/<pid>/stat, clock ticks since boot), so that a pid
 *                the kernel recycled is not taken for the dead owner
 *
 * 0 is free. Taking it is a CAS from 0 to the taker's identity (acquire
 * order); releasing it an exchange with 0 (release order), then FUTEX_WAKE on
 * the 32-bit half that holds WAITERS when that bit was set. A waiter sets
 * WAITERS and sleeps in FUTEX_WAIT on that half; after waiting once it takes
 * the lock with WAITERS set (it cannot know whether others still sleep), so
 * a wake-up is never lost between live processes. Both orders are plain
 * atomics, which ThreadSanitizer models; the futex calls only park threads.
 *
 * In a shared table a holder may die. A waiter sleeps in short slices (a
 * woken waiter may itself die before taking the lock, leaving others asleep
 * on a free word) and, when a slice expires, checks the owner: a pid that
 * cannot be one (0, bit 31, beyond the kernel's PID_MAX_LIMIT) is garbage; a
 * missing /proc/<pid>/stat, a dead or zombie process, or another start time
 * means the owner is gone; without /proc, kill(pid, 0) == ESRCH does. A gone
 * owner's word is taken over by a CAS from the value observed, so exactly
 * one waiter takes it, and that one is told so (like EOWNERDEAD): it repairs
 * what the lock guards. Pids identify processes only within one PID
 * namespace, so a table records its creator's and refuses others.
 *
 * What cannot be told apart, and errs on the side of waiting (TG_EBUSY when
 * the wait's bound passes, never a stolen live lock): a recycled pid whose
 * start time matches in its low 32 bits (2^32 ticks is 497 days at 100 Hz);
 * a word whose start time is 0 (an owner that could not read its own, or
 * hostile bytes) naming a live process; a process that called execve while
 * another of its threads held the lock (its pid and start time survive).
 *
 * A table private to one process uses private futexes, no liveness checks
 * and unbounded waits: its threads do not die holding a lock.
 */
#ifndef TG_LOCK_H
#define TG_LOCK_H

#include "tollgate.h"

#include <stdbool.h>
#include <stdint.h>

#define TG__LOCK_PID_MASK UINT64_C(0x3fffffff)
#define TG__LOCK_WAITERS (UINT64_C(1) << 30)
#define TG__LOCK_RESERVED (UINT64_C(1) << 31)
/* The owner word of a table private to one process. */
#define TG__LOCK_PRIVATE UINT64_C(1)
/* A shared waiter looks at the owner after each slice of this many ms. */
#define TG__LOCK_SLICE_MS 10u

/* One operation's bound on all its waits: the clock starts at its first
 * wait (so the uncontended path never reads it), and every later wait of
 * the same operation shares the same deadline. */
typedef struct tg__wait {
  uint32_t timeout_ms;  /* the limiter's lock_timeout_ms; 0: never wait */
  bool started;         /* deadline_ns is set */
  uint64_t deadline_ns; /* CLOCK_MONOTONIC */
} tg__wait;

static inline tg__wait tg__wait_bound(uint32_t timeout_ms) {
  tg__wait w = {timeout_ms, false, 0};
  return w;
}

/* Starts the clock if it has not started; true once the deadline passed. */
bool tg__wait_over(tg__wait *w);

/* This process's identity (pid and start time, as above), computed once
 * per process: it lives in a page the kernel zeroes in a fork's child
 * (MADV_WIPEONFORK), so a child recomputes its own without pthread_atfork,
 * which a library could never unregister. */
extern uint64_t *tg__lock_me;
uint64_t tg__lock_self_slow(void);
static inline uint64_t tg__lock_self(void) {
  const uint64_t *p = __atomic_load_n(&tg__lock_me, __ATOMIC_ACQUIRE);
  uint64_t id = p ? __atomic_load_n(p, __ATOMIC_RELAXED) : 0;
  return id ? id : tg__lock_self_slow();
}

/* The inode of this process's PID namespace (/proc/self/ns/pid), 0 if it
 * cannot be read. */
uint64_t tg__lock_pidns(void);

/* True when `word` names an owner that is gone (or cannot exist): dead,
 * zombie, another process on a recycled pid, or garbage. False for 0 and
 * for an owner that may be alive, this process included. */
bool tg__lock_owner_gone(uint64_t word);

int tg__lock_take_slow(uint64_t *w, bool shared, tg__wait *wt, bool *died);

/* Takes the lock. Returns TG_OK, with *died set when it was taken over from
 * a gone owner (the caller repairs what it guards); TG_EBUSY when a shared
 * lock is still held by a live owner once wt's deadline passed. A private
 * lock waits as long as it takes (wt is not used). */
static inline int tg__lock_take(uint64_t *w, bool shared, tg__wait *wt,
                                bool *died) {
  uint64_t expected = 0;
  *died = false;
  if (__atomic_compare_exchange_n(w, &expected,
                                  shared ? tg__lock_self() : TG__LOCK_PRIVATE,
                                  false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
    return TG_OK;
  return tg__lock_take_slow(w, shared, wt, died);
}

/* Takes the lock if that needs no wait: TG_OK (with *died as above: a
 * shared lock whose owner is gone is taken over at once), else TG_EBUSY. */
int tg__lock_try(uint64_t *w, bool shared, bool *died);

void tg__lock_wake(uint64_t *w, bool shared);

/* Releases the lock, whoever took it (a word rewritten meanwhile is simply
 * cleared), and wakes one waiter if any may sleep. */
static inline void tg__lock_release(uint64_t *w, bool shared) {
  uint64_t old = __atomic_exchange_n(w, 0, __ATOMIC_RELEASE);
  if (old & TG__LOCK_WAITERS)
    tg__lock_wake(w, shared);
}

#endif /* TG_LOCK_H */
