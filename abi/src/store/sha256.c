/*
 * sha256.c — SHA-256 as specified in FIPS 180-4 (section 6.2) and HMAC as
 * specified in RFC 2104 / FIPS 198-1, used by the rendezvous store's
 * challenge-response authentication. Tested against the FIPS/NIST example
 * vectors and the RFC 4231 HMAC-SHA256 vectors (tests/c/test-store-sha256.c).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <string.h>

#include "store/store.h"

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube
 * roots of the first 64 primes. */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, unsigned n) {
  return (x >> n) | (x << (32 - n));
}

/* FIPS 180-4 4.1.2 functions. */
#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define BSIG0(x) (rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22))
#define BSIG1(x) (rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25))
#define SSIG0(x) (rotr(x, 7) ^ rotr(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (rotr(x, 17) ^ rotr(x, 19) ^ ((x) >> 10))

/* FIPS 180-4 6.2.2: process one 512-bit block. */
static void compress(uint32_t h[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
           (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
  for (int t = 16; t < 64; t++)
    w[t] = SSIG1(w[t - 2]) + w[t - 7] + SSIG0(w[t - 15]) + w[t - 16];
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  uint32_t e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t t1 = hh + BSIG1(e) + CH(e, f, g) + K[t] + w[t];
    uint32_t t2 = BSIG0(a) + MAJ(a, b, c);
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

/* Start a digest with the FIPS 180-4 5.3.3 initial hash value. */
void ddplug__sha256_init(ddplug__sha256_ctx *c) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                 0xa54ff53a, 0x510e527f, 0x9b05688c,
                                 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, H0, sizeof H0);
  c->total = 0;
  c->fill = 0;
}

/* Feed len bytes. Any length, any number of calls. */
void ddplug__sha256_update(ddplug__sha256_ctx *c, const void *data, size_t len) {
  const uint8_t *p = data;
  c->total += len;
  if (c->fill > 0) {
    size_t take = DDPLUG__MIN(len, DDPLUG__SHA256_BLOCK - c->fill);
    memcpy(c->block + c->fill, p, take);
    c->fill += take;
    p += take;
    len -= take;
    if (c->fill < DDPLUG__SHA256_BLOCK) return;
    compress(c->h, c->block);
    c->fill = 0;
  }
  while (len >= DDPLUG__SHA256_BLOCK) {
    compress(c->h, p);
    p += DDPLUG__SHA256_BLOCK;
    len -= DDPLUG__SHA256_BLOCK;
  }
  if (len > 0) {
    memcpy(c->block, p, len);
    c->fill = len;
  }
}

/* FIPS 180-4 5.1.1 padding (a 1 bit, zeros, the 64-bit bit length), then
 * the big-endian hash value. c must be re-initialised before reuse. */
void ddplug__sha256_final(ddplug__sha256_ctx *c, uint8_t out[DDPLUG__SHA256_LEN]) {
  uint64_t bits = c->total * 8u;
  uint8_t pad[DDPLUG__SHA256_BLOCK + 8] = {0x80};
  size_t padlen = (c->fill < 56) ? 56 - c->fill : 120 - c->fill;
  for (int i = 0; i < 8; i++) pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
  ddplug__sha256_update(c, pad, padlen + 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(c->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)c->h[i];
  }
}

void ddplug__sha256(const void *data, size_t len,
                    uint8_t out[DDPLUG__SHA256_LEN]) {
  ddplug__sha256_ctx c;
  ddplug__sha256_init(&c);
  ddplug__sha256_update(&c, data, len);
  ddplug__sha256_final(&c, out);
}

/* RFC 2104: H((K0 ^ opad) || H((K0 ^ ipad) || text)), K0 = the key padded
 * to the block size, or its digest if it is longer than a block. */
void ddplug__hmac_sha256(const void *key, size_t key_len, const void *msg1,
                         size_t len1, const void *msg2, size_t len2,
                         uint8_t out[DDPLUG__SHA256_LEN]) {
  uint8_t k0[DDPLUG__SHA256_BLOCK] = {0};
  if (key_len > DDPLUG__SHA256_BLOCK)
    ddplug__sha256(key, key_len, k0);
  else if (key_len > 0)
    memcpy(k0, key, key_len);
  uint8_t pad[DDPLUG__SHA256_BLOCK];
  uint8_t inner[DDPLUG__SHA256_LEN];
  ddplug__sha256_ctx c;

  for (int i = 0; i < DDPLUG__SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x36;
  ddplug__sha256_init(&c);
  ddplug__sha256_update(&c, pad, sizeof pad);
  if (len1) ddplug__sha256_update(&c, msg1, len1);
  if (len2) ddplug__sha256_update(&c, msg2, len2);
  ddplug__sha256_final(&c, inner);

  for (int i = 0; i < DDPLUG__SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x5c;
  ddplug__sha256_init(&c);
  ddplug__sha256_update(&c, pad, sizeof pad);
  ddplug__sha256_update(&c, inner, sizeof inner);
  ddplug__sha256_final(&c, out);
  memset(k0, 0, sizeof k0);
  memset(pad, 0, sizeof pad);
}

int ddplug__ct_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (uint8_t)(x[i] ^ y[i]);
  return diff == 0;
}
