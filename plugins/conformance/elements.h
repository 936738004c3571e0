/* elements.h — one element of any ddplug dtype, read and written as a
 * double: what the conformance suite sends and checks, and what the nccl
 * plugin's tests (tests/c/nccl_test_values.h) compute their references
 * with. float16 (IEEE binary16) and bfloat16 are converted with round to
 * nearest even, subnormals, infinities and NaN included. Header-only, so
 * the `ddplug` command carries it without depending on tests/. The
 * plugins convert with code of their own: this is the reference they are
 * checked against. */
#ifndef DDPLUG_CONFORMANCE_ELEMENTS_H
#define DDPLUG_CONFORMANCE_ELEMENTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ddplug/common.h"

static inline uint16_t cf_float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static inline float cf_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while (!(mant & 0x400u));
      x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* bfloat16: the top half of a float32, rounded to nearest even. */
static inline uint16_t cf_float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static inline float cf_bf16_to_float(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* Store v as element i of a buffer of dtype (converted as a cast would,
 * half types rounded to nearest even). An unknown dtype stores nothing. */
static inline void cf_put(int dtype, void *buf, uint64_t i, double v) {
  switch (dtype) {
    case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DDPLUG_FLOAT64: ((double *)buf)[i] = v; break;
    case DDPLUG_FLOAT16: ((uint16_t *)buf)[i] = cf_float_to_half((float)v); break;
    case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = cf_float_to_bf16((float)v); break;
    case DDPLUG_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DDPLUG_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DDPLUG_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
  }
}

/* Element i of a buffer of dtype; NaN for an unknown dtype. */
static inline double cf_get(int dtype, const void *buf, uint64_t i) {
  switch (dtype) {
    case DDPLUG_FLOAT32: return ((const float *)buf)[i];
    case DDPLUG_FLOAT64: return ((const double *)buf)[i];
    case DDPLUG_FLOAT16: return cf_half_to_float(((const uint16_t *)buf)[i]);
    case DDPLUG_BFLOAT16: return cf_bf16_to_float(((const uint16_t *)buf)[i]);
    case DDPLUG_INT8: return ((const int8_t *)buf)[i];
    case DDPLUG_UINT8: return ((const uint8_t *)buf)[i];
    case DDPLUG_INT32: return ((const int32_t *)buf)[i];
    case DDPLUG_INT64: return (double)((const int64_t *)buf)[i];
    default: return NAN;
  }
}

#endif /* DDPLUG_CONFORMANCE_ELEMENTS_H */
