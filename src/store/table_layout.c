/* SPDX-License-Identifier: MIT */
/*
 * table_layout.c - where everything sits in a table's region: the sizes a
 * region needs for given parameters, a new table's header, and the checks
 * an existing region passes before a process attaches to it (see table.h
 * for the layout itself). Run once per table or attach, never per call.
 */
#include "table.h"

#include "../siphash.h"

#include <stddef.h>

/* ---- layout ---- */

typedef struct layout {
  uint64_t nslots, nchunks, nlogs, block_bytes;
  uint64_t ctrl_off, slot_off, chunk_off, log_off, total;
} layout;

static uint64_t round64(uint64_t x) { return (x + 63) & ~UINT64_C(63); }

static bool plan(const tg__table_params *p, layout *l) {
  if (p->capacity == 0 || p->capacity > TG_CAPACITY_MAX ||
      p->long_keys > p->capacity || p->log_entries == 0 ||
      p->log_entries > TG_SLIDING_ENTRIES_MAX ||
      (unsigned)p->algorithm >= TG_ALGORITHM_COUNT)
    return false;
  l->nslots = p->capacity + tg__div_ceil(p->capacity, TG__LOAD_NUM);
  l->nchunks = p->long_keys;
  l->nlogs = p->algorithm == TG_SLIDING_WINDOW ? p->capacity : 0;
  l->block_bytes = round64(sizeof(tg__log_block) +
                           (uint64_t)p->log_entries * sizeof(tg__entry));
  uint64_t off = round64(sizeof(tg__table_hdr)), sz;
  l->slot_off = off;
  l->ctrl_off = off + offsetof(tg__slot, ctrl);
  off = round64(off + l->nslots * sizeof(tg__slot));
  l->chunk_off = off;
  if (!tg__mul(l->nchunks, TG_KEY_MAX, &sz) || !tg__add(off, sz, &off))
    return false;
  l->log_off = off;
  if (!tg__mul(l->nlogs, l->block_bytes, &sz) || !tg__add(off, sz, &off))
    return false;
  l->total = off;
  return off <= SIZE_MAX;
}

size_t tg__table_bytes(const tg__table_params *p) {
  layout l;
  return plan(p, &l) ? (size_t)l.total : 0;
}

size_t tg__table_core_bytes(const tg__table_params *p) {
  layout l;
  return plan(p, &l) ? (size_t)l.chunk_off : 0;
}

static void attach_view(tg__table *t, void *mem, const tg__table_params *p) {
  t->base = mem;
  t->h = mem;
  /* the geometry is read once, after validation, and never again from the
   * region: another process could rewrite the shared header at any time */
  t->g.nslots = t->h->nslots;
  t->g.nchunks = t->h->nchunks;
  t->g.nlogs = t->h->nlogs;
  t->g.capacity = t->h->capacity;
  t->g.log_entries = t->h->log_entries;
  t->g.log_block_bytes = t->h->log_block_bytes;
  t->g.algorithm = t->h->algorithm;
  t->g.shared = t->h->shared;
  t->g.chunk_off = t->h->chunk_off;
  t->g.log_off = t->h->log_off;
  t->g.lock_timeout_ms = p->lock_timeout_ms;
  t->g.evict = p->evict;
  t->slots = (tg__slot *)(void *)(t->base + t->h->slot_off);
  t->chunks = (uint64_t *)(void *)(t->base + t->g.chunk_off);
  t->logs = t->base + t->g.log_off;
  t->bk = NULL;
}

int tg__table_init(tg__table *t, void *mem, const tg__table_params *p) {
  layout l;
  if (!plan(p, &l))
    return TG_EINVAL;
  tg__table_hdr *h = mem;
  h->version = TG__TABLE_VERSION;
  h->hdr_bytes = (uint32_t)sizeof *h;
  h->algorithm = (uint32_t)p->algorithm;
  h->slot_bytes = (uint32_t)sizeof(tg__slot);
  h->log_entries = p->log_entries;
  h->log_block_bytes = (uint32_t)l.block_bytes;
  h->shared = p->shared;
  h->capacity = p->capacity;
  h->nslots = l.nslots;
  h->nchunks = l.nchunks;
  h->nlogs = l.nlogs;
  h->ctrl_off = l.ctrl_off;
  h->slot_off = l.slot_off;
  h->chunk_off = l.chunk_off;
  h->log_off = l.log_off;
  h->total_bytes = l.total;
  h->pidns = p->shared ? tg__lock_pidns() : 0;
  if (tg__siphash_random_key(h->sip) != 0)
    return TG_ESTORE;
  /* the magic goes last: a segment whose creator died part way through is
   * recognisable by its missing magic */
  tg__store_release(&h->magic, TG__TABLE_MAGIC);
  attach_view(t, mem, p);
  return TG_OK;
}

int tg__table_check_header(const tg__table_hdr *h, size_t size,
                           const tg__table_params *p, const char **why) {
  const char *unused;
  if (!why)
    why = &unused;
  *why = "not a tollgate table";
  if (size < sizeof *h || tg__load_acquire(&h->magic) != TG__TABLE_MAGIC)
    return TG_ECORRUPT;
  if (h->version != TG__TABLE_VERSION) {
    *why = "a table of another format version (another tollgate release)";
    return TG_EMISMATCH;
  }
  *why = "a corrupt table header";
  if (h->hdr_bytes != sizeof *h || h->slot_bytes != sizeof(tg__slot) ||
      h->shared != 1 || h->algorithm >= TG_ALGORITHM_COUNT)
    return TG_ECORRUPT;
  /* the layout must be exactly the one its own parameters give */
  tg__table_params hp = {(tg_algorithm)h->algorithm,
                         h->capacity,
                         h->nchunks,
                         h->log_entries,
                         true,
                         0,
                         false};
  layout l;
  if (!plan(&hp, &l) || l.nslots != h->nslots || l.nlogs != h->nlogs ||
      l.block_bytes != h->log_block_bytes || l.ctrl_off != h->ctrl_off ||
      l.slot_off != h->slot_off || l.chunk_off != h->chunk_off ||
      l.log_off != h->log_off || l.total != h->total_bytes || l.total != size)
    return TG_ECORRUPT;
  if (h->pidns != tg__lock_pidns()) {
    *why = "created in another PID namespace (its lock owners are pids)";
    return TG_EMISMATCH;
  }
  if (hp.algorithm != p->algorithm || hp.capacity != p->capacity ||
      hp.long_keys != p->long_keys || hp.log_entries != p->log_entries) {
    *why = "created with another algorithm, capacity, long_keys or "
           "sliding_max_entries";
    return TG_EMISMATCH;
  }
  *why = "";
  return TG_OK;
}

int tg__table_attach(tg__table *t, void *mem, size_t size,
                     const tg__table_params *p) {
  int rc = tg__table_check_header(mem, size, p, NULL);
  if (rc == TG_OK)
    attach_view(t, mem, p);
  return rc;
}
