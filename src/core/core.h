/* SPDX-License-Identifier: MIT */
/*
 * core.h - the pure algorithm core: (state, quota, cost, now) -> (decision,
 * new state).
 *
 * Nothing in src/core reads a clock, takes a lock, allocates or does I/O, so
 * every store (the in-process table, shared memory, a caller's custom store)
 * runs exactly the same arithmetic and gives the same answers. A store holds
 * one of two kinds of per-key state:
 *
 *   tg__state  two 64-bit words: windows keep (end_us, count), buckets the
 *              GCRA theoretical arrival time (ns) and 0; read through the
 *              accessors tg__win_end, tg__win_count and tg__tat;
 *   tg__log    the sliding window's entry list, in caller-provided memory.
 *
 * Units: time in us at the API edge, ns inside the buckets, ms in results.
 */
#ifndef TG_CORE_H
#define TG_CORE_H

#include "tollgate.h"

#include <stdbool.h>
#include <stdint.h>

/* The operations a store executes. */
typedef enum tg__op {
  TG__OP_HIT = 0,
  TG__OP_INC,
  TG__OP_GET,
  TG__OP_SET,
  TG__OP_EXPIRES,
  /* A policy's rule (tg_hit_rules): */
  TG__OP_CHECK, /* what TAKE would answer; the store writes nothing and
                   records in c->tok the state it saw */
  TG__OP_TAKE,  /* a hit that consumes only when allowed: a denied TAKE
                   writes nothing, windows included; the store records in
                   c->tok what it consumed */
  /* Reservations (the buckets, tg_reserve): */
  TG__OP_RESERVE, /* a hit admitted up to c->wait_ns late: value = delay */
  /* Giving back what c->tok records (cost c->arg): */
  TG__OP_UNDO,   /* a TAKE of a policy that was then denied */
  TG__OP_CANCEL, /* a RESERVE that will not be used */
  TG__OP_COUNT_
} tg__op;

/* A quota validated and prepared for one algorithm, so the steps never divide
 * by zero or overflow. Computed once per call by tg__quota_prepare(). */
typedef struct tg__quota {
  uint64_t limit;     /* events per period, >= 1 */
  uint64_t period_us; /* us, >= 1000 */
  uint64_t burst;     /* bucket capacity in cost units (burst or limit) */
  uint64_t t_ns;      /* buckets: emission interval, ns, >= 1 */
  uint64_t tau_ns;    /* buckets: tolerance burst * t_ns, ns */
} tg__quota;

/* Fixed-size state of the windows and buckets. The all-zero value is
 * "absent", and so is any fully decayed value (tg__state_fresh). The two
 * words mean different things per algorithm family, so code reads and
 * writes them through the accessors below, which say which meaning it
 * relies on; a and b are only the layout. */
typedef struct tg__state {
  uint64_t a;
  uint64_t b;
} tg__state;

/* Windows (both kinds): the end of the window the count belongs to, us
 * since the epoch, and the cost counted in it, denied calls included. */
static inline uint64_t tg__win_end(const tg__state *s) { return s->a; }
static inline uint64_t tg__win_count(const tg__state *s) { return s->b; }
static inline void tg__win_set_end(tg__state *s, uint64_t end_us) {
  s->a = end_us;
}
static inline void tg__win_set_count(tg__state *s, uint64_t count) {
  s->b = count;
}
static inline tg__state tg__win_state(uint64_t end_us, uint64_t count) {
  return (tg__state){end_us, count};
}

/* Buckets (both): GCRA's theoretical arrival time, ns since the epoch. The
 * other word is always 0 (tg__state_plausible refuses anything else), so a
 * bucket state is built whole, never set word by word. */
static inline uint64_t tg__tat(const tg__state *s) { return s->a; }
static inline tg__state tg__tat_state(uint64_t tat_ns) {
  return (tg__state){tat_ns, 0};
}

/* The state as two words in a fixed order, for stores that copy it without
 * interpreting it (the custom store's serialised form, tokens): word 0 is
 * the window end or the TAT, word 1 the count or 0. */
static inline uint64_t tg__state_word(const tg__state *s, unsigned i) {
  return i == 0 ? s->a : s->b;
}
static inline tg__state tg__state_of_words(uint64_t w0, uint64_t w1) {
  return (tg__state){w0, w1};
}

/* One sliding-log entry: cost admitted at time t_us. */
typedef struct tg__entry {
  uint64_t t_us;
  uint64_t cost;
} tg__entry;

/* A sliding log in memory the store owns: a ring of `cap` entries holding n
 * of them from `head` on, times strictly increasing, and the sum of their
 * costs. The steps keep all of it (pruning advances head, so no decision
 * moves or re-sums the log: a decision is O(1) amortised). */
typedef struct tg__log {
  tg__entry *e;  /* the ring */
  uint32_t head; /* ring index of the oldest entry, < cap */
  uint32_t n;    /* entries in use, <= cap */
  uint32_t cap;  /* ring size: most entries kept (sliding_max_entries) */
  uint64_t sum;  /* sum of the n entries' costs */
} tg__log;

/* The i-th oldest entry (i < cap). */
static inline tg__entry *tg__log_at(const tg__log *log, uint32_t i) {
  uint32_t j = log->head + i;
  return &log->e[j >= log->cap ? j - log->cap : j];
}

/* What a policy's CHECK hands its TAKE, and what a TAKE or RESERVE hands
 * the UNDO or CANCEL that may give it back. The store fills it; the
 * limiter only carries it (and tg_reservation keeps the receipt part). */
typedef struct tg__token {
  /* The flags come first and together, so that a policy clears them all
   * with one store (they are all a store may read before writing). */
  bool seen_ok;     /* CHECK -> TAKE: seen[] is valid */
  bool seen_absent; /* the key was absent */
  bool next_ok;     /* next[] is the state a TAKE writes over seen[] (the
                       check ran the same step): a TAKE that finds seen[]
                       unchanged publishes it without stepping again, and
                       then sets `reused`: its answer is the CHECK's */
  bool reused;
  bool taken;     /* TAKE, RESERVE -> UNDO, CANCEL: something was consumed
                     (else there is nothing to give back) */
  bool peek_owed; /* the CHECK left o->peek unfilled (tg__state_check):
                     the peek is tg__state_peek of `peek_from` */
  /* CHECK -> TAKE: the state the check saw, in the store's own words, so
   * the TAKE can compare-and-swap from it without reading it again */
  uint64_t seen[2];
  uint64_t where[2]; /* where the store found the key (table: the slot and
                        its ctrl word), so the TAKE need not look again */
  uint64_t next[2];
  tg__state peek_from; /* with peek_owed: the state the CHECK saw */
  /* TAKE, RESERVE -> UNDO, CANCEL: the consumption */
  uint64_t gen;      /* the store's incarnation of the key (table: the slot's
                        generation), so a reset or reclaimed key is left
                        alone */
  tg__state before;  /* windows, buckets: the state consumed from */
  tg__state after;   /* and the state written */
  uint64_t entry_us; /* sliding: the time of the entry that got the cost */
  uint64_t now_us;   /* the time of the consumption */
} tg__token;

/* A token as a CHECK, TAKE or RESERVE starts from: the flags (the store
 * fills the rest before reading it), and the generation and entry a
 * give-back would compare. Clearing the whole token instead is a `rep
 * stos` (gcc 12): a tenth of a two-rule decision, measured. */
static inline void tg__token_start(tg__token *tk) {
  tk->seen_ok = tk->seen_absent = tk->next_ok = tk->reused = false;
  tk->taken = tk->peek_owed = false;
  tk->gen = 0;
  tk->entry_us = 0;
}

/* What one call asks of the store. */
typedef struct tg__call {
  tg__op op;
  tg_algorithm alg;
  const void *key;
  size_t key_len;
  tg__quota q;
  uint64_t arg;     /* cost (hit, inc) or value (set) */
  uint64_t now_us;  /* already range-checked */
  bool store_time;  /* the store reads its own clock (the Redis server's
                       TIME): now_us is 0 until the store sets it */
  uint64_t wait_ns; /* RESERVE: the longest delay accepted, ns */
  tg__token *tok;   /* CHECK, TAKE, RESERVE, UNDO, CANCEL: in and out
                       (NULL for the other operations; NULL for a TAKE
                       that is a policy's only step, which a table runs
                       as a plain step without a receipt) */
} tg__call;

/* What one call answers. */
typedef struct tg__outcome {
  tg_result r;    /* hit, check, take, reserve */
  uint64_t value; /* inc: new count; get: value; expires: absolute ms;
                     reserve: the delay, ns */
  tg_result peek; /* check: the key's numbers left as they are (what a
                     cost-0 call would report), for a policy denied by
                     another rule */
} tg__outcome;

/* The longest wait a reservation may accept, ns: TG_PERIOD_MAX_MS. A TAT
 * then stays below TG_NOW_MAX_US in ns + TG_TOLERANCE_MAX_NS + this (1.4e19
 * ns), and every step's sums below 2^64. */
#define TG__WAIT_MAX_NS (TG_PERIOD_MAX_MS * UINT64_C(1000000))

/* Validates *q for alg and fills *out. TG_EQUOTA when limit or period is 0,
 * the period is above TG_PERIOD_MAX_MS, or (buckets) the rate is above one
 * per ns or burst * T does not fit the documented range. */
int tg__quota_prepare(tg__quota *out, const tg_quota *q, tg_algorithm alg);

/* What tg__quota_prepare does for every algorithm, and all it does for the
 * windows and the sliding log: inline, so that their decisions skip a call
 * (a bucket's quota has a division to prepare, which the limiter memoises
 * instead, limiter.h). */
static inline int tg__quota_prepare_common(tg__quota *out, const tg_quota *q) {
  if (q->limit == 0 || q->period_ms == 0 || q->period_ms > TG_PERIOD_MAX_MS)
    return TG_EQUOTA;
  out->limit = q->limit;
  out->period_us = q->period_ms * 1000u;
  out->burst = q->burst != 0 ? q->burst : q->limit;
  out->t_ns = 0;
  out->tau_ns = 0;
  return TG_OK;
}

/* The operations each algorithm supports, one bit per tg__op (quota.c). */
extern const unsigned tg__ops_of[TG_ALGORITHM_COUNT];

/* True when `op` is defined for `alg` (the table in tollgate.h): a lookup,
 * inline, since every call and every step asks. */
static inline bool tg__op_supported(tg_algorithm alg, tg__op op) {
  if ((unsigned)alg >= TG_ALGORITHM_COUNT || (unsigned)op >= TG__OP_COUNT_)
    return false;
  return tg__ops_of[alg] >> op & 1u;
}

/* The first two of tg__call_check's checks: the key's length (TG_EKEY),
 * then the operation (TG_ENOTSUP). */
static inline int tg__call_checks_key_op(tg_algorithm alg, tg__op op,
                                         size_t key_len) {
  if (key_len == 0 || key_len > TG_KEY_MAX)
    return TG_EKEY;
  if (!tg__op_supported(alg, op))
    return TG_ENOTSUP;
  return TG_OK;
}

/* What every call is checked for before a store sees it, in the order
 * tollgate.h documents: the key's length (TG_EKEY), the operation
 * (TG_ENOTSUP), the quota (TG_EQUOTA; *prepared is filled on success). */
static inline int tg__call_check(tg_algorithm alg, tg__op op, size_t key_len,
                                 const tg_quota *q, tg__quota *prepared) {
  int rc = tg__call_checks_key_op(alg, op, key_len);
  return rc != TG_OK ? rc : tg__quota_prepare(prepared, q, alg);
}

/* Runs one call on fixed-size state. *st is read and, when *changed is set
 * true, replaced by the new state, which the store must then publish (or, for
 * a CAS store, publish only if the old state is still current and otherwise
 * call again). Never called for TG_SLIDING_WINDOW. */
int tg__state_step(const tg__call *c, tg__state *st, tg__outcome *o,
                   bool *changed);

/* A policy's CHECK or TAKE on fixed-size state (c->op one of them: the
 * step is the same, only the store publishes a TAKE's state): o->r and the
 * state a TAKE writes, as tg__state_step answers, o->peek left alone. The
 * peek is needed only when the policy is denied (then tg__state_peek gives
 * it from the same state), so the table's policies leave it until then
 * (a bucket's costs two divisions, a window's a few stores on every
 * allowed call). */
int tg__state_check(const tg__call *c, tg__state *st, tg__outcome *o,
                    bool *changed);

/* The peek a CHECK (c, as checked, any op) on state `st` reports, to the
 * bit: the key's numbers left as they are. */
void tg__state_peek(const tg__call *c, const tg__state *st, tg_result *peek);

/* False when `st` holds numbers tollgate never writes (a window ending after
 * TG_NOW_MAX_US + TG_PERIOD_MAX_MS, a TAT beyond TG_NOW_MAX_US in ns plus
 * TG_TOLERANCE_MAX_NS): stores that read state from outside (a custom store,
 * a shared segment) answer TG_ECORRUPT instead of letting it wrap. */
bool tg__state_plausible(tg_algorithm alg, const tg__state *st);

/* The same for a log: head and n within the ring, times at most
 * TG_NOW_MAX_US and strictly increasing, sum equal to the costs' sum. */
bool tg__log_plausible(const tg__log *log);

/* What a shared table checks on every call instead, at the cost of the
 * entries the call reads rather than all of them: head and n within the
 * ring, a zero sum when empty, the newest entry's time at most
 * TG_NOW_MAX_US, and from the oldest, each entry a call at now_us expires
 * and the first it keeps strictly increasing in time up to the newest, with
 * their costs and the newest's within the sum. An entry further in is
 * checked when a later call reaches it; a denied call that no entry can
 * account for (no wait found: a sum beyond all of them) is caught by its
 * caller. */
bool tg__log_sound_where_read(const tg__log *log, uint64_t period_us,
                              uint64_t now_us);

/* Restores a log whose writer died part way through a step (shared memory):
 * clamps head and n to the ring; on a full ring whose head entry is newer
 * than the next (an append into the slot a prune freed, its header not
 * written), reads from the slot after head; keeps, in order, each entry
 * newer than the last one kept (which drops the stale slots a half-written
 * prune or append can expose), and recomputes the sum. */
void tg__log_repair(tg__log *log);

/* What a sliding-log call saw, all a result needs: the sum of live costs
 * before the call (after pruning), the newest entry after the call, and for a
 * denied call that may pass later, the entry it waits for (the oldest entries
 * whose costs cover what it lacks must expire first). tg__log_step fills one
 * from its log; the Redis store, whose log lives in the server, gets one from
 * its script. */
typedef struct tg__log_view {
  uint64_t sum;       /* live costs before the call */
  bool has_newest;    /* the log holds an entry after the call */
  uint64_t newest_us; /* its time */
  bool has_wait;      /* a denied call's entry to wait for was found */
  uint64_t wait_us;   /* its time: the call may pass once it has expired */
} tg__log_view;

/* Runs one call on a sliding log: drops expired entries, decides, appends
 * or merges an allowed cost, and fills *v with what it saw. *changed says
 * whether the log was modified (pruning included). A store whose log lives
 * elsewhere (the Redis module) returns *v to the client, which reports with
 * tg__log_report as if it had stepped the log itself. */
int tg__log_decide(const tg__call *c, tg__log *log, tg__log_view *v,
                   bool *changed);

/* tg__log_decide then tg__log_report: one call on a log held here. */
int tg__log_step(const tg__call *c, tg__log *log, tg__outcome *o,
                 bool *changed);

/* CHECK on a log: what TAKE would decide, reading the log without
 * changing it (expired entries are skipped, not dropped). */
int tg__log_check(const tg__call *c, const tg__log *log, tg__log_view *v);

/* UNDO: takes cost back from the entry that received it, the first entry
 * at or after entry_us (a later merge may have moved it there), unless that
 * entry may be another call's (entry_us has expired under period_us at
 * now_us); an entry left with no cost is removed. Returns whether the log
 * changed. */
bool tg__log_undo(tg__log *log, uint64_t entry_us, uint64_t cost,
                  uint64_t period_us, uint64_t now_us);

/* True when a sliding-log hit of cost c->arg fits beside live costs sum. */
bool tg__log_allows(const tg__call *c, uint64_t sum);

/* Fills *o for call c from what it saw: the one place the sliding log's
 * results are computed, whichever store holds the log. */
int tg__log_report(const tg__call *c, const tg__log_view *v, tg__outcome *o);

/* Drops entries that have expired at now_us; returns how many were dropped. */
uint32_t tg__log_prune(tg__log *log, uint64_t period_us, uint64_t now_us);

/* ---- lifetime: when a state stops mattering (lifetime.c, sliding.c) ----
 * Every store asks these rather than re-deriving them: the memory and shm
 * table to reclaim keys, the custom store and Redis for TTLs. */

/* True when `st` is equivalent to absent at now (a store may delete it). */
bool tg__state_fresh(tg_algorithm alg, const tg__state *st, uint64_t now_us);

/* The moment, us since the epoch, from which `st` is fresh at every now: a
 * window's end, a bucket's TAT rounded up to the us. A fixed window with
 * count 0 is fresh before it too, but a store that keeps such a state must
 * keep it until then (a clock stepping back may find it current). */
uint64_t tg__state_expiry_us(tg_algorithm alg, const tg__state *st);

/* ms from now until `st` is fresh, rounded up; 0 when it is fresh already.
 * The TTL a store that may drop fresh state gives it (the custom store). */
uint64_t tg__state_ttl_ms(tg_algorithm alg, const tg__state *st,
                          uint64_t now_us);

/* When a log stops mattering, us: its newest entry plus period_us; 0 for an
 * empty log (fresh already). */
uint64_t tg__log_expiry_us(const tg__log *log, uint64_t period_us);

/* ms from now until the log is fresh, rounded up; 0 when it is empty. */
uint64_t tg__log_ttl_ms(const tg__log *log, uint64_t period_us,
                        uint64_t now_us);

/* Whether call c may change the key's state, so that a store must open the
 * key for writing (and replicate what it writes); false means the step
 * leaves the state exactly as it found it. Which calls count is the table
 * in tollgate.h less the steps' refusals: a window cost of 0, a bucket cost
 * or value above the burst change nothing. Every call on a sliding log may
 * change it: it drops the entries expired under the call's period. */
bool tg__call_writes(const tg__call *c);

/* Whether a store must write the state a step produced: the step changed it,
 * and it is not a fresh state where the key was absent (no store creates a
 * key for a state equivalent to none). */
bool tg__state_store_needed(tg_algorithm alg, bool was_absent, bool changed,
                            const tg__state *st, uint64_t now_us);

/* The per-family steps behind tg__state_step (window.c, gcra.c). */
int tg__window_step(const tg__call *c, tg__state *st, tg__outcome *o,
                    bool *changed);
int tg__gcra_step(const tg__call *c, tg__state *st, tg__outcome *o,
                  bool *changed);
/* tg__state_check and tg__state_peek of each family. */
int tg__window_check(const tg__call *c, tg__state *st, tg__outcome *o,
                     bool *changed);
int tg__gcra_check(const tg__call *c, tg__state *st, tg__outcome *o,
                   bool *changed);
void tg__window_peek(const tg__call *c, const tg__state *st, tg_result *p);
void tg__gcra_peek(const tg__call *c, const tg__state *st, tg_result *p);

/* ---- small arithmetic helpers shared by the steps ---- */

/* ceil(x / d) without overflow; d > 0. */
static inline uint64_t tg__div_ceil(uint64_t x, uint64_t d) {
  return x / d + (x % d != 0);
}

/* a + b, or false on overflow. */
static inline bool tg__add(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/* a * b, or false on overflow. */
static inline bool tg__mul(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

/* Whole ms from now_us until later_us, rounded up; 0 if not later. */
static inline uint64_t tg__ms_until(uint64_t later_us, uint64_t now_us) {
  return later_us > now_us ? tg__div_ceil(later_us - now_us, 1000) : 0;
}

/* Fills a result for an allowed/denied outcome; the steps use it so the
 * relationship between the fields is written once. */
static inline void tg__result_set(tg_result *r, bool allowed, uint64_t count,
                                  uint64_t remaining, uint64_t retry_ms,
                                  uint64_t reset_ms) {
  r->allowed = allowed;
  r->degraded = false;
  r->shadow_denied = false;
  r->count = count;
  r->remaining = remaining;
  r->retry_after_ms = allowed ? 0 : retry_ms;
  r->reset_after_ms = reset_ms;
}

#endif /* TG_CORE_H */
