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
#include <string.h>
#include <sys/mman.h>

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

/* ---- arena extents ---- */

/* Units in an arena's first extent: as many as fill 64 KiB (one at least),
 * a power of two. */
static unsigned ext_shift(uint64_t unit) {
  unsigned sh = 0;
  while (sh < 16 && unit << (sh + 1) <= UINT64_C(65536))
    sh++;
  return sh;
}

/* First unit of extent k. */
static uint64_t ext_first(unsigned k, unsigned sh) {
  return ((UINT64_C(1) << k) - 1) << sh;
}

/* Units extent k holds, of an arena of n. */
static uint64_t ext_units(unsigned k, unsigned sh, uint64_t n) {
  uint64_t first = ext_first(k, sh), full = UINT64_C(1) << k << sh;
  return first >= n ? 0 : n - first < full ? n - first : full;
}

/* The extents of an arena of n units laid out from `start` on. */
static void slice(unsigned char **ext, unsigned sh, unsigned char *start,
                  uint64_t n, uint64_t unit) {
  for (unsigned k = 0; k < TG__EXTENTS; k++)
    ext[k] = ext_first(k, sh) < n ? start + ext_first(k, sh) * unit : NULL;
}

/* One arena's geometry: the chunks' (a = -1) or log class a's. */
typedef struct arena {
  unsigned char **ext;
  unsigned sh;
  uint64_t n, unit;
} arena;

static arena arena_of(tg__table *t, int a) {
  if (a < 0)
    return (arena){t->cext, t->cshift, t->g.nchunks, TG_KEY_MAX};
  return (arena){t->lext[a], t->lshift[a], t->g.nlogs, t->lbytes[a]};
}

bool tg__table_extent(tg__table *t, int a, uint64_t i) {
  if (a >= 0 && (unsigned)a >= t->nclass)
    return false;
  arena ar = arena_of(t, a);
  unsigned char **ext = ar.ext;
  if (i >= ar.n)
    return false;
  unsigned k = tg__extent_of(i, ar.sh);
  if (__atomic_load_n(&ext[k], __ATOMIC_ACQUIRE))
    return true;
  if (!t->grow)
    return false;
  size_t len = (size_t)(ext_units(k, ar.sh, ar.n) * ar.unit);
  /* backed by the kernel a page at a time, as its units are touched */
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 // cppcheck-suppress invalidFunctionArg
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return false;
  /* published after the mapping exists: a reader that finds the pointer
   * finds zeroed memory behind it */
  __atomic_store_n(&ext[k], (unsigned char *)m, __ATOMIC_RELEASE);
  __atomic_fetch_add(&t->ext_bytes, (uint64_t)len, __ATOMIC_RELAXED);
  return true;
}

void tg__table_unmap_extents(tg__table *t) {
  if (!t->grow)
    return;
  for (int a = -1; a < (int)t->nclass; a++) {
    arena ar = arena_of(t, a);
    for (unsigned k = 0; k < TG__EXTENTS; k++)
      if (ar.ext[k]) {
        munmap(ar.ext[k], (size_t)(ext_units(k, ar.sh, ar.n) * ar.unit));
        ar.ext[k] = NULL;
      }
  }
  t->ext_bytes = 0;
}

/* ---- a process's view ---- */

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
  t->cshift = ext_shift(TG_KEY_MAX);
  slice(t->cext, t->cshift, t->base + t->g.chunk_off, t->g.nchunks, TG_KEY_MAX);
  memset(t->lext, 0, sizeof t->lext);
  memset(t->lshift, 0, sizeof t->lshift);
  memset(t->lcap, 0, sizeof t->lcap);
  memset(t->lbytes, 0, sizeof t->lbytes);
  memset(t->lfree, 0, sizeof t->lfree);
  memset(t->lbump, 0, sizeof t->lbump);
  t->nclass = 1;
  t->log0 = t->base + t->g.log_off;
  t->lcap[0] = t->g.log_entries;
  t->lbytes[0] = t->g.log_block_bytes;
  t->lshift[0] = ext_shift(t->g.log_block_bytes);
  slice(t->lext[0], t->lshift[0], t->base + t->g.log_off, t->g.nlogs,
        t->g.log_block_bytes);
  t->grow = false;
  t->ext_bytes = 0;
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

int tg__table_init_grow(tg__table *t, void *mem, const tg__table_params *p) {
  int rc = tg__table_init(t, mem, p);
  if (rc != TG_OK)
    return rc;
  /* the header keeps the contiguous layout's offsets (nothing reads them
   * from a private region); the arenas are not behind the slots */
  memset(t->cext, 0, sizeof t->cext);
  memset(t->lext, 0, sizeof t->lext);
  t->log0 = NULL;
  t->grow = true;
  /* a sliding log starts in a 64-byte block and doubles as it fills, up to
   * class 0's whole log: a key's memory follows its entries */
  if (t->g.algorithm == TG_SLIDING_WINDOW)
    for (uint64_t bytes = 64; t->nclass < TG__LOG_CLASSES; bytes *= 2) {
      uint64_t cap = (bytes - sizeof(tg__log_block)) / sizeof(tg__entry);
      if (cap >= t->g.log_entries)
        break;
      t->lcap[t->nclass] = (uint32_t)cap;
      t->lbytes[t->nclass] = bytes;
      t->lshift[t->nclass] = ext_shift(bytes);
      t->nclass++;
    }
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
