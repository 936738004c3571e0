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

int cf_same(int dtype, int op, double got, double want) {
  if (op != DDPLUG_OP_AVG || cf_is_integer(dtype)) return got == want;
  /* AVG of floats: one rounding of the division in the dtype's precision
   * (and an implementation may divide before or after summing). */
  double eps = dtype == DDPLUG_FLOAT16 ? 1e-3 : dtype == DDPLUG_BFLOAT16 ? 8e-3
               : dtype == DDPLUG_FLOAT32 ? 1e-6 : 1e-12;
  return fabs(got - want) <= eps * (fabs(want) > 1 ? fabs(want) : 1) * 4;
}
