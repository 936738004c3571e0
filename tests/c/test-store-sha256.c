/* test-store-sha256.c — SHA-256 against the FIPS 180-4 / NIST example
 * vectors, padding-boundary lengths, incremental feeding, and HMAC-SHA256
 * against the RFC 4231 test cases (the store's authentication uses both). */
#include <stdlib.h>

#include "harness.h"
#include "store/store.h"

static void hex(const uint8_t *d, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *data, size_t len, const char *want) {
  uint8_t d[32];
  char h[65];
  ddplug__sha256(data, len, d);
  hex(d, 32, h);
  CHECK_EQ_STR(h, want);
}

TEST(sha256_fips_vectors) {
  check_sha("abc", 3,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  check_sha("", 0,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  check_sha(m448, strlen(m448),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *m896 =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmno"
      "pjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
  check_sha(m896, strlen(m896),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  char *million = malloc(1000000);
  memset(million, 'a', 1000000);
  check_sha(million, 1000000,
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(million);
}

/* Messages whose length puts the padding at every edge of a block
 * (reference digests computed independently). */
TEST(sha256_padding_boundaries) {
  static const struct {
    size_t len;
    const char *digest;
  } v[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {127, "a8d23e75d936f303d248888d9b165ee543f4cbafcad3c9dd2a79bd84faa11d07"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
  };
  uint8_t msg[128];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 7 + 3);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(v); i++) check_sha(msg, v[i].len, v[i].digest);
}

TEST(sha256_incremental_equals_one_shot) {
  uint8_t msg[300];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 131 + 17);
  for (size_t len = 0; len <= sizeof msg; len += 7) {
    uint8_t one[32], inc[32];
    ddplug__sha256(msg, len, one);
    for (size_t step = 1; step <= 70; step += 23) {
      ddplug__sha256_ctx c;
      ddplug__sha256_init(&c);
      for (size_t off = 0; off < len; off += step)
        ddplug__sha256_update(&c, msg + off, DDPLUG__MIN(step, len - off));
      ddplug__sha256_final(&c, inc);
      CHECK_MSG(memcmp(one, inc, 32) == 0, "len %zu step %zu differs", len, step);
    }
  }
}

static void check_hmac(const void *key, size_t klen, const void *msg,
                       size_t mlen, const char *want, size_t want_bytes) {
  uint8_t d[32];
  char h[65];
  ddplug__hmac_sha256(key, klen, msg, mlen, NULL, 0, d);
  hex(d, want_bytes, h);
  CHECK_EQ_STR(h, want);
  /* Splitting the message over msg1/msg2 gives the same MAC. */
  uint8_t d2[32];
  size_t half = mlen / 2;
  ddplug__hmac_sha256(key, klen, msg, half, (const uint8_t *)msg + half,
                      mlen - half, d2);
  CHECK(memcmp(d, d2, 32) == 0);
}

TEST(hmac_sha256_rfc4231_vectors) {
  uint8_t k[131];
  uint8_t m[50];
  memset(k, 0x0b, 20);
  check_hmac(k, 20, "Hi There", 8,
             "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32);
  check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32);
  memset(k, 0xaa, 20);
  memset(m, 0xdd, 50);
  check_hmac(k, 20, m, 50,
             "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32);
  for (int i = 0; i < 25; i++) k[i] = (uint8_t)(i + 1);
  memset(m, 0xcd, 50);
  check_hmac(k, 25, m, 50,
             "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32);
  memset(k, 0x0c, 20);
  check_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", 16);
  memset(k, 0xaa, 131);
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  check_hmac(k, 131, t6, strlen(t6),
             "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32);
  const char *t7 =
      "This is a test using a larger than block-size key and a larger than "
      "block-size data. The key needs to be hashed before being used by the "
      "HMAC algorithm.";
  check_hmac(k, 131, t7, strlen(t7),
             "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32);
}

TEST(constant_time_compare) {
  CHECK(ddplug__ct_equal("abcd", "abcd", 4));
  CHECK(!ddplug__ct_equal("abcd", "abce", 4));
  CHECK(!ddplug__ct_equal("xbcd", "abcd", 4));
  CHECK(ddplug__ct_equal("", "", 0));
}
