/* nccl_test_values.h — element values for the nccl plugin's tests: every
 * ddplug dtype read and written as double (cf_put / cf_get, the conformance
 * suite's elements.h: float16 and bfloat16 converted with
 * round-to-nearest-even), the values rank r contributes (1..5: sums,
 * products of two and halves are exact in every dtype), and the reference
 * result of each reduce op. Shared by the GPU tests, the CUDA/NCCL fake and
 * the tests that run on it. */
#ifndef DDPLUG_NCCL_TEST_VALUES_H
#define DDPLUG_NCCL_TEST_VALUES_H

#include <stdint.h>
#include <string.h>

#include "ddplug/common.h"
#include "elements.h" /* plugins/conformance: cf_put, cf_get */

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

/* v as dtype dt would hold it (rounded to float16, truncated to int8...). */
static inline double tv_round(int dt, double v) {
  unsigned char tmp[8];
  cf_put(dt, tmp, 0, v);
  return cf_get(dt, tmp, 0);
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
