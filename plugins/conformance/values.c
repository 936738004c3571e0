/* values.c — the values `ddplug conformance` sends and the
 * results it expects. Inputs are small integers (exact in every dtype,
 * float16 and bfloat16 included), chosen per op so that no result
 * overflows int8 for up to 24 ranks and every op's result differs from
 * every other op's on some element; signed types get negative values, so
 * that AVG's truncation toward zero is checked. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "conformance.h"

int cf_is_integer(int dtype) {
  return dtype == DDPLUG_INT8 || dtype == DDPLUG_UINT8 || dtype == DDPLUG_INT32 ||
         dtype == DDPLUG_INT64;
}

int cf_op_valid(int dtype, int op) {
  return (op != DDPLUG_OP_BOR && op != DDPLUG_OP_BAND) || cf_is_integer(dtype);
}

double cf_input(int dtype, int op, int rank, uint64_t i) {
  int neg = dtype != DDPLUG_UINT8; /* room for negative values */
  long long r = rank, k = (long long)(i % 1000003);
  switch (op) {
    case DDPLUG_OP_SUM:
    case DDPLUG_OP_AVG:
      return (double)((r % 3) + (k % 4) - (neg ? 3 : 0));
    case DDPLUG_OP_MIN:
    case DDPLUG_OP_MAX:
      return (double)(((k * 7 + r * 3) % 11) - (neg ? 5 : 0));
    case DDPLUG_OP_PROD:
      if (neg && (k + r) % 5 == 0) return -1.0;
      return (k + r) % 4 == 0 ? 2.0 : 1.0;
    case DDPLUG_OP_BOR:
    case DDPLUG_OP_BAND:
      return (double)((1 << ((k + r) % 5)) | ((k % 3) << 5));
    default: /* broadcast / allgather payload: rank and position */
      return (double)((r % 10) * 10 + (k % 10));
  }
}

double cf_expected(int dtype, int op, int world, uint64_t i) {
  double acc = cf_input(dtype, op, 0, i);
  long long bits = (long long)acc;
  for (int r = 1; r < world; r++) {
    double v = cf_input(dtype, op, r, i);
    switch (op) {
      case DDPLUG_OP_SUM:
      case DDPLUG_OP_AVG: acc += v; break;
      case DDPLUG_OP_MIN: acc = v < acc ? v : acc; break;
      case DDPLUG_OP_MAX: acc = v > acc ? v : acc; break;
      case DDPLUG_OP_PROD: acc *= v; break;
      case DDPLUG_OP_BOR: bits |= (long long)v; break;
      case DDPLUG_OP_BAND: bits &= (long long)v; break;
      default: break;
    }
  }
  if (op == DDPLUG_OP_BOR || op == DDPLUG_OP_BAND) return (double)bits;
  if (op == DDPLUG_OP_AVG) {
    if (cf_is_integer(dtype)) return (double)((long long)acc / world); /* toward zero */
    return acc / world;
  }
  return acc;
}

/* float <-> IEEE half (round to nearest even), and bfloat16 (the top half
 * of a float32, rounded to nearest even). */
static uint16_t to_half(float f) {
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

static float from_half(uint16_t h) {
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

static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float from_bf16(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

void cf_put(int dtype, void *buf, uint64_t i, double v) {
  switch (dtype) {
    case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DDPLUG_FLOAT64: ((double *)buf)[i] = v; break;
    case DDPLUG_FLOAT16: ((uint16_t *)buf)[i] = to_half((float)v); break;
    case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case DDPLUG_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DDPLUG_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DDPLUG_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
  }
}

double cf_get(int dtype, const void *buf, uint64_t i) {
  switch (dtype) {
    case DDPLUG_FLOAT32: return ((const float *)buf)[i];
    case DDPLUG_FLOAT64: return ((const double *)buf)[i];
    case DDPLUG_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
    case DDPLUG_BFLOAT16: return from_bf16(((const uint16_t *)buf)[i]);
    case DDPLUG_INT8: return ((const int8_t *)buf)[i];
    case DDPLUG_UINT8: return ((const uint8_t *)buf)[i];
    case DDPLUG_INT32: return ((const int32_t *)buf)[i];
    case DDPLUG_INT64: return (double)((const int64_t *)buf)[i];
    default: return NAN;
  }
}

int cf_same(int dtype, int op, double got, double want) {
  if (op != DDPLUG_OP_AVG || cf_is_integer(dtype)) return got == want;
  /* AVG of floats: one rounding of the division in the dtype's precision
   * (and an implementation may divide before or after summing). */
  double eps = dtype == DDPLUG_FLOAT16 ? 1e-3 : dtype == DDPLUG_BFLOAT16 ? 8e-3
               : dtype == DDPLUG_FLOAT32 ? 1e-6 : 1e-12;
  return fabs(got - want) <= eps * (fabs(want) > 1 ? fabs(want) : 1) * 4;
}
