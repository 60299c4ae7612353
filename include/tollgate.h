/* SPDX-License-Identifier: MIT */
/*
 * tollgate.h - the whole public API of tollgate, a rate-limiting library for C.
 *
 * This header is the reference manual. A program asks "may key K do this now,
 * at cost C, under quota Q?" and gets back allow/deny plus the numbers an HTTP
 * 429 response needs (remaining, retry-after, reset).
 *
 * Conventions used throughout:
 *   - Every function that can fail returns int: 0 (TG_OK) or a negative TG_E*
 *     code. tg_strerror() and tg_err_name() describe a code.
 *   - Time: "now" is microseconds since the Unix epoch (uint64_t). Durations
 *     in quotas and results are milliseconds. Field names carry the unit
 *     (_ms, _us, _ns).
 *   - Keys are byte strings (pointer + length, 1..TG_KEY_MAX bytes, any bytes,
 *     NUL included). tollgate copies what it keeps; the caller keeps ownership.
 *   - Handles are opaque; tg_limiter_destroy(NULL) is a harmless no-op.
 *
 * Minimal use:
 *
 *   tg_config cfg;
 *   tg_config_init(&cfg);
 *   cfg.algorithm = TG_TOKEN_BUCKET;
 *   tg_limiter *lim;
 *   if (tg_limiter_new(&lim, &cfg) != 0) abort();
 *   tg_quota q = {.limit = 10, .period_ms = 1000, .burst = 20};
 *   tg_result r;
 *   int rc = tg_hit(lim, "user:42", 7, &q, 1, &r);
 *   if (rc == 0 && !r.allowed) reply_429(r.retry_after_ms);
 *   tg_limiter_destroy(lim);
 *
 * The sections, in order: version; status codes; limits; algorithms; quota;
 * result; limiter configuration (with the types of its fields: clock,
 * failure policy, full table, callbacks); the limiter; operations; batches;
 * what extends a decision (policies, reservations, shadow mode, counters and
 * the decision hook); cleanup; the stores (custom, shared memory, a table in
 * the caller's memory, Redis, surviving a store outage); the non-blocking
 * Redis API; HTTP headers. Each is headed by a "---- Name ----" line.
 */
#ifndef TOLLGATE_H
#define TOLLGATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Export macro ---------------------------------------------------------
 * The library is built with -fvisibility=hidden; only TG_EXTERN symbols are
 * exported from the shared object. Static builds define TG_STATIC (the CMake
 * target does it for consumers of the static library). */
#if defined(TG_STATIC)
#define TG_EXTERN
#elif defined(_WIN32)
#if defined(TG_BUILDING_SHARED)
#define TG_EXTERN __declspec(dllexport)
#else
#define TG_EXTERN __declspec(dllimport)
#endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#define TG_EXTERN __attribute__((visibility("default")))
#else
#define TG_EXTERN
#endif

/* ---- Version --------------------------------------------------------------
 * This block is the single source of truth: CMake parses these three lines. */
#define TG_VERSION_MAJOR 0
#define TG_VERSION_MINOR 1
#define TG_VERSION_PATCH 0
/* 0xMMmmpp: comparable with <, e.g. #if TG_VERSION_HEX >= 0x000100 */
#define TG_VERSION_HEX                                                         \
  ((TG_VERSION_MAJOR << 16) | (TG_VERSION_MINOR << 8) | (TG_VERSION_PATCH))

/* The version of the library actually linked, as TG_VERSION_HEX would give. */
TG_EXTERN unsigned tg_version(void);
/* The same as a static string "MAJOR.MINOR.PATCH". */
TG_EXTERN const char *tg_version_string(void);

/* ---- Status codes ---------------------------------------------------------
 * One table generates the enum, tg_strerror() and tg_err_name(), so they
 * never drift. Values are negative, stable, and only ever appended. */
#define TG_ERRNO_MAP(XX)                                                       \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(EKEY, -2, "key is empty or longer than TG_KEY_MAX bytes")                 \
  XX(EQUOTA, -3, "invalid quota (limit 0, period 0 or out of range)")          \
  XX(EOVERFLOW, -4, "arithmetic would overflow 64 bits")                       \
  XX(ENOTSUP, -5, "operation not supported by this algorithm, store or build") \
  XX(ENOMEM, -6, "out of memory")                                              \
  XX(ERANGE, -7, "value out of range for this algorithm")                      \
  XX(ETIME, -8, "time out of range (after TG_NOW_MAX_US)")                     \
  XX(EFULL, -9, "store is full")                                               \
  XX(ESTORE, -10, "store failure")                                             \
  XX(EBUSY, -11, "a lock is held by another caller")                           \
  XX(ECORRUPT, -12, "stored state is corrupt")                                 \
  XX(EMISMATCH, -13,                                                           \
     "shared segment was created with other parameters, by another "           \
     "tollgate version or in another PID namespace")                           \
  XX(ECONNECT, -14, "cannot reach the store: connection refused or lost")      \
  XX(ETIMEDOUT, -15, "the store did not answer in time")                       \
  XX(EPERM, -16,                                                               \
     "shared segment refused: another user's, not a regular file, or open "    \
     "beyond shm_mode")

typedef enum tg_errno {
  TG_OK = 0,
#define TG__ERR_ENUM(name, val, msg) TG_##name = (val),
  TG_ERRNO_MAP(TG__ERR_ENUM)
#undef TG__ERR_ENUM
} tg_errno;

/* A human-readable message for a status code; "unknown error" for values that
 * are not codes. Never NULL; the string is static. */
TG_EXTERN const char *tg_strerror(int err);
/* The code's name, e.g. "TG_EKEY"; "TG_OK" for 0, "TG_UNKNOWN" otherwise. */
TG_EXTERN const char *tg_err_name(int err);

/* Why the calling thread's last tg_limiter_new failed, in words: which
 * field is invalid, which segment was refused and why ("owned by uid 1001,
 * not by this process's effective uid 1000"), how many bytes a full tmpfs
 * could not supply... The string is thread-local (like dlerror), valid until
 * the thread's next tg_limiter_new, tg_nb_new or tg_nb_input (which say,
 * the same way, why they failed), and "" when that call succeeded or none
 * was made.
 * Never NULL. */
TG_EXTERN const char *tg_last_error(void);

/* ---- Limits ------------------------------------------------------------ */

/* Longest key accepted, in bytes. Longer (or empty) keys are TG_EKEY. */
#define TG_KEY_MAX 256
/* Longest period accepted, in ms (about 31.7 years). Longer is TG_EQUOTA. */
#define TG_PERIOD_MAX_MS UINT64_C(1000000000000)
/* Latest "now" accepted, in us since the epoch (about the year 2262): beyond
 * it nanosecond arithmetic would not fit 64 bits. Later is TG_ETIME. */
#define TG_NOW_MAX_US UINT64_C(9000000000000000)
/* Largest bucket tolerance burst * T, in ns (see the algorithms below). */
#define TG_TOLERANCE_MAX_NS UINT64_C(4000000000000000000)
/* Most keys one table holds (tg_config.capacity). More is TG_EINVAL. */
#define TG_CAPACITY_MAX (UINT64_C(1) << 40)
/* Most entries one sliding-window key keeps (tg_config.sliding_max_entries).
 * More is TG_EINVAL. */
#define TG_SLIDING_ENTRIES_MAX (UINT32_C(1) << 24)
/* retry_after_ms value meaning "this call can never be allowed", e.g. a cost
 * greater than the limit (windows) or the burst (buckets). */
#define TG_NEVER UINT64_MAX

/* ---- Algorithms -----------------------------------------------------------
 * All five give the same answers on every store. The summary each caller
 * needs (README.md has the table):
 *
 * TG_FIXED_WINDOW: windows aligned to the Unix epoch, window = floor(now_ms /
 *   period_ms). A call adds its cost to the window's count and is allowed when
 *   count <= limit. A DENIED CALL IS STILL COUNTED, so a client that keeps
 *   calling stays denied until the window ends. retry_after_ms = end of
 *   window - now.
 * TG_FIXED_WINDOW_PER_KEY: a window opens at the key's first hit and ends at
 *   that moment + period_ms; it is active while end > now. Hits inside do not
 *   move the end; the first hit after it opens a fresh window. Denied calls are
 *   counted.
 * TG_SLIDING_WINDOW: a log of allowed (time, cost) entries; a call is allowed
 *   when the costs of entries younger than period_ms plus its cost <= limit,
 *   so no interval of length period_ms ever admits more than limit. Denied
 *   calls are not recorded. Memory per key is bounded, see
 *   tg_config.sliding_max_entries.
 * TG_TOKEN_BUCKET: a new bucket is full (burst tokens); it refills
 *   continuously at limit per period_ms up to burst; a call is allowed when
 *   tokens >= cost. count = tokens left. A denied call changes nothing.
 * TG_LEAKY_BUCKET (as a meter): a new bucket is empty; it drains continuously
 *   at limit per period_ms; a call is allowed when level + cost <= burst.
 *   count = level after the call. A denied call changes nothing.
 *
 * Both buckets keep one 64-bit word per key (GCRA's theoretical arrival time,
 * in nanoseconds). Their refill/drain rate is quantised to an emission
 * interval of whole nanoseconds, rounded UP: T = ceil(period_ms * 10^6 /
 * limit) ns, so tollgate never admits faster than the quota says (the error is
 * below one part in T, e.g. 5.5e-8 at 55 per second). A quota whose rate is
 * above one per nanosecond (limit > period_ms * 10^6) is TG_EQUOTA, and so is
 * one whose tolerance burst * T exceeds TG_TOLERANCE_MAX_NS (about 126 years:
 * e.g. burst 10 at one token per 31 years). */
typedef enum tg_algorithm {
  TG_FIXED_WINDOW = 0,
  TG_FIXED_WINDOW_PER_KEY = 1,
  TG_SLIDING_WINDOW = 2,
  TG_TOKEN_BUCKET = 3,
  TG_LEAKY_BUCKET = 4
} tg_algorithm;

/* Number of algorithms, for loops over all of them. */
#define TG_ALGORITHM_COUNT 5

/* The algorithm's name as used in docs and the command-line tool, e.g.
 * "fixed_window"; "unknown" for values outside the enum. Static string. */
TG_EXTERN const char *tg_algorithm_name(tg_algorithm alg);

/* ---- Quota ----------------------------------------------------------------
 * "limit per period_ms", plus burst for the buckets. Passed with every call:
 * a key should always be used with the same quota (a different quota on the
 * same key reinterprets its state, which is well defined but rarely useful).
 * E.g. 55 per second with bursts of 100: {.limit = 55, .period_ms = 1000,
 * .burst = 100}. */
typedef struct tg_quota {
  /* Events (cost units) per period; must be >= 1. */
  uint64_t limit;
  /* The period, ms, 1..TG_PERIOD_MAX_MS. */
  uint64_t period_ms;
  /* Bucket capacity in cost units; 0 means "= limit". Ignored by the three
   * window algorithms. */
  uint64_t burst;
} tg_quota;

/* Whether every call with algorithm alg takes quota q: TG_OK, or the code
 * such a call would answer. TG_EQUOTA: limit or period_ms is 0, period_ms is
 * above TG_PERIOD_MAX_MS, or (the two buckets) the rate is above one per
 * nanosecond or burst * T exceeds TG_TOLERANCE_MAX_NS (see the algorithms
 * above). TG_EINVAL: q is NULL or alg is not an algorithm. The same check a
 * call makes, on every store and in the Redis module, and nothing else (no
 * key, no cost, no limiter): for validating a configuration when it is
 * read, rather than at its first request. E.g. tg_quota_check(
 * TG_TOKEN_BUCKET, &(tg_quota){.limit = 1, .period_ms = 1000, .burst =
 * UINT64_MAX}) is TG_EQUOTA. */
TG_EXTERN int tg_quota_check(tg_algorithm alg, const tg_quota *q);

/* ---- Result ---------------------------------------------------------------
 * What a decision answers: the verdict, and the numbers an HTTP 429 response
 * (or a RateLimit header, see "HTTP headers") needs. */
typedef struct tg_result {
  /* The call was admitted (and its cost consumed). */
  bool allowed;
  /* The answer came from the failure policy, not the store: see
   * tg_config.on_failure. */
  bool degraded;
  /* Shadow mode (tg_config.shadow, TG_RULES_SHADOW) let through a call the
   * limit would have denied: allowed is then true and the other fields are
   * the real answer's (retry_after_ms included). */
  bool shadow_denied;
  /* Per algorithm: windows: count in the window (after adding cost when it
   * was counted); sliding: sum of live costs; token bucket: whole tokens
   * left; leaky bucket: level, rounded up. */
  uint64_t count;
  /* How many cost-1 calls would still be allowed now, after this call. */
  uint64_t remaining;
  /* 0 when allowed; otherwise the exact wait in ms, rounded up, after which
   * the same call would be allowed (if nothing else happens meanwhile);
   * TG_NEVER when it never can. */
  uint64_t retry_after_ms;
  /* ms until the key is back to a fresh state (empty window or log, full
   * token bucket, empty leaky bucket), rounded up; 0 if it is fresh now. */
  uint64_t reset_after_ms;
} tg_result;

/* ---- Limiter configuration ------------------------------------------------
 * A limiter is made from a tg_config: its algorithm, its clock, its failure
 * policy, its store (the built-in memory table unless one of custom_store,
 * shm_name, region or redis is set) and that store's settings. The types of
 * its fields come first; tg_config and tg_config_init end the section. */

/* The clock: returns microseconds since the Unix epoch. Called at most once
 * per operation (each item of a batch is one), from the calling thread; and
 * by the cleaning thread, from
 * its own, at each pass (clean_period_ms > 0 on a memory or shm store). So
 * it must be thread-safe if the limiter is shared or cleans in the
 * background, and must not answer from the calling thread's own state (an
 * event loop's cached time): with such a clock set clean_period_ms to 0 and
 * call tg_clean from the loop. Tests inject their own to drive time by
 * hand. */
typedef uint64_t (*tg_clock_fn)(void *ctx);

/* CLOCK_REALTIME in us (the default). ctx is ignored. */
TG_EXTERN uint64_t tg_clock_realtime(void *ctx);
/* CLOCK_REALTIME_COARSE in us: cheaper to read than CLOCK_REALTIME, at the
 * price of the kernel tick's resolution (1-4 ms). ctx is ignored. */
TG_EXTERN uint64_t tg_clock_coarse(void *ctx);

/* One timeline for callers whose clocks lag one another: returns the latest
 * of now_us and every time passed through *latest before, and raises
 * *latest to it. For processes (or threads) sharing a table that each read
 * the time once per event-loop turn (nginx's workers do): a worker whose
 * turn began 80 ms before another's would otherwise decide on a key the
 * other wrote 80 ms "later", and a bucket would look 80 ms fuller to it
 * (time never moves a stored state back, see "Operations"). With the
 * word, it decides at the other's time, as if its own clock were as fresh.
 * *latest is a 64-bit word (8-byte aligned) every caller shares (in shared
 * memory between processes; 0 to start), updated with atomic operations,
 * lock-free: a load per call, a compare-and-swap when now_us is ahead of it.
 * Use one word for every limiter a decision may span (a policy decides all its
 * rules at one time). A word more than TG_CLOCK_LEAD_MAX_US ahead of now_us
 * is not a lag but a clock that stepped back (or a damaged word): it is set
 * to now_us, and now_us is returned. So a clock stepping back by less than
 * that holds the word's time until it catches up (keys' states would be
 * held as long without the word); and a caller whose lag exceeds it
 * (nginx's timer_resolution of a minute or more) sets the word back to its
 * own time: the others lose the latest time until their next call, so
 * such callers do not share a timeline.
 * latest NULL: now_us. */
#define TG_CLOCK_LEAD_MAX_US UINT64_C(60000000)
TG_EXTERN uint64_t tg_clock_latest(uint64_t *latest, uint64_t now_us);

/* The failure policy: what a decision answers when the store cannot decide:
 * the memory table is full even after reclaiming decayed keys (TG_EFULL), a
 * custom store's key is locked (TG_EBUSY) or fails (TG_ESTORE, TG_ECORRUPT),
 * a shared-memory lock stays held (TG_EBUSY), memory runs out (TG_ENOMEM),
 * the Redis server cannot be reached (TG_ECONNECT), does not answer in time
 * (TG_ETIMEDOUT) or answers with an error (TG_ESTORE: OOM, BUSY, READONLY,
 * a failed AUTH...). The function still returns that code; the policy only
 * decides what is written into the result, which then has degraded = true.
 * A store failure is never disguised as a plain denial. (A shared segment
 * whose file system is full answers TG_ENOMEM for the new key, or the
 * sliding log, that needed memory, through this policy, never with a
 * signal.) TG_POLICY_FALLBACK
 * decides instead, locally: see "Surviving a store outage". */
typedef enum tg_policy {
  /* Result: allowed (the default: a broken limiter should not take the
   * service down). */
  TG_POLICY_FAIL_OPEN = 0,
  /* Result: not allowed, retry_after_ms = period. */
  TG_POLICY_FAIL_CLOSED = 1,
  /* Result: not allowed, retry_after_ms TG_NEVER: the caller must look at
   * the return code. */
  TG_POLICY_ERROR = 2,
  /* Result: decided by a local memory store under the quota divided by
   * tg_config.fallback_share (see "Surviving a store outage"). */
  TG_POLICY_FALLBACK = 3
} tg_policy;

/* What a new key does when the memory (or shm) table is full and the
 * bounded scan of "Cleanup" finds no decayed key to reclaim. */
typedef enum tg_full {
  /* The call fails with TG_EFULL and the failure policy answers (the
   * default): no key's count is ever lost, but new keys go unlimited
   * (fail-open) or are denied (fail-closed) while the table is full. */
  TG_FULL_REFUSE = 0,
  /* The live key closest to fresh (whose state would decay soonest) among
   * those the scan inspected is evicted, and the new key takes its place.
   * The evicted key's count is forgotten: its next call starts from a fresh
   * state, so within one period it may be admitted up to a full limit
   * again, on top of what it had used. Each limit stays exact for keys that
   * are not evicted. An eviction never moves the reclaim horizon (see
   * "Operations"), and a sliding log held by another call is not evicted. */
  TG_FULL_EVICT = 1
} tg_full;

/* Declared here because tg_config and its callbacks point to them; each is
 * defined in the section that explains it: "Custom store", "Redis store",
 * "Cleanup" (tg_expired), "Counters and the decision hook" (tg_decision). */
typedef struct tg_custom_store tg_custom_store;
typedef struct tg_redis_config tg_redis_config;
typedef struct tg_expired tg_expired;
typedef struct tg_decision tg_decision;

/* Called by a cleaning pass with up to 64 entries at a time, only when
 * something expired, before they are deleted; from the cleaning thread (or
 * the tg_clean caller), never while a tollgate lock is held, so it may call
 * tollgate itself. Its return value is ignored for deletion: deletion goes on
 * even if it reports failure (non-zero). An entry hit again between this
 * call and its deletion is not deleted (the cleaner deletes only the state
 * it inspected). */
typedef int (*tg_before_clean_fn)(tg_algorithm alg, const tg_expired *entries,
                                  size_t n, void *ctx);

/* The decision hook: called from the deciding thread, after the decision,
 * outside every tollgate lock (it may call tollgate). Must be thread-safe if
 * the limiter is shared. See "Counters and the decision hook". */
typedef void (*tg_decision_fn)(const tg_decision *d, void *ctx);

typedef struct tg_config {
  /* Default TG_FIXED_WINDOW. */
  tg_algorithm algorithm;
  /* Default tg_clock_realtime; clock_ctx is passed to it, owned by the
   * caller. */
  tg_clock_fn clock;
  void *clock_ctx;
  /* Default TG_POLICY_FAIL_OPEN. */
  tg_policy on_failure;
  /* TG_SLIDING_WINDOW only: most log entries kept per key (default 1024,
   * 1..TG_SLIDING_ENTRIES_MAX). Entries of the same microsecond are merged.
   * When a new entry would exceed the cap it is merged into the newest
   * entry, which takes the later time: memory stays bounded and the limit
   * is never exceeded, at the price of keeping some cost a little longer
   * than its true age (answers become conservative, never permissive). */
  uint32_t sliding_max_entries;
  /* Memory store: most keys held at once (default 65536, at most
   * TG_CAPACITY_MAX). The table takes about 55 bytes per key (a 48-byte
   * slot, at most 7/8 of them in use), reserved up front and, from 2 MiB
   * on, advised onto transparent huge pages (TG_ENOMEM if the address space
   * cannot hold it). What keys need beyond their slot is reserved as they
   * come: a long key's 256 bytes (long_keys), and a sliding window key's
   * log, which starts in a 64-byte block (one entry) and moves to one
   * twice as large whenever an admitted call finds it full (5, 13, 29,
   * ... entries), up to 48 + 16 * sliding_max_entries bytes rounded up to
   * 64: a key's log costs about 16 bytes an entry it holds, plus a block's
   * slack. A log that cannot move up (no memory for a larger block) keeps
   * its block and merges its newest entries early, as at
   * sliding_max_entries: answers stay on the safe side, and a later call
   * tries again. They are
   * mapped in extents of doubling size (each size's first 64 KiB), so the
   * table reserves at most about twice what the most keys it has held
   * needed, plus 64 KiB per size of chunk or block in use, and a key whose
   * memory cannot be mapped is TG_ENOMEM (through
   * on_failure). Nothing is given back before tg_limiter_destroy: a key
   * reclaimed, or a log that moved up, leaves its chunk or block to the
   * next one. Memory backs it all only as it is touched. A shared segment,
   * or a region the caller provides, holds all of it from the start, a
   * whole log per key (tg_store_bytes). */
  uint64_t capacity;
  /* Memory store: most keys longer than 24 bytes held at once (keys up to
   * 24 bytes live in their slot); 0 (the default) means "as many as
   * capacity". 256 bytes each, reserved only once used (see capacity). */
  uint64_t long_keys;
  /* Memory store: background cleaning period (default 60000); 0 runs no
   * thread: call tg_clean() yourself. */
  uint64_t clean_period_ms;
  /* How long a key may stay after its state became fresh (default 86400000,
   * 24 h). */
  uint64_t key_older_than_ms;
  /* May be NULL (the default); before_clean_ctx is passed to it. */
  tg_before_clean_fn before_clean;
  void *before_clean_ctx;
  /* NULL (default): the built-in memory store. Else the caller's store (see
   * "Custom store"); the struct is copied and must stay valid as long as the
   * limiter, as must its ctx. */
  const tg_custom_store *custom_store;
  /* NULL (default): the table lives in this process. Else the name of a
   * POSIX shared-memory segment ("/tollgate-api", see shm_open(3)) that
   * holds it ("/" then 1..254 bytes without "/"), so that unrelated
   * processes naming it share one limit: created with this config's
   * algorithm, capacity, long_keys and sliding_max_entries if absent,
   * attached if present (see "Shared memory" for what a segment guarantees
   * and the codes tg_limiter_new answers). The string is only read during
   * tg_limiter_new. Cannot be combined with custom_store. */
  const char *shm_name;
  /* Permissions of a segment this limiter creates (default 0600: only the
   * same user may attach), and the most an existing one may allow. */
  unsigned shm_mode;
  /* Shared memory: the longest one operation waits, in all, for locks other
   * processes hold (the table's, a sliding log's, the segment's creation
   * lock in tg_limiter_new), in ms, default 2000, at most 3600000; then it
   * answers TG_EBUSY. 0 means never wait (a lock whose holder has died is
   * still taken over). */
  uint32_t lock_timeout_ms;
  /* Memory and shm stores: what a new key does in a full table, default
   * TG_FULL_REFUSE. Each limiter's own choice, even on one segment. */
  tg_full on_full;
  /* NULL (default): not Redis. Else the Redis store with these settings
   * (copied, strings included, during tg_limiter_new). Cannot be combined
   * with custom_store or shm_name. */
  const tg_redis_config *redis;
  /* false (default). true: shadow (dry-run) mode: every decision is made
   * and recorded as usual (state, counters, hook), but the answer is always
   * allowed; shadow_denied says when the real answer was a denial. See
   * "Shadow mode". */
  bool shadow;
  /* NULL (default): no hook. Else called after decisions, with
   * on_decision_ctx: see "Counters and the decision hook". */
  tg_decision_fn on_decision;
  void *on_decision_ctx;
  /* 0 or 1 (default 1): every decision the hook considers; N: one in N of
   * them, counted per thread. */
  uint32_t on_decision_every;
  /* false (default). true: the hook considers only denials, shadow denials
   * and failures. */
  bool on_decision_denied_only;
  /* NULL (default). Else memory the caller provides for the table, shared
   * by the processes that map it (a MAP_SHARED anonymous mapping made before
   * fork(), nginx's shared zones): see "A table in the caller's memory".
   * 64-byte aligned. Cannot be combined with custom_store, shm_name or
   * redis. */
  void *region;
  /* The region's size, at least tg_region_bytes(cfg). */
  size_t region_bytes;
  /* TG_POLICY_FALLBACK: the number of hosts sharing the store's limits;
   * while the store fails, each decides alone under limit / fallback_share
   * (and burst / fallback_share), rounded down. Default 1, 1..65536. */
  uint32_t fallback_share;
  /* 0 (default): no deny cache. Else the entries of the local deny cache
   * (rounded up to a power of two, at least 4; at most 2^24), about 380
   * bytes each: see "Surviving a store outage". */
  uint64_t deny_cache_entries;
} tg_config;

/* Fills *cfg with the defaults documented beside each field. Always use it
 * before setting fields, so new fields get their defaults. */
TG_EXTERN void tg_config_init(tg_config *cfg);

/* ---- Limiter --------------------------------------------------------------
 * The limiter handle. Its state lives in the built-in memory store (a
 * concurrent hash table of fixed capacity owned by the limiter) unless a
 * shared-memory segment, a region of the caller's memory, a Redis server or
 * a custom store is configured.
 *
 * THREAD SAFETY: every operation may be called from any number of threads at
 * once on the same limiter. With the memory store, decisions on existing keys
 * are lock-free (one 16-byte compare-and-swap; a sliding log takes a per-key
 * lock); creating and reclaiming keys take a table lock. With the Redis
 * store, each call holds one pooled connection (on a Cluster, one pooled
 * set of per-node connections) for its round trip. With a
 * custom store, thread safety is that of its callbacks. tg_limiter_new and
 * tg_limiter_destroy must not race with other calls on the same limiter. */
typedef struct tg_limiter tg_limiter;

/* Creates a limiter from *cfg (copied; NULL means all defaults) and stores it
 * in *out; starts the cleaning thread if clean_period_ms > 0 (memory and shm
 * stores). Returns TG_EINVAL for a bad algorithm, policy, on_full,
 * sliding_max_entries, capacity, long_keys, fallback_share or
 * deny_cache_entries, a custom store without its three callbacks, more than
 * one of custom_store, shm_name, redis and region, a region not 64-byte
 * aligned or, to be initialised, below tg_region_bytes(cfg), or a bad
 * tg_redis_config (pool_size, port, prefix, a username without a password,
 * cluster_nodes that do not parse or come with unix_path or a db other than
 * 0); TG_ENOTSUP for redis in a build without hiredis; TG_ENOMEM or
 * TG_ESTORE if memory or the thread cannot be had (for a shared segment: its
 * file system cannot hold the table's header and slots); for a
 * shared segment also TG_EPERM, TG_EMISMATCH, TG_ECORRUPT and TG_EBUSY
 * (another process kept the segment's creation lock for lock_timeout_ms;
 * "Shared memory" says when each applies). *out is then NULL and
 * tg_last_error() says why. A Redis limiter does not connect here: see "Redis
 * store" below. */
TG_EXTERN int tg_limiter_new(tg_limiter **out, const tg_config *cfg);
/* Stops the cleaning thread, frees the limiter and all key state it owns.
 * NULL is a harmless no-op. A cleaning pass in progress ends at its next
 * key, or, inside a call of before_clean, once that call returns (the keys
 * it was handed are reclaimed; the rest of the pass is not made, and no
 * other call of before_clean: the memory store's keys go with the limiter,
 * a shared segment's or region's stay for a later pass), so destroy waits
 * for at most one call of the hook. Called from before_clean on the
 * cleaning thread, it returns at once: the pass ends as that call returns,
 * then the thread frees the limiter (a caller's region must stay mapped
 * until then; nothing tells when, so unmap it elsewhere, after a destroy
 * made outside the hook). Never
 * from a hook that runs inside a call of yours (the decision hook, before_clean
 * under tg_clean): that call still uses the limiter. */
TG_EXTERN void tg_limiter_destroy(tg_limiter *lim);

/* ---- Operations -----------------------------------------------------------
 * Every operation validates its input first: lim, key and the output pointer
 * must be non-NULL (TG_EINVAL), 1 <= key_len <= TG_KEY_MAX (TG_EKEY), the
 * quota valid (TG_EQUOTA). Invalid input never changes any state.
 *
 * Each operation comes twice: reading the limiter's clock, and with an
 * explicit now_us ("_at"), for callers that read the time once per event-loop
 * turn and pass it down, and for replaying history. Time never moves a key's
 * stored state backwards: if now is earlier than what the key has seen, the
 * elapsed time is taken as 0. Concretely: a fixed window keeps counting in
 * the later window it has seen (retry_after_ms may then exceed the period);
 * a bucket measures its fill from the later time, so it can look fuller
 * than its burst and deny even a peek until time catches up; a sliding log
 * has already dropped entries that expired by the later time. Once the
 * memory (or shm) store has reclaimed a key, any key it does not hold,
 * reclaimed or never seen, is evaluated no earlier than the latest moment at
 * which a reclaimed state expired (the reclaim horizon), so a clock stepping
 * back cannot revive a reclaimed count as fresh (the first call's numbers
 * are then those at the horizon: its reset_after_ms short of the caller's
 * by the lag, and a bucket's remaining what it will be then); but never
 * further past the
 * call's now than the longest period (a bucket's: burst * T) of any key the
 * table has held, at most TG_PERIOD_MAX_MS: after a clock jump forward and
 * back, new keys run on the real time. A horizon beyond now +
 * TG_PERIOD_MAX_MS (or TG_NOW_MAX_US) is corrupt and is cleared, not obeyed.
 * The Redis store keeps a state until its TTL, counted on the server's
 * clock, and a fresh one (TTL 0: a full bucket, say after a tg_cancel gave
 * a reservation back) not at all after tg_cancel and after a write only
 * for the TTL's slack (the script's 2 ms, the module's rounding up to the
 * ms, or 1 s with a now you gave: see the Redis store), as a custom store
 * given TTL 0 need not keep one either: a later
 * call with an earlier now then may find no state there and is answered as
 * a never-seen key (allowed in full), where the memory and shm stores,
 * which keep the emptied key in its slot, measure from the later time they
 * saw. Only a now that steps back tells them apart. (A bucket whose
 * state was written at now 0 exactly, full, reads in the memory and shm
 * stores as a key never seen: their all-zero slot is "absent". Redis keeps
 * it, so after such a write only a now that steps back, to 0, tells the
 * stores apart there too.)
 *
 * Supported operations per algorithm (others are TG_ENOTSUP):
 *
 *   op          FIXED  PER_KEY  SLIDING  TOKEN  LEAKY
 *   hit          yes    yes      yes      yes    yes
 *   inc          yes    yes      -        -      -
 *   get          yes    yes      yes      yes    yes
 *   set          yes    yes      -        yes    yes
 *   expires_at   yes    yes      yes      yes    yes
 *   reset        yes    yes      yes      yes    yes
 */

/* Decides one call of `cost` units and, when allowed (or for the windows,
 * always), consumes it. cost 0 is a peek: it reports the same fields without
 * changing anything. A peek's `allowed` answers "may a call of cost 0 pass",
 * which is true unless the key is already over its limit (a fixed window that
 * counted denied calls); to know whether a real call would pass, read
 * `remaining`. TG_EOVERFLOW if a window count would pass 2^64 - 1. On success
 * returns 0 and fills *out. On error *out is still written: for a store
 * failure with the answer of tg_config.on_failure and degraded = true, for
 * invalid input as "not allowed, retry TG_NEVER". */
TG_EXTERN int tg_hit(tg_limiter *lim, const void *key, size_t key_len,
                     const tg_quota *q, uint64_t cost, tg_result *out);
TG_EXTERN int tg_hit_at(tg_limiter *lim, uint64_t now_us, const void *key,
                        size_t key_len, const tg_quota *q, uint64_t cost,
                        tg_result *out);

/* Windows only: adds cost to the key's count without checking the limit (for
 * work that happened anyway) and stores the new count in *count_out (may be
 * NULL). A per-key window that has ended is reopened at now. TG_EOVERFLOW if
 * the count would pass 2^64 - 1. */
TG_EXTERN int tg_inc(tg_limiter *lim, const void *key, size_t key_len,
                     const tg_quota *q, uint64_t cost, uint64_t *count_out);
TG_EXTERN int tg_inc_at(tg_limiter *lim, uint64_t now_us, const void *key,
                        size_t key_len, const tg_quota *q, uint64_t cost,
                        uint64_t *count_out);

/* Reads the key's value now without changing it: windows: count in the current
 * window (0 once the window index changes or a per-key window has ended);
 * sliding: sum of live costs; token bucket: whole tokens available (an unknown
 * key is full: burst); leaky bucket: level rounded up (unknown key: 0). */
TG_EXTERN int tg_get(tg_limiter *lim, const void *key, size_t key_len,
                     const tg_quota *q, uint64_t *value_out);
TG_EXTERN int tg_get_at(tg_limiter *lim, uint64_t now_us, const void *key,
                        size_t key_len, const tg_quota *q, uint64_t *value_out);

/* Sets the key's value: fixed window: the current window's count; per-key
 * window: re-anchors the window to [now, now + period) with that count; token
 * bucket: tokens available now; leaky bucket: level now. For the buckets the
 * value must be <= burst (TG_ERANGE otherwise). */
TG_EXTERN int tg_set(tg_limiter *lim, const void *key, size_t key_len,
                     const tg_quota *q, uint64_t value);
TG_EXTERN int tg_set_at(tg_limiter *lim, uint64_t now_us, const void *key,
                        size_t key_len, const tg_quota *q, uint64_t value);

/* Stores in *at_ms the absolute time, in ms since the epoch (rounded up), at
 * which the key is back to a fresh state: end of the current window (if the
 * key has a count in it, or for a per-key window, while it is active); expiry
 * of the newest sliding-log entry; when a token bucket is full again; when a
 * leaky bucket is empty. 0 when the key is fresh already. */
TG_EXTERN int tg_expires_at(tg_limiter *lim, const void *key, size_t key_len,
                            const tg_quota *q, uint64_t *at_ms);
TG_EXTERN int tg_expires_at_at(tg_limiter *lim, uint64_t now_us,
                               const void *key, size_t key_len,
                               const tg_quota *q, uint64_t *at_ms);

/* Deletes the key's state (it becomes fresh). Deleting an unknown key is not
 * an error. The next call on the key behaves exactly as on a key never seen,
 * at that call's own now (the reclaim horizon does not apply to it while
 * the emptied key is held, see below; once reclaimed it is a key the
 * table does not hold). The
 * memory and shm stores keep the emptied key in its slot until a cleaning
 * pass or a full table reclaims it (so it still counts in tg_key_count);
 * resetting takes no table lock, and for a sliding log only that log's
 * (TG_EBUSY after lock_timeout_ms). */
TG_EXTERN int tg_reset(tg_limiter *lim, const void *key, size_t key_len);

/* Number of keys the memory store currently holds (fresh keys, reset ones
 * included, are counted until they are reclaimed); 0 for a custom or Redis
 * store (they cannot tell). */
TG_EXTERN size_t tg_key_count(const tg_limiter *lim);

/* Bytes of memory the store has reserved for key state: the memory store's
 * slots and the long-key chunks and sliding logs mapped so far (it grows as
 * keys come, see tg_config.capacity); a shared segment's or the caller's
 * region's whole table; 0 for a custom or Redis store. */
TG_EXTERN size_t tg_store_bytes(const tg_limiter *lim);

/* ---- Batches --------------------------------------------------------------
 * Many decisions in one call: the same answers as calling tg_hit on each item
 * in order (one exception on the Redis store without its module: a script
 * flushed mid-batch, see "Redis store"), but the Redis store sends them all
 * in one pipelined round trip,
 * and the memory and shared-memory stores hash the keys of each group of
 * 16 items and start fetching their slots before deciding any, so that a
 * batch over keys not in cache waits for their memory accesses together
 * rather than one after another (other stores simply loop). The batch is not
 * atomic as a whole: each item is its own decision. Items may name the same
 * key; later items see earlier ones. With a deny cache (deny_cache_entries),
 * an item that shares a cache set with an item not yet sent sends the items
 * before it first, so that it sees their denials: a batch of k distinct keys
 * then takes more than one round trip when two of its keys share one of the
 * cache's sets (a quarter of its entries; about k^2 / (2 x sets) such
 * pairs). */
typedef struct tg_batch_item {
  const void *key;   /* in: key bytes */
  size_t key_len;    /* in */
  const tg_quota *q; /* in */
  uint64_t cost;     /* in */
  int status;        /* out: what tg_hit would have returned */
  tg_result result;  /* out: what tg_hit would have written */
} tg_batch_item;

/* Decides items[0..n) and fills each status and result. Returns 0 when every
 * item was decided (look at each status: like tg_hit, a store failure fills
 * the result from the failure policy), TG_EINVAL when lim is NULL or items
 * is NULL with n > 0 (then nothing is written). */
TG_EXTERN int tg_hit_batch(tg_limiter *lim, tg_batch_item *items, size_t n);
TG_EXTERN int tg_hit_batch_at(tg_limiter *lim, uint64_t now_us,
                              tg_batch_item *items, size_t n);

/* ---- Policies: several limits, one atomic decision ------------------------
 * A policy is an ordered list of rules, each a limiter (which gives the
 * algorithm and the store), a key, a quota and a cost: e.g. 5 per second
 * and 6 per minute on "user:42", or a token bucket per user and a fixed
 * window per day per tenant. tg_hit_rules decides the call on all of them
 * at once:
 *
 *   - it is allowed only if every rule allows it, and then each rule
 *     consumes its cost exactly as tg_hit would;
 *   - if any rule denies it, NOTHING is consumed anywhere, windows included:
 *     unlike tg_hit on a window, a denied policy call is not counted in any
 *     window (that is what makes a combination predictable: 5/s + 6/min
 *     admits exactly the calls both allow, and the minute is charged only
 *     for those);
 *   - the answer names the first rule that denied (denied_by) and the
 *     largest retry_after_ms of the rules that denied: the wait after which
 *     the whole policy passes, if nothing else happens (waiting never makes
 *     a rule stricter).
 *
 * Rules may use different algorithms (one limiter each) and different keys.
 * Every rule's limiter must use the same kind of store: memory and shared
 * memory limiters mix freely; custom-store limiters must share one custom
 * store (the same callbacks and ctx); Redis limiters must address the same
 * server and database, or the same Redis Cluster (equal cluster_nodes
 * strings), with key names in one Cluster slot (see below). Two
 * rules may not name the same state (the same key on limiters that share a
 * table or a custom store, or the same Redis key name). Anything else is
 * TG_EINVAL and decides nothing: denied_by names the first rule that does
 * not fit with those before it, whose status is TG_EINVAL and whose
 * limiter counts it in errors (after every rule's own input was found
 * valid: invalid input is reported first, wherever it is).
 *
 * Concurrency. Memory and shm: no lock is added (a process that dies
 * cannot leave a policy's lock held). A decision first checks every rule
 * without writing; if one denies, it writes nothing. Otherwise it applies
 * the rules in order, each with one compare-and-swap from the state its
 * check saw (a sliding log under its own lock); a rule that changed in
 * between is checked again, and if it now denies, the rules already applied
 * are given back, in reverse order, and the call is denied. So concurrent
 * callers may briefly see a rule's consumption that is then given back, and
 * under contention a policy admits AT MOST what some serial order of the
 * same calls would admit, never more; a denied policy call leaves no
 * consumption behind. Giving back is exact for windows and sliding logs
 * (the cost is subtracted where it was added). For the buckets it is exact
 * unless calls on the same key with later times landed in between, which
 * can only make the bucket stricter; with the _at function those later
 * times must not exceed the policy's now for that to hold. A bucket on
 * which reservations (tg_reserve) are queued when it is given back gives
 * back only what none of them is queued behind, as tg_cancel does: they
 * keep their times and no later caller is promised one of them again,
 * at the price of a hole in the queue (stricter). One race is not
 * covered: a tg_reset or tg_set of a rule's key between its consumption
 * and its giving back (the policy's own call, between two of its rules)
 * leaves the key's incarnation as it was, so the
 * cost given back can come off what calls after the reset added: that
 * key then admits at most that rule's cost more, once. Custom store:
 * every rule's key is locked (lock_and_get) in one fixed order (by key
 * bytes), all are decided, then each is stored (set_and_unlock) or
 * unlocked: nothing is ever given back (see "Custom stores" below).
 * Redis with the tollgate module loaded (redis-module/; found once per
 * connection): one command, TG.STEPS, checks every rule and, when the
 * policy passes, consumes in every rule that allowed, atomically, on the
 * server's clock, and answers the values it found; the rules are then
 * decided here by the same core on those values (its verdict must be the
 * server's). Redis without the module: the same in one script call
 * (EVALSHA), which reads the server's TIME once, checks every rule, writes
 * every rule that allowed only when the policy passes, and answers the
 * values it found, decided here as TG.STEPS's are. Either way one round
 * trip per decision, never retried; nothing is ever written that is given
 * back, and every number is the core's.
 *
 * Redis Cluster and hash tags: the store names a key prefix ":{" key "}:"
 * algorithm, so a name's Cluster slot is that of its key bytes up to the
 * first "}" (the hash tag; a key that starts with "}" makes an empty tag,
 * which Redis ignores: its names then hash whole, each algorithm's to its
 * own slot). A policy's names must all be in one slot, or it
 * is TG_EINVAL (denied_by names the first rule out of place), on one server
 * too (so a policy that works there works on a Cluster): give the keys
 * of one policy a common beginning ended by "}", e.g. "acme}user:42" and
 * "acme}tenant" (tag "acme"). The same key under two algorithms is two
 * names in one slot.
 *
 * Failures: a store failure on any rule stops the decision; rules applied
 * before it are given back (best effort: a failure while giving back leaves
 * that consumption), the function returns the code, denied_by names the
 * rule, and the answer (and every rule's result) is that rule's limiter's
 * failure policy answer with degraded = true; in shadow mode (that rule's
 * limiter's, or TG_RULES_SHADOW) shadow mode's answer to it: allowed,
 * shadow_denied when the failure policy denied. Invalid input is never
 * turned into an allowed answer, in shadow mode either.
 *
 * Shadow mode: a rule whose limiter is in shadow mode (tg_config.shadow)
 * is decided and recorded but does not deny the call: the call is decided
 * on the other rules, and when they allow it every rule that allowed
 * consumes (a shadow rule that denied consumes nothing); the answer is
 * allowed with shadow_denied set. With TG_RULES_SHADOW the whole call is
 * decided and recorded exactly as without it (a denied call consumes
 * nothing) and answered allowed, shadow_denied saying it was denied.
 *
 * Custom stores: a policy holds all its keys' locks at once, taken in key
 * order (bytes, then length). A store whose keys share locks (stripes, like
 * examples/custom_store_map.c) must let the thread that holds a lock take
 * it again for another key (a recursive lock), and must not block forever
 * in lock_and_get: two policies may meet holding shared locks in opposite
 * orders. A lock that answers TG_CUSTOM_BUSY makes the policy let go of
 * every lock and try again, up to 6 times (50 us to 800 us apart), then
 * answer TG_EBUSY. If set_and_unlock fails for one key after others were
 * stored, those stay consumed (the call answers TG_ESTORE). */

/* Most rules in one policy. */
#define TG_RULES_MAX 16
/* denied_by when no rule denied. */
#define TG_RULE_NONE SIZE_MAX
/* tg_hit_rules flags: the whole decision in shadow mode. */
#define TG_RULES_SHADOW 1u
/* tg_reserve_rules (and tg_nb_submit_rules) flags: every rule's wait is in
 * nanoseconds, not milliseconds (at most TG_PERIOD_MAX_MS * 10^6, else
 * TG_EINVAL): for a queue bounded to less than a millisecond, such as
 * limit_req's burst=B at more than 1,000 per second, where B emission
 * intervals rounded up to a millisecond would admit more than B. */
#define TG_RULES_WAIT_NS 2u

/* A rule of a policy. The Out fields need no initial value: tg_hit_rules
 * and tg_reserve_rules write them (except when they refuse the call as a
 * whole, rules or out NULL or n or flags out of range, and leave them as
 * they were). In a hot loop, set the five In fields rather than
 * initialising the whole struct: gcc 12 clears two rules' zeroed results
 * with a `rep stos`, 10-13 ns of a 98-111 ns two-rule decision on the
 * bench machine (BENCHMARKS.md, "Policies and counters"). */
typedef struct tg_rule {
  /* In: the rule's limiter (algorithm, store, clock). */
  tg_limiter *lim;
  /* In: the key bytes, the quota and the cost this call has under this
   * rule. */
  const void *key;
  size_t key_len;
  const tg_quota *q;
  uint64_t cost;
  /* Out: 0, or why this rule failed (invalid input, or its store's
   * failure). */
  int status;
  /* Out: this rule's own answer. Allowed call: what tg_hit would answer
   * (the cost consumed). Denied call: allowed says whether this rule alone
   * would allow it, retry_after_ms is its own wait, and count, remaining and
   * reset_after_ms describe the key as the call left it (unchanged). */
  tg_result result;
} tg_rule;

typedef struct tg_rules_result {
  /* The policy's answer: allowed when every rule (but shadow ones) allowed;
   * count of the tightest rule; remaining the least of the rules' (the
   * cost-1 calls the whole policy would still allow); retry_after_ms the
   * largest of the denying rules' (TG_NEVER if one never passes; 0 when
   * allowed); reset_after_ms the largest; degraded, shadow_denied as for one
   * rule. */
  tg_result r;
  /* Index of the first rule that denied (or failed); TG_RULE_NONE when none
   * did. */
  size_t denied_by;
  /* Index of the rule with the fewest remaining (the first of equals): the
   * one to report in a header. */
  size_t tightest;
} tg_rules_result;

/* Decides one call on rules[0..n) (1 <= n <= TG_RULES_MAX) as described
 * above, filling each rule's status and result and *out. now is read once,
 * from rules[0].lim's clock (a Redis policy uses the server's TIME). Input
 * is validated first, rule by rule, as tg_hit would (then the stores'
 * compatibility): an invalid rule makes the function return its code with
 * that rule's status set and denied_by naming it, and nothing changes.
 * Returns 0 when the policy was decided (look at out->r.allowed), else a
 * TG_E* code as described above (never TG_EOVERFLOW: a window rule whose
 * count would pass 2^64 - 1 denies, counting nothing, where tg_hit, which
 * counts denials, returns it). flags: 0 or TG_RULES_SHADOW. */
TG_EXTERN int tg_hit_rules(tg_rule *rules, size_t n, unsigned flags,
                           tg_rules_result *out);
TG_EXTERN int tg_hit_rules_at(uint64_t now_us, tg_rule *rules, size_t n,
                              unsigned flags, tg_rules_result *out);

/* ---- Reservations: delay instead of reject --------------------------------
 * For the two buckets (other algorithms: TG_ENOTSUP). tg_reserve takes the
 * next slot now and says when the caller may go: it consumes the cost at
 * once, queueing behind earlier reservations, and answers delay_ns, the
 * wait before the work may run (0: at once). A reservation whose delay
 * would exceed max_wait_ms is refused and consumes nothing. Reservations
 * are spaced exactly as GCRA spaces calls: at rate limit per period_ms
 * (emission interval T ns, see "Algorithms"), N reservations of cost 1
 * made at the same moment on a bucket with burst b get delays 0 (b of
 * them), then T, 2T, 3T... exactly, to the nanosecond. Later tg_hit calls
 * on the key see the queued reservations' cost (they wait behind them).
 *
 * This is nginx limit_req's queue: with the rate r = limit per period_ms,
 *   limit_req ... burst=B nodelay;  is a bucket of burst B + 1 and tg_hit
 *                                   (excess calls pass at once, or 429);
 *   limit_req ... burst=B;          is tg_reserve on a bucket of burst 1,
 *                                   max_wait_ms = B * T (in ms): up to B
 *                                   calls wait their turn, one per T;
 *   limit_req ... burst=B delay=D;  is tg_reserve on a bucket of burst
 *                                   D + 1, max_wait_ms = (B - D) * T: the
 *                                   first D excess calls pass at once, the
 *                                   next B - D wait.
 *
 * tg_cancel gives back a reservation that will not be used (the work was
 * abandoned): the cost is returned, but only as far as no reservation made
 * after it was scheduled behind it (their times are promised) and its time
 * has not already passed; so cancelling never lets later calls closer than
 * the rate allows. Cancelling twice, or a refused reservation, does
 * nothing. The exception, as for a policy's give-back (see "Policies"): a
 * tg_reset or tg_set of the key between the reservation and its cancel
 * (or, on Redis or a custom store, the key deleted there by other means,
 * which the memory and shm stores' slot generation would catch);
 * the cancel can then give back a later reservation's slot (burst 1: a
 * reservation, a reset, another at once, the first cancelled, and a third
 * goes at once too), at most the cancelled cost, once. Shadow mode: the
 * reservation is made as usual, but the answer is always ok with delay 0,
 * shadow_denied saying the real answer was a refusal or a delay. On Redis a
 * reservation or a cancel reads the key and writes it back only if it did not
 * change (two round trips; the server's TIME), where a policy of
 * reservations is one command (TG.STEPS, or the script). */
typedef struct tg_reservation {
  /* Reserved: the cost is consumed; go after the delay. */
  bool ok;
  /* The exact wait, ns (0 when not ok), and the same rounded up to ms. */
  uint64_t delay_ns;
  uint64_t delay_ms;
  /* allowed = ok; count, remaining (0 while reservations queue),
   * reset_after_ms after the reservation; retry_after_ms when refused: the
   * wait after which the same reservation would be accepted. */
  tg_result result;
  /* For tg_cancel: do not change. */
  uint64_t private_[6];
} tg_reservation;

/* Reserves cost units of the key's bucket, waiting at most max_wait_ms (at
 * most TG_PERIOD_MAX_MS, else TG_EINVAL, once the rest of the input passed
 * tg_hit's checks). Validates like tg_hit; a cost
 * above the burst is never accepted (ok false, retry TG_NEVER). On a store
 * failure the failure policy decides ok (degraded = true, delay 0). */
TG_EXTERN int tg_reserve(tg_limiter *lim, const void *key, size_t key_len,
                         const tg_quota *q, uint64_t cost, uint64_t max_wait_ms,
                         tg_reservation *out);
TG_EXTERN int tg_reserve_at(tg_limiter *lim, uint64_t now_us, const void *key,
                            size_t key_len, const tg_quota *q, uint64_t cost,
                            uint64_t max_wait_ms, tg_reservation *out);

/* Gives back reservation *res made on this key with this quota (as
 * described above). A reservation that was not ok, or was already
 * cancelled, is a no-op; *res is marked cancelled. */
TG_EXTERN int tg_cancel(tg_limiter *lim, const void *key, size_t key_len,
                        const tg_quota *q, tg_reservation *res);
TG_EXTERN int tg_cancel_at(tg_limiter *lim, uint64_t now_us, const void *key,
                           size_t key_len, const tg_quota *q,
                           tg_reservation *res);

/* ---- Policies of reservations: several limits, one delay ------------------
 * tg_reserve_rules is tg_hit_rules (see "Policies") in which a rule may
 * reserve: rule i waits at most max_wait_ms[i] (0: a plain hit, as in
 * tg_hit_rules; above 0 only for the two buckets, else TG_ENOTSUP for that
 * rule; at most TG_PERIOD_MAX_MS, else TG_EINVAL). It is nginx's limit_req
 * with several lines in one location:
 *
 *   - a bucket rule with a wait passes when its reservation would be
 *     accepted (its delay <= its max_wait_ms), any other rule as in
 *     tg_hit_rules; the call passes only if every rule passes, and then
 *     every rule consumes (a reserving rule queues, as tg_reserve does);
 *   - if any rule refuses, NOTHING is consumed anywhere (on memory and
 *     shm, under contention, a bucket rule taken before a later rule lost
 *     its race is given back as tg_cancel gives back: reservations other
 *     callers queued behind it since keep their times, and the part they
 *     are queued behind stays consumed, a hole: stricter, never looser;
 *     see "Policies", Concurrency); the answer names
 *     the first rule that refused (denied_by) and the largest
 *     retry_after_ms of the rules that refused (a reserving rule's is the
 *     wait after which the same reservation would be accepted);
 *   - the call's delay is the largest of its rules' delays: the caller goes
 *     after it (each rule's own delay is in its receipt, below).
 *
 * The decision is made exactly as tg_hit_rules's (the same stores, the same
 * concurrency: on memory and shm an optimistic check then take, a rule that
 * changed meanwhile decided again and, if it now refuses, the rules taken
 * given back; so concurrent callers admit at most what some serial order
 * of the same calls would). Every rule's status and result are filled as
 * tg_hit_rules fills them (an accepted reservation's result is allowed).
 * Stores: every store. On Redis (and Redis Cluster) the policy is one
 * command, as tg_hit_rules's: the script's P with each waiting bucket's
 * tolerance stretched by its wait, or the module's TG.STEPS with each
 * rule's wait as an eighth argument (policies without a wait are sent as
 * before). A server whose tollgate module predates that argument refuses
 * it: the connection then turns to the script, as when the module is
 * unloaded, and the policy is decided there the same (tg_nb_submit_rules
 * asks the module whether it takes waits when it connects, and sends such
 * a policy to the script from the start when it does not).
 *
 * Shadow mode: a rule whose limiter is in shadow mode does not refuse the
 * call (as in tg_hit_rules) and delays nothing: when its reservation was
 * accepted with a delay its result says shadow_denied, and its delay is not
 * the call's. With TG_RULES_SHADOW the call is decided and recorded as
 * without it and answered ok with delay 0, rules.r.shadow_denied saying
 * that the real answer was a refusal or a delay.
 *
 * Receipts: res, when not NULL, is an array of n tg_reservation that
 * receives each rule's: ok (the call really passed and this rule
 * consumed: in shadow mode a call answered ok may have consumed nothing,
 * and a shadow rule that denied consumed nothing), the rule's own delay
 * (with TG_RULES_SHADOW, what it would have waited; the call's is 0), its
 * result, and what tg_cancel_rules needs to give the
 * rule back (all zero when the call is refused as a whole, unless n is
 * above TG_RULES_MAX). tg_cancel_rules gives back a policy's reservation that
 * will not be used (e.g. nginx: the client went away while its request waited):
 * each bucket rule's consumption is cancelled as tg_cancel does (only as far as
 * no later reservation was scheduled behind it), in reverse rule order; a
 * rule on another algorithm stays consumed (a window cannot take a call
 * back once others may have counted on it: like tg_hit's). */
typedef struct tg_rules_reservation {
  /* The call passed: every rule consumed (but shadow rules that denied);
   * go after the delay. In shadow mode (TG_RULES_SHADOW) always true: go
   * now, rules.r.shadow_denied saying whether it really passed. */
  bool ok;
  /* The largest of the rules' delays, ns (0 when not ok), and the same
   * rounded up to ms. */
  uint64_t delay_ns;
  uint64_t delay_ms;
  /* The policy's answer, as tg_hit_rules's (rules.r.allowed = ok). */
  tg_rules_result rules;
} tg_rules_reservation;

/* Decides one call on rules[0..n) (1 <= n <= TG_RULES_MAX), rule i waiting
 * at most max_wait_ms[i] (max_wait_ms NULL: 0 for every rule), as
 * described above; now is read once, as in tg_hit_rules. res: NULL, or n
 * receipts to fill. Returns 0 when the call was decided (look at out->ok),
 * else a TG_E* code as tg_hit_rules returns them (an invalid wait: that
 * rule's TG_EINVAL or TG_ENOTSUP), with nothing
 * consumed and no receipt to cancel. flags: TG_RULES_SHADOW,
 * TG_RULES_WAIT_NS, both or 0 (another bit: TG_EINVAL, the call refused
 * as a whole). */
TG_EXTERN int tg_reserve_rules(tg_rule *rules, size_t n,
                               const uint64_t *max_wait_ms, unsigned flags,
                               tg_rules_reservation *out, tg_reservation *res);
TG_EXTERN int tg_reserve_rules_at(uint64_t now_us, tg_rule *rules, size_t n,
                                  const uint64_t *max_wait_ms, unsigned flags,
                                  tg_rules_reservation *out,
                                  tg_reservation *res);

/* Gives back the reservation res[0..n) that tg_reserve_rules made on these
 * rules (the same limiters, keys and quotas), as described above. Receipts
 * of a call that was not ok, or already cancelled, do nothing; each
 * receipt cancelled is marked so. Returns 0, or the first failure's code
 * (every rule is still tried); TG_EINVAL when rules or res is NULL or
 * n > TG_RULES_MAX. */
TG_EXTERN int tg_cancel_rules(tg_rule *rules, size_t n, tg_reservation *res);
TG_EXTERN int tg_cancel_rules_at(uint64_t now_us, tg_rule *rules, size_t n,
                                 tg_reservation *res);

/* ---- Shadow mode ----------------------------------------------------------
 * A limiter with tg_config.shadow = true (or a policy decided with
 * TG_RULES_SHADOW) decides and records every call exactly as it would for
 * real (state, counters, the hook), and answers allowed whatever the real
 * answer, with result.shadow_denied = true when the real answer was a denial
 * (the other fields keep the real numbers, so retry_after_ms may be
 * non-zero). This is how a new limit is rolled out: watch shadow_denied (or
 * the counter of the same name) before enforcing it. A store failure in shadow
 * mode also answers allowed (shadow_denied when the failure policy would have
 * denied); the function still returns the failure's code. */

/* ---- Counters and the decision hook ---------------------------------------
 * Every limiter counts its decisions (tg_hit, batch items, rules of a
 * policy, reservations; a tg_nb its own), always: the counters are kept per
 * thread (in cache-line sized shards), so counting costs a decision no shared
 * write. tg_limiter_stats adds the shards up; counts taken while decisions run
 * are each exact at some moment during the call, not one snapshot. A rule
 * of a policy counts on its own limiter by its own verdict: allowed when it
 * allowed and the call passed, denied when it denied; a rule that allowed
 * a call another rule denied counts in neither.
 *
 * The hook (tg_config.on_decision) sees decisions after they are made: all
 * of them, or one in on_decision_every (counted per thread, so the first
 * decision of each thread is passed; threads beyond the 63rd alive at once
 * share one count), of all decisions or of only denials,
 * shadow denials and failures (on_decision_denied_only): enough to log
 * refusals without logging every request. */

/* One decision as the hook sees it. Everything is valid only during the
 * call. */
struct tg_decision {
  const void *key; /* key bytes (not NUL-terminated) */
  size_t key_len;
  tg_algorithm algorithm;
  const tg_quota *q;
  uint64_t cost;
  int status;              /* what the call returned (0 or a TG_E* code) */
  const tg_result *result; /* what it answered */
  bool in_rules;           /* a rule of tg_hit_rules: result is the rule's */
};

/* A limiter's counters. Fields are only ever appended. */
typedef struct tg_stats {
  /* Decisions answered allowed (shadow mode: by the real answer). */
  uint64_t allowed;
  /* Decisions the limit denied (not in shadow mode). */
  uint64_t denied;
  /* Shadow mode: let through, would have denied; a reservation too that
   * would have waited (what its result's shadow_denied says; not counted
   * in allowed). */
  uint64_t shadow_denied;
  /* Answers the failure policy gave. */
  uint64_t degraded;
  /* Decisions that found the table full (TG_EFULL). */
  uint64_t table_full;
  /* Keys this limiter's cleaning passes (tg_clean, the thread) reclaimed. */
  uint64_t reclaimed;
  /* Decision calls that returned code c, at errors[-c] (errors[0] is
   * unused): invalid input and store failures alike. */
  uint64_t errors[32];
  /* Decisions the deny cache answered without asking the store (see
   * "Surviving a store outage"); also counted as denials. */
  uint64_t deny_cache_hits;
  /* Decisions TG_POLICY_FALLBACK made locally while the store failed; also
   * counted in degraded and errors[]. */
  uint64_t fallback_decisions;
  /* Redis Cluster: MOVED and ASK redirections followed. */
  uint64_t moved;
  uint64_t ask;
  /* Redis Cluster store and tg_nb: calls sent again because the server said
   * they had not run (NOSCRIPT, the module unloaded) or a connection was
   * lost before they were written to it in full (counted as they are
   * sent again). */
  uint64_t resent;
  /* Redis Cluster: slot maps fetched. */
  uint64_t slot_refreshes;
} tg_stats;

/* Copies the limiter's counters into *out, at most size bytes of it (pass
 * sizeof(tg_stats) as your program knows it: fields are only appended).
 * TG_EINVAL for a NULL argument or size 0. Safe while other threads decide. */
TG_EXTERN int tg_limiter_stats(const tg_limiter *lim, tg_stats *out,
                               size_t size);

/* ---- Cleanup --------------------------------------------------------------
 * The memory store reclaims keys whose state has decayed to "fresh" (an
 * ended window, a full token bucket, an empty leaky bucket or log): such a key
 * is indistinguishable from an unknown one, so reclaiming it changes no
 * answer. A cleaning pass reclaims those that have been fresh for at least
 * key_older_than_ms; the background thread runs one every clean_period_ms;
 * tg_clean() runs one by hand. When the table is full, a new key first
 * reclaims fresh keys near the insert cursor, whatever their age, without
 * calling before_clean: it scans at most 4096 slots from a cursor that moves
 * on with each attempt, so in a table larger than that a new key can get
 * TG_EFULL while decayed keys remain elsewhere (the next attempts scan
 * further; a cleaning pass reclaims them all). The scan is bounded so that
 * a stream of new keys cannot make each refusal cost O(capacity), but it is
 * still work under the table lock (BENCHMARKS.md has its cost): give
 * capacity room above the keys live at once. With tg_config.on_full =
 * TG_FULL_EVICT a new key that finds no decayed key there evicts a live one
 * instead of being refused (see tg_full). A key emptied by tg_reset is
 * reclaimed like any fresh key, but not handed to before_clean (it has
 * nothing to report). */

/* One expired entry handed to before_clean (tg_before_clean_fn, under
 * "Limiter configuration"). The key bytes are valid only for the duration
 * of the call. */
struct tg_expired {
  const void *key; /* key bytes (not NUL-terminated) */
  size_t key_len;
  /* Windows: the count of the ended window; sliding: the cost left in the
   * log; buckets: 0. */
  uint64_t value;
  uint64_t expired_at_ms; /* when the state became fresh, ms since epoch */
};

/* Runs one cleaning pass now (memory store): keys whose state has been fresh
 * for at least key_older_than_ms are handed to before_clean and reclaimed.
 * *removed (may be NULL) receives how many were reclaimed. If another pass is
 * running it returns 0 at once with nothing removed. TG_ENOTSUP for a custom
 * or Redis store (they expire keys by their TTL). TG_EBUSY when a shared
 * table's lock stayed held by another process for lock_timeout_ms (the pass
 * stops; *removed counts what it reclaimed before). */
TG_EXTERN int tg_clean(tg_limiter *lim, size_t *removed);
TG_EXTERN int tg_clean_at(tg_limiter *lim, uint64_t now_us, size_t *removed);

/* ---- Custom store ---------------------------------------------------------
 * Keep state wherever you like; tollgate does the arithmetic. Per call,
 * tollgate calls lock_and_get, computes, then exactly one of set_and_unlock
 * (the state changed, pruning a log included) or unlock (it did not), from
 * the same thread and before the tollgate call returns; nothing is called
 * after BUSY or ERROR. Callbacks may be called from any thread that uses the
 * limiter, concurrently for different keys. TTLs are relative to the now of
 * the call: a caller driving its own times (the _at functions) should give
 * the store the same clock.
 *
 * One key space. The callbacks see key bytes only, so every limiter on one
 * store shares its keys whatever its algorithm (the memory store gives each
 * limiter a table, Redis each algorithm its own name): a state written by
 * one algorithm (or one sliding_max_entries) reads as TG_ECORRUPT to
 * another, answered by the failure policy, fail-open by default. Give each
 * limiter's keys their own prefix. A TTL is computed under the quota of
 * the call that wrote the state: a store that deletes at the TTL can
 * forget a state that a later call under a longer period would still
 * count (a sliding log, a window written at count 0), so answers differ
 * from the memory store's when a key's quota changes; keep one quota per
 * key, or delete later than the TTL.
 *
 * The serialised state is documented and versioned (little-endian):
 *   byte 0      format version, 1
 *   byte 1      algorithm (tg_algorithm)
 *   bytes 2-3   0
 *   bytes 4-7   u32 number of log entries n (sliding window; else 0)
 *   windows     u64 window end (us since epoch), u64 count
 *   buckets     u64 theoretical arrival time (ns since epoch), u64 0
 *   sliding     n x (u64 time (us since epoch), u64 cost), oldest first
 * so it is at most 8 + 16 * max(1, sliding_max_entries) bytes. State that
 * does not parse is TG_ECORRUPT (never a crash). */
enum {
  TG_CUSTOM_OK = 0,        /* locked; the state was copied */
  TG_CUSTOM_NOT_FOUND = 1, /* locked; the key has no state */
  TG_CUSTOM_BUSY = 2,      /* the lock could not be taken: nothing is held */
  TG_CUSTOM_ERROR = 3      /* failure: nothing is held */
};

struct tg_custom_store {
  /* Locks the key and copies its state (at most cap bytes) into buf, setting
   * *len. A state longer than cap must not be cut short: set *len to its
   * full length (tollgate answers TG_ECORRUPT) or return TG_CUSTOM_ERROR.
   * Returns a TG_CUSTOM_* code. */
  int (*lock_and_get)(void *ctx, const void *key, size_t key_len, void *buf,
                      size_t cap, size_t *len);
  /* Stores len bytes as the key's state and unlocks. ttl_ms is how long the
   * state matters: after it the state is fresh and may be deleted; 0 means
   * it is fresh already (delete it now if you like). Returns TG_CUSTOM_OK or
   * TG_CUSTOM_ERROR (then the lock must still be released). */
  int (*set_and_unlock)(void *ctx, const void *key, size_t key_len,
                        const void *data, size_t len, uint64_t ttl_ms);
  /* Releases the lock without changing the state. */
  void (*unlock)(void *ctx, const void *key, size_t key_len);
  void *ctx; /* passed to every callback; owned by the caller */
};

/* ---- Shared memory --------------------------------------------------------
 * A limiter with shm_name keeps its table in a named POSIX shared-memory
 * segment (shm_open + mmap; on Linux, a file in the tmpfs /dev/shm) instead
 * of private memory: every limiter on the host that names it shares one
 * limit, whatever process it is in (pre-fork servers, worker pools,
 * unrelated programs of the same user). There is no master process. The
 * first limiter to open the name creates the segment with its algorithm,
 * capacity, long_keys and sliding_max_entries; the others attach to it.
 * Creation is serialised by a lock on the segment (flock), so processes
 * starting together get one table. What a process can rely on, and against
 * whom, follows.
 *
 * Opening. A segment this limiter creates gets exactly shm_mode (O_EXCL,
 * whatever the umask); attaching does not change an existing one's mode. An
 * existing segment is used only if it is a regular file owned by this
 * process's effective user whose mode has no bits beyond shm_mode: anything
 * else (a segment another user created first, a 0666 one, a FIFO or a link)
 * is TG_EPERM and is left untouched, so nobody can plant one in advance and
 * keep write access to our limits. TG_EMISMATCH: the segment was created
 * with another algorithm, capacity, long_keys or sliding_max_entries (a
 * long_keys of 0 counts as equal to capacity), by a tollgate with another
 * table format (unlink it to start afresh), or in another PID namespace
 * (below). The rest of the configuration (clock, failure policy, cleaning,
 * lock_timeout_ms, on_full) belongs to each limiter and may differ.
 * TG_ECORRUPT: the name holds something that is not a sound tollgate table
 * (another program's segment, a file of the wrong size), left untouched.
 * TG_EBUSY: another process has held the creation lock for
 * lock_timeout_ms. TG_EINVAL: a name shm_open refuses (empty, "/" alone, a
 * "/" after the first character, too long). tg_last_error() says which.
 *
 * Lifetime. The segment outlives the processes that use it (a restarted
 * worker finds the counts its predecessor left) but not a reboot.
 * tg_limiter_destroy only unmaps it. tg_shm_unlink removes the name:
 * limiters already attached keep working, and sharing, until destroyed, and
 * the memory goes with the last of them; a limiter opening the name
 * afterwards creates a new, empty table. Nothing removes the name by itself
 * (the tollgate program lists and removes segments: tollgate shm ls, rm).
 *
 * Memory, and a full file system (Docker's /dev/shm is 64 MiB, and any
 * local user can fill /dev/shm). The whole table is sized at creation
 * (tg_store_bytes tells how much). Its header and slots (about 55 bytes
 * per key of capacity) are reserved then (posix_fallocate, on
 * every attach too): a file system too small for them is TG_ENOMEM from
 * tg_limiter_new. Long keys' chunks and sliding-log blocks are reserved a
 * page at a time as they are first used. A log keeps its entries at the
 * start of its ring while they fill at most half of its first page or two
 * (64 entries or more), so a log holding a few entries costs one or two
 * pages, however large sliding_max_entries and however long it lives; one
 * holding more takes pages as its entries reach them, up to its whole ring.
 * A new key whose memory cannot be had, or a log whose next entry needs a
 * page that cannot be had, is TG_ENOMEM through the failure policy
 * (decayed keys are reclaimed first, and their memory reused). Never a SIGBUS:
 * touching memory the file system cannot supply would raise one, and tollgate
 * never does. Each limiter on a segment keeps its file descriptor open for
 * this.
 *
 * Cleaning. Each limiter with clean_period_ms > 0 runs its own cleaning
 * thread; a pass that finds another process's pass running returns at
 * once. A key reclaimed in one process is gone for all of them.
 *
 * Crash safety. A decision on an existing window or bucket key is one
 * 16-byte compare-and-swap on the key's state: a process killed at any
 * instruction has either made its update or not, and holds no lock.
 * Creating and reclaiming keys take the table's lock, and a sliding log
 * takes its own. These are tollgate's own locks, never a C library's mutex
 * state: one 64-bit word naming the holder (its pid and start time), taken
 * with a compare-and-swap and slept on with a futex. When a process dies
 * holding one (or exits, or its pid is reused by another process), the next
 * process that needs it takes it over and repairs what it guards: the table
 * finishes any reclaim the dead process left half done and recounts its
 * keys, and a log drops the slots a half-written step exposed and
 * recomputes its sum (the decision of the call that died may or may not
 * stay counted; its caller never saw it). A long-key chunk or log block
 * that was being handed out at that instant can be lost to the table. A
 * process that dies while creating the segment leaves it without its magic
 * number, and the next process to open the name with the same
 * configuration initialises it again (one with another size gets
 * TG_ECORRUPT until the name is unlinked).
 *
 * Lock timeouts. A lock held by a live process is waited for, and one
 * operation waits at most lock_timeout_ms (default 2 s) in all, however
 * many locks and retries it needs (reset and cleaning included); then it
 * returns TG_EBUSY and the failure policy answers. With 0 it never waits (a
 * dead holder's lock is still taken over). No operation holds the table's
 * lock while it waits for a log's, so a process stopped inside one key's
 * log delays that key's callers only.
 *
 * Any bytes in the segment (a bug, a process killed half way, or a process
 * that may write it): tollgate does not crash, abort or hang. Indices and
 * counts are range-checked before use; every lock word is either a live
 * holder, waited for within the bound, or taken over; state that makes no
 * sense is TG_ECORRUPT for the calls that meet it. A sliding log is met
 * where a call reads it: its bounds, its newest entry, the entries the call
 * expires and the first it keeps (their order, their costs within the sum),
 * and a denial that no entry can account for (a sum larger than all of
 * them); an entry
 * further in is checked by the call that reaches it, so a decision costs
 * the entries it reads, not the whole log. The reclaim horizon (see
 * "Operations") cannot be kept years ahead: a key the table does not hold
 * is evaluated no earlier than the latest expiry of a reclaimed state, but
 * never further past the call's time than the longest period any key has
 * had, and a value beyond what any valid clock could write is cleared.
 * (The counts themselves are only as right as the writers.)
 *
 * Not guaranteed: a process that may write the segment (the same user, or
 * a group that shm_mode 0660 lets in) can change any count, fill the table,
 * or hold a lock so that operations answer TG_EBUSY after lock_timeout_ms;
 * it can also truncate the file or punch holes in it, after which touching
 * the lost pages raises SIGBUS (a file's size cannot be checked on every
 * access). With the default shm_mode 0600 only the same user, who could
 * ptrace the process anyway, can write it. Lock owners are process ids, so
 * a segment created in another PID namespace is refused (TG_EMISMATCH):
 * containers share a segment only if they share the PID namespace. A
 * process that calls execve while one of its threads holds a tollgate lock
 * still looks alive to the others (same pid, same start time): that lock is
 * waited for, then TG_EBUSY, until the process exits. */

/* Removes the name of a shared-memory segment: new limiters can no longer
 * attach to it, while those attached keep working until destroyed (the
 * memory is freed with the last one). Removing an absent name is not an
 * error. TG_EINVAL for a malformed name. */
TG_EXTERN int tg_shm_unlink(const char *name);

/* ---- A table in the caller's memory ---------------------------------------
 * For a server that allocates shared memory itself (nginx's shared zones, or
 * a MAP_SHARED | MAP_ANONYMOUS mapping made before fork()): tg_config.region
 * and region_bytes place the table there.
 *
 * tg_limiter_new initialises the region when it does not hold a tollgate
 * table (its first 8 bytes are not a table's magic: whatever is there is
 * overwritten, the first tg_region_bytes(cfg) bytes zeroed), and attaches
 * when it holds one made with the same algorithm, capacity, long_keys and
 * sliding_max_entries: then nothing in it changes, keys and counts are
 * kept. A table made with other parameters (whatever region_bytes they
 * would need), by another format version or in another PID namespace is
 * TG_EMISMATCH, one whose header is not sound TG_ECORRUPT, and the region is
 * left as it was. A region to initialise must have tg_region_bytes(cfg)
 * bytes, and one to attach to at least the bytes of the table it holds
 * (TG_EINVAL otherwise). tg_limiter_destroy leaves
 * the region alone (it is the caller's, and so is unmapping it; but not
 * from before_clean, whose pass goes on in the region after a destroy
 * there returns: see tg_limiter_destroy). So a server
 * that re-reads its configuration keeps the counts by creating a new limiter
 * on the same region, and learns from TG_EMISMATCH that the parameters
 * changed.
 *
 * The region is shared between processes with the guarantees of a shm
 * segment ("Shared memory" above) against killed processes and any bytes:
 * the locks are tollgate's own, owned by a pid and its start time, so a
 * process killed at any instruction leaves no lock held for good, and every
 * wait is bounded by lock_timeout_ms. A limiter may be created before fork()
 * and used in the children (the table is addressed by offsets, and each
 * child records its own identity in the locks it takes). A child inherits
 * no cleaning thread: the parent's cleans the table while the parent
 * lives (a child may call tg_clean), and tg_limiter_destroy in a child
 * frees the child's copy without waiting for the parent's thread. Growth is
 * bounded by the region: the table never allocates; a new key in a full table
 * is TG_EFULL, answered by the failure policy (or evicts one, TG_FULL_EVICT).
 * Every page of the region must be usable when touched: anonymous memory
 * is; a file mapping on a file system that can fill up is not (use shm_name
 * there, which reserves its pages).
 *
 * Not guarded: two tg_limiter_new calls initialising the same fresh region
 * at once. Create the first limiter before others may attach, as a server's
 * master process does before it forks its workers. */

/* Bytes a region needs for *cfg's table (its algorithm, capacity, long_keys
 * and sliding_max_entries): the least tg_config.region_bytes may be; 0 when
 * cfg is NULL or those fields are out of range. */
TG_EXTERN size_t tg_region_bytes(const tg_config *cfg);

/* ---- Redis store ----------------------------------------------------------
 * Keeps every key's state in a Redis server, so limiters on many hosts share
 * one limit. Available when the library was built with hiredis (see
 * tg_redis_available()); otherwise a limiter configured with it is
 * TG_ENOTSUP.
 *
 * One round trip per decision: the arithmetic of each algorithm's state
 * change runs server-side in one Lua script (EVALSHA; the script is loaded
 * once per connection and reloaded on NOSCRIPT), so a decision is atomic
 * however many hosts share the key. Time is the server's (TIME): hosts whose
 * clocks disagree still share one timeline, and tg_config.clock is not used.
 * The _at functions pass your now to the script instead (for replaying
 * history and for tests); the TTLs the server gives keys then count from
 * your now, so it should follow the server's clock.
 *
 * Every key gets a TTL equal to the time until its state is fresh again
 * (plus 2 ms, or 1 s with a now you gave), so idle keys vanish by
 * themselves: tg_clean() is TG_ENOTSUP, before_clean is never called and
 * tg_key_count() is 0. A sliding log's TTL follows the period of the call
 * that last wrote it: use one quota per key (as everywhere). Redis key names
 * are key_prefix ":{" key "}:" and the algorithm's short name (fw, pk, sw,
 * tb, lb), so limiters with different algorithms never share state. A call
 * touches one key, so it is always in one Cluster slot; the slot is the key
 * bytes' own (the hash tag) unless the key contains "}", where Redis ends
 * the tag. Keys are binary-safe (NUL, "{" and "}" included).
 *
 * Values are the limiter's state as decimal text (documented in
 * src/store/redis_value.h); a value that is not one of ours (another
 * program's key, another type) is TG_ECORRUPT and is left untouched, but
 * by tg_reset, which deletes the name whatever it holds (the module's
 * TG.RESET refuses such a value, as TG_ECORRUPT). One exception: the
 * script checks a sliding log's form but reads only the entries a call
 * prunes, its newest and those a denied call waits for (a hot log is
 * kilobytes), so a log edited by hand into well-formed text whose sum
 * disagrees with its entries is decided as it reads (and rewritten),
 * where the module, which checks the whole log in C, answers TG_ECORRUPT.
 *
 * The Redis module: when the server has loaded tollgate.so (README.md, "The
 * Redis module"), a connection finds it once, when it opens (COMMAND INFO
 * TG.STEP), and sends each call as the module's TG.STEP command (TG.STEP_RO
 * for calls that cannot write) instead of the script: the same step,
 * compiled, in the server, on the same values and key names, with the same
 * answers and failure codes (over maxmemory both refuse, TG_ESTORE, only a
 * call that would write: a refusal on a bucket, or on a sliding log none of
 * whose entries expired, is answered); nothing to configure (a user whose ACL
 * forbids COMMAND gets the script). A connection keeps what it found until
 * it reconnects, except that one whose module is unloaded turns to the
 * script at once and sends the call again (it did not run). The module's
 * keys get the time until fresh rounded up to the ms (plus 1 s with a now
 * you gave), its writes reach replicas and the AOF as SET ... PXAT or DEL,
 * never as the clock-reading command.
 *
 * Connections: a pool of pool_size connections, each used by one thread at a
 * time (a thread takes a free one, or waits for one), so a limiter may be
 * used from any number of threads. The pool connects on first use, not in
 * tg_limiter_new, so a service can start while Redis is down. A connection
 * that fails (refused, reset, timed out, protocol error) is closed and
 * reopened by the next call that picks it.
 *
 * Failing fast: a server that does not answer must not make every call wait.
 * When a call times out (command_timeout_ms, connect_timeout_ms) or a
 * connection cannot be opened (refused, timed out, or AUTH, SELECT or SCRIPT
 * LOAD failed), the whole pool is marked down for reconnect_backoff_ms.
 * Meanwhile every call on the limiter returns that failure's code at once
 * (TG_ETIMEDOUT, TG_ECONNECT, or TG_ESTORE for a refused AUTH), with the
 * failure policy's answer, and sends nothing. Once the backoff has passed,
 * one call at a time (the probe) tries the server while the others go on
 * returning at once; if it gets any answer the pool is up again, otherwise
 * it is down for another backoff. So while the server is unresponsive at
 * most one call per limiter waits, at most once per backoff plus timeout,
 * and with the defaults a stopped server costs the process about one 1 s
 * wait every 1.1 s on one thread, not 1 s per call. A connection the server
 * closes (a restart, CLIENT KILL) does not mark the pool down: that call
 * returns TG_ECONNECT and the next one reconnects. A call is never retried
 * after its command
 * was sent (it may have been counted), except after NOSCRIPT, which means
 * the script did not run (in a batch, the calls that met NOSCRIPT are sent
 * again after the rest: so when the server loses its scripts while a batch
 * is in flight, SCRIPT FLUSH or a restart, and another client loads it again
 * before the batch's later calls arrive, those later calls run first, and a
 * key named by both is decided out of the batch's order; the module's
 * TG.STEP has no such case). Tested with Redis 7.0; the script asks Redis 3.2-6
 * to replicate its effects, which they need for a script that reads TIME
 * and then writes.
 *
 * Redis Cluster: with cluster_nodes set, the store finds the cluster from
 * those seeds (CLUSTER SLOTS from one that answers; a seed may be a master
 * or a replica) and sends each call to the master that serves its key's
 * hash slot: the same script or module command, key names and answers as
 * with one server (a call touches one key, so one slot). The slot map is
 * shared by the limiter's threads. A MOVED reply updates it and the call
 * goes to the named node; an ASK reply (a slot being migrated) sends the
 * call once to the named node after ASKING; in both cases the call had not
 * run, so nothing is counted twice; a call follows at most 8 of them, then
 * it is TG_ESTORE. A connection lost before all of a call's bytes were
 * written cannot have run it: the call goes again on a new connection (a
 * call written in full is answered with the failure, as with one server).
 * pool_size counts per node: each of the pool's pool_size slots holds at most
 * one connection to each node, opened on first need. tg_hit_batch sends each
 * node its part of the batch, pipelined, all nodes at once. Health is per node:
 * a node that cannot be connected to or does not answer in time is down for
 * reconnect_backoff_ms (its slots' calls fail fast with the failure policy's
 * answer, then one call at a time probes it, as "Failing fast" says for one
 * server) while the other nodes' calls go on. A node going down, a MOVED and a
 * CLUSTERDOWN reply make the store ask an up node for a new map, at most once
 * per reconnect_backoff_ms (and 100 ms) unless calls are waiting for one. So
 * when a master dies, its slots' calls are degraded until a replica is promoted
 * and the cluster's map shows it, then exact again, with no restart; what the
 * dead master had not yet replicated is lost with it (Redis replicates
 * asynchronously), so a key may then admit again up to what it had admitted
 * since. Nodes are remembered by address, at most 1024 over a limiter's life.
 * Unix sockets and databases other than 0 are TG_EINVAL with cluster_nodes;
 * calls never go to replicas (every decision may write).
 *
 * Policies (tg_hit_rules) and reservations (tg_reserve, tg_cancel) on a
 * Cluster: all of a policy's key names must share a hash slot (see "Redis
 * Cluster and hash tags" under Policies: TG_EINVAL otherwise, nothing
 * decided). They run as with one server (a policy in one command, a
 * reservation by reading, deciding here and writing if unchanged) on the
 * master of that slot, through a second pool of at most
 * pool_size connections per node, opened on first need. A MOVED or
 * CLUSTERDOWN reply there refreshes the map and starts over (at most 8
 * times, from the second on after a pause of 2 to 50 ms, about 110 ms in
 * all: two nodes may disagree about a slot for a moment, see README
 * "Resharding"), an ASK or TRYAGAIN (the slot is being migrated) waits 2
 * to 50 ms and starts over (at most 40 times, about 1.8 s in all); then
 * TG_ESTORE.
 * Nothing had run, so nothing is counted twice; they are counted in
 * tg_stats's moved and ask (a TRYAGAIN as an ASK). A node that cannot be
 * reached answers as in "Failing fast" (per node) and asks for a new map,
 * so after a failover they follow the promoted replica.
 *
 * fork(): a connection opened before a fork is not used by the child (each
 * call checks the process id and the child opens its own), so a limiter may
 * be created before forking workers, as long as no thread is inside a
 * tollgate call at the moment of the fork. */
struct tg_redis_config {
  /* Default "127.0.0.1" and 6379; unused when unix_path is set. */
  const char *host;
  int port;
  /* A unix socket instead of TCP; NULL (default) for TCP. At most 107
   * bytes (a socket address's room; longer is TG_EINVAL: it would be cut,
   * and could name another socket). */
  const char *unix_path;
  /* ACL user for AUTH (Redis 6+); NULL (default): AUTH with password
   * alone. */
  const char *username;
  /* NULL (default): no AUTH. */
  const char *password;
  /* SELECTed database, default 0. */
  int db;
  /* Default 1000 each; 0: none (blocks). */
  uint32_t connect_timeout_ms;
  uint32_t command_timeout_ms;
  /* Default 100: after a timeout or a failed connect, calls fail fast for
   * this long, then one probes (see "Failing fast"). */
  uint32_t reconnect_backoff_ms;
  /* Connections, default 4, 1..1024 (per node with cluster_nodes). */
  uint32_t pool_size;
  /* Default "tg": 1..128 bytes, no "{" or "}". */
  const char *key_prefix;
  /* NULL (default): one server (host, port or unix_path). Else a Redis
   * Cluster, found from these seed nodes: "host:port" (or "[v6addr]:port")
   * items separated by commas, 1..64 of them; host, port and unix_path are
   * then unused and db must be 0. See "Redis Cluster" above. */
  const char *cluster_nodes;
};

/* Fills *rc with the defaults documented beside each field. */
TG_EXTERN void tg_redis_config_init(tg_redis_config *rc);

/* 1 when this build of the library has the Redis store, else 0. */
TG_EXTERN int tg_redis_available(void);

/* ---- Surviving a store outage ---------------------------------------------
 * Two ways for a limiter on a remote store (Redis, or a custom store) to
 * lean on it less. Both are off by default, and both apply to decisions
 * (tg_hit, tg_hit_batch and the non-blocking API): tg_inc, tg_get, tg_set,
 * tg_expires_at and tg_reset always ask the store, and so do policies
 * (tg_hit_rules) and reservations (tg_reserve, tg_cancel). A failed policy
 * or reservation on a limiter with TG_POLICY_FALLBACK is answered as with
 * TG_POLICY_FAIL_OPEN (allowed, degraded): the fallback decides single
 * calls only. Deny-cache answers and fallback decisions are counted like
 * the store's (tg_stats, shadow mode and the hook apply to them too).
 *
 * TG_POLICY_FALLBACK. While the store fails (any code a failure policy
 * answers), a decision is made in a memory store of the limiter's own, as
 * if this host alone had the quota divided by tg_config.fallback_share:
 * limit / share and, for the buckets, burst / share, rounded down (a share
 * below one call admits nothing: not allowed, retry_after_ms = period). Set
 * the share to the number of hosts that share the store, and together they
 * admit at most the quota while it is out. The result is marked degraded
 * and the function still returns the store's code. Every call tries the
 * store first (the Redis store's "Failing fast" makes that free while it is
 * down), so exact decisions resume by themselves once it answers. The local
 * store keeps what it counted, so a key met in an earlier outage starts
 * the next one where it was (stricter, never looser); it is sized by
 * capacity, long_keys and sliding_max_entries (reserved as keys come,
 * as the memory store's), uses the limiter's clock for calls on the
 * store's clock, and when it is full answers as TG_POLICY_FAIL_OPEN.
 *
 * The deny cache (tg_config.deny_cache_entries). Once the store has denied
 * a call, later calls on that key which the store would deny too are
 * answered here, without a round trip, until 1 ms before the denial's
 * retry time (which is known rounded up to the ms):
 *   - a fixed window (either kind): every call, whatever its cost, until
 *     the window ends: the denied call was counted, so the window stays
 *     over its limit until then;
 *   - a sliding window or a bucket: calls of the denied cost or more, until
 *     the time that cost would fit if nothing else happened (other callers
 *     only make it later); a smaller cost may fit sooner: the store decides.
 * A denial is reused only under the same quota (a call under another quota
 * drops it: that quota may change the state the denial was true of; and a
 * tg_inc, a policy that passed, or a tg_nb TG_NB_RULE call a window
 * admitted, on the key drops it whatever its quota, since none of them
 * reads the cache) and in
 * the same timeline: calls on the store's clock count on this host's
 * monotonic clock from the moment the denied call was sent, which is never
 * after the server decided; the _at calls count in their own now. So it
 * never denies a call the store, asked at that moment, would allow, with
 * one exception it cannot see: a tg_reset, tg_set or tg_cancel of the key
 * by another limiter (another process's included), or the key deleted in
 * the store by other means (this limiter's own tg_reset, tg_set and
 * tg_cancel forget it). The answer: allowed false,
 * degraded false, count and remaining those of the denial, retry_after_ms
 * the time left (the store's wait or 1 ms less right after the denial;
 * never more than the store's, which other calls may have pushed out;
 * TG_NEVER for a cost no wait admits), reset_after_ms the denial's less the
 * time since. A fixed window's denials answered here are not added to its
 * stored count: no decision under the key's quota changes (the window
 * refuses everything until it ends anyway), but tg_get shows the lower
 * count; likewise a sliding log's refusal answered here writes nothing,
 * where the store's drops the entries the call's period has expired, so
 * after a change to a longer period those entries still count (as after a
 * refused policy, see tg_hit_rules): a key's quota should not change (as
 * everywhere). Degraded answers are never cached. Memory: about 380 bytes per
 * entry (keys are kept whole, never matched by hash alone), in sets of 4;
 * a new denial takes an expired entry of its set, else the one that ends
 * first. Thread-safe (striped locks). tg_limiter_stats counts what it
 * answered (deny_cache_hits); BENCHMARKS.md measures the round trips it
 * spares. */

/* ---- Non-blocking Redis API (sans-IO) -------------------------------------
 * The Redis store for event loops that own their sockets (nginx, libuv,
 * libevent, epoll). tollgate never blocks here, never touches a socket,
 * starts a thread or sets a timer: it says which connection needs what,
 * gives the bytes to send, takes the bytes received in any split, and says
 * which decisions are done. Connecting, polling, timeouts and when to try
 * a failed node again are the caller's, and this section says exactly what
 * the library expects after each event. examples/nb_uv.c is a complete
 * adapter for libuv (and tests/nb_poll.h a plain poll(2) loop).
 *
 * One tg_nb is a client of one Redis server or of a Redis Cluster, made
 * from a tg_config whose redis is set. Everything in it that tg_limiter_new
 * uses is used the same way (algorithm, key_prefix, AUTH, db or
 * cluster_nodes, sliding_max_entries, on_failure with its fallback, the
 * deny cache, shadow mode, the decision hook), and a decision is the one
 * tg_hit would make with that configuration: the same script or module
 * command, key names, validation, answers and failure answers, counted in
 * the same counters (tg_nb_stats), from the same code. The Redis settings
 * that are about doing I/O (pool_size, the timeouts, reconnect_backoff_ms)
 * are not used: they are the caller's business here. It decides
 * tg_hit's calls, a one-rule policy's (TG_NB_RULE), tg_reserve's
 * (TG_NB_RESERVE), and policies (tg_nb_submit_rules: tg_hit_rules's and
 * tg_reserve_rules's), each in one command. tg_cancel and
 * tg_cancel_rules are offered on a limiter only.
 *
 * One call as a policy's rule: flags TG_NB_RULE decides the request as
 * tg_hit_rules decides a policy of that one rule, rather than as tg_hit:
 * a refused call consumes nothing, so a fixed window (either kind) does
 * not count it (tg_hit counts it), and a denial reports the key as the
 * call left it (count and remaining unchanged, retry_after_ms the wait for
 * this cost). The other algorithms decide and answer exactly as without
 * the flag (as tg_hit: the deny cache read and filled, and
 * TG_POLICY_FALLBACK deciding on the local store when Redis fails, where
 * tg_hit_rules does neither): tg_hit consumes nothing on a refusal there
 * either, and its answers are a one-rule policy's, but on a sliding log
 * after a refusal: a refused tg_hit drops the entries expired at its now,
 * a refused policy call writes nothing, so those entries count again for a
 * later call under a longer period (a quota that changes between calls)
 * or at an earlier now (a clock that stepped back). On a window it is
 * still one command and one round trip: the script's op p, or TG.STEP's
 * TAKE.
 * On a fixed window such a request neither reads nor fills the deny cache
 * (its denied cost says nothing about a smaller one); a store failure is
 * answered by the failure policy as tg_hit's is (the fallback store
 * included). This is what the nginx
 * module's Redis zones use, so that a Redis zone answers as a shared-memory one
 * does.
 *
 * A reservation: flags TG_NB_RESERVE (the two buckets; another algorithm
 * is TG_ENOTSUP, a max_wait_ms above TG_PERIOD_MAX_MS TG_EINVAL) decides
 * the request as tg_reserve with max_wait_ms: status and result as
 * tg_reserve's, and delay_ns / delay_ms the wait before the work may run
 * (0 when it may go at once, or was refused, or failed; in shadow mode a
 * delay is answered 0 with shadow_denied set). One command, one round
 * trip: the script's bucket step with the tolerance stretched by the wait,
 * or TG.STEP's RESERVE with the wait as its eleventh argument. When it
 * connects, the client asks whether the server's tollgate module takes
 * waits (COMMAND INFO TG.PROTOCOL); a module that predates them would
 * refuse that argument, so calls that carry a wait (reservations, policies
 * of them) are sent to the script instead, which decides them alike, and
 * the others to the module. A failure is
 * answered as tg_reserve answers it (the failure policy, without the
 * fallback's decision). What is missing beside tg_reserve: a receipt, so
 * there is no tg_cancel for it: a reservation made here is never given
 * back.
 *
 * Links. A tg_nb talks to each node over one connection, its "link",
 * numbered from 0: link 0 is the server (or the first seed); a Cluster adds
 * links for the seeds and for every node its slot map or a redirection
 * names, so tg_nb_links may grow (never shrink) after any call. Each link
 * carries its calls pipelined, in submission order.
 *
 * A request's life. The caller owns a tg_nb_req, fills key, key_len, q,
 * cost and flags (and data, which is never touched) and calls tg_nb_submit
 * (or tg_nb_submit_at with its own now, as tg_hit_at). Invalid input is
 * refused there: the code is returned, status and result are filled as
 * tg_hit would, and the request is not pending. Otherwise it is pending until
 * tg_nb_done returns it, with status and result exactly what tg_hit would
 * have returned and written (with TG_NB_RULE or TG_NB_RESERVE, what the
 * call they name would have: below), a store failure its code and the
 * failure policy's answer, marked degraded. Until then its memory, and the
 * bytes of its key, must stay valid and untouched (q is copied). A request the
 * deny cache answers, or whose node is down, is done at once: tg_nb_done
 * returns it after the submit without any I/O. Requests complete in
 * submission order per link, in any order across links.
 *
 * The caller's loop. After any call into a tg_nb, each link (0 ..
 * tg_nb_links - 1) may want something; tg_nb_wants says what, in bits:
 *   TG_NB_CONNECT  it has something to send and no connection: connect to
 *                  tg_nb_address (TCP host:port, a unix socket path when
 *                  port is 0), then call tg_nb_connected; if the connection
 *                  cannot be made, call tg_nb_down.
 *   TG_NB_WRITE    bytes wait: tg_nb_output gives the next ones (after
 *                  tg_nb_connected, the handshake first: AUTH, SELECT,
 *                  COMMAND INFO TG.STEP, SCRIPT LOAD; calls after its
 *                  replies); write what the socket takes and report exactly
 *                  that many bytes with tg_nb_written.
 *   TG_NB_READ     replies are due (or will be, once the queued bytes are
 *                  written): hand every byte read to tg_nb_input.
 * A link that wants nothing may keep its connection open.
 *
 * What the caller tells it, and what happens:
 *   - the connection ended (EOF, a socket error: TG_ECONNECT) or the
 *     caller's timeout expired (TG_ETIMEDOUT): tg_nb_closed(link, code).
 *     A request whose bytes were all reported written may have been counted
 *     by the server: it completes with code and the failure policy's
 *     answer, and is NEVER sent again. A request not written in full cannot
 *     have run (Redis runs a command once all of it has arrived): it stays
 *     queued, and the link wants CONNECT again. A connection that ends
 *     before its handshake was answered (a server that accepts and closes
 *     at once) is taken as a connect that failed: the link's queued
 *     requests, none of them sent, complete with code, and it wants
 *     CONNECT again only for new ones (so such a server is asked once per
 *     request, never in a loop).
 *   - the node cannot be reached (a connect refused or timed out, or the
 *     caller's judgement): tg_nb_down(link, code). As closed, then every
 *     request queued for the node, and every new one, completes at once
 *     with code until tg_nb_up(link), which the caller calls when its
 *     backoff has passed. In a Cluster another node is asked for the map.
 *   - tg_nb_input returns a negative code: the bytes were not a valid reply
 *     to what was sent (the stream cannot be trusted), or the server
 *     refused the handshake (a wrong password) or the connection (-ERR max
 *     number of clients reached, -DENIED, -LOADING, -BUSY, -MASTERDOWN,
 *     -NOAUTH): the link is already closed
 *     (its requests answered as by tg_nb_closed with TG_ESTORE) and down;
 *     close the socket, and tg_nb_up it after a backoff.
 * Timeouts are the caller's: a link with TG_NB_READ that hears nothing for
 * too long is closed (or downed) with TG_ETIMEDOUT.
 *
 * Sent again without the caller's help, because the server said they did
 * not run: a call that met NOSCRIPT (after a SCRIPT LOAD that goes first),
 * or a vanished module (the link turns to the script); in a Cluster, a
 * MOVED (the map is updated, the call goes to the named node's link) and an
 * ASK (once, to the named node, after ASKING); at most 8 times per call,
 * then TG_ESTORE. A Cluster's calls for a slot its map does not know (at
 * first, before any map) wait for CLUSTER SLOTS, sent on a link that is not
 * down, a connected one if any; with every link down they complete with
 * the code of the last one that went down.
 *
 * The one timer: a policy (tg_nb_submit_rules) whose Cluster slot is being
 * migrated, with its keys split between the two nodes, is told TRYAGAIN
 * by the node that imports it. It did not run; it waits and is sent again
 * as the blocking store does it (2, 4, 8, 16, 32 ms, then 50 ms, at most 39
 * times, about 1.8 s; then TG_ESTORE, by the failure policy); each
 * TRYAGAIN is counted in tg_nb_stats's ask, as is the ASK that usually
 * comes before it. The library keeps no timer of its own. A policy starts
 * waiting when tg_nb_done meets its TRYAGAIN, so after draining tg_nb_done
 * (and after tg_nb_tick) arm a timer for tg_nb_timeout() ms when that is
 * not negative, and when it fires call tg_nb_tick, then service the links
 * as after input. A loop that never does leaves such a policy pending
 * until it next calls tg_nb_tick.
 * Single-key requests never wait (a key cannot be split).
 *
 * Memory: tg_nb_new allocates the tg_nb (about 150 KiB, most of it the
 * slot map: 16384 slots and up to 1024 node addresses), a store-less
 * limiter (with the fallback's table and the deny cache when configured,
 * sized as for tg_limiter_new), and for a Cluster a 64 KiB scratch map.
 * Each link, when first used, takes about 4.5 KiB, and at its first connect
 * a 64 KiB output buffer (the handshake carries the 18 KiB script), kept
 * until tg_nb_destroy; a node's address is copied once. A request
 * allocates nothing: its bookkeeping lives in its own private_ words,
 * replies are decoded in the link's fixed storage, and the deny cache and
 * the fallback allocate nothing per call (a policy allocates one block, and
 * a block for each sliding log its reply carries, see tg_nb_submit_rules).
 * The output buffer bounds how far
 * ahead calls are encoded; the others wait queued.
 *
 * Threads: a tg_nb is used by one thread at a time (it has no lock); use
 * one per event-loop thread. Several may be made from one config. */
typedef struct tg_nb tg_nb;

/* Words of a tg_nb_req that belong to the library while it is pending. */
#define TG_NB_PRIVATE_WORDS 48

/* One decision through the non-blocking API: the caller's memory, from
 * tg_nb_submit until tg_nb_done returns it. */
typedef struct tg_nb_req {
  const void *key;      /* in: key bytes, read until the request is done */
  size_t key_len;       /* in */
  const tg_quota *q;    /* in: read by tg_nb_submit only */
  uint64_t cost;        /* in */
  unsigned flags;       /* in: 0 (as tg_hit), TG_NB_RULE, TG_NB_RESERVE */
  uint64_t max_wait_ms; /* in, with TG_NB_RESERVE: as tg_reserve's (in ns
                           with TG_NB_WAIT_NS) */
  void *data;           /* the caller's, never touched */
  int status;           /* out: what tg_hit (or, with a flag, the call
                           it names) would have returned */
  tg_result result;     /* out: and written */
  uint64_t delay_ns;    /* out, with TG_NB_RESERVE: as tg_reservation's;
                           a policy's: as tg_rules_reservation's */
  uint64_t delay_ms;    /* (delay_ns rounded up) */
  size_t denied_by;     /* out, a policy (tg_nb_submit_rules): as */
  size_t tightest;      /* tg_rules_result's; else TG_RULE_NONE and 0 */
  uint64_t private_[TG_NB_PRIVATE_WORDS]; /* the library's */
} tg_nb_req;

/* One rule of a policy through the non-blocking API (tg_nb_submit_rules):
 * a tg_rule whose limiter is a client's. */
typedef struct tg_nb_rule {
  tg_nb *nb;            /* in: the client whose configuration decides the rule
                           (algorithm, key prefix, shadow mode, failure policy,
                           counters); it must name the same server or Cluster
                           as the client the policy is submitted to */
  const void *key;      /* in: read until the request is done */
  size_t key_len;       /* in */
  const tg_quota *q;    /* in: read by the submit only */
  uint64_t cost;        /* in */
  uint64_t max_wait_ms; /* in: as tg_reserve_rules's max_wait_ms[i]: 0, a
                           plain rule; above 0 (the buckets), the rule
                           reserves, waiting at most that long (ns when
                           the policy's flags have TG_RULES_WAIT_NS) */
  int status;           /* out: as tg_rule's */
  tg_result result;     /* out */
  uint64_t delay_ns;    /* out: the rule's own delay, as its receipt's in
                           tg_reserve_rules (0 unless the policy passed with
                           this rule's reservation accepted late) */
} tg_nb_rule;

/* tg_nb_req.flags: decide as a one-rule policy; reserve (see above);
 * max_wait_ms is in nanoseconds (at most TG_PERIOD_MAX_MS * 10^6), as
 * TG_RULES_WAIT_NS says of a policy's waits. */
#define TG_NB_RULE 1u
#define TG_NB_RESERVE 2u
#define TG_NB_WAIT_NS 4u

/* What a link asks of its caller (tg_nb_wants), bits. */
#define TG_NB_CONNECT 1u /* open a connection to tg_nb_address */
#define TG_NB_WRITE 2u   /* write tg_nb_output's bytes */
#define TG_NB_READ                                                             \
  4u /* replies are due, or will be once the queued                            \
        bytes are written: read and tg_nb_input them */

/* Makes a client from cfg (copied; cfg->redis must be set). Returns
 * TG_EINVAL for what tg_limiter_new refuses (but pool_size and the other
 * I/O settings it does not use, see above), a NULL argument or no redis,
 * with tg_last_error() saying which; TG_ENOTSUP in a build without
 * hiredis; TG_ENOMEM. Connects nothing. */
TG_EXTERN int tg_nb_new(tg_nb **out, const tg_config *cfg);
/* Frees everything; pending requests are abandoned (the caller's memory,
 * never touched again). The caller closes its sockets. NULL: no-op. */
TG_EXTERN void tg_nb_destroy(tg_nb *nb);

/* Submits a decision on the store's clock (tg_hit), or at now_us
 * (tg_hit_at). Returns 0 (pending: tg_nb_done returns it later, or at once)
 * or the code of invalid input (TG_EINVAL, also for an unknown flag;
 * TG_EKEY, TG_EQUOTA, TG_ETIME, TG_ENOTSUP; not pending, status and result
 * filled as tg_hit would). */
TG_EXTERN int tg_nb_submit(tg_nb *nb, tg_nb_req *req);
TG_EXTERN int tg_nb_submit_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req);

/* Submits a policy: rules[0..n) (1 <= n <= TG_RULES_MAX) decided as one
 * call of tg_hit_rules (flags 0 or TG_RULES_SHADOW, with TG_RULES_WAIT_NS
 * for waits in ns) on the store's clock,
 * or at now_us, in one command to the server (the module's TG.STEPS, or the
 * script's P), so several hosts share the policy's limits. req's key, q,
 * cost, flags and max_wait_ms are not read; when it is done its status is
 * what tg_hit_rules would return, result the policy's answer (tg_rules_
 * result's r), denied_by and tightest as tg_rules_result's, and each
 * rule's status and result as tg_hit_rules sets them (rules must stay
 * valid until then). A rule whose max_wait_ms is above 0 reserves: the
 * policy is then decided as tg_reserve_rules decides it (without receipts:
 * there is no cancel here), req's delay_ns and delay_ms are the call's
 * delay and each rule's delay_ns its own (to a server whose tollgate
 * module predates TG.STEPS's waits, such a policy goes as the script's
 * P: see TG_NB_RESERVE); with no wait, as tg_hit_rules (delays 0). The
 * answer is the one tg_hit_rules (tg_reserve_rules) gives on the blocking
 * Redis store: every number computed by this process's core from the
 * values the server read, whose verdict must agree (else TG_ESTORE).
 * A store failure is answered for every rule by the failure policy of the
 * rule where it happened (rule 0 for a lost connection), as there.
 * Returns 0 (pending) or, not pending, with status and results filled as
 * tg_hit_rules fills them for invalid input:
 *   TG_EINVAL: NULL rules or req, n out of range, an unknown flag, a rule
 *     without a client, a rule whose client names another server (another
 *     first host, port, db or kind), two rules naming the same Redis key
 *     (denied_by names the first rule that does not fit, as tg_hit_rules
 *     names a misfit, counted on its client), or names in more than one
 *     hash slot, on one server too (see "Redis Cluster and hash tags"
 *     under Policies; denied_by names the first rule out of place,
 *     answered as the blocking store answers it: not allowed, never,
 *     counted, shadow mode not applied);
 *   what tg_hit_rules returns for a rule's input (TG_EKEY, TG_EQUOTA,
 *     TG_ETIME, TG_EINVAL), and tg_reserve_rules for its wait (TG_EINVAL
 *     above TG_PERIOD_MAX_MS, TG_ENOTSUP on a window or a sliding log).
 * A policy allocates one block (about 18 KiB) from submit until done;
 * when it cannot, it is answered at once as a store failure: submit
 * returns TG_ENOMEM, not pending, with status and results filled by rule
 * 0's failure policy (tg_nb_done never returns it).
 * The reply carries the value of every key read, which for a sliding-
 * window rule is its whole log (21 bytes, and 40 an entry: 41 KiB for the
 * default 1,024 entries); each such log is read into a block of its own,
 * freed once the reply is decoded (when no block can be had, the policy
 * is answered TG_ESTORE, by the failure policy).
 * Every rule's client must outlive the request (its names and its
 * limiter are used until the answer). The deny cache is not consulted
 * (as tg_hit_rules does not). A policy whose slot is being moved between
 * Cluster nodes (ASK, then TRYAGAIN while its keys are split) waits and
 * goes again as on the blocking store, through the caller's timer: see
 * "The one timer" above. */
TG_EXTERN int tg_nb_submit_rules(tg_nb *nb, tg_nb_req *req, tg_nb_rule *rules,
                                 size_t n, unsigned flags);
TG_EXTERN int tg_nb_submit_rules_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req,
                                    tg_nb_rule *rules, size_t n,
                                    unsigned flags);

/* The next request done (status and result set), or NULL. */
TG_EXTERN tg_nb_req *tg_nb_done(tg_nb *nb);

/* Requests submitted and not yet returned by tg_nb_done. */
TG_EXTERN size_t tg_nb_pending(const tg_nb *nb);

/* Milliseconds (rounded up) until a policy told TRYAGAIN is due to be sent
 * again (see "The one timer" above): 0 when one is due now, -1 when none
 * waits (and for a NULL nb). Reads CLOCK_MONOTONIC. */
TG_EXTERN long tg_nb_timeout(const tg_nb *nb);

/* Sends again every waiting policy whose time has come (none early); then
 * service the links (tg_nb_wants) as after tg_nb_input. TG_EINVAL for a
 * NULL nb, else TG_OK (also when nothing was due). */
TG_EXTERN int tg_nb_tick(tg_nb *nb);

/* Links so far: 0 .. tg_nb_links() - 1 (only grows). */
TG_EXTERN unsigned tg_nb_links(const tg_nb *nb);

/* TG_NB_CONNECT, TG_NB_WRITE and TG_NB_READ bits for a link (0 for a link
 * that is down, or that does not exist). */
TG_EXTERN unsigned tg_nb_wants(const tg_nb *nb, unsigned link);

/* Where a link connects: *host (a name, numeric address or, with *port 0,
 * a unix socket path; valid until tg_nb_destroy) and *port. TG_EINVAL for
 * a link that does not exist. */
TG_EXTERN int tg_nb_address(const tg_nb *nb, unsigned link, const char **host,
                            int *port);

/* The caller's connection for a link is open: the handshake is queued.
 * TG_EINVAL for a link that does not exist, is down or is open already;
 * TG_ENOMEM (the link stays closed). */
TG_EXTERN int tg_nb_connected(tg_nb *nb, unsigned link);

/* The next bytes to write on a link (*len 0: none). They stay valid and
 * unchanged until the next tg_nb_output, tg_nb_written, tg_nb_connected,
 * tg_nb_closed or tg_nb_down on that link, or tg_nb_destroy, so an
 * asynchronous write may use them in place. */
TG_EXTERN int tg_nb_output(tg_nb *nb, unsigned link, const void **data,
                           size_t *len);

/* n of those bytes were handed to the kernel. Report them before feeding
 * the replies to them (tg_nb_input takes a reply to a command not yet
 * reported written for a corrupt stream). */
TG_EXTERN int tg_nb_written(tg_nb *nb, unsigned link, size_t n);

/* Bytes read from a link's connection, any amount. 0; TG_EINVAL, nothing
 * changed, for a link that does not exist or has no open connection
 * (tg_nb_connected); or a negative code after which the link is closed
 * and down (see above): TG_ESTORE, with tg_last_error() saying why (the
 * server's refusal of AUTH or SELECT, bytes that are not RESP...). */
TG_EXTERN int tg_nb_input(tg_nb *nb, unsigned link, const void *data,
                          size_t len);

/* The link's connection ended (code TG_ECONNECT) or timed out
 * (TG_ETIMEDOUT); TG_ESTORE and TG_ENOMEM are accepted too. TG_EINVAL for
 * another code or a link that does not exist. */
TG_EXTERN int tg_nb_closed(tg_nb *nb, unsigned link, int code);

/* The link's node cannot be reached now: closed, then its requests and any
 * new ones complete at once with code until tg_nb_up. Codes as
 * tg_nb_closed. */
TG_EXTERN int tg_nb_down(tg_nb *nb, unsigned link, int code);

/* Lets a down link's node be tried again. */
TG_EXTERN int tg_nb_up(tg_nb *nb, unsigned link);

/* The client's counters (tg_stats, see "Counters and the decision hook"):
 * its decisions as tg_limiter_stats counts a limiter's, and its store
 * counters. At most size bytes; TG_EINVAL for a NULL argument or size 0. */
TG_EXTERN int tg_nb_stats(const tg_nb *nb, tg_stats *out, size_t size);

/* ---- HTTP headers ---------------------------------------------------------
 * The response header fields a limited HTTP response carries, written into
 * the caller's buffer (no allocation, no clock): for one limit or for every
 * rule of a policy. Three parts, chosen by flags:
 *
 * TG_HTTP_IETF: the fields of draft-ietf-httpapi-ratelimit-headers-11 (the
 *   IETF draft "RateLimit header fields for HTTP", May 2026), Structured
 *   Field Lists with one item per limit:
 *     RateLimit-Policy: "name";q=LIMIT;w=SECONDS
 *     RateLimit: "name";r=REMAINING;t=SECONDS
 *   w is period_ms in seconds, rounded up; r the remaining cost units; t
 *   the effective window: until the key is fresh (reset_after_ms), or for a
 *   denied result, until the call would pass (retry_after_ms, unless
 *   TG_NEVER; so a Retry-After of that limit never names a time before its
 *   t ends, as the draft's section 6 asks), in seconds rounded up. Within
 *   t a window's client can use no more than r: its units come back only
 *   when it resets. A bucket's or a sliding log's come back a little at a
 *   time before the key is fresh (a token bucket is fresh when full), so
 *   there t is when all of them are back, and the client may use more
 *   than r within it, as units return. An optional
 *   partition key adds ;pk=:BASE64:. q is the quota's limit (its rate per
 *   w): a bucket whose burst is above its limit can hold more than that,
 *   and r then says so (r above q). A number above 999999999999999 (the
 *   15 digits of a Structured Field Integer) is written as that, in both
 *   forms, so that no field is one a parser must reject.
 * TG_HTTP_LEGACY: the older form of drafts 00-06, still read by many
 *   clients: RateLimit-Limit (the limit of the limit with the fewest
 *   remaining; with several limits, then every limit as LIMIT;w=SECONDS),
 *   RateLimit-Remaining and RateLimit-Reset (t above) of that limit.
 * TG_HTTP_RETRY_AFTER: when the decision was denied (some result not
 *   allowed), Retry-After: the largest retry_after_ms in seconds, rounded
 *   up; nothing when a denying result's is TG_NEVER (that limit never
 *   passes: no wait helps). A shadow-mode result is allowed and adds
 *   nothing.
 * Each field is written as "Name: value\r\n". */
#define TG_HTTP_IETF 1u
#define TG_HTTP_LEGACY 2u
#define TG_HTTP_RETRY_AFTER 4u

/* One limit to report. */
typedef struct tg_http_limit {
  const char *name;   /* policy name: 1..64 printable ASCII bytes */
  const tg_quota *q;  /* its quota (limit, period_ms) */
  const tg_result *r; /* the decision's result for it */
  /* Partition key bytes for ;pk= (IETF only), or NULL; pk_len 0..256. */
  const void *pk;
  size_t pk_len;
} tg_http_limit;

/* Writes the fields for limits[0..n) (1..TG_RULES_MAX) into buf, at most
 * cap bytes, and a terminating NUL; *len receives the length without it.
 * Returns 0, TG_EINVAL for NULL arguments (buf may be NULL when cap is 0),
 * n out of range, no flag, a bad name or pk, or TG_ERANGE when cap is too
 * small (cap 0 asks for the size only): then nothing useful is in buf and
 * *len is the size needed (without the NUL). */
TG_EXTERN int tg_http_headers(char *buf, size_t cap, size_t *len,
                              const tg_http_limit *limits, size_t n,
                              unsigned flags);

#ifdef __cplusplus
}
#endif

#endif /* TOLLGATE_H */
