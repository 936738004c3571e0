/* nccl_test_values.h — element values for the nccl plugin's tests: every
 * ddplug dtype read and written as double (float16 and bfloat16 converted
 * with round-to-nearest-even), the values rank r contributes (1..5: sums,
 * products of two and halves are exact in every dtype), and the reference
 * result of each reduce op. Shared by the GPU tests, the CUDA/NCCL fake and
 * the tests that run on it. */
#ifndef DDPLUG_NCCL_TEST_VALUES_H
#define DDPLUG_NCCL_TEST_VALUES_H

#include <stdint.h>
#include <string.h>

#include "ddplug/common.h"

/* float <-> half / bfloat16 (round to nearest even; test values are small
 * integers and halves, exact in every type). */
static inline uint16_t tv_f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if ((x & 0x7fffffffu) == 0) return sign;
  int32_t e = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
  uint32_t m = (x & 0x7fffffu) >> 13, rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) {
    if (++m == 0x400u) {
      m = 0;
      e++;
    }
  }
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) return sign; /* not used by these tests */
  return (uint16_t)(sign | ((uint32_t)e << 10) | m);
}

static inline float tv_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0 && m == 0) x = sign;
  else if (e == 31) x = sign | 0x7f800000u | (m << 13);
  else if (e == 0) { /* subnormal */
    float f = (float)m / 1024.0f / 16384.0f;
    return sign ? -f : f;
  } else x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static inline uint16_t tv_f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float tv_bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline size_t tv_dtype_size(int dt) {
  switch (dt) {
#define TV_SIZE(name, v, str, size) \
  case v:                           \
    return size;
    DDPLUG_DTYPE_MAP(TV_SIZE)
#undef TV_SIZE
    default:
      return 0;
  }
}

static inline void tv_put(int dt, void *buf, size_t i, double v) {
  switch (dt) {
    case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DDPLUG_FLOAT64: ((double *)buf)[i] = v; break;
    case DDPLUG_FLOAT16: ((uint16_t *)buf)[i] = tv_f2h((float)v); break;
    case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = tv_f2bf((float)v); break;
    case DDPLUG_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DDPLUG_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DDPLUG_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  }
}

static inline double tv_get(int dt, const void *buf, size_t i) {
  switch (dt) {
    case DDPLUG_FLOAT32: return ((const float *)buf)[i];
    case DDPLUG_FLOAT64: return ((const double *)buf)[i];
    case DDPLUG_FLOAT16: return tv_h2f(((const uint16_t *)buf)[i]);
    case DDPLUG_BFLOAT16: return tv_bf2f(((const uint16_t *)buf)[i]);
    case DDPLUG_INT8: return ((const int8_t *)buf)[i];
    case DDPLUG_UINT8: return ((const uint8_t *)buf)[i];
    case DDPLUG_INT32: return ((const int32_t *)buf)[i];
    case DDPLUG_INT64: return (double)((const int64_t *)buf)[i];
  }
  return 0;
}

/* v as dtype dt would hold it (rounded to float16, truncated to int8...). */
static inline double tv_round(int dt, double v) {
  unsigned char tmp[8];
  tv_put(dt, tmp, 0, v);
  return tv_get(dt, tmp, 0);
}

static inline int tv_is_int(int dt) {
  return dt == DDPLUG_INT8 || dt == DDPLUG_UINT8 || dt == DDPLUG_INT32 ||
         dt == DDPLUG_INT64;
}

/* Rank r's value at i: 1..5, so that sums, products of two and halves are
 * exact in every dtype. */
static inline double tv_value(int rank, size_t i) {
  return (double)(((i * 7u) + (size_t)rank * 3u) % 5u) + 1.0;
}

/* The reference for op over every rank's value at i. */
static inline double tv_reference(int dt, int op, int world, size_t i) {
  double acc = tv_value(0, i);
  for (int r = 1; r < world; r++) {
    double v = tv_value(r, i);
    switch (op) {
      case DDPLUG_OP_SUM:
      case DDPLUG_OP_AVG: acc += v; break;
      case DDPLUG_OP_PROD: acc *= v; break;
      case DDPLUG_OP_MIN: acc = v < acc ? v : acc; break;
      case DDPLUG_OP_MAX: acc = v > acc ? v : acc; break;
    }
  }
  if (op == DDPLUG_OP_AVG) {
    if (tv_is_int(dt)) return (double)((int64_t)acc / (int64_t)world);
    return acc / world;
  }
  return acc;
}

#endif /* DDPLUG_NCCL_TEST_VALUES_H */
