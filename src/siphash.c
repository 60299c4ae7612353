/* SPDX-License-Identifier: MIT */
/*
 * siphash.c - SipHash-1-3 (the tables' hash), SipHash-2-4 and the random
 * key, see siphash.h.
 */
#include "siphash.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static inline uint64_t rotl(uint64_t x, unsigned b) {
  return (x << b) | (x >> (64 - b));
}

/* Little-endian load of 8 bytes, whatever the host order. */
static inline uint64_t load64_le(const unsigned char *p) {
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
         (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
         (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

#define SIPROUND                                                               \
  do {                                                                         \
    v0 += v1;                                                                  \
    v1 = rotl(v1, 13);                                                         \
    v1 ^= v0;                                                                  \
    v0 = rotl(v0, 32);                                                         \
    v2 += v3;                                                                  \
    v3 = rotl(v3, 16);                                                         \
    v3 ^= v2;                                                                  \
    v0 += v3;                                                                  \
    v3 = rotl(v3, 21);                                                         \
    v3 ^= v0;                                                                  \
    v2 += v1;                                                                  \
    v1 = rotl(v1, 17);                                                         \
    v1 ^= v2;                                                                  \
    v2 = rotl(v2, 32);                                                         \
  } while (0)

/* SipHash-c-d: c rounds per message block, d to finish. */
static inline __attribute__((always_inline)) uint64_t
siphash_cd(const uint64_t k[2], const void *data, size_t len, unsigned c,
           unsigned d) {
  const unsigned char *p = data;
  uint64_t v0 = k[0] ^ UINT64_C(0x736f6d6570736575);
  uint64_t v1 = k[1] ^ UINT64_C(0x646f72616e646f6d);
  uint64_t v2 = k[0] ^ UINT64_C(0x6c7967656e657261);
  uint64_t v3 = k[1] ^ UINT64_C(0x7465646279746573);
  const unsigned char *end = p + (len & ~(size_t)7);
  for (; p != end; p += 8) {
    uint64_t m = load64_le(p);
    v3 ^= m;
    for (unsigned r = 0; r < c; r++)
      SIPROUND;
    v0 ^= m;
  }
  /* last block: the remaining 0..7 bytes, length mod 256 in the top byte */
  uint64_t b = (uint64_t)len << 56;
  switch (len & 7) {
  case 7:
    b |= (uint64_t)p[6] << 48; /* fall through */
  case 6:
    b |= (uint64_t)p[5] << 40; /* fall through */
  case 5:
    b |= (uint64_t)p[4] << 32; /* fall through */
  case 4:
    b |= (uint64_t)p[3] << 24; /* fall through */
  case 3:
    b |= (uint64_t)p[2] << 16; /* fall through */
  case 2:
    b |= (uint64_t)p[1] << 8; /* fall through */
  case 1:
    b |= (uint64_t)p[0];
    break;
  default:
    break;
  }
  v3 ^= b;
  for (unsigned r = 0; r < c; r++)
    SIPROUND;
  v0 ^= b;
  v2 ^= 0xff;
  for (unsigned r = 0; r < d; r++)
    SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t tg__siphash(const uint64_t k[2], const void *data, size_t len) {
  return siphash_cd(k, data, len, 1, 3);
}

uint64_t tg__siphash24(const uint64_t k[2], const void *data, size_t len) {
  return siphash_cd(k, data, len, 2, 4);
}

int tg__siphash_random_key(uint64_t k[2]) {
  unsigned char buf[16];
  size_t got = 0;
  while (got < sizeof buf) {
    ssize_t n = getrandom(buf + got, sizeof buf - got, 0);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    break;
  }
  if (got < sizeof buf) { /* old kernel or seccomp: try the device */
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return -1;
    got = 0;
    while (got < sizeof buf) {
      ssize_t n = read(fd, buf + got, sizeof buf - got);
      if (n > 0)
        got += (size_t)n;
      else if (!(n < 0 && errno == EINTR))
        break;
    }
    close(fd);
    if (got < sizeof buf)
      return -1;
  }
  k[0] = load64_le(buf);
  k[1] = load64_le(buf + 8);
  return 0;
}
