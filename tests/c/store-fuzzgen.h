/*
 * store-fuzzgen.h — a deterministic generator of store request frames for
 * the fuzz tests: well-formed requests of every type with random fields
 * (keys from a small set so requests interact), and mutations of them
 * (bit flips, overwrites, cuts, extensions, wrong lengths, extreme 16-bit
 * fields). Seeded, so a failing run can be replayed.
 */
#ifndef DDPLUG_STORE_FUZZGEN_H
#define DDPLUG_STORE_FUZZGEN_H

#include <stdio.h>

#include "store/store.h"

static uint64_t g_fuzz_rng = 1;
static inline void fuzz_seed(uint64_t seed) { g_fuzz_rng = seed ? seed : 1; }
static inline uint32_t rnd(void) { /* xorshift64* */
  g_fuzz_rng ^= g_fuzz_rng >> 12;
  g_fuzz_rng ^= g_fuzz_rng << 25;
  g_fuzz_rng ^= g_fuzz_rng >> 27;
  return (uint32_t)((g_fuzz_rng * 2685821657736338717ull) >> 32);
}
static inline uint32_t rnd_below(uint32_t n) { return n ? rnd() % n : 0; }

static inline void fuzz_key(ddplug__sbuf *b) {
  char k[8];
  int n = snprintf(k, sizeof k, "f/%u", rnd_below(12));
  ddplug__sbuf_key(b, k, (size_t)n);
}

static inline void fuzz_value(ddplug__sbuf *b) {
  uint32_t n = rnd_below(4) == 0 ? rnd_below(5000) : rnd_below(24);
  ddplug__sbuf_u32(b, n);
  for (uint32_t i = 0; i < n; i++) ddplug__sbuf_u8(b, (uint8_t)('0' + rnd_below(10)));
}

/* A well-formed request of a random type. */
static inline void fuzz_valid(ddplug__sbuf *b) {
  static const uint8_t types[] = {
      DDPLUG__STORE_SET,  DDPLUG__STORE_GET,    DDPLUG__STORE_ADD,
      DDPLUG__STORE_CAS,  DDPLUG__STORE_DELETE, DDPLUG__STORE_WAIT,
      DDPLUG__STORE_ON_DISCONNECT, DDPLUG__STORE_BYE, DDPLUG__STORE_AUTH};
  uint8_t t = types[rnd_below(sizeof types)];
  ddplug__sbuf_frame_begin(b, t, rnd());
  switch (t) {
    case DDPLUG__STORE_SET:
    case DDPLUG__STORE_ON_DISCONNECT:
      fuzz_key(b);
      fuzz_value(b);
      break;
    case DDPLUG__STORE_GET:
      ddplug__sbuf_u32(b, rnd_below(3) ? rnd_below(150) : 0);
      fuzz_key(b);
      break;
    case DDPLUG__STORE_ADD:
      fuzz_key(b);
      ddplug__sbuf_i64(b, (int64_t)rnd() - (int64_t)rnd() * (rnd_below(8) ? 1 : (1ll << 31)));
      break;
    case DDPLUG__STORE_CAS: {
      fuzz_key(b);
      uint8_t present = (uint8_t)rnd_below(2);
      ddplug__sbuf_u8(b, present);
      if (present) fuzz_value(b);
      fuzz_value(b);
      break;
    }
    case DDPLUG__STORE_DELETE:
      fuzz_key(b);
      break;
    case DDPLUG__STORE_WAIT: {
      ddplug__sbuf_u32(b, rnd_below(150));
      uint16_t n = (uint16_t)(1 + rnd_below(6));
      ddplug__sbuf_u16(b, n);
      for (uint16_t i = 0; i < n; i++) fuzz_key(b);
      break;
    }
    case DDPLUG__STORE_AUTH: {
      ddplug__sbuf_u8(b, (uint8_t)rnd_below(2));
      for (int i = 0; i < 64; i++) ddplug__sbuf_u8(b, (uint8_t)rnd());
      break;
    }
    default:
      break;
  }
  ddplug__sbuf_frame_end(b);
}

/* Flip bits, overwrite bytes, cut, extend or re-length the frame. */
static inline void fuzz_mutate(ddplug__sbuf *b) {
  int rounds = 1 + (int)rnd_below(3);
  for (int r = 0; r < rounds && b->len > 0; r++) {
    switch (rnd_below(6)) {
      case 0:
        b->data[rnd_below((uint32_t)b->len)] ^= (uint8_t)(1u << rnd_below(8));
        break;
      case 1:
        b->data[rnd_below((uint32_t)b->len)] = (uint8_t)rnd();
        break;
      case 2:
        b->len = rnd_below((uint32_t)b->len);
        break;
      case 3:
        for (uint32_t i = rnd_below(16); i > 0; i--) ddplug__sbuf_u8(b, (uint8_t)rnd());
        break;
      case 4:
        if (b->len >= 4) {
          uint32_t l = rnd_below(3) ? (uint32_t)b->len - 4 + rnd_below(9) - 4 : rnd();
          b->data[0] = (uint8_t)(l >> 24);
          b->data[1] = (uint8_t)(l >> 16);
          b->data[2] = (uint8_t)(l >> 8);
          b->data[3] = (uint8_t)l;
        }
        break;
      default: /* a 16-bit field somewhere gets an extreme value */
        if (b->len >= 12) {
          size_t at = 10 + rnd_below((uint32_t)b->len - 11);
          uint16_t v = rnd_below(2) ? 0xffff : 0;
          b->data[at] = (uint8_t)(v >> 8);
          b->data[at + 1] = (uint8_t)v;
        }
        break;
    }
  }
}

#endif
