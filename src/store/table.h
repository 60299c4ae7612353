/* SPDX-License-Identifier: MIT */
/*
 * table.h - the concurrent fixed-capacity hash table behind the memory store
 * (and, mapped from a named segment, the shared-memory store).
 *
 * Everything lives in one region addressed by offsets from its start, never by
 * pointers, so unrelated processes can map it at different addresses:
 *
 *   [header][slots: nslots x 48 B][long-key chunks: nkeys x 256 B]
 *   [sliding-log blocks: nlogs x block]
 *
 * (The memory store's table keeps only the header and slots in its region
 * and maps the two arenas apart, as they fill: see tg__table.)
 *
 * A slot holds its ctrl word, the key's 16-byte state and the key (inline
 * up to 24 bytes, else the index of a 256-byte chunk): a decision on an
 * existing key touches that slot and nothing else of the table. The ctrl
 * word says whether the slot is EMPTY, LIVE or a TOMB, and carries the key
 * length, 16 bits of the key's hash and a 32-bit generation. The generation
 * is repeated inside the state, so once a slot is reclaimed for another
 * key, a CAS prepared against the old key's state fails: for buckets and
 * logs until the generation wraps (2^32 reuses); a window keeps 10 bits
 * of it, so a CAS stalled over 1,024 reuses of its slot could land on a
 * key with the same window end and count (docs/DESIGN.md, "State
 * encodings").
 *
 * Concurrency contract:
 *   - lookups and updates of existing keys are lock-free: probe, validate the
 *     ctrl word around the key comparison, then one 16-byte CAS on the state
 *     (a sliding log takes its block's lock instead);
 *   - creating a key and reclaiming one (cleaner, or pressure when full) are
 *     structural changes and take the table lock; they are off the hot path,
 *     and never wait for another lock while holding it (a log they would
 *     have to wait for is skipped), so a process stopped holding a log's
 *     lock delays that key's callers only;
 *   - a reclaim replaces only the state it inspected (CAS from the observed
 *     value), so a key hit between inspection and reclaim survives;
 *   - a state that decayed to "absent" is equivalent to absent, which is what
 *     lets a reclaim go unnoticed by readers;
 *   - every operation waits for locks at most lock_timeout_ms in all (one
 *     tg__wait shared by its locks and retries), then answers TG_EBUSY.
 *
 * The locks are tollgate's own (lock.h), so any bytes in a shared region are
 * handled: a lock word is free, held by a live process (wait, then
 * TG_EBUSY), or held by a gone one (taken over, and what it guards
 * repaired).
 */
#ifndef TG_TABLE_H
#define TG_TABLE_H

#include "../atomic.h"
#include "../core/core.h"
#include "lock.h"
#include "store.h"

#include <stddef.h>

#define TG__TABLE_MAGIC UINT64_C(0x31454c4241544754) /* "TGTABLE1" */
/* 2: tollgate's own locks instead of pthread mutexes, the PID namespace,
 * the reclaimed states' reach. 3: the ctrl word inside the 48-byte slot,
 * keys inline up to 24 bytes (was: a ctrl array beside 48-byte slots with
 * 32-byte keys). 4: keys hashed with SipHash-1-3 (was SipHash-2-4), so
 * a key's home slot moved. The magic and the version keep their
 * offsets in every version, so an old segment is recognised and refused
 * (TG_EMISMATCH), never misread. */
#define TG__TABLE_VERSION 4u
/* Keys up to this many bytes live in the slot; longer ones in a chunk. */
#define TG__INLINE_KEY 24u
/* Most slots the table lets be LIVE, as a fraction of all slots: 7/8 keeps
 * linear-probing clusters short and the table at 64 bytes per key. */
#define TG__LOAD_NUM 7u
#define TG__LOAD_DEN 8u

/* A slot holds everything a decision on an existing key touches: 48 bytes,
 * so a lookup reads one cache line, or two adjacent ones that it fetches
 * together (slot_off is 64-aligned; slots 4k+1 and 4k+2 straddle a line).
 * st comes first: at offset 0 of a 48-byte slot it is 16-byte aligned, as
 * the 16-byte CAS needs. */
typedef struct tg__slot {
  tg__pair st;     /* state + generation, see table.c for the encodings */
  uint64_t ctrl;   /* status, key length, hash tag, generation (table.c) */
  uint64_t key[3]; /* inline key, zero padded; or key[0] = chunk index */
} tg__slot;

/* One sliding log: its lock, the ring's head, count and cost sum, the
 * period its entries were written with (the cleaner needs it), then a ring
 * of `log_entries` entries. A zero block is a free lock and an empty log,
 * so a block needs no initialisation when first handed out; a thread may
 * still be waiting on its lock when it is reused, which is harmless. */
typedef struct tg__log_block {
  uint64_t lock;      /* lock.h word */
  uint32_t n;         /* entries in use (guarded by lock) */
  uint32_t head;      /* ring index of the oldest entry (guarded by lock) */
  uint64_t sum;       /* sum of their costs (guarded by lock) */
  uint64_t period_us; /* period of the quota last used (guarded by lock) */
  uint64_t next_free; /* free-list link, index + 1 (under the table lock) */
  uint64_t last_us;   /* time of the newest entry ever kept, so a log that
                         pruning emptied still knows when it expired */
  tg__entry e[];      /* the ring: log_entries entries */
} tg__log_block;

typedef struct tg__table_hdr {
  uint64_t magic;           /* TG__TABLE_MAGIC */
  uint32_t version;         /* TG__TABLE_VERSION */
  uint32_t hdr_bytes;       /* sizeof(tg__table_hdr) */
  uint32_t algorithm;       /* the one algorithm this table serves */
  uint32_t slot_bytes;      /* sizeof(tg__slot) */
  uint32_t log_entries;     /* entries per sliding-log block */
  uint32_t log_block_bytes; /* bytes per block, a multiple of 64 */
  uint32_t shared;          /* 1: locks shared between processes */
  uint32_t pad0;
  uint64_t capacity; /* most LIVE keys */
  uint64_t nslots;   /* slots (capacity * 8 / 7, rounded up) */
  uint64_t nchunks;  /* long-key chunks */
  uint64_t nlogs;    /* sliding-log blocks (0 unless sliding) */
  uint64_t sip[2];   /* SipHash key, random per table */
  uint64_t ctrl_off; /* slot 0's ctrl word; slot i's is slot_bytes further
                        per slot (the ctrl word lives in the slot) */
  uint64_t slot_off, chunk_off, log_off; /* offsets from the start */
  uint64_t total_bytes;                  /* size of the whole region */
  uint64_t pidns;                  /* the creator's PID namespace (inode of
                                      /proc/self/ns/pid; 0 in-process): lock
                                      owners are pids, which mean nothing in
                                      another namespace */
  uint64_t live;                   /* LIVE slots (atomic) */
  uint64_t chunk_bump, chunk_free; /* chunk allocator (table lock) */
  uint64_t log_bump, log_free;     /* block allocator (table lock) */
  uint64_t cursor;     /* where the next pressure reclaim looks (lock) */
  uint64_t horizon_us; /* latest expiry of any state a cleaner or pressure
                          reclaimed (atomic, only grows): a call that finds
                          its key absent is evaluated no earlier than this,
                          so a thread that read the time before a reclaim
                          cannot see a fresh state where the reclaimed one
                          still mattered; see absent_call for its bounds */
  uint64_t reach_us;   /* the longest any key's state may matter after the
                          call that wrote it, us (a window's period, a
                          bucket's tolerance), over every key ever created
                          (atomic, only grows, at most TG_PERIOD_MAX_MS):
                          no reclaimed state can need the horizon applied
                          further than this past a call's now */
  uint64_t lock;       /* structural changes (lock.h word) */
  uint64_t clean_lock; /* at most one cleaning pass at a time */
} tg__table_hdr;

/* How the region's pages come to exist. Anonymous memory (the memory store)
 * is backed by the kernel when first touched and needs none of this. A
 * shared segment's pages come from a file system that can be full (tmpfs):
 * touching a page it cannot supply raises SIGBUS. So the shm store backs
 * the part of the region every key needs (header, slots) when it
 * attaches, and the arenas that grow with use (long-key chunks, log blocks)
 * an extent at a time, before this process first touches one: the table
 * asks for every arena range it is about to touch (tg__backed). Asking
 * again is cheap and harmless, so the same hook serves any later layout. */
typedef struct tg__backing tg__backing;
struct tg__backing {
  /* Makes bytes [off, off + len) of the region backed: TG_OK, or TG_ENOMEM
   * when the file system has no room. Any thread, any time. */
  int (*back)(tg__backing *b, uint64_t off, uint64_t len);
  /* Frees what the store allocated for it (called when the store goes). */
  void (*release)(tg__backing *b);
  uint64_t lazy_from; /* bytes before this offset were backed at attach */
  unsigned shift;     /* an extent is 2^shift bytes (a page or more), */
  uint64_t ext_base;  /* from this offset on: lazy_from rounded down to one,
                         so that extents are whole pages */
  uint64_t nextents;
  uint64_t *done; /* one bit per extent this process has seen backed */
};

/* True when [off, off + len) may be touched: backed already, or backed now
 * (false: no room; the caller answers TG_ENOMEM or treats the index that led
 * there as corrupt). A bitmap test on the hot path. */
static inline bool tg__backed(tg__backing *b, uint64_t off, uint64_t len) {
  if (!b || off + len <= b->lazy_from)
    return true;
  if (off < b->lazy_from) {
    len -= b->lazy_from - off;
    off = b->lazy_from;
  }
  uint64_t first = (off - b->ext_base) >> b->shift;
  uint64_t last = (off + len - 1 - b->ext_base) >> b->shift;
  for (uint64_t e = first; e <= last && e < b->nextents; e++)
    if (!(__atomic_load_n(&b->done[e / 64], __ATOMIC_RELAXED) >> (e % 64) & 1u))
      return b->back(b, off, len) == TG_OK;
  return true;
}

/* Parameters of a new table. */
typedef struct tg__table_params {
  tg_algorithm algorithm;
  uint64_t capacity;        /* most keys held at once, >= 1 */
  uint64_t long_keys;       /* most keys longer than TG__INLINE_KEY at once */
  uint32_t log_entries;     /* sliding log cap per key */
  bool shared;              /* locks shared between processes */
  uint32_t lock_timeout_ms; /* shared: longest an operation waits for locks
                               in all, then TG_EBUSY (0: never waits) */
  bool evict;               /* a full table evicts the live key closest to
                               fresh (TG_FULL_EVICT); this process's choice,
                               not stored in the region */
} tg__table_params;

/* The table's geometry as this process validated it on attaching. */
typedef struct tg__geom {
  uint64_t nslots, nchunks, nlogs, capacity;
  uint32_t log_entries, log_block_bytes;
  uint32_t algorithm;
  uint32_t shared;
  uint64_t chunk_off, log_off; /* where the arenas start */
  uint32_t lock_timeout_ms;    /* this process's bound, not the segment's */
  bool evict;                  /* this process's choice, see the params */
} tg__geom;

/* Extents per arena: enough for TG_CAPACITY_MAX units from a first extent
 * of one unit. */
#define TG__EXTENTS 48
/* Sizes of log block: class 0 holds a whole log (log_entries entries, as
 * every block of a region); a growing table's classes 1.. hold 64 B, 128 B,
 * ... (1, 5, 13, ... entries), each below log_entries. A log starts in the
 * smallest and moves up a class whenever it fills (grow_log in table.c). */
#define TG__LOG_CLASSES 24
/* A log block's index carries its class above this bit (class 0: the index
 * alone, the only encoding a region's table holds). */
#define TG__CLASS_SHIFT 48

/* A process's view of a table region. */
typedef struct tg__table {
  tg__geom g; /* never re-read from the region: indices are bounded by it */
  tg__table_hdr *h;
  unsigned char *base;
  tg__slot *slots;
  /* Where each arena's units are (long-key chunks: cext, TG_KEY_MAX bytes
   * each; log blocks: lext, log_block_bytes each). Extent k of an arena
   * holds units [(2^k - 1) << shift, (2^(k+1) - 1) << shift), cut at the
   * arena's end, so that unit i is found with one bit scan (tg__arena_at).
   * In a region (a segment, the caller's memory) the extents are
   * consecutive slices of it, at chunk_off and log_off. The memory store's
   * table grows instead: its region holds the header and slots only, and
   * each extent is mapped apart when its first unit is handed out, so that
   * what it reserves follows the keys it holds (at most twice what they
   * use, plus the first extent). An extent never moves or goes before the
   * table does: a pointer to a unit stays valid. NULL: not mapped yet. */
  unsigned char *cext[TG__EXTENTS];
  unsigned char *lext[TG__LOG_CLASSES][TG__EXTENTS]; /* per class */
  unsigned cshift, lshift[TG__LOG_CLASSES];
  unsigned nclass;     /* log block classes: 1, or a growing sliding table's */
  unsigned char *log0; /* a region's class 0 blocks, one after another
                          (NULL in a growing table: lext[0]) */
  uint32_t lcap[TG__LOG_CLASSES];   /* entries a block of the class holds */
  uint64_t lbytes[TG__LOG_CLASSES]; /* its size, a multiple of 64 */
  /* classes 1..: free list heads and bump counts (table lock; class 0's
   * are the header's log_free and log_bump) */
  uint64_t lfree[TG__LOG_CLASSES], lbump[TG__LOG_CLASSES];
  bool grow;          /* extents mapped apart, as they fill */
  uint64_t ext_bytes; /* grow: bytes mapped for extents (atomic) */
  tg__backing *bk;    /* NULL: every page is backed when touched */
} tg__table;

/* The extent that holds unit i, in an arena whose first extent has 2^sh
 * units. */
static inline unsigned tg__extent_of(uint64_t i, unsigned sh) {
  return 63u - (unsigned)__builtin_clzll((i >> sh) + 1);
}

/* Unit i of an arena whose extents are ext (first extent 2^sh units of
 * `unit` bytes each), or NULL when its extent is not mapped (an index
 * never handed out). i must be below the arena's length. */
static inline unsigned char *tg__arena_at(unsigned char *const *ext,
                                          unsigned sh, uint64_t i,
                                          uint64_t unit) {
  unsigned k = tg__extent_of(i, sh);
  unsigned char *e = __atomic_load_n(&ext[k], __ATOMIC_ACQUIRE);
  if (!e)
    return NULL;
  return e + (i - (((UINT64_C(1) << k) - 1) << sh)) * unit;
}

/* Makes sure the extent holding unit i of the chunk arena (arena -1) or of
 * log class `arena` exists, mapping it if the table grows: false when it
 * cannot be mapped (TG_ENOMEM). Table lock held. */
bool tg__table_extent(tg__table *t, int arena, uint64_t i);

/* Bytes a region for p needs, or 0 if p is out of range. */
size_t tg__table_bytes(const tg__table_params *p);

/* Bytes at the start of such a region that every key may touch (header
 * and slots): what a store backs before attaching. */
size_t tg__table_core_bytes(const tg__table_params *p);

/* Lays out a fresh table in mem (zeroed, tg__table_bytes(p) bytes, 64-byte
 * aligned) and fills *t. */
int tg__table_init(tg__table *t, void *mem, const tg__table_params *p);

/* The same for a table that grows (the memory store): mem holds only the
 * header and slots (zeroed, tg__table_core_bytes(p) bytes, 64-byte
 * aligned), and the arenas are mapped apart as they fill (see tg__table).
 * tg__table_unmap_extents gives them back. */
int tg__table_init_grow(tg__table *t, void *mem, const tg__table_params *p);

/* Unmaps a growing table's extents (the table goes with them). */
void tg__table_unmap_extents(tg__table *t);

/* Checks a table header (a copy, or the region itself) against the size of
 * the region that holds it and the parameters the caller wants: TG_OK;
 * TG_ECORRUPT if it is not a complete table of this layout, or its layout
 * does not match its own parameters and size; TG_EMISMATCH if it is sound
 * but another format version, created in another PID namespace, or with
 * parameters other than *p. *why (may be NULL) receives a static reason. */
int tg__table_check_header(const tg__table_hdr *h, size_t size,
                           const tg__table_params *p, const char **why);

/* Attaches to the table a region of `size` bytes already holds (a shared
 * segment another process created), after tg__table_check_header. */
int tg__table_attach(tg__table *t, void *mem, size_t size,
                     const tg__table_params *p);

/* Executes one validated call. TG_EFULL when a new key cannot be placed even
 * after reclaiming decayed keys (and, with evict, evicting one); TG_ENOMEM
 * when the arena memory it needs cannot be backed; TG_EBUSY when a lock it
 * needs stays held past lock_timeout_ms. */
int tg__table_exec(tg__table *t, const tg__call *c, tg__outcome *o);

/* tg__table_exec of n calls, in order, answers in outs[i] and rcs[i]: the
 * same answers as n calls of it, with the keys of a group hashed and their
 * slots fetched before the group's first decision (memory-level
 * parallelism: a batch of keys not in cache waits about one miss per
 * group, not one per key). */
void tg__table_exec_batch(tg__table *t, const tg__call *calls, size_t n,
                          tg__outcome *outs, int *rcs);

/* tg__table_exec for the operations of policies and reservations (CHECK
 * and after: c->tok set), without the dispatch. */
int tg__table_rule(tg__table *t, const tg__call *c, tg__outcome *o);

/* A policy's checks and takes, as store.h's exec_policy, on the tables of
 * stores[i]: each store's table is the tg__table at byte offset table_at
 * in it (a store over one table, table_store.c's, passes offsetof: the
 * table is found here, without a frame between for it). */
int tg__table_policy(tg__store *const *stores, size_t table_at, tg__call *calls,
                     size_t n, uint32_t shadow, tg__outcome *o,
                     tg__outcome *took, tg__policy_marks *pm);

/* Makes the key fresh: its state becomes the all-zero one, which every call
 * evaluates at its own now, and which a cleaning pass or a full table
 * reclaims later (without calling before_clean). TG_EBUSY as above. */
int tg__table_reset(tg__table *t, const void *key, size_t key_len);

/* LIVE keys. */
size_t tg__table_live(const tg__table *t);

/* True when the table holds the key (a LIVE slot), decayed or not. For
 * tests and tools; lock-free. */
bool tg__table_holds(const tg__table *t, const void *key, size_t key_len);

/* One cleaning pass at now: every key whose state decayed to absent at least
 * older_than_us ago is handed to cb (in batches, outside any lock, may be
 * NULL; a key tg__table_reset emptied is not) and then reclaimed if its state
 * is still the one inspected. Returns the number reclaimed in *removed. A
 * pass already running elsewhere makes this one return TG_OK at once with
 * *removed = 0; TG_EBUSY when the table lock stayed held past
 * lock_timeout_ms (the pass stops there; what it reclaimed is counted).
 * halt (NULL: never): the pass ends, with what it reclaimed so far, once
 * *halt is not 0 (read before each slot and after each call of cb; keys
 * inspected but not yet handed to cb stay). */
int tg__table_clean(tg__table *t, uint64_t now_us, uint64_t older_than_us,
                    tg__clean_cb cb, void *ctx, const int *halt,
                    size_t *removed);

/* What tg__table_validate found. */
typedef struct tg__table_check {
  uint64_t live_slots;   /* LIVE slots */
  uint64_t live_counter; /* the header's count of them */
  uint64_t pending;      /* LIVE slots with a half-done reclaim (a process
                            died in it; the next lock settles it) */
  uint64_t leaked;       /* chunks or log blocks handed out and neither used
                            nor free (a process died between the two) */
  uint64_t busy;         /* logs not checked: a live process held them */
  uint64_t errors;       /* broken invariants */
  char first_error[96];
} tg__table_check;

/* Walks the whole table and checks every invariant a reader relies on: ctrl
 * words well formed, every LIVE key reachable from its home slot without an
 * EMPTY in between and held by exactly one slot, hash tags matching keys,
 * chunk and log-block indices in range and owned once, logs sorted and
 * within their blocks, free lists in range, acyclic and disjoint from used
 * entries, no more LIVE keys than capacity. Meant for a quiescent table
 * (tests, and after crashes). It writes only what a lock would: each log is
 * checked under its lock, and one whose holder died mid-step is repaired
 * and counted as pending. */
int tg__table_validate(const tg__table *t, tg__table_check *r);

#endif /* TG_TABLE_H */
