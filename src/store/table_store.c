/* SPDX-License-Identifier: MIT */
/*
 * table_store.c - the store over the concurrent table (table.c), wherever the
 * table's region is mapped: anonymous private memory for the embedded
 * default, a named segment for the shared-memory store (shm.c), or memory
 * the caller provides (tg_config.region), which stays the caller's.
 *
 * The embedded default's table grows: its mapping holds the header and
 * slots, and the long-key chunks and sliding-log blocks are mapped in
 * extents of doubling size as they are first handed out (see tg__table),
 * so that neither the address space it reserves nor the memory it touches
 * runs ahead of its keys. Every mapping is anonymous, MAP_NORESERVE, backed
 * by the kernel a page at a time as it is touched; freed chunks and blocks
 * are reused from free lists. A segment's pages are backed by its store
 * instead (the table's tg__backing, which this store owns and releases).
 */
#include "../error.h"
#include "store.h"
#include "table.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct memory {
  tg__store base;
  tg__table t;   /* t.bk, if any, is owned here */
  size_t bytes;  /* size of the mapping */
  bool borrowed; /* the caller's region: not ours to unmap */
} memory;

static int mem_exec(tg__store *s, const tg__call *c, tg__outcome *o) {
  return tg__table_exec(&((memory *)s)->t, c, o);
}

static void mem_exec_batch(tg__store *s, const tg__call *calls, size_t n,
                           tg__outcome *outs, int *rcs) {
  tg__table_exec_batch(&((memory *)s)->t, calls, n, outs, rcs);
}

static int mem_reset(tg__store *s, const void *key, size_t key_len) {
  return tg__table_reset(&((memory *)s)->t, key, key_len);
}

static size_t mem_key_count(const tg__store *s) {
  return tg__table_live(&((const memory *)s)->t);
}

static int mem_clean(tg__store *s, uint64_t now_us, uint64_t older_than_us,
                     tg__clean_cb cb, void *ctx, const int *halt,
                     size_t *removed) {
  return tg__table_clean(&((memory *)s)->t, now_us, older_than_us, cb, ctx,
                         halt, removed);
}

static size_t mem_bytes(const tg__store *s) {
  const memory *m = (const memory *)s;
  return m->bytes + (size_t)__atomic_load_n(&m->t.ext_bytes, __ATOMIC_RELAXED);
}

static void mem_destroy(tg__store *s) {
  memory *m = (memory *)s;
  tg__table_unmap_extents(&m->t);
  if (!m->borrowed)
    munmap(m->t.base, m->bytes);
  if (m->t.bk)
    m->t.bk->release(m->t.bk);
  free(m);
}

/* Every table may share a policy with any other (the protocol is the
 * limiter's); a table is known by its random SipHash key, the same in every
 * process that maps it, so two limiters on one segment share a space. */
static void mem_ident(const tg__store *s, uint64_t group[2],
                      uint64_t space[2]) {
  const memory *m = (const memory *)s;
  group[0] = group[1] = 0;
  space[0] = m->t.h->sip[0];
  space[1] = m->t.h->sip[1];
}

/* A policy's checks and takes (see store.h): the table runs them in its
 * own loops. */
static int mem_exec_policy(tg__store *const *stores, tg__call *calls, size_t n,
                           uint32_t shadow, tg__outcome *o, tg__outcome *took,
                           tg__policy_marks *pm) {
  return tg__table_policy(stores, offsetof(memory, t), calls, n, shadow, o,
                          took, pm);
}

static const tg__store_ops memory_ops = {
    .exec = mem_exec,
    .exec_batch = mem_exec_batch,
    .reset = mem_reset,
    .key_count = mem_key_count,
    .clean = mem_clean,
    .bytes = mem_bytes,
    .destroy = mem_destroy,
    .ident = mem_ident,
    .exec_policy = mem_exec_policy,
};

int tg__table_store_wrap(tg__store **out, const tg__table *t, size_t bytes) {
  memory *m = calloc(1, sizeof *m);
  if (!m)
    return TG_ENOMEM;
  m->base.ops = &memory_ops;
  m->t = *t;
  m->bytes = bytes;
  *out = &m->base;
  return TG_OK;
}

/* Asks for transparent huge pages under the header and slots (not the
 * arenas, whose memory must follow their use a page at a time). Keys hash
 * uniformly over the slots, so a table in use soon touches every page of
 * them anyway; with 2 MiB pages a decision on a key not in cache misses
 * the TLB less often. How much that saves depends on the host: on the KVM
 * guest BENCHMARKS.md measures, where the host's own page size still
 * bounds the TLB, a dependent miss cost 171 ns on huge pages against 170
 * on small ones (no gain there). Below one huge page it would only add
 * memory. Advice: a kernel without THP, or with it off, ignores it. */
static void huge_slots(void *mem, size_t core) {
#ifdef MADV_HUGEPAGE
  if (core >= (size_t)2 << 20)
    (void)madvise(mem, core, MADV_HUGEPAGE);
#else
  (void)mem, (void)core;
#endif
}

int tg__memory_store_new(tg__store **out, const tg__table_params *p) {
  /* the header and slots; the arenas are mapped as they fill */
  size_t bytes = tg__table_core_bytes(p);
  if (bytes == 0)
    return TG_EINVAL;
  /* fd -1 is what an anonymous mapping asks for (cppcheck thinks not) */
  void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   // cppcheck-suppress invalidFunctionArg
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED)
    return TG_ENOMEM;
  huge_slots(mem, bytes);
  tg__table t;
  int rc = tg__table_init_grow(&t, mem, p);
  if (rc == TG_OK)
    rc = tg__table_store_wrap(out, &t, bytes);
  if (rc != TG_OK)
    munmap(mem, bytes);
  return rc;
}

int tg__region_store_new(tg__store **out, void *mem, size_t size,
                         const tg__table_params *params) {
  tg__table_params p = *params;
  p.shared = true; /* other processes map it: locks name their owners */
  size_t bytes = tg__table_bytes(&p);
  if (bytes == 0 || mem == NULL || (uintptr_t)mem % 64 != 0) {
    tg__error_set("invalid tg_config: region %s",
                  bytes == 0 ? "parameters out of range"
                             : "not 64-byte aligned");
    return TG_EINVAL;
  }
  const tg__table_hdr *h = mem;
  tg__table t;
  int rc;
  if (size >= sizeof *h && tg__load_acquire(&h->magic) == TG__TABLE_MAGIC) {
    /* a table already: judged by the size its own header claims (the
     * check reads the header only), so that other parameters read as
     * TG_EMISMATCH, whatever either would need; then the region must hold
     * it */
    size_t claimed = (size_t)h->total_bytes;
    const char *why;
    rc = tg__table_check_header(h, claimed, &p, &why);
    if (rc == TG_OK && claimed > size) {
      tg__error_set("invalid tg_config: region_bytes below the size of the "
                    "table the region holds");
      return TG_EINVAL;
    }
    if (rc == TG_OK)
      rc = tg__table_attach(&t, mem, claimed, &p);
    else
      tg__error_set("region: %s", why);
  } else if (size < bytes) {
    tg__error_set("invalid tg_config: region smaller than "
                  "tg_region_bytes(cfg)");
    return TG_EINVAL;
  } else {
    memset(mem, 0, bytes);
    rc = tg__table_init(&t, mem, &p);
  }
  if (rc != TG_OK)
    return rc;
  rc = tg__table_store_wrap(out, &t, bytes);
  if (rc == TG_OK)
    ((memory *)*out)->borrowed = true;
  return rc;
}
