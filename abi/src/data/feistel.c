/* sampler_feistel.c — a keyed bijection of [0, N): the permutation behind
 * every shuffled sampler (and the audit's sampled mode).
 *
 * Algorithm (deterministic on every machine: fixed-width integer arithmetic
 * only, no floating point, no platform-dependent types):
 *
 *  1. Domain. b = max(2, ceil(log2 N)) bits, so 2^b is in [N, 2N) for
 *     N >= 3; for N <= 2 the floor of 2 bits makes 2^b = 4. A value x < 2^b
 *     is split into a left half of a = ceil(b/2) bits and a right half of
 *     c = floor(b/2) bits (a, c <= 32 because N < 2^64).
 *  2. Rounds. Four rounds of an unbalanced Feistel network. One round maps
 *     (L: p bits, R: q bits) to (R: q bits, (L ^ F(R, k_r)) mod 2^p: p bits);
 *     it is invertible (R is kept, L is recovered by xoring F(R) again), so
 *     the composition is a bijection of [0, 2^b). Widths alternate (a,c),
 *     (c,a), (a,c), (c,a), so after the even number of rounds the layout is
 *     (a,c) again and x' = L << c | R.
 *  3. Round function. F(R, k) = mix32(R ^ k), where mix32 is a 32-bit
 *     avalanche (xorshift-multiply, constants 0x7feb352d and 0x846ca68b).
 *  4. Keys. k_0..k_3 are the low 32 bits of four successive splitmix64
 *     outputs from a state derived from (seed, epoch, salt): a new epoch or
 *     seed is a new, independent-looking permutation, computed in O(1).
 *  5. Cycle walking. pi(i) = E(i) if E(i) < N, else E(E(i)), ... : the first
 *     value of i's cycle under E that lands back in [0, N). Because E is a
 *     bijection of [0, 2^b) this is a bijection of [0, N); as 2^b < 2N
 *     (N >= 3) the expected number of E evaluations per index is
 *     2^b / N < 2 (N = 2: 2; N = 1: 4; N = 0 has no index to map).
 *
 * Memory is the struct (40 bytes) whatever N; any pi(i) costs O(1) expected
 * time, so any rank computes only its own slice and any position resumes
 * directly. ddplug__feistel_map evaluates a run of inputs in fixed blocks
 * whose straight-line loop the compiler vectorises (an AVX2 clone on x86-64
 * where the CPU has it — the same integer results on every path), then walks
 * the few cycles that left the domain.
 *
 * SPDX-License-Identifier: Apache-2.0 */
#include "data/data.h"

#include <string.h>

_Static_assert(sizeof(ddplug__feistel) == 40,
               "the header comment gives the permutation's size: keep it true");

/* splitmix64: the standard 64-bit state-advancing mixer (Steele, Lea,
 * Flood 2014); used for key derivation only. */
static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint32_t round_fn(uint32_t r, uint32_t k) {
  uint32_t x = r ^ k;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

static inline uint32_t low_mask(uint32_t bits) {
  return (uint32_t)((1ull << bits) - 1ull);
}

int ddplug__feistel_init(ddplug__feistel *f, uint64_t n, uint64_t seed,
                         uint64_t epoch, uint64_t salt) {
  memset(f, 0, sizeof *f);
  f->n = n;
  uint32_t bits = 2;
  while (bits < 64 && (1ull << bits) < n) bits++;
  f->bits_hi = (bits + 1) / 2;
  f->bits_lo = bits / 2;
  f->mask_hi = low_mask(f->bits_hi);
  f->mask_lo = low_mask(f->bits_lo);
  uint64_t state = seed;
  uint64_t s1 = splitmix64(&state);
  state = s1 ^ (epoch * 0xd6e8feb86659fd93ull);
  uint64_t s2 = splitmix64(&state);
  state = s2 ^ (salt * 0xa0761d6478bd642full);
  for (int r = 0; r < DDPLUG__FEISTEL_ROUNDS; r++)
    f->key[r] = (uint32_t)splitmix64(&state);
  return DDPLUG_OK;
}

/* One application of E on a b-bit value. */
static inline uint64_t encrypt(const ddplug__feistel *f, uint64_t x) {
  const uint32_t c = f->bits_lo, a = f->bits_hi;
  const uint32_t ma = f->mask_hi, mc = f->mask_lo;
  uint32_t L = (uint32_t)(x >> c), R = (uint32_t)x & mc, t;
  /* (a,c) -> (c,a) -> (a,c) -> (c,a) -> (a,c) */
  t = (L ^ round_fn(R, f->key[0])) & ma; L = R; R = t;
  t = (L ^ round_fn(R, f->key[1])) & mc; L = R; R = t;
  t = (L ^ round_fn(R, f->key[2])) & ma; L = R; R = t;
  t = (L ^ round_fn(R, f->key[3])) & mc; L = R; R = t;
  (void)a;
  return ((uint64_t)L << c) | R;
}

uint64_t ddplug__feistel_apply(const ddplug__feistel *f, uint64_t i) {
  uint64_t y = encrypt(f, i);
  while (y >= f->n) y = encrypt(f, y);
  return y;
}

/* Blocks of BLOCK values: the fixed trip count and local arrays let the
 * vectoriser replace each loop whole. */
#define BLOCK 64
/* Values handled per window of ddplug__feistel_map. */
#define WINDOW 1024

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DDPLUG__CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DDPLUG__CLONES
#endif

/* The four rounds on BLOCK split values, in place. */
static inline void rounds_block(const ddplug__feistel *f, uint32_t *restrict L,
                                uint32_t *restrict R) {
  const uint32_t ma = f->mask_hi, mc = f->mask_lo;
  const uint32_t k0 = f->key[0], k1 = f->key[1], k2 = f->key[2],
                 k3 = f->key[3];
  for (int t = 0; t < BLOCK; t++) {
    uint32_t l = L[t], r = R[t], u;
    u = (l ^ round_fn(r, k0)) & ma; l = r; r = u;
    u = (l ^ round_fn(r, k1)) & mc; l = r; r = u;
    u = (l ^ round_fn(r, k2)) & ma; l = r; r = u;
    u = (l ^ round_fn(r, k3)) & mc; l = r; r = u;
    L[t] = l;
    R[t] = r;
  }
}

/* y[t] = E(start + t*stride) for t < BLOCK. */
DDPLUG__CLONES
static void encrypt_progression(const ddplug__feistel *f, uint64_t start,
                                uint64_t stride, uint64_t *restrict y) {
  const uint32_t c = f->bits_lo, mc = f->mask_lo;
  uint32_t L[BLOCK], R[BLOCK];
  for (int t = 0; t < BLOCK; t++) {
    uint64_t x = start + (uint64_t)t * stride;
    L[t] = (uint32_t)(x >> c);
    R[t] = (uint32_t)x & mc;
  }
  rounds_block(f, L, R);
  for (int t = 0; t < BLOCK; t++) y[t] = ((uint64_t)L[t] << c) | R[t];
}

/* v[t] = E(v[t]) for t < BLOCK. */
DDPLUG__CLONES
static void encrypt_array(const ddplug__feistel *f, uint64_t *restrict v) {
  const uint32_t c = f->bits_lo, mc = f->mask_lo;
  uint32_t L[BLOCK], R[BLOCK];
  for (int t = 0; t < BLOCK; t++) {
    L[t] = (uint32_t)(v[t] >> c);
    R[t] = (uint32_t)v[t] & mc;
  }
  rounds_block(f, L, R);
  for (int t = 0; t < BLOCK; t++) v[t] = ((uint64_t)L[t] << c) | R[t];
}

/* One window of m <= WINDOW outputs. The first pass encrypts every input;
 * the values that left [0, n) are compacted (branch-free) into a list and
 * encrypted again, block by block, until none is left — every E evaluation
 * runs in the vectorised loop, and no branch depends on the data. */
static void map_window(const ddplug__feistel *f, uint64_t start,
                       uint64_t stride, uint32_t m, int64_t *out) {
  uint64_t y[WINDOW];
  uint64_t vals[WINDOW];
  uint32_t pend[WINDOW];
  const uint64_t n = f->n;
  for (uint32_t b = 0; b < m; b += BLOCK)
    encrypt_progression(f, start + (uint64_t)b * stride, stride, y + b);
  uint32_t np = 0;
  for (uint32_t t = 0; t < m; t++) {
    uint64_t v = y[t];
    out[t] = (int64_t)v;
    pend[np] = t;
    vals[np] = v;
    np += v >= n;
  }
  while (np > 0) {
    uint32_t padded = (np + BLOCK - 1) / BLOCK * BLOCK;
    for (uint32_t k = np; k < padded; k++) vals[k] = 0;
    for (uint32_t b = 0; b < padded; b += BLOCK) encrypt_array(f, vals + b);
    uint32_t keep = 0;
    for (uint32_t k = 0; k < np; k++) {
      uint32_t t = pend[k];
      uint64_t v = vals[k];
      out[t] = (int64_t)v;
      pend[keep] = t;
      vals[keep] = v;
      keep += v >= n;
    }
    np = keep;
  }
}

void ddplug__feistel_map(const ddplug__feistel *f, uint64_t start,
                         uint64_t stride, uint64_t count, int64_t *out) {
  while (count > 0) {
    uint32_t m = count < WINDOW ? (uint32_t)count : WINDOW;
    map_window(f, start, stride, m, out);
    out += m;
    count -= m;
    start += (uint64_t)m * stride;
  }
}
