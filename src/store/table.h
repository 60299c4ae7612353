/*
 * table.h - the concurrent fixed-capacity hash table behind the memory store
 * (and, mapped from a named segment, the shared-memory store).
 *
 * Everything lives in one region addressed by offsets from its start, never by
 * pointers, so unrelated processes can map it at different addresses:
 *
 *   [header][ctrl words: nslots x 8 B][slots: nslots x 48 B]
 *   [long-key chunks: nkeys x 256 B][sliding-log blocks: nlogs x block]
 *
 * A slot's ctrl word says whether it is EMPTY, LIVE or a TOMB, and carries the
 * key length, 16 bits of the key's hash and a 32-bit generation. The slot
 * holds the key's 16-byte state and its key (inline up to 32 bytes, else the
 * index of a 256-byte chunk). The generation is repeated inside the state, so
 * once a slot is reclaimed for another key, a CAS prepared against the old
 * key's state can never succeed: no ABA.
 *
 * Concurrency contract:
 *   - lookups and updates of existing keys are lock-free: probe, validate the
 *     ctrl word around the key comparison, then one 16-byte CAS on the state
 *     (a sliding log takes its block's mutex instead);
 *   - creating a key and reclaiming one (cleaner, or pressure when full) are
 *     structural changes and take the table mutex; they are off the hot path;
 *   - a reclaim replaces only the state it inspected (CAS from the observed
 *     value), so a key hit between inspection and reclaim survives;
 *   - a state that decayed to "absent" is equivalent to absent, which is what
 *     lets a reclaim go unnoticed by readers.
 */
#ifndef TG_TABLE_H
#define TG_TABLE_H

#include "../atomic.h"
#include "../core/core.h"

#include <pthread.h>
#include <stddef.h>

#define TG__TABLE_MAGIC UINT64_C(0x31454c4241544754) /* "TGTABLE1" */
#define TG__TABLE_VERSION 1u
/* Keys up to this many bytes live in the slot; longer ones in a chunk. */
#define TG__INLINE_KEY 32u
/* Most slots the table lets be LIVE, as a fraction of all slots: 7/8 keeps
 * linear-probing clusters short and the table at 64 bytes per key. */
#define TG__LOAD_NUM 7u
#define TG__LOAD_DEN 8u

typedef struct tg__slot {
  tg__pair st;     /* state + generation, see table.c for the encodings */
  uint64_t key[4]; /* inline key, zero padded; or key[0] = chunk index */
} tg__slot;

/* One sliding log: a mutex, the ring's head, count and cost sum, the period
 * its entries were written with (the cleaner needs it), then a ring of
 * `log_entries` entries. The mutex is initialised once, when the block is
 * first handed out, and never again: a thread may still be waiting on it
 * when the block is reused. */
typedef struct tg__log_block {
  pthread_mutex_t mu;
  uint32_t n;         /* entries in use (guarded by mu) */
  uint32_t head;      /* ring index of the oldest entry (guarded by mu) */
  uint64_t sum;       /* sum of their costs (guarded by mu) */
  uint64_t period_us; /* period of the quota last used (guarded by mu) */
  uint64_t next_free; /* free-list link, index + 1 (under the table mutex) */
  uint32_t inited;    /* mu has been initialised (set under the table mutex) */
  uint32_t pad;
  uint64_t last_us; /* time of the newest entry ever kept, so a log that
                       pruning emptied still knows when it expired */
  tg__entry e[];    /* the ring: log_entries entries */
} tg__log_block;

typedef struct tg__table_hdr {
  uint64_t magic;           /* TG__TABLE_MAGIC */
  uint32_t version;         /* TG__TABLE_VERSION */
  uint32_t hdr_bytes;       /* sizeof(tg__table_hdr) */
  uint32_t algorithm;       /* the one algorithm this table serves */
  uint32_t slot_bytes;      /* sizeof(tg__slot) */
  uint32_t log_entries;     /* entries per sliding-log block */
  uint32_t log_block_bytes; /* bytes per block, a multiple of 64 */
  uint32_t shared;          /* 1: mutexes are process-shared and robust */
  uint32_t pad0;
  uint64_t capacity; /* most LIVE keys */
  uint64_t nslots;   /* slots (capacity * 8 / 7, rounded up) */
  uint64_t nchunks;  /* long-key chunks */
  uint64_t nlogs;    /* sliding-log blocks (0 unless sliding) */
  uint64_t sip[2];   /* SipHash key, random per table */
  uint64_t ctrl_off, slot_off, chunk_off, log_off; /* offsets from the start */
  uint64_t total_bytes;            /* size of the whole region */
  uint64_t live;                   /* LIVE slots (atomic) */
  uint64_t chunk_bump, chunk_free; /* chunk allocator (table mutex) */
  uint64_t log_bump, log_free;     /* block allocator (table mutex) */
  uint64_t cursor;          /* where the next pressure reclaim looks (mutex) */
  uint64_t horizon_us;      /* latest expiry of any state a cleaner or pressure
                               reclaimed (atomic, only grows): a call that finds
                               its key absent is evaluated no earlier than this,
                               so a thread that read the time before a reclaim
                               cannot see a fresh state where the reclaimed one
                               still mattered */
  pthread_mutex_t mu;       /* structural changes */
  pthread_mutex_t clean_mu; /* at most one cleaning pass at a time */
} tg__table_hdr;

/* Parameters of a new table. */
typedef struct tg__table_params {
  tg_algorithm algorithm;
  uint64_t capacity;        /* most keys held at once, >= 1 */
  uint64_t long_keys;       /* most keys longer than TG__INLINE_KEY at once */
  uint32_t log_entries;     /* sliding log cap per key */
  bool shared;              /* process-shared robust mutexes */
  uint32_t lock_timeout_ms; /* shared: longest wait for a lock, then
                               TG_EBUSY (0: try once) */
} tg__table_params;

/* The table's geometry as this process validated it on attaching. */
typedef struct tg__geom {
  uint64_t nslots, nchunks, nlogs, capacity;
  uint32_t log_entries, log_block_bytes;
  uint32_t algorithm;
  uint32_t shared;
  uint32_t lock_timeout_ms; /* this process's bound, not the segment's */
} tg__geom;

/* A process's view of a table region. */
typedef struct tg__table {
  tg__geom g; /* never re-read from the region: indices are bounded by it */
  tg__table_hdr *h;
  unsigned char *base;
  uint64_t *ctrl;
  tg__slot *slots;
  uint64_t *chunks; /* nchunks x 32 words */
  unsigned char *logs;
} tg__table;

/* Bytes a region for p needs, or 0 if p is out of range. */
size_t tg__table_bytes(const tg__table_params *p);

/* Lays out a fresh table in mem (zeroed, tg__table_bytes(p) bytes, 64-byte
 * aligned) and fills *t. */
int tg__table_init(tg__table *t, void *mem, const tg__table_params *p);

/* Attaches to the table a region of `size` bytes already holds (a shared
 * segment another process created), after checking its header: TG_ECORRUPT
 * if the header is not a complete table of this version and layout, or its
 * layout does not match its own parameters and size; TG_EMISMATCH if it is
 * sound but was created with parameters other than *p. */
int tg__table_attach(tg__table *t, void *mem, size_t size,
                     const tg__table_params *p);

/* Destroys the mutexes of a table this process created (in-process only). */
void tg__table_fini(tg__table *t);

/* Executes one validated call. TG_EFULL when a new key cannot be placed even
 * after reclaiming decayed keys. */
int tg__table_exec(tg__table *t, const tg__call *c, tg__outcome *o);

/* Makes the key fresh, replacing only the state observed. */
int tg__table_reset(tg__table *t, const void *key, size_t key_len);

/* LIVE keys. */
size_t tg__table_live(const tg__table *t);

/* One entry handed to a cleaning callback. */
typedef struct tg__clean_item {
  uint64_t slot;   /* where it was */
  uint64_t ctrl;   /* ctrl word observed */
  uint64_t w0, w1; /* state observed */
  uint64_t value;  /* what the entry reports as its value */
  uint64_t expired_at_ms;
  size_t key_len;
  unsigned char key[TG_KEY_MAX];
} tg__clean_item;

typedef void (*tg__clean_cb)(const tg__clean_item *items, size_t n, void *ctx);

/* One cleaning pass at now: every key whose state decayed to absent at least
 * older_than_us ago is handed to cb (in batches, outside any lock, may be
 * NULL) and then reclaimed if its state is still the one inspected. Returns
 * the number reclaimed in *removed. Returns TG_ESTORE when the cleaning lock
 * fails for a reason other than being held, TG_ENOMEM when the batch buffer
 * cannot be had; a pass already running elsewhere makes this one return 0
 * at once with *removed = 0. */
int tg__table_clean(tg__table *t, uint64_t now_us, uint64_t older_than_us,
                    tg__clean_cb cb, void *ctx, size_t *removed);

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
 * checked under its mutex, and one whose holder died mid-step is repaired
 * and counted as pending. */
int tg__table_validate(const tg__table *t, tg__table_check *r);

#endif /* TG_TABLE_H */
