/* SPDX-License-Identifier: MIT */
/*
 * table_impl.h - the table's private helpers that more than one of its files
 * needs: the ctrl word, state and log block encodings, the key lookup. The
 * hot path (table.c) and the structural check (table_validate.c) must read
 * the region the same way, so the reading is written once, here. Everything
 * is static, so that each file gets its own copy and the hot path never
 * calls across files; static inline, except for the five helpers marked
 * unused (chunk_words, read_pair, block, repair_log, log_backed), which the
 * compiler kept out of line (at most of their calls) before the split: an
 * inline keyword would be a hint that changes those choices, and the hot
 * path's code with them. Included only by src/store/table*.c: the table's
 * interface is table.h.
 */
#ifndef TG_TABLE_IMPL_H
#define TG_TABLE_IMPL_H

#include "table.h"

#include "../siphash.h"

#include <string.h>

enum { EMPTY = 0, LIVE = 1, TOMB = 2 };

#define CHUNK_WORDS (TG_KEY_MAX / 8)
#define WIN_GEN_SHIFT 54
#define WIN_END_MASK ((UINT64_C(1) << WIN_GEN_SHIFT) - 1)
#define WIN_GEN_MASK UINT64_C(0x3ff)

/* ---- ctrl words ---- */

/* Slot i's ctrl word. */
static inline uint64_t *ctrl_at(const tg__table *t, uint64_t i) {
  return &t->slots[i].ctrl;
}

static inline unsigned ctrl_status(uint64_t c) { return (unsigned)(c & 3u); }
static inline size_t ctrl_len(uint64_t c) {
  return (size_t)((c >> 2) & 0x1ffu);
}
static inline uint64_t ctrl_tag(uint64_t c) { return (c >> 16) & 0xffffu; }
static inline uint32_t ctrl_gen(uint64_t c) { return (uint32_t)(c >> 32); }
static inline uint64_t ctrl_make(unsigned status, size_t len, uint64_t tag,
                                 uint32_t gen) {
  return (uint64_t)gen << 32 | (tag & 0xffffu) << 16 | (uint64_t)len << 2 |
         status;
}

/* ---- keys ---- */

/* A caller's key as the table compares it: hashed once, copied into zero
 * padded words so comparisons are word by word. */
typedef struct kref {
  uint64_t hash;
  uint64_t tag;
  size_t len;
  size_t nw; /* words that hold the key */
  uint64_t w[CHUNK_WORDS];
} kref;

static inline void kref_init(const tg__table *t, kref *k, const void *key,
                             size_t len) {
  k->hash = tg__siphash(t->h->sip, key, len);
  k->tag = k->hash >> 48;
  k->len = len;
  k->nw = (len + 7) / 8;
  k->w[k->nw - 1] = 0;
  memcpy(k->w, key, len);
}

static inline uint64_t home(const tg__table *t, uint64_t hash) {
  return (uint64_t)(((tg__u128)hash * t->g.nslots) >> 64);
}

static inline uint64_t next(const tg__table *t, uint64_t i) {
  return i + 1 == t->g.nslots ? 0 : i + 1;
}

/* Long-key chunk ci's words, backed; NULL when ci is out of range or its
 * memory cannot be backed (a chunk in use always is: that index is
 * corrupt). */
static __attribute__((unused)) uint64_t *chunk_words(const tg__table *t,
                                                     uint64_t ci) {
  if (ci >= t->g.nchunks ||
      !tg__backed(t->bk, t->g.chunk_off + ci * TG_KEY_MAX, TG_KEY_MAX))
    return NULL;
  return (uint64_t *)(void *)tg__arena_at(t->cext, t->cshift, ci, TG_KEY_MAX);
}

/* The words holding slot i's key, or NULL if a chunk index is corrupt. */
static inline const uint64_t *key_words(const tg__table *t, uint64_t i,
                                        size_t len) {
  const tg__slot *s = &t->slots[i];
  if (len <= TG__INLINE_KEY)
    return s->key;
  return chunk_words(t, tg__load_relaxed(&s->key[0]));
}

/* Whether this process has seen every extent of chunk ci backed: a bit
 * test, no call, so that the lookup stays a leaf function. */
static inline bool chunk_seen(const tg__table *t, uint64_t ci) {
  const tg__backing *b = t->bk;
  if (!b)
    return true;
  uint64_t off = t->g.chunk_off + ci * TG_KEY_MAX;
  uint64_t e = (off - b->ext_base) >> b->shift,
           last = (off + TG_KEY_MAX - 1 - b->ext_base) >> b->shift;
  for (; e <= last && e < b->nextents; e++)
    if (!(__atomic_load_n(&b->done[e / 64], __ATOMIC_RELAXED) >> (e % 64) & 1u))
      return false;
  return true;
}

/* Slot i's key equals k's. A long key whose chunk this process has not
 * seen backed is not compared: its index goes to *unseen, for find() to
 * back it and look again. */
static inline bool key_equal(const tg__table *t, uint64_t i, const kref *k,
                             uint64_t *unseen) {
  const uint64_t *w = t->slots[i].key;
  if (k->len > TG__INLINE_KEY) {
    uint64_t ci = tg__load_relaxed(&w[0]);
    if (ci >= t->g.nchunks)
      return false;
    if (!chunk_seen(t, ci)) {
      *unseen = ci;
      return false;
    }
    /* NULL: an index read from a slot that changed under us, whose
     * extent this thread cannot see yet; the ctrl check rejects it */
    w = (const uint64_t *)(const void *)tg__arena_at(t->cext, t->cshift, ci,
                                                     TG_KEY_MAX);
    if (!w)
      return false;
  }
  for (size_t j = 0; j < k->nw; j++)
    if (tg__load_relaxed(&w[j]) != k->w[j])
      return false;
  return true;
}

/* Starts fetching slots i .. i+n-1: every line they cover, so a slot
 * that straddles two lines costs one miss's wait, not two. Addresses as
 * integers: near the table's end they pass the slots (a prefetch never
 * faults; a probe itself wraps to slot 0). */
static inline void tg__slots_prefetch(const tg__table *t, uint64_t i,
                                      unsigned n) {
  uintptr_t s = (uintptr_t)&t->slots[i];
  size_t bytes = n * sizeof(tg__slot);
  for (size_t o = 0; o < bytes; o += 64)
    __builtin_prefetch((const void *)(s + o));
  __builtin_prefetch((const void *)(s + bytes - 1));
}

/* How many slots a batch prefetches from each key's home: where a probe
 * goes when the key is not at home. At the table's load (83 % with 1M
 * keys in a 1M-capacity table), linear probing leaves 38 % of keys outside
 * the home slot's own lines but 15 % outside these four slots (192 bytes;
 * a simulation of the layout). A batch has its slots' misses overlap; a
 * probe past its home slot would otherwise meet its next lines one miss at
 * a time. Measured with `tollgate_bench --filter name=batch16`: 0.60-0.65x
 * a single decision with the home slot alone, 0.52-0.56x with four slots,
 * no better with six (BENCHMARKS.md). A single lookup fetches its home
 * slot alone: the extra lines cost every hot key 5-11 %. */
#define TG__BATCH_SLOTS_AHEAD 4u

/* The lookup proper (see find). */
static inline bool find_leaf(const tg__table *t, const kref *k, uint64_t *idx,
                             uint64_t *ctrl, uint64_t *unseen) {
  uint64_t n = t->g.nslots, i = home(t, k->hash);
  /* the slot's address is known from the hash: fetch both lines it may
   * span at once, so a straddling slot costs one miss's wait, not two */
  tg__slots_prefetch(t, i, 1);
  for (uint64_t probes = 0; probes < n; probes++) {
    uint64_t c = tg__load_acquire(ctrl_at(t, i));
    unsigned st = ctrl_status(c);
    if (st == EMPTY)
      return false;
    if (st == LIVE && ctrl_tag(c) == k->tag && ctrl_len(c) == k->len &&
        key_equal(t, i, k, unseen)) {
      tg__fence_acquire();
      if (tg__load_acquire(ctrl_at(t, i)) == c) {
        *idx = i;
        *ctrl = c;
        return true;
      }
      continue; /* the slot changed while we compared: look again */
    }
    i = next(t, i);
  }
  return false;
}

/* Lock-free lookup. On success *idx is the slot and *ctrl the ctrl word that
 * was valid before and after the key comparison. A long key whose chunk
 * this process has not touched yet is backed first (on a full file system
 * it cannot be: such an index is no key's, and is skipped). */
static inline __attribute__((always_inline)) bool
find_inline(const tg__table *t, const kref *k, uint64_t *idx, uint64_t *ctrl) {
  for (;;) {
    uint64_t unseen = UINT64_MAX;
    bool found = find_leaf(t, k, idx, ctrl, &unseen);
    if (found || unseen == UINT64_MAX || !chunk_words(t, unseen))
      return found;
  }
}

/* The same, inlined where gcc sees fit. The policy's loops (table.c) use
 * find_inline: there gcc left the lookup out of line, a frame and a call
 * per rule that a hit, whose lookup is inlined, does not pay. */
static inline bool find(const tg__table *t, const kref *k, uint64_t *idx,
                        uint64_t *ctrl) {
  return find_inline(t, k, idx, ctrl);
}

/* ---- state encodings ---- */

static inline bool is_window(tg_algorithm alg) {
  return alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY;
}

static inline bool gen_ok(tg_algorithm alg, uint64_t w0, uint64_t w1,
                          uint32_t g) {
  if (is_window(alg))
    return (w0 >> WIN_GEN_SHIFT) == (g & WIN_GEN_MASK);
  return w1 == g;
}

/* A consistent view of a slot's pair. Buckets and logs keep the generation in
 * w1, which only grows, so two plain loads around w0 suffice and a reader
 * never writes. Window pairs change in both words, so their snapshot is taken
 * with a CAS of the value onto itself. */
static __attribute__((unused)) void read_pair(tg_algorithm alg, tg__pair *p,
                                              uint64_t *w0, uint64_t *w1) {
  if (!is_window(alg)) {
    tg__load_pair(p, 1, w0, w1);
    return;
  }
  *w0 = tg__load_relaxed(&p->w[0]);
  *w1 = tg__load_relaxed(&p->w[1]);
  while (!tg__cas128(p, w0, w1, *w0, *w1))
    ;
}

/* ---- log blocks and their locks ---- */

/* A block index: its class (TG__CLASS_SHIFT) and its place in the class's
 * arena. */
static inline unsigned block_class(uint64_t idx) {
  return (unsigned)(idx >> TG__CLASS_SHIFT);
}
static inline uint64_t block_place(uint64_t idx) {
  return idx & ((UINT64_C(1) << TG__CLASS_SHIFT) - 1);
}
static inline uint64_t block_idx(unsigned cls, uint64_t place) {
  return (uint64_t)cls << TG__CLASS_SHIFT | place;
}
static inline bool block_ok(const tg__table *t, uint64_t idx) {
  return block_class(idx) < t->nclass && block_place(idx) < t->g.nlogs;
}
/* idx is a block of class cls (a free list holds one class only). */
static inline bool block_in_class(const tg__table *t, uint64_t idx,
                                  unsigned cls) {
  return block_ok(t, idx) && block_class(idx) == cls;
}

/* Block idx, its header backed; NULL when idx is out of range or that
 * memory cannot be backed (a block in use always is: that index is
 * corrupt). Its entries are backed as the log grows (entries_backed), so
 * that a log's memory follows its entries, as in anonymous memory. Only
 * class 0 lives in a region (and is backed); the other classes are a
 * growing table's. */
static __attribute__((unused)) tg__log_block *block(const tg__table *t,
                                                    uint64_t idx) {
  if (idx < t->g.nlogs) { /* class 0, a whole log */
    if (!t->log0)
      return (tg__log_block *)(void *)tg__arena_at(t->lext[0], t->lshift[0],
                                                   idx, t->g.log_block_bytes);
    uint64_t off = idx * t->g.log_block_bytes;
    if (!tg__backed(t->bk, t->g.log_off + off, sizeof(tg__log_block)))
      return NULL;
    return (tg__log_block *)(void *)(t->log0 + off);
  }
  unsigned cls = block_class(idx);
  uint64_t i = block_place(idx);
  if (cls == 0 || cls >= t->nclass || i >= t->g.nlogs)
    return NULL;
  return (tg__log_block *)(void *)tg__arena_at(t->lext[cls], t->lshift[cls], i,
                                               t->lbytes[cls]);
}

/* Backs the first `count` entries of block b's ring. */
static inline bool entries_backed(const tg__table *t, const tg__log_block *b,
                                  uint64_t count) {
  if (!t->bk)
    return true;
  uint64_t off = (uint64_t)((const unsigned char *)b - t->base);
  return tg__backed(t->bk, off + sizeof *b, count * sizeof(tg__entry));
}

/* Block idx's log (b = block(t, idx)) as the steps see it, head and n
 * clamped to the ring (a corrupt segment must not send them out of it).
 * Block lock held. */
static inline tg__log log_view(const tg__table *t, tg__log_block *b,
                               uint64_t idx) {
  tg__log lg = {b->e, b->head, b->n, t->lcap[block_class(idx)], b->sum};
  if (lg.head >= lg.cap)
    lg.head = 0;
  if (lg.n > lg.cap)
    lg.n = lg.cap;
  return lg;
}

/* Writes a view back. Entries were written in place first; head goes before
 * n, so a process dying in between exposes stale slots past the tail (which
 * repair drops), never hides live ones. Block lock held. */
static inline void log_store(tg__log_block *b, const tg__log *lg) {
  if (lg->n > 0) /* so an emptied log still knows when it expired */
    tg__store_release(&b->last_us, tg__log_at(lg, lg->n - 1)->t_us);
  tg__store32_release(&b->head, lg->head);
  tg__store32_release(&b->n, lg->n);
  tg__store_release(&b->sum, lg->sum);
}

/* Empties the log, forgetting its last entry too. Block lock held. */
static inline void log_clear(tg__log_block *b) {
  tg__log empty = {NULL, 0, 0, 0, 0};
  log_store(b, &empty);
  tg__store_release(&b->last_us, 0);
}

/* Repairs a log whose last writer died in the middle of a step. A step
 * never moves entries: it writes an appended or merged entry in place, then
 * head, n and sum (log_store). What a death can leave is an appended entry n
 * does not cover (lost with the call that died: the caller never got its
 * answer), or on a full ring one written over the oldest slot, which the
 * step expired, with head not yet past it (the newest entry at head: read
 * from the next slot), a head advanced with n not yet shrunk (stale slots
 * past the tail, all older than the newest live entry), or a stale sum:
 * repair keeps each entry newer than the last kept and recomputes the sum
 * (tg__log_repair). */
static __attribute__((unused)) bool log_backed(const tg__table *t,
                                               tg__log_block *b);

static __attribute__((unused)) void repair_log(const tg__table *t,
                                               tg__log_block *b) {
  if (!log_backed(t, b)) { /* entries never written: nothing to keep */
    log_clear(b);
    return;
  }
  tg__log lg = log_view(t, b, 0); /* a region's: class 0 */
  tg__log_repair(&lg);
  log_store(b, &lg);
}

/* Backs every entry a step on b may read or write: the ring is filled from
 * its start, so the entries up to the one after the last in use are all it
 * ever wrote, plus the one it may append. Block lock held. False: a log no
 * legitimate writer left (its entries were never backed) on a full file
 * system; the caller treats it as such. */
static __attribute__((unused)) bool log_backed(const tg__table *t,
                                               tg__log_block *b) {
  if (!t->bk)
    return true;
  tg__log lg = log_view(t, b, 0); /* a region's: class 0 */
  uint64_t used = (uint64_t)lg.head + lg.n + 1;
  return entries_backed(t, b, used < lg.cap ? used : lg.cap);
}

/* Entries at the start of a shared log's ring that a log holding few
 * entries keeps to: from the first entry to the end of its page (a
 * segment's backing extent: a page, or more in a very large segment; a
 * caller's region is taken as 4 KiB pages from its start), and the next
 * page too when that leaves fewer than TG__LOG_HOME_MIN. At most cap. */
#define TG__LOG_HOME_MIN 64u

static inline uint32_t log_home(const tg__table *t, const tg__log_block *b,
                                uint32_t cap) {
  uint64_t ext = 4096, base = 0;
  if (t->bk) {
    ext = UINT64_C(1) << t->bk->shift;
    base = t->bk->ext_base;
  }
  uint64_t off = (uint64_t)((const unsigned char *)b->e - t->base);
  uint64_t into = (off >= base ? off - base : off) & (ext - 1);
  uint64_t room = (ext - into) / sizeof(tg__entry);
  if (room < TG__LOG_HOME_MIN)
    room += ext / sizeof(tg__entry);
  return room < cap ? (uint32_t)room : cap;
}

/* log_backed, for a step that may write: first, a shared log (a segment's
 * or a caller region's: their pages, once touched, stay) whose next
 * entry would go past its home (log_home) while its entries fit in half of
 * it goes back to the start of its ring. Otherwise pruning walks head
 * through the whole ring, each page it reaches is backed for good, and a
 * key that never holds more than a few entries comes to hold
 * sliding_max_entries' worth of pages; on a full file system it then
 * answers TG_ENOMEM although it needs no new memory. The entries are copied
 * to the start first, where nothing live is (head >= n: the copy and the
 * live range do not meet), then head is set to 0 in one store: a process
 * dying before that store leaves the old view whole, after it the new one
 * (n, sum and last_us do not change). A move copies at most home/2
 * entries and leaves at least home/2 appends before the next: at most one
 * entry copied per entry appended. A wrapped live range (head + n + 1 >
 * cap) stays: its ring has been walked already. Block lock held. */
static __attribute__((unused)) bool log_ready(const tg__table *t,
                                              tg__log_block *b) {
  if (!t->g.shared)
    return true; /* the memory store's logs move to blocks of their size */
  tg__log lg = log_view(t, b, 0);              /* a region's: class 0 */
  uint64_t end = (uint64_t)lg.head + lg.n + 1; /* entries a step may use */
  if (end > TG__LOG_HOME_MIN && end <= lg.cap) {
    uint32_t span = log_home(t, b, lg.cap);
    /* the live entries and the start were written, so backed, by the
     * log's own steps: asked again so that a log another process made up
     * (a hostile segment's) is never read where nothing was backed */
    if (end > span && 2 * ((uint64_t)lg.n + 1) <= span && lg.head >= lg.n &&
        entries_backed(t, b, end - 1)) {
      for (uint32_t i = 0; i < lg.n; i++)
        b->e[i] = b->e[lg.head + i];
      tg__store32_release(&b->head, 0);
    }
  }
  return log_backed(t, b);
}

static inline void unlock_block(const tg__table *t, tg__log_block *b) {
  tg__lock_release(&b->lock, t->g.shared);
}

/* A shared log's decision that its entries cannot account for: denied with
 * no wait although the cost fits the limit, which only a sum larger than
 * its entries' can give (tg__log_sound_where_read leaves the entries past
 * the ones a call reads to the call that reaches them). */
static inline bool log_sum_unaccounted(const tg__table *t, const tg__call *c,
                                       const tg__outcome *o) {
  return t->g.shared &&
         (c->op == TG__OP_HIT || c->op == TG__OP_TAKE ||
          c->op == TG__OP_CHECK) &&
         !o->r.allowed && c->arg <= c->q.limit &&
         o->r.retry_after_ms == TG_NEVER;
}

#endif
