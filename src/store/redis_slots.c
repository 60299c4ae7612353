/* SPDX-License-Identifier: MIT */
/*
 * redis_slots.c - hash slots, the slot map and redirections (see
 * redis_slots.h).
 */
#include "redis_slots.h"

#include "../atomic.h"
#include "tollgate.h"

#include <stdlib.h>
#include <string.h>

/* Bit by bit: a key name is a few dozen bytes and each call is a network
 * round trip, so a table would buy nothing measurable. */
uint16_t tg__crc16(const void *data, size_t len) {
  const unsigned char *p = data;
  unsigned crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (unsigned)p[i] << 8;
    for (int b = 0; b < 8; b++)
      crc = crc & 0x8000u ? (crc << 1) ^ 0x1021u : crc << 1;
    crc &= 0xffffu;
  }
  return (uint16_t)crc;
}

unsigned tg__key_slot(const void *name, size_t len) {
  const char *s = name;
  const char *open = memchr(s, '{', len);
  if (open) {
    size_t from = (size_t)(open - s) + 1;
    const char *close = memchr(s + from, '}', len - from);
    if (close && close > s + from)
      return tg__crc16(s + from, (size_t)(close - (s + from))) &
             (TG__SLOTS - 1);
  }
  return tg__crc16(s, len) & (TG__SLOTS - 1);
}

int tg__slotmap_init(tg__slotmap *m) {
  memset(m, 0, sizeof *m);
  return pthread_mutex_init(&m->mu, NULL) == 0 ? TG_OK : TG_ENOMEM;
}

void tg__slotmap_free(tg__slotmap *m) {
  uint32_t n = tg__slotmap_count(m);
  for (uint32_t i = 0; i < n; i++)
    free(m->nodes[i].host);
  pthread_mutex_destroy(&m->mu);
}

uint32_t tg__slotmap_count(const tg__slotmap *m) {
  return (uint32_t)tg__load_acquire(&m->nnodes);
}

const tg__node *tg__slotmap_addr(const tg__slotmap *m, uint32_t id) {
  return &m->nodes[id];
}

uint32_t tg__slotmap_node(tg__slotmap *m, const char *host, size_t host_len,
                          int port) {
  if (host_len > TG__HOST_MAX)
    return TG__NO_NODE;
  pthread_mutex_lock(&m->mu);
  uint32_t n = (uint32_t)tg__load_relaxed(&m->nnodes), id = TG__NO_NODE;
  for (uint32_t i = 0; i < n && id == TG__NO_NODE; i++) {
    const tg__node *d = &m->nodes[i];
    if (d->port == port && strlen(d->host) == host_len &&
        memcmp(d->host, host, host_len) == 0)
      id = i;
  }
  if (id == TG__NO_NODE && n < TG__NODES_MAX) {
    char *h = malloc(host_len + 1);
    if (h) {
      memcpy(h, host, host_len);
      h[host_len] = '\0';
      m->nodes[n].host = h;
      m->nodes[n].port = port;
      /* the address is written before the count that publishes it */
      tg__store_release(&m->nnodes, n + 1);
      id = n;
    }
  }
  pthread_mutex_unlock(&m->mu);
  return id;
}

uint32_t tg__slotmap_get(const tg__slotmap *m, unsigned slot) {
  /* acquire: the node's address was published before its id got here */
  uint64_t v = tg__load_acquire(&m->slot[slot & (TG__SLOTS - 1)]);
  return v ? (uint32_t)(v - 1) : TG__NO_NODE;
}

void tg__slotmap_set(tg__slotmap *m, unsigned slot, uint32_t id) {
  uint64_t v = id == TG__NO_NODE ? 0 : (uint64_t)id + 1;
  pthread_mutex_lock(&m->mu);
  tg__store_release(&m->slot[slot & (TG__SLOTS - 1)], v);
  pthread_mutex_unlock(&m->mu);
}

void tg__slotmap_replace(tg__slotmap *m, const uint32_t *ids) {
  pthread_mutex_lock(&m->mu);
  for (unsigned s = 0; s < TG__SLOTS; s++)
    tg__store_release(&m->slot[s],
                      ids[s] == TG__NO_NODE ? 0 : (uint64_t)ids[s] + 1);
  tg__fetch_add(&m->epoch, 1);
  pthread_mutex_unlock(&m->mu);
}

/* A decimal of 1..digits digits at [*p, end) with a value <= max. */
static bool scan_uint(const char **p, const char *end, unsigned digits,
                      unsigned long max, unsigned long *out) {
  const char *q = *p;
  unsigned long v = 0;
  while (q < end && *q >= '0' && *q <= '9' && (unsigned)(q - *p) < digits) {
    v = v * 10 + (unsigned long)(*q - '0');
    q++;
  }
  if (q == *p || v > max)
    return false;
  *p = q;
  *out = v;
  return true;
}

bool tg__parse_hostport(const char *s, size_t len, const char **host,
                        size_t *host_len, int *port) {
  const char *end = s + len, *colon = NULL;
  for (const char *q = s; q < end; q++)
    if (*q == ':')
      colon = q;
  if (!colon)
    return false;
  const char *h = s, *he = colon;
  if (he > h && *h == '[') {
    if (he[-1] != ']')
      return false;
    h++;
    he--;
  }
  const char *p = colon + 1;
  unsigned long v;
  if (!scan_uint(&p, end, 5, 65535, &v) || p != end || v == 0 ||
      (size_t)(he - h) > TG__HOST_MAX)
    return false;
  for (const char *q = h; q < he; q++)
    if (*q <= ' ' || *q > '~' || *q == ',' || *q == '[' || *q == ']')
      return false; /* not a name or an address */
  *host = h;
  *host_len = (size_t)(he - h);
  *port = (int)v;
  return true;
}

bool tg__parse_redirect(const char *s, size_t len, tg__redirect *out) {
  const char *end = s + len, *p;
  if (len > 6 && memcmp(s, "MOVED ", 6) == 0) {
    out->ask = false;
    p = s + 6;
  } else if (len > 4 && memcmp(s, "ASK ", 4) == 0) {
    out->ask = true;
    p = s + 4;
  } else {
    return false;
  }
  unsigned long slot;
  if (!scan_uint(&p, end, 5, TG__SLOTS - 1, &slot) || p == end || *p != ' ')
    return false;
  p++;
  out->slot = (unsigned)slot;
  const char *q = p + 1;
  unsigned long v;
  if (p < end && *p == ':' && scan_uint(&q, end, 5, 65535, &v) && q == end) {
    if (v == 0) /* ":port": the sender's own host */
      return false;
    out->host = p;
    out->host_len = 0;
    out->port = (int)v;
    return true;
  }
  return tg__parse_hostport(p, (size_t)(end - p), &out->host, &out->host_len,
                            &out->port);
}

int tg__cluster_seeds(tg__slotmap *m, const char *list) {
  if (!list)
    return TG_EINVAL;
  const char *p = list;
  unsigned n = 0;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *host;
    size_t host_len;
    int port;
    if (++n > TG__SEEDS_MAX ||
        !tg__parse_hostport(p, len, &host, &host_len, &port) || host_len == 0)
      return TG_EINVAL;
    if (tg__slotmap_node(m, host, host_len, port) == TG__NO_NODE)
      return TG_ENOMEM;
    if (!comma)
      return TG_OK;
    p = comma + 1;
  }
}
