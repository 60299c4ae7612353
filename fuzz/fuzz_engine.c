/* SPDX-License-Identifier: MIT */
/*
 * fuzz_engine.c - libFuzzer target: the Redis protocol engine
 * (src/store/redis_engine.c, over redis_resp.c and redis_slots.c) fed a
 * server's byte stream no server would send, on one server or a Cluster.
 *
 * The input: byte 0 chooses the setup (bit 0: a Cluster; bit 1: give it a
 * valid handshake first, so the fuzzer starts past it; bit 2: the map
 * starts empty, so calls wait for CLUSTER SLOTS; bits 3-5: the
 * algorithm), byte 1 how many calls (up to 31), byte 2 seeds the split of
 * the rest. The rest is read in chunks: each chunk's first byte picks the
 * link it arrives on and its length; between chunks every link that wants
 * a connection gets one and everything it wants to write is written.
 *
 * Oracles, besides the sanitizers: every call submitted is answered
 * exactly once, once the links are closed and the waiting calls failed; an
 * answer is a code the store may return; an answered decision is sane
 * (allowed implies retry_after_ms 0, denied implies a retry time). A
 * failed oracle aborts.
 */
#include "store/redis_cmd.h"
#include "store/redis_engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_engine: check failed: %s (line %d)\n", #cond,      \
              __LINE__);                                                       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define CALLS_MAX 31

static const char HANDSHAKE[] =
    "*1\r\n*-1\r\n$40\r\n0123456789abcdef0123456789abcdef01234567\r\n";

static bool known_code(int rc) {
  return rc == TG_OK || rc == TG_ECORRUPT || rc == TG_ESTORE ||
         rc == TG_ETIME || rc == TG_ENOMEM || rc == TG_ECONNECT ||
         rc == TG_ETIMEDOUT || rc == TG_EOVERFLOW || rc == TG_ERANGE;
}

/* Writes everything every link has to write, and connects those that ask
 * (with the valid handshake when `easy`). */
static void service(tg__eng *e, bool easy) {
  uint32_t n = tg__eng_nodes(e);
  for (uint32_t id = 0; id < n; id++) {
    unsigned w = tg__eng_wants(e, id);
    if (w & TG__WANT_CONNECT) {
      if (tg__eng_connected(e, id) != TG_OK)
        continue;
      const char *p;
      size_t len;
      tg__eng_output(e, id, &p, &len);
      tg__eng_written(e, id, len);
      if (easy)
        (void)tg__eng_input(e, id, HANDSHAKE, sizeof HANDSHAKE - 1);
    }
    const char *p;
    size_t len;
    tg__eng_output(e, id, &p, &len);
    tg__eng_written(e, id, len);
  }
  if (tg__eng_refresh_wanted(e))
    tg__eng_refresh(e, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  bool cluster = data[0] & 1, easy = data[0] & 2, empty = data[0] & 4;
  tg_algorithm alg = (tg_algorithm)((data[0] >> 3) % TG_ALGORITHM_COUNT);
  int ncalls = data[1] % (CALLS_MAX + 1);
  uint32_t rng = data[2] * 2654435761u + 1;
  data += 3;
  size -= 3;

  tg__store *codec = NULL;
  CHECK(tg__redis_codec_new(&codec, "tg", alg, 8) == TG_OK);
  tg__slotmap *map = malloc(sizeof *map);
  CHECK(map && tg__slotmap_init(map) == TG_OK);
  CHECK(tg__cluster_seeds(map, "127.0.0.1:7000,127.0.0.1:7001") == TG_OK);
  if (cluster && !empty) {
    uint32_t *ids = malloc(TG__SLOTS * sizeof *ids);
    CHECK(ids);
    for (unsigned s = 0; s < TG__SLOTS; s++)
      ids[s] = s & 1;
    tg__slotmap_replace(map, ids);
    free(ids);
  }
  tg__eng_stats st;
  memset(&st, 0, sizeof st);
  tg__eng_config ec = {codec, NULL, NULL, 0, cluster, map, &st};
  tg__eng e;
  CHECK(tg__eng_init(&e, &ec) == TG_OK);

  static const char *const keys[] = {"a", "b{x}", "}", "user:42"};
  tg__ereq calls[CALLS_MAX];
  tg_quota q = {.limit = 3, .period_ms = 1000, .burst = 4};
  for (int i = 0; i < ncalls; i++) {
    tg__ereq *r = &calls[i];
    memset(r, 0, sizeof *r);
    const char *k = keys[i % 4];
    tg__op op = alg == TG_SLIDING_WINDOW || i % 3 ? TG__OP_HIT : TG__OP_GET;
    CHECK(tg__call_check(alg, op, strlen(k), &q, &r->call.q) == TG_OK);
    r->call.op = op;
    r->call.alg = alg;
    r->call.key = k;
    r->call.key_len = strlen(k);
    r->call.arg = op == TG__OP_HIT ? 1 : 0;
    r->call.store_time = i % 2 == 0;
    r->call.now_us = r->call.store_time ? 0 : UINT64_C(1735689600000000);
    r->del = i % 7 == 6;
    tg__eng_submit(&e, r);
  }
  service(&e, easy);

  /* the server's bytes, in chunks, on links chosen by the input */
  size_t pos = 0;
  while (pos < size) {
    uint8_t head = data[pos++];
    rng = rng * 1103515245u + 12345u;
    size_t len = 1 + (head >> 2) + (rng >> 16) % 8;
    if (len > size - pos)
      len = size - pos;
    uint32_t n = tg__eng_nodes(&e);
    uint32_t id = n ? (head & 3) % n : 0;
    if (tg__eng_open(&e, id))
      (void)tg__eng_input(&e, id, (const char *)data + pos, len);
    pos += len;
    service(&e, easy);
  }

  /* the end: every connection lost, the waiting calls refused */
  uint32_t n = tg__eng_nodes(&e);
  for (uint32_t id = 0; id < n; id++) {
    tg__eng_closed(&e, id, TG_ETIMEDOUT);
    tg__eng_fail_queued(&e, id, TG_ECONNECT);
  }
  tg__eng_fail_parked(&e, TG_ECONNECT);
  int answered = 0;
  tg__ereq *d;
  bool seen[CALLS_MAX] = {false};
  while ((d = tg__eng_done(&e)) != NULL) {
    long i = d - calls;
    CHECK(i >= 0 && i < ncalls && !seen[i]);
    seen[i] = true;
    answered++;
    CHECK(known_code(d->status));
    if (d->status == TG_OK && !d->del && d->call.op == TG__OP_HIT) {
      const tg_result *r = &d->out.r;
      CHECK(r->allowed ? r->retry_after_ms == 0 : r->retry_after_ms > 0);
    }
  }
  CHECK(answered == ncalls);
  CHECK(e.pending == 0);

  tg__eng_free(&e);
  tg__slotmap_free(map);
  free(map);
  codec->ops->destroy(codec);
  return 0;
}
