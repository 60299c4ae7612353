/* SPDX-License-Identifier: MIT */
/*
 * atomic.h - the only place tollgate touches atomic instructions.
 *
 * Every shared word goes through these wrappers with an explicit memory
 * order. They use the compiler's __atomic builtins on plain integers rather
 * than <stdatomic.h> _Atomic types for one reason: a key's state is a 16-byte
 * pair that is updated with ONE 16-byte compare-and-swap (cmpxchg16b on
 * x86-64, a CASP/LDXP-STXP loop on arm64) and read as two 8-byte loads.
 * <stdatomic.h> cannot express that mix, and GCC routes 16-byte _Atomic
 * operations through libatomic, which may fall back to a process-local lock
 * table: useless for a table in shared memory. The __sync 16-byte CAS is
 * inlined by both GCC and Clang (with -mcx16) and understood by
 * ThreadSanitizer.
 */
#ifndef TG_ATOMIC_H
#define TG_ATOMIC_H

#include <stdbool.h>
#include <stdint.h>

/* The pair CAS below must be one inlined instruction: a libatomic call may
 * fall back to a lock local to this process (see above). The compiler
 * defines this macro exactly when it inlines 16-byte __sync operations. The
 * build checks the same thing at configure time (CMakeLists.txt). */
#ifndef __GCC_HAVE_SYNC_COMPARE_AND_SWAP_16
#error "no inlined 16-byte compare-and-swap: on x86-64 add -mcx16"
#endif

__extension__ typedef unsigned __int128 tg__u128;

static inline uint64_t tg__load_relaxed(const uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline uint64_t tg__load_acquire(const uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void tg__store_relaxed(uint64_t *p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline void tg__store_release(uint64_t *p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void tg__store32_release(uint32_t *p, uint32_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint64_t tg__fetch_add(uint64_t *p, uint64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
static inline uint64_t tg__fetch_sub(uint64_t *p, uint64_t v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_ACQ_REL);
}
static inline bool tg__cas64(uint64_t *p, uint64_t *expected,
                             uint64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* A 16-byte-aligned pair updated as one unit. */
typedef struct tg__pair {
  uint64_t w[2];
} __attribute__((aligned(16))) tg__pair;

static inline tg__u128 tg__pack(uint64_t w0, uint64_t w1) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return (tg__u128)w1 << 64 | w0;
#else
  return (tg__u128)w0 << 64 | w1;
#endif
}

/* One atomic 16-byte compare-and-swap (full barrier). On failure *exp0 and
 * *exp1 receive the current value, read atomically by the same instruction. */
static inline bool tg__cas128(tg__pair *p, uint64_t *exp0, uint64_t *exp1,
                              uint64_t new0, uint64_t new1) {
  tg__u128 expected = tg__pack(*exp0, *exp1);
  tg__u128 prev = __sync_val_compare_and_swap((tg__u128 *)(void *)p, expected,
                                              tg__pack(new0, new1));
  if (prev == expected)
    return true;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  *exp0 = (uint64_t)prev;
  *exp1 = (uint64_t)(prev >> 64);
#else
  *exp0 = (uint64_t)(prev >> 64);
  *exp1 = (uint64_t)prev;
#endif
  return false;
}

/* A consistent snapshot of a pair without writing to it (so readers never
 * take the cache line exclusive), valid when word `stable` (0 or 1) only
 * changes together with a change that makes it differ: the table keeps a
 * per-slot generation in it. Reads stable, the other word, stable again, and
 * retries until both reads of stable agree. */
static inline void tg__load_pair(const tg__pair *p, int stable, uint64_t *w0,
                                 uint64_t *w1) {
  const uint64_t *s = &p->w[stable], *o = &p->w[!stable];
  for (;;) {
    uint64_t s1 = tg__load_acquire(s);
    uint64_t ov = tg__load_acquire(o);
    uint64_t s2 = tg__load_acquire(s);
    if (s1 == s2) {
      *(stable ? w1 : w0) = s1;
      *(stable ? w0 : w1) = ov;
      return;
    }
  }
}

/* Orders the relaxed loads before it ahead of the loads after it: the
 * reader side of a seqlock-style "read, copy, re-read and compare". */
#if defined(__SANITIZE_THREAD__) && (defined(__x86_64__) || defined(__i386__))
/* gcc refuses fences under ThreadSanitizer (-Wtsan: it cannot model them).
 * On x86 (TSO) loads are never reordered with older loads, so an acquire
 * fence is only a compiler barrier, which this is; the TSan build stays the
 * same algorithm as the real one. */
static inline void tg__fence_acquire(void) {
  __asm__ __volatile__("" ::: "memory");
}
#else
static inline void tg__fence_acquire(void) {
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
}
#endif

#endif /* TG_ATOMIC_H */
