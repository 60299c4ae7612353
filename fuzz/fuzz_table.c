/* SPDX-License-Identifier: MIT */
/*
 * fuzz_table.c - libFuzzer target: the concurrent table (the region the shm
 * store shares between processes) after another process has scribbled on it.
 *
 * Each input builds a small shared-mode table in a heap block of exactly the
 * region's size (so ASan sees any access outside it), fills it through
 * tg__table_exec with keys of every kind (inline and long, sliding logs
 * below and at their cap), then:
 *
 *   1. xors the region at the offsets the input gives, lock words included
 *      (tollgate's own, src/store/lock.h: any value is handled);
 *   2. attaches to it with tg__table_attach, which must not crash and may
 *      refuse; if it accepts:
 *   3. runs the operations the rest of the input encodes (hit, inc, get, set,
 *      expires_at, reset, cleaning passes, and further corruption between
 *      them, as a concurrent hostile writer would), each of which must answer
 *      a code a corrupt table may give;
 *   4. runs a last cleaning pass and tg__table_validate.
 *
 * Oracles: the sanitizers; every code is one of TG_OK, TG_ECORRUPT,
 * TG_EFULL, TG_EOVERFLOW (and TG_ERANGE for a bucket set), and TG_EBUSY only
 * once something was corrupted (a lock word may then name a live process:
 * the table never waits here, lock_timeout_ms is 0); no lock word may name
 * this process when the input is done (a lock left held); and an input
 * that corrupts nothing must leave a table tg__table_validate finds
 * sound.
 *
 * Input (every field is taken modulo its range, so any bytes are an input):
 *   byte 0          algorithm (mod 5)
 *   byte 1          number of corruptions k (mod 17)
 *   k x 3 bytes     u16 offset (little-endian, mod the region's size), xor
 *   then 4 bytes per operation:
 *     op    (mod 8) 0 hit, 1 inc, 2 get, 3 set, 4 expires_at, 5 reset,
 *                   6 cleaning pass, 7 corrupt one byte now
 *     key   (mod 16) keys 0-7 exist before the corruption, 8-15 do not;
 *                   op 7: low byte of the offset
 *     arg   low 5 bits: cost or value (31 means 2^64 - 1); high 3 bits: one
 *                   of 8 quotas; op 7: high byte of the offset
 *     time  how far the clock moves first: < 200: that many ms; 200-254:
 *                   (time - 199) hours; 255: 5 ms back; op 7: the xor
 *
 * Op 7 may also rewrite the header fields attach checked (the geometry):
 * a process must never trust them again after attach.
 *
 * Build: -DTG_FUZZ=ON with clang (fuzz/CMakeLists.txt).
 */
#include "store/lock.h"
#include "store/table.h"
#include "tollgate.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define T0 UINT64_C(1700000000123456) /* us */
#define CAP 16u
#define LONG_KEYS 4u
#define LOG_ENTRIES 4u
#define NKEYS 16u /* 0-7 populated */
#define MAX_CORRUPT 17u

static const tg_quota quotas[8] = {
    {5, 1000, 8},   {1, 1, 0},        {1000, 60000, 0}, {3, 100, 1},
    {10, 1000, 10}, {2, 86400000, 0}, {7, 5000, 20},    {100, 1, 0}};

static const size_t key_lens[] = {1, 7, 8, 23, 24, 25, 100, 256};

static size_t key_bytes(unsigned idx, unsigned char *buf) {
  size_t len = key_lens[idx % (sizeof key_lens / sizeof key_lens[0])];
  for (size_t j = 0; j < len; j++)
    buf[j] = (unsigned char)(idx * 31u + j * 7u + 1u);
  buf[0] = (unsigned char)idx;
  return len;
}

/* The region's layout before any corruption: where the locks are. */
typedef struct geom {
  size_t size, log_off, block_bytes, nlogs;
} geom;

static void corrupt(unsigned char *mem, const geom *g, size_t off, uint8_t x) {
  mem[off % g->size] ^= x;
}

/* Set once the input has corrupted anything. */
static bool corrupted;

static bool code_ok(int rc, tg__op op, tg_algorithm alg) {
  if (rc == TG_OK || rc == TG_ECORRUPT || rc == TG_EFULL ||
      rc == TG_EOVERFLOW || (corrupted && rc == TG_EBUSY))
    return true;
  return rc == TG_ERANGE && op == TG__OP_SET &&
         (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET);
}

static void fail(const char *what, int rc) {
  fprintf(stderr, "fuzz_table: %s answered %s\n", what, tg_err_name(rc));
  abort();
}

/* Aborts if a lock word of the original layout names this process: some
 * path took a lock and never released it. */
static void locks_left(const unsigned char *mem, const geom *g) {
  const uint64_t me = tg__lock_self();
  uint64_t w;
  size_t offs[2] = {offsetof(tg__table_hdr, lock),
                    offsetof(tg__table_hdr, clean_lock)};
  for (size_t i = 0; i < 2 + g->nlogs; i++) {
    size_t off = i < 2 ? offs[i]
                       : g->log_off + (i - 2) * g->block_bytes +
                             offsetof(tg__log_block, lock);
    memcpy(&w, mem + off, sizeof w);
    if ((w & ~TG__LOCK_WAITERS) == me) {
      fprintf(stderr, "fuzz_table: a lock at offset %zu was left held\n", off);
      abort();
    }
  }
}

/* One call through the table, as tollgate.c's run() builds it. */
static int exec(tg__table *t, tg_algorithm alg, tg__op op, unsigned key,
                unsigned qi, uint64_t arg, uint64_t now_us) {
  unsigned char kb[TG_KEY_MAX];
  tg__call c;
  int rc = tg__quota_prepare(&c.q, &quotas[qi % 8], alg);
  if (rc != TG_OK)
    return rc; /* a quota this algorithm refuses: never reaches a store */
  c.op = op;
  c.alg = alg;
  c.key = kb;
  c.key_len = key_bytes(key, kb);
  c.arg = arg;
  c.now_us = now_us;
  c.store_time = false;
  tg__outcome o;
  rc = tg__table_exec(t, &c, &o);
  if (!code_ok(rc, op, alg))
    fail("tg__table_exec", rc);
  return rc;
}

/* Reads every byte handed to it, so ASan checks what the cleaner copied. */
static void clean_cb(const tg__clean_item *items, size_t n, void *ctx) {
  unsigned *acc = ctx;
  for (size_t i = 0; i < n; i++) {
    if (items[i].key_len == 0 || items[i].key_len > TG_KEY_MAX)
      abort();
    for (size_t j = 0; j < items[i].key_len; j++)
      *acc += items[i].key[j];
  }
}

static void clean(tg__table *t, uint64_t now_us, uint64_t older_us) {
  size_t removed;
  unsigned acc = 0;
  int rc = tg__table_clean(t, now_us, older_us, clean_cb, &acc, NULL, &removed);
  if (rc != TG_OK && !(corrupted && rc == TG_EBUSY))
    fail("tg__table_clean", rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  tg_algorithm alg = (tg_algorithm)(data[0] % TG_ALGORITHM_COUNT);
  tg__table_params p = {alg, CAP, LONG_KEYS, LOG_ENTRIES, true, 0, false};
  size_t bytes = tg__table_bytes(&p);
  void *mem = NULL;
  if (bytes == 0 || posix_memalign(&mem, 64, bytes) != 0)
    abort();
  memset(mem, 0, bytes);
  tg__table t;
  if (tg__table_init(&t, mem, &p) != TG_OK)
    abort();
  /* a fixed SipHash key: the same input always lands in the same slots */
  t.h->sip[0] = UINT64_C(0x0706050403020100);
  t.h->sip[1] = UINT64_C(0x0f0e0d0c0b0a0908);
  for (unsigned k = 0; k < NKEYS / 2; k++)
    for (unsigned j = 0; j <= k; j++)
      if (exec(&t, alg, TG__OP_HIT, k, 0, 1, T0 + j * 1000u + k) != TG_OK)
        abort();
  geom g = {bytes, (size_t)t.h->log_off, t.h->log_block_bytes,
            (size_t)t.h->nlogs};

  /* 1. corruption */
  size_t pos = 1;
  unsigned ncorrupt = data[pos++] % MAX_CORRUPT;
  corrupted = false;
  for (unsigned i = 0; i < ncorrupt && pos + 3 <= size; i++, pos += 3) {
    size_t off = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
    corrupt(mem, &g, off, data[pos + 2]);
    corrupted = true;
  }

  /* 2. attach */
  tg__table v;
  int rc = tg__table_attach(&v, mem, bytes, &p);
  if (rc != TG_OK) {
    if (rc != TG_ECORRUPT && rc != TG_EMISMATCH)
      fail("tg__table_attach", rc);
    free(mem);
    return 0;
  }

  /* 3. operations */
  uint64_t now = T0 + 10000;
  for (; pos + 4 <= size; pos += 4) {
    const uint8_t *b = data + pos;
    unsigned op = b[0] % 8u, key = b[1] % NKEYS, qi = b[2] >> 5;
    uint64_t arg = (b[2] & 31u) == 31u ? UINT64_MAX : (uint64_t)(b[2] & 31u);
    if (op == 7) {
      corrupt(mem, &g, (size_t)b[1] | (size_t)b[2] << 8, b[3]);
      corrupted = true;
      continue;
    }
    if (b[3] < 200)
      now += (uint64_t)b[3] * 1000;
    else if (b[3] < 255)
      now += (uint64_t)(b[3] - 199) * 3600 * UINT64_C(1000000);
    else
      now -= 5000;
    if (op == 5) {
      unsigned char kb[TG_KEY_MAX];
      size_t len = key_bytes(key, kb);
      rc = tg__table_reset(&v, kb, len);
      if (rc != TG_OK && !(corrupted && rc == TG_EBUSY))
        fail("tg__table_reset", rc);
    } else if (op == 6) {
      clean(&v, now, arg == UINT64_MAX ? 0 : arg * 1000000);
    } else if (tg__op_supported(alg, (tg__op)op)) {
      exec(&v, alg, (tg__op)op, key, qi, arg, now);
    }
  }

  /* 4. a last pass, and the invariants */
  clean(&v, now + 3600 * UINT64_C(1000000), 0);
  tg__table_check chk;
  if (tg__table_validate(&v, &chk) != TG_OK)
    abort(); /* only on malloc failure */
  if (!corrupted && (chk.errors || chk.pending || chk.leaked ||
                     chk.live_slots != chk.live_counter)) {
    fprintf(stderr,
            "fuzz_table: an uncorrupted table is unsound: %s (errors %llu, "
            "pending %llu, leaked %llu, live %llu, counter %llu)\n",
            chk.first_error, (unsigned long long)chk.errors,
            (unsigned long long)chk.pending, (unsigned long long)chk.leaked,
            (unsigned long long)chk.live_slots,
            (unsigned long long)chk.live_counter);
    abort();
  }
  locks_left(mem, &g);
  free(mem);
  return 0;
}
