/* SPDX-License-Identifier: MIT */
/*
 * table.c - the concurrent fixed-capacity hash table's hot path: lookups,
 * decisions, inserts, reclaims, resets and cleaning (see table.h for the
 * layout and the concurrency contract). The region's layout and attach are
 * in table_layout.c, the structural check in table_validate.c, and what
 * they share with this file (the encodings, the lookup) in table_impl.h.
 *
 * Open addressing with linear probing from home = (hash * nslots) >> 64.
 * Inserts and reclaims are serialised by the table lock, so an insert may
 * reuse a TOMB safely; lookups never lock and fall back to the insert path
 * when they miss, which re-checks under the lock. A TOMB directly followed
 * by an EMPTY becomes EMPTY again (no LIVE key beyond it can depend on it), so
 * probe chains stay short however long the table runs.
 *
 * State encodings in the slot's 16-byte pair, generation g from the ctrl:
 *   windows : w0 = end_us | (g mod 1024) << 54, w1 = count
 *   buckets : w0 = TAT (ns),                     w1 = g
 *   sliding : w0 = log block index + 1,          w1 = g
 * (end_us stays below 2^54 because now <= TG_NOW_MAX_US and period <=
 * TG_PERIOD_MAX_MS.) The all-zero state of each (with the slot's
 * generation) is the one tg__table_reset leaves: fresh at any now.
 *
 * Locks (lock.h): the table lock for structural changes, one per sliding
 * log, one for cleaning passes. A function named *_locked must be called
 * with the table lock held. An operation's waits share one tg__wait.
 * While holding the table lock nothing waits for a log's lock (it tries,
 * and leaves a busy log alone), so the order table -> log never blocks.
 */
#include "table_impl.h"

#include <stdlib.h>
#include <string.h>

/* Slots a pressure reclaim inspects per failed insert. */
#define RECLAIM_SCAN 4096u
#define PERIOD_MAX_US (TG_PERIOD_MAX_MS * 1000u)

/* ---- probing backwards (see table_impl.h for the rest of the keys) ---- */

static uint64_t prev(const tg__table *t, uint64_t i) {
  return i == 0 ? t->g.nslots - 1 : i - 1;
}

/* ---- state encodings ---- */

static tg__state decode(tg_algorithm alg, uint64_t w0, uint64_t w1) {
  if (is_window(alg))
    return tg__win_state(w0 & WIN_END_MASK, w1);
  return tg__tat_state(w0);
}

static void encode(tg_algorithm alg, const tg__state *st, uint32_t g,
                   uint64_t *w0, uint64_t *w1) {
  if (is_window(alg)) {
    *w0 = (tg__win_end(st) & WIN_END_MASK) | ((uint64_t)g & WIN_GEN_MASK)
                                                 << WIN_GEN_SHIFT;
    *w1 = tg__win_count(st);
  } else {
    *w0 = tg__tat(st);
    *w1 = g;
  }
}

/* ---- log blocks and their locks ---- */

/* When the log stops mattering, us: its newest entry plus the period (an
 * entry at now 0 included: a replay or a test clock may start there), or,
 * for a log emptied by pruning, its last entry's; 0 for a log that never
 * kept one (or was reset), and for an emptied one whose last entry was at
 * 0 (last_us cannot tell the two apart; such a log expired before now
 * reached its period anyway). Block lock held. */
static uint64_t log_expiry(const tg__table *t, tg__log_block *b, uint64_t idx) {
  tg__log lg = log_view(t, b, idx);
  if (lg.n)
    return tg__log_at(&lg, lg.n - 1)->t_us + b->period_us;
  return b->last_us ? b->last_us + b->period_us : 0;
}

/* Starts fetching a log block's first lines together: the header (lock,
 * head, n, sum) and the entries after it, which a short log lives in.
 * Otherwise the lock's miss and then each entry line's would be waited
 * for in turn. Only lines the block owns; a prefetch never faults, so a
 * line of a segment not backed yet is simply not fetched. */
static void block_prefetch(const tg__table *t, const tg__log_block *b,
                           uint64_t idx) {
  const char *p = (const char *)b;
  size_t lines = t->lbytes[block_class(idx)] / 64; /* >= 1: a multiple of 64 */
  if (lines > 4)
    lines = 4;
  for (size_t k = 0; k < lines; k++)
    __builtin_prefetch(p + (size_t)64 * k, 1);
}

static int lock_block(const tg__table *t, tg__log_block *b, tg__wait *wt) {
  bool died;
  int rc = tg__lock_take(&b->lock, t->g.shared, wt, &died);
  if (rc == TG_OK && died)
    repair_log(t, b);
  return rc;
}

/* The block's lock if it is free (or its holder gone), without waiting. */
static int try_block(const tg__table *t, tg__log_block *b) {
  bool died;
  int rc = tg__lock_try(&b->lock, t->g.shared, &died);
  if (rc == TG_OK && died)
    repair_log(t, b);
  return rc;
}

/* ---- arenas (all under the table lock) ---- */

/* The free lists keep index + 1 (0 ends them). Every link read from the
 * region is range-checked: a corrupt list is dropped (its chunks or blocks
 * are lost to the table), never followed out of bounds. Memory is backed
 * before an entry is first touched, so a full file system answers
 * TG_ENOMEM here instead of a signal later. */

/* Returns chunk index + 1, or 0 with *rc = TG_EFULL (none left) or
 * TG_ENOMEM (the next one cannot be backed). */
static uint64_t chunk_alloc_locked(tg__table *t, unsigned cls, int *rc) {
  (void)cls;
  tg__table_hdr *h = t->h;
  if (h->chunk_free > t->g.nchunks)
    h->chunk_free = 0;
  if (h->chunk_free) {
    uint64_t idx = h->chunk_free - 1;
    const uint64_t *w = chunk_words(t, idx);
    if (w) {
      uint64_t nx = tg__load_relaxed(&w[0]);
      h->chunk_free = nx <= t->g.nchunks ? nx : 0;
      return idx + 1;
    }
    h->chunk_free = 0; /* a free chunk never backed: not one we freed */
  }
  if (h->chunk_bump < t->g.nchunks) {
    if (!tg__table_extent(t, -1, h->chunk_bump) ||
        !chunk_words(t, h->chunk_bump)) {
      *rc = TG_ENOMEM;
      return 0;
    }
    return ++h->chunk_bump;
  }
  *rc = TG_EFULL;
  return 0;
}

static void chunk_release_locked(tg__table *t, uint64_t idx) {
  uint64_t *w = chunk_words(t, idx);
  if (!w)
    return;
  tg__store_relaxed(&w[0], t->h->chunk_free);
  t->h->chunk_free = idx + 1;
}

/* Where class cls keeps its free list and bump count: class 0 in the
 * header (a region's, shared), the others in this process's view (only a
 * growing table, which is private, has them). */
static uint64_t *class_free(tg__table *t, unsigned cls) {
  return cls ? &t->lfree[cls] : &t->h->log_free;
}
static uint64_t *class_bump(tg__table *t, unsigned cls) {
  return cls ? &t->lbump[cls] : &t->h->log_bump;
}

/* Returns a block of class cls, index + 1, or 0 with *rc as
 * chunk_alloc_locked's. Free-list links are index + 1 of the same class. */
static uint64_t block_alloc_locked(tg__table *t, unsigned cls, int *rc) {
  uint64_t *fr = class_free(t, cls), *bump = class_bump(t, cls);
  if (*fr && !block_in_class(t, *fr - 1, cls))
    *fr = 0;
  if (*fr) {
    uint64_t idx = *fr - 1;
    const tg__log_block *b = block(t, idx);
    if (b) {
      uint64_t nx = b->next_free;
      *fr = nx && block_in_class(t, nx - 1, cls) ? nx : 0;
      return idx + 1;
    }
    *fr = 0;
  }
  if (*bump < t->g.nlogs) {
    uint64_t idx = block_idx(cls, *bump);
    if (!tg__table_extent(t, (int)cls, *bump) || !block(t, idx)) {
      *rc = TG_ENOMEM;
      return 0;
    }
    ++*bump;
    return idx + 1;
  }
  *rc = TG_EFULL;
  return 0;
}

static void block_release_locked(tg__table *t, uint64_t idx) {
  tg__log_block *b = block(t, idx);
  if (!b)
    return;
  uint64_t *fr = class_free(t, block_class(idx));
  b->next_free = *fr;
  *fr = idx + 1;
}

/* ---- reclaim ---- */

/* How long after the call that wrote it the call's state may matter, us:
 * a window or log ends a period after its last write, a bucket's TAT lies
 * at most its tolerance ahead of the call, and a reservation's its wait
 * further. */
static uint64_t call_reach_us(const tg__call *c) {
  uint64_t r =
      c->alg == TG_TOKEN_BUCKET || c->alg == TG_LEAKY_BUCKET
          ? tg__div_ceil(c->q.tau_ns, 1000) + tg__div_ceil(c->wait_ns, 1000)
          : c->q.period_us;
  return r < PERIOD_MAX_US ? r : PERIOD_MAX_US;
}

static void raise_max(uint64_t *w, uint64_t v) {
  uint64_t cur = tg__load_relaxed(w);
  while (cur < v && !tg__cas64(w, &cur, v))
    ;
}

/* A reservation may push a held key's state its wait further ahead than
 * any key the table created reaches (the reach raised at insert): the
 * horizon must reach that far before the state is written, so before its
 * key can be reclaimed. */
static inline void reach_wait(tg__table *t, const tg__call *c) {
  if (__builtin_expect(c->wait_ns != 0, 0))
    raise_max(&t->h->reach_us, call_reach_us(c));
}

/* Publishes, before the reclaim that needs it, that no call may evaluate an
 * absent key earlier than expiry_us. */
static void raise_horizon(tg__table *t, uint64_t expiry_us) {
  raise_max(&t->h->horizon_us, expiry_us);
}

/* The call as it applies to an absent key: no earlier than the horizon, so
 * a call whose time was read before a reclaim, or a clock that stepped back
 * a little, cannot find fresh a key whose reclaimed state still mattered.
 * Bounded: a reclaimed state mattered at most reach_us after the call that
 * wrote it, so a horizon further ahead of now than that is not applied
 * (the clock went back further than any state reaches, e.g. after a jump
 * forward). A horizon beyond what any accepted clock could have written is
 * corruption, or a clock that was once decades ahead: it is cleared, not
 * obeyed, so it cannot hold every new key in the future for good. */
static const tg__call *absent_call(tg__table *t, const tg__call *c,
                                   tg__call *tmp) {
  uint64_t hz = tg__load_acquire(&t->h->horizon_us);
  if (c->now_us >= hz)
    return c;
  uint64_t ahead = hz - c->now_us;
  if (hz > TG_NOW_MAX_US || ahead > PERIOD_MAX_US) {
    (void)tg__cas64(&t->h->horizon_us, &hz, 0);
    return c;
  }
  if (ahead > tg__load_acquire(&t->h->reach_us))
    return c;
  if (c != tmp)
    *tmp = *c;
  tmp->now_us = hz;
  return tmp;
}

/* A TOMB followed by an EMPTY can become EMPTY (no LIVE key beyond it probed
 * through it), and so can the TOMBs before it. The generation is kept.
 * Table lock held, as for every structural change. */
static void tombs_to_empty_locked(tg__table *t, uint64_t i) {
  if (ctrl_status(tg__load_relaxed(ctrl_at(t, next(t, i)))) != EMPTY)
    return;
  for (uint64_t n = 0; n < t->g.nslots; n++) {
    uint64_t c = tg__load_relaxed(ctrl_at(t, i));
    if (ctrl_status(c) != TOMB)
      return;
    tg__store_release(ctrl_at(t, i), ctrl_make(EMPTY, 0, 0, ctrl_gen(c)));
    i = prev(t, i);
  }
}

/* Second half of a reclaim, once the state carries the next generation: the
 * ctrl word turns TOMB first, and only then are the key's chunk and log
 * block freed, so a process dying in between leaks at most those (never a
 * double free), and one dying before the ctrl store leaves a LIVE slot with a
 * newer state that settle() finishes. Table lock held. */
static void finish_reclaim_locked(tg__table *t, uint64_t i, uint64_t c) {
  tg__table_hdr *h = t->h;
  tg__store_release(ctrl_at(t, i), ctrl_make(TOMB, 0, 0, ctrl_gen(c) + 1));
  if (ctrl_len(c) > TG__INLINE_KEY)
    chunk_release_locked(t, tg__load_relaxed(&t->slots[i].key[0]));
  if (t->g.algorithm == TG_SLIDING_WINDOW) {
    uint64_t bi = tg__load_relaxed(&t->slots[i].st.w[0]);
    if (bi >= 1 && block_ok(t, bi - 1))
      block_release_locked(t, bi - 1);
  }
  if (tg__load_relaxed(&h->live) > 0)
    tg__fetch_sub(&h->live, 1);
  tombs_to_empty_locked(t, i);
}

/* Slot i holds ctrl c: if its state has moved to another generation, that is
 * a reclaim left half done (in this process only while the reclaimer holds
 * the lock we now hold, so: by a process that died), and we finish it.
 * Table lock held. Returns true if it was finished. */
static bool settle_slot_locked(tg__table *t, uint64_t i, uint64_t c) {
  tg_algorithm alg = (tg_algorithm)t->g.algorithm;
  uint64_t w0, w1;
  read_pair(alg, &t->slots[i].st, &w0, &w1);
  if (gen_ok(alg, w0, w1, ctrl_gen(c)))
    return false;
  finish_reclaim_locked(t, i, c);
  return true;
}

/* After a process died holding the table lock: finish every reclaim left
 * half done and recount the LIVE slots (an insert or reclaim may have died
 * between its ctrl store and the count). */
static void repair_table_locked(tg__table *t) {
  uint64_t live = 0;
  for (uint64_t i = 0; i < t->g.nslots; i++) {
    uint64_t c = tg__load_acquire(ctrl_at(t, i));
    if (ctrl_status(c) == LIVE && !settle_slot_locked(t, i, c))
      live++;
  }
  tg__store_release(&t->h->live, live);
}

static int lock_table(tg__table *t, tg__wait *wt) {
  bool died;
  int rc = tg__lock_take(&t->h->lock, t->g.shared, wt, &died);
  if (rc == TG_OK && died)
    repair_table_locked(t);
  return rc;
}

static void unlock_table(tg__table *t) {
  tg__lock_release(&t->h->lock, t->g.shared);
}

/* Decayed enough to reclaim: stopped mattering at expiry, at least
 * older_than_us before now. */
static bool decayed(uint64_t now_us, uint64_t expiry, uint64_t older_than_us) {
  return now_us >= expiry && now_us - expiry >= older_than_us;
}

/* Reclaims slot i if it still holds ctrl c and state (w0, w1) and either
 * that state has been absent-equivalent for at least older_than_us at now,
 * or `evict` (the table is full and its user chose to forget a live key;
 * the horizon is then not raised, as the evicted state did not decay: it is
 * lost, and a key's next call starts afresh at its own now). Table lock
 * held; never waits (a log in use is left alone). Returns true if the slot
 * was freed. */
static bool reclaim_locked(tg__table *t, uint64_t i, uint64_t c, uint64_t w0,
                           uint64_t w1, uint64_t now_us, uint64_t older_than_us,
                           bool evict) {
  tg_algorithm alg = (tg_algorithm)t->g.algorithm;
  if (tg__load_acquire(ctrl_at(t, i)) != c)
    return false;
  uint32_t g2 = ctrl_gen(c) + 1;
  tg__pair *p = &t->slots[i].st;
  if (alg == TG_SLIDING_WINDOW) {
    tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
    if (!b || try_block(t, b) != TG_OK)
      return false; /* a corrupt index (only a reset drops it), or in use */
    if (!log_backed(t, b) || tg__load_relaxed(&p->w[0]) != w0) {
      unlock_block(t, b); /* or the log grew out of this block */
      return false;
    }
    uint64_t expiry = log_expiry(t, b, w0 - 1);
    bool ok = evict || decayed(now_us, expiry, older_than_us);
    if (ok && !evict)
      raise_horizon(t, expiry);
    /* the block index stays in w0 so a repair can still free the block */
    ok = ok && tg__cas128(p, &w0, &w1, w0, g2);
    if (ok)
      log_clear(b);
    unlock_block(t, b);
    if (!ok)
      return false;
  } else {
    if (!evict) {
      /* the caller inspected (w0, w1) as decayed at now, so this never
       * moves the horizon past now, even if the CAS below then fails */
      tg__state st = decode(alg, w0, w1);
      raise_horizon(t, tg__state_expiry_us(alg, &st));
    }
    tg__state absent = {0, 0};
    uint64_t n0, n1;
    encode(alg, &absent, g2, &n0, &n1);
    if (!tg__cas128(p, &w0, &w1, n0, n1))
      return false; /* hit since inspection: the key survives */
  }
  finish_reclaim_locked(t, i, c);
  return true;
}

/* Inspects LIVE slot i (ctrl c): fills the observed state into *it, and its
 * expiry (when it stops or stopped mattering) into *expiry. False when the
 * slot cannot be judged now: another generation, a corrupt log index, or a
 * log whose lock is held (it is in use, so hardly decayed; never waited
 * for). */
static bool inspect(tg__table *t, uint64_t i, uint64_t c, tg__clean_item *it,
                    uint64_t *expiry) {
  tg_algorithm alg = (tg_algorithm)t->g.algorithm;
  uint64_t w0, w1;
  read_pair(alg, &t->slots[i].st, &w0, &w1);
  if (!gen_ok(alg, w0, w1, ctrl_gen(c)))
    return false;
  if (alg == TG_SLIDING_WINDOW) {
    tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
    if (!b || try_block(t, b) != TG_OK)
      return false;
    if (!log_backed(t, b)) {
      unlock_block(t, b);
      return false;
    }
    if (tg__load_relaxed(&t->slots[i].st.w[0]) != w0) {
      unlock_block(t, b); /* the log grew out of this block */
      return false;
    }
    tg__log lg = log_view(t, b, w0 - 1);
    *expiry = log_expiry(t, b, w0 - 1);
    unlock_block(t, b);
    it->value = lg.sum;
  } else {
    tg__state st = decode(alg, w0, w1);
    *expiry = tg__state_expiry_us(alg, &st);
    it->value = is_window(alg) ? tg__win_count(&st) : 0;
  }
  it->slot = i;
  it->ctrl = c;
  it->w0 = w0;
  it->w1 = w1;
  it->expired_at_ms = tg__div_ceil(*expiry, 1000);
  return true;
}

/* What an insert lacks when it reclaims: a slot, a long key's chunk, a log
 * block. Any reclaim frees a slot; only a long key frees a chunk; every
 * sliding key frees a block. */
enum need { NEED_SLOT, NEED_CHUNK, NEED_BLOCK };

/* Under pressure (table or arena full): reclaims every decayed key among
 * the next RECLAIM_SCAN slots from the rotating cursor. Then, with evict,
 * if none of those freed what the caller needs, evicts the live key
 * closest to fresh (earliest expiry) among those inspected that would.
 * Table lock held; never waits. */
static void reclaim_some_locked(tg__table *t, uint64_t now_us, enum need need,
                                bool evict) {
  tg__table_hdr *h = t->h;
  uint64_t i = h->cursor % t->g.nslots;
  uint64_t scan = t->g.nslots;
  if (scan > RECLAIM_SCAN)
    scan = RECLAIM_SCAN;
  bool freed = false, have = false;
  uint64_t best_expiry = 0, best_slot = 0, best_ctrl = 0, best_w0 = 0,
           best_w1 = 0;
  tg__clean_item it;
  for (uint64_t n = 0; n != scan; n++, i = next(t, i)) {
    uint64_t c = tg__load_acquire(ctrl_at(t, i)), expiry;
    if (ctrl_status(c) != LIVE || !inspect(t, i, c, &it, &expiry))
      continue;
    bool useful = need != NEED_CHUNK || ctrl_len(c) > TG__INLINE_KEY;
    if (decayed(now_us, expiry, 0)) {
      if (reclaim_locked(t, i, c, it.w0, it.w1, now_us, 0, false))
        freed = freed || useful;
    } else if (evict && useful && (!have || expiry < best_expiry)) {
      have = true;
      best_expiry = expiry;
      best_slot = i;
      best_ctrl = c;
      best_w0 = it.w0;
      best_w1 = it.w1;
    }
  }
  h->cursor = i;
  if (evict && !freed && have)
    (void)reclaim_locked(t, best_slot, best_ctrl, best_w0, best_w1, now_us, 0,
                         true);
}

/* ---- insert ---- */

/* Takes a chunk (long key) or a log block, reclaiming (or evicting) a few
 * scans at a time when none is free. On failure *rc says why (TG_EFULL,
 * TG_ENOMEM). Table lock held. */
static uint64_t alloc_or_reclaim_locked(
    tg__table *t, uint64_t (*alloc)(tg__table *, unsigned, int *), unsigned cls,
    enum need need, uint64_t now_us, int *rc) {
  uint64_t x = alloc(t, cls, rc);
  for (int pass = 0; !x && pass < 4; pass++) {
    reclaim_some_locked(t, now_us, need, t->g.evict);
    x = alloc(t, cls, rc);
  }
  return x;
}

/* The smallest class of block that holds n entries (0: a whole log). */
static unsigned log_class_for(const tg__table *t, uint32_t n) {
  for (unsigned c = 1; c < t->nclass; c++)
    if (t->lcap[c] >= n)
      return c;
  return 0;
}

/* A log block for a new key, locked (index + 1; 0 with *rc on failure). A
 * free block's lock may still be held: by a thread that found the block's
 * old key just before its reclaim (it lets go at once, seeing the key
 * gone), or by a process stopped right there. Such a block is set aside and
 * another taken, never waited for. Table lock held. */
static uint64_t take_block_locked(tg__table *t, unsigned cls, uint64_t now_us,
                                  int *rc) {
  uint64_t aside[4], bi = 0;
  unsigned na = 0;
  while (na < 4) {
    bi = alloc_or_reclaim_locked(t, block_alloc_locked, cls, NEED_BLOCK, now_us,
                                 rc);
    if (!bi)
      break;
    tg__log_block *b = block(t, bi - 1);
    if (b && try_block(t, b) == TG_OK)
      break;
    aside[na++] = bi;
    bi = 0;
  }
  if (!bi && na == 4)
    *rc = TG_EBUSY;
  while (na > 0)
    block_release_locked(t, aside[--na] - 1);
  return bi;
}

/* Creates the key with its first state already in place: `init` (windows,
 * buckets) or the entries of `init_log` (sliding), computed at c's time,
 * then the key, then the ctrl word, so nobody (a cleaner included) ever
 * sees it half made. Sets *published when this call created it; if the
 * key exists already (someone created it meanwhile), or a reclaim has
 * raised the horizon past c's time since the caller evaluated it (see
 * absent_call), nothing is written and the caller evaluates the call
 * again. */
static int insert(tg__table *t, const kref *k, const tg__call *c,
                  const tg__state *init, const tg__log *init_log,
                  bool *published, tg__wait *wt) {
  tg__table_hdr *h = t->h;
  *published = false;
  const bool sliding = c->alg == TG_SLIDING_WINDOW;
  if (sliding ? init_log == NULL : init == NULL)
    return TG_EINVAL; /* a caller's bug: every caller passes the right one */
  int rc = lock_table(t, wt);
  if (rc != TG_OK)
    return rc;
  uint64_t i, ctl, chunk = 0, bi = 0;
  if (find(t, k, &i, &ctl) && !settle_slot_locked(t, i, ctl))
    goto out; /* someone else created it meanwhile */
  /* the caller evaluated the absent key at c's time before it had the
   * lock: a reclaim since then may have raised the horizon past it, and
   * the state made at that time may be one the reclaim ended (a full
   * window, counted again from 1). Nothing published: the caller
   * evaluates it again, at the horizon. */
  tg__call again;
  if (absent_call(t, c, &again) != c)
    goto out;
  /* a long key's chunk first: a long key reclaimed for it frees a slot
   * too, where a short key reclaimed for the slot would leave the chunk
   * still to find (a full table evicting two keys for one) */
  if (k->len > TG__INLINE_KEY &&
      !(chunk = alloc_or_reclaim_locked(t, chunk_alloc_locked, 0, NEED_CHUNK,
                                        c->now_us, &rc)))
    goto out;
  /* one bounded scan; an eviction can lose its CAS to a racing decision,
   * so evicting tries a few more */
  for (int pass = 0; tg__load_relaxed(&h->live) >= t->g.capacity &&
                     pass < (t->g.evict ? 4 : 1);
       pass++)
    reclaim_some_locked(t, c->now_us, NEED_SLOT, t->g.evict);
  rc = TG_EFULL;
  if (tg__load_relaxed(&h->live) >= t->g.capacity)
    goto fail;
  /* arenas and reclaims before the slot: a reclaim may turn TOMBs into
   * EMPTYs, and the slot must be the first free one on the key's probe
   * path */
  if (sliding && !(bi = take_block_locked(t, log_class_for(t, init_log->n),
                                          c->now_us, &rc)))
    goto fail;
  if (sliding && !entries_backed(t, block(t, bi - 1), init_log->n)) {
    rc = TG_ENOMEM;
    goto fail;
  }
  i = home(t, k->hash);
  uint64_t cc = 0, probes;
  for (probes = 0; probes < t->g.nslots; probes++, i = next(t, i)) {
    cc = tg__load_relaxed(ctrl_at(t, i));
    if (ctrl_status(cc) != LIVE)
      break;
  }
  rc = TG_EFULL;
  if (probes == t->g.nslots || tg__load_relaxed(&h->live) >= t->g.capacity)
    goto fail;
  uint32_t g = ctrl_gen(cc);
  tg__slot *s = &t->slots[i];
  if (chunk) {
    uint64_t *w = chunk_words(t, chunk - 1); /* backed by chunk_alloc_locked */
    for (size_t j = 0; j < k->nw; j++)
      tg__store_relaxed(&w[j], k->w[j]);
    tg__store_relaxed(&s->key[0], chunk - 1);
  } else {
    for (size_t j = 0; j < 3; j++)
      tg__store_relaxed(&s->key[j], j < k->nw ? k->w[j] : 0);
  }
  uint64_t w0, w1;
  if (sliding) {
    tg__log_block *b = block(t, bi - 1); /* locked by take_block_locked */
    tg__log lg = log_view(t, b, bi - 1);
    lg.head = 0;
    lg.n = 0;
    lg.sum = init_log->sum;
    for (uint32_t j = 0; j < init_log->n && j < lg.cap; j++)
      *tg__log_at(&lg, lg.n++) = *tg__log_at(init_log, j);
    b->period_us = c->q.period_us;
    b->last_us = 0;
    log_store(b, &lg);
    unlock_block(t, b);
    w0 = bi;
    w1 = g;
  } else {
    encode(c->alg, init, g, &w0, &w1);
  }
  /* before the key can be reclaimed, so before any horizon it raises */
  raise_max(&h->reach_us, call_reach_us(c));
  tg__store_relaxed(&s->st.w[0], w0);
  tg__store_relaxed(&s->st.w[1], w1);
  tg__store_release(ctrl_at(t, i), ctrl_make(LIVE, k->len, k->tag, g));
  tg__fetch_add(&h->live, 1);
  *published = true;
  rc = TG_OK;
  goto out;
fail:
  if (chunk)
    chunk_release_locked(t, chunk - 1);
  if (bi) {
    tg__log_block *b = block(t, bi - 1);
    if (b)
      unlock_block(t, b);
    block_release_locked(t, bi - 1);
  }
out:
  unlock_table(t);
  return rc;
}

/* Whether a HIT or TAKE on log lg (block idx) at c->now_us will append an
 * entry its ring lacks room for: the ring is full, its oldest entry is
 * still live (so, the log being sorted, pruning frees none), now is past
 * its newest (a call of the same microsecond merges), and the call is
 * allowed with a cost (a denied call records nothing). A log in a block
 * smaller than a whole log (class > 0) then moves up a class first, so
 * that entries merge only at sliding_max_entries. */
static inline bool log_needs_room(uint64_t idx, const tg__log *lg,
                                  const tg__call *c) {
  if (block_class(idx) == 0 || lg->n < lg->cap ||
      (c->op != TG__OP_HIT && c->op != TG__OP_TAKE) || c->arg == 0)
    return false;
  const tg__entry *first = tg__log_at(lg, 0), *last = tg__log_at(lg, lg->n - 1);
  bool frees =
      first->t_us <= c->now_us && c->now_us - first->t_us >= c->q.period_us;
  return !frees && c->now_us > last->t_us && tg__log_allows(c, lg->sum);
}

/* Moves the log of slot pair p (generation g, block *w0 - 1, locked, as
 * *bp) into a block of the next class: the new block comes back locked in
 * *bp and its index + 1 in *w0; the old one is emptied, let go and freed.
 * A thread that was waiting for the old block's lock finds the pair
 * changed once it has it, and follows (every path checks the pair again
 * under the block lock). Only a growing table's logs move, and only while
 * their holder has the old block's lock, so no reclaim, reset or other
 * move can change the pair meanwhile. The table lock is taken with a block
 * lock held, the order every path allows (a holder of the table lock never
 * waits for a log: the new block is try-locked), and held over the copy
 * (at most a whole log's entries) so that one section both takes the new
 * block and frees the old. */
__attribute__((noinline, cold)) static int
grow_log(tg__table *t, tg__pair *p, uint32_t g, uint64_t *w0,
         tg__log_block **bp, uint64_t now_us, tg__wait *wt) {
  uint64_t from = *w0 - 1;
  unsigned cls = block_class(from);
  unsigned to = cls + 1 < t->nclass ? cls + 1 : 0;
  int rc = lock_table(t, wt);
  if (rc != TG_OK)
    return rc;
  uint64_t bi = take_block_locked(t, to, now_us, &rc);
  if (!bi) {
    unlock_table(t);
    return rc;
  }
  tg__log_block *old = *bp, *b = block(t, bi - 1); /* locked, see above */
  tg__log src = log_view(t, old, from), dst = log_view(t, b, bi - 1);
  dst.head = 0;
  dst.n = 0;
  dst.sum = src.sum;
  for (uint32_t j = 0; j < src.n && dst.n < dst.cap; j++)
    *tg__log_at(&dst, dst.n++) = *tg__log_at(&src, j);
  b->period_us = old->period_us;
  b->last_us = old->last_us;
  log_store(b, &dst);
  uint64_t e0 = *w0, e1 = g;
  bool moved = tg__cas128(p, &e0, &e1, bi, g);
  tg__log_block *gone = moved ? old : b;
  uint64_t gone_idx = moved ? from : bi - 1;
  log_clear(gone);
  unlock_block(t, gone);
  block_release_locked(t, gone_idx);
  unlock_table(t);
  if (!moved)
    return TG_ECORRUPT; /* the pair changed under its log's lock */
  *w0 = bi;
  *bp = b;
  return TG_OK;
}

/* A step is about to append to a full log in a block smaller than a whole
 * log (log_needs_room): moves it up a class and views the new block in
 * *lg. When no larger block can be had (TG_ENOMEM, TG_EBUSY) the step
 * runs in this one and merges its newest entries early: answers stay on
 * the safe side, and a later call tries the move again. TG_ECORRUPT (the
 * pair changed under its log's lock) is the only failure; the block in
 * *bp is locked either way. */
static int make_room(tg__table *t, tg__pair *p, uint32_t g, uint64_t *w0,
                     tg__log_block **bp, tg__log *lg, uint64_t now_us,
                     tg__wait *wt) {
  int rc = grow_log(t, p, g, w0, bp, now_us, wt);
  if (rc == TG_ECORRUPT)
    return rc;
  *lg = log_view(t, *bp, *w0 - 1);
  return TG_OK;
}

/* Finishes a reclaim of the key left half done (see settle_slot_locked); in
 * this process, simply waits for the reclaimer holding the lock. */
static int settle(tg__table *t, const kref *k, tg__wait *wt) {
  int rc = lock_table(t, wt);
  if (rc != TG_OK)
    return rc;
  uint64_t i, c;
  if (find(t, k, &i, &c))
    settle_slot_locked(t, i, c);
  unlock_table(t);
  return TG_OK;
}

/* ---- operations ---- */

/* The all-zero state (a reset key) stands for an absent key, for which a
 * step that leaves the state fresh creates nothing: writing that state
 * would make it matter to an earlier now, as an absent key never does.
 * True when (w0, w1) is that state and *st is fresh: nothing to write. */
static bool blank_stays(const tg__call *c, uint64_t w0, uint64_t w1,
                        const tg__state *st) {
  tg__state was = decode(c->alg, w0, w1);
  return tg__state_word(&was, 0) == 0 && tg__state_word(&was, 1) == 0 &&
         tg__state_fresh(c->alg, st, c->now_us);
}

/* Windows and buckets: one CAS per decision. A bucket reads its pair without
 * writing and publishes only a changed state, so a denied decision writes
 * nothing; a window snapshot is validated by the CAS itself. */
static inline __attribute__((always_inline)) int
exec_state(tg__table *t, const kref *k, const tg__call *c, tg__outcome *o) {
  tg__wait wait = tg__wait_bound(t->g.lock_timeout_ms), *wt = &wait;
  bool win = is_window(c->alg);
  tg__call tmp; /* c with its time clamped to the horizon, when needed */
  for (;;) {
    uint64_t i, ctl;
    if (!find(t, k, &i, &ctl)) {
      const tg__call *ac = absent_call(t, c, &tmp);
      tg__state st = {0, 0};
      bool changed, published;
      int rc = tg__state_step(ac, &st, o, &changed);
      if (rc != TG_OK || !changed || tg__state_fresh(c->alg, &st, ac->now_us))
        return rc;
      rc = insert(t, k, ac, &st, NULL, &published, wt);
      if (rc != TG_OK || published)
        return rc; /* *o is this call's answer on the state it published */
      c = ac;      /* created meanwhile: step on it, keeping the clamped time */
      continue;
    }
    tg__pair *p = &t->slots[i].st;
    uint32_t g = ctrl_gen(ctl);
    uint64_t w0, w1;
    if (win) {
      w0 = tg__load_relaxed(&p->w[0]);
      w1 = tg__load_relaxed(&p->w[1]);
    } else {
      tg__load_pair(p, 1, &w0, &w1);
    }
    while (gen_ok(c->alg, w0, w1, g)) {
      tg__state st = decode(c->alg, w0, w1);
      if (t->g.shared && !tg__state_plausible(c->alg, &st))
        return TG_ECORRUPT; /* a hostile segment: never let it wrap */
      bool changed;
      int rc = tg__state_step(c, &st, o, &changed);
      uint64_t n0 = w0, n1 = w1;
      if (rc == TG_OK && changed && !blank_stays(c, w0, w1, &st))
        encode(c->alg, &st, g, &n0, &n1);
      else if (!win)
        return rc; /* consistent snapshot, nothing to write */
      if (tg__cas128(p, &w0, &w1, n0, n1))
        return rc;
      /* lost a race (or a window guess was torn): w0, w1 are current */
    }
    /* the slot was reclaimed since the lookup (or a reclaim was left half
     * done by a dead process): settle it, then look the key up again */
    int rc = settle(t, k, wt);
    if (rc != TG_OK)
      return rc;
  }
}

/* Sliding log: the block's lock serialises the key's log. */
static inline __attribute__((always_inline)) int
exec_log(tg__table *t, const kref *k, const tg__call *c, tg__outcome *o) {
  tg__wait wait = tg__wait_bound(t->g.lock_timeout_ms), *wt = &wait;
  tg__call tmp; /* c with its time clamped to the horizon, when needed */
  for (;;) {
    uint64_t i, ctl;
    bool changed;
    if (!find(t, k, &i, &ctl)) {
      const tg__call *ac = absent_call(t, c, &tmp);
      tg__entry one[1];
      tg__log lg = {one, 0, 0, 1, 0};
      int rc = tg__log_step(ac, &lg, o, &changed);
      if (rc != TG_OK || !changed)
        return rc;
      bool published;
      rc = insert(t, k, ac, NULL, &lg, &published, wt);
      if (rc != TG_OK || published)
        return rc;
      c = ac;
      continue;
    }
    tg__pair *p = &t->slots[i].st;
    uint32_t g = ctrl_gen(ctl);
    uint64_t w0, w1;
    tg__load_pair(p, 1, &w0, &w1);
    int rc;
    if (w1 != g) {
      if ((rc = settle(t, k, wt)) != TG_OK)
        return rc;
      continue;
    }
    tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
    if (!b)
      return TG_ECORRUPT;
    block_prefetch(t, b, w0 - 1);
    if ((rc = lock_block(t, b, wt)) != TG_OK)
      return rc;
    if (tg__load_acquire(&p->w[1]) != g) {
      unlock_block(t, b);
      if ((rc = settle(t, k, wt)) != TG_OK)
        return rc;
      continue;
    }
    if (tg__load_relaxed(&p->w[0]) != w0) {
      unlock_block(t, b); /* the log grew into another block: follow it */
      continue;
    }
    if (!log_ready(t, b)) {
      unlock_block(t, b);
      return TG_ENOMEM;
    }
    tg__log lg = log_view(t, b, w0 - 1);
    if (log_needs_room(w0 - 1, &lg, c) &&
        make_room(t, p, g, &w0, &b, &lg, c->now_us, wt) != TG_OK) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    if (t->g.shared &&
        !tg__log_sound_where_read(&lg, c->q.period_us, c->now_us)) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    rc = tg__log_step(c, &lg, o, &changed);
    if (rc == TG_OK && log_sum_unaccounted(t, c, o)) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    /* a one-rule policy's TAKE (rules.c, hit_one) writes as the
     * protocol's (exec_rule_log): nothing when it is denied, not even the
     * entries its period expired nor that period (the cleaner reads it:
     * a shorter one would reclaim entries a longer one still counts) */
    bool take = c->op == TG__OP_TAKE;
    if (changed && (!take || (rc == TG_OK && o->r.allowed))) {
      log_store(b, &lg);
      b->period_us = c->q.period_us;
    } else if (!take) {
      b->period_us = c->q.period_us;
    }
    unlock_block(t, b);
    return rc;
  }
}

/* ---- policies and reservations (docs/DESIGN.md, "Policies") ----
 * The table's side of the optimistic protocol: CHECK reads without writing
 * and records the pair it saw; TAKE (and RESERVE) publishes with one CAS,
 * first from that pair, and records what it consumed and the slot's
 * generation; UNDO (and CANCEL) gives that back only while the slot holds
 * the same incarnation of the key. No new lock: a sliding log uses its own
 * block lock, for the length of one step, as a hit does. */

/* The receipt of a consumption published at generation g. */
static void receipt(tg__token *tok, bool taken, uint32_t g,
                    const tg__state *before, const tg__state *after,
                    uint64_t now_us) {
  tok->taken = taken;
  tok->gen = g;
  tok->before = *before;
  tok->after = *after;
  tok->now_us = now_us;
}

/* The generation the key's slot has now (after an insert), or false. */
static bool gen_now(const tg__table *t, const kref *k, uint32_t *g) {
  uint64_t i, ctl;
  if (!find(t, k, &i, &ctl))
    return false;
  *g = ctrl_gen(ctl);
  return true;
}

/* The key's hash and words, computed on first use: a TAKE that finds its
 * slot where the CHECK left it never hashes the key again. */
typedef struct lazy_key {
  kref k;
  bool ready;
} lazy_key;

static const kref *lazy(const tg__table *t, lazy_key *lk, const tg__call *c) {
  if (!lk->ready) {
    kref_init(t, &lk->k, c->key, c->key_len);
    lk->ready = true;
  }
  return &lk->k;
}

static int exec_rule_state(tg__table *t, lazy_key *lk, const tg__call *c,
                           tg__outcome *o) {
  tg__token *tok = c->tok;
  const bool check = c->op == TG__OP_CHECK;
  const bool give = c->op == TG__OP_UNDO || c->op == TG__OP_CANCEL;
  tg__wait wait = tg__wait_bound(t->g.lock_timeout_ms), *wt = &wait;
  tg__call tmp;
  bool first = !check && !give && tok->seen_ok; /* start from CHECK's pair */
  for (;;) {
    uint64_t i = 0, ctl = 0, w0, w1;
    bool found;
    if (first && !tok->seen_absent && tok->where[0] < t->g.nslots &&
        tg__load_acquire(ctrl_at(t, tok->where[0])) == tok->where[1]) {
      /* the slot the check found still holds that key: the ctrl word
       * (status, key length, tag, generation) is unchanged */
      i = tok->where[0];
      ctl = tok->where[1];
      found = true;
    } else {
      found = find(t, lazy(t, lk, c), &i, &ctl);
    }
    if (!found) {
      first = false;
      if (give)
        return TG_OK; /* nothing held: nothing to give back */
      const tg__call *ac = absent_call(t, c, &tmp);
      tg__state st = {0, 0}, zero = {0, 0};
      bool changed, published;
      int rc = tg__state_step(ac, &st, o, &changed);
      if (check) {
        tok->seen_ok = tok->seen_absent = true;
        return rc;
      }
      if (rc != TG_OK || !changed || tg__state_fresh(c->alg, &st, ac->now_us))
        return rc;
      rc = insert(t, lazy(t, lk, c), ac, &st, NULL, &published, wt);
      if (rc != TG_OK)
        return rc;
      if (published) {
        uint32_t g;
        bool known = gen_now(t, lazy(t, lk, c), &g);
        receipt(tok, known, known ? g : 0, &zero, &st, ac->now_us);
        return TG_OK;
      }
      c = ac;
      continue;
    }
    tg__pair *p = &t->slots[i].st;
    uint32_t g = ctrl_gen(ctl);
    if (give && g != (uint32_t)tok->gen)
      return TG_OK; /* another incarnation of the key: leave it */
    if (first && tok->seen[0] != 0 && (uint32_t)tok->gen == g) {
      w0 = tok->seen[0];
      w1 = tok->seen[1];
    } else {
      /* windows too: their end word changes with every new state, so a
       * pair read around it is consistent, and a CHECK writes nothing */
      tg__load_pair(p, is_window(c->alg) ? 0 : 1, &w0, &w1);
    }
    if (first && tok->next_ok && w0 == tok->seen[0] && w1 == tok->seen[1] &&
        tg__cas128(p, &w0, &w1, tok->next[0], tok->next[1])) {
      /* the state is still the one checked: publish what the check's step
       * computed; the receipt is the pair it replaced and the one written */
      tok->taken = true;
      tok->reused = true;
      tok->before = decode(c->alg, tok->seen[0], tok->seen[1]);
      tok->after = decode(c->alg, tok->next[0], tok->next[1]);
      tok->now_us = c->now_us;
      return TG_OK;
    }
    first = false;
    while (gen_ok(c->alg, w0, w1, g)) {
      tg__state st = decode(c->alg, w0, w1), before = st;
      if (t->g.shared && !tg__state_plausible(c->alg, &st))
        return TG_ECORRUPT;
      bool changed;
      int rc = tg__state_step(c, &st, o, &changed);
      if (check) {
        tok->seen_ok = true;
        tok->seen_absent = false;
        tok->seen[0] = w0;
        tok->seen[1] = w1;
        tok->where[0] = i;
        tok->where[1] = ctl;
        tok->gen = g;
        /* what a TAKE from this pair would write: the same step (a CHECK
         * computes the consumed state, it only does not publish it) */
        tok->next_ok = rc == TG_OK && changed && !blank_stays(c, w0, w1, &st);
        if (tok->next_ok)
          encode(c->alg, &st, g, &tok->next[0], &tok->next[1]);
        return rc;
      }
      if (rc != TG_OK || !changed || blank_stays(c, w0, w1, &st)) {
        if (!give)
          receipt(tok, false, g, &before, &st, c->now_us);
        return rc;
      }
      uint64_t n0, n1;
      encode(c->alg, &st, g, &n0, &n1);
      if (tg__cas128(p, &w0, &w1, n0, n1)) {
        if (!give)
          receipt(tok, true, g, &before, &st, c->now_us);
        return rc;
      }
      /* lost a race: w0, w1 are current; the step runs again on them */
    }
    int rc = settle(t, lazy(t, lk, c), wt);
    if (rc != TG_OK)
      return rc;
  }
}

static int exec_rule_log(tg__table *t, const kref *k, const tg__call *c,
                         tg__outcome *o) {
  tg__token *tok = c->tok;
  tg__wait wait = tg__wait_bound(t->g.lock_timeout_ms), *wt = &wait;
  tg__call tmp;
  for (;;) {
    uint64_t i, ctl;
    bool changed;
    if (!find(t, k, &i, &ctl)) {
      if (c->op == TG__OP_UNDO)
        return TG_OK;
      const tg__call *ac = absent_call(t, c, &tmp);
      tg__entry one[1];
      tg__log lg = {one, 0, 0, 1, 0};
      if (c->op == TG__OP_CHECK) {
        tg__log_view v;
        int rc = tg__log_check(ac, &lg, &v);
        return rc != TG_OK ? rc : tg__log_report(ac, &v, o);
      }
      int rc = tg__log_step(ac, &lg, o, &changed);
      if (rc != TG_OK || !changed)
        return rc;
      bool published;
      rc = insert(t, k, ac, NULL, &lg, &published, wt);
      if (rc != TG_OK)
        return rc;
      if (published) {
        uint32_t g;
        tok->taken = gen_now(t, k, &g);
        tok->gen = tok->taken ? g : 0;
        tok->entry_us = ac->now_us;
        tok->now_us = ac->now_us;
        return TG_OK;
      }
      c = ac;
      continue;
    }
    tg__pair *p = &t->slots[i].st;
    uint32_t g = ctrl_gen(ctl);
    uint64_t w0, w1;
    tg__load_pair(p, 1, &w0, &w1);
    int rc;
    if (w1 != g) {
      if ((rc = settle(t, k, wt)) != TG_OK)
        return rc;
      continue;
    }
    if (c->op == TG__OP_UNDO && g != (uint32_t)tok->gen)
      return TG_OK;
    tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
    if (!b)
      return TG_ECORRUPT;
    if ((rc = lock_block(t, b, wt)) != TG_OK)
      return rc;
    if (tg__load_acquire(&p->w[1]) != g) {
      unlock_block(t, b);
      if ((rc = settle(t, k, wt)) != TG_OK)
        return rc;
      continue;
    }
    if (tg__load_relaxed(&p->w[0]) != w0) {
      unlock_block(t, b); /* the log grew into another block: follow it */
      continue;
    }
    if (c->op != TG__OP_CHECK && !log_ready(t, b)) {
      unlock_block(t, b);
      return TG_ENOMEM;
    }
    tg__log lg = log_view(t, b, w0 - 1);
    if (log_needs_room(w0 - 1, &lg, c) &&
        make_room(t, p, g, &w0, &b, &lg, c->now_us, wt) != TG_OK) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    if (t->g.shared &&
        !tg__log_sound_where_read(&lg, c->q.period_us, c->now_us)) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    changed = false;
    if (c->op == TG__OP_CHECK) {
      tg__log_view v;
      rc = tg__log_check(c, &lg, &v);
      if (rc == TG_OK)
        rc = tg__log_report(c, &v, o);
    } else if (c->op == TG__OP_UNDO) {
      changed =
          tg__log_undo(&lg, tok->entry_us, c->arg, c->q.period_us, c->now_us);
      rc = TG_OK;
    } else {
      rc = tg__log_step(c, &lg, o, &changed);
    }
    if (rc == TG_OK && log_sum_unaccounted(t, c, o)) {
      unlock_block(t, b);
      return TG_ECORRUPT;
    }
    if (c->op != TG__OP_UNDO && c->op != TG__OP_CHECK) {
      bool took = rc == TG_OK && o->r.allowed && c->arg > 0;
      tok->taken = took;
      tok->gen = g;
      tok->entry_us = took ? tg__log_at(&lg, lg.n - 1)->t_us : 0;
      tok->now_us = c->now_us;
    }
    /* a denied TAKE writes nothing, not even the entries its period
     * expired: a policy that is denied leaves every key as it was */
    if (changed && (c->op != TG__OP_TAKE || (rc == TG_OK && o->r.allowed))) {
      log_store(b, &lg);
      b->period_us = c->q.period_us;
    }
    unlock_block(t, b);
    return rc;
  }
}

/* The policy loops below take the rule's algorithm family as an argument:
 * `alg` is the rule's own (c->alg), or a constant of its family when every
 * rule is of it (tg__table_policy: TG_TOKEN_BUCKET for the buckets,
 * TG_FIXED_WINDOW for the windows), which folds each encoding's and step's
 * choice away. So alg picks only what a family shares (the encoding, the
 * step's function, which read c->alg themselves); what tells the members
 * apart is asked of c->alg. ALG_EACH: each call's own. */
#define ALG_EACH (-1)

/* tg__state_check, dispatched on alg's family. */
static inline __attribute__((always_inline)) int
state_check(tg_algorithm alg, const tg__call *c, tg__state *st, tg__outcome *o,
            bool *changed) {
  if (alg == TG_TOKEN_BUCKET || alg == TG_LEAKY_BUCKET)
    return tg__gcra_check(c, st, o, changed);
  if (alg == TG_FIXED_WINDOW || alg == TG_FIXED_WINDOW_PER_KEY)
    return tg__window_check(c, st, o, changed);
  *changed = false;
  return TG_ENOTSUP;
}

/* blank_stays with the algorithm's family given. */
static inline __attribute__((always_inline)) bool
blank_stays_alg(tg_algorithm alg, const tg__call *c, uint64_t w0, uint64_t w1,
                const tg__state *st) {
  tg__state was = decode(alg, w0, w1);
  return tg__state_word(&was, 0) == 0 && tg__state_word(&was, 1) == 0 &&
         tg__state_fresh(c->alg, st, c->now_us);
}

/* A policy's TAKE whose CHECK found the key where it still is, unchanged:
 * one ctrl-word load and one CAS from the pair the check saw to the one its
 * step computed, without the set-up of exec_rule_state (false: anything
 * else, which exec_rule_state handles from the start). */
static inline __attribute__((always_inline)) bool
take_as_checked(tg__table *t, const tg__call *c, tg_algorithm alg) {
  tg__token *tok = c->tok;
  uint64_t i = tok->where[0];
  if (!tok->next_ok || tok->seen_absent || tok->seen[0] == 0 ||
      i >= t->g.nslots || tg__load_acquire(ctrl_at(t, i)) != tok->where[1])
    return false;
  uint64_t w0 = tok->seen[0], w1 = tok->seen[1];
  if (!tg__cas128(&t->slots[i].st, &w0, &w1, tok->next[0], tok->next[1]))
    return false;
  tok->taken = true;
  tok->reused = true;
  tok->before = decode(alg, tok->seen[0], tok->seen[1]);
  tok->after = decode(alg, tok->next[0], tok->next[1]);
  tok->now_us = c->now_us;
  return true;
}

/* A policy's CHECK on a key the table holds, as exec_rule_state's would be
 * on its first pass, without its set-up (the wait, the lazy key, the TAKE's
 * cases): false for anything else (absent, reclaimed meanwhile), which
 * exec_rule_state then handles from the start. */
static inline __attribute__((always_inline)) bool
check_found(tg__table *t, const tg__call *c, tg_algorithm alg, tg__outcome *o,
            int *rc) {
  kref k;
  kref_init(t, &k, c->key, c->key_len);
  uint64_t i, ctl, w0, w1;
  if (!find_inline(t, &k, &i, &ctl))
    return false;
  uint32_t g = ctrl_gen(ctl);
  /* windows too: their end word changes with every new state, so a pair
   * read around it is consistent, and a CHECK writes nothing */
  tg__load_pair(&t->slots[i].st, is_window(alg) ? 0 : 1, &w0, &w1);
  if (!gen_ok(alg, w0, w1, g))
    return false;
  /* the peek is left for the limiter, which needs it only for a policy
   * that is denied: the state it comes from. Field by field: st lives in
   * memory (its address is passed), and a 16-byte copy of what was just
   * stored there as two words stalls on store forwarding (perf annotate: a
   * tenth of this function's samples) */
  tg__token *tok = c->tok;
  tg__state st = decode(alg, w0, w1);
  tok->peek_from.a = st.a;
  tok->peek_from.b = st.b;
  if (t->g.shared && !tg__state_plausible(c->alg, &st)) {
    *rc = TG_ECORRUPT;
    return true;
  }
  bool changed;
  tok->peek_owed = true; /* tg__state_check leaves it */
  *rc = state_check(alg, c, &st, o, &changed);
  tok->seen_ok = true;
  tok->seen_absent = false;
  tok->seen[0] = w0;
  tok->seen[1] = w1;
  tok->where[0] = i;
  tok->where[1] = ctl;
  tok->gen = g;
  tok->next_ok =
      *rc == TG_OK && changed && !blank_stays_alg(alg, c, w0, w1, &st);
  if (tok->next_ok)
    encode(alg, &st, g, &tok->next[0], &tok->next[1]);
  return true;
}

/* The rest of tg__table_rule, kept out of line so that the shortcut above
 * does not pay for this one's frame. */
static __attribute__((noinline)) int exec_rule(tg__table *t, const tg__call *c,
                                               tg__outcome *o) {
  lazy_key lk; /* not zeroed: kref_init fills what it uses */
  lk.ready = false;
  if (c->alg != TG_SLIDING_WINDOW)
    return exec_rule_state(t, &lk, c, o);
  return exec_rule_log(t, lazy(t, &lk, c), c, o);
}

int tg__table_rule(tg__table *t, const tg__call *c, tg__outcome *o) {
  int rc;
  reach_wait(t, c);
  if (c->op == TG__OP_TAKE) {
    if (take_as_checked(t, c, c->alg))
      return TG_OK;
  } else if (c->op == TG__OP_CHECK && c->alg != TG_SLIDING_WINDOW) {
    if (check_found(t, c, c->alg, o, &rc))
      return rc;
  }
  return exec_rule(t, c, o);
}

/* A policy's TAKE (c->op) on a key the table holds, made without a CHECK
 * first, as exec_state's hit would be, with its receipt (the token's) and
 * the state it stepped from as the peek a denied policy reports: false for
 * anything else (absent, reclaimed meanwhile), having written nothing. */
static inline __attribute__((always_inline)) bool
take_found(tg__table *t, const tg__call *c, tg_algorithm alg, tg__outcome *o,
           int *rc) {
  kref k;
  kref_init(t, &k, c->key, c->key_len);
  uint64_t i, ctl, w0, w1;
  if (!find_inline(t, &k, &i, &ctl))
    return false;
  uint32_t g = ctrl_gen(ctl);
  tg__pair *p = &t->slots[i].st;
  tg__load_pair(p, is_window(alg) ? 0 : 1, &w0, &w1);
  tg__token *tok = c->tok;
  while (gen_ok(alg, w0, w1, g)) {
    tg__state st = decode(alg, w0, w1), before = st;
    if (t->g.shared && !tg__state_plausible(c->alg, &st)) {
      *rc = TG_ECORRUPT;
      return true;
    }
    bool changed;
    *rc = state_check(alg, c, &st, o, &changed);
    tok->peek_from = before;
    tok->peek_owed = true; /* tg__state_check leaves it */
    if (*rc != TG_OK || !changed || blank_stays_alg(alg, c, w0, w1, &st)) {
      receipt(tok, false, g, &before, &st, c->now_us);
      return true;
    }
    uint64_t n0, n1;
    encode(alg, &st, g, &n0, &n1);
    if (tg__cas128(p, &w0, &w1, n0, n1)) {
      receipt(tok, true, g, &before, &st, c->now_us);
      return true;
    }
    /* lost a race: w0, w1 are current; the step runs again on them */
  }
  tok->peek_owed = false; /* the call goes on elsewhere, which fills it */
  return false;
}

/* A policy's CHECKs, then its TAKEs (the contract is store.h's
 * exec_policy), on tables ts[i]: the loops are here so that the common
 * case of each (check_found, take_as_checked) runs inline, without a call
 * and a dispatch per rule and phase. The last rule is taken at once when
 * the others allowed: its state is stepped once, like a hit's. */
static inline __attribute__((always_inline)) int
table_policy(tg__table *const *ts, tg__call *calls, size_t n, uint32_t shadow,
             tg__outcome *o, tg__outcome *took, tg__policy_marks *pm,
             int alg_all) {
  uint32_t ok = 0;
  bool blocked = false; /* a rule outside `shadow` denied */
  int rc = TG_OK;
  size_t last = n - 1;
  for (size_t i = 0; i < last; i++) {
    const tg__call *c = &calls[i];
    tg_algorithm a = alg_all == ALG_EACH ? c->alg : (tg_algorithm)alg_all;
    if (a == TG_SLIDING_WINDOW || !check_found(ts[i], c, a, &o[i], &rc))
      rc = exec_rule(ts[i], c, &o[i]);
    if (__builtin_expect(rc != TG_OK, 0)) {
      pm->at = i;
      return rc;
    }
    bool yes = o[i].r.allowed;
    ok |= (uint32_t)yes << i;
    blocked |= !yes && !(shadow >> i & 1u);
  }
  tg__call *cl = &calls[last];
  tg_algorithm al = alg_all == ALG_EACH ? cl->alg : (tg_algorithm)alg_all;
  bool direct = false;
  if (al != TG_SLIDING_WINDOW && !blocked) {
    cl->op = TG__OP_TAKE;
    direct = take_found(ts[last], cl, al, &o[last], &rc);
    if (!direct)
      cl->op = TG__OP_CHECK;
  }
  if (!direct && (al == TG_SLIDING_WINDOW ||
                  !check_found(ts[last], cl, al, &o[last], &rc)))
    rc = exec_rule(ts[last], cl, &o[last]);
  if (__builtin_expect(rc != TG_OK, 0)) {
    pm->at = last;
    return rc; /* a take that failed wrote nothing */
  }
  bool yes = o[last].r.allowed;
  ok |= (uint32_t)yes << last;
  blocked |= !yes && !(shadow >> last & 1u);
  uint32_t taken = direct && cl->tok->taken ? 1u << last : 0;
  pm->allowed = ok;
  pm->taken = taken;
  pm->at = n;
  if (blocked)
    return TG_OK; /* denied: nothing is written */
  size_t todo = direct ? last : n;
  for (size_t i = 0; i < todo; i++) {
    if (!(ok >> i & 1u))
      continue; /* a shadow rule that denied consumes nothing */
    tg__call *c = &calls[i];
    c->op = TG__OP_TAKE; /* the call stays as checked otherwise */
    if (take_as_checked(ts[i], c,
                        alg_all == ALG_EACH ? c->alg : (tg_algorithm)alg_all)) {
      taken |= 1u << i; /* published what the check computed */
      continue;
    }
    rc = exec_rule(ts[i], c, &took[i]);
    taken |= (uint32_t)c->tok->taken << i;
    pm->taken = taken;
    if (c->tok->reused) {
      if (__builtin_expect(rc != TG_OK, 0)) {
        pm->at = i;
        return rc;
      }
      continue;
    }
    pm->stepped |= 1u << i;
    if (__builtin_expect(rc != TG_OK, 0) ||
        (!(shadow >> i & 1u) && !took[i].r.allowed)) {
      pm->at = i;
      return rc;
    }
  }
  pm->taken = taken;
  return TG_OK;
}

/* Policies of one rule (what an nginx location with one limit decides) and
 * of two are compiled apart: with n known, the loops fold away. A policy of
 * reservations first raises every rule's table's reach (reach_wait). */
int tg__table_policy(tg__store *const *stores, size_t table_at, tg__call *calls,
                     size_t n, uint32_t shadow, tg__outcome *o,
                     tg__outcome *took, tg__policy_marks *pm) {
  tg__table *ts[TG_RULES_MAX];
  if (n == 2) {
    ts[0] = (tg__table *)(void *)((char *)stores[0] + table_at);
    ts[1] = (tg__table *)(void *)((char *)stores[1] + table_at);
    reach_wait(ts[0], &calls[0]);
    reach_wait(ts[1], &calls[1]);
    /* two rules of one family (buckets, windows): compiled for it */
    tg_algorithm a0 = calls[0].alg, a1 = calls[1].alg;
    if (is_window(a0) && is_window(a1))
      return table_policy(ts, calls, 2, shadow, o, took, pm, TG_FIXED_WINDOW);
    if ((a0 == TG_TOKEN_BUCKET || a0 == TG_LEAKY_BUCKET) &&
        (a1 == TG_TOKEN_BUCKET || a1 == TG_LEAKY_BUCKET))
      return table_policy(ts, calls, 2, shadow, o, took, pm, TG_TOKEN_BUCKET);
    return table_policy(ts, calls, 2, shadow, o, took, pm, ALG_EACH);
  }
  if (n == 0 || n > TG_RULES_MAX)
    return TG_EINVAL; /* not reached: rules.c checked the call */
  for (size_t i = 0; i < n; i++) {
    ts[i] = (tg__table *)(void *)((char *)stores[i] + table_at);
    reach_wait(ts[i], &calls[i]);
  }
  if (n == 1)
    return table_policy(ts, calls, 1, shadow, o, took, pm, ALG_EACH);
  return table_policy(ts, calls, n, shadow, o, took, pm, ALG_EACH);
}

static inline __attribute__((always_inline)) int
exec_key(tg__table *t, const kref *k, const tg__call *c, tg__outcome *o) {
  if (c->alg == TG_SLIDING_WINDOW)
    return exec_log(t, k, c, o);
  return exec_state(t, k, c, o);
}

/* Whether call c goes through the policy protocol (tg__table_rule): every
 * policy step and reservation, which carry a token, but a TAKE without one
 * (a one-rule policy, rules.c's hit_one), which is a plain step. */
static inline bool by_rule(const tg__call *c) {
  return c->op > TG__OP_EXPIRES && (c->op != TG__OP_TAKE || c->tok);
}

int tg__table_exec(tg__table *t, const tg__call *c, tg__outcome *o) {
  if (by_rule(c)) /* policies and reservations: c->tok set */
    return tg__table_rule(t, c, o);
  kref k;
  kref_init(t, &k, c->key, c->key_len);
  return exec_key(t, &k, c, o);
}

/* Items hashed and prefetched ahead of the first decision of a group: 16
 * slots in flight are more than a core's miss buffers hold (10-12 on
 * current x86 cores), and the krefs (~300 bytes each) stay in L1/L2. */
#define BATCH_AHEAD 16u

/* For a group of a sliding table's keys, once their slots are on their way:
 * the log block of each key found in its home slot (most are), so that
 * the group's second misses overlap too, instead of each decision waiting
 * for its block after its slot. A hint only: the key is recognised by its
 * tag, the slot read without a snapshot, a region's blocks addressed
 * without backing them (a prefetch never faults); a wrong guess costs one
 * useless line. */
static void batch_prefetch_logs(const tg__table *t, const kref *ks, size_t m) {
  for (size_t j = 0; j < m; j++) {
    uint64_t i = home(t, ks[j].hash);
    uint64_t c = tg__load_relaxed(ctrl_at(t, i));
    if (ctrl_status(c) != LIVE || ctrl_tag(c) != ks[j].tag)
      continue;
    uint64_t idx = tg__load_relaxed(&t->slots[i].st.w[0]) - 1;
    if (!block_ok(t, idx))
      continue; /* 0 (no block yet) wraps to out of range */
    const unsigned char *b = idx < t->g.nlogs && t->log0
                                 ? t->log0 + idx * t->g.log_block_bytes
                                 : (const unsigned char *)block(t, idx);
    if (b)
      block_prefetch(t, (const tg__log_block *)(const void *)b, idx);
  }
}

void tg__table_exec_batch(tg__table *t, const tg__call *calls, size_t n,
                          tg__outcome *outs, int *rcs) {
  kref ks[BATCH_AHEAD];
  const bool logs = t->g.algorithm == TG_SLIDING_WINDOW;
  for (size_t base = 0, m; base < n; base += m) {
    m = n - base;
    if (m > BATCH_AHEAD)
      m = BATCH_AHEAD;
    /* first every key's hash and the prefetch of its home slot, so the
     * group's misses overlap; then the decisions, in order, which find
     * their slots arriving or arrived */
    for (size_t j = 0; j < m; j++) {
      kref_init(t, &ks[j], calls[base + j].key, calls[base + j].key_len);
      tg__slots_prefetch(t, home(t, ks[j].hash), TG__BATCH_SLOTS_AHEAD);
    }
    if (logs)
      batch_prefetch_logs(t, ks, m);
    for (size_t j = 0; j < m; j++) {
      const tg__call *c = &calls[base + j];
      rcs[base + j] = by_rule(c) ? tg__table_rule(t, c, &outs[base + j])
                                 : exec_key(t, &ks[j], c, &outs[base + j]);
    }
  }
}

/* Drops a sliding key whose block index is corrupt (nothing to lock or
 * free): what a reset of it can do. */
static int drop_corrupt(tg__table *t, uint64_t i, uint64_t c, uint64_t w0,
                        uint64_t w1, tg__wait *wt) {
  int rc = lock_table(t, wt);
  if (rc != TG_OK)
    return rc;
  if (tg__load_acquire(ctrl_at(t, i)) == c &&
      tg__cas128(&t->slots[i].st, &w0, &w1, w0, ctrl_gen(c) + 1))
    finish_reclaim_locked(t, i, c);
  unlock_table(t);
  return TG_OK;
}

/* Reset leaves the key in place with the all-zero state (an empty log),
 * replacing only the state it read: a decision that lands in between makes
 * the CAS fail and the reset read again. The key is then fresh at any now,
 * evaluated at the caller's own time (an absent key could be held at the
 * reclaim horizon), and a cleaning pass or a full table reclaims it later.
 * Windows and buckets take no lock at all; a log takes its own, and never
 * the table's, so a reset waiting for a busy log delays nobody else. */
int tg__table_reset(tg__table *t, const void *key, size_t key_len) {
  tg_algorithm alg = (tg_algorithm)t->g.algorithm;
  kref k;
  kref_init(t, &k, key, key_len);
  tg__wait wt = tg__wait_bound(t->g.lock_timeout_ms);
  for (unsigned pass = 0;; pass++) {
    uint64_t i, ctl;
    if (!find(t, &k, &i, &ctl))
      return TG_OK;
    /* a state changing under every CAS, or a segment rewritten under us:
     * give up within the same bound as a lock */
    if (pass >= 64 && tg__wait_over(&wt))
      return TG_EBUSY;
    tg__pair *p = &t->slots[i].st;
    uint32_t g = ctrl_gen(ctl);
    uint64_t w0, w1;
    read_pair(alg, p, &w0, &w1);
    int rc;
    if (!gen_ok(alg, w0, w1, g)) { /* a reclaim left half done */
      if ((rc = settle(t, &k, &wt)) != TG_OK)
        return rc;
      continue;
    }
    if (alg == TG_SLIDING_WINDOW) {
      tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
      if (!b)
        return drop_corrupt(t, i, ctl, w0, w1, &wt);
      if ((rc = lock_block(t, b, &wt)) != TG_OK)
        return rc;
      bool same = tg__load_acquire(&p->w[1]) == g &&
                  tg__load_relaxed(&p->w[0]) == w0; /* not grown meanwhile */
      if (same)
        log_clear(b);
      unlock_block(t, b);
      if (same)
        return TG_OK;
      continue;
    }
    tg__state zero = {0, 0};
    uint64_t n0, n1;
    encode(alg, &zero, g, &n0, &n1);
    if ((w0 == n0 && w1 == n1) || tg__cas128(p, &w0, &w1, n0, n1))
      return TG_OK;
  }
}

size_t tg__table_live(const tg__table *t) {
  return (size_t)tg__load_relaxed(&t->h->live);
}

bool tg__table_holds(const tg__table *t, const void *key, size_t key_len) {
  kref k;
  uint64_t i, c;
  kref_init(t, &k, key, key_len);
  return find(t, &k, &i, &c);
}

/* ---- cleaning ---- */

#define CLEAN_BATCH 64u

/* Hands the batch to cb (outside every lock; its outcome never stops us),
 * without the keys a reset emptied (nothing happened to them worth
 * reporting), then reclaims what is still as inspected. */
static int flush(tg__table *t, tg__clean_item *items, size_t n, uint64_t now_us,
                 uint64_t older_than_us, tg__clean_cb cb, void *ctx,
                 tg__wait *wt, size_t *removed) {
  if (n == 0)
    return TG_OK;
  if (cb) {
    size_t m = 0;
    for (size_t j = 0; j < n; j++)
      if (items[j].expired_at_ms != 0) {
        tg__clean_item tmp = items[m];
        items[m++] = items[j];
        items[j] = tmp;
      }
    if (m > 0)
      cb(items, m, ctx);
  }
  int rc = lock_table(t, wt);
  if (rc != TG_OK)
    return rc;
  for (size_t j = 0; j < n; j++)
    *removed += reclaim_locked(t, items[j].slot, items[j].ctrl, items[j].w0,
                               items[j].w1, now_us, older_than_us, false);
  unlock_table(t);
  return TG_OK;
}

static inline bool halted(const int *halt) {
  return halt && __atomic_load_n(halt, __ATOMIC_RELAXED) != 0;
}

int tg__table_clean(tg__table *t, uint64_t now_us, uint64_t older_than_us,
                    tg__clean_cb cb, void *ctx, const int *halt,
                    size_t *removed) {
  tg__table_hdr *h = t->h;
  *removed = 0;
  bool died; /* a pass that died left nothing to repair */
  if (tg__lock_try(&h->clean_lock, t->g.shared, &died) != TG_OK)
    return TG_OK; /* another pass is running */
  tg__clean_item *items = malloc(CLEAN_BATCH * sizeof *items);
  if (!items) {
    tg__lock_release(&h->clean_lock, t->g.shared);
    return TG_ENOMEM;
  }
  tg__wait wt = tg__wait_bound(t->g.lock_timeout_ms);
  int rc = TG_OK;
  size_t n = 0;
  bool stop = false;
  for (uint64_t i = 0; i < t->g.nslots && rc == TG_OK; i++) {
    if ((stop = halted(halt)))
      break; /* the batch not yet handed to cb stays for a later pass */
    uint64_t c = tg__load_acquire(ctrl_at(t, i)), expiry;
    if (ctrl_status(c) != LIVE)
      continue;
    tg__clean_item *it = &items[n];
    if (!inspect(t, i, c, it, &expiry) ||
        !decayed(now_us, expiry, older_than_us))
      continue;
    /* copy the key, then check the slot still held it */
    size_t len = ctrl_len(c);
    const uint64_t *w = key_words(t, i, len);
    if (!w || len == 0 || len > TG_KEY_MAX)
      continue;
    uint64_t words[CHUNK_WORDS];
    for (size_t j = 0; j < (len + 7) / 8; j++)
      words[j] = tg__load_relaxed(&w[j]);
    tg__fence_acquire();
    if (tg__load_acquire(ctrl_at(t, i)) != c)
      continue;
    memcpy(it->key, words, len);
    it->key_len = len;
    if (++n == CLEAN_BATCH) {
      rc = flush(t, items, n, now_us, older_than_us, cb, ctx, &wt, removed);
      n = 0;
    }
  }
  if (rc == TG_OK && !stop)
    rc = flush(t, items, n, now_us, older_than_us, cb, ctx, &wt, removed);
  free(items);
  tg__lock_release(&h->clean_lock, t->g.shared);
  return rc;
}
