/* SPDX-License-Identifier: MIT */
/*
 * test_siphash.c - SipHash-2-4 against the 64 published test vectors of the
 * reference implementation (key 00 01 .. 0f, message 00 01 .. n-1 for
 * n = 0..63); SipHash-1-3, the tables' hash, against an independent
 * implementation (CPython's, see below); and properties of the random
 * per-table key: every table draws its own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "siphash.h"
#include "store/table.h"

static const uint64_t vectors[64] = {
    0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a,
    0x85676696d7fb7e2d, 0xcf2794e0277187b7, 0x18765564cd99a68d,
    0xcbc9466e58fee3ce, 0xab0200f58b01d137, 0x93f5f5799a932462,
    0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
    0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee,
    0xa129ca6149be45e5, 0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794,
    0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd, 0xbed65cf21aa2ee98,
    0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
    0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3,
    0x2f2e6163076bcfad, 0xde4daaaca71dc9a5, 0xa6a2506687956571,
    0xad87a3535c49ef28, 0x32d892fad841c342, 0x7127512f72f27cce,
    0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
    0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d,
    0x9abfd8766a33735c, 0x0e3ea96b5304a7d0, 0xad0c42d6fc585992,
    0x187306c89bc215a9, 0xd4a60abcf3792b95, 0xf935451de4f21df2,
    0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
    0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72,
    0xa192d576b245165a, 0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f,
    0x7fa8220ba3b2ecea, 0x245731c13ca42499, 0xb78dbfaf3a8d83bd,
    0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
    0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57,
    0x958a324ceb064572,
};

/* SipHash-1-3 under the all-zero key of message 00 01 .. n-1, n = 1..63:
 * CPython 3.11 hashes bytes with SipHash-1-3 (sys.hash_info.algorithm is
 * 'siphash13') and, run with PYTHONHASHSEED=0, under a zero key, so these
 * are `hash(bytes(range(n))) & (2**64 - 1)` printed by that interpreter
 * (none is one of the two values its -1 remapping touches). */
static const uint64_t vectors13[63] = {
    0x68a914128e01e473, 0x010bac45c41e3669, 0x4d4c9a4a8ef6e0ad,
    0x7cc43f98813e4dbd, 0x5abe2169dff36275, 0xe3c25f87624f1cdb,
    0x2f098ab0c751325a, 0xead411e67ebe2eea, 0x75927f9d95124362,
    0xaf9f77a65ab51a1d, 0xfe64ce8b6617fcff, 0xa6baf4fb0f9fe1c2,
    0xa0cf3211850f8e0d, 0x7f86049379fbfe67, 0xf30eb725bb91c9ea,
    0x8972188433a5c5b7, 0x4883c49a2c009c1d, 0xadc2c0b63044067d,
    0x091f4a3329f87d19, 0x639e355ae68c0100, 0xb17bef2cb5213239,
    0xf8aeb1066236ccfe, 0x37332b1389daa4ff, 0x31185a47af932f3a,
    0xebf352e82ae23e2f, 0xed36ff242fe478b2, 0x2454d97d299299df,
    0x8cd57fe8130d0ac7, 0xbe98eb2faf0a0e85, 0xd427c34ee09470c6,
    0x169739443111d49b, 0x31ef8061c910629b, 0x7fb71d24dfa4c9f6,
    0x92771f49e836d389, 0x3c393cf6f0853bc3, 0xac77921fcc642bd3,
    0x422a9751192ff266, 0xc680ae8a8c584ddf, 0x6c76b6d34bb6d26b,
    0x95bc321ab41d8206, 0x908a3a97a6d37669, 0xfcaf3c64874dd0b4,
    0xf689479b32b84a44, 0xd857641079efd1fd, 0x8b581578722633f7,
    0x83cb09d35ea7bcd4, 0x8485f7f5ae725a0d, 0xfe1f2445ba50237f,
    0x23cece041d7866b0, 0x416687480b336c09, 0xf15960da7e7f3892,
    0xded6177b9826835a, 0xf80dae51668be6be, 0x17ecc6ee6647df18,
    0x5220d642b4a52110, 0xa4f0cf4ba4adc016, 0xe5125bb26d1f2976,
    0x851b0e75f580d256, 0x12605250a37e39ac, 0xd95a713568daebf1,
    0xcdcf4a42ec0dd605, 0xa5c708712b617164, 0x385d3e39e5f37359};

static void published_vectors(void **state) {
  (void)state;
  /* key bytes 00..0f read little-endian into two words */
  const uint64_t k[2] = {UINT64_C(0x0706050403020100),
                         UINT64_C(0x0f0e0d0c0b0a0908)};
  unsigned char msg[64];
  for (unsigned i = 0; i < sizeof msg; i++)
    msg[i] = (unsigned char)i;
  for (size_t n = 0; n < 64; n++) {
    uint64_t h = tg__siphash24(k, msg, n);
    if (h != vectors[n])
      print_error("length %zu: got %016llx\n", n, (unsigned long long)h);
    assert_int_equal(h, vectors[n]);
  }
}

static void siphash13_matches_cpython(void **state) {
  (void)state;
  const uint64_t k[2] = {0, 0};
  unsigned char msg[64];
  for (unsigned i = 0; i < sizeof msg; i++)
    msg[i] = (unsigned char)i;
  for (size_t n = 1; n < 64; n++) {
    uint64_t h = tg__siphash(k, msg, n);
    if (h != vectors13[n - 1])
      print_error("length %zu: got %016llx\n", n, (unsigned long long)h);
    assert_int_equal(h, vectors13[n - 1]);
  }
  /* and not the other variant under another name */
  assert_int_not_equal(tg__siphash(k, msg, 24), tg__siphash24(k, msg, 24));
}

static void unaligned_input_same_hash(void **state) {
  (void)state;
  const uint64_t k[2] = {1, 2};
  unsigned char buf[80];
  for (unsigned i = 0; i < sizeof buf; i++)
    buf[i] = (unsigned char)(i * 7 + 3);
  for (size_t off = 1; off < 8; off++) {
    unsigned char copy[72];
    for (size_t i = 0; i < 64; i++)
      copy[i] = buf[i];
    /* the same 64 bytes hashed from an odd address give the same value */
    for (size_t i = 0; i < 64; i++)
      buf[off + i] = copy[i];
    assert_int_equal(tg__siphash(k, copy, 64), tg__siphash(k, buf + off, 64));
  }
}

static void random_keys_differ(void **state) {
  (void)state;
  uint64_t a[2], b[2];
  assert_int_equal(tg__siphash_random_key(a), 0);
  assert_int_equal(tg__siphash_random_key(b), 0);
  /* 2^-128 chance of a false failure */
  assert_true(a[0] != b[0] || a[1] != b[1]);
  /* the key matters: the same input hashes differently under two keys */
  assert_int_not_equal(tg__siphash(a, "203.0.113.7", 11),
                       tg__siphash(b, "203.0.113.7", 11));
}

/* Issue 3: "keyed SipHash with a random per-table key". A table that used a
 * fixed key (or one key for the whole process) would pass every other test;
 * here tables created one after the other must hold different keys. */
static void tables_draw_their_own_key(void **state) {
  (void)state;
  const tg__table_params p = {
      .algorithm = TG_FIXED_WINDOW, .capacity = 4, .log_entries = 1};
  size_t bytes = tg__table_bytes(&p);
  assert_true(bytes > 0);
  bytes = (bytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
  uint64_t keys[3][2];
  for (int i = 0; i < 3; i++) {
    void *mem = aligned_alloc(64, bytes);
    assert_non_null(mem);
    memset(mem, 0, bytes);
    tg__table t;
    assert_int_equal(tg__table_init(&t, mem, &p), TG_OK);
    keys[i][0] = t.h->sip[0];
    keys[i][1] = t.h->sip[1];
    free(mem);
    assert_true(keys[i][0] != 0 || keys[i][1] != 0);
    for (int j = 0; j < i; j++) /* 2^-128 chance of a false failure */
      assert_true(keys[i][0] != keys[j][0] || keys[i][1] != keys[j][1]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(published_vectors),
      cmocka_unit_test(siphash13_matches_cpython),
      cmocka_unit_test(unaligned_input_same_hash),
      cmocka_unit_test(random_keys_differ),
      cmocka_unit_test(tables_draw_their_own_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
