/*
 * reduce.c — the reduction kernels: every dtype x op the plugin supports.
 *
 * Sources are combined block by block (DDCPU_BLOCK elements at a time) into an
 * accumulator that stays in L1, in source order 0..n-1, so every rank that
 * computes the same reduction produces the same bits. Integer SUM/PROD wrap
 * (computed in the unsigned type: no undefined behaviour); integer AVG is
 * the wrapped SUM divided by the divisor, truncated toward zero. float16 and
 * bfloat16 are widened to float32, accumulated there, and rounded once to
 * nearest even. Float MIN/MAX with NaN inputs give an unspecified one of the
 * operands. The loops are simple enough for the compiler to vectorise
 * (this file is built with -O3).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <string.h>

#include "kernels.h"

#define DDCPU_BLOCK 1024

/* Elements in the block that starts at element base of count. */
static inline size_t block_len(uint64_t count, uint64_t base) {
  uint64_t left = count - base;
  return (size_t)(left < DDCPU_BLOCK ? left : DDCPU_BLOCK);
}

/* ---- names and sizes ------------------------------------------------------ */

uint32_t ddcpu_dtype_size(int dtype) {
  switch (dtype) {
#define SZ(name, value, str, size) case value: return size;
    DDPLUG_DTYPE_MAP(SZ)
#undef SZ
    default: return 0;
  }
}

const char *ddcpu_dtype_name(int dtype) {
  switch (dtype) {
#define NM(name, value, str, size) case value: return str;
    DDPLUG_DTYPE_MAP(NM)
#undef NM
    default: return "?";
  }
}

const char *ddcpu_op_name(int op) {
  switch (op) {
#define NM(name, value, str) case value: return str;
    DDPLUG_OP_MAP(NM)
#undef NM
    default: return "?";
  }
}

const char *ddcpu_kind_name(int kind) {
  switch (kind) {
    case DDPLUG_COLL_ALLREDUCE: return "allreduce";
    case DDPLUG_COLL_BROADCAST: return "broadcast";
    case DDPLUG_COLL_ALLGATHER: return "allgather";
    case DDPLUG_COLL_BARRIER: return "barrier";
    default: return "?";
  }
}

int ddcpu_dtype_is_int(int dtype) {
  return dtype == DDPLUG_INT8 || dtype == DDPLUG_UINT8 ||
         dtype == DDPLUG_INT32 || dtype == DDPLUG_INT64;
}

/* ---- float16 / bfloat16 ----------------------------------------------------- */

static inline float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* binary16 → binary32, exact (integer arithmetic only, so a flush-to-zero
 * floating-point mode cannot lose half subnormals). */
float ddcpu_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13); /* inf / NaN (payload kept) */
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    /* subnormal: value = mant * 2^-24; normalise the mantissa */
    int shift = __builtin_clz(mant) - 21; /* bits to bring bit 10 up */
    mant = (mant << shift) & 0x3ffu;
    u = sign | ((uint32_t)(113 - shift) << 23) | (mant << 13);
  }
  return bits_to_float(u);
}

/* binary32 → binary16, round to nearest, ties to even; overflow → inf;
 * NaN stays NaN (quiet). */
uint16_t ddcpu_float_to_half(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) { /* inf or NaN */
    if (a == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu);
  }
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {                       /* below 2^-14: subnormal */
    if (a <= 0x33000000u) return sign;         /* <= 2^-25 rounds to 0 */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14 .. 24 */
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float ddcpu_bf16_to_float(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

uint16_t ddcpu_float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void widen(int dtype, float *out, const uint16_t *in, size_t m) {
  if (dtype == DDPLUG_BFLOAT16) {
    for (size_t i = 0; i < m; i++) out[i] = bits_to_float((uint32_t)in[i] << 16);
  } else {
    for (size_t i = 0; i < m; i++) out[i] = ddcpu_half_to_float(in[i]);
  }
}

static void narrow(int dtype, uint16_t *out, const float *in, size_t m) {
  if (dtype == DDPLUG_BFLOAT16) {
    for (size_t i = 0; i < m; i++) out[i] = ddcpu_float_to_bf16(in[i]);
  } else {
    for (size_t i = 0; i < m; i++) out[i] = ddcpu_float_to_half(in[i]);
  }
}

/* See kernels.h: whole buffers, for the float32 partial sums of multi-node
 * allreduce (hierarchical steps keep half types wide until the end). */
void ddcpu_half_widen(int dtype, float *out, const void *in, uint64_t count) {
  const uint16_t *h = in;
  for (uint64_t base = 0; base < count; base += DDCPU_BLOCK) {
    size_t m = block_len(count, base);
    widen(dtype, out + base, h + base, m);
  }
}

void ddcpu_half_narrow(int dtype, void *out, const float *in, uint64_t count) {
  uint16_t *h = out;
  for (uint64_t base = 0; base < count; base += DDCPU_BLOCK) {
    size_t m = block_len(count, base);
    narrow(dtype, h + base, in + base, m);
  }
}

/* ---- combine loops ------------------------------------------------------------ */

/* min and max are the same loops for every type */
#define MINMAX_CASES                                                         \
  case DDPLUG_OP_MIN:                                                        \
    for (size_t i = 0; i < m; i++) acc[i] = s[i] < acc[i] ? s[i] : acc[i];   \
    break;                                                                   \
  case DDPLUG_OP_MAX:                                                        \
    for (size_t i = 0; i < m; i++) acc[i] = s[i] > acc[i] ? s[i] : acc[i];   \
    break;

/* acc[i] = acc[i] op s[i] for a floating type T. */
#define DEF_FLOAT_COMBINE(NAME, T)                                           \
  static void NAME(int op, T *restrict acc, const T *restrict s, size_t m) { \
    switch (op) {                                                            \
      case DDPLUG_OP_SUM:                                                    \
      case DDPLUG_OP_AVG:                                                    \
        for (size_t i = 0; i < m; i++) acc[i] += s[i];                       \
        break;                                                               \
      case DDPLUG_OP_PROD:                                                   \
        for (size_t i = 0; i < m; i++) acc[i] *= s[i];                       \
        break;                                                               \
      MINMAX_CASES                                                           \
      default: break;                                                        \
    }                                                                        \
  }

/* The same for an integer type T with unsigned twin U (wrapping SUM/PROD). */
#define DEF_INT_COMBINE(NAME, T, U)                                          \
  static void NAME(int op, T *restrict acc, const T *restrict s, size_t m) { \
    switch (op) {                                                            \
      case DDPLUG_OP_SUM:                                                    \
      case DDPLUG_OP_AVG:                                                    \
        for (size_t i = 0; i < m; i++) acc[i] = (T)(U)((U)acc[i] + (U)s[i]); \
        break;                                                               \
      case DDPLUG_OP_PROD:                                                   \
        for (size_t i = 0; i < m; i++) acc[i] = (T)(U)((U)acc[i] * (U)s[i]); \
        break;                                                               \
      MINMAX_CASES                                                           \
      case DDPLUG_OP_BOR:                                                    \
        for (size_t i = 0; i < m; i++) acc[i] = (T)(acc[i] | s[i]);          \
        break;                                                               \
      case DDPLUG_OP_BAND:                                                   \
        for (size_t i = 0; i < m; i++) acc[i] = (T)(acc[i] & s[i]);          \
        break;                                                               \
      default: break;                                                        \
    }                                                                        \
  }

/* Reduce nsrc sources of type T block by block into each of dsts. */
#define DEF_REDUCE(NAME, T, COMBINE)                                              \
  static void NAME(int op, void *const *dsts, int nd, const void *const *srcs,    \
                   int n, uint64_t count, int divisor, int stream) {              \
    T acc[DDCPU_BLOCK];                                                           \
    for (uint64_t base = 0; base < count; base += DDCPU_BLOCK) {                  \
      size_t m = block_len(count, base);                                          \
      ddcpu_copy(acc, (const T *)srcs[0] + base, m * sizeof(T), 0);               \
      for (int k = 1; k < n; k++) COMBINE(op, acc, (const T *)srcs[k] + base, m); \
      if (divisor > 0)                                                            \
        for (size_t i = 0; i < m; i++) acc[i] = (T)(acc[i] / divisor);            \
      for (int d = 0; d < nd; d++)                                                \
        ddcpu_copy((T *)dsts[d] + base, acc, m * sizeof(T), stream);              \
    }                                                                             \
  }

DEF_FLOAT_COMBINE(combine_f32, float)
DEF_FLOAT_COMBINE(combine_f64, double)
DEF_INT_COMBINE(combine_i8, int8_t, uint8_t)
DEF_INT_COMBINE(combine_u8, uint8_t, uint8_t)
DEF_INT_COMBINE(combine_i32, int32_t, uint32_t)
DEF_INT_COMBINE(combine_i64, int64_t, uint64_t)

DEF_REDUCE(reduce_f32, float, combine_f32)
DEF_REDUCE(reduce_f64, double, combine_f64)
DEF_REDUCE(reduce_i8, int8_t, combine_i8)
DEF_REDUCE(reduce_u8, uint8_t, combine_u8)
DEF_REDUCE(reduce_i32, int32_t, combine_i32)
DEF_REDUCE(reduce_i64, int64_t, combine_i64)

/* float16 / bfloat16: widen each source, accumulate in float32, narrow once. */
static void reduce_half(int dtype, int op, void *const *dsts, int nd,
                        const void *const *srcs, int n, uint64_t count,
                        int divisor, int stream) {
  float acc[DDCPU_BLOCK], tmp[DDCPU_BLOCK];
  uint16_t out[DDCPU_BLOCK];
  for (uint64_t base = 0; base < count; base += DDCPU_BLOCK) {
    size_t m = block_len(count, base);
    widen(dtype, acc, (const uint16_t *)srcs[0] + base, m);
    for (int k = 1; k < n; k++) {
      widen(dtype, tmp, (const uint16_t *)srcs[k] + base, m);
      combine_f32(op, acc, tmp, m);
    }
    if (divisor > 0)
      for (size_t i = 0; i < m; i++) acc[i] = acc[i] / (float)divisor;
    if (nd == 1 && !stream) {
      narrow(dtype, (uint16_t *)dsts[0] + base, acc, m);
      continue;
    }
    narrow(dtype, out, acc, m);
    for (int d = 0; d < nd; d++)
      ddcpu_copy((uint16_t *)dsts[d] + base, out, m * sizeof(uint16_t), stream);
  }
}

/* See kernels.h. Not thread-affine; pure function of its arguments. */
void ddcpu_reduce_bcast(int dtype, int op, void *const *dsts, int nd,
                        const void *const *srcs, int nsrc, uint64_t count,
                        int divisor, int stream) {
  if (count == 0 || nsrc <= 0 || nd <= 0) return;
  switch (dtype) {
    case DDPLUG_FLOAT32: reduce_f32(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_FLOAT64: reduce_f64(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_INT8: reduce_i8(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_UINT8: reduce_u8(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_INT32: reduce_i32(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_INT64: reduce_i64(op, dsts, nd, srcs, nsrc, count, divisor, stream); break;
    case DDPLUG_FLOAT16:
    case DDPLUG_BFLOAT16:
      reduce_half(dtype, op, dsts, nd, srcs, nsrc, count, divisor, stream);
      break;
    default: break;
  }
}

/* See kernels.h. */
void ddcpu_reduce_n(int dtype, int op, void *dst, const void *const *srcs,
                    int nsrc, uint64_t count, int divisor) {
  void *dsts[1] = {dst};
  ddcpu_reduce_bcast(dtype, op, dsts, 1, srcs, nsrc, count, divisor, 0);
}

/* dst op= src (AVG combines as SUM; no division). */
void ddcpu_reduce_into(int dtype, int op, void *dst, const void *src,
                       uint64_t count) {
  const void *srcs[2] = {dst, src};
  ddcpu_reduce_n(dtype, op, dst, srcs, 2, count, 0);
}

/* x /= divisor element-wise. */
void ddcpu_divide(int dtype, void *x, uint64_t count, int divisor) {
  const void *srcs[1] = {x};
  if (divisor > 1) ddcpu_reduce_n(dtype, DDPLUG_OP_SUM, x, srcs, 1, count, divisor);
}
