/* SPDX-License-Identifier: MIT */
/*
 * siphash.h - SipHash-c-d (Aumasson & Bernstein), written from the paper:
 * SipHash-1-3 for the tables, SipHash-2-4 for its published vectors.
 *
 * Keys come from attackers (IPs, API tokens), so every table hashes them with
 * SipHash under a random per-table 128-bit key: an attacker who cannot learn
 * the key cannot aim many keys at one bucket.
 */
#ifndef TG_SIPHASH_H
#define TG_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-1-3 of data[0..len) under key k (k[0] = first 8 key bytes read
 * little-endian, k[1] = the next 8): the tables' and the deny cache's hash. */
uint64_t tg__siphash(const uint64_t k[2], const void *data, size_t len);

/* SipHash-2-4, the same way: the paper's default, whose published vectors
 * check the code both share (and the benchmarks' yardstick). */
uint64_t tg__siphash24(const uint64_t k[2], const void *data, size_t len);

/* Fills k with 16 random bytes from the kernel (getrandom, falling back to
 * /dev/urandom). Returns 0, or -1 if no randomness could be had. */
int tg__siphash_random_key(uint64_t k[2]);

#endif /* TG_SIPHASH_H */
