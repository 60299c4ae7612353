/* SPDX-License-Identifier: MIT */
/*
 * table_validate.c - tg__table_validate, the walk over a whole table that
 * checks every invariant a reader relies on (table.h lists them), for the
 * tests and fuzzers, after crashes above all. Off the hot path; it reads the
 * region through the same helpers as the hot path (table_impl.h), so that
 * what it accepts is what the hot path would read.
 */
#include "table_impl.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- validation ---- */

static int check_fail(tg__table_check *r, const char *what, uint64_t i) {
  if (r->errors++ == 0)
    (void)snprintf(r->first_error, sizeof r->first_error, "%s (slot %llu)",
                   what, (unsigned long long)i);
  return 0;
}

/* True if slot i is reachable from home without crossing an EMPTY. */
static bool reachable(const tg__table *t, uint64_t home_i, uint64_t i) {
  for (uint64_t j = home_i; j != i; j = next(t, j))
    if (ctrl_status(tg__load_relaxed(ctrl_at(t, j))) == EMPTY)
      return false;
  return true;
}

int tg__table_validate(const tg__table *t, tg__table_check *r) {
  const tg__table_hdr *h = t->h;
  tg_algorithm alg = (tg_algorithm)t->g.algorithm;
  memset(r, 0, sizeof *r);
  /* which chunks and blocks LIVE keys use, and which the free lists hold */
  unsigned char *chunk_use = calloc(t->g.nchunks + 1, 1);
  /* blocks of every class: class c's place i at c * nlogs + i */
  unsigned char *block_use = calloc(t->nclass * t->g.nlogs + 1, 1);
  uint64_t *hashes = calloc(t->g.nslots + 1, sizeof *hashes);
  if (!chunk_use || !block_use || !hashes) {
    free(chunk_use);
    free(block_use);
    free(hashes);
    return TG_ENOMEM;
  }
  for (uint64_t i = 0; i < t->g.nslots; i++) {
    uint64_t c = tg__load_acquire(ctrl_at(t, i));
    unsigned st = ctrl_status(c);
    if (st == 3) {
      check_fail(r, "bad ctrl status", i);
      continue;
    }
    if (st != LIVE)
      continue;
    r->live_slots++;
    size_t len = ctrl_len(c);
    if (len == 0 || len > TG_KEY_MAX) {
      check_fail(r, "bad key length", i);
      continue;
    }
    const uint64_t *w = key_words(t, i, len);
    if (!w) {
      check_fail(r, "long key chunk out of range", i);
      continue;
    }
    if (len > TG__INLINE_KEY) {
      uint64_t ci = tg__load_relaxed(&t->slots[i].key[0]);
      if (chunk_use[ci]++)
        check_fail(r, "chunk used twice", i);
    }
    kref k;
    unsigned char bytes[TG_KEY_MAX];
    for (size_t j = 0; j < (len + 7) / 8; j++) {
      uint64_t v = tg__load_relaxed(&w[j]);
      memcpy(bytes + 8 * j, &v, len - 8 * j < 8 ? len - 8 * j : 8);
    }
    kref_init(t, &k, bytes, len);
    if (k.tag != ctrl_tag(c))
      check_fail(r, "hash tag does not match key", i);
    else if (!reachable(t, home(t, k.hash), i))
      check_fail(r, "key not reachable from its home slot", i);
    hashes[r->live_slots - 1] = k.hash ^ i; /* duplicates checked below */
    uint64_t w0, w1;
    read_pair(alg, &t->slots[i].st, &w0, &w1);
    if (!gen_ok(alg, w0, w1, ctrl_gen(c))) {
      r->pending++; /* a reclaim left half done: settle() finishes it */
      continue;
    }
    if (alg == TG_SLIDING_WINDOW) {
      tg__log_block *b = w0 >= 1 ? block(t, w0 - 1) : NULL;
      if (!b) {
        check_fail(r, "log block out of range", i);
        continue;
      }
      if (block_use[block_class(w0 - 1) * t->g.nlogs + block_place(w0 - 1)]++)
        check_fail(r, "log block used twice", i);
      bool died;
      if (tg__lock_try(&b->lock, t->g.shared, &died) != TG_OK) {
        r->busy++; /* a live process is in a step: not checked */
        continue;
      }
      if (died) { /* left mid-step: repair, as a lock would */
        repair_log(t, b);
        r->pending++;
      }
      if (!log_backed(t, b)) {
        check_fail(r, "log entries never backed", i);
        unlock_block(t, b);
        continue;
      }
      tg__log lg = {b->e, b->head, b->n, t->lcap[block_class(w0 - 1)], b->sum};
      if (!tg__log_plausible(&lg))
        check_fail(r, "log not a sorted ring with its sum", i);
      unlock_block(t, b);
    }
  }
  /* one key, one slot: find each LIVE key from its home and expect itself */
  for (uint64_t i = 0; i < t->g.nslots; i++) {
    uint64_t c = tg__load_acquire(ctrl_at(t, i)), found, fc;
    size_t len = ctrl_len(c);
    if (ctrl_status(c) != LIVE || len == 0 || len > TG_KEY_MAX)
      continue;
    const uint64_t *w = key_words(t, i, len);
    if (!w)
      continue;
    unsigned char bytes[TG_KEY_MAX];
    for (size_t j = 0; j < (len + 7) / 8; j++) {
      uint64_t v = tg__load_relaxed(&w[j]);
      memcpy(bytes + 8 * j, &v, len - 8 * j < 8 ? len - 8 * j : 8);
    }
    kref k;
    kref_init(t, &k, bytes, len);
    if (find(t, &k, &found, &fc) && found != i)
      check_fail(r, "key held by two slots", i);
  }
  /* free lists: in range, acyclic, disjoint from what LIVE keys use */
  uint64_t steps = 0;
  for (uint64_t f = h->chunk_free; f; steps++) {
    const uint64_t *w = f <= t->g.nchunks ? chunk_words(t, f - 1) : NULL;
    if (!w || steps > t->g.nchunks) {
      check_fail(r, "chunk free list corrupt", f);
      break;
    }
    if (chunk_use[f - 1]++)
      check_fail(r, "chunk both free and used", f);
    f = tg__load_relaxed(&w[0]);
  }
  for (unsigned cls = 0; cls < t->nclass; cls++) {
    steps = 0;
    for (uint64_t f = cls ? t->lfree[cls] : h->log_free; f; steps++) {
      const tg__log_block *b =
          block_in_class(t, f - 1, cls) ? block(t, f - 1) : NULL;
      if (!b || steps > t->g.nlogs) {
        check_fail(r, "log free list corrupt", f);
        break;
      }
      if (block_use[cls * t->g.nlogs + block_place(f - 1)]++)
        check_fail(r, "log block both free and used", f);
      f = b->next_free;
    }
  }
  for (uint64_t i = 0; i < h->chunk_bump && i < t->g.nchunks; i++)
    r->leaked += chunk_use[i] == 0;
  for (unsigned cls = 0; cls < t->nclass; cls++) {
    uint64_t bump = cls ? t->lbump[cls] : h->log_bump;
    for (uint64_t i = 0; i < bump && i < t->g.nlogs; i++)
      r->leaked += block_use[cls * t->g.nlogs + i] == 0;
  }
  r->live_counter = tg__load_relaxed(&h->live);
  if (r->live_slots > t->g.capacity)
    check_fail(r, "more LIVE keys than capacity", r->live_slots);
  free(chunk_use);
  free(block_use);
  free(hashes);
  return TG_OK;
}
